// Requests to the JSON API v1 that the dashboard's modules share. Every metric read goes through
// fetchSeries, so the URL, its parameters and the response shape are known in one place.

/** `/api/v1/runs/{id}`: the base of a run's API paths. */
export function runPath(runId) {
  return `/api/v1/runs/${encodeURIComponent(runId)}`;
}

export async function getJSON(url) {
  const res = await fetch(url, { headers: { accept: "application/json" } });
  if (!res.ok) throw new Error(`${url}: HTTP ${res.status}`);
  return res.json();
}

/** The session's CSRF token, which every write made with the session cookie must echo. */
function csrfToken() {
  return document.querySelector('meta[name="csrf-token"]')?.content ?? "";
}

export async function sendJSON(method, url, body) {
  const res = await fetch(url, {
    method,
    headers: {
      "content-type": "application/json",
      accept: "application/json",
      "x-csrf-token": csrfToken(),
    },
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

/**
 * One metric of a run, read with `GET /api/v1/runs/{id}/metrics`. The server downsamples to at
 * most `maxPoints`, keeping each bucket's min and max, so spikes survive. `start` and `end`
 * bound the step range inclusively (null or undefined: open). Resolves to
 * `{points: [{step, value, time}], total}`, `total` counting the points in the range before
 * downsampling.
 */
export async function fetchSeries(runId, key, { maxPoints, start = null, end = null } = {}) {
  const params = new URLSearchParams({ key });
  if (maxPoints !== undefined) params.set("max_points", String(maxPoints));
  if (start !== null && start !== undefined) params.set("start_step", String(start));
  if (end !== null && end !== undefined) params.set("end_step", String(end));
  const data = await getJSON(`${runPath(runId)}/metrics?${params}`);
  return { points: data.points, total: data.total };
}

/**
 * Expert routing shares of a MoE run, already grouped by the server:
 * `{layers: [{layer, experts, steps, fractions}]}` with `fractions[row][expert]` the share at
 * `steps[row]` (null before the expert's first point). At most `maxSteps` rows per layer.
 */
export function fetchExpertUtilization(runId, maxSteps) {
  const params = new URLSearchParams({ max_steps: String(maxSteps) });
  return getJSON(`${runPath(runId)}/expert-utilization?${params}`);
}

/**
 * One page of the run's charts as its page lays them out, `{charts: [{id, title, keys,
 * total_keys, x_unit}], heatmaps: [{layer, experts, keys}], next_cursor, total_charts}` in page
 * order: the server's one grouping rule, which the run page follows for keys that appear while
 * it is open. Without `cursor`, the first page (with the heatmaps).
 */
export function fetchChartLayout(runId, { cursor } = {}) {
  const query = cursor ? `?${new URLSearchParams({ cursor })}` : "";
  return getJSON(`${runPath(runId)}/charts${query}`);
}
