// mcp-gateway console: fills the views from /ui/api/ every two seconds and draws the plots.
// Everything shown comes from the gateway, and much of it from clients and plugins (names,
// errors, client info): it is only ever set as text, never parsed as HTML.
"use strict";

const CSRF = document.querySelector('meta[name="csrf-token"]').content;
const PERIOD_MS = 2000;
const SPAN_MS = 15 * 60 * 1000;
const VIEWS = ["overview", "plugins", "sessions", "credentials", "audit"];

let current = "overview";
let timer = null;
let auditQuery = "";
let editing = null; // the plugin whose definition the form edits, or null for an addition

// ---- Talking to the gateway ----------------------------------------------------------------

async function api(method, path, body) {
  const init = { method, credentials: "same-origin", headers: {} };
  if (method !== "GET") {
    init.headers["X-CSRF-Token"] = CSRF;
  }
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  if (r.status === 401) {
    location.assign("/ui");
    throw new Error("signed out");
  }
  let data = null;
  if (r.status !== 204) {
    try { data = await r.json(); } catch (_) { data = null; }
  }
  if (!r.ok) {
    throw new Error((data && data.error) || ("HTTP " + r.status));
  }
  return data;
}

function say(text, bad) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = bad ? "bad" : "";
  s.hidden = false;
  clearTimeout(say.timer);
  say.timer = setTimeout(() => { s.hidden = true; }, bad ? 8000 : 3000);
}

// ---- Small DOM helpers ---------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function badge(text) {
  return el("span", { class: "badge " + text }, text);
}

function fmtNum(v, digits) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  return Number(v).toFixed(digits === undefined ? 1 : digits);
}

function fmtMs(v) {
  if (v === null || v === undefined) return "–";
  return v < 10 ? v.toFixed(2) + " ms" : v < 1000 ? v.toFixed(0) + " ms" : (v / 1000).toFixed(2) + " s";
}

function fmtAge(secs) {
  if (secs < 60) return secs + " s";
  if (secs < 3600) return Math.floor(secs / 60) + " min";
  return Math.floor(secs / 3600) + " h " + Math.floor((secs % 3600) / 60) + " min";
}

function last(values) {
  for (let i = values.length - 1; i >= 0; i--) {
    if (values[i] !== null && values[i] !== undefined) return values[i];
  }
  return null;
}

// ---- Plots ---------------------------------------------------------------------------------

function niceMax(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) {
    if (v <= m * p) return m * p;
  }
  return 10 * p;
}

// Draws `lines` ({values, color}) against times `t` (ms) over the last fifteen minutes.
function plot(canvas, t, lines, fmt) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth;
  const h = canvas.clientHeight;
  if (!w || !h) return;
  canvas.width = Math.round(w * dpr);
  canvas.height = Math.round(h * dpr);
  const g = canvas.getContext("2d");
  g.scale(dpr, dpr);
  g.clearRect(0, 0, w, h);
  const pad = { l: 52, r: 10, t: 8, b: 20 };
  const pw = w - pad.l - pad.r;
  const ph = h - pad.t - pad.b;
  const now = Date.now();
  const x0 = now - SPAN_MS;
  let max = 0;
  for (const line of lines) {
    for (const v of line.values) if (v !== null && v > max) max = v;
  }
  max = niceMax(max);
  const css = getComputedStyle(document.documentElement);
  g.font = "11px system-ui, sans-serif";
  g.fillStyle = css.getPropertyValue("--muted") || "#667085";
  g.strokeStyle = css.getPropertyValue("--line") || "#e3e7ef";
  g.lineWidth = 1;
  g.textAlign = "right";
  g.textBaseline = "middle";
  for (let i = 0; i <= 4; i++) {
    const y = pad.t + ph - (ph * i) / 4;
    g.beginPath();
    g.moveTo(pad.l, Math.round(y) + 0.5);
    g.lineTo(pad.l + pw, Math.round(y) + 0.5);
    g.stroke();
    g.fillText(fmt((max * i) / 4), pad.l - 6, y);
  }
  g.textAlign = "center";
  g.textBaseline = "top";
  [["-15 min", 0], ["-10 min", 1 / 3], ["-5 min", 2 / 3], ["now", 1]].forEach(([label, f]) => {
    g.fillText(label, pad.l + pw * f - (f === 1 ? 12 : 0), pad.t + ph + 5);
  });
  let drawn = 0;
  for (const line of lines) {
    const points = [];
    line.values.forEach((v, i) => {
      const visible = v !== null && v !== undefined && t[i] >= x0;
      points.push(visible ? [pad.l + ((t[i] - x0) / SPAN_MS) * pw,
        pad.t + ph - (Math.min(v, max) / max) * ph] : null);
    });
    g.strokeStyle = line.color;
    g.fillStyle = line.color;
    g.lineWidth = 1.8;
    g.lineJoin = "round";
    g.beginPath();
    let pen = false;
    for (const p of points) {
      if (!p) { pen = false; continue; }
      if (pen) g.lineTo(p[0], p[1]); else g.moveTo(p[0], p[1]);
      pen = true;
      drawn++;
    }
    g.stroke();
    // Points without a neighbour (and every point while there are few) get a dot.
    const few = drawn < 40;
    points.forEach((p, i) => {
      if (!p || (!few && points[i - 1] && points[i + 1])) return;
      g.beginPath();
      g.arc(p[0], p[1], 2.5, 0, 2 * Math.PI);
      g.fill();
    });
  }
  canvas.dataset.points = String(drawn);
}

