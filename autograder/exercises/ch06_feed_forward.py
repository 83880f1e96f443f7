"""Chapter 6 grading: ``PositionwiseFeedForward``, ``conv1d_feed_forward`` and ``gelu``."""

from __future__ import annotations

import dataclasses

import torch

from autograder.exercises.shared import Case, Contract, Exercise, Mistake, Mutant, dim, generators, randn, variants

CHAPTER, NOTEBOOK = "06_feed_forward", "feed_forward.ipynb"


def positionwise_feed_forward_cases(seed: int) -> list[Case]:
    """``PositionwiseFeedForward(d_model, d_ff, dropout=0.1)``: built with ``construct``, given the reference's weights."""
    pub, gen = generators(seed)
    cases = [Case("d_model 4, d_ff 16", "a batch of 2 sentences of 3 tokens (public)", True, (randn(pub, 2, 3, 4),),
                  construct=(4, 16, 0.1))]
    d_model = dim(gen, 4, 16)
    cases.append(Case("a random batch, d_ff = 4 d_model", "(batch, seq_len, d_model) -> the same shape", False,
                      (randn(gen, dim(gen, 2, 4), dim(gen, 3, 9), d_model, scale=2.0),),
                      construct=(d_model, 4 * d_model, 0.1)))
    d_model, d_ff = dim(gen, 3, 8), dim(gen, 9, 20)
    cases.append(Case("one token, no batch axis", "a single (d_model,) vector: nn.Linear acts on the last axis",
                      False, (randn(gen, d_model, scale=2.0),), construct=(d_model, d_ff, 0.1)))
    d_model = dim(gen, 8, 16)
    cases.append(Case("a narrow hidden layer", "d_ff smaller than d_model (the shapes of w_1 and w_2 matter)",
                      False, (randn(gen, 2, dim(gen, 3, 6), d_model, scale=2.0),),
                      construct=(d_model, dim(gen, 2, d_model - 1), 0.1)))
    for title, shape in (("large activations", (2, dim(gen, 3, 6))), ("large activations, one token", ())):
        d_model = dim(gen, 4, 12)
        cases.append(Case(title, "inputs of a few hundred: hidden activations far above 6, where the ReLU has no "
                          "upper limit (ReLU6 differs here)", False, (randn(gen, *shape, d_model, scale=300.0),),
                          construct=(d_model, 4 * d_model, 0.1), rtol=1e-4, atol=1e-2))
    return cases


def conv1d_feed_forward_cases(seed: int) -> list[Case]:
    """``conv1d_feed_forward(x, w_1, b_1, w_2, b_2)``."""
    pub, gen = generators(seed)

    def weights(g: torch.Generator, d_model: int, d_ff: int, dtype: torch.dtype = torch.float32) -> tuple:
        return (randn(g, d_ff, d_model, dtype=dtype), randn(g, d_ff, dtype=dtype),
                randn(g, d_model, d_ff, dtype=dtype), randn(g, d_model, dtype=dtype))

    cases = [Case("d_model 3, d_ff 6", "2 sentences of 4 tokens (public)", True,
                  (randn(pub, 2, 4, 3), *weights(pub, 3, 6)))]
    d_model, d_ff, n = dim(gen, 4, 12), dim(gen, 13, 40), dim(gen, 5, 12)
    cases.append(Case("a random batch", "(batch, seq_len, d_model) in and out; channels moved with a transpose",
                      False, (randn(gen, dim(gen, 2, 4), n, d_model), *weights(gen, d_model, d_ff))))
    d_model = dim(gen, 4, 10)
    cases.append(Case("a square layer", "d_ff = d_model, where a transposed weight would still run", False,
                      (randn(gen, 3, dim(gen, 3, 7), d_model), *weights(gen, d_model, d_model))))
    d_model, d_ff = dim(gen, 3, 6), dim(gen, 7, 12)
    cases.append(Case("one position", "seq_len = 1", False, (randn(gen, 2, 1, d_model), *weights(gen, d_model, d_ff))))
    d_model, d_ff = dim(gen, 4, 8), dim(gen, 9, 16)
    x = randn(gen, 2, dim(gen, 3, 6), d_model)
    x[0, 0] = 10.0  # every first-layer unit of this token is w_1 @ (10, ..., 10) + b_1: some pass 6 for sure
    cases.append(Case("large activations", "hidden activations far above 6: the ReLU has no upper limit (ReLU6 "
                      "differs here)", False, (5 * x, *weights(gen, d_model, d_ff)), rtol=1e-4, atol=1e-3))
    # The exercise asks for convolutions: copies of the first public and the first hidden case on which
    # every conv1d call adds a mark to its result, here and in the reference; only a result that the
    # convolutions compute carries it (a matrix product, or a convolution called and thrown away, does not).
    through = ("computed by the convolutions: on this case every call of torch's conv1d (`nn.Conv1d` or "
               "`F.conv1d`) adds to its result an offset the grader draws afresh for each call, in your code "
               "and in the reference alike, so a result computed without them (`@`, `matmul`, `einsum`, "
               "`F.linear`) misses those offsets")
    cases += [dataclasses.replace(c, title=f"{c.title}, through torch's conv1d", marked=("conv1d",),
                                  checks=through + (" (public)" if c.public else "")) for c in cases[:2]]
    return cases


