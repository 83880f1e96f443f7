"""Chapter 12, the capstone: the student's code gathered from their chapters, the task, Part A's training and
bands, the diagnosis, Part B's weights and BLEU, the widgets.

The fast tests need no training. The slow ones grade the solution's notebooks (Part A once, Part B on a
subset of the test split) and one planted bug end to end; ``scripts/capstone_diagnosis.py`` runs every
planted bug (its table is on the chapter's page).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import struct
from pathlib import Path

import nbformat
import pytest
import torch

import tfm_solution
from autograder import capstone as harness
from autograder.course_code import gather, gather_pieces, run_course
from tfm_solution.my_chapters import PIECES, REQUIRED, is_stub
from autograder.diagnoses_zh import CAPSTONE_ZH
from autograder.exercises import ch12_capstone as spec
from autograder.extract import read_submission
from autograder.grade import grade_path
from autograder.registry import by_id
from tfm_solution.capstone import (ReversalTask, TranslationTask, foreign_modules, forced_predictions, held_out,
                                   load_weights, only_yours, padded, reversal_pairs, same_rows, scores,
                                   train_reversal, translate_part_b)
from tfm_solution.course_model import COURSE_MODEL_DIR

TOP_CASE = f"exact match at least {spec.ACCURACY_BANDS[-1]:.0%}"

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS, CHAPTERS = REPO / "solutions", REPO / "chapters"
MULTI30K = os.environ.get("MULTI30K_DIR")

_spec = importlib.util.spec_from_file_location("capstone_diagnosis", REPO / "scripts" / "capstone_diagnosis.py")
diagnosis_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(diagnosis_script)


def _capstone(notebooks):
    return next(nb for nb in notebooks if getattr(nb, "name", "").startswith("12_capstone"))


# ----------------------------------------------------------------------------- the student's code

@pytest.mark.fast
def test_the_solutions_hold_every_piece_the_capstone_uses():
    found = gather_pieces(read_submission(SOLUTIONS), None)
    assert found.problems == []
    assert set(REQUIRED) <= set(found.sources)
    assert all(found.sources[p.name] == p.where for p in PIECES if p.required)
    # chapter 5's answer imports `clones` from the course: left out, and said so
    assert any("from tfm_solution import clones" in n for n in found.notes)
    assert not any("tfm_solution" in c["source"] for c in found.chunks)


@pytest.mark.fast
def test_the_students_loader_knows_every_answer_the_registry_grades():
    """The student's loader ships without the grader (``tfm_solution.my_chapters``), so its table of pieces is
    written out: every graded exercise of chapters 1-11 is in it at its notebook and answer id, and the two practice
    answers the capstone runs are in the solution notebooks under the ids it names."""
    from autograder.registry import REGISTRY

    graded = {(e.chapter, e.notebook, e.solution_grade_id, e.name) for e in REGISTRY if e.chapter < "12"}
    listed = [(p.chapter, p.notebook, p.grade_id, p.name) for p in PIECES]
    assert graded <= set(listed) and listed == sorted(listed, key=lambda p: p[0])
    for chapter, notebook, grade_id, name in set(listed) - graded:
        cells = nbformat.read(SOLUTIONS / chapter / notebook, as_version=4).cells
        assert any(c.metadata.get("nbgrader", {}).get("grade_id") == grade_id and f"def {name}(" in c.source
                   for c in cells), (chapter, name)


@pytest.mark.fast
def test_the_notebook_gathers_what_the_grader_gathers(tmp_path, monkeypatch):
    """What ``load_my_chapters`` shows the student is what the grader grades: on a course with a chapter missing,
    a stub, a syntax error and a working answer, both name the same sources and the same problems."""
    from tfm_solution.my_chapters import load_my_chapters

    course = _course_copy(tmp_path, drop="03_attention")
    broken = {"ch07-layer-norm": "class LayerNorm(nn.Module):\n    def __init__(self, features, eps=1e-6):\n"
                                 "        raise NotImplementedError\n",
              "ch09-rate": "def rate(step, model_size, factor, warmup):\n    return (\n"}
    for chapter in ("07_add_norm", "09_training"):
        path = next((course / chapter).glob("*.ipynb"))
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            cell.source = broken.get(cell.metadata.get("nbgrader", {}).get("grade_id"), cell.source)
        nbformat.write(nb, path)
    (course / "12_capstone" / "capstone.ipynb").unlink()
    grader = gather_pieces(read_submission(course), None)
    monkeypatch.chdir(course / "12_capstone")
    mine = load_my_chapters({}, quiet=True)
    assert mine.sources == grader.sources and "LayerNorm" not in mine.sources and "attention" not in mine.sources
    assert mine.problems[:len(grader.problems)] == grader.problems
    assert any("`LayerNorm` is not implemented yet" in p for p in grader.problems)
    assert any("`rate` has a syntax error" in p for p in grader.problems)
    assert any("no answer for `attention` was found" in p for p in grader.problems)


@pytest.mark.fast
def test_untouched_chapters_name_every_missing_answer_by_chapter():
    notebooks = read_submission(CHAPTERS)
    extraction = gather(notebooks, _capstone(notebooks), by_id("ch12.reversal"))
    assert extraction.error is not None and "not implemented" in extraction.error
    for piece in (p for p in PIECES if p.required):
        assert f"{piece.where}: `{piece.name}` is not implemented yet" in extraction.error, piece


def _course_copy(tmp_path: Path, drop: str | None = None) -> Path:
    folder = tmp_path / "course"
    shutil.copytree(SOLUTIONS, folder, ignore=shutil.ignore_patterns("my_model", *([drop] if drop else [])))
    return folder


@pytest.mark.fast
def test_comments_and_docstrings_in_the_chapters_reach_neither_the_worker_nor_the_seed(tmp_path):
    """A table of answers in a comment or a docstring would otherwise reach the worker, and editing a comment
    would draw other held-out sequences (a new chance at a band)."""
    folder = _course_copy(tmp_path)
    path = folder / "04_masks" / "masks.ipynb"
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "ch04-batch")
    cell.source = cell.source.replace("def __init__(self, src, tgt=None, pad=2):",
                                      'def __init__(self, src, tgt=None, pad=2):  # TABLE [1, 2, 3]\n'
                                      '        """TABLE [4, 5, 6]"""', 1)
    assert "TABLE [1" in cell.source
    nbformat.write(nb, path)
    exercise = by_id("ch12.reversal")
    found = {}
    for name, course in (("solutions", SOLUTIONS), ("commented", folder)):
        notebooks = read_submission(course)
        found[name] = gather(notebooks, _capstone(notebooks), exercise)
    assert "TABLE" not in "".join(found["commented"].sources())
    assert found["commented"].sources() == found["solutions"].sources()
    assert found["commented"].digest() == found["solutions"].digest()


@pytest.mark.fast
def test_a_missing_chapter_is_named_and_a_pasted_answer_takes_its_place(tmp_path):
    folder = _course_copy(tmp_path, drop="06_feed_forward")
    notebooks = read_submission(folder)
    extraction = gather(notebooks, _capstone(notebooks), by_id("ch12.reversal"))
    assert "chapter 6 (06_feed_forward/feed_forward.ipynb): no answer for `PositionwiseFeedForward` was found" \
        in extraction.error
    assert extraction.error.count("\n- ") == 1  # only that one
    path = folder / "12_capstone" / "capstone.ipynb"
    nb = nbformat.read(path, as_version=4)
    ffn = diagnosis_script.solution_answer("ch06-positionwise-feed-forward")
    paste = next(c for c in nb.cells if c.source.startswith("# Paste here"))
    paste.source += "\n" + ffn
    nbformat.write(nb, path)
    notebooks = read_submission(folder)
    assert gather(notebooks, _capstone(notebooks), by_id("ch12.reversal")).error is None
    assert gather_pieces(notebooks, _capstone(notebooks)).sources["PositionwiseFeedForward"] == "this notebook"


@pytest.mark.fast
@pytest.mark.parametrize("source,stub", [
    ("def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()\n", True),
    ("def f(x):\n    '''doc'''\n    raise NotImplementedError\n", True),
    ("class f:\n    def __init__(self):\n        super().__init__()\n        raise NotImplementedError()\n", True),
    ("def f(x):\n    return x\n", False),
    ("def f(x):\n    if x:\n        raise NotImplementedError('negative x')\n    return x\n", False),
    ("def f(x):\n    return x\n    raise NotImplementedError()\n", False),
])
def test_stubs_are_told_from_answers(source, stub):
    import ast

    assert is_stub(ast.parse(source), "f") is stub


# ----------------------------------------------------------------------------- the task

@pytest.mark.fast
def test_the_grader_trains_the_task_the_notebook_shows():
    assert ReversalTask(**{k: v for k, v in spec.TASK.items() if k != "module"}) == ReversalTask()
    assert TranslationTask(**{k: v for k, v in spec.TRANSLATION.items() if k != "module"}) == TranslationTask()


@pytest.mark.fast
def test_reversal_pairs_reverse_and_never_train_on_held_out_sequences():
    task = ReversalTask()
    train = reversal_pairs(300, task, torch.Generator().manual_seed(0))
    unseen = reversal_pairs(300, task, torch.Generator().manual_seed(0), evaluation=True)
    for src, tgt in train + unseen:
        symbols = src[:-1]
        assert src[-1] == task.eos and tgt == [task.bos, *symbols[::-1], task.eos]
        assert task.min_len <= len(symbols) <= task.max_len and all(4 <= s < task.vocab for s in symbols)
    assert not any(held_out(s[:-1]) for s, _ in train) and all(held_out(s[:-1]) for s, _ in unseen)
    draw = torch.Generator().manual_seed(1)
    sequences = [torch.randint(4, task.vocab, (int(torch.randint(task.min_len, task.max_len + 1, (1,), generator=draw)),),
                               generator=draw).tolist() for _ in range(4000)]
    assert 0.08 < sum(map(held_out, sequences)) / len(sequences) < 0.12  # a tenth of all sequences is held out


@pytest.mark.fast
def test_scores_count_exact_matches_forced_predictions_and_agreement_by_hand():
    pairs = [([5, 6, 1], [0, 6, 5, 1]), ([7, 1], [0, 7, 1])]
    greedy = torch.tensor([[0, 6, 5, 1, 2], [0, 7, 7, 1, 2]])       # right, then wrong
    cached = torch.tensor([[0, 6, 5, 1], [0, 7, 7, 1]])             # the same tokens, narrower
    forced = torch.tensor([[6, 5, 1], [7, 1, 9]])                   # both right (padding positions ignored)
    assert scores(pairs, greedy, cached, forced, pad=2) == (0.5, 1.0, 1.0)
    assert same_rows(cached, torch.tensor([[0, 6, 5, 1], [0, 7, 1, 2]]), 2) == [True, False]
    with pytest.raises(ValueError, match="one row per held-out sequence"):
        scores(pairs, greedy[:1], cached, forced, pad=2)


@pytest.mark.fast
def test_teacher_forcing_and_greedy_decoding_agree_on_what_a_model_gets_right():
    """The property the diagnosis relies on: a working greedy decoder gets a sequence exactly right iff
    teacher forcing predicts its every token. Checked on the reference model with its first rows made
    exact by construction (the greedy outputs themselves as targets)."""
    task = ReversalTask()
    torch.manual_seed(0)
    model = tfm_solution.make_model(task.vocab, task.vocab, 1, 16, 32, 2, 0.0).eval()
    pairs = reversal_pairs(20, task, torch.Generator().manual_seed(3), evaluation=True)
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s, _ in pairs], batch_first=True, padding_value=2)
    greedy = tfm_solution.greedy_decode(model, src, (src != 2).unsqueeze(-2), task.max_len + 2, 0, 1, 2)
    own = [(s, [t for t in row if t != 2][: row.index(1) + 1] if 1 in row else row) for (s, _), row
           in zip(pairs, greedy.tolist())]
    own = [(s, t) for s, t in own if t[-1] == 1]
    assert own, "some greedy outputs end"
    assert scores(own, greedy[[i for i, (s, _) in enumerate(pairs) if any(s is o for o, _ in own)]],
                  greedy[: len(own)], forced_predictions(model, own, 2), 2)[:2] == (1.0, 1.0)


# ----------------------------------------------------------------------------- the model is the student's

@pytest.mark.fast
def test_only_the_students_classes_may_make_the_model():
    reference = tfm_solution.make_model(14, 14, 1, 16, 32, 2, 0.0)
    assert "encoder: Encoder" in foreign_modules(reference)
    with pytest.raises(TypeError, match="course's reference classes"):
        only_yours(reference)
    parts = run_course(SOLUTIONS)
    mine = parts["make_model"](14, 14, 1, 16, 32, 2, 0.0)
    assert foreign_modules(mine) == [] and only_yours(mine) is mine


# ----------------------------------------------------------------------------- Part B's weights

def _safetensors(header: dict, body: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


@pytest.mark.fast
@pytest.mark.parametrize("data,why", [
    (b"\x80\x04K\x01.", "not a safetensors file"),                                   # a pickle
    (b"", "too short"),
    (struct.pack("<Q", 10**9) + b"{}", "header size is impossible"),
    (struct.pack("<Q", 4) + b"nope", "not JSON"),
    (_safetensors({"w": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}, bytes(8)), "malformed"),
    (_safetensors({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)), "do not match"),
    (_safetensors({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                   "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)), "overlap"),
    (_safetensors({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(4)), "truncated"),
    ((COURSE_MODEL_DIR / "model.safetensors").read_bytes()[:100_000], "truncated"),  # an export cut short
    ((COURSE_MODEL_DIR / "model.safetensors").read_bytes()[:1000], "truncated"),  # within its header
])
def test_a_bad_weights_file_is_refused_before_anything_reads_it(data, why):
    with pytest.raises(harness.WeightsRejected, match=why):
        harness.read_weights(data)


@pytest.mark.fast
def test_the_course_models_weights_fit_the_solutions_model_and_translate_as_the_reference_does():
    """Independent oracle: the reference's own beam search on the course model."""
    weights = harness.read_weights((COURSE_MODEL_DIR / "model.safetensors").read_bytes())
    assert torch.equal(weights["src_embed.0.lut.weight"], weights["generator.proj.weight"])  # the tied copies
    parts = run_course(SOLUTIONS)
    from tfm_solution.course_model import load_course_model
    from tfm_solution.data import PAD, pad_batch

    reference, tokenizer = load_course_model()
    sources = pad_batch([tokenizer.encode_src(s) for s in ("Ein Hund rennt.", "Zwei Frauen lachen im Park.")], PAD)
    got = translate_part_b(parts, weights, sources, TranslationTask())
    want = tfm_solution.beam_search(reference, sources, (sources != PAD).unsqueeze(-2), sources.size(1) + 50, 0, 1)
    assert [row[: len(h[0].tokens)] for row, h in zip(got.tolist(), want)] == [h[0].tokens for h in want]
    model = parts["make_model"](5000, 5000, 3, 128, 512, 4, 0.1)
    wrong = dict(weights, **{"generator.proj.weight": torch.zeros(3, 128)})
    del wrong["decoder.norm.a_2"]
    with pytest.raises(ValueError, match="missing from the file: decoder.norm.a_2.*other shapes: generator.proj"):
        load_weights(model, wrong)


