"""The course in two languages: a link on every page to the same page in the other language.

The English site is built into ``_build/html`` and the Chinese one (generated into ``zh/`` by
``make chapters``) into ``_build/html/zh``, with the same page names. The ``language_links``
setting of each book says where the other site's root lies relative to this one's root and
how to label the link::

    language_links: {href: zh/, label: 中文, hreflang: zh-CN}    # in _config.yml
    language_links: {href: ../, label: English, hreflang: en}    # in zh/_config.yml

Each content page gets the link at the top of its text and a ``<link rel="alternate">`` in its
head. A relative ``html_search_options["dict"]`` (the Chinese site's search dictionary) is
resolved against the book's folder, so the build works from any working directory, and the
Chinese search index is built in linear time (``ChineseSearch``).
"""

from __future__ import annotations

import html
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.search import languages
from sphinx.search.zh import SearchChinese


def other_language_href(pagename: str, root_href: str) -> str:
    """The relative URL, from page ``pagename``, of the same page on the other site."""
    return "../" * pagename.count("/") + root_href + pagename + ".html"


def add_link(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    link = app.config.language_links
    if not link or doctree is None or "body" not in context:  # search and index pages have no counterpart text
        return
    href = html.escape(other_language_href(pagename, link["href"]))
    label, lang = html.escape(link["label"]), html.escape(link["hreflang"])
    context["body"] = (
        f'<p class="language-switch" style="text-align: right; margin: 0">'
        f'<a href="{href}" hreflang="{lang}" lang="{lang}">{label}</a></p>\n' + context["body"]
    )
    context["metatags"] = context.get("metatags", "") + f'\n<link rel="alternate" hreflang="{lang}" href="{href}" />'


def resolve_search_dictionary(app: Sphinx, config: Config) -> None:
    options = config.html_search_options or {}
    if options.get("dict") and not Path(options["dict"]).is_absolute():
        config.html_search_options = {**options, "dict": str(Path(app.srcdir) / options["dict"])}


class _Words(set):
    """A set that can be ``extend``-ed like the list Sphinx's Chinese search keeps."""

    extend = set.update


class ChineseSearch(SearchChinese):
    """Sphinx's Chinese search, with its record of the Latin words seen kept as a set.

    Sphinx 7 keeps it as a list that grows with the whole site and looks every indexed word up in
    it, which made the search index half of the Chinese site's build time.
    """

    def init(self, options: dict[str, str]) -> None:
        super().init(options)
        self.latin_terms = _Words()


def setup(app: Sphinx) -> dict[str, bool]:
    languages["zh"] = ChineseSearch
    app.add_config_value("language_links", {}, "html")
    app.connect("config-inited", resolve_search_dictionary)
    app.connect("html-page-context", add_link)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
