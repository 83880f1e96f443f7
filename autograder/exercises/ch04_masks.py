"""Chapter 4 grading: ``subsequent_mask``, ``Batch`` and ``masked_softmax``."""

from __future__ import annotations

import torch

from autograder.exercises.shared import (Case, Contract, Exercise, Mistake, Mutant, dim, generators, key_padding_mask,
                                         padded_lengths, randn, variants)

CHAPTER, NOTEBOOK = "04_masks", "masks.ipynb"


def subsequent_mask_cases(seed: int) -> list[Case]:
    """``subsequent_mask(size)``."""
    _, gen = generators(seed)
    cases = [Case("size 3", "the (1, 3, 3) boolean lower triangle (public)", True, (3,))]
    cases.append(Case("size 1", "a single position sees itself: (1, 1, 1) True", False, (1,)))
    for _ in range(2):
        n = dim(gen, 4, 16)
        cases.append(Case("a longer sequence", "shape (1, size, size), dtype bool, the diagonal included",
                          False, (n,)))
    return cases


def _padded_ids(gen: torch.Generator, lengths: list[int], pad: int, vocab: int = 12) -> torch.Tensor:
    """``(len(lengths), max_len)`` ids: row i has ``lengths[i]`` non-pad ids, then ``pad``."""
    width = max(lengths)
    ids = torch.randint(0, vocab - 1, (len(lengths), width), generator=gen)
    ids = ids + (ids >= pad).long()  # real tokens never equal the pad id
    keep = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~keep, pad)


_BATCH_ATTRIBUTES = ("src_mask", "tgt", "tgt_y", "tgt_mask", "ntokens")


def batch_cases(seed: int) -> list[Case]:
    """``Batch(src, tgt=None, pad=2)``: its attributes are compared."""
    pub, gen = generators(seed)
    cases = [Case("2 sentences, pad 2", "src_mask, tgt, tgt_y, tgt_mask and ntokens (public)", True,
                  (_padded_ids(pub, [4, 2], 2), _padded_ids(pub, [5, 3], 2)), {"pad": 2},
                  attributes=_BATCH_ATTRIBUTES)]
    # The exercise asks for `src` too (the training loop reads batch.src): cases of their own, so that
    # forgetting it costs these cases only.
    cases.append(Case("the source kept, 2 sentences", "`src` is the source ids, unchanged (public)", True,
                      (torch.tensor([[5, 7, 4], [6, 3, 2]]), torch.tensor([[0, 4, 8, 1], [0, 9, 1, 2]])),
                      attributes=("src",)))
    b = dim(gen, 3, 5)
    src_len, tgt_len = dim(gen, 4, 9), dim(gen, 4, 9)
    src = _padded_ids(gen, padded_lengths(gen, b, src_len), 2)
    tgt = _padded_ids(gen, padded_lengths(gen, b, tgt_len, shortest=2), 2)
    cases.append(Case("padded batch, default pad", "every attribute on a batch of sentences of mixed lengths",
                      False, (src, tgt), attributes=_BATCH_ATTRIBUTES))
    pad = dim(gen, 0, 1)
    src = _padded_ids(gen, padded_lengths(gen, 3, dim(gen, 2, 6)), pad)
    tgt = _padded_ids(gen, padded_lengths(gen, 3, dim(gen, 3, 7), shortest=2), pad)
    cases.append(Case("another pad id", "the `pad` argument is used (here it is not 2)", False, (src, tgt),
                      {"pad": pad}, attributes=_BATCH_ATTRIBUTES))
    src = _padded_ids(gen, [dim(gen, 2, 6), 1], 2)
    cases.append(Case("source only", "without a target only src_mask is built", False, (src,),
                      attributes=("src_mask",)))
    src = _padded_ids(gen, [dim(gen, 2, 6), dim(gen, 1, 6)], 2)
    cases.append(Case("the source kept", "`src` is the source ids, unchanged", False,
                      (src, _padded_ids(gen, [dim(gen, 3, 7), dim(gen, 2, 7)], 2)), attributes=("src",)))
    return cases


