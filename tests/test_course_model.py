"""The committed course model: it loads into ``make_model`` with strict keys, its card's BLEU on
the first 100 validation sentences is what it really scores, and cached decoding gives exactly
the uncached tokens on it."""

import json
import os

import pytest
import sacrebleu
import torch
from safetensors.torch import load_file

from tfm_solution import make_model
from tfm_solution.course_model import (COURSE_MODEL_DIR, course_model_config, load_course_model,
                                       load_training_log)
from tfm_solution.data import BOS, EOS, PAD, load_multi30k, multi30k_dir, pad_batch
from tfm_solution.decoding import beam_search, greedy_decode
from tfm_solution.experiment import decode_texts

CARD = json.loads((COURSE_MODEL_DIR / "card.json").read_text())


@pytest.mark.fast
def test_weights_load_into_make_model_with_strict_keys_and_fit_the_budget():
    cfg = course_model_config()
    model = make_model(**cfg["model"])
    saved = load_file(str(COURSE_MODEL_DIR / "model.safetensors"))
    assert all(t.dtype == torch.float16 for t in saved.values())
    expected = set(model.state_dict())
    # safetensors stores a tied matrix once (the name it keeps is among the model's own), and the file
    # holds no sinusoid tables: loading rebuilds them, rounded to float16 like the rest of the export
    assert set(saved) <= expected
    assert expected - set(saved) == {"src_embed.0.lut.weight", "tgt_embed.0.lut.weight", "src_embed.1.pe",
                                     "tgt_embed.1.pe"}
    loaded, tok = load_course_model()
    d, pos = cfg["model"]["d_model"], torch.arange(5000, dtype=torch.float64)[:, None]
    angle = pos * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    table = torch.stack([angle.sin(), angle.cos()], dim=-1).reshape(5000, d)   # sin, cos interleaved
    for embed in (loaded.src_embed, loaded.tgt_embed):
        assert torch.equal(embed[1].pe[0], table.float().half().float())
    assert not loaded.training and loaded.src_embed[0].lut.weight is loaded.generator.proj.weight
    assert sum(p.stat().st_size for p in COURSE_MODEL_DIR.iterdir()) <= 16 * 2**20
    assert tok.src is tok.tgt and [tok.src.token_to_id(t) for t in ("<s>", "</s>", "<blank>", "<unk>")] == [0, 1, 2, 3]


@pytest.mark.fast
def test_the_training_log_has_every_epoch_with_five_sample_translations():
    log = load_training_log()
    assert [e["epoch"] for e in log] == list(range(course_model_config()["run"]["epochs"]))
    assert all(len(e["samples"]) == 5 and all(s["output"] for s in e["samples"]) for e in log)
    assert log[-1]["val_loss"] < log[0]["val_loss"]


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("MULTI30K_DIR"), reason="needs the Multi30k mirror (CI sets MULTI30K_DIR)")
def test_the_cards_validation_bleu_is_what_the_model_scores():
    model, tok = load_course_model()
    val = load_multi30k("val", multi30k_dir())[:100]
    hyps = decode_texts(model, tok, [de for de, _ in val])
    score = sacrebleu.corpus_bleu(hyps, [[en for _, en in val]]).score
    assert score == pytest.approx(CARD["val_first_100_bleu_greedy"], abs=0.05)
    assert [x["output"] for x in CARD["examples"]] == hyps[:10]


@pytest.mark.slow
def test_cached_and_uncached_decoding_give_the_same_tokens_on_it():
    model, tok = load_course_model()
    sentences = ["Ein Mann fährt Fahrrad auf einer Straße.", "Zwei Hunde spielen im Schnee.",
                 "Eine Frau mit einem roten Hut liest ein Buch.", "Kinder."]
    src = pad_batch([tok.encode_src(s) for s in sentences])
    src_mask = (src != PAD).unsqueeze(-2)
    cached = greedy_decode(model, src, src_mask, 40, BOS, EOS, PAD, use_cache=True)
    uncached = greedy_decode(model, src, src_mask, 40, BOS, EOS, PAD, use_cache=False)
    assert torch.equal(cached, uncached)
    beams_c = beam_search(model, src, src_mask, 40, BOS, EOS, beam_size=3, use_cache=True)
    beams_u = beam_search(model, src, src_mask, 40, BOS, EOS, beam_size=3, use_cache=False)
    assert [[h.tokens for h in b] for b in beams_c] == [[h.tokens for h in b] for b in beams_u]
