"""Chapter 10 — decoding strategies (解码策略): greedy search (贪心搜索), beam search (集束搜索)
and sampling (采样) with temperature, top-k and top-p.

Every strategy runs on a batch, stops each sequence at its end symbol, and takes
``use_cache``: with it, each step feeds only the newest token through the decoder
(``kv_cache``); without it, each step re-decodes the whole prefix, as the notes do.
Both paths give the same tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .data import PAD
from .encoder_decoder import EncoderDecoder
from .kv_cache import KVCache, decode_step
from .masks import subsequent_mask


class IncrementalDecoder:
    """Next-token log-probabilities for a growing batch of prefixes.

    Encodes the source once; ``step(ys)`` returns ``(batch, vocab)`` log-probabilities of the
    token after ``ys`` ``(batch, t)``. With ``use_cache`` only ``ys[:, -1]`` is new work, so
    ``step`` must be called once per position, in order; ``capacity`` preallocates the cache
    for that many positions instead of growing it by concatenation.
    """

    def __init__(self, model: EncoderDecoder, src: torch.Tensor, src_mask: torch.Tensor, use_cache: bool,
                 capacity: int | None = None) -> None:
        self.model = model
        self.src_mask = src_mask
        self.memory = model.encode(src, src_mask)
        self.cache = KVCache.from_memory(model, self.memory, capacity) if use_cache else None

    def step(self, ys: torch.Tensor) -> torch.Tensor:
        if self.cache is not None:
            out = decode_step(self.model, ys[:, -1:], self.src_mask, self.cache)
        else:
            mask = subsequent_mask(ys.size(1)).to(ys.device)
            out = self.model.decode(self.memory, self.src_mask, ys, mask)
        return self.model.generator(out[:, -1]).float()

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` (beams follow their parents)."""
        self.memory = self.memory.index_select(0, index)
        self.src_mask = self.src_mask.index_select(0, index)
        if self.cache is not None:
            self.cache.reorder(index)


def _check(max_len: int, src: torch.Tensor, src_mask: torch.Tensor) -> None:
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if src.dim() != 2 or src_mask.shape != (src.size(0), 1, src.size(1)):
        raise ValueError(f"src must be (batch, len) and src_mask (batch, 1, len); got {tuple(src.shape)}, "
                         f"{tuple(src_mask.shape)}")


def _autoregress(
    model: EncoderDecoder,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len: int,
    start_symbol: int,
    end_symbol: int | None,
    pad: int,
    use_cache: bool,
    choose: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Shared loop of greedy search and sampling: ``choose(log_probs) -> (batch,)`` picks each token."""
    _check(max_len, src, src_mask)
    dec = IncrementalDecoder(model, src, src_mask, use_cache)
    ys = torch.full((src.size(0), 1), start_symbol, dtype=torch.long, device=src.device)
    done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    for _ in range(max_len - 1):
        nxt = choose(dec.step(ys))
        nxt = nxt.masked_fill(done, pad)  # a finished sequence only pads
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        if end_symbol is not None:
            done |= nxt == end_symbol
            if bool(done.all()):
                break
    return ys


@torch.no_grad()
def greedy_decode(
    model: EncoderDecoder,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len: int,
    start_symbol: int,
    end_symbol: int | None = None,
    pad: int = PAD,
    use_cache: bool = True,
) -> torch.Tensor:
    """Pick the most likely token at every step.

    Shapes: src ``(batch, src_len)``, src_mask ``(batch, 1, src_len)``  ->  ``(batch, <= max_len)``
    ids starting with ``start_symbol``; after a sequence's ``end_symbol`` come only ``pad`` ids,
    and decoding stops once every sequence has ended.
    """
    return _autoregress(model, src, src_mask, max_len, start_symbol, end_symbol, pad, use_cache,
                        lambda lp: lp.argmax(dim=-1))


def top_k_top_p_filter(
    logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """Hide every token outside the top-k and then outside the nucleus: hidden logits become ``-inf``.

    * top-k: keep the tokens whose logit is at least the ``top_k``-th largest of the row.
    * top-p (nucleus): of what top-k left, sort by probability (descending) and keep each token
      while the probability of the tokens *before* it is still below ``top_p``: the smallest set
      whose mass reaches ``top_p``, including the token that crosses it. ``top_p >= 1`` keeps all.

    ``None`` skips a filter. Shape ``(..., vocab)`` in and out; kept logits are unchanged.
    """
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k is not None and top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p is not None and top_p < 1:
        # float64: in float32 a dominant token's probability rounds to 1.0 and the running
        # mass "reaches" p before the tail has been counted.
        probs, order = logits.double().softmax(dim=-1).sort(dim=-1, descending=True)
        mass_before = probs.cumsum(dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, -math.inf)
    return logits


def shape_logits(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """Reshape a next-token distribution before sampling: ``logits / temperature``, then
    ``top_k_top_p_filter``. Shape ``(..., vocab)``; removed tokens get ``-inf``."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (use greedy_decode for 0), got {temperature}")
    return top_k_top_p_filter(logits / temperature, top_k, top_p)


