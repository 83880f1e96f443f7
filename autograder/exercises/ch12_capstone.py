"""Chapter 12 grading: the student's own Transformer, trained (Part A) and translating (Part B).

Both exercises are graded on the student's whole course: their answers of chapters 1-11 (found in
the submitted chapter notebooks, ``autograder.course_code``) and the capstone notebook's own code.
``autograder.capstone.CapstoneRun`` runs them (``Exercise.runner``); it is an ``ExerciseRun`` that
gathers that code, lifts the worker's limits to a training run, diagnoses a model that does not
learn (``COMPONENTS``), and brings Part B its weights and sentences. The cases here say what is
judged, in bands (``Case.judge``): no reference is computed, the bands are the verdict.

Part A: ``tfm_solution.capstone.train_reversal`` on ``TASK`` (the model, the data and the budget
are the course's; every line of the model, the loss, the schedule and the loop is the student's),
then held-out sequences decoded with the student's greedy decoders. Part B: the student's weights,
trained on Multi30k, loaded into their model and decoded with the course's beam-search loop over
their model, their causal mask and their ``beam_step``; sacreBLEU on the configured test split.
"""

from __future__ import annotations

import functools
import os

from autograder.exercises.shared import Case, Exercise, dim, generators

CHAPTER, NOTEBOOK = "12_capstone", "capstone.ipynb"

TASK = {"module": "ReversalTask", "symbols": 10, "min_len": 4, "max_len": 10, "layers": 2, "d_model": 32, "d_ff": 64,
        "heads": 4, "dropout": 0.0, "steps": 400, "batch_size": 32, "accum_iter": 2, "factor": 1.0, "warmup": 100,
        "smoothing": 0.0, "chunks": 20, "held_out": 500, "seed": 0, "cpu_budget_s": 90.0}
"""Part A's task and budget (``tfm_solution.capstone.ReversalTask``), built on both sides from this description."""

ACCURACY_BANDS = (0.5, 0.8, 0.95)
"""Part A: a case per band of held-out exact match; full marks from 95%."""

PUBLIC_EVAL_SEED = 1
"""The held-out sequences of the public case (the cached decoder's agreement); the bands use fresh ones."""

TRANSLATION = {"module": "TranslationTask", "src_vocab": 5000, "tgt_vocab": 5000, "layers": 3, "d_model": 128,
               "d_ff": 512, "heads": 4, "dropout": 0.1, "beam_size": 4, "alpha": 0.6, "max_extra": 50,
               "batch_size": 64}
"""Part B: the course model's size and the decoding of its model card (``tfm_solution.capstone.TranslationTask``)."""

BLEU_BANDS = (15.0, 22.0, 28.0)
"""Part B: a case per band of sacreBLEU on the configured test split (the course model scores 33 on test_2016)."""

SPLIT_ENV, SENTENCES_ENV = "AUTOGRADER_CAPSTONE_SPLIT", "AUTOGRADER_CAPSTONE_SENTENCES"


def translation_split() -> tuple[str, int | None]:
    """The instructor's choice for Part B: a Multi30k split (``test``: test_2016 flickr, the default; or
    ``val``) and how many of its sentences, from the start (default all), from the environment."""
    count = os.environ.get(SENTENCES_ENV)
    return os.environ.get(SPLIT_ENV, "test"), int(count) if count else None


def _judge(kind: str, threshold: float, seed: int, got):
    """The verdicts live with the harness (``autograder.capstone.JUDGES``), imported when a case is judged:
    ``kind`` of verdict, its band, the case's seed (Part A's held-out sequences, Part B's shown sentences)."""
    from autograder.capstone import JUDGES

    return JUDGES[kind](threshold, seed, got)


