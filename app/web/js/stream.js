// Following a run's events until it settles, across dropped connections.
//
// The first connection is whatever started the run (a posted turn, a regeneration,
// submitted tool results). When it breaks (a network error, the browser going offline,
// no bytes for IDLE_MS, the service shutting down) the run goes on on the server; this
// reconnects to GET /runs/{id}/events with `Last-Event-ID` set to the last event
// applied. Event ids only grow and are never reused (they may jump when another
// process resumed the run), so every event is applied exactly once, in order: ids at or
// below the last one (a replay overlapping what was seen) are skipped.

import { ApiError, headers, problemOf, sseEvents } from "./api.js";

export const SETTLING = new Set(["run.completed", "run.failed", "run.cancelled", "run.requires_action"]);
const IDLE_MS = 40_000; // the service pings every 15 s at most
const BACKOFF_MS = [250, 500, 1000, 2000, 4000];

export class Stopped extends Error {}

/**
 * open(signal): Promise<Response> for the first connection (or null to start by
 * reconnecting). When that connection breaks before `run.started` names the run, or
 * before it answered at all, it is opened again if `reopen` (a POST with an
 * Idempotency-Key answers with the same run, its events from the start; tool results
 * sent again answer as the first post did), else findRun() looks the run up. onEvent(name, data, id) applies one event; onLink(state)
 * hears "live", "reconnecting" or "offline". stop: an AbortSignal that ends following
 * (the page moved to another session); the run itself goes on.
 * Resolves with {event, data, runId, lastId} at the event that settled the run.
 */
export async function followRun({
  sessionId,
  runId = null,
  lastId = 0,
  open,
  reopen = false,
  findRun,
  onEvent,
  onLink,
  stop,
}) {
  let first = Boolean(open);
  let answered = false; // the first connection got an answer: it was received
  let failures = 0;
  for (;;) {
    if (stop?.aborted) throw new Stopped();
    const connection = new AbortController();
    const abort = (why) => () => connection.abort(why);
    const onOffline = abort("offline");
    const onStop = abort("stopped");
    window.addEventListener("offline", onOffline);
    stop?.addEventListener("abort", onStop);
    let idle = null;
    const touch = () => {
      clearTimeout(idle);
      idle = setTimeout(abort("idle"), IDLE_MS);
    };
    try {
      touch();
      let response;
      if (first || (reopen && (!runId || !answered))) {
        first = false;
        response = await open(connection.signal);
        answered = response.ok;
      } else {
        if (!runId && findRun) runId = await findRun();
        if (!runId) throw new ApiError(409, { detail: "The run did not start; try again." });
        response = await fetch(`/sessions/${sessionId}/runs/${runId}/events`, {
          headers: headers({ "Last-Event-ID": String(lastId), Accept: "text/event-stream" }),
          signal: connection.signal,
        });
      }
      if (!response.ok) throw await problemOf(response);
      onLink("live");
      for await (const message of sseEvents(response, touch)) {
        failures = 0;
        if (message.id === null || message.id === "") {
          // An event without an id is not part of the run's log: the server's notice that
          // it is shutting down (an `error` of type `unavailable`). Reconnect.
          if (message.event === "error") break;
          continue;
        }
        const id = Number(message.id);
        if (!(id > lastId)) continue; // already applied
        lastId = id;
        const data = message.data ? JSON.parse(message.data) : null;
        if (message.event === "run.started" && data?.id) runId = data.id;
        onEvent(message.event, data, id);
        if (SETTLING.has(message.event)) return { event: message.event, data, runId, lastId };
      }
    } catch (err) {
      if (stop?.aborted) throw new Stopped();
      const network =
        connection.signal.aborted ||
        err?.name === "AbortError" ||
        err instanceof TypeError ||
        (err instanceof ApiError && err.transient);
      if (!network) throw err;
    } finally {
      clearTimeout(idle);
      window.removeEventListener("offline", onOffline);
      stop?.removeEventListener("abort", onStop);
    }
    // The connection ended before the run settled.
    onLink(navigator.onLine ? "reconnecting" : "offline");
    await pause(BACKOFF_MS[Math.min(failures++, BACKOFF_MS.length - 1)], stop);
  }
}

/** Wait `ms`, or until the browser is back online when it is offline now. */
function pause(ms, stop) {
  return new Promise((resolve, reject) => {
    const done = () => {
      clearTimeout(timer);
      window.removeEventListener("online", online);
      stop?.removeEventListener("abort", stopped);
    };
    const online = () => {
      done();
      resolve();
    };
    const stopped = () => {
      done();
      reject(new Stopped());
    };
    const timer = navigator.onLine ? setTimeout(online, ms) : null;
    window.addEventListener("online", online);
    stop?.addEventListener("abort", stopped);
  });
}
