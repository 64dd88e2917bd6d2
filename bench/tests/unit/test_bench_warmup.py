"""bench.series.warm_until_steady: when a warm-up stops (windows are made up, no server)."""

from __future__ import annotations

from bench.series import warm_until_steady


def windows(rates: list[float]):
    calls: list[int] = []

    def window(seconds: int) -> float:
        calls.append(seconds)
        return rates[len(calls) - 1]

    return window, calls


def test_stops_at_the_first_two_windows_that_agree():
    window, calls = windows([1000, 1500, 1950, 2000, 2100])
    warm = warm_until_steady(window, window_s=3, min_s=0, max_s=60, steady=0.05)
    assert warm["rates"] == [1000, 1500, 1950, 2000] and warm["steady"] and calls == [3, 3, 3, 3]


def test_agreeing_windows_before_the_minimum_do_not_end_it():
    window, _ = windows([1000, 1000, 1000])
    warm = warm_until_steady(window, min_s=10, max_s=0, steady=0.05)
    assert warm["rates"] == [1000] and not warm["steady"]


def test_a_server_that_never_settles_stops_at_the_maximum():
    window, _ = windows([1000, 2000])
    warm = warm_until_steady(window, min_s=0, max_s=0, steady=0.05)
    assert warm["rates"] == [1000] and not warm["steady"]


def test_a_zero_window_never_counts_as_settled():
    window, _ = windows([0, 0, 500, 510])
    warm = warm_until_steady(window, min_s=0, max_s=60, steady=0.05)
    assert warm["rates"] == [0, 0, 500, 510] and warm["steady"]
