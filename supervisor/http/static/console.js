// The operator console (supervisor/http/webconsole.py serves it). One module, no dependencies, no inline script.
// Everything the server sends is put in the page as text (textContent), never as HTML: job ids, crew output and
// cancel reasons are chosen by clients and crews.

const TOKEN_KEY = "crew-supervisor.token"; // sessionStorage: this tab only, gone when it closes
const REFRESH_MS = 1000; // /health and the open view
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
  refresh: null, // the open view's refresh, called on every tick
  close: null, // the open view's clean-up (an event stream to abort)
  busy: false,
};

// The API -------------------------------------------------------------------------------------------------------

async function call(path, init = {}) {
  const headers = new Headers(init.headers);
  if (session.token) headers.set("Authorization", `Bearer ${session.token}`);
  let response;
  try {
    response = await fetch(path, { ...init, headers, cache: "no-store", credentials: "omit" });
  } catch (error) {
    if (error.name === "AbortError") throw error;
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

const getJSON = async (path, init) => (await call(path, init)).json();
const jobPath = (id) => `/jobs/${encodeURIComponent(id)}`;

// Server-sent events, read from a fetch body (EventSource cannot send the Authorization header). Lines end at
// CRLF, CR or LF; a field's value loses one leading space; data lines join with LF; comments and other fields are
// skipped; a frame without data is nothing; a partial frame at the end of a dropped stream is discarded.
async function* readEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let data = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = /\r\n|\r|\n/.exec(buffer)) !== null) {
        if (end[0] === "\r" && end.index === buffer.length - 1) break; // maybe the first half of a CRLF
        const line = buffer.slice(0, end.index);
        buffer = buffer.slice(end.index + end[0].length);
        if (line === "") {
          if (data.length) yield JSON.parse(data.join("\n"));
          data = [];
        } else if (line.startsWith("data")) {
          const colon = line.indexOf(":");
          if (colon === 4) data.push(line.slice(line[5] === " " ? 6 : 5));
          else if (line === "data") data.push("");
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
  for (const id of ["health", "nav", "banner", "workers-view", "jobs-view", "job-view"]) $(id).hidden = true;
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
  try {
    renderHealth(await getJSON("/health"));
  } catch (error) {
    if (error instanceof Unauthorized) forget("The supervisor refused that token (401). Check it and try again.");
    else showLogin(`Cannot sign in: ${error.message}.`);
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  enter();
}

function enter() {
  session.signedIn = true;
  $("login").hidden = true;
  $("login-error").textContent = "";
  $("health").hidden = false;
  $("nav").hidden = false;
  route();
}

// Errors of a refresh: a refused token ends the session, an unanswered call says so and the next tick retries.
function handle(error) {
  if (error instanceof Unauthorized) {
    forget("The supervisor refused the token (401): it may have restarted with another. Sign in again.");
  } else if (error instanceof Unreachable) {
    banner("Cannot reach the supervisor; retrying every second…");
  } else if (error.name !== "AbortError") {
    banner(`Error: ${error.message}`);
  }
}

function banner(text) {
  $("banner").textContent = text;
  $("banner").hidden = false;
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

async function tick() {
  if (session.busy || !session.signedIn) return;
  session.busy = true;
  try {
    renderHealth(await getJSON("/health"));
    if (session.refresh) await session.refresh();
  } catch (error) {
    handle(error);
  } finally {
    session.busy = false;
  }
}

// Views ---------------------------------------------------------------------------------------------------------

function closeView() {
  session.close?.();
  session.close = null;
  session.refresh = null;
}

function clearData() {
  for (const id of ["workers", "jobs"]) $(id).tBodies[0].replaceChildren();
  for (const id of ["job-record", "events", "stdout", "stderr", "evidence", "job-evidence"]) {
    $(id).replaceChildren();
  }
  workerRows.clear();
  samples.clear();
}

function route() {
  if (!session.signedIn) return;
  closeView();
  const [path, query] = location.hash.slice(1).split("?");
  for (const id of ["workers-view", "jobs-view", "job-view"]) $(id).hidden = true;
  for (const link of $("nav").querySelectorAll("a")) {
    link.classList.toggle("current", path.startsWith(link.getAttribute("href").slice(1)));
  }
  if (path.startsWith("/job/")) openJob(decodeURIComponent(path.slice("/job/".length)));
  else if (path === "/jobs") openJobs(new URLSearchParams(query ?? ""));
  else openWorkers();
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
  session.refresh = refreshWorkers;
}

async function refreshWorkers() {
  const { workers } = await getJSON("/workers");
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
    cpu.replaceChildren(worker.cpu_percent == null ? "–" : `${worker.cpu_percent.toFixed(0)} %`, sparkline(history.cpu, 0));
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
  const button = document.createElement("button");
  button.type = "button";
  button.className = "danger";
  button.textContent = "Cancel";
  const entry = { row, cells, button, worker };
  button.addEventListener("click", () => cancel(entry.worker, button, $("evidence")));
  const action = cell("");
  action.append(button);
  row.append(link, cell(worker.crew_id), cell(worker.operation), ...cells, action);
  return entry;
}

// Cancel, and the evidence that the work stopped -----------------------------------------------------------------

async function cancel(job, button, box) {
  if (!window.confirm(`Cancel ${job.action_id}? Its worker and every process it started are killed.`)) return;
  button.disabled = true;
  button.textContent = "Cancelling…";
  try {
    const record = await getJSON(`${jobPath(job.action_id)}/cancel`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ action_id: job.action_id, crew_id: job.crew_id, reason: "cancelled from the console" }),
    });
    showEvidence(box, record);
  } catch (error) {
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
    title.textContent = `${record.action_id} cancelled: ${terminal.stop_confirmed ? "stop confirmed" : "stop NOT confirmed"}`;
    detail.textContent =
      `worker pid ${terminal.pid} (process group ${terminal.pgid}) sent ${terminal.signal}; ` +
      `exit status ${terminal.exit_status}; ${terminal.descendants_killed} other process(es) killed; ` +
      `${terminal.elapsed_ms} ms`;
  }
  box.replaceChildren(title, detail);
  box.hidden = false;
}