# ----------------------------------------------------------------------------- the planted bugs

PASS_VISIBLE = {"masks", "SublayerConnection", "embeddings", "positional encoding", "glue"}


@pytest.mark.fast
@pytest.mark.parametrize("component", list(spec.PLANTED))
def test_planted_bugs_and_their_chapters_visible_tests(component):
    """Five planted bugs pass their own chapter's visible tests (what makes them worth diagnosing); five cut
    the graph, which the contract's visible tests catch; for the other four components every bug found that
    stops the model from learning is caught by them."""
    grade_id, _, source = spec.PLANTED[component]
    failure = diagnosis_script.visible_tests(grade_id, source)
    assert (failure is None) == (component in PASS_VISIBLE), failure
    # The check itself: the solution's own answer passes it.
    assert diagnosis_script.visible_tests(grade_id, diagnosis_script.solution_answer(grade_id)) is None


@pytest.mark.fast
def test_every_component_can_be_put_in_place_and_has_a_planted_bug():
    assert [c[0] for c in spec.COMPONENTS] == list(spec.PLANTED)
    for _, _, installed, targets, hint in spec.COMPONENTS:
        assert installed and hint and all(n in {t.split(":")[1] for t in targets} for n in installed)


@pytest.mark.fast
def test_the_recorded_diagnosis_is_of_todays_bugs_and_names_each_one():
    """The table on the chapter's page (``scripts/capstone_diagnosis.py``'s record): every planted bug as declared
    now, graded with the task as declared now, named right, and no bug scored in full."""
    record = json.loads((REPO / "tfm_solution" / "assets" / "capstone_diagnosis.json").read_text())
    assert record["task"] == json.loads(json.dumps(spec.TASK))
    rows = {row["component"]: row for row in record["bugs"]}
    assert list(rows) == list(spec.PLANTED)
    for component, (answer_cell, bug, _) in spec.PLANTED.items():
        row = rows[component]
        assert row["bug"] == bug, f"{component}: declared since the record was made; rerun the script"
        assert row["answer_cell"] == answer_cell, row
        assert row["named"] == component and row["right"], row
        assert row["score"] < by_id("ch12.reversal").points and row["runs"] <= 5
        # A model that learns anyway is named by what the harness measured (parameters that never changed),
        # without retraining; every other bug is found by substitution.
        learned = row["accuracy"] is not None and row["accuracy"] >= spec.ACCURACY_BANDS[-1]
        assert (row["runs"] == 0) == learned, row
        assert (row["visible_tests"] == "pass") == (component in PASS_VISIBLE)
    more = {row["component"]: row for row in record["more"]}
    assert list(more) == list(spec.ALSO_PLANTED)
    for component, (answer_cell, bug, says, _) in spec.ALSO_PLANTED.items():
        row = more[component]
        assert row["bug"] == bug and row["says"] == says, f"{component}: declared since the record was made"
        assert row["answer_cell"] == answer_cell, row
        assert row["right"] and row["score"] < by_id("ch12.reversal").points, row


