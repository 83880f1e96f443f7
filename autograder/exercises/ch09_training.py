"""Chapter 9 grading: ``LabelSmoothing``, ``rate`` and ``train_with_accumulation``."""

from __future__ import annotations

import dataclasses

import torch

from autograder.exercises.shared import Case, Contract, Exercise, Mistake, Mutant, dim, generators, randn, variants

CHAPTER, NOTEBOOK = "09_training", "training.ipynb"

# KL divergences summed over up to a few hundred float32 terms: nn.KLDivLoss and the reference's
# xlogy form agree to ~1e-6 relative; the declared mistakes are off by several percent at least.
_KL_TOL = {"rtol": 1e-4, "atol": 1e-4}


def _targets(gen: torch.Generator, n: int, size: int, pad: int, padded: int) -> torch.Tensor:
    """``(n,)`` label ids in ``0 .. size-1``: ``padded`` of them (at random places) are ``pad``, the rest are not."""
    ids = torch.randint(0, size - 1, (n,), generator=gen)
    ids = ids + (ids >= pad).long()  # real labels never equal the padding id
    where = torch.randperm(n, generator=gen)[:padded]
    ids[where] = pad
    return ids


def _labelled_2(gen: torch.Generator, ids: torch.Tensor, pad: int, count: int) -> torch.Tensor:
    """``ids`` with ``count`` of its real (not padding) labels, at random places, made class 2."""
    real = (ids != pad).nonzero().flatten()
    ids = ids.clone()
    ids[real[torch.randperm(len(real), generator=gen)[:count]]] = 2
    return ids


def _log_probs(gen: torch.Generator, n: int, size: int, scale: float = 2.0) -> torch.Tensor:
    return randn(gen, n, size, scale=scale).log_softmax(-1)


def label_smoothing_cases(seed: int) -> list[Case]:
    """``LabelSmoothing(size, padding_idx, smoothing)``: the summed KL divergence on log-probabilities."""
    pub, gen = generators(seed)
    cases = [Case("size 6, padding 2, smoothing 0.4", "the summed KL divergence of 5 rows, one labelled with "
                  "padding (public)", True, (_log_probs(pub, 5, 6), torch.tensor([4, 2, 0, 5, 1])),
                  construct=(6, 2, 0.4), **_KL_TOL)]
    size, n = dim(gen, 8, 40), dim(gen, 10, 30)
    cases.append(Case("a random vocabulary", "ε spread over size - 2 classes, padding column and padded rows at 0",
                      False, (_log_probs(gen, n, size), _targets(gen, n, size, 2, dim(gen, 2, 5))),
                      construct=(size, 2, 0.1), **_KL_TOL))
    size, n, pad = dim(gen, 6, 20), dim(gen, 6, 16), dim(gen, 0, 1)
    cases.append(Case("another padding id", "`padding_idx` is an argument (here not 2)", False,
                      (_log_probs(gen, n, size), _targets(gen, n, size, pad, 2)), construct=(size, pad, 0.2),
                      **_KL_TOL))
    size, n = dim(gen, 6, 20), dim(gen, 4, 12)
    cases.append(Case("no smoothing", "smoothing 0: the summed negative log-likelihood of the real labels", False,
                      (_log_probs(gen, n, size), _targets(gen, n, size, 2, 1)), construct=(size, 2, 0.0), **_KL_TOL))
    size, n = dim(gen, 6, 20), dim(gen, 4, 12)
    cases.append(Case("no padded label", "every row is a real label", False,
                      (_log_probs(gen, n, size), _targets(gen, n, size, 2, 0)), construct=(size, 2, 0.3), **_KL_TOL))
    size, n = dim(gen, 500, 2000), dim(gen, 40, 80)
    cases.append(Case("a large vocabulary", "hundreds of classes share ε; dozens of positions are summed", False,
                      (_log_probs(gen, n, size, scale=3.0), _targets(gen, n, size, 2, dim(gen, 5, 15))),
                      construct=(size, 2, 0.1), **_KL_TOL))
    # Padding ids other than 2, where class 2 is an ordinary label: a padding column hard-coded as 2 scores
    # nothing here. Each case comes twice, the second time comparing `true_dist` too (as the contract's attribute
    # copies do: a case that reads attributes builds nothing for the structure line, so the first one does).
    more = [Case("padding 0, class 2 a real label", "size 7, padding id 0, smoothing 0.3: column 0 and the row "
                 "labelled 0 are zero; class 2 is an ordinary class, the label of two rows, ε's share in the others "
                 "(public)", True, (_log_probs(pub, 6, 7), torch.tensor([2, 0, 5, 2, 1, 6])), construct=(7, 0, 0.3),
                 **_KL_TOL)]
    size, n = dim(gen, 6, 20), dim(gen, 8, 16)
    pad = dim(gen, 0, size - 2)
    pad += int(pad >= 2)  # any padding id but 2
    more.append(Case("another padding id, class 2 labelled", "padding_idx is not 2: column 2 holds ε's share, rows "
                     "labelled 2 put 1 - ε on it", False,
                     (_log_probs(gen, n, size), _labelled_2(gen, _targets(gen, n, size, pad, 2), pad, 3)),
                     construct=(size, pad, 0.2), **_KL_TOL))
    size, n = dim(gen, 6, 20), dim(gen, 4, 12)
    pad = dim(gen, 0, size - 2)
    pad += int(pad >= 2)
    more.append(Case("no smoothing, another padding id", "smoothing 0, padding_idx not 2, no padded row: the summed "
                     "negative log-likelihood of every label, class 2 included", False,
                     (_log_probs(gen, n, size), _labelled_2(gen, _targets(gen, n, size, pad, 0), pad, 2)),
                     construct=(size, pad, 0.0), **_KL_TOL))
    for case in more:
        cases += [case, dataclasses.replace(
            case, title=f"{case.title}, its attributes", keep=("true_dist",),
            checks=case.checks.removesuffix(" (public)") + "; after the call the module's `true_dist` is the "
            "reference's" + (" (public)" if case.public else ""))]
    return cases