def reversal_cases(seed: int) -> list[Case]:
    """Part A: one training run of the student's model, judged by cached/uncached agreement (public held-out
    sequences) and by the exact match on fresh held-out sequences, in bands."""
    _, gen = generators(seed)
    hidden = dim(gen, 2, 2**30)
    cases = [Case("your cached decoder agrees with your uncached one",
                  "your `greedy_decode_cached` (chapter 11) gives exactly the tokens of your `greedy_decode` (chapter "
                  "10) on 500 held-out sequences, with the model you trained (public)", True,
                  (TASK, PUBLIC_EVAL_SEED), driver="reversal",
                  judge=functools.partial(_judge, "agreement", 1.0, PUBLIC_EVAL_SEED))]
    for band in ACCURACY_BANDS:
        cases.append(Case(f"exact match at least {band:.0%}",
                          f"your model, trained by your loop for at most {TASK['steps']} steps, reverses at least "
                          f"{band:.0%} of 500 fresh held-out sequences exactly (your greedy decoding)", False,
                          (TASK, hidden), driver="reversal", judge=functools.partial(_judge, "accuracy", band, hidden)))
    return cases


def translation_cases(seed: int) -> list[Case]:
    """Part B: the submitted weights in the student's model, decoded with beams; the harness adds the weights
    and the sentences (``CapstoneRun``). Hidden cases show three of the student's translations, drawn per
    submission."""
    _, gen = generators(seed)
    shown = dim(gen, 0, 2**30)
    cases = [Case("your weights load into your model and it translates",
                  "the weights file you exported loads into your model (your make_model at the course model's size) "
                  "and your model, with your beam_step, translates the test sentences (public)", True,
                  (TRANSLATION,), driver="translation", judge=functools.partial(_judge, "translates", 0.0, 0))]
    for band in BLEU_BANDS:
        cases.append(Case(f"BLEU at least {band:g}", f"sacreBLEU of your translations of the test split is at least "
                          f"{band:g}", False, (TRANSLATION,), driver="translation",
                          judge=functools.partial(_judge, "bleu", band, shown)))
    return cases


# ----------------------------------------------------------------------------- the diagnosis

