// Compare page: one metric overlaid across runs, with smoothing and log scale.
import { LineChart } from "./chart.js";
import { fetchSeries } from "./api.js";
import { registry } from "./live.js";

const box = document.getElementById("compare-chart");
const key = box.dataset.key;
const runs = JSON.parse(box.dataset.runs); // [{id, name}]
const reg = registry();
const chart = new LineChart(box, {
  onZoom: (s0, s1) => Promise.all(runs.map((r, i) => load(r, chart.series[i], s0, s1))),
});

async function load(run, series, start, end) {
  const maxPoints = Math.max(400, box.clientWidth * 2);
  const data = await fetchSeries(run.id, key, { maxPoints, start, end });
  series.setPoints(data.points);
}

// Series take the palette in run order, as the server-rendered swatches do.
for (const r of runs) chart.addSeries(r.name);
await Promise.all(runs.map((r, i) => load(r, chart.series[i])));
chart.redraw();
reg.compare = { key, series: chart.series.map((s) => ({ label: s.label, points: s.n })) };

document.getElementById("smoothing")?.addEventListener("input", (e) => {
  chart.smoothing = Number(e.target.value);
  document.getElementById("smoothing-value").textContent = chart.smoothing.toFixed(2);
  chart.redraw();
});
document.getElementById("logscale")?.addEventListener("change", (e) => { chart.logScale = e.target.checked; chart.redraw(); });
document.getElementById("xaxis")?.addEventListener("change", (e) => { chart.xAxis = e.target.value; chart.view = null; chart.redraw(); });
document.body.dataset.ready = "true";
