"""``python -m autograder report RESULTS_DIR``: the class at a glance, from the results of ``grade-batch``.

``read_results`` reads every ``results.json`` that ``grade-batch --results-dir`` kept (one per
submission) into a ``ClassSummary``: per exercise, the scores, the declared mistakes the grader
named and the cases failed most often; per submission, its crashes, time-outs and memory limits,
and the lines an instructor should read before the grades go out (a library shortcut, a sign of
tampering). ``read_gradebook`` adds nbgrader's points per student and notebook, read-only.
``render_html`` writes one self-contained page (figures inline, a table that sorts itself, nothing
fetched from the network) and ``render_markdown`` the same as Markdown tables.

Everything here is read from the grader's own words, so the report needs neither torch nor the
course's code. Those words are matched outside the code blocks that quote a student's code (what
it raised or printed): a student cannot plant a diagnosis or an incident in the report. Whatever a
student controls that the report shows (a submission's name, a quoted line) is escaped on the way
out, and the report's own words follow the course's language.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import re
import sqlite3
import statistics
import sys
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from autograder.results import ERROR_NOTE, ERROR_TEST, graded

_EXERCISE_LINE = re.compile(r"(ch\d\d\.\w+) (.+)", re.S)
_DIAGNOSIS = re.compile(r"^\*\*(?:Diagnosis: |诊断：)([^*\n]+)\*\*[:：]?[ \t]*(.*)$", re.M)
_FENCE = re.compile(r"^(`{3,})[^`\n]*\n.*?^\1[ \t]*$", re.M | re.S)
# C0 and C1 controls but tab and newline, and the bidi embeddings, overrides and isolates, which
# can make a name read as something else.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~&])")

# What the grader says when something other than a wrong answer happened, in the order they are tried
# (a worker killed by SIGKILL also "died before answering": the memory limit is the cause to report).
# The words are the grader's own (grade.py, sandbox.py, sandboxed/procedure.py, extract.py); the tests, one of which
# grades a class for real, keep them in step.
_INCIDENTS = (
    ("memory", "exceeded the memory limit"),
    ("memory", "ran out of memory"),
    ("memory", "likely the memory or CPU limit"),
    ("timeout", "timed out after"),
    ("timeout", "CPU time limit"),
    ("integrity", "sent a malformed reply"),
    ("integrity", "answered out of turn"),
    ("integrity", "returned more data than the size cap"),
    ("crash", "died before answering"),
    ("integrity", "is not available while grading"),
    ("integrity", "is not allowed in an answer"),
    ("integrity", "cells carry the answer id"),
    ("integrity", "(metadata edited?)"),
    ("integrity", "after the answer cell"),
    ("error", ERROR_NOTE),
)
_NOT_IMPLEMENTED = "not implemented yet"
INCIDENT_KINDS = ("crash", "timeout", "memory", "error")
REVIEW_KINDS = ("policy", "integrity")
DETAIL_CAP = 300

LABELS = {
    "en": {
        "title": "The class at a glance",
        "lede": "{n} submissions; median total {median} of {max}; {full} with full marks. Crashes, time-outs "
                "and memory limits: {incidents}. Lines to review: {review}.",
        "chapter": "Chapter {n}",
        "figure": "Scores of each exercise in chapter {n}: points across, submissions up.",
        "exercise": "{points} points; median {median}; {stubs} still a stub.",
        "mistakes": "Named mistakes",
        "mistake": "Diagnosis",
        "count": "Submissions",
        "points": "Points",
        "no_mistakes": "No declared mistake was named.",
        "cases": "Cases failed most often",
        "case": "Case",
        "no_cases": "No case failed.",
        "incidents": "Crashes, time-outs and memory limits",
        "review": "For review: library shortcuts and integrity",
        "review_note": "Read each line before the grades go out: the grader marks these, the decision is yours.",
        "submission": "Submission",
        "exercise_col": "Exercise",
        "what": "What happened",
        "detail": "Detail",
        "none": "None.",
        "students": "Students × exercises",
        "students_note": "Select a column's heading to sort by it; select it again to reverse.",
        "total": "Total",
        "flags": "Flags",
        "gradebook": "nbgrader's gradebook",
        "student": "Student",
        "kind.crash": "crash",
        "kind.timeout": "time-out",
        "kind.memory": "memory limit",
        "kind.error": "not graded",
        "kind.policy": "library shortcut",
        "kind.integrity": "integrity",
    },
    "zh": {
        "title": "全班概览",
        "lede": "共 {n} 份提交；总分中位数 {median}（满分 {max}）；{full} 份满分。崩溃、超时与内存超限：{incidents}。"
                "待复核的行：{review}。",
        "chapter": "第 {n} 章",
        "figure": "第 {n} 章各练习的得分分布：横轴为分数，纵轴为提交份数。",
        "exercise": "满分 {points}；中位数 {median}；{stubs} 份仍是桩代码。",
        "mistakes": "诊断出的已知错误",
        "mistake": "诊断",
        "count": "提交份数",
        "points": "得分",
        "no_mistakes": "没有诊断出已知错误。",
        "cases": "失败最多的测试用例",
        "case": "测试用例",
        "no_cases": "没有失败的测试用例。",
        "incidents": "崩溃、超时与内存超限",
        "review": "待复核：库函数捷径与完整性",
        "review_note": "成绩发出之前，请逐行阅读：评分器只负责标出，如何处理由你决定。",
        "submission": "提交",
        "exercise_col": "练习",
        "what": "情况",
        "detail": "详情",
        "none": "无。",
        "students": "学生 × 练习",
        "students_note": "点击列标题即按该列排序，再点击一次则反向排序。",
        "total": "总分",
        "flags": "标记",
        "gradebook": "nbgrader 成绩簿",
        "student": "学生",
        "kind.crash": "崩溃",
        "kind.timeout": "超时",
        "kind.memory": "内存超限",
        "kind.error": "未能评分",
        "kind.policy": "库函数捷径",
        "kind.integrity": "完整性",
    },
}


@dataclass
class ExerciseResult:
    """One exercise of one submission: its points, the cases it failed and the mistakes named on them."""

    score: float = 0.0
    max_score: float = 0.0
    failed_cases: list[str] = field(default_factory=list)
    mistakes: dict[str, str] = field(default_factory=dict)  # the diagnosis's name -> its message
    cases: int = 0
    stubbed_cases: int = 0

    @property
    def stub(self) -> bool:
        """Every graded case met the stub's ``NotImplementedError``: the exercise was not attempted."""
        return self.cases > 0 and self.stubbed_cases == self.cases