function colors() {
  const css = getComputedStyle(document.documentElement);
  return {
    accent: css.getPropertyValue("--accent").trim(),
    p50: css.getPropertyValue("--p50").trim(),
    p99: css.getPropertyValue("--p99").trim(),
    bad: css.getPropertyValue("--bad").trim(),
  };
}

const asCount = (v) => (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2).replace(/\.?0+$/, "") || "0");
const asPercent = (v) => (v * 100).toFixed(v >= 0.1 || v === 0 ? 0 : 1) + "%";
const asMs = (v) => (v >= 100 ? v.toFixed(0) : v >= 1 ? v.toFixed(1) : v.toFixed(2));

// ---- Overview ------------------------------------------------------------------------------

async function loadOverview() {
  const o = await api("GET", "/ui/api/overview");
  const s = o.series;
  const c = colors();
  document.getElementById("stat-sessions").textContent = o.now.sessions;
  document.getElementById("stat-callers").textContent =
    o.now.callers ? "+ " + o.now.callers + " modern caller" + (o.now.callers === 1 ? "" : "s") : "";
  document.getElementById("stat-calls").textContent = fmtNum(last(s.calls_per_s), 1);
  const er = last(s.error_rate);
  document.getElementById("stat-errors").textContent = er === null ? "–" : asPercent(er);
  document.getElementById("stat-p50").textContent = fmtMs(last(s.p50_ms));
  document.getElementById("stat-p99").textContent = fmtMs(last(s.p99_ms));
  document.getElementById("stat-plugins").textContent = o.now.plugins_ready + " / " + o.now.plugins;
  plot(document.getElementById("plot-sessions"), s.t, [{ values: s.sessions, color: c.accent }], asCount);
  plot(document.getElementById("plot-calls"), s.t, [{ values: s.calls_per_s, color: c.accent }], asCount);
  plot(document.getElementById("plot-errors"), s.t, [{ values: s.error_rate, color: c.bad }], asPercent);
  plot(document.getElementById("plot-latency"), s.t,
    [{ values: s.p50_ms, color: c.p50 }, { values: s.p99_ms, color: c.p99 }], asMs);
  const body = document.querySelector("#limits-table tbody");
  body.replaceChildren(...o.limits.limits.map((l) => el("tr", {},
    el("td", { class: "mono" }, l.name),
    el("td", {}, l.applies_to + (l.pattern ? " " + l.pattern : "")),
    el("td", {}, l.rate),
    el("td", {}, l.burst),
    el("td", {}, l.refused))));
  document.getElementById("limits-table").hidden = o.limits.limits.length === 0;
  document.getElementById("limits-note").textContent = o.limits.limits.length === 0
    ? "No rate limits are configured ([limits] in the config file)."
    : (o.limits.shared ? "Counted across the cluster through Redis." : "Counted on this replica.");
}

// ---- Plugins -------------------------------------------------------------------------------

function definitionOf(p) {
  const keep = ["command", "args", "env", "cwd", "prefix", "response_mode", "startup_timeout_secs",
    "shutdown_grace_secs", "request_timeout_secs", "tools_allow", "tools_deny", "max_children",
    "idle_timeout_secs", "process_model", "pool_size", "warm", "connect", "era", "scheduling", "scope", "allow_groups",
    "allow_subjects", "tool_access", "sandbox", "enabled", "url", "transport", "headers"];
  const d = {};
  for (const k of keep) {
    const v = p[k];
    if (v === null || v === undefined) continue;
    // A remote plugin has a url and no command.
    if (k === "command" && p.url) continue;
    if (Array.isArray(v) && v.length === 0 && k !== "args") continue;
    if (typeof v === "object" && !Array.isArray(v) && Object.keys(v).length === 0) continue;
    d[k] = v;
  }
  return d;
}

