// Renders the maths of every page with the KaTeX copy beside this file (javascripts/katex/,
// no network). pymdownx.arithmatex (mkdocs.yml, generic mode) leaves $...$ and \(...\) as
// <span class="arithmatex">\(...\)</span>, and $$...$$ and \[...\] as
// <div class="arithmatex">\[...\]</div>; each is typeset here in place. Without JavaScript
// the page shows the TeX source.
(function () {
  "use strict";

  function typeset(root) {
    if (typeof katex === "undefined") {
      return;
    }
    root.querySelectorAll(".arithmatex").forEach(function (element) {
      var tex = element.textContent.trim();
      var display = element.tagName !== "SPAN";
      var delimited = /^\\\(([\s\S]*)\\\)$/.exec(tex) || /^\\\[([\s\S]*)\\\]$/.exec(tex);
      if (delimited) {
        tex = delimited[1];
      }
      katex.render(tex, element, {
        displayMode: display,
        throwOnError: false, // a TeX error shows the source in red, the page stays readable
      });
    });
  }

  if (typeof document$ !== "undefined") {
    document$.subscribe(function () { typeset(document); }); // Material, instant navigation too
  } else {
    document.addEventListener("DOMContentLoaded", function () { typeset(document); });
  }
})();