@pytest.mark.fast
def test_the_bands_lie_below_every_correct_course_of_the_seed_table():
    """``scripts/capstone_seeds.py``'s record: the task as declared now, the solution and at least three correct
    courses written otherwise, 20 training seeds each; every run clears full marks by three points, keeps every
    parameter learning and is deterministic in evaluation (a correct course never loses a point by luck)."""
    record = json.loads((REPO / "tfm_solution" / "assets" / "capstone_seeds.json").read_text())
    assert record["task"] == json.loads(json.dumps(spec.TASK))
    courses: dict[str, list[dict]] = {}
    for run in record["runs"]:
        courses.setdefault(run["style"], []).append(run)
    assert "solution" in courses and len(courses) >= 4, list(courses)
    for style, runs in courses.items():
        assert sorted(r["seed"] for r in runs) == list(range(20)), style
        assert record["courses"][style]["worst"] == min(r["accuracy"] for r in runs)
        for run in runs:
            assert run["accuracy"] >= spec.ACCURACY_BANDS[-1] + 0.03, run
            assert run["unchanged"] == [] and run["repeatable"] is True, run
            assert run["agreement"] == 1.0, run


def _reply(pairs, *, changed=0.5, repeatable=True, unchanged=(), cut_by=(), count=None):
    """A Part A reply whose decoders return the right targets for ``pairs``, and the harness's measures as given."""
    right = padded([t for _, t in pairs], ReversalTask().pad)
    return (right, right.clone(), right[:, 1:].clone(), 1000.0, 300.0, 20.0, spec.TASK["steps"], spec.TASK["steps"],
            torch.zeros(2, 2, dtype=torch.float64), right.clone(), changed, 600, repeatable, tuple(unchanged),
            tuple(cut_by), len(unchanged) if count is None else count)


