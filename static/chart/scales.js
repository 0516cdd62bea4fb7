// Scales: value transforms (linear or log), the data extent a plot shows, the map from data
// units to pixels, tick positions and tick labels. Plain functions of numbers and series, so a
// scatter or parallel-coordinates plot can build its axes from the same pieces.

import { lowerBound } from "./data.js";

/** Identity transform: a linear axis. */
export const LINEAR = Object.freeze({ log: false, forward: (v) => v, inverse: (t) => t });

/** Base-10 log axis; values <= 0 have no position (NaN) and are skipped. */
export const LOG10 = Object.freeze({
  log: true,
  forward: (v) => (v > 0 ? Math.log10(v) : NaN),
  inverse: (t) => Math.pow(10, t),
});

export function valueTransform(log) {
  return log ? LOG10 : LINEAR;
}

/** A linear map from the domain [d0, d1] (transformed units) onto pixels [r0, r1]; a y axis
 *  passes r0 > r1 so larger values sit higher. */
export class Scale {
  constructor(d0, d1, r0, r1) {
    this.d0 = d0;
    this.d1 = d1;
    this.r0 = r0;
    this.r1 = r1;
  }

  map(v) {
    return this.r0 + ((v - this.d0) / (this.d1 - this.d0)) * (this.r1 - this.r0);
  }

  invert(px) {
    return this.d0 + ((px - this.r0) / (this.r1 - this.r0)) * (this.d1 - this.d0);
  }

  ticks(count) {
    return niceTicks(this.d0, this.d1, count);
  }
}

/** Round tick positions (1, 2 or 5 times a power of ten apart), about `count` of them. */
export function niceTicks(lo, hi, count) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) ?? raw;
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(t);
  return ticks;
}

/**
 * The box of data to show: x over every series (or the zoomed `view`), y over the points
 * inside that x range, transformed, with 5% headroom. `origin` is subtracted from x (the first
 * time, on a wall-time axis). Degenerate ranges widen to a unit span.
 */
export function extent(series, { axis, origin, view, transform }) {
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const s of series) {
    if (!s.n) continue;
    const xs = s.xs(axis);
    x0 = Math.min(x0, xs[0] - origin);
    x1 = Math.max(x1, xs[s.n - 1] - origin);
  }
  if (view) { x0 = view.x0; x1 = view.x1; }
  for (const s of series) {
    const xs = s.xs(axis);
    const i0 = lowerBound(xs, s.n, x0 + origin), i1 = lowerBound(xs, s.n, x1 + origin + 1e-9);
    for (let i = i0; i < i1; i++) {
      const v = transform.forward(s.values[i]);
      if (Number.isFinite(v)) { if (v < y0) y0 = v; if (v > y1) y1 = v; }
    }
  }
  if (!Number.isFinite(x0)) { x0 = 0; x1 = 1; }
  if (x1 === x0) x1 = x0 + 1;
  if (!Number.isFinite(y0)) { y0 = 0; y1 = 1; }
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const padY = (y1 - y0) * 0.05;
  return { x0, x1, y0: y0 - padY, y1: y1 + padY };
}

/** A value with 4 significant digits, exponential for very small or large magnitudes. */
export function formatValue(v) {
  if (!Number.isFinite(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
  return Number(v.toPrecision(4)).toString();
}

/** Milliseconds as `1h05m`, `3m07s` or `12s`. */
export function formatDuration(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  return h > 0 ? `${h}h${String(m).padStart(2, "0")}m` : m > 0 ? `${m}m${String(sec).padStart(2, "0")}s` : `${sec}s`;
}
