// Chat page glue for the htmx ws extension (no build step).
// - On every (re)connect, ask the server for the turns after the last one shown.
// - Give each message an id so a resend after a reconnect is never stored twice.
// - Send stays enabled while a reply is being written: the server stores a message sent
//   meanwhile at once and answers it next (and a crisis at once, whatever is in flight).
// - Never lose what the person typed: a draft survives a reload; a sent message is kept
//   (in sessionStorage too) until the server shows it in the transcript. If it is refused
//   or the connection drops first, its text goes back into the box with a notice, and
//   sending that same text again reuses its id (the server stores a message once per id).
(function () {
  "use strict";

  var chat = document.querySelector("section.chat[data-session]");
  if (!chat) { return; }
  var KEY = "psyevo.chat." + chat.dataset.session;
  var connected = false;

  function box() { return document.getElementById("message"); }

  function load(name) {
    try { return JSON.parse(window.sessionStorage.getItem(KEY + "." + name) || "null"); }
    catch (e) { return null; }
  }

  function save(name, value) {
    try {
      if (value === null || value === "") { window.sessionStorage.removeItem(KEY + "." + name); }
      else { window.sessionStorage.setItem(KEY + "." + name, JSON.stringify(value)); }
    } catch (e) { /* storage full or disabled: the page still works, without the copy */ }
  }

  function notice(text) {
    var el = document.getElementById("connection");
    if (el) { el.textContent = text; el.hidden = !text; }
  }

  function lastSeq() {
    var turns = document.querySelectorAll("#transcript article[data-seq]");
    var max = -1;
    turns.forEach(function (el) { max = Math.max(max, parseInt(el.dataset.seq, 10)); });
    return max;
  }

  function dedupe() {
    var seen = {};
    document.querySelectorAll("#transcript article[id]").forEach(function (el) {
      if (seen[el.id]) { el.remove(); } else { seen[el.id] = true; }
    });
    // A safe reply sent from memory while storage was down has no seq (turn--1); once
    // its stored copy arrives (a resync after storage is back), show that one only.
    document.querySelectorAll("#transcript article#turn--1").forEach(function (early) {
      var text = early.querySelector(".text");
      var copies = document.querySelectorAll("#transcript article.turn-counselor:not(#turn--1) .text");
      for (var i = 0; i < copies.length; i++) {
        if (text && copies[i].textContent === text.textContent) { early.remove(); return; }
      }
    });
  }

  function newId() {
    if (window.crypto && window.crypto.randomUUID) { return window.crypto.randomUUID(); }
    return String(Date.now()) + "-" + String(Math.random()).slice(2);
  }

  function stored(pending) {
    var turns = document.querySelectorAll("#transcript article[data-msg-id]");
    for (var i = 0; i < turns.length; i++) {
      if (turns[i].dataset.msgId === pending.id) { return true; }
    }
    return false;
  }

  // Put an unacknowledged message back where the person can see and resend it. Text they
  // typed since stays: the old message goes first, so nothing is overwritten.
  // Once per message: later frames must not put it back again after the person edits it.
  function restore(pending, why) {
    var el = box();
    if (pending.returned) { return; }
    if (el && el.value !== pending.text) {
      el.value = el.value.trim() ? pending.text + "\n\n" + el.value : pending.text;
      save("draft", el.value);
    }
    pending.returned = why;
    save("pending", pending);
  }

  function setBusy(text) {
    var status = document.getElementById("status");
    if (!status) { return; }
    status.innerHTML = "";
    if (text) {
      var p = document.createElement("p");
      p.className = "status busy";
      p.textContent = text;
      status.appendChild(p);
    }
  }


  // On load: the transcript the server rendered may already hold the pending message.
  (function onLoad() {
    var pending = load("pending");
    if (pending && stored(pending)) { save("pending", null); pending = null; }
    var el = box();
    var draft = load("draft");
    if (el && draft && !el.value) { el.value = draft; }
    if (pending) {
      pending.returned = null;
      restore(pending, "reload");
      notice("Your last message may not have reached the counselor. It is in the box below: press Send to send it.");
    }
    if (el) { el.addEventListener("input", function () { save("draft", el.value); }); }
  })();

  document.addEventListener("htmx:wsOpen", function (evt) {
    connected = true;
    notice("");
    // A reply being written when the socket dropped may have finished meanwhile: the
    // resync brings its turn but no status, so drop a stale "writing…"; a reply still in
    // progress sends its next frames to this socket too.
    var stale = document.querySelector("#status .busy");
    if (stale) { stale.remove(); }
    var socket = evt.detail.socketWrapper;
    socket.send(JSON.stringify({ type: "resync", after_seq: lastSeq() }));
    // A message sent just before the drop may never have arrived: send it again with its
    // id (harmless if it was stored), unless it waits in the extension's own queue.
    var pending = load("pending");
    var queued = (socket.queue || []).some(function (item) {
      return pending && item.message.indexOf(pending.id) >= 0;
    });
    if (pending && !queued && pending.returned !== "refused") {
      socket.send(JSON.stringify({ type: "message", text: pending.text, client_msg_id: pending.id }));
    }
  });

  document.addEventListener("htmx:wsClose", function () {
    connected = false;
    var pending = load("pending");
    if (pending && !stored(pending)) {
      restore(pending, "dropped");
      notice("The connection was lost. Your message is kept in the box and will be sent when the connection is back.");
    } else {
      notice("The connection was lost. Reconnecting…");
    }
    var stale = document.querySelector("#status .busy");
    if (stale) { stale.remove(); }
  });

  document.addEventListener("htmx:wsConfigSend", function (evt) {
    var params = evt.detail.parameters;
    // A "Send again" button carries its message's id and text: keep both (the server
    // stores a message once per id) and leave whatever is being typed in the box.
    if (params.type !== "message" || params.client_msg_id) { return; }
    var pending = load("pending");
    var text = String(params.text || "");
    params.client_msg_id = pending && pending.text === text ? pending.id : newId();
    save("pending", { id: params.client_msg_id, text: text });
    var el = box();
    if (el) { el.value = ""; }
    save("draft", null);
    if (connected) {
      setBusy("Sending your message…");
    } else {
      restore(load("pending"), "offline");
      notice("You are not connected. Your message is kept in the box and will be sent when the connection is back.");
    }
  });

  document.addEventListener("htmx:wsAfterMessage", function () {
    dedupe();
    var pending = load("pending");
    if (pending && stored(pending)) {
      save("pending", null);
      var el = box();
      if (el && el.value === pending.text) { el.value = ""; save("draft", null); }
    } else if (pending && document.querySelector("#status .error[data-code]")) {
      restore(pending, "refused");  // refused before it was stored: they keep their words
    }
    var pendingText = document.getElementById("pending-text");
    if (pendingText) { pendingText.scrollIntoView({ block: "nearest" }); }
  });
})();
