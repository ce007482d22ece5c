// Talking to the supervisor: its API with the bearer token and a deadline on every call, and its event streams.

export const CALL_MS = 5000; // a call unanswered this long: the supervisor is "not answering" (the next tick retries)
export const CANCEL_MS = 120000; // a cancel answers once the kill is confirmed: after STOP_GRACE_MS (at most 60 s)
export const RECONNECT_MS = 1000;
const SILENCE_MS = 60000; // a followed stream with no byte this long is reconnected (keep-alives: every 15 s)
const MAX_FRAME_CHARS = 16 * 1024 * 1024; // an SSE frame larger than this ends the stream (events are <= 4 MiB)

export class Unauthorized extends Error {}
export class Unreachable extends Error {}
export class Refused extends Error {
  constructor(status, detail) {
    super(`${status}: ${detail}`);
    this.status = status;
  }
}

// The bearer token every call sends (console.js keeps it in sessionStorage).
export const credentials = { token: null };

// `signal` ends the call with its view; `timeout` (ms, or null for a stream) bounds the whole answer, body too.
export async function call(path, { signal, timeout = CALL_MS, ...init } = {}) {
  const headers = new Headers(init.headers);
  if (credentials.token) headers.set("Authorization", `Bearer ${credentials.token}`);
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

export async function getJSON(path, options) {
  try {
    return await (await call(path, options)).json();
  } catch (error) {
    if (error instanceof SyntaxError) throw new Error(`${path} answered something other than JSON`);
    if (error.name === "TimeoutError") throw new Unreachable("the supervisor stopped answering mid-way");
    throw error;
  }
}

export const jobPath = (id) => `/jobs/${encodeURIComponent(id)}`;

// Server-sent events, read from a fetch body (EventSource cannot send the Authorization header). Lines end at
// CRLF, CR or LF; a field's value loses one leading space; data lines join with LF; comments and other fields are
// skipped; a frame without data is nothing; a partial frame at the end of a dropped stream is discarded. A stream
// silent for SILENCE_MS (the server sends a keep-alive comment while idle) counts as dropped.
export async function* readEvents(body) {
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
