"""The fast paths (tfm_solution.fast) against the chapters' model as the oracle: the same tokens for
greedy search, beam search and seeded sampling, log-probabilities and training losses and gradients
within float tolerance, on random small models of every flavour and on the course model; the fused
LayerNorm against the chapters' LayerNorm, nn.LayerNorm and a float64 gradient check; the engine's
kernels against float64 products (packed float32 to float tolerance, int8 within its rounding bound)
and the int8 engine's translations against float32's."""

import copy
import json
from pathlib import Path

import pytest
import sacrebleu
import torch
from torch import nn

import tfm_solution
from tfm_solution import make_model
from tfm_solution.course_model import load_course_model
from tfm_solution.data import BOS, EOS, PAD, pad_batch
from tfm_solution.decoding import IncrementalDecoder, beam_search, greedy_decode, sample
from tfm_solution.fast import FastTraining, InferenceEngine, NotesLayerNormFunction, fast_forward, layer_norm
from tfm_solution.fast.linear import MKL_PACKING, DenseLinear, Int8Linear
from tfm_solution.kv_cache import kv_cache_bytes
from tfm_solution.masks import Batch
from tfm_solution.norm import LayerNorm
from tfm_solution.training import LabelSmoothing, SimpleLossCompute, run_epoch

pytestmark = pytest.mark.fast

V = 17
FLAVOURS = [  # (attention kernel, norm position, LayerNorm kind, tied embeddings)
    ("matmul", "pre", "notes", False), ("sdpa", "pre", "notes", True),
    ("sdpa", "post", "torch", False), ("matmul", "post", "notes", False), ("sdpa", "pre", "torch", False),
]


def small_model(kernel="sdpa", norm="pre", ln="notes", tie=False, dropout=0.1, seed=0):
    torch.manual_seed(seed)
    model = make_model(V, V, N=2, d_model=32, d_ff=64, h=4, dropout=dropout, attention_kernel=kernel,
                       norm_position=norm, layer_norm=ln, tie_embeddings=tie)
    with torch.no_grad():  # the LayerNorms' gains and shifts are not 1 and 0 in a trained model
        for module in model.modules():
            if isinstance(module, LayerNorm):
                module.a_2.uniform_(0.5, 1.5)
                module.b_2.uniform_(-0.5, 0.5)
    return model.eval()


@pytest.fixture(params=FLAVOURS, ids=["-".join(map(str, f)) for f in FLAVOURS])
def model(request):
    return small_model(*request.param)


def padded_source(seed=1):
    """Four sources of true lengths 9, 6, 2 and 0 (a row that is all padding)."""
    src = torch.randint(4, V, (4, 9), generator=torch.Generator().manual_seed(seed))
    for row, keep in enumerate([9, 6, 2, 0]):
        src[row, keep:] = PAD
    return src, (src != PAD).unsqueeze(-2)


