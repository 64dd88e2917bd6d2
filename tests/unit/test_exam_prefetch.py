"""The served exams made ahead in the background (support.exam_prefetch) are the very items the tests would make."""

from __future__ import annotations

from support.exam_prefetch import EXAMS, items, make, start


def test_the_background_run_gives_the_items_made_in_process(tmp_path, monkeypatch):
    monkeypatch.setenv("PHOTO_EXAM_N", "5")
    monkeypatch.setenv("PHONE_EXAM_N", "4")
    process = start(tmp_path)
    for name, n in (("photo_exam", 5), ("phone_exam", 4)):
        ahead = items(name, n, tmp_path, process, wait_s=300)
        assert (tmp_path / f"{name}.json").is_file()
        assert ahead == make(name, n)
    assert process.wait(60) == 0
    assert items("photo_exam", 3, tmp_path, process) == make("photo_exam", 3)  # made for 5: not these
    assert set(EXAMS) == {"photo_exam", "phone_exam"}


def test_other_counts_or_no_background_run_make_them_here(tmp_path):
    assert items("photo_exam", 3, None, None) == make("photo_exam", 3)
    assert items("photo_exam", 3, tmp_path, None) == make("photo_exam", 3)
