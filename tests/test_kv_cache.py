"""The KV cache: cached decoding equals uncached decoding (tokens and logits) on padded batches,
for greedy search, beam search and sampling, with a growing or a preallocated cache; one cached
self-attention step equals the last row of full causal attention; the byte formula matches the
allocated tensors."""

import pytest
import torch

from tfm_solution import MultiHeadedAttention, make_model, subsequent_mask
from tfm_solution.data import BOS, EOS, PAD
from tfm_solution.decoding import IncrementalDecoder, beam_search, greedy_decode, sample
from tfm_solution.kv_cache import CachedSelfAttention, KVCache, cached_self_attention, decode_step, kv_cache_bytes

pytestmark = pytest.mark.fast

V = 13


def padded_source(batch=3, length=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (batch, length), generator=g)
    for row, keep in enumerate([length, length - 3, 2][:batch]):
        src[row, keep:] = PAD  # rows of different true lengths
    return src, (src != PAD).unsqueeze(-2)


@pytest.fixture(params=[("matmul", "pre"), ("sdpa", "post")], ids=["matmul-preLN", "sdpa-postLN"])
def model(request):
    kernel, norm = request.param
    return make_model(V, V, N=2, d_model=32, d_ff=64, h=4, attention_kernel=kernel, norm_position=norm).eval()


def test_cached_step_logits_match_full_prefix_decoding(model):
    src, src_mask = padded_source()
    cached = IncrementalDecoder(model, src, src_mask, use_cache=True)
    ys = torch.full((3, 1), BOS)
    with torch.no_grad():
        for _ in range(12):
            lp = cached.step(ys)
            # Oracle: the whole prefix through the plain forward pass, last position's log-probs.
            full = model.generator(model(src, ys, src_mask, torch.ones(1, ys.size(1), ys.size(1)).tril().bool()))
            torch.testing.assert_close(lp, full[:, -1], atol=1e-5, rtol=0)
            ys = torch.cat([ys, lp.argmax(-1, keepdim=True)], dim=1)
    assert cached.cache.length == 12


@pytest.mark.parametrize("capacity", [None, 20])
def test_preallocated_cache_decodes_like_the_growing_one(model, capacity):
    src, src_mask = padded_source()
    plain = IncrementalDecoder(model, src, src_mask, use_cache=False)
    cached = IncrementalDecoder(model, src, src_mask, use_cache=True, capacity=capacity)
    ys = torch.full((3, 1), BOS)
    with torch.no_grad():
        for _ in range(12):
            lp = cached.step(ys)
            torch.testing.assert_close(lp, plain.step(ys), atol=1e-5, rtol=0)
            ys = torch.cat([ys, lp.argmax(-1, keepdim=True)], dim=1)
    held = [lc.self_k.size(2) for lc in cached.cache.layers]
    assert held == [capacity or 12] * 2  # a preallocated buffer keeps its size; the fill is `length`
    assert all(lc.length == 12 for lc in cached.cache.layers)


def test_preallocated_cache_refuses_to_overflow(model):
    src, src_mask = padded_source()
    cache = KVCache.from_memory(model, model.encode(src, src_mask), capacity=2)
    with torch.no_grad(), pytest.raises(ValueError, match="holds 2 positions"):
        for _ in range(3):
            decode_step(model, torch.full((3, 1), BOS), src_mask, cache)


@pytest.mark.parametrize("kernel", ["matmul", "sdpa"])
def test_cached_self_attention_is_the_last_row_of_causal_attention(kernel):
    torch.manual_seed(0)
    attn = MultiHeadedAttention(4, 32, dropout=0.0, kernel=kernel).eval()
    y = torch.randn(2, 6, 32)
    with torch.no_grad():
        full = attn(y, y, y, subsequent_mask(6))  # oracle: every prefix at once, causal mask
        k = v = None
        for t in range(6):
            out, k, v = cached_self_attention(attn, y[:, t: t + 1], k, v)
            assert out.shape == (2, 1, 32) and k.shape == v.shape == (2, 4, t + 1, 8)
            torch.testing.assert_close(out[:, 0], full[:, t], atol=1e-5, rtol=0)
        # the cache holds exactly the projections of the whole prefix
        torch.testing.assert_close(k, attn.split_heads(attn.linears[1](y)), atol=1e-6, rtol=0)
        module = CachedSelfAttention(4, 32, dropout=0.0, kernel=kernel).eval()
        module.load_state_dict(attn.state_dict())
        again = module(y[:, :1])
        torch.testing.assert_close(again[0], cached_self_attention(attn, y[:, :1])[0])


