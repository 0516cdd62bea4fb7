// Pointer and keyboard handling of a line chart: drag to zoom, hover for the tooltip,
// double-click or Escape (or 0) to reset. It only reads the chart's state and calls its
// zoomTo / resetZoom / showTip / hideTip / redraw.

/** Pixels a drag must cover before it counts as a zoom rather than a click. */
const MIN_DRAG = 4;

export function bindPointer(chart) {
  const c = chart.canvas;
  const pos = (e) => {
    const r = c.getBoundingClientRect();
    return { x: e.clientX - r.left, y: e.clientY - r.top };
  };
  c.addEventListener("mousedown", (e) => {
    if (!chart.frame) return;
    chart.drag = { x0: pos(e).x };
  });
  // On the window: a drag released outside the canvas still ends.
  window.addEventListener("mouseup", () => {
    if (!chart.drag) return;
    const d = chart.drag;
    chart.drag = null;
    if (d.x1 !== undefined && Math.abs(d.x1 - d.x0) > MIN_DRAG) {
      const x = chart.frame.x;
      chart.zoomTo(x.invert(Math.min(d.x0, d.x1)), x.invert(Math.max(d.x0, d.x1)));
    }
    chart.redraw();
  });
  c.addEventListener("mousemove", (e) => {
    const p = pos(e);
    if (chart.drag) chart.drag.x1 = p.x;
    chart.showTip(p.x, p.y);
    chart.redraw();
  });
  c.addEventListener("mouseleave", () => { chart.hideTip(); chart.redraw(); });
  c.addEventListener("dblclick", () => chart.resetZoom());
  c.addEventListener("keydown", (e) => { if (e.key === "Escape" || e.key === "0") chart.resetZoom(); });
}
