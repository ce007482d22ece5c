// One job: what it answered or why it did not, its record, its effect ledger, its events followed live, its output
// tails.

import { RECONNECT_MS, Refused, Unauthorized, Unreachable, call, getJSON, jobPath, readEvents } from "./api.js";
import { clearEffects, renderEffects } from "./effects.js";
import { EVENT, REASON, STATUS, TERMINAL_EVENTS } from "./names.js";
import { $, clock, duration, handle, ident, state, stopConfirmed, stopProof, viewError } from "./page.js";
import { cancel } from "./workers.js";

const EVENTS_SHOWN = 2000; // the oldest leave the page beyond this
const TERMINAL = new Set(TERMINAL_EVENTS);
const TRACEBACK = "Traceback (most recent call last):"; // where a worker wrote a crew's exception whole
// A failure's `reason`, in words (the code itself for any other).
const REASONS = {
  [REASON.TIMEOUT]: "it reached its timeout",
  [REASON.OPERATION_FAILED]: "the crew raised an error",
  [REASON.CREW_FACTORY_FAILED]: "its crew could not be built",
  [REASON.REGISTRY_ERROR]: "the registry could not be loaded",
  [REASON.LAUNCH_FAILED]: "no worker could be started for it",
  [REASON.SUPERVISOR_RESTARTED]: "the supervisor restarted while it ran",
  [REASON.SUPERVISOR_STOPPED]: "the supervisor stopped before it finished",
  [REASON.MEMORY_LIMIT_EXCEEDED]: "it went over its memory limit",
  [REASON.CPU_LIMIT_EXCEEDED]: "it went over its CPU limit",
  [REASON.PROCESS_LIMIT_EXCEEDED]: "it started too many processes",
  [REASON.OUTPUT_LIMIT_EXCEEDED]: "it wrote too much to stdout and stderr",
  [REASON.EVENT_LIMIT_EXCEEDED]: "it sent too many events",
  [REASON.EVENT_TOO_LARGE]: "an event or its output was too large",
  [REASON.TOKEN_LIMIT_EXCEEDED]: "it spent more LLM tokens than its budget",
  [REASON.LLM_CALL_LIMIT_EXCEEDED]: "it would have made more LLM calls than its budget",
  [REASON.EFFECT_LIMIT_EXCEEDED]: "it would have made more tool and LLM calls than MAX_EFFECTS",
  [REASON.STRAY_PROCESSES]: "it left processes running after it answered",
  [REASON.WORKER_EXITED]: "its worker exited without an answer",
  [REASON.WORKER_KILLED]: "its worker was killed from outside",
};
const USAGE = [
  ["total", "total_tokens"],
  ["prompt", "prompt_tokens"],
  ["completion", "completion_tokens"],
  ["cached prompt", "cached_prompt_tokens"],
  ["requests", "successful_requests"],
];

