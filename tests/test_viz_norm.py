"""Chapter 7's widgets and measurements: batch norm against PyTorch's, the gradients against finite
differences, linked frames, the student's class or the reference, and the warm-up results."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from tfm_solution import LayerNorm, SublayerConnection
from tfm_solution.viz import norm as ch7

REPO = Path(__file__).resolve().parents[1]


def _stub(*args, **kwargs):
    raise NotImplementedError()


class _StudentLayerNorm(LayerNorm):
    """A correct LayerNorm that is not the reference object (as a student's would be)."""


class _BiasedLayerNorm(LayerNorm):
    """A wrong LayerNorm: the biased standard deviation."""

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        return self.a_2 * (x - mean) / (x.std(-1, keepdim=True, unbiased=False) + self.eps) + self.b_2


class _StudentSublayer(SublayerConnection):
    """A correct SublayerConnection that is not the reference object."""


class _PostAlwaysSublayer(SublayerConnection):
    """A wrong one: Post-LN whatever it is asked for."""

    def forward(self, x, sublayer):
        return self.norm(x + self.dropout(sublayer(x)))


@pytest.mark.fast
def test_padded_batch_keeps_the_real_tokens_and_fills_with_one_pad_vector():
    x0, keep0 = ch7.padded_batch(0)
    x3, keep3 = ch7.padded_batch(3)
    assert x0.shape == (2, 4, ch7.N_FEATURES) and x3.shape == (2, 7, ch7.N_FEATURES)
    assert keep3.sum(1).tolist() == list(ch7.LENGTHS)
    torch.testing.assert_close(x3[keep3], x0[keep0])
    pads = x3[~keep3]
    assert len(pads) == 2 * 7 - sum(ch7.LENGTHS) and (pads == pads[0]).all()


@pytest.mark.fast
def test_batch_norm_tokens_is_nn_batchnorm_over_every_cell_or_over_the_real_tokens():
    x, keep = ch7.padded_batch(2)
    bn = nn.BatchNorm1d(ch7.N_FEATURES, affine=False, dtype=torch.float64).train()
    expected = bn(x.reshape(-1, ch7.N_FEATURES)).reshape(x.shape)
    torch.testing.assert_close(ch7.batch_norm_tokens(x), expected)
    real_only = nn.BatchNorm1d(ch7.N_FEATURES, affine=False, dtype=torch.float64).train()(x[keep])
    torch.testing.assert_close(ch7.batch_norm_tokens(x, keep)[keep], real_only)


def test_norm_axis_explorer_links_both_controls_and_uses_the_students_class():
    grid = ch7.norm_axis_explorer(_StudentLayerNorm)
    assert "your own" in grid.children[0].value
    frames = [bytes(f.value) for row in grid.stack.children for f in row.children]
    assert len(frames) == 2 * (ch7.MAX_EXTRA_PAD + 1) and len(set(frames)) == len(frames)
    assert all(frame.startswith(b"\x89PNG") for frame in frames)
    assert len(grid.links) == 3 and {link.source[0] for link in grid.links} == {grid.first, grid.second}
    assert "stub" in ch7.norm_axis_explorer(_stub, max_extra=0).children[0].value
    assert "differ" in ch7.norm_axis_explorer(_BiasedLayerNorm, max_extra=0).children[0].value


def _finite_difference(depth: int, residual: bool, normalize: bool, eps: float = 1e-6) -> float:
    """d loss / d w_1[0, 0] of the first sublayer, by a central difference, rebuilding the same stack."""
    from tfm_solution import PositionwiseFeedForward

    def loss(shift: float) -> float:
        torch.manual_seed(0)
        ffns = [PositionwiseFeedForward(32, 128, 0.0).double() for _ in range(depth)]
        for ffn in ffns:
            for p in ffn.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)
        with torch.no_grad():
            ffns[0].w_1.weight[0, 0] += shift
        norm = LayerNorm(32).double() if normalize else nn.Identity()
        g = torch.Generator().manual_seed(1)
        x = torch.randn(8, 10, 32, generator=g, dtype=torch.float64)
        read_out = torch.randn(32, generator=g, dtype=torch.float64)
        with torch.no_grad():
            for ffn in ffns:
                x = x + ffn(norm(x)) if residual else ffn(norm(x))
            return (x @ read_out).mean().item()

    return (loss(eps) - loss(-eps)) / (2 * eps)


