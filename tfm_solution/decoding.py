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

from .encoder_decoder import EncoderDecoder
from .kv_cache import KVCache, decode_step
from .masks import subsequent_mask


class IncrementalDecoder:
    """Next-token log-probabilities for a growing batch of prefixes.

    Encodes the source once; ``step(ys)`` returns ``(batch, vocab)`` log-probabilities of the
    token after ``ys`` ``(batch, t)``. With ``use_cache`` only ``ys[:, -1]`` is new work, so
    ``step`` must be called once per position, in order.
    """

    def __init__(self, model: EncoderDecoder, src: torch.Tensor, src_mask: torch.Tensor, use_cache: bool) -> None:
        self.model = model
        self.src_mask = src_mask
        self.memory = model.encode(src, src_mask)
        self.cache = KVCache.from_memory(model, self.memory) if use_cache else None

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
    pad: int = 0,
    use_cache: bool = True,
) -> torch.Tensor:
    """Pick the most likely token at every step.

    Shapes: src ``(batch, src_len)``, src_mask ``(batch, 1, src_len)``  ->  ``(batch, <= max_len)``
    ids starting with ``start_symbol``; after a sequence's ``end_symbol`` come only ``pad`` ids,
    and decoding stops once every sequence has ended.
    """
    return _autoregress(model, src, src_mask, max_len, start_symbol, end_symbol, pad, use_cache,
                        lambda lp: lp.argmax(dim=-1))


def shape_logits(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """Reshape a next-token distribution before sampling; removed tokens get ``-inf``.

    ``logits / temperature``; then keep the ``top_k`` largest; then keep the smallest set of most
    likely tokens whose probability mass reaches ``top_p`` (the nucleus). Shape ``(..., vocab)``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (use greedy_decode for 0), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    logits = logits / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        mass_before = sorted_logits.softmax(dim=-1).cumsum(dim=-1) - sorted_logits.softmax(dim=-1)
        # A token stays while the mass of the more likely ones has not yet reached p.
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, -math.inf)
    return logits


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
    pad: int = 0,
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
    """A finished beam: ids (with start and, if reached, end symbol), summed log-probability, and
    ``score`` = log-probability / length penalty."""

    tokens: list[int]
    log_prob: float
    score: float


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's length penalty ``((5 + length) / 6) ** alpha``; ``alpha = 0`` ranks by raw log-probability."""
    return ((5 + length) / 6) ** alpha


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
) -> list[list[Hypothesis]]:
    """Keep the ``beam_size`` most likely prefixes per sentence; return each sentence's ``n_best``
    hypotheses, best first.

    A prefix ends when an end symbol ranks among the step's top ``beam_size`` candidates
    (so beam size 1 is greedy search) or when it reaches ``max_len`` ids. A sentence stops
    early once its ``n_best``-th finished score beats any score an open beam could still reach
    (log-probabilities only fall; the penalty grows at most to that of ``max_len``), so with a
    beam wider than the search space the result is the exhaustive optimum.
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
    scores = torch.full((batch, k), -math.inf, device=device)
    scores[:, 0] = 0.0  # all beams start equal: expand only the first
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    open_ = [True] * batch
    best_reachable = length_penalty(max_len - 1, alpha)
    for step in range(1, max_len):
        log_probs = dec.step(ys)
        vocab = log_probs.size(-1)
        cand = (scores.view(-1, 1) + log_probs).view(batch, k * vocab)
        top_scores, top_ids = cand.topk(min(2 * k, k * vocab), dim=1)
        new_scores = torch.full((batch, k), -math.inf, device=device)
        parents = torch.arange(batch * k, device=device)
        tokens = torch.full((batch * k,), end_symbol, dtype=torch.long, device=device)
        for b in range(batch):
            alive = 0
            for rank, (s, idx) in enumerate(zip(top_scores[b].tolist(), top_ids[b].tolist())):
                if not open_[b] or alive == k or s == -math.inf:
                    break
                parent, token = b * k + idx // vocab, idx % vocab
                if token == end_symbol:
                    if rank < k:
                        seq = ys[parent].tolist() + [token]
                        finished[b].append(Hypothesis(seq, s, s / length_penalty(step, alpha)))
                    continue
                new_scores[b, alive], parents[b * k + alive], tokens[b * k + alive] = s, parent, token
                alive += 1
        if step == max_len - 1:  # open prefixes at the length limit finish as they are
            for b in range(batch):
                for j in range(k):
                    if open_[b] and new_scores[b, j] > -math.inf:
                        seq = ys[parents[b * k + j]].tolist() + [int(tokens[b * k + j])]
                        s = float(new_scores[b, j])
                        finished[b].append(Hypothesis(seq, s, s / length_penalty(step, alpha)))
            break
        for b in range(batch):
            ranked = sorted(h.score for h in finished[b])[::-1]
            best_open = float(new_scores[b].max())
            if best_open == -math.inf or (len(ranked) >= n_best and ranked[n_best - 1] >= best_open / best_reachable):
                open_[b] = False
                new_scores[b] = -math.inf
        if not any(open_):
            break
        dec.reorder(parents)
        ys = torch.cat([ys.index_select(0, parents), tokens[:, None]], dim=1)
        scores = new_scores
    return [sorted(f, key=lambda h: h.score, reverse=True)[:n_best] for f in finished]
