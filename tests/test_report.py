"""The class report (``python -m autograder report``): counts that match what went in, and nothing unescaped.

The fast tests write results files as the grader writes them (with its own functions where it has them)
for a class planted by hand; the slow one grades a class of 40 submissions of chapter 3 with the real
``grade-batch``, planted from the declared mistakes, and checks the report against the plan.
"""

from __future__ import annotations

import base64
import os
import random
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from autograder.diagnoses_zh import diagnosis
from autograder.feedback import code, fenced
from autograder.mistakes import submission_source
from autograder.reach import reach_line
from autograder.registry import by_id
from autograder.report import GradebookRow, read_gradebook, read_results, render_html, render_markdown
from autograder.results import Report, TestResult, error_results, to_gradescope, write_results
from autograder.sandbox import REPO_ROOT

from .notebook_answers import release_with, solution_answers

CLI = [sys.executable, "-m", "autograder"]
NOT_IMPLEMENTED = "not implemented yet (the stub raises `NotImplementedError`)"
TIMED_OUT = ("timed out after 10 s (the worker's own CPU and waiting time: time spent waiting for a busy CPU does "
             "not count); the remaining cases run in a fresh worker")
CRASHED = "worker died before answering (exit code 3); an exit code never counts as success"
MEMORY = "exceeded the memory limit:\n\n" + fenced("RuntimeError: DefaultCPUAllocator: can't allocate memory")
POLICY = ("Your answer calls `scaled_dot_product_attention`: this exercise asks you to write it yourself. "
          "Points are not deducted automatically; your instructor sees this line.")
REACH = reach_line(["`sys.modules`"])

# Two chapters, three exercises; each case is worth 2 points.
CASES = {"ch03.attention": ["public: small batch", "hidden: causal mask", "hidden: padding"],
         "ch03.softmax_saturation": ["public: scaled", "hidden: unscaled"],
         "ch04.subsequent_mask": ["public: size 3", "hidden: size 9"]}
HOSTILE = {"script": "<script>alert(1)", "ansi": "\x1b[31mred\x1b[0m", "bidi": "abc\u202eevil.exe"}


def _case_line(exercise: str, case: str, plan: str, language: str) -> TestResult:
    """One case as the grader writes it, for a plan: "ok", "stub", "crash", "timeout", "memory" or a mistake."""
    name = f"{exercise} {case}"
    if plan == "ok":
        return TestResult(name, 2.0, 2.0, "Checked: something.\n\npassed")
    why = {"stub": NOT_IMPLEMENTED, "crash": CRASHED, "timeout": TIMED_OUT, "memory": MEMORY}.get(plan)
    if why is None:  # a declared mistake, named after what it raised (which quotes a fake diagnosis, fenced)
        message = by_id(exercise).mistakes[plan].message if language == "zh" else f"the message of {plan}, with `code`"
        quoted = fenced("**Diagnosis: planted**: in an exception\n\ntimed out after 1 s")  # the student's words
        why = f"your code raised:\n\n{quoted}\n\n{diagnosis(plan, message, language)}"
    return TestResult(name, 0.0, 2.0, f"Checked: something.\n\n{why}")


def _write_class(folder: Path, plans: dict[str, dict[str, str]], language: str = "en") -> None:
    """A results file per submission, as ``grade-batch --results-dir`` names them."""
    for student, plan in plans.items():
        report = Report(language=language)
        for exercise, what in plan.items():
            report.tests += [_case_line(exercise, case, what, language) for case in CASES[exercise]]
            if what == "policy":
                report.tests[-len(CASES[exercise]):] = [_case_line(exercise, c, "ok", language)
                                                        for c in CASES[exercise]]
                report.tests.append(TestResult(f"{exercise} policy: no library shortcut", 0, 0, POLICY, passed=False))
            if what == "reach":
                report.tests[-len(CASES[exercise]):] = [TestResult(f"{exercise} {c}", 0.0, 2.0, REACH)
                                                        for c in CASES[exercise]]
                report.tests.append(TestResult(f"{exercise} integrity: the grader's machinery left alone", 0, 0, REACH,
                                               passed=False))
        write_results(to_gradescope(report), folder / f"{student}.json")