@pytest.mark.fast
@pytest.mark.parametrize("residual,normalize", [(False, False), (True, False), (True, True)])
def test_first_layer_gradient_agrees_with_finite_differences(residual, normalize, monkeypatch):
    captured = {}
    # The function returns the norm of the whole gradient; recompute one entry through autograd the same way.
    from tfm_solution import PositionwiseFeedForward

    real_init = PositionwiseFeedForward.__init__

    def record(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        captured.setdefault("first", self)

    monkeypatch.setattr(PositionwiseFeedForward, "__init__", record)
    norm = ch7.first_layer_gradient(3, residual, normalize)
    entry = captured["first"].w_1.weight.grad[0, 0].item()
    assert norm == pytest.approx(captured["first"].w_1.weight.grad.norm().item())
    assert entry == pytest.approx(_finite_difference(3, residual, normalize), rel=1e-5, abs=1e-9)


@pytest.mark.fast
def test_residuals_keep_the_gradient_and_plain_stacks_lose_it():
    assert ch7.first_layer_gradient(1, True) == pytest.approx(ch7.first_layer_gradient(1, False))
    plain = [ch7.first_layer_gradient(n, False) for n in (1, 16)]
    pre = [ch7.first_layer_gradient(n, True, normalize=True) for n in (1, 16)]
    assert plain[1] < 1e-2 * plain[0] and 0.3 < pre[1] / pre[0] < 5


@pytest.mark.fast
def test_layer_gradient_norms_with_the_reference_class_equal_the_default_path():
    default = ch7.layer_gradient_norms(3, "pre", seeds=(0,))
    explicit = ch7.layer_gradient_norms(3, "pre", SublayerConnection, seeds=(0,))
    torch.testing.assert_close(default, explicit)
    post = ch7.layer_gradient_norms(3, "post", seeds=(0,))
    assert default.shape == post.shape == (3,) and (default > 0).all() and not torch.allclose(default, post)


@pytest.mark.fast
def test_the_post_ln_stack_has_no_final_norm_and_the_pre_ln_stack_has_one():
    assert isinstance(ch7._encoder_stack(2, "pre", None, 0)["final"], LayerNorm)
    assert isinstance(ch7._encoder_stack(2, "post", None, 0)["final"], nn.Identity)


def test_gradient_depth_explorer_frames_numbers_and_fallbacks():
    player = ch7.gradient_depth_explorer(_StudentSublayer, depths=(2, 3))
    assert "your own" in player.children[0].value
    assert len(player.stack.children) == 2 and player.link is not None
    assert set(player.norms) == {2, 3} and player.norms[3]["pre"].shape == (3,)
    torch.testing.assert_close(player.norms[2]["post"], ch7.layer_gradient_norms(2, "post", _StudentSublayer))
    assert "stub" in ch7.gradient_depth_explorer(_stub, depths=(2,)).children[0].value
    assert "differ" in ch7.gradient_depth_explorer(_PostAlwaysSublayer, depths=(2,)).children[0].value


def _script():
    spec = importlib.util.spec_from_file_location("warmup_experiment", REPO / "scripts" / "warmup_experiment.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.fast
def test_the_committed_results_come_from_the_committed_settings():
    script = _script()
    results = ch7.load_warmup_results()
    settings = results["settings"]
    assert {k: v for k, v in settings.items() if k != "uniform_loss"} == json.loads(json.dumps(script.SETTINGS))
    runs = {(r["lr"], r["norm_position"], r["warmup"]) for r in results["runs"]}
    assert runs == {(lr, p, w) for lr in settings["learning_rates"] for p in ("post", "pre")
                    for w in (0, settings["warmup_steps"])}
    assert all(len(r["loss"]) == settings["steps"] // settings["log_every"] for r in results["runs"])


@pytest.mark.fast
def test_the_results_show_what_the_chapter_says():
    """At the highest rate Post-LN without warm-up stays near chance, with warm-up it learns; Pre-LN learns
    without warm-up."""
    results = ch7.load_warmup_results()
    top = max(results["settings"]["learning_rates"])
    final = {(r["norm_position"], r["warmup"]): r["loss"][-1] for r in results["runs"] if r["lr"] == top}
    chance = results["settings"]["uniform_loss"]
    warm = results["settings"]["warmup_steps"]
    assert final["post", 0] > 0.9 * chance
    assert final["post", warm] < 0.9 * chance
    assert final["pre", 0] < 0.5 * chance


@pytest.mark.fast
def test_warmup_curves_has_one_frame_per_view():
    results = ch7.load_warmup_results()
    player = ch7.warmup_curves(results)
    frames = [bytes(f.value) for f in player.stack.children]
    assert len(frames) == len(ch7.WARMUP_VIEWS) == len(set(frames)) and player.link is not None
    assert "warmup_experiment.py" in player.children[0].value


@pytest.mark.fast
def test_the_script_trains_and_writes_its_json(tmp_path, monkeypatch):
    script = _script()
    tiny = {**script.SETTINGS, "N": 1, "d_model": 16, "d_ff": 32, "steps": 4, "log_every": 2, "batch": 4,
            "learning_rates": [1e-3], "warmup_steps": 2}
    losses = script.train_run("post", 1e-3, 2, tiny)
    assert len(losses) == 2 and all(loss > 0 for loss in losses)
    assert script.train_run("post", 1e-3, 2, tiny) == losses  # seeded: the same run twice
    monkeypatch.setattr(script, "SETTINGS", tiny)
    monkeypatch.setattr("sys.argv", ["warmup_experiment.py", "--out", str(tmp_path / "w.json"), "--threads", "1"])
    script.main()
    written = json.loads((tmp_path / "w.json").read_text())
    assert len(written["runs"]) == 4 and written["settings"]["steps"] == 4