async function act(method, path, body, done) {
  try {
    await api(method, path, body);
    say(done);
  } catch (e) {
    say(e.message, true);
  }
  refresh();
}

// What the machine enforces of the plugin's sandbox: "off", "all N rules", or the rules missing.
function isolationOf(p) {
  const iso = p.isolation;
  if (!iso || !iso.sandboxed) return "off";
  const missing = iso.rules.filter((r) => !r.enforced);
  if (missing.length === 0) return "all " + iso.rules.length + " rules enforced";
  return "not enforced: " + missing.map((r) => r.rule + " (" + r.how + ")").join("; ");
}

function pluginCard(p) {
  const c = colors();
  const name = encodeURIComponent(p.name);
  const buttons = el("div", { class: "buttons" });
  if (p.enabled) {
    buttons.append(el("button", { class: "small quiet", "data-action": "restart", type: "button",
      onclick: () => act("POST", "/ui/api/plugins/" + name + "/restart", undefined, "Restarted " + p.name) }, "Restart"));
    buttons.append(el("button", { class: "small danger", "data-action": "disable", type: "button",
      onclick: () => act("POST", "/ui/api/plugins/" + name + "/disable", undefined, "Disabled " + p.name) }, "Disable"));
  } else {
    buttons.append(el("button", { class: "small", "data-action": "enable", type: "button",
      onclick: () => act("POST", "/ui/api/plugins/" + name + "/enable", undefined, "Enabled " + p.name) }, "Enable"));
  }
  buttons.append(el("button", { class: "small quiet", "data-action": "edit", type: "button",
    onclick: () => openForm(p) }, "Edit"));
  const s = p.series;
  const errors = el("canvas", { class: "plot-errors" });
  const latency = el("canvas", { class: "plot-latency" });
  const card = el("article", { class: "plugin", "data-plugin": p.name },
    el("header", {},
      el("h3", {}, p.name),
      badge(p.state),
      el("span", { class: "command mono" }, p.url || [p.command].concat(p.args || []).join(" ")),
      buttons),
    el("dl", {},
      el("div", {}, el("dt", {}, "Processes"), el("dd", {}, p.running_children)),
      el("div", {}, el("dt", {}, "Starts"), el("dd", {}, p.starts)),
      el("div", {}, el("dt", {}, "Restarts after a crash"), el("dd", {}, p.restarts)),
      el("div", {}, el("dt", {}, "Tools"), el("dd", {}, p.tools === null ? "–" : p.tools)),
      el("div", {}, el("dt", {}, "Process model"), el("dd", {}, p.process_model)),
      el("div", {}, el("dt", {}, "Breaker"), el("dd", {}, p.breaker_open_secs ? "open, " + p.breaker_open_secs + " s left" : "closed")),
      el("div", {}, el("dt", {}, "Calls / s"), el("dd", {}, fmtNum(last(s.calls_per_s), 1))),
      el("div", {}, el("dt", {}, "Sandbox"), el("dd", { class: "isolation" }, isolationOf(p)))),
    p.last_error ? el("p", { class: "last-error" }, "Last error: " + p.last_error) : null,
    el("div", { class: "charts" },
      el("figure", {}, el("figcaption", {}, el("span", { class: "key p50" }), "p50",
        el("span", { class: "key p99" }), "p99 latency (ms)"), latency),
      el("figure", {}, el("figcaption", {}, "Error rate"), errors)));
  // Drawn once the card is in the page and has a size.
  card.draw = () => {
    plot(latency, s.t, [{ values: s.p50_ms, color: c.p50 }, { values: s.p99_ms, color: c.p99 }], asMs);
    plot(errors, s.t, [{ values: s.error_rate, color: c.bad }], asPercent);
  };
  return card;
}

async function loadPlugins() {
  const data = await api("GET", "/ui/api/plugins");
  const list = document.getElementById("plugin-list");
  const cards = data.plugins.map(pluginCard);
  list.replaceChildren(...cards);
  cards.forEach((c) => c.draw());
}

function openForm(p) {
  editing = p ? p.name : null;
  const form = document.getElementById("plugin-form");
  document.getElementById("plugin-form-title").textContent = p ? "Edit " + p.name : "Add a plugin";
  const name = document.getElementById("plugin-name");
  name.value = p ? p.name : "";
  name.disabled = !!p;
  if (p) {
    const d = definitionOf(p);
    delete d.enabled;
    document.getElementById("plugin-definition").value = JSON.stringify(d, null, 2);
  }
  document.getElementById("plugin-error").hidden = true;
  form.hidden = false;
  name.focus();
}