@pytest.mark.fast
def test_full_marks_need_every_parameter_learning_and_dropout_off_in_evaluation():
    """A right answer loses the top band when the harness saw dropout on after eval() or parameters that never
    changed, and every band when training changed nothing; the lines say why."""
    seed = 7
    pairs = harness.held_out_pairs(seed)
    top, low = spec.ACCURACY_BANDS[-1], spec.ACCURACY_BANDS[0]
    accuracy = spec.JUDGES["accuracy"]
    assert accuracy(top, seed, _reply(pairs))[0] and accuracy(low, seed, _reply(pairs))[0]
    passed, lines = accuracy(top, seed, _reply(pairs, repeatable=False))
    assert not passed and "dropout is still on after `model.eval()`" in lines[0]
    assert accuracy(low, seed, _reply(pairs, repeatable=False))[0]
    frozen = ("decoder.layers.0.feed_forward.w_1.weight (PositionwiseFeedForward)",
              "decoder.layers.0.feed_forward.w_1.bias (PositionwiseFeedForward)")
    passed, lines = accuracy(top, seed, _reply(pairs, unchanged=frozen))
    assert not passed and "left 2 of your model's parameter tensors exactly as they were initialised" in lines[0]
    assert "`decoder.layers.0.feed_forward.w_1.weight`" in lines[0]
    # The worker names the first tensors only (a sequence on the wire holds at most 64 items) and counts them all.
    passed, lines = accuracy(top, seed, _reply(pairs, unchanged=frozen, count=80))
    assert not passed and "left 80 of your model's parameter tensors" in lines[0]
    passed, lines = accuracy(low, seed, _reply(pairs, changed=0.0, unchanged=frozen))
    assert not passed and lines[0].startswith("training changed none of your model's parameters")


@pytest.mark.fast
def test_parameters_that_never_learn_name_the_component_only_where_the_graph_is_cut():
    """The diagnosis of a model that learned with frozen parameters: the component of the classes that cut the
    graph when the worker found them, and otherwise only the classes holding the frozen tensors, no component."""
    from types import SimpleNamespace

    frozen = ("encoder.layers.0.feed_forward.w_1.weight (PositionwiseFeedForward)",
              "encoder.layers.0.sublayer.1.norm.a_2 (LayerNorm)")
    named = harness.reply(_reply(harness.held_out_pairs(3), unchanged=frozen, cut_by=("PositionwiseFeedForward",)))
    said = harness.CapstoneRun._frozen_diagnosis(SimpleNamespace(language="en"), named, 0.97)
    assert said.startswith("**Diagnosis: feed-forward** (chapter 6's `PositionwiseFeedForward`)"), said
    assert "never changed 2 of its parameter tensors" in said and "stops in your `PositionwiseFeedForward`" in said
    named = harness.reply(_reply(harness.held_out_pairs(3), unchanged=frozen))
    said = harness.CapstoneRun._frozen_diagnosis(SimpleNamespace(language="en"), named, 0.97)
    assert said.startswith("**Diagnosis: parameters that never learn**") and "`LayerNorm`" in said, said
    assert harness.CapstoneRun._frozen_diagnosis(SimpleNamespace(language="en"), harness.reply(
        _reply(harness.held_out_pairs(3))), 0.97) is None
    zh = harness.CapstoneRun._frozen_diagnosis(SimpleNamespace(language="zh"), named, 0.97)
    assert zh.startswith("**诊断：从不学习的参数**"), zh