def _planted_class() -> dict[str, dict[str, str]]:
    mistakes = ["missing_scale", "inverted_mask", "missing_scale"]
    plans = {f"s{i:02d}": {"ch03.attention": mistakes[i % 3] if i % 2 else "ok",
                           "ch03.softmax_saturation": "ok" if i % 4 else "ignores_scaled_flag",
                           "ch04.subsequent_mask": "ok"} for i in range(12)}
    plans["s00"]["ch04.subsequent_mask"] = "stub"
    plans["s02"]["ch03.attention"] = "crash"
    plans["s04"]["ch03.softmax_saturation"] = "timeout"
    plans["s06"]["ch04.subsequent_mask"] = "memory"
    plans["s08"]["ch03.attention"] = "policy"
    plans["s10"]["ch03.softmax_saturation"] = "reach"
    for student, name in zip(("s09", "s10", "s11"), HOSTILE.values(), strict=True):
        plans[name] = plans.pop(student)
    return plans


def _rows(markdown: str, header: str) -> list[list[str]]:
    """The rows of every Markdown table whose first header cell is ``header``, as cells."""
    rows, inside = [], False
    for line in markdown.splitlines():
        if line.startswith("| "):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            if cells[0] == header:
                inside = True
            elif inside and not line.startswith("|---"):
                rows.append(cells)
        else:
            inside = inside and line.startswith("|")
    return rows


@pytest.mark.fast
def test_counts_of_a_planted_class(tmp_path):
    plans = _planted_class()
    _write_class(tmp_path, plans)
    summary = read_results(tmp_path)
    assert len(summary.submissions) == 12 and summary.language == "en"
    assert summary.exercises == ["ch03.attention", "ch03.softmax_saturation", "ch04.subsequent_mask"]
    planted = Counter((e, what) for plan in plans.values() for e, what in plan.items())
    assert summary.mistakes("ch03.attention") == [
        ("missing_scale", "the message of missing_scale, with `code`", planted["ch03.attention", "missing_scale"]),
        ("inverted_mask", "the message of inverted_mask, with `code`", planted["ch03.attention", "inverted_mask"])]
    assert [n for *_, n in summary.mistakes("ch03.softmax_saturation")] == [
        planted["ch03.softmax_saturation", "ignores_scaled_flag"]]
    assert summary.mistakes("ch04.subsequent_mask") == []  # a stub, a memory limit: no mistake is named
    assert summary.stubs("ch04.subsequent_mask") == 1 and summary.stubs("ch03.attention") == 0
    wrong = sum(1 for plan in plans.values() if plan["ch03.attention"] not in ("ok", "policy"))
    assert summary.failed_cases("ch03.attention") == sorted(
        [(case, wrong) for case in CASES["ch03.attention"]])
    assert summary.scores("ch03.attention").count(6.0) == planted["ch03.attention", "ok"] + 1  # and the policy one
    incidents = {(f.submission, f.exercise, f.kind): f.detail for f in summary.flags(("crash", "timeout", "memory",
                                                                                      "error"))}
    assert incidents == {("s02", "ch03.attention", "crash"): CRASHED, ("s04", "ch03.softmax_saturation", "timeout"):
                         TIMED_OUT, ("s06", "ch04.subsequent_mask", "memory"):
                         "exceeded the memory limit: RuntimeError: DefaultCPUAllocator: can't allocate memory"}
    assert {(f.submission, f.exercise, f.kind, f.detail) for f in summary.flags(("policy", "integrity"))} == {
        ("s08", "ch03.attention", "policy", POLICY),
        (HOSTILE["ansi"], "ch03.softmax_saturation", "integrity", REACH)}  # s10, renamed

    markdown = render_markdown(summary)
    mistakes = _rows(markdown, "Diagnosis")
    assert mistakes[:2] == [[r"missing\_scale: the message of missing\_scale, with \`code\`", "4"],
                            [r"inverted\_mask: the message of inverted\_mask, with \`code\`", "2"]]
    assert "planted" not in markdown  # a diagnosis inside the student's fenced error is not the grader's
    kinds = {(r[0], r[2]) for r in _rows(markdown, "Submission") if len(r) == 4}
    assert {("s02", "crash"), ("s04", "time-out"), ("s06", "memory limit"), ("s08", "library shortcut")} <= kinds
    students = [r for r in _rows(markdown, "Submission") if len(r) == 6]
    assert len(students) == 12


