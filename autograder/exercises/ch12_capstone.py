"""Chapter 12 grading: the student's own Transformer, trained (Part A) and translating (Part B).

Both exercises are graded on the student's whole course: their answers of chapters 1-11 (found in
the submitted chapter notebooks, ``autograder.course_code``) and the capstone notebook's own code.
``autograder.capstone.CapstoneRun`` runs them (``Exercise.runner``); it is an ``ExerciseRun`` that
gathers that code, lifts the worker's limits to a training run, diagnoses a model that does not
learn (``COMPONENTS``), and brings Part B its weights and sentences. The cases here say what is
judged, in bands (``Case.rule``): no reference is computed, the bands are the verdict.

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
from tfm_solution.capstone import ACCURACY_BANDS  # the chapter states them, the grader applies them

CHAPTER, NOTEBOOK = "12_capstone", "capstone.ipynb"

TASK = {"module": "ReversalTask", "symbols": 10, "min_len": 4, "max_len": 10, "layers": 2, "d_model": 32, "d_ff": 64,
        "heads": 4, "dropout": 0.0, "steps": 600, "batch_size": 32, "accum_iter": 2, "factor": 0.5, "warmup": 100,
        "smoothing": 0.0, "chunks": 30, "held_out": 500, "seed": 0, "cpu_budget_s": 90.0}
"""Part A's task and budget (``tfm_solution.capstone.ReversalTask``), built on both sides from this description."""

PUBLIC_EVAL_SEED = 1
"""The held-out sequences of the public case (the cached decoder's agreement); the bands use fresh ones."""

TRANSLATION = {"module": "TranslationTask", "src_vocab": 5000, "tgt_vocab": 5000, "layers": 3, "d_model": 128,
               "d_ff": 512, "heads": 4, "dropout": 0.1, "beam_size": 4, "alpha": 0.6, "max_extra": 50,
               "batch_size": 64, "cpu_budget_s": 200.0}
"""Part B: the course model's size and the decoding of its model card (``tfm_solution.capstone.TranslationTask``)."""

BLEU_BANDS = (15.0, 22.0, 28.0)
"""Part B: a case per band of sacreBLEU on the configured test split (the course model scores 33 on test_2016)."""

SPLIT_ENV, SENTENCES_ENV = "AUTOGRADER_CAPSTONE_SPLIT", "AUTOGRADER_CAPSTONE_SENTENCES"


def translation_split() -> tuple[str, int | None]:
    """The instructor's choice for Part B: a Multi30k split (``test``: test_2016 flickr, the default; or
    ``val``) and how many of its sentences, from the start (default all), from the environment."""
    count = os.environ.get(SENTENCES_ENV)
    return os.environ.get(SPLIT_ENV, "test"), int(count) if count else None


JUDGES: dict = {}
"""``kind -> judge(band, seed, returned value) -> (passed, lines)``: the cases name their verdict by key, and the
harness that runs them (``autograder.capstone``, these exercises' runner) puts its judges here when it loads."""


def _judge(kind: str, threshold: float, seed: int, got):
    """The verdict ``kind`` on ``got``, with its band and the case's seed (Part A's held-out sequences, Part B's
    shown sentences)."""
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
                  rule=functools.partial(_judge, "agreement", 1.0, PUBLIC_EVAL_SEED))]
    for band in ACCURACY_BANDS:
        cases.append(Case(f"exact match at least {band:.0%}",
                          f"your model, trained by your loop for at most {TASK['steps']} steps, reverses at least "
                          f"{band:.0%} of 500 fresh held-out sequences exactly (decoded by the course's greedy loop)", False,
                          (TASK, hidden), driver="reversal", rule=functools.partial(_judge, "accuracy", band, hidden)))
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
                  (TRANSLATION,), driver="translation", rule=functools.partial(_judge, "translates", 0.0, 0))]
    for band in BLEU_BANDS:
        cases.append(Case(f"BLEU at least {band:g}", f"sacreBLEU of your translations of the test split is at least "
                          f"{band:g}", False, (TRANSLATION,), driver="translation",
                          rule=functools.partial(_judge, "bleu", band, shown)))
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
                 "tfm_solution.capstone:forced_predictions", "tfm_solution.capstone:course_greedy",
                 "tfm_solution.capstone:repeatable", "tfm_solution.capstone:one_thread", "tfm_solution.capstone:_needs",
                 "tfm_solution.capstone:train_reversal", "tfm_solution.capstone:_train_reversal",
                 "tfm_solution.capstone:_holder", "tfm_solution.capstone:_cut_by",
                 "tfm_solution.capstone:evaluate_reversal", "tfm_solution.capstone:_evaluate_reversal"),
    "translation": ("tfm_solution.masks:subsequent_mask", "tfm_solution.decoding:IncrementalDecoder",
                    "tfm_solution.decoding:_check", "tfm_solution.decoding:Hypothesis",
                    "tfm_solution.decoding:length_penalty", "tfm_solution.decoding:beam_step",
                    "tfm_solution.decoding:BeamTrace", "tfm_solution.decoding:beam_search",
                    "tfm_solution.capstone:TranslationTask", "tfm_solution.capstone:weight_names",
                    "tfm_solution.capstone:padded", "tfm_solution.capstone:one_thread",
                    "tfm_solution.capstone:WithYourMask", "tfm_solution.capstone:load_weights",
                    "tfm_solution.capstone:_needs",
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
        kind="class",
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
        kind="class",
        signature="your Transformer with your Multi30k weights (my_model/model.safetensors), decoded with beams",
        points=12,
        solution_grade_id="ch12-generator",
        test_grade_id="ch12-translation-tests",
        reference="tfm_solution.encoder_decoder:make_model",
        cases=translation_cases,
        prerequisites=PROCEDURES["translation"],
        time_budget_s=300.0,
        runner="autograder.capstone:CapstoneRun",
    ),
)


