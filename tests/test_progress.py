"""`core.progress`: an error escaping a batch run carries what the run had committed."""

from __future__ import annotations

import pytest

from consumer_kit.core.progress import committed_before, committed_on_error, counted


def test_an_error_after_committed_work_carries_it_and_a_note() -> None:
    done = 0
    with pytest.raises(RuntimeError) as caught, \
            committed_on_error(lambda: counted(done, "row", "deleted", 1)):
        done = 1
        raise RuntimeError("the database went away")
    assert committed_before(caught.value) == "1 row deleted in 1 batch"
    assert caught.value.__notes__ == ["committed before the error: 1 row deleted in 1 batch"]


def test_an_error_before_any_work_carries_nothing() -> None:
    with pytest.raises(RuntimeError) as caught, \
            committed_on_error(lambda: counted(0, "row", "deleted")):
        raise RuntimeError("refused at once")
    assert committed_before(caught.value) is None
    assert not getattr(caught.value, "__notes__", [])


def test_a_run_wrapping_another_names_the_whole_run_once() -> None:
    with pytest.raises(RuntimeError) as caught, \
            committed_on_error(lambda: "2 partitions added, 3 rows copied"), \
            committed_on_error(lambda: "3 rows copied"):
        raise RuntimeError("boom")
    assert committed_before(caught.value) == "2 partitions added, 3 rows copied"
    assert caught.value.__notes__ == [
        "committed before the error: 2 partitions added, 3 rows copied"]


def test_an_interrupt_is_marked_so_ctrl_c_says_what_stays_done() -> None:
    with pytest.raises(KeyboardInterrupt) as caught, \
            committed_on_error(lambda: "1 row deleted"):
        raise KeyboardInterrupt
    assert committed_before(caught.value) == "1 row deleted"


def test_a_stopping_process_is_not_marked() -> None:
    with pytest.raises(SystemExit) as caught, committed_on_error(lambda: "1 row deleted"):
        raise SystemExit(143)
    assert committed_before(caught.value) is None


def test_counted_words_plural_and_thousands() -> None:
    assert counted(2000, "row", "archived", 2) == "2,000 rows archived in 2 batches"
    assert counted(1, "repair", "applied") == "1 repair applied"
    assert counted(0, "row", "archived", 3) is None


class NoAddNote(RuntimeError):
    """An error without `add_note`, as every exception is on Python 3.10."""

    def add_note(self, note: str) -> None:
        raise AttributeError("add_note")


def test_the_mark_needs_no_add_note_so_python_3_10_keeps_the_error() -> None:
    with pytest.raises(NoAddNote) as caught, committed_on_error(lambda: "1 row deleted"):
        raise NoAddNote("the database went away")
    assert committed_before(caught.value) == "1 row deleted"
    assert caught.value.__notes__ == ["committed before the error: 1 row deleted"]
