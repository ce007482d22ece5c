// What the views share: finding and making elements, the page's two message lines, and how an error is shown.

import { Unauthorized, Unreachable } from "./api.js";

export const HISTORY = 30; // samples per sparkline: half a minute at one refresh a second
const SVG = "http://www.w3.org/2000/svg";

export const $ = (id) => document.getElementById(id);

// What a refused token does (console.js: forget it and ask again), set once at start.
export const hooks = { unauthorized: () => {} };

// Errors of a refresh: a refused token ends the session; an unanswered call says so, and the next tick retries.
export function handle(error) {
  if (error instanceof Unauthorized) {
    hooks.unauthorized();
  } else if (error instanceof Unreachable) {
    banner(`Cannot reach the supervisor (${error.message}); retrying every second…`);
  } else if (error.name !== "AbortError") {
    viewError(error.message);
  }
}

export function banner(text) {
  $("banner").textContent = text;
  $("banner").hidden = false;
}

// What the open view could not do (a 404, a refused cancel), until it next succeeds.
export function viewError(text) {
  $("view-error").textContent = text ?? "";
  $("view-error").hidden = !text;
}

export function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text ?? "–";
  if (className) td.className = className;
  return td;
}

// A client chooses its ids, and one can pass for another: "tіdes" with a Cyrillic і, a fullwidth "ｔides", a
// zero-width space inside, an "é" made of "e" and a combining accent. Every character but printable ASCII is
// written out (and the backslash), as the CLI writes it (supervisor/escaping.py), so what is shown reads back.
export function ident(id) {
  return String(id).replace(/[^\x21-\x5b\x5d-\x7e]/gu, (char) => {
    const code = char.codePointAt(0);
    if (code === 0x5c) return "\\\\";
    if (code < 0x80) return `\\x${code.toString(16).padStart(2, "0")}`;
    return code <= 0xffff ? `\\u${code.toString(16).padStart(4, "0")}` : `\\U${code.toString(16).padStart(8, "0")}`;
  });
}

export function jobLink(id) {
  const a = document.createElement("a");
  a.href = `#/jobs/${encodeURIComponent(id)}`;
  a.textContent = ident(id);
  a.title = ident(id); // whole, where its cell cuts it
  return a;
}

// A job's one word, as the CLI shows it: where it is while it runs (the API's `phase`), else its status.
export const state = (job) => job.phase ?? job.status;

// Unix seconds as the browser's local date and time.
export function clock(seconds) {
  return seconds == null ? "–" : new Date(seconds * 1000).toLocaleString();
}

// Whether a stop was confirmed, and what it did, from a terminal event's evidence.
export function stopConfirmed(terminal) {
  return terminal.stop_confirmed ? "stop confirmed" : "stop NOT confirmed";
}

export function stopProof(terminal) {
  return (
    `worker pid ${terminal.pid} (process group ${terminal.pgid}) sent ${terminal.signal}; ` +
    `exit status ${terminal.exit_status}; ${terminal.descendants_killed} other process(es) killed; ` +
    `${terminal.elapsed_ms} ms`
  );
}

export function megabytes(bytes) {
  return bytes == null ? "–" : `${(bytes / 1048576).toFixed(1)} MiB`;
}

// As `duration`, in fewer characters: a narrow column's.
export function shortDuration(seconds) {
  if (seconds == null || seconds < 60) return duration(seconds);
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ${Math.floor(seconds % 60)}s`;
  return `${Math.floor(seconds / 3600)}h ${Math.floor((seconds % 3600) / 60)}m`;
}

export function duration(seconds) {
  if (seconds == null) return "–";
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.floor(seconds % 60)} s`;
  return `${Math.floor(seconds / 3600)} h ${Math.floor((seconds % 3600) / 60)} min`;
}

// The last HISTORY samples, the newest at the right edge, scaled from `low` to `high` (or the samples' least and most).
export function sparkline(values, low, high) {
  const width = 64;
  const height = 18;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("aria-hidden", "true");
  const bottom = low ?? Math.min(...values);
  const range = (high ?? Math.max(...values)) - bottom;
  const step = width / (HISTORY - 1);
  const start = HISTORY - values.length;
  const y = (v) => (range > 0 ? height - 2 - ((v - bottom) / range) * (height - 4) : height / 2);
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", values.map((v, i) => `${((start + i) * step).toFixed(1)},${y(v).toFixed(1)}`).join(" "));
  svg.append(line);
  return svg;
}

