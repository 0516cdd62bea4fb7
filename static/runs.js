// Runs table: live status badges from the global event stream, new runs added as they start
// (a tracking client such as MLflow's, or a launch from elsewhere), the compare button state,
// and saved columns (kept in this browser: a table opened without `cols=` uses them).
import { subscribe, statusOf, setBadges } from "./live.js";

// MLflow clients print links into MLflow's own UI (`/#/experiments/1/runs/ID`, a fragment the
// server never sees): open the run, or the experiment, they name.
{
  const m = /^#\/experiments\/([0-9]+)(?:\/runs\/([0-9a-f]{32}))?/.exec(location.hash);
  if (m) location.replace(m[2] ? `/runs/${m[2]}` : `/experiments/${m[1]}`);
}

// A status change of a run the table does not show yet: fetch this same page again and swap
// in its rows (the server decides filter, sort and columns), keeping what was selected.
let refreshing = null;
let again = false;
async function refreshRows() {
  if (refreshing) { again = true; return; }
  refreshing = (async () => {
    const res = await fetch(location.href, { headers: { accept: "text/html" } });
    if (!res.ok) return;
    const doc = new DOMParser().parseFromString(await res.text(), "text/html");
    for (const id of ["runs-rows", "runs-count", "runs-empty"]) {
      const fresh = doc.getElementById(id);
      const old = document.getElementById(id);
      if (!fresh || !old) continue;
      if (id === "runs-rows") {
        const checked = new Set([...old.querySelectorAll("input[name=runs]:checked")].map((i) => i.value));
        for (const i of fresh.querySelectorAll("input[name=runs]")) i.checked = checked.has(i.value);
      }
      old.replaceWith(fresh);
    }
    update();
  })();
  try { await refreshing; } finally {
    refreshing = null;
    if (again) { again = false; refreshRows(); }
  }
}

subscribe("/api/v1/events", {
  status: (d) => {
    const s = statusOf(d);
    if (!s) return;
    if (document.querySelector(`[data-run-row="${CSS.escape(s.run_id)}"]`)) setBadges(s.run_id, s.status);
    else refreshRows();
  },
  // The server dropped events for this slow client: the table may be stale, so re-render it.
  lagged: () => location.reload(),
});

const form = document.getElementById("compare-form");
const button = document.getElementById("compare-button");
const update = () => {
  const n = form.querySelectorAll("input[name=runs]:checked").length;
  button.disabled = n < 2;
  button.textContent = n >= 2 ? `Compare ${n} runs` : "Compare (select 2+)";
};
form?.addEventListener("change", update);
if (form) update();

// Saved columns are kept per experiment (the table of all runs has its own), in this browser.
const experiment = form?.dataset.experiment || "";
const COLS_KEY = `trainyard.cols.${experiment || "all"}`;
const colsInput = document.getElementById("f-cols");
const saveCols = (cols) => {
  if (cols) localStorage.setItem(COLS_KEY, cols); else localStorage.removeItem(COLS_KEY);
};
document.getElementById("save-cols")?.addEventListener("click", (e) => {
  const cols = colsInput.value.trim();
  saveCols(cols);
  e.target.textContent = cols ? "Saved" : "Cleared";
  colsInput.form.requestSubmit();
});
// The chooser: the ticked keys become the columns, applied and kept for this experiment.
document.getElementById("col-chooser-apply")?.addEventListener("click", () => {
  const ticked = [...document.querySelectorAll("#col-chooser input[type=checkbox]:checked")].map((i) => i.value);
  colsInput.value = ticked.join(", ");
  saveCols(colsInput.value);
  colsInput.form.requestSubmit();
});
const saved = localStorage.getItem(COLS_KEY);
const url = new URL(location.href);
if (saved && !url.searchParams.has("cols")) {
  url.searchParams.set("cols", saved);
  location.replace(url);
}