@dataclass(frozen=True)
class Flag:
    """Something an instructor should know of one submission: a kind (one of ``INCIDENT_KINDS`` or
    ``REVIEW_KINDS``) and the grader's line that says so."""

    submission: str
    exercise: str  # "" for the run as a whole
    kind: str
    detail: str


@dataclass
class Submission:
    """What the grader recorded of one submission."""

    name: str
    score: float
    max_score: float
    language: str = "en"
    exercises: dict[str, ExerciseResult] = field(default_factory=dict)
    flags: list[Flag] = field(default_factory=list)


@dataclass(frozen=True)
class GradebookRow:
    """nbgrader's points of one student's notebook (manual grades over automatic ones, extra credit added)."""

    student: str
    assignment: str
    notebook: str
    score: float
    max_score: float


@dataclass
class ClassSummary:
    """The whole class: its submissions, the exercises in course order, and nbgrader's points if given."""

    submissions: list[Submission]
    gradebook: list[GradebookRow] = field(default_factory=list)

    @property
    def exercises(self) -> list[str]:
        """Every exercise any submission was graded on, by chapter, in the grader's order within one."""
        seen: dict[str, None] = {}
        for submission in self.submissions:
            seen.update(dict.fromkeys(submission.exercises))
        return sorted(seen, key=lambda e: int(e[2:4]))

    @property
    def language(self) -> str:
        """"zh" when most submissions were graded as Chinese notebooks, else "en"."""
        chinese = sum(s.language == "zh" for s in self.submissions)
        return "zh" if 2 * chinese > len(self.submissions) else "en"

    def chapters(self) -> dict[int, list[str]]:
        """Chapter number -> its exercises."""
        chapters: dict[int, list[str]] = {}
        for exercise in self.exercises:
            chapters.setdefault(int(exercise[2:4]), []).append(exercise)
        return chapters

    def points(self, exercise: str) -> float:
        """What ``exercise`` is worth (its most, should a submission's results lack a case)."""
        return max((s.exercises[exercise].max_score for s in self.submissions if exercise in s.exercises), default=0.0)

    def scores(self, exercise: str) -> list[float]:
        """The points of every submission graded on ``exercise``."""
        return [s.exercises[exercise].score for s in self.submissions if exercise in s.exercises]

    def stubs(self, exercise: str) -> int:
        """How many submissions left ``exercise`` as the release's stub."""
        return sum(s.exercises[exercise].stub for s in self.submissions if exercise in s.exercises)

    def mistakes(self, exercise: str) -> list[tuple[str, str, int]]:
        """``(name, message, submissions)`` of each mistake named on ``exercise``, the most frequent first."""
        counts: Counter[str] = Counter()
        messages: dict[str, str] = {}
        for s in self.submissions:
            found = s.exercises.get(exercise)
            for name, message in (found.mistakes.items() if found else ()):
                counts[name] += 1
                messages.setdefault(name, message)
        return [(name, messages[name], n) for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]

    def failed_cases(self, exercise: str) -> list[tuple[str, int]]:
        """``(case, submissions that failed it)``, the most often failed first."""
        counts = Counter(case for s in self.submissions if exercise in s.exercises
                         for case in set(s.exercises[exercise].failed_cases))
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))

    def flags(self, kinds: tuple[str, ...]) -> list[Flag]:
        """Every submission's flags of these ``kinds``, by submission."""
        return [f for s in self.submissions for f in s.flags if f.kind in kinds]


