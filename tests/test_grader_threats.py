"""Every row of the threat table as a regression test: a hostile submission and its outcome.

Each submission puts the attack in ``attention`` (6 points) and leaves a correct
``softmax_saturation`` (4 points) next to it, so each test also checks that an attack costs
only its own exercise. Probes built with ``guarded`` answer correctly only if the attack
works, so "0 points for attention" means the sandbox held.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import jsonschema
import nbformat
import pytest

from autograder.grade import Report, grade_path
from autograder.results import GRADESCOPE_SCHEMA, to_gradescope
from autograder.sandbox import REPO_ROOT, Limits, isolation
from tests.grader_fixtures import ATTENTION, STUB_ATTENTION, guarded, notebook, write

pytestmark = pytest.mark.slow
LIMITS = Limits(call_timeout_s=3.0)


def _namespaces() -> bool:
    return isolation()[0]


def _needs_namespaces() -> None:
    """Hiding files, blocking the network and reaping escaped processes need Linux namespaces;
    without them the grader says so in its results, and these outcomes are not promised."""
    if not _namespaces():
        pytest.skip("Linux namespaces are not available to this user: this protection is off here")


def _grade(path: Path, **kw) -> Report:
    report = grade_path(path, limits=LIMITS, **kw)
    jsonschema.validate(to_gradescope(report), GRADESCOPE_SCHEMA)
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
    assert elapsed < 2 * LIMITS.call_timeout_s + 30


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
    report = _hostile(tmp_path, f"import os, subprocess, threading, time\n"
                                f"def attention(query, key, value, mask=None, dropout=None):\n"
                                f"    subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
                                f"    threading.Thread(target=time.sleep, args=(1000,), daemon=False).start()\n"
                                f"    if query.dim() == 4:\n"
                                f"        while True:\n            try:\n                os.fork()\n"
                                f"            except OSError:\n                pass\n"
                                f"    return query, query\n")
    _only_attention_lost(report)
    time.sleep(0.5)
    assert _processes_with(marker) == []


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
    import json

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


def test_12_hidden_tests_and_other_submissions_are_invisible(tmp_path):
    _needs_namespaces()
    other = tmp_path / "other-student"
    write(notebook(), other)
    probe = guarded(f"os.path.exists({str(REPO_ROOT / 'autograder' / 'cases.py')!r}) or "
                    f"os.path.exists({str(REPO_ROOT / 'tests')!r} + '/test_grader_threats.py') or "
                    f"os.path.exists({str(other / 'attention.ipynb')!r}) or "
                    f"os.path.exists({str(REPO_ROOT / '.git')!r})", "import os")  # history holds the reference
    _only_attention_lost(_hostile(tmp_path / "me", probe))


def test_13_hard_coded_public_outputs_fail_the_hidden_cases(tmp_path):
    from autograder.cases import CASES
    from autograder.grade import _expected, resolve

    public = CASES["ch03.attention"](0)[0]
    out, p_attn = _expected(resolve("tfm_solution.attention:attention"), public)
    constant = (f"import torch\nOUT = torch.tensor({out.tolist()})\nP = torch.tensor({p_attn.tolist()})\n"
                "def attention(query, key, value, mask=None, dropout=None):\n    return OUT.clone(), P.clone()\n")
    report = _hostile(tmp_path, constant)
    _only_attention_lost(report, kept=1.0)


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


def test_without_namespaces_the_grader_still_grades_and_says_so(tmp_path, monkeypatch):
    """The fallback path (process group, limits, private scratch folder) on a correct and a
    crashing answer; the results name the weaker isolation."""
    from autograder import sandbox

    monkeypatch.setattr(sandbox, "isolation", lambda: (False, False, "process group and resource limits only"))
    monkeypatch.setattr("autograder.grade.isolation", sandbox.isolation)
    report = _grade(write(notebook(), tmp_path / "ok"))
    assert report.score == 10.0 and report.sandbox.startswith("process group")
    report = _hostile(tmp_path / "exit", "import os\ndef attention(query, key, value, mask=None, dropout=None):\n"
                                         "    os._exit(3)\n")
    _only_attention_lost(report)
    assert "exit code 3" in _outputs(report)
