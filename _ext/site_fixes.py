"""Two repairs of what Jupyter Book 1 (Sphinx 7.4) puts on every page of the site.

**Inline scripts written twice.** Extensions that register an inline script (a ``body`` and no file)
after the builder was initialised, as sphinx-togglebutton does in ``builder-inited`` and sphinx-thebe
in ``env-before-read-docs``, reach the builder twice: once at once, with the file name ``None``, and
again when Sphinx starts writing, where it re-adds every script registered after ``Builder.init()``,
now with the file name ``''``. The two are not equal, so both are written, and the browser then
reports ``Identifier 'THEBE_JS_URL' has already been declared`` on every page. Before writing starts,
the early copies are dropped; the registry's copy of each comes back exactly once.

**Display equations wider than the text column.** MathJax 3 breaks no lines, and an equation with a
number (``\\tag``) that is wider than the column spills out of it on the left, where no scroll bar
reaches. A small script scales every such equation down (font size, so the tag shrinks with it) until
it fits, and does so again when the window is resized. Chapters keep their equations narrow where
they can (``aligned``); this catches the rest, on narrow screens too.
"""

from __future__ import annotations

from pathlib import Path

from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment

FIT_MATH_NAME = "fit-display-math.js"
FIT_MATH = """\
// Display equations wider than their column are scaled down until they fit (see _ext/site_fixes.py).
(function () {
  var SMALLEST = 0.5;   // below half size an equation is unreadable anyway; it then overflows
  function fit() {
    document.querySelectorAll('mjx-container[display="true"]').forEach(function (box) {
      box.style.fontSize = "";
      var room = box.parentElement.clientWidth;
      var need = box.getBoundingClientRect().width;
      if (room > 0 && need > room + 0.5) {
        box.style.fontSize = (100 * Math.max(SMALLEST, 0.98 * room / need)).toFixed(1) + "%";
      }
    });
  }
  if (window.MathJax && window.MathJax.startup) {
    window.MathJax.startup.promise.then(fit);
  }
  var pending;
  window.addEventListener("resize", function () {
    clearTimeout(pending);
    pending = setTimeout(fit, 150);
  });
})();
"""


def drop_early_inline_scripts(app: Sphinx, env: BuildEnvironment) -> None:
    """Forget the builder's copies of inline scripts registered after its initialisation (see above)."""
    scripts = getattr(app.builder, "_js_files", None)
    if scripts is not None:
        scripts[:] = [js for js in scripts if js.filename is not None]


def write_fit_math(app: Sphinx, exception: Exception | None) -> None:
    if exception is None and app.builder.format == "html":
        (Path(app.outdir) / "_static" / FIT_MATH_NAME).write_text(FIT_MATH)


def setup(app: Sphinx) -> dict[str, bool]:
    app.connect("env-updated", drop_early_inline_scripts)
    app.connect("build-finished", write_fit_math)
    # Deferred scripts run in order: after MathJax (priority 500), so its startup promise exists.
    app.add_js_file(FIT_MATH_NAME, loading_method="defer", priority=520)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