@pytest.mark.fast
def test_the_cached_decoders_first_difference_points_at_the_likely_mistake():
    """The first generated position where the two decoders differ: at the first token only what reads the source
    (or the last norm) can differ; later, the hint still names the scale 1/sqrt(d_k)."""
    pad = 2
    a = torch.tensor([[0, 5, 6, 1], [0, 7, 1, pad]])
    assert harness.first_difference(a, a.clone(), pad) is None
    assert harness.first_difference(a, torch.tensor([[0, 5, 6, 1], [0, 7, 8, 1]]), pad) == 2
    assert harness.first_difference(a, torch.tensor([[0, 4, 6, 1], [0, 7, 1, pad]]), pad) == 1
    assert harness.first_difference(a, torch.tensor([[0, 5, 6, 1, pad], [0, 7, 1, pad, pad]]), pad) is None
    pairs = harness.held_out_pairs(1)
    reply = list(_reply(pairs))
    reply[1] = reply[1].clone()
    reply[1][0, 1] = (reply[1][0, 1] + 1) % 10 + 4
    passed, lines = spec.JUDGES["agreement"](1.0, 1, tuple(reply))
    assert not passed and "differ already at the first token" in lines[0] and "1/sqrt(d_k)" in lines[0], lines
    reply = list(_reply(pairs))
    reply[1] = reply[1].clone()
    reply[1][3, 3] = (reply[1][3, 3] + 1) % 10 + 4
    passed, lines = spec.JUDGES["agreement"](1.0, 1, tuple(reply))
    assert not passed and "first differ at token 3" in lines[0] and "1/sqrt(d_k)" in lines[0], lines


# ----------------------------------------------------------------------------- the widgets

@pytest.mark.fast
def test_the_widgets_replay_training_and_show_the_models_own_cross_attention():
    from tfm_solution.viz.capstone import TrainingMonitor, cross_attention_view, symbols

    task = ReversalTask(steps=4, chunks=2, held_out=8)
    parts = run_course(SOLUTIONS)
    watched = reversal_pairs(3, task, torch.Generator().manual_seed(5), evaluation=True)
    monitor = TrainingMonitor(parts, watched, task)
    trained = train_reversal(parts, task, on_chunk=monitor.record)
    assert [s for s, _, _ in monitor.records] == [2, 4] and "after 4 steps" in monitor.chart.value
    replay = monitor.finish()
    assert len(replay.stack.children) == 2 and replay.links and monitor.children == (replay,)
    view = cross_attention_view(trained.model, watched[:2], task)
    assert len(view.controls[0].options) == 2 and len(view.controls[1].options) == task.layers
    assert len(view.stack.children) == 2 and all(len(s.children) == task.layers for s in view.stack.children)
    assert symbols([0, 4, 5, 1, 2], task) == "<s> A B </s> ·"


# ----------------------------------------------------------------------------- grading, end to end

def _lines(report, exercise_id):
    return {t.name.split(": ", 1)[-1] if ": " in t.name else t.name: t for t in report.tests
            if t.name.startswith(exercise_id + " ")}


@pytest.mark.slow
def test_part_a_gives_the_solution_full_marks_and_names_a_planted_bug(tmp_path):
    """The solution: full marks, no diagnosis. Then the solution with chapter 8's `make_model` swapping
    MultiHeadedAttention's arguments (the cheapest planted bug to diagnose: every probe without the course's
    `make_model` fails at once, so only two of them train), graded end to end: 0, and the diagnosis names
    `make_model` after training with the course's in its place."""
    report = grade_path(SOLUTIONS, chapter="12", only="ch12.reversal")
    lines = _lines(report, "ch12.reversal")
    assert report.exercise_score("ch12.reversal") == 12, [t.output for t in lines.values()]
    top = lines[TOP_CASE].output
    assert f"trained {spec.TASK['steps']} of {spec.TASK['steps']} optimizer steps" in top
    assert "Diagnosis" not in "".join(t.output for t in lines.values())

    grade_id, _, source = spec.PLANTED["make_model"]
    report = grade_path(diagnosis_script.submission_with(tmp_path / "course", grade_id, source), chapter="12",
                        only="ch12.reversal")
    lines = _lines(report, "ch12.reversal")
    assert report.exercise_score("ch12.reversal") == 0
    assert "your code raised" in lines[TOP_CASE].output
    notes = lines["ch12.reversal notes"].output
    hint = next(c[4] for c in spec.COMPONENTS if c[0] == "make_model")
    assert "**Diagnosis: make_model** (chapter 8's `make_model`)" in notes and hint in notes, notes
    alone = re.search(r"^- the course's make_model: ([\d.]+)%$", notes, re.M)  # the culprit alone, replaced
    assert alone and float(alone.group(1)) >= 100 * spec.ACCURACY_BANDS[-1], notes