@pytest.mark.fast
def test_student_controlled_text_is_escaped(tmp_path):
    plans = _planted_class()
    _write_class(tmp_path, plans)
    # An import error quotes the student's words inline (``code``): the report shows that line for review.
    unsafe_error = "ImportError: ## Score: 10/10 | <img src=x onerror=alert(1)> \x1b[2J \u2066x\u2069"
    tampered = Report(tests=[TestResult("ch03.attention hidden: causal mask", 0.0, 6.0,
                                        f"`attention` is not defined after running your code: an import failed "
                                        f"({code('`tfm_solution` is not available while grading: ' + unsafe_error)})")])
    write_results(to_gradescope(tampered), tmp_path / "## Score 10 of 10.json")
    write_results(error_results("Traceback\nValueError: <b>bold</b>"), tmp_path / "broken.json")
    (tmp_path / "unreadable.json").write_text("{oops")
    summary = read_results(tmp_path)
    # A gradebook's student ids are anything nbgrader was given, slashes included.
    summary.gradebook = [GradebookRow("</script><script>alert(2)</script>", "03_attention", "attention", 1.0, 10.0)]
    kinds = {f.submission: f.kind for f in summary.flags(("error", "integrity"))}
    assert kinds == {"## Score 10 of 10": "integrity", "broken": "error", "unreadable": "error",
                     HOSTILE["ansi"]: "integrity"}

    page = render_html(summary)
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)" in page
    assert "&lt;/script&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in page
    assert "<img src=x" not in page and "<b>bold" not in page and "&lt;b&gt;bold" in page
    assert not re.search("[\x1b\u202e\u2066\u2069]", page)
    assert "[31mred" in page and "abcevil.exe" in page  # the text stays, without its controls
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)  # nothing fetched: it works offline
    assert "default-src 'none'" in page and page.count("<script>") == 1
    png = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert png and base64.b64decode(png.group(1)).startswith(b"\x89PNG")

    markdown = render_markdown(summary)
    assert not re.search("[\x1b\u202e\u2066\u2069]", markdown)
    assert r"\<script\>alert(1)" in markdown and r"\</script\>\<script\>alert(2)" in markdown
    assert r"\#\# Score 10 of 10" in markdown
    assert r"\#\# Score: 10/10 \| \<img src=x onerror=alert(1)\>" in markdown
    for line in markdown.splitlines():
        assert not line.startswith(("## Score", "<")), line
        if line.startswith("|"):  # an escaped | never ends a cell: every row has its header's cells
            assert len(re.split(r"(?<!\\)\|", line)) in (4, 6, 8), line


@pytest.mark.fast
def test_a_chinese_class_gets_a_chinese_report(tmp_path):
    plans = {f"s{i}": {"ch03.attention": "missing_scale" if i < 3 else "ok"} for i in range(5)}
    _write_class(tmp_path, plans, language="zh")
    summary = read_results(tmp_path)
    assert summary.language == "zh"
    page, markdown = render_html(summary), render_markdown(summary)
    assert '<html lang="zh">' in page and "全班概览" in page and "诊断出的已知错误" in page
    assert _rows(markdown, "诊断") == [[r"missing\_scale: 得分没有除以 sqrt(d\_k)（缺少缩放）：d\_k 较大时 softmax 会饱和", "3"]]
    assert "The class at a glance" not in page + markdown