def rate_cases(seed: int) -> list[Case]:
    """``rate(step, model_size, factor, warmup)``: one float per call."""
    _, gen = generators(seed)
    d, warmup = 2 ** dim(gen, 6, 10), 100 * dim(gen, 5, 60)
    factor = float(dim(gen, 1, 8)) / 4
    return [
        Case("step 1 of the paper's setting", "rate(1, 512, 1.0, 4000): the first warm-up step (public)", True,
             (1, 512, 1.0, 4000)),
        Case("step 0", "step 0 counts as step 1 (LambdaLR asks for it when it is created)", False,
             (0, d, factor, warmup)),
        Case("during the warm-up", "the linear ramp, step * warmup^-1.5", False,
             (dim(gen, 2, warmup - 1), d, factor, warmup)),
        Case("at the peak", "step == warmup: factor * (d_model * warmup)^-0.5", False, (warmup, d, factor, warmup)),
        Case("after the warm-up", "the 1/sqrt(step) decay", False, (warmup + dim(gen, 1, 20 * warmup), d, factor, warmup)),
        Case("a long run", "hundreds of thousands of steps, another factor", False,
             (dim(gen, 100_000, 500_000), d, 2 * factor, warmup)),
    ]


_label_smoothing = variants('''
from torch import nn


class LabelSmoothing(nn.Module):
    def __init__(self, size, padding_idx, smoothing=0.0):
        super().__init__()
        self.criterion = nn.KLDivLoss(reduction={reduction})
        self.padding_idx = padding_idx
        self.confidence = 1.0 - smoothing
        self.smoothing = smoothing
        self.size = size
        self.true_dist = None

    def forward(self, x, target):
        true_dist = x.detach().clone()
        true_dist.fill_(self.smoothing / ({share}))
        true_dist.scatter_(1, target.unsqueeze(1), self.confidence)
        {pad_column}
        {pad_rows}
        self.true_dist = true_dist
        return {loss}
''', reduction='"sum"', share="self.size - 2", pad_column="true_dist[:, self.padding_idx] = 0",
                            pad_rows="true_dist[target == self.padding_idx] = 0", loss="self.criterion(x, true_dist)")

