"use strict";
// Text written by a model, a page or a box, put into the DOM as text only. A
// bidirectional control character (the "\u202e" that makes text read backwards) is
// kept in the text but shown as a visible mark in a box of its own, so it cannot
// reorder the text around it: a person sees what was written.
const FleetText = (() => {
  const BIDI = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/;
  const BIDI_SPLIT = /([\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069])/;
  function textOf(s) {
    s = String(s);
    if (!BIDI.test(s)) return document.createTextNode(s);
    const frag = document.createDocumentFragment();
    for (const part of s.split(BIDI_SPLIT)) {
      if (!part) continue;
      if (!BIDI.test(part)) { frag.append(part); continue; }
      const mark = document.createElement("span");
      mark.className = "bidi";
      mark.dataset.cp = "U+" + part.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0");
      mark.textContent = part;
      frag.append(mark);
    }
    return frag;
  }
  return { textOf };
})();
