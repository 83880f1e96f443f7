"""A decoding engine over the model's weights: the same tokens as ``decoding``, fewer and cheaper kernels.

A cached decoding step is about fifty products with weights that never change, then small
operations around them. So the engine keeps, built once and rebuilt when the model's parameters
change:

* every projection as a kernel object of ``linear`` (the layout each kernel reads fastest:
  transposed for one row, MKL-packed for a batch, or int8 with ``int8=True``), each encoder and
  decoder layer's Q/K/V projections fused into one; the target embedding pre-scaled;
* the cross-attention K/V projections of all layers as one matrix, applied to the encoder memory
  once per sentence; the cross-attention's additive mask, built once per sentence;
* a preallocated self-attention cache ``StaticKVCache`` with a length pointer (the notes' §7.5),
  in place of the concatenation that ``kv_cache.KVCache`` does at every step, and its per-layer
  views made once per sentence.

It runs under ``torch.inference_mode`` (no autograd bookkeeping on each small operation).

It computes as the model does in eval mode (no dropout), with either LayerNorm flavour and either
norm position. ``greedy_decode``, ``sample`` and ``beam_search`` take the arguments of the functions
of the same name in ``tfm_solution.decoding`` (without ``model`` and ``use_cache``) and give the
same tokens in float32; with ``int8=True`` a few tokens change (``benchmarks/RESULTS.md``).

    engine = InferenceEngine(model)
    ys = engine.greedy_decode(src, src_mask, max_len=60, start_symbol=BOS, end_symbol=EOS)
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import mask_fill_value
from ..data import PAD
from ..decoding import Hypothesis, beam_step, length_penalty, sample_token
from ..encoder_decoder import EncoderDecoder
from .forward import additive_mask, fuse
from .layer_norm import apply_norm, layer_norm
from .linear import DenseLinear, Int8Linear, int8_available


Linear = DenseLinear | Int8Linear


class StepLayer(NamedTuple):
    """One decoder layer's projections and its three sublayers' LayerNorms (in the step's dtype)."""

    norms: list[nn.Module]
    qkv: Linear
    self_out: Linear
    cross_q: Linear
    cross_out: Linear
    w_1: Linear
    w_2: Linear


class EncoderLayerWeights(NamedTuple):
    """One encoder layer's projections (Q/K/V fused) and its two sublayers' LayerNorms."""

    norms: list[nn.Module]
    qkv: Linear
    out: Linear
    w_1: Linear
    w_2: Linear


class Frozen(NamedTuple):
    """Everything the engine derives from the parameters (see the module docstring)."""

    encoder: list[EncoderLayerWeights]
    encoder_norm: nn.Module
    cross_kv: Linear  # every decoder layer's cross-attention K and V, one product
    layers: list[StepLayer]
    final_norm: nn.Module
    generator: Linear
    embedding: torch.Tensor  # (vocab, d_model), already multiplied by sqrt(d_model)

    def step_linears(self) -> list[Linear]:
        """The products of one decoding step, in the order the step runs them."""
        return [lin for layer in self.layers for lin in layer[1:]] + [self.generator]

    def linears(self) -> list[Linear]:
        """Every product the engine runs: the encoder's, the cross-attention K/V and the step's."""
        return [lin for layer in self.encoder for lin in layer[1:]] + [self.cross_kv] + self.step_linears()


def freeze(model: EncoderDecoder, dtype: torch.dtype, int8: bool = False, prepack: bool = True) -> Frozen:
    """Derive the engine's weights from ``model``: the decoding step's in ``dtype``, the encoder's
    in the model's own dtype; with ``int8``, every projection as an ``Int8Linear``."""
    model_dtype = model.generator.proj.weight.dtype

    def linear(*linears: nn.Linear, step: bool = True) -> Linear:
        proj = fuse(linears)
        if int8:
            return Int8Linear(proj.weight, proj.bias)
        return DenseLinear(proj.weight, proj.bias, dtype if step else model_dtype, prepack and step)

    def norm(module: nn.Module) -> nn.Module:
        return module if isinstance(module, nn.Identity) or module.a_2.dtype == dtype else copy.deepcopy(
            module).to(dtype)

    with torch.no_grad():
        encoder = [EncoderLayerWeights([conn.norm for conn in layer.sublayer], linear(*layer.self_attn.linears[:3],
                                       step=False), linear(layer.self_attn.linears[3], step=False),
                                       linear(layer.feed_forward.w_1, step=False),
                                       linear(layer.feed_forward.w_2, step=False)) for layer in model.encoder.layers]
        layers = [StepLayer([norm(conn.norm) for conn in layer.sublayer],
                            linear(*layer.self_attn.linears[:3]), linear(layer.self_attn.linears[3]),
                            linear(layer.src_attn.linears[0]), linear(layer.src_attn.linears[3]),
                            linear(layer.feed_forward.w_1), linear(layer.feed_forward.w_2))
                  for layer in model.decoder.layers]
        embed = model.tgt_embed[0]
        return Frozen(
            encoder,
            model.encoder.norm,
            linear(*[lin for layer in model.decoder.layers for lin in layer.src_attn.linears[1:3]], step=False),
            layers,
            norm(model.decoder.norm),
            linear(model.generator.proj),
            (embed.lut.weight * math.sqrt(embed.d_model)).to(dtype),
        )


class StaticKVCache:
    """Self-attention keys and values of every layer in one preallocated tensor, with a length pointer.

    ``kv`` has shape ``(layers, 2, batch, heads, max_len, d_k)``: the notes' ``[2, b, h, s, d_h]``
    (K and V stacked) for each layer, allocated once for the longest output. A step writes
    position ``length`` of every layer, then ``length`` moves on by one.
    """

    def __init__(self, layers: int, batch: int, heads: int, max_len: int, d_k: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.kv = torch.zeros(layers, 2, batch, heads, max_len, d_k, dtype=dtype, device=device)
        self.length = 0

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` of the filled positions (beams follow their parents)."""
        filled = self.kv[:, :, :, :, : self.length]
        filled.copy_(filled.index_select(2, index))

    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


def write_kv(kv: torch.Tensor, new: torch.Tensor, pos: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Store ``new`` ``(2, batch, heads, d_k)`` at position ``pos`` of one layer's cache ``kv``
    ``(2, batch, heads, max_len, d_k)``; return the keys and values to attend to, each
    ``(batch, heads, n, d_k)``.

    An ``int`` position returns the filled prefix (``n = pos + 1``, a view). A tensor position
    ``(1,)`` keeps every shape the same from step to step, as ``torch.compile`` wants: it returns
    all ``max_len`` positions, and the caller masks those after ``pos``.
    """
    if isinstance(pos, int):
        kv.select(3, pos).copy_(new)
        return kv.narrow(3, 0, pos + 1).unbind(0)
    kv.index_copy_(3, pos, new.unsqueeze(3))
    return kv.unbind(0)


@dataclass
class DecodeState:
    """One batch being decoded: its self-attention cache, the cross-attention keys and values
    ``(layers, 2, batch, heads, src_len, d_k)`` and additive mask ``(batch, 1, 1, src_len)``, and
    the sinusoid table ``(max_len, d_model)`` in the step's dtype.

    ``layer_kv`` and ``cross`` are per-layer views of ``cache.kv`` and ``cross_kv``, made once per
    sentence rather than once per step (each view is an operation of its own)."""

    cache: StaticKVCache
    cross_kv: torch.Tensor
    cross_mask: torch.Tensor
    pe: torch.Tensor
    layer_kv: list[torch.Tensor] = field(init=False)
    cross: list[tuple[torch.Tensor, torch.Tensor]] = field(init=False)

    def __post_init__(self) -> None:
        self.layer_kv = list(self.cache.kv.unbind(0))
        self.cross = [tuple(layer.unbind(0)) for layer in self.cross_kv.unbind(0)]


def _check(max_len: int, src: torch.Tensor, src_mask: torch.Tensor) -> None:
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if src.dim() != 2 or src_mask.shape != (src.size(0), 1, src.size(1)):
        raise ValueError(f"src must be (batch, len) and src_mask (batch, 1, len); got {tuple(src.shape)}, "
                         f"{tuple(src_mask.shape)}")


class InferenceEngine:
    """Fast eval-mode decoding of ``model`` (see the module docstring).

    Args:
        model: the ``EncoderDecoder`` whose weights are read (never modified).
        dtype: the decoding step's weights and activations, e.g. ``torch.bfloat16`` (half the
            bytes to read per token; the numbers, and maybe the tokens, differ); default: the model's.
            The encoder always runs in the model's own dtype.
        fixed_shape: attend over the whole preallocated cache, masking the positions not yet
            decoded, so that every step has the same shapes (what ``compile`` needs); the same numbers.
        int8: every projection, the encoder's included, as a dynamic int8 product (``linear.Int8Linear``):
            a quarter of the weight bytes, activations still float32; the numbers differ, and with
            them some tokens (the tests bound how much).
        prepack: for batches (or beams) of more than one row, MKL-packed copies of the step's
            float32 weights (``linear.DenseLinear``); False keeps ``addmm`` everywhere.
    """

    def __init__(self, model: EncoderDecoder, dtype: torch.dtype | None = None, fixed_shape: bool = False,
                 int8: bool = False, prepack: bool = True) -> None:
        if int8 and dtype not in (None, torch.float32):
            raise ValueError(f"the int8 engine computes its activations in float32; got dtype={dtype}")
        if int8 and next(model.parameters()).device.type != "cpu":
            raise ValueError("the int8 engine runs on the CPU: move the model there first (model.cpu())")
        if int8 and not int8_available():
            raise RuntimeError("this PyTorch build has no quantized engine, so no int8 linear kernel; "
                               "decode in float32 instead")
        self.model = model
        self.dtype = dtype
        self.fixed_shape = fixed_shape
        self.int8 = int8
        self.prepack = prepack
        self.cache_len = 0
        self._frozen: Frozen | None = None
        self._signature: list[tuple[torch.Tensor, int, int]] = []

    def weights(self) -> Frozen:
        """The derived weights, rebuilt first if any parameter was replaced or changed in place
        (an optimizer step, ``load_state_dict``, ``.to()``) since they were built.

        Writes through ``param.data`` bypass the version counters that tell: call ``invalidate()``
        after those."""
        current = [(p, p._version, p.data_ptr()) for p in self.model.parameters()]
        if self._frozen is None or len(current) != len(self._signature) or any(
                p is not q or v != w or a != c for (p, v, a), (q, w, c) in zip(current, self._signature)):
            self._frozen = freeze(self.model, self.dtype or current[0][0].dtype, self.int8, self.prepack)
            self._signature = current
        return self._frozen

    def invalidate(self) -> None:
        """Forget the derived weights; the next ``start`` rebuilds them from the parameters."""
        self._frozen = None

    def nbytes(self) -> int:
        """Bytes of the derived projections (int8 weights, or float weights and their packed copies)."""
        return sum(lin.nbytes() for lin in self.weights().linears())

    @torch.inference_mode()
    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """``model.encode`` over the engine's projections: ``(batch, src_len)`` -> ``(batch, src_len, d_model)``."""
        model, w = self.model, self.weights()
        h = model.encoder.layers[0].self_attn.h
        x = model.src_embed(src)  # eval mode: the scaled embedding plus the sinusoids, no dropout
        b, s, d = x.shape
        mask = additive_mask(src_mask, x.dtype)
        x = x.reshape(b * s, d)  # every product sees rows, the attention (batch, heads, len, d_k)
        for layer, lw in zip(model.encoder.layers, w.encoder):

            def self_attention(y: torch.Tensor) -> torch.Tensor:
                q, k, v = lw.qkv(y).view(b, s, 3, h, -1).permute(2, 0, 3, 1, 4)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                return lw.out(out.transpose(1, 2).reshape(b * s, d))

            post = layer.sublayer[0].norm_position == "post"
            x = _residual(post, lw.norms[0], x, self_attention)
            x = _residual(post, lw.norms[1], x, lambda y: lw.w_2(lw.w_1(y).relu_()))
        return apply_norm(x, w.encoder_norm).view(b, s, d)

    @torch.inference_mode()
    def start(self, src: torch.Tensor, src_mask: torch.Tensor, steps: int) -> DecodeState:
        """Encode ``src`` ``(batch, src_len)`` and prepare ``steps`` decoding steps."""
        model, w = self.model, self.weights()
        if model.training:
            raise ValueError("the engine decodes as the model does in eval mode: call model.eval() first")
        layer = model.decoder.layers[0].self_attn
        pe = model.tgt_embed[1].pe
        if steps > pe.size(1):
            raise ValueError(f"{steps} steps exceed the positional table (max_len={pe.size(1)})")
        memory = self.encode(src, src_mask)
        dtype = w.embedding.dtype
        b, s, d = memory.shape
        kv = w.cross_kv(memory.view(b * s, d)).to(dtype)
        kv = kv.view(b, s, len(w.layers), 2, layer.h, layer.d_k).permute(2, 3, 0, 4, 1, 5).contiguous()
        for lin in w.step_linears():
            lin.prepare(b)
        cache = StaticKVCache(len(w.layers), b, layer.h, max(steps, self.cache_len, 1), layer.d_k, dtype,
                              memory.device)
        return DecodeState(cache, kv, additive_mask(src_mask, dtype), pe[0].to(dtype))

    @torch.inference_mode()
    def step(self, state: DecodeState, token: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``(batch, vocab)`` (float32) of the token after ``token`` ``(batch,)``,
        the token at position ``state.cache.length``; the cache advances by one."""
        cache = state.cache
        if cache.length >= cache.kv.size(4):
            raise ValueError(f"the cache holds {cache.kv.size(4)} positions; all are filled")
        pos: int | torch.Tensor = cache.length
        if self.fixed_shape:  # a tensor position, and a token column whose stride is 1 whatever max_len
            pos, token = torch.tensor([cache.length], device=token.device), token.contiguous()
        log_probs = self._step(token, pos, state.layer_kv, state.cross, state.cross_mask, state.pe)
        cache.length += 1
        return log_probs

    def _step(self, token: torch.Tensor, pos: int | torch.Tensor, layer_kv: list[torch.Tensor],
              cross: list[tuple[torch.Tensor, torch.Tensor]], cross_mask: torch.Tensor, pe: torch.Tensor
              ) -> torch.Tensor:
        """The decoding step as a function of tensors only (what ``compile`` compiles); ``pos`` as
        in ``write_kv``, the other arguments as in ``DecodeState``."""
        model, w = self.model, self._frozen
        h = model.decoder.layers[0].self_attn.h
        x = F.embedding(token, w.embedding) + pe[pos]
        b = x.size(0)
        self_mask = None
        if not isinstance(pos, int):  # hide the positions after pos from the fixed-length cache
            kv = layer_kv[0]
            later = torch.arange(kv.size(3), device=kv.device).view(1, -1) > pos
            self_mask = torch.zeros(later.shape, dtype=kv.dtype, device=kv.device).masked_fill(
                later, mask_fill_value(kv.dtype))
        for layer, lw, kv, (cross_k, cross_v) in zip(model.decoder.layers, w.layers, layer_kv, cross):

            def self_attention(y: torch.Tensor) -> torch.Tensor:
                qkv = lw.qkv(y).view(b, 3, h, -1)
                k, v = write_kv(kv, qkv[:, 1:].transpose(0, 1), pos)
                out = F.scaled_dot_product_attention(qkv[:, :1].transpose(1, 2), k, v, attn_mask=self_mask)
                return lw.self_out(out.view(b, -1))

            def cross_attention(y: torch.Tensor) -> torch.Tensor:
                out = F.scaled_dot_product_attention(lw.cross_q(y).view(b, h, 1, -1), cross_k, cross_v,
                                                     attn_mask=cross_mask)
                return lw.cross_out(out.view(b, -1))

            post = layer.sublayer[0].norm_position == "post"
            x = _residual(post, lw.norms[0], x, self_attention)
            x = _residual(post, lw.norms[1], x, cross_attention)
            x = _residual(post, lw.norms[2], x, lambda y: lw.w_2(lw.w_1(y).relu_()))
        return w.generator(apply_norm(x, w.final_norm)).float().log_softmax(-1)

    def compile(self, cache_len: int = 0, **options) -> None:
        """Run the step through ``torch.compile(dynamic=False, **options)`` with fixed shapes: each
        new batch size, source length or cache length compiles once, then steps reuse it.
        ``cache_len``: give every cache at least that many positions, so that one compilation
        serves every output length up to it."""
        if self.int8:
            raise ValueError("compile is for the floating-point engine: torch.compile cannot trace the int8 "
                             "kernel's packed weights")
        self.fixed_shape = True
        self.cache_len = cache_len
        self._step = torch.compile(self._step, dynamic=False, **options)

    def _autoregress(self, src: torch.Tensor, src_mask: torch.Tensor, max_len: int, start_symbol: int,
                     end_symbol: int | None, pad: int, choose: Callable[[torch.Tensor], torch.Tensor]
                     ) -> torch.Tensor:
        """The loop of greedy search and sampling; ``choose(log_probs) -> (batch,)`` picks each token."""
        _check(max_len, src, src_mask)
        state = self.start(src, src_mask, max_len - 1)
        ys = torch.full((src.size(0), max_len), pad, dtype=torch.long, device=src.device)
        ys[:, 0] = start_symbol
        done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
        for t in range(max_len - 1):
            nxt = choose(self.step(state, ys[:, t])).masked_fill(done, pad)  # a finished sequence only pads
            ys[:, t + 1] = nxt
            if end_symbol is not None:
                done |= nxt == end_symbol
                if bool(done.all()):
                    return ys[:, : t + 2]
        return ys

    @torch.inference_mode()
    def greedy_decode(self, src: torch.Tensor, src_mask: torch.Tensor, max_len: int, start_symbol: int,
                      end_symbol: int | None = None, pad: int = PAD) -> torch.Tensor:
        """``decoding.greedy_decode`` with this engine: ``(batch, src_len) -> (batch, <= max_len)`` ids."""
        return self._autoregress(src, src_mask, max_len, start_symbol, end_symbol, pad, lambda lp: lp.argmax(-1))

    @torch.inference_mode()
    def sample(self, src: torch.Tensor, src_mask: torch.Tensor, max_len: int, start_symbol: int,
               end_symbol: int | None = None, pad: int = PAD, temperature: float = 1.0, top_k: int | None = None,
               top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """``decoding.sample`` with this engine; the same seeded ``generator`` draws the same tokens."""
        return self._autoregress(src, src_mask, max_len, start_symbol, end_symbol, pad,
                                 lambda lp: sample_token(lp, temperature, top_k, top_p, generator))

    @torch.inference_mode()
    def beam_search(self, src: torch.Tensor, src_mask: torch.Tensor, max_len: int, start_symbol: int,
                    end_symbol: int, beam_size: int = 4, alpha: float = 0.6, n_best: int = 1
                    ) -> list[list[Hypothesis]]:
        """``decoding.beam_search`` with this engine (the same search, step for step): each
        sentence's ``n_best`` finished hypotheses, best first."""
        _check(max_len, src, src_mask)
        if beam_size < 1 or not 1 <= n_best <= beam_size:
            raise ValueError(f"need beam_size >= 1 and 1 <= n_best <= beam_size, got {beam_size}, {n_best}")
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0 (the early stop relies on it), got {alpha}")
        batch, k, device = src.size(0), beam_size, src.device
        # Each sentence's k rows share its source, so the cross-attention state is expanded once
        # and never reordered: a beam's parent is always a row of the same sentence.
        expand = torch.arange(batch, device=device).repeat_interleave(k)
        state = self.start(src.index_select(0, expand), src_mask.index_select(0, expand), max_len - 1)
        ys = torch.full((batch * k, max_len), start_symbol, dtype=torch.long, device=device)
        scores = torch.full((batch, k), -math.inf, dtype=torch.float64, device=device)
        scores[:, 0] = 0.0  # the k beams start identical: expand only the first
        finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
        open_ = [True] * batch
        best_reachable = length_penalty(max_len - 1, alpha)
        for step in range(1, max_len):
            log_probs = self.step(state, ys[:, step - 1]).double().view(batch, k, -1)
            cand = [c.tolist() for c in beam_step(scores, log_probs, min(2 * k, log_probs[0].numel()))]
            new_scores = torch.full((batch, k), -math.inf, dtype=torch.float64, device=device)
            parents = torch.zeros(batch, k, dtype=torch.long, device=device)
            tokens = torch.full((batch, k), end_symbol, dtype=torch.long, device=device)
            for b in range(batch):
                alive = 0
                for rank, (score, parent, token) in enumerate(zip(*(c[b] for c in cand))):
                    if not open_[b] or alive == k or score == -math.inf:
                        break
                    if token == end_symbol:  # among the best k it finishes a hypothesis
                        if rank < k:
                            seq = ys[b * k + parent, :step].tolist() + [token]
                            finished[b].append(Hypothesis(seq, score, score / length_penalty(step, alpha)))
                        continue
                    new_scores[b, alive], parents[b, alive], tokens[b, alive] = score, parent, token
                    alive += 1
                if step == max_len - 1:  # open prefixes at the length limit finish as they are
                    for j in range(alive):
                        score = float(new_scores[b, j])
                        seq = ys[b * k + int(parents[b, j]), :step].tolist() + [int(tokens[b, j])]
                        finished[b].append(Hypothesis(seq, score, score / length_penalty(step, alpha)))
                ranked = sorted((h.score for h in finished[b]), reverse=True)
                best_open = float(new_scores[b].max())
                if (best_open == -math.inf or len(ranked) >= k
                        or (len(ranked) >= n_best and ranked[n_best - 1] >= best_open / best_reachable)):
                    open_[b] = False
                    new_scores[b] = -math.inf
            if not any(open_):
                break
            rows = (parents + torch.arange(batch, device=device).unsqueeze(1) * k).view(-1)
            state.cache.reorder(rows)
            ys[:, :step] = ys[:, :step].index_select(0, rows)
            ys[:, step] = tokens.view(-1)
            scores = new_scores
        return [sorted(f, key=lambda h: h.score, reverse=True)[:n_best] for f in finished]


def _residual(post: bool, norm: nn.Module, x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]
              ) -> torch.Tensor:
    """``SublayerConnection`` at eval time (no dropout); ``fn``'s fresh output takes the sum in place."""
    if post:
        return layer_norm(fn(x).add_(x), norm)
    return fn(layer_norm(x, norm)).add_(x)
