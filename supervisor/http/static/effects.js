// A job's effect ledger: each tool and LLM call its worker started, and how it ended. An uncertain one (cut off when
// the job ended otherwise: it may or may not have had its effect) stands out: it is what an operator reconciles.

import { EFFECT, EFFECT_STATUS } from "./names.js";
import { $, cell, clock, duration } from "./page.js";

export function clearEffects() {
  $("job-effects").hidden = true;
  $("effects").tBodies[0].replaceChildren();
  $("effects-summary").textContent = "";
}

// Every text here is the crew's (a tool's name, an exception's message): set as text, never as markup.
export function renderEffects(answer) {
  const entries = answer.effects;
  $("job-effects").hidden = entries.length === 0 && !answer.tasks_completed;
  $("effects").tBodies[0].replaceChildren(...entries.map(row));
  const counts = {};
  for (const entry of entries) counts[entry.status] = (counts[entry.status] ?? 0) + 1;
  const said = Object.entries(counts).map(([status, n]) => `${n} ${status}`);
  const tasks = `${answer.tasks_completed} task(s) completed`;
  $("effects-summary").textContent = `${entries.length} call(s)${said.length ? `: ${said.join(", ")}` : ""}; ${tasks}`;
}

function row(entry) {
  const tr = document.createElement("tr");
  tr.className = `effect-${entry.status}`;
  if (entry.status === EFFECT_STATUS.UNCERTAIN) {
    tr.title = "It had started when the job ended: it may or may not have had its effect";
  }
  const took = entry.ended_at == null ? null : duration(entry.ended_at - entry.started_at);
  const outcome =
    entry.status === EFFECT_STATUS.FAILED
      ? [entry.error_type, entry.error_message].filter(Boolean).join(": ")
      : entry.kind === EFFECT.LLM
        ? `${entry.prompt_tokens.toLocaleString()} + ${entry.completion_tokens.toLocaleString()} tokens`
        : null;
  tr.append(
    cell(entry.id),
    cell(entry.kind),
    cell(entry.name, "name"),
    cell(entry.status, `status-${entry.status}`),
    cell(clock(entry.started_at)),
    cell(took),
    cell(outcome, entry.status === EFFECT_STATUS.FAILED ? "error" : null),
  );
  return tr;
}