def masked_softmax_cases(seed: int) -> list[Case]:
    """``masked_softmax(scores, mask=None)``."""
    pub, gen = generators(seed)
    cases = [Case("2 rows, one hidden entry", "weights of a (2, 4) float32 row pair (public)", True,
                  (randn(pub, 2, 4), torch.tensor([[True, True, False, True], [True, True, True, True]])))]
    b, h, lq, lk = dim(gen, 2, 3), dim(gen, 2, 4), dim(gen, 3, 6), dim(gen, 5, 9)
    pad = key_padding_mask(padded_lengths(gen, b, lk))
    cases.append(Case("key padding mask, 4-D", "a (b, 1, 1, len_k) mask broadcast over heads and queries", False,
                      (randn(gen, b, h, lq, lk, scale=3.0), pad)))
    n = dim(gen, 4, 7)
    mask = (torch.rand(n, n, generator=gen) > 0.4).long()
    mask[dim(gen, 0, n - 1)] = 0
    cases.append(Case("a fully hidden row, float32", "an integer 0/1 mask with one row hidden entirely: "
                      "that row must be uniform, not NaN", False, (randn(gen, 2, n, n, scale=3.0), mask)))
    n = dim(gen, 4, 7)
    mask = torch.tril(torch.ones(n, n, dtype=torch.bool))
    mask[0] = False
    cases.append(Case("float16", "float16 scores with a causal mask and a fully hidden row: no overflow, no NaN",
                      False, (randn(gen, 2, n, n, dtype=torch.float16), mask), rtol=2e-3, atol=2e-3))
    cases.append(Case("bfloat16", "bfloat16 scores with a causal mask: masked weights exactly 0", False,
                      (randn(gen, 3, n, n, dtype=torch.bfloat16), torch.tril(torch.ones(n, n, dtype=torch.bool))),
                      rtol=2e-2, atol=2e-2))
    n = dim(gen, 3, 6)
    mask = torch.ones(n, n, dtype=torch.bool)
    mask[-1] = False
    cases.append(Case("float64, a fully hidden row", "dtype kept; a hidden row is uniform whatever its scores",
                      False, (randn(gen, n, n, dtype=torch.float64, scale=2.0), mask), rtol=1e-9, atol=1e-12))
    cases.append(Case("no mask", "mask=None is a plain softmax over the last axis", False,
                      (randn(gen, 3, 5, scale=2.0),)))
    return cases


_SUBSEQUENT = '''
def subsequent_mask(size):
    return {body}
'''

_batch = variants('''
class Batch:
    def __init__(self, src, tgt=None, pad=2):
        self.src = src
        self.src_mask = (src != {pad}).unsqueeze(-2)
        if tgt is not None:
            self.tgt, self.tgt_y = {shift}
            causal = torch.ones(1, self.tgt.size(-1), self.tgt.size(-1), dtype=torch.bool).tril()
            self.tgt_mask = {tgt_mask}
            self.ntokens = ({counted} != {pad}).sum()
''', pad="pad", shift="tgt[:, :-1], tgt[:, 1:]", tgt_mask="(self.tgt != pad).unsqueeze(-2) & causal",
                  counted="self.tgt_y")

_MASKED_SOFTMAX = '''
def masked_softmax(scores, mask=None):
    if mask is not None:
        {body}
    return scores.softmax(dim=-1)
'''

_NOTES_BATCH = '''
from tfm_solution import subsequent_mask


class Batch:
    def __init__(self, src, tgt=None, pad=2):
        self.src = src
        self.src_mask = (src != pad).unsqueeze(-2)
        if tgt is not None:
            self.tgt = tgt[:, :-1]
            self.tgt_y = tgt[:, 1:]
            self.tgt_mask = self.make_std_mask(self.tgt, pad)
            self.ntokens = (self.tgt_y != pad).data.sum()

    @staticmethod
    def make_std_mask(tgt, pad):
        tgt_mask = (tgt != pad).unsqueeze(-2)
        return tgt_mask & subsequent_mask(tgt.size(-1)).type_as(tgt_mask.data)
'''

_MASKED_SOFTMAX_ALTERNATIVE = '''
def masked_softmax(scores, mask=None):
    {body}
'''

