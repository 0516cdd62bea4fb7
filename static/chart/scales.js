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

/** The tick spacing for about `count` ticks over `span`: 1, 2 or 5 times a power of ten. */
export function niceStep(span, count) {
  const raw = span / Math.max(1, count);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  return [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw * (1 - 1e-9)) ?? raw;
}

/** Round tick positions in [lo, hi] (multiples of a nice step, at least `minStep` apart),
 *  about `count` of them. Each is k * step, so a tick within rounding noise of 0 is 0. */
export function niceTicks(lo, hi, count, minStep = 0) {
  if (!(hi > lo) || !Number.isFinite(lo) || !Number.isFinite(hi)) return [lo];
  const step = Math.max(niceStep(hi - lo, count), minStep);
  const ticks = [];
  const last = Math.floor(hi / step + 1e-9);
  for (let k = Math.ceil(lo / step - 1e-9); k <= last; k++) {
    const t = k * step;
    ticks.push(Math.abs(t) < step * 1e-9 ? 0 : t);
  }
  return ticks;
}

/** 10^d written out, exact where Math.pow(10, -3) is not. */
function pow10(d) {
  return Number(`1e${d}`);
}

/** Ticks of a log axis over values [lo, hi] (both > 0): powers of ten (thinned to about
 *  `count`), else 1-2-5 multiples, else linear ticks; never a tick on 10^0.2 = 1.585. */
export function logTicks(lo, hi, count) {
  const d0 = Math.ceil(Math.log10(lo) - 1e-9), d1 = Math.floor(Math.log10(hi) + 1e-9);
  const decades = d1 >= d0 ? d1 - d0 + 1 : 0;
  if (decades >= 2) {
    const every = Math.max(1, Math.ceil(decades / Math.max(1, count)));
    const out = [];
    for (let i = 0; i < decades; i += every) out.push(pow10(d0 + i));
    return out;
  }
  const out = [];
  for (let d = Math.floor(Math.log10(lo)); d <= Math.ceil(Math.log10(hi)); d++) {
    for (const m of [1, 2, 5]) {
      const t = m * pow10(d);
      if (t >= lo * (1 - 1e-9) && t <= hi * (1 + 1e-9)) out.push(t);
    }
  }
  if (out.length >= 2) return out;
  return niceTicks(lo, hi, count).filter((t) => t > 0);
}

/**
 * Labels for sorted tick values: fixed notation from 0.001 to below a million, exponential
 * outside (`2.7e-4`), with the fewest digits that tell neighbouring ticks apart. The server's
 * rendered charts label their axes by the same rules (`http/api/charts/axis.rs`).
 */
export function tickLabels(ticks) {
  let gap = Infinity;
  for (let i = 1; i < ticks.length; i++) {
    const g = Math.abs(ticks[i] - ticks[i - 1]);
    if (g > 0) gap = Math.min(gap, g);
  }
  let labels = [];
  for (let extra = 0; extra <= 12; extra++) {
    labels = ticks.map((t) => tickLabel(t, gap, extra));
    if (labels.every((l, i) => i === 0 || l !== labels[i - 1])) break;
  }
  return labels;
}

function trimZeros(s) {
  return s.includes(".") ? s.replace(/0+$/, "").replace(/\.$/, "") : s;
}

function tickLabel(t, gap, extra) {
  if (t === 0) return "0";
  if (!Number.isFinite(t)) return String(t);
  const a = Math.abs(t);
  // A lone tick has no neighbour to tell apart from: four significant digits.
  const gapDigit = Number.isFinite(gap) ? Math.floor(Math.log10(gap)) : Math.floor(Math.log10(a)) - 3;
  if (a >= 1e-3 && a < 1e6) return trimZeros(t.toFixed(Math.min(15, Math.max(0, -gapDigit) + extra)));
  const digits = Math.min(15, Math.max(0, Math.floor(Math.log10(a)) - gapDigit) + extra);
  const [mantissa, exp] = t.toExponential(digits).split("e");
  return `${trimZeros(mantissa)}e${exp.replace("+", "")}`;
}

/**
 * The range a value axis shows for data in [lo, hi] (transformed units): 5% headroom; a flat
 * series gets a band proportional to its value (±10%, or a factor of 2 on a log axis), so a
 * constant learning rate of 3e-4 sits mid-chart on 2.7e-4..3.3e-4, not at 0 on -0.5..0.5.
 */
export function valueRange(lo, hi, transform) {
  if (!Number.isFinite(lo)) return transform.log ? [-1, 1] : [0, 1];
  if (hi > lo) {
    const pad = (hi - lo) * 0.05;
    return [lo - pad, hi + pad];
  }
  if (transform.log) return [lo - Math.log10(2), lo + Math.log10(2)];
  if (lo === 0) return [-1, 1];
  const half = Math.abs(lo) * 0.1;
  return [lo - half, lo + half];
}

/** Ticks and labels of a value axis over [d0, d1] in `transform`'s units; `ticks` are in
 *  those units too (log10 of the value on a log axis). */
export function valueTicks(d0, d1, transform, count) {
  if (!transform.log) {
    const ticks = niceTicks(d0, d1, count);
    return { ticks, labels: tickLabels(ticks) };
  }
  const values = logTicks(transform.inverse(d0), transform.inverse(d1), count);
  return { ticks: values.map((v) => transform.forward(v)), labels: tickLabels(values) };
}

/** Ticks and labels of an x axis over [d0, d1]: steps and seconds tick on whole numbers;
 *  wall time (milliseconds) on whole seconds, labelled as durations. */
export function xTicks(d0, d1, axis, count) {
  if (axis === "time") {
    const ticks = niceTicks(d0, d1, count, 1000).filter((t) => t >= 0);
    return { ticks, labels: ticks.map(formatDuration) };
  }
  const ticks = niceTicks(d0, d1, count, 1).filter((t) => t >= 0);
  return { ticks, labels: tickLabels(ticks) };
}

/**
 * The box of data to show: x over every series (or the zoomed `view`), y over the points
 * inside that x range, transformed, with the headroom of `valueRange`. `origin` is subtracted
 * from x (the first time, on a wall-time axis).
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
  // A single step shows from one step before to one after (a second each side in time), so
  // its ticks are three whole numbers.
  if (x1 === x0) { const d = axis === "time" ? 1000 : 1; x0 -= d; x1 += d; }
  const [r0, r1] = valueRange(y0, Number.isFinite(y1) ? y1 : y0, transform);
  return { x0, x1, y0: r0, y1: r1 };
}

/** A value with 4 significant digits, exponential for very small or large magnitudes (the
 *  tooltip). */
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

/** A metric value as the server's pages print it (`fmt_value` in `http/pages/views.rs`):
 *  4 significant digits, trailing zeros trimmed, `1.000e-5` outside 0.001..100000. The run
 *  page's header values use it, so a live update reads like a reloaded page. */
export function formatMetric(v) {
  if (!Number.isFinite(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(3).replace("e+", "e");
  const digits = a === 0 ? 0 : Math.min(6, Math.max(0, 3 - Math.floor(Math.log10(a))));
  return trimZeros(v.toFixed(digits));
}
