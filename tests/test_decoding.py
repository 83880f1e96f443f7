"""Decoding strategies against independent oracles: exhaustive search, hand-built top-k/top-p
sets, a float64 shaped distribution with a chi-square test, and greedy search itself.
Special ids are the notes' (``<s>`` 0, ``</s>`` 1, ``<blank>`` 2), from ``tfm_solution.data``."""

import itertools
import math

import pytest
import torch

from tfm_solution import make_model
from tfm_solution.data import BOS, EOS, PAD
from tfm_solution.decoding import (beam_search, beam_step, greedy_decode, length_penalty, sample, sample_token,
                                   shape_logits, top_k_top_p_filter)

pytestmark = pytest.mark.fast


def tiny_model(vocab=9, seed=0, flat=False):
    """A random model; ``flat`` shrinks the output layer so that runners-up are close to the best."""
    torch.manual_seed(seed)
    model = make_model(vocab, vocab, N=1, d_model=16, d_ff=32, h=2).eval()
    if flat:
        with torch.no_grad():
            model.generator.proj.weight.mul_(0.2)
    return model


def source(batch=2, length=5, vocab=9):
    src = torch.randint(3, vocab, (batch, length), generator=torch.Generator().manual_seed(4))
    src[-1, 3:] = PAD
    return src, (src != PAD).unsqueeze(-2)


def test_greedy_stops_each_sequence_at_its_end_symbol():
    model = tiny_model()
    src, src_mask = source(batch=4)
    src_mask = src_mask.expand(4, 1, 5)
    free = greedy_decode(model, src, src_mask, 12, BOS, None)  # no end symbol: full length
    assert free.shape == (4, 12)
    # Choose as "end symbol" a token the free run emits, so some rows end early.
    eos = int(free[0, 3])
    out = greedy_decode(model, src, src_mask, 12, BOS, eos, PAD)
    for row, free_row in zip(out.tolist(), free.tolist()):
        gen = free_row[1:]
        if eos in gen:
            cut = gen.index(eos) + 1
            assert row[1: cut + 1] == gen[:cut]
            assert all(t == PAD for t in row[cut + 1:])
        else:
            assert row == free_row
    assert out.size(1) <= 12


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_beam_size_one_is_greedy_for_every_length_penalty(alpha):
    # Every token in turn plays the end symbol, so that it is often the runner-up of a step; with
    # alpha > 0 a finished beam must not lose its one place to a longer runner-up.
    src, src_mask = source(batch=4)
    src_mask = src_mask.expand(4, 1, 5)
    for seed in range(3):
        model = tiny_model(flat=True, seed=seed)
        for eos in range(9):
            if eos == BOS:
                continue
            greedy = greedy_decode(model, src, src_mask, 20, BOS, eos, PAD)
            beams = beam_search(model, src, src_mask, 20, BOS, eos, beam_size=1, alpha=alpha)
            for row, hyps in zip(greedy.tolist(), beams):
                tokens = hyps[0].tokens
                assert row[: len(tokens)] == tokens and all(t == PAD for t in row[len(tokens):]), (seed, eos)


def sequence_log_prob(model, src, src_mask, tokens):
    """Oracle: sum of log-probabilities from one full teacher-forced forward pass."""
    ys = torch.tensor([tokens[:-1]])
    mask = torch.ones(1, ys.size(1), ys.size(1)).tril().bool()
    lp = model.generator(model(src, ys, src_mask, mask))[0]
    return float(lp[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])].sum())


@pytest.mark.parametrize("alpha,seed", [(0.0, 7), (0.6, 7), (2.0, 7), (1.0, 3), (3.0, 5)])
def test_beam_search_equals_exhaustive_search(alpha, seed):
    vocab, max_len = 5, 5  # at most 4 new tokens over a vocabulary of 5
    model = tiny_model(vocab, seed=seed)
    src, src_mask = source(batch=1, vocab=vocab)
    candidates = []
    for n in range(1, max_len):
        for gen in itertools.product(range(vocab), repeat=n):
            if EOS in gen[:-1] or (n < max_len - 1 and gen[-1] != EOS):
                continue  # EOS only at the end; shorter than the limit only if ended
            tokens = [BOS, *gen]
            with torch.no_grad():
                score = sequence_log_prob(model, src, src_mask, tokens)
            candidates.append((score / ((5 + n) / 6) ** alpha, tokens))
    candidates.sort(reverse=True)
    assert len(candidates) == 1 + 4 + 16 + 4 ** 3 * 5  # 341 possible outputs, all within a beam of 512
    hyps = beam_search(model, src, src_mask, max_len, BOS, EOS, beam_size=512, alpha=alpha, n_best=3)[0]
    assert [h.tokens for h in hyps] == [c[1] for c in candidates[:3]]
    torch.testing.assert_close(torch.tensor([h.score for h in hyps]),
                               torch.tensor([c[0] for c in candidates[:3]]), atol=1e-5, rtol=0)


