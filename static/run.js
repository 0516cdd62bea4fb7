// Run page: live charts, heatmaps, log pane, status badge and edit forms.
import { LineChart } from "./chart.js";
import { LiveFeed } from "./chart/live.js";
import { chartCard, heatmapCard, placeCard, sectionCards, showSections } from "./chart/cards.js";
import { formatMetric } from "./chart/scales.js";
import { Heatmap } from "./heatmap.js";
import { runPath, fetchSeries, fetchExpertUtilization, fetchChartLayout, sendJSON } from "./api.js";
import { subscribe, statusOf, setBadges, registry } from "./live.js";

const root = document.querySelector("[data-run-id]");
const runId = root.dataset.runId;
const api = runPath(runId);
const reg = registry();
reg.runId = runId;

const feed = new LiveFeed(reg);
/** Chart cards by layout id: {chart, keys, section}. */
const cards = new Map();
/** Heatmaps by MoE layer: {keys, card, offs (functions that stop its live points)}. */
const heatmaps = new Map();
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

/** The chart controls' current settings, for charts created after the user changed them. */
function controls() {
  return {
    smoothing: Number(document.getElementById("smoothing")?.value ?? 0),
    logScale: !!document.getElementById("logscale")?.checked,
    xAxis: document.getElementById("xaxis")?.value ?? "step",
  };
}

async function initChart(box) {
  const section = box.closest(".chart-card");
  const chart = new LineChart(box, {
    ...controls(),
    xUnit: box.dataset.xUnit,
    // Zoomed reads replace the series with finer detail of the range.
    onZoom: (s0, s1, c) => Promise.all(c.series.map(async (s) => s.setPoints(await readSeries(c, s.label, s0, s1)))),
  });
  const entry = { chart, keys: [], section };
  cards.set(section.dataset.group, entry);
  await addKeys(entry, box.dataset.keys.split(",").filter(Boolean));
}

/** Adds series for `keys` to a card (its legend too) and reads them. */
async function addKeys(entry, keys) {
  const legend = entry.section.querySelector(".chart-legend");
  const added = keys.map((key) => {
    const series = entry.chart.addSeries(key);
    feed.attach(key, entry.chart, series);
    entry.keys.push(key);
    if (legend) {
      const item = document.createElement("span");
      const sw = document.createElement("i");
      sw.style.background = series.color;
      item.append(sw, document.createTextNode(key));
      legend.append(item);
    }
    return series;
  });
  entry.chart.box.dataset.keys = entry.keys.join(",");
  await Promise.all(added.map((s) => feed.load(s.label, s, () => readSeries(entry.chart, s.label))));
  entry.chart.redraw();
}

/** A heatmap for a `.heat-box`; the page lists each row's metric key, in expert order. */
function initHeatmap(box) {
  const keys = box.dataset.keys.split(",").filter(Boolean);
  const hm = new Heatmap(box, keys.length);
  const offs = keys.map((key, expert) => feed.on(key, (p) => hm.set(expert, p.step, p.value)));
  heatmaps.set(Number(box.dataset.layer), { hm, keys, card: box.closest(".heat-card"), offs });
}

/** Reads the matrices of `layers` (all when absent). */
async function loadHeatmaps(layers) {
  const wanted = layers ?? [...heatmaps.keys()];
  if (!wanted.length) return;
  const data = await fetchExpertUtilization(runId, HEAT_ROWS);
  for (const l of data.layers) if (wanted.includes(l.layer)) heatmaps.get(l.layer)?.hm.setMatrix(l.steps, l.fractions);
}

/**
 * Brings the cards in line with the server's chart layout: a new group gets a card in its
 * place, a group with a new key at its end gets a series, a group whose keys changed order
 * (so its colours would differ from a reload) is rebuilt; the same for heatmap layers.
 */
