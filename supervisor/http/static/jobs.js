// The job list (GET /jobs with its filters and keyset pages) and one job: its record, its events followed live,
// its output tails.

import { RECONNECT_MS, Refused, Unauthorized, Unreachable, call, getJSON, jobPath, readEvents } from "./api.js";
import { $, cell, handle, jobLink, viewError } from "./page.js";
import { cancel } from "./workers.js";

const JOBS_PER_PAGE = 25; // #/jobs?limit=N asks for another (1 to 500, the API's bound)
const EVENTS_SHOWN = 2000; // the oldest leave the page beyond this
const TERMINAL = new Set(["completed", "failed", "cancelled"]);
// A job's one word, as the CLI shows it: where it is while it runs (the API's `phase`), else its status.
const PHASES = new Set(["queued", "launching", "running", "settling"]);
const state = (job) => job.phase ?? job.status;

// Shows the view; returns its refresh.
export function openJobs(params, signal) {
  $("jobs-view").hidden = false;
  const form = $("filters");
  for (const name of ["status", "crew_id", "operation"]) form.elements[name].value = params.get(name) ?? "";
  const limit = Math.min(Math.max(Math.floor(Number(params.get("limit"))) || JOBS_PER_PAGE, 1), 500);
  const cursors = [null]; // the cursor of each page seen, the first page's being none
  let page = 0;
  let next = null;
  let ticks = 0;
  let latest = 0; // only the newest load is shown: a reload from a tick may answer after a page turn
  async function load() {
    const mine = ++latest;
    const query = new URLSearchParams();
    for (const name of ["status", "crew_id", "operation"]) if (params.get(name)) query.set(name, params.get(name));
    const status = query.get("status");
    if (PHASES.has(status)) {
      query.delete("status");
      query.set("phase", status);
    }
    query.set("limit", limit);
    if (cursors[page]) query.set("cursor", cursors[page]);
    const { jobs, next_cursor } = await getJSON(`/jobs?${query}`, { signal });
    if (signal.aborted || mine !== latest) return;
    next = next_cursor;
    viewError(null);
    $("jobs").tBodies[0].replaceChildren(...jobs.map(jobRow));
    $("jobs-empty").hidden = jobs.length > 0;
    $("jobs-older").disabled = !next;
    $("jobs-newer").disabled = page === 0;
    $("jobs-page").textContent = `page ${page + 1}`;
  }
  const turn = (by) => {
    if (by > 0) cursors[page + 1] = next;
    page += by;
    load().catch((error) => signal.aborted || handle(error));
  };
  $("jobs-older").onclick = () => turn(1);
  $("jobs-newer").onclick = () => turn(-1);
  form.onsubmit = (event) => {
    event.preventDefault();
    const query = new URLSearchParams();
    for (const [name, value] of new FormData(form)) if (value) query.set(name, value);
    if (params.get("limit")) query.set("limit", limit);
    location.hash = `#/jobs${query.size ? `?${query}` : ""}`;
  };
  return async () => {
    if (ticks++ % 3 === 0) await load(); // every third tick: a list being read should not jump every second
  };
}

function jobRow(job) {
  const row = document.createElement("tr");
  const id = cell("", "id");
  id.append(jobLink(job.action_id));
  const status = cell(state(job), `status-${state(job)}`);
  row.append(id, cell(job.crew_id), cell(job.operation), status, cell(job.event_count));
  row.append(cell(new Date(job.admitted_at * 1000).toLocaleString()));
  return row;
}

// One job: its record, its events followed live, its output tails ------------------------------------------------

