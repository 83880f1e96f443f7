"""Chapter 1 grading: ``Embeddings`` and ``cosine_similarity_matrix``."""

from __future__ import annotations

import torch

from autograder.exercises.shared import Case, Contract, Exercise, Mistake, Mutant, dim, generators, randn

CHAPTER, NOTEBOOK = "01_embeddings", "embeddings.ipynb"


def embeddings_cases(seed: int) -> list[Case]:
    """``Embeddings(d_model, vocab)``: built with ``construct``, given the reference's table."""
    pub, gen = generators(seed)
    cases = [Case("d_model 4, vocab 6", "a batch of 2 sentences of 3 ids (public)", True,
                  (torch.randint(0, 6, (2, 3), generator=pub),), construct=(4, 6))]
    d, vocab = 2 * dim(gen, 8, 32), dim(gen, 20, 60)
    cases.append(Case("a batch of sentences", "ids (batch, seq_len) -> (batch, seq_len, d_model), times sqrt(d_model)",
                      False, (torch.randint(0, vocab, (dim(gen, 2, 4), dim(gen, 5, 12)), generator=gen),),
                      construct=(d, vocab)))
    d, vocab = dim(gen, 5, 11) | 1, dim(gen, 8, 16)
    cases.append(Case("odd d_model, repeated ids", "sqrt(d_model) is not an integer; every id appears several times",
                      False, (torch.randint(0, vocab, (3, 4 * vocab), generator=gen),), construct=(d, vocab)))
    d, vocab = dim(gen, 64, 128), dim(gen, 100, 300)
    cases.append(Case("three index dimensions, wide d_model", "ids of any shape: (a, b, c) -> (a, b, c, d_model)",
                      False, (torch.randint(0, vocab, (2, 3, dim(gen, 2, 5)), generator=gen),), construct=(d, vocab)))
    return cases


def cosine_similarity_matrix_cases(seed: int) -> list[Case]:
    """``cosine_similarity_matrix(vectors, eps=1e-8)``."""
    pub, gen = generators(seed)
    cases = [Case("4 vectors of dimension 3", "every pair of rows (public)", True, (randn(pub, 4, 3),))]
    b, n, d = dim(gen, 2, 4), dim(gen, 3, 8), dim(gen, 4, 16)
    cases.append(Case("a batch of tables", "(batch, n, d) -> (batch, n, n)", False, (randn(gen, b, n, d),)))
    n, d = dim(gen, 4, 9), dim(gen, 3, 8)
    lengths = torch.exp(torch.randn(n, 1, generator=gen) * 3)
    cases.append(Case("vectors of very different lengths", "each vector is divided by its own length (over the last "
                      "axis), so lengths from about 0.001 to 1000 do not matter", False, (randn(gen, n, d) * lengths,),
                      atol=1e-5))
    n, d = dim(gen, 4, 8), dim(gen, 2, 6)
    x = randn(gen, 2, n, d, dtype=torch.float64)
    x[dim(gen, 0, 1), dim(gen, 0, n - 1)] = 0
    cases.append(Case("a zero vector, float64", "a zero vector has similarity 0 with everything (no NaN); dtype kept",
                      False, (x,), rtol=1e-9, atol=1e-12))
    return cases


_EMBEDDINGS = '''
from torch import nn


class Embeddings(nn.Module):
    def __init__(self, d_model, vocab):
        super().__init__()
        self.lut = nn.Embedding(vocab, d_model)
        self.d_model = d_model

    def forward(self, x):
        return {result}
'''

_COSINE = '''
def cosine_similarity_matrix(vectors, eps=1e-8):
    {body}
'''