async function savePlugin(event) {
  event.preventDefault();
  const error = document.getElementById("plugin-error");
  let definition;
  try {
    definition = JSON.parse(document.getElementById("plugin-definition").value);
  } catch (e) {
    error.textContent = "The definition is not JSON: " + e.message;
    error.hidden = false;
    return;
  }
  try {
    if (editing) {
      await api("PUT", "/ui/api/plugins/" + encodeURIComponent(editing), definition);
      say("Saved " + editing);
    } else {
      definition.name = document.getElementById("plugin-name").value;
      await api("POST", "/ui/api/plugins", definition);
      say("Added " + definition.name);
    }
    document.getElementById("plugin-form").hidden = true;
    refresh();
  } catch (e) {
    error.textContent = e.message;
    error.hidden = false;
  }
}

// ---- Sessions ------------------------------------------------------------------------------

async function loadSessions() {
  const data = await api("GET", "/ui/api/sessions");
  const rows = data.sessions.map((s) => el("tr", { "data-session": s.id_prefix },
    el("td", { class: "mono" }, s.id_prefix + (s.era === "legacy" ? "…" : "")),
    el("td", {}, s.subject || "–"),
    el("td", {}, s.client || "–"),
    el("td", {}, s.protocol_version),
    el("td", {}, fmtAge(s.age_secs)),
    el("td", {}, s.open_streams),
    el("td", {}, s.instances.length ? s.instances.map((i) => i.plugin + (i.pid ? " (" + i.pid + ")" : "")).join(", ") : "–"),
    el("td", {}, el("button", { class: "small danger", type: "button", "data-action": "end",
      onclick: () => act("DELETE", "/ui/api/sessions/" + s.key, undefined, "Ended session " + s.id_prefix) }, "End"))));
  document.querySelector("#session-table tbody").replaceChildren(...rows);
  document.getElementById("sessions-empty").hidden = rows.length > 0;
}

// ---- Credentials ---------------------------------------------------------------------------

async function loadCredentials() {
  const data = await api("GET", "/ui/api/credentials");
  const when = (ms) => (ms === null || ms === undefined ? "–" : new Date(ms).toLocaleString());
  const revoke = (c, subject) => {
    const path = "/ui/api/credentials/" + encodeURIComponent(c.name) + "/connections"
      + (subject === null ? "" : "/" + encodeURIComponent(subject));
    const what = subject === null ? "everyone's " + c.name : subject + "'s " + c.name;
    act("DELETE", path, undefined, "Revoked " + what);
  };
  const blocks = data.credentials.map((c) => {
    const rows = c.connections.map((k) => el("tr", { "data-subject": k.subject },
      el("td", {}, k.subject),
      el("td", {}, when(k.connected_at_ms)),
      el("td", {}, when(k.expires_at_ms)),
      el("td", { class: "mono" }, k.scopes || "–"),
      el("td", {}, el("button", { class: "small danger", type: "button", "data-action": "revoke",
        onclick: () => revoke(c, k.subject) }, "Revoke"))));
    return el("div", { class: "panel", "data-credential": c.name },
      el("div", { class: "heading" },
        el("h2", {}, c.label + " ", badge(c.kind), " ", badge(c.source)),
        c.connections.length
          ? el("button", { class: "small danger", type: "button", "data-action": "revoke-all",
            onclick: () => revoke(c, null) }, "Revoke everyone's")
          : "",
        c.source === "api"
          ? el("button", { class: "small danger", type: "button", "data-action": "remove",
            onclick: () => act("DELETE", "/ui/api/credentials/" + encodeURIComponent(c.name),
              undefined, "Removed " + c.name) }, "Remove")
          : ""),
      el("p", { class: "muted" }, c.name + " · used by " + (c.plugins.length ? c.plugins.join(", ") : "no plugin")
        + " · " + c.connections.length + " connected"),
      c.connections.length
        ? el("table", {},
          el("thead", {}, el("tr", {}, el("th", {}, "Subject"), el("th", {}, "Connected"),
            el("th", {}, "Expires"), el("th", {}, "Scopes"), el("th", {}, ""))),
          el("tbody", {}, ...rows))
        : el("p", { class: "empty" }, "No one has connected it."));
  });
  document.getElementById("credential-list").replaceChildren(...blocks);
  document.getElementById("credentials-empty").hidden = blocks.length > 0;
}