async function applyLayout(layout) {
  const work = [];
  const order = layout.charts.map((g) => g.id);
  const place = (card, g) => placeCard(sectionCards(g.section), card, order, (c) => c.dataset.group);
  for (const g of layout.charts) {
    const entry = cards.get(g.id);
    if (entry && entry.keys.every((k, i) => g.keys[i] === k)) {
      // A chart of `val/` keys that a `train/` key joined moves under Training.
      if (entry.section.dataset.section !== g.section) {
        entry.section.dataset.section = g.section;
        place(entry.section, g);
      }
      if (g.keys.length > entry.keys.length) work.push(addKeys(entry, g.keys.slice(entry.keys.length)));
      continue;
    }
    const card = chartCard(g);
    if (entry) {
      feed.detach(entry.chart);
      cards.delete(g.id);
      entry.section.remove();
    }
    place(card, g);
    work.push(initChart(card.querySelector(".chart-box")));
  }
  showSections();
  if (layout.charts.length) document.getElementById("charts-empty")?.remove();

  const heatBox = document.getElementById("heatmaps");
  const layers = layout.heatmaps.map((h) => String(h.layer));
  const changed = [];
  for (const h of layout.heatmaps) {
    const cur = heatmaps.get(h.layer);
    if (cur && cur.keys.join(",") === h.keys.join(",")) continue;
    const card = heatmapCard(h);
    if (cur) {
      cur.offs.forEach((off) => off());
      cur.card.replaceWith(card);
    } else {
      placeCard(heatBox, card, layers, (c) => c.dataset.layer);
    }
    initHeatmap(card.querySelector(".heat-box"));
    changed.push(h.layer);
  }
  if (layout.heatmaps.length) document.getElementById("moe-section").hidden = false;
  work.push(loadHeatmaps(changed));
  await Promise.all(work);
}

// One layout request at a time; keys that show up meanwhile are covered by one more. It reads
// the layout's first page: charts on later pages get cards when the user asks for them.
let layoutRun = null;
let layoutAgain = false;
/** Whether the last layout read succeeded. */
let layoutRead = false;
function refreshLayout() {
  if (layoutRun) { layoutAgain = true; return layoutRun; }
  layoutRun = (async () => {
    do {
      layoutAgain = false;
      try {
        await applyLayout(await fetchChartLayout(runId));
        layoutRead = true;
      } catch (err) {
        // The keys stay unknown, so their next point asks again.
        layoutRead = false;
        console.warn("chart layout:", err);
      }
    } while (layoutAgain);
    layoutRun = null;
    reg.layouts = (reg.layouts ?? 0) + 1;
  })();
  return layoutRun;
}
feed.onUnknown = async (keys) => {
  await refreshLayout();
  // A key the first page has no card for belongs to a later page (or past a chart's key
  // limit): it is not asked about again; "Show more charts" gives its card.
  if (layoutRead) for (const k of keys) if (!feed.shows(k)) feed.ignored.add(k);
};

/** "Show more charts": the layout's next page, appended below the cards there are. */
function wireMoreCharts() {
  const more = document.getElementById("charts-more");
  if (!more) return;
  more.addEventListener("click", async () => {
    more.disabled = true;
    try {
      const page = await fetchChartLayout(runId, { cursor: more.dataset.cursor });
      const added = page.charts.filter((g) => !cards.has(g.id)).map((g) => {
        const card = chartCard(g);
        sectionCards(g.section).append(card);
        return initChart(card.querySelector(".chart-box"));
      });
      showSections();
      const count = document.getElementById("charts-count");
      // initChart registers its card before it reads anything.
      if (count) count.textContent = `${cards.size} of ${page.total_charts} charts shown`;
      if (page.next_cursor) {
        more.dataset.cursor = page.next_cursor;
        more.disabled = false;
      } else {
        document.getElementById("charts-more-row")?.remove();
      }
      await Promise.all(added);
    } catch (err) {
      more.disabled = false;
      console.warn("more charts:", err);
    }
  });
}

// The instability guard's points (trainer::wire::guard_keys) change its event panel, which
// static/checkpoints.js fetches from the server like the other panels.
for (const key of ["guard/skipped_steps", "guard/rollback_to"]) {
  feed.on(key, () => document.dispatchEvent(new CustomEvent("trainyard:guard")));
}

/** The card headers' latest values follow the stream, as a reload would show them. */
feed.onLatest = (key, step, value) => {
  for (const span of document.querySelectorAll(`[data-latest-of="${CSS.escape(key)}"]`)) {
    const shown = Number(/@ (\d+)$/.exec(span.textContent)?.[1] ?? -1);
    if (step >= shown) span.textContent = `${formatMetric(value)} @ ${step}`;
  }
};

// The header's duration: it ticks while the run runs, by the server's clock (its time at render
// against the browser's), and stops at the end the status event records.
const duration = document.getElementById("run-duration");
const clockSkew = duration ? Number(duration.dataset.now) - Date.now() : 0;
let startedAt = duration?.dataset.startedAt ? Number(duration.dataset.startedAt) : null;
reg.status = document.getElementById("status-badge")?.textContent.trim();

