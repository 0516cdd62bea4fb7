// The sweep page's plots, redrawn from each `sweep` event: best objective so far by trial, every
// trial's metric curve, parallel coordinates, a slice per parameter and the parameter
// importance. They are composed from the line chart's pieces (chart/scales.js for ranges, ticks
// and log axes; chart/draw.js for canvases, axes, lines, markers and the one palette), so the
// sweep's axes read like every other chart of the dashboard.

import { Scale, LINEAR, LOG10, valueRange, valueTicks, formatValue } from "../chart/scales.js";
import { objective } from "./table.js";
import { PAD, PALETTE, colorFor, cssVar, prepareCanvas, leftPad, drawAxes, clipTo, drawLine, drawMarker, FONT } from "../chart/draw.js";

/** Distributions searched on a log scale (docs/sweeps.md, Parameters). */
const LOG_DISTRIBUTIONS = new Set(["log_uniform", "log_uniform_values", "int_log_uniform", "q_log_uniform", "q_log_uniform_values"]);

/** Greys for what no longer counts (pruned trials): the palette's neutral entry. */
const GREY = PALETTE[7];

const finite = (v) => typeof v === "number" && Number.isFinite(v);

/** Whether objective `a` is better than `b` under `goal`. */
export function better(a, b, goal) {
  return goal === "maximize" ? a > b : a < b;
}

/** `#rrggbb` as [r, g, b]. */
function rgb(hex) {
  const n = parseInt(hex.slice(1), 16);
  return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
}

/** The objective's colour ramp, from the palette: blue for the best value seen, through teal
 *  and gold, to red for the worst (neighbours mix without passing through grey). */
const RAMP = [PALETTE[0], PALETTE[5], PALETTE[4], PALETTE[6]].map(rgb);