@pytest.mark.fast
@pytest.mark.filterwarnings("ignore:Object of type")  # nbgrader's own SQLAlchemy warnings while it adds a submission
def test_gradebook_points_per_student_and_notebook(tmp_path, monkeypatch):
    from nbgrader.api import Gradebook

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # its alembic
    database = tmp_path / "gradebook.db"
    with Gradebook(f"sqlite:///{database}") as gradebook:
        gradebook.update_or_create_assignment("03_attention")
        gradebook.add_notebook("attention", "03_attention")
        gradebook.add_grade_cell("ch03-attention-tests", "attention", "03_attention", max_score=6, cell_type="code")
        gradebook.add_grade_cell("ch03-softmax-saturation-tests", "attention", "03_attention", max_score=4,
                                 cell_type="code")
        for student, attention, manual in (("ada", 4.5, None), ("## Score: 10/10", 1.0, 6.0)):
            gradebook.add_student(student)
            gradebook.add_submission("03_attention", student)
            grade = gradebook.find_grade("ch03-attention-tests", "attention", "03_attention", student)
            grade.auto_score, grade.manual_score = attention, manual
            gradebook.find_grade("ch03-softmax-saturation-tests", "attention", "03_attention", student).auto_score = 4
        gradebook.db.commit()
    before = database.read_bytes()
    rows = {r.student: (r.assignment, r.notebook, r.score, r.max_score) for r in read_gradebook(database)}
    assert rows == {"ada": ("03_attention", "attention", 8.5, 10.0),
                    "## Score: 10/10": ("03_attention", "attention", 10.0, 10.0)}  # the manual grade wins
    _write_class(tmp_path / "results", {"ada": {"ch03.attention": "ok"}})
    out = tmp_path / "report.md"
    run = subprocess.run([*CLI, "report", str(tmp_path / "results"), "--format", "md", "--out", str(out),
                          "--gradebook", str(database)], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert _rows(out.read_text(), "Student") == [[r"\#\# Score: 10/10", "10 / 10"], ["ada", "8.5 / 10"]]
    assert database.read_bytes() == before  # read-only


def _timed_report(results: Path, out: Path) -> float:
    """Seconds ``python -m autograder report results --out out`` takes, as a teacher runs it (it must succeed)."""
    start = time.perf_counter()
    run = subprocess.run([*CLI, "report", str(results), "--out", str(out)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    return time.perf_counter() - start


@pytest.mark.fast
def test_a_thousand_results_files_in_under_a_minute(tmp_path):
    rng = random.Random(1000)
    choices = ["ok", "ok", "missing_scale", "inverted_mask", "stub"]
    _write_class(tmp_path, {f"student{i:04d}": {e: rng.choice(choices) for e in CASES} for i in range(1000)})
    seconds = _timed_report(tmp_path, tmp_path / "report.html")
    print(f"report of 1,000 results files: {seconds:.1f} s")
    assert seconds < 60
    assert (tmp_path / "report.html").read_text().count('<td class="n" data-v=') >= 1000 * 4


def _plan_class(rng: random.Random) -> dict[str, dict[str, str]]:
    """What each of 40 submissions of chapter 3 does per exercise: a seeded mixture of right answers and declared
    mistakes, with four untouched stubs, one crash, one time-out, one memory limit and one library shortcut."""
    exercises = ("ch03.attention", "ch03.softmax_saturation")
    plans = {f"student{i:02d}": {e: rng.choice(["ok", "ok", *by_id(e).mistakes]) for e in exercises}
             for i in range(40)}
    plans["student00"]["ch03.attention"] = "crash"
    plans["student01"]["ch03.softmax_saturation"] = "timeout"
    plans["student02"]["ch03.softmax_saturation"] = "memory"
    plans["student03"]["ch03.attention"] = "policy"
    for student in ("student04", "student05", "student06", "student07"):
        plans[student] = {e: "stub" for e in exercises}
    return plans


_PLANTED = {
    "crash": "import os\n\nos._exit(3)\n",  # while the notebook's code loads: one worker, not one per case
    "timeout": "def softmax_saturation(query, key, scaled=True):\n    while True:\n        pass\n",
    "memory": "import torch\n\ndef softmax_saturation(query, key, scaled=True):\n    return torch.empty(2 ** 42)\n",
}


@pytest.mark.slow
def test_report_of_a_graded_class_counts_what_was_planted(tmp_path):
    """40 submissions of chapter 3 graded by ``grade-batch``: the report names each planted mistake for exactly the
    submissions it was planted in, and finds the crash, the time-out, the memory limit and the shortcut."""
    release = REPO_ROOT / "chapters" / "03_attention" / "attention.ipynb"
    solution = solution_answers(REPO_ROOT / "solutions" / "03_attention" / "attention.ipynb")
    plans = _plan_class(random.Random(37))
    for student, plan in plans.items():
        answers = {}
        for exercise, what in plan.items():
            if what in ("ok", "policy"):
                answers[exercise] = solution[exercise]
            elif what in _PLANTED:
                answers[exercise] = _PLANTED[what]
            elif what != "stub":
                answers[exercise] = submission_source(exercise, what)
        if plan["ch03.attention"] == "policy":  # a right answer that reaches for the library's attention
            answers["ch03.attention"] = ("import torch\n_fast = torch.nn.functional.scaled_dot_product_attention\n"
                                         + answers["ch03.attention"])
        release_with(release, tmp_path / "submissions" / student, answers)
    results = tmp_path / "results"
    graded = subprocess.run([*CLI, "grade-batch", str(tmp_path / "submissions"), "--chapter", "03", "--jobs", "2",
                             "--out", str(tmp_path / "grades.csv"), "--results-dir", str(results)],
                            capture_output=True, text=True, timeout=600, check=False)
    assert graded.returncode == 0, graded.stderr[-3000:]

    seconds = _timed_report(results, tmp_path / "report.html")
    print(f"report of 40 graded submissions: {seconds:.1f} s")
    markdown = subprocess.run([*CLI, "report", str(results), "--format", "md"], capture_output=True, text=True,
                              timeout=120, check=True).stdout

    planted = Counter((e, what) for plan in plans.values() for e, what in plan.items())
    summary = read_results(results)
    assert len(summary.submissions) == 40
    for exercise in ("ch03.attention", "ch03.softmax_saturation"):
        named = {name: n for name, _, n in summary.mistakes(exercise)}
        assert named == {m: planted[exercise, m] for m in by_id(exercise).mistakes if planted[exercise, m]}, exercise
        assert summary.stubs(exercise) == 4
        full = planted[exercise, "ok"] + planted[exercise, "policy"]
        assert summary.scores(exercise).count(float(by_id(exercise).points)) == full, exercise
        wrong = 40 - full
        assert all(5 <= n <= wrong for _, n in summary.failed_cases(exercise)), summary.failed_cases(exercise)
    incidents = {(f.submission, f.exercise, f.kind) for f in summary.flags(("crash", "timeout", "memory", "error"))}
    assert incidents == {("student00", "ch03.attention", "crash"), ("student01", "ch03.softmax_saturation", "timeout"),
                         ("student02", "ch03.softmax_saturation", "memory")}
    review = {(f.submission, f.exercise, f.kind) for f in summary.flags(("policy", "integrity"))}
    assert review == {("student03", "ch03.attention", "policy")}

    # What an instructor reads says the same.
    for exercise in ("ch03.attention", "ch03.softmax_saturation"):
        section = markdown.split(f"### {exercise.replace('_', chr(92) + '_')}")[1].split("###")[0]
        counts = {r[0].split(":")[0].replace("\\", ""): int(r[1]) for r in _rows(section, "Diagnosis")}
        assert counts == {m: planted[exercise, m] for m in by_id(exercise).mistakes if planted[exercise, m]}
    students = [r for r in _rows(markdown, "Submission") if len(r) == 5]
    assert sorted(r[0] for r in students) == sorted(plans)
    page = (tmp_path / "report.html").read_text()
    assert page.count('<img alt=') == 1 and 'class="sortable"' in page
    assert seconds < 15  # measured about 2 s; the margin is for a machine shared with other work


@pytest.mark.slow
@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="the browser test drives Debian's Chromium")
def test_the_report_renders_offline_in_a_browser_and_sorts(tmp_path):
    """The page a teacher opens: every figure decodes and has a size, nothing is fetched from the network (every
    request but the page itself is refused and counted), no script error, and a heading sorts the students' table."""
    from playwright.sync_api import sync_playwright

    plans = _planted_class()
    _write_class(tmp_path / "results", plans)
    page_path = tmp_path / "report.html"
    page_path.write_text(render_html(read_results(tmp_path / "results")), encoding="utf-8")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        fetched, errors = [], []
        page.route("**/*", lambda route: route.continue_() if route.request.url == page_path.as_uri()
                   else (fetched.append(route.request.url), route.abort()))
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(page_path.as_uri())
        figures = page.eval_on_selector_all("img", "els => els.map(e => [e.complete, e.naturalWidth, e.naturalHeight])")
        assert figures and all(done and width > 100 and height > 50 for done, width, height in figures), figures
        assert not fetched and not errors, (fetched, errors)
        sizes = page.eval_on_selector_all("table.sortable", "ts => ts.map(t => t.tBodies[0].rows.length)")
        assert len(plans) in sizes, sizes  # the students x exercises table
        table = page.locator("table.sortable").nth(sizes.index(len(plans)))
        first = table.locator("tbody tr td:first-child").all_inner_texts()
        table.locator("th").first.click()
        once = table.locator("tbody tr td:first-child").all_inner_texts()
        table.locator("th").first.click()
        twice = table.locator("tbody tr td:first-child").all_inner_texts()
        assert sorted(once) == sorted(first) and twice == once[::-1] and once != twice, (once, twice)
        assert "<script>" in page.inner_text("body")  # a student's name shown as text, never run
        browser.close()