def end_symbol_inside(ys: torch.Tensor) -> int:
    """A token that the first row produces in the middle of its output: decoding with it as the end
    symbol stops that row early, and the others (maybe) at other steps or never."""
    return int(ys[0, ys.size(1) // 2])


# --- decoding: the same tokens, the same numbers -----------------------------------------------


def test_step_log_probs_match_the_chapters_cached_decoder(model):
    src, src_mask = padded_source()
    engine = InferenceEngine(model)
    state = engine.start(src, src_mask, 14)
    chapters = IncrementalDecoder(model, src, src_mask, use_cache=True)
    ys = torch.full((4, 1), BOS)
    with torch.no_grad():
        for _ in range(14):
            expected = chapters.step(ys)
            got = engine.step(state, ys[:, -1])
            assert not got.isnan().any()
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
            ys = torch.cat([ys, expected.argmax(-1, keepdim=True)], dim=1)
    assert state.cache.length == 14


def test_greedy_gives_the_chapters_tokens(model):
    src, src_mask = padded_source()
    expected = greedy_decode(model, src, src_mask, 16, BOS, None, PAD)
    assert torch.equal(InferenceEngine(model).greedy_decode(src, src_mask, 16, BOS, None, PAD), expected)
    end = end_symbol_inside(expected)
    stopped = greedy_decode(model, src, src_mask, 16, BOS, end, PAD)
    assert stopped.size(1) < 16 or (stopped == PAD).any()  # the end symbol did stop something
    assert torch.equal(InferenceEngine(model).greedy_decode(src, src_mask, 16, BOS, end, PAD), stopped)


def test_sampling_with_a_seed_gives_the_chapters_tokens(model):
    src, src_mask = padded_source()
    settings = dict(temperature=1.3, top_k=8, top_p=0.95)
    expected = sample(model, src, src_mask, 16, BOS, None, PAD, True, generator=torch.Generator().manual_seed(3),
                      **settings)
    got = InferenceEngine(model).sample(src, src_mask, 16, BOS, None, PAD,
                                        generator=torch.Generator().manual_seed(3), **settings)
    assert torch.equal(got, expected)
    assert len(set(expected[0].tolist())) > 3  # the draws vary: a real test of the random stream


def test_beam_search_gives_the_chapters_hypotheses(model):
    src, src_mask = padded_source()
    end = end_symbol_inside(greedy_decode(model, src, src_mask, 12, BOS, None, PAD))
    expected = beam_search(model, src, src_mask, 12, BOS, end, beam_size=4, alpha=0.6, n_best=3)
    got = InferenceEngine(model).beam_search(src, src_mask, 12, BOS, end, beam_size=4, alpha=0.6, n_best=3)
    assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in expected]
    for hyps, ref in zip(got, expected):
        for h, r in zip(hyps, ref):
            assert h.log_prob == pytest.approx(r.log_prob, abs=1e-4)
            assert h.score == pytest.approx(r.score, abs=1e-4)


def test_fixed_shape_steps_give_the_same_numbers():
    model = small_model()
    src, src_mask = padded_source()
    dynamic, fixed = InferenceEngine(model), InferenceEngine(model, fixed_shape=True)
    fixed.cache_len = 20  # more positions than needed: the unused ones must stay invisible
    a, b = dynamic.start(src, src_mask, 10), fixed.start(src, src_mask, 10)
    assert b.cache.kv.size(4) == 20
    token = torch.full((4,), BOS)
    for _ in range(10):
        expected = dynamic.step(a, token)
        torch.testing.assert_close(fixed.step(b, token), expected, atol=1e-6, rtol=1e-6)
        token = expected.argmax(-1)
    end = 5
    assert fixed.beam_search(src, src_mask, 10, BOS, end)[1][0].tokens == \
        beam_search(model, src, src_mask, 10, BOS, end)[1][0].tokens


def test_the_step_compiles_to_one_graph_for_every_length():
    """torch.compile with a backend that only records the graph (no code generation: seconds)."""
    torch._dynamo.reset()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model = small_model()
    src, src_mask = padded_source()
    engine = InferenceEngine(model)
    engine.compile(cache_len=12, backend=record, fullgraph=True)  # fullgraph: no break anywhere
    for max_len in (9, 12):
        assert torch.equal(engine.greedy_decode(src, src_mask, max_len, BOS, None, PAD),
                           greedy_decode(model, src, src_mask, max_len, BOS, None, PAD))
    assert len(graphs) == 1  # one compilation served both lengths
    torch._dynamo.reset()


def test_beams_wider_than_the_possible_outputs_return_each_output_once():
    model = small_model()
    src, src_mask = padded_source()
    expected = beam_search(model, src, src_mask, 2, BOS, EOS, beam_size=V + 3, n_best=V + 3)
    got = InferenceEngine(model).beam_search(src, src_mask, 2, BOS, EOS, beam_size=V + 3, n_best=V + 3)
    assert [len(h) for h in got] == [len(h) for h in expected] == [V] * 4  # one token: V outputs, not V + 3
    assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in expected]