def gelu_cases(seed: int) -> list[Case]:
    """``gelu(x)``: exact, so the float64 cases are tight enough to tell the tanh approximation apart."""
    pub, gen = generators(seed)
    cases = [Case("9 values from -4 to 4", "x * Phi(x), float64 (public)", True,
                  (torch.linspace(-4, 4, 9, dtype=torch.float64),), rtol=1e-9, atol=1e-12)]
    cases.append(Case("a random tensor, float64", "every element, any shape: (a, b, c)", False,
                      (randn(gen, dim(gen, 2, 4), dim(gen, 3, 6), dim(gen, 3, 6), dtype=torch.float64, scale=2.0),),
                      rtol=1e-9, atol=1e-12))
    cases.append(Case("near zero, float64", "small inputs, where GELU(x) is about x / 2", False,
                      (randn(gen, 50, dtype=torch.float64, scale=0.05),), rtol=1e-9, atol=1e-12))
    cases.append(Case("large inputs, float32", "far from 0 GELU is the ReLU; no overflow; dtype kept", False,
                      (randn(gen, 4, 20, scale=8.0),)))
    cases.append(Case("bfloat16", "the dtype is kept (bfloat16)", False,
                      (randn(gen, 3, 8, dtype=torch.bfloat16, scale=2.0),), rtol=2e-2, atol=2e-2))
    return cases


_FFN = '''
from torch import nn


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return {result}
'''

_CONV = '''
import torch.nn.functional as F


def conv1d_feed_forward(x, w_1, b_1, w_2, b_2):
    channels = {channels}
    hidden = F.conv1d(channels, {kernel}, b_1){activation}
    out = F.conv1d(hidden, w_2.unsqueeze(-1), b_2)
    return {back}
'''

_conv = variants(_CONV, channels="x.transpose(1, 2)", kernel="w_1.unsqueeze(-1)", activation=".relu()",
                 back="out.transpose(1, 2)")

_GELU = '''
def gelu(x):
    return {body}
'''

_CONV_MODULES = '''
from torch import nn


def conv1d_feed_forward(x, w_1, b_1, w_2, b_2):
    d_ff, d_model = w_1.shape
    first, second = nn.Conv1d(d_model, d_ff, kernel_size=1), nn.Conv1d(d_ff, d_model, kernel_size=1)
    with torch.no_grad():
        first.weight.copy_(w_1.unsqueeze(-1))
        first.bias.copy_(b_1)
        second.weight.copy_(w_2.unsqueeze(-1))
        second.bias.copy_(b_2)
    return second(torch.relu(first(x.transpose(1, 2)))).transpose(1, 2)
'''

