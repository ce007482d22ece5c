"""Every kind of refused start has its HTTP answer: a kind without one would be a 500."""

from __future__ import annotations

from supervisor.http.app import REFUSALS
from supervisor.jobs import admission


def test_every_refusal_has_a_status() -> None:
    kinds = {value for value in vars(admission).values() if isinstance(value, type) and issubclass(value, Exception)}
    assert {kind for kind in kinds if issubclass(kind, admission.Refused)} - {admission.Refused} == set(REFUSALS)
    assert all(400 <= status < 600 for status in REFUSALS.values())
