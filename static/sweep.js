// Sweep page: everything the server rendered (header, trials table) follows the sweep's event
// stream (`GET /api/v1/sweeps/{id}/events`: `sweep` events carrying the whole sweep, at once
// and after every change), the plots are drawn from it, and the buttons pause, resume, stop and
// change the sweep through the API. The page never reloads. Without this script the buttons and
// the change form post to the page's own routes, which redirect back here.

import { sendJSON } from "./api.js";
import { subscribe, registry } from "./live.js";
import { formatMetric } from "./chart/scales.js";
import { TrialsTable, paramKeys } from "./sweep/table.js";
import { SweepPlots } from "./sweep/plots.js";

const root = document.querySelector("[data-sweep-id]");
const sweepId = root.dataset.sweepId;
const api = `/api/v1/sweeps/${encodeURIComponent(sweepId)}`;
const $ = (id) => document.getElementById(id);

const table = new TrialsTable($("sweep-trials"), () => { hook.rows = table.rowCount(); });
const plots = new SweepPlots();
const reg = registry();
/** Test and debugging hook: what the page shows now. */
const hook = { rows: table.rowCount(), lines: 0, importance: 0, curves: 0, slices: 0, best: 0, lastEvent: 0, state: $("sweep-state").dataset.state };
reg.sweep = hook;

/** The sweep as last received. */
let current = null;
const OVER = new Set(["finished", "stopped", "failed"]);

function setText(id, text) {
  const e = $(id);
  if (e) e.textContent = text;
}

function header(d) {
  const badge = $("sweep-state");
  badge.textContent = d.state;
  badge.className = `badge status-${d.state}`;
  badge.dataset.state = d.state;
  $("sweep-message-box").hidden = !d.message;
  setText("sweep-message", d.message ?? "");
  setText("sweep-name", d.name);
  setText("sweep-method", d.method);
  setText("sweep-metric", d.metric);
  setText("sweep-goal", d.goal);
  setText("sweep-early", d.early_terminate);
  setText("sweep-max", String(d.max_trials));
  setText("sweep-parallel-now", String(d.parallel));
  setText("sweep-version", String(d.version));
  for (const e of document.querySelectorAll("#sweep-counts [data-count]")) e.textContent = String(d.trials_counts?.[e.dataset.count] ?? 0);
  const best = $("sweep-best-trial");
  if (d.best) {
    const value = document.createElement("span");
    value.className = "mono";
    value.textContent = formatMetric(d.best.value);
    const trial = d.best.run_id ? document.createElement("a") : document.createElement("span");
    if (d.best.run_id) trial.href = `/runs/${encodeURIComponent(d.best.run_id)}`;
    trial.textContent = `trial ${d.best.number}`;
    best.replaceChildren(value, " · ", trial);
  } else {
    const none = document.createElement("span");
    none.className = "muted";
    none.textContent = "no complete trial yet";
    best.replaceChildren(none);
  }
  versions(d.versions ?? []);
  controls(d);
}

function versions(list) {
  const ol = $("sweep-versions");
  const items = [...list].reverse().map((v) => {
    const li = document.createElement("li");
    li.dataset.version = String(v.version);
    const strong = document.createElement("strong");
    strong.textContent = `v${v.version}`;
    const when = document.createElement("span");
    when.className = "muted";
    when.textContent = ` ${new Date(v.changed_at).toISOString().slice(0, 16).replace("T", " ")}${v.changed_by ? ` · ${v.changed_by}` : ""}`;
    li.append(strong, when);
    if (v.changes?.length) {
      const ul = document.createElement("ul");
      for (const c of v.changes) {
        const item = document.createElement("li");
        item.className = "mono";
        item.textContent = c;
        ul.appendChild(item);
      }
      li.appendChild(ul);
    } else {
      const first = document.createElement("div");
      first.className = "muted";
      first.textContent = "submitted";
      li.appendChild(first);
    }
    return li;
  });
  ol.replaceChildren(...items);
}

/** The buttons and the change form the state allows: pause while running, resume while
 *  paused, stop and change until the sweep is over. */
function controls(d) {
  const over = OVER.has(d.state);
  const show = (id, on) => { const b = $(id); if (b) b.hidden = !on; };
  show("sweep-pause", d.state === "running");
  show("sweep-resume", d.state === "paused");
  show("sweep-stop", !over);
  const form = $("sweep-change");
  if (!form) return;
  form.hidden = over;
  // A field the user is editing keeps their value; the others follow the sweep.
  for (const [id, value] of [["sweep-max-input", d.max_trials], ["sweep-parallel-input", d.parallel]]) {
    const input = $(id);
    if (document.activeElement !== input && input.dataset.edited !== "true") input.value = String(value);
  }
}

function render(d) {
  current = d;
  // The server's counts (`counts`), else counted here from the list.
  d.trials_counts = d.counts ?? countTrials(d.trials ?? []);
  header(d);
  hook.rows = table.render(d);
  const counts = plots.update(d, paramKeys(d));
  Object.assign(hook, counts, { state: d.state, version: d.version });
}

function countTrials(trials) {
  const c = { total: trials.length, pending: 0, running: 0, complete: 0, pruned: 0, failed: 0, stopped: 0 };
  for (const t of trials) if (t.state in c) c[t.state] += 1;
  return c;
}

const live = $("live-state");
const stream = subscribe(`${api}/events`, {
  sweep: (d) => {
    if (!d || typeof d !== "object" || !Array.isArray(d.trials)) return;
    render(d);
    hook.lastEvent += 1;
    // The server ends the stream once the sweep is over; do not reconnect to an ended sweep.
    if (OVER.has(d.state)) {
      stream.close();
      live.textContent = "ended";
    }
  },
}, { onState: (s) => { if (!current || !OVER.has(current.state)) live.textContent = s; } });

// --- Actions ------------------------------------------------------------------------------

const status = $("sweep-action-status");
// Each button is a form to the page's route (it works without this script); here the form
// goes through the API instead and the page stays.
for (const button of document.querySelectorAll(".sweep-controls button[data-action]")) {
  button.form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const action = button.dataset.action;
    if (action === "stop" && !confirm("Stop this sweep? Its running trials are stopped too.")) return;
    button.disabled = true;
    status.textContent = `${action}…`;
    try {
      await sendJSON("POST", `${api}/${action}`);
      // The event stream brings the new state.
      status.textContent = "";
    } catch (e) {
      status.textContent = e.message;
    } finally {
      button.disabled = false;
    }
  });
}

const form = $("sweep-change");
if (form) {
  const out = $("sweep-change-status");
  for (const input of form.querySelectorAll("input")) input.addEventListener("input", () => { input.dataset.edited = "true"; });
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = {};
    const max = Number($("sweep-max-input").value), par = Number($("sweep-parallel-input").value);
    if (current?.max_trials !== max) body.max_trials = max;
    if (current?.parallel !== par) body.parallel = par;
    if (!Object.keys(body).length) { out.textContent = "Nothing changed."; return; }
    if (current) body.version = current.version;
    out.textContent = "Saving…";
    try {
      await sendJSON("PATCH", api, body);
      out.textContent = "Changed.";
      for (const input of form.querySelectorAll("input")) delete input.dataset.edited;
    } catch (err) {
      out.textContent = err.message;
    }
  });
}

reg.ready = true;
document.body.dataset.ready = "true";
