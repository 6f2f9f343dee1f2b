/* hermes-session-guard: the "Compactions" tab of Hermes's dashboard.
   Written by `hermes-session-guard enable`. It lists what GET
   /api/plugins/session-guard/compactions returns: every recorded compaction, newest
   first (ids, outcomes, counts, times; never message text), one session's with the
   filter. "Open" on a compaction shows the original turns it replaced, read from its
   snapshot by GET /api/plugins/session-guard/compaction (secrets masked as in hand-off
   packets); the address ?session=<id>&op=<op id> opens one directly. React through the
   dashboard's plugin SDK; no build step. */
(function () {
  "use strict";
  var SDK = window.__HERMES_PLUGIN_SDK__;
  var PLUGINS = window.__HERMES_PLUGINS__;
  if (!SDK || !PLUGINS) { return; }
  var h = SDK.React.createElement;
  var hooks = SDK.hooks;
  var C = SDK.components || {};
  var ROUTE = "/api/plugins/session-guard/compactions";
  var OPEN_ROUTE = "/api/plugins/session-guard/compaction";
  var COLUMNS = [
    ["open", ""], ["started_at", "Started"], ["session_id", "Session"], ["op_id", "Op"], ["outcome", "Outcome"],
    ["messages", "Messages"], ["summary_ms", "Summary call"], ["duration_ms", "Total"],
    ["snapshot_id", "Snapshot"], ["reason", "Reason"]
  ];
  var CELL = { padding: "0.3em 0.6em", textAlign: "left", verticalAlign: "top", overflowWrap: "anywhere" };
  var HEAD = { padding: "0.3em 0.6em", textAlign: "left", whiteSpace: "nowrap" };

  function linked() {  // ?session=...&op=... of the tab's address, when there is one
    var search = window.location && window.location.search;
    if (!search || typeof URLSearchParams === "undefined") { return {}; }
    var params = new URLSearchParams(search);
    return {session: (params.get("session") || "").trim(), op: (params.get("op") || "").trim()};
  }

  function seconds(ms) { return ms === null || ms === undefined ? "-" : (ms / 1000).toFixed(1) + " s"; }

  function cell(record, key, open) {
    if (key === "open") {
      return record.snapshot_id ? h("button", { type: "button", className: "session-guard-open",
        "data-op": record.op_id, style: { textDecoration: "underline", cursor: "pointer", whiteSpace: "nowrap" },
        onClick: function () { open(record); } }, "Open") : "";
    }
    if (key === "messages") {
      var after = record.messages_after === null || record.messages_after === undefined ? "-" : record.messages_after;
      return String(record.messages_before) + " -> " + String(after);
    }
    if (key === "summary_ms" || key === "duration_ms") { return seconds(record[key]); }
    var value = record[key];
    return value === null || value === undefined ? "" : String(value);
  }

  function table(records, open) {
    if (!records.length) { return h("p", null, "No compaction recorded yet."); }
    return h("div", { style: { overflowX: "auto" } },
      h("table", { className: "session-guard-compactions", style: { width: "100%", fontSize: "0.85em",
                                                                     borderCollapse: "collapse" } },
        h("thead", null, h("tr", null, COLUMNS.map(function (c) { return h("th", { key: c[0], style: HEAD }, c[1]); }))),
        h("tbody", null, records.map(function (r) {
          return h("tr", { key: r.op_id, style: { borderTop: "1px solid rgba(127,127,127,0.3)" } },
            COLUMNS.map(function (c) { return h("td", { key: c[0], style: CELL }, cell(r, c[0], open)); }));
        }))));
  }

  function originals(opened, close) {
    if (!opened) { return null; }
    var op = opened.op, body = opened.body;
    var head = h("h3", { style: { fontWeight: "bold" } }, "Compaction " + op + ": the original turns it replaced");
    var inner;
    if (opened.error) {
      inner = h("p", null, "Could not open the compaction: " + opened.error);
    } else if (!body) {
      inner = h("p", null, "Loading...");
    } else if (!body.compaction) {
      inner = h("p", null, "No compaction " + op + " is recorded for this session.");
    } else if (!body.turns || !body.turns.length) {
      inner = h("p", null, "This compaction kept no snapshot of its original turns.");
    } else {
      inner = h("div", null,
        h("p", null, "Turns " + body.first_turn + "-" + body.last_turn + " of snapshot " +
          body.compaction.snapshot_id + " (" + body.turns.length + " messages; secrets masked as in hand-off packets)."),
        h("ol", { className: "session-guard-turns", style: { listStyle: "none", padding: 0 } },
          body.turns.map(function (t) {
            return h("li", { key: t.turn, "data-turn": t.turn,
                             style: { border: "1px solid rgba(127,127,127,0.3)", margin: "0 0 0.5em", padding: "0.4em" } },
              h("strong", null, "Turn " + t.turn + " · " + t.role),
              h("pre", { style: { whiteSpace: "pre-wrap", margin: "0.2em 0 0", maxHeight: "7.5em", overflowY: "auto",
                                  fontSize: "0.85em" } }, t.content));
          })));
    }
    return h("section", { className: "session-guard-originals", "data-op": op, style: { marginTop: "1.5em" } },
      head, h("button", { type: "button", onClick: close }, "Close"), inner);
  }

  function Page() {
    var link = linked();
    var data = hooks.useState(null), error = hooks.useState(null), session = hooks.useState(link.session || "");
    var opened = hooks.useState(null);

    function open(record) {
      var op = record.op_id;
      opened[1]({ op: op });
      SDK.fetchJSON(OPEN_ROUTE + "?session=" + encodeURIComponent(record.session_id) + "&op=" + encodeURIComponent(op))
        .then(function (body) { opened[1]({ op: op, body: body }); })
        .catch(function (e) { opened[1]({ op: op, error: String((e && e.message) || e) }); });
    }

    hooks.useEffect(function () {
      var query = session[0] ? "?session=" + encodeURIComponent(session[0]) : "";
      SDK.fetchJSON(ROUTE + query).then(function (body) {
        error[1](null); data[1](body);
        var wanted = (body.compactions || []).filter(function (r) { return link.op && r.op_id === link.op; });
        if (wanted.length) { open(wanted[0]); }
      }).catch(function (e) { error[1](String((e && e.message) || e)); });
    }, [session[0]]);
    var body = error[0] ? h("p", null, "Could not load the compactions: " + error[0])
      : !data[0] ? h("p", null, "Loading...")
      : data[0].guard !== "on" ? h("p", null, "The session guard is not on in this dashboard process.")
      : table(data[0].compactions || [], open);
    var Card = C.Card || "div", Header = C.CardHeader || "div", Title = C.CardTitle || "h2";
    var Content = C.CardContent || "div";
    return h(Card, null,
      h(Header, null, h(Title, null, "Compactions")),
      h(Content, null,
        h("input", { placeholder: "session id (all sessions when empty)", value: session[0],
                     style: { width: "28em", maxWidth: "100%", padding: "0.3em", marginBottom: "0.8em" },
                     onChange: function (e) { session[1](e.target.value.trim()); } }),
        body,
        originals(opened[0], function () { opened[1](null); })));
  }

  PLUGINS.register("session-guard", Page);
})();
