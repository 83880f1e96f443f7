"""Chapter 2 grading: ``positional_encoding``, ``PositionalEncoding`` and ``rotation_matrix``."""

from __future__ import annotations

import torch

from autograder.exercises.shared import (Case, Contract, Exercise, Mistake, Mutant, dim, even, generators, randn,
                                         variants)

CHAPTER, NOTEBOOK = "02_positional_encoding", "positional_encoding.ipynb"

# The notes' float32 recipe is a correct answer: float32 tables may differ from the float64-then-cast
# reference by up to ~6e-5 at position 1000, far below the 0.1-size errors of the declared mistakes.
_PE_TOL = {"rtol": 1e-4, "atol": 2e-4}


def positional_encoding_cases(seed: int) -> list[Case]:
    """``positional_encoding(seq_len, d_model)``."""
    _, gen = generators(seed)
    return [
        Case("6 positions, d_model = 4", "the sinusoid table, sin in even and cos in odd columns (public)", True,
             (6, 4), **_PE_TOL),
        Case("a random table size", "shape (seq_len, d_model), float32, one frequency per pair", False,
             (dim(gen, 20, 60), even(gen, 8, 40)), **_PE_TOL),
        Case("one position, one pair", "seq_len = 1, d_model = 2: the row (sin 0, cos 0)", False, (1, 2), **_PE_TOL),
        Case("a long, wide table", "hundreds of positions, d_model in the hundreds", False,
             (dim(gen, 300, 600), even(gen, 128, 256)), **_PE_TOL),
    ]


def positional_encoding_module_cases(seed: int) -> list[Case]:
    """``PositionalEncoding(d_model, dropout, max_len=5000)``, in eval mode with the reference's buffer."""
    pub, gen = generators(seed)
    d, max_len = even(gen, 4, 32), dim(gen, 20, 60)
    full_d, default_d = even(gen, 4, 16), even(gen, 4, 16)
    long_len, bf_d = dim(gen, 100, 300), even(gen, 8, 32)
    return [
        Case("a batch of 2 sentences of length 5", "x + pe[:, :5] (public)", True, (randn(pub, 2, 5, 8),),
             construct=(8, 0.1, 16)),
        Case("a random batch shorter than max_len", "the table sliced to the input length and added", False,
             (randn(gen, dim(gen, 1, 3), dim(gen, 1, max_len - 1), d),), construct=(d, 0.1, max_len)),
        Case("a batch exactly max_len long", "every row of the table is used", False,
             (randn(gen, 2, 24, full_d),), construct=(full_d, 0.2, 24)),
        Case("default max_len", "max_len defaults to 5000: a batch of a few hundred positions", False,
             (randn(gen, 1, long_len, default_d),), construct=(default_d, 0.1)),
        Case("a bfloat16 batch", "the output keeps the dtype of x (bfloat16)", False,
             (randn(gen, 2, 9, bf_d).to(torch.bfloat16),), construct=(bf_d, 0.1, 32), rtol=1e-2, atol=1e-2),
    ]


def rotation_matrix_cases(seed: int) -> list[Case]:
    """``rotation_matrix(k, d_model)``."""
    _, gen = generators(seed)
    return [
        Case("k = 1, d_model = 4", "the block-diagonal rotation R_1, float64 (public)", True, (1, 4)),
        Case("a random offset and width", "one 2x2 rotation by k * w_i per pair", False,
             (dim(gen, 2, 40), even(gen, 6, 32))),
        Case("k = 0", "R_0 is the identity", False, (0, even(gen, 4, 16))),
        Case("a negative offset", "k < 0 turns the pairs backwards", False, (-dim(gen, 1, 30), even(gen, 6, 20))),
        Case("a large offset, wide table", "k in the hundreds, d_model = 128", False, (dim(gen, 100, 300), 128),
             rtol=1e-4, atol=1e-4),
    ]


