// Chat page glue for the htmx ws extension (no build step).
// - On every (re)connect, ask the server for the turns after the last one shown.
// - Give each message an id so a resend after a reconnect is never stored twice.
// - Keep the Send button disabled while a reply is being written.
(function () {
  "use strict";

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
  }

  function newId() {
    if (window.crypto && window.crypto.randomUUID) { return window.crypto.randomUUID(); }
    return String(Date.now()) + "-" + String(Math.random()).slice(2);
  }

  document.addEventListener("htmx:wsOpen", function (evt) {
    // A reply being written when the socket dropped may have finished meanwhile: the
    // resync brings its turn but no status, so drop a stale "writing…" (else Send would
    // stay disabled for good). A reply still in progress answers a new message "busy".
    var stale = document.querySelector("#status .busy");
    if (stale) { stale.remove(); }
    var send = document.getElementById("send");
    if (send) { send.disabled = false; }
    evt.detail.socketWrapper.send(JSON.stringify({ type: "resync", after_seq: lastSeq() }));
  });

  document.addEventListener("htmx:wsConfigSend", function (evt) {
    var params = evt.detail.parameters;
    // A "Send again" button carries its message's id and text: keep both (the server
    // stores a message once per id) and leave whatever is being typed in the box.
    if (params.type === "message" && !params.client_msg_id) {
      params.client_msg_id = newId();
      var box = document.getElementById("message");
      if (box) { box.value = ""; }
    }
  });

  document.addEventListener("htmx:wsAfterMessage", function () {
    dedupe();
    var busy = document.querySelector("#status .busy") !== null;
    var send = document.getElementById("send");
    if (send) { send.disabled = busy; }
    var pending = document.getElementById("pending-text");
    if (pending) { pending.scrollIntoView({ block: "nearest" }); }
  });
})();