// Shows the view and follows the job's events; returns its refresh.
export function openJob(id, signal) {
  $("job-view").hidden = false;
  $("job-id").textContent = ident(id);
  for (const box of ["job-record", "events", "stdout", "stderr", "job-evidence", "job-why"]) $(box).replaceChildren();
  const texts = ["stdout-total", "stderr-total", "events-state", "answer", "raw", "stacks", "stacks-when", "raised"];
  for (const text of [...texts, "raised-summary"]) $(text).textContent = "";
  delete $("raw").dataset.drawn;
  const boxes = ["job-evidence", "job-why", "job-raised", "job-answer", "job-tasks", "job-usage", "job-stacks-box"];
  for (const box of boxes) $(box).hidden = true;
  $("events-dropped").hidden = true;
  clearEffects();
  const cancelJob = $("job-cancel");
  cancelJob.hidden = true;
  cancelJob.setAttribute("aria-label", `Cancel ${id}`);
  let record = null;
  let live = true;
  let known = true;
  let ticks = 0;
  cancelJob.onclick = () => record && cancel(record, cancelJob, $("job-evidence"), signal);
  $("job-stacks").onclick = () => showStacks(id, signal);

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
      renderRaised(record, output.stderr.text);
      const ledger = await getJSON(`${jobPath(id)}/effects`, { signal });
      if (signal.aborted) return;
      renderEffects(ledger);
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

// Every thread's stack: asked of a running job's worker (the job goes on), or those its stop kept from before its
// kill. A job with none, or a worker that cannot answer in time, says why in the same place.
async function showStacks(id, signal) {
  const button = $("job-stacks");
  button.disabled = true;
  $("job-stacks-box").hidden = false;
  $("stacks-when").textContent = "asking its worker…";
  try {
    const answer = await getJSON(`${jobPath(id)}/stack`, { signal });
    if (signal.aborted) return;
    const before = answer.before ? `, just before its ${answer.before} kill` : "";
    $("stacks-when").textContent = `taken at ${clock(answer.taken_at)}${before}`;
    $("stacks").textContent = answer.threads.map((thread) => `Thread ${thread.name}:\n${thread.stack}`).join("\n");
  } catch (error) {
    if (signal.aborted) return;
    if (!(error instanceof Refused)) {
      handle(error);
      return;
    }
    $("stacks-when").textContent = "none";
    $("stacks").textContent = error.message;
  } finally {
    button.disabled = false;
  }
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
  // A completed event's data is the output, shown above as text.
  const data =
    event.event === EVENT.CHUNK
      ? String(event.data?.content ?? "")
      : event.event === EVENT.COMPLETED
        ? "the output: shown above"
        : JSON.stringify(event.data);
  item.append(seq, name, data.length > 2000 ? `${data.slice(0, 2000)}…` : data);
  list.append(item);
  if (list.childElementCount <= EVENTS_SHOWN) return 0;
  list.firstElementChild.remove();
  return 1;
}

function renderRecord(job) {
  const ended = job.ended_at ?? Date.now() / 1000; // a running job: for how long so far
  const rows = [
    ["status", state(job)],
    ["crew", ident(job.crew_id)],
    ["operation", job.operation],
    ["admitted", clock(job.admitted_at)],
    ["ended", job.ended_at == null ? null : clock(job.ended_at)],
    [job.ended_at == null ? "running for" : "took", job.admitted_at == null ? null : duration(ended - job.admitted_at)],
    ["events", job.event_count],
    ["LLM spend", job.llm_spent && `${job.llm_spent.tokens.toLocaleString()} tokens, ${job.llm_spent.llm_calls} calls`],
    // A failed crew's worker exits 0 (it reported the error): only a worker that did not say so is news.
    ["worker exit", job.exit_status ? exitText(job.exit_status) : null],
    // What the worker left running when it exited (an MCP server, an interpreter): killed, each named.
    ...(job.leftovers?.processes ?? []).map((p) => ["left running", `${p.pid} (${p.left}, killed): ${p.command}`]),
    ["trace", job.trace_id == null ? null : traceLink(job.trace_id, job.trace_url)],
  ];
  const list = $("job-record");
  list.replaceChildren();
  for (const [name, value] of rows) {
    if (value == null) continue;
    const dt = document.createElement("dt");
    dt.textContent = name;
    const dd = document.createElement("dd");
    dd.append(value); // text, or an element (the trace's link)
    if (name === "status") dd.className = `status-${value}`;
    list.append(dt, dd);
  }
  $("job-cancel").hidden = job.status !== STATUS.RUNNING;
  // Drawn again only when it changed: a redraw would drop the text an operator is selecting to copy.
  const drawn = JSON.stringify(job);
  if ($("raw").dataset.drawn === drawn) return;
  $("raw").dataset.drawn = drawn;
  renderWhy(job);
  renderOutput(job.output);
  $("raw").textContent = JSON.stringify(job, null, 2);
}

// Why a job failed or was cancelled, in words; what the stop proved.
function renderWhy(job) {
  const box = $("job-why");
  const terminal = job.terminal ?? {};
  box.hidden = job.status !== STATUS.FAILED && job.status !== STATUS.CANCELLED;
  if (box.hidden) return;
  const title = document.createElement("strong");
  const lines = [];
  if (job.status === STATUS.CANCELLED) {
    title.textContent = `Cancelled: ${terminal.reason ?? "by request"}`;
  } else {
    const words = Object.hasOwn(REASONS, terminal.reason ?? "") ? REASONS[terminal.reason] : terminal.reason;
    title.textContent = `Failed: ${words ?? "no reason given"}`;
    lines.push(`${terminal.error_type}: ${terminal.message}`);
    lines.push(
      terminal.uncertain_outcome
        ? "Its work had begun: what it did before it stopped may have taken effect (uncertain outcome)."
        : "Nothing it did can have taken effect (certain outcome).",
    );
  }
  if (terminal.launched === false) lines.push("It never had a worker: no process ran.");
  else if (terminal.signal) lines.push(`${stopConfirmed(terminal)}: ${stopProof(terminal)}`);
  box.replaceChildren(title, ...lines.map(paragraph));
}

// A failed crew's own exception, as its worker wrote it to stderr (its event keeps the reference's generic words):
// its last line under the failure, its whole traceback behind that, as `crew-supervisor show` prints it.
function renderRaised(job, stderr) {
  const at = stderr.lastIndexOf(TRACEBACK);
  const box = $("job-raised");
  const raisedByCrew = [REASON.OPERATION_FAILED, REASON.CREW_FACTORY_FAILED].includes(job.terminal?.reason);
  box.hidden = !raisedByCrew || at < 0 || (at > 0 && stderr[at - 1] !== "\n");
  if (box.hidden) return;
  const traceback = stderr.slice(at).trimEnd();
  $("raised-summary").textContent = `The crew raised ${traceback.split("\n").at(-1)}`;
  $("raised").textContent = traceback;
}

// The answer first (its structured form when it has one), then each task's, then the tokens it took.
function renderOutput(output) {
  $("job-answer").hidden = output == null;
  $("job-tasks").hidden = !output?.tasks_output?.length;
  $("job-usage").hidden = output?.token_usage == null;
  if (output == null) return;
  const structured = output.json_dict ?? output.pydantic;
  $("answer").textContent =
    structured != null
      ? JSON.stringify(structured, null, 2)
      : (output.raw ?? JSON.stringify(output, null, 2)); // batch_run, test, …: the output is its own shape
  $("tasks").replaceChildren(
    ...(output.tasks_output ?? []).map((task) => {
      const item = document.createElement("li");
      const who = document.createElement("strong");
      who.textContent = task.agent ?? "agent";
      const what = document.createElement("span");
      what.textContent = ` — ${task.name || task.description || "task"}`;
      const text = document.createElement("pre");
      text.textContent = task.raw ?? "";
      item.append(who, what, text);
      return item;
    }),
  );
  const usage = output.token_usage ?? {};
  const list = $("usage");
  list.replaceChildren();
  for (const [name, key] of USAGE) {
    if (usage[key] == null) continue;
    const dt = document.createElement("dt");
    dt.textContent = name;
    const dd = document.createElement("dd");
    dd.textContent = Number(usage[key]).toLocaleString();
    list.append(dt, dd);
  }
}

// A traced job's trace id: a link to its page in the trace UI (TRACE_UI_URL) when the server gives one, opened in a
// tab of its own that cannot reach back into this one; only an http(s) page, whatever the server says.
function traceLink(id, url) {
  let page = null;
  try {
    page = url == null ? null : new URL(url);
  } catch {
    // not a URL: the id alone
  }
  if (page === null || !["http:", "https:"].includes(page.protocol)) return String(id);
  const a = document.createElement("a");
  a.href = page.href;
  a.target = "_blank";
  a.rel = "noopener noreferrer";
  a.textContent = id;
  a.title = "this job's trace in the trace UI";
  return a;
}

function paragraph(text) {
  const p = document.createElement("p");
  p.textContent = text;
  return p;
}

function exitText(status) {
  return status < 0 ? `killed by signal ${-status}` : `exit status ${status}`;
}

function renderTail(name, stream) {
  $(name).textContent = stream.text;
  const shown = new TextEncoder().encode(stream.text).length;
  $(`${name}-total`).textContent =
    stream.total_bytes > shown ? `last ${shown} of ${stream.total_bytes} bytes` : `${stream.total_bytes} bytes`;
}