def _outside_code(text: str) -> str:
    """``text`` without its fenced code blocks: the grader fences everything a student's code says."""
    return _FENCE.sub("", text)


def _paragraphs(text: str) -> list[tuple[str, str]]:
    """``(the grader's words, what they quote)`` for each paragraph of ``text`` outside its code blocks: a paragraph
    that introduces a quote ("exceeded the memory limit:") comes with the quote's first line, so that the report can
    say what was raised, while no phrase is ever looked for in what a student's code wrote."""
    found: list[tuple[str, str]] = []
    start = 0
    for quote in [*_FENCE.finditer(text), None]:
        prose = text[start: quote.start() if quote else len(text)]
        found += [(p.strip(), "") for p in prose.split("\n\n") if p.strip()]
        if quote:
            start = quote.end()
            first = next((line for line in quote.group(0).splitlines()[1:-1] if line.strip()), "")
            if found and found[-1][0].endswith(":"):
                found[-1] = (found[-1][0], first)
    return found


def _incidents(text: str) -> list[tuple[str, str]]:
    """``(kind, the paragraph that says so)`` for each paragraph of the grader's own words naming one."""
    found = []
    for own, quoted in _paragraphs(text):
        kind = next((k for k, phrase in _INCIDENTS if phrase in own), None)
        if kind:
            found.append((kind, f"{own} {quoted}".strip()))
    return found


def _error_detail(output: str) -> str:
    """The last line of what a grader failure quotes (a traceback's last line names the exception)."""
    lines = [line for line in output.splitlines() if line.strip() and not line.startswith("```")]
    return lines[-1] if lines else ""