function objectiveColor(v, lo, hi, goal) {
  let t = hi > lo ? (v - lo) / (hi - lo) : 0;
  if (goal === "maximize") t = 1 - t; // t: 0 = best, 1 = worst
  const span = t * (RAMP.length - 1);
  const i = Math.min(RAMP.length - 2, Math.floor(span));
  const u = span - i;
  const c = RAMP[i].map((x, k) => Math.round(x + (RAMP[i + 1][k] - x) * u));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

/** A canvas filling `box`, repainted with the latest data when the box is resized. */
class CanvasPlot {
  constructor(box, paint) {
    this.box = box;
    this.paint = paint;
    this.data = null;
    this.count = 0;
    this.canvas = document.createElement("canvas");
    this.canvas.setAttribute("role", "img");
    this.canvas.setAttribute("aria-label", box.dataset.title || "sweep chart");
    box.replaceChildren(this.canvas);
    new ResizeObserver(() => this.draw()).observe(box);
  }

  update(data) {
    this.data = data;
    return this.draw();
  }

  /** Paints; returns how many marks (lines, curves, dots) the plot holds. */
  draw() {
    if (!this.data) return this.count;
    const c = prepareCanvas(this.canvas, this.box);
    if (!c) return this.count;
    const colors = { text: cssVar(this.box, "--muted", "#666"), grid: cssVar(this.box, "--grid", "#eee"), fg: cssVar(this.box, "--fg", "#222") };
    this.count = this.paint(c, this.data, colors, this.box);
    this.box.dataset.drawn = String(this.count);
    return this.count;
  }
}

/** A note in the middle of an empty plot. */
function note(ctx, w, h, text, colors) {
  ctx.font = FONT;
  ctx.fillStyle = colors.text;
  ctx.textAlign = "center";
  ctx.textBaseline = "middle";
  ctx.fillText(text, w / 2, h / 2);
}

/** How a parameter is laid on an axis: a categorical parameter's values in the spec's order
 *  (every value it may take, so trials to come keep their place), numbers on a linear or, when
 *  searched so, log scale, and any other values as sorted categories. */
function axisOf(key, values, spec) {
  const def = spec?.parameters?.[key];
  const present = values.filter((v) => v !== null && v !== undefined);
  const listed = Array.isArray(def?.values) ? def.values : def && "value" in def && !def.distribution ? [def.value] : null;
  if (!listed && present.length && present.every(finite)) {
    const log = LOG_DISTRIBUTIONS.has(def?.distribution) && present.every((v) => v > 0);
    const transform = log ? LOG10 : LINEAR;
    const t = present.map((v) => transform.forward(v));
    const [d0, d1] = valueRange(Math.min(...t), Math.max(...t), transform);
    return { kind: "number", transform, d0, d1, pos: (v) => (finite(v) ? transform.forward(v) : NaN) };
  }
  const cats = (listed ?? []).map((v) => JSON.stringify(v));
  const extra = [...new Set(present.map((v) => JSON.stringify(v)))].filter((c) => !cats.includes(c)).sort();
  cats.push(...extra);
  return {
    kind: "category", cats, d0: -0.5, d1: Math.max(0.5, cats.length - 0.5),
    pos: (v) => (v === null || v === undefined ? NaN : cats.indexOf(JSON.stringify(v))),
  };
}

/** Ticks and labels of an axis laid out by `axisOf`, at most about `count` of them (a log
 *  axis within two decades offers every 1-2-5 multiple; a narrow plot keeps every k-th). */
function ticksOf(axis, count) {
  let ticks, labels;
  if (axis.kind === "number") ({ ticks, labels } = valueTicks(axis.d0, axis.d1, axis.transform, count));
  else {
    ticks = axis.cats.map((_, i) => i);
    labels = axis.cats.map((c) => { const v = JSON.parse(c); return typeof v === "string" ? v : String(v); });
  }
  const every = Math.ceil(ticks.length / Math.max(1, count));
  if (every <= 1) return { ticks, labels };
  return { ticks: ticks.filter((_, i) => i % every === 0), labels: labels.filter((_, i) => i % every === 0) };
}

/** The objective axis over trials' values. */
function objectiveAxis(values) {
  const [d0, d1] = valueRange(Math.min(...values), Math.max(...values), LINEAR);
  return { kind: "number", transform: LINEAR, d0, d1, pos: (v) => v };
}

// --- Best so far ------------------------------------------------------------------------------

function paintBest({ ctx, w, h }, d, colors) {
  const done = d.trials.filter((t) => t.state === "complete" && finite(t.value)).sort((a, b) => a.number - b.number);
  if (!done.length) { note(ctx, w, h, "No complete trial yet", colors); return 0; }
  const numbers = d.trials.map((t) => t.number);
  const x0 = Math.min(...numbers), x1 = Math.max(...numbers);
  const [y0, y1] = valueRange(Math.min(...done.map((t) => t.value)), Math.max(...done.map((t) => t.value)), LINEAR);
  const yt = valueTicks(y0, y1, LINEAR, Math.max(3, Math.round((h - PAD.top - PAD.bottom) / 40)));
  const area = { left: leftPad(ctx, yt.labels), top: PAD.top, right: w - PAD.right, bottom: h - PAD.bottom };
  const x = new Scale(x0 - 0.5, x1 + 0.5, area.left, area.right);
  const y = new Scale(y0, y1, area.bottom, area.top);
  const xt = valueTicks(x0 - 0.5, x1 + 0.5, LINEAR, Math.max(2, Math.floor((area.right - area.left) / 60)));
  const whole = xt.ticks.map((t, i) => [t, xt.labels[i]]).filter(([t]) => Number.isInteger(t));
  drawAxes(ctx, area, { scale: x, ticks: whole.map((p) => p[0]), labels: whole.map((p) => p[1]), caption: "trial" }, { scale: y, ...yt }, colors);
  const unclip = clipTo(ctx, area);
  // The running best as a staircase: it only ever improves.
  ctx.strokeStyle = colorFor(0);
  ctx.lineWidth = 2;
  ctx.beginPath();
  let best = null;
  for (const t of done) {
    if (best === null) { best = t.value; ctx.moveTo(x.map(t.number), y.map(best)); continue; }
    ctx.lineTo(x.map(t.number), y.map(best));
    if (better(t.value, best, d.goal)) { best = t.value; ctx.lineTo(x.map(t.number), y.map(best)); }
  }
  ctx.lineTo(x.map(x1), y.map(best));
  ctx.stroke();
  for (const t of done) drawMarker(ctx, x.map(t.number), y.map(t.value), t.number === d.best?.number ? colorFor(0) : GREY, t.number === d.best?.number ? 4.5 : 3);
  unclip();
  return done.length;
}

// --- Curves -----------------------------------------------------------------------------------

/** The points of a trial's curve the chart draws: a pruned trial's up to the step it had
 *  reached when it was pruned (its run may log a few more while it stops). */
function drawnPoints(t) {
  const pts = (t.curve ?? []).filter((p) => finite(p[1]));
  return t.state === "pruned" && finite(t.step) ? pts.filter((p) => p[0] <= t.step) : pts;
}

/** The curves' legend under the chart: a swatch per trial, in its colour (pruned: grey,
 *  dashed), its number, state and, for the best, a mark. */
function curvesLegend(box, trials, best) {
  let legend = box.parentElement?.querySelector(".sweep-curves-legend");
  if (!legend) {
    legend = document.createElement("div");
    legend.className = "chart-legend sweep-curves-legend";
    legend.id = "sweep-curves-legend";
    box.after(legend);
  }
  const items = [...trials].sort((a, b) => a.number - b.number).map((t) => {
    const item = document.createElement("span");
    item.dataset.trial = String(t.number);
    item.dataset.state = t.state;
    const sw = document.createElement("i");
    if (t.state === "pruned") { sw.className = "dashed"; sw.style.borderColor = GREY; } else sw.style.background = colorFor(t.number);
    item.append(sw, document.createTextNode(`trial ${t.number}${t.state === "running" ? "" : ` (${t.state})`}${t.number === best ? " · best" : ""}`));
    return item;
  });
  legend.replaceChildren(...items);
}

function paintCurves({ ctx, w, h }, d, colors, box) {
  const trials = d.trials.filter((t) => drawnPoints(t).length > 0);
  curvesLegend(box, trials, d.best?.number);
  if (!trials.length) { note(ctx, w, h, `No ${d.metric} points yet`, colors); return 0; }
  let x0 = Infinity, x1 = -Infinity, v0 = Infinity, v1 = -Infinity;
  for (const t of trials) for (const [s, v] of drawnPoints(t)) {
    x0 = Math.min(x0, s); x1 = Math.max(x1, s); v0 = Math.min(v0, v); v1 = Math.max(v1, v);
  }
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  const [y0, y1] = valueRange(v0, v1, LINEAR);
  const yt = valueTicks(y0, y1, LINEAR, Math.max(3, Math.round((h - PAD.top - PAD.bottom) / 40)));
  const area = { left: leftPad(ctx, yt.labels), top: PAD.top, right: w - PAD.right, bottom: h - PAD.bottom };
  const x = new Scale(x0, x1, area.left, area.right);
  const y = new Scale(y0, y1, area.bottom, area.top);
  const xt = valueTicks(x0, x1, LINEAR, Math.max(2, Math.floor((area.right - area.left) / 90)));
  drawAxes(ctx, area, { scale: x, ...xt, caption: "step" }, { scale: y, ...yt }, colors);
  const unclip = clipTo(ctx, area);
  // Pruned curves first, so live and complete ones are drawn over them.
  trials.sort((a, b) => (a.state === "pruned") === (b.state === "pruned") ? a.number - b.number : a.state === "pruned" ? -1 : 1);
  for (const t of trials) {
    const pts = drawnPoints(t);
    const xs = Float64Array.from(pts, (p) => p[0]), ys = Float64Array.from(pts, (p) => p[1]);
    const pruned = t.state === "pruned";
    const color = pruned ? GREY : colorFor(t.number);
    ctx.setLineDash(pruned ? [5, 4] : []);
    ctx.lineWidth = t.number === d.best?.number ? 2.5 : 1.5;
    ctx.globalAlpha = pruned ? 0.8 : 1;
    drawLine(ctx, { xs, ys, i0: 0, i1: pts.length, origin: 0, transform: LINEAR }, x, y, color);
    ctx.setLineDash([]);
    const [ls, lv] = pts[pts.length - 1];
    if (pts.length === 1) drawMarker(ctx, x.map(ls), y.map(lv), color);
    if (pruned) {
      // An × where the early-stopping rule stopped it.
      const px = x.map(ls), py = y.map(lv);
      ctx.strokeStyle = GREY;
      ctx.lineWidth = 2;
      ctx.beginPath();
      ctx.moveTo(px - 4, py - 4); ctx.lineTo(px + 4, py + 4);
      ctx.moveTo(px - 4, py + 4); ctx.lineTo(px + 4, py - 4);
      ctx.stroke();
    }
  }
  ctx.globalAlpha = 1;
  unclip();
  return trials.length;
}

// --- Parallel coordinates ---------------------------------------------------------------------

/** The axis names above the parallel-coordinates plot, as text over the canvas: each wraps at
 *  its dots within the room between axes and is cut with an ellipsis beyond two lines; its
 *  title holds the full name. */
function axisLabels(box, axes, width, top) {
  let layer = box.querySelector(".pc-labels");
  if (!layer) {
    layer = document.createElement("div");
    layer.className = "pc-labels";
    box.appendChild(layer);
  }
  layer.style.height = `${top - 6}px`;
  const labels = axes.map((a) => {
    const label = document.createElement("span");
    label.className = "pc-label mono";
    label.title = a.label;
    label.dataset.axis = a.label;
    // A break opportunity after every dot and underscore: `training.` / `learning_rate`.
    a.label.split(/(?<=[._])/).forEach((part, i) => {
      if (i) label.appendChild(document.createElement("wbr"));
      label.appendChild(document.createTextNode(part));
    });
    const left = Math.max(0, Math.min(box.clientWidth - width, a.x - width / 2));
    label.style.left = `${left}px`;
    label.style.width = `${width}px`;
    return label;
  });
  layer.replaceChildren(...labels);
}

function clip(ctx, text, width) {
  if (ctx.measureText(text).width <= width) return text;
  let t = text;
  while (t.length > 1 && ctx.measureText(`…${t}`).width > width) t = t.slice(1);
  return `…${t}`;
}

function paintParallel({ ctx, w, h }, { d, params }, colors, box) {
  const trials = d.trials.filter((t) => finite(objective(t))).map((t) => ({ ...t, value: objective(t) }));
  if (!trials.length || !params.length) {
    box.querySelector(".pc-labels")?.replaceChildren();
    note(ctx, w, h, "No trial has an objective yet", colors);
    return 0;
  }
  const axes = params.map((k) => ({ label: k, get: (t) => t.params?.[k], ...axisOf(k, trials.map((t) => t.params?.[k]), d.spec) }));
  axes.push({ label: `${d.metric} (${d.goal})`, get: (t) => t.value, ...objectiveAxis(trials.map((t) => t.value)) });
  // Room above the axes for names of two lines.
  const top = 44, bottom = h - 14, left = 56, right = w - 56;
  const gap = axes.length > 1 ? (right - left) / (axes.length - 1) : 0;
  axes.forEach((a, i) => { a.x = axes.length > 1 ? left + i * gap : (left + right) / 2; a.scale = new Scale(a.d0, a.d1, bottom, top); });
  axisLabels(box, axes, Math.max(60, Math.min(gap - 8, 220)), top);
  const values = trials.map((t) => t.value);
  const lo = Math.min(...values), hi = Math.max(...values);
  // Worst first, so the best lines lie on top.
  trials.sort((a, b) => (better(a.value, b.value, d.goal) ? 1 : better(b.value, a.value, d.goal) ? -1 : 0));
  let lines = 0;
  for (const t of trials) {
    const pruned = t.state === "pruned";
    ctx.strokeStyle = pruned ? GREY : objectiveColor(t.value, lo, hi, d.goal);
    ctx.setLineDash(pruned ? [4, 3] : []);
    ctx.globalAlpha = t.state === "complete" ? 0.9 : 0.55;
    ctx.lineWidth = t.number === d.best?.number ? 2.5 : 1.25;
    ctx.beginPath();
    let pen = false;
    for (const a of axes) {
      const p = a.pos(a.get(t));
      if (!Number.isFinite(p)) { pen = false; continue; } // a parameter this trial lacks
      const py = a.scale.map(p);
      if (pen) ctx.lineTo(a.x, py); else ctx.moveTo(a.x, py);
      pen = true;
    }
    ctx.stroke();
    lines += 1;
  }
  ctx.setLineDash([]);
  ctx.globalAlpha = 1;
  // Axes over the lines: a rule and tick labels beside (the names are `axisLabels`).
  ctx.font = FONT;
  for (const a of axes) {
    ctx.strokeStyle = colors.text;
    ctx.lineWidth = 1;
    ctx.beginPath(); ctx.moveTo(Math.round(a.x) + 0.5, top); ctx.lineTo(Math.round(a.x) + 0.5, bottom); ctx.stroke();
    const { ticks, labels } = ticksOf(a, 5);
    ctx.fillStyle = colors.text;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    ticks.forEach((tk, i) => {
      const py = a.scale.map(tk);
      if (py < top - 1 || py > bottom + 1) return;
      ctx.beginPath(); ctx.moveTo(a.x - 3, py); ctx.lineTo(a.x, py); ctx.stroke();
      ctx.fillText(clip(ctx, labels[i], 48), a.x - 5, py);
    });
  }
  return lines;
}

// --- Slices -----------------------------------------------------------------------------------

function paintSlice({ ctx, w, h }, { d, key }, colors) {
  const trials = d.trials
    .filter((t) => finite(objective(t)) && t.params?.[key] !== undefined)
    .map((t) => ({ ...t, value: objective(t) }));
  if (!trials.length) { note(ctx, w, h, "no objective yet", colors); return 0; }
  const ax = axisOf(key, trials.map((t) => t.params[key]), d.spec);
  const oy = objectiveAxis(trials.map((t) => t.value));
  const yt = valueTicks(oy.d0, oy.d1, LINEAR, Math.max(3, Math.round((h - PAD.top - PAD.bottom) / 36)));
  const area = { left: leftPad(ctx, yt.labels), top: 8, right: w - 10, bottom: h - PAD.bottom };
  const x = new Scale(ax.d0, ax.d1, area.left, area.right);
  const y = new Scale(oy.d0, oy.d1, area.bottom, area.top);
  const xt = ticksOf(ax, Math.max(2, Math.floor((area.right - area.left) / 55)));
  drawAxes(ctx, area, { scale: x, ...xt, caption: ax.kind === "number" && ax.transform.log ? "log scale" : "" }, { scale: y, ...yt }, colors);
  const unclip = clipTo(ctx, area);
  for (const t of trials) {
    const px = x.map(ax.pos(t.params[key])), py = y.map(t.value);
    if (t.state === "complete") drawMarker(ctx, px, py, colorFor(0), 3.5);
    else {
      // Not a final value (still running, or stopped early): a ring.
      ctx.strokeStyle = t.state === "pruned" ? GREY : colorFor(0);
      ctx.lineWidth = 1.5;
      ctx.beginPath(); ctx.arc(px, py, 3, 0, 2 * Math.PI); ctx.stroke();
    }
  }
  unclip();
  return trials.length;
}

// --- Importance -------------------------------------------------------------------------------

function renderImportance(box, importance) {
  const entries = Object.entries(importance ?? {}).filter(([, v]) => finite(v)).sort((a, b) => b[1] - a[1]);
  if (!entries.length) {
    const p = document.createElement("p");
    p.className = "muted";
    p.textContent = "Needs a few complete trials.";
    box.replaceChildren(p);
    return 0;
  }
  const rows = entries.map(([key, share]) => {
    const row = document.createElement("div");
    row.className = "imp-row";
    row.dataset.param = key;
    const name = document.createElement("span");
    name.className = "mono";
    name.textContent = key;
    const track = document.createElement("span");
    track.className = "imp-track";
    const bar = document.createElement("span");
    bar.className = "imp-bar";
    bar.style.width = `${Math.max(0, Math.min(1, share)) * 100}%`;
    bar.style.background = colorFor(0);
    track.appendChild(bar);
    const value = document.createElement("span");
    value.className = "num mono";
    value.textContent = `${formatValue(share * 100)}%`;
    row.append(name, track, value);
    return row;
  });
  box.replaceChildren(...rows);
  return rows.length;
}

/** Every plot of the sweep page; `update(detail, params)` redraws them and returns the counts. */
export class SweepPlots {
  constructor() {
    this.best = new CanvasPlot(document.getElementById("sweep-best"), paintBest);
    this.curves = new CanvasPlot(document.getElementById("sweep-curves"), paintCurves);
    this.parallel = new CanvasPlot(document.getElementById("sweep-parallel"), paintParallel);
    this.slicesBox = document.getElementById("sweep-slices");
    this.importanceBox = document.getElementById("sweep-importance");
    /** Slice plots by parameter key. */
    this.slices = new Map();
  }

  /** The slice plots for `params`, made or dropped to match. */
  sliceFor(key) {
    let plot = this.slices.get(key);
    if (!plot) {
      const card = document.createElement("div");
      card.className = "slice";
      card.dataset.param = key;
      const title = document.createElement("h4");
      title.className = "mono";
      title.textContent = key;
      const box = document.createElement("div");
      box.className = "chart-box";
      box.dataset.title = `Objective against ${key}`;
      card.append(title, box);
      this.slicesBox.appendChild(card);
      plot = new CanvasPlot(box, paintSlice);
      plot.card = card;
      this.slices.set(key, plot);
    }
    return plot;
  }

  update(detail, params) {
    for (const [key, plot] of this.slices) {
      if (!params.includes(key)) { plot.card.remove(); this.slices.delete(key); }
    }
    let slices = 0;
    for (const key of params) if (this.sliceFor(key).update({ d: detail, key }) > 0) slices += 1;
    return {
      best: this.best.update(detail),
      curves: this.curves.update(detail),
      lines: this.parallel.update({ d: detail, params }),
      slices,
      importance: renderImportance(this.importanceBox, detail.importance),
    };
  }
}