async function saveCredential(event) {
  event.preventDefault();
  const error = document.getElementById("credential-error");
  error.hidden = true;
  let body;
  try {
    body = JSON.parse(document.getElementById("credential-definition").value);
  } catch (e) {
    error.textContent = "The definition is not JSON: " + e.message;
    error.hidden = false;
    return;
  }
  body.name = document.getElementById("credential-name").value;
  try {
    await api("POST", "/ui/api/credentials", body);
  } catch (e) {
    error.textContent = e.message;
    error.hidden = false;
    return;
  }
  document.getElementById("credential-form").hidden = true;
  say("Defined " + body.name);
  refresh();
}

// ---- Audit ---------------------------------------------------------------------------------

function auditFilter(event) {
  if (event) event.preventDefault();
  const form = new FormData(document.getElementById("audit-filter"));
  const q = new URLSearchParams();
  for (const [k, v] of form.entries()) {
    if (!v) continue;
    if (k === "since" || k === "until") q.set(k, String(new Date(v).getTime()));
    else q.set(k, v);
  }
  q.set("limit", "200");
  auditQuery = q.toString();
  refresh();
}

async function loadAudit() {
  let data;
  try {
    data = await api("GET", "/ui/api/audit?" + (auditQuery || "limit=200"));
  } catch (e) {
    // Said where the records would be (a filter the gateway refuses, the audit log off).
    document.querySelector("#audit-table tbody").replaceChildren();
    const empty = document.getElementById("audit-empty");
    empty.textContent = e.message;
    empty.hidden = false;
    return;
  }
  document.getElementById("audit-empty").textContent = "No records match.";
  const rows = data.records.map((r) => el("tr", { "data-record": r.id },
    el("td", { class: "mono" }, new Date(r.at_ms).toLocaleString()),
    el("td", {}, r.kind),
    el("td", {}, r.subject || "–"),
    el("td", { class: "mono" }, r.session || "–"),
    el("td", {}, r.client || "–"),
    el("td", {}, r.plugin || "–"),
    el("td", { class: "mono" }, r.target || "–"),
    el("td", {}, badge(r.outcome), r.error_code !== null ? " " + r.error_code : ""),
    el("td", {}, fmtMs(r.duration_ms)),
    el("td", { class: "mono args", title: r.arguments || "" }, r.arguments || "–")));
  document.querySelector("#audit-table tbody").replaceChildren(...rows);
  document.getElementById("audit-empty").hidden = rows.length > 0;
}

// ---- Views and polling ---------------------------------------------------------------------

const LOADERS = {
  overview: loadOverview, plugins: loadPlugins, sessions: loadSessions,
  credentials: loadCredentials, audit: loadAudit,
};

async function refresh() {
  clearTimeout(timer);
  const live = document.getElementById("live");
  try {
    await LOADERS[current]();
    live.classList.remove("stale");
    live.textContent = "live";
  } catch (e) {
    live.classList.add("stale");
    live.textContent = "not reachable";
  }
  // A form being filled in is not redrawn under the user's hands.
  timer = setTimeout(refresh, PERIOD_MS);
}

function show() {
  const wanted = location.hash.replace("#", "");
  current = VIEWS.includes(wanted) ? wanted : "overview";
  for (const v of VIEWS) {
    document.getElementById("view-" + v).hidden = v !== current;
  }
  document.querySelectorAll("header nav a").forEach((a) => {
    a.classList.toggle("active", a.dataset.view === current);
  });
  refresh();
}

document.addEventListener("DOMContentLoaded", () => {
  window.addEventListener("hashchange", show);
  document.getElementById("sign-out").addEventListener("click", async () => {
    try { await api("POST", "/ui/logout"); } catch (_) { /* signed out either way */ }
    location.assign("/ui");
  });
  document.getElementById("plugin-add").addEventListener("click", () => openForm(null));
  document.getElementById("plugin-cancel").addEventListener("click", () => {
    document.getElementById("plugin-form").hidden = true;
  });
  document.getElementById("plugin-form").addEventListener("submit", savePlugin);
  document.getElementById("audit-filter").addEventListener("submit", auditFilter);
  document.getElementById("credential-add").addEventListener("click", () => {
    document.getElementById("credential-form").hidden = false;
  });
  document.getElementById("credential-cancel").addEventListener("click", () => {
    document.getElementById("credential-form").hidden = true;
  });
  document.getElementById("credential-form").addEventListener("submit", saveCredential);
  show();
});
