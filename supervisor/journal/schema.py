"""The journal's SQLite schema and the consistency rule each record must pass before it is served (a record that
fails it is quarantined: ``supervisor/journal/quarantine.py``)."""

from __future__ import annotations

from protocol import EffectStatus
from supervisor.enums import TERMINAL_EVENTS, Status

# The names the journal's SQL compares with, as SQL literals (a partial index is used only by a query that spells
# its condition): each the enum's, spelled there once.
RUNNING = f"'{Status.RUNNING}'"
TERMINAL = "(" + ", ".join(f"'{event}'" for event in TERMINAL_EVENTS) + ")"

# 2: completed events hold the output itself; the worker's exit status is in jobs. 3: when a job ended (ended_at).
# 4: what identifies a job's processes beside its worker (boundary: its cgroups, the descendants samples saw).
# 5: the stacks table. 6: what a job's worker left running when it exited, killed and named (leftovers);
# the quarantine and its tables.
SCHEMA_VERSION = 6
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS jobs (
    action_id TEXT PRIMARY KEY,
    crew_id TEXT NOT NULL,
    operation TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    status TEXT NOT NULL,
    event_count INTEGER NOT NULL DEFAULT 0,
    output BLOB,
    admitted_at REAL NOT NULL,
    worker_pid INTEGER,
    worker_start_time REAL,
    worker_pgid INTEGER,
    exit_status INTEGER,
    ended_at REAL,
    boundary BLOB,
    leftovers BLOB
);
CREATE TABLE IF NOT EXISTS events (
    action_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    event TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (action_id, sequence)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status);
CREATE INDEX IF NOT EXISTS jobs_by_admission ON jobs (admitted_at, action_id);
CREATE INDEX IF NOT EXISTS jobs_by_status_admission ON jobs (status, admitted_at, action_id);
CREATE INDEX IF NOT EXISTS jobs_by_crew_admission ON jobs (crew_id, admitted_at, action_id);
-- Ended records by their end (one whose end is unknown, from before schema 3 or the reference, by its admission):
-- what retention archives first (supervisor/jobs/retention.py). Made at every open, so older journals gain it.
CREATE INDEX IF NOT EXISTS jobs_by_end ON jobs (coalesce(ended_at, admitted_at), action_id) WHERE status != {RUNNING};
-- A settled worker's stdout/stderr tails (64 KiB each) and byte totals; created here, so old journals gain it.
CREATE TABLE IF NOT EXISTS outputs (
    action_id TEXT PRIMARY KEY,
    stdout TEXT NOT NULL,
    stderr TEXT NOT NULL,
    stdout_total INTEGER NOT NULL,
    stderr_total INTEGER NOT NULL
);
-- Where a job was just before the kill of its timeout, cancel or broken limit (supervisor/jobs/stacks.py): JSON.
CREATE TABLE IF NOT EXISTS stacks (
    action_id TEXT PRIMARY KEY,
    stack BLOB NOT NULL
);
-- A job's effect ledger (supervisor/jobs/ledger.py): each tool or LLM call its worker said it was starting, made
-- durable before the call went out, and how it ended. ``status`` is an EffectStatus; a call still ``running`` when
-- its job ends becomes ``uncertain`` in the commit that ends the job (at a restart, in fencing's). Bounded per job by
-- MAX_EFFECTS, apart from the event budget. Created here, so older journals gain it.
CREATE TABLE IF NOT EXISTS effects (
    action_id TEXT NOT NULL,
    id INTEGER NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    digest TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    error_type TEXT,
    error_message TEXT,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (action_id, id)
) WITHOUT ROWID;
-- Each task a ``run`` completed, durable before its next task started: what a resume gives its new job's worker.
CREATE TABLE IF NOT EXISTS tasks_done (
    action_id TEXT NOT NULL,
    task_index INTEGER NOT NULL,
    fingerprint TEXT NOT NULL,
    output BLOB NOT NULL,
    PRIMARY KEY (action_id, task_index)
) WITHOUT ROWID;
-- A ``run``'s input as its client sent it, written with its admission: what a resume of it runs with again (kept
-- verbatim, not masked: it is the client's own, in the journal's 0600 file).
CREATE TABLE IF NOT EXISTS inputs (
    action_id TEXT PRIMARY KEY,
    input BLOB NOT NULL
);
-- Resumes: the job ``action_id`` continues ``resumed_from`` (each job resumed at most once).
CREATE TABLE IF NOT EXISTS resumes (
    action_id TEXT PRIMARY KEY,
    resumed_from TEXT NOT NULL UNIQUE
);
-- Each job that was resumed, written with its resume's admission and kept until its own record is archived (or
-- quarantined): the link above goes with the resume's record, and the job must not be resumed a second time.
CREATE TABLE IF NOT EXISTS resumed (
    action_id TEXT PRIMARY KEY
);
-- A traced job's trace (supervisor/jobs/tracing.py): its trace id and its root span's id, written with its admission
-- when an OTLP endpoint is set (none for a job not traced): what its view links to, and a resume's trace to.
CREATE TABLE IF NOT EXISTS traces (
    action_id TEXT PRIMARY KEY,
    trace_id TEXT NOT NULL,
    span_id TEXT NOT NULL
);
-- Records found inconsistent at open (supervisor/journal/quarantine.py): what was wrong with each, and when. The
-- action id stays taken: admission refuses it, and restart fencing kills what its job left, at every start.
CREATE TABLE IF NOT EXISTS quarantine (
    action_id TEXT PRIMARY KEY,
    problem TEXT NOT NULL,
    quarantined_at REAL NOT NULL
);
-- Their rows, moved here as they were, for whoever finds out how they came to be: each table has the columns of
-- the one it mirrors (and none of its constraints: a row is kept whatever it holds). A schema change that adds a
-- column to one of these tables adds it to its mirror too.
CREATE TABLE IF NOT EXISTS quarantined_jobs AS SELECT * FROM jobs WHERE 0;
CREATE TABLE IF NOT EXISTS quarantined_events AS SELECT * FROM events WHERE 0;
CREATE TABLE IF NOT EXISTS quarantined_outputs AS SELECT * FROM outputs WHERE 0;
CREATE TABLE IF NOT EXISTS quarantined_stacks AS SELECT * FROM stacks WHERE 0;
CREATE TABLE IF NOT EXISTS quarantined_effects AS SELECT * FROM effects WHERE 0;
CREATE TABLE IF NOT EXISTS quarantined_tasks_done AS SELECT * FROM tasks_done WHERE 0;
CREATE TABLE IF NOT EXISTS quarantined_resumes AS SELECT * FROM resumes WHERE 0;
CREATE TABLE IF NOT EXISTS quarantined_inputs AS SELECT * FROM inputs WHERE 0;
CREATE TABLE IF NOT EXISTS quarantined_resumed AS SELECT * FROM resumed WHERE 0;
CREATE TABLE IF NOT EXISTS quarantined_traces AS SELECT * FROM traces WHERE 0;
"""
# Every table that holds a record's rows, by its action id.
MIRRORED = ("jobs", "events", "outputs", "stacks", "effects", "tasks_done", "resumes", "inputs", "resumed", "traces")


# Per job: events numbered 0..event_count-1, at most one terminal event, it comes last, and the
# status agrees with it. Events of unknown jobs are also inconsistent. A worker's captured output (and its
# last stacks) is written with its job's terminal event, in the same commit: it belongs to a known, terminal
# job, and its tails fit in its totals (text decoded from at most the bytes counted, so never more characters,
# and redacted without growing: ``redaction.redact_within``). A job's effect ledger and completed tasks belong to a
# known job, and an ended job has no call ``running`` (its end made them ``uncertain``, in the same commit). Every
# problem of every record, an action id as often as it has problems.
INCONSISTENT = f"""
WITH summary AS (
    SELECT action_id, count(*) AS n, min(sequence) AS lo, max(sequence) AS hi,
           sum(event IN {TERMINAL}) AS terminals,
           max(CASE WHEN event IN {TERMINAL} THEN sequence END) AS terminal_at,
           max(CASE WHEN event IN {TERMINAL} THEN event END) AS terminal
    FROM events GROUP BY action_id
)
SELECT j.action_id,
       CASE WHEN coalesce(s.n, 0) != j.event_count THEN 'event count differs from its events'
            WHEN s.n > 0 AND (s.lo != 0 OR s.hi != s.n - 1) THEN 'event sequences are not contiguous from 0'
            WHEN s.terminals > 1 THEN 'more than one terminal event'
            WHEN s.terminals = 1 AND s.terminal_at != s.hi THEN 'events follow the terminal event'
            WHEN j.status = {RUNNING} AND s.terminals = 1 THEN 'running with a terminal event'
            WHEN j.status != {RUNNING} AND coalesce(s.terminal, '') != j.status THEN 'status without its terminal event'
       END AS problem
