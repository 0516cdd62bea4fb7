// Run page: live charts, heatmaps, log pane, status badge and edit forms.
import { LineChart, PALETTE } from "./chart.js";
import { Heatmap } from "./heatmap.js";
import { subscribe, pointsOf, statusOf, setBadges, getJSON, sendJSON, registry } from "./live.js";

const root = document.querySelector("[data-run-id]");
const runId = root.dataset.runId;
const api = `/api/v1/runs/${encodeURIComponent(runId)}`;
const reg = registry();
reg.runId = runId;

const charts = []; // {chart, keys}
const byKey = new Map(); // metric key -> [{chart, series}]
const heatmaps = new Map(); // "moe/layerL/expert" prefix -> Heatmap
const loading = new Map(); // key -> buffered live points while the first read is in flight

function columnsOf(box) {
  return Math.max(200, Math.round(box.clientWidth || 600) * 2);
}

async function loadSeries(chart, series, key, start, end) {
  const params = new URLSearchParams({ key, max_points: String(columnsOf(chart.box)) });
  if (start !== null && start !== undefined) params.set("start_step", String(start));
  if (end !== null && end !== undefined) params.set("end_step", String(end));
  const data = await getJSON(`${api}/metrics?${params}`);
  series.setPoints(data.points);
  chart.box.dataset.total = String(data.total);
}

function track(key) {
  const info = reg.charts[key] ?? (reg.charts[key] = { points: 0, lastStep: -1, lastValue: null });
  return info;
}

function noteSeries(key, series) {
  const info = track(key);
  info.points = series.n;
  if (series.n) { info.lastStep = series.steps[series.n - 1]; info.lastValue = series.values[series.n - 1]; }
}

async function initChart(box) {
  const keys = box.dataset.keys.split(",").filter(Boolean);
  const chart = new LineChart(box, {
    smoothing: Number(document.getElementById("smoothing")?.value ?? 0),
    onZoom: (s0, s1, c) => Promise.all(c.series.map((s) => loadSeries(c, s, s.label, s0, s1))),
  });
  const entry = { chart, keys };
  charts.push(entry);
  const legend = box.parentElement.querySelector(".chart-legend");
  keys.forEach((key, i) => {
    const series = chart.addSeries(key, PALETTE[i % PALETTE.length]);
    if (!byKey.has(key)) byKey.set(key, []);
    byKey.get(key).push({ chart, series });
    if (legend) {
      const item = document.createElement("span");
      const sw = document.createElement("i");
      sw.style.background = series.color;
      item.append(sw, document.createTextNode(key));
      legend.append(item);
    }
  });
  await Promise.all(
    chart.series.map(async (s) => {
      loading.set(s.label, loading.get(s.label) ?? []);
      try {
        await loadSeries(chart, s, s.label);
      } finally {
        for (const p of loading.get(s.label) ?? []) s.append(p.step, p.value, p.time ?? Date.now());
      }
      noteSeries(s.label, s);
    }),
  );
  for (const k of keys) loading.delete(k);
  chart.redraw();
}

async function initHeatmap(box) {
  const experts = Number(box.dataset.experts);
  const prefix = box.dataset.prefix;
  const hm = new Heatmap(box, experts);
  heatmaps.set(prefix, hm);
  await Promise.all(
    Array.from({ length: experts }, async (_, e) => {
      const data = await getJSON(`${api}/metrics?${new URLSearchParams({ key: `${prefix}${e}`, max_points: "400" })}`);
      for (const p of data.points) hm.set(e, p.step, p.value);
    }),
  );
}

function onPoints(data) {
  const pts = pointsOf(data);
  reg.events += 1;
  const touched = new Set();
  for (const p of pts) {
    const m = /^(moe\/layer\d+\/expert)(\d+)$/.exec(p.key);
    if (m && heatmaps.has(m[1])) heatmaps.get(m[1]).set(Number(m[2]), p.step, p.value);
    const pending = loading.get(p.key);
    if (pending) pending.push(p);
    for (const { chart, series } of byKey.get(p.key) ?? []) {
      if (series.append(p.step, p.value, p.time ?? Date.now())) touched.add(chart);
      noteSeries(p.key, series);
    }
    const latest = document.querySelector(`[data-latest="${CSS.escape(p.key)}"]`);
    if (latest) latest.textContent = String(p.value);
  }
  for (const c of touched) c.redraw();
  // When the frame that shows these points has been painted (for latency measurements).
  const keys = pts.map((p) => p.key);
  requestAnimationFrame(() => {
    const now = Date.now();
    for (const k of keys) if (reg.charts[k]) reg.charts[k].paintedAt = now;
  });
}

