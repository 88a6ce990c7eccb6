// The console's only script: the tree's quick filter and collapse buttons,
// live pages fed by server-sent events, and the session's bind secret its
// forms carry. Pages read without it (reload); actions need it.
"use strict";

function $(sel) { return document.querySelector(sel); }

// ---- the agent tree ----
function setupTree() {
  const tree = $("#tree");
  if (!tree) return;
  const all = (open) => tree.querySelectorAll("details").forEach((d) => { d.open = open; });
  const ex = $("#expand-all"), co = $("#collapse-all");
  if (ex) ex.addEventListener("click", () => all(true));
  if (co) co.addEventListener("click", () => all(false));
  const quick = $("#quick");
  if (!quick) return;
  let timer = 0;
  quick.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => filterTree(tree, quick.value.trim().toLowerCase()), 120);
  });
}

// nodeIDStart is the start of a node id, or all of one: n_ and up to 20
// characters of the ids' alphabet.
const nodeIDStart = /^n_[0-9abcdefghjkmnpqrstvwxyz]{0,20}$/;

// nodeIDPart may be a part of a node id from its middle, its "n_" left
// behind by a cut cell or a wrapped line: six to twenty characters of the
// ids' alphabet.
const nodeIDPart = /^[0-9abcdefghjkmnpqrstvwxyz]{6,20}$/;

// filterTree shows the nodes matching q and their ancestors, opening the
// path to each match; an empty q shows everything again. A q shaped like
// the start of a node id (or a whole one) matches the ids that begin with
// it alone: an agent chooses its children's names and labels, and a
// rogue's child named worker-2 and labelled with worker-2's id was found
// by that id as worker-2 was, and by its start as its child named after
// that start was. A q that may be a part of an id from its middle and is
// one of a shown node's id matches the ids that hold it alone: the
// rogue's child named after that part, or labelled with the whole id, is
// not found by it.
function filterTree(tree, q) {
  const items = tree.querySelectorAll("li.n");
  if (!q) {
    items.forEach((li) => { li.hidden = false; li.classList.remove("hit"); });
    return;
  }
  const idPart = nodeIDPart.test(q) && [...items].some((li) => li.dataset.id.includes(q));
  items.forEach((li) => { li.hidden = true; li.classList.remove("hit"); });
  items.forEach((li) => {
    const text = (li.dataset.name + " " + li.dataset.id + " " + li.dataset.labels).toLowerCase();
    if (nodeIDStart.test(q) ? !li.dataset.id.startsWith(q) : idPart ? !li.dataset.id.includes(q) : !text.includes(q)) return;
    li.classList.add("hit");
    for (let p = li; p && p !== tree; p = p.parentElement) {
      if (p.tagName === "LI") p.hidden = false;
      if (p.tagName === "DETAILS" && p !== li.firstElementChild) p.open = true;
    }
  });
}

// ---- a termination in progress ----
function setupTermination() {
  const box = $("#termination");
  if (!box || !window.EventSource) return;
  if (box.dataset.state === "terminated" && $("#record-link").getAttribute("href")) return;
  const es = new EventSource("/ui/terminations/" + encodeURIComponent(box.dataset.id) + "/events");
  es.addEventListener("termination", (ev) => showTermination(box, JSON.parse(ev.data)));
  es.addEventListener("end", () => { es.close(); $("#term-live").textContent = "Finished."; });
  es.addEventListener("failed", (ev) => { es.close(); $("#term-live").textContent = "Live updates stopped: " + JSON.parse(ev.data).error; });
  es.onerror = () => { if (es.readyState === EventSource.CLOSED) $("#term-live").textContent = "Live updates stopped; reload the page."; };
}

function showTermination(box, t) {
  box.dataset.state = t.state;
  const st = $("#term-state");
  st.textContent = t.state;
  st.className = "badge t-" + t.state;
  $("#term-escalated").hidden = !t.escalated;
  let seen = true;
  document.querySelectorAll("#phases li").forEach((li) => {
    li.classList.remove("current", "done");
    if (li.dataset.phase === t.state) { li.classList.add("current"); seen = false; } else if (seen) li.classList.add("done");
  });
  document.querySelectorAll("[data-field]").forEach((el) => {
    const v = t[el.dataset.field];
    if (v !== undefined) el.textContent = v;
  });
  const bar = $("#term-confirmed");
  bar.max = t.nodes_total; bar.value = t.confirmations;
  if (t.record_id) {
    const a = $("#record-link");
    a.href = "/ui/records/" + encodeURIComponent(t.record_id);
    a.textContent = t.record_id;
    $("#term-record").hidden = false;
  }
}

