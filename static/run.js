// Run page: live charts, heatmaps, log pane, status badge and edit forms.
import { LineChart } from "./chart.js";
import { LiveFeed } from "./chart/live.js";
import { Heatmap } from "./heatmap.js";
import { runPath, fetchSeries, fetchExpertUtilization, sendJSON } from "./api.js";
import { subscribe, statusOf, setBadges, registry } from "./live.js";

const root = document.querySelector("[data-run-id]");
const runId = root.dataset.runId;
const api = runPath(runId);
const reg = registry();
reg.runId = runId;

const feed = new LiveFeed(reg);
const charts = []; // {chart, keys}
/** Heatmap rows per layer read at load (live points add more). */
const HEAT_ROWS = 400;

/** Points to ask for: two per CSS pixel of the chart's width (min and max per column). */
function columnsOf(box) {
  return Math.max(200, Math.round(box.clientWidth || 600) * 2);
}

async function readSeries(chart, key, start, end) {
  const data = await fetchSeries(runId, key, { maxPoints: columnsOf(chart.box), start, end });
  chart.box.dataset.total = String(data.total);
  return data.points;
}

async function initChart(box) {
  const keys = box.dataset.keys.split(",").filter(Boolean);
  const chart = new LineChart(box, {
    smoothing: Number(document.getElementById("smoothing")?.value ?? 0),
    // Zoomed reads replace the series with finer detail of the range.
    onZoom: (s0, s1, c) => Promise.all(c.series.map(async (s) => s.setPoints(await readSeries(c, s.label, s0, s1)))),
  });
  charts.push({ chart, keys });
  const legend = box.parentElement.querySelector(".chart-legend");
  for (const key of keys) {
    const series = chart.addSeries(key);
    feed.attach(key, chart, series);
    if (legend) {
      const item = document.createElement("span");
      const sw = document.createElement("i");
      sw.style.background = series.color;
      item.append(sw, document.createTextNode(key));
      legend.append(item);
    }
  }
  await Promise.all(chart.series.map((s) => feed.load(s.label, s, () => readSeries(chart, s.label))));
  chart.redraw();
}

/** One heatmap per MoE layer; the page lists each row's metric key, in expert order. */
function initHeatmaps() {
  const layers = new Map(); // layer -> Heatmap
  for (const box of document.querySelectorAll(".heat-box[data-layer]")) {
    const keys = box.dataset.keys.split(",").filter(Boolean);
    const hm = new Heatmap(box, keys.length);
    keys.forEach((key, expert) => feed.on(key, (p) => hm.set(expert, p.step, p.value)));
    layers.set(Number(box.dataset.layer), hm);
  }
  return layers;
}

async function loadHeatmaps(layers) {
  if (!layers.size) return;
  const data = await fetchExpertUtilization(runId, HEAT_ROWS);
  for (const l of data.layers) layers.get(l.layer)?.setMatrix(l.steps, l.fractions);
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

function setLiveState(state) {
  reg.sse = state;
  const el = document.getElementById("live-state");
  if (el) el.textContent = state;
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
  points: (data) => feed.push(data.points),
  status: onStatus,
  // The server ended the stream on its own failure; the browser reconnects and resumes.
  stream_error: () => setLiveState("reconnecting"),
}, { onState: setLiveState });
const heatmaps = initHeatmaps();
await Promise.all([
  ...[...document.querySelectorAll(".chart-box[data-keys]")].map(initChart),
  loadHeatmaps(heatmaps),
]);
reg.ready = true;
document.body.dataset.ready = "true";