@pytest.mark.slow
def test_part_a_and_b_give_the_untouched_notebooks_zero_naming_each_missing_chapter():
    """As a student runs it: the lone capstone notebook, its chapters found in the folders beside its own."""
    report = grade_path(CHAPTERS / "12_capstone" / "capstone.ipynb", chapter="12")
    assert report.score == 0 and report.max_score == 24
    for exercise in ("ch12.reversal", "ch12.translation"):
        first, *others = (t for t in report.tests if t.max_score > 0 and t.name.startswith(exercise + " "))
        for piece in (p for p in PIECES if p.required):  # the whole list once per exercise
            assert f"{piece.where}: `{piece.name}` is not implemented yet" in first.output, piece
        assert others and all("not implemented" in t.output and f"(listed in full on the line `{first.name}`)"
                              in t.output and "chapter 1 (" not in t.output for t in others)
    notes = [t.output for t in report.tests if t.name.endswith("notes")]
    assert notes and all("read from the 11 chapter notebooks in the folders beside 12_capstone/" in n for n in notes)


def _searched(fixes, language: str = "en") -> tuple[str, list]:
    """The diagnosis's search with a stand-in for its training runs: ``fixes(indices)`` says whether replacing
    the components ``indices`` makes the model learn; the diagnosis is written in ``language``."""
    run = harness.CapstoneRun.__new__(harness.CapstoneRun)
    probes = []

    def probe(indices, eval_seed):
        probes.append(list(indices))
        return (0.99 if fixes(set(indices)) else 0.3), "", 10.0

    run._probe = probe
    return run._search(7, "yours reverses 20.0%", language), probes


@pytest.mark.fast
@pytest.mark.parametrize("culprit", range(len(spec.COMPONENTS)))
def test_the_diagnosis_search_names_the_one_component_that_fixes_training(culprit):
    """Every component, as the only culprit: named, with its hint, in at most five runs (four halvings of the
    fourteen, then the culprit alone). The planted bugs end to end: ``scripts/capstone_diagnosis.py``."""
    line, probes = _searched(lambda indices: culprit in indices)
    name, _, _, _, hint = spec.COMPONENTS[culprit]
    assert line.startswith(f"**Diagnosis: {name}**") and hint in line, line
    assert len(probes) <= harness.DIAGNOSIS_PROBES - 1 and probes[-1] == [culprit]
    assert len(set(map(tuple, probes))) == len(probes)  # no training run twice (masks: the last halving is alone)
    assert f"{len(probes)} more training runs, {10 * len(probes)} CPU seconds" in line


@pytest.mark.fast
def test_a_chinese_notebook_is_told_the_diagnosis_in_chinese():
    """The same searches for a notebook of the Chinese course: the diagnosis's sentences, and the names,
    descriptions and hints of the components, in Chinese (``diagnoses_zh``); English notebooks are told as above."""
    for culprit, (name, what, _, _, hint) in enumerate(spec.COMPONENTS):
        line, _ = _searched(lambda indices: culprit in indices, "zh")
        assert line.startswith(f"**诊断：{CAPSTONE_ZH.get(name, name)}**（{CAPSTONE_ZH[what]}）：") \
            and f"提示：{CAPSTONE_ZH[hint]}。" in line, line
        assert f"- 换上课程的{CAPSTONE_ZH.get(name, name)}：99.0%" in line, line
    line, _ = _searched(lambda indices: {2, 9} <= indices, "zh")
    assert line.startswith("**诊断：不止一个组件**") and CAPSTONE_ZH[spec.COMPONENTS[9][1]] in line, line
    assert not re.search(r"Diagnosis|Hint|the course's|training runs", line), line


@pytest.mark.fast
def test_an_error_in_a_chapters_answer_is_shown_where_the_student_wrote_it():
    notebooks = read_submission(SOLUTIONS)
    run = harness.CapstoneRun.__new__(harness.CapstoneRun)
    run.extraction = gather(notebooks, _capstone(notebooks), by_id("ch12.reversal"))
    number = next(i for i, c in enumerate(run.extraction.chunks) if c["label"].endswith("`Batch`"))
    chunk = run.extraction.chunks[number]
    # The worker runs the answer without its docstring and comments: its line is not the cell's.
    line, cell_line = (next(i for i, text in enumerate(chunk[key].splitlines(), 1) if "subsequent_mask(" in text)
                       for key in ("source", "written"))
    assert line < cell_line and '"""' not in chunk["source"] and '"""' in chunk["written"]
    said = harness._RAISED_IN.sub(run._located, f"RuntimeError: size (raised in chunk {number}, line {line}, in `f`)")
    assert said.startswith(f"RuntimeError: size (raised in chapter 4 (04_masks/masks.ipynb), `Batch`, line {cell_line}: `")
    assert "subsequent_mask(" in said and said.endswith(", in `f`)"), said


@pytest.mark.fast
def test_the_diagnosis_says_when_no_single_component_is_to_blame():
    line, probes = _searched(lambda indices: {2, 9} <= indices)
    assert line.startswith("**Diagnosis: more than one component**") and "up to and including glue" in line, line
    assert probes[-1] == [9]


@pytest.mark.slow
@pytest.mark.skipif(not MULTI30K, reason="needs the Multi30k mirror (CI sets MULTI30K_DIR)")
def test_part_b_gives_the_solution_full_marks_on_a_subset_and_tells_the_course_models_weights(monkeypatch):
    """The solution's weights (its own code trained on Multi30k: scripts/capstone_multi30k.py) score 30.6 on 60
    sentences; were they the course model's, the instructor would be told (the rule itself: the fast test)."""
    monkeypatch.setenv(spec.SENTENCES_ENV, "60")
    harness.translation_data.cache_clear()
    report = grade_path(SOLUTIONS, chapter="12", only="ch12.translation")
    lines = _lines(report, "ch12.translation")
    assert report.exercise_score("ch12.translation") == 12, [t.output for t in lines.values()]
    assert "sacreBLEU" in lines["BLEU at least 28"].output and "60 sentences" in lines["BLEU at least 28"].output
    # the repository publishes these weights: submitted as they are, they are told to the instructor
    assert harness.SOLUTION_WEIGHTS in lines["ch12.translation notes"].output