def test_bfloat16_weights_stay_close_to_float32():
    model = small_model()
    src, src_mask = padded_source()
    engine = InferenceEngine(model, torch.bfloat16)
    state = engine.start(src, src_mask, 4)
    assert engine.weights().layers[0].qkv.weight_t.dtype == torch.bfloat16
    expected = IncrementalDecoder(model, src, src_mask, True).step(torch.full((4, 1), BOS))
    got = engine.step(state, torch.full((4,), BOS))
    assert got.dtype == torch.float32
    assert (got.exp() - expected.exp()).abs().max() < 0.02  # probabilities, to bfloat16's 3 digits


def test_the_course_model_decodes_to_the_same_tokens():
    model, tok = load_course_model()
    sentences = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball im Park.", "Eine Frau liest."]
    ids = [tok.encode_src(s) for s in sentences]
    src = torch.full((3, max(map(len, ids))), PAD)
    for row, seq in enumerate(ids):
        src[row, : len(seq)] = torch.tensor(seq)
    src_mask = (src != PAD).unsqueeze(-2)
    engine = InferenceEngine(model)
    expected = greedy_decode(model, src, src_mask, 40, BOS, EOS, PAD)
    assert (expected == EOS).any(dim=1).all()  # real translations that end
    assert torch.equal(engine.greedy_decode(src, src_mask, 40, BOS, EOS, PAD), expected)
    beams = beam_search(model, src, src_mask, 40, BOS, EOS, beam_size=4, n_best=2)
    assert [[h.tokens for h in b] for b in engine.beam_search(src, src_mask, 40, BOS, EOS, beam_size=4, n_best=2)] \
        == [[h.tokens for h in b] for b in beams]
    drawn = sample(model, src, src_mask, 40, BOS, EOS, PAD, True, 0.9, generator=torch.Generator().manual_seed(7))
    assert torch.equal(engine.sample(src, src_mask, 40, BOS, EOS, PAD, 0.9, generator=torch.Generator().manual_seed(7)),
                       drawn)


def test_changed_parameters_rebuild_the_engine_weights():
    model, other = small_model(seed=0), small_model(seed=1)
    src, src_mask = padded_source()
    engine = InferenceEngine(model)
    before = engine.greedy_decode(src, src_mask, 12, BOS, None, PAD)
    model.load_state_dict(other.state_dict())  # in place: same tensors, new values
    after = engine.greedy_decode(src, src_mask, 12, BOS, None, PAD)
    assert torch.equal(after, greedy_decode(other, src, src_mask, 12, BOS, None, PAD))
    assert not torch.equal(after, before)
    with torch.no_grad():  # an optimizer-style in-place update of one weight
        model.generator.proj.weight.add_(torch.randn_like(model.generator.proj.weight))
    assert torch.equal(engine.greedy_decode(src, src_mask, 12, BOS, None, PAD),
                       greedy_decode(model, src, src_mask, 12, BOS, None, PAD))
    with torch.no_grad():
        model.generator.proj.weight.data.mul_(-1)  # bypasses the version counter: needs invalidate()
    engine.invalidate()
    assert torch.equal(engine.greedy_decode(src, src_mask, 12, BOS, None, PAD),
                       greedy_decode(model, src, src_mask, 12, BOS, None, PAD))


def test_the_engine_reads_the_model_without_changing_it():
    model = small_model()
    keys = {k: v.clone() for k, v in model.state_dict().items()}
    InferenceEngine(model).beam_search(*padded_source(), 8, BOS, EOS)
    assert model.state_dict().keys() == keys.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in keys.items())