_pe = variants('''
def positional_encoding(seq_len, d_model):
    pos = torch.arange(seq_len, dtype=torch.float64)[:, None]
    {frequencies}
    pe = torch.zeros(seq_len, d_model, dtype=torch.float64)
    {fill}
    return pe.float()
''', frequencies="omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)",
               fill="pe[:, 0::2] = torch.sin(pos * omega)\n    pe[:, 1::2] = torch.cos(pos * omega)")

_pe_module = variants('''
from torch import nn


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout, max_len=5000):
        super().__init__()
        self.d_model = d_model
        self.dropout = nn.Dropout(p=dropout)
        {table}

    def forward(self, x):
        return {forward}
''', table='self.register_buffer("pe", torch.zeros(1, max_len, d_model))',
                        forward="self.dropout(x + self.pe[:, : x.size(1)].to(x.dtype))")

_rotation = variants('''
def rotation_matrix(k, d_model):
    omega = 10000.0 ** (-torch.arange({pairs}, dtype=torch.float64) / d_model)
    theta = {theta}
    r = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        c, s = torch.cos(theta[i]), torch.sin(theta[i])
        r[2 * i, 2 * i], r[2 * i, 2 * i + 1] = c, {sign}s
        r[2 * i + 1, 2 * i], r[2 * i + 1, 2 * i + 1] = {other}s, c
    return r
''', pairs="0, d_model, 2", theta="k * omega", sign="", other="-")

_NOTES_TABLE = '''
def positional_encoding(seq_len, d_model):
    position = torch.arange(0, seq_len).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
    pe = torch.zeros(seq_len, d_model)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe
'''

_TABLE_BY_PAIRS = '''
def positional_encoding(seq_len, d_model):
    pe = torch.zeros(seq_len, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        w = 10000.0 ** (-2 * i / d_model)
        angle = torch.arange(seq_len, dtype=torch.float64) * w
        pe[:, 2 * i], pe[:, 2 * i + 1] = torch.sin(angle), torch.cos(angle)
    return pe.to(torch.float32)
'''

_TABLE_STACKED = '''
def positional_encoding(seq_len, d_model):
    omega = torch.pow(10000.0, -torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angle = torch.outer(torch.arange(seq_len, dtype=torch.float64), omega)
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(-2).float()
'''

_ROTATION_BLOCKS = '''
def rotation_matrix(k, d_model):
    blocks = []
    for i in range(d_model // 2):
        t = k * 10000.0 ** (-2 * i / d_model)
        c, s = math.cos(t), math.sin(t)
        blocks.append(torch.tensor([[c, s], [-s, c]], dtype=torch.float64))
    return torch.block_diag(*blocks)
'''

_ROTATION_KRON = '''
def rotation_matrix(k, d_model):
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    c, s = torch.cos(k * omega), torch.sin(k * omega)
    blocks = torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)   # (d/2, 2, 2)
    r = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i, block in enumerate(blocks):
        r[2 * i:2 * i + 2, 2 * i:2 * i + 2] = block
    return r
'''

_ROTATION_FROM_TABLE_ANGLES = '''
def rotation_matrix(k, d_model):
    r = torch.zeros(d_model, d_model, dtype=torch.float64)
    pairs = torch.arange(d_model // 2)
    theta = k * torch.exp(-2 * pairs.double() / d_model * math.log(10000.0))
    r[2 * pairs, 2 * pairs] = r[2 * pairs + 1, 2 * pairs + 1] = torch.cos(theta)
    r[2 * pairs, 2 * pairs + 1] = torch.sin(theta)
    r[2 * pairs + 1, 2 * pairs] = -torch.sin(theta)
    return r
'''

_PE_MODULE_TABLE = '''
from torch import nn
import torch.nn.functional as F
from tfm_solution import positional_encoding


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout, max_len=5000):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.p = dropout
        {table}

    def forward(self, x):
        {forward}
'''

