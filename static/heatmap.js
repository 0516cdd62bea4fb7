// Expert-utilisation heatmap: rows are experts, columns are steps, colour is the fraction of
// tokens routed to the expert; beside it, bars of the current (latest) load. The rows come
// from the expert-utilization API, already grouped per layer; live points are routed to a row
// by the key the page lists for it, so nothing here knows how expert metric keys are spelled.

import { cssVar, prepareCanvas, FONT } from "./chart/draw.js";

const STOPS = [
  [0.0, [24, 28, 70]],
  [0.25, [40, 90, 160]],
  [0.5, [40, 160, 150]],
  [0.75, [170, 210, 80]],
  [1.0, [250, 230, 60]],
];

export function colour(t) {
  t = Math.min(1, Math.max(0, t));
  for (let i = 1; i < STOPS.length; i++) {
    const [t1, c1] = STOPS[i];
    if (t <= t1) {
      const [t0, c0] = STOPS[i - 1];
      const f = (t - t0) / (t1 - t0);
      return c0.map((c, j) => Math.round(c + (c1[j] - c) * f));
    }
  }
  return STOPS[STOPS.length - 1][1];
}

export class Heatmap {
  /** experts: number of rows; box: the element holding the canvas. */
  constructor(box, experts) {
    this.box = box;
    this.experts = experts;
    this.rows = Array.from({ length: experts }, () => new Map()); // step -> fraction
    this.steps = new Set();
    this.canvas = document.createElement("canvas");
    this.canvas.setAttribute("role", "img");
    this.canvas.setAttribute("aria-label", box.dataset.title || "expert utilisation heatmap");
    box.replaceChildren(this.canvas);
    // The colour scale: what a colour means, from no tokens to the largest share drawn.
    this.scale = document.createElement("div");
    this.scale.className = "heat-scale";
    const bar = document.createElement("span");
    bar.className = "heat-scale-bar";
    bar.style.background = `linear-gradient(to right, ${STOPS.map(([t, [r, g, b]]) => `rgb(${r},${g},${b}) ${t * 100}%`).join(", ")})`;
    this.scaleLow = document.createElement("span");
    this.scaleLow.textContent = "0%";
    this.scaleHigh = document.createElement("span");
    this.scaleHigh.className = "heat-scale-high";
    this.scaleHigh.textContent = "–";
    const caption = document.createElement("span");
    caption.className = "muted";
    caption.textContent = "of the layer's tokens";
    this.scale.append(this.scaleLow, bar, this.scaleHigh, caption);
    box.after(this.scale);
    this.pending = false;
    new ResizeObserver(() => this.redraw()).observe(box);
  }

  set(expert, step, value) {
    if (!this.put(expert, step, value)) return;
    this.changed();
  }

  /** Loads a layer's matrix: `fractions[row][expert]` at `steps[row]`, null for no value. */
  setMatrix(steps, fractions) {
    steps.forEach((step, row) => {
      fractions[row].forEach((v, e) => { if (v !== null && v !== undefined) this.put(e, step, v); });
    });
    this.changed();
  }

  put(expert, step, value) {
    if (expert < 0 || expert >= this.experts) return false;
    this.rows[expert].set(step, value);
    this.steps.add(step);
    return true;
  }

  changed() {
    this.box.dataset.cells = String(this.rows.reduce((a, r) => a + r.size, 0));
    this.redraw();
  }

  redraw() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.draw(); });
  }

  draw() {
    const canvas = prepareCanvas(this.canvas, this.box);
    if (!canvas) return;
    const { ctx, w, h } = canvas;
    const muted = cssVar(this.box, "--muted", "#666");
    const left = 34, bottom = 20, barW = 90, gap = 14;
    const hw = w - left - barW - gap, hh = h - bottom;
    const steps = [...this.steps].sort((a, b) => a - b);
    const rowH = hh / this.experts;
    let maxV = 0;
    for (const r of this.rows) for (const v of r.values()) maxV = Math.max(maxV, v);
    const scale = maxV > 0 ? maxV : 1;
    this.scaleHigh.textContent = `${(scale * 100).toFixed(0)}%`;
    ctx.font = FONT;
    ctx.fillStyle = muted;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let e = 0; e < this.experts; e++) ctx.fillText(`E${e}`, left - 6, e * rowH + rowH / 2);
    if (steps.length) {
      // Columns are binned so the image never needs more than one cell per pixel.
      const cols = Math.min(steps.length, Math.max(1, Math.floor(hw)));
      for (let c = 0; c < cols; c++) {
        // Integer pixel edges: fractional rectangles leave anti-aliased seams between columns.
        const x0 = Math.floor(left + (c * hw) / cols), x1 = Math.floor(left + ((c + 1) * hw) / cols);
        const a = Math.floor((c * steps.length) / cols), z = Math.floor(((c + 1) * steps.length) / cols);
        for (let e = 0; e < this.experts; e++) {
          let sum = 0, k = 0;
          for (let i = a; i < Math.max(z, a + 1); i++) {
            const v = this.rows[e].get(steps[i]);
            if (v !== undefined) { sum += v; k++; }
          }
          if (!k) continue;
          const [r, g, b] = colour(sum / k / scale);
          ctx.fillStyle = `rgb(${r},${g},${b})`;
          const y0 = Math.floor(e * rowH), y1 = Math.floor((e + 1) * rowH);
          ctx.fillRect(x0, y0, Math.max(1, x1 - x0), Math.max(1, y1 - y0 - (rowH > 8 ? 1 : 0)));
        }
      }
      ctx.fillStyle = muted;
      ctx.textBaseline = "top";
      ctx.textAlign = "left";
      ctx.fillText(`step ${steps[0]}`, left, hh + 5);
      ctx.textAlign = "right";
      ctx.fillText(`step ${steps[steps.length - 1]}`, left + hw, hh + 5);
      // Current load: each expert's value at its latest step.
      const bx = left + hw + gap;
      for (let e = 0; e < this.experts; e++) {
        let lastStep = -Infinity, v = 0;
        for (const [st, val] of this.rows[e]) if (st > lastStep) { lastStep = st; v = val; }
        const [r, g, b] = colour(v / scale);
        ctx.fillStyle = `rgb(${r},${g},${b})`;
        ctx.fillRect(bx, e * rowH + rowH * 0.15, Math.max(1, (v / scale) * (barW - 34)), rowH * 0.7);
        ctx.fillStyle = muted;
        ctx.textAlign = "right";
        ctx.textBaseline = "middle";
        ctx.fillText((v * 100).toFixed(0) + "%", bx + barW, e * rowH + rowH / 2);
      }
    }
  }
}
