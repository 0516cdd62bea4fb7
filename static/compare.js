// Compare page: each chosen metric overlaid across the runs (one chart per metric), with one
// smoothing, log-scale and x-axis setting for all of them.
import { LineChart } from "./chart.js";
import { fetchSeries } from "./api.js";
import { registry } from "./live.js";

const reg = registry();
const charts = [];

async function load(box, run, series, start, end) {
  const maxPoints = Math.max(400, box.clientWidth * 2);
  const data = await fetchSeries(run.id, box.dataset.key, { maxPoints, start, end });
  series.setPoints(data.points);
}

async function initChart(box) {
  const runs = JSON.parse(box.dataset.runs); // [{id, name}]
  const chart = new LineChart(box, {
    onZoom: (s0, s1) => Promise.all(runs.map((r, i) => load(box, r, chart.series[i], s0, s1))),
  });
  // Series take the palette in run order, as the server-rendered swatches do.
  for (const r of runs) chart.addSeries(r.name);
  await Promise.all(runs.map((r, i) => load(box, r, chart.series[i])));
  chart.redraw();
  charts.push(chart);
  return { key: box.dataset.key, series: chart.series.map((s) => ({ label: s.label, points: s.n })) };
}

const boxes = [...document.querySelectorAll(".compare-chart[data-key]")];
const loaded = await Promise.all(boxes.map(initChart));
reg.compares = loaded;
reg.compare = loaded[0];

const each = (f) => { for (const c of charts) { f(c); c.redraw(); } };
document.getElementById("smoothing")?.addEventListener("input", (e) => {
  const w = Number(e.target.value);
  document.getElementById("smoothing-value").textContent = w.toFixed(2);
  each((c) => { c.smoothing = w; });
});
document.getElementById("logscale")?.addEventListener("change", (e) => each((c) => { c.logScale = e.target.checked; }));
document.getElementById("xaxis")?.addEventListener("change", (e) => each((c) => { c.xAxis = e.target.value; c.view = null; }));
document.body.dataset.ready = "true";