@pytest.mark.fast
def test_every_set_of_weights_the_repository_publishes_is_told_and_no_other():
    """The course model's weights and the solution's Part B weights: each is recognised (renamed, with extra
    buffers), neither is taken for the other, and one changed tensor is not recognised."""
    published = harness.published_fingerprints()
    course = harness.read_weights((COURSE_MODEL_DIR / "model.safetensors").read_bytes())
    own = harness.read_weights((SOLUTIONS / "12_capstone" / "my_model" / "model.safetensors").read_bytes())
    assert set(published) == {harness.COURSE_MODEL, harness.SOLUTION_WEIGHTS}
    for name, weights, other in ((harness.COURSE_MODEL, course, own), (harness.SOLUTION_WEIGHTS, own, course)):
        told = published[name].__le__
        # an export of a student's model adds the sinusoid tables, and names the tensors its own way
        assert told(harness._fingerprint({f"renamed.{k}": v for k, v in weights.items()} | {"pe": torch.rand(1, 8, 4)}))
        assert not told(harness._fingerprint(other))
        first = min(k for k in weights if not k.endswith(".pe"))  # a weight: the sinusoid tables are not fingerprinted
        assert not told(harness._fingerprint(weights | {first: weights[first] + 1}))


@pytest.mark.slow
@pytest.mark.skipif(not MULTI30K, reason="needs the Multi30k mirror (CI sets MULTI30K_DIR)")
def test_part_b_without_weights_or_with_a_pickle_scores_zero_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setenv(spec.SENTENCES_ENV, "8")
    harness.translation_data.cache_clear()
    folder = _course_copy(tmp_path)
    report = grade_path(folder, chapter="12", only="ch12.translation")
    assert report.exercise_score("ch12.translation") == 0
    assert all("no my_model/model.safetensors next to the notebook" in t.output
               for t in report.tests if t.max_score > 0)
    (folder / "12_capstone" / "my_model").mkdir()
    torch.save({"w": torch.zeros(2)}, folder / "12_capstone" / "my_model" / "model.safetensors")
    report = grade_path(folder, chapter="12", only="ch12.translation")
    assert report.exercise_score("ch12.translation") == 0
    assert all("not a safetensors file" in t.output for t in report.tests if t.max_score > 0)


@pytest.mark.fast
def test_nbgrader_grades_the_capstone_with_every_chapter_the_student_submitted(tmp_path):
    """nbgrader autogrades each assignment in a copy of its own (autograded/<student>/<chapter>), beside
    only the chapters autograded before it: the capstone reads the student's submitted chapters instead."""
    from traitlets.config import Config

    from autograder.nbgrader_plugin import _submitted_folder, _with_course

    for chapter in ("01_embeddings", "04_masks"):
        (tmp_path / "submitted" / "alice" / chapter).mkdir(parents=True)
        nbformat.write(nbformat.v4.new_notebook(), tmp_path / "submitted" / "alice" / chapter / f"{chapter[3:]}.ipynb")
    here = tmp_path / "autograded" / "alice" / "12_capstone"
    (here / "my_model").mkdir(parents=True)
    (here / "my_model" / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "autograded" / "alice" / "03_attention").mkdir()  # autograded before: not where chapters are read
    config = Config()
    config.CourseDirectory.root = str(tmp_path)
    resources = {"metadata": {"path": str(here)}, "nbgrader": {"student": "alice", "assignment": "12_capstone"}}
    exercise = spec.EXERCISES[0]
    course = _with_course(tmp_path / "course", resources, exercise, nbformat.v4.new_notebook(),
                          _submitted_folder(config, resources))
    assert sorted(str(p.relative_to(course)) for p in course.rglob("*") if p.is_file()) == [
        "01_embeddings/embeddings.ipynb", "04_masks/masks.ipynb", f"12_capstone/{exercise.notebook}",
        "12_capstone/my_model/model.safetensors"]
    assert _submitted_folder(config, {"metadata": {"path": str(here)}}) is None  # outside autograde


@pytest.mark.fast
def test_my_chapters_load_from_a_crowded_folder_and_from_colabs_content(tmp_path, monkeypatch, capsys):
    """The first cell read the whole folder above the notebook: on Colab (/content, whose parent is /) it refused
    "more than 2000 files and folders". It now reads the chapters at their exact places: the course's layout
    (chapter folders beside 12_capstone/), else the folder the notebook runs in (Colab's uploads)."""
    from tfm_solution.my_chapters import load_my_chapters

    course = tmp_path / "course"
    for chapter in {p.chapter for p in PIECES}:
        shutil.copytree(SOLUTIONS / chapter, course / chapter, ignore=shutil.ignore_patterns("my_model"))
    (course / "12_capstone").mkdir()
    crowd = course / "downloads"
    crowd.mkdir()
    for n in range(2100):  # more than a submission may hold: none of it is read
        (crowd / f"file{n}.txt").write_text("x")
    monkeypatch.chdir(course / "12_capstone")
    assert not load_my_chapters({}, quiet=True).problems
    monkeypatch.chdir(course)  # Colab: the chapter folders uploaded into the folder the notebook runs in
    assert not load_my_chapters({}, quiet=True).problems
    (tmp_path / "elsewhere" / "deep").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "elsewhere" / "deep")
    found = load_my_chapters({}, quiet=True)
    assert any("no chapter folder was found" in p for p in found.problems), found.problems