// ---- a rollout: its counts live, reload when it moved ----
// The counts are written from the event: the agents move them (a child
// labelled like the agents being replaced is one more to replace), and a
// reload at each move cost the operator two requests for one of the
// agent's. The version is the rest of what the page draws (its state,
// reason and batches): when it moved the page reloads, unless the
// operator has typed into it: a reload would wipe the reason being typed
// at every move. Then the page says it moved (a form still names the
// state it showed, so an action on a rollout that moved is refused as
// stale).
function setupRollout() {
  const box = $("#rollout");
  if (!box || !window.EventSource) return;
  const es = new EventSource("/ui/rollouts/" + encodeURIComponent(box.dataset.id) + "/events");
  es.addEventListener("rollout", (ev) => {
    const m = JSON.parse(ev.data);
    const counts = m.counts || {};
    box.querySelectorAll("[data-count]").forEach((el) => {
      const v = counts[el.dataset.count];
      if (v !== undefined) el.textContent = String(v);
    });
    const bar = box.querySelector("#rollout-counts progress");
    if (bar && counts.total !== undefined) { bar.max = counts.total; bar.value = counts.done; }
    if (m.version === box.dataset.version) return;
    es.close();
    const typed = [...box.querySelectorAll("input, textarea")].some((el) => el.value !== el.defaultValue);
    if (!typed) { location.reload(); return; }
    $("#rollout-moved").hidden = false;
  });
}

// ---- the revocation feed ----
function setupFeed() {
  const feed = $("#feed");
  if (!feed || !window.EventSource) return;
  const body = feed.querySelector("tbody");
  const es = new EventSource("/ui/revocations/events");
  // Each (re)connection opens with the newest tombstones again: start over.
  es.addEventListener("open", () => { while (body.rows.length) body.deleteRow(0); });
  es.addEventListener("tombstone", (ev) => {
    const t = JSON.parse(ev.data);
    const tr = document.createElement("tr");
    const cell = (text, code) => {
      const td = document.createElement("td");
      const el = code ? document.createElement("a") : td;
      if (code) { el.href = "/ui/grants/" + encodeURIComponent(text); el.className = "id"; td.appendChild(el); }
      el.textContent = text;
      tr.appendChild(td);
    };
    cell(String(t.sequence)); cell(t.grant_id, true); cell(t.revoked_at); cell(t.revoked_by || "—"); cell(t.reason || "");
    body.insertBefore(tr, body.firstChild);
    while (body.rows.length > 500) body.deleteRow(body.rows.length - 1); // feedRows (views.go)
    // The older tombstones (those the page dropped, or skipped when it
    // fell behind) are a page away.
    const older = $("#feed-older");
    const oldest = Number(body.rows[body.rows.length - 1].cells[0].textContent);
    older.href = "/ui/revocations?before=" + oldest;
    older.hidden = oldest <= 1;
  });
  es.addEventListener("head", (ev) => {
    const h = JSON.parse(ev.data);
    $("#feed-head").textContent = h.head;
    $("#feed-time").textContent = h.server_time;
    $("#feed-status").textContent = "Live.";
  });
  es.addEventListener("failed", (ev) => { es.close(); $("#feed-status").textContent = "Stopped: " + JSON.parse(ev.data).error; });
}

// ---- the session's bind secret ----
// The first page the sign-in leads to carries it, and no later page
// does; it is kept in this origin's localStorage (no page of another port
// of the console's host reads it, though the browser sends such a page's
// server the session cookie) and added to every form posted, as the
// console's actions require (console.go, action).
const bindKey = "tether-console-bind";

function setupBind() {
  const meta = document.querySelector('meta[name="tether-bind"]');
  if (meta) {
    localStorage.setItem(bindKey, meta.content);
    meta.remove();
  }
  document.addEventListener("submit", (ev) => {
    const form = ev.target;
    if (form.method !== "post" || form.elements.namedItem("bind")) return;
    const input = document.createElement("input");
    input.type = "hidden";
    input.name = "bind";
    input.value = localStorage.getItem(bindKey) || "";
    form.appendChild(input);
    if (form.getAttribute("action") === "/ui/signout") localStorage.removeItem(bindKey);
  });
}

document.addEventListener("DOMContentLoaded", () => {
  setupBind();
  setupTree();
  setupTermination();
  setupRollout();
  setupFeed();
});