# ----------------------------------------------------------------------------- planted bugs

_MULTI_HEADED_ATTENTION = '''
from torch import nn


class MultiHeadedAttention(nn.Module):
    def __init__(self, h, d_model, dropout=0.1):
        super().__init__()
        assert d_model % h == 0
        self.d_k = d_model // h
        self.h = h
        self.linears = clones(nn.Linear(d_model, d_model), 4)
        self.attn = None
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query, key, value, mask=None):
        if mask is not None:
            mask = mask.unsqueeze(1)
        query, key, value = (split_heads(lin(x), self.h) for lin, x in zip(self.linears, (query, key, value)))
        x, self.attn = attention(query, key, value, mask=mask, dropout=self.dropout)
        return self.linears[3](merge_heads(x))
'''
"""Chapter 5's answer cell, correct: two of the bugs below are this cell with one place changed."""


def _changed(cell: str, old: str, new: str) -> str:
    """``cell`` with its one occurrence of ``old`` written as ``new``."""
    assert cell.count(old) == 1, old
    return cell.replace(old, new)


PLANTED: dict[str, tuple[str, str, str]] = {
    "masks": ("ch04-subsequent-mask", "a causal mask cut from a table of 8 positions: right for every length the "
              "visible tests try, wrong (a shape error) for the 11 positions of a reversal target", '''
_CAUSAL = torch.ones(1, 8, 8, dtype=torch.bool).tril()


def subsequent_mask(size):
    return _CAUSAL[:, :size, :size]
'''),
    "attention": ("ch03-attention", "the weights detached (they are returned for display): the scores never get "
                  "a gradient, so queries and keys never learn", '''
def attention(query, key, value, mask=None, dropout=None):
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, torch.finfo(scores.dtype).min)
    p_attn = scores.softmax(dim=-1).detach()
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn
'''),
    "multi-head attention": ("ch05-multiheaded-attention", "the projections computed under torch.no_grad(): W^Q, "
                             "W^K and W^V never learn, and no gradient reaches the layer's input",
                             _changed(_MULTI_HEADED_ATTENTION, "        query, key, value = (split_heads(",
                                      "        with torch.no_grad():\n            query, key, value = (split_heads(")),
    "feed-forward": ("ch06-positionwise-feed-forward", "the hidden layer detached: w_1 never learns and no gradient "
                     "goes back through the network", '''
from torch import nn


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.w_2(self.dropout(self.w_1(x).relu().detach()))
'''),
    "LayerNorm": ("ch07-layer-norm", "the input detached before normalizing: nothing before a norm gets a gradient "
                  "through it, and the final norms cut both stacks off from the loss", '''
from torch import nn


class LayerNorm(nn.Module):
    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        x = x.detach()
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2
'''),
    "SublayerConnection": ("ch07-sublayer-connection", "the sublayer run under torch.no_grad(): the attention and "
                           "feed-forward layers it wraps never learn", '''
from torch import nn


class SublayerConnection(nn.Module):
    def __init__(self, size, dropout, norm_position="pre"):
        super().__init__()
        self.norm = LayerNorm(size)
        self.dropout = nn.Dropout(dropout)
        self.norm_position = norm_position

    def forward(self, x, sublayer):
        if self.norm_position == "post":
            return self.norm(x + self.dropout(sublayer(x)))
        with torch.no_grad():
            out = sublayer(self.norm(x))
        return x + self.dropout(out)
'''),
    "encoder and decoder layers": ("ch08-decoder-layer", "the decoder layer's state detached after cross-attention: "
                                   "the loss reaches only the last feed-forward layers", '''
from torch import nn


class DecoderLayer(nn.Module):
    def __init__(self, size, self_attn, src_attn, feed_forward, dropout):
        super().__init__()
        self.size = size
        self.self_attn = self_attn
        self.src_attn = src_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout), 3)

    def forward(self, x, memory, src_mask, tgt_mask):
        m = memory
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y, tgt_mask))
        x = self.sublayer[1](x, lambda y: self.src_attn(y, m, m, src_mask)).detach()
        return self.sublayer[2](x, self.feed_forward)
'''),
    "embeddings": ("ch01-embeddings", "a sparse embedding table (sparse=True): the right vectors and a gradient, but "
                   "one that Adam refuses", '''
from torch import nn


class Embeddings(nn.Module):
    def __init__(self, d_model, vocab):
        super().__init__()
        self.lut = nn.Embedding(vocab, d_model, sparse=True)
        self.d_model = d_model

    def forward(self, x):
        return self.lut(x) * math.sqrt(self.d_model)
'''),
    "positional encoding": ("ch02-positional-encoding-module", "the table added in evaluation mode only: the model "
                            "trains without positions", '''
from torch import nn


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout, max_len=5000):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        self.register_buffer("pe", positional_encoding(max_len, d_model).unsqueeze(0))

    def forward(self, x):
        if not self.training:
            x = x + self.pe[:, : x.size(1)].to(x.dtype)
        return self.dropout(x)
'''),
    "glue": ("ch12-encoder-decoder", "the memory computed under torch.no_grad(): the encoder never learns", '''
class EncoderDecoder(nn.Module):
    def __init__(self, encoder, decoder, src_embed, tgt_embed, generator):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.generator = generator

    def forward(self, src, tgt, src_mask, tgt_mask):
        return self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)

    def encode(self, src, src_mask):
        with torch.no_grad():
            return self.encoder(self.src_embed(src), src_mask)

    def decode(self, memory, src_mask, tgt, tgt_mask):
        return self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask)
'''),
    "make_model": ("ch08-make-model", "MultiHeadedAttention(d_model, h): the arguments swapped", '''
import copy

from torch import nn


def make_model(src_vocab, tgt_vocab, N=6, d_model=512, d_ff=2048, h=8, dropout=0.1):
    c = copy.deepcopy
    attn = MultiHeadedAttention(d_model, h, dropout)
    ff = PositionwiseFeedForward(d_model, d_ff, dropout)
    position = PositionalEncoding(d_model, dropout)
    model = EncoderDecoder(
        Encoder(EncoderLayer(d_model, c(attn), c(ff), dropout), N),
        Decoder(DecoderLayer(d_model, c(attn), c(attn), c(ff), dropout), N),
        nn.Sequential(Embeddings(d_model, src_vocab), c(position)),
        nn.Sequential(Embeddings(d_model, tgt_vocab), c(position)),
        Generator(d_model, tgt_vocab),
    )
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    return model
'''),
    "loss": ("ch09-label-smoothing", "the correct label scattered along dimension 0: the smoothed target puts the "
             "confidence in the wrong places", '''
from torch import nn


class LabelSmoothing(nn.Module):
    def __init__(self, size, padding_idx, smoothing=0.0):
        super().__init__()
        self.criterion = nn.KLDivLoss(reduction="sum")
        self.padding_idx = padding_idx
        self.confidence = 1.0 - smoothing
        self.smoothing = smoothing
        self.size = size
        self.true_dist = None

    def forward(self, x, target):
        true_dist = torch.full_like(x.detach(), self.smoothing / (self.size - 2))
        true_dist.scatter_(0, target.unsqueeze(1), self.confidence)
        true_dist[:, self.padding_idx] = 0
        true_dist[target == self.padding_idx] = 0
        self.true_dist = true_dist
        return self.criterion(x, true_dist)
'''),
    "schedule": ("ch09-rate", "max instead of min: after the warm-up the rate keeps growing", '''
def rate(step, model_size, factor, warmup):
    if step == 0:
        step = 1
    return factor * (model_size ** (-0.5) * max(step ** (-0.5), step * warmup ** (-1.5)))
'''),
    "training loop": ("ch09-train-with-accumulation", "the gradients never cleared: each step adds all the earlier "
                      "groups' gradients to its own", '''
def train_with_accumulation(model, batches, loss_compute, optimizer, scheduler, accum_iter):
    model.train()
    steps = 0
    iterator = iter(batches)
    while True:
        group = [batch for _, batch in zip(range(accum_iter), iterator)]
        if not group:
            return steps
        total = sum(int(batch.ntokens) for batch in group)
        for batch in group:
            out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
            _, loss_node = loss_compute(out, batch.tgt_y, total)
            loss_node.backward()
        optimizer.step()
        scheduler.step()
        steps += 1
'''),
}
"""A bug for every component of ``COMPONENTS``: (the answer cell it replaces, what it does, the cell's code).
``scripts/capstone_diagnosis.py`` submits each with the solution's other answers and records what the
diagnosis names; ``tests/test_chapters_capstone.py`` checks which pass their chapter's visible tests."""