_rate = variants('''
def rate(step, model_size, factor, warmup):
    {guard}
    return factor * ({scale} * {pick}(step ** (-0.5), step * warmup ** ({exponent})))
''', guard="step = max(step, 1)", scale="model_size ** (-0.5)", pick="min", exponent="-1.5")


# ----------------------------------------------------------------------------- train_with_accumulation

_PAD = 2


def _micro_batches(gen: torch.Generator, count: int, vocab: int) -> tuple:
    """``count`` micro-batches ``(src, tgt)`` of 1 to 3 sentence pairs each, padded with id 2: sentences of
    different lengths, so the micro-batches hold unequal numbers of real target tokens."""
    found = []
    for _ in range(count):
        b, longest = dim(gen, 1, 3), dim(gen, 2, 7)
        lengths = [longest] + [dim(gen, 1, longest) for _ in range(b - 1)]
        src = torch.full((b, longest + 1), _PAD)
        tgt = torch.full((b, longest + 2), _PAD)
        for row, n in enumerate(lengths):
            src[row, :n + 1] = torch.cat([torch.randint(3, vocab, (n,), generator=gen), torch.tensor([1])])
            tgt[row, :n + 2] = torch.cat([torch.tensor([0]), torch.randint(3, vocab, (n,), generator=gen),
                                          torch.tensor([1])])
        found.append((src, tgt))
    return tuple(found)


def _tiny_model(vocab: int, dropout: float = 0.0) -> dict:
    return {"module": "make_model", "src_vocab": vocab, "tgt_vocab": vocab, "N": 1, "d_model": 8, "d_ff": 16, "h": 2,
            "dropout": dropout}


_DRIVEN = {"rtol": 1e-7, "atol": 1e-10}


def train_with_accumulation_cases(seed: int) -> list[Case]:
    """``train_with_accumulation`` driven on a tiny float64 model (``worker.train_accumulated``): the
    parameters and learning rate it leaves, and the number of steps it returns."""
    pub, gen = generators(seed)
    cases = [Case("5 micro-batches, accum_iter 2", "groups (1, 2), (3, 4), (5): one step per group with the "
                  "gradient of the group's summed token loss / its tokens, the scheduler once per step (public)",
                  True, (_tiny_model(10), _micro_batches(pub, 5, 10), 2, 0.5), driver="accumulation", **_DRIVEN)]
    vocab = dim(gen, 8, 14)
    cases.append(Case("micro-batches of unequal sizes", "each token weighs the same, whichever micro-batch holds it "
                      "(dividing by accum_iter is not that)", False,
                      (_tiny_model(vocab), _micro_batches(gen, 3 * dim(gen, 1, 2), vocab), 3, 0.3),
                      driver="accumulation", **_DRIVEN))
    vocab = dim(gen, 8, 14)
    cases.append(Case("a shorter last group", "the micro-batches left at the end make one more, smaller step",
                      False, (_tiny_model(vocab), _micro_batches(gen, 3 * dim(gen, 1, 2) + 2, vocab), 3, 0.3),
                      driver="accumulation", **_DRIVEN))
    vocab = dim(gen, 8, 14)
    cases.append(Case("accum_iter 1", "one optimizer step per micro-batch, each with its own tokens", False,
                      (_tiny_model(vocab), _micro_batches(gen, dim(gen, 2, 4), vocab), 1, 0.2),
                      driver="accumulation", **_DRIVEN))
    vocab = dim(gen, 8, 14)
    cases.append(Case("with dropout", "the model is put in training mode (it arrives in eval mode): dropout acts",
                      False, (_tiny_model(vocab, 0.3), _micro_batches(gen, 4, vocab), 2, 0.3),
                      driver="accumulation", **_DRIVEN))
    return cases


_ACCUMULATE = variants('''
def train_with_accumulation(model, batches, loss_compute, optimizer, scheduler, accum_iter):
    {train}
    batches = list(batches)
    steps = 0
    for start in range(0, {stop}, accum_iter):
        group = batches[start:start + accum_iter]
        total = sum(int(b.ntokens) for b in group)
        for b in group:
            out = model(b.src, b.tgt, b.src_mask, b.tgt_mask)
            _, loss_node = loss_compute(out, b.tgt_y, {norm})
            loss_node.backward()
            {per_micro_batch}
        optimizer.step()
        {zero}
        {per_step}
        steps += 1
    return steps
''', train="model.train()", stop="len(batches)", norm="total", per_micro_batch="pass", zero="optimizer.zero_grad()",
    per_step="scheduler.step()")

