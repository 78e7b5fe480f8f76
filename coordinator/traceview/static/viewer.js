"use strict";
// Fleet trace page: renders the inlined run data; no network, no dependencies.
(function () {
  let DATA = JSON.parse(document.getElementById("fleet-data").textContent);
  let RUN = DATA.run;
  let MEMBERS = DATA.members;
  // Served by `fleet view`: where this run's routes are (else the written page: none).
  const API = DATA.live ? DATA.live.api : "/";
  const SVG = "http://www.w3.org/2000/svg";

  // Every string here was written by a model, a page or a box: it enters the DOM as text
  // (never as markup, bidirectional controls made visible: FleetText), a URL only when it
  // resolves to the page's own kind of link, and a class only as one token.
  const textOf = FleetText.textOf;
  // Links lead to run files (relative, http(s) under `fleet view`, file: when written);
  // anything else (javascript:, data:, ...) is dropped.
  const LINKABLE = new Set(["http:", "https:", "file:"]);
  function safeUrl(v) {
    try { return LINKABLE.has(new URL(String(v), document.baseURI).protocol) ? String(v) : null; } catch (e) { return null; }
  }
  const IMAGE_DATA = /^data:image\/(png|jpeg|webp);base64,[A-Za-z0-9+/=]*$/;
  const token = (s) => String(s).replace(/[^A-Za-z0-9_-]/g, "_");
  function el(tag, attrs, ...kids) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.replaceChildren(textOf(v));
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else if (k === "href") { const u = safeUrl(v); if (u !== null) node.setAttribute(k, u); }
      else if (k === "src") { const u = IMAGE_DATA.test(v) ? v : safeUrl(v); if (u !== null) node.setAttribute(k, u); }
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const kid of kids.flat()) if (kid !== null && kid !== undefined) node.append(typeof kid === "string" ? textOf(kid) : kid);
    return node;
  }
  function sv(tag, attrs, ...kids) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) node.setAttribute(k, v);
    for (const kid of kids) if (kid) node.append(kid);
    return node;
  }
  function title(text) { const t = document.createElementNS(SVG, "title"); t.textContent = text; return t; }
  function tok(n) {
    if (n >= 1e6) return (n / 1e6).toFixed(1) + "M";
    if (n >= 1e3) return (n / 1e3).toFixed(1) + "k";
    return String(Math.round(n));
  }
  function dur(s) {
    if (s >= 3600) return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
    if (s >= 60) return Math.floor(s / 60) + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s";
    return s.toFixed(1) + "s";
  }
  const totalIn = (x) => x.input_tokens + x.cache_read_tokens + x.cache_write_tokens;
  const pill = (status) => el("span", { class: "pill st-" + token(status), text: status });
  const FAILED = new Set(["failed", "crashed", "timed_out", "cancelled", "incomplete", "skipped"]);
  // Ids in natural order: research-2 before research-10.
  const natural = (a, b) => String(a).localeCompare(String(b), "en", { numeric: true });
  // A lead run: the lead first, then its members wave by wave.
  const order = () => [...MEMBERS].sort((a, b) => (b.lead - a.lead) || ((a.wave || 0) - (b.wave || 0)) || natural(a.id, b.id));
  let ORDER = order();
  let statusFilter = "";
  const shown = (m) => !statusFilter || m.status === statusFilter;
  // Enter or Space on a focused row or lane opens it, as a click does.
  const onKeys = (fn) => (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); fn(); } };

  // ---------- overview ----------
  function cards() {
    const t = RUN.totals;
    const tin = t.input_tokens + t.cache_read_tokens + t.cache_write_tokens;
    const st = Object.entries(RUN.statuses).map(([k, v]) => v + " " + k).join(", ");
    const waves = new Set(MEMBERS.filter((m) => m.wave).map((m) => m.wave)).size;
    const items = [
      [MEMBERS.filter((m) => !m.lead && !m.attempt_of).length, "members", st + (RUN.lead ? "; the lead is not counted" : "") + (MEMBERS.some((m) => m.attempt_of) ? "; " + MEMBERS.filter((m) => m.attempt_of).length + " parallel attempts are lanes under their member" : "")],
      ...(RUN.lead ? [[waves, "waves", "spawn calls of the lead that started members"]] : []), [dur(RUN.duration), "wall time", (RUN.finished ? "finished" : "running") + "; run start to end, planning and synthesis included"],
      [dur(t.box_s), "box start-up", "seconds spent creating boxes, all members and attempts"],
      ...(t.setup_s ? [[dur(t.setup_s), "setup wait", "seconds members waited on their repository's setup (made, reused or failed)"]] : []),
      ...(RUN.merge ? [[RUN.merge.verdict, "merge", "applied: " + (RUN.merge.applied.join(", ") || "none") + (RUN.merge.conflicts.length ? "; left out (conflicts): " + RUN.merge.conflicts.join(", ") : "") + (RUN.merge.diff ? "; " + RUN.merge.diff : "")]] : []),
      [t.turns, "turns"], [t.tool_calls, "tool calls"], [tok(tin), "tokens in", "cached " + tok(t.cache_read_tokens)],
      [tok(t.output_tokens), "tokens out"], [t.errors, "errors"], [t.offloads + " / " + t.compactions, "offloads / compactions"],
      ["$" + t.cost_usd.toFixed(3), "est. cost"],
    ];
    const box = document.getElementById("cards");
    box.textContent = "";
    for (const [v, l, sub] of items) box.append(el("div", { class: "card", title: sub || "" }, el("div", { class: "v", text: String(v) }), el("div", { class: "l", text: l })));
  }

  // The job as written, its model's settings, and tokens and cost per model (per
  // member: the table below).
  function info() {
    const per = new Map();
    for (const m of MEMBERS) {
      const row = per.get(m.model || "?") || { n: 0, i: 0, cr: 0, o: 0, c: 0, est: false };
      row.n += 1; row.i += totalIn(m); row.cr += m.cache_read_tokens; row.o += m.output_tokens; row.c += m.cost_usd; row.est = row.est || m.cost_estimated;
      per.set(m.model || "?", row);
    }
    const head = el("tr", {}, ["model", "members", "in", "cached", "out", "cost"].map((t, i) => el("th", { class: i ? "num" : "", text: t })));
    const rows = [...per.entries()].sort((a, b) => natural(a[0], b[0])).map(([model, r]) => el("tr", { class: "model-row", "data-model": model },
      el("td", { class: "mono", text: model }), el("td", { class: "num", text: String(r.n) }), el("td", { class: "num", text: tok(r.i) }),
      el("td", { class: "num", text: tok(r.cr) }), el("td", { class: "num", text: tok(r.o) }), el("td", { class: "num", text: "$" + r.c.toFixed(3) + (r.est ? "*" : "") })));
    const cfg = RUN.model_cfg;
    document.getElementById("info").replaceChildren(el("details", { class: "panel", id: "info-panel" },
      el("summary", {}, el("h2", { text: "Job, model and usage" })),
      el("h3", { text: "Tokens and cost per model" }), el("table", { class: "per-model" }, el("thead", {}, head), el("tbody", {}, rows)),
      el("div", { class: "meta", text: "per member: the Members table; * priced from the model's profile" }),
      el("h3", { text: "Model and its settings" }),
      cfg && typeof cfg === "object" ? FleetTree.render(el, cfg) : el("div", { class: "mono", text: cfg ? String(cfg) : "(not recorded)" }),
      el("h3", { text: "The job as written" }),
      RUN.job_text ? el("pre", { class: "job-text", text: RUN.job_text }) : el("pre", { class: "job-text", text: RUN.job || "(not recorded)" })));
  }

  function legend(box, items) {
    for (const [color, label] of items) box.append(el("span", {}, el("i", { style: "background:" + color }), label));
  }

  function ticks(span, width) {
    const steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200];
    const want = span / Math.max(2, Math.floor(width / 110));
    return steps.find((s) => s >= want) || 3600 * Math.ceil(want / 3600);
  }

  function timeline() {
    const box = document.getElementById("timeline");
    box.textContent = "";
    const W = Math.max(320, box.clientWidth || 1000);
    const narrow = W < 600;
    const L = narrow ? 96 : 150, R = narrow ? 52 : 120, laneH = 26, top = 22, headH = 16;
    // The run's span: its journal's end, or a later member event (a run still going).
    const span = Math.max(RUN.duration, RUN.end, ...MEMBERS.map((m) => m.end), 1);
    const x = (t) => L + (t / span) * (W - L - R);
    // Lanes in display order; a lead run's waves each open with a heading row, and a
    // cluster run's members are grouped by the node they ran on, each node a heading.
    const rows = [];
    let wave = null, node = null;
    const byNode = !RUN.lead && MEMBERS.some((m) => m.node);
    const lanes = ORDER.filter(shown);
    if (byNode) lanes.sort((a, b) => natural(a.node || "", b.node || ""));  // stable: ids stay in order
    // Repository setups first, a lane each: what the members below waited on.
    const setups = RUN.setups || [];
    if (setups.length) {
      rows.push({ head: setups.length === 1 ? "repository setup" : "repository setups" });
      for (const su of setups) rows.push({ su });
      if (lanes.length) rows.push({ head: "members" });
    }
    for (const m of lanes) {
      if (RUN.lead && !m.lead && m.wave !== wave) {
        wave = m.wave;
        rows.push({ head: wave ? "wave " + wave : "not spawned by the lead" });
      }
      if (byNode && m.node !== node) {
        node = m.node;
        rows.push({ head: node ? "node " + node : "no node recorded" });
      }
      rows.push({ m });
    }
    let yAt = top;
    for (const r of rows) { r.y = yAt; yAt += r.head ? headH : laneH; }
    const H = yAt + 6;
    const svg = sv("svg", { viewBox: `0 0 ${W} ${H}`, height: H, id: "timeline-svg" });
    const axis = sv("g", { class: "axis" });
    const step = ticks(span, W - L - R);
    for (let t = 0; t <= span + 1e-9; t += step) {
      axis.append(sv("line", { x1: x(t), x2: x(t), y1: top - 4, y2: H }));
      axis.append(sv("text", { x: x(t), y: 12, "text-anchor": "middle" }, document.createTextNode(dur(t))));
    }
    svg.append(axis);
    const slowest = MEMBERS.reduce((a, m) => (m.duration_s > a.duration_s ? m : a), MEMBERS[0] || { duration_s: 0 });
    for (const r of rows) {
      if (r.head) svg.append(sv("text", { class: "wave-head", x: 6, y: r.y + 12 }, document.createTextNode(r.head)));
      else if (r.su) svg.append(setupLane(r.su, r.y, { x, laneH, W }));
      else svg.append(lane(r.m, r.y, { x, laneH, W, L, slowest, narrow }));
    }
    box.append(svg);
  }

  // One setup: from the first member's wait to the last one's end; its log opens on click.
  function setupLane(su, y, g) {
    const failed = su.st === "failed";
    const name = "setup " + (su.key || "(key not recorded)");
    const how = su.st === "made" ? `ran here in ${dur(su.d)}, for ${su.by}`
      : su.st === "reused" ? "reused a prepared snapshot" : su.st === "failed" ? `failed after ${dur(su.d)}: ${su.why}` : "still running";
    const text = `${name}: ${how}; members ${su.m.join(", ")}` + (su.log ? "; click for its log" : "");
    const grp = sv("g", { class: "setup-lane" + (failed ? " failed" : ""), "data-key": su.key, "data-status": su.st,
      tabindex: su.log ? 0 : -1, role: su.log ? "link" : "img", "aria-label": text });
    if (su.log) {
      const open = () => window.open(RUN.lb + su.log, "_blank", "noopener");
      grp.addEventListener("click", open);
      grp.addEventListener("keydown", onKeys(open));
    }
    grp.append(sv("rect", { class: "lane-bg", x: 0, y, width: g.W, height: g.laneH }));
    grp.append(sv("text", { class: "lane-label", x: 20, y: y + g.laneH / 2 + 4 }, document.createTextNode("setup " + (su.key ? su.key.slice(0, 10) : "?"))));
    grp.append(sv("rect", { class: "setup-span", x: g.x(su.s), y: y + 5, width: Math.max(1, g.x(su.e) - g.x(su.s)), height: 16, rx: 2,
      fill: failed ? "var(--tool-err)" : "var(--setup)" }));
    grp.append(title(text));
    return grp;
  }

  function lane(m, y, g) {
    const failed = FAILED.has(m.status);
    const grp = sv("g", { class: "lane" + (failed ? " failed" : "") + (m.lead ? " lead" : ""), "data-member": m.id, "data-status": m.status,
      "data-wave": m.wave || "", tabindex: 0, role: "button", "aria-label": `open ${m.id} (${m.kind}, ${m.status})` });
    grp.addEventListener("click", () => openMember(m.id));
    grp.addEventListener("keydown", onKeys(() => openMember(m.id)));
    grp.append(sv("rect", { class: "lane-bg", x: 0, y, width: g.W, height: g.laneH }));
    const dot = failed ? "#d64545" : m.status === "ok" ? "#2a9d63" : "#3b8fd6";
    grp.append(sv("circle", { cx: 10, cy: y + g.laneH / 2, r: 4, fill: dot }));
    grp.append(sv("text", { class: "lane-label", x: 20, y: y + g.laneH / 2 + 4 }, document.createTextNode(m.id + (g.narrow ? "" : " " + (m.kind || "")))));
    // On a cluster, where the member ran (its last attempt's node), on hover.
    if (m.node) grp.append(sv("title", {}, document.createTextNode(`${m.id} ran on node ${m.node}`)));
    // One segment per attempt: the box starting (its own bar), then the member's work;
    // an attempt that was retried is marked where it ended.
    for (const a of m.per_attempt) {
      const last = a.n === m.per_attempt.length;
      grp.append(sv("line", { class: "attempt-line", x1: g.x(a.s), x2: g.x(a.e), y1: y + g.laneH / 2, y2: y + g.laneH / 2, stroke: "#d5dae4" }));
      if (a.b > a.s) grp.append(sv("rect", { class: "box-bar", x: g.x(a.s), y: y + 5, width: Math.max(1, g.x(a.b) - g.x(a.s)), height: 16, rx: 2, fill: "var(--box)" },
        title(`${m.id} attempt ${a.n}: box start-up ${a.box.toFixed(1)}s`)));
      // The wait on the repository's setup comes first, its own bar over the start-up's.
      if (a.su) grp.append(sv("rect", { class: "setup-bar", x: g.x(a.s), y: y + 5, width: Math.max(1, g.x(a.s + a.su) - g.x(a.s)), height: 16, rx: 2, fill: "var(--setup)" },
        title(`${m.id} attempt ${a.n}: waited ${a.su.toFixed(1)}s on the repository's setup`)));
      if (!last) {
        const xe = g.x(a.e);
        grp.append(sv("path", { d: `M${xe - 4} ${y + 7} l8 8 M${xe + 4} ${y + 7} l-8 8`, stroke: "var(--tool-err)", "stroke-width": 2, class: "attempt-fail" },
          title(`attempt ${a.n} ${a.st}: ${a.why} (retried)`)));
      }
    }
    for (const t of m.turns_detail) {
      for (const c of t.m) {
        const w = Math.max(1, g.x(c.e) - g.x(c.s));
        grp.append(sv("rect", { x: g.x(c.s), y: y + 5, width: w, height: 8, fill: "var(--model)", rx: 1 },
          title(`${m.id} turn ${t.n}: model ${(c.e - c.s).toFixed(1)}s, ctx ${tok(c.ctx)}, out ${c.o}`)));
      }
      for (const tc of t.t) {
        const end = tc.e === null ? tc.s : tc.e;
        const w = Math.max(1, g.x(end) - g.x(tc.s));
        grp.append(sv("rect", { x: g.x(tc.s), y: y + 14, width: w, height: 7, rx: 1, fill: tc.err ? "var(--tool-err)" : "var(--tool)" },
          title(`${m.id} turn ${t.n}: ${tc.n} ${(end - tc.s).toFixed(1)}s${tc.err ? " (error)" : ""}`)));
      }
      for (const k of t.k) {
        if (k.k === "compaction") grp.append(sv("path", { d: `M${g.x(k.ts)} ${y + 2} l4 6 l-4 6 l-4 -6 z`, fill: "var(--compact)" }, title(`compaction ${k.x}`)));
        else if (k.k === "offload") grp.append(sv("path", { d: `M${g.x(k.ts)} ${y + 22} l4 -6 l-8 0 z`, fill: "var(--offload)" }, title(`offload ${k.x}`)));
      }
    }
    if (m.lead) decisions(grp, m, y, g);
    const label = dur(m.duration_s) + (m.id === g.slowest.id && MEMBERS.length > 1 && !g.narrow ? " slowest" : "");
    if (failed) {
      const xe = g.x(m.end);
      grp.append(sv("path", { d: `M${xe - 5} ${y + 6} l10 10 M${xe + 5} ${y + 6} l-10 10`, stroke: "var(--fail)", "stroke-width": 2.5, class: "fail-mark" }, title(`${m.status}: ${m.reason}`)));
    }
    grp.append(sv("text", { x: g.x(m.end) + 9, y: y + g.laneH / 2 + 4, fill: failed ? "#d64545" : "#687083" }, document.createTextNode(failed ? m.status : label)));
    return grp;
  }

  // The lead's decisions on its lane: each spawn (a wave), wait and finish where it happened.
  const DECISIONS = { spawn: "M0 -6 L6 0 L0 6 L-6 0 z", wait: "M-4 -5 h8 l-8 10 h8 z", read_result: "M-4 -4 h8 v8 h-8 z", finish: "M-3 -7 v14 M-3 -7 h8 l-2 3 l2 3 h-8" };
  function decisions(grp, m, y, g) {
    for (const t of m.turns_detail) {
      for (const tc of t.t) {
        if (!Object.hasOwn(DECISIONS, tc.n)) continue;
        const d = DECISIONS[tc.n];
        const first = (tc.out || "").split("\n")[0];
        const at = g.x(tc.n === "wait" && tc.e !== null ? tc.e : tc.s);
        grp.append(sv("path", { class: "decision d-" + tc.n + (tc.err ? " refused" : ""), "data-tool": tc.n, transform: `translate(${at} ${y + g.laneH / 2})`, d,
          fill: tc.n === "finish" ? "none" : tc.err ? "var(--tool-err)" : "#1f2740", stroke: tc.n === "finish" ? "#1f2740" : "none", "stroke-width": 1.6 },
        title(`lead turn ${t.n}: ${tc.n}${tc.err ? " (refused)" : ""} - ${first.slice(0, 200)}`)));
      }
    }
  }

  // Computed per drawing: a live run's first node or wave adds its column.
  const cols = () => [
    ["member", "member", (m) => el("span", { class: "mono", text: m.id })],
    ["kind", "kind", (m) => m.kind],
    ...(RUN.lead ? [["wave", "wave", (m) => (m.lead ? "lead" : m.wave || ""), 1]] : []),
    ...(MEMBERS.some((m) => m.node) ? [["node", "node", (m) => m.node || ""]] : []),
    ["status", "status", (m) => pill(m.status)],
    ["attempts", "attempts", (m) => m.attempts, 1],
    ["duration_s", "wall", (m) => dur(m.duration_s), 1],
    ["box_s", "box", (m) => dur(m.box_s), 1],
    ["turns", "turns", (m) => m.turns, 1],
    ["in", "in", (m) => tok(totalIn(m)), 1],
    ["cache_read_tokens", "cached", (m) => tok(m.cache_read_tokens), 1],
    ["output_tokens", "out", (m) => tok(m.output_tokens), 1],
    ["tool_calls", "tools", (m) => m.tool_calls, 1],
    ["errors", "errors", (m) => m.errors, 1],
    ["offloads", "offloads", (m) => m.offloads, 1],
    ["compactions", "compactions", (m) => m.compactions, 1],
    ["cost_usd", "cost", (m) => "$" + m.cost_usd.toFixed(3) + (m.cost_estimated ? "*" : ""), 1],
    ["reason", "reason", (m) => m.reason],
  ];
  let sortKey = RUN.lead ? "wave" : "member", sortDir = 1;

  function table() {
    const COLS = cols();
    const tbl = document.getElementById("members");
    tbl.textContent = "";
    const head = el("tr", {}, COLS.map(([key, label, , num]) => el("th", { class: num ? "num" : "", text: label + (sortKey === key ? (sortDir > 0 ? " ▲" : " ▼") : ""),
      onclick: () => { sortDir = sortKey === key ? -sortDir : 1; sortKey = key; table(); } })));
    const val = (m) => (sortKey === "in" ? totalIn(m) : sortKey === "member" ? m.id : sortKey === "wave" ? (m.lead ? 0 : m.wave || 1e6) : m[sortKey]);
    const cmp = (a, b) => (typeof a === "string" || typeof b === "string" ? natural(a, b) : a > b ? 1 : a < b ? -1 : 0);
    const rows = [...ORDER].filter(shown).sort((a, b) => cmp(val(a), val(b)) * sortDir);
    const body = el("tbody", {}, rows.map((m) => el("tr", { "data-member": m.id, "data-status": m.status, tabindex: 0, onclick: () => openMember(m.id), onkeydown: onKeys(() => openMember(m.id)) },
      COLS.map(([key, , fn, num]) => el("td", { class: num ? "num" : key === "reason" ? "reason" : "" }, fn(m))))));
    tbl.append(el("thead", {}, head), body);
  }

  // ---------- member view ----------
  const refFile = (ref) => (ref || "").replace(/:\d+$/, "");
  const fileLink = (path, text) => el("a", { class: "path", href: RUN.lb + path, target: "_blank", text: text || path });

  // A cut text says where its full version is (a link to the file); under `fleet view`
  // it can also be loaded in place, so the page stays small yet nothing is out of reach.
  function cutNote(item, shownLen, total, pre, ref, cut) {
    ref = ref || item.ref;
    if (!(cut === undefined ? item.tr || item.off : cut)) return null;
    const where = item.off && cut === undefined ? "offloaded; full text in " : "truncated; full text in ";
    const size = total ? ` (${shownLen} of ${total} chars shown)` : "";
    const note = el("div", { class: "cut" }, where, fileLink(refFile(ref), ref), size);
    if (RUN.served && pre) {
      const btn = el("button", { class: "load-full", text: "load full text" });
      btn.addEventListener("click", async () => {
        btn.disabled = true;
        const resp = await fetch(API + "full/" + ref.split("/").map(encodeURIComponent).join("/"));
        if (!resp.ok) { btn.textContent = "not found (" + resp.status + ")"; return; }
        pre.textContent = await resp.text();
        pre.classList.add("full");
        note.replaceChildren("full text from ", fileLink(refFile(ref), ref));
      });
      note.append(" ", btn);
    }
    return note;
  }

  function contextChart(m) {
    const W = 620, H = 200, L = 48, R = 10, T = 12, B = 26;
    const pts = [];
    for (const t of m.turns_detail) for (const c of t.m) pts.push([t.n, c.ctx]);
    const svg = sv("svg", { viewBox: `0 0 ${W} ${H}`, class: "ctx-chart" });
    if (!pts.length) return el("div", { class: "empty", text: "no model calls" });
    const maxT = Math.max(...pts.map((p) => p[0]), 1), maxY = Math.max(...pts.map((p) => p[1]), 1) * 1.08;
    const x = (n) => L + ((n - 1) / Math.max(1, maxT - 1)) * (W - L - R);
    const y = (v) => T + (1 - v / maxY) * (H - T - B);
    const grid = sv("g", { class: "grid" });
    for (let i = 0; i <= 4; i++) {
      const v = (maxY * i) / 4;
      grid.append(sv("line", { x1: L, x2: W - R, y1: y(v), y2: y(v) }));
      grid.append(sv("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, document.createTextNode(tok(v))));
    }
    const tstep = ticks(maxT, W - L - R);
    for (let n = 1; n <= maxT; n += n === 1 && tstep > 1 ? tstep - 1 : tstep) {
      grid.append(sv("text", { x: x(n), y: H - 8, "text-anchor": "middle" }, document.createTextNode("t" + n)));
    }
    svg.append(grid);
    const line = pts.map((p, i) => (i ? "L" : "M") + x(p[0]).toFixed(1) + " " + y(p[1]).toFixed(1)).join(" ");
    svg.append(sv("path", { d: line + ` L${x(pts[pts.length - 1][0])} ${y(0)} L${x(pts[0][0])} ${y(0)} z`, fill: "rgba(79,124,240,.12)" }));
    svg.append(sv("path", { d: line, fill: "none", stroke: "var(--model)", "stroke-width": 1.6 }));
    for (const t of m.turns_detail) {
      for (const k of t.k) {
        if (k.k === "compaction") {
          svg.append(sv("line", { x1: x(t.n), x2: x(t.n), y1: T, y2: H - B, stroke: "var(--compact)", "stroke-dasharray": "4 3", class: "mk-compaction" }, title(`turn ${t.n}: compaction ${k.x}`)));
        } else if (k.k === "offload") {
          const c = t.m[0];
          svg.append(sv("circle", { cx: x(t.n), cy: y(c ? c.ctx : 0), r: 4, fill: "var(--offload)", class: "mk-offload" }, title(`turn ${t.n}: offload ${k.x}`)));
        }
      }
    }
    const lg = el("div", { class: "legend" });
    legend(lg, [["var(--model)", "context sent"], ["var(--compact)", "compaction"], ["var(--offload)", "offload"]]);
    return el("div", { class: "chart" }, el("div", { class: "panel-head" }, el("h3", { text: "Context size per turn" }), lg), svg);
  }

  function tokenChart(m) {
    const parts = [["uncached in", m.input_tokens, "#7d95d8"], ["cache read", m.cache_read_tokens, "#b9c8ef"],
      ["cache write", m.cache_write_tokens, "#5a6fae"], ["out", m.output_tokens, "#2aa876"]];
    const sum = parts.reduce((a, p) => a + p[1], 0) || 1;
    const W = 420, bar = sv("svg", { viewBox: `0 0 ${W} 34`, class: "tok-bar" });
    let x0 = 0;
    for (const [label, v, color] of parts) {
      const w = (v / sum) * W;
      bar.append(sv("rect", { x: x0, y: 4, width: Math.max(0, w), height: 24, fill: color }, title(`${label}: ${v}`)));
      x0 += w;
    }
    const per = sv("svg", { viewBox: `0 0 ${W} 90`, class: "tok-turns" });
    const calls = m.turns_detail.flatMap((t) => t.m);
    const maxO = Math.max(1, ...calls.map((c) => c.o));
    const bw = W / Math.max(1, calls.length);
    calls.forEach((c, i) => per.append(sv("rect", { x: i * bw, y: 86 - (c.o / maxO) * 80, width: Math.max(0.5, bw - 0.5), height: (c.o / maxO) * 80, fill: "#2aa876" })));
    const lg = el("div", { class: "legend" });
    legend(lg, parts.map(([l, v, c]) => [c, `${l} ${tok(v)}`]));
    return el("div", { class: "chart" }, el("h3", { text: "Token use" }), bar, lg,
      el("div", { class: "meta", style: "margin-top:10px", text: `output tokens per model call (max ${tok(maxO)})` }), per);
  }

  function modelBlock(c) {
    const pre = c.x ? el("pre", { text: c.x }) : null;
    return el("div", { class: "block model" },
      el("div", { class: "meta" }, el("b", { text: "model call" }), ` ${(c.e - c.s).toFixed(1)}s · ctx ${tok(c.ctx)} · in ${tok(c.i + c.cr + c.cw)} (cached ${tok(c.cr)}) · out ${c.o} · stop ${c.stop}` + (c.rt ? ` · ${c.rt} retries` : "")),
      c.x ? el("details", { class: "sub" }, el("summary", { text: c.x.slice(0, 140) + (c.x.length > 140 ? "…" : "") }), pre, cutNote(c, c.x.length, 0, pre)) : null);
  }

  function toolBlock(tc) {
    const d = tc.e === null ? "no result" : (tc.e - tc.s).toFixed(1) + "s";
    const inPre = el("pre", { class: "tool-input", text: tc.in }), outPre = el("pre", { class: "tool-output", text: tc.out });
    return el("div", { class: "block tool" + (tc.err ? " err" : "") },
      el("details", { class: "sub tool-call" },
        el("summary", {}, el("b", { class: "mono", text: tc.n }), ` ${d} · ${tc.oc} chars` + (tc.err ? " · error" : "") + (tc.off ? " · offloaded" : "")),
        el("div", { class: "meta", text: "input" }), inPre, cutNote(tc, tc.in.length, 0, inPre, tc.iref, tc.itr),
        el("div", { class: "meta", text: "result" + (tc.err ? " (error)" : "") }), outPre,
        cutNote(tc, tc.out.length, tc.oc, outPre)));
  }

  function markBlock(k) {
    if (k.k === "compaction") {
      const pre = el("pre", { text: k.sm || "" });
      return el("div", { class: "block compaction" }, el("div", { class: "meta" }, el("b", { text: "compaction" }), " " + k.x + " · transcript ", k.p ? fileLink(k.p) : ""),
        el("details", { class: "sub", open: true }, el("summary", { text: "summary" }), pre, cutNote(k, (k.sm || "").length, 0, pre, k.ref, k.tr)));
    }
    if (k.k === "screenshot") {
      return el("div", { class: "block" }, el("div", { class: "meta" }, el("b", { text: "screenshot" }), " " + (k.x || "") + " · ", fileLink(k.p)),
        k.src ? el("a", { href: RUN.lb + k.p, target: "_blank" }, el("img", { class: "shot", src: k.src, alt: "screenshot " + k.p, loading: "lazy" })) : null);
    }
    const cls = k.k === "offload" ? "offload" : k.k === "error" || k.k === "retry" ? "error" : "";
    return el("div", { class: "block " + cls }, el("div", { class: "meta" }, el("b", { text: k.k }), " " + k.x, k.p ? [" · ", fileLink(k.p)] : null));
  }

  function turnNode(t) {
    const kinds = new Set(t.k.map((k) => k.k));
    const err = t.t.some((x) => x.err) || kinds.has("error");
    const ctx = t.m.length ? "ctx " + tok(t.m[0].ctx) : "";
    const badges = ["offload", "compaction", "screenshot", "error", "retry", "clip"].filter((k) => kinds.has(k)).map((k) => el("span", { class: "badge b-" + k, text: k }));
    if (t.t.some((x) => x.err)) badges.push(el("span", { class: "badge b-error", text: "tool error" }));
    const node = el("details", { class: "turn" + (err ? " has-error" : ""), "data-turn": t.n, "data-attempt": t.a },
      el("summary", {}, el("span", { class: "tn", text: t.c ? "closing call (after a limit)" : "turn " + t.n }), el("span", { class: "tdur", text: dur(t.e - t.s) }),
        el("span", { class: "tctx", text: ctx }), el("span", { class: "tools-sum", text: t.t.map((x) => x.n).join(", ") }), badges));
    // The body is built when the turn is first opened (a 200-turn member opens at once).
    node._fill = () => {
      if (node.dataset.filled) return;
      node.dataset.filled = "1";
      node.append(el("div", { class: "turn-body" }, t.m.map(modelBlock), t.t.map(toolBlock), t.k.map(markBlock)));
    };
    node.addEventListener("toggle", () => {
      if (!node.open) return;
      node._fill();
      // The address names the open turn, so it can be linked to.
      const id = document.getElementById("member-view").dataset.member;
      history.replaceState(null, "", "#member=" + encodeURIComponent(id) + "&turn=" + t.n + (t.a ? "&attempt=" + t.a : ""));
    });
    node._search = (t.t.map((x) => x.n + " " + x.in + " " + x.out).join(" ") + " " + t.m.map((c) => c.x).join(" ") + " " + [...kinds].join(" ")).toLowerCase();
    node._flag = err || kinds.has("offload") || kinds.has("compaction");
    return node;
  }

  function turnsPanel(m) {
    // A retried member counts turns from 1 in each attempt: a heading opens each attempt.
    const heads = m.attempts > 1 ? new Map(m.per_attempt.map((a) => [a.n, a])) : new Map();
    const nodes = [];
    for (const t of m.turns_detail) {
      const a = heads.get(t.a);
      if (a) {
        heads.delete(t.a);
        nodes.push(el("div", { class: "attempt-head" + (a.n < m.attempts ? " retried" : ""), "data-attempt": a.n },
          el("b", { text: "attempt " + a.n }), " ", pill(a.st), ` ${dur(a.d)} · ${a.turns} turns` + (a.why ? " · " + a.why : "")));
      }
      nodes.push(turnNode(t));
    }
    const list = el("div", { id: "turns" }, nodes);
    const search = el("input", { type: "search", placeholder: "filter turns (tool, text, error…)" });
    const only = el("input", { type: "checkbox" });
    const apply = () => {
      const q = search.value.trim().toLowerCase();
      for (const n of list.children) if (n._search !== undefined) n.hidden = (q && !n._search.includes(q)) || (only.checked && !n._flag);
    };
    search.addEventListener("input", apply);
    only.addEventListener("change", apply);
    const setAll = (open) => () => { for (const n of list.children) if (!n.hidden && n.tagName === "DETAILS") n.open = open; };
    const bar = el("div", { class: "toolbar" }, search, el("label", { class: "chk" }, only, "only errors, offloads, compactions"),
      el("button", { onclick: setAll(true), text: "expand all" }), el("button", { onclick: setAll(false), text: "collapse all" }));
    return el("div", { class: "panel" }, el("div", { class: "panel-head" }, el("h2", { text: `Turns (${m.turns_detail.length})` })), bar, list);
  }

  function size(b) { return b >= 1e6 ? (b / 1e6).toFixed(1) + " MB" : b >= 1e3 ? (b / 1e3).toFixed(1) + " kB" : b + " B"; }

  function pagesPanel(m) {
    if (!m.pages.length) return null;
    const rows = m.pages.map((p) => el("tr", { class: "page-row" },
      el("td", { class: "num", text: String(p.n) }), el("td", { class: "num", text: "+" + dur(p.ts) }),
      el("td", {}, el("div", { text: p.t || "(no title)" }), el("div", { class: "meta mono", text: p.u })),
      el("td", { class: "num", text: tok(p.c) + " chars" }), el("td", {}, fileLink(p.p, "page text"))));
    return el("div", { class: "panel", id: "pages" }, el("div", { class: "panel-head" }, el("h2", { text: `Pages fetched (${m.pages.length})` }),
      el("span", { class: "hint", text: "the texts quotes are checked against" })),
    el("table", { class: "pages" }, el("tbody", {}, rows)));
  }

  function memoryPanel(m) {
    if (!m.mem || !m.mem.length) return null;
    const rows = m.mem.flatMap((s) => [
      el("div", { class: "meta", text: `${s.error ? "NOT saved" : "saved"} to ${s.profile}` + (m.attempts > 1 ? ` (attempt ${s.attempt})` : "") + (s.error ? `: ${s.error}` : "") }),
      ...s.files.map((f) => el("div", { class: f.action === "conflict" ? "reason-box" : "file", text: `${f.path} ${f.action}` + (f.merged_with.length ? ` with ${f.merged_with.join(", ")}` : "") + (f.detail ? `: ${f.detail}` : "") }))]);
    return el("div", { class: "panel", id: "memory" }, el("div", { class: "panel-head" }, el("h2", { text: "Memory" })), rows);
  }

  function filesPanel(m) {
    if (!m.files.length) return null;
    return el("div", { class: "panel", id: "files" }, el("div", { class: "panel-head" }, el("h2", { text: `Files (${m.files.length})` }),
      el("span", { class: "hint", text: "trace, result, patch, offloads, transcripts, memory" })),
    el("div", { class: "file-list" }, m.files.map((f) => el("span", { class: "file" }, fileLink(f.p, f.p.slice(m.dir.length + 1)), el("span", { class: "meta", text: " " + size(f.b) })))));
  }

  // Each attempt of a member: status, reason and times (the last one is the outcome).
  function attemptsPanel(m) {
    if (m.attempts < 2) return null;
    const rows = m.per_attempt.map((a) => el("tr", { class: "attempt-row" + (a.n < m.attempts ? " retried" : ""), "data-attempt": a.n },
      el("td", { class: "num", text: String(a.n) }), el("td", {}, pill(a.st)), el("td", { class: "num", text: "+" + dur(a.s) }),
      el("td", { class: "num", text: dur(a.d) }), el("td", { class: "num", text: dur(a.box) }), el("td", { class: "num", text: String(a.turns) }),
      el("td", { class: "reason", text: a.why || (a.n < m.attempts ? "retried" : "") })));
    const head = el("tr", {}, ["attempt", "status", "started", "took", "box", "turns", "reason"].map((h, i) => el("th", { class: i && i < 6 && i !== 1 ? "num" : "", text: h })));
    return el("div", { class: "panel", id: "attempts" }, el("div", { class: "panel-head" }, el("h2", { text: `Attempts (${m.attempts})` }),
      el("span", { class: "hint", text: "the member was retried; its totals cover every attempt, the back-off between them included" })),
    el("table", { class: "attempts" }, el("thead", {}, head), el("tbody", {}, rows)));
  }

  // The final result as a tree: nested fields readable (long texts as text blocks), each
  // string the page cut naming result.json and the field, loadable in full under `fleet view`.
  function resultPanel(m) {
    const box = el("div", { id: "final-result" });
    const r = m.result;
    if (!r) return el("div", { class: "panel result" }, el("h2", { text: "Final result" }), el("div", { class: "empty", text: "no result (" + m.status + ")" }));
    const cuts = new Map(r.cuts.map(([path, total]) => [path.join("\u0000"), total]));
    const noteFor = (path, pre) => {
      const total = cuts.get(path.join("\u0000"));
      if (total === undefined) return null;
      const field = path.map((k) => (typeof k === "number" ? `[${k}]` : "." + k)).join("").replace(/^\./, "");
      const shown = pre ? pre.textContent.length : 0;
      const note = el("div", { class: "cut" }, "truncated; full text in ", r.file ? fileLink(r.file) : "the member's trace", ` (field ${r.partial || "result"}.${field}, ${shown} of ${total} chars shown)`);
      if (RUN.served && pre && r.file) {
        const btn = el("button", { class: "load-full", text: "load full text" });
        btn.addEventListener("click", async () => {
          btn.disabled = true;
          const resp = await fetch(RUN.lb + r.file);
          if (!resp.ok) { btn.textContent = "not found (" + resp.status + ")"; return; }
          pre.textContent = path.reduce((v, k) => (v == null ? v : v[k]), (await resp.json())[r.partial || "result"]);
          pre.classList.add("full");
          note.replaceChildren("full text from ", fileLink(r.file), ` (field ${r.partial || "result"}.${field})`);
        });
        note.append(" ", btn);
      }
      return note;
    };
    box.append(FleetTree.render(el, r.v, noteFor));
    if (r.partial) {
      const why = `the member ended ${m.status}` + (m.reason ? ": " + m.reason : "") + "; this is what it left, not a finished answer";
      return el("div", { class: "panel result partial", id: "partial-result" }, el("h2", { text: "Partial result" }), el("div", { class: "reason-box", text: why }), box);
    }
    return el("div", { class: "panel result" }, el("h2", { text: "Final result" }), box);
  }

  // What the member was told before anything happened: the system prompt, its tools
  // and its first message (the task, its inputs, loaded memory).
  function promptPanel(m) {
    if (!m.system && !m.first) return null;
    const first = el("pre", { class: "first-message", text: m.first || "" });
    return el("details", { class: "panel", id: "prompt" },
      el("summary", {}, el("h2", { text: "System prompt and first message" })),
      el("h3", { text: "System prompt" }), el("pre", { class: "system-prompt", text: m.system || "(not recorded)" }),
      m.tools && m.tools.length ? el("div", { class: "meta", text: "tools: " + m.tools.join(", ") }) : null,
      el("h3", { text: "First message" }), first, m.first_ref ? cutNote({ tr: m.first_tr, ref: m.first_ref }, m.first.length, 0, first) : null);
  }

  function openTurn(view, turn, attempt, query) {
    const sel = `details.turn[data-turn="${turn}"]` + (attempt ? `[data-attempt="${attempt}"]` : "");
    const node = view.querySelector(sel);
    if (!node) return;
    node.open = true;
    node._fill();
    // The calls inside that hold what was searched for are unfolded too.
    for (const sub of node.querySelectorAll("details.sub")) if (query && sub.textContent.toLowerCase().includes(query)) sub.open = true;
    node.classList.add("found");
    node.scrollIntoView({ block: "center" });
    node.querySelector("summary").focus();
  }

  function openMember(id, push = true, turn = null, attempt = null, query = "") {
    const m = MEMBERS.find((x) => x.id === id);
    if (!m) return;
    if (push) history.pushState(null, "", "#member=" + encodeURIComponent(id));
    document.getElementById("overview").hidden = true;
    const view = document.getElementById("member-view");
    view.hidden = false;
    view.textContent = "";
    view.dataset.member = id;
    const tin = totalIn(m);
    const lastA = m.per_attempt[m.per_attempt.length - 1];
    const stats = [[m.turns, "turns"], [dur(m.duration_s), m.attempts > 1 ? "wall, all attempts" : "wall time"], [dur(m.box_s), "box start-up"],
      ...(m.setup_s ? [[dur(m.setup_s), "setup wait"]] : []),
      ...(m.attempts > 1 ? [[m.attempts, "attempts"], [dur(lastA.d), "last attempt"]] : []), [m.tool_calls, "tool calls"], [m.errors, "errors"],
      [tok(tin), "tokens in"], [tok(m.cache_read_tokens), "cached"], [tok(m.output_tokens), "tokens out"],
      [m.offloads, "offloads"], [m.compactions, "compactions"], ["$" + m.cost_usd.toFixed(3), "cost"]];
    view.append(...[
      el("div", { class: "member-head" }, el("h2", { text: m.id }), pill(m.status), el("span", { class: "meta", text: `${m.kind} · ${m.model} · ${m.node ? "node " + m.node + " · " : ""}${m.dir}` + (m.wave ? ` · wave ${m.wave}` : "") })),
      el("div", { class: "task", text: m.task }),
      m.reason ? el("div", { class: "reason-box", text: m.reason }) : null,
      el("div", { class: "cards" }, stats.map(([v, l]) => el("div", { class: "card" }, el("div", { class: "v", text: String(v) }), el("div", { class: "l", text: l })))),
      attemptsPanel(m),
      el("div", { class: "panel charts" }, contextChart(m), tokenChart(m)),
      m.pre.length ? el("div", { class: "panel" }, el("h3", { text: "Before the first turn" }), m.pre.map(markBlock)) : null,
      promptPanel(m),
      turnsPanel(m),
      resultPanel(m), memoryPanel(m), pagesPanel(m), filesPanel(m)].filter(Boolean));
    crumbs(m.id);
    window.scrollTo(0, 0);
    if (turn !== null && turn !== undefined) openTurn(view, turn, attempt, query);
  }

  function showOverview(push = true) {
    if (push) history.pushState(null, "", "#");
    document.getElementById("member-view").hidden = true;
    document.getElementById("overview").hidden = false;
    crumbs(null);
  }

  function crumbs(id) {
    const nav = document.getElementById("crumbs");
    nav.textContent = "";
    const link = (text, fn) => el("a", { href: "#", text, onclick: (ev) => { ev.preventDefault(); fn(); } });
    nav.append(link("Overview", () => showOverview()));
    if (id) {
      const i = ORDER.findIndex((m) => m.id === id);
      if (i > 0) nav.append(link("← " + ORDER[i - 1].id, () => openMember(ORDER[i - 1].id)));
      if (i < ORDER.length - 1) nav.append(link(ORDER[i + 1].id + " →", () => openMember(ORDER[i + 1].id)));
    }
  }

  // `#member=ID&turn=N[&attempt=A]`: a link to a member, or to one of its turns.
  function route() {
    const params = new URLSearchParams(location.hash.slice(1));
    const id = params.get("member");
    const turn = /^\d+$/.test(params.get("turn") || "") ? Number(params.get("turn")) : null;
    const attempt = /^\d+$/.test(params.get("attempt") || "") ? Number(params.get("attempt")) : null;
    if (id !== null) openMember(id, false, turn, attempt);
    else showOverview(false);
  }

  // The landing view: the question and the report first, then a search over the run.
  const verified = (id) => {
    const m = MEMBERS.find((x) => x.id === id);
    const v = m && m.result && m.result.v && m.result.v.verified;
    return v && typeof v === "object" ? v : null;
  };
  const H = { el, pill, token, verified, fileLink: (p) => fileLink(p) };
  const openFrom = (id, turn, attempt, query) => openMember(id, true, turn, attempt, query);
  const rerunSearch = () => document.getElementById("search-results").replaceChildren(...FleetLanding.search(H, MEMBERS,
    document.getElementById("run-search").value, (id) => shown(MEMBERS.find((m) => m.id === id)), openFrom));
  function landing() {
    document.getElementById("landing").replaceChildren(FleetLanding.report(H, RUN, openFrom));
    const select = document.getElementById("status-filter");
    const counts = {};
    for (const m of MEMBERS) counts[m.status] = (counts[m.status] || 0) + 1;  // the lead too
    select.replaceChildren(el("option", { value: "", text: "all" }), ...Object.keys(counts).sort().map((st) => el("option", { value: st, text: `${st} (${counts[st]})` })));
    select.value = statusFilter;
  }
  function heading() {
    document.getElementById("run-title").textContent = `${RUN.id} · ${RUN.finished ? "finished" : "running"} · ${RUN.dir}`;
  }
  function asksPanel() {
    document.getElementById("asks").replaceChildren(...[FleetLive.asks(H, DATA.live, () => null)].filter(Boolean));
  }

  // New data from the server: everything is drawn again from it; an open member is
  // redrawn only when its data changed, keeping its open turns and the scroll.
  function refresh(next) {
    const before = new Map(MEMBERS.map((m) => [m.id, JSON.stringify(m)]));
    DATA = next; RUN = next.run; MEMBERS = next.members; ORDER = order();
    FleetLanding.forget();
    const infoOpen = document.getElementById("info-panel").open;
    heading(); landing(); cards(); info(); timeline(); table(); asksPanel();
    document.getElementById("info-panel").open = infoOpen;
    if (document.getElementById("run-search").value) rerunSearch();
    const view = document.getElementById("member-view");
    const id = view.dataset.member;
    if (view.hidden || !id) return;
    const now = MEMBERS.find((m) => m.id === id);
    if (!now || before.get(id) === JSON.stringify(now)) return;
    const open = [...view.querySelectorAll("details.turn[open]")].map((d) => [d.dataset.turn, d.dataset.attempt]);
    const y = window.scrollY;
    openMember(id, false);
    for (const [t, a] of open) {
      const node = view.querySelector(`details.turn[data-turn="${t}"][data-attempt="${a}"]`);
      if (node) { node.open = true; node._fill(); }
    }
    window.scrollTo(0, y);
  }

  heading();
  landing();
  (() => {
    let timer = 0;
    document.getElementById("run-search").addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(rerunSearch, 120); });
    const select = document.getElementById("status-filter");
    select.addEventListener("change", () => { statusFilter = select.value; table(); timeline(); rerunSearch(); });
  })();
  asksPanel();
  cards();
  info();
  legend(document.getElementById("tl-legend"), [["var(--model)", "model call"], ["var(--tool)", "tool call"], ["var(--tool-err)", "tool error"],
    ["var(--box)", "box start-up"], ["var(--compact)", "compaction"], ["var(--offload)", "offload"], ["var(--tool-err)", "retried attempt (×)"],
    ["var(--fail)", "failed member"]]);
  timeline();
  table();
  let resizeTimer = 0;
  window.addEventListener("resize", () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(timeline, 150); });
  window.addEventListener("popstate", route);
  route();
  if (DATA.live) FleetLive.follow(DATA.live, () => RUN.finished && !(DATA.live.asks || []).length, refresh);
})();
