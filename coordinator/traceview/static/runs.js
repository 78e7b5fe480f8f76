"use strict";
// `fleet view` with no run: every run under the runs directory, newest first, searchable,
// each linking to its own live page; the list follows new runs as they start.
(function () {
  const DATA = JSON.parse(document.getElementById("fleet-data").textContent);
  let RUNS = DATA.runs;
  function el(tag, attrs, ...kids) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.replaceChildren(FleetText.textOf(v));
      else node.setAttribute(k, v);
    }
    for (const kid of kids.flat()) if (kid !== null && kid !== undefined) node.append(typeof kid === "string" ? FleetText.textOf(kid) : kid);
    return node;
  }
  const token = (s) => String(s).replace(/[^A-Za-z0-9_-]/g, "_");
  function dur(s) {
    if (s >= 3600) return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
    if (s >= 60) return Math.floor(s / 60) + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s";
    return s.toFixed(1) + "s";
  }
  const when = (ts) => (ts ? new Date(ts * 1000).toLocaleString() : "?");
  const search = document.getElementById("runs-search");

  function draw() {
    const q = search.value.trim().toLowerCase();
    const shown = RUNS.filter((r) => !q || [r.id, r.name, r.question, r.status].join("\n").toLowerCase().includes(q));
    const head = el("tr", {}, ["run", "status", "ok", "started", "wall", "question or job", "cost", "asks"].map((t, i) => el("th", { class: [2, 4, 6, 7].includes(i) ? "num" : "", text: t })));
    const rows = shown.map((r) => el("tr", { "data-run": r.id, "data-status": r.status },
      // The link is built here from the id, percent-encoded: it can only name a run route.
      el("td", {}, el("a", { class: "mono run-link", href: "/run/" + encodeURIComponent(r.id) + "/", text: r.id })),
      el("td", {}, el("span", { class: "pill st-" + token(r.status), text: r.status })),
      el("td", { class: "num", text: `${r.ok}/${r.members}` }),
      el("td", { text: when(r.started) }),
      el("td", { class: "num", text: dur(r.duration) }),
      el("td", { class: "reason", text: r.question || r.name }),
      el("td", { class: "num", text: r.cost === null ? "?" : "$" + r.cost.toFixed(3) }),
      el("td", { class: "num", text: r.asks ? String(r.asks) : "" })));
    document.getElementById("runs-count").textContent = `${shown.length} of ${RUNS.length} runs under ${DATA.root}`;
    document.getElementById("runs").replaceChildren(el("thead", {}, head), el("tbody", {}, rows));
  }

  async function poll() {
    try {
      const resp = await fetch("/runs.json", { cache: "no-store" });
      if (resp.ok) { RUNS = await resp.json(); draw(); }
    } catch (e) { /* the server stopped: keep the list shown */ }
    setTimeout(poll, 2000);
  }
  search.addEventListener("input", draw);
  draw();
  setTimeout(poll, 2000);
})();