def test_greedy_cached_equals_uncached(model):
    src, src_mask = padded_source()
    a = greedy_decode(model, src, src_mask, 15, BOS, EOS, PAD, use_cache=True)
    b = greedy_decode(model, src, src_mask, 15, BOS, EOS, PAD, use_cache=False)
    assert torch.equal(a, b)


def test_sampling_cached_equals_uncached(model):
    src, src_mask = padded_source()
    a = sample(model, src, src_mask, 15, BOS, EOS, PAD, True, 1.3, 8, 0.95, torch.Generator().manual_seed(3))
    b = sample(model, src, src_mask, 15, BOS, EOS, PAD, False, 1.3, 8, 0.95, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_beam_cached_equals_uncached(model):
    src, src_mask = padded_source()
    a = beam_search(model, src, src_mask, 10, BOS, EOS, beam_size=4, n_best=3, use_cache=True)
    b = beam_search(model, src, src_mask, 10, BOS, EOS, beam_size=4, n_best=3, use_cache=False)
    for hyps_a, hyps_b in zip(a, b):
        assert [h.tokens for h in hyps_a] == [h.tokens for h in hyps_b]
        torch.testing.assert_close(torch.tensor([h.log_prob for h in hyps_a]),
                                   torch.tensor([h.log_prob for h in hyps_b]), atol=1e-5, rtol=0)


def test_cross_attention_projected_once_and_self_cache_grows(model):
    src, src_mask = padded_source()
    memory = model.encode(src, src_mask)
    cache = KVCache.from_memory(model, memory)
    cross = [lc.cross_k for lc in cache.layers]
    with torch.no_grad():
        for t in range(4):
            decode_step(model, torch.full((3, 1), BOS), src_mask, cache)
            assert all(lc.self_k.shape == (3, 4, t + 1, 8) for lc in cache.layers)
    assert all(lc.cross_k is k for lc, k in zip(cache.layers, cross))  # never recomputed


def test_reorder_follows_parent_rows(model):
    src, src_mask = padded_source()
    cache = KVCache.from_memory(model, model.encode(src, src_mask))
    with torch.no_grad():
        decode_step(model, torch.tensor([[BOS], [4], [5]]), src_mask, cache)
    before = [lc.self_v.clone() for lc in cache.layers]
    index = torch.tensor([2, 2, 0])
    cache.reorder(index)
    for lc, old in zip(cache.layers, before):
        assert torch.equal(lc.self_v, old[index])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_bytes_formula_matches_allocation(dtype):
    model = make_model(V, V, N=3, d_model=48, d_ff=64, h=6).eval().to(dtype)
    src, src_mask = padded_source(batch=2, length=5)
    cache = KVCache.from_memory(model, model.encode(src, src_mask))
    with torch.no_grad():
        for _ in range(6):
            decode_step(model, torch.full((2, 1), BOS), src_mask, cache)
    expected = kv_cache_bytes(batch=2, layers=3, heads=6, head_dim=8, length=6, dtype=dtype, src_len=5)
    assert cache.nbytes() == expected
    # by hand: K and V, 3 layers, (2 x 6 x (6 + 5) x 8) numbers each, at 4 or 2 bytes
    assert expected == 2 * 3 * 2 * 6 * 11 * 8 * (4 if dtype == torch.float32 else 2)


def test_cache_bytes_takes_bytes_per_number():
    assert kv_cache_bytes(1, 2, 4, 8, 10, 2) == kv_cache_bytes(1, 2, 4, 8, 10, torch.float16) == 2 * 2 * 4 * 8 * 10 * 2
    assert kv_cache_bytes(1, 32, 8, 128, 4096, 0.5) == 2 * 32 * 8 * 128 * 4096 // 2  # a 4-bit cache


def test_position_beyond_table_is_a_clear_error():
    model = make_model(V, V, N=1, d_model=16, d_ff=32, h=2, max_len=3).eval()
    src, src_mask = padded_source(batch=1, length=2)
    cache = KVCache.from_memory(model, model.encode(src, src_mask))
    with torch.no_grad(), pytest.raises(ValueError, match="max_len=3"):
        for _ in range(4):
            decode_step(model, torch.full((1, 1), BOS), src_mask, cache)
