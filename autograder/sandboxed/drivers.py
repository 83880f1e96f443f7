"""Fixed procedures a case runs around the answer instead of calling it (``Case.driver``).
"""

from __future__ import annotations

import sys


def train_accumulated(fn, args: list, classes: dict) -> tuple:
    """Drive a ``train_with_accumulation(model, batches, loss_compute, optimizer, scheduler, accum_iter)``
    (chapter 9) as a ``driver="accumulation"`` case does, here and in the harness alike.

    ``args`` = ``(model, micro-batches ((src, tgt), ...), accum_iter, lr)``, the model built (seeded)
    from its description. It trains in float64 and arrives in eval mode (the function must switch it
    to training). The loss is the summed negative log-likelihood of the real labels through the
    reference's ``SimpleLossCompute``; the optimizer is SGD with momentum (its step is proportional to
    the gradient, unlike Adam's) and the schedule ``LambdaLR`` with ``1 / (1 + step)``, so stepping it
    per micro-batch shows. Returns ``(every parameter, flattened; the learning rate after; what fn returned)``.
    """
    import torch

    model, micro, accum_iter, lr = args
    model = model.double().eval()
    pad = 2  # the course's <blank>
    batches = [classes["Batch"](src, tgt, pad) for src, tgt in micro]

    def summed_nll(log_probs, labels):
        return torch.nn.functional.nll_loss(log_probs, labels, ignore_index=pad, reduction="sum")

    loss_compute = classes["SimpleLossCompute"](model.generator, summed_nll)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    returned = fn(model, iter(batches), loss_compute, optimizer, scheduler, accum_iter)
    parameters = torch.cat([p.detach().flatten() for p in model.parameters()])
    # The rate as a 0-dim tensor: a difference is then reported by its size, as every other number's.
    return parameters, torch.tensor(float(optimizer.param_groups[0]["lr"]), dtype=torch.float64), returned


_TRAINED: dict = {}
"""Chapter 12's runs, by task: the cases of one worker share one training run (one translation)."""


def _located(exc: BaseException) -> RuntimeError:
    """``exc`` with where in the student's code it was raised (the innermost of their cells on the stack)."""
    import traceback

    theirs = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(("/", "<"))]
    where = f" (raised in {theirs[-1].filename}, line {theirs[-1].lineno}, in `{theirs[-1].name}`)" if theirs else ""
    return RuntimeError(f"{type(exc).__name__}: {exc}{where}"[:2000])


UNCHANGED_SENT = 32
"""At most this many names of unchanged parameter tensors cross (the wire carries sequences of up to 64 items)."""


def capstone_reversal(fn, args: list, classes: dict) -> tuple:
    """Chapter 12, Part A: train the submission's own model with its own loop on the reversal task
    (``tfm_solution.capstone.train_reversal``), then decode held-out sequences with its greedy decoders.

    ``args`` = ``(task, eval_seed)``. Everything the model computes comes from the submission's
    namespace; the course's procedure only draws the data, counts the optimizer's steps and decodes with
    its own greedy loop (the graded accuracy). One training run serves every case of this worker.
    Returns ids, never shares (the harness scores them against the sequences it draws itself):
    ``(the course loop's ids, their cached ids, teacher-forced predictions, cached tokens/s, uncached
    tokens/s, training CPU seconds, optimizer steps taken, planned steps, loss curve (chunks + 1, 2),
    their uncached ids, share of parameters changed, step of the kept weights, repeatable in evaluation, names of
    the first ``UNCHANGED_SENT`` parameter tensors training never changed, the classes that cut the graph, how many
    tensors it never changed)``
    (``autograder.capstone.REPLY`` names them).
    """
    import torch

    task, eval_seed = args
    parts = vars(sys.modules["submission"])
    try:
        key = repr(task)
        if key not in _TRAINED:
            _TRAINED[key] = classes["train_reversal"](parts, task)
        trained = _TRAINED[key]
        found = classes["evaluate_reversal"](parts, trained.model, task, int(eval_seed))
    except Exception as exc:  # noqa: BLE001 - reported with where it happened in the student's code
        raise _located(exc) from None
    return (found.greedy, found.cached, found.forced, found.tokens_per_s, found.uncached_tokens_per_s,
            trained.train_cpu_s, trained.steps, trained.planned_steps,
            torch.tensor(trained.curve, dtype=torch.float64), found.theirs, trained.changed, trained.kept_step,
            found.repeatable, trained.unchanged[:UNCHANGED_SENT], trained.cut_by, len(trained.unchanged))


def capstone_translation(fn, args: list, classes: dict):
    """Chapter 12, Part B: load the submitted weights into the submission's own model (built by its
    ``make_model`` at the course model's size) and translate with the course's beam-search loop over
    its model, its causal mask and its ``beam_step`` (``tfm_solution.capstone.translate_part_b``).

    ``args`` = ``(names, *weights, sources, config)``: the weights' names (a description the
    worker builds), one tensor per name, the source ids ``(sentences, longest)`` padded, and the
    decoding settings. Returns the output ids ``(sentences, longest output)``, padded; the cases of
    one worker share one translation.
    """
    names = args[0]
    weights = dict(zip(names, args[1:1 + len(names)], strict=True))
    sources, config = args[1 + len(names):]
    key = ("translation", repr(config), tuple(sources.shape))
    try:
        if key not in _TRAINED:
            _TRAINED[key] = classes["translate_part_b"](vars(sys.modules["submission"]), weights, sources, config)
    except Exception as exc:  # noqa: BLE001 - reported with where it happened in the student's code
        raise _located(exc) from None
    return _TRAINED[key]


DRIVERS = {"accumulation": train_accumulated, "reversal": capstone_reversal, "translation": capstone_translation}
"""What a ``Case.driver`` runs around the answer instead of calling it on the case's arguments."""