EXERCISES = (
    Exercise(
        id="ch01.embeddings",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="Embeddings",
        kind="module",
        signature="Embeddings(d_model, vocab); forward(x) -> x.shape + (d_model,)",
        points=5,
        solution_grade_id="ch01-embeddings",
        test_grade_id="ch01-embeddings-tests",
        reference="tfm_solution.embeddings:Embeddings",
        cases=embeddings_cases,
        contract=Contract(
            dtype="the result has the table's dtype: float32 as built, float64 after `.double()`",
            keeps_dtype=True,
            modes=("eval", "train"),
        ),
        alternatives={
            "power_half": _EMBEDDINGS.format(result="self.lut(x) * self.d_model ** 0.5"),
            "functional_lookup": "import torch.nn.functional as F\n" + _EMBEDDINGS.format(
                result="math.sqrt(self.d_model) * F.embedding(x, self.lut.weight)"),
            "rows_by_index": _EMBEDDINGS.format(result="self.lut.weight[x] * math.sqrt(self.d_model)"),
            "scaled_in_place": _EMBEDDINGS.format(result="self.lut(x).mul_(math.sqrt(self.d_model))"),
        },
        mutants={
            "lookup_detached": Mutant("modes", _EMBEDDINGS.format(
                result="self.lut(x).detach() * math.sqrt(self.d_model)")),
            "reseeds": Mutant("random", _EMBEDDINGS.format(
                result="(torch.manual_seed(0), self.lut(x) * math.sqrt(self.d_model))[1]")),
        },
        mistakes={
            "missing_scale": Mistake(
                "the lookup is not multiplied by sqrt(d_model)",
                _EMBEDDINGS.format(result="self.lut(x)")),
            "divides_by_sqrt": Mistake(
                "the lookup is divided by sqrt(d_model); the notes multiply by it",
                _EMBEDDINGS.format(result="self.lut(x) / math.sqrt(self.d_model)")),
            "scale_by_d_model": Mistake(
                "the lookup is multiplied by d_model instead of sqrt(d_model)",
                _EMBEDDINGS.format(result="self.lut(x) * self.d_model")),
        },
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch01.cosine_similarity_matrix",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="cosine_similarity_matrix",
        kind="function",
        signature="cosine_similarity_matrix(vectors, eps=1e-8) -> torch.Tensor",
        points=5,
        solution_grade_id="ch01-cosine-similarity-matrix",
        test_grade_id="ch01-cosine-similarity-matrix-tests",
        reference="tfm_solution.embeddings:cosine_similarity_matrix",
        cases=cosine_similarity_matrix_cases,
        contract=Contract(
            dtype="the result has the dtype of `vectors` (float32 in, float32 out; float64 in, float64 out)",
            keeps_dtype=True,
        ),
        alternatives={
            "normalize": _COSINE.format(body="unit = torch.nn.functional.normalize(vectors, dim=-1, eps=eps)\n"
                                             "    return unit @ unit.transpose(-2, -1)"),
            "dots_over_lengths": _COSINE.format(
                body="length = vectors.norm(dim=-1).clamp_min(eps)\n"
                     "    dots = vectors @ vectors.transpose(-2, -1)\n"
                     "    return dots / (length[..., :, None] * length[..., None, :])"),
            "einsum": _COSINE.format(body="length = (vectors * vectors).sum(-1, keepdim=True).sqrt().clamp_min(eps)\n"
                                          "    unit = vectors / length\n"
                                          "    return torch.einsum('...id,...jd->...ij', unit, unit)"),
        },
        mutants={
            "normalised_in_place": Mutant("inputs", _COSINE.format(
                body="vectors /= vectors.norm(dim=-1, keepdim=True).clamp_min(eps)\n"
                     "    return vectors @ vectors.transpose(-2, -1)")),
        },
        mistakes={
            "dot_product_only": Mistake(
                "these are plain dot products: each vector must first be divided by its length",
                _COSINE.format(body="return vectors @ vectors.transpose(-2, -1)")),
            "normalised_wrong_axis": Mistake(
                "the lengths were taken over the wrong axis (dim=-2, across vectors); a vector's length is over "
                "its own entries, the last axis",
                _COSINE.format(body="unit = vectors / vectors.norm(dim=-2, keepdim=True).clamp_min(eps)\n"
                                    "    return unit @ unit.transpose(-2, -1)")),
            "zero_vector_nan": Mistake(
                "a zero vector gives 0/0 = NaN: clamp each length below at eps (norm.clamp_min(eps))",
                _COSINE.format(body="unit = vectors / vectors.norm(dim=-1, keepdim=True)\n"
                                    "    return unit @ unit.transpose(-2, -1)")),
        },
        banned=("cosine_similarity",),
        time_budget_s=1.0,
    ),
)
