"""Command line: ``python -m autograder grade | grade-batch | report | gradescope-zip | release``."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import traceback

from autograder.feedback import clean
from autograder.sandbox import REQUIRE_ENV
from autograder.results import error_results, table, to_gradescope, write_results


NOT_GRADED_EXIT = 3  # some case could not be run even after a retry: this run is no grade


def _grade(args: argparse.Namespace) -> int:
    start = time.monotonic()
    if args.require_isolation:
        os.environ[REQUIRE_ENV] = "1"
    try:
        from autograder.sandbox import fork_server

        # The fork server imports torch while this process does the same: both at once.
        threading.Thread(target=fork_server, daemon=True).start()
        from autograder.grade import grade_path
        from autograder.extract import SubmissionError

        try:
            report = grade_path(args.submission, chapter=args.chapter, seed=args.seed, public_only=args.public_only)
        except SubmissionError as exc:
            results = error_results(str(exc), time.monotonic() - start)
            results["tests"][0]["name"] = "could not read the submission"
            results["output"] = str(exc)
            write_results(results, args.results)
            print(clean(f"could not read the submission: {exc}"))
            return 0
    except Exception:  # noqa: BLE001 - the grader failed: results must still exist
        message = traceback.format_exc()
        write_results(error_results(message, time.monotonic() - start), args.results)
        print(clean(message), file=sys.stderr)
        return 2
    write_results(to_gradescope(report), args.results)
    print(table(report))
    print(f"\nresults written to {args.results} ({report.execution_time:.1f} s)")
    return NOT_GRADED_EXIT if report.not_graded else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    grade = commands.add_parser("grade", help="grade one submission (notebook, folder or zip)")
    grade.add_argument("submission")
    grade.add_argument("--chapter", help="grade this chapter's exercises (e.g. 03); missing ones score 0")
    grade.add_argument("--results", default="results.json", help="where to write Gradescope's results.json")
    grade.add_argument("--public-only", action="store_true", help="run only the public cases")
    grade.add_argument("--seed", type=int, help="replay a run with the seed it recorded")
    grade.add_argument("--require-isolation", action="store_true",
                       help="grade nothing unless workers get the allowlist view (the Gradescope package sets it)")
    grade.set_defaults(run=_grade)

    batch = commands.add_parser("grade-batch", help="grade every submission in a folder, in parallel")
    batch.add_argument("folder")
    batch.add_argument("--out", default="grades.csv")
    batch.add_argument("--chapter")
    batch.add_argument("--jobs", type=int, default=0, help="parallel submissions (default: CPU count)")
    batch.add_argument("--results-dir", help="also keep each submission's results.json here")
    batch.add_argument("--allow-unisolated", action="store_true",
                       help="grade even where workers cannot get the allowlist view (a class you trust)")
    batch.set_defaults(run=lambda a: __import__("autograder.batch", fromlist=["run"]).run(a))

    report = commands.add_parser("report", help="the class at a glance, from grade-batch's --results-dir")
    report.add_argument("results_dir")
    report.add_argument("--out", help="where to write it (default: report.html; Markdown goes to stdout)")
    report.add_argument("--format", choices=("html", "md"), default="html")
    report.add_argument("--gradebook", help="also show nbgrader's points per student and notebook")
    report.set_defaults(run=lambda a: __import__("autograder.report", fromlist=["run"]).run(a))

    package = commands.add_parser("gradescope-zip", help="build the Gradescope autograder package")
    package.add_argument("--chapter", required=True)
    package.add_argument("--out", help="zip path (default: gradescope-chNN.zip)")
    package.add_argument("--wheels", help="folder of wheels to ship (default: download the pinned ones)")
    package.add_argument("--allow-unisolated", action="store_true",
                         help="the package grades even where workers cannot get the allowlist view")
    package.add_argument("--released-through", type=int, metavar="NN",
                         help="grade for a graded release through chapter NN (its run_autograder sets "
                              "AUTOGRADER_RELEASED_THROUGH); default: the self-learner's course")
    package.set_defaults(run=lambda a: __import__("autograder.gradescope", fromlist=["run"]).run(a))

    graded = commands.add_parser("release", help="build a graded release: the notebooks and a student package "
                                                 "holding the answers of chapters 1..THROUGH only")
    graded.add_argument("--through", type=int, required=True, help="the last chapter whose answers are released")
    graded.add_argument("--out", default="dist", help="where release-NN/ is written (default: dist)")
    graded.set_defaults(run=lambda a: __import__("autograder.release", fromlist=["main"]).main(
        ["--through", str(a.through), "--out", a.out]))

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