function onStatus(data) {
  const st = statusOf(data);
  if (!st) return;
  setBadges(runId, st.status);
  reg.status = st.status;
  const stop = document.getElementById("stop-button");
  if (stop) stop.disabled = !["queued", "running"].includes(st.status);
  const out = document.querySelector("#stop-form output");
  if (out && !["queued", "running"].includes(st.status)) out.textContent = "";
}

function wireControls() {
  const smoothing = document.getElementById("smoothing");
  const out = document.getElementById("smoothing-value");
  smoothing?.addEventListener("input", () => {
    const w = Number(smoothing.value);
    if (out) out.textContent = w.toFixed(2);
    for (const { chart } of charts) { chart.smoothing = w; chart.redraw(); }
  });
  document.getElementById("logscale")?.addEventListener("change", (e) => {
    for (const { chart } of charts) { chart.logScale = e.target.checked; chart.redraw(); }
  });
  document.getElementById("xaxis")?.addEventListener("change", (e) => {
    for (const { chart } of charts) { chart.xAxis = e.target.value; chart.view = null; chart.redraw(); }
  });
}

function wireLogs() {
  const pane = document.getElementById("log-pane");
  if (!pane) return;
  const follow = document.getElementById("log-follow");
  const pause = document.getElementById("log-pause");
  let paused = false;
  const held = [];
  const add = (line) => {
    if (paused) { held.push(line); return; }
    pane.append(document.createTextNode(line));
    if (pane.childNodes.length > 5000) pane.firstChild.remove();
    if (follow?.checked) pane.scrollTop = pane.scrollHeight;
  };
  pause?.addEventListener("click", () => {
    paused = !paused;
    pause.textContent = paused ? "Resume" : "Pause";
    pause.setAttribute("aria-pressed", String(paused));
    if (!paused) held.splice(0).forEach(add);
  });
  // Log events carry {offset, text}; a reconnect resumes after the last byte shown.
  let offset = 0;
  let stream = null;
  const handler = (data) => {
    if (data && typeof data.text === "string") {
      if (typeof data.offset === "number") {
        if (data.offset + data.text.length <= offset) return;
        offset = data.offset + data.text.length;
      }
      add(data.text);
    } else if (typeof data === "string") add(data);
  };
  pane.textContent = "";
  stream = subscribe(() => `${api}/logs?follow=true&offset=${offset}`, {
    log: handler,
    end: () => stream?.close(),
  });
}

function alertBox(text) {
  const box = document.createElement("div");
  box.className = "panel error-box";
  box.setAttribute("role", "alert");
  box.textContent = text;
  root.prepend(box);
}

function wireForms() {
  const msg = (form, text, bad) => {
    const out = form.querySelector("output");
    if (out) { out.textContent = text; out.className = bad ? "muted error" : "muted"; }
  };
  document.getElementById("notes-form")?.addEventListener("submit", async (e) => {
    e.preventDefault();
    try {
      await sendJSON("PATCH", api, { notes: e.target.notes.value });
      msg(e.target, "Saved.");
    } catch (err) { msg(e.target, err.message, true); }
  });
  document.getElementById("tag-form")?.addEventListener("submit", async (e) => {
    e.preventDefault();
    const key = e.target.key.value.trim();
    if (!key) return;
    try {
      await sendJSON("PATCH", api, { tags: { [key]: e.target.value.value } });
      const tags = document.getElementById("tags");
      tags.querySelector(".muted")?.remove();
      const span = document.createElement("span");
      span.className = "tag";
      span.textContent = e.target.value.value ? `${key}=${e.target.value.value}` : key;
      tags.append(span);
      e.target.reset();
    } catch (err) { alertBox(err.message); }
  });
  document.getElementById("stop-form")?.addEventListener("submit", async (e) => {
    e.preventDefault();
    const btn = document.getElementById("stop-button");
    btn.disabled = true;
    try {
      await sendJSON("POST", `${api}/stop`);
      msg(e.target, "Stopping…");
    } catch (err) { btn.disabled = false; msg(e.target, err.message, true); }
  });
}

wireControls();
wireLogs();
wireForms();
// Points up to the page's latest step come from the (downsampled) metric reads; the stream
// only needs what follows. After a drop, EventSource resumes with Last-Event-ID.
const afterStep = root.dataset.afterStep;
subscribe(`${api}/events${afterStep ? `?after_step=${afterStep}` : ""}`, {
  points: onPoints, point: onPoints, metrics: onPoints,
  status: onStatus, run_event: onStatus,
  message: (d) => (statusOf(d) && !Array.isArray(d) && !d.points ? onStatus(d) : onPoints(d)),
}, { onState: (s) => { reg.sse = s; const el = document.getElementById("live-state"); if (el) el.textContent = s; } });
await Promise.all([
  ...[...document.querySelectorAll(".chart-box[data-keys]")].map(initChart),
  ...[...document.querySelectorAll(".heat-box[data-prefix]")].map(initHeatmap),
]);
reg.ready = true;
document.body.dataset.ready = "true";
