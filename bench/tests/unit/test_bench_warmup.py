"""bench.series.warm_until_steady: when a warm-up stops (made-up windows on a fake clock, no server)."""

from __future__ import annotations

import pytest

from bench import series
from bench.series import warm_until_steady


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A clock that only the windows move: each window of `seconds` adds them."""
    now = [0.0]
    monkeypatch.setattr(series.time, "monotonic", lambda: now[0])
    return now


def windows(rates: list[float], clock: list[float]):
    calls: list[int] = []

    def window(seconds: int) -> float:
        calls.append(seconds)
        clock[0] += seconds
        return rates[len(calls) - 1]

    return window, calls


def test_stops_at_the_first_two_windows_that_agree(clock):
    window, calls = windows([1000, 1500, 1950, 2000, 2100], clock)
    warm = warm_until_steady(window, window_s=3, min_s=0, max_s=60, steady=0.05)
    assert warm["rates"] == [1000, 1500, 1950, 2000] and warm["steady"] and calls == [3, 3, 3, 3]


def test_agreeing_windows_before_the_minimum_do_not_end_it(clock):
    window, _ = windows([1000] * 10, clock)
    warm = warm_until_steady(window, window_s=3, min_s=10, max_s=60, steady=0.05)
    assert warm["rates"] == [1000] * 4 and warm["seconds"] == 12 and warm["steady"]


def test_a_server_that_never_settles_stops_at_the_maximum(clock):
    window, _ = windows([1000, 2000] * 10, clock)
    warm = warm_until_steady(window, window_s=3, min_s=0, max_s=10, steady=0.05)
    assert warm["rates"] == [1000, 2000, 1000, 2000] and warm["seconds"] == 12 and not warm["steady"]


def test_a_zero_window_never_counts_as_settled(clock):
    window, _ = windows([0, 0, 500, 510], clock)
    warm = warm_until_steady(window, window_s=3, min_s=0, max_s=60, steady=0.05)
    assert warm["rates"] == [0, 0, 500, 510] and warm["steady"]
