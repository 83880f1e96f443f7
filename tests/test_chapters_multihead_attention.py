"""Chapter 5: the reference's head splitting and multi-head attention against independent oracles
(per-head slices and loops in float64, ``nn.MultiheadAttention``, FLOP counts), and the notebook's
visible tests against the mistakes the chapter names (the grader's verdicts are in ``test_grader_submissions.py``)."""

import math
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from autograder.exercises.shared import resolve
from autograder.registry import by_id
from tfm_solution import MultiHeadedAttention, attention
from tfm_solution.multihead import merge_heads, split_heads

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("b,n,h,d_k", [(1, 1, 1, 4), (2, 5, 3, 4), (3, 7, 8, 2)])
def test_split_heads_gives_head_i_the_ith_block_of_features(b, n, h, d_k):
    x = torch.randn(b, n, h * d_k, dtype=torch.float64)
    split = split_heads(x, h)
    assert split.shape == (b, h, n, d_k)
    for i in range(h):
        torch.testing.assert_close(split[:, i], x[..., i * d_k:(i + 1) * d_k], rtol=0, atol=0)
    assert split.data_ptr() == x.data_ptr(), "split_heads is a view: no copy"


@pytest.mark.parametrize("b,n,h,d_k", [(1, 1, 1, 4), (2, 5, 3, 4), (3, 7, 8, 2)])
def test_merge_heads_concatenates_the_heads_in_order(b, n, h, d_k):
    heads = torch.randn(b, h, n, d_k, dtype=torch.float64)
    merged = merge_heads(heads)
    torch.testing.assert_close(merged, torch.cat([heads[:, i] for i in range(h)], dim=-1), rtol=0, atol=0)
    assert merged.is_contiguous()
    torch.testing.assert_close(split_heads(merged, h), heads, rtol=0, atol=0)


def test_split_heads_rejects_an_indivisible_width():
    with pytest.raises(ValueError, match="divisible"):
        split_heads(torch.zeros(1, 2, 10), 4)


def _per_head_loop(mha: MultiHeadedAttention, q, k, v, mask=None):
    """Equation (5.1)-(5.2) written out: each head's own W_i^Q, W_i^K, W_i^V slices, then W^O."""
    d_k = mha.d_k
    heads = []
    for i in range(mha.h):
        rows = slice(i * d_k, (i + 1) * d_k)
        proj = [x @ lin.weight[rows].T + lin.bias[rows] for lin, x in zip(mha.linears[:3], (q, k, v))]
        scores = proj[0] @ proj[1].transpose(-2, -1) / d_k**0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        heads.append(scores.softmax(-1) @ proj[2])
    return mha.linears[3](torch.cat(heads, dim=-1))


def test_module_equals_the_per_head_loop_of_the_paper():
    torch.manual_seed(1)
    mha = MultiHeadedAttention(4, 24, dropout=0.0).double().eval()
    q, kv = torch.randn(3, 5, 24, dtype=torch.float64), torch.randn(3, 7, 24, dtype=torch.float64)
    keep = torch.arange(7)[None, :] < torch.tensor([7, 4, 1])[:, None]
    got = mha(q, kv, kv, mask=keep[:, None, :])
    torch.testing.assert_close(got, _per_head_loop(mha, q, kv, kv, keep[:, None, :]), rtol=1e-12, atol=1e-12)
    assert mha.attn.shape == (3, 4, 5, 7) and (mha.attn[1, ..., 4:] == 0).all()


def test_attention_weights_match_nn_multiheadattention_per_head():
    torch.manual_seed(2)
    ours = MultiHeadedAttention(2, 8, dropout=0.0).double().eval()
    ref = nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([lin.weight for lin in ours.linears[:3]]))
        ref.in_proj_bias.copy_(torch.cat([lin.bias for lin in ours.linears[:3]]))
        ref.out_proj.load_state_dict(ours.linears[3].state_dict())
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    keep = torch.tensor([[True] * 4, [True, True, False, False]])
    out = ours(x, x, x, mask=keep[:, None, :])
    expected, weights = ref(x, x, x, key_padding_mask=~keep, average_attn_weights=False)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(ours.attn, weights)


def test_parameter_count_is_four_d_squared_plus_four_d_for_every_h():
    for d_model in (8, 64, 512):
        counts = {h: sum(p.numel() for p in MultiHeadedAttention(h, d_model).parameters()) for h in (1, 2, 8)}
        assert set(counts.values()) == {4 * d_model**2 + 4 * d_model}


def test_flops_do_not_depend_on_the_number_of_heads():
    d_model, n = 64, 10
    x = torch.randn(2, n, d_model)
    flops = {}
    for h in (1, 2, 4, 8):
        mha = MultiHeadedAttention(h, d_model, dropout=0.0).eval()
        with FlopCounterMode(display=False) as counter:
            mha(x, x, x)
        flops[h] = counter.get_total_flops()
    # 4 projections (2 n d^2 each), scores and mixing (2 n^2 d each), per sentence, counted by hand.
    assert set(flops.values()) == {2 * (4 * 2 * n * d_model**2 + 2 * 2 * n * n * d_model)}