_NOTES_LOOP = '''
def train_with_accumulation(model, batches, loss_compute, optimizer, scheduler, accum_iter):
    model.train()
    steps = 0
    for i, b in enumerate(batches):
        out = model(b.src, b.tgt, b.src_mask, b.tgt_mask)
        _, loss_node = loss_compute(out, b.tgt_y, b.ntokens)
        (loss_node / accum_iter).backward()
        if i % accum_iter == 0:
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            steps += 1
    return steps
'''

_MODEL = (
    "tfm_solution.attention:mask_fill_value",
    "tfm_solution.attention:attention",
    "tfm_solution.cloning:clones",
    "tfm_solution.multihead:split_heads",
    "tfm_solution.multihead:merge_heads",
    "tfm_solution.multihead:MultiHeadedAttention",
    "tfm_solution.feed_forward:PositionwiseFeedForward",
    "tfm_solution.norm:LayerNorm",
    "tfm_solution.norm:SublayerConnection",
    "tfm_solution.embeddings:Embeddings",
    "tfm_solution.positional_encoding:_check_even",
    "tfm_solution.positional_encoding:pair_frequencies",
    "tfm_solution.positional_encoding:positional_encoding",
    "tfm_solution.positional_encoding:PositionalEncoding",
    "tfm_solution.encoder_decoder:EncoderLayer",
    "tfm_solution.encoder_decoder:DecoderLayer",
    "tfm_solution.encoder_decoder:_final_norm",
    "tfm_solution.encoder_decoder:Encoder",
    "tfm_solution.encoder_decoder:Decoder",
    "tfm_solution.encoder_decoder:Generator",
    "tfm_solution.encoder_decoder:EncoderDecoder",
    "tfm_solution.encoder_decoder:make_model",
    "tfm_solution.masks:subsequent_mask",
    "tfm_solution.masks:Batch",
    "tfm_solution.training:SimpleLossCompute",
)
"""What the accumulation cases build in the worker: the course's model, its batches and its loss."""

_LABEL_SMOOTHING_OWN = '''
from torch import nn
import torch.nn.functional as F


class LabelSmoothing(nn.Module):
    def __init__(self, size, padding_idx, smoothing=0.0):
        super().__init__()
        self.padding_idx = padding_idx
        self.smoothing = smoothing
        self.size = size
        self.true_dist = None

    def forward(self, x, target):
        {body}
'''

_RATE = '''
def rate(step, model_size, factor, warmup):
    {body}
'''

_ACCUMULATE_SCALED = '''
def train_with_accumulation(model, batches, loss_compute, optimizer, scheduler, accum_iter):
    model.train()
    steps, group = 0, []
    for batch in list(batches) + [None]:
        if batch is not None:
            group.append(batch)
        if group and (batch is None or len(group) == accum_iter):
            total = sum(int(b.ntokens) for b in group)
            for b in group:
                out = model(b.src, b.tgt, b.src_mask, b.tgt_mask)
                _, loss_node = loss_compute(out, b.tgt_y, 1)
                (loss_node / total).backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            steps += 1
            group = []
    return steps
'''

