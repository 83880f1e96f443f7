"""An independent, functional rendering of the source notes' model, used as a test oracle.

It knows the notes' module hierarchy (hence their ``state_dict`` keys and shapes) and
their arithmetic (Pre-LN, std-based LayerNorm with eps 1e-6 outside the root, masked
scores set to -1e9), and computes the forward pass straight from a ``state_dict`` with
plain tensor algebra: no module of ``tfm_solution`` is used.
"""

from __future__ import annotations

import math

import torch


def notes_shapes(src_vocab: int, tgt_vocab: int, N: int, d_model: int, d_ff: int, max_len: int = 5000):
    """Every ``state_dict`` entry of the notes' ``make_model`` with its shape."""
    shapes: dict[str, tuple[int, ...]] = {}

    def linear(prefix, n_in, n_out):
        shapes[f"{prefix}.weight"] = (n_out, n_in)
        shapes[f"{prefix}.bias"] = (n_out,)

    def norm(prefix):
        shapes[f"{prefix}.a_2"] = (d_model,)
        shapes[f"{prefix}.b_2"] = (d_model,)

    for stack, attns, n_sub in (("encoder", ("self_attn",), 2), ("decoder", ("self_attn", "src_attn"), 3)):
        for i in range(N):
            layer = f"{stack}.layers.{i}"
            for a in attns:
                for j in range(4):
                    linear(f"{layer}.{a}.linears.{j}", d_model, d_model)
            linear(f"{layer}.feed_forward.w_1", d_model, d_ff)
            linear(f"{layer}.feed_forward.w_2", d_ff, d_model)
            for s in range(n_sub):
                norm(f"{layer}.sublayer.{s}.norm")
        norm(f"{stack}.norm")
    shapes["src_embed.0.lut.weight"] = (src_vocab, d_model)
    shapes["src_embed.1.pe"] = (1, max_len, d_model)
    shapes["tgt_embed.0.lut.weight"] = (tgt_vocab, d_model)
    shapes["tgt_embed.1.pe"] = (1, max_len, d_model)
    linear("generator.proj", d_model, tgt_vocab)
    return shapes


def _linear(sd, prefix, x):
    return x @ sd[f"{prefix}.weight"].T + sd[f"{prefix}.bias"]


def _norm(sd, prefix, x, eps=1e-6):
    centred = x - x.mean(-1, keepdim=True)
    std = torch.sqrt((centred**2).sum(-1, keepdim=True) / (x.size(-1) - 1))
    return sd[f"{prefix}.a_2"] * centred / (std + eps) + sd[f"{prefix}.b_2"]


def _mha(sd, prefix, q_in, kv_in, mask, h):
    b, d = q_in.size(0), q_in.size(-1)
    d_k = d // h

    def heads(x, j):
        return _linear(sd, f"{prefix}.linears.{j}", x).reshape(b, -1, h, d_k).permute(0, 2, 1, 3)

    q, k, v = heads(q_in, 0), heads(kv_in, 1), heads(kv_in, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d_k)
    scores = torch.where(mask[:, None].bool(), scores, torch.full_like(scores, -1e9))
    out = torch.softmax(scores, dim=-1) @ v
    return _linear(sd, f"{prefix}.linears.3", out.permute(0, 2, 1, 3).reshape(b, -1, d))


def _ffn(sd, prefix, x):
    return _linear(sd, f"{prefix}.w_2", torch.relu(_linear(sd, f"{prefix}.w_1", x)))


def _embed(sd, side, ids):
    table = sd[f"{side}.0.lut.weight"]
    x = table[ids] * math.sqrt(table.size(1))
    return x + sd[f"{side}.1.pe"][:, : ids.size(1)]


def notes_forward(sd, src, tgt, src_mask, tgt_mask, N: int, h: int):
    """Decoder states of the notes' ``EncoderDecoder.forward`` in eval mode."""
    x = _embed(sd, "src_embed", src)
    for i in range(N):
        p = f"encoder.layers.{i}"
        y = _norm(sd, f"{p}.sublayer.0.norm", x)
        x = x + _mha(sd, f"{p}.self_attn", y, y, src_mask, h)
        x = x + _ffn(sd, f"{p}.feed_forward", _norm(sd, f"{p}.sublayer.1.norm", x))
    memory = _norm(sd, "encoder.norm", x)
    x = _embed(sd, "tgt_embed", tgt)
    for i in range(N):
        p = f"decoder.layers.{i}"
        y = _norm(sd, f"{p}.sublayer.0.norm", x)
        x = x + _mha(sd, f"{p}.self_attn", y, y, tgt_mask, h)
        x = x + _mha(sd, f"{p}.src_attn", _norm(sd, f"{p}.sublayer.1.norm", x), memory, src_mask, h)
        x = x + _ffn(sd, f"{p}.feed_forward", _norm(sd, f"{p}.sublayer.2.norm", x))
    return _norm(sd, "decoder.norm", x)
