"""Serve MathJax 3, RequireJS and the Jupyter widgets HTML manager from the site itself.

By default the pages would load these from CDNs, so math and widgets would vanish without a
network. ``book/package.json`` pins them; ``make book`` installs them with npm, and this
extension copies them into ``_static/`` when the build has finished. They are copied rather
than listed as static paths on purpose: Jupyter Book registers every .js file found in a
static path on every page, which would mean dozens of MathJax script tags per page.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

#: destination under _static/  ->  source under book/node_modules/
ASSETS = {
    "mathjax": "mathjax/es5",
    "require.js": "requirejs/require.js",
    "widgets": "@jupyter-widgets/html-manager/dist",
}


#: The widget manager typesets with MathJax 2's ``MathJax.Hub.Queue``; MathJax 3 has no ``Hub``,
#: so without this every widget label throws. The shim maps the old call onto MathJax 3.
SHIM_NAME = "mathjax2-widgets-shim.js"
SHIM = """\
if (window.MathJax && window.MathJax.startup && !window.MathJax.Hub) {
  window.MathJax.Hub = {
    Queue: function (...jobs) {
      for (const job of jobs) {
        const element = Array.isArray(job) ? job[2] : undefined;
        if (element) MathJax.startup.promise.then(() => MathJax.typesetPromise([element]));
      }
    },
  };
}
"""


#: The widget manager computes where its font files live from the RequireJS module path, which
#: by default is relative to each page; this points it at _static/widgets/ instead. RequireJS
#: reads a global ``require`` object defined before it loads as its configuration.
REQUIRE_CONFIG_NAME = "requirejs-config.js"
REQUIRE_CONFIG = """\
var require = {
  paths: {
    "@jupyter-widgets/html-manager/dist":
      (document.documentElement.dataset.content_root || "./") + "_static/widgets",
  },
};
"""


def copy_assets(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    # Beside this folder, not under the book's: the Chinese book (zh/) uses the same assets.
    modules = Path(__file__).resolve().parents[1] / "book" / "node_modules"
    static = Path(app.outdir) / "_static"
    for dest, src in ASSETS.items():
        source = modules / src
        if not source.exists():
            raise ExtensionError(f"{source} is missing: run `npm ci --prefix book` (or `make book`) first")
        target = static / dest
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.map"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    (static / SHIM_NAME).write_text(SHIM)
    (static / REQUIRE_CONFIG_NAME).write_text(REQUIRE_CONFIG)


def setup(app: Sphinx) -> dict[str, bool]:
    app.connect("build-finished", copy_assets)
    # Deferred scripts run in order, after MathJax (priority 500) and before the widgets render.
    app.add_js_file(SHIM_NAME, loading_method="defer", priority=510)
    # Before require.js, which myst-nb adds at the default priority 500 on pages with widgets.
    app.add_js_file(REQUIRE_CONFIG_NAME, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
