// The daemon's status page (status_page.h): one HTML file, its style and script inline, no
// framework and no network beyond this origin. The script puts every value of the status
// document into the page with textContent and setAttribute, never as markup: run ids and node
// names come from users.
#include <string_view>

#include "rendezvous/status_page.h"

namespace ddprun::rdzv {

namespace {

constexpr std::string_view kPage = R"html(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ddprun-rdzvd status</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2430; background: #f4f6f9; }
  header { background: #1d2430; color: #fff; padding: 10px 20px; display: flex;
           align-items: baseline; gap: 16px; flex-wrap: wrap; }
  header h1 { font-size: 18px; margin: 0; }
  #state { color: #b9c3d3; }
  #state.error { color: #ffb4a8; font-weight: bold; }
  main { padding: 12px 20px; }
  .job { background: #fff; border: 1px solid #d5dbe5; border-radius: 6px; margin: 0 0 16px;
         padding: 10px 14px; }
  .job h2 { font-size: 16px; margin: 0 0 4px; word-break: break-all; }
  .phase { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px;
           margin-left: 8px; color: #fff; background: #6b7686; vertical-align: middle; }
  .phase.running { background: #2f8a4a; } .phase.joining { background: #c98a12; }
  .phase.closed { background: #6b7686; }
  .summary, .forming, .note { color: #4a5566; margin: 2px 0; }
  .forming { color: #8a5a00; }
  h3 { font-size: 13px; margin: 10px 0 4px; text-transform: uppercase; color: #6b7686; }
  table { border-collapse: collapse; font-size: 13px; }
  th, td { text-align: left; padding: 2px 12px 2px 0; vertical-align: top; }
  th { color: #6b7686; font-weight: normal; }
  td.num { font-variant-numeric: tabular-nums; }
  .stale { color: #b3261e; font-weight: bold; }
  svg.timeline { width: 100%; max-width: 1000px; height: auto; display: block; }
  svg text { font: 11px system-ui, sans-serif; fill: #4a5566; }
  .legend span { display: inline-block; margin-right: 14px; font-size: 12px; color: #4a5566; }
  .legend i { display: inline-block; width: 12px; height: 10px; margin-right: 4px; }
  #empty { color: #6b7686; }
</style>
</head>
<body data-refreshes="0">
<header><h1>ddprun-rdzvd status</h1><span id="generator"></span><span id="state">loading&#8230;</span></header>
<main>
  <p id="empty" hidden>No jobs on this rendezvous server.</p>
  <p id="more" class="note" hidden></p>
  <div id="jobs"></div>
</main>
<script>
'use strict';
const SCHEMA = 1;
const SVG_NS = 'http://www.w3.org/2000/svg';
const params = new URLSearchParams(location.search);
const refreshSeconds = Math.max(0.5, Number(params.get('refresh')) || 2);
const colors = { forming: '#e9b949', running: '#3fa35b', recovery: '#d9534f',
                 failure_reported: '#b3261e', node_lost: '#b3261e', node_left: '#6b7686',
                 closed: '#1d2430' };
let refreshes = 0;

// Elements from data: text is always a text node, attributes always go through setAttribute.
function make(ns, tag, attrs, children) {
  const e = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  for (const c of children || []) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}
const h = (tag, attrs, ...children) => make(null, tag, attrs, children);
const s = (tag, attrs, ...children) => make(SVG_NS, tag, attrs, children);

function seconds(x) {
  if (typeof x !== 'number' || !isFinite(x)) return '-';
  const a = Math.abs(x);
  if (a < 10) return x.toFixed(1) + ' s';
  if (a < 120) return Math.round(x) + ' s';
  if (a < 7200) return Math.floor(x / 60) + ' min ' + Math.round(x % 60) + ' s';
  return (x / 3600).toFixed(1) + ' h';
}
// A duration: milliseconds below a second (a local recovery takes a few).
function duration(x) {
  if (typeof x === 'number' && isFinite(x) && Math.abs(x) < 1) return Math.round(x * 1000) + ' ms';
  return seconds(x);
}
function text(v) { return v === undefined || v === null ? '-' : String(v); }

function table(head, rows) {
  const t = h('table', {}, h('tr', {}, ...head.map((c) => h('th', {}, c))));
  for (const r of rows) t.append(h('tr', {}, ...r.map((c) => (c instanceof Node ? h('td', {}, c) : h('td', {}, text(c))))));
  return t;
}

// The recovery timeline: rounds forming and running, failures and losses, each recovery's span.
function timeline(job) {
  const history = job.history || { events: [], recoveries: [] };
  const events = history.events || [];
  const W = 960, left = 70, right = 10, plotW = W - left - right;
  let start = -60;
  for (const e of events) start = Math.min(start, -e.ago_s);
  for (const r of history.recoveries || []) start = Math.min(start, -r.started_ago_s);
  const x = (t) => left + ((t - start) / (0 - start)) * plotW;
  const root = s('svg', { class: 'timeline', viewBox: '0 0 ' + W + ' 112', role: 'img',
                          'aria-label': 'recovery timeline' });
  root.append(s('text', { x: 0, y: 34 }, 'rounds'), s('text', { x: 0, y: 66 }, 'recovery'));
  // Round segments from the events: a round forms from round_opened to round_formed, then runs
  // until the next round opens or the job closes.
  const segments = [];
  let forming = null, running = null, closedAt = null;
  for (const e of events) {
    const t = -e.ago_s;
    if (e.kind === 'round_opened') {
      if (running) segments.push({ kind: 'running', round: running.round, from: running.from, to: t });
      running = null;
      if (!forming) forming = { round: e.round, from: t };
      else forming.round = e.round;
    } else if (e.kind === 'round_formed') {
      if (forming) segments.push({ kind: 'forming', round: e.round, from: forming.from, to: t });
      forming = null;
      running = { round: e.round, from: t };
    } else if (e.kind === 'closed') {
      closedAt = t;
      if (forming) segments.push({ kind: 'forming', round: forming.round, from: forming.from, to: t });
      if (running) segments.push({ kind: 'running', round: running.round, from: running.from, to: t });
      forming = running = null;
    }
  }
  if (forming) segments.push({ kind: 'forming', round: forming.round, from: forming.from, to: 0 });
  if (running) segments.push({ kind: 'running', round: running.round, from: running.from, to: 0 });
  for (const g of segments) {
    const x0 = x(g.from), w = Math.max(1.5, x(g.to) - x0);
    const rect = s('rect', { x: x0, y: 20, width: w, height: 22, fill: colors[g.kind],
                             class: 'segment ' + g.kind });
    rect.append(s('title', {}, 'round ' + g.round + ' ' + g.kind + ': ' + duration(g.to - g.from)));
    root.append(rect);
    if (w > 28) root.append(s('text', { x: x0 + 4, y: 35, style: 'fill:#fff' }, 'r' + g.round));
  }
  for (const r of history.recoveries || []) {
    const t0 = -r.started_ago_s, t1 = 'formed_ago_s' in r ? -r.formed_ago_s : 0;
    const x0 = x(t0), w = Math.max(2, x(t1) - x0);
    const label = 'recovery to round ' + r.round + ': ' +
      ('duration_s' in r ? duration(r.duration_s) : 'under way') + ' (' + text(r.cause) + ')';
    const rect = s('rect', { x: x0, y: 54, width: w, height: 16, fill: colors.recovery,
                             class: 'recovery' });
    rect.append(s('title', {}, label));
    root.append(rect);
    // The length beside the span: to its right, or to its left near the end of the axis.
    const right = x0 + w + 70 < W;
    root.append(s('text', { x: right ? x0 + w + 4 : x0 - 4, y: 66, 'text-anchor': right ? 'start' : 'end' },
                  'duration_s' in r ? duration(r.duration_s) : 'under way'));
  }
  for (const e of events) {
    if (!['failure_reported', 'node_lost', 'node_left', 'closed'].includes(e.kind)) continue;
    const xe = x(-e.ago_s);
    const mark = s('line', { x1: xe, x2: xe, y1: 14, y2: 48, stroke: colors[e.kind],
                             'stroke-width': 2, class: 'marker ' + e.kind });
    mark.append(s('title', {}, e.kind.replace('_', ' ') + (e.node ? ' ' + e.node : '') +
                               (e.detail ? ': ' + e.detail : '') + ' (round ' + e.round + ')'));
    root.append(mark);
  }
  if (closedAt !== null) root.append(s('text', { x: Math.min(x(closedAt) + 4, W - 60), y: 12 }, 'closed'));
  // Axis: seconds before now, at a round step.
  const span = 0 - start;
  const step = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 43200, 86400]
    .find((c) => span / c <= 8) || Math.ceil(span / 8);
  root.append(s('line', { x1: left, x2: W - right, y1: 84, y2: 84, stroke: '#9aa4b2' }));
  for (let t = 0, n = 0; t >= start && n < 20; t -= step, n++) {
    root.append(s('line', { x1: x(t), x2: x(t), y1: 84, y2: 89, stroke: '#9aa4b2' }));
    root.append(s('text', { x: x(t), y: 102, 'text-anchor': t === 0 ? 'end' : 'middle' },
                  t === 0 ? 'now' : '-' + seconds(-t)));
  }
  return root;
}

function renderJob(job) {
  const st = job.settings || {};
  const card = h('section', { class: 'job' });
  card.dataset.phase = text(job.phase);
  card.append(h('h2', {}, 'job ', h('span', { class: 'run-id' }, text(job.run_id)),
                h('span', { class: 'phase ' + text(job.phase) }, text(job.phase))));
  card.append(h('p', { class: 'summary' },
    'round ' + text(job.round) + ' \u00b7 restarts ' + text(job.restart_count) + ' of ' +
    text(st.max_restarts) + ' \u00b7 --nnodes ' + text(st.min_nodes) + ':' + text(st.max_nodes) +
    ' \u00b7 --nproc_per_node ' + text(st.nproc_per_node) + ' \u00b7 ' + text(job.node_count) + ' nodes'));
  if (job.message) card.append(h('p', { class: 'note' }, 'ended (' + text(job.outcome) + '): ' + job.message));
  const f = job.forming;
  if (f) {
    let line = 'round ' + text(job.round) + ' forming: ' + text(f.joined) + ' joined';
    if (f.awaited && f.awaited.length) line += '; awaited: ' + f.awaited.join(', ');
    if (f.more_needed) line += '; ' + f.more_needed + ' more needed';
    if ('last_call_in_s' in f) line += '; last call ends in ' + seconds(f.last_call_in_s);
    if ('join_timeout_in_s' in f) line += '; join timeout in ' + seconds(f.join_timeout_in_s);
    card.append(h('p', { class: 'forming' }, line));
  }
  card.append(h('h3', {}, 'Recovery timeline'));
  card.append(timeline(job));
  card.append(h('div', { class: 'legend' },
    ...['forming', 'running', 'recovery'].map((k) => h('span', {}, h('i', { style: 'background:' + colors[k] }), k)),
    h('span', {}, h('i', { style: 'background:' + colors.failure_reported + ';width:3px' }), 'failure or lost node')));
  const stale = 2 * (st.keep_alive_interval_s || 5);
  card.append(h('h3', {}, 'Nodes'));
  card.append(table(['group rank', 'node', 'state', 'node rank', 'last heard'],
    (job.nodes || []).map((n) => {
      const age = h('span', n.last_seen_s > stale ? { class: 'stale' } : {}, seconds(n.last_seen_s) + ' ago');
      let state = n.state;
      if (state === 'wait_listed' && job.phase === 'running') state = 'spare';
      if (state === 'kept_out') state = h('span', { title: n.kept_out || '' }, 'kept out (health check)');
      if (state === 'quarantined' && 'quarantine_left_s' in n) {
        state = h('span', { title: n.quarantined || '' }, 'quarantined (' + seconds(n.quarantine_left_s) + ' left)');
      }
      return [n.group_rank >= 0 ? n.group_rank : '-', n.name, state, n.node_rank, age];
    })));
  const history = job.history || { events: [], recoveries: [] };
  const restarts = (history.events || []).filter((e) => e.kind === 'round_opened' && e.round > 0);
  card.append(h('h3', {}, 'Restart history'));
  if (!restarts.length) {
    card.append(h('p', { class: 'note' }, 'no restarts'));
  } else {
    const recovery = {};
    for (const r of history.recoveries || []) recovery[r.round] = r;
    card.append(table(['round', 'when', 'counted', 'reason', 'recovery'],
      restarts.slice().reverse().map((e) => {
        const r = recovery[e.round];
        return [e.round, seconds(e.ago_s) + ' ago', e.counted ? 'yes' : 'no', e.detail,
                r ? ('duration_s' in r ? duration(r.duration_s) : 'under way') : '-'];
      })));
  }
  card.append(h('h3', {}, 'Events'));
  const shown = (history.events || []).slice(-30).reverse();
  card.append(table(['when', 'event', 'round', 'node', 'detail'],
    shown.map((e) => [seconds(e.ago_s) + ' ago', e.kind.replace('_', ' '), e.round, e.node,
                      e.kind === 'closed' ? text(e.outcome) + ': ' + text(e.detail) : e.detail])));
  if (history.events_dropped) card.append(h('p', { class: 'note' }, history.events_dropped + ' older events not kept'));
  return card;
}

function render(doc) {
  document.getElementById('generator').textContent = text(doc.generator);
  const jobs = doc.jobs || [];
  document.getElementById('empty').hidden = jobs.length > 0;
  const more = document.getElementById('more');
  more.hidden = !(doc.job_count > jobs.length);
  more.textContent = 'showing the first ' + jobs.length + ' of ' + doc.job_count + ' jobs';
  document.getElementById('jobs').replaceChildren(...jobs.map(renderJob));
}

function setState(message, error) {
  const e = document.getElementById('state');
  e.textContent = message;
  e.className = error ? 'error' : '';
}

async function refresh() {
  try {
    const r = await fetch(location.origin + '/status', { cache: 'no-store', credentials: 'same-origin' });
    if (!r.ok) throw new Error('HTTP ' + r.status + ': ' + (await r.text()).trim());
    const doc = await r.json();
    if (doc.schema_version !== SCHEMA)
      throw new Error('status document schema ' + doc.schema_version + '; this page reads ' + SCHEMA);
    render(doc);
    refreshes += 1;
    document.body.dataset.refreshes = String(refreshes);
    setState('updated ' + new Date().toLocaleTimeString() + ', every ' + refreshSeconds + ' s', false);
  } catch (e) {
    setState('cannot refresh: ' + e.message, true);
  }
  setTimeout(refresh, refreshSeconds * 1000);
}
refresh();
</script>
</body>
</html>
)html";

}  // namespace

std::string_view status_page_html() { return kPage; }

}  // namespace ddprun::rdzv