def sample_token(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One draw per row from the shaped distribution: ``(batch, vocab) -> (batch,)`` ids."""
    probs = shape_logits(logits, temperature, top_k, top_p).softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def sample(
    model: EncoderDecoder,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len: int,
    start_symbol: int,
    end_symbol: int | None = None,
    pad: int = PAD,
    use_cache: bool = True,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Draw each token from the shaped distribution (see ``shape_logits``).

    Pass a seeded ``torch.Generator`` for reproducible draws. Shapes as ``greedy_decode``.
    """

    def choose(log_probs: torch.Tensor) -> torch.Tensor:
        return sample_token(log_probs, temperature, top_k, top_p, generator)

    return _autoregress(model, src, src_mask, max_len, start_symbol, end_symbol, pad, use_cache, choose)


@dataclass
class Hypothesis:
    """A finished beam: ids (with the start and, if reached, the end symbol), summed
    log-probability, and ``score`` = log-probability / length penalty."""

    tokens: list[int]
    log_prob: float
    score: float


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's length penalty ``((5 + length) / 6) ** alpha``; ``alpha = 0`` ranks by raw log-probability."""
    return ((5 + length) / 6) ** alpha


def beam_step(
    scores: torch.Tensor, log_probs: torch.Tensor, beam_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of beam search: expand every beam by every token, score, prune globally.

    Args:
        scores: ``(batch, k)`` summed log-probabilities of the ``k`` beams (``-inf`` = empty slot).
        log_probs: ``(batch, k, vocab)`` next-token log-probabilities of each beam.
        beam_size: how many of the ``k * vocab`` candidates of a sentence survive.

    Returns:
        ``(new_scores, parents, tokens)``, each ``(batch, beam_size)``, best first: the
        candidate's summed log-probability ``scores[parent] + log_probs[parent, token]``, the
        beam it extends (``0 .. k-1``) and the token it appends.
    """
    batch, k, vocab = log_probs.shape
    candidates = (scores.unsqueeze(-1) + log_probs).view(batch, k * vocab)
    new_scores, flat = candidates.topk(beam_size, dim=-1)
    return new_scores, flat // vocab, flat % vocab


@dataclass
class BeamTrace:
    """What one step of ``beam_search`` saw and decided (for drawing the beam tree).

    ``scores`` ``(batch, k)``: the open beams before the step; ``log_probs`` ``(batch, k, vocab)``
    their next-token log-probabilities; ``cand_scores``, ``cand_parents``, ``cand_tokens``
    ``(batch, 2k)``: ``beam_step``'s best ``2k`` candidates, best first; ``ended``: the candidates
    that finished a hypothesis (the end symbol, ranked among the first ``k``); ``kept``: those
    that continue as the next step's open beams.
    """

    scores: torch.Tensor
    log_probs: torch.Tensor
    cand_scores: torch.Tensor
    cand_parents: torch.Tensor
    cand_tokens: torch.Tensor
    ended: torch.Tensor
    kept: torch.Tensor


@torch.no_grad()
def beam_search(
    model: EncoderDecoder,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len: int,
    start_symbol: int,
    end_symbol: int,
    beam_size: int = 4,
    alpha: float = 0.6,
    n_best: int = 1,
    use_cache: bool = True,
    trace: list[BeamTrace] | None = None,
    step_fn: Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, ...]] = beam_step,
) -> list[list[Hypothesis]]:
    """Keep the ``beam_size`` most likely open prefixes per sentence; return each sentence's
    ``n_best`` finished hypotheses, best first.

    Every step extends each of the ``k`` open beams by every token and ranks the candidates by
    summed log-probability (``beam_step``, asked for the best ``2k``). An end symbol among the
    first ``k`` finishes a hypothesis, which leaves the beam with the score
    ``log_prob / length_penalty(n, alpha)`` (``n`` ids after the start symbol); the best ``k``
    other candidates stay open. At ``max_len`` ids the open prefixes finish as they are. A
    sentence is done once ``k`` hypotheses have finished, or once its ``n_best``-th finished
    score beats any score an open beam could still reach (log-probabilities only fall; the
    penalty grows at most to that of ``max_len``). So beam size 1 is greedy search for every
    ``alpha``, and a beam as wide as the number of possible outputs returns the exhaustive
    optimum. Pass a list as ``trace`` to receive one ``BeamTrace`` per step; ``step_fn`` replaces
    ``beam_step`` (to search with another implementation of it).
    """
    _check(max_len, src, src_mask)
    if beam_size < 1 or not 1 <= n_best <= beam_size:
        raise ValueError(f"need beam_size >= 1 and 1 <= n_best <= beam_size, got {beam_size}, {n_best}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0 (the early stop relies on it), got {alpha}")
    batch, k, device = src.size(0), beam_size, src.device
    dec = IncrementalDecoder(model, src, src_mask, use_cache)
    dec.reorder(torch.arange(batch, device=device).repeat_interleave(k))
    ys = torch.full((batch * k, 1), start_symbol, dtype=torch.long, device=device)
    # float64 sums: in float32 adding a long prefix's score can merge two close candidates.
    scores = torch.full((batch, k), -math.inf, dtype=torch.float64, device=device)
    scores[:, 0] = 0.0  # the k beams start identical: expand only the first
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    open_ = [True] * batch
    best_reachable = length_penalty(max_len - 1, alpha)
    for step in range(1, max_len):
        log_probs = dec.step(ys).double().view(batch, k, -1)
        cand_scores, cand_parents, cand_tokens = step_fn(scores, log_probs, min(2 * k, log_probs[0].numel()))
        new_scores = torch.full((batch, k), -math.inf, dtype=torch.float64, device=device)
        parents = torch.zeros(batch, k, dtype=torch.long, device=device)
        tokens = torch.full((batch, k), end_symbol, dtype=torch.long, device=device)
        ended, kept = torch.zeros_like(cand_tokens, dtype=torch.bool), torch.zeros_like(cand_tokens, dtype=torch.bool)
        for b in range(batch):
            alive = 0
            for rank, (s, j, v) in enumerate(zip(cand_scores[b].tolist(), cand_parents[b].tolist(),
                                                 cand_tokens[b].tolist())):
                if not open_[b] or alive == k or s == -math.inf:
                    break
                if v == end_symbol:
                    if rank < k:
                        finished[b].append(Hypothesis(ys[b * k + j].tolist() + [v], s, s / length_penalty(step, alpha)))
                        ended[b, rank] = True
                    continue
                new_scores[b, alive], parents[b, alive], tokens[b, alive] = s, j, v
                kept[b, rank] = True
                alive += 1
            if step == max_len - 1:  # open prefixes at the length limit finish as they are
                for j in range(alive):
                    s = float(new_scores[b, j])
                    seq = ys[b * k + int(parents[b, j])].tolist() + [int(tokens[b, j])]
                    finished[b].append(Hypothesis(seq, s, s / length_penalty(step, alpha)))
            ranked = sorted((h.score for h in finished[b]), reverse=True)
            best_open = float(new_scores[b].max())
            if (best_open == -math.inf or len(ranked) >= k
                    or (len(ranked) >= n_best and ranked[n_best - 1] >= best_open / best_reachable)):
                open_[b] = False
                new_scores[b] = -math.inf
        if trace is not None:
            trace.append(BeamTrace(scores, log_probs, cand_scores, cand_parents, cand_tokens, ended, kept))
        if not any(open_):
            break
        rows = (parents + torch.arange(batch, device=device).unsqueeze(1) * k).view(-1)
        dec.reorder(rows)
        ys = torch.cat([ys.index_select(0, rows), tokens.view(-1, 1)], dim=1)
        scores = new_scores
    return [sorted(f, key=lambda h: h.score, reverse=True)[:n_best] for f in finished]
