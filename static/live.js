// Server-sent events with reconnect. EventSource already resumes with Last-Event-ID after a
// dropped connection; when the browser gives up (readyState CLOSED), we reopen with backoff.

/**
 * Subscribes to an SSE endpoint. `handlers` maps event names to callbacks receiving parsed JSON
 * (the default unnamed event is "message"). Returns a handle with close().
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

/** Normalises a points payload into an array of {key, step, value, time}. */
export function pointsOf(data) {
  if (Array.isArray(data)) return data;
  if (data && Array.isArray(data.points)) return data.points;
  if (data && typeof data.key === "string") return [data];
  return [];
}

/** Normalises a status payload into {run_id, status, reason}. */
export function statusOf(data) {
  if (!data || typeof data !== "object") return null;
  const status = data.to_status ?? data.status;
  if (typeof status !== "string") return null;
  return { run_id: data.run_id, status, reason: data.reason ?? null };
}

/** Updates every status badge of a run on the page. */
export function setBadges(runId, status) {
  for (const el of document.querySelectorAll(`[data-status-of="${CSS.escape(runId)}"]`)) {
    el.textContent = status;
    el.className = `badge status-${status}`;
    el.dataset.status = status;
  }
}

export async function getJSON(url) {
  const res = await fetch(url, { headers: { accept: "application/json" } });
  if (!res.ok) throw new Error(`${url}: HTTP ${res.status}`);
  return res.json();
}

export async function sendJSON(method, url, body) {
  const res = await fetch(url, {
    method,
    headers: { "content-type": "application/json", accept: "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  try { data = await res.json(); } catch { /* empty body */ }
  if (!res.ok) {
    const msg = data?.error?.message ?? `HTTP ${res.status}`;
    throw new Error(msg);
  }
  return data;
}

/** Test and debugging hook: live chart state by key. */
export function registry() {
  window.__trainyard ??= { charts: {}, events: 0 };
  return window.__trainyard;
}
