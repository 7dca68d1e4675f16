// The run-config keys page (config.md): a strategy filter and a text filter above the keys
// table. fedapp/config_docs.py writes the table and, in an HTML comment before it, the
// groups its "read by" names ({"app": [...], "the FedAvg family": [...], ...}). A row is
// shown for strategy S when its read-by names S, or a group with S, or the app (every run
// reads the app's keys): the keys `fedhetero keys --strategy S` prints. Nothing leaves the
// page; without JavaScript the whole table shows.
(function () {
  "use strict";

  var MARK = "run-config read-by groups:";

  function groupsComment(root) {
    var walker = document.createTreeWalker(root, NodeFilter.SHOW_COMMENT);
    for (var node = walker.nextNode(); node; node = walker.nextNode()) {
      var text = node.nodeValue.trim();
      if (text.indexOf(MARK) === 0) {
        return { node: node, groups: JSON.parse(text.slice(MARK.length)) };
      }
    }
    return null;
  }

  function readers(cell, groups) {
    var names = {};
    cell.textContent.split(",").forEach(function (part) {
      var name = part.trim();
      (groups[name] || [name]).forEach(function (strategy) { names[strategy] = true; });
    });
    return names;
  }

  function element(tag, attributes, text) {
    var made = document.createElement(tag);
    Object.keys(attributes).forEach(function (name) { made.setAttribute(name, attributes[name]); });
    if (text) {
      made.textContent = text;
    }
    return made;
  }

  function setUp(root) {
    var found = groupsComment(root);
    if (!found) {
      return;
    }
    var table = null;
    root.querySelectorAll("table").forEach(function (candidate) {
      if (!table && candidate.querySelector(".read-by")) {
        table = candidate;
      }
    });
    if (!table || table.dataset.filtered) {
      return;
    }
    table.dataset.filtered = "yes";
    var rows = Array.prototype.slice.call(table.tBodies[0].rows).map(function (row) {
      return { row: row, text: row.textContent.toLowerCase(),
               readers: readers(row.querySelector(".read-by"), found.groups) };
    });

    var form = element("form", { class: "config-keys-filter", role: "search" });
    var strategy = element("select", { id: "config-keys-strategy" });
    strategy.appendChild(element("option", { value: "" }, "every strategy"));
    found.groups.app.forEach(function (name) {
      strategy.appendChild(element("option", { value: name }, name));
    });
    var text = element("input", { id: "config-keys-text", type: "search",
                                  placeholder: "key or word, e.g. straggler" });
    var count = element("span", { class: "config-keys-count", "aria-live": "polite" });
    form.appendChild(element("label", { for: "config-keys-strategy" }, "Keys read by "));
    form.appendChild(strategy);
    form.appendChild(element("label", { for: "config-keys-text" }, " containing "));
    form.appendChild(text);
    form.appendChild(count);
    form.addEventListener("submit", function (event) { event.preventDefault(); });
    var before = table.closest(".md-typeset__scrollwrap") || table; // Material's wrapper
    before.parentNode.insertBefore(form, before);

    function apply() {
      var chosen = strategy.value;
      var words = text.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
      var shown = 0;
      rows.forEach(function (entry) {
        var visible = (!chosen || entry.readers[chosen] === true) &&
          words.every(function (word) { return entry.text.indexOf(word) >= 0; });
        entry.row.hidden = !visible;
        shown += visible ? 1 : 0;
      });
      count.textContent = " " + shown + " of " + rows.length + " keys";
      var url = new URL(window.location.href);
      if (chosen) {
        url.searchParams.set("strategy", chosen);
      } else {
        url.searchParams.delete("strategy");
      }
      if (window.location.protocol !== "file:") {
        window.history.replaceState(null, "", url.toString());
      }
    }

    var asked = new URL(window.location.href).searchParams.get("strategy");
    if (asked && found.groups.app.indexOf(asked) >= 0) {
      strategy.value = asked;
    }
    strategy.addEventListener("change", apply);
    text.addEventListener("input", apply);
    apply();
  }

  function onEveryPage() {
    var content = document.querySelector(".md-content") || document.body;
    setUp(content);
  }

  if (typeof document$ !== "undefined") {
    document$.subscribe(onEveryPage);
  } else {
    document.addEventListener("DOMContentLoaded", onEveryPage);
  }
})();