// Jobs: GET /jobs with its filters and keyset pages ---------------------------------------------------------------

function openJobs(params) {
  $("jobs-view").hidden = false;
  const form = $("filters");
  for (const name of ["status", "crew_id", "operation"]) form.elements[name].value = params.get(name) ?? "";
  const limit = Math.min(Math.max(Math.floor(Number(params.get("limit"))) || JOBS_PER_PAGE, 1), 500);
  const cursors = [null]; // the cursor of each page seen, the first page's being none
  let page = 0;
  let next = null;
  let ticks = 0;
  async function load() {
    const query = new URLSearchParams();
    for (const name of ["status", "crew_id", "operation"]) if (params.get(name)) query.set(name, params.get(name));
    query.set("limit", limit);
    if (cursors[page]) query.set("cursor", cursors[page]);
    const { jobs, next_cursor } = await getJSON(`/jobs?${query}`);
    next = next_cursor;
    $("jobs").tBodies[0].replaceChildren(...jobs.map(jobRow));
    $("jobs-empty").hidden = jobs.length > 0;
    $("jobs-older").disabled = !next;
    $("jobs-newer").disabled = page === 0;
    $("jobs-page").textContent = `page ${page + 1}`;
  }
  const turn = (by) => {
    if (by > 0) cursors[page + 1] = next;
    page += by;
    load().catch(handle);
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
  session.refresh = async () => {
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

function openJob(id) {
  $("job-view").hidden = false;
  $("job-id").textContent = id;
  for (const box of ["job-record", "events", "stdout", "stderr", "job-evidence"]) $(box).replaceChildren();
  $("job-evidence").hidden = true;
  $("events-dropped").hidden = true;
  $("job-cancel").hidden = true;
  const stream = new AbortController();
  session.close = () => stream.abort();
  let record = null;
  let live = true;
  let ticks = 0;
  $("job-cancel").onclick = () => record && cancel(record, $("job-cancel"), $("job-evidence"));

  async function refresh() {
    record = await getJSON(jobPath(id));
    renderRecord(record);
    if (live) {
      const output = await getJSON(`${jobPath(id)}/output`);
      renderTail("stdout", output.stdout);
      renderTail("stderr", output.stderr);
      live = output.live; // once settled the journal's copy is final: read no more
    }
  }
  session.refresh = async () => {
    if (ticks++ % 2 === 0) {
      try {
        await refresh();
      } catch (error) {
        if (!(error instanceof Refused)) throw error;
        $("events-state").textContent = error.message;
      }
    }
  };
  follow(id, stream.signal, () => {
    live = true; // read the final tails once more
    ticks = 0;
  });
}

async function follow(id, signal, ended) {
  const state = $("events-state");
  let last = null;
  let dropped = 0;
  while (!signal.aborted) {
    let terminal = null;
    try {
      const headers = { Accept: "text/event-stream" };
      if (last !== null) headers["Last-Event-ID"] = String(last); // resume after the last event shown
      state.textContent = last === null ? "following…" : `following (resumed after event ${last})…`;
      const response = await call(`${jobPath(id)}/events`, { headers, signal });
      for await (const event of readEvents(response.body)) {
        dropped += addEvent(event);
        last = event.sequence;
        if (TERMINAL.has(event.event)) terminal = event.event;
      }
    } catch (error) {
      if (signal.aborted) return;
      if (error instanceof Unauthorized) return handle(error);
      if (error instanceof Refused) {
        state.textContent = error.message;
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
    if (signal.aborted) return;
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
    renderHealth(await getJSON("/health"));
    enter();
  } catch (error) {
    if (error instanceof Unauthorized) {
      showLogin(session.token ? "The saved token was refused (401). Sign in again." : "");
    } else {
      banner(`Cannot reach the supervisor (${error.message}); retrying every second…`);
      setTimeout(start, RECONNECT_MS);
    }
  }
})();
