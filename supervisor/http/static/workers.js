// The live worker view (GET /workers every tick), and a cancel with the evidence that the work stopped.

import { CANCEL_MS, Refused, getJSON, jobPath } from "./api.js";
import { STATUS, WAITING_FOR } from "./names.js";
import {
  $,
  HISTORY,
  cell,
  handle,
  ident,
  jobLink,
  megabytes,
  shortDuration,
  sparkline,
  stopConfirmed,
  stopProof,
} from "./page.js";

const workerRows = new Map(); // action_id -> {row, cells, button, worker, spent}
const samples = new Map(); // action_id -> CPU percents, the newest last
const MEASURES = { pss: "PSS: shared pages counted by share", cgroup: "what the kernel charges its cgroup" };

let viewSignal = null; // the open workers view's: a cancel's answer is shown only while it is open

// Shows the view; returns its refresh.
export function openWorkers(signal) {
  viewSignal = signal;
  $("workers-view").hidden = false;
  $("evidence").hidden = true;
  return refreshWorkers;
}

// Signing out: nothing of the last view is kept.
export function forgetWorkers() {
  workerRows.clear();
  samples.clear();
}

async function refreshWorkers(signal) {
  const { workers } = await getJSON("/workers", { signal });
  if (signal.aborted) return;
  const body = $("workers").tBodies[0];
  const present = new Set();
  for (const worker of workers) {
    present.add(worker.action_id);
    const cpuHistory = samples.get(worker.action_id) ?? [];
    if (worker.cpu_percent != null) cpuHistory.push(worker.cpu_percent);
    samples.set(worker.action_id, cpuHistory.slice(-HISTORY));
    let entry = workerRows.get(worker.action_id);
    if (!entry) {
      entry = workerRow(worker);
      workerRows.set(worker.action_id, entry);
      body.append(entry.row);
    }
    entry.worker = worker;
    const tokens = worker.tokens.toLocaleString();
    entry.spent.textContent = worker.llm_calls ? `${tokens} tokens, ${worker.llm_calls} calls` : "";
    const [phase, pid, memory, cpu, left, idle, last] = entry.cells;
    phase.replaceChildren(worker.phase, ...waitingFor(worker));
    phase.className = `phase status-${worker.phase}`;
    pid.textContent = worker.pid ?? "–";
    memory.replaceChildren(...memoryCell(worker));
    cpu.replaceChildren(...cpuCell(worker, samples.get(worker.action_id)));
    left.textContent = shortDuration(Math.max(worker.seconds_left, 0));
    idle.textContent = shortDuration(worker.idle_seconds); // the server's clock: the browser's may differ
    last.textContent = worker.last_output ?? "–";
    last.title = worker.last_output ?? "";
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

// What a queued job waits for: a slot of MAX_CONCURRENCY, or its crew's own (CREW_MAX_CONCURRENCY).
function waitingFor(worker) {
  const waiting = worker.waiting;
  if (!waiting) return [];
  const running = `(${waiting.running}/${waiting.limit} running)`;
  const said = document.createElement("small");
  said.className = "waiting";
  said.textContent =
    waiting.on === WAITING_FOR.CREW
      ? `waits for crew ${ident(worker.crew_id)} ${running}`
      : `waits for a slot ${running}`;
  return [said];
}

// What the job's memory is as its cap measures it, against the cap (a bar) where there is one.
function memoryCell(worker) {
  if (worker.memory_bytes == null) return ["–"];
  const limit = worker.memory_limit_bytes;
  const measure = document.createElement("small");
  measure.textContent = limit ? `of ${Math.round(limit / 1048576)} MiB · ${worker.memory_measure}` : worker.memory_measure;
  measure.title = MEASURES[worker.memory_measure] ?? "";
  const text = megabytes(worker.memory_bytes);
  if (!limit) return [text, measure];
  const bar = document.createElement("meter");
  bar.min = 0;
  bar.max = limit;
  bar.high = limit * 0.8;
  bar.value = Math.min(worker.memory_bytes, limit);
  return [bar, text, measure];
}

// CPU now and over the last half minute, on a scale from 0 to one core (or the most seen, if more).
function cpuCell(worker, history) {
  if (worker.cpu_percent == null) return ["–"];
  const top = Math.max(100, ...history);
  const scale = document.createElement("small");
  scale.textContent = `scale 0–${top.toFixed(0)} %`;
  return [`${worker.cpu_percent.toFixed(0)} %`, sparkline(history, 0, top), scale];
}

function workerRow(worker) {
  const row = document.createElement("tr");
  row.dataset.actionId = worker.action_id;
  const job = cell("", "id");
  const what = document.createElement("small");
  what.textContent = `${ident(worker.crew_id)} · ${worker.operation}`;
  const spent = document.createElement("small"); // its LLM usage so far
  spent.className = "spent";
  job.replaceChildren(jobLink(worker.action_id), what, spent);
  const cells = ["phase", "pid", "memory", "cpu", "left", "idle", "last"].map((name) => cell("", name));
  const button = cancelButton(worker.action_id);
  const entry = { row, cells, button, worker, spent };
  button.addEventListener("click", () => cancel(entry.worker, button, $("evidence"), viewSignal));
  const action = cell("");
  action.append(button);
  row.append(job, ...cells, action);
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
export async function cancel(job, button, box, signal) {
  if (!window.confirm(`Cancel ${ident(job.action_id)}? Its worker and every process it started are killed.`)) return;
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
    if (error instanceof Refused) {
      showEvidence(box, null, `Cancel of ${ident(job.action_id)} refused: ${error.message}`);
    } else {
      handle(error);
    }
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
  } else if (record.status !== STATUS.CANCELLED) {
    title.textContent = `${ident(record.action_id)} had already ended: ${record.status}`;
  } else if (terminal.launched === false) {
    title.textContent = `${ident(record.action_id)} cancelled before it started: no process ran`;
  } else {
    title.textContent = `${ident(record.action_id)} cancelled: ${stopConfirmed(terminal)}`;
    detail.textContent = stopProof(terminal);
  }
  box.replaceChildren(title, detail);
  box.hidden = false;
}