// Shows the view and follows the job's events; returns its refresh.
export function openJob(id, signal) {
  $("job-view").hidden = false;
  $("job-id").textContent = id;
  for (const box of ["job-record", "events", "stdout", "stderr", "job-evidence"]) $(box).replaceChildren();
  for (const text of ["stdout-total", "stderr-total", "events-state"]) $(text).textContent = "";
  $("job-evidence").hidden = true;
  $("events-dropped").hidden = true;
  const cancelJob = $("job-cancel");
  cancelJob.hidden = true;
  cancelJob.setAttribute("aria-label", `Cancel ${id}`);
  let record = null;
  let live = true;
  let known = true;
  let ticks = 0;
  cancelJob.onclick = () => record && cancel(record, cancelJob, $("job-evidence"), signal);

  async function refresh() {
    const answer = await getJSON(jobPath(id), { signal });
    if (signal.aborted) return;
    record = answer;
    renderRecord(record);
    if (live) {
      const output = await getJSON(`${jobPath(id)}/output`, { signal });
      if (signal.aborted) return;
      renderTail("stdout", output.stdout);
      renderTail("stderr", output.stderr);
      live = output.live; // once settled the journal's copy is final: read no more
    }
  }
  follow(id, signal, () => {
    live = true; // read the final tails once more
    ticks = 0;
  });
  return async () => {
    if (!known || ticks++ % 2) return;
    try {
      await refresh();
    } catch (error) {
      if (!(error instanceof Refused)) throw error;
      viewError(error.message);
      known = error.status !== 404 && error.status !== 422; // no such job: asking again will not make one
    }
  };
}

// Follows a job's events to its terminal one. Only a supervisor that cannot be reached is retried (resuming
// after the last event shown); anything else it answers is shown and ends the following.
async function follow(id, signal, ended) {
  const state = $("events-state");
  let last = null;
  let dropped = 0;
  while (!signal.aborted) {
    let terminal = null;
    try {
      const headers = { Accept: "text/event-stream" };
      if (last !== null) headers["Last-Event-ID"] = String(last);
      state.textContent = last === null ? "following…" : `following (resumed after event ${last})…`;
      const response = await call(`${jobPath(id)}/events`, { headers, signal, timeout: null });
      for await (const event of readEvents(response.body)) {
        if (signal.aborted) return;
        dropped += addEvent(event);
        last = event.sequence;
        if (TERMINAL.has(event.event)) terminal = event.event;
      }
    } catch (error) {
      if (signal.aborted) return;
      if (error instanceof Unauthorized) return handle(error);
      if (!(error instanceof Unreachable) && error.name !== "TypeError") {
        state.textContent = `stopped following: ${error.message}`;
        return;
      }
    }
    if (dropped) {
      $("events-dropped").hidden = false;
      $("events-dropped").textContent = `${dropped} earlier events are not shown here.`;
    }
    if (terminal) {
      state.textContent = `ended: ${terminal}`;
      ended();
      return;
    }
    state.textContent = `connection lost after event ${last ?? "none"}; reconnecting…`;
    await new Promise((resume) => setTimeout(resume, RECONNECT_MS));
  }
}

function addEvent(event) {
  const list = $("events");
  const item = document.createElement("li");
  item.dataset.event = event.event;
  const seq = document.createElement("span");
  seq.className = "seq";
  seq.textContent = event.sequence;
  const name = document.createElement("span");
  name.className = `name status-${event.event}`;
  name.textContent = event.event;
  const data = event.event === "chunk" ? String(event.data?.content ?? "") : JSON.stringify(event.data);
  item.append(seq, name, data.length > 2000 ? `${data.slice(0, 2000)}…` : data);
  list.append(item);
  if (list.childElementCount <= EVENTS_SHOWN) return 0;
  list.firstElementChild.remove();
  return 1;
}

function renderRecord(job) {
  const rows = [
    ["crew", job.crew_id],
    ["operation", job.operation],
    ["status", state(job)],
    ["events", job.event_count],
    ["exit status", job.exit_status],
    ["terminal", job.terminal && JSON.stringify(job.terminal)],
    ["output", job.output && JSON.stringify(job.output).slice(0, 4000)],
  ];
  const list = $("job-record");
  list.replaceChildren();
  for (const [name, value] of rows) {
    if (value == null) continue;
    const dt = document.createElement("dt");
    dt.textContent = name;
    const dd = document.createElement("dd");
    dd.textContent = value;
    if (name === "status") dd.className = `status-${value}`;
    list.append(dt, dd);
  }
  $("job-cancel").hidden = job.status !== "running";
}

function renderTail(name, stream) {
  $(name).textContent = stream.text;
  const shown = new TextEncoder().encode(stream.text).length;
  $(`${name}-total`).textContent =
    stream.total_bytes > shown ? `last ${shown} of ${stream.total_bytes} bytes` : `${stream.total_bytes} bytes`;
}