COMPONENTS: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...], str], ...] = (
    ("masks", "chapter 4's `subsequent_mask` and `Batch`", ("subsequent_mask", "Batch"),
     ("tfm_solution.masks:subsequent_mask", "tfm_solution.masks:Batch"),
     "look at the masks your `Batch` builds: every target position must see itself and the positions before it "
     "(and no padding), and `tgt`/`tgt_y` must be the target shifted by one"),
    ("attention", "chapter 3's `attention`", ("attention",),
     ("tfm_solution.attention:mask_fill_value", "tfm_solution.attention:attention"),
     "look at your `attention`: the weights must come from the scaled scores with the mask applied, and the "
     "output must stay connected to them (no `.detach()`, no `torch.no_grad()`), or the queries and keys never learn"),
    ("multi-head attention", "chapter 5's `MultiHeadedAttention`, `split_heads` and `merge_heads`",
     ("split_heads", "merge_heads", "MultiHeadedAttention"),
     ("tfm_solution.attention:mask_fill_value", "tfm_solution.attention:attention", "tfm_solution.cloning:clones",
      "tfm_solution.multihead:split_heads", "tfm_solution.multihead:merge_heads",
      "tfm_solution.multihead:MultiHeadedAttention"),
     "look at your `MultiHeadedAttention`: each of query, key and value has its own projection, the heads are split "
     "and merged back in the same order, and gradients reach every projection"),
    ("feed-forward", "chapter 6's `PositionwiseFeedForward`", ("PositionwiseFeedForward",),
     ("tfm_solution.feed_forward:PositionwiseFeedForward",),
     "look at your `PositionwiseFeedForward`: w_2(dropout(relu(w_1(x)))), with gradients reaching both layers"),
    ("LayerNorm", "chapter 7's `LayerNorm`", ("LayerNorm",), ("tfm_solution.norm:LayerNorm",),
     "look at your `LayerNorm`: it normalizes each token over its features and its gain and bias are learned"),
    ("SublayerConnection", "chapter 7's `SublayerConnection`", ("SublayerConnection",),
     ("tfm_solution.norm:LayerNorm", "tfm_solution.norm:SublayerConnection"),
     "look at your `SublayerConnection`: x + dropout(sublayer(norm(x))), with the sublayer's output (and its "
     "gradient) reaching the residual sum"),
    ("encoder and decoder layers", "chapter 8's `EncoderLayer`, `DecoderLayer` and `Decoder`",
     ("EncoderLayer", "DecoderLayer", "Decoder"),
     ("tfm_solution.norm:LayerNorm", "tfm_solution.norm:SublayerConnection", "tfm_solution.cloning:clones",
      "tfm_solution.encoder_decoder:EncoderLayer", "tfm_solution.encoder_decoder:DecoderLayer",
      "tfm_solution.encoder_decoder:_final_norm", "tfm_solution.encoder_decoder:Decoder"),
     "look at your layers: the decoder's cross-attention takes its queries from the decoder and its keys and values "
     "from the encoder's memory, with the source mask; each sublayer gets the right mask"),
    ("embeddings", "chapter 1's `Embeddings`", ("Embeddings",), ("tfm_solution.embeddings:Embeddings",),
     "look at your `Embeddings`: one learned row per id, scaled by sqrt(d_model)"),
    ("positional encoding", "chapter 2's `PositionalEncoding` and `positional_encoding`",
     ("positional_encoding", "PositionalEncoding"),
     ("tfm_solution.positional_encoding:_check_even", "tfm_solution.positional_encoding:pair_frequencies",
      "tfm_solution.positional_encoding:positional_encoding", "tfm_solution.positional_encoding:PositionalEncoding"),
     "look at your `PositionalEncoding`: every position of every batch, in training as in evaluation, gets its own "
     "row of the table added; reversing a sequence is impossible without knowing where each symbol is"),
    ("glue", "this chapter's `clones`, `Encoder`, `Generator` and `EncoderDecoder`",
     ("clones", "Encoder", "Generator", "EncoderDecoder"),
     ("tfm_solution.norm:LayerNorm", "tfm_solution.cloning:clones", "tfm_solution.encoder_decoder:_final_norm",
      "tfm_solution.encoder_decoder:Encoder", "tfm_solution.encoder_decoder:Generator",
      "tfm_solution.encoder_decoder:EncoderDecoder"),
     "look at this chapter's glue: `clones` makes independent deep copies, the generator returns log-probabilities, "
     "and `EncoderDecoder` encodes the source once and decodes the target against that memory"),
    ("make_model", "chapter 8's `make_model`", ("make_model",), (
        "tfm_solution.attention:mask_fill_value", "tfm_solution.attention:attention", "tfm_solution.cloning:clones",
        "tfm_solution.multihead:split_heads", "tfm_solution.multihead:merge_heads",
        "tfm_solution.multihead:MultiHeadedAttention", "tfm_solution.feed_forward:PositionwiseFeedForward",
        "tfm_solution.norm:LayerNorm", "tfm_solution.norm:SublayerConnection", "tfm_solution.embeddings:Embeddings",
        "tfm_solution.positional_encoding:_check_even", "tfm_solution.positional_encoding:pair_frequencies",
        "tfm_solution.positional_encoding:positional_encoding", "tfm_solution.positional_encoding:PositionalEncoding",
        "tfm_solution.encoder_decoder:EncoderLayer", "tfm_solution.encoder_decoder:DecoderLayer",
        "tfm_solution.encoder_decoder:_final_norm", "tfm_solution.encoder_decoder:Encoder",
        "tfm_solution.encoder_decoder:Decoder", "tfm_solution.encoder_decoder:Generator",
        "tfm_solution.encoder_decoder:EncoderDecoder", "tfm_solution.encoder_decoder:make_model"),
     "look at your `make_model`: separate deep copies of every attention and feed-forward module, the dropout "
     "passed everywhere, Xavier initialization of the matrices; your pieces each work with the course's others"),
    ("loss", "chapter 9's `LabelSmoothing` and this chapter's `SimpleLossCompute`",
     ("LabelSmoothing", "SimpleLossCompute"),
     ("tfm_solution.training:LabelSmoothing", "tfm_solution.training:SimpleLossCompute"),
     "look at your loss: the generator's log-probabilities against the smoothed target, padding given nothing, "
     "summed and divided by the norm it is given"),
    ("schedule", "chapter 9's `rate`", ("rate",), ("tfm_solution.schedule:rate",),
     "look at your `rate`: it rises linearly for `warmup` steps and then decays as 1/sqrt(step), for every step"),
    ("training loop", "chapter 9's `train_with_accumulation`", ("train_with_accumulation",),
     ("tfm_solution.training:accumulation_groups", "tfm_solution.training:_global_tokens",
      "tfm_solution.training:autocast", "tfm_solution.training:accumulated_step",
      "tfm_solution.training:train_with_accumulation"),
     "look at your `train_with_accumulation`: every micro-batch is used, the optimizer and the scheduler step once "
     "per group, and the gradients are cleared after each step"),
)
"""What the diagnosis can put in place of the student's code, in an order where each component's reference
uses only components before it: (short name, what it is, the names installed over the student's, the reference
objects they need, a pointed hint)."""