def read_submission(path: Path) -> Submission:
    """One ``results.json`` as ``grade-batch`` wrote it, named after the submission (the file's name); a file that
    cannot be read is a submission flagged as not graded, never the end of the report."""
    name = path.name.removesuffix(".json")
    try:
        return _submission(name, json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return Submission(name, 0.0, 0.0, flags=[Flag(name, "", "error", f"unreadable results file ({exc!r})")])


def _submission(name: str, data: dict) -> Submission:
    language = (data.get("extra_data") or {}).get("language")
    data = graded(data)  # the grader's own words, whatever language the student was shown
    tests = data["tests"]
    max_score = (data.get("extra_data") or {}).get("max_score", sum(t.get("max_score", 0) for t in tests))
    submission = Submission(name, float(data.get("score", 0)), float(max_score),
                            language="zh" if language == "zh" else "en")
    flagged: set[tuple[str, str]] = set()

    def flag(exercise: str, kind: str, detail: str) -> None:
        if (exercise, kind) not in flagged:  # one flag of a kind per exercise: a time-out fails many cases
            flagged.add((exercise, kind))
            submission.flags.append(Flag(name, exercise, kind, detail[:DETAIL_CAP]))

    for test in tests:
        title, output = str(test.get("name", "")), str(test.get("output", ""))
        failed = test.get("status") == "failed"
        if title == ERROR_TEST:
            flag("", "error", _error_detail(output))
            continue
        line = _EXERCISE_LINE.fullmatch(title)
        if line is None:
            continue
        exercise, rest = line.groups()
        result = submission.exercises.setdefault(exercise, ExerciseResult())
        result.score = round(result.score + float(test.get("score", 0)), 2)
        result.max_score = round(result.max_score + float(test.get("max_score", 0)), 2)
        if rest.startswith(("public: ", "hidden: ")):
            result.cases += 1
            result.stubbed_cases += _NOT_IMPLEMENTED in _outside_code(output)
        if failed and test.get("max_score", 0) > 0:
            result.failed_cases.append(rest)
        kind = rest.partition(": ")[0]
        if failed and kind in REVIEW_KINDS:  # a 0-point line of its own: "ch03.attention policy: no library shortcut"
            flag(exercise, kind, next((own for own, _ in _paragraphs(output)), rest))
        for mistake, message in _DIAGNOSIS.findall(_outside_code(output)):
            result.mistakes.setdefault(mistake.strip(), message.strip().rstrip(".。"))
        for kind, paragraph in _incidents(output):
            flag(exercise, kind, paragraph)
    return submission


def read_results(folder: Path) -> ClassSummary:
    """Every ``*.json`` of a ``grade-batch --results-dir`` folder, by submission name."""
    return ClassSummary([read_submission(p) for p in sorted(folder.glob("*.json")) if not p.name.startswith(".")])


_GRADEBOOK_QUERY = """
SELECT sa.student_id, a.name, n.name,
       SUM(CASE WHEN g.manual_score IS NOT NULL THEN g.manual_score + COALESCE(g.extra_credit, 0)
                WHEN g.auto_score IS NOT NULL THEN g.auto_score + COALESCE(g.extra_credit, 0)
                ELSE 0 END),
       SUM(gc.max_score)
FROM grade g
JOIN submitted_notebook sn ON g.notebook_id = sn.id
JOIN submitted_assignment sa ON sn.assignment_id = sa.id
JOIN assignment a ON sa.assignment_id = a.id
JOIN notebook n ON sn.notebook_id = n.id
JOIN grade_cells gc ON g.cell_id = gc.id
GROUP BY sa.student_id, a.name, n.name
ORDER BY sa.student_id, a.name, n.name
"""


def read_gradebook(path: Path) -> list[GradebookRow]:
    """nbgrader's points per student and notebook, as its ``Grade.score`` counts them. The database is
    opened read-only: a report never changes a gradebook, even one nbgrader is writing at the time."""
    if not path.is_file():
        raise FileNotFoundError(path)
    with closing(sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)) as db:
        rows = db.execute(_GRADEBOOK_QUERY).fetchall()
    return [GradebookRow(str(s), str(a), str(n), round(float(score), 2), round(float(top), 2))
            for s, a, n, score, top in rows]


