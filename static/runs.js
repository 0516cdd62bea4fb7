// Runs table: live status badges from the global event stream, and the compare button state.
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
