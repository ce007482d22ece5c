// The operator console (supervisor/http/webconsole.py serves it). One module, no dependencies, no inline script.
// Everything the server sends is put in the page as text (textContent), never as HTML: job ids, crew output and
// cancel reasons are chosen by clients and crews.

const TOKEN_KEY = "crew-supervisor.token"; // sessionStorage: this tab only, gone when it closes
const REFRESH_MS = 1000; // /health and the open view, fetched together
const CALL_MS = 5000; // a call unanswered this long: the supervisor is "not answering" (the next tick retries)
const CANCEL_MS = 120000; // a cancel answers once the kill is confirmed: after STOP_GRACE_MS (at most 60 s)
const SILENCE_MS = 60000; // a followed stream with no byte this long is reconnected (keep-alives: every 15 s)
const HISTORY = 30; // samples per sparkline: half a minute at REFRESH_MS
const JOBS_PER_PAGE = 25; // #/jobs?limit=N asks for another (1 to 500, the API's bound)
const EVENTS_SHOWN = 2000; // the oldest leave the page beyond this
const MAX_FRAME_CHARS = 16 * 1024 * 1024; // an SSE frame larger than this ends the stream (events are <= 4 MiB)
const RECONNECT_MS = 1000;
const RESTART_NOTICE_MS = 15000;
const TERMINAL = new Set(["completed", "failed", "cancelled"]);
const SVG = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);

class Unauthorized extends Error {}
class Unreachable extends Error {}
class Refused extends Error {
  constructor(status, detail) {
    super(`${status}: ${detail}`);
    this.status = status;
  }
}

const session = {
  token: sessionStorage.getItem(TOKEN_KEY),
  signedIn: false,
  instance: null,
  restartNoticeUntil: 0,
  // The open view: its refresh (called on every tick) and the signal that ends it. Leaving a view aborts its
  // calls and streams, and whatever of them still answers is dropped: a slow answer for one job never lands in
  // the next one's page.
  view: { refresh: null, controller: new AbortController() },
  busy: false,
};

// The API -------------------------------------------------------------------------------------------------------

// `signal` ends the call with its view; `timeout` (ms, or null for a stream) bounds the whole answer, body too.
async function call(path, { signal, timeout = CALL_MS, ...init } = {}) {
  const headers = new Headers(init.headers);
  if (session.token) headers.set("Authorization", `Bearer ${session.token}`);
  const deadline = timeout === null ? null : AbortSignal.timeout(timeout);
  const signals = [signal, deadline].filter(Boolean);
  let response;
  try {
    response = await fetch(path, {
      ...init,
      headers,
      signal: signals.length ? AbortSignal.any(signals) : undefined,
      cache: "no-store",
      credentials: "omit",
    });
  } catch (error) {
    if (signal?.aborted) throw error;
    if (deadline?.aborted) throw new Unreachable(`the supervisor did not answer within ${timeout / 1000} s`);
    throw new Unreachable("the supervisor is not answering");
  }
  if (response.status === 401) throw new Unauthorized("the supervisor refused the token");
  if (!response.ok) {
    let detail = response.statusText;
    try {
      detail = (await response.json()).detail ?? detail;
    } catch {
      // not JSON: keep the status text
    }
    throw new Refused(response.status, typeof detail === "string" ? detail : JSON.stringify(detail));
  }
  return response;
}

async function getJSON(path, options) {
  try {
    return await (await call(path, options)).json();
  } catch (error) {
    if (error instanceof SyntaxError) throw new Error(`${path} answered something other than JSON`);
    if (error.name === "TimeoutError") throw new Unreachable("the supervisor stopped answering mid-way");
    throw error;
  }
}

const jobPath = (id) => `/jobs/${encodeURIComponent(id)}`;

