// Run page: keeps the checkpoints panel, the history and the Resume button current without a
// reload, and resumes in place. The panels' markup is the server's (GET /runs/{id}/panels
// renders the same templates as the page); they are fetched again whenever the status badge
// changes (run.js updates it from the live stream) and every 30 s while the run is running
// (checkpoints appear as it saves), with the run's parameter count and, once it has finished,
// its Hugging Face download; and when the instability guard records a skipped update or a
// rollback (run.js announces its points). Resume forms post to the API instead of navigating, so the
// charts and the log keep their stream and simply go on.
import { runPath, sendJSON } from "./api.js";

const root = document.querySelector("[data-run-id]");
const runId = root?.dataset.runId;
const badge = document.getElementById("status-badge");
const REFRESH_MS = 30_000;

const PANELS = ["status-reason", "run-model", "checkpoints-panel", "history", "guard-panel"];

async function refresh() {
  if (!runId) return;
  const res = await fetch(`/runs/${runId}/panels`, { credentials: "same-origin" });
  if (!res.ok) return;
  const doc = new DOMParser().parseFromString(await res.text(), "text/html");
  for (const id of PANELS) {
    const fresh = doc.getElementById(id);
    if (fresh) document.getElementById(id)?.replaceWith(fresh);
  }
  const resume = document.getElementById("resume-button");
  const panel = document.getElementById("checkpoints-panel");
  if (resume && panel) resume.disabled = panel.dataset.resumable !== "true";
  // A status change answers "Resuming…" (or an earlier refusal).
  for (const out of document.querySelectorAll("form[action$='/resume'] output")) out.textContent = "";
}

// A burst of guard points (one per skipped step) asks once.
let guardTimer = null;
document.addEventListener("trainyard:guard", () => {
  if (guardTimer) return;
  guardTimer = setTimeout(() => { guardTimer = null; refresh(); }, 500);
});

if (badge) {
  new MutationObserver(() => refresh()).observe(badge, { childList: true, characterData: true, subtree: true });
  setInterval(() => {
    if (badge.textContent.trim() === "running" && document.visibilityState === "visible") refresh();
  }, REFRESH_MS);
}

function resumeMessage(form, text) {
  let out = form.querySelector("output");
  if (!out) {
    out = document.createElement("output");
    out.className = "muted";
    form.append(out);
  }
  out.textContent = text;
}

document.addEventListener("submit", async (e) => {
  const form = e.target;
  if (!(form instanceof HTMLFormElement) || !runId || !form.action.endsWith(`/runs/${runId}/resume`)) return;
  e.preventDefault();
  const raw = form.elements.from?.value || "latest";
  const from = /^[0-9]+$/.test(raw) ? Number(raw) : raw;
  for (const b of form.querySelectorAll("button")) b.disabled = true;
  try {
    await sendJSON("POST", `${runPath(runId)}/resume`, { from });
    resumeMessage(form, "Resuming…");
  } catch (err) {
    for (const b of form.querySelectorAll("button")) b.disabled = false;
    resumeMessage(form, err.message);
  }
});
