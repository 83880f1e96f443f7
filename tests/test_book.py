"""The website: it builds without warnings, leaks no solution, keeps widget state, and works in a browser offline.

All tests share one build of `_build/html`: the first xdist worker to need it builds it under a
file lock, and the others reuse it. The
browser test drives Debian's Chromium (`/usr/bin/chromium`, installed by `.ci/run`) with
Playwright and saves a screenshot of every page under `_build/screenshots/`.
"""

from __future__ import annotations

import fcntl
import html as html_lib
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import nbformat
import pytest

from autograder.registry import REGISTRY

REPO = Path(__file__).resolve().parents[1]
SITE = REPO / "_build" / "html"
SHOTS = REPO / "_build" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]  # fmt: skip
#: The width the pages are checked at: a laptop screen, where the text column is 688 pixels wide.
VIEWPORT = {"width": 1280, "height": 900}
VIEW = "application/vnd.jupyter.widget-view+json"
STATE = "application/vnd.jupyter.widget-state+json"

pytestmark = pytest.mark.slow
#: Identifies this test run; xdist gives all workers of one run the same value.
RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex


def _toc_pages() -> list[str]:
    """The built pages of every file in _toc.yml, relative to the site root."""
    files = re.findall(r"(?:root|file):\s*(\S+)", (REPO / "_toc.yml").read_text())
    return [f"{f}.html" for f in files]


@pytest.fixture(scope="session")
def site() -> Path:
    """Build the site once per test run, whichever worker asks first; the others wait and reuse it."""
    build_dir = REPO / "_build"
    build_dir.mkdir(exist_ok=True)
    stamp = build_dir / ".site-built-by-run"
    with open(build_dir / ".site-build.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.is_file() and stamp.read_text() == RUN_ID:
            return SITE
        stamp.unlink(missing_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("COV_CORE", "PYTEST_"))}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        cmd = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(REPO), "-W", "--keep-going", "--all"]
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        log = done.stdout + done.stderr
        assert done.returncode == 0, log[-5000:]
        assert "WARNING" not in log, log[-5000:]
        stamp.write_text(RUN_ID)
    return SITE


def test_every_toc_page_is_built_and_assets_are_local(site):
    for page in _toc_pages():
        text = (site / page).read_text()
        for src in re.findall(r'<script[^>]*src="([^"]+)"', text):
            assert not src.startswith(("http:", "https:", "//")), f"{page} loads {src} from the network"
    for asset in ("mathjax/tex-mml-chtml.js", "require.js", "widgets/embed-amd.js"):
        assert (site / "_static" / asset).is_file(), asset
    chapter = (site / "chapters/03_attention/attention.html").read_text()
    assert "colab.research.google.com" in chapter, "the chapter has a Colab launch button"
    assert "_static/mathjax/tex-mml-chtml.js" in chapter and "_static/widgets/embed-amd.js" in chapter


def test_the_download_button_gives_the_student_notebook(site):
    chapter = (site / "chapters/03_attention/attention.html").read_text()
    assert "_sources/chapters/03_attention/attention.ipynb" in chapter
    downloaded = nbformat.read(site / "_sources/chapters/03_attention/attention.ipynb", as_version=4)
    released = nbformat.read(REPO / "chapters/03_attention/attention.ipynb", as_version=4)
    assert [c.source for c in downloaded.cells] == [c.source for c in released.cells]
    assert not list(site.rglob("solutions")), "no copy of solutions/ in the site"


def _text(path: Path) -> str:
    """What a reader could see in a built file, whitespace collapsed: page text, or notebook sources."""
    raw = path.read_text(errors="replace")
    if path.suffix == ".ipynb":
        nb = json.loads(raw)
        raw = "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in nb["cells"])
    elif path.suffix == ".html":
        raw = html_lib.unescape(re.sub(r"<[^>]+>", "", raw))
    return " ".join(raw.split())