EXERCISES = (
    Exercise(
        id="ch09.label_smoothing",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="LabelSmoothing",
        kind="module",
        signature="LabelSmoothing(size, padding_idx, smoothing=0.0); forward(x, target) -> summed KL divergence",
        points=5,
        solution_grade_id="ch09-label-smoothing",
        test_grade_id="ch09-label-smoothing-tests",
        reference="tfm_solution.training:LabelSmoothing",
        cases=label_smoothing_cases,
        contract=Contract(
            dtype="`x` holds float32 log-probabilities; the loss is a 0-dim float32 tensor, `true_dist` float32 too",
            modes=("eval", "train"),
            attributes=("true_dist",),
            attributes_text="after a call, `self.true_dist` holds the `(n, size)` smoothed target of that call (the "
                            "notes keep it for plotting)",
        ),
        alternatives={
            "notes_fill": _label_smoothing(),
            "one_hot": _LABEL_SMOOTHING_OWN.format(
                body="confidence, share = 1.0 - self.smoothing, self.smoothing / (self.size - 2)\n"
                     "        hot = F.one_hot(target, self.size).to(x.dtype)\n"
                     "        true_dist = hot * confidence + (1 - hot) * share\n"
                     "        true_dist[:, self.padding_idx] = 0\n"
                     "        true_dist = true_dist * (target != self.padding_idx).unsqueeze(1)\n"
                     "        self.true_dist = true_dist\n"
                     "        return F.kl_div(x, true_dist, reduction='sum')"),
            "xlogy": _LABEL_SMOOTHING_OWN.format(
                body="true_dist = x.new_full(x.shape, self.smoothing / (self.size - 2))\n"
                     "        true_dist.scatter_(1, target[:, None], 1.0 - self.smoothing)\n"
                     "        true_dist[:, self.padding_idx] = 0\n"
                     "        true_dist.masked_fill_((target == self.padding_idx)[:, None], 0.0)\n"
                     "        self.true_dist = true_dist\n"
                     "        return (torch.xlogy(true_dist, true_dist) - true_dist * x).sum()"),
        },
        mutants={
            "target_not_kept": Mutant("attributes", _label_smoothing(loss="self.criterion(x, true_dist)").replace(
                "        self.true_dist = true_dist\n", "")),
        },
        mistakes={
            "share_over_size_minus_1": Mistake(
                "ε is spread as smoothing / (size - 1): it is shared by size - 2 classes (every class but the "
                "label and the padding class), so each gets smoothing / (size - 2)",
                _label_smoothing(share="self.size - 1")),
            "padding_column_kept": Mistake(
                "the padding column of the target is not 0: the model must never be taught to predict padding",
                _label_smoothing(pad_column="pass")),
            "padded_rows_kept": Mistake(
                "rows whose label is padding are not all zero: padded positions must add nothing to the loss",
                _label_smoothing(pad_rows="pass")),
            "mean_reduction": Mistake(
                "the KL divergence is averaged (reduction='mean'); the notes sum it (reduction='sum') and "
                "SimpleLossCompute divides by ntokens",
                _label_smoothing(reduction='"mean"')),
            "cross_entropy_not_kl": Mistake(
                "this is the cross-entropy against the smoothed target, -sum q log p; the KL divergence also "
                "subtracts the target's entropy: sum q (log q - log p)",
                _label_smoothing(loss="-(true_dist * x).sum()")),
            # 2 for the rows too, which the visible tests catch (padding id 0); on the no-smoothing case with no
            # padded row it computes what a column 2 zeroed besides (or instead of) padding_idx's does: named there
            "padding_hard_coded_as_2": Mistake(
                "the padding is hard-coded as 2 (its column, and perhaps its rows): use self.padding_idx; when "
                "padding_idx is not 2, class 2 is an ordinary label that keeps 1 - smoothing where it is the label "
                "and smoothing / (size - 2) elsewhere",
                _label_smoothing(pad_column="true_dist[:, 2] = 0", pad_rows="true_dist[target == 2] = 0")),
        },
        time_budget_s=2.0,
    ),
    Exercise(
        id="ch09.rate",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="rate",
        kind="function",
        signature="rate(step, model_size, factor, warmup) -> float",
        points=3,
        solution_grade_id="ch09-rate",
        test_grade_id="ch09-rate-tests",
        reference="tfm_solution.schedule:rate",
        cases=rate_cases,
        contract=Contract(dtype="a Python `float`, computed in float64 arithmetic; the grader accepts a relative "
                                "difference of 1e-12 (another order of the same operations)"),
        alternatives={
            "docstring_expression": _RATE.format(
                body="step = max(step, 1)\n"
                     "    return factor * model_size ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)"),
            "over_warmup_power": _RATE.format(
                body="step = step or 1\n"
                     "    return factor * (model_size ** (-0.5) * min(step ** (-0.5), step / warmup ** 1.5))"),
            "square_roots": _RATE.format(
                body="if step == 0:\n        step = 1\n"
                     "    return factor / math.sqrt(model_size) * min(1 / math.sqrt(step), step / warmup / "
                     "math.sqrt(warmup))"),
        },
        mutants={
            "a_tensor": Mutant("expected a float", _RATE.format(
                body="step = max(step, 1)\n"
                     "    return torch.tensor(factor * model_size ** -0.5\n"
                     "                        * min(step ** -0.5, step * warmup ** -1.5))")),
        },
        mistakes={
            "step_zero_unguarded": Mistake(
                "step 0 is not treated as step 1: 0 ** -0.5 divides by zero (LambdaLR asks for step 0 when it "
                "is created)",
                _rate(guard="pass")),
            "warmup_exponent": Mistake(
                "the warm-up term uses warmup ** -0.5: it is step * warmup ** -1.5, so that the two terms meet "
                "at step == warmup",
                _rate(exponent="-0.5")),
            "max_not_min": Mistake(
                "max instead of min: the rate must follow the smaller of the two terms (the ramp, then the decay)",
                _rate(pick="max")),
            "no_model_size_scale": Mistake(
                "the factor d_model ** -0.5 is missing: wider models need smaller rates",
                _rate(scale="1.0")),
        },
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch09.train_with_accumulation",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="train_with_accumulation",
        kind="function",
        signature="train_with_accumulation(model, batches, loss_compute, optimizer, scheduler, accum_iter) -> steps",
        points=4,
        solution_grade_id="ch09-train-with-accumulation",
        test_grade_id="ch09-train-with-accumulation-tests",
        reference="tfm_solution.training:train_with_accumulation",
        cases=train_with_accumulation_cases,
        prerequisites=_MODEL,
        return_names=("parameters after training", "learning rate after training", "returned number of steps"),
        contract=Contract(
            dtype="the number of optimizer steps, a Python `int`; the model trains in the dtype it has",
            pure=False,
            pure_text="it changes the model's parameters, the optimizer's and the scheduler's state, as training "
                      "does; the batches are read once and left as they are",
        ),
        alternatives={
            "notes_style_solution": _ACCUMULATE(),
            "summed_then_divided": _ACCUMULATE_SCALED,
            "divided_inside": _ACCUMULATE(norm="1").replace("loss_node.backward()", "(loss_node / total).backward()"),
        },
        mutants={
            "reseeds": Mutant("random", _ACCUMULATE(train="model.train()\n    torch.manual_seed(0)")),
        },
        mistakes={
            "loss_not_divided": Mistake(
                "each micro-batch's loss is its own mean (norm = its ntokens), so the accumulated gradient is the "
                "sum of the group's means, about accum_iter times too large: divide every micro-batch's summed "
                "loss by the group's total ntokens",
                _ACCUMULATE(norm="b.ntokens")),
            "divided_by_accum_iter": Mistake(
                "each micro-batch's mean loss is divided by accum_iter: right only when every micro-batch holds "
                "as many tokens; divide the summed losses by the group's total ntokens, equation (9.5)",
                _ACCUMULATE(norm="b.ntokens * accum_iter")),
            "step_at_first_micro_batch": Mistake(
                "the optimizer steps when i % accum_iter == 0, already after the first micro-batch (i = 0): the "
                "groups are shifted and the last micro-batches never make a step",
                _NOTES_LOOP),
            "scheduler_per_micro_batch": Mistake(
                "the scheduler steps once per micro-batch: the schedule counts optimizer steps, so step it once "
                "per group, after optimizer.step()",
                _ACCUMULATE(per_micro_batch="scheduler.step()", per_step="pass")),
            "last_group_dropped": Mistake(
                "the micro-batches left after the last full group make no step: a shorter last group still "
                "makes one",
                _ACCUMULATE(stop="len(batches) - accum_iter + 1")),
            "gradients_not_zeroed": Mistake(
                "the gradients are never zeroed after a step: each group's gradient adds to the previous ones'",
                _ACCUMULATE(zero="pass")),
            "no_training_mode": Mistake(
                "the model is not put in training mode (model.train()): dropout stays off while training",
                _ACCUMULATE(train="pass")),
        },
        time_budget_s=5.0,
    ),
)