@pytest.mark.fast
@pytest.mark.parametrize("component", ["multi-head attention", "feed-forward", "LayerNorm", "SublayerConnection",
                                       "encoder and decoder layers", "glue"])
def test_the_graph_is_found_cut_where_the_planted_bug_cuts_it(component):
    """The classes that cut the graph, found by one forward pass with hooks: for every planted bug that detaches a
    tensor or switches gradients off, a class of that bug's component alone (not the modules around it, not the
    ones it runs under `torch.no_grad()`); for the solution, none."""
    from tfm_solution.capstone import _cut_by

    task = ReversalTask()
    pairs = reversal_pairs(8, task, torch.Generator().manual_seed(0), evaluation=True)

    def cut(parts):
        batch = parts["Batch"](padded([s for s, _ in pairs], task.pad), padded([t for _, t in pairs], task.pad),
                               task.pad)
        return _cut_by(parts["make_model"](task.vocab, task.vocab, 2, 32, 64, 4, 0.0), batch)

    assert cut(run_course(SOLUTIONS)) == ()
    parts = run_course(SOLUTIONS)
    exec(spec.PLANTED[component][2], parts)  # noqa: S102 - the course's own planted bug
    found = cut(parts)
    classes = next(c[2] for c in spec.COMPONENTS if c[0] == component)
    assert found and set(found) <= set(classes), (found, classes)


def _two_test_sentences(monkeypatch):
    """Part B's test split as two sentences written here: the Chinese of its lines needs no Multi30k mirror."""
    from tfm_solution.data import PAD, TokenizerPair, pad_batch

    tokenizer = TokenizerPair.load(COURSE_MODEL_DIR)
    pairs = [("Ein Hund läuft durch den Schnee.", "A dog runs through the snow."),
             ("Zwei Kinder spielen Fußball.", "Two children play soccer.")]
    sources = pad_batch([tokenizer.encode_src(de) for de, _ in pairs], PAD)
    monkeypatch.setattr(harness, "translation_data", lambda: ([en for _, en in pairs], sources, tokenizer))


@pytest.mark.fast
def test_every_line_of_the_capstones_verdicts_reads_in_chinese(monkeypatch):
    """Each line Part A and Part B write (every variant: full marks, dropout on, frozen or unchanged parameters, a
    short or slow run, decoders that differ first or later, a translation cut by its budget, the inputs) has its
    Chinese in translations/zh/grader.yml: rendered for a Chinese notebook, no English sentence is left."""
    from types import SimpleNamespace

    from autograder import feedback_zh

    seed = 5
    pairs = harness.held_out_pairs(seed)
    top = spec.ACCURACY_BANDS[-1]
    frozen = tuple(f"encoder.layers.{i}.feed_forward.w_1.weight (PositionwiseFeedForward)" for i in range(6))
    slow, short = list(_reply(pairs)), list(_reply(pairs))
    slow[5], slow[6] = spec.TASK["cpu_budget_s"], 100
    short[6] = 100
    verdicts = [spec.JUDGES["accuracy"](top, seed, reply) for reply in
                (_reply(pairs), _reply(pairs, repeatable=False), _reply(pairs, unchanged=frozen),
                 _reply(pairs, changed=0.0), tuple(slow), tuple(short))]
    for position in (1, 3):
        differs = list(_reply(pairs))
        differs[1] = differs[1].clone()
        differs[1][0, position] = (differs[1][0, position] + 1) % 10 + 4
        verdicts.append(spec.JUDGES["agreement"](1.0, seed, tuple(differs)))
    verdicts.append(spec.JUDGES["agreement"](1.0, seed, _reply(pairs)))
    _two_test_sentences(monkeypatch)
    task = TranslationTask()
    got = torch.tensor([[task.bos, 20, 21, task.eos], [task.pad] * 4])
    verdicts += [spec.JUDGES["translates"](0.0, 0, got), spec.JUDGES["bleu"](spec.BLEU_BANDS[-1], 0, got)]
    lines = [line for _, said in verdicts for text in said for line in text.splitlines()
             if line.strip() and not line.startswith(("```", "    (reference: "))]
    lines.append(harness.CapstoneRun._inputs_summary(SimpleNamespace(
        attached=(None, torch.zeros(3, dtype=torch.float16), torch.zeros(2, 5, dtype=torch.long)))))
    assert len(lines) >= 30
    for line in lines:
        rendered = feedback_zh.render(line, "zh")
        assert not feedback_zh._prose(rendered), (line, rendered)


@pytest.mark.fast
def test_a_chinese_capstones_part_b_notes_and_weights_problems_are_chinese(tmp_path, monkeypatch):
    """Part B of a notebook that records Chinese: the verdicts, the notes (an import left out, the published weights
    told) and a weights file cut short are all written in Chinese, the numbers exact."""
    from autograder.results import to_gradescope
    from tests.test_feedback_zh import english_sentences

    _two_test_sentences(monkeypatch)
    folder = tmp_path / "course"
    shutil.copytree(SOLUTIONS, folder)
    capstone = folder / "12_capstone" / "capstone.ipynb"
    nb = nbformat.read(capstone, as_version=4)
    nb.metadata["course"] = {"language": "zh"}
    nbformat.write(nb, capstone)
    texts = []
    for cut in (False, True):
        if cut:
            weights = folder / "12_capstone" / "my_model" / "model.safetensors"
            weights.write_bytes(weights.read_bytes()[:100_000])
        results = to_gradescope(grade_path(folder, chapter="12", only="ch12.translation"))
        texts += [t.get("output", "") for t in results["tests"]] + [results.get("output", "")]
    joined = "\n".join(texts)
    assert "B 部分：你提交的权重是答案公开的权重" in joined and "权重文件被截断了" in joined, joined[:3000]
    assert [s for text in texts for s in english_sentences(text)] == []