// Server-sent events, read from a fetch body (EventSource cannot send the Authorization header). Lines end at
// CRLF, CR or LF; a field's value loses one leading space; data lines join with LF; comments and other fields are
// skipped; a frame without data is nothing; a partial frame at the end of a dropped stream is discarded. A stream
// silent for SILENCE_MS (the server sends a keep-alive comment while idle) counts as dropped.
async function* readEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let data = [];
  try {
    for (;;) {
      let timer;
      const silence = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Unreachable(`no byte for ${SILENCE_MS / 1000} s`)), SILENCE_MS);
      });
      let chunk;
      try {
        chunk = await Promise.race([reader.read(), silence]);
      } finally {
        clearTimeout(timer);
      }
      if (chunk.done) return;
      buffer += chunk.value;
      let end;
      while ((end = /\r\n|\r|\n/.exec(buffer)) !== null) {
        if (end[0] === "\r" && end.index === buffer.length - 1) break; // maybe the first half of a CRLF
        const line = buffer.slice(0, end.index);
        buffer = buffer.slice(end.index + end[0].length);
        if (line === "") {
          if (data.length) yield JSON.parse(data.join("\n"));
          data = [];
        } else if (line === "data") {
          data.push("");
        } else if (line.startsWith("data:")) {
          data.push(line.slice(line[5] === " " ? 6 : 5));
        }
      }
      if (buffer.length + data.reduce((sum, part) => sum + part.length, 0) > MAX_FRAME_CHARS) {
        throw new Error("an event larger than the console reads");
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

// Signing in ----------------------------------------------------------------------------------------------------

function showLogin(message) {
  session.signedIn = false;
  closeView();
  clearData();
  for (const id of ["health", "nav", "banner", "view-error", "workers-view", "jobs-view", "job-view"]) {
    $(id).hidden = true;
  }
  $("login").hidden = false;
  $("login-error").textContent = message ?? "";
  $("token").value = "";
  $("token").focus();
}

function forget(message) {
  session.token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  showLogin(message);
}

async function signIn(token) {
  session.token = token;
  try {
    new Headers({ Authorization: `Bearer ${token}` }); // throws on characters a header cannot carry
  } catch {
    forget("That is not a token: it holds characters a header cannot carry.");
    return;
  }
  let health;
  try {
    health = await getJSON("/health");
  } catch (error) {
    if (error instanceof Unauthorized) forget("The supervisor refused that token (401). Check it and try again.");
    else showLogin(`Cannot sign in: ${error.message}.`);
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  enter(health);
}

function enter(health) {
  session.signedIn = true;
  $("login").hidden = true;
  $("login-error").textContent = "";
  $("health").hidden = false;
  $("nav").hidden = false;
  renderHealth(health);
  route();
}

// Errors of a tick: a refused token ends the session; an unanswered call says so, and the next tick retries.
function handle(error) {
  if (error instanceof Unauthorized) {
    forget("The supervisor refused the token (401): it may have restarted with another. Sign in again.");
  } else if (error instanceof Unreachable) {
    banner(`Cannot reach the supervisor (${error.message}); retrying every second…`);
  } else if (error.name !== "AbortError") {
    viewError(error.message);
  }
}

function banner(text) {
  $("banner").textContent = text;
  $("banner").hidden = false;
}

// What the open view could not do (a 404, a refused cancel), until it next succeeds.
function viewError(text) {
  $("view-error").textContent = text ?? "";
  $("view-error").hidden = !text;
}

// The header: /health -------------------------------------------------------------------------------------------

function renderHealth(health) {
  if (session.instance !== null && health.instance !== session.instance) {
    session.restartNoticeUntil = Date.now() + RESTART_NOTICE_MS;
    banner(`The supervisor restarted (instance ${health.instance}); the page follows the new one.`);
  } else if (Date.now() > session.restartNoticeUntil) {
    $("banner").hidden = true;
  }
  session.instance = health.instance;
  const status = $("health-status");
  status.textContent = health.status;
  status.className = `status-${health.status}`;
  const fork = health.forkserver;
  $("health-forkserver").textContent = fork
    ? `${fork.alive ? "alive" : "down"} · ${fork.idle_workers} idle · ${fork.restarts} restarts` +
      (fork.refused ? ` · ${fork.refused} refused` : "")
    : `none (${health.launcher} launcher)`;
  $("health-limits").textContent = `memory ${health.memory_limit} · processes ${health.process_limit}`;
  $("health-jobs").textContent =
    `${health.active_runs} active · ${health.retained_runs} / ${health.max_retained_runs} retained`;
}

// Every REFRESH_MS: /health and the open view's refresh side by side. A tick still waiting (at most CALL_MS)
// makes the next one wait its turn rather than pile calls onto a slow supervisor.
async function tick() {
  if (session.busy || !session.signedIn) return;
  session.busy = true;
  const view = session.view;
  const signal = view.controller.signal;
  try {
    const [health] = await Promise.all([getJSON("/health", { signal }), view.refresh?.(signal)]);
    if (!signal.aborted) renderHealth(health);
  } catch (error) {
    if (!signal.aborted) handle(error);
  } finally {
    session.busy = false;
  }
}

// Views ---------------------------------------------------------------------------------------------------------

function closeView() {
  session.view.controller.abort();
  session.view = { refresh: null, controller: new AbortController() };
}

function clearData() {
  for (const id of ["workers", "jobs"]) $(id).tBodies[0].replaceChildren();
  for (const id of ["job-record", "events", "stdout", "stderr", "evidence", "job-evidence"]) {
    $(id).replaceChildren();
  }
  for (const id of ["health-status", "health-forkserver", "health-limits", "health-jobs", "job-id"]) {
    $(id).textContent = "";
  }
  for (const id of ["stdout-total", "stderr-total", "events-state", "jobs-page", "workers-updated", "view-error"]) {
    $(id).textContent = "";
  }
  workerRows.clear();
  samples.clear();
}

function route() {
  if (!session.signedIn) return;
  closeView();
  viewError(null);
  const [path, query] = location.hash.slice(1).split("?");
  for (const id of ["workers-view", "jobs-view", "job-view"]) $(id).hidden = true;
  const signal = session.view.controller.signal;
  let current = "/workers";
  if (path.startsWith("/job/")) {
    current = null;
    let id;
    try {
      id = decodeURIComponent(path.slice("/job/".length));
    } catch {
      viewError("This address names no job: its id is not valid percent-encoding.");
      return;
    }
    openJob(id, signal);
  } else if (path === "/jobs") {
    current = "/jobs";
    openJobs(new URLSearchParams(query ?? ""), signal);
  } else {
    openWorkers();
  }
  for (const link of $("nav").querySelectorAll("a")) {
    const here = link.getAttribute("href") === `#${current}`;
    link.classList.toggle("current", here);
    if (here) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  tick();
}

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text ?? "–";
  if (className) td.className = className;
  return td;
}

function jobLink(id) {
  const a = document.createElement("a");
  a.href = `#/job/${encodeURIComponent(id)}`;
  a.textContent = id;
  return a;
}

function megabytes(bytes) {
  return bytes == null ? "–" : `${(bytes / 1048576).toFixed(1)} MiB`;
}

function duration(seconds) {
  if (seconds == null) return "–";
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.floor(seconds % 60)} s`;
  return `${Math.floor(seconds / 3600)} h ${Math.floor((seconds % 3600) / 60)} min`;
}

// The last HISTORY samples, the newest at the right edge, scaled from `low` (or the samples' least) to their most.
function sparkline(values, low) {
  const width = 90;
  const height = 18;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("aria-hidden", "true");
  const bottom = low ?? Math.min(...values);
  const range = Math.max(...values) - bottom;
  const step = width / (HISTORY - 1);
  const start = HISTORY - values.length;
  const y = (v) => (range > 0 ? height - 2 - ((v - bottom) / range) * (height - 4) : height / 2);
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", values.map((v, i) => `${((start + i) * step).toFixed(1)},${y(v).toFixed(1)}`).join(" "));
  svg.append(line);
  return svg;
}

// Workers: GET /workers every tick ------------------------------------------------------------------------------

const workerRows = new Map(); // action_id -> {row, cells, button, worker}
const samples = new Map(); // action_id -> {rss: [], cpu: []}

function openWorkers() {
  $("workers-view").hidden = false;
  $("evidence").hidden = true;
  session.view.refresh = refreshWorkers;
}

async function refreshWorkers(signal) {
  const { workers } = await getJSON("/workers", { signal });
  if (signal.aborted) return;
  const body = $("workers").tBodies[0];
  const present = new Set();
  for (const worker of workers) {
    present.add(worker.action_id);
    const history = samples.get(worker.action_id) ?? { rss: [], cpu: [] };
    samples.set(worker.action_id, history);
    if (worker.rss_bytes != null) history.rss = [...history.rss, worker.rss_bytes].slice(-HISTORY);
    if (worker.cpu_percent != null) history.cpu = [...history.cpu, worker.cpu_percent].slice(-HISTORY);
    let entry = workerRows.get(worker.action_id);
    if (!entry) {
      entry = workerRow(worker);
      workerRows.set(worker.action_id, entry);
      body.append(entry.row);
    }
    entry.worker = worker;
    const [phase, pid, rss, cpu, processes, age, events] = entry.cells;
    phase.textContent = worker.phase;
    phase.className = `phase status-${worker.phase}`;
    pid.textContent = worker.pid ?? "–";
    rss.replaceChildren(megabytes(worker.rss_bytes), sparkline(history.rss));
    const percent = worker.cpu_percent == null ? "–" : `${worker.cpu_percent.toFixed(0)} %`;
    cpu.replaceChildren(percent, sparkline(history.cpu, 0));
    processes.textContent = worker.processes ?? "–";
    age.textContent = duration(worker.age_seconds);
    events.textContent = worker.event_count;
  }
  for (const [id, entry] of workerRows) {
    if (!present.has(id)) {
      entry.row.remove();
      workerRows.delete(id);
      samples.delete(id);
    }
  }
  $("workers-empty").hidden = workers.length > 0;
  $("workers-updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
}

function workerRow(worker) {
  const row = document.createElement("tr");
  row.dataset.actionId = worker.action_id;
  const link = cell("", "id");
  link.replaceChildren(jobLink(worker.action_id));
  const cells = ["phase", "pid", "rss", "cpu", "processes", "age", "events"].map((name) => cell("", name));
  const button = cancelButton(worker.action_id);
  const entry = { row, cells, button, worker };
  button.addEventListener("click", () => cancel(entry.worker, button, $("evidence"), session.view.controller.signal));
  const action = cell("");
  action.append(button);
  row.append(link, cell(worker.crew_id), cell(worker.operation), ...cells, action);
  return entry;
}

// Cancel, and the evidence that the work stopped -----------------------------------------------------------------

function cancelButton(id) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "danger";
  button.textContent = "Cancel";
  button.setAttribute("aria-label", `Cancel ${id}`);
  return button;
}

// The call is not aborted with its view (the kill goes on whatever the page shows next), but its answer is shown
// only in the view that asked.
async function cancel(job, button, box, signal) {
  if (!window.confirm(`Cancel ${job.action_id}? Its worker and every process it started are killed.`)) return;
  button.disabled = true;
  button.textContent = "Cancelling…";
  try {
    const record = await getJSON(`${jobPath(job.action_id)}/cancel`, {
      method: "POST",
      timeout: CANCEL_MS,
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ action_id: job.action_id, crew_id: job.crew_id, reason: "cancelled from the console" }),
    });
    if (!signal.aborted) showEvidence(box, record);
  } catch (error) {
    if (signal.aborted) return;
    if (error instanceof Refused) showEvidence(box, null, `Cancel of ${job.action_id} refused: ${error.message}`);
    else handle(error);
  } finally {
    button.disabled = false;
    button.textContent = "Cancel";
  }
}

function showEvidence(box, record, failure) {
  const title = document.createElement("strong");
  const detail = document.createElement("span");
  const terminal = record?.terminal ?? {};
  if (failure) {
    title.textContent = failure;
  } else if (record.status !== "cancelled") {
    title.textContent = `${record.action_id} had already ended: ${record.status}`;
  } else if (terminal.launched === false) {
    title.textContent = `${record.action_id} cancelled before it started: no process ran`;
  } else {
    const confirmed = terminal.stop_confirmed ? "stop confirmed" : "stop NOT confirmed";
    title.textContent = `${record.action_id} cancelled: ${confirmed}`;
    detail.textContent =
      `worker pid ${terminal.pid} (process group ${terminal.pgid}) sent ${terminal.signal}; ` +
      `exit status ${terminal.exit_status}; ${terminal.descendants_killed} other process(es) killed; ` +
      `${terminal.elapsed_ms} ms`;
  }
  box.replaceChildren(title, detail);
  box.hidden = false;
}

// Jobs: GET /jobs with its filters and keyset pages ---------------------------------------------------------------

function openJobs(params, signal) {
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
  session.view.refresh = async () => {
    if (ticks++ % 3 === 0) await load(); // every third tick: a list being read should not jump every second
  };
}

function jobRow(job) {
  const row = document.createElement("tr");
  const id = cell("", "id");
  id.append(jobLink(job.action_id));
  const status = cell(job.status, `status-${job.status}`);
  row.append(id, cell(job.crew_id), cell(job.operation), status, cell(job.event_count));
  row.append(cell(new Date(job.admitted_at * 1000).toLocaleString()));
  return row;
}

// One job: its record, its events followed live, its output tails ------------------------------------------------

function openJob(id, signal) {
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
  session.view.refresh = async () => {
    if (!known || ticks++ % 2) return;
    try {
      await refresh();
    } catch (error) {
      if (!(error instanceof Refused)) throw error;
      viewError(error.message);
      known = error.status !== 404 && error.status !== 422; // no such job: asking again will not make one
    }
  };
  follow(id, signal, () => {
    live = true; // read the final tails once more
    ticks = 0;
  });
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
    ["status", job.status],
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

// Start ---------------------------------------------------------------------------------------------------------

$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  signIn($("token").value.trim());
});
$("forget").addEventListener("click", () => forget("Token forgotten."));
window.addEventListener("hashchange", route);
setInterval(tick, REFRESH_MS);

// A token kept in this tab, or none where the supervisor asks for none (a loopback dev server).
(async function start() {
  try {
    enter(await getJSON("/health"));
  } catch (error) {
    if (error instanceof Unauthorized) {
      showLogin(session.token ? "The saved token was refused (401). Sign in again." : "");
    } else {
      banner(`Cannot reach the supervisor (${error.message}); retrying every second…`);
      setTimeout(start, RECONNECT_MS);
    }
  }
})();