def test_beam_step_keeps_the_best_candidates_of_all_beams():
    g = torch.Generator().manual_seed(5)
    batch, k, vocab, keep = 3, 4, 6, 5
    scores = torch.randn(batch, k, generator=g, dtype=torch.float64) * 3
    scores[1, 2:] = -math.inf  # empty slots never produce a finite candidate
    log_probs = torch.randn(batch, k, vocab, generator=g, dtype=torch.float64).log_softmax(-1)
    new_scores, parents, tokens = beam_step(scores, log_probs, keep)
    assert new_scores.shape == parents.shape == tokens.shape == (batch, keep)
    for b in range(batch):
        # Oracle: every (beam, token) pair in plain Python, sorted by summed log-probability.
        every = sorted(((float(scores[b, j] + log_probs[b, j, t]), j, t) for j in range(k) for t in range(vocab)),
                       reverse=True)[:keep]
        assert [(j, t) for _, j, t in every] == list(zip(parents[b].tolist(), tokens[b].tolist()))
        assert new_scores[b].tolist() == pytest.approx([s for s, _, _ in every], abs=1e-12)


def test_beam_trace_records_every_step():
    model = tiny_model()
    src, src_mask = source(batch=2)
    trace = []
    hyps = beam_search(model, src, src_mask, 9, BOS, EOS, beam_size=3, n_best=3, trace=trace)
    assert 1 <= len(trace) <= 8
    for step in trace:
        again = beam_step(step.scores, step.log_probs, 6)  # the best 2k candidates
        assert all(torch.equal(a, b) for a, b in zip(again, (step.cand_scores, step.cand_parents, step.cand_tokens)))
        assert (step.kept.sum(-1) <= 3).all() and not (step.kept & step.ended).any()
        assert (step.cand_tokens[step.ended] == EOS).all() and (step.cand_tokens[step.kept] != EOS).all()
        assert not step.ended[:, 3:].any()  # an end symbol finishes a hypothesis only among the first k
    # every returned hypothesis was a finished candidate, or an open one cut at max_len
    seen = {round(float(x), 9) for step in trace for x in step.cand_scores[step.ended]}
    seen |= {round(float(x), 9) for x in trace[-1].cand_scores[trace[-1].kept]}
    assert all(round(h.log_prob, 9) in seen for sentence in hyps for h in sentence)


def test_beam_search_batched_equals_one_sentence_at_a_time():
    model = tiny_model()
    src, src_mask = source(batch=3)
    together = beam_search(model, src, src_mask, 9, BOS, EOS, beam_size=3, n_best=2)
    for b in range(3):
        alone = beam_search(model, src[b:b + 1], src_mask[b:b + 1], 9, BOS, EOS, beam_size=3, n_best=2)[0]
        assert [h.tokens for h in together[b]] == [h.tokens for h in alone]


def test_length_penalty_formula():
    assert length_penalty(7, 0.0) == 1.0
    assert math.isclose(length_penalty(7, 0.6), 2.0 ** 0.6)


def test_top_k_never_emits_outside_the_k_most_likely():
    logits = torch.randn(200, 30, generator=torch.Generator().manual_seed(0))
    draws = sample_token(logits, top_k=4, generator=torch.Generator().manual_seed(1))
    top4 = logits.topk(4, dim=-1).indices
    assert (top4 == draws[:, None]).any(dim=1).all()


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    g = torch.Generator().manual_seed(2)
    for _ in range(50):
        logits = torch.randn(12, generator=g, dtype=torch.float64) * 2
        p = float(torch.rand(1, generator=g)) * 0.98 + 0.01
        probs = logits.softmax(-1)
        order = probs.argsort(descending=True)
        cum = probs[order].cumsum(0)
        m = int((cum < p).sum()) + 1  # smallest m with mass of the top m >= p
        expected = set(order[:m].tolist())
        kept = set(torch.isfinite(shape_logits(logits, top_p=p)).nonzero().flatten().tolist())
        assert kept == expected