PROCEDURES = {
    "reversal": ("tfm_solution.capstone:ReversalTask", "tfm_solution.capstone:Trained",
                 "tfm_solution.capstone:Evaluation", "tfm_solution.capstone:held_out",
                 "tfm_solution.capstone:reversal_pairs", "tfm_solution.capstone:padded",
                 "tfm_solution.capstone:forced_predictions", "tfm_solution.capstone:one_thread",
                 "tfm_solution.capstone:train_reversal", "tfm_solution.capstone:_train_reversal",
                 "tfm_solution.capstone:evaluate_reversal", "tfm_solution.capstone:_evaluate_reversal"),
    "translation": ("tfm_solution.masks:subsequent_mask", "tfm_solution.decoding:IncrementalDecoder",
                    "tfm_solution.decoding:_check", "tfm_solution.decoding:Hypothesis",
                    "tfm_solution.decoding:length_penalty", "tfm_solution.decoding:beam_step",
                    "tfm_solution.decoding:BeamTrace", "tfm_solution.decoding:beam_search",
                    "tfm_solution.capstone:TranslationTask", "tfm_solution.capstone:weight_names",
                    "tfm_solution.capstone:padded", "tfm_solution.capstone:one_thread",
                    "tfm_solution.capstone:WithYourMask", "tfm_solution.capstone:load_weights",
                    "tfm_solution.capstone:translate_part_b"),
}
"""The course's procedures each part runs in the worker (compiled, never installed over the student's names)."""

INSTALLED = {"reversal": ("ReversalTask", "train_reversal", "evaluate_reversal"),
             "translation": ("TranslationTask", "weight_names", "translate_part_b")}
"""Of those, what the worker's driver calls or builds from a case's description."""

EXERCISES = (
    Exercise(
        id="ch12.reversal",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="EncoderDecoder",
        kind="function",
        signature="your Transformer (chapters 1-12), trained by your loop on the reversal task",
        points=12,
        solution_grade_id="ch12-encoder-decoder",
        test_grade_id="ch12-reversal-tests",
        reference="tfm_solution.encoder_decoder:make_model",
        cases=reversal_cases,
        prerequisites=PROCEDURES["reversal"],
        time_budget_s=120.0,
        runner="autograder.capstone:CapstoneRun",
    ),
    Exercise(
        id="ch12.translation",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="Generator",
        kind="function",
        signature="your Transformer with your Multi30k weights (my_model/model.safetensors), decoded with beams",
        points=12,
        solution_grade_id="ch12-generator",
        test_grade_id="ch12-translation-tests",
        reference="tfm_solution.encoder_decoder:make_model",
        cases=translation_cases,
        prerequisites=PROCEDURES["translation"],
        time_budget_s=600.0,
        runner="autograder.capstone:CapstoneRun",
    ),
)
