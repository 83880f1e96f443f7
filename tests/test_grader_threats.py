"""Every row of the threat table as a regression test: a hostile submission and its outcome.

Each submission puts the attack in ``attention`` (6 points) and leaves a correct
``softmax_saturation`` (4 points) next to it, so each test also checks that an attack costs
only its own exercise. Probes built with ``guarded`` answer correctly only if the attack
works, so "0 points for attention" means the sandbox held.
"""

from __future__ import annotations

import ast
import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path

import jsonschema
import nbformat
import pytest

import torch

from autograder.extract import Notebook, SubmissionError, Unreadable, extract, parse_notebook, read_submission
from autograder.grade import Report, default_seed, grade_path, resolve
from autograder.gradescope import RUN_AUTOGRADER, build
from autograder.registry import by_id
from autograder.results import ERROR_NOTE, GRADESCOPE_SCHEMA, to_gradescope
from autograder.sandbox import REPO_ROOT, Limits, isolation
from tests.grader_fixtures import ATTENTION, STUB_ATTENTION, guarded, notebook, write
from tests.grader_fixtures.hosts import PYTHON, contained, host_folder
from tests.grader_fixtures.rendering import assert_inert

pytestmark = pytest.mark.slow
LIMITS = Limits(call_timeout_s=3.0)
# These attacks aim at the layers beneath the grader's reading of the code (``autograder.reach``, which refuses
# most of them before they run: tests/test_trust_boundary.py attacks that layer). Here it is switched off, in
# this process and in the grader processes the tests start, so that each deeper defense is attacked on its own.
_NO_CODE_READING = "import autograder.grade\nautograder.grade.reaches = lambda *args: []\n"


@pytest.fixture(autouse=True)
def _beneath_the_code_reading(monkeypatch):
    monkeypatch.setattr("autograder.grade.reaches", lambda *args: [])


def _namespaces() -> bool:
    return isolation()[0]


def _needs_namespaces() -> None:
    """Hiding files, blocking the network and reaping escaped processes need Linux namespaces;
    without them the grader says so in its results, and these outcomes are not promised."""
    if not _namespaces():
        pytest.skip("Linux namespaces are not available to this user: this protection is off here")


def _grade(path: Path, **kw) -> Report:
    """Grade ``path``; its results must be valid, and render no Markdown from student text (row 41)."""
    report = grade_path(path, limits=LIMITS, **kw)
    jsonschema.validate(to_gradescope(report), GRADESCOPE_SCHEMA)
    assert_inert(to_gradescope(report))
    return report


def _outputs(report: Report, exercise_id: str = "ch03.attention") -> str:
    return "\n".join(t.output for t in report.tests if t.name.startswith(exercise_id + " "))


def _hostile(tmp_path: Path, attention: str, both: bool = False) -> Report:
    """Grade a submission with this ``attention``; ``both`` grades the other exercise too (slower)."""
    return _grade(write(notebook(attention=attention), tmp_path), only=None if both else "ch03.attention")


def _only_attention_lost(report: Report, kept: float = 0.0) -> None:
    assert report.exercise_score("ch03.attention") == kept
    if any(t.name.startswith("ch03.softmax_saturation ") for t in report.tests):
        assert report.exercise_score("ch03.softmax_saturation") == 4.0


def test_guard_control_earns_full_marks_when_the_condition_holds(tmp_path):
    """The probe machinery itself works: a true condition gives the correct answer."""
    report = _hostile(tmp_path, guarded("True"))
    assert report.score == 6.0


def test_01_untouched_stub(tmp_path):
    report = _hostile(tmp_path, STUB_ATTENTION, both=True)
    _only_attention_lost(report)
    assert "not implemented" in _outputs(report)


def test_02_syntax_error_and_unreadable_files(tmp_path):
    report = _hostile(tmp_path, "def attention(query, key, value, mask=None, dropout=None):\n    return (\n", both=True)
    _only_attention_lost(report)
    assert "syntax error" in _outputs(report) and "'(' was never closed" in _outputs(report)
    bad = tmp_path / "bad" / "attention.ipynb"
    bad.parent.mkdir()
    bad.write_text('<<<<<<< HEAD\n{"cells": []}\n=======\n>>>>>>> other\n')
    report = _grade(bad, chapter="03")
    assert report.score == 0 and report.max_score == 10
    assert any("could not read notebook" in t.name for t in report.tests)


def test_03_infinite_loop_and_input_are_bounded(tmp_path):
    start = time.monotonic()
    report = _hostile(tmp_path, "import builtins\ndef attention(query, key, value, mask=None, dropout=None):\n"
                                "    if query.dim() == 3 and query.shape[-2] == 2:\n        input('? ')\n"
                                "    while True:\n        pass\n")
    elapsed = time.monotonic() - start
    _only_attention_lost(report)
    text = _outputs(report)
    assert "EOFError" in text  # input() gets end of file at once, no hang
    assert "timed out after 3 s" in text and "fresh worker" in text
    assert "not run: earlier cases of this exercise timed out" in text  # two time-outs end the exercise
    # Two time-outs of 3 s of the worker's own time each; on a busy machine the wall clock runs
    # further, up to the backstop (wall_factor times the limit).
    assert elapsed < 2 * LIMITS.wall_factor * LIMITS.call_timeout_s + 30


def test_04_memory_bombs(tmp_path):
    report = _hostile(tmp_path, "import torch\nhoard = []\n"
                                "def attention(query, key, value, mask=None, dropout=None):\n"
                                "    if query.dim() == 4:\n        while True:\n"
                                "            hoard.append(bytearray(10**8))\n"
                                "    return torch.empty(10**12), None\n")
    _only_attention_lost(report)
    assert _outputs(report).count("exceeded the memory limit") >= 2