def test_train_mode_stores_the_weights_after_dropout():
    torch.manual_seed(3)
    mha = MultiHeadedAttention(2, 8, dropout=0.5).train()
    x = torch.randn(1, 6, 8)
    mha(x, x, x)
    sums = mha.attn.sum(-1)
    assert (mha.attn == 0).any() and not torch.allclose(sums, torch.ones_like(sums))
    mha.eval()(x, x, x)
    torch.testing.assert_close(mha.attn.sum(-1), torch.ones(1, 2, 6))
    _, p = attention(*(split_heads(lin(x), 2) for lin in mha.linears[:3]))
    torch.testing.assert_close(mha.attn, p)


# ----------------------------------------------------------------------------- visible tests vs mutants

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "05_multihead_attention" / "multihead_attention.ipynb"


def _visible_tests(prefix: str) -> list[str]:
    cells = nbformat.read(SOLUTION, as_version=4).cells
    return [c.source for c in cells if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith(prefix + "-visible")]


def _run_visible(prefix: str, names: dict) -> None:
    sources = _visible_tests(prefix)
    assert sources, f"no visible tests for {prefix}"
    for source in sources:
        exec(source, {"math": math, "torch": torch, "nn": nn, "split_heads": split_heads,  # noqa: S102
                      "merge_heads": merge_heads, **names, "print": lambda *a, **k: None})


def _mistake(exercise_id: str, name: str):
    from autograder.mistakes import mistake_function

    return mistake_function(exercise_id, name, by_id(exercise_id).name)


class _NoAttn(MultiHeadedAttention):
    """Forgets to keep the weights."""

    def forward(self, query, key, value, mask=None):
        out = super().forward(query, key, value, mask)
        self.attn = None
        return out


class _NoDropoutOnWeights(MultiHeadedAttention):
    """Never passes its dropout to attention."""

    def forward(self, query, key, value, mask=None):
        if mask is not None:
            mask = mask.unsqueeze(1)
        q, k, v = (split_heads(lin(x), self.h) for lin, x in zip(self.linears, (query, key, value)))
        x, self.attn = attention(q, k, v, mask=mask)
        return self.linears[3](merge_heads(x))


@pytest.mark.parametrize("exercise_id,prefix,name,reference", [
    ("ch05.split_heads", "ch05-split-heads", "split_heads", split_heads),
    ("ch05.merge_heads", "ch05-merge-heads", "merge_heads", merge_heads),
    ("ch05.multiheaded_attention", "ch05-multiheaded-attention", "MultiHeadedAttention", MultiHeadedAttention),
])
def test_visible_tests_pass_on_the_reference_and_fail_on_every_declared_mistake(exercise_id, prefix, name, reference):
    _run_visible(prefix, {name: reference})
    for mistake in by_id(exercise_id).mistakes:
        with pytest.raises((AssertionError, RuntimeError)):
            _run_visible(prefix, {name: _mistake(exercise_id, mistake)})


@pytest.mark.parametrize("mutant", [_NoAttn, _NoDropoutOnWeights])
def test_visible_module_tests_catch_what_the_grader_cannot_see(mutant):
    """``self.attn`` is not graded by the hidden cases (they compare outputs); the visible tests check it."""
    with pytest.raises((AssertionError, TypeError, AttributeError)):
        _run_visible("ch05-multiheaded-attention", {"MultiHeadedAttention": mutant})


def test_every_declared_mistake_differs_from_the_reference_on_some_hidden_case():
    """A declared mistake that every case lets through could never be named. Eval-mode cases see all but
    two, which the grader's training-mode cases see: dropout placement, and one projection for q, k and v
    (the reference's four layers start as copies of one, ``clones``, so with fresh weights they coincide;
    their gradients do not)."""
    from autograder.grade import _expected, _reference_state

    for exercise_id in ("ch05.split_heads", "ch05.merge_heads", "ch05.multiheaded_attention"):
        exercise = by_id(exercise_id)
        reference = resolve(exercise.reference)
        cases = exercise.cases(11)
        for mistake in exercise.mistakes:
            if mistake in ("dropout_on_output", "one_projection_for_all"):
                continue
            wrong = _mistake(exercise_id, mistake)
            differs = []
            for case in cases:
                state = _reference_state(reference, case, 11)
                try:
                    got = _expected(wrong, case, state)
                except Exception:  # noqa: BLE001 - an error is a difference
                    differs.append(True)
                    continue
                want = _expected(reference, case, state)
                differs.append(not (got.shape == want.shape and torch.allclose(got, want, rtol=1e-4, atol=1e-5)))
            assert any(differs[1:]), (exercise_id, mistake, "no hidden case tells it apart")
