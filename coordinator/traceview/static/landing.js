"use strict";
// The landing view's top: what a person looks for first - the job's question and the
// run's report (its findings citing members, what running code verified, what stayed
// open) - and a search over every member's turns and result. `h` is the page's helpers
// ({el, pill, token, verified(member): its result's verified run or null}); `open(id, turn, attempt, query)` opens a member (at a turn, the query's
// places unfolded), so this file
// stays free of page state.
const FleetLanding = (() => {
  function cite(h, c, open) {
    const label = c.member + (c.claim === null || c.claim === undefined ? "" : "#" + c.claim) + (c.wave ? " · wave " + c.wave : "");
    return h.el("button", { class: "cite", title: c.url || "", "data-member": c.member, text: label, onclick: () => open(c.member) });
  }

  // A check, and beside it what ran and what it printed (the checking member's
  // verified run, as its result holds it), folded.
  function checkLine(h, k, open) {
    const ran = k.command ? `\`${k.command}\` exit ${k.exit_code}` : "nothing ran";
    const v = h.verified(k.member);
    const session = v ? h.el("details", { class: "check-session" }, h.el("summary", { text: "what ran and its output" }),
      h.el("pre", { class: "session", text: "$ " + String(v.command || k.command || "") + "\n" + String(v.output_tail || "(no output recorded)") })) : null;
    return h.el("div", { class: "check v-" + h.token(k.verdict), "data-verdict": k.verdict },
      h.el("b", { text: k.verdict }), " by ", h.el("button", { class: "cite", text: k.member, onclick: () => open(k.member) }),
      ` (wave ${k.wave}): ${ran}` + (k.detail ? " - " + k.detail : ""), session);
  }

  // The question and the report, as report.json has them.
  function report(h, run, open) {
    const parts = [];
    if (run.question) parts.push(h.el("div", { class: "question" }, h.el("div", { class: "l", text: "Question" }), h.el("div", { class: "q", text: run.question })));
    const r = run.report;
    if (!r) {
      parts.push(h.el("div", { class: "empty", text: run.finished ? "No report was written for this run." : "The report is written when the run ends." }));
      return h.el("div", { class: "panel", id: "report" }, parts);
    }
    const who = run.lead ? "Written by the lead" : "Analyst";
    const label = r.offline ? `${r.analyst} (deterministic, no model)` : r.analyst;
    parts.push(h.el("div", { class: "panel-head" }, h.el("h2", { text: "Report" }),
      h.el("span", { class: "hint", text: `${who}: ${label}` + (r.lead && r.lead !== "ok" ? ` · the lead ended ${r.lead}` : "") }),
      r.file ? h.el("a", { class: "path", href: run.lb + r.file, target: "_blank", text: r.file }) : null));
    parts.push(h.el("p", { class: "summary", text: r.summary || "" }));
    const checks = r.checks || [];
    if ((r.claims || []).length) {
      const items = r.claims.map((c) => {
        const cited = new Set((c.citations || []).map((x) => x.member + "#" + x.claim));
        const mine = checks.filter((k) => cited.has(k.claim_member + "#" + k.claim));
        return h.el("li", {}, h.el("span", { class: "claim-text", text: c.text }), " ",
          (c.citations || []).length ? (c.citations || []).map((x) => cite(h, x, open)) : h.el("span", { class: "badge b-error", text: "uncited" }),
          mine.map((k) => checkLine(h, k, open)));
      });
      const more = r.claims_total > r.claims.length ? h.el("div", { class: "meta", text: `${r.claims_total - r.claims.length} more in report.md` }) : null;
      parts.push(h.el("h3", { text: `Findings (${r.claims_total})` }), h.el("ol", { class: "findings" }, items), more);
    }
    if (checks.length) parts.push(h.el("h3", { text: "Checked by running code" }), h.el("div", { class: "checks" }, checks.map((k) => checkLine(h, k, open))));
    if ((r.open_questions || []).length) parts.push(h.el("h3", { text: "Open questions" }), h.el("ul", { class: "open-questions" }, r.open_questions.map((q) => h.el("li", { text: q }))));
    if ((r.failed || []).length) parts.push(h.el("h3", { text: "Did not end ok" }), h.el("ul", {}, r.failed.map((f) => h.el("li", {}, h.el("button", { class: "cite", text: f.member, onclick: () => open(f.member) }), ` ${f.status}: ${f.reason}`))));
    return h.el("div", { class: "panel", id: "report" }, parts);
  }

  // Every text of every member, one entry per turn (plus task and result), built once.
  function index(members) {
    const out = [];
    for (const m of members) {
      out.push({ m: m.id, where: "task", text: (m.task || "") + "\n" + (m.first || "") });
      for (const t of m.turns_detail) {
        const texts = [...t.m.map((c) => c.x || ""), ...t.t.map((x) => `${x.n} ${x.in} ${x.out}`), ...t.k.map((k) => k.x || "")];
        out.push({ m: m.id, turn: t.n, attempt: t.a, where: "turn " + t.n, text: texts.join("\n") });
      }
      if (m.result) out.push({ m: m.id, where: "result", text: JSON.stringify(m.result.v) });
      if (m.reason) out.push({ m: m.id, where: "reason", text: m.reason });
    }
    for (const e of out) e.low = e.text.toLowerCase();
    return out;
  }

  function snippet(text, at, len) {
    const from = Math.max(0, at - 50), to = Math.min(text.length, at + len + 70);
    return (from ? "…" : "") + text.slice(from, to).replace(/\s+/g, " ") + (to < text.length ? "…" : "");
  }

  // Matches of `query` in the members `shown` lets through, as buttons that open the place.
  function search(h, members, query, shown, open) {
    const q = query.trim().toLowerCase();
    if (!q) return [];
    const entries = (search.cache = search.cache || index(members));
    const hits = entries.filter((e) => shown(e.m) && e.low.includes(q));
    const rows = hits.slice(0, 60).map((e) => h.el("button", { class: "hit", "data-member": e.m, "data-where": e.where, onclick: () => open(e.m, e.turn, e.attempt, q) },
      h.el("span", { class: "mono", text: e.m }), h.el("span", { class: "meta", text: " · " + e.where + " · " }), snippet(e.text, e.low.indexOf(q), q.length)));
    const whom = new Set(hits.map((e) => e.m)).size;
    const head = h.el("div", { class: "meta", id: "hit-count", text: `${hits.length} match${hits.length === 1 ? "" : "es"} in ${whom} member${whom === 1 ? "" : "s"}` + (hits.length > rows.length ? ` (first ${rows.length} shown)` : "") });
    return [head, ...rows];
  }

  // The run's data changed (a live page): the next search indexes it again.
  const forget = () => { search.cache = null; };

  return { report, search, forget };
})();
