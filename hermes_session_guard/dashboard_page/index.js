/* hermes-session-guard: the "Compactions" tab of Hermes's dashboard.
   Written by `hermes-session-guard enable`. It lists what GET
   /api/plugins/session-guard/compactions returns: every recorded compaction, newest
   first (ids, outcomes, counts, times; never message text), one session's with the
   filter. React through the dashboard's plugin SDK; no build step. */
(function () {
  "use strict";
  var SDK = window.__HERMES_PLUGIN_SDK__;
  var PLUGINS = window.__HERMES_PLUGINS__;
  if (!SDK || !PLUGINS) { return; }
  var h = SDK.React.createElement;
  var hooks = SDK.hooks;
  var C = SDK.components || {};
  var ROUTE = "/api/plugins/session-guard/compactions";
  var COLUMNS = [
    ["started_at", "Started"], ["session_id", "Session"], ["op_id", "Op"], ["outcome", "Outcome"],
    ["messages", "Messages"], ["summary_ms", "Summary call"], ["duration_ms", "Total"],
    ["snapshot_id", "Snapshot"], ["reason", "Reason"]
  ];

  function seconds(ms) { return ms === null || ms === undefined ? "-" : (ms / 1000).toFixed(1) + " s"; }

  function cell(record, key) {
    if (key === "messages") {
      var after = record.messages_after === null || record.messages_after === undefined ? "-" : record.messages_after;
      return String(record.messages_before) + " -> " + String(after);
    }
    if (key === "summary_ms" || key === "duration_ms") { return seconds(record[key]); }
    var value = record[key];
    return value === null || value === undefined ? "" : String(value);
  }

  function table(records) {
    if (!records.length) { return h("p", null, "No compaction recorded yet."); }
    return h("table", { className: "session-guard-compactions", style: { width: "100%", fontSize: "0.85em" } },
      h("thead", null, h("tr", null, COLUMNS.map(function (c) { return h("th", { key: c[0] }, c[1]); }))),
      h("tbody", null, records.map(function (r) {
        return h("tr", { key: r.op_id }, COLUMNS.map(function (c) { return h("td", { key: c[0] }, cell(r, c[0])); }));
      })));
  }

  function Page() {
    var data = hooks.useState(null), error = hooks.useState(null), session = hooks.useState("");
    hooks.useEffect(function () {
      var query = session[0] ? "?session=" + encodeURIComponent(session[0]) : "";
      SDK.fetchJSON(ROUTE + query).then(function (body) { error[1](null); data[1](body); })
        .catch(function (e) { error[1](String((e && e.message) || e)); });
    }, [session[0]]);
    var body = error[0] ? h("p", null, "Could not load the compactions: " + error[0])
      : !data[0] ? h("p", null, "Loading...")
      : data[0].guard !== "on" ? h("p", null, "The session guard is not on in this dashboard process.")
      : table(data[0].compactions || []);
    var Card = C.Card || "div", Header = C.CardHeader || "div", Title = C.CardTitle || "h2";
    var Content = C.CardContent || "div";
    return h(Card, null,
      h(Header, null, h(Title, null, "Compactions")),
      h(Content, null,
        h("input", { placeholder: "session id (all sessions when empty)", value: session[0],
                     onChange: function (e) { session[1](e.target.value.trim()); } }),
        body));
  }

  PLUGINS.register("session-guard", Page);
})();
