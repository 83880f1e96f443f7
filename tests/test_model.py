"""The whole model: the notes' checkpoint format and arithmetic, invariances, gradients, dtypes, sizes."""

import pytest
import torch

from tfm_solution import Batch, Embeddings, make_model, rate, subsequent_mask

from .notes_oracle import notes_forward, notes_shapes

PAD = 2  # the notes' <blank> id


def _batch(src_lengths, tgt_lengths, vocab, src_len=9, tgt_len=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, vocab, (len(src_lengths), src_len), generator=g)
    tgt = torch.randint(1, vocab, (len(tgt_lengths), tgt_len), generator=g)
    for row, n in enumerate(src_lengths):
        src[row, n:] = PAD
    for row, n in enumerate(tgt_lengths):
        tgt[row, n:] = PAD
    return Batch(src, tgt, pad=PAD)


@pytest.mark.fast
def test_state_dict_has_exactly_the_notes_keys_and_shapes():
    model = make_model(13, 17, N=2, d_model=32, d_ff=64, h=4)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == notes_shapes(13, 17, N=2, d_model=32, d_ff=64)


@pytest.mark.fast
def test_outputs_equal_the_notes_arithmetic_with_the_same_weights():
    model = make_model(13, 17, N=2, d_model=32, d_ff=64, h=4).double().eval()
    # A checkpoint written in the notes' format loads unchanged: build one from the oracle's key list.
    g = torch.Generator().manual_seed(3)
    checkpoint = {
        k: (torch.randn(shape, generator=g, dtype=torch.float64) * 0.2 if not k.endswith(".pe") else v)
        for (k, shape), v in zip(notes_shapes(13, 17, 2, 32, 64).items(), model.state_dict().values())
    }
    model.load_state_dict(checkpoint, strict=True)
    b = _batch([9, 5, 2], [8, 6, 3], vocab=13)
    with torch.no_grad():
        out = model(b.src, b.tgt, b.src_mask, b.tgt_mask)
    expected = notes_forward(checkpoint, b.src, b.tgt, b.src_mask, b.tgt_mask, N=2, h=4)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.fast
@pytest.mark.parametrize("position", ["pre", "post"])
@pytest.mark.parametrize("kernel", ["matmul", "sdpa"])
def test_padding_invariance_and_causality(position, kernel):
    vocab = 20
    model = make_model(vocab, vocab, N=2, d_model=32, d_ff=64, h=4, norm_position=position, attention_kernel=kernel)
    model.double().eval()
    b = _batch([9, 6, 3], [7, 7, 4], vocab=vocab)
    with torch.no_grad():
        base = model(b.src, b.tgt, b.src_mask, b.tgt_mask)
        # 1) Different ids under the source padding change nothing (the mask still marks them as padding).
        noisy = b.src.clone()
        noisy[b.src == PAD] = torch.randint(1, vocab, (int((b.src == PAD).sum()),))
        out = model(noisy, b.tgt, b.src_mask, b.tgt_mask)
        torch.testing.assert_close(out, base, rtol=1e-10, atol=1e-10)
        # 2) Changing target token t changes no output before t, and does change position t.
        for t in (1, 4):
            tgt = b.tgt.clone()
            tgt[:, t] = (tgt[:, t] + 1) % vocab
            out = model(b.src, tgt, b.src_mask, Batch.make_std_mask(tgt, PAD))
            torch.testing.assert_close(out[:, :t], base[:, :t], rtol=1e-10, atol=1e-10)
            assert not torch.allclose(out[0, t], base[0, t])


@pytest.mark.fast
@pytest.mark.parametrize("tie", [False, True])
def test_gradients_reach_every_parameter(tie):
    model = make_model(15, 15, N=2, d_model=32, d_ff=64, h=4, tie_embeddings=tie)
    b = _batch([9, 4], [8, 5], vocab=15)
    logp = model.generator(model(b.src, b.tgt, b.src_mask, b.tgt_mask))
    loss = -logp.gather(-1, b.tgt_y.unsqueeze(-1)).squeeze(-1)[b.tgt_y != PAD].mean()
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name


