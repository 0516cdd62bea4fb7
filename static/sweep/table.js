// The sweep page's trials table: one row per trial (number linked to its run, state, one column
// per parameter, objective, step, next rung, reason), rebuilt from each `sweep` event and sorted
// by the column whose header was clicked last. The server renders the same table first (trials
// by number, parameter columns sorted by key), so the page reads the same without JavaScript.

import { formatMetric } from "../chart/scales.js";

/** Every parameter key of the spec and of the trials, sorted as the server sorts them. */
export function paramKeys(detail) {
  const keys = new Set(Object.keys(detail.spec?.parameters ?? {}));
  for (const t of detail.trials ?? []) for (const k of Object.keys(t.params ?? {})) keys.add(k);
  return [...keys].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
}

/** A trial's objective as the page shows it: its value once ended, else the latest point of
 *  its curve (the server records the value only when the trial ends). */
export function objective(t) {
  if (typeof t.value === "number" && Number.isFinite(t.value)) return t.value;
  const curve = t.curve ?? [];
  for (let i = curve.length - 1; i >= 0; i--) if (Number.isFinite(curve[i][1])) return curve[i][1];
  return null;
}

/** A cell's text: numbers as the server's pages print them (`fmt_value`), missing as a dash. */
export function cellText(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") return formatMetric(v);
  if (typeof v === "string") return v;
  return JSON.stringify(v);
}

/** What a column sorts by, for one trial. */
function sortValue(t, col) {
  switch (col.kind) {
    case "number": return t.number;
    case "state": return t.state;
    case "param": return t.params?.[col.param];
    case "value": return objective(t);
    case "step": return t.step;
    case "next_rung": return t.next_rung;
    case "reason": return t.reason;
    default: return null;
  }
}

/** Numbers before text; missing values last whichever the direction. */
function compare(a, b, dir) {
  const missA = a === null || a === undefined, missB = b === null || b === undefined;
  if (missA || missB) return missA === missB ? 0 : missA ? 1 : -1;
  if (typeof a === "number" && typeof b === "number") return (a - b) * dir;
  if (typeof a === "number") return -1;
  if (typeof b === "number") return 1;
  return String(a).localeCompare(String(b)) * dir;
}

function el(tag, attrs = {}, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

export class TrialsTable {
  constructor(table, onSort) {
    this.table = table;
    this.tbody = table.querySelector("tbody");
    this.empty = document.getElementById("sweep-trials-empty");
    this.sort = { kind: "number", param: null, dir: 1 };
    this.detail = null;
    this.params = [...table.querySelectorAll("thead th[data-param]")].map((th) => th.dataset.param);
    table.querySelector("thead").addEventListener("click", (e) => {
      const th = e.target.closest("th[data-sort]");
      if (!th) return;
      const col = { kind: th.dataset.sort, param: th.dataset.param ?? null };
      const same = col.kind === this.sort.kind && col.param === this.sort.param;
      this.sort = { ...col, dir: same ? -this.sort.dir : 1 };
      this.markSorted();
      if (this.detail) this.render(this.detail);
      else this.sortRendered();
      onSort?.();
    });
  }

  /** Rows in the table now. */
  rowCount() {
    return this.tbody.rows.length;
  }

  markSorted() {
    for (const th of this.table.querySelectorAll("thead th[data-sort]")) {
      const on = th.dataset.sort === this.sort.kind && (th.dataset.param ?? null) === this.sort.param;
      if (on) th.setAttribute("aria-sort", this.sort.dir > 0 ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    }
  }

  /** Before the first event: sorts the server-rendered rows by their cells' text. */
  sortRendered() {
    const ths = [...this.table.querySelectorAll("thead th")];
    const index = ths.findIndex((th) => th.dataset.sort === this.sort.kind && (th.dataset.param ?? null) === this.sort.param);
    if (index < 0) return;
    const rows = [...this.tbody.rows];
    const key = (r) => {
      const text = r.cells[index]?.textContent.trim() ?? "";
      const n = Number(text);
      return text === "–" || text === "" ? null : Number.isFinite(n) ? n : text;
    };
    rows.sort((a, b) => compare(key(a), key(b), this.sort.dir));
    this.tbody.append(...rows);
  }

  /** The header row, rebuilt when the parameter columns changed (a spec change). */
  header(params) {
    if (params.length === this.params.length && params.every((p, i) => p === this.params[i])) return;
    this.params = params;
    const row = el("tr");
    const th = (sort, label, cls, param) => {
      const h = el("th", { scope: "col", "data-sort": sort });
      if (cls) h.className = cls;
      if (param !== undefined) h.dataset.param = param;
      h.appendChild(el("button", { type: "button", class: "sort" }, label));
      row.appendChild(h);
    };
    th("number", "#", "num");
    th("state", "State");
    for (const p of params) th("param", p, "num mono", p);
    th("value", "Value", "num");
    th("step", "Step", "num");
    th("next_rung", "Next rung", "num");
    th("reason", "Reason");
    this.table.querySelector("thead").replaceChildren(row);
    this.markSorted();
  }

  /** Renders `detail`'s trials; returns the number of rows. */
  render(detail) {
    this.detail = detail;
    const params = paramKeys(detail);
    this.header(params);
    const trials = [...(detail.trials ?? [])];
    trials.sort((a, b) => compare(sortValue(a, this.sort), sortValue(b, this.sort), this.sort.dir) || a.number - b.number);
    const best = detail.best?.number;
    const rows = trials.map((t) => {
      const tr = el("tr", { "data-trial": String(t.number) });
      if (t.run_id) tr.dataset.runId = t.run_id;
      if (t.number === best) tr.className = "best";
      const num = el("td", { class: "num" });
      if (t.run_id) num.appendChild(el("a", { href: `/runs/${encodeURIComponent(t.run_id)}` }, String(t.number)));
      else num.textContent = String(t.number);
      tr.appendChild(num);
      const st = el("td");
      st.appendChild(el("span", { class: `badge status-${t.state}` }, t.state));
      tr.appendChild(st);
      for (const p of params) tr.appendChild(el("td", { class: "num mono" }, cellText(t.params?.[p])));
      const value = el("td", { class: "num mono", "data-col": "value" }, cellText(objective(t)));
      if (t.value === null || t.value === undefined) { value.classList.add("latest"); value.title = "latest value reported, not a final value"; }
      tr.appendChild(value);
      tr.appendChild(el("td", { class: "num", "data-col": "step" }, t.step ?? "–"));
      tr.appendChild(el("td", { class: "num", "data-col": "next_rung" }, t.next_rung ?? "–"));
      tr.appendChild(el("td", { class: "muted" }, t.reason ?? ""));
      return tr;
    });
    this.tbody.replaceChildren(...rows);
    if (this.empty) this.empty.hidden = rows.length > 0;
    return rows.length;
  }
}