def test_top_p_one_keeps_every_token():
    # In float32 the dominant token's probability rounds to 1.0, so a running mass "reaches" 1.0
    # before the tail: p = 1 must still mean no filtering.
    logits = torch.tensor([[30.0, 0.0, -1.0, -2.0]])
    assert torch.equal(top_k_top_p_filter(logits, top_p=1.0), logits)
    assert torch.equal(shape_logits(logits, top_p=1.0), logits)
    # Just below 1 the tail (mass about 1.4e-13) is cut, as the definition says.
    assert torch.isfinite(top_k_top_p_filter(logits, top_p=1 - 1e-6)).tolist() == [[True, False, False, False]]


def test_top_p_counts_mass_in_float64_for_float32_logits():
    # The mass before the last token is 1 - 2.1e-9: in float32 that sum is 1.0, in float64 it is below p.
    logits = torch.tensor([20.0, 0.0, 0.0, 0.0])
    p = 1 - 1e-9
    kept = torch.isfinite(top_k_top_p_filter(logits, top_p=p)).tolist()
    assert kept == [True, True, True, True]


def test_filter_applies_top_k_before_top_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    # top-2 leaves (0.5, 0.3) -> renormalised (0.625, 0.375); p = 0.6 then keeps the first only.
    assert torch.isfinite(top_k_top_p_filter(logits, top_k=2, top_p=0.6)).tolist() == [True, False, False, False]
    # without top-k, p = 0.6 keeps 0.5 and 0.3 (0.5 alone is short of 0.6)
    assert torch.isfinite(top_k_top_p_filter(logits, top_p=0.6)).tolist() == [True, True, False, False]
    kept = top_k_top_p_filter(logits, top_k=3)
    assert torch.equal(kept[:3], logits[:3]) and kept[3] == -math.inf


def test_tiny_temperature_is_greedy():
    model = tiny_model()
    src, src_mask = source()
    greedy = greedy_decode(model, src, src_mask, 10, BOS, EOS, PAD)
    cold = sample(model, src, src_mask, 10, BOS, EOS, PAD, temperature=1e-4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(greedy, cold)


CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12}  # p = 0.001


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, None, None), (0.7, 6, None), (1.5, None, 0.8),
                                                     (0.9, 5, 0.9)])
def test_sample_frequencies_match_the_shaped_distribution(temperature, top_k, top_p):
    logits = torch.tensor([2.0, 1.5, 1.2, 0.9, 0.5, 0.1, -0.3, -1.0, -2.0])
    # Oracle in float64: temperature, then the k best, then the nucleus, renormalised.
    q = (logits.double() / temperature).softmax(-1)
    keep = torch.ones(9, dtype=torch.bool)
    if top_k:
        keep[q.argsort(descending=True)[top_k:]] = False
    if top_p:
        r = torch.where(keep, q, 0) / torch.where(keep, q, 0).sum()
        order = r.argsort(descending=True)
        m = int((r[order].cumsum(0) < top_p).sum()) + 1
        keep[order[m:]] = False
    expected = torch.where(keep, q, 0) / torch.where(keep, q, 0).sum()
    n = 20000
    draws = sample_token(logits.expand(n, 9), temperature, top_k, top_p, torch.Generator().manual_seed(11))
    counts = torch.bincount(draws, minlength=9).double()
    assert counts[~keep].sum() == 0
    chi2 = float((((counts - n * expected) ** 2) / (n * expected))[keep].sum())
    assert chi2 < CHI2_999[int(keep.sum()) - 1]


def test_bad_arguments_are_clear_errors():
    model = tiny_model()
    src, src_mask = source()
    with pytest.raises(ValueError, match="temperature"):
        shape_logits(torch.zeros(3), temperature=0)
    with pytest.raises(ValueError, match="top_k"):
        shape_logits(torch.zeros(3), top_k=0)
    with pytest.raises(ValueError, match="top_p"):
        shape_logits(torch.zeros(3), top_p=1.5)
    with pytest.raises(ValueError, match="max_len"):
        greedy_decode(model, src, src_mask, 0, BOS)
    with pytest.raises(ValueError, match="src_mask"):
        greedy_decode(model, src, src_mask[:, 0], 5, BOS)
    with pytest.raises(ValueError, match="n_best"):
        beam_search(model, src, src_mask, 5, BOS, EOS, beam_size=2, n_best=3)
    with pytest.raises(ValueError, match="alpha"):
        beam_search(model, src, src_mask, 5, BOS, EOS, alpha=-1)