@pytest.mark.fast
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kernel", ["matmul", "sdpa"])
def test_low_precision_forward_with_fully_padded_row_is_finite(dtype, kernel):
    model = make_model(12, 12, N=2, d_model=32, d_ff=64, h=4, attention_kernel=kernel).to(dtype).eval()
    b = _batch([9, 0], [8, 0], vocab=12)  # the second sequence is entirely padding
    with torch.no_grad():
        logp = model.generator(model(b.src, b.tgt, b.src_mask, b.tgt_mask))
    assert logp.dtype == dtype
    assert torch.isfinite(logp).all()


def _paper_count(vocab: int, N: int = 6, d: int = 512, d_ff: int = 2048) -> int:
    """The paper's base model with one shared vocabulary, counted from its description (Post-LN, no final norm)."""
    attention = 4 * (d * d + d)
    ffn = d * d_ff + d_ff + d_ff * d + d
    norm = 2 * d
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    shared_embedding = vocab * d
    generator_bias = vocab
    return N * encoder_layer + N * decoder_layer + shared_embedding + generator_bias


def _n_params(model):
    return sum(p.numel() for p in model.parameters())  # shared tensors count once


@pytest.mark.fast
def test_base_parameter_counts():
    src_vocab, tgt_vocab = 1000, 1200
    model = make_model(src_vocab, tgt_vocab)
    notes = sum(
        torch.Size(s).numel() for k, s in notes_shapes(src_vocab, tgt_vocab, 6, 512, 2048).items() if not k.endswith(".pe")
    )
    assert _n_params(model) == notes
    vocab = 37000  # the paper's shared byte-pair vocabulary for English-German
    tied = make_model(vocab, vocab, norm_position="post", tie_embeddings=True)
    assert _n_params(tied) == _paper_count(vocab) == 63_119_496  # reported as "65 x 10^6" in the paper's Table 3
    assert tied.src_embed[0].lut.weight is tied.tgt_embed[0].lut.weight is tied.generator.proj.weight
    assert set(tied.state_dict()) == set(notes_shapes(vocab, vocab, 6, 512, 2048)) - {"encoder.norm.a_2", "encoder.norm.b_2", "decoder.norm.a_2", "decoder.norm.b_2"}


@pytest.mark.fast
def test_tied_embeddings_need_one_vocabulary():
    with pytest.raises(ValueError, match="shared vocabulary"):
        make_model(10, 11, tie_embeddings=True)


@pytest.mark.fast
def test_embeddings_scale_by_sqrt_d_model():
    emb = Embeddings(16, 7)
    ids = torch.tensor([[0, 3, 6]])
    torch.testing.assert_close(emb(ids), emb.lut.weight[ids] * 4.0)


@pytest.mark.fast
def test_batch_shifts_targets_and_builds_masks():
    src = torch.tensor([[5, 6, 7, 2, 2]])
    tgt = torch.tensor([[1, 8, 9, 2, 2]])
    b = Batch(src, tgt, pad=2)
    assert b.src_mask.tolist() == [[[True, True, True, False, False]]]
    assert b.tgt.tolist() == [[1, 8, 9, 2]] and b.tgt_y.tolist() == [[8, 9, 2, 2]]
    assert int(b.ntokens) == 2
    expected = [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, True, True, False],
    ]
    assert b.tgt_mask.tolist() == [expected]
    assert subsequent_mask(3).tolist() == [[[True, False, False], [True, True, False], [True, True, True]]]
    assert Batch(src).src_mask.shape == (1, 1, 5) and not hasattr(Batch(src), "tgt")
    moved = b.to("cpu")
    assert moved is b and b.tgt_mask.device.type == "cpu"


@pytest.mark.fast
def test_rate_warms_up_linearly_then_decays_as_inverse_sqrt():
    d, warmup, factor = 512, 4000, 1.0
    peak = factor * (d * warmup) ** -0.5
    assert rate(warmup, d, factor, warmup) == pytest.approx(peak)
    assert rate(0, d, factor, warmup) == rate(1, d, factor, warmup)
    assert rate(warmup // 2, d, factor, warmup) == pytest.approx(peak / 2)
    assert rate(4 * warmup, d, factor, warmup) == pytest.approx(peak / 2)
    schedule = [rate(s, d, factor, warmup) for s in range(1, 3 * warmup)]
    assert max(schedule) == pytest.approx(peak)