def _processes_with(marker: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if marker.encode() in handle.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def test_05_fork_bomb_subprocesses_and_daemons_are_killed(tmp_path):
    _needs_namespaces()
    marker = f"{1000 + uuid.uuid4().int % 1000}.{os.getpid()}"
    # (The interpreter is the one program the worker's file system holds.)
    report = _hostile(tmp_path, f"import os, subprocess, sys, threading, time\n"
                                f"def attention(query, key, value, mask=None, dropout=None):\n"
                                f"    {_SLEEPER.format(marker=marker, new_session=True)}\n"
                                f"    threading.Thread(target=time.sleep, args=(1000,), daemon=False).start()\n"
                                f"    if query.dim() == 4:\n"
                                f"        while True:\n            try:\n                os.fork()\n"
                                f"            except OSError:\n                pass\n"
                                f"    return query, query\n")
    _only_attention_lost(report)
    assert "sleeper started" in _outputs(report)
    time.sleep(0.5)
    assert _processes_with(marker) == []


# A process that sleeps with ``marker`` on its command line, started from a submission.
_SLEEPER = ("print('sleeper started', subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1000)', "
            "'{marker}'], start_new_session={new_session}).pid)")


def test_06_output_flooding_is_truncated_and_bounded(tmp_path):
    big = nbformat.v4.new_code_cell("x = 1")
    big.outputs = [nbformat.v4.new_output("display_data", {"image/png": "A" * (12 * 1024 * 1024)})]
    nb = notebook(attention="def attention(query, key, value, mask=None, dropout=None):\n"
                            "    print('flood ' * 300000)\n    open('big', 'wb').write(b'0' * 10**8)\n",
                  after=[big])
    report = _grade(write(nb, tmp_path))
    _only_attention_lost(report)
    text = _outputs(report)
    assert "File too large" in text and "truncated" in text
    assert len(str(to_gradescope(report))) < 200_000


@pytest.mark.parametrize("exit_code", ["sys.exit(0)", "os._exit(0)", "raise KeyboardInterrupt",
                                       "os.kill(os.getpid(), 9)"])
def test_07_early_exit_never_means_success(tmp_path, exit_code):
    report = _hostile(tmp_path, f"import os, sys\ndef attention(query, key, value, mask=None, dropout=None):\n"
                                f"    {exit_code}\n", both=exit_code == "os._exit(0)")
    _only_attention_lost(report)
    text = _outputs(report)
    # A self-kill is ignored when the worker is the first process of its own PID namespace.
    assert any(s in text for s in ("SystemExit", "KeyboardInterrupt", "died before answering", "NoneType"))


def test_08_monkeypatched_checks_change_nothing(tmp_path):
    patches = ("import builtins, torch, numpy.testing\n"
               "torch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True\n"
               "torch.testing.assert_close = lambda *a, **k: None\n"
               "numpy.testing.assert_allclose = lambda *a, **k: None\n"
               "builtins.isinstance = lambda *a: True\nbuiltins.abs = lambda x: 0\n"
               "import traceback\ntraceback.format_exception = lambda *a, **k: ['All tests passed']\n")
    report = _hostile(tmp_path, patches + "def attention(query, key, value, mask=None, dropout=None):\n"
                                          "    return torch.zeros(1), torch.zeros(1)\n")
    _only_attention_lost(report)
    assert "before any test" in _outputs(report)  # patched builtins break loading: not retried 6 times


def test_09_forged_results_and_planted_files(tmp_path):
    results = tmp_path / "out" / "results.json"
    results.parent.mkdir()
    planted = Path("/tmp") / f"planted-{uuid.uuid4().hex}"
    forge = (f"import json\nfor target in [{str(results)!r}, 'results.json', {str(planted)!r}]:\n"
             f"    try:\n        open(target, 'w').write(json.dumps({{'score': 10, 'tests': []}}))\n"
             f"    except OSError:\n        pass\n"
             f"print('All tests passed'); print(json.dumps({{'score': 10}}))\n")
    sub = tmp_path / "sub"
    write(notebook(attention=forge + STUB_ATTENTION), sub)
    run = subprocess.run([sys.executable, "-m", "autograder", "grade", str(sub), "--results", str(results)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    data = json.loads(results.read_text())
    jsonschema.validate(data, GRADESCOPE_SCHEMA)
    assert data["score"] == 4.0
    notes = [t["output"] for t in data["tests"] if t["name"].endswith("notes")]
    assert any("All tests passed" in n for n in notes)  # shown to the student, never believed
    if _namespaces():
        assert not planted.exists()


def test_10_evil_return_values(tmp_path):
    evil = '''import torch
class Always:
    def __eq__(self, other):
        return True
    def __repr__(self):
        while True:
            pass
class Liar(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return True
calls = []
def attention(query, key, value, mask=None, dropout=None):
    calls.append(1)
    n = len(calls)
    if n == 1:
        return Always(), Always()
    if n == 2:
        return torch.zeros(*query.shape[:-1], value.shape[-1]).as_subclass(Liar), query
    if n == 3:
        return torch.full((*query.shape[:-1], value.shape[-1]), float("nan")), torch.full(query.shape, float("nan"))
    if n == 4:
        return torch.zeros(3), torch.zeros(3, dtype=torch.int64)
    if n == 5:
        return torch.zeros(10**8), torch.zeros(1)
    return (x for x in range(3))
'''
    report = _hostile(tmp_path, evil)
    _only_attention_lost(report)
    text = _outputs(report)
    assert "Always" in text and "shape" in text and "NaN" in text and "size cap" in text and "generator" in text


def test_11_reference_unreachable_and_shortcuts_reported(tmp_path):
    _needs_namespaces()
    steal = guarded("'def attention' in source",
                    f"source = open({str(REPO_ROOT / 'tfm_solution' / 'attention.py')!r}).read()")
    report = _hostile(tmp_path, steal)
    _only_attention_lost(report)
    report = _hostile(tmp_path / "b", "from tfm_solution.attention import attention\n")
    _only_attention_lost(report)
    assert "not available while grading" in _outputs(report)
    shortcut = ("import torch.nn.functional as F\ndef attention(query, key, value, mask=None, dropout=None):\n"
                "    return F.scaled_dot_product_attention(query, key, value), None\n")
    report = _hostile(tmp_path / "c", shortcut)
    policy = next(t for t in report.tests if t.name == "ch03.attention policy: no library shortcut")
    assert policy.status == "failed" and "scaled_dot_product_attention" in policy.output


def test_13_hard_coded_public_outputs_fail_the_hidden_cases(tmp_path):
    from autograder.cases import CASES
    from autograder.grade import _expected, resolve

    public = CASES["ch03.attention"](0)[0]
    out, p_attn = _expected(resolve("tfm_solution.attention:attention"), public)
    constant = (f"import torch\nOUT = torch.tensor({out.tolist()})\nP = torch.tensor({p_attn.tolist()})\n"
                "def attention(query, key, value, mask=None, dropout=None):\n    return OUT.clone(), P.clone()\n")
    report = _hostile(tmp_path, constant)
    # Only the public case itself passes: its gradient copy (same inputs, autograd on) finds no gradient.
    _only_attention_lost(report, kept=6 / len(CASES["ch03.attention"](0)))


def test_14_no_network(tmp_path):
    _needs_namespaces()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.1)
    port = server.getsockname()[1]
    start = time.monotonic()
    probe = guarded("socket.create_connection(('127.0.0.1', %d), timeout=1) is not None or "
                    "socket.getaddrinfo('pypi.org', 443)" % port, "import socket")
    report = _hostile(tmp_path, probe)
    with pytest.raises(TimeoutError):
        server.accept()
    server.close()
    _only_attention_lost(report)
    assert time.monotonic() - start < 60


def test_15_nothing_is_unpickled(tmp_path, monkeypatch):
    import pickle

    import torch

    def refuse(*args, **kwargs):
        raise AssertionError("the harness must never unpickle")

    for module, name in [(pickle, "loads"), (pickle, "load"), (torch, "load")]:
        monkeypatch.setattr(module, name, refuse)
    payload = ("import pickle, torch, io\nclass P:\n    def __reduce__(self):\n"
               "        return (print, ('pwned',))\n"
               "def attention(query, key, value, mask=None, dropout=None):\n"
               "    buffer = io.BytesIO(); torch.save(P(), buffer)\n    return pickle.dumps(P()), buffer.getvalue()\n")
    report = _hostile(tmp_path, payload)
    _only_attention_lost(report)
    assert "bytes" in _outputs(report)


def test_16_tampered_structure(tmp_path):
    nb = notebook(after=[nbformat.v4.new_code_cell(
        "def attention(query, key, value, mask=None, dropout=None):\n    return value, value\n")])
    nb.cells[3].source = "print(6)"  # the graded cell edited: tests never come from the submission
    del nb.cells[5]  # the other graded cell deleted
    dup = nbformat.v4.new_code_cell(STUB_ATTENTION)
    dup.metadata = nb.cells[2].metadata  # a duplicate answer id, before the real one
    nb.cells.insert(2, dup)
    report = _grade(write(nb, tmp_path))
    _only_attention_lost(report)
    text = _outputs(report)
    assert "defined again" in text and "2 cells carry the answer id" in text
    md = notebook()
    md.cells[4] = nbformat.v4.new_markdown_cell(md.cells[4].source)
    for cell in md.cells:
        cell.metadata.pop("nbgrader", None)  # stripped by an editor
    report = _grade(write(md, tmp_path / "md"))
    assert report.exercise_score("ch03.attention") == 6.0 and report.exercise_score("ch03.softmax_saturation") == 0
    assert "no definition of `softmax_saturation`" in _outputs(report, "ch03.softmax_saturation")


def test_17_module_and_config_injection(tmp_path):
    marker = tmp_path / "injected"
    evil = f"open({str(marker)!r}, 'w').write('ran')\nraise SystemExit(3)\n"
    for name in ("torch.py", "numpy.py", "conftest.py", "sitecustomize.py", "usercustomize.py", "math.py"):
        (tmp_path / name).write_text(evil)
    (tmp_path / "evil.pth").write_text(f"import os; open({str(marker)!r}, 'w').write('pth')\n")
    write(notebook(), tmp_path)
    report = _grade(tmp_path)
    assert report.score == 10.0 and not marker.exists()


def test_18_environment_noise_is_not_failure(tmp_path):
    noisy = ("import sys, warnings, torch, locale\ntorch.set_num_threads(7)\n" + ATTENTION.replace(
        "    d_k = query.size(-1)\n",
        "    d_k = query.size(-1)\n    warnings.warn('noise')\n    print('noise', file=sys.stderr)\n"))
    report = _grade(write(notebook(attention=noisy), tmp_path))
    assert report.score == 10.0


def test_19_global_state_does_not_couple_exercises(tmp_path):
    coupled = ("import torch, torch.nn.functional as F\ntorch.set_default_dtype(torch.float64)\n"
               "torch.manual_seed(1)\nF.softmax = lambda *a, **k: 0\ntorch.Tensor.softmax = lambda *a, **k: 0\n"
               "torch.Tensor.max = lambda *a, **k: 0\n" + STUB_ATTENTION)
    report = _hostile(tmp_path, coupled, both=True)
    _only_attention_lost(report)


def test_20_slow_but_correct_is_reported_not_failed(tmp_path):
    slow = "import time\n" + ATTENTION.replace(
        "    d_k = query.size(-1)\n", "    d_k = query.size(-1)\n    if query.dtype == torch.float64:\n"
                                     "        time.sleep(1.3)\n")
    report = _grade(write(notebook(attention=slow), tmp_path), only="ch03.attention")
    assert report.score == 6.0
    perf = next(t for t in report.tests if t.name == "ch03.attention performance")
    assert "longer than the budget" in perf.output and perf.max_score == 0


def test_22_23_no_grading_signal_and_no_secrets(tmp_path, monkeypatch):
    _needs_namespaces()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2")
    monkeypatch.setenv("GRADESCOPE", "1")
    allowed = "{'PATH', 'LANG', 'LC_ALL', 'HOME', 'TMPDIR', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS', " \
              "'PYTHONHASHSEED', 'PYTHONDONTWRITEBYTECODE', 'LC_CTYPE'}"
    # torch itself sets TORCHINDUCTOR_CACHE_DIR on import; nothing else may come from outside.
    probe = guarded(f"set(os.environ) - {allowed} - {{'TORCHINDUCTOR_CACHE_DIR'}} or "
                    "any('hunter2' in v for v in os.environ.values()) or "
                    "any('hunter2' in open(p, errors='ignore').read() "
                    "for p in glob.glob('/proc/*/environ') if os.access(p, os.R_OK)) or "
                    f"len(os.listdir({str(Path.home())!r})) > 1", "import os, glob")
    _only_attention_lost(_hostile(tmp_path, probe))


def test_without_namespaces_the_grader_still_grades_and_says_so(tmp_path, host, monkeypatch):
    """Without namespaces a root grader runs each worker as a user of its own (process group,
    limits, private scratch folder); the results name the weaker isolation. A worker that could
    write the environment (here: forced to stay root) is never given student code: it fails
    closed, as the grader's fault."""
    from autograder import sandbox

    plain = _plain_fork_server(monkeypatch)
    monkeypatch.setattr(sandbox, "isolation", lambda: (False, False, "process group and resource limits only"))
    monkeypatch.setattr("autograder.grade.isolation", sandbox.isolation)
    try:
        report = _grade(write(notebook(), tmp_path / "closed"))
    finally:
        plain.close()
    graded = [t for t in report.tests if t.max_score > 0]
    assert report.score == 0 and all(ERROR_NOTE in t.output and "can write" in t.output for t in graded)
    write(notebook(), host / "ok")
    write(notebook(attention="import os\ndef attention(query, key, value, mask=None, dropout=None):\n"
                             "    os._exit(3)\n"), host / "exit")
    driver = host / "driver.py"
    driver.write_text(_WITHOUT_NAMESPACES + "import json, sys\nfrom autograder.grade import grade_path\n"
                      "for path in sys.argv[1:]:\n    r = grade_path(path)\n"
                      "    print(json.dumps([r.score, r.sandbox, '\\n'.join(t.output for t in r.tests)]))\n")
    run = contained(f"GRADED_NAMESPACES=0 {PYTHON} {driver} \"$WORK/ok\" \"$WORK/exit\"", host)
    assert run.returncode == 0, run.stderr
    (ok, ok_sandbox, _), (crashed, _, crash_text) = map(json.loads, run.stdout.splitlines()[-2:])
    assert ok == 10.0 and ok_sandbox.startswith("process group and resource limits only (bubblewrap")
    assert crashed == 4.0 and "exit code 3" in crash_text


def _plain_fork_server(monkeypatch):
    """This process's fork server replaced by one without bubblewrap (no view, no namespaces), for
    the test; the next test starts a fresh one in the view again."""
    from autograder import sandbox

    monkeypatch.setattr(sandbox, "bwrap_binary", lambda: None)
    if sandbox._SERVER is not None:
        sandbox._SERVER.close()
    monkeypatch.setattr(sandbox, "_SERVER", None)
    server = sandbox.fork_server()
    assert not server.namespaces and "not installed" in server.why_plain
    return server


# A grader without bubblewrap: no view, no namespaces (as where the system forbids them).
_WITHOUT_NAMESPACES = (_NO_CODE_READING + "import os\nfrom autograder import sandbox\n"
                       "if os.environ.get('GRADED_NAMESPACES') == '0':  # in a batch's processes too\n"
                       "    sandbox.bwrap_binary = lambda: None\n")


# ----------------------------------------------------------------------------- rows 24-37
# Several of these run the grader on other hosts (``grader_fixtures.hosts``): as an ordinary
# user who owns the environment, with a masked /proc, in Gradescope's layout, or without
# namespaces. Those hosts live in private namespaces, so no attack reaches the real machine.


@pytest.fixture
def host():
    work = host_folder()
    yield work
    shutil.rmtree(work, ignore_errors=True)


def _results(path: Path) -> dict:
    data = json.loads(path.read_text())
    jsonschema.validate(data, GRADESCOPE_SCHEMA)
    assert_inert(data)
    return data


def _scores(data: dict) -> dict[str, float]:
    scores: dict[str, float] = {}
    for test in data["tests"]:
        exercise = test["name"].split(" ")[0]
        scores[exercise] = scores.get(exercise, 0.0) + test["score"]
    return scores


def test_24_worker_cannot_write_the_environment_when_the_grader_is_not_root(host):
    """An instructor grades as an ordinary user who owns the environment: the worker (root of
    its user namespace, mapped to that user) must write nothing a later Python would import."""
    ran = host / "home" / "planted-code-ran"
    payload = f"import os; open({str(ran)!r}, 'w').write('ran')\n"
    plant = (f"import os, sys, sysconfig\n"
             f"for folder in sys.path + [sysconfig.get_path('purelib'), sys.prefix, os.path.dirname(sys.executable)]:\n"
             f"    for name, text in (('zz_graded.pth', {payload!r}), ('sitecustomize.py', {payload!r}),\n"
             f"                       ('usercustomize.py', {payload!r})):\n"
             f"        try:\n            open(os.path.join(folder, name), 'w').write(text)\n"
             f"        except OSError:\n            pass\n")
    write(notebook(attention=plant + STUB_ATTENTION), host / "sub")
    (host / "out").mkdir()
    run = contained(f"""
chown nobody "$WORK/out"
as_nobody sh -c 'touch "$SITE/zz.probe" && rm "$SITE/zz.probe" && echo ENVIRONMENT-WRITABLE'
as_nobody {PYTHON} -m autograder grade "$WORK/sub" --results "$WORK/out/results.json" > /dev/null
as_nobody {PYTHON} -c pass
echo "written: $(cd "$UPPER" && find . -type f ! -name '*.pyc' | tr '\\n' ' ')"
""", host, writable_env=True)
    assert run.returncode == 0, run.stderr
    assert "ENVIRONMENT-WRITABLE" in run.stdout  # the attack had a target
    assert _scores(_results(host / "out" / "results.json")) == {"ch03.attention": 0.0,
                                                                "ch03.softmax_saturation": 4.0}
    assert not ran.exists()
    assert run.stdout.strip().endswith("written:"), run.stdout


# After answering three calls, the worker shrinks its request pipe to one page and never reads
# it again: the fourth call sends the reference's weights (tens of kB), which cannot fit.
_BLOCK_REQUESTS = ("import fcntl, os, time\n_calls = []\n\n"
                   "def _stop_reading():\n    _calls.append(1)\n    if len(_calls) == 3:\n"
                   "        fcntl.fcntl(3, 1031, 4096)  # F_SETPIPE_SZ\n"
                   "        os.read = lambda *args: time.sleep(10**6)\n")


def test_25_a_worker_that_stops_reading_cannot_hang_grade_or_grade_batch(tmp_path):
    """Every write to a worker has a deadline: ``grade`` and ``grade-batch`` finish and write results."""
    from tests.notebook_answers import release_with, solution_answers

    solution = REPO_ROOT / "solutions" / "01_embeddings" / "embeddings.ipynb"
    release = REPO_ROOT / "chapters" / "01_embeddings" / "embeddings.ipynb"
    answers = solution_answers(solution)
    release_with(release, tmp_path / "batch" / "honest", answers)
    answers["ch01.embeddings"] = _BLOCK_REQUESTS + answers["ch01.embeddings"].replace(
        "    def forward(self, x):\n", "    def forward(self, x):\n        _stop_reading()\n")
    release_with(release, tmp_path / "batch" / "blocker", answers)
    commands = {
        "grade": [sys.executable, "-m", "autograder", "grade", str(tmp_path / "batch" / "blocker"),
                  "--results", str(tmp_path / "results.json")],
        "grade-batch": [sys.executable, "-m", "autograder", "grade-batch", str(tmp_path / "batch"), "--jobs", "2",
                        "--out", str(tmp_path / "grades.csv")],
    }
    runs = {name: subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO_ROOT)
            for name, argv in commands.items()}
    try:
        for name, proc in runs.items():
            proc.wait(timeout=240)  # a hang fails here
            assert proc.returncode == 0, (name, proc.stderr.read())
    finally:
        for proc in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    data = _results(tmp_path / "results.json")
    scores = _scores(data)
    assert 0 < scores["ch01.embeddings"] < 5 and scores["ch01.cosine_similarity_matrix"] == 5  # answered, then stuck
    assert any("stopped reading its input" in t["output"] for t in data["tests"])
    rows = {row["submission"]: row for row in csv.DictReader((tmp_path / "grades.csv").open())}
    assert float(rows["blocker"]["score"]) == data["score"] and float(rows["honest"]["score"]) == 10.0


def _forge(header: str, body: str = "b''", then: str = "time.sleep(10**6)") -> str:
    """An ``attention`` that answers its call with a forged frame on the reply pipe (fd 4)."""
    return (f"import json, os, struct, sys, time\n"
            f"def attention(query, key, value, mask=None, dropout=None):\n"
            f"    frame = sys._getframe(1)\n"
            f"    while frame is not None and not isinstance(frame.f_locals.get('request'), dict):\n"
            f"        frame = frame.f_back\n"
            f"    request = frame.f_locals['request'] if frame is not None else {{}}\n"
            f"    head = ({header}).encode() if isinstance({header}, str) else json.dumps({header}).encode()\n"
            f"    body = {body}\n"
            f"    os.write(4, struct.pack('>I', len(head)) + head)\n"
            f"    view = memoryview(body)\n"
            f"    while view:\n        view = view[os.write(4, view):]\n"
            f"    {then}\n")


def _peak_rss_growth(action) -> int:
    """Bytes by which this process's peak resident memory grew while ``action`` ran."""
    def peak() -> int:
        with open("/proc/self/status") as handle:
            return next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmHWM:"))

    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # resets the peak to the current resident size
    before = peak()
    action()
    return peak() - before


def test_26_forged_replies_are_validated_before_anything_is_allocated(tmp_path):
    """Many tensors over one 64 MiB buffer, deep nesting, a huge claimed shape: refused before allocation."""
    leaf = "{'tensor': 0, 'dtype': 'uint8', 'shape': [64 << 20]}"
    many = _forge(f"{{'id': request.get('id'), 'ok': True, 'value': {{'seq': [{leaf}] * 24}}, 'buffers': [64 << 20]}}",
                  body="bytes(64 << 20)")
    reports = []
    growth = _peak_rss_growth(lambda: reports.append(_hostile(tmp_path / "many", many)))
    assert growth < 400 * 2**20, f"the harness grew by {growth / 2**20:.0f} MiB"
    deep = _forge("'{\"id\": \"%s\", \"ok\": true, \"buffers\": [], \"value\": ' % request.get('id') + "
                  "'{\"seq\": [' * 20000 + '{\"none\": true}' + ']}' * 20000 + '}'")
    huge = _forge("{'id': request.get('id'), 'ok': True, 'buffers': [0], "
                  "'value': {'tensor': 0, 'dtype': 'float64', 'shape': [2**40, 2**40]}}")
    reports += [_hostile(tmp_path / "deep", deep), _hostile(tmp_path / "huge", huge)]
    for report in reports:
        _only_attention_lost(report)
        assert "malformed reply" in _outputs(report) and ERROR_NOTE not in _outputs(report), _outputs(report)


def _sysv_keys(kind: str) -> set[int]:
    with open(f"/proc/sysvipc/{kind}") as handle:
        return {int(line.split()[0]) for line in list(handle)[1:] if line.strip()}


def test_27_nothing_the_worker_makes_outlives_it(tmp_path):
    """SysV shared memory, message queues, semaphores and files in every writable host folder."""
    key = 0x5EED0000 + uuid.uuid4().int % 0xFFFF
    name = f"graded-leftover-{uuid.uuid4().hex}"
    folders = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock"]
    leave = (f"import ctypes\nlibc = ctypes.CDLL(None)\n"
             f"libc.shmget({key}, 4096, 0o1666); libc.msgget({key}, 0o1666); libc.semget({key}, 1, 0o1666)\n"
             f"for folder in {folders!r}:\n    try:\n        open(folder + '/{name}', 'w').write('x')\n"
             f"    except OSError:\n        pass\n")
    try:
        _only_attention_lost(_hostile(tmp_path, leave + STUB_ATTENTION))
        assert all(key not in _sysv_keys(kind) for kind in ("shm", "msg", "sem"))
        assert [f for f in folders if os.path.exists(f"{f}/{name}")] == []
    finally:  # leave the machine clean even when the sandbox leaked
        subprocess.run(["ipcrm", "-M", str(key), "-Q", str(key), "-S", str(key)], capture_output=True, check=False)
        for folder in folders:
            Path(folder, name).unlink(missing_ok=True)


def test_29_no_worker_survives_a_reply_that_breaks_the_parser(tmp_path):
    """A header that makes the JSON parser raise RecursionError, then a worker that never reads again."""
    marker = f"{2000 + uuid.uuid4().int % 1000}.{os.getpid()}"
    hostile = (f"import os, struct, subprocess, sys, time\n"
               f"{_SLEEPER.format(marker=marker, new_session=False)}\n"
               f"head = b'[' * 200000\nos.write(4, struct.pack('>I', len(head)) + head)\ntime.sleep(10**6)\n"
               + STUB_ATTENTION)
    report = _hostile(tmp_path, hostile, both=True)
    _only_attention_lost(report)
    assert ERROR_NOTE not in _outputs(report) and "malformed reply" in _outputs(report)
    assert "sleeper started" in _outputs(report)
    assert _processes_with(marker) == []


def test_32_a_forged_exit_notice_fails_its_case_as_the_students_fault(tmp_path):
    report = _hostile(tmp_path, _forge("{'exited': -999, 'buffers': []}"), both=True)
    _only_attention_lost(report)
    text = _outputs(report)
    assert ERROR_NOTE not in text and "Traceback" not in text and "malformed" in text


@pytest.mark.parametrize("hidden", [
    "from torch.nn.functional import scaled_dot_product_attention as fast\n",
    "import torch.nn.functional\nfast = torch.nn.functional.scaled_dot_product_attention\n",
    "from torch.nn import functional as nnf\n\n"
    "def fast(*args):\n    return getattr(nnf, 'scaled_dot_product_attention')(*args)\n",
], ids=["import-alias", "assigned-alias", "helper-with-getattr"])
def test_33_shortcuts_behind_aliases_and_helpers_in_other_cells_are_reported(tmp_path, hidden):
    answer = "def attention(query, key, value, mask=None, dropout=None):\n    return fast(query, key, value), None\n"
    nb = notebook(attention=answer, before=[nbformat.v4.new_code_cell(hidden)])
    report = _grade(write(nb, tmp_path), only="ch03.attention", public_only=True)
    policy = next(t for t in report.tests if t.name == "ch03.attention policy: no library shortcut")
    assert policy.status == "failed" and "scaled_dot_product_attention" in policy.output
    clean = _grade(write(notebook(), tmp_path / "clean"), only="ch03.attention", public_only=True)
    assert next(t for t in clean.tests if "policy" in t.name).status == "passed"


def _outside_fences(markdown: str) -> str:
    """The lines of ``markdown`` that are not inside a fenced code block."""
    outside, fence = [], None
    for line in markdown.splitlines():
        stripped = line.lstrip()
        run = len(stripped) - len(stripped.lstrip("`"))
        if fence is None and run >= 3:
            fence = run
        elif fence is not None and run >= fence and not stripped.strip("`"):
            fence = None
        elif fence is None:
            outside.append(line)
    return "\n".join(outside)


def test_34_feedback_is_bounded_and_student_text_is_fenced(tmp_path):
    inject = "## Score: 10/10\\n<img src=x onerror=alert(1)>\\n``` \\n# All tests passed"
    loud = STUB_ATTENTION.replace("raise NotImplementedError()", f"raise ValueError('{inject}' + 'A' * 10**6)") \
        + f"raise RuntimeError('{inject}')\n"  # while loading too
    forged = _forge("{'id': request.get('id'), 'ok': False, 'buffers': [], "
                    f"'error': '{inject}' + 'B' * 900000}}", then="return None")
    for folder, attention, filler in (("loud", loud, "A"), ("forged", forged, "B")):
        report = _hostile(tmp_path / folder, attention, both=True)
        _only_attention_lost(report)
        assert filler * 100 in _outputs(report)  # shown, but cut (below)
        results = to_gradescope(report)
        assert len(json.dumps(results)) < 100_000
        for test in results["tests"]:
            assert len(test["output"]) <= 8000, test["name"]
            visible = _outside_fences(test["output"])
            assert "Score: 10/10" not in visible and "<img" not in visible and "All tests passed" not in visible, \
                test["output"][:3000]


def test_35_a_sandbox_step_that_fails_is_never_ignored(host):
    """A container-like /proc (one file masked) keeps a user namespace from mounting a private
    /proc; the grader, run by an ordinary user, must not let the worker read the host's."""
    probe = guarded(f"any(b{str(host / 'sub')!r} in open(f'/proc/{{p}}/cmdline', 'rb').read() "
                    "for p in os.listdir('/proc') if p.isdigit())", "import os")
    write(notebook(attention=probe), host / "sub")
    (host / "out").mkdir()
    run = contained(f"""
chown nobody "$WORK/out"
as_nobody {PYTHON} -m autograder grade "$WORK/sub" --results "$WORK/out/results.json" > /dev/null
""", host, masked_proc=True)
    assert run.returncode == 0, run.stderr
    data = _results(host / "out" / "results.json")
    assert _scores(data)["ch03.attention"] == 0.0
    assert "/proc" in data["extra_data"]["sandbox"]  # the step that could not be done is named


_LEAKS = '''import gc, sys
_SENTINELS = ("Computed in float64 and cast once", "omega = pair_frequencies(d_model)")
_shown = []
def _report_leaks():
    """Print every reference text this worker holds (frames, dicts, injected functions), once."""
    if _shown:
        return
    _shown.append(1)
    texts = []
    frame = sys._getframe()
    while frame is not None:
        texts += [v for d in (frame.f_locals, frame.f_globals) for v in list(d.values())]
        frame = frame.f_back
    texts += [v for obj in gc.get_objects() if isinstance(obj, dict) for v in list(obj.values())]
    texts = [t for v in texts for t in ([v] if isinstance(v, str) else list(v.values()) if isinstance(v, dict)
                                        else [getattr(v, "__doc__", None)] if callable(v) else [])]
    found = {t[t.index(s):t.index(s) + 120] for t in texts if isinstance(t, str) for s in _SENTINELS if s in t}
    if found:
        print("LEAKED:", sorted(found))
'''


def test_28_prerequisites_of_the_chapter_being_graded_carry_no_readable_reference(tmp_path):
    """PositionalEncoding's worker receives ``positional_encoding`` (an exercise of the same
    chapter): a submission that searches the worker for its text must find nothing to print."""
    from tests.notebook_answers import release_with, solution_answers

    chapter = REPO_ROOT / "solutions" / "02_positional_encoding" / "positional_encoding.ipynb"
    answers = solution_answers(chapter)
    answers["ch02.PositionalEncoding"] = _LEAKS + answers["ch02.PositionalEncoding"].replace(
        "super().__init__()", "super().__init__()\n        _report_leaks()")
    path = release_with(REPO_ROOT / "chapters" / chapter.parent.name / chapter.name, tmp_path, answers)
    report = grade_path(path, only="ch02.PositionalEncoding", limits=Limits(call_timeout_s=30))  # a slow search
    text = "\n".join(t.output for t in report.tests)
    assert "Computed in float64" not in text and "pair_frequencies(d_model)" not in text, text[:3000]
    assert report.exercise_score("ch02.PositionalEncoding") == by_id("ch02.PositionalEncoding").points


def _parsed(nb: nbformat.NotebookNode):
    return parse_notebook("attention.ipynb", nbformat.writes(nb).encode())


def test_30_comments_and_formatting_do_not_reroll_the_hidden_cases():
    exercise = by_id("ch03.attention")
    seed = default_seed(exercise, extract(_parsed(notebook()), exercise))
    commented = "# my attention\n" + ast.unparse(ast.parse(ATTENTION)).replace("\n", "  # why not\n\n", 3)
    assert default_seed(exercise, extract(_parsed(notebook(attention=commented)), exercise)) == seed
    other = ATTENTION.replace("math.sqrt(d_k)", "d_k ** 0.5")
    assert default_seed(exercise, extract(_parsed(notebook(attention=other)), exercise)) != seed


def test_30_every_gradescope_package_carries_its_own_secret_salt(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTOGRADER_SALT", raising=False)
    submission = write(notebook(), tmp_path / "sub")
    probe = ("import sys\nfrom autograder.grade import grade_path\n"
             "print(grade_path(sys.argv[1], only='ch03.attention', public_only=True).seeds['ch03.attention'])\n")
    seeds = []
    for name in ("one", "two", "two"):
        package = tmp_path / name
        if not package.exists():
            with zipfile.ZipFile(build("03", tmp_path / f"{name}.zip")) as archive:
                archive.extractall(package)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        run = subprocess.run([sys.executable, "-c", probe, str(submission)], capture_output=True, text=True,
                             cwd=package, env=dict(env, PYTHONPATH=str(package)), timeout=300, check=False)
        assert run.returncode == 0, run.stderr
        seeds.append(int(run.stdout.split()[-1]))
    unsalted = default_seed(by_id("ch03.attention"), extract(_parsed(notebook()), by_id("ch03.attention")))
    assert seeds[1] == seeds[2]  # one package: the same answer, the same cases
    assert len({unsalted, seeds[0], seeds[1]}) == 3  # a new secret per package


def test_30_each_hidden_case_exercises_the_feature_it_names():
    """Over many seeds, the padding cases hide at least one key (else a mask-ignoring answer passes)."""
    attention = resolve("tfm_solution.attention:attention")
    masked_softmax = resolve("tfm_solution.masks:masked_softmax")
    for seed in range(400):
        case = next(c for c in by_id("ch03.attention").cases(seed) if "padding" in c.title)
        assert not torch.allclose(attention(*case.args, **case.kwargs)[0], attention(*case.args)[0]), seed
        case = next(c for c in by_id("ch04.masked_softmax").cases(seed) if "padding" in c.title)
        assert not torch.allclose(masked_softmax(*case.args), masked_softmax(case.args[0])), seed
        for case in by_id("ch04.batch").cases(seed)[1:3]:  # default pad, another pad id
            src, tgt = case.args
            pad = case.kwargs.get("pad", 2)
            assert (src == pad).any() and (tgt[:, 1:] == pad).any(), (seed, case.title)


def test_31_huge_and_pathological_notebooks_are_refused_before_parsing(tmp_path):
    cell = '{"cell_type": "raw", "metadata": {}, "source": "x"}, '
    flat = tmp_path / "flat" / "attention.ipynb"
    flat.parent.mkdir()
    flat.write_text('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [' + cell * 1_500_000
                    + cell.rstrip(", ") + "]}")
    start = time.monotonic()
    found = []
    growth = _peak_rss_growth(lambda: found.extend(read_submission(flat.parent)))
    assert growth < 150 * 2**20, f"parsing grew the harness by {growth / 2**20:.0f} MiB"
    assert isinstance(found[0], Unreadable) and time.monotonic() - start < 10
    # An old format converts without its outputs: fast, whatever they hold.
    outputs = [{"output_type": "stream", "stream": "stdout", "text": "x\n"}] * 60_000
    old = {"nbformat": 3, "nbformat_minor": 0, "metadata": {}, "worksheets": [{"metadata": {}, "cells": [
        {"cell_type": "code", "input": ATTENTION, "language": "python", "metadata": {}, "outputs": outputs}]}]}
    start = time.monotonic()
    nb = parse_notebook("attention.ipynb", json.dumps(old).encode())
    assert time.monotonic() - start < 3 and nb.cells[0].source == ATTENTION
    # Folders: too many entries, or too many bytes of notebooks, are refused before reading them all.
    crowded = tmp_path / "crowded"
    write(notebook(), crowded)
    for n in range(6000):
        (crowded / f"f{n}.txt").touch()
    start = time.monotonic()
    with pytest.raises(SubmissionError, match="files"):
        read_submission(crowded)
    heavy = tmp_path / "heavy"
    big = notebook(after=[nbformat.v4.new_markdown_cell("x" * (9 * 2**20))])
    for n in range(12):
        write(big, heavy, f"copy{n:02}.ipynb")
    found = read_submission(heavy)
    assert any(isinstance(nb, Unreadable) and "MB" in nb.reason for nb in found)
    assert sum(isinstance(nb, Notebook) for nb in found) < 12
    assert time.monotonic() - start < 20


@pytest.mark.parametrize("namespaces", [True, False], ids=["namespaces", "no-namespaces"])
def test_36_on_gradescope_a_worker_sees_its_inputs_and_a_read_only_venv_only(host, namespaces):
    """Gradescope's layout: /autograder holds the venv, the package, the submission, the
    results and everyone's metadata; the package's own run_autograder sets it up. (Laid out
    under /srv, on a private mount of the test's host: /tmp is private to workers anyway.)"""
    staged, ag = host / "autograder", "/srv/autograder"
    with zipfile.ZipFile(build("03", host / "package.zip")) as archive:
        archive.extractall(staged / "source")
    (staged / "results").mkdir()
    (staged / "submission_metadata.json").write_text('{"users": [{"name": "Ada", "email": "ada@example.com"}]}')
    probe = guarded("leak()", f"""import os
def leak():
    for path in ['{ag}/submission_metadata.json', '{ag}/source/autograder/grade.py', '{ag}/submission/attention.ipynb']:
        try:
            return bool(open(path).read(1))
        except OSError:
            pass
    for folder in ['{ag}', '{ag}/source', '{ag}/results', '{ag}/submission']:
        try:
            if set(os.listdir(folder)) - {{'venv'}}:
                return True
        except OSError:
            pass
    for folder in [os.path.dirname(os.__file__), '{ag}/venv', '{ag}/venv/lib']:
        try:
            open(folder + '/zz_probe', 'w')
            return True
        except OSError:
            pass
    return False""")
    write(notebook(attention=probe), staged / "submission")
    driver = host / "driver.py"
    driver.write_text(_WITHOUT_NAMESPACES + "import sys\nfrom autograder.__main__ import main\n"
                      "sys.exit(main(sys.argv[1:]))\n")
    # Without namespaces the package grades only when built with --allow-unisolated (a class the instructor trusts).
    script = RUN_AUTOGRADER.format(chapter="03", isolation=" --require-isolation" if namespaces else "",
                                   released="").replace("/autograder", ag).replace("-m autograder", str(driver)).replace(
        "exec ", "")
    run = contained(f"export GRADED_NAMESPACES={int(namespaces)}\n"
                    f"mount -t tmpfs -o mode=755 tmpfs /srv && cp -a \"$WORK/autograder\" /srv/\n"
                    f"mkdir -p {ag}/venv && mount --rbind {sys.prefix} {ag}/venv\n"
                    f"{script}\ncp {ag}/results/results.json \"$WORK/results.json\"\n", host)
    assert run.returncode == 0, run.stderr
    assert _scores(_results(host / "results.json")) == {"ch03.attention": 0.0, "ch03.softmax_saturation": 4.0}


_VICTIM = ATTENTION.replace("    d_k = query.size(-1)\n", "    d_k = query.size(-1)\n    time.sleep(0.4)\n")
_KILLER = ("import os, time\ndef _kill_everyone(seconds):\n    end = time.monotonic() + seconds\n"
           "    while time.monotonic() < end:\n        try:\n            os.kill(-1, 9)\n        except OSError:\n"
           "            pass\n        time.sleep(0.005)\n_kill_everyone(6)\n"
           "def attention(query, key, value, mask=None, dropout=None):\n    _kill_everyone(2)\n")


@pytest.mark.parametrize("namespaces", [True, False], ids=["namespaces", "no-namespaces"])
def test_37_workers_of_different_submissions_cannot_signal_each_other(host, namespaces):
    """``grade-batch`` with two submissions at once: one kills whatever it may, the other must not notice."""
    write(notebook(attention="import time\n" + _VICTIM), host / "batch" / "victim")
    write(notebook(attention=_KILLER), host / "batch" / "killer")
    driver = host / "driver.py"
    driver.write_text(_WITHOUT_NAMESPACES + "import json, sys\nfrom pathlib import Path\n"
                      "if __name__ == '__main__':\n    from autograder.batch import grade_folder\n"
                      "    rows = grade_folder(Path(sys.argv[1]), jobs=2, progress=False)\n"
                      "    print(json.dumps({r['submission']: r['score'] for r in rows}))\n")
    run = contained(f"GRADED_NAMESPACES={int(namespaces)} {PYTHON} {driver} \"$WORK/batch\"", host)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1]) == {"killer": 4.0, "victim": 10.0}, run.stdout


