// Canvas line chart for metric series that may hold millions of points. This entry composes
// the pieces under chart/: data.js (series, smoothing, merges), scales.js (extent, linear/log
// maps, ticks), draw.js (canvas painting, palette), interact.js (zoom and tooltip) and live.js
// (server-sent points into charts). Each frame draws at most ~2 points (min and max) per pixel
// column, so drawing cost depends on the canvas width, not on the series length.

import { Series, lowerBound, timeOrigin, pointCount, effectiveSmoothing, nanSteps } from "./chart/data.js";
import { Scale, extent, valueTransform, valueTicks, xTicks, formatValue } from "./chart/scales.js";
import {
  PAD, PALETTE, colorFor, cssVar, prepareCanvas, leftPad, drawAxes, clipTo, drawLine, drawMarker,
  drawNanMarks, drawSelection, drawCursor,
} from "./chart/draw.js";
import { bindPointer } from "./chart/interact.js";

export { Series, lowerBound, PALETTE, colorFor };

/** A line chart bound to a canvas inside `box`. */
export class LineChart {
  /** opts: {onZoom(startStep, endStep, chart) -> Promise, smoothing, logScale,
   *  xAxis: "step"|"time", xUnit: what a step counts, "step" or "seconds" (`sys/...` series,
   *  whose step is the time since the run started)} */
  constructor(box, opts = {}) {
    this.box = box;
    this.opts = opts;
    this.series = [];
    this.smoothing = opts.smoothing ?? 0;
    this.logScale = !!opts.logScale;
    this.xAxis = opts.xAxis ?? "step";
    this.xUnit = opts.xUnit ?? "step";
    this.view = null; // {x0, x1} in x units while zoomed
    this.frame = null; // the last drawn frame: {w, h, area, x, y, origin, transform}
    this.canvas = document.createElement("canvas");
    this.canvas.setAttribute("role", "img");
    this.canvas.setAttribute("aria-label", box.dataset.title || "metric chart");
    this.canvas.tabIndex = 0;
    box.replaceChildren(this.canvas);
    this.tip = document.createElement("div");
    this.tip.className = "chart-tip";
    this.tip.hidden = true;
    box.appendChild(this.tip);
    this.pending = false;
    this.drag = null;
    this.hover = null;
    bindPointer(this);
    new ResizeObserver(() => this.redraw()).observe(box);
  }

  addSeries(label, color) {
    const s = new Series(label, color ?? colorFor(this.series.length));
    this.series.push(s);
    return s;
  }

  /** Total points held (exposed for tests through data-points). */
  pointCount() {
    return pointCount(this.series);
  }

