"""LayerNorm flavours and whole encoder/decoder layers against PyTorch's own Transformer layers."""

import pytest
import torch
from torch import nn

from tfm_solution import (
    DecoderLayer,
    EncoderLayer,
    LayerNorm,
    MultiHeadedAttention,
    PositionwiseFeedForward,
    SublayerConnection,
    subsequent_mask,
)

pytestmark = pytest.mark.fast
D, H, FF = 32, 4, 64


def test_torch_flavour_matches_nn_layernorm():
    ours = LayerNorm(D, kind="torch")
    ref = nn.LayerNorm(D)
    with torch.no_grad():
        ours.a_2.uniform_(0.5, 1.5)
        ours.b_2.normal_()
        ref.weight.copy_(ours.a_2)
        ref.bias.copy_(ours.b_2)
    x = torch.randn(4, 5, D) * 3 + 1
    torch.testing.assert_close(ours(x), ref(x))
    assert ours.eps == ref.eps


def test_notes_flavour_matches_float64_hand_formula():
    x = torch.randn(3, 6, D, dtype=torch.float64) * 2 + 0.5
    ours = LayerNorm(D).double()
    with torch.no_grad():
        ours.a_2.uniform_(0.5, 1.5)
        ours.b_2.normal_()
    n = x.size(-1)
    mean = x.sum(-1, keepdim=True) / n
    unbiased_std = (((x - mean) ** 2).sum(-1, keepdim=True) / (n - 1)).sqrt()
    expected = ours.a_2 * (x - mean) / (unbiased_std + 1e-6) + ours.b_2
    torch.testing.assert_close(ours(x), expected, rtol=1e-12, atol=1e-12)


def test_the_two_flavours_really_differ():
    """The notes' std is unbiased: outputs are smaller by sqrt((d-1)/d) than nn.LayerNorm's."""
    x = torch.randn(2, 8, dtype=torch.float64)
    notes, torch_kind = LayerNorm(8).double(), LayerNorm(8, eps=0.0, kind="torch").double()
    ratio = notes(x) / torch_kind(x)
    torch.testing.assert_close(ratio, torch.full_like(ratio, (7 / 8) ** 0.5), rtol=1e-5, atol=1e-5)


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match="kind"):
        LayerNorm(4, kind="rms")
    with pytest.raises(ValueError, match="norm_position"):
        SublayerConnection(4, 0.0, norm_position="middle")


def _copy_norm(ours: LayerNorm, ref: nn.LayerNorm):
    ref.weight.copy_(ours.a_2)
    ref.bias.copy_(ours.b_2)


def _copy_mha(ours: MultiHeadedAttention, ref: nn.MultiheadAttention):
    ref.in_proj_weight.copy_(torch.cat([ours.linears[i].weight for i in range(3)]))
    ref.in_proj_bias.copy_(torch.cat([ours.linears[i].bias for i in range(3)]))
    ref.out_proj.weight.copy_(ours.linears[3].weight)
    ref.out_proj.bias.copy_(ours.linears[3].bias)


def _randomise(module: nn.Module):
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.3)


def _copy_ffn(ours: PositionwiseFeedForward, ref):
    ref.linear1.weight.copy_(ours.w_1.weight)
    ref.linear1.bias.copy_(ours.w_1.bias)
    ref.linear2.weight.copy_(ours.w_2.weight)
    ref.linear2.bias.copy_(ours.w_2.bias)


@pytest.mark.parametrize("position", ["pre", "post"])
def test_encoder_layer_matches_nn_transformer_encoder_layer(position):
    ours = EncoderLayer(
        D, MultiHeadedAttention(H, D, 0.0), PositionwiseFeedForward(D, FF, 0.0), 0.0, position, "torch"
    ).double()
    _randomise(ours)
    ref = nn.TransformerEncoderLayer(
        D, H, FF, dropout=0.0, batch_first=True, norm_first=(position == "pre"), dtype=torch.float64
    )
    with torch.no_grad():
        _copy_mha(ours.self_attn, ref.self_attn)
        _copy_ffn(ours.feed_forward, ref)
        _copy_norm(ours.sublayer[0].norm, ref.norm1)
        _copy_norm(ours.sublayer[1].norm, ref.norm2)
    # Training mode (dropout is 0) keeps PyTorch off its inference fast path.
    ours.train(), ref.train()
    x = torch.randn(3, 6, D, dtype=torch.float64)
    keep = torch.arange(6)[None, :] < torch.tensor([6, 4, 2])[:, None]
    out = ours(x, keep[:, None, :])
    expected = ref(x, src_key_padding_mask=~keep)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("position", ["pre", "post"])
def test_decoder_layer_matches_nn_transformer_decoder_layer(position):
    ours = DecoderLayer(
        D,
        MultiHeadedAttention(H, D, 0.0),
        MultiHeadedAttention(H, D, 0.0),
        PositionwiseFeedForward(D, FF, 0.0),
        0.0,
        position,
        "torch",
    ).double()
    _randomise(ours)
    ref = nn.TransformerDecoderLayer(
        D, H, FF, dropout=0.0, batch_first=True, norm_first=(position == "pre"), dtype=torch.float64
    )
    with torch.no_grad():
        _copy_mha(ours.self_attn, ref.self_attn)
        _copy_mha(ours.src_attn, ref.multihead_attn)
        _copy_ffn(ours.feed_forward, ref)
        for i, ref_norm in enumerate((ref.norm1, ref.norm2, ref.norm3)):
            _copy_norm(ours.sublayer[i].norm, ref_norm)
    ours.train(), ref.train()
    tgt = torch.randn(2, 5, D, dtype=torch.float64)
    memory = torch.randn(2, 7, D, dtype=torch.float64)
    src_keep = torch.arange(7)[None, :] < torch.tensor([7, 3])[:, None]
    out = ours(tgt, memory, src_keep[:, None, :], subsequent_mask(5))
    expected = ref(tgt, memory, tgt_mask=~subsequent_mask(5)[0], memory_key_padding_mask=~src_keep)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)
