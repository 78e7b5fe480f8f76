"use strict";
// A JSON value as a readable tree: objects and arrays as nested, foldable lists (open
// to depth 2), short scalars inline, multi-line or long strings as their own text block
// (a patch or a test's output reads as text, never as one escaped JSON line). `el` is
// the page's element helper; `noteFor(path, pre)` returns the cut note of a string the
// page truncated (or null), so the tree stays free of page specifics.
const FleetTree = (() => {
  const OPEN_DEPTH = 2;

  function scalar(el, v) {
    const type = v === null ? "null" : typeof v;
    return el("span", { class: "tv t-" + type, text: type === "string" ? v : JSON.stringify(v) });
  }

  function text(el, v, path, noteFor) {
    const pre = el("pre", { class: "tree-text" + (/^diff |^--- /m.test(v) ? " diff" : ""), text: v });
    return el("div", { class: "tree-block" }, pre, noteFor(path, pre));
  }

  function node(el, v, path, depth, noteFor) {
    if (v === null || typeof v !== "object") {
      const long = typeof v === "string" && (v.includes("\n") || v.length > 100 || noteFor(path, null));
      return long ? text(el, v, path, noteFor) : scalar(el, v);
    }
    const entries = Array.isArray(v) ? v.map((x, i) => [i, x]) : Object.entries(v);
    if (!entries.length) return el("span", { class: "tv t-null", text: Array.isArray(v) ? "[]" : "{}" });
    const rows = entries.map(([k, x]) => {
      const kid = node(el, x, [...path, k], depth + 1, noteFor);
      const key = el("span", { class: "tk", text: Array.isArray(v) ? "[" + k + "]" : k + ":" });
      const block = kid.tagName === "DETAILS" || kid.classList.contains("tree-block");
      return el("li", { class: block ? "tree-row nested" : "tree-row", "data-path": [...path, k].join(".") }, key, " ", kid);
    });
    const list = el("ul", { class: "tree" }, rows);
    if (depth === 0) return list;
    const n = entries.length, label = Array.isArray(v) ? `${n} item${n > 1 ? "s" : ""}` : `${n} field${n > 1 ? "s" : ""}`;
    return el("details", { class: "tree-node", open: depth <= OPEN_DEPTH }, el("summary", { class: "tree-sum", text: label }), list);
  }

  return { render: (el, value, noteFor) => node(el, value, [], 0, noteFor || (() => null)) };
})();
