// Canvas line chart for metric series that may hold millions of points.
// Data lives in growable typed arrays; each frame draws at most ~2 points (min and max) per pixel
// column, so drawing cost depends on the canvas width, not on the series length.

const PAD = { left: 56, right: 12, top: 10, bottom: 26 };

/** A growable, step-sorted series in typed arrays. */
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
      this.values[this.n] = p.value;
      this.times[this.n] = p.time ?? 0;
      this.n++;
    }
    this.smoothed = null;
  }

  /** Appends one point; a step already present is ignored (writes are first-wins). */
  append(step, value, time) {
    const n = this.n;
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

function typicalGap(series) {
  if (series.n < 2) return 1;
  // The median of a sample of gaps: robust to the wide gaps a downsampled view leaves.
  const sample = [];
  const stride = Math.max(1, Math.floor((series.n - 1) / 512));
  for (let i = 1; i < series.n; i += stride) sample.push(series.steps[i] - series.steps[i - 1]);
  sample.sort((a, b) => a - b);
  return Math.max(sample[sample.length >> 1], 1e-9);
}

export function lowerBound(arr, n, x) {
  let lo = 0, hi = n;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (arr[mid] < x) lo = mid + 1; else hi = mid;
  }
  return lo;
}

export const PALETTE = ["#2f6fde", "#e0663a", "#2a9d63", "#9b59b6", "#d4a017", "#17a2b8", "#c0392b", "#7f8c8d"];

function cssVar(el, name, fallback) {
  const v = getComputedStyle(el).getPropertyValue(name).trim();
  return v || fallback;
}

function fmt(v) {
  if (!Number.isFinite(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
  return Number(v.toPrecision(4)).toString();
}

function fmtDuration(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  return h > 0 ? `${h}h${String(m).padStart(2, "0")}m` : m > 0 ? `${m}m${String(sec).padStart(2, "0")}s` : `${sec}s`;
}

function niceTicks(lo, hi, count) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) ?? raw;
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(t);
  return ticks;
}

/** A line chart bound to a canvas inside `box`. */
export class LineChart {
  /** opts: {onZoom(startStep, endStep) -> Promise, smoothing, logScale, xAxis: "step"|"time"} */
  constructor(box, opts = {}) {
    this.box = box;
    this.opts = opts;
    this.series = [];
    this.smoothing = opts.smoothing ?? 0;
    this.logScale = !!opts.logScale;
    this.xAxis = opts.xAxis ?? "step";
    this.view = null; // {x0, x1} in x units while zoomed
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
    this.bindEvents();
    new ResizeObserver(() => this.redraw()).observe(box);
  }

  addSeries(label, color) {
    const s = new Series(label, color ?? PALETTE[this.series.length % PALETTE.length]);
    this.series.push(s);
    return s;
  }

  seriesByLabel(label) {
    return this.series.find((s) => s.label === label);
  }

  /** Total points held (exposed for tests through data-points). */
  pointCount() {
    return this.series.reduce((a, s) => a + s.n, 0);
  }

  xs(s) {
    return this.xAxis === "time" ? s.times : s.steps;
  }

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

