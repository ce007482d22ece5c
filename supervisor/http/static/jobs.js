// The job list: GET /jobs with its filters and keyset pages.

import { getJSON } from "./api.js";
import { ENDED, LIVE_PHASES, OPERATION } from "./names.js";
import { $, cell, clock, duration, handle, ident, jobLink, state, viewError } from "./page.js";

const JOBS_PER_PAGE = 25; // #/jobs?limit=N asks for another (1 to 500, the API's bound)
const PHASES = new Set(LIVE_PHASES); // the API's `phase`: filtered as such

// The filters offer what a job may be (where it is while it runs, else how it ended) and every operation, as the
// server names them (names.js).
offer($("filters").elements.status, [...LIVE_PHASES, ...ENDED]);
offer($("filters").elements.operation, Object.values(OPERATION));

function offer(select, names) {
  select.append(...names.map((name) => new Option(name)));
}

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
  const took = job.ended_at == null ? null : duration(job.ended_at - job.admitted_at);
  const reason = cell(job.reason, "reason");
  reason.title = job.reason ?? "";
  row.append(id, cell(ident(job.crew_id)), cell(job.operation), status, cell(job.event_count));
  row.append(cell(clock(job.admitted_at)), cell(took), reason);
  return row;
}