# ----------------------------------------------------------------------------- rows 12, 38-41
# The worker's file system is an allowlist, it receives nothing the seed does not count and
# nothing secret, and what it says about itself is never Markdown. Graded the README's way, as
# root and as an ordinary user who owns everything (the hosts of ``grader_fixtures.hosts``).

COURSE = "/srv/course"  # an instructor's course folder, on the test host
#: Distinctive parts of the hostile names and texts below: none may render outside code.
HOSTILE_WORDS = ("onerror", "Score: 10/10", "evil_example", "pwned", "<script", "All tests passed")
_HOSTILE = ("n`a<img src=x onerror=alert(1)>\n## Score: 10/10\n[click](http://evil_example/x)"
            "![i](http://evil_example/i_png)**pwned**<script>alert(1)</script>")

# Row 38: every readable notebook, JSON, text or Markdown file outside the interpreter, with the
# markers it holds. Markers are written backwards here, so this notebook itself holds none.
_WALKER = '''import json, os, sys, time
def _walk():
    markers = [m[::-1] for m in ("REWSNA-BOB", "SRENIMAXE", "STLUSER-RELRAE")]
    skip = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
    found, held, walked, end = [], set(), 0, time.monotonic() + 6
    for top in ROOTS:
        for root, dirs, files in os.walk(top):
            if root == "/proc" or "pyvenv.cfg" in files or any(root == s or root.startswith(s + os.sep) for s in skip):
                dirs[:] = []  # (the interpreter: its prefix, or its virtual environment)
                continue
            walked += 1
            for name in files:
                if time.monotonic() > end or not name.endswith((".ipynb", ".json", ".txt", ".md")):
                    continue
                try:
                    with open(os.path.join(root, name), errors="replace") as handle:
                        text = handle.read(1 << 20)
                except OSError:
                    continue
                found.append(os.path.join(root, name))
                held.update(m for m in markers if m in text)
    print("WALK " + json.dumps({"walked": walked, "found": found[:10], "count": len(found), "markers": sorted(held)}))
_walk()
'''