def test_static_cache_holds_what_the_notes_formula_counts():
    model = small_model()
    src, src_mask = padded_source()
    state = InferenceEngine(model).start(src, src_mask, 11)
    assert state.cache.kv.shape == (2, 2, 4, 4, 11, 8)  # layers, K/V, batch, heads, max_len, d_k
    assert state.cache.nbytes() == kv_cache_bytes(4, 2, 4, 8, 11, torch.float32)


def test_engine_refuses_what_it_cannot_do():
    model = small_model()
    src, src_mask = padded_source()
    engine = InferenceEngine(model)
    with pytest.raises(ValueError, match="max_len"):
        engine.greedy_decode(src, src_mask, 0, BOS)
    with pytest.raises(ValueError, match="src_mask"):
        engine.greedy_decode(src, src_mask[:, 0], 5, BOS)
    with pytest.raises(ValueError, match="positional table"):
        engine.start(src, src_mask, 5001)
    state = engine.start(src, src_mask, 1)
    engine.step(state, torch.full((4,), BOS))
    with pytest.raises(ValueError, match="positions"):
        engine.step(state, torch.full((4,), BOS))
    with pytest.raises(ValueError, match="beam_size"):
        engine.beam_search(src, src_mask, 5, BOS, EOS, beam_size=2, n_best=3)
    with pytest.raises(ValueError, match="alpha"):
        engine.beam_search(src, src_mask, 5, BOS, EOS, alpha=-1)
    with pytest.raises(ValueError, match="eval"):
        InferenceEngine(model.train()).greedy_decode(src, src_mask, 5, BOS)
    assert torch.equal(InferenceEngine(model.eval()).greedy_decode(src, src_mask, 1, BOS), torch.full((4, 1), BOS))


# --- training: the same loss and gradients, into the model's own parameters -----------------------


