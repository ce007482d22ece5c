"""The quarantine: a record that breaks the journal's consistency rule (``schema.INCONSISTENT``) when the journal
opens is moved aside, and the journal serves the others, rather than refusing to serve them all for one record.

Its rows go as they were to the ``quarantined_*`` tables, for whoever finds out how it came to be; its action id,
with what was wrong, to ``quarantine``, which keeps the id taken (admission refuses it, the API answers 404 naming
the quarantine), names it to ``crew-supervisor doctor``, and has restart fencing kill what its job left. A record's
own disagreement is all this takes in: a file that fails SQLite's integrity check still refuses to start.
"""

from __future__ import annotations

import logging
import sqlite3
import time

from supervisor.journal.schema import MIRRORED

log = logging.getLogger("crew_supervisor.journal")


def quarantine(db: sqlite3.Connection, found: list[tuple[str, str]]) -> dict[str, str]:
    """Move each record ``found`` (its action id and a problem, an id as often as it has problems) aside, all in
    one transaction; what was wrong with each, its problems joined. The rest of the journal then keeps the rule:
    it holds no row of these action ids."""
    problems: dict[str, list[str]] = {}
    for action_id, problem in found:
        problems.setdefault(action_id, []).append(problem)
    said = {action_id: "; ".join(dict.fromkeys(each)) for action_id, each in problems.items()}
    now = time.time()
    db.execute("BEGIN IMMEDIATE")
    try:
        for action_id, problem in said.items():
            for table in MIRRORED:
                db.execute(f"INSERT INTO quarantined_{table} SELECT * FROM {table} WHERE action_id = ?", (action_id,))
                db.execute(f"DELETE FROM {table} WHERE action_id = ?", (action_id,))
            # Again only by hand (rows of an id already quarantined put back): the latest finding is said.
            db.execute("INSERT OR REPLACE INTO quarantine VALUES (?, ?, ?)", (action_id, problem, now))
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    for action_id, problem in said.items():
        log.warning(
            "quarantined a journal record: %s; its rows are kept aside and its action id stays taken",
            problem,
            extra={"action_id": action_id},
        )
    return said
