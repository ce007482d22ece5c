// The operator console (supervisor/http/webconsole.py serves it): signing in, the /health header, the tick that
// refreshes the open view, and which view the address names. No dependencies, no inline script. Everything the
// server sends is put in the page as text (textContent), never as HTML: job ids, crew output and cancel reasons are
// chosen by clients and crews. The views are workers.js, jobs.js and job.js; api.js talks to the supervisor.

import { RECONNECT_MS, Unauthorized, credentials, getJSON } from "./api.js";
import { openJob } from "./job.js";
import { openJobs } from "./jobs.js";
import { $, banner, handle, hooks, viewError } from "./page.js";
import { forgetWorkers, openWorkers } from "./workers.js";

const TOKEN_KEY = "crew-supervisor.token"; // sessionStorage: this tab only, gone when it closes
const REFRESH_MS = 1000; // /health and the open view, fetched together
const RESTART_NOTICE_MS = 15000;

credentials.token = sessionStorage.getItem(TOKEN_KEY);
const session = {
  signedIn: false,
  instance: null,
  restartNoticeUntil: 0,
  // The open view: its refresh (called on every tick) and the signal that ends it. Leaving a view aborts its
  // calls and streams, and whatever of them still answers is dropped: a slow answer for one job never lands in
  // the next one's page.
  view: { refresh: null, controller: new AbortController() },
  busy: false,
};

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
  credentials.token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  showLogin(message);
}

async function signIn(token) {
  credentials.token = token;
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
  for (const id of ["job-record", "events", "stdout", "stderr", "evidence", "job-evidence", "stacks", "raised"]) {
    $(id).replaceChildren();
  }
  for (const id of ["health-status", "health-forkserver", "health-limits", "health-jobs", "job-id"]) {
    $(id).textContent = "";
  }
  for (const id of ["stdout-total", "stderr-total", "events-state", "jobs-page", "workers-updated", "view-error"]) {
    $(id).textContent = "";
  }
  forgetWorkers();
}

function route() {
  if (!session.signedIn) return;
  closeView();
  viewError(null);
  const [path, query] = location.hash.slice(1).split("?");
  for (const id of ["workers-view", "jobs-view", "job-view"]) $(id).hidden = true;
  const signal = session.view.controller.signal;
  let current = "/workers";
  // A job's address is the API's path, #/jobs/<id>; #/job/<id> is what the console's links said before.
  const jobPrefix = ["/jobs/", "/job/"].find((prefix) => path.startsWith(prefix) && path.length > prefix.length);
  if (jobPrefix) {
    current = null;
    let id;
    try {
      id = decodeURIComponent(path.slice(jobPrefix.length));
    } catch {
      viewError("This address names no job: its id is not valid percent-encoding.");
      return;
    }
    session.view.refresh = openJob(id, signal);
  } else if (path === "/jobs") {
    current = "/jobs";
    session.view.refresh = openJobs(new URLSearchParams(query ?? ""), signal);
  } else {
    session.view.refresh = openWorkers(signal);
  }
  for (const link of $("nav").querySelectorAll("a")) {
    const here = link.getAttribute("href") === `#${current}`;
    link.classList.toggle("current", here);
    if (here) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  tick();
}

// Start ---------------------------------------------------------------------------------------------------------

$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  signIn($("token").value.trim());
});
$("forget").addEventListener("click", () => forget("Token forgotten."));
hooks.unauthorized = () =>
  forget("The supervisor refused the token (401): it may have restarted with another. Sign in again.");
window.addEventListener("hashchange", route);
setInterval(tick, REFRESH_MS);

// A token kept in this tab, or none where the supervisor asks for none (a loopback dev server).
(async function start() {
  try {
    enter(await getJSON("/health"));
  } catch (error) {
    if (error instanceof Unauthorized) {
      showLogin(credentials.token ? "The saved token was refused (401). Sign in again." : "");
    } else {
      banner(`Cannot reach the supervisor (${error.message}); retrying every second…`);
      setTimeout(start, RECONNECT_MS);
    }
  }
})();