def _loss_and_grads(model, forward, batch, seed=5):
    """Forward in train mode (dropout on) from a fixed seed, label-smoothed loss, backward."""
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    criterion = LabelSmoothing(model.generator.proj.out_features, PAD, 0.1)
    out = forward(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
    log_probs = model.generator(out)
    loss = criterion(log_probs.reshape(-1, log_probs.size(-1)), batch.tgt_y.reshape(-1)) / batch.ntokens
    loss.backward()
    return out.detach(), loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def _training_batch(vocab, seed=2):
    g = torch.Generator().manual_seed(seed)
    src, tgt = torch.randint(4, vocab, (3, 8), generator=g), torch.randint(4, vocab, (3, 7), generator=g)
    src[1, 5:], src[2, 2:], tgt[2, 4:] = PAD, PAD, PAD
    return Batch(src, tgt, pad=PAD)


def test_fast_forward_gives_the_same_loss_and_gradients_with_dropout(model):
    model.train()
    batch = _training_batch(V)
    out, loss, grads = _loss_and_grads(model, model, batch)
    fast_out, fast_loss, fast_grads = _loss_and_grads(model, FastTraining(model), batch)
    # Dropout draws the same units only if the fast pass asks for the same shapes in the same order.
    torch.testing.assert_close(fast_out, out, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(fast_loss, loss, atol=1e-6, rtol=1e-5)
    assert grads.keys() == fast_grads.keys() and all(g is not None for g in fast_grads.values())
    for name in grads:
        torch.testing.assert_close(fast_grads[name], grads[name], atol=2e-5, rtol=1e-4, msg=name)
    _, other_loss, _ = _loss_and_grads(model, model, batch, seed=6)
    assert not torch.allclose(other_loss, loss)  # dropout is really on: another seed, another loss


def test_the_course_model_trains_the_same_through_the_fast_forward():
    model, _ = load_course_model()
    model.train()
    batch = _training_batch(model.generator.proj.out_features)
    _, loss, grads = _loss_and_grads(model, model, batch)
    _, fast_loss, fast_grads = _loss_and_grads(model, lambda *a: fast_forward(model, *a), batch)
    torch.testing.assert_close(fast_loss, loss, atol=1e-5, rtol=1e-5)
    for name in grads:
        torch.testing.assert_close(fast_grads[name], grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_fast_forward_under_bfloat16_autocast_matches_the_chapters():
    """Autocast (the GPU training recipe) runs the products in bfloat16: the masks must follow."""
    model = small_model()
    batch = _training_batch(V)
    args = (batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
    with torch.no_grad():
        full = model(*args)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected, got = model(*args), fast_forward(model, *args)
    assert (expected - full).abs().max() > 1e-3  # bfloat16 really was used
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-3)


def test_run_epoch_trains_the_model_through_fast_training():
    chapters, fast = small_model(), small_model()
    batches = [_training_batch(V, seed) for seed in range(3)]
    results = []
    for model, wrapped in ((chapters, chapters), (fast, FastTraining(fast))):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        compute = SimpleLossCompute(model.generator, LabelSmoothing(V, PAD, 0.1))
        torch.manual_seed(9)
        wrapped.train()
        results.append(run_epoch(batches, wrapped, compute, optimizer, scheduler, accum_iter=2)[0])
    assert results[1] == pytest.approx(results[0], rel=1e-5)
    assert fast.state_dict().keys() == chapters.state_dict().keys()
    for (name, p), q in zip(chapters.named_parameters(), fast.parameters()):
        torch.testing.assert_close(q, p, atol=1e-5, rtol=1e-5, msg=name)
    assert not torch.equal(fast.generator.proj.weight, small_model().generator.proj.weight)  # it did train


# --- the fused LayerNorm ---------------------------------------------------------------------------


def _layer_norms(kind, dtype=torch.float64):
    norm = LayerNorm(24, kind=kind).to(dtype)
    with torch.no_grad():
        norm.a_2.uniform_(0.5, 1.5)
        norm.b_2.uniform_(-1, 1)
    return norm


@pytest.mark.parametrize("kind", ["notes", "torch"])
def test_layer_norm_matches_the_chapters_layer_norm(kind):
    norm = _layer_norms(kind)
    x = torch.randn(3, 5, 24, dtype=torch.float64) * 3 + 1
    with torch.no_grad():
        torch.testing.assert_close(layer_norm(x, norm), norm(x), atol=1e-12, rtol=1e-12)
    x.requires_grad_(True)
    g = torch.randn(3, 5, 24, dtype=torch.float64)
    expected = torch.autograd.grad(norm(x), (x, norm.a_2, norm.b_2), g)
    got = torch.autograd.grad(layer_norm(x, norm), (x, norm.a_2, norm.b_2), g)
    for e, o in zip(expected, got):
        torch.testing.assert_close(o, e, atol=1e-12, rtol=1e-10)


def test_notes_layer_norm_is_not_torch_layer_norm():
    """An oracle outside the chapter: with eps = 0 the notes' flavour is nn.LayerNorm scaled by
    sqrt((d - 1) / d) (unbiased std); with its eps it is not, and a constant row gives b_2."""
    norm = _layer_norms("notes")
    x = torch.randn(6, 24, dtype=torch.float64)
    reference = nn.LayerNorm(24, eps=0.0, elementwise_affine=False).double()
    with torch.no_grad():
        norm.eps = 0.0
        expected = norm.a_2 * reference(x) * ((24 - 1) / 24) ** 0.5 + norm.b_2
        torch.testing.assert_close(layer_norm(x, norm), expected, atol=1e-12, rtol=1e-12)
        norm.eps = 1e-6
        assert not torch.allclose(layer_norm(x * 1e-6, norm), norm.a_2 * reference(x) * (23 / 24) ** 0.5 + norm.b_2)
        torch.testing.assert_close(layer_norm(x * 1e-6, norm), norm(x * 1e-6), atol=1e-12, rtol=1e-10)
        constant = torch.full((2, 24), 3.25, dtype=torch.float64)
        torch.testing.assert_close(layer_norm(constant, norm), norm.b_2.expand(2, 24), atol=0, rtol=0)


def test_notes_layer_norm_backward_passes_gradcheck():
    norm = _layer_norms("notes")
    x = torch.randn(4, 24, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, a, b: NotesLayerNormFunction.apply(x, a, b, 1e-6),
                                    (x, norm.a_2, norm.b_2))


# --- the engine's kernels: MKL-packed float32 and dynamic int8 --------------------------------------


def test_packed_products_match_float64_and_pack_only_what_pays():
    torch.manual_seed(0)
    big, small = torch.randn(1536, 512), torch.randn(64, 32)  # packs into ~3.4x its bytes; into ~1000x
    for weight, packs in ((big, True), (small, False)):
        bias = torch.randn(weight.size(0))
        lin = DenseLinear(weight, bias, torch.float32)
        for rows in (1, 5, 8):
            lin.prepare(rows)
            x = torch.randn(rows, weight.size(1))
            expected = (x.double() @ weight.double().t() + bias.double()).float()
            torch.testing.assert_close(lin(x), expected, atol=1e-4, rtol=1e-5)
            if MKL_PACKING:
                assert (lin.packed is not None) == (packs and rows > 1), (weight.shape, rows)
        lin.prepare(5)
        x = torch.randn(3, weight.size(1))  # another row count than prepared: still right, unpacked
        torch.testing.assert_close(lin(x), (x.double() @ weight.double().t() + bias.double()).float(),
                                   atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("reduce_range", [True, False])
def test_int8_products_stay_within_the_rounding_bound(reduce_range):
    """Each weight is off by at most half its row's step and each input by half the input's step,
    so |y - y_exact| <= sum_k |x_k| dw_j + |W_jk| dx + dx dw_j. Rows whose scales differ by 1000x
    make a per-tensor weight scale break the bound."""
    torch.manual_seed(1)
    weight = torch.randn(96, 80) * torch.logspace(-3, 0, 96).unsqueeze(1)
    bias, x = torch.randn(96), torch.randn(7, 80) * 2
    lin = Int8Linear(weight, bias, reduce_range)
    got = lin(x).double()
    exact = x.double() @ weight.double().t() + bias.double()
    dw = (weight.abs().amax(1) / 127 / 2).double()  # (out,)
    levels = 127 if reduce_range else 255
    dx = float((x.max().clamp_min(0) - x.min().clamp_max(0)) / levels / 2)
    bound = x.double().abs().sum(1, keepdim=True) * dw + dx * weight.double().abs().sum(1) + 80 * dx * dw
    assert ((got - exact).abs() <= bound + 1e-5).all()
    assert (got - exact).abs().max() > 1e-4  # it really is int8: float32 would be ~1e-6 off
    small_rows = (got - exact)[:, :10].abs().max()
    assert small_rows < 0.01  # the rows of small weights keep their own fine scale


def test_packed_batches_give_the_chapters_tokens():
    """A model with base-size matrices, so that the step's products really are MKL-packed."""
    torch.manual_seed(3)
    model = make_model(1100, 1100, N=1, d_model=512, d_ff=2048, h=8, dropout=0.0, attention_kernel="sdpa").eval()
    src = torch.randint(4, 1100, (4, 7), generator=torch.Generator().manual_seed(4))
    src_mask = (src != PAD).unsqueeze(-2)
    engine = InferenceEngine(model)
    assert torch.equal(engine.greedy_decode(src, src_mask, 9, BOS, None, PAD), greedy_decode(model, src, src_mask, 9,
                                                                                            BOS, None, PAD))
    if MKL_PACKING:
        assert engine.weights().layers[0].qkv.packed is not None and engine.weights().layers[0].w_1.packed is not None
    beams = beam_search(model, src[:2], src_mask[:2], 6, BOS, EOS, beam_size=3, n_best=2)  # 6 rows: packed again
    assert [[h.tokens for h in b] for b in engine.beam_search(src[:2], src_mask[:2], 6, BOS, EOS, beam_size=3,
                                                              n_best=2)] == [[h.tokens for h in b] for b in beams]
    unpacked = InferenceEngine(model, prepack=False)
    assert torch.equal(unpacked.greedy_decode(src, src_mask, 9, BOS, None, PAD),
                       engine.greedy_decode(src, src_mask, 9, BOS, None, PAD))
    assert unpacked.weights().layers[0].qkv.packed is None


def _course_val_set():
    """The 40 validation pairs chapter 10 ships (no dataset needed) as a padded batch."""
    path = Path(tfm_solution.__file__).parent / "assets" / "decoding_quality.json"
    pairs = json.loads(path.read_text())["val_pairs"]
    model, tok = load_course_model()
    src = pad_batch([tok.encode_src(s) for s, _ in pairs])
    return model, tok, src, (src != PAD).unsqueeze(-2), [r for _, r in pairs]


def _outputs(rows):
    out = []
    for row in rows:
        row = row[1:]
        out.append(row[: row.index(EOS)] if EOS in row else row)
    return out


def _agreement(a, b):
    return sum(sum(x == y for x, y in zip(s, t)) for s, t in zip(a, b)) / sum(max(len(s), len(t)) for s, t in zip(a, b))


def test_int8_engine_keeps_the_course_model_translations():
    """Greedy and beam 4 on 40 validation sentences: most tokens as float32's, BLEU within a point
    (on the 1,000 sentences of test_2016 the gap is within 0.3: benchmarks/int8_quality.py)."""
    model, tok, src, src_mask, refs = _course_val_set()
    fp32, int8 = InferenceEngine(model), InferenceEngine(model, int8=True)
    n = src.size(1) + 40
    assert int8.nbytes() < fp32.nbytes() / 3.5  # a byte a weight, against four
    for decode in (lambda e: e.greedy_decode(src, src_mask, n, BOS, EOS, PAD).tolist(),
                   lambda e: [h[0].tokens for h in e.beam_search(src, src_mask, n, BOS, EOS, beam_size=4)]):
        a, b = _outputs(decode(fp32)), _outputs(decode(int8))
        assert a != b  # int8 really changes numbers (or this test would prove nothing)
        assert _agreement(a, b) > 0.85
        bleu = [sacrebleu.corpus_bleu([tok.decode_tgt(ids) for ids in out], [refs]).score for out in (a, b)]
        assert abs(bleu[1] - bleu[0]) < 1.0, bleu
        assert bleu[0] > 25  # and the float32 side is the course model translating, not noise
    drawn = int8.sample(src[:4], src_mask[:4], 20, BOS, EOS, PAD, generator=torch.Generator().manual_seed(5))
    assert torch.equal(drawn, int8.sample(src[:4], src_mask[:4], 20, BOS, EOS, PAD,
                                          generator=torch.Generator().manual_seed(5)))


def test_int8_engine_refuses_what_it_cannot_do():
    model = small_model()
    with pytest.raises(ValueError, match="float32"):
        InferenceEngine(model, torch.bfloat16, int8=True)
    with pytest.raises(ValueError, match="compile"):
        InferenceEngine(model, int8=True).compile()
    with pytest.raises(ValueError, match="CPU"):
        InferenceEngine(copy.deepcopy(model).to("meta"), int8=True)


def test_translate_int8_on_the_command_line(capsys):
    from tfm_solution.cli import main
    from tfm_solution.course_model import COURSE_MODEL_DIR

    assert main(["translate", "--int8", str(COURSE_MODEL_DIR), "Ein Hund läuft über die Wiese."]) == 0
    assert "dog" in capsys.readouterr().out
    assert main(["translate", "--int8", "--no-cache", str(COURSE_MODEL_DIR), "Ein Hund."]) == 2
    assert "--no-cache" in capsys.readouterr().err
