// Server-sent events with reconnect, and the page state they drive (status badges, test hook).
//
// Events the server sends, by stream:
//   /api/v1/runs/{id}/events   `points` {run_id, points: [{key, step, value, time, seq}]},
//                              `status` {run_id, from_status, to_status, reason, ...},
//                              `stream_error` (the server ended the stream on its own failure)
//   /api/v1/events             `status` (every run), `lagged` {missed}
//   /api/v1/runs/{id}/logs     `log` {offset, text}, `end` {status}
// EventSource's own `error` event is the connection's state, never a server event.
//
// EventSource already resumes with Last-Event-ID after a dropped connection (and after the
// server ends a stream); when the browser gives up (readyState CLOSED), we reopen with backoff.

/**
 * Subscribes to an SSE endpoint. `handlers` maps server event names to callbacks receiving the
 * parsed JSON data (plain text when it is not JSON). `url` may be a function, re-evaluated on
 * every reopen. Returns a handle with close().
 */
export function subscribe(url, handlers, { onState } = {}) {
  let es = null;
  let closed = false;
  let delay = 500;
  const open = () => {
    if (closed) return;
    es = new EventSource(typeof url === "function" ? url() : url);
    onState?.("connecting");
    es.onopen = () => { delay = 500; onState?.("live"); };
    es.onerror = () => {
      if (es.readyState === EventSource.CLOSED) {
        onState?.("reconnecting");
        setTimeout(open, delay);
        delay = Math.min(delay * 2, 15000);
      } else {
        onState?.("reconnecting");
      }
    };
    for (const [name, fn] of Object.entries(handlers)) {
      es.addEventListener(name, (ev) => {
        let data = ev.data;
        try { data = JSON.parse(ev.data); } catch { /* plain text event */ }
        fn(data, ev);
      });
    }
  };
  open();
  return { close() { closed = true; es?.close(); } };
}

/** A `status` event's data as {run_id, status, reason}, or null when it is not one. */
export function statusOf(data) {
  if (!data || typeof data !== "object" || typeof data.to_status !== "string") return null;
  return { run_id: data.run_id, status: data.to_status, reason: data.reason ?? null };
}

/** Updates every status badge of a run on the page. */
export function setBadges(runId, status) {
  for (const el of document.querySelectorAll(`[data-status-of="${CSS.escape(runId)}"]`)) {
    el.textContent = status;
    el.className = `badge status-${status}`;
    el.dataset.status = status;
  }
}

/** Test and debugging hook: `window.__trainyard` ({charts: {key: {...}}, events, ...}). */
export function registry() {
  window.__trainyard ??= { charts: {}, events: 0 };
  return window.__trainyard;
}