EXERCISES = (
    Exercise(
        id="ch06.positionwise_feed_forward",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="PositionwiseFeedForward",
        kind="module",
        signature="PositionwiseFeedForward(d_model, d_ff, dropout=0.1); forward(x) -> x.shape",
        points=4,
        solution_grade_id="ch06-positionwise-feed-forward",
        test_grade_id="ch06-positionwise-feed-forward-tests",
        reference="tfm_solution.feed_forward:PositionwiseFeedForward",
        cases=positionwise_feed_forward_cases,
        has_dropout=True,
        contract=Contract(
            dtype="the output has the dtype of the module and of `x`: float32, or float64 after `.double()`",
            keeps_dtype=True,
            modes=("eval", "train"),
        ),
        alternatives={
            "functional_relu": _FFN.format(result="self.w_2(self.dropout(nn.functional.relu(self.w_1(x))))"),
            "clamp": _FFN.format(result="self.w_2(self.dropout(self.w_1(x).clamp_min(0)))"),
            "functional_dropout": "import torch.nn.functional as F\n" + _FFN.format(
                result="self.w_2(F.dropout(F.relu(F.linear(x, self.w_1.weight, self.w_1.bias)), self.dropout.p, "
                       "self.training))"),
        },
        mutants={
            "relu6": Mutant("relu6", _FFN.format(result="self.w_2(self.dropout(nn.functional.relu6(self.w_1(x))))")),
            "computed_in_float32": Mutant("dtype", _FFN.format(result="self.w_2.float()(self.dropout(self.w_1.float()"
                                                                      "(x.float()).relu()))")),
            "dropout_rate_fixed": Mutant("modes", _FFN.replace("nn.Dropout(dropout)", "nn.Dropout(0.1)").format(
                result="self.w_2(self.dropout(self.w_1(x).relu()))")),
        },
        mistakes={
            "no_relu": Mistake(
                "there is no ReLU between w_1 and w_2: the two layers collapse into one linear map",
                _FFN.format(result="self.w_2(self.dropout(self.w_1(x)))")),
            "relu_after_w_2": Mistake(
                "the ReLU is applied to the output of w_2; it belongs between w_1 and w_2",
                _FFN.format(result="self.w_2(self.dropout(self.w_1(x))).relu()")),
            "gelu_instead_of_relu": Mistake(
                "GELU is used where the notes' FFN has a ReLU (the trained weights expect the ReLU)",
                _FFN.format(result="self.w_2(self.dropout(nn.functional.gelu(self.w_1(x))))")),
            "dropout_on_input": Mistake(
                "dropout is applied to the input x, before w_1; the notes apply it to the hidden activations, "
                "after the ReLU",
                _FFN.format(result="self.w_2(self.w_1(self.dropout(x)).relu())")),
            "dropout_after_w_2": Mistake(
                "dropout is applied to the output of w_2; the notes apply it to the hidden activations, before w_2",
                _FFN.format(result="self.dropout(self.w_2(self.w_1(x).relu()))")),
            "relu6": Mistake(
                "the activation stops at 6 (ReLU6, or a clamp at 6): the ReLU of equation (6.2) is max(0, z), with "
                "no upper limit",
                _FFN.format(result="self.w_2(self.dropout(self.w_1(x).clamp(0, 6)))")),
        },
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch06.conv1d_feed_forward",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="conv1d_feed_forward",
        kind="function",
        signature="conv1d_feed_forward(x, w_1, b_1, w_2, b_2) -> (batch, seq_len, d_model)",
        points=3,
        solution_grade_id="ch06-conv1d-feed-forward",
        test_grade_id="ch06-conv1d-feed-forward-tests",
        reference="tfm_solution.feed_forward:conv1d_feed_forward",
        cases=conv1d_feed_forward_cases,
        contract=Contract(
            dtype="`x` and the weights are float32, and so is the result (the grader uses no other dtype)",
            gradients=("x",),
            draws=True,
            draws_text="the call may draw random numbers (building `nn.Conv1d` layers draws their initial weights "
                       "from torch's generator before you overwrite them); the result must not depend on them",
        ),
        alternatives={
            "conv1d_modules": _CONV_MODULES,
            "permute": _conv(channels="x.permute(0, 2, 1)", back="out.permute(0, 2, 1)"),
            "kernels_by_view": _conv(kernel="w_1.view(*w_1.shape, 1)", channels="x.mT", back="out.mT"),
            "conv1d_by_name": '''
from torch.nn.functional import conv1d


def conv1d_feed_forward(x, w_1, b_1, w_2, b_2):
    hidden = torch.relu(conv1d(x.transpose(1, 2), w_1[:, :, None]) + b_1[:, None])  # biases added apart
    return (conv1d(hidden, w_2[:, :, None]) + b_2[:, None]).transpose(1, 2)
''',
        },
        mutants={
            "cut_with_data": Mutant("gradients", _conv(channels="x.data.transpose(1, 2)")),
            "relu6": Mutant("relu6", _conv(activation=".clamp(0, 6)")),
            "convolution_thrown_away": Mutant("through torch's conv1d", '''
import torch.nn.functional as F


def conv1d_feed_forward(x, w_1, b_1, w_2, b_2):
    F.conv1d(x.transpose(1, 2), w_1.unsqueeze(-1), b_1)  # called for show, its result unused
    return (x @ w_1.T + b_1).relu() @ w_2.T + b_2
'''),
            "conv1d_imported_by_name": Mutant("computed by the convolutions", '''
from torch.nn.functional import conv1d


def conv1d_feed_forward(x, w_1, b_1, w_2, b_2):
    hidden = conv1d(x.transpose(1, 2), w_1.unsqueeze(-1), b_1).relu()
    return torch.einsum("bfs,mf->bsm", hidden, w_2) + b_2  # the second layer without a convolution
'''),
        },
        mistakes={
            "matrix_products": Mistake(
                "the result is computed with matrix products, not with convolutions: the exercise asks for two "
                "1-D convolutions of kernel size 1 (`nn.Conv1d` layers or `F.conv1d`)",
                '''
def conv1d_feed_forward(x, w_1, b_1, w_2, b_2):
    return (x @ w_1.T + b_1).relu() @ w_2.T + b_2
'''),
            "channels_by_reshape": Mistake(
                "the input was reshaped to (batch, d_model, seq_len) instead of transposed: the numbers stay in "
                "place and are read as the wrong channels. Use x.transpose(1, 2)",
                _conv(channels="x.reshape(x.size(0), x.size(2), x.size(1))",
                      back="out.reshape(out.size(0), out.size(2), out.size(1))")),
            "no_transpose_back": Mistake(
                "the result is still (batch, d_model, seq_len): transpose it back to (batch, seq_len, d_model)",
                _conv(back="out")),
            "kernel_transposed": Mistake(
                "the weight was transposed before it became a kernel: nn.Linear and Conv1d both store (out, in); "
                "add the kernel axis with unsqueeze(-1) only",
                _conv(kernel="w_1.T.unsqueeze(-1)")),
            "no_relu": Mistake(
                "there is no ReLU between the two convolutions",
                _conv(activation="")),
            "relu6": Mistake(
                "the activation stops at 6 (ReLU6, or a clamp at 6): the FFN's ReLU is max(0, z), with no upper limit",
                _conv(activation=".clamp(0, 6)")),
        },
        banned=("linear", "matmul", "einsum", "mm", "bmm", "tensordot", "addmm", "baddbmm"),
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch06.gelu",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="gelu",
        kind="function",
        signature="gelu(x) -> x * Phi(x), same shape and dtype",
        points=3,
        solution_grade_id="ch06-gelu",
        test_grade_id="ch06-gelu-tests",
        reference="tfm_solution.feed_forward:gelu",
        cases=gelu_cases,
        contract=Contract(dtype="the result has the dtype of `x` (float32, float64 and bfloat16 alike)",
                          keeps_dtype=True, gradients=("x",)),
        alternatives={
            "erfc": _GELU.format(body="x * 0.5 * torch.erfc(-x / math.sqrt(2.0))"),
            "halved_first": _GELU.format(body="x / 2 * (1 + torch.erf(x * 2 ** -0.5))"),
            "phi_named": _GELU.format(body="x * ((1.0 + torch.special.erf(x / math.sqrt(2))) / 2)"),
        },
        mutants={
            "scaled_in_place": Mutant("inputs", _GELU.format(body="x.mul_(0.5 * (1 + torch.erf(x / math.sqrt(2))))")),
            "result_as_new_tensor": Mutant("gradients", _GELU.format(
                body="torch.tensor((0.5 * x * (1 + torch.erf(x / math.sqrt(2)))).tolist(), dtype=x.dtype)")),
        },
        mistakes={
            "tanh_approximation": Mistake(
                "this is the tanh approximation of GELU (off by up to about 5e-4); use the exact "
                "x * (1 + erf(x / sqrt(2))) / 2",
                _GELU.format(body="0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))")),
            "sigmoid_approximation": Mistake(
                "this is the sigmoid approximation x * sigmoid(1.702 x); use the exact x * Phi(x)",
                _GELU.format(body="x * torch.sigmoid(1.702 * x)")),
            "erf_without_sqrt2": Mistake(
                "erf(x) is not the normal CDF: Phi(x) = (1 + erf(x / sqrt(2))) / 2",
                _GELU.format(body="0.5 * x * (1 + torch.erf(x))")),
            "missing_half": Mistake(
                "the factor 1/2 is missing: Phi(x) = (1 + erf(x / sqrt(2))) / 2",
                _GELU.format(body="x * (1 + torch.erf(x / math.sqrt(2)))")),
        },
        banned=("gelu", "GELU"),
        time_budget_s=1.0,
    ),
)
