"""Results rendered the way Gradescope shows them (Markdown to HTML), to find student text that became markup.

The grader's own feedback is paragraphs, lists, code and its bold "Diagnosis" and "Contract" labels; everything a
student controls must stay inside code. ``assert_inert(results)`` renders every output of a
``results.json`` with CommonMark (raw HTML allowed, as the strictest reading) and checks both the
token stream and the HTML it gives.
"""

from __future__ import annotations

from html.parser import HTMLParser

from markdown_it import MarkdownIt

#: What the grader's own Markdown is made of (its bold labels: a diagnosis, a contract's clause, a run not graded); anything else came from student text.
ALLOWED = {"p", "code", "pre", "ul", "li", "strong"}
#: Tokens the grader's own Markdown never makes.
FORBIDDEN_TOKENS = {"html_inline", "html_block", "image", "link_open", "heading_open", "hr", "blockquote_open",
                    "em_open", "lheading"}
_MARKDOWN = MarkdownIt("commonmark")


class _Elements(HTMLParser):
    """The elements of an HTML fragment, the text outside ``code``/``pre`` and the text in bold."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.open: list[str] = []
        self.outside: list[str] = []
        self.bold: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.add(tag)
        self.open.append(tag)

    def handle_startendtag(self, tag, attrs) -> None:
        self.tags.add(tag)

    def handle_endtag(self, tag) -> None:
        if tag in self.open:
            del self.open[len(self.open) - 1 - self.open[::-1].index(tag):]

    def handle_data(self, data) -> None:
        if not {"code", "pre"} & set(self.open):
            self.outside.append(data)
        if "strong" in self.open:
            self.bold.append(data)


def rendered(markdown: str) -> _Elements:
    """``markdown`` rendered to HTML and taken apart."""
    found = _Elements()
    found.feed(_MARKDOWN.render(markdown))
    found.close()
    return found


def _tokens(markdown: str) -> set[str]:
    kinds = set()
    for token in _MARKDOWN.parse(markdown):
        kinds.add(token.type)
        kinds.update(child.type for child in token.children or [])
    return kinds


def assert_inert(results: dict, student_words: tuple[str, ...] = ()) -> None:
    """No output of ``results`` renders an element the grader does not make itself, and none of
    ``student_words`` (distinctive parts of hostile text) appears outside code."""
    outputs = [("output", results.get("output", ""))] + [(t["name"], t["output"]) for t in results["tests"]]
    for name, text in outputs:
        tokens = _tokens(text) & FORBIDDEN_TOKENS
        assert not tokens, (name, tokens, text[:3000])
        found = rendered(text)
        assert found.tags <= ALLOWED, (name, found.tags - ALLOWED, text[:3000])
        # The grader's own labels are the only bold text: diagnoses and the contract's clauses.
        assert all(b.startswith(("Diagnosis:", "Contract:", "Not graded yet")) for b in found.bold), (name, found.bold)
        outside = "".join(found.outside)
        leaked = [w for w in student_words if w in outside]
        assert not leaked, (name, leaked, text[:3000])
