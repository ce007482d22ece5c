"""``python -m worker job|describe``: the process the supervisor launches.

Frames go only to --event-fd; stdout and stderr belong to CrewAI's panels and are captured apart.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from protocol import Completed, Failed, Hello, Registry, Start, Started
from worker import lifecycle, registry
from worker.operations import OPERATIONS, OperationError, OutputTooLarge, bounded

REGISTRY_ENV = registry.ENV


async def execute(start: Start, crews: dict[str, object], out: lifecycle.FrameWriter) -> None:
    """Run one job and send exactly one terminal frame. Messages stay generic: no traceback text."""
    operation = OPERATIONS.get(start.operation)
    if start.crew_id not in crews or operation is None:
        what = "crew" if start.crew_id not in crews else "operation"
        out.send(
            Failed(error_type=f"unknown_{what}", message=f"this worker has no such {what}", uncertain_outcome=False)
        )
        return
    try:
        crew = registry.build(crews[start.crew_id])
    except Exception as exc:  # a broken factory is the registry's fault, reported by class
        out.send(Failed(error_type=type(exc).__name__, message="crew factory failed", uncertain_outcome=False))
        return
    out.send(Started())
    try:
        output = bounded(await operation(crew, start.input, out.send))
    except OutputTooLarge as exc:
        out.send(Failed(error_type="output_too_large", message=str(exc), uncertain_outcome=False))
    except OperationError as exc:  # our own words (or CrewAI's configuration text), never provider output
        out.send(Failed(error_type=type(exc).__name__, message=str(exc), uncertain_outcome=False))
    except Exception as exc:
        out.send(Failed(error_type=type(exc).__name__, message="CrewAI operation failed", uncertain_outcome=False))
    else:
        out.send(Completed(output=output))


def load_registry(out: lifecycle.FrameWriter) -> dict[str, object] | None:
    spec = os.environ.get(REGISTRY_ENV, "")
    try:
        lifecycle.prepare_environment()
        return registry.load(spec)
    except Exception as exc:
        # Registry errors are configuration, so their text is safe and needed to fix startup.
        out.send(
            Failed(error_type="registry_error", message=f"{spec}: {type(exc).__name__}: {exc}", uncertain_outcome=False)
        )
        return None


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m worker")
    parser.add_argument("mode", choices=["job", "describe"])
    parser.add_argument("--event-fd", type=int, required=True)
    parser.add_argument("--control-fd", type=int)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)

    lifecycle.bind_to_parent(args.parent_pid)
    out = lifecycle.FrameWriter(args.event_fd)
    starts = lifecycle.watch_control(args.control_fd) if args.control_fd is not None else None
    out.send(Hello(pid=os.getpid()))
    crews = load_registry(out)
    if crews is not None:
        if args.mode == "describe":
            out.send(Registry(crews=sorted(crews)))
        elif starts is not None:
            # Not asyncio.run: its teardown would wait on threads CrewAI may leave blocked.
            asyncio.new_event_loop().run_until_complete(execute(starts.get(), crews, out))
    sys.stdout.flush()
    sys.stderr.flush()
    # Interpreter teardown after CrewAI costs 1-1.5 s; the terminal frame is already written.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
