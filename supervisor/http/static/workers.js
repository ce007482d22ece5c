// The live worker view (GET /workers every tick), and a cancel with the evidence that the work stopped.

import { CANCEL_MS, Refused, getJSON, jobPath } from "./api.js";
import { $, HISTORY, cell, duration, handle, jobLink, megabytes, sparkline } from "./page.js";

const workerRows = new Map(); // action_id -> {row, cells, button, worker}
const samples = new Map(); // action_id -> {rss: [], cpu: []}

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
  button.addEventListener("click", () => cancel(entry.worker, button, $("evidence"), viewSignal));
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
export async function cancel(job, button, box, signal) {
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
