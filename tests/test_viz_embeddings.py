"""Chapter 1's widgets: linked frames for the static site, the student's code used when it works,
the reference (with a message) when it is a stub, and the projection's fixed axes."""

import ipywidgets as widgets
import pytest
import torch
from torch import nn

from tfm_solution import Embeddings, cosine_similarity_matrix
from tfm_solution.viz import similarity_explorer, training_projection
from tfm_solution.viz.embeddings import projection_2d, resolve_embeddings
from tfm_solution.word_vectors import train_word_vectors

@pytest.fixture(scope="module")
def run():
    return train_word_vectors(steps=(0, 20, 60))


def _stub(*args, **kwargs):
    raise NotImplementedError


@pytest.mark.fast
def test_similarity_explorer_has_one_linked_frame_per_word(run):
    player = similarity_explorer(lambda v, eps=1e-8: cosine_similarity_matrix(v, eps), run, start="香蕉")
    assert len(player.stack.children) == len(run.vocab) == 18
    assert player.link is not None and player.stack.selected_index == run.vocab.index("香蕉")
    frame = player.stack.children[run.vocab.index("苹果")].value
    # The nearest neighbours of apple after training are the two other fruit.
    listed = [w for w in run.vocab if w in frame and w != "苹果"]
    first_two = sorted(listed, key=frame.index)[:2]
    assert set(first_two) == {"香蕉", "橘子"}
    assert "Drawn with your own" in player.children[0].value


@pytest.mark.fast
def test_similarity_explorer_falls_back_on_a_stub_and_flags_a_wrong_answer(run):
    stub = similarity_explorer(_stub, run)
    assert "still a stub" in stub.children[0].value
    dot_only = similarity_explorer(lambda v, eps=1e-8: v @ v.transpose(-2, -1), run)
    assert "differ from the reference" in dot_only.children[0].value


@pytest.mark.slow
def test_training_projection_frames_and_student_class():
    class Mine(Embeddings):
        pass

    player = training_projection(cosine_similarity_matrix, Mine, steps=(0, 10, 30, 60, 100))
    assert isinstance(player.control, widgets.SelectionSlider)
    n = len(player.control.options)
    assert n == len(player.stack.children) == 5
    assert all(isinstance(c, widgets.Image) and c.value[:4] == b"\x89PNG" for c in player.stack.children)
    assert sum(len(c.value) for c in player.stack.children) < 600_000
    assert "your own `Embeddings`" in player.children[0].value
    assert "reference `cosine_similarity_matrix`" in player.children[1].value


@pytest.mark.fast
def test_resolve_embeddings_reports_a_missing_scale():
    class NoScale(nn.Module):
        def __init__(self, d_model, vocab):
            super().__init__()
            self.lut = nn.Embedding(vocab, d_model)

        def forward(self, x):
            return self.lut(x)

    assert resolve_embeddings(NoScale).status == "differs"
    assert resolve_embeddings(Embeddings).status == "reference"


@pytest.mark.fast
def test_projection_uses_the_last_snapshots_main_axes(run):
    points = projection_2d(run.snapshots)
    assert [tuple(p.shape) for p in points] == [(18, 2)] * 3
    final = run.snapshots[-1].double()
    centred = final - final.mean(0)
    # Two orthonormal axes that keep the most variance: the top two singular values.
    kept = points[-1].pow(2).sum()
    top2 = torch.linalg.svdvals(centred)[:2].pow(2).sum()
    torch.testing.assert_close(kept, top2)


@pytest.mark.fast
def test_live_player_draws_on_demand(run):
    player = similarity_explorer(None, run, live=True)
    assert player.link is None
    player.control.index = 3
    assert player.stack.selected_index == 3 and "Nearest neighbours" in player.stack.children[3].value


@pytest.mark.slow
def test_scale_explorer_measures_lengths_against_float64_oracles():
    from tfm_solution.viz import embedding_scale_explorer
    from tfm_solution.viz.embeddings import INITS, scale_lengths

    lengths = scale_lengths(Embeddings, d_models=(64, 256), vocab=500)
    for k, d in enumerate((64, 256)):
        small_rows, small_out = lengths[INITS[0]][k]
        unit_rows, unit_out = lengths[INITS[2]][k]
        # Entries of std 1/sqrt(d): rows of length about 1; std 1: about sqrt(d). The module multiplies by sqrt(d).
        assert small_rows == pytest.approx(1.0, rel=0.1) and unit_rows == pytest.approx(d**0.5, rel=0.1)
        assert small_out == pytest.approx(small_rows * d**0.5, rel=1e-5)
        assert unit_out == pytest.approx(unit_rows * d**0.5, rel=1e-5)
    player = embedding_scale_explorer(None, d_models=(64, 512))
    assert player.control.value == 512 and len(player.stack.children) == 2
    stub = embedding_scale_explorer(_stub_class(), d_models=(64,))
    assert "still a stub" in stub.children[0].value


def _stub_class():
    class Stub(nn.Module):
        def __init__(self, d_model, vocab):
            super().__init__()
            raise NotImplementedError

    return Stub