def _sentinels() -> dict[str, list[str]]:
    """Distinctive lines of each solution region and hidden test: those no student notebook contains (a
    line of chapter 2's answer that a later chapter provides as given code is no leak)."""
    found: dict[str, list[str]] = {}
    releases = sorted((REPO / "chapters").glob("*/*.ipynb"))
    release = "\n".join(p.read_text() for p in releases)
    released_text = " ".join(" ".join(_text(p).split()) for p in releases)
    for source in sorted((REPO / "solutions").glob("*/*.ipynb")):
        for cell in nbformat.read(source, as_version=4).cells:
            for begin, end in (("### BEGIN SOLUTION", "### END SOLUTION"), ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")):
                if begin not in cell.source:
                    continue
                # A class exercise may have several solution regions (one per method): check them all.
                regions = [part.split(end, 1)[0] for part in cell.source.split(begin)[1:]]
                lines = [" ".join(line.split()) for region in regions for line in region.splitlines()]
                lines = [line for line in lines if len(line) >= 12 and line not in released_text and line not in release]
                key = f"{source.parent.name}/{cell.metadata['nbgrader']['grade_id']}"
                found[key] = lines
    return found


def _leaks(texts: dict[str, str], sentinels: dict[str, list[str]]) -> list[str]:
    return [f"{region}: {line!r} in {name}" for name, text in texts.items() for region, lines in sentinels.items() for line in lines if line in text]


def test_no_solution_or_hidden_test_reaches_the_site(site):
    sentinels = _sentinels()
    graded = {f"{e.chapter}/{gid}" for e in REGISTRY for gid in (e.solution_grade_id, e.test_grade_id)}
    assert graded <= set(sentinels) and all(sentinels.values()), "each graded region has lines to look for"
    texts = {str(p.relative_to(site)): _text(p) for p in site.rglob("*") if p.suffix in {".html", ".ipynb", ".txt", ".md", ".json"}}
    assert _leaks(texts, sentinels) == []
    # The check can fail: a page quoting one solution line is caught.
    line = next(iter(sentinels.values()))[0]
    assert _leaks({"page.html": f"some prose {line} more"}, sentinels)


def widget_views_without_state(page_html: str) -> list[str]:
    """Model ids of widget views on a page that the page's saved widget state does not hold."""
    views = [json.loads(m)["model_id"] for m in re.findall(rf'<script type="{re.escape(VIEW)}">(.*?)</script>', page_html, re.S)]
    states = re.findall(rf'<script type="{re.escape(STATE)}">(.*?)</script>', page_html, re.S)
    known = set().union(*(json.loads(html_lib.unescape(s))["state"] for s in states)) if states else set()
    return [v for v in views if v not in known]


def test_pages_with_widget_views_carry_their_state(site):
    chapter = (site / "chapters/03_attention/attention.html").read_text()
    assert chapter.count(f'<script type="{VIEW}">') == 3
    for page in _toc_pages():
        assert widget_views_without_state((site / page).read_text()) == [], page
    # A page with a view and no state fails (such a widget would vanish from the page silently).
    stateless = re.sub(rf'<script type="{re.escape(STATE)}">.*?</script>', "", chapter, flags=re.S)
    assert len(widget_views_without_state(stateless)) == 3


#: Display equations whose box reaches outside the column that holds them (MathJax's container for an
#: equation with a number grows to the left when the equation is too wide, out of reach of a scroll bar).
_WIDE_EQUATIONS = """() => Array.from(document.querySelectorAll('mjx-container[display="true"]')).filter(box => {
  const column = box.parentElement.getBoundingClientRect(), eq = box.getBoundingClientRect();
  return eq.left < column.left - 1 || eq.right > column.right + 1;
}).map(box => (box.textContent || "").slice(0, 50))"""

_FRAME_FINGERPRINT = """root => {
  const frames = root.lastElementChild;           // the Stack: only the chosen frame is attached
  return frames ? frames.innerHTML : "";  // each PNG frame has its own blob: URL
}"""


def _check_page(browser, page_name: str, exercise_widgets: bool = True) -> dict:
    """Open one page offline; return what was seen. Screenshots go to _build/screenshots/.

    Without ``exercise_widgets`` (a page whose widget state is another page's but for its words, whose
    widgets were exercised there) the widgets must render but are not moved, and the screenshot
    is the first screen only.
    """
    page = browser.new_page(viewport=VIEWPORT)
    errors: list[str] = []
    external: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    def offline(route):
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            external.append(route.request.url)
            route.abort()

    page.route("**/*", offline)
    page.goto((SITE / page_name).as_uri(), wait_until="load")
    page.evaluate("async () => { if (window.MathJax && MathJax.startup) await MathJax.startup.promise; }")
    n_views = page.locator(f'script[type="{VIEW}"]').count()
    if n_views:
        page.wait_for_function(
            f"""() => Array.from(document.querySelectorAll('script[type="{VIEW}"]'))
                 .every(s => s.parentElement.querySelector('.widget-subarea > .jupyter-widgets'))""",
            timeout=30_000,
        )
    seen = {
        "math": page.locator("span.math, div.math").count(),
        "typeset": page.locator("mjx-container").count(),
        "math_errors": page.locator("mjx-merror").count(),
        "wide_equations": page.evaluate(_WIDE_EQUATIONS),
        "views": n_views,
        "moved": [],
    }
    stem = page_name.removesuffix(".html").replace("/", "_")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{stem}.png"), full_page=exercise_widgets)
    roots = page.locator(".widget-subarea > .jupyter-widgets")
    for i in range(roots.count() if exercise_widgets else 0):
        root = roots.nth(i)
        root.scroll_into_view_if_needed()
        before = root.evaluate(_FRAME_FINGERPRINT)
        handle = root.locator(".noUi-handle")
        if handle.count():
            handle.first.focus()
            for _ in range(2):
                page.keyboard.press("ArrowRight")
            kind = "slider"
        else:
            root.locator(".widget-toggle-button:not(.mod-active)").first.click()
            kind = "toggle"
        page.wait_for_timeout(300)
        after = root.evaluate(_FRAME_FINGERPRINT)
        root.screenshot(path=str(SHOTS / f"{stem}-widget{i}-after-{kind}.png"))
        seen["moved"].append((kind, before != after and bool(after)))
    seen["errors"] = errors
    seen["external"] = external
    page.close()
    return seen


def test_browser_every_page_renders_math_and_responsive_widgets_offline(site):
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.is_file(), "Debian's chromium is needed: apt-get install -y chromium (.ci/run does this)"
    assert 'url=intro.html' in (site / "index.html").read_text(), "index.html forwards to the intro"
    pages = _toc_pages()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            report = {name: _check_page(browser, name) for name in pages}
            # The width check can fail: an equation box wider than its column is found.
            page = browser.new_page(viewport=VIEWPORT)
            page.set_content('<div class="math" style="width:100px"><mjx-container display="true" '
                             'style="display:block;width:300px;margin-left:-100px">x</mjx-container></div>')
            assert page.evaluate(_WIDE_EQUATIONS) == ["x"]
            page.close()
        finally:
            browser.close()
    for name, seen in report.items():
        assert seen["errors"] == [], f"{name}: console errors {seen['errors']}"
        assert seen["external"] == [], f"{name}: tried the network {seen['external']}"
        assert seen["typeset"] >= seen["math"] and seen["math_errors"] == 0, f"{name}: math not typeset {seen}"
        assert seen["wide_equations"] == [], f"{name}: display equations wider than the column {seen['wide_equations']}"
        assert len(seen["moved"]) == seen["views"], f"{name}: not every widget rendered {seen}"
        assert all(changed for _, changed in seen["moved"]), f"{name}: a control did not change its frame {seen['moved']}"
    chapter = report["chapters/03_attention/attention.html"]
    assert chapter["typeset"] > 20 and sorted(kind for kind, _ in chapter["moved"]) == ["slider", "toggle", "toggle"]
    assert report["intro.html"]["typeset"] == 0 or report["intro.html"]["math_errors"] == 0


def test_the_appendix_outputs_are_what_its_code_prints():
    """The appendix is rendered as committed, like the chapters, but no generation step runs it: nbval
    replays it here (a few seconds)."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--nbval", "--nbval-current-env",
           "--nbval-sanitize-with", str(REPO / "tests" / "nbval_sanitize.cfg"), "-o", "addopts=",
           str(REPO / "appendix" / "from_transformer_to_llms.ipynb")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COV_CORE", "PYTEST_"))}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_the_introduction_shows_the_readmes_chapter_map_and_the_exercise_table_names_what_each_builds_on(site):
    readme = (REPO / "README.md").read_text()
    chapters = sorted(p.parent.name for p in (REPO / "chapters").glob("*/*.ipynb"))
    intro = (site / "intro.html").read_text()
    for chapter in chapters:   # the map is written once, in the README, and included by the introduction
        assert f"chapters/{chapter}/" in readme.split("<!-- end of chapter-table -->")[0]
        assert f'href="chapters/{chapter}/' in intro, chapter
    rows = {line.split("|")[2].strip(" `"): line.split("|")[6].strip() for line in readme.splitlines()
            if line.startswith("| [") and "`ch" in line}
    assert rows["ch08.make_model"] == "1–7; `EncoderLayer`, `DecoderLayer`, `Decoder`"
    assert rows["ch05.multiheaded_attention"].startswith("3; `split_heads`")
    assert rows["ch01.embeddings"] == "none" and all(len(v) < 80 for v in rows.values())


# --------------------------------------------------------------------------------------------
# The Chinese site (zh/, generated by `make chapters`), built into _build/html/zh.

ZH_SITE = SITE / "zh"
CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="session")
def zh_site(site) -> Path:
    """Build the Chinese site once per test run, after the English one, whichever worker asks first."""
    from scripts import translations

    stamp = REPO / "_build" / ".zh-site-built-by-run"
    with open(REPO / "_build" / ".site-build.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (stamp.is_file() and stamp.read_text() == RUN_ID):
            stamp.unlink(missing_ok=True)
            translations.build_site(SITE, REPO, fresh=True)
            stamp.write_text(RUN_ID)
    return ZH_SITE


def test_every_page_links_to_the_same_page_in_the_other_language(site, zh_site):
    for page in _toc_pages():
        for here, there, lang in ((site / page, zh_site / page, "zh-CN"), (zh_site / page, site / page, "en")):
            links = re.findall(r'<p class="language-switch"[^>]*><a href="([^"]+)" hreflang="([^"]+)"', here.read_text())
            assert len(links) == 1 and links[0][1] == lang, (here, links)
            assert (here.parent / links[0][0]).resolve() == there.resolve() and there.is_file(), (here, links)
    assert 'lang="zh-CN"' in (zh_site / "intro.html").read_text()


def test_the_chinese_pages_are_chinese_except_what_is_pending(zh_site):
    from scripts import translations

    pending = set(translations.settings(REPO)["pending"])
    for page in _toc_pages():
        html = (zh_site / page).read_text()
        title = re.search(r"<h1>(.*?)<", html, re.S)[1]
        # The prose paragraphs: not code, outputs or widget state; not a paragraph of inline code and
        # formulas only (a table cell naming modules or functions); not the references (cited as published).
        prose = re.sub(r"<script.*?</script>", "", html, flags=re.S)
        prose = re.sub(r'<section id="[^"]*">\s*<h2>参考文献.*?</section>', "", prose, flags=re.S)
        paragraphs = [html_lib.unescape(re.sub(r"<[^>]+>", "", p)) for p in re.findall(r"<p>(.*?)</p>", prose, re.S)
                      if re.search(r"[^\W\d_]", re.sub(r"<code.*?</code>|\\\(.*?\\\)", "", p, flags=re.S))]
        chinese = [p for p in paragraphs if CJK.search(p)]
        if page.removesuffix(".html") in pending:
            assert "译文待补" in html, page
        else:
            assert "译文待补" not in html and CJK.search(title), (page, title)
            assert not [w for w in ("Launch on", "Launch interactive", "列印") if w in html], page  # the theme's words
            assert len(chinese) >= 0.8 * len(paragraphs) > 0, (page, [p for p in paragraphs if not CJK.search(p)])
    for page in _toc_pages():
        assert widget_views_without_state((zh_site / page).read_text()) == [], page


def test_chinese_search_indexes_chinese_words(zh_site):
    raw = (zh_site / "searchindex.js").read_text()
    index = json.loads(raw[raw.index("(") + 1 : raw.rindex(")")])

    def pages(word: str) -> set[str]:
        """Pages whose text or titles hold the word."""
        found: set[str] = set()
        for kind in ("terms", "titleterms"):
            ids = index[kind].get(word, [])
            found |= {index["docnames"][i] for i in ([ids] if isinstance(ids, int) else ids)}
        return found

    assert "chapters/03_attention/attention" in pages("缩放点积注意力")
    assert "chapters/04_masks/masks" in pages("因果掩码")
    assert "chapters/02_positional_encoding/positional_encoding" in pages("旋转矩阵")
    assert "glossary" in pages("层归一化")  # one word, from the termbase's search dictionary
    assert pages("缩放点积注意力") < set(index["docnames"])


def test_browser_the_chinese_site_renders_offline_and_search_answers_in_chinese(zh_site):
    from playwright.sync_api import sync_playwright

    fonts = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True).stdout
    assert fonts.strip(), "a Chinese font is needed for readable screenshots: apt-get install -y fonts-wqy-zenhei"
    pages = [f"zh/{name}" for name in _toc_pages()]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            # The widget state of a Chinese page is the English page's with its labels and readouts translated
            # (test_translations checks it), and the English test moves every widget: here they must render,
            # and the math typeset.
            report = {name: _check_page(browser, name, exercise_widgets=False) for name in pages}
            search = browser.new_page()
            # Offline too; over file:// the browser refuses the fetch of result snippets, so only the
            # result list is read here (served over HTTP the snippets load as on the English site).
            search.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:") else route.abort())
            search.goto(f"{(zh_site / 'search.html').as_uri()}?q=缩放点积注意力", wait_until="load")
            search.wait_for_selector("ul.search li a", timeout=30_000)
            found = search.eval_on_selector_all("ul.search li a", "links => links.map(a => a.getAttribute('href'))")
            search.screenshot(path=str(SHOTS / "zh_search.png"))
        finally:
            browser.close()
    for name, seen in report.items():
        assert seen["errors"] == [], f"{name}: console errors {seen['errors']}"
        assert seen["external"] == [], f"{name}: tried the network {seen['external']}"
        assert seen["typeset"] >= seen["math"] and seen["math_errors"] == 0, f"{name}: math not typeset {seen}"
        english_views = (SITE / name.removeprefix("zh/")).read_text().count(f'<script type="{VIEW}">')
        assert seen["views"] == english_views, f"{name}: {seen['views']} widgets, the English page has {english_views}"
    assert report["zh/chapters/03_attention/attention.html"]["views"] == 3
    assert any(href.startswith("chapters/03_attention/attention.html") for href in found), found
