import { createHash } from 'node:crypto';

/** How often the page asks for fresh figures. */
export const STATUS_REFRESH_MS = 5000;

const STYLE = `
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; background: #fafafa; }
h1 { font-size: 1.3em; margin: 0 0 .2em; } h2 { font-size: 1.05em; margin: 1.4em 0 .4em; }
#meta, .note { color: #666; font-size: .9em; }
table { border-collapse: collapse; background: #fff; min-width: 32em; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: left; }
th { background: #eee; } .num { text-align: right; }
.ok { background: #dfd; } .warn { background: #ffd; } .bad { background: #fdd; }
#error { color: #a00; } [hidden] { display: none !important; }
`;

// No innerHTML anywhere: every value goes in through textContent, so nothing the JSON holds can
// become markup, and the CSP below needs no 'unsafe-*' source.
const SCRIPT = `
'use strict';
let key = '';
let timer;
const $ = (id) => document.getElementById(id);
function cell(row, text, cls) {
  const td = document.createElement('td');
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}
function fill(id, rows, columns) {
  const body = $(id);
  body.replaceChildren();
  for (const item of rows) {
    const tr = document.createElement('tr');
    tr.dataset.name = columns[0](item)[0];
    for (const column of columns) { const [text, cls] = column(item); cell(tr, text, cls); }
    body.appendChild(tr);
  }
}
const n = (v) => [String(v), typeof v === 'number' ? 'num' : ''];
const pct = (v) => [v === null ? '-' : (v * 100).toFixed(1) + '%', 'ratio num'];
const state = (v, until) => [until ? v + ' until ' + until : v, v === 'ok' || v === 'closed' || v === 'active' ? 'ok' : v === 'half_open' ? 'warn' : 'bad'];
const bytes = (v) => v >= 1048576 ? (v / 1048576).toFixed(1) + ' MiB' : v >= 1024 ? (v / 1024).toFixed(1) + ' KiB' : v + ' B';
function render(s) {
  $('meta').textContent = 'perch ' + s.version + ', up ' + s.uptime_seconds + ' s, figures of ' + s.generated_at +
    (s.config.reload_successful ? '' : ' (last reload refused: serving the configuration of ' + s.config.loaded_at + ')');
  fill('endpoints', s.endpoints, [(e) => n(e.endpoint), (e) => n(e.requests), (e) => n(e.hits), (e) => n(e.stale),
    (e) => n(e.coalesced), (e) => n(e.misses), (e) => pct(e.hit_ratio)]);
  fill('upstreams', s.upstreams, [(u) => n(u.name), (u) => state(u.state, u.until), (u) => state(u.breaker),
    (u) => [(u.throttle_reject_probability * 100).toFixed(1) + '%', u.throttle_reject_probability > 0 ? 'warn num' : 'num'], (u) => n(u.calls),
    (u) => [String(u.errors), u.errors > 0 ? 'warn num' : 'num'], (u) => n(u.rate_limited), (u) => n(u.refused),
    (u) => [u.credentials.map((c) => c.id + ': ' + c.state + (c.until ? ' until ' + c.until : '')).join(', ') || '-']]);
  fill('keys', s.keys, [(k) => n(k.id), (k) => n(k.requests), (k) => n(k.hits), (k) => n(k.errors), (k) => n(k.rate_limited),
    (k) => n(k.upstream_calls), (k) => n(k.saved_calls), (k) => (k.budget_left === null ? ['-'] : n(k.budget_left))]);
  const m = s.cache.memory;
  const tiers = [{ tier: 'memory', state: ['ok', 'ok'], size: m.entries + ' entries, ' + bytes(m.bytes) + ' of ' + bytes(m.max_bytes), detail: m.evictions + ' evictions' }];
  if (s.cache.redis) {
    const r = s.cache.redis;
    tiers.push({ tier: 'redis', state: r.connected ? state(r.breaker) : ['disconnected', 'bad'], size: '-', detail: r.errors + ' failed calls, ' + r.skipped + ' skipped' });
  }
  fill('cache', tiers, [(t) => n(t.tier), (t) => t.state, (t) => n(t.size), (t) => n(t.detail)]);
}
async function refresh() {
  clearTimeout(timer);
  try {
    const res = await fetch('status.json', { headers: { 'x-api-key': key }, cache: 'no-store' });
    if (res.status === 401) { key = ''; show('Not an admin key.'); return; }
    if (!res.ok) throw new Error('status ' + res.status);
    render(await res.json());
    $('data').hidden = false;
    $('error').textContent = '';
  } catch (error) {
    $('error').textContent = 'Could not refresh (' + error.message + '); retrying.';
  }
  timer = setTimeout(refresh, ${STATUS_REFRESH_MS});
}
function show(message) {
  clearTimeout(timer);
  $('data').hidden = true;
  $('login').hidden = false;
  $('error').textContent = message;
}
$('login').addEventListener('submit', (event) => {
  event.preventDefault();
  key = $('key').value;
  $('key').value = '';
  $('login').hidden = true;
  refresh();
});
`;

const hash = (text: string) => `'sha256-${createHash('sha256').update(text).digest('base64')}'`;

/**
 * No source but this page's own script and style (by hash), and fetches to this origin only:
 * an injected tag could neither run nor send the admin key anywhere else. Framing is refused, so
 * the key form cannot be overlaid (clickjacking).
 */
export const STATUS_PAGE_CSP = [
  "default-src 'none'",
  `script-src ${hash(SCRIPT)}`,
  `style-src ${hash(STYLE)}`,
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ');

/**
 * The status page: static, holding no figure and no secret, so it is served without a key. It
 * asks for an admin key, keeps it in the page's memory only (not in storage, a cookie or the
 * URL, where it would outlive the tab or reach logs), and sends it as `X-API-Key` with every
 * fetch of `status.json`.
 */
export const STATUS_PAGE = Buffer.from(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>perch status</title>
<style>${STYLE}</style>
</head>
<body>
<h1>perch status</h1>
<p id="meta">Counts are this instance's, since it started.</p>
<form id="login">
<label for="key">Admin key</label>
<input id="key" type="password" autocomplete="off" required>
<button type="submit">Show</button>
</form>
<p id="error" role="alert"></p>
<div id="data" hidden>
<h2>Endpoints</h2>
<table><thead><tr><th>endpoint</th><th>requests</th><th>hits</th><th>stale</th><th>coalesced</th><th>misses</th><th>hit ratio</th></tr></thead><tbody id="endpoints"></tbody></table>
<p class="note">Hit ratio: (hits + stale) over the requests that reached the cache.</p>
<h2>Upstreams</h2>
<table><thead><tr><th>upstream</th><th>state</th><th>breaker</th><th>throttle sheds</th><th>calls</th><th>errors</th><th>rate limited</th><th>refused</th><th>credentials</th></tr></thead><tbody id="upstreams"></tbody></table>
<h2>Client keys</h2>
<table><thead><tr><th>key id</th><th>requests</th><th>hits</th><th>errors</th><th>rate limited</th><th>provider calls</th><th>calls saved</th><th>budget left</th></tr></thead><tbody id="keys"></tbody></table>
<h2>Cache tiers</h2>
<table><thead><tr><th>tier</th><th>state</th><th>size</th><th>detail</th></tr></thead><tbody id="cache"></tbody></table>
</div>
<script>${SCRIPT}</script>
</body>
</html>
`);
