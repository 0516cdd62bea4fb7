// Chart data: step-sorted series in growable typed arrays, their smoothing, and merging live
// points into a downsampled read. Nothing here touches the DOM, so any plot can hold its data
// in a Series.

/** Index of the first of the first `n` entries of sorted `arr` that is >= x (n when none). */
export function lowerBound(arr, n, x) {
  let lo = 0, hi = n;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (arr[mid] < x) lo = mid + 1; else hi = mid;
  }
  return lo;
}

/** A point's value: the API writes a NaN as null (a typed array would make null 0). */
const valueOf = (v) => (v === null || v === undefined ? NaN : v);

/** A growable, step-sorted series in typed arrays; a NaN value is a gap in the line. */
export class Series {
  constructor(label, color) {
    this.label = label;
    this.color = color;
    this.n = 0;
    this.steps = new Float64Array(256);
    this.values = new Float64Array(256);
    this.times = new Float64Array(256);
    this.smoothed = null; // cache, rebuilt when data or smoothing changes
  }

  grow(min) {
    let cap = this.steps.length;
    while (cap < min) cap *= 2;
    if (cap === this.steps.length) return;
    for (const name of ["steps", "values", "times"]) {
      const next = new Float64Array(cap);
      next.set(this[name].subarray(0, this.n));
      this[name] = next;
    }
  }

  /** Replaces the content with points `[{step, value, time}]` (sorted by step). */
  setPoints(points) {
    this.n = 0;
    this.grow(points.length);
    for (const p of points) {
      this.steps[this.n] = p.step;
      this.values[this.n] = valueOf(p.value);
      this.times[this.n] = p.time ?? 0;
      this.n++;
    }
    this.smoothed = null;
  }

  /** Appends one point; a step already present is ignored (writes are first-wins). */
  append(step, raw, time) {
    const n = this.n;
    const value = valueOf(raw);
    if (n > 0 && step <= this.steps[n - 1]) {
      const i = lowerBound(this.steps, n, step);
      if (i < n && this.steps[i] === step) return false;
      this.grow(n + 1);
      for (const a of [this.steps, this.values, this.times]) a.copyWithin(i + 1, i, n);
      this.steps[i] = step;
      this.values[i] = value;
      this.times[i] = time;
      this.n++;
      this.smoothed = null;
      return true;
    }
    this.grow(n + 1);
    this.steps[n] = step;
    this.values[n] = value;
    this.times[n] = time;
    this.n++;
    if (this.smoothed && this.smoothed.upTo === n) this.extendSmoothing();
    return true;
  }

  /** Adds live points `[{step, value, time}]` on top of a (downsampled) read: steps the read
   *  already holds keep their value, the others are inserted in step order. */
  merge(points) {
    for (const p of points) this.append(p.step, p.value, p.time ?? Date.now());
  }

  /** The x coordinates for an axis: "step" or "time" (unix milliseconds). */
  xs(axis) {
    return axis === "time" ? this.times : this.steps;
  }

  /** Debiased, x-gap-weighted EMA: each point decays the history by w^(gap / typical gap), so
   *  unevenly spaced (downsampled) data smooths like evenly spaced data, and the running
   *  normaliser removes the bias toward the first value. */
  smooth(weight) {
    if (this.smoothed && this.smoothed.weight === weight) return this.smoothed.values;
    const out = new Float64Array(this.values.length);
    this.smoothed = { weight, values: out, acc: 0, norm: 0, upTo: 0, gap: typicalGap(this) };
    this.extendSmoothing();
    return out;
  }

  extendSmoothing() {
    const s = this.smoothed;
    if (s.values.length < this.values.length) {
      const next = new Float64Array(this.values.length);
      next.set(s.values.subarray(0, s.upTo));
      s.values = next;
    }
    for (let i = s.upTo; i < this.n; i++) {
      const v = this.values[i];
      // A NaN stays a gap in the smoothed line too, and does not enter the average.
      if (Number.isNaN(v)) { s.values[i] = NaN; continue; }
      if (!Number.isFinite(v)) { s.values[i] = s.norm > 0 ? s.acc / s.norm : v; continue; }
      const gap = i === 0 ? 1 : Math.max(this.steps[i] - this.steps[i - 1], 0) / s.gap;
      const decay = Math.pow(s.weight, gap);
      s.acc = s.acc * decay + (1 - decay) * v;
      s.norm = s.norm * decay + (1 - decay);
      s.values[i] = s.norm > 0 ? s.acc / s.norm : v;
    }
    s.upTo = this.n;
  }
}

/**
 * The smoothing a series of `n` points gets from the slider's `weight`. An EMA of weight w
 * averages over about 1 / (1 - w) points; that span is capped at 2% of the series' points, and
 * below 1.5 points there is no smoothing. So 4 eval points or a 20-step run are drawn as
 * measured, a warm-up of a few dozen steps keeps its shape, and only a long, dense series
 * (where noise hides the trend) is smoothed as much as the slider says.
 */
export function effectiveSmoothing(weight, n) {
  if (!(weight > 0 && weight < 1)) return 0;
  const span = Math.min(1 / (1 - weight), n / 50);
  return span < 1.5 ? 0 : 1 - 1 / span;
}

function typicalGap(series) {
  if (series.n < 2) return 1;
  // The median of a sample of gaps: robust to the wide gaps a downsampled view leaves.
  const sample = [];
  const stride = Math.max(1, Math.floor((series.n - 1) / 512));
  for (let i = 1; i < series.n; i += stride) sample.push(series.steps[i] - series.steps[i - 1]);
  sample.sort((a, b) => a - b);
  return Math.max(sample[sample.length >> 1], 1e-9);
}

/** The earliest time among the series: a wall-time axis counts from it. */
export function timeOrigin(series) {
  let t = Infinity;
  for (const s of series) if (s.n) t = Math.min(t, s.times[0]);
  return Number.isFinite(t) ? t : 0;
}

/** The steps of a series' NaN points (its gaps). */
export function nanSteps(series) {
  const out = [];
  for (let i = 0; i < series.n; i++) if (Number.isNaN(series.values[i])) out.push(series.steps[i]);
  return out;
}

/** Total points held by the series. */
export function pointCount(series) {
  return series.reduce((a, s) => a + s.n, 0);
}
