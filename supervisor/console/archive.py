"""``crew-supervisor archive``: the ended records past an age, removed through ``POST /jobs/archive`` a bounded batch
at a time until none is left (``--dry-run``: the first batch named, none removed)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.text import Text

from supervisor.console.client import Client, OperatorError
from supervisor.console.durations import age
from supervisor.console.views import id_text
from supervisor.enums import TERMINAL_EVENTS
from supervisor.escaping import typed_id

DESCRIPTION = """\
Archive the ended jobs of a running supervisor that ended more than
--older-than ago (30m, 12h, 7d; 0s for every ended job), as DELETE /jobs/{id}
archives one: their records, events and output are removed from the journal
for good, and their action ids may be started again. --status and --crew
narrow them; a running job is never archived. It asks the server a batch at
a time until none is left, and prints how many it archived. Without --yes it
refuses; --dry-run lists the first batch and archives none."""
CONFIRMATION = {"X-AIP-Archive-Confirmation": "bulk"}
MAX_ROUNDS = 1000  # batches one command asks for: a journal holds at most 100,000 records, 1,000 a batch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--older-than", required=True, type=age, metavar="DURATION", help="how long ago they ended: 30m, 12h, 7d"
    )
    parser.add_argument(
        "--status", action="append", choices=tuple(status.value for status in TERMINAL_EVENTS), help="only these"
    )
    parser.add_argument("--crew", type=typed_id, help="only this crew id (as the CLI prints it, or as it is)")
    parser.add_argument("--dry-run", action="store_true", help="list the first batch it would archive; archive none")
    parser.add_argument("--yes", action="store_true", help="archive them: required unless --dry-run")


def archive(client: Client, args: argparse.Namespace) -> dict[str, Any]:
    """The batches' answers as one: every id archived, and how many more matched after the last (``--dry-run``: the
    first batch's answer)."""
    if not (args.yes or args.dry_run):
        raise OperatorError("archiving removes the records for good: add --yes (or --dry-run to list them first)")
    body = {"older_than_seconds": args.older_than, "status": args.status, "crew_id": args.crew, "dry_run": args.dry_run}
    body = {key: value for key, value in body.items() if value is not None}
    total: dict[str, Any] = {"archived": 0, "action_ids": []}
    for _ in range(MAX_ROUNDS):
        batch = client.post("/jobs/archive", body, CONFIRMATION)
        archived = total["archived"] + batch["archived"]
        total = {**batch, "archived": archived, "action_ids": [*total["action_ids"], *batch["action_ids"]]}
        if args.dry_run or not batch["more"] or not batch["archived"]:
            break
    return total


def view(answer: dict[str, Any]) -> Text:
    """How many it archived, or (``dry_run``) each one it would, and how many more matched."""
    count = answer["archived"]
    verb = "would archive" if answer["dry_run"] else "archived"
    lines = [Text(f"{verb} {count} job{'' if count == 1 else 's'}", "bold")]
    if answer["dry_run"]:  # what an archive removes is counted; what it would is named
        lines += [Text.assemble("  ", id_text(action_id)) for action_id in answer["action_ids"]]
    if answer["more"]:
        lines.append(Text(f"{answer['more']} more matched", "yellow"))
    return Text("\n").join(lines)