/** As the server writes it (views::fmt_duration): 42s, 3m 05s, 2h 07m. */
function fmtDuration(ms) {
  const s = Math.floor((Math.max(0, ms) + 500) / 1000);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  const two = (n) => String(n).padStart(2, "0");
  return h > 0 ? `${h}h ${two(m)}m` : m > 0 ? `${m}m ${two(sec)}s` : `${sec}s`;
}

function showDuration(untilMs) {
  if (!duration || startedAt == null) return;
  duration.textContent = fmtDuration(untilMs - startedAt);
  document.getElementById("run-duration-part").hidden = false;
}

setInterval(() => {
  if (reg.status === "running") showDuration(Date.now() + clockSkew);
}, 1000);

function onStatus(data) {
  const st = statusOf(data);
  if (!st) return;
  const at = typeof data.time === "number" ? data.time : Date.now() + clockSkew;
  if (st.status === "running" && startedAt == null) startedAt = at;
  if (reg.status === "running" && st.status !== "running") showDuration(at);
  setBadges(runId, st.status);
  reg.status = st.status;
  const active = ["queued", "running"].includes(st.status);
  const stop = document.getElementById("stop-button");
  if (stop) stop.disabled = !active;
  // A run is deleted once it has ended.
  const del = document.getElementById("delete-button");
  if (del) {
    del.disabled = active;
    if (!active) del.removeAttribute("title");
  }
  const out = document.querySelector("#stop-form output");
  if (out && !["queued", "running"].includes(st.status)) out.textContent = "";
  // A run not launched here is marked ended while it has not ended (the server's `markable`).
  const end = document.getElementById("end-form");
  if (end) end.hidden = !["created", "running", "lost"].includes(st.status);
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
    for (const { chart } of cards.values()) { chart.smoothing = w; chart.redraw(); }
  });
  document.getElementById("logscale")?.addEventListener("change", (e) => {
    for (const { chart } of cards.values()) { chart.logScale = e.target.checked; chart.redraw(); }
  });
  document.getElementById("xaxis")?.addEventListener("change", (e) => {
    for (const { chart } of cards.values()) { chart.xAxis = e.target.value; chart.view = null; chart.redraw(); }
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
  document.getElementById("end-form")?.addEventListener("submit", async (e) => {
    e.preventDefault();
    const form = e.target;
    const btn = document.getElementById("end-button");
    btn.disabled = true;
    try {
      await sendJSON("POST", `${api}/end`, { status: form.status.value, reason: form.reason.value });
      msg(form, "");
    } catch (err) { msg(form, err.message, true); }
    btn.disabled = false;
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
wireMoreCharts();
// Points up to the page's latest step come from the (downsampled) metric reads; the stream
// only needs what follows. After a drop, EventSource resumes with Last-Event-ID.
const afterStep = root.dataset.afterStep;
/** Keys reported once (views: the layout's `is_summary_key`) go to the summary table. */
const isSummaryKey = (key) => key.startsWith("data/") || key.startsWith("model/");
function updateSummary(points) {
  const body = document.querySelector("#summary tbody");
  if (!body) return;
  for (const p of points) {
    if (!isSummaryKey(p.key)) continue;
    feed.ignored.add(p.key);
    let row = body.querySelector(`tr[data-summary-of="${CSS.escape(p.key)}"]`);
    if (!row) {
      row = document.createElement("tr");
      row.dataset.summaryOf = p.key;
      const th = document.createElement("th");
      th.scope = "row";
      th.className = "mono";
      th.textContent = p.key;
      const td = document.createElement("td");
      td.className = "num mono";
      row.append(th, td);
      const after = [...body.children].find((r) => r.dataset.summaryOf > p.key);
      body.insertBefore(row, after ?? null);
    }
    if (!row.dataset.step || p.step >= Number(row.dataset.step)) {
      row.dataset.step = String(p.step);
      row.querySelector("td").textContent = formatMetric(p.value);
    }
    document.getElementById("summary-section").hidden = false;
  }
}
subscribe(`${api}/events${afterStep ? `?after_step=${afterStep}` : ""}`, {
  points: (data) => { updateSummary(data.points); feed.push(data.points); },
  status: onStatus,
  // The server ended the stream on its own failure; the browser reconnects and resumes.
  stream_error: () => setLiveState("reconnecting"),
}, { onState: setLiveState });
document.querySelectorAll(".heat-box[data-layer]").forEach(initHeatmap);
await Promise.all([
  ...[...document.querySelectorAll(".chart-box[data-keys]")].map(initChart),
  loadHeatmaps(),
]);
reg.ready = true;
document.body.dataset.ready = "true";
// Keys stored between the page's render and the stream's start have no point coming: one
// layout read covers them.
refreshLayout();