  /** Draws on the next animation frame; several calls before it draw once. */
  redraw() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.draw();
    });
  }

  updateDataset() {
    this.box.dataset.points = String(this.pointCount());
    const last = this.series.map((s) => (s.n ? s.steps[s.n - 1] : -1));
    this.box.dataset.lastStep = String(Math.max(-1, ...last));
  }

  origin() {
    return this.xAxis === "time" ? timeOrigin(this.series) : 0;
  }

  /** What the x axis counts, written under it. */
  xCaption() {
    if (this.xAxis === "time") return "wall time";
    return this.xUnit === "seconds" ? "time since start (s)" : "step";
  }

  /** The smoothing weight series `s` is drawn with (see effectiveSmoothing). */
  smoothingOf(s) {
    return effectiveSmoothing(this.smoothing, s.n);
  }

  draw() {
    const canvas = prepareCanvas(this.canvas, this.box);
    if (!canvas) return;
    const { ctx, w, h } = canvas;
    const colors = { text: cssVar(this.box, "--muted", "#666"), grid: cssVar(this.box, "--grid", "#eee") };
    const transform = valueTransform(this.logScale);
    const origin = this.origin();
    const b = extent(this.series, { axis: this.xAxis, origin, view: this.view, transform });
    // About one y tick per 40 px of plot height.
    const yt = valueTicks(b.y0, b.y1, transform, Math.max(3, Math.round((h - PAD.top - PAD.bottom) / 40)));
    const area = { left: leftPad(ctx, yt.labels), top: PAD.top, right: w - PAD.right, bottom: h - PAD.bottom };
    const x = new Scale(b.x0, b.x1, area.left, area.right);
    const y = new Scale(b.y0, b.y1, area.bottom, area.top);
    const xt = xTicks(b.x0, b.x1, this.xAxis, Math.max(2, Math.floor((area.right - area.left) / 90)));
    this.frame = { w, h, area, x, y, origin, transform };
    const caption = this.xCaption();
    drawAxes(ctx, area, { scale: x, ...xt, caption }, { scale: y, ...yt }, colors);
    // What the axes say, for tests and screenshots' captions: tick labels and the value range.
    Object.assign(this.box.dataset, {
      xTicks: JSON.stringify(xt.labels),
      yTicks: JSON.stringify(yt.labels),
      yRange: JSON.stringify([transform.inverse(b.y0), transform.inverse(b.y1)]),
      xCaption: caption,
      log: String(transform.log),
      smoothing: JSON.stringify(this.series.map((s) => this.smoothingOf(s))),
    });

    const unclip = clipTo(ctx, area);
    const pieces = [];
    const danger = cssVar(this.box, "--danger", "#c93838");
    for (const s of this.series) {
      if (!s.n) { pieces.push(0); continue; }
      const weight = this.smoothingOf(s);
      // With smoothing on, the raw line stays as a faint trace under the smoothed one.
      ctx.globalAlpha = weight > 0 ? 0.25 : 1;
      ctx.lineWidth = 1.25;
      pieces.push(this.paintSeries(ctx, s, s.values));
      ctx.globalAlpha = 1;
      this.paintNanMarks(ctx, s, danger);
      if (weight > 0) {
        ctx.globalAlpha = 1;
        ctx.lineWidth = 1.75;
        this.paintSeries(ctx, s, s.smooth(weight));
      }
    }
    unclip();
    ctx.globalAlpha = 1;
    // The gaps NaN points leave, for tests: each series' line pieces and NaN steps.
    Object.assign(this.box.dataset, {
      linePieces: JSON.stringify(pieces),
      nanSteps: JSON.stringify(this.series.map(nanSteps)),
    });

    if (this.drag && this.drag.x1 !== undefined) drawSelection(ctx, area, this.drag.x0, this.drag.x1);
    if (this.hover) drawCursor(ctx, area, this.hover.px, colors.text);
    this.updateDataset();
  }

  /** One series' values `ys` over the frame's x range (one point beyond each edge, so lines
   *  run to the border). */
  paintSeries(ctx, s, ys) {
    const { x, y, origin, transform } = this.frame;
    const xs = s.xs(this.xAxis);
    const [i0, i1] = this.visible(s, xs);
    const pieces = drawLine(ctx, { xs, ys, i0, i1, origin, transform }, x, y, s.color);
    const lone = transform.forward(ys[0]);
    if (s.n === 1 && Number.isFinite(lone)) drawMarker(ctx, x.map(xs[0] - origin), y.map(lone), s.color);
    return pieces;
  }

  /** The index range of series `s` over the frame's x range, one point beyond each edge. */
  visible(s, xs) {
    const { x, origin } = this.frame;
    const i0 = Math.max(0, lowerBound(xs, s.n, x.d0 + origin) - 1);
    const i1 = Math.min(s.n, lowerBound(xs, s.n, x.d1 + origin + 1e-9) + 1);
    return [i0, i1];
  }

  /** Marks the series' NaN points on the x axis (each is a gap in its line). */
  paintNanMarks(ctx, s, color) {
    const { x, area, origin } = this.frame;
    const xs = s.xs(this.xAxis);
    const [i0, i1] = this.visible(s, xs);
    drawNanMarks(ctx, { xs, ys: s.values, i0, i1, origin }, x, area, color);
  }

  /** Zooms to an x range and asks the owner for detail in that step range. */
  zoomTo(a, z) {
    this.view = { x0: a, x1: z };
    if (this.opts.onZoom) {
      const [s0, s1] = this.stepRange(a, z);
      Promise.resolve(this.opts.onZoom(s0, s1, this)).then(() => this.redraw());
    }
    this.box.dataset.zoomed = "true";
    this.redraw();
  }

  resetZoom() {
    if (!this.view) return;
    this.view = null;
    delete this.box.dataset.zoomed;
    if (this.opts.onZoom) Promise.resolve(this.opts.onZoom(null, null, this)).then(() => this.redraw());
    this.redraw();
  }

  /** The steps an x range covers (on a wall-time axis, of the points inside it). */
  stepRange(a, z) {
    if (this.xAxis === "step") return [Math.floor(a), Math.ceil(z)];
    const off = timeOrigin(this.series);
    let s0 = Infinity, s1 = -Infinity;
    for (const s of this.series) {
      const i0 = lowerBound(s.times, s.n, a + off), i1 = lowerBound(s.times, s.n, z + off) - 1;
      if (i0 < s.n) s0 = Math.min(s0, s.steps[i0]);
      if (i1 >= 0) s1 = Math.max(s1, s.steps[i1]);
    }
    return [s0, s1];
  }

  /** Shows each series' point nearest to pixel column px. */
  showTip(px, py) {
    const f = this.frame;
    if (!f || px < f.area.left || px > f.area.right) { this.hideTip(); return; }
    const x = f.x.invert(px);
    const off = this.origin();
    const rows = [];
    for (const s of this.series) {
      if (!s.n) continue;
      const xs = s.xs(this.xAxis);
      let i = lowerBound(xs, s.n, x + off);
      if (i >= s.n || (i > 0 && Math.abs(xs[i - 1] - off - x) < Math.abs(xs[i] - off - x))) i -= 1;
      i = Math.max(0, i);
      const weight = this.smoothingOf(s);
      const sm = weight > 0 ? ` (smoothed ${formatValue(s.smooth(weight)[i])})` : "";
      rows.push(`${s.label}: step ${s.steps[i]} · ${s.values[i]}${sm}`);
    }
    if (!rows.length) { this.tip.hidden = true; return; }
    this.hover = { px };
    this.tip.textContent = rows.join("\n");
    this.tip.style.whiteSpace = "pre";
    this.tip.hidden = false;
    const left = px + 12 + this.tip.offsetWidth > f.w ? px - 12 - this.tip.offsetWidth : px + 12;
    this.tip.style.left = `${left}px`;
    this.tip.style.top = `${Math.max(0, py - 10)}px`;
  }

  hideTip() {
    this.hover = null;
    this.tip.hidden = true;
  }
}