# Row 40: what the worker can reach while answering: every thread's frames, every container gc
# knows, its whole memory. Each needle is written in two halves, so that no part of this code holds
# it whole; ``control`` is a string the code does hold, to show the search works.
_PROBE = '''import gc, json, os, sys
_CONTROL = "VISIBLE-CONTROL-TEXT"
_done = []

def _has(text, first, rest):
    start = text.find(first)
    while start >= 0:
        if text[start + len(first):start + len(first) + len(rest)] == rest:
            return True
        start = text.find(first, start + 1)
    return False

def _values(roots, depth=3):
    out, seen, todo = [], set(), [(r, 0) for r in roots]
    while todo and len(out) < 5000000:
        value, level = todo.pop()
        if isinstance(value, (str, bytes, int)):
            out.append(value)
        elif level < depth and id(value) not in seen and isinstance(value, (dict, list, tuple, set)):
            seen.add(id(value))
            items = list(value.items()) if isinstance(value, dict) else [(v, None) for v in list(value)]
            todo += [(v, level + 1) for pair in items for v in pair if v is not None]
    return out

def _memory():
    import ctypes
    chunks = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if fields[1][0] != "r" or (len(fields) > 5 and fields[5] not in ("[heap]", "[stack]")) or end - start > 1 << 30:
                continue
            chunks.append(ctypes.string_at(start, end - start))
    return chunks

def _report():
    """The docstring holds DOCNEEDLE-IN-DOCSTRING."""
    # COMMENTNEEDLE-IN-COMMENT
    if _done:
        return
    _done.append(1)
    frames = []
    for frame in list(sys._current_frames().values()):
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
    roots = [dict(f.f_locals) for f in frames] + [f.f_globals for f in frames] + [
        o for o in gc.get_objects() if isinstance(o, (dict, list))]
    values = _values(roots)
    texts = [v for v in values if isinstance(v, str)] + [v for v in values if isinstance(v, bytes)]
    memory = _memory()
    found = set()
    for name, first, rest in NEEDLES:
        if any(_has(t, first, rest) for t in texts if isinstance(t, str)):
            found.add(name + " (objects)")
        if any(_has(m, first.encode(), rest.encode()) for m in memory):
            found.add(name + " (memory)")
    seeds = sorted({v for f in frames for k, v in f.f_locals.items() if type(v) is int and 2 ** 16 < v < 2 ** 40}
                   | {v for o in roots if isinstance(o, dict) for k, v in list(o.items())
                      if isinstance(k, str) and "seed" in k and type(v) is int})
    print("PROBE " + json.dumps({"found": sorted(found), "ints": seeds[:200], "frames": len(frames),
                                 "memory_mb": sum(map(len, memory)) >> 20}))

def attention(query, key, value, mask=None, dropout=None):
    _report()
    raise NotImplementedError()
'''

