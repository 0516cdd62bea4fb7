// Runs table: live status badges from the global event stream, the compare button state, and
// saved columns (kept in this browser: a table opened without `cols=` uses them).
import { subscribe, statusOf, setBadges } from "./live.js";

subscribe("/api/v1/events", {
  status: (d) => { const s = statusOf(d); if (s) setBadges(s.run_id, s.status); },
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

const COLS_KEY = "trainyard.cols";
const colsInput = document.getElementById("f-cols");
document.getElementById("save-cols")?.addEventListener("click", (e) => {
  const cols = colsInput.value.trim();
  if (cols) localStorage.setItem(COLS_KEY, cols); else localStorage.removeItem(COLS_KEY);
  e.target.textContent = cols ? "Saved" : "Cleared";
  colsInput.form.requestSubmit();
});
const saved = localStorage.getItem(COLS_KEY);
const url = new URL(location.href);
if (saved && !url.searchParams.has("cols")) {
  url.searchParams.set("cols", saved);
  location.replace(url);
}