EXERCISES = (
    Exercise(
        id="ch04.subsequent_mask",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="subsequent_mask",
        kind="function",
        signature="subsequent_mask(size) -> torch.Tensor",
        points=3,
        solution_grade_id="ch04-subsequent-mask",
        test_grade_id="ch04-subsequent-mask-tests",
        reference="tfm_solution.masks:subsequent_mask",
        cases=subsequent_mask_cases,
        contract=Contract(dtype="a bool tensor of shape (1, size, size)"),
        alternatives={
            "notes_triu": _SUBSEQUENT.format(body="torch.triu(torch.ones(1, size, size), diagonal=1) == 0"),
            "compare_positions": _SUBSEQUENT.format(
                body="(torch.arange(size)[None, :] <= torch.arange(size)[:, None]).unsqueeze(0)"),
            "tril_then_axis": _SUBSEQUENT.format(body="torch.tril(torch.ones(size, size, dtype=torch.bool))[None]"),
        },
        mistakes={
            "upper_triangle": Mistake(
                "True marks the future positions (the upper triangle): in this course True means *may attend*, "
                "so position i sees j <= i; the notes' triu(..., diagonal=1) still needs `== 0`",
                _SUBSEQUENT.format(body="torch.triu(torch.ones(1, size, size), diagonal=1).bool()")),
            "diagonal_hidden": Mistake(
                "the diagonal is hidden: a position must see itself (j <= i, not j < i)",
                _SUBSEQUENT.format(body="torch.ones(1, size, size, dtype=torch.bool).tril(diagonal=-1)")),
            "no_batch_axis": Mistake(
                "the mask has shape (size, size): it needs a leading axis of 1, (1, size, size), to broadcast "
                "over the batch",
                _SUBSEQUENT.format(body="torch.ones(size, size, dtype=torch.bool).tril()")),
            "float_mask": Mistake(
                "the mask is a float tensor of 0.0/1.0: return a bool tensor (`& ` with the padding mask needs one)",
                _SUBSEQUENT.format(body="torch.ones(1, size, size).tril()")),
        },
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch04.batch",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="Batch",
        kind="class",
        signature="Batch(src, tgt=None, pad=2) with src_mask, tgt, tgt_y, tgt_mask, ntokens",
        points=5,
        solution_grade_id="ch04-batch",
        test_grade_id="ch04-batch-tests",
        reference="tfm_solution.masks:Batch",
        cases=batch_cases,
        prerequisites=("tfm_solution.masks:subsequent_mask",),
        contract=Contract(dtype="`src_mask` and `tgt_mask` are bool tensors; `ntokens` is a 0-dim int64 tensor (what "
                                "`.sum()` of a bool tensor gives); `src`, `tgt` and `tgt_y` keep the ids' dtype"),
        alternatives={
            "notes_make_std_mask": _NOTES_BATCH,
            "counted_as_long": _batch(counted="self.tgt_y", tgt_mask="(self.tgt != pad)[:, None, :] & causal")
            .replace("self.ntokens = (self.tgt_y != pad).sum()", "self.ntokens = (self.tgt_y != pad).long().sum()"),
            "slices_by_narrow": _batch(shift="tgt.narrow(1, 0, tgt.size(1) - 1), tgt.narrow(1, 1, tgt.size(1) - 1)"),
        },
        mutants={
            "padding_labels_marked_in_place": Mutant("inputs", _NOTES_BATCH.replace(
                "            self.tgt_mask = self.make_std_mask(self.tgt, pad)\n",
                "            self.tgt_mask = self.make_std_mask(self.tgt, pad)\n"
                "            self.tgt_y[self.tgt_y == pad] = -100  # a view of tgt: the caller's tensor changes\n")),
        },
        mistakes={
            "no_shift": Mistake(
                "tgt and tgt_y are not shifted: the decoder reads tgt[:, :-1] and must predict tgt[:, 1:]",
                _batch(shift="tgt, tgt")),
            "causal_only": Mistake(
                "tgt_mask hides the future but not the padding: combine both masks with `&`",
                _batch(tgt_mask="causal.expand(self.tgt.size(0), -1, -1)")),
            "padding_only": Mistake(
                "tgt_mask hides the padding but not the future: combine it with subsequent_mask using `&`",
                _batch(tgt_mask="(self.tgt != pad).unsqueeze(-2).expand(-1, self.tgt.size(-1), -1)")),
            "ntokens_from_tgt": Mistake(
                "ntokens counts the decoder input tgt; the loss is taken over the labels, so count non-pad tgt_y",
                _batch(counted="self.tgt")),
            "ignores_pad_argument": Mistake(
                "the padding id 2 is hard-coded: use the `pad` argument",
                _batch(pad="2", tgt_mask="(self.tgt != 2).unsqueeze(-2) & causal")),
        },
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch04.masked_softmax",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="masked_softmax",
        kind="function",
        signature="masked_softmax(scores, mask=None) -> torch.Tensor",
        points=4,
        solution_grade_id="ch04-masked-softmax",
        test_grade_id="ch04-masked-softmax-tests",
        reference="tfm_solution.masks:masked_softmax",
        cases=masked_softmax_cases,
        contract=Contract(dtype="the result has the dtype of `scores` (float16, bfloat16, float32 and float64 alike)",
                          keeps_dtype=True, gradients=("scores",)),
        alternatives={
            "where": _MASKED_SOFTMAX_ALTERNATIVE.format(
                body="if mask is not None:\n"
                     "        scores = torch.where(mask.bool(), scores, torch.finfo(scores.dtype).min)\n"
                     "    return torch.softmax(scores, dim=-1)"),
            "not_mask": _MASKED_SOFTMAX_ALTERNATIVE.format(
                body="if mask is not None:\n"
                     "        scores = scores.masked_fill(~mask.bool(), torch.finfo(scores.dtype).min)\n"
                     "    return scores.softmax(-1)"),
            "wider_inside": _MASKED_SOFTMAX_ALTERNATIVE.format(
                body="wide = scores.to(torch.promote_types(scores.dtype, torch.float32))\n"
                     "    if mask is not None:\n"
                     "        wide = wide.masked_fill(mask == 0, torch.finfo(scores.dtype).min)\n"
                     "    return wide.softmax(dim=-1).to(scores.dtype)"),
        },
        mutants={
            "filled_in_place": Mutant("inputs", _MASKED_SOFTMAX.format(
                body="scores.masked_fill_(mask == 0, torch.finfo(scores.dtype).min)")),
            "result_as_new_tensor": Mutant("gradients", _MASKED_SOFTMAX_ALTERNATIVE.format(
                body="if mask is not None:\n"
                     "        scores = scores.masked_fill(mask == 0, torch.finfo(scores.dtype).min)\n"
                     "    return torch.tensor(scores.softmax(dim=-1).tolist(), dtype=scores.dtype)")),
        },
        mistakes={
            "neg_inf_nan_rows": Mistake(
                "hidden scores are filled with -inf: a row with every entry hidden becomes NaN; fill with "
                "torch.finfo(scores.dtype).min",
                _MASKED_SOFTMAX.format(body="scores = scores.masked_fill(mask == 0, float('-inf'))")),
            "fill_minus_1e9": Mistake(
                "hidden scores are filled with -1e9, which float16 cannot hold (its range ends at -65504); fill "
                "with torch.finfo(scores.dtype).min",
                _MASKED_SOFTMAX.format(body="scores = scores.masked_fill(mask == 0, -1e9)")),
            "additive_mask": Mistake(
                "a large negative number is added to hidden scores instead of replacing them: a fully hidden row "
                "keeps its old ranking, and the addition can change the dtype; use masked_fill",
                _MASKED_SOFTMAX.format(body="scores = scores + (mask == 0) * -1e9")),
            "mask_after_softmax": Mistake(
                "the weights are zeroed after the softmax: the rows no longer sum to 1",
                _MASKED_SOFTMAX.format(body="return scores.softmax(dim=-1).masked_fill(mask == 0, 0.0)")),
            "inverted_mask": Mistake(
                "the mask is inverted: entries where mask == 1 were hidden instead of those where mask == 0",
                _MASKED_SOFTMAX.format(
                    body="scores = scores.masked_fill(mask != 0, torch.finfo(scores.dtype).min)")),
        },
        time_budget_s=1.0,
    ),
)