ALSO_PLANTED: dict[str, tuple[str, str, str, str]] = {
    "dropout in evaluation": ("ch06-positionwise-feed-forward", "`F.dropout(x, p)`, which stays on after "
                              "`model.eval()`: harmless at Part A's dropout 0, wrong wherever dropout is not 0",
                              "dropout is still on after `model.eval()`", '''
from torch import nn
from torch.nn import functional as F


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.p = dropout

    def forward(self, x):
        return self.w_2(F.dropout(self.w_1(x).relu(), self.p))
'''),
    "unscaled cached cross-attention": ("ch11-greedy-decode-cached", "the cached decoder's cross-attention without "
                                        "the 1/sqrt(d_k) scale: its tokens drift from the uncached decoder's",
                                        "scaled by 1/sqrt(d_k)", '''
def greedy_decode_cached(model, src, src_mask, max_len, start_symbol, end_symbol=None, pad=2):
    memory = model.encode(src, src_mask)
    layers = model.decoder.layers
    embed, position = model.tgt_embed[0], model.tgt_embed[1]

    def heads(attn, t):
        return t.view(t.size(0), -1, attn.h, attn.d_k).transpose(1, 2)

    cross = [(heads(l.src_attn, l.src_attn.linears[1](memory)), heads(l.src_attn, l.src_attn.linears[2](memory)))
             for l in layers]
    past = [(None, None)] * len(layers)

    def cross_attention(attn, y, k, v):
        q = heads(attn, attn.linears[0](y))
        scores = (q @ k.transpose(-2, -1)).masked_fill(src_mask.unsqueeze(1) == 0, -1e9)
        out = scores.softmax(dim=-1) @ v
        return attn.linears[-1](out.transpose(1, 2).contiguous().view(y.size(0), -1, attn.h * attn.d_k))

    ys = torch.full((src.size(0), 1), start_symbol, dtype=torch.long, device=src.device)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    for t in range(max_len - 1):
        x = position.dropout(embed(ys[:, -1:]) + position.pe[:, t:t + 1])
        for i, layer in enumerate(layers):
            def self_attention(y, i=i, layer=layer):
                out, k, v = cached_self_attention(layer.self_attn, y, *past[i])
                past[i] = (k, v)
                return out
            x = layer.sublayer[0](x, self_attention)
            x = layer.sublayer[1](x, lambda y, layer=layer, i=i: cross_attention(layer.src_attn, y, *cross[i]))
            x = layer.sublayer[2](x, layer.feed_forward)
        next_word = model.generator(model.decoder.norm(x)[:, -1]).argmax(dim=-1)
        next_word = next_word.masked_fill(finished, pad)
        ys = torch.cat([ys, next_word[:, None]], dim=1)
        if end_symbol is not None:
            finished |= next_word == end_symbol
            if bool(finished.all()):
                break
    return ys
'''),
    "mask tiled across the batch": ("ch05-multiheaded-attention", "the mask repeated h times and viewed as (batch, h, "
                                    "...): right for a batch of one, another sequence's padding for the others",
                                    "**Diagnosis: multi-head attention**",
                                    _changed(_MULTI_HEADED_ATTENTION, "mask.unsqueeze(1)", "mask.repeat(self.h, 1, 1)"
                                             ".view(query.size(0), self.h, mask.size(-2), mask.size(-1))")),
}
"""Bugs that are not one component's failure to learn, each as (the answer cell it replaces, what it does, what the
grade must say, the cell's code): a dropout left on in evaluation, a cached decoder that disagrees, a mask right only
for a batch of one. ``scripts/capstone_diagnosis.py`` grades them beside ``PLANTED``."""
