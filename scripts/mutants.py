"""Break the product on purpose and show that the suite notices: the headline claims' mutation check.

    scripts/mutants [--only NAME ...] [--list]

Each mutant is one small deliberate break of a claim (cancel does nothing, the descendants that left the
group are spared, restart fencing is skipped, the output drops fields, the header timeout is off). For each,
a temporary copy of this checkout gets that one change, and the tests meant to catch it run there, each on its
own (the copy's own supervisor and workers: nothing of this checkout is touched); the mutant is caught when
every one of them fails. The same tests first run on an unchanged copy, where each must pass, so a catch is
the break's and not a broken test.
``--list`` prints the mutants and checks that each one still applies (its text is in the source exactly once):
``tests/project/test_mutants.py`` does that in the suite, so a mutant cannot rot into a no-op.

Exit 0 when every mutant is caught, 1 otherwise; a line per mutant either way.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_SECONDS = 900


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    claim: str
    path: str  # relative to the checkout
    text: str  # exactly once in that file
    broken: str
    tests: tuple[str, ...]  # pytest node ids or files, each of which must fail with the break


MUTANTS = (
    Mutant(
        "cancel-is-a-no-op",
        "a cancel kills the work and proves it",
        "supervisor/jobs/runner.py",
        '            job.ask_stop(StopReason.CANCEL, said=reason or "cancelled by request")\n',
        "            pass  # the stop is never asked\n",
        (
            "tests/supervisor/jobs/test_stops.py::test_a_cancel_kills_the_running_worker_and_proves_it",
            "tests/supervisor/http/test_api.py::test_cancel_mid_stream_kills_the_worker_and_proves_it",
        ),
    ),
    Mutant(
        "descendants-spared",
        "a cancel kills the whole tree, the processes that left the group included",
        "supervisor/processes/process.py",
        "        killed = await asyncio.to_thread(containment.kill, snapshot)\n",
        "        killed: list[psutil.Process] = []\n",
        (
            "tests/supervisor/jobs/test_stops.py::test_a_cancel_kills_the_workers_tree_even_what_left_its_group",
            "tests/supervisor/http/test_api.py::test_cancel_over_http_kills_a_child_and_a_grandchild_that_left_the_group",
        ),
    ),
    Mutant(
        "fencing-skipped",
        "no orphan outlives a restart, and an interrupted job is fenced",
        "supervisor/jobs/supervisor.py",
        "            await fence_restored(journal, killed, tracing)\n",
        "            await asyncio.sleep(0)\n",
        ("tests/supervisor/processes/test_fencing.py::test_an_orphan_that_survived_a_crash_is_killed_at_restart",),
    ),
    Mutant(
        "dead-supervisors-cgroups-spared",
        "a journal that cannot be opened stops no kill of what a dead supervisor's job cgroups hold",
        "supervisor/jobs/supervisor.py",
        "            killed = await asyncio.to_thread(kill_left_in_cgroups, claim.before)",
        "            killed = {}",
        ("tests/supervisor/test_restart_port.py::test_a_corrupt_journal_stops_no_kill_of_the_leftovers",),
    ),
    Mutant(
        "port-bound-before-fencing",
        "no leftover of a job holds the port at a restart: it is killed before the bind",
        "supervisor/serve.py",
        "                    opening = Supervisor.open(self.settings, self.journal, launcher, fenced=self._bind)\n",
        "                    self._bind()\n"
        "                    opening = Supervisor.open(self.settings, self.journal, launcher)\n",
        ("tests/supervisor/test_restart_port.py::test_a_restart_kills_the_leftover_on_its_port_before_binding",),
    ),
    Mutant(
        "output-drops-fields",
        "a job's output is what CrewAI's kickoff gives",
        "worker/operations.py",
        "    for field, default in OUTPUT_FIELDS.items():\n        data.setdefault(field, default)\n",
        "    for field, default in OUTPUT_FIELDS.items():\n        data.setdefault(field, default)\n"
        '    data["pydantic"], data["tasks_output"] = None, []\n',
        ("tests/system/compat/test_fidelity.py::test_run_gives_what_kickoff_gives",),
    ),
    Mutant(
        "header-timeout-off",
        "a connection that sends no headers is closed at the header timeout",
        "supervisor/http/connections.py",
        "        self._deadline = self.loop.call_later(self.guard.bounds.header_timeout, self.close)\n",
        "        self._deadline = None\n",
        ("tests/system/security/test_connections.py::test_silent_sockets_neither_exhaust_nor_block_the_supervisor",),
    ),
)


def applies(mutant: Mutant, root: Path = ROOT) -> bool:
    return (root / mutant.path).read_text().count(mutant.text) == 1


def copy_of_checkout(into: Path) -> Path:
    """The tracked files of this checkout (as they are in the working tree), without .venv or caches."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    copy = into / "checkout"
    for name in filter(None, listed.decode().split("\0")):
        target = copy / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, target)
    return copy


def run_tests(copy: Path, tests: tuple[str, ...]) -> tuple[list[bool], float, str]:
    """Whether each of ``tests`` passes in ``copy`` (its own code first on the path), run one by one; how long
    they took, and the end of what pytest printed for the last that failed."""
    began = time.monotonic()
    passed, said = [], ""
    for test in tests:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", test]
        done = subprocess.run(command, cwd=copy, capture_output=True, text=True, timeout=TEST_SECONDS)
        passed.append(done.returncode == 0)
        if done.returncode != 0:
            said = "\n".join(done.stdout.splitlines()[-40:])
    return passed, time.monotonic() - began, said


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="these mutants alone (by name)")
    parser.add_argument("--list", action="store_true", help="list the mutants and check that each applies")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    stale = [m.name for m in chosen if not applies(m)]
    if args.list or stale:
        for mutant in chosen:
            print(f"{mutant.name:<22} {'applies' if applies(mutant) else 'STALE'}  {mutant.claim}")
        return 1 if stale else 0
    caught = 0
    with tempfile.TemporaryDirectory(prefix="crew-mutants-") as place:
        copy = copy_of_checkout(Path(place))
        for mutant in chosen:
            original = (copy / mutant.path).read_text()
            passed, seconds, said = run_tests(copy, mutant.tests)
            if not all(passed):
                print(f"{mutant.name:<22} the tests fail WITHOUT the break: fix them first ({seconds:.0f} s)")
                print(said)
                continue
            (copy / mutant.path).write_text(original.replace(mutant.text, mutant.broken))
            try:
                passed, seconds, _ = run_tests(copy, mutant.tests)
            finally:
                (copy / mutant.path).write_text(original)
            survivors = [test for test, ok in zip(mutant.tests, passed, strict=True) if ok]
            caught += not survivors
            verdict = "caught" if not survivors else "SURVIVED " + ", ".join(survivors)
            print(f"{mutant.name:<22} {verdict} in {seconds:.0f} s: {mutant.claim}")
    print(f"{caught} of {len(chosen)} mutants caught")
    return 0 if caught == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
