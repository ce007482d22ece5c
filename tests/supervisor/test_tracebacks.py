"""The traceback a failed job shows its operator: the last one in its worker's stderr, with its causes."""

from __future__ import annotations

import traceback

from supervisor.tracebacks import last_traceback


def _printed(error: BaseException) -> str:
    return "".join(traceback.format_exception(error))


def _raised(error: Exception) -> BaseException:
    try:
        raise error
    except Exception as raised:
        return raised


def _raised_from() -> BaseException:
    try:
        try:
            raise KeyError("the cause")
        except KeyError as cause:
            raise ValueError("the crew's error") from cause
    except ValueError as error:
        return error


def test_a_chained_exception_keeps_its_cause() -> None:
    shown = last_traceback("crew output\n" + _printed(_raised_from()))
    assert shown is not None
    assert shown.startswith("Traceback (most recent call last):")
    assert "KeyError: 'the cause'" in shown
    assert shown.rstrip().endswith("ValueError: the crew's error")
    assert "crew output" not in shown


def test_an_earlier_unrelated_traceback_is_left_out() -> None:
    earlier = _printed(_raised(RuntimeError("a retried call")))
    shown = last_traceback(earlier + "a log line\n" + _printed(_raised(ValueError("the last"))))
    assert shown is not None
    assert "RuntimeError" not in shown and "ValueError: the last" in shown


def test_a_chain_longer_than_the_bound_keeps_its_end() -> None:
    printed = _printed(_raised_from())
    last = printed.split("\n\n")[-1]
    shown = last_traceback(printed, max_lines=last.count("\n") + 1)
    assert shown is not None
    assert "KeyError" not in shown and "ValueError: the crew's error" in shown


def test_a_chain_longer_than_its_characters_keeps_its_last_tracebacks_whole() -> None:
    printed = _printed(_raised_from())
    last = printed[printed.rindex("Traceback (most recent call last):") :].rstrip("\n")
    assert last_traceback(printed, max_chars=len(last)) == last
    assert last_traceback(printed, max_chars=len(printed)) == printed.rstrip("\n")


def test_no_traceback_or_one_too_far_back_is_none() -> None:
    assert last_traceback("just output\n") is None
    assert last_traceback(_printed(_raised(ValueError("old"))) + "line\n" * 400) is None
