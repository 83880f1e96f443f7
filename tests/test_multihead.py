"""Multi-head attention against ``nn.MultiheadAttention`` and the two attention kernels against each other."""

import pytest
import torch
from torch import nn

from tfm_solution import MultiHeadedAttention, make_model, subsequent_mask

pytestmark = pytest.mark.fast


def _torch_mha_from(ours: MultiHeadedAttention) -> nn.MultiheadAttention:
    d_model = ours.h * ours.d_k
    ref = nn.MultiheadAttention(d_model, ours.h, dropout=0.0, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.linears[i].weight for i in range(3)]))
        ref.in_proj_bias.copy_(torch.cat([ours.linears[i].bias for i in range(3)]))
        ref.out_proj.weight.copy_(ours.linears[3].weight)
        ref.out_proj.bias.copy_(ours.linears[3].bias)
    return ref


@pytest.mark.parametrize("kernel", ["matmul", "sdpa"])
def test_matches_nn_multiheadattention_cross_attention_with_padding(kernel):
    ours = MultiHeadedAttention(4, 32, dropout=0.0, kernel=kernel).double().eval()
    ref = _torch_mha_from(ours).eval()
    query = torch.randn(3, 5, 32, dtype=torch.float64)
    memory = torch.randn(3, 7, 32, dtype=torch.float64)
    keep = torch.arange(7)[None, :] < torch.tensor([7, 3, 5])[:, None]
    out = ours(query, memory, memory, mask=keep[:, None, :])
    expected, _ = ref(query, memory, memory, key_padding_mask=~keep, need_weights=False)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def test_matches_nn_multiheadattention_causal_self_attention():
    ours = MultiHeadedAttention(2, 16, dropout=0.0).double().eval()
    ref = _torch_mha_from(ours).eval()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    out = ours(x, x, x, mask=subsequent_mask(6))
    expected, weights = ref(x, x, x, attn_mask=~subsequent_mask(6)[0], average_attn_weights=False)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours.attn, weights, rtol=1e-10, atol=1e-10)


def test_sdpa_kernel_equals_matmul_kernel_including_fully_padded_rows():
    matmul = MultiHeadedAttention(4, 32, dropout=0.0, kernel="matmul").eval()
    sdpa = MultiHeadedAttention(4, 32, dropout=0.0, kernel="sdpa").eval()
    sdpa.load_state_dict(matmul.state_dict())
    x = torch.randn(3, 6, 32)
    keep = torch.arange(6)[None, :] < torch.tensor([6, 2, 0])[:, None]
    mask = keep[:, None, :] & subsequent_mask(6)
    torch.testing.assert_close(sdpa(x, x, x, mask), matmul(x, x, x, mask), rtol=1e-5, atol=1e-6)
    assert sdpa.attn is None and matmul.attn.shape == (3, 4, 6, 6)


def test_heads_are_merged_in_order():
    mha = MultiHeadedAttention(4, 8)
    x = torch.arange(2 * 3 * 8, dtype=torch.float32).view(2, 3, 8)
    split = mha.split_heads(x)
    assert split.shape == (2, 4, 3, 2)
    torch.testing.assert_close(split[:, 1], x[:, :, 2:4])
    torch.testing.assert_close(mha.merge_heads(split), x)


def test_invalid_configuration_is_rejected():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadedAttention(3, 32)
    with pytest.raises(ValueError, match="kernel"):
        MultiHeadedAttention(4, 32, kernel="flash")


@pytest.mark.parametrize("kernel", ["matmul", "sdpa"])
def test_make_model_passes_dropout_to_attention(kernel):
    model = make_model(10, 10, N=1, d_model=16, d_ff=32, h=2, dropout=0.3, attention_kernel=kernel)
    attns = [m for m in model.modules() if isinstance(m, MultiHeadedAttention)]
    assert len(attns) == 3 and all(m.dropout.p == 0.3 for m in attns)
    # Behaviour, not only the attribute: in training mode the attention output is random.
    attn = attns[0].train()
    x = torch.randn(2, 5, 16)
    assert not torch.allclose(attn(x, x, x), attn(x, x, x))
    attn.eval()
    torch.testing.assert_close(attn(x, x, x), attn(x, x, x))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sdpa_fully_masked_row_with_very_negative_scores_is_finite(dtype):
    # Scores of -400 pushed past the finite minimum would overflow to -inf if the kernel
    # added the mask in the input dtype; the whole row would then become NaN.
    from tfm_solution.multihead import sdpa_attention

    q = torch.full((1, 1, 2, 16), 10.0, dtype=dtype)
    k = -q
    for keep in ([False, False], [True, False]):
        out = sdpa_attention(q, k, k, torch.tensor(keep).view(1, 1, 1, 2), 0.0)
        assert torch.isfinite(out).all()