  bounds() {
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    const t0 = this.timeOrigin();
    for (const s of this.series) {
      if (!s.n) continue;
      const xs = this.xs(s);
      const off = this.xAxis === "time" ? t0 : 0;
      x0 = Math.min(x0, xs[0] - off);
      x1 = Math.max(x1, xs[s.n - 1] - off);
    }
    if (this.view) { x0 = this.view.x0; x1 = this.view.x1; }
    for (const s of this.series) {
      const xs = this.xs(s);
      const off = this.xAxis === "time" ? t0 : 0;
      const i0 = lowerBound(xs, s.n, x0 + off), i1 = lowerBound(xs, s.n, x1 + off + 1e-9);
      for (let i = i0; i < i1; i++) {
        const v = this.ty(s.values[i]);
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

  timeOrigin() {
    let t = Infinity;
    for (const s of this.series) if (s.n) t = Math.min(t, s.times[0]);
    return Number.isFinite(t) ? t : 0;
  }

  ty(v) {
    if (!this.logScale) return v;
    return v > 0 ? Math.log10(v) : NaN;
  }

  draw() {
    const dpr = window.devicePixelRatio || 1;
    const w = this.box.clientWidth, h = this.box.clientHeight;
    if (!w || !h) return;
    if (this.canvas.width !== Math.round(w * dpr) || this.canvas.height !== Math.round(h * dpr)) {
      this.canvas.width = Math.round(w * dpr);
      this.canvas.height = Math.round(h * dpr);
    }
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const fg = cssVar(this.box, "--muted", "#666"), grid = cssVar(this.box, "--grid", "#eee");
    const b = this.bounds();
    this.b = b;
    const pw = w - PAD.left - PAD.right, ph = h - PAD.top - PAD.bottom;
    this.plot = { w, h, pw, ph };
    const X = (x) => PAD.left + ((x - b.x0) / (b.x1 - b.x0)) * pw;
    const Y = (y) => PAD.top + (1 - (y - b.y0) / (b.y1 - b.y0)) * ph;

    ctx.font = "11px system-ui, sans-serif";
    ctx.lineWidth = 1;
    ctx.strokeStyle = grid;
    ctx.fillStyle = fg;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (const t of niceTicks(b.y0, b.y1, 5)) {
      const y = Math.round(Y(t)) + 0.5;
      ctx.beginPath(); ctx.moveTo(PAD.left, y); ctx.lineTo(w - PAD.right, y); ctx.stroke();
      ctx.fillText(this.logScale ? fmt(Math.pow(10, t)) : fmt(t), PAD.left - 6, y);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    for (const t of niceTicks(b.x0, b.x1, Math.max(2, Math.floor(pw / 90)))) {
      const x = Math.round(X(t)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, PAD.top); ctx.lineTo(x, PAD.top + ph); ctx.stroke();
      ctx.fillText(this.xAxis === "time" ? fmtDuration(t) : fmt(t), x, PAD.top + ph + 6);
    }

    ctx.save();
    ctx.beginPath();
    ctx.rect(PAD.left, PAD.top, pw, ph);
    ctx.clip();
    const off = this.xAxis === "time" ? this.timeOrigin() : 0;
    for (const s of this.series) {
      if (!s.n) continue;
      const smooth = this.smoothing > 0;
      ctx.globalAlpha = smooth ? 0.25 : 1;
      ctx.lineWidth = 1.25;
      this.trace(ctx, s, s.values, X, Y, off, pw);
      if (smooth) {
        ctx.globalAlpha = 1;
        ctx.lineWidth = 1.75;
        this.trace(ctx, s, s.smooth(this.smoothing), X, Y, off, pw);
      }
    }
    ctx.restore();
    ctx.globalAlpha = 1;

    if (this.drag && this.drag.x1 !== undefined) {
      ctx.fillStyle = "rgba(47,111,222,0.15)";
      const a = Math.min(this.drag.x0, this.drag.x1), z = Math.abs(this.drag.x1 - this.drag.x0);
      ctx.fillRect(a, PAD.top, z, ph);
    }
    if (this.hover) {
      ctx.strokeStyle = fg;
      ctx.beginPath(); ctx.moveTo(this.hover.px + 0.5, PAD.top); ctx.lineTo(this.hover.px + 0.5, PAD.top + ph); ctx.stroke();
    }
    this.updateDataset();
  }

  /** Draws one series: per pixel column the first, min, max and last points in order, which
   *  keeps spikes visible while bounding the work by the plot width. */
  trace(ctx, s, ys, X, Y, off, pw) {
    const xs = this.xs(s);
    const b = this.b;
    const i0 = Math.max(0, lowerBound(xs, s.n, b.x0 + off) - 1);
    const i1 = Math.min(s.n, lowerBound(xs, s.n, b.x1 + off + 1e-9) + 1);
    ctx.strokeStyle = s.color;
    ctx.beginPath();
    let started = false, col = NaN, minV = 0, maxV = 0, minI = 0, maxI = 0;
    const flush = () => {
      if (Number.isNaN(col)) return;
      const a = minI < maxI ? minV : maxV, z = minI < maxI ? maxV : minV;
      if (!started) { ctx.moveTo(col, Y(a)); started = true; } else ctx.lineTo(col, Y(a));
      if (z !== a) ctx.lineTo(col, Y(z));
    };
    for (let i = i0; i < i1; i++) {
      const v = this.ty(ys[i]);
      if (!Number.isFinite(v)) continue;
      const c = Math.round(X(xs[i] - off));
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
    if (s.n === 1 && Number.isFinite(this.ty(ys[0]))) {
      // A lone point has no segment to stroke: mark it.
      ctx.fillStyle = s.color;
      ctx.beginPath();
      ctx.arc(X(xs[0] - off), Y(this.ty(ys[0])), 3, 0, 2 * Math.PI);
      ctx.fill();
    }
  }

  pxToX(px) {
    const b = this.b;
    return b.x0 + ((px - PAD.left) / this.plot.pw) * (b.x1 - b.x0);
  }

  bindEvents() {
    const c = this.canvas;
    const pos = (e) => {
      const r = c.getBoundingClientRect();
      return { x: e.clientX - r.left, y: e.clientY - r.top };
    };
    c.addEventListener("mousedown", (e) => {
      if (!this.plot) return;
      this.drag = { x0: pos(e).x };
    });
    window.addEventListener("mouseup", (e) => {
      if (!this.drag) return;
      const d = this.drag;
      this.drag = null;
      if (d.x1 !== undefined && Math.abs(d.x1 - d.x0) > 4) {
        const a = this.pxToX(Math.min(d.x0, d.x1)), z = this.pxToX(Math.max(d.x0, d.x1));
        this.zoomTo(a, z);
      }
      this.redraw();
    });
    c.addEventListener("mousemove", (e) => {
      const p = pos(e);
      if (this.drag) this.drag.x1 = p.x;
      this.showTip(p.x, p.y);
      this.redraw();
    });
    c.addEventListener("mouseleave", () => { this.hover = null; this.tip.hidden = true; this.redraw(); });
    c.addEventListener("dblclick", () => this.resetZoom());
    c.addEventListener("keydown", (e) => { if (e.key === "Escape" || e.key === "0") this.resetZoom(); });
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

  stepRange(a, z) {
    if (this.xAxis === "step") return [Math.floor(a), Math.ceil(z)];
    const off = this.timeOrigin();
    let s0 = Infinity, s1 = -Infinity;
    for (const s of this.series) {
      const i0 = lowerBound(s.times, s.n, a + off), i1 = lowerBound(s.times, s.n, z + off) - 1;
      if (i0 < s.n) s0 = Math.min(s0, s.steps[i0]);
      if (i1 >= 0) s1 = Math.max(s1, s.steps[i1]);
    }
    return [s0, s1];
  }

  showTip(px, py) {
    if (!this.plot || px < PAD.left || px > PAD.left + this.plot.pw) { this.tip.hidden = true; this.hover = null; return; }
    const x = this.pxToX(px);
    const off = this.xAxis === "time" ? this.timeOrigin() : 0;
    const rows = [];
    for (const s of this.series) {
      if (!s.n) continue;
      const xs = this.xs(s);
      let i = lowerBound(xs, s.n, x + off);
      if (i >= s.n || (i > 0 && Math.abs(xs[i - 1] - off - x) < Math.abs(xs[i] - off - x))) i -= 1;
      i = Math.max(0, i);
      const sm = this.smoothing > 0 ? ` (smoothed ${fmt(s.smooth(this.smoothing)[i])})` : "";
      rows.push(`${s.label}: step ${s.steps[i]} · ${s.values[i]}${sm}`);
    }
    if (!rows.length) { this.tip.hidden = true; return; }
    this.hover = { px };
    this.tip.textContent = rows.join("\n");
    this.tip.style.whiteSpace = "pre";
    this.tip.hidden = false;
    const left = px + 12 + this.tip.offsetWidth > this.plot.w ? px - 12 - this.tip.offsetWidth : px + 12;
    this.tip.style.left = `${left}px`;
    this.tip.style.top = `${Math.max(0, py - 10)}px`;
  }
}
