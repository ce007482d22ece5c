"""Every crew the tests run. ``tests.crews:registry`` is the one registry: the suite's supervisors serve it
(``AIP_CREWAI_REGISTRY=tests.crews:registry``, ``TEST_REGISTRY`` in ``tests/conftest.py``), and a doctor run on it
names one problem, the crew ``broken-factory``.

Its parts, by what their crews do: ``base`` (the demo crews and crews that misbehave on purpose), ``hostile``
(runaways, broken workers, sizes), ``prober`` (what a crew can reach from its worker), ``shapes`` (the shapes
real crews have, for fidelity), ``effects`` (a crew whose every task has an external effect: the effect ledger,
resume). The modules with a registry of their own are apart because they break by
design what the one registry must pass: ``hostile_text`` (factories that raise), ``immortal`` (a factory that
disarms the process that builds it), ``instance`` (a value that is not a factory), ``flaky`` (an import that fails on
demand), ``threaded`` and ``unwarmable`` (imports that stop a fork server), ``patching`` (an import that patches
CrewAI for every job), ``garbled`` (an import that garbles a fork server's first word on demand).
"""

from __future__ import annotations

from collections.abc import Callable

from crewai import Crew

from tests.crews import base, effects, hostile, prober, shapes
from worker.demo import eval_llms as demo_eval_llms

registry: dict[str, Callable[[], Crew]] = {
    **base.registry,
    **hostile.CREWS,
    **prober.CREWS,
    **shapes.SHAPES,
    **effects.CREWS,
}
# What ``test`` may name as eval_llm here (read from this module by worker.registry.eval_llms).
eval_llms = dict(demo_eval_llms)