FROM jobs AS j LEFT JOIN summary AS s USING (action_id)
WHERE problem IS NOT NULL
UNION ALL
SELECT action_id, 'events of an unknown job' FROM summary WHERE action_id NOT IN (SELECT action_id FROM jobs)
UNION ALL
SELECT o.action_id,
       CASE WHEN j.action_id IS NULL THEN 'worker output of an unknown job'
            WHEN j.status = {RUNNING} THEN 'running with its worker output recorded'
            WHEN length(o.stdout) > o.stdout_total OR length(o.stderr) > o.stderr_total
                THEN 'worker output longer than its byte count'
       END AS problem
FROM outputs AS o LEFT JOIN jobs AS j USING (action_id)
WHERE problem IS NOT NULL
UNION ALL
SELECT s.action_id,
       CASE WHEN j.action_id IS NULL THEN 'stacks of an unknown job'
            WHEN j.status = {RUNNING} THEN 'running with its last stacks recorded'
       END AS problem
FROM stacks AS s LEFT JOIN jobs AS j USING (action_id)
WHERE problem IS NOT NULL
UNION ALL
SELECT DISTINCT e.action_id,
       CASE WHEN j.action_id IS NULL THEN 'effects of an unknown job'
            WHEN j.status != {RUNNING} AND e.status = '{EffectStatus.RUNNING}' THEN 'a running effect in an ended job'
       END AS problem
FROM effects AS e LEFT JOIN jobs AS j USING (action_id)
WHERE problem IS NOT NULL
UNION ALL
SELECT DISTINCT action_id, 'completed tasks of an unknown job' FROM tasks_done
WHERE action_id NOT IN (SELECT action_id FROM jobs)
"""