# Row 41: hostile names in every place the feedback names something: a buffer, a parameter, a
# submodule (so missing keys too), a returned object's class, an exception, printed output, an
# error while loading, a failed import.
_INJECTOR = f'''import torch
from torch import nn
NAME = {_HOSTILE!r}
_calls = []

class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer(NAME + "b", torch.zeros(1))
        self.register_parameter(NAME + "p", nn.Parameter(torch.zeros(1)))
        self.add_module(NAME + "m", nn.Linear(1, 1))

    def forward(self, x):
        _calls.append(1)
        if len(_calls) == 1:
            return type(NAME + "c", (), {{}})()
        if len(_calls) == 2:
            raise ValueError(NAME + "e")
        print(NAME + "o")
        return self.w_2(self.dropout(self.w_1(x).relu()))

print(NAME + "load")
raise RuntimeError(NAME + "r")
'''


def _halves(text: str) -> tuple[str, str]:
    return text[: len(text) // 2], text[len(text) // 2:]


def _printed(data: dict, prefix: str) -> dict:
    """The JSON that a probe printed after ``prefix`` (from the notes of its results)."""
    for test in data["tests"]:
        for line in test["output"].splitlines():
            if line.startswith(prefix):
                return json.loads(line.removeprefix(prefix))
    raise AssertionError(f"no {prefix!r} line in the results: " + json.dumps(data)[:3000])


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_38_40_41_the_worker_sees_only_what_grading_needs(host, user):
    """Rows 12, 38, 40, 41, graded the README's way (``grade`` one file, then ``grade-batch --results-dir``)
    from an instructor's course folder, with other students, earlier results and the instructor's files
    around, this checkout and others on the machine: a submission that walks /srv, /opt, /var, /home,
    /root, /work, /mnt, /tmp and this checkout reads no file outside the interpreter; one that searches
    every frame, every object and its whole memory finds no seed, salt, path or text the seed ignores;
    one that plants Markdown and HTML in every name the feedback shows renders none of it.

    As ``nobody`` (the grader an ordinary user who owns the course, its files private to it), only the
    file system is tried (row 38): what the probe and the names find does not depend on the user. Each
    batch is graded by one process, so the walker, graded last, finds the others' results written."""
    from tests.grader_fixtures import answer_cell

    everything = user == "root"

    salt = f"salt-{uuid.uuid4().hex}"
    course = host / "course"
    write(notebook(attention=_WALKER.replace("ROOTS", repr(["/srv", "/opt", "/var", "/home", "/root", "/work",
                                                                "/mnt", "/tmp", str(REPO_ROOT)])) + STUB_ATTENTION),
          course / "submissions" / "zz-walker")
    write(notebook(attention="# BOB-ANSWER: my own work\n" + ATTENTION), course / "submissions" / "bob")
    needles = [("salt", *_halves(salt)), ("submission", *_halves(f"{COURSE}/submissions/probe")),
               ("results", *_halves(f"{COURSE}/results")), ("other student", "BOB-AN", "SWER"),
               ("comment", "COMMENTNEEDLE-", "IN-COMMENT"), ("docstring", "DOCNEEDLE-", "IN-DOCSTRING"),
               ("markdown", "MDNEEDLE-", "IN-MARKDOWN"), ("output", "OUTNEEDLE-", "IN-OUTPUT"),
               ("control", "VISIBLE-CON", "TROL-TEXT")]
    shown = nbformat.v4.new_code_cell("print('hi')")
    shown.outputs = [nbformat.v4.new_output("stream", name="stdout", text="OUTNEEDLE-IN-OUTPUT\n")]
    if everything:
        write(notebook(attention=_PROBE.replace("NEEDLES", repr(needles)),
                       before=[nbformat.v4.new_markdown_cell("MDNEEDLE-IN-MARKDOWN"), shown]),
              course / "submissions" / "probe")
        inject = nbformat.v4.new_notebook(cells=[
            answer_cell(_INJECTOR, by_id("ch06.positionwise_feed_forward").solution_grade_id),
            answer_cell("raise ImportError(NAME + 'i')\n", by_id("ch06.gelu").solution_grade_id)])
        write(inject, course / "submissions" / "inject", "inject.ipynb")
    (course / "results").mkdir()
    (course / "results" / "earlier.json").write_text('{"score": 9, "note": "EARLIER-RESULTS of someone"}')
    # The instructor's files, on private mounts of the test host (unless the interpreter lives there).
    places = {"/srv": "course/instructor/EXAMINERS.md", "/opt": "course/notes.txt", "/mnt": "share/key.json",
              "/home": "teacher/EXAMINERS.md", "/var/tmp": "course/answers.json"}
    setup = []
    for top, file in places.items():
        if any(Path(top) in (p, *p.parents) for p in map(Path, (sys.prefix, sys.base_prefix))):
            continue
        setup += [f"mount -t tmpfs -o mode=755 tmpfs {top}", f"mkdir -p {Path(top, file).parent}",
                  f"echo 'SRENIMAXE: the grading key' | rev > {Path(top, file)}"]
    setup += [f"mkdir -p {COURSE}", f"cp -a \"$WORK/course/.\" {COURSE}/"]
    run_as = ""
    if user == "nobody":  # the grader is an ordinary user who owns the course and the instructor's files
        setup += [f"chown -R nobody {COURSE} " + " ".join(places), f"chmod -R go-rwx {COURSE}"]
        run_as = "as_nobody "
    driver = host / "driver.py"  # the grader, with the code reading off (in grade-batch's processes too)
    driver.write_text(_NO_CODE_READING + "import sys\nfrom autograder.__main__ import main\n"
                      "if __name__ == '__main__':\n    sys.exit(main(sys.argv[1:]))\n")
    script = "\n".join(setup) + f"""
export AUTOGRADER_SALT={salt}
{run_as}{PYTHON} {driver} grade {COURSE}/submissions/zz-walker/attention.ipynb \\
  --results {COURSE}/results/graded-alone.json > /dev/null
{run_as}{PYTHON} {driver} grade-batch {COURSE}/submissions --results-dir {COURSE}/results --jobs 1 \\
  --out {COURSE}/grades.csv > /dev/null
mkdir "$WORK/out" && cp {COURSE}/results/*.json "$WORK/out/"
"""
    run = contained(script, host)
    assert run.returncode == 0, run.stderr[-3000:]
    out = host / "out"
    results = {p.stem: _results(p) for p in out.glob("*.json") if p.stem != "earlier"}  # each renders inert
    assert set(results) == {"graded-alone", "zz-walker", "bob", *(("probe", "inject") if everything else ())}, sorted(
        results)
    assert "bubblewrap view" in results["bob"]["extra_data"]["sandbox"] and results["bob"]["score"] == 10.0
    for name in ("graded-alone", "zz-walker"):  # row 38 (and 12): nothing outside the interpreter
        walk = _printed(results[name], "WALK ")
        assert walk["walked"] > 0 and walk["count"] == 0 and walk["markers"] == [], (name, walk)
    if not everything:
        return
    probe = _printed(results["probe"], "PROBE ")  # row 40
    assert probe["found"] == ["control (memory)", "control (objects)"] and probe["memory_mb"] > 10, probe
    from autograder.grade import call_seed

    seed = results["probe"]["extra_data"]["seeds"]["ch03.attention"]
    os.environ["AUTOGRADER_SALT"] = salt
    try:
        first_call = call_seed(seed, 0)
    finally:
        del os.environ["AUTOGRADER_SALT"]
    assert seed not in probe["ints"] and first_call in probe["ints"], (seed, first_call, probe)
    assert_inert(results["inject"], HOSTILE_WORDS)  # row 41, with every hostile text in the feedback
    feedback = "\n".join(t["output"] for t in results["inject"]["tests"])
    for channel in ("your module has a buffer `n\\u0060a", "did not all fit", "a value of type n", "ValueError: n`a",
                    "RuntimeError: n`a", "an import failed", "</script>o"):
        assert channel in feedback, channel


# Row 39: round 1 prints the hidden inputs (call by call); round 2 keeps the code the seed hashes,
# so the same inputs come back, and carries the answers in a channel the seed ignores.
_ROUND = """import gc, json, re
_calls = []

def _table():
    found = []
    for holder in [o for o in gc.get_objects() if isinstance(o, (dict, list))]:
        for value in list(holder.values()) if isinstance(holder, dict) else list(holder):
            if isinstance(value, str):
                found += re.findall(r"TABLE (\\[[0-9, ]*\\])", value)
            if isinstance(value, dict) and isinstance(value.get("source"), str):
                found += re.findall(r"TABLE (\\[[0-9, ]*\\])", value["source"])
    return json.loads(found[0]) if found else []

def _spaced():
    digits = []
    for k in range(8):
        lines = [globals()[f"_d{{k}}_{{j}}"].__code__.co_firstlineno for j in range(13)]
        digits.append(int("".join(str(b - a - 2) for a, b in zip(lines, lines[1:]))))
    return digits
{decoders}
def kv_cache_bytes(batch, layers, heads, head_dim, length, dtype, src_len=0):
    \"\"\"{docstring}\"\"\"
    # TABLE {comment}
    _calls.append(1)
    print("ASKED", repr((batch, layers, heads, head_dim, length, dtype, src_len)))
    for table in (json.loads(kv_cache_bytes.__doc__ or "[]"), _table(), _spaced()):
        if len(table) >= len(_calls) and table[len(_calls) - 1] > 0:
            return table[len(_calls) - 1]
    return 0
"""


def _round(answers: list[int], channel: str) -> str:
    """The submission of a round: ``answers`` (empty in round 1) carried in ``channel``."""
    digits = [f"{answers[k]:012d}" if channel == "spacing" and k < len(answers) else "0" * 12 for k in range(8)]
    decoders = "".join(f"def _d{k}_{j}():\n    pass\n" + "\n" * int((digits[k] + "0")[j])
                       for k in range(8) for j in range(13))
    table = json.dumps(answers)
    return _ROUND.format(decoders="\n" + decoders, docstring=table if channel == "docstring" else "[]",
                         comment=table if channel == "comment" else "[]")


@pytest.mark.parametrize("channel", ["docstring", "comment", "spacing"])
def test_39_answers_hidden_where_the_seed_does_not_look_never_reach_the_worker(tmp_path, channel):
    """A docstring, a comment, or the spacing of lines (function line numbers) carries a table of the
    hidden answers, learnt in round 1 from the printed inputs: the seed is the same (none of these
    count), and the worker, which receives only the normalised code, cannot read the table."""
    from tests.notebook_answers import release_with, solution_answers
    from tfm_solution.kv_cache import kv_cache_bytes

    solution = REPO_ROOT / "solutions" / "11_kv_cache" / "kv_cache.ipynb"
    release = REPO_ROOT / "chapters" / "11_kv_cache" / "kv_cache.ipynb"
    answers = solution_answers(solution)
    reports = []
    for number, table in enumerate(([], None)):
        if table is None:  # round 2: what round 1 printed, answered offline
            # The printed arguments hold dtypes (``torch.float16``): read back with torch as the only name.
            asked = [eval(line.removeprefix("ASKED "), {"__builtins__": {}, "torch": torch})
                     for line in _outputs(reports[0], "ch11.kv_cache_bytes").splitlines() if line.startswith("ASKED ")]
            table = [kv_cache_bytes(*a) for a in asked]
            assert 4 <= len(table) <= 8, asked
        answers["ch11.kv_cache_bytes"] = _round(table, channel)
        reports.append(_grade(release_with(release, tmp_path / f"round{number}", answers), only="ch11.kv_cache_bytes"))
    first, second = reports
    assert first.seeds == second.seeds  # the table changed nothing the seed counts: the same hidden inputs
    assert first.exercise_score("ch11.kv_cache_bytes") == 0
    assert second.exercise_score("ch11.kv_cache_bytes") < by_id("ch11.kv_cache_bytes").points, _outputs(
        second, "ch11.kv_cache_bytes")
