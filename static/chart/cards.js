// The run page's chart and heatmap cards, built in the browser for keys that appear while the
// page is open. The markup is the server template's (`templates/run.html`), so a card created
// live and the same card on a reloaded page look and behave alike; where a card goes is the
// server's chart layout (`GET /api/v1/runs/{id}/charts`), never decided here.

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  e.append(...children);
  return e;
}

/** A chart card for a layout group {id, title, keys, x_unit, section}. */
export function chartCard(group) {
  return el("section", { class: "chart-card", "data-group": group.id, "data-section": group.section ?? "training" },
    el("h3", {},
      el("span", { class: "chart-title" }, group.title), " ",
      el("span", { class: "muted mono", "data-latest-of": group.keys[0] ?? "" })),
    el("div", {
      class: "chart-box", "data-keys": group.keys.join(","), "data-title": group.title,
      "data-x-unit": group.x_unit, "data-points": "0",
    }),
    el("div", { class: "chart-legend" }));
}

/** A heatmap card for a layout heatmap {layer, experts, keys}. */
export function heatmapCard(h) {
  return el("div", { class: "heat-card", "data-layer": String(h.layer) },
    el("h3", { style: "font-size:13px;margin:0 0 6px" }, `Layer ${h.layer}`),
    el("div", {
      class: "heat-box", "data-layer": String(h.layer), "data-experts": String(h.experts),
      "data-keys": h.keys.join(","), "data-title": `Layer ${h.layer} expert utilisation`,
    }));
}

/** The card container under a chart heading (`#charts [data-section-cards]`). */
export function sectionCards(section) {
  return document.querySelector(`#charts [data-section-cards="${CSS.escape(section ?? "training")}"]`);
}

/** Shows the chart headings that hold a card, hides the others. */
export function showSections() {
  for (const s of document.querySelectorAll("#charts .chart-section")) s.hidden = !s.querySelector(".chart-card");
}

/**
 * Puts `card` into `container` in layout order: before the first card of a later group that is
 * already there. `order` lists the layout's ids; `idOf(card)` reads a card's id.
 */
export function placeCard(container, card, order, idOf) {
  const rank = new Map(order.map((id, i) => [id, i]));
  const mine = rank.get(idOf(card)) ?? Infinity;
  const next = [...container.children].find((c) => (rank.get(idOf(c)) ?? Infinity) > mine);
  container.insertBefore(card, next ?? null);
}
