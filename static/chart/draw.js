// Canvas painting: sizing a canvas to its box, grid and tick labels, series lines, markers and
// the zoom/hover overlays. Every function takes the context and the scales it paints with, so a
// new plot composes the pieces it needs. Colours come from the server's one palette.

import { PALETTE } from "../palette.js";

export { PALETTE };

/** Room around the plot area (CSS pixels): below it the x tick labels and the axis caption;
 *  the left side is sized to the widest y label (`leftPad`). */
export const PAD = Object.freeze({ right: 12, top: 12, bottom: 38 });

/** The zoom selection: the page accent (app.css `--accent`) at 15%. */
const SELECTION = "rgba(47,111,222,0.15)";

export const FONT = "11px system-ui, sans-serif";

/** The colour of the `i`-th series (the palette repeats). */
export function colorFor(i) {
  return PALETTE[i % PALETTE.length];
}

/** A CSS custom property of `el`, or `fallback` when unset. */
export function cssVar(el, name, fallback) {
  const v = getComputedStyle(el).getPropertyValue(name).trim();
  return v || fallback;
}

/**
 * Sizes `canvas` to `box` at the device pixel ratio and clears it. Returns {ctx, w, h} in CSS
 * pixels, or null while the box has no size (hidden).
 */
export function prepareCanvas(canvas, box) {
  const dpr = window.devicePixelRatio || 1;
  const w = box.clientWidth, h = box.clientHeight;
  if (!w || !h) return null;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  return { ctx, w, h };
}

/** The left padding that fits the widest of `labels` (the y tick labels) beside the plot. */
export function leftPad(ctx, labels) {
  ctx.font = FONT;
  const widest = labels.reduce((m, l) => Math.max(m, ctx.measureText(l).width), 0);
  return Math.max(36, Math.ceil(widest) + 12);
}

/**
 * Grid lines, tick labels and the x axis caption. `x` and `y` are {scale, ticks, labels} with
 * one label per tick, and `x.caption` names what x counts; `area` is the plot rectangle
 * {left, top, right, bottom}; `colors` {text, grid}.
 */
export function drawAxes(ctx, area, x, y, colors) {
  ctx.font = FONT;
  ctx.lineWidth = 1;
  ctx.strokeStyle = colors.grid;
  ctx.fillStyle = colors.text;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  y.ticks.forEach((t, i) => {
    const py = Math.round(y.scale.map(t)) + 0.5;
    ctx.beginPath(); ctx.moveTo(area.left, py); ctx.lineTo(area.right, py); ctx.stroke();
    // Kept inside the canvas: a tick at the very top keeps its whole label.
    ctx.fillText(y.labels[i], area.left - 6, Math.max(7, py));
  });
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  x.ticks.forEach((t, i) => {
    const px = Math.round(x.scale.map(t)) + 0.5;
    ctx.beginPath(); ctx.moveTo(px, area.top); ctx.lineTo(px, area.bottom); ctx.stroke();
    ctx.fillText(x.labels[i], px, area.bottom + 5);
  });
  if (x.caption) {
    ctx.textAlign = "right";
    ctx.fillText(x.caption, area.right, area.bottom + 21);
  }
}

/** Restricts painting to the plot rectangle until the returned function is called. */
export function clipTo(ctx, area) {
  ctx.save();
  ctx.beginPath();
  ctx.rect(area.left, area.top, area.right - area.left, area.bottom - area.top);
  ctx.clip();
  return () => ctx.restore();
}

/**
 * Strokes points i0..i1 of (xs, ys) as a line. Per pixel column it draws the first of the
 * column's min and max, then the other, in step order: spikes stay visible while the work is
 * bounded by the plot width, not the series length. `origin` is subtracted from x; `transform`
 * maps values onto the y scale's units; values it cannot place are skipped, and a NaN value
 * breaks the line (a gap; `drawNanMarks` marks it). Returns the number of pieces stroked.
 */
export function drawLine(ctx, { xs, ys, i0, i1, origin, transform }, xScale, yScale, color) {
  ctx.strokeStyle = color;
  ctx.beginPath();
  let started = false, col = NaN, minV = 0, maxV = 0, minI = 0, maxI = 0, pieces = 0;
  const flush = () => {
    if (Number.isNaN(col)) return;
    const a = minI < maxI ? minV : maxV, z = minI < maxI ? maxV : minV;
    if (!started) { ctx.moveTo(col, yScale.map(a)); started = true; pieces++; } else ctx.lineTo(col, yScale.map(a));
    if (z !== a) ctx.lineTo(col, yScale.map(z));
  };
  for (let i = i0; i < i1; i++) {
    if (Number.isNaN(ys[i])) {
      flush();
      started = false;
      col = NaN;
      continue;
    }
    const v = transform.forward(ys[i]);
    if (!Number.isFinite(v)) continue;
    const c = Math.round(xScale.map(xs[i] - origin));
    if (c !== col) {
      flush();
      col = c; minV = maxV = v; minI = maxI = i;
    } else {
      if (v < minV) { minV = v; minI = i; }
      if (v > maxV) { maxV = v; maxI = i; }
    }
  }
  flush();
  ctx.stroke();
  return pieces;
}

/** A NaN point's mark: a small triangle on the x axis, under the gap it leaves. */
export function drawNanMarks(ctx, { xs, ys, i0, i1, origin }, xScale, area, color) {
  ctx.fillStyle = color;
  for (let i = i0; i < i1; i++) {
    if (!Number.isNaN(ys[i])) continue;
    const px = xScale.map(xs[i] - origin);
    ctx.beginPath();
    ctx.moveTo(px, area.bottom - 7);
    ctx.lineTo(px - 4, area.bottom);
    ctx.lineTo(px + 4, area.bottom);
    ctx.closePath();
    ctx.fill();
  }
}

/** A filled dot: a lone point, which has no segment to stroke. */
export function drawMarker(ctx, px, py, color, radius = 3) {
  ctx.fillStyle = color;
  ctx.beginPath();
  ctx.arc(px, py, radius, 0, 2 * Math.PI);
  ctx.fill();
}

/** The band a zoom drag covers, between pixel columns a and z. */
export function drawSelection(ctx, area, a, z) {
  ctx.fillStyle = SELECTION;
  ctx.fillRect(Math.min(a, z), area.top, Math.abs(z - a), area.bottom - area.top);
}

/** The vertical hover line at pixel column px. */
export function drawCursor(ctx, area, px, color) {
  ctx.strokeStyle = color;
  ctx.beginPath(); ctx.moveTo(px + 0.5, area.top); ctx.lineTo(px + 0.5, area.bottom); ctx.stroke();
}
