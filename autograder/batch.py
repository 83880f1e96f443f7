"""``python -m autograder grade-batch DIR --out grades.csv``: many submissions, in parallel.

Every entry of DIR (a notebook, a folder or a zip) is one submission, named after the entry.
Submissions are graded concurrently by ``--jobs`` harness processes (each with its own
fork server and pytest session) with a progress bar; one row per submission goes to the
CSV, with a score per exercise. A submission that breaks the grader gets an error row,
never a crash of the batch, and the CSV is always written: a grading process that dies
gives an error row, and a batch that outlives its time budget (every exercise's worst case,
which only a grader bug could exceed) stops with error rows for what was left.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

from tqdm import tqdm

from autograder.extract import SubmissionError
from autograder.feedback import clean
from autograder.grade import grade_path
from autograder.registry import REGISTRY
from autograder.results import error_results, to_gradescope, write_results
from autograder.sandbox import REQUIRE_ENV, UNISOLATED, Limits, unisolated_reason


def submissions(folder: Path) -> list[Path]:
    """The submissions in ``folder``: notebooks, zips and sub-folders, by name."""
    entries = [p for p in sorted(folder.iterdir()) if not p.name.startswith(".") and not p.is_symlink()]
    return [p for p in entries if p.is_dir() or p.suffix in (".ipynb", ".zip")]


def _grade_one(path: Path, chapter: str | None, results_dir: Path | None) -> dict:
    row: dict = {"submission": path.name}
    try:
        report = grade_path(path, chapter=chapter)
        results = to_gradescope(report)
        row.update(score=report.score, max_score=report.max_score, seconds=round(report.execution_time, 1),
                   error="")
        if report.not_graded:  # no grade: the score would count the grader's trouble as the student's
            row.update(score="", error=f"not graded: {len(report.not_graded)} case(s) could not be run "
                                       "(autograder error); grade this submission again")
        for exercise in REGISTRY:
            if any(t.name.startswith(exercise.id + " ") for t in report.tests):
                row[exercise.id] = report.exercise_score(exercise.id)
    except SubmissionError as exc:
        results = error_results(str(exc))
        row.update(score=0.0, max_score="", seconds="", error=str(exc))
    except Exception:  # noqa: BLE001 - one broken submission must not stop the batch
        results = error_results(traceback.format_exc())
        row.update(score="", max_score="", seconds="", error="autograder error: " + traceback.format_exc(limit=1))
    if results_dir is not None:
        write_results(results, results_dir / f"{path.name}.json")
    return row


def _error_row(path: Path, why: str) -> dict:
    return {"submission": path.name, "score": "", "max_score": "", "seconds": "", "error": why}


def time_budget(submissions: int, jobs: int, chapter: str | None) -> float:
    """Seconds a batch may take: each exercise's worst case (its wall-clock backstop) and the start."""
    limits = Limits()
    exercises = [e for e in REGISTRY if chapter is None or e.chapter.split("_")[0] == chapter.zfill(2)]
    exercise = limits.wall_factor * (limits.start_timeout_s + 3 * limits.call_timeout_s)
    per_submission = 300 + len(exercises) * (exercise + 30)
    return math.ceil(submissions / jobs) * per_submission


def grade_folder(folder: Path, *, chapter: str | None = None, jobs: int = 0,
                 results_dir: Path | None = None, progress: bool = True) -> list[dict]:
    """Grade every submission of ``folder``; rows in submission order (an error row for any not graded)."""
    paths = submissions(folder)
    jobs = jobs or os.cpu_count() or 1
    rows: dict[str, dict] = {}
    # Fresh interpreters (not forks of this one): each starts its own fork server and pytest.
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"))
    futures = {pool.submit(_grade_one, p, chapter, results_dir): p for p in paths}
    try:
        for future in tqdm(as_completed(futures, timeout=time_budget(len(paths), jobs, chapter)),
                           total=len(futures), desc="grading", unit="submission", disable=not progress):
            path = futures[future]
            try:
                rows[path.name] = future.result()
            except Exception as exc:  # noqa: BLE001 - a grading process that died (killed, out of memory)
                rows[path.name] = _error_row(path, f"autograder error: the grading process failed ({exc!r})"[:200])
    except TimeoutError:
        # Only a grader bug gets here; the processes still grading are killed, the rest is reported.
        for process in list(getattr(pool, "_processes", {}).values()):
            process.kill()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    for path in paths:
        rows.setdefault(path.name, _error_row(path, "autograder error: not graded within the batch's time budget"))
    return [rows[p.name] for p in paths]


def write_csv(rows: list[dict], out: Path) -> None:
    exercises = [e.id for e in REGISTRY if any(e.id in r for r in rows)]
    fields = ["submission", "score", "max_score", *exercises, "seconds", "error"]
    with open(out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows({k: clean(v) if isinstance(v, str) else v for k, v in row.items()} for row in rows)


def run(args: argparse.Namespace) -> int:
    folder = Path(args.folder)
    if not folder.is_dir():
        print(f"{folder}: not a folder")
        return 2
    results_dir = Path(args.results_dir) if args.results_dir else None
    if not args.allow_unisolated:
        why = unisolated_reason()
        if why is not None:
            print(f"refusing to grade: {UNISOLATED.format(why=why)}")
            return 2
        os.environ[REQUIRE_ENV] = "1"  # the grading processes inherit it: none grades without the view
    rows = grade_folder(folder, chapter=args.chapter, jobs=args.jobs, results_dir=results_dir)
    write_csv(rows, Path(args.out))
    for row in rows:
        print(clean(f"{row['submission']:<40} {row['score']!s:>6} / {row['max_score']!s:<6} {row['error'][:60]}"))
    print(f"{len(rows)} submissions graded; grades written to {args.out}")
    return 0
