"""Chapter 1: the reference ``Embeddings`` and ``cosine_similarity_matrix`` against independent
oracles, the word-vector demo, the notebook's visible tests against the mistakes the chapter
names. The grader's verdicts on every chapter's notebooks are in ``test_grader_submissions.py``."""

import math
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

from autograder.mistakes import mistake_function
from autograder.registry import REGISTRY, by_id
from tfm_solution import Embeddings, cosine_similarity_matrix
from tfm_solution.word_vectors import (
    FRUITS,
    VEHICLES,
    group_similarity,
    skipgram_pairs,
    toy_corpus,
    train_word_vectors,
)


REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "01_embeddings" / "embeddings.ipynb"
CHAPTER = "01_embeddings"


# The reference against oracles.


@pytest.mark.fast
def test_embeddings_is_a_scaled_one_hot_product():
    emb = Embeddings(24, 50)
    ids = torch.randint(0, 50, (3, 7))
    oracle = nn.functional.one_hot(ids, 50).double() @ emb.lut.weight.double() * math.sqrt(24)
    torch.testing.assert_close(emb(ids).double(), oracle)
    assert [n for n, _ in emb.named_parameters()] == ["lut.weight"]


@pytest.mark.fast
@pytest.mark.parametrize("shape", [(5, 3), (2, 6, 8), (2, 3, 4, 16)])
def test_cosine_matrix_matches_pairwise_torch(shape):
    x = torch.randn(shape, dtype=torch.float64)
    got = cosine_similarity_matrix(x)
    oracle = nn.functional.cosine_similarity(x.unsqueeze(-2), x.unsqueeze(-3), dim=-1)
    torch.testing.assert_close(got, oracle)
    assert got.shape == shape[:-1] + (shape[-2],)


@pytest.mark.fast
def test_cosine_matrix_zero_vector_and_scale_invariance():
    x = torch.randn(6, 5)
    x[2] = 0
    sim = cosine_similarity_matrix(x)
    assert not sim.isnan().any()
    assert (sim[2] == 0).all() and (sim[:, 2] == 0).all()
    torch.testing.assert_close(cosine_similarity_matrix(x * 7.5), sim)
    assert sim.dtype == torch.float32


@pytest.mark.fast
def test_cosine_matrix_bad_input_gets_a_clear_error():
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        cosine_similarity_matrix(torch.randn(4))
    with pytest.raises(TypeError, match="floating-point"):
        cosine_similarity_matrix(torch.ones(3, 2, dtype=torch.int64))


@pytest.mark.fast
def test_skipgram_pairs_by_hand():
    pairs = skipgram_pairs([["a", "b", "c"]], ["a", "b", "c"], window=1)
    assert sorted(map(tuple, pairs.tolist())) == [(0, 1), (1, 0), (1, 2), (2, 1)]
    assert len(toy_corpus()) == 18


@pytest.mark.fast
def test_training_pulls_each_group_together():
    run = train_word_vectors(steps=(0, 120))
    before = group_similarity(run, cosine_similarity_matrix(run.vectors(0)))
    after = group_similarity(run, cosine_similarity_matrix(run.vectors()))
    assert after["fruit-fruit"] > 0.8 and after["vehicle-vehicle"] > 0.8
    assert after["fruit-fruit"] - before["fruit-fruit"] > 0.5
    assert after["fruit-vehicle"] < 0.5
    assert run.losses[-1] < run.losses[0] - 1
    assert len(run.snapshots) == 2 and run.vectors(0).shape == (len(run.vocab), 8)
    # The table of a run is the embedding module's output, sqrt(d_model) included: rows of
    # length about sqrt(8) * 1 at the start, given entries of std 1/sqrt(8).
    assert 2.0 < float(run.vectors(0).norm(dim=-1).mean()) < 3.7
    sim = cosine_similarity_matrix(run.vectors())
    fruit = [run.vocab.index(w) for w in FRUITS]
    vehicle = [run.vocab.index(w) for w in VEHICLES]
    assert sim[fruit][:, fruit].min() > sim[fruit][:, vehicle].max()


@pytest.mark.fast
def test_training_rejects_bad_steps():
    with pytest.raises(ValueError, match="increasing"):
        train_word_vectors(steps=(10, 5))


# The notebook's visible tests catch the mistakes the chapter names.


def _visible_tests(prefix: str) -> list[str]:
    cells = nbformat.read(SOLUTION, as_version=4).cells
    found = [c.source for c in cells if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith(prefix + "-visible")]
    assert found, f"no visible tests for {prefix}"
    return found


def _run_visible(prefix: str, name: str, obj) -> None:
    for source in _visible_tests(prefix):
        exec(source, {"math": math, "torch": torch, "nn": nn, name: obj, "print": lambda *a, **k: None})  # noqa: S102


@pytest.mark.fast
@pytest.mark.parametrize("exercise_id", [e.id for e in REGISTRY if e.chapter == CHAPTER])
def test_visible_tests_pass_on_the_reference_and_fail_on_each_declared_mistake(exercise_id):
    exercise = by_id(exercise_id)
    prefix = exercise.solution_grade_id
    reference = {"Embeddings": Embeddings, "cosine_similarity_matrix": cosine_similarity_matrix}[exercise.name]
    _run_visible(prefix, exercise.name, reference)
    assert exercise.mistakes
    for mistake in exercise.mistakes:
        with pytest.raises(AssertionError):
            _run_visible(prefix, exercise.name, mistake_function(exercise_id, mistake, exercise.name))
