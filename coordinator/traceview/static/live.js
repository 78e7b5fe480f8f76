"use strict";
// Following a run under `fleet view`: the page asks the server for the run's data when
// the run's files changed (`data?since=STAMP`, a 204 when nothing did) and hands it to
// `onData`; and the asks waiting on a person, each answerable here. An answer is posted
// with the run's token and the sha256 of the text shown, so the server records it only
// if the ask is still what this page showed. `h` is the page's helpers ({el, fileLink}).
const FleetLive = (() => {
  const RUNNING_MS = 1500, IDLE_MS = 5000;

  function follow(live, isFinished, onData) {
    let stamp = live.stamp;
    async function tick() {
      try {
        const resp = await fetch(live.api + "data?since=" + encodeURIComponent(stamp), { cache: "no-store" });
        if (resp.status === 200) {
          const next = await resp.json();
          stamp = next.live.stamp;
          onData(next);
        }
        document.body.dataset.live = "on";
      } catch (e) {
        document.body.dataset.live = "lost";  // the server stopped; keep what is shown
      }
      setTimeout(tick, isFinished() ? IDLE_MS : RUNNING_MS);
    }
    setTimeout(tick, RUNNING_MS);
  }

  async function post(live, ask, answer, say) {
    say("sending…");
    try {
      const resp = await fetch(live.api + "answer", {
        method: "POST", headers: { "Content-Type": "application/json" }, cache: "no-store",
        body: JSON.stringify({ id: ask.id, answer, sha256: ask.sha256, token: live.token }),
      });
      const text = await resp.text();
      let msg = text;
      try { const j = JSON.parse(text); msg = j.told || j.error || text; } catch (e) { /* plain text refusal */ }
      say((resp.ok ? "answered: " : "not taken: ") + msg);
      return resp.ok;
    } catch (e) {
      say("not sent: the server did not answer");
      return false;
    }
  }

  // The panel of asks (null when none waits): what is asked, shown whole as the
  // terminal shows it, its sha256, and yes / no / always.
  function asks(h, live, answered) {
    const list = (live && live.asks) || [];
    if (!list.length) return null;
    const rows = list.map((a) => {
      const status = h.el("div", { class: "meta ask-status" });
      const say = (t) => status.replaceChildren(document.createTextNode(t));
      const buttons = ["yes", "no", "always"].map((word) => h.el("button", { class: "ask-" + word, "data-answer": word, text: word,
        onclick: async () => { for (const b of buttons) b.disabled = true; if (await post(live, a, word, say)) answered(); else for (const b of buttons) b.disabled = false; } }));
      return h.el("div", { class: "ask", "data-ask": a.id },
        h.el("pre", { class: "ask-text", text: a.text }),
        a.review ? h.el("div", { class: "meta" }, "review the whole argument: ", h.fileLink(a.review)) : null,
        h.el("div", { class: "meta mono", text: "ask " + a.id + " · sha256 of what is shown " + a.sha256 }),
        h.el("div", { class: "toolbar" }, buttons), status);
    });
    return h.el("div", { class: "panel asks", id: "asks-panel" },
      h.el("div", { class: "panel-head" }, h.el("h2", { text: `Waiting for you (${list.length})` }),
        h.el("span", { class: "hint", text: "a member's tool call its policy asks a person about; the answer goes where fleet approve's does" })),
      rows);
  }

  return { follow, asks };
})();
