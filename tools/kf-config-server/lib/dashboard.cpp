// SPDX-License-Identifier: Apache-2.0
#include "kf-config-server/lib/dashboard.hpp"

namespace kf::config_server {

namespace {

// One page, no build step: plain HTML, CSS and script. The script reads /v1/cluster (a
// long-poll, so a change shows at once), and every 2 s /v1/summary, /v1/events and /v1/agents
// (only what is new, by seq). Chart.js comes from /chart.js when the service has it.
constexpr std::string_view kPage = R"PAGE(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>kf job</title>
<link rel="icon" href="data:,">
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #222; background: #f6f7f9; }
  header { background: #1f2937; color: #fff; padding: 10px 16px; }
  header h1 { font-size: 18px; margin: 0 0 4px 0; }
  header .status { font-size: 13px; color: #d1d5db; }
  main { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; padding: 12px; }
  section { background: #fff; border: 1px solid #e5e7eb; border-radius: 6px; padding: 10px; }
  section.wide { grid-column: 1 / span 2; }
  h2 { font-size: 15px; margin: 0 0 8px 0; }
  table { border-collapse: collapse; width: 100%; font-size: 13px; }
  th, td { text-align: left; padding: 3px 6px; border-bottom: 1px solid #eee; }
  th { color: #555; font-weight: 600; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  .state-active { color: #047857; } .state-joining { color: #b45309; }
  .state-leaving { color: #b91c1c; } .state-spare { color: #4b5563; }
  .slow { color: #b91c1c; font-weight: 600; }
  #timeline { max-height: 320px; overflow-y: auto; }
  .note { color: #6b7280; font-size: 12px; }
  canvas { max-height: 220px; }
</style>
</head>
<body>
<header>
  <h1>kf job <span id="job"></span></h1>
  <div class="status" id="status">connecting to the config service...</div>
</header>
<main>
  <section class="wide">
    <h2>Members</h2>
    <table id="members">
      <thead><tr><th>rank</th><th>worker</th><th>host</th><th>state</th><th>step</th>
        <th>heartbeat age</th><th>step time</th><th>samples/s</th></tr></thead>
      <tbody></tbody>
    </table>
    <div class="note">Read-only: change the job with <code>kf-member</code>. Step, step time and
      samples/s come from the job's summary (rank 0, about once a second); the heartbeat is the
      host agent's.</div>
  </section>
  <section class="wide">
    <h2>Cluster versions</h2>
    <div id="timeline"><table id="versions"><thead><tr><th>version</th><th>time</th><th>event</th>
      <th>worker</th><th>cause</th></tr></thead><tbody></tbody></table></div>
  </section>
  <section><h2>Samples per second</h2><canvas id="c-throughput"></canvas></section>
  <section><h2>Step time (s)</h2><canvas id="c-step"></canvas></section>
  <section><h2>Gradient noise scale (B_simple)</h2><canvas id="c-gns"></canvas></section>
  <section><h2>Global batch and learning rate</h2><canvas id="c-batch"></canvas></section>
  <section class="wide"><h2>Phases of each change (ms)</h2><canvas id="c-phases"></canvas>
    <div class="note" id="chart-note"></div></section>
</main>
<script src="/chart.js"></script>
<script>
"use strict";
const state = { cluster: null, version: 0, summaries: [], summarySeq: 0, events: [],
                eventSeq: 0, agents: {}, charts: {} };
const $ = (id) => document.getElementById(id);

function text(v) { return v === undefined || v === null ? "" : String(v); }
function fmt(v, digits) {
  if (typeof v !== "number" || !isFinite(v)) return "";
  if (Math.abs(v) >= 1000) return v.toFixed(0);
  return v.toPrecision(digits || 3);
}
function cell(row, value, cls) {
  const td = document.createElement("td");
  td.textContent = text(value);
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}
async function getJson(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

// ---- members ----
function latestSummary() {
  return state.summaries.length ? state.summaries[state.summaries.length - 1] : null;
}
function leavingWorkers() {
  // Revoked (out of the document) and not yet gone: revoked with no later left/exited/failed.
  const open = new Map();
  for (const e of state.events) {
    if (!e.worker) continue;
    if (e.type === "revoked") open.set(e.worker, e);
    else if (e.type === "left" || e.type === "exited" || e.type === "failed") open.delete(e.worker);
  }
  return [...open.keys()];
}
function renderMembers() {
  const body = $("members").tBodies[0];
  body.textContent = "";
  const c = state.cluster;
  if (!c) return;
  const s = latestSummary();
  const speeds = new Map();
  if (s && Array.isArray(s.members)) for (const m of s.members) speeds.set(m.worker, m);
  const now = Date.now();
  const rows = [];
  const named_ = (w) => ({ host: w.host, endpoint: w.host + ":" + w.port });
  (c.workers || []).forEach((w, rank) => rows.push({ rank, w: named_(w), state: "active" }));
  (c.spares || []).forEach((w) => rows.push({ rank: "", w: named_(w), state: "spare" }));
  const named = new Set(rows.map((r) => r.w.endpoint));
  for (const name of leavingWorkers()) {
    if (!named.has(name)) rows.push({ rank: "", w: { endpoint: name }, state: "leaving" });
  }
  for (const r of rows) {
    const name = r.w.endpoint;
    const host = r.w.host !== undefined ? r.w.host : name.slice(0, name.lastIndexOf(":"));
    let st = r.state;
    if (st === "active" && (!s || s.version < c.version) && !speeds.has(name)) st = "joining";
    const tr = document.createElement("tr");
    tr.dataset.worker = name;
    cell(tr, r.rank, "num");
    cell(tr, name);
    cell(tr, host);
    cell(tr, st, "state-" + st);
    cell(tr, st === "active" && s ? s.step : "", "num");
    const agent = state.agents[host];
    cell(tr, agent ? ((now - Date.parse(agent.renewed)) / 1000).toFixed(1) + " s" : "", "num");
    cell(tr, st === "active" && s ? fmt(s.step_time_seconds) : "", "num");
    const m = speeds.get(name);
    const sp = cell(tr, m ? fmt(m.samples_per_second) : "", "num" + (m && m.slow ? " slow" : ""));
    if (m && m.slow) sp.title = "a straggler: " + fmt(m.vs_fastest, 2) + " of the fastest";
    body.appendChild(tr);
  }
  const mode = c.settings && c.settings.mode ? c.settings.mode : "sync-sgd";
  $("job").textContent = c.job_id ? "(" + c.job_id + ")" : "";
  $("status").textContent = "version " + c.version + " · " + (c.workers || []).length +
      " workers · mode " + mode + (s ? " · step " + s.step : "") +
      " · updated " + new Date().toLocaleTimeString();
}

// ---- timeline ----
function renderTimeline() {
  const body = $("versions").tBodies[0];
  body.textContent = "";
  // The changes and their causes; the stragglers show in the members' table.
  const shown = state.events.filter((e) => e.type !== "slow" && e.type !== "recovered")
      .slice(-200).reverse();
  for (const e of shown) {
    const tr = document.createElement("tr");
    cell(tr, e.version !== undefined ? "v" + e.version : "");
    cell(tr, e.time ? new Date(e.time).toLocaleTimeString() : "");
    cell(tr, e.type);
    cell(tr, e.worker || "");
    cell(tr, e.detail || "");
    body.appendChild(tr);
  }
}

// ---- charts ----
function policyMarks() {
  // Where a policy acted: its event's version, placed at the first summary of that version.
  const marks = [];
  for (const e of state.events) {
    if (!e.detail || !e.detail.startsWith("policy:") || e.version === undefined) continue;
    const at = state.summaries.find((s) => s.version >= e.version);
    if (at) marks.push({ step: at.step, label: e.detail });
  }
  return marks;
}
function lineChart(id, series) {
  if (typeof Chart === "undefined") return;
  const datasets = series.map((s) => ({ label: s.label, data: s.data, yAxisID: s.axis || "y",
      borderColor: s.color, backgroundColor: s.color, pointRadius: s.points || 0,
      showLine: s.points ? false : true, borderWidth: 1.5 }));
  let chart = state.charts[id];
  if (!chart) {
    const scales = { x: { type: "linear", title: { display: true, text: "step" } }, y: {} };
    if (series.some((s) => s.axis === "y2")) scales.y2 = { position: "right" };
    chart = new Chart($(id), { type: "line", data: { datasets },
        options: { animation: false, parsing: false, responsive: true, scales,
                   plugins: { legend: { display: series.length > 1 } } } });
    state.charts[id] = chart;
  } else {
    chart.data.datasets = datasets;
    chart.update("none");
  }
}
function renderCharts() {
  if (typeof Chart === "undefined") return;
  const pts = (key) => state.summaries.filter((s) => typeof s[key] === "number")
      .map((s) => ({ x: s.step, y: s[key] }));
  const marks = policyMarks();
  const markAt = (key) => marks.map((m) => {
    const s = state.summaries.find((x) => x.step >= m.step && typeof x[key] === "number");
    return s ? { x: m.step, y: s[key] } : null;
  }).filter((p) => p);
  lineChart("c-throughput", [{ label: "samples/s", data: pts("samples_per_second"), color: "#2563eb" },
      { label: "policy acted", data: markAt("samples_per_second"), color: "#dc2626", points: 5 }]);
  lineChart("c-step", [{ label: "step time", data: pts("step_time_seconds"), color: "#059669" }]);
  lineChart("c-gns", [{ label: "B_simple", data: pts("gns"), color: "#7c3aed" }]);
  lineChart("c-batch", [{ label: "global batch", data: pts("global_batch"), color: "#ea580c" },
      { label: "learning rate", data: pts("lr"), color: "#0891b2", axis: "y2" },
      { label: "policy acted", data: markAt("global_batch"), color: "#dc2626", points: 5 }]);
  // One bar group per change (its version), one bar per phase.
  const changes = new Map();
  for (const s of state.summaries) {
    if (s.last_change && s.last_change.version !== undefined) changes.set(s.last_change.version, s.last_change);
  }
  const list = [...changes.values()].slice(-20);
  const phases = ["detect_ms", "agree_ms", "connect_ms", "sync_ms", "resume_ms"];
  const colors = ["#9ca3af", "#f59e0b", "#3b82f6", "#10b981", "#8b5cf6"];
  const data = { labels: list.map((c) => "v" + c.version + " " + c.kind),
      datasets: phases.map((p, i) => ({ label: p.replace("_ms", ""), data: list.map((c) => c[p] || 0),
                                         backgroundColor: colors[i] })) };
  if (!state.charts["c-phases"]) {
    state.charts["c-phases"] = new Chart($("c-phases"), { type: "bar", data,
        options: { animation: false, responsive: true,
                   scales: { x: { stacked: true }, y: { stacked: true } } } });
  } else {
    state.charts["c-phases"].data = data;
    state.charts["c-phases"].update("none");
  }
}

// ---- updates ----
function render() { renderMembers(); renderTimeline(); renderCharts(); }

async function watchCluster() {
  for (;;) {
    try {
      const url = state.cluster ? "/v1/cluster?watch=1&after=" + state.version : "/v1/cluster";
      const c = await getJson(url);
      state.cluster = c;
      state.version = c.version;
      await poll();
    } catch (e) {
      $("status").textContent = "the config service does not answer (" + e.message + "); retrying";
      await new Promise((ok) => setTimeout(ok, 2000));
    }
  }
}
async function poll() {
  try {
    const [sum, ev, ag] = await Promise.all([
      getJson("/v1/summary?after=" + state.summarySeq),
      getJson("/v1/events?after=" + state.eventSeq),
      getJson("/v1/agents")]);
    for (const s of sum.summaries) { state.summaries.push(s); state.summarySeq = s.seq; }
    if (state.summaries.length > 600) state.summaries.splice(0, state.summaries.length - 600);
    for (const e of ev.events) { state.events.push(e); state.eventSeq = e.seq; }
    if (state.events.length > 2000) state.events.splice(0, state.events.length - 2000);
    state.agents = {};
    for (const a of ag.agents) state.agents[a.host] = a;
  } catch (e) {
    $("status").textContent = "update failed: " + e.message;
  }
  render();
}

if (typeof Chart === "undefined") {
  $("chart-note").textContent =
      "No charts: the config service has no charting library (apt install libjs-chart.js).";
}
setInterval(poll, 2000);
watchCluster();
</script>
</body>
</html>
)PAGE";

}  // namespace

std::string_view dashboard_page() noexcept { return kPage; }

}  // namespace kf::config_server
