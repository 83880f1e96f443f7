"""The exercise registry: the one table that names every graded exercise of the course.

Generation (``make chapters``), the grader, the tests and the README's exercise table all
read this table; nothing else repeats it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Exercise:
    """One graded exercise.

    Attributes:
        id: stable identifier, ``"chNN.name"``.
        chapter: the chapter folder under ``solutions/`` and ``chapters/`` (= nbgrader assignment).
        notebook: the notebook file inside that folder.
        name: the top-level name the student defines (function or class).
        kind: ``"function"``, ``"module"`` (an ``nn.Module`` subclass) or ``"class"`` (a plain
            class whose instance attributes are graded, see ``Case.attributes``).
        signature: as shown to the student.
        points: the exercise's weight.
        solution_grade_id: nbgrader ``grade_id`` of the cell holding the answer.
        test_grade_id: nbgrader ``grade_id`` of the graded (hidden) test cell.
        reference: ``"module:attr"`` of the reference implementation in ``tfm_solution``.
        prerequisites: names the exercise may use, injected from ``tfm_solution`` when grading.
        time_budget_s: wall seconds one graded call may take before it is reported as too slow
            (reported apart, never counted as wrong; a call is killed only at the worker's timeout).
        memory_budget_mb: address-space limit of the grading worker.
        mistakes: the declared mistakes the grader names when an output matches one.
        banned: library shortcuts reported by the policy check for this exercise.
    """

    id: str
    chapter: str
    notebook: str
    name: str
    kind: Literal["function", "module", "class"]
    signature: str
    points: int
    solution_grade_id: str
    test_grade_id: str
    reference: str
    prerequisites: tuple[str, ...] = ()
    time_budget_s: float = 10.0
    memory_budget_mb: int = 2048
    mistakes: tuple[str, ...] = ()
    banned: tuple[str, ...] = ()


REGISTRY: tuple[Exercise, ...] = (
    Exercise(
        id="ch01.embeddings",
        chapter="01_embeddings",
        notebook="embeddings.ipynb",
        name="Embeddings",
        kind="module",
        signature="Embeddings(d_model, vocab); forward(x) -> x.shape + (d_model,)",
        points=5,
        solution_grade_id="ch01-embeddings",
        test_grade_id="ch01-embeddings-tests",
        reference="tfm_solution.embeddings:Embeddings",
        mistakes=("missing_scale", "divides_by_sqrt", "scale_by_d_model"),
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch01.cosine_similarity_matrix",
        chapter="01_embeddings",
        notebook="embeddings.ipynb",
        name="cosine_similarity_matrix",
        kind="function",
        signature="cosine_similarity_matrix(vectors, eps=1e-8) -> torch.Tensor",
        points=5,
        solution_grade_id="ch01-cosine-similarity-matrix",
        test_grade_id="ch01-cosine-similarity-matrix-tests",
        reference="tfm_solution.embeddings:cosine_similarity_matrix",
        mistakes=("dot_product_only", "normalised_wrong_axis", "zero_vector_nan"),
        banned=("cosine_similarity",),
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch02.positional_encoding",
        chapter="02_positional_encoding",
        notebook="positional_encoding.ipynb",
        name="positional_encoding",
        kind="function",
        signature="positional_encoding(seq_len, d_model) -> torch.Tensor",
        points=4,
        solution_grade_id="ch02-positional-encoding",
        test_grade_id="ch02-positional-encoding-tests",
        reference="tfm_solution.positional_encoding:positional_encoding",
        mistakes=(
            "sin_cos_swapped",
            "exponent_per_dimension",
            "pair_index_not_doubled",
            "halves_not_interleaved",
            "positions_start_at_one",
        ),
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch02.PositionalEncoding",
        chapter="02_positional_encoding",
        notebook="positional_encoding.ipynb",
        name="PositionalEncoding",
        kind="module",
        signature="PositionalEncoding(d_model, dropout, max_len=5000); forward(x) -> x + pe[:, :len], dropped out",
        points=3,
        solution_grade_id="ch02-positional-encoding-module",
        test_grade_id="ch02-positional-encoding-module-tests",
        reference="tfm_solution.positional_encoding:PositionalEncoding",
        prerequisites=(
            "tfm_solution.positional_encoding:_check_even",
            "tfm_solution.positional_encoding:pair_frequencies",
            "tfm_solution.positional_encoding:positional_encoding",
        ),
        mistakes=("positions_start_at_one", "scales_by_sqrt_d_model", "result_dtype_promoted"),
        time_budget_s=2.0,
    ),
    Exercise(
        id="ch02.rotation_matrix",
        chapter="02_positional_encoding",
        notebook="positional_encoding.ipynb",
        name="rotation_matrix",
        kind="function",
        signature="rotation_matrix(k, d_model) -> torch.Tensor",
        points=3,
        solution_grade_id="ch02-rotation-matrix",
        test_grade_id="ch02-rotation-matrix-tests",
        reference="tfm_solution.positional_encoding:rotation_matrix",
        mistakes=("rotates_backwards", "angle_without_frequency", "pair_index_not_doubled"),
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch03.attention",
        chapter="03_attention",
        notebook="attention.ipynb",
        name="attention",
        kind="function",
        signature="attention(query, key, value, mask=None, dropout=None) -> (output, p_attn)",
        points=6,
        solution_grade_id="ch03-attention",
        test_grade_id="ch03-attention-tests",
        reference="tfm_solution.attention:attention",
        mistakes=(
            "missing_scale",
            "scale_by_d_k",
            "softmax_wrong_axis",
            "inverted_mask",
            "mask_after_softmax",
            "neg_inf_nan_rows",
            "no_transpose",
        ),
        banned=("scaled_dot_product_attention", "MultiheadAttention"),
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch03.softmax_saturation",
        chapter="03_attention",
        notebook="attention.ipynb",
        name="softmax_saturation",
        kind="function",
        signature="softmax_saturation(query, key, scaled=True) -> torch.Tensor",
        points=4,
        solution_grade_id="ch03-softmax-saturation",
        test_grade_id="ch03-softmax-saturation-tests",
        reference="tfm_solution.attention:softmax_saturation",
        mistakes=("ignores_scaled_flag", "min_instead_of_max"),
        banned=("scaled_dot_product_attention",),
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch04.subsequent_mask",
        chapter="04_masks",
        notebook="masks.ipynb",
        name="subsequent_mask",
        kind="function",
        signature="subsequent_mask(size) -> torch.Tensor",
        points=3,
        solution_grade_id="ch04-subsequent-mask",
        test_grade_id="ch04-subsequent-mask-tests",
        reference="tfm_solution.masks:subsequent_mask",
        mistakes=("upper_triangle", "diagonal_hidden", "no_batch_axis", "float_mask"),
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch04.batch",
        chapter="04_masks",
        notebook="masks.ipynb",
        name="Batch",
        kind="class",
        signature="Batch(src, tgt=None, pad=2) with src_mask, tgt, tgt_y, tgt_mask, ntokens",
        points=5,
        solution_grade_id="ch04-batch",
        test_grade_id="ch04-batch-tests",
        reference="tfm_solution.masks:Batch",
        prerequisites=("tfm_solution.masks:subsequent_mask",),
        mistakes=("no_shift", "causal_only", "padding_only", "ntokens_from_tgt", "ignores_pad_argument"),
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch04.masked_softmax",
        chapter="04_masks",
        notebook="masks.ipynb",
        name="masked_softmax",
        kind="function",
        signature="masked_softmax(scores, mask=None) -> torch.Tensor",
        points=4,
        solution_grade_id="ch04-masked-softmax",
        test_grade_id="ch04-masked-softmax-tests",
        reference="tfm_solution.masks:masked_softmax",
        mistakes=("neg_inf_nan_rows", "fill_minus_1e9", "additive_mask", "mask_after_softmax", "inverted_mask"),
        time_budget_s=1.0,
    ),
)


def by_id(exercise_id: str) -> Exercise:
    """The exercise with this id; ``KeyError`` if there is none."""
    for exercise in REGISTRY:
        if exercise.id == exercise_id:
            return exercise
    raise KeyError(exercise_id)


def by_chapter(chapter: str) -> list[Exercise]:
    """The exercises of one chapter folder, in registry order."""
    return [e for e in REGISTRY if e.chapter == chapter]


def chapters() -> list[str]:
    """Chapter folders that have exercises, in order."""
    return sorted({e.chapter for e in REGISTRY})
