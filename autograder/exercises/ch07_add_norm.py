"""Chapter 7 grading: the notes' ``LayerNorm`` and ``SublayerConnection`` (Pre-LN and Post-LN)."""

from __future__ import annotations

import dataclasses

import torch

from autograder.exercises.shared import Case, Contract, Exercise, Mistake, Mutant, dim, generators, randn, variants

CHAPTER, NOTEBOOK = "07_add_norm", "add_norm.ipynb"


def _features(gen: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Token vectors with a different offset and spread per token, as a layer's inputs have."""
    spread = torch.rand(*shape[:-1], 1, generator=gen, dtype=dtype) * 3 + 0.2
    offset = torch.randn(*shape[:-1], 1, generator=gen, dtype=dtype) * 2
    return randn(gen, *shape, dtype=dtype) * spread + offset


def layer_norm_cases(seed: int) -> list[Case]:
    """``LayerNorm(features, eps=1e-6)``, given the reference's ``a_2`` and ``b_2`` (with seeded noise on
    them in the last case, so that an answer that ignores them is seen)."""
    pub, gen = generators(seed)
    b, n, d = dim(gen, 2, 4), dim(gen, 3, 9), dim(gen, 6, 40)
    wide = dim(gen, 256, 512)
    near_constant = 5 + 1e-4 * randn(gen, 3, dim(gen, 32, 64), dtype=torch.float64)
    return [
        Case("4 features, a batch of 2 x 3 tokens", "each token normalized over its 4 features (public)", True,
             (_features(pub, 2, 3, 4),), construct=(4,)),
        Case("a random batch of token vectors", "(batch, seq_len, features): the last axis only, unbiased std",
             False, (_features(gen, b, n, d),), construct=(d,)),
        Case("two features", "features = 2, where the unbiased std differs most from the biased one", False,
             (_features(gen, dim(gen, 3, 8), 2),), construct=(2,)),
        Case("a large eps", "eps given to the constructor and added to the std, outside the square root", False,
             (_features(gen, 2, dim(gen, 3, 6), 8),), construct=(8, 0.5)),
        Case("another eps, near-constant vectors", "the eps given to the constructor (here 1e-3) is the one used: "
             "with a spread of 1e-4 it decides the result (float64)", False,
             (5 + 1e-4 * randn(gen, 2, dim(gen, 3, 6), d, dtype=torch.float64),), construct=(d, 1e-3),
             rtol=1e-6, atol=1e-8),
        Case("near-constant vectors, float64", "spread 1e-4: eps = 1e-6 is added to the std (not inside the "
             "root); the dtype is kept", False, (near_constant,), construct=(near_constant.size(-1),),
             rtol=1e-6, atol=1e-8),
        Case("d_model in the hundreds, 2-D input", "a (tokens, features) input: no batch axis", False,
             (_features(gen, dim(gen, 4, 8), wide),), construct=(wide,)),
        Case("a learned gain and bias", "a_2 and b_2 away from ones and zeros, as after training: the output "
             "is a_2 * normalized + b_2, feature by feature", False, (_features(gen, 2, dim(gen, 3, 6), d),),
             construct=(d,), distinct=True),
    ]


_TRAIN_DROPOUT = 0.3
"""The dropout of the training-mode cases, as the grader sets it where it derives them (``cases.TRAIN_DROPOUT``)."""

_TRAIN_CHECKS = ("in training mode, with dropout 0.3 (the same fixed mask stands in for the random one in your "
                 "module and in the reference): {form}, dropout applied once, to the sublayer's output, at the "
                 "rate given to the constructor; the gradients reaching the input and every parameter are the "
                 "reference's (nothing detached)")


def sublayer_connection_cases(seed: int) -> list[Case]:
    """``SublayerConnection(size, dropout)`` (Pre-LN, the notes' call) around a stand-in sublayer that scales.

    The stand-in multiplies its input by a factor, so the answer is ``x + f * norm(x)`` (Pre-LN) or
    ``norm(x + f * x)`` (Post-LN, ``norm_position="post"``, a string the wire carries). The training-mode
    cases are written here rather than derived (the grader would copy Pre-LN cases only): the first public
    and the first hidden case of each form again, in training mode with dropout ``_TRAIN_DROPOUT``, so
    that a dropout missing from either path loses points.
    """
    pub, gen = generators(seed)

    def scale() -> dict:
        return {"module": "scale", "factor": float(torch.empty(1).uniform_(0.5, 3.0, generator=gen))}

    d_pre, d_64, d_neg, d_post = dim(gen, 6, 24), dim(gen, 8, 32), dim(gen, 6, 16), dim(gen, 6, 24)
    cases = [
        Case("Pre-LN, the notes' two-argument call", "x + sublayer(norm(x)); norm_position defaults to 'pre' "
             "(public)", True, (_features(pub, 2, 3, 8), {"module": "scale", "factor": 2.0}), construct=(8, 0.1)),
        Case("a random batch", "x + sublayer(norm(x)): the residual is x itself, the sublayer sees norm(x)", False,
             (_features(gen, dim(gen, 1, 3), dim(gen, 3, 9), d_pre), scale()), construct=(d_pre, 0.2)),
        Case("a sublayer that flips the sign", "a negative factor: x + f * norm(x) with f < 0", False,
             (_features(gen, 2, dim(gen, 3, 6), d_neg), {"module": "scale", "factor": -1.5}), construct=(d_neg, 0.1)),
        Case("float64", "the residual x is added unchanged; the dtype is kept", False,
             (_features(gen, 2, 5, d_64, dtype=torch.float64), scale()), construct=(d_64, 0.1),
             rtol=1e-6, atol=1e-8),
        Case("Post-LN, the paper's form", 'norm_position="post": norm(x + sublayer(x)) (public)', True,
             (_features(pub, 2, 3, 8), {"module": "scale", "factor": 2.0}), construct=(8, 0.1, "post")),
        Case("Post-LN on a random batch", 'norm_position="post": the sublayer sees x itself, the norm comes last',
             False, (_features(gen, dim(gen, 1, 3), dim(gen, 3, 9), d_post), scale()), construct=(d_post, 0.2, "post")),
    ]
    trained = [cases[0], cases[1], cases[4], cases[5]]  # the first public and first hidden case of each form
    return cases + [dataclasses.replace(
        case, title=f"{case.title}, in training mode",
        checks=_TRAIN_CHECKS.format(form="Post-LN: norm(x + dropout(sublayer(x)))" if case.construct[2:] == ("post",)
                                    else "Pre-LN: x + dropout(sublayer(norm(x)))")
        + (" (public)" if case.public else ""),
        construct=(case.construct[0], _TRAIN_DROPOUT, *case.construct[2:]), train=True) for case in trained]


_layer_norm = variants('''
from torch import nn


class LayerNorm(nn.Module):
    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean({axis}, keepdim=True)
        {spread}
        return {gain}(x - mean) / {denominator}{bias}
''', axis="-1", spread="std = x.std(-1, keepdim=True)", denominator="(std + self.eps)", gain="self.a_2 * ",
                   bias=" + self.b_2")

_SUBLAYER_BY_FLAG = '''
from torch import nn
import torch.nn.functional as F
from tfm_solution import LayerNorm


class SublayerConnection(nn.Module):
    def __init__(self, size, dropout, norm_position="pre"):
        super().__init__()
        self.norm = LayerNorm(size)
        self.dropout = nn.Dropout(dropout)
        self.pre = norm_position == "pre"

    def forward(self, x, sublayer):
        if self.pre:
            return torch.add(x, self.dropout(sublayer(self.norm(x))))
        return self.norm(torch.add(x, self.dropout(sublayer(x))))
'''

_sublayer = variants('''
from torch import nn


class LayerNorm(nn.Module):
    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        return self.a_2 * (x - mean) / (x.std(-1, keepdim=True) + self.eps) + self.b_2


class SublayerConnection(nn.Module):
    def __init__(self, size, dropout, norm_position="pre"):
        super().__init__()
        self.norm = LayerNorm(size)
        self.dropout = nn.Dropout(dropout)
        self.norm_position = norm_position

    def forward(self, x, sublayer):
        if self.norm_position == "post":
            return {post}
        return {pre}
''', post="self.norm(x + self.dropout(sublayer(x)))", pre="x + self.dropout(sublayer(self.norm(x)))")

EXERCISES = (
    Exercise(
        id="ch07.LayerNorm",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="LayerNorm",
        kind="module",
        signature="LayerNorm(features, eps=1e-6); forward(x) -> a_2 * (x - mean) / (std + eps) + b_2",
        points=4,
        solution_grade_id="ch07-layer-norm",
        test_grade_id="ch07-layer-norm-tests",
        reference="tfm_solution.norm:LayerNorm",
        cases=layer_norm_cases,
        contract=Contract(
            dtype="the result has the dtype of `x` (float32 in, float32 out; float64 in, float64 out)",
            keeps_dtype=True,
            modes=("eval", "train"),
            init="as built, `a_2` is all ones and `b_2` all zeros (the grader compares them before loading any "
                 "weights)",
        ),
        alternatives={
            "correction_1": _layer_norm(spread="std = torch.std(x, dim=-1, keepdim=True, correction=1)"),
            "variance_root": _layer_norm(
                spread="std = ((x - mean).pow(2).sum(-1, keepdim=True) / (x.size(-1) - 1)).sqrt()"),
            "float64_inside": _layer_norm(
                spread="wide = x.double()\n        mean = wide.mean(-1, keepdim=True)\n"
                       "        std = wide.std(-1, keepdim=True)",
                gain="(self.a_2 * ", bias=" + self.b_2).to(x.dtype)"),
        },
        mutants={
            "centred_in_place": Mutant("inputs", _layer_norm(
                spread="x -= mean\n        mean = 0\n        std = x.std(-1, keepdim=True)")),
            "gain_and_bias_swapped": Mutant("init", _layer_norm().replace(
                "nn.Parameter(torch.ones(features))", "nn.Parameter(torch.zeros(features))").replace(
                "self.b_2 = nn.Parameter(torch.zeros(features))", "self.b_2 = nn.Parameter(torch.ones(features))")),
            "eps_fixed": Mutant("eps_fixed", _layer_norm(denominator="(std + 1e-6)")),
        },
        mistakes={
            "biased_std": Mistake(
                "the standard deviation divides by d (biased); the notes' LayerNorm uses x.std(-1), which "
                "divides by d - 1",
                _layer_norm(spread="std = x.std(-1, keepdim=True, unbiased=False)")),
            "eps_inside_root": Mistake(
                "eps is added inside the square root, sqrt(var + eps); the notes add it to the standard "
                "deviation: (x - mean) / (std + eps)",
                _layer_norm(spread="var = x.var(-1, keepdim=True)", denominator="torch.sqrt(var + self.eps)")),
            "torch_flavour": Mistake(
                "this is nn.LayerNorm's formula (biased variance, eps inside the root); the notes' flavour "
                "divides by the unbiased std plus eps",
                _layer_norm(spread="var = x.var(-1, keepdim=True, unbiased=False)",
                            denominator="torch.sqrt(var + self.eps)")),
            "eps_ignored": Mistake(
                "eps is never used: divide by (std + eps); it matters for vectors whose spread is tiny",
                _layer_norm(denominator="std")),
            "gain_and_bias_ignored": Mistake(
                "a_2 and b_2 are created but never used: the output is the normalized x alone; the layer must "
                "return a_2 * normalized + b_2, so that training can rescale and shift each feature",
                _layer_norm(gain="", bias="")),
            "normalized_over_positions": Mistake(
                "the mean and std run over the positions (axis -2); layer normalization uses each token's own "
                "features, the last axis",
                _layer_norm(axis="-2", spread="std = x.std(-2, keepdim=True)")),
            "eps_fixed": Mistake(
                "eps is fixed at 1e-6: use the eps given to the constructor (self.eps)",
                _layer_norm(denominator="(std + 1e-6)")),
        },
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch07.SublayerConnection",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="SublayerConnection",
        kind="module",
        signature='SublayerConnection(size, dropout, norm_position="pre"); forward(x, sublayer)',
        points=4,
        solution_grade_id="ch07-sublayer-connection",
        test_grade_id="ch07-sublayer-connection-tests",
        reference="tfm_solution.norm:SublayerConnection",
        cases=sublayer_connection_cases,
        prerequisites=("tfm_solution.norm:LayerNorm",),
        contract=Contract(
            dtype="the result has the dtype of `x` (float32 in, float32 out; float64 in, float64 out)",
            keeps_dtype=True,
            modes=("eval", "train"),
            init="as built, `norm.a_2` is all ones and `norm.b_2` all zeros (what `LayerNorm(size)` builds)",
        ),
        alternatives={
            "pre_first": _sublayer().replace(
                '        if self.norm_position == "post":\n'
                '            return self.norm(x + self.dropout(sublayer(x)))\n'
                '        return x + self.dropout(sublayer(self.norm(x)))',
                '        if self.norm_position == "pre":\n'
                '            return x + self.dropout(sublayer(self.norm(x)))\n'
                '        return self.norm(x + self.dropout(sublayer(x)))'),
            "flag_and_add": _SUBLAYER_BY_FLAG,
            "functional_dropout": _sublayer(
                pre="x + F.dropout(sublayer(self.norm(x)), self.dropout.p, self.training)",
                post="self.norm(x + F.dropout(sublayer(x), self.dropout.p, self.training))",
            ).replace("from torch import nn\n", "from torch import nn\nimport torch.nn.functional as F\n"),
        },
        mutants={
            "post_ignored": Mutant("post_ignored", _sublayer(post="x + self.dropout(sublayer(self.norm(x)))")),
            "residual_added_in_place": Mutant("inputs", _sublayer(pre="x.add_(self.dropout(sublayer(self.norm(x))))")),
            # dropout missing in the Post-LN path only: the Post-LN training-mode cases fail, named `no_dropout`
            "no_dropout_post": Mutant("no_dropout", _sublayer(post="self.norm(x + sublayer(x))")),
        },
        mistakes={
            "post_when_pre": Mistake(
                "the Pre-LN form normalizes after the add, norm(x + sublayer(x)): that is Post-LN; Pre-LN is "
                "x + dropout(sublayer(norm(x)))",
                _sublayer(pre="self.norm(x + self.dropout(sublayer(x)))")),
            "no_residual": Mistake(
                "the residual connection is missing: add the input x to the sublayer's output",
                _sublayer(pre="self.dropout(sublayer(self.norm(x)))")),
            "residual_from_normed": Mistake(
                "the residual adds norm(x) instead of x: the stream that goes around the sublayer is the "
                "input itself, unnormalized",
                _sublayer(pre="self.norm(x) + self.dropout(sublayer(self.norm(x)))")),
            "dropout_on_residual": Mistake(
                "dropout is applied to the sum, residual included; it belongs on the sublayer's output only",
                _sublayer(pre="self.dropout(x + sublayer(self.norm(x)))")),
            # dropout in neither form: on a training-mode case it is also what an answer missing dropout in that
            # form alone computes, so this names either slip (the mutant `no_dropout_post`); a mistake missing it
            # in the Post-LN form alone would pass the notebook's visible tests, which every declared mistake fails
            "no_dropout": Mistake(
                "dropout is never applied: in training mode the sublayer's output goes through self.dropout",
                _sublayer(pre="x + sublayer(self.norm(x))", post="self.norm(x + sublayer(x))")),
            "post_ignored": Mistake(
                'norm_position="post" is ignored: the paper\'s Post-LN form is norm(x + dropout(sublayer(x))), '
                "the norm after the residual sum",
                _sublayer(post="x + self.dropout(sublayer(self.norm(x)))")),
        },
        has_dropout=True,
        time_budget_s=1.0,
    ),
)