def safe(text: str) -> str:
    """``text`` without control characters (tab and newline stay) and bidi overrides, which could hide or
    reorder what the report shows."""
    return _UNSAFE.sub("", str(text))


def escape_html(text: str) -> str:
    """Student-controlled text as inert HTML."""
    return html.escape(safe(text), quote=True)


def escape_markdown(text: str) -> str:
    """Student-controlled text as inert Markdown in one table cell: on one line, every character that could
    start markup (a heading, emphasis, code, a link, HTML, an entity, the cell's end) escaped."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(safe(text).split()))


def _number(value: float) -> str:
    return f"{value:g}"


def _median(values: list[float]) -> str:
    return _number(round(statistics.median(values), 2)) if values else "-"


def _overview(summary: ClassSummary, words: dict[str, str]) -> str:
    totals = [s.score for s in summary.submissions]
    top = max((s.max_score for s in summary.submissions), default=0.0)
    full = sum(top > 0 and s.score >= top for s in summary.submissions)
    return words["lede"].format(n=len(totals), median=_median(totals), max=_number(top), full=full,
                                incidents=len(summary.flags(INCIDENT_KINDS)), review=len(summary.flags(REVIEW_KINDS)))


def _exercise_note(summary: ClassSummary, exercise: str, words: dict[str, str]) -> str:
    return words["exercise"].format(points=_number(summary.points(exercise)), median=_median(summary.scores(exercise)),
                                    stubs=summary.stubs(exercise))


def _figure(summary: ClassSummary, chapter: int, exercises: list[str]) -> str:
    """The score distributions of a chapter's exercises as a base64 PNG (Agg: no display, no global state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    columns = min(len(exercises), 3)
    rows = -(-len(exercises) // columns)
    figure = Figure(figsize=(3.6 * columns, 2.5 * rows), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    for index, exercise in enumerate(exercises):
        axes = figure.add_subplot(rows, columns, index + 1)
        points, scores = summary.points(exercise), summary.scores(exercise)
        counts = Counter(scores)
        if len(counts) <= 12:  # a few possible scores (a case is worth a fixed share): one bar each
            values = sorted(counts)
            axes.bar(range(len(values)), [counts[v] for v in values], color="#3b6ea5")
            axes.set_xticks(range(len(values)), [_number(v) for v in values])
        else:
            axes.hist(scores, bins=10, range=(0, points or None), color="#3b6ea5", edgecolor="white")
        for container in axes.containers:
            axes.bar_label(container, fontsize=8)
        # Words stay out of the figure (the page gives them in the course's language); ids are ASCII.
        axes.set_title(f"{exercise}  (/{_number(points)})", fontsize=10)
        axes.margins(y=0.18)
        axes.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts of submissions
        axes.spines[["top", "right"]].set_visible(False)
        axes.tick_params(labelsize=8)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


_STYLE = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI","Noto Sans","Noto Sans CJK SC",sans-serif;color:#1f2937;
max-width:1100px;margin:2em auto;padding:0 1.2em}
h1{margin-bottom:.2em}h2{margin-top:2em;border-bottom:2px solid #e5e7eb;padding-bottom:.2em}
h3{margin:1.4em 0 .2em;font-family:ui-monospace,monospace}.lede{font-size:1.1em;color:#374151}
.note{color:#6b7280}img{max-width:100%}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:14px}
th,td{border-bottom:1px solid #e5e7eb;padding:.25em .7em;text-align:left;vertical-align:top}
th{background:#f3f4f6}td.n{text-align:right;font-variant-numeric:tabular-nums}
.sortable th{cursor:pointer;user-select:none}.sortable th:after{content:" \\2195";color:#9ca3af}
.bar{width:110px}.bar span{display:block;height:.8em;margin-top:.35em;background:#3b6ea5;border-radius:2px}
.two{display:flex;gap:2em;flex-wrap:wrap}.two>div:first-child{flex:3 1 480px}.two>div{flex:2 1 340px}
.two table{width:100%}
.detail{max-width:560px;font-size:13px;color:#374151;overflow-wrap:anywhere}
.flag{display:inline-block;background:#fef3c7;color:#92400e;border-radius:3px;padding:0 .35em;margin:0 .15em;
font-size:12px}
code{background:#f3f4f6;padding:0 .2em;border-radius:2px}
"""

# Sorting by a column: numbers by the value they carry (data-v), words as words; nothing is fetched.
_SCRIPT = """
document.querySelectorAll("table.sortable th").forEach((th, i) => th.addEventListener("click", () => {
  const body = th.closest("table").tBodies[0], up = th.dataset.dir !== "up";
  th.closest("tr").querySelectorAll("th").forEach(h => delete h.dataset.dir);
  th.dataset.dir = up ? "up" : "down";
  const key = row => row.cells[i].dataset.v ?? row.cells[i].textContent;
  const order = (a, b) => {
    const x = key(a), y = key(b), nx = parseFloat(x), ny = parseFloat(y);
    return isNaN(nx) || isNaN(ny) ? x.localeCompare(y) : nx - ny;
  };
  [...body.rows].sort((a, b) => up ? order(a, b) : order(b, a)).forEach(row => body.appendChild(row));
}));
"""


def _html_table(head: list[str], rows: list[list[str]], css_class: str = "") -> str:
    """A table whose cells are HTML already (escaped by the caller); a cell that is a whole ``<td ...>`` element
    (for its class or sort value) is used as it is (escaped text never starts with ``<``)."""
    head_html = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(cell if cell.startswith("<td") else f"<td>{cell}</td>" for cell in row)
                   + "</tr>" for row in rows)
    attribute = f' class="{css_class}"' if css_class else ""
    return f"<table{attribute}><thead><tr>{head_html}</tr></thead><tbody>{body}</tbody></table>"


def _grader_words(message: str) -> str:
    """A diagnosis's message (the grader's words) as HTML, its `code` spans as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape_html(message))


def _flag_rows(flags: list[Flag], words: dict[str, str]) -> list[list[str]]:
    return [[escape_html(f.submission), escape_html(f.exercise), words[f"kind.{f.kind}"],
             f'<td class="detail">{escape_html(f.detail)}</td>'] for f in flags]


def _exercise_html(summary: ClassSummary, exercise: str, words: dict[str, str]) -> str:
    """One exercise's section: its named mistakes and its most failed cases, each with a bar for its share of the
    submissions graded on the exercise."""
    graded = max(len(summary.scores(exercise)), 1)
    mistakes, cases = summary.mistakes(exercise), summary.failed_cases(exercise)[:8]

    def count(n: int) -> list[str]:
        return [f'<td class="n">{n}</td>', f'<td class="bar"><span style="width:{100 * n / graded:.0f}%"></span></td>']

    left = _html_table([words["mistake"], words["count"], ""],
                       [[f"<b>{escape_html(name)}</b>: {_grader_words(message)}", *count(n)]
                        for name, message, n in mistakes]) if mistakes else f"<p>{words['no_mistakes']}</p>"
    right = _html_table([words["case"], words["count"], ""], [[escape_html(case), *count(n)] for case, n in cases]) \
        if cases else f"<p>{words['no_cases']}</p>"
    return (f"<h3>{escape_html(exercise)}</h3>"
            f'<p class="note">{_exercise_note(summary, exercise, words)}</p>'
            f'<div class="two"><div><h4>{words["mistakes"]}</h4>{left}</div>'
            f'<div><h4>{words["cases"]}</h4>{right}</div></div>')


def render_html(summary: ClassSummary) -> str:
    """The report as one self-contained HTML page."""
    words = LABELS[summary.language]
    parts = [f"<h1>{words['title']}</h1>", f'<p class="lede">{escape_html(_overview(summary, words))}</p>']
    for chapter, exercises in summary.chapters().items():
        parts.append(f"<h2>{words['chapter'].format(n=chapter)}</h2>")
        parts.append(f'<img alt="{escape_html(words["figure"].format(n=chapter))}" '
                     f'src="data:image/png;base64,{_figure(summary, chapter, exercises)}">')
        parts.append(f'<p class="note">{words["figure"].format(n=chapter)}</p>')
        parts += [_exercise_html(summary, exercise, words) for exercise in exercises]
    head = [words["submission"], words["exercise_col"], words["what"], words["detail"]]
    incidents, review = summary.flags(INCIDENT_KINDS), summary.flags(REVIEW_KINDS)
    parts.append(f"<h2>{words['incidents']}</h2>")
    parts.append(_html_table(head, _flag_rows(incidents, words)) if incidents else f"<p>{words['none']}</p>")
    parts.append(f"<h2>{words['review']}</h2><p class=\"note\">{words['review_note']}</p>")
    parts.append(_html_table(head, _flag_rows(review, words)) if review else f"<p>{words['none']}</p>")
    parts.append(f"<h2>{words['students']}</h2><p class=\"note\">{words['students_note']}</p>")
    parts.append(_students_html(summary, words))
    if summary.gradebook:
        parts.append(f"<h2>{words['gradebook']}</h2>")
        parts.append(_gradebook_html(summary.gradebook, words))
    # No request leaves the page: only inline styles and scripts and data: images are allowed.
    policy = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
    return (f'<!DOCTYPE html>\n<html lang="{summary.language}"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{policy}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{words['title']}</title><style>{_STYLE}</style></head><body>\n"
            + "\n".join(parts) + f"\n<script>{_SCRIPT}</script></body></html>\n")


def _students_html(summary: ClassSummary, words: dict[str, str]) -> str:
    exercises = summary.exercises
    rows = []
    for s in summary.submissions:
        total = f"{_number(s.score)} / {_number(s.max_score)}"
        cells = [escape_html(s.name), f'<td class="n" data-v="{s.score}">{total}</td>']
        for exercise in exercises:
            found = s.exercises.get(exercise)
            cells.append(f'<td class="n" data-v="{found.score}">{_number(found.score)}</td>' if found
                         else '<td class="n" data-v="-1">–</td>')
        kinds = dict.fromkeys(f.kind for f in s.flags)
        cells.append(f'<td data-v="{len(kinds)}">' + "".join(f'<span class="flag">{words[f"kind.{k}"]}</span>'
                                                             for k in kinds) + "</td>")
        rows.append(cells)
    head = [words["submission"], words["total"], *(escape_html(e) for e in exercises), words["flags"]]
    return _html_table(head, rows, "sortable")


def _notebooks(gradebook: list[GradebookRow]) -> list[tuple[str, str]]:
    return sorted({(r.assignment, r.notebook) for r in gradebook})


def _gradebook_html(gradebook: list[GradebookRow], words: dict[str, str]) -> str:
    notebooks = _notebooks(gradebook)
    by_student: dict[str, dict[tuple[str, str], GradebookRow]] = {}
    for row in gradebook:
        by_student.setdefault(row.student, {})[(row.assignment, row.notebook)] = row
    rows = []
    for student, marks in by_student.items():
        cells = [escape_html(student)]
        for notebook in notebooks:
            row = marks.get(notebook)
            cells.append(f'<td class="n" data-v="{row.score}">{_number(row.score)} / {_number(row.max_score)}</td>'
                         if row else '<td class="n" data-v="-1">–</td>')
        rows.append(cells)
    head = [words["student"], *(escape_html(f"{a}/{n}") for a, n in notebooks)]
    return _html_table(head, rows, "sortable")


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    """A Markdown table whose cells are escaped already."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(summary: ClassSummary) -> str:
    """The report as Markdown tables (the figures as tables of counts)."""
    words = LABELS[summary.language]
    md = escape_markdown
    out = [f"# {words['title']}", md(_overview(summary, words))]
    for chapter, exercises in summary.chapters().items():
        out.append(f"## {words['chapter'].format(n=chapter)}")
        for exercise in exercises:
            scores = summary.scores(exercise)
            out.append(f"### {md(exercise)}")
            out.append(md(_exercise_note(summary, exercise, words)))
            counts = Counter(scores)
            out.append(_md_table([words["points"], words["count"]],
                                 [[_number(v), str(counts[v])] for v in sorted(counts)]))
            mistakes, cases = summary.mistakes(exercise), summary.failed_cases(exercise)[:8]
            out.append(_md_table([words["mistake"], words["count"]],
                                 [[f"{md(name)}: {md(message)}", str(n)] for name, message, n in mistakes])
                       if mistakes else words["no_mistakes"])
            out.append(_md_table([words["case"], words["count"]], [[md(case), str(n)] for case, n in cases])
                       if cases else words["no_cases"])
    head = [words["submission"], words["exercise_col"], words["what"], words["detail"]]
    for title, note, kinds in ((words["incidents"], "", INCIDENT_KINDS),
                               (words["review"], words["review_note"], REVIEW_KINDS)):
        flags = summary.flags(kinds)
        out += [f"## {title}", *([note] if note else [])]
        out.append(_md_table(head, [[md(f.submission), md(f.exercise), words[f"kind.{f.kind}"], md(f.detail)]
                                    for f in flags]) if flags else words["none"])
    exercises = summary.exercises
    out.append(f"## {words['students']}")
    out.append(_md_table([words["submission"], words["total"], *(md(e) for e in exercises), words["flags"]], [
        [md(s.name), f"{_number(s.score)} / {_number(s.max_score)}",
         *(_number(s.exercises[e].score) if e in s.exercises else "–" for e in exercises),
         ", ".join(words[f"kind.{k}"] for k in dict.fromkeys(f.kind for f in s.flags))]
        for s in summary.submissions]))
    if summary.gradebook:
        notebooks = _notebooks(summary.gradebook)
        marks = {(r.student, r.assignment, r.notebook): r for r in summary.gradebook}
        out.append(f"## {words['gradebook']}")
        out.append(_md_table([words["student"], *(md(f"{a}/{n}") for a, n in notebooks)], [
            [md(student), *(f"{_number(r.score)} / {_number(r.max_score)}" if (r := marks.get((student, *nb)))
                            else "–" for nb in notebooks)]
            for student in dict.fromkeys(r.student for r in summary.gradebook)]))
    return "\n\n".join(out) + "\n"


def run(args: argparse.Namespace) -> int:
    """``python -m autograder report``: write the HTML page, or print (or write) the Markdown."""
    folder = Path(args.results_dir)
    if not folder.is_dir():
        print(f"{folder}: not a folder", file=sys.stderr)
        return 2
    summary = read_results(folder)
    if args.gradebook:
        try:
            summary.gradebook = read_gradebook(Path(args.gradebook))
        except (OSError, sqlite3.Error) as exc:
            print(f"{args.gradebook}: cannot read the gradebook ({exc})", file=sys.stderr)
            return 2
    if args.format == "md":
        text = render_markdown(summary)
        if args.out:
            Path(args.out).write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
        return 0
    out = Path(args.out or "report.html")
    out.write_text(render_html(summary), encoding="utf-8")
    print(f"{len(summary.submissions)} submissions; report written to {out}")
    return 0