EXERCISES = (
    Exercise(
        id="ch02.positional_encoding",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="positional_encoding",
        kind="function",
        signature="positional_encoding(seq_len, d_model) -> torch.Tensor",
        points=4,
        solution_grade_id="ch02-positional-encoding",
        test_grade_id="ch02-positional-encoding-tests",
        reference="tfm_solution.positional_encoding:positional_encoding",
        cases=positional_encoding_cases,
        contract=Contract(dtype="the table is a float32 tensor (computed in float64 or not: both are within the "
                                "tolerance)"),
        alternatives={"notes_float32": _NOTES_TABLE, "pair_by_pair": _TABLE_BY_PAIRS, "stacked": _TABLE_STACKED},
        mutants={
            "draws_noise": Mutant("random", _TABLE_BY_PAIRS.replace("return pe", "torch.rand(1)\n    return pe")),
        },
        mistakes={
            "sin_cos_swapped": Mistake(
                "sine and cosine are swapped: even columns take sin(pos * w_i), odd columns cos(pos * w_i)",
                _pe(fill="pe[:, 0::2] = torch.cos(pos * omega)\n    pe[:, 1::2] = torch.sin(pos * omega)")),
            "exponent_per_dimension": Mistake(
                "each dimension j got its own exponent j / d_model: i indexes dimension *pairs*, so columns "
                "2i and 2i+1 share the frequency 10000^(-2i/d_model)",
                _pe(frequencies="omega = 10000.0 ** (-torch.arange(d_model, dtype=torch.float64) / d_model)",
                    fill="pe[:, 0::2] = torch.sin(pos * omega[0::2])\n"
                         "    pe[:, 1::2] = torch.cos(pos * omega[1::2])")),
            "pair_index_not_doubled": Mistake(
                "the exponent is i / d_model with i the pair index; it must be 2i / d_model",
                _pe(frequencies="omega = 10000.0 ** (-torch.arange(d_model // 2, dtype=torch.float64) / d_model)")),
            "halves_not_interleaved": Mistake(
                "the sines fill the first half and the cosines the second; they must interleave "
                "(sin in even columns, cos in odd ones)",
                _pe(fill="pe[:, : d_model // 2] = torch.sin(pos * omega)\n"
                         "    pe[:, d_model // 2 :] = torch.cos(pos * omega)")),
            "positions_start_at_one": Mistake(
                "the first row is position 1; positions start at 0 (the first row is sin 0 = 0, cos 0 = 1)",
                _pe(fill="pe[:, 0::2] = torch.sin((pos + 1) * omega)\n"
                         "    pe[:, 1::2] = torch.cos((pos + 1) * omega)")),
        },
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch02.PositionalEncoding",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="PositionalEncoding",
        kind="module",
        signature="PositionalEncoding(d_model, dropout, max_len=5000); forward(x) -> x + pe[:, :len], dropped out",
        points=3,
        solution_grade_id="ch02-positional-encoding-module",
        test_grade_id="ch02-positional-encoding-module-tests",
        reference="tfm_solution.positional_encoding:PositionalEncoding",
        cases=positional_encoding_module_cases,
        contract=Contract(
            dtype="the result has the dtype of `x` (bfloat16 stays bfloat16; float64, in a module converted with "
                  "`.double()`, stays float64)",
            keeps_dtype=True,
            modes=("eval", "train"),
            init="as built, the buffer `pe` holds `positional_encoding(max_len, d_model)` with a leading axis of 1 "
                 "(the grader compares it before loading any weights)",
        ),
        alternatives={
            "type_as": _PE_MODULE_TABLE.format(
                table='self.register_buffer("pe", positional_encoding(max_len, d_model)[None])',
                forward="return self.dropout(x + self.pe[:, : x.size(1)].type_as(x))"),
            "functional_dropout": _PE_MODULE_TABLE.format(
                table='self.register_buffer("pe", positional_encoding(max_len, d_model).unsqueeze(0))',
                forward="return F.dropout(x + self.pe[:, : x.size(1)].to(x.dtype), self.p, self.training)"),
            "float64_buffer_narrowed": _PE_MODULE_TABLE.format(
                table='self.register_buffer("pe", positional_encoding(max_len, d_model).double()[None])',
                forward="return self.dropout(x + self.pe.narrow(1, 0, x.size(1)).to(x.dtype))"),
        },
        mutants={
            "table_of_512_rows": Mutant("structure", _PE_MODULE_TABLE.format(
                table='self.register_buffer("pe", positional_encoding(512, d_model)[None])',
                forward="return self.dropout(x + self.pe[:, : x.size(1)].to(x.dtype))")),
            "added_in_place": Mutant("inputs", _PE_MODULE_TABLE.format(
                table='self.register_buffer("pe", positional_encoding(max_len, d_model)[None])',
                forward="x += self.pe[:, : x.size(1)].to(x.dtype)\n        return self.dropout(x)")),
            "table_not_built": Mutant("init", _PE_MODULE_TABLE.format(
                table='self.register_buffer("pe", torch.zeros(1, max_len, d_model))',
                forward="return self.dropout(x + self.pe[:, : x.size(1)].to(x.dtype))")),
        },
        prerequisites=(
            "tfm_solution.positional_encoding:_check_even",
            "tfm_solution.positional_encoding:pair_frequencies",
            "tfm_solution.positional_encoding:positional_encoding",
        ),
        mistakes={
            "positions_start_at_one": Mistake(
                "the slice skips row 0 of the table: a sequence of length n takes rows 0 .. n-1, pe[:, :n]",
                _pe_module(forward="self.dropout(x + self.pe[:, 1 : x.size(1) + 1].to(x.dtype))")),
            "scales_by_sqrt_d_model": Mistake(
                "x was multiplied by sqrt(d_model): that scale belongs to the embeddings (chapter 1), "
                "the positional encoding only adds",
                _pe_module(forward="self.dropout(x * math.sqrt(self.d_model)"
                                   " + self.pe[:, : x.size(1)].to(x.dtype))")),
            "result_dtype_promoted": Mistake(
                "adding the float32 table to a lower-precision batch promoted the result to float32; "
                "cast the slice with .to(x.dtype)",
                _pe_module(forward="self.dropout(x + self.pe[:, : x.size(1)])")),
            "no_dropout": Mistake(
                "dropout is never applied: in training mode the sum x + pe[:, :len] goes through self.dropout",
                _pe_module(forward="x + self.pe[:, : x.size(1)].to(x.dtype)")),
            "pe_trainable": Mistake(
                "`pe` is a trainable nn.Parameter: the optimizer would change the table, which is fixed; "
                "register it as a buffer (self.register_buffer(\"pe\", ...))",
                _pe_module(table="self.pe = nn.Parameter(torch.zeros(1, max_len, d_model))")),
        },
        has_dropout=True,
        time_budget_s=2.0,
    ),
    Exercise(
        id="ch02.rotation_matrix",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="rotation_matrix",
        kind="function",
        signature="rotation_matrix(k, d_model) -> torch.Tensor",
        points=3,
        solution_grade_id="ch02-rotation-matrix",
        test_grade_id="ch02-rotation-matrix-tests",
        reference="tfm_solution.positional_encoding:rotation_matrix",
        cases=rotation_matrix_cases,
        contract=Contract(dtype="the matrix is a float64 tensor"),
        alternatives={"block_diag": _ROTATION_BLOCKS, "blocks_placed": _ROTATION_KRON,
                      "exp_frequencies": _ROTATION_FROM_TABLE_ANGLES},
        mutants={"float32_matrix": Mutant("dtype", _ROTATION_BLOCKS.replace("torch.block_diag(*blocks)",
                                                                            "torch.block_diag(*blocks).float()"))},
        mistakes={
            "rotates_backwards": Mistake(
                "the signs of sin(k w_i) are swapped: this is R_(-k), which maps PE(pos) to PE(pos - k)",
                _rotation(sign="-", other="")),
            "angle_without_frequency": Mistake(
                "every pair turns by k radians: pair i must turn by k * w_i, with w_i = 10000^(-2i/d_model)",
                _rotation(theta="k * torch.ones_like(omega)")),
            "pair_index_not_doubled": Mistake(
                "the frequency exponent is i / d_model with i the pair index; it must be 2i / d_model",
                _rotation(pairs="d_model // 2")),
        },
        time_budget_s=1.0,
    ),
)
