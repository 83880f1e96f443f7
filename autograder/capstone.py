"""The harness side of chapter 12: the student's whole Transformer, trained (Part A) and translating (Part B).

``CapstoneRun`` grades a chapter-12 exercise like any other (``grade.ExerciseRun``: one sandboxed
worker, one pytest test per case), with these differences:

* its code is the student's whole course (``course_code.gather``): their chapter notebooks of the
  submission, then the capstone notebook;
* the worker's limits are those of a training run (``LIMITS``), and only the course's procedures
  (``ch12_capstone.INSTALLED``) are put into the student's namespace, never a reference of a piece
  the student wrote;
* Part A's cases are judged here from the ids the student's decoders produced, against sequences
  the harness draws itself (its judges, which ``ch12_capstone``'s cases name by key): a worker's claim of its accuracy is never believed;
* when Part A misses full marks, ``diagnose`` trains again with the course's components in place
  of the student's, a prefix of ``ch12_capstone.COMPONENTS`` at a time (a binary search, then one
  run with the culprit alone), and names the component whose replacement fixes training;
* Part B's weights file is read and checked here (``read_weights``: size, safetensors only, a sane
  header) before its tensors travel to the worker with the sentences of the configured split;
  sacreBLEU is computed here from the ids the worker returns.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import marshal
import re
import zipfile
from dataclasses import replace
from pathlib import Path, PurePosixPath

import torch

from autograder.sandboxed import wire
from autograder.course_code import CAPSTONE, chapters_beside, gather
from autograder.diagnoses_zh import CAPSTONE_SAY, CAPSTONE_ZH
from autograder.exercises import ch12_capstone as spec
from autograder.extract import Extraction, Notebook, without_docstrings
from autograder.feedback import fenced
from autograder.grade import ExerciseRun, _pack_args, _provided, value_of
from autograder.results import ERROR_NOTE, Report, TestResult
from autograder.sandbox import Limits, Worker, WorkerDied

LIMITS = {"reversal": {"cpu_s": 240, "call_timeout_s": 900.0},
          "translation": {"cpu_s": 400, "call_timeout_s": 600.0}}
"""A worker's limits for each part: Part A trains for at most ``TASK["cpu_budget_s"]`` CPU seconds, Part B
translates the test split with beams, uncached, for at most ``TRANSLATION["cpu_budget_s"]`` (the course model needs
about 80 CPU seconds); the rest is building the model and loading the weights."""

WEIGHTS_FILE = PurePosixPath("my_model") / "model.safetensors"
"""Where Part B's weights are, next to the capstone notebook (what the notebook's export writes)."""

MAX_WEIGHTS_BYTES = 64 * 1024 * 1024
MAX_HEADER_BYTES = 1024 * 1024
MAX_TENSORS = 1024
WEIGHT_DTYPES = {"F16": 2, "BF16": 2, "F32": 4}

DIAGNOSIS_PROBES = 6
"""At most this many extra training runs to find what stops a model from learning."""

SAY = {
    "greedy": "**Diagnosis: the decoder sees the future** (chapters 4 and 8): fed the whole target at once, your "
              "model gets every token of {forced:.1%} of the held-out sequences right, but generating one token at a "
              "time, as the course's greedy loop does, it reverses only {accuracy:.1%} of them. A model that is right "
              "only while the next tokens are in its input is reading them: check that your decoder's "
              "self-attention applies the target mask it is given (`tgt_mask` in `DecoderLayer`), and that your "
              "`Batch` hides from each target position the positions after it.",
    "frozen": "**Diagnosis: {name}** ({what}): your model reverses {accuracy:.1%} of the held-out sequences, but "
              "training never changed {count} of its parameter tensors ({tensors}): no gradient reaches them, so they "
              "keep their random initial values. The gradient stops in your {classes}: its output carries no "
              "gradient back to its input (look for a `.detach()` or a `torch.no_grad()` in its `forward`). "
              "Hint: {hint}.",
    "frozen_several": "**Diagnosis: parameters that never learn**: your model reverses {accuracy:.1%} of the "
                      "held-out sequences, but training never changed {count} of its parameter tensors "
                      "({tensors}), held by your {classes}: no gradient reaches them, so they keep their random "
                      "initial values. Look for a `.detach()`, a `torch.no_grad()` or `requires_grad=False` on "
                      "their way to the loss, in those classes or in what calls them.",
    "alone": "**Diagnosis: {name}** ({what}): with the course's version of it in place of yours, and the rest of your "
             "code unchanged, your model learns the task ({yours}). Hint: {hint}.\n\nThe grader trained your model "
             "again with parts of your code replaced by the course's, as Part A does ({cost}); the share is that of "
             "held-out sequences whose every token the model predicts right when fed the right prefix:\n\n{tried}",
    "several": "**Diagnosis: more than one component** ({yours}). Your model learns only once the course's components "
               "replace yours up to and including {name} ({what}); replacing that one alone is not enough, so at "
               "least one more of them needs a look. Hint for {name}: {hint}.\n\nThe runs ({cost}):\n\n{tried}",
    "cost": "{runs} more training runs, {cpu:.0f} CPU seconds of training",
    "run": "the course's {names}: {outcome}",
    "names": ", ",
    "yours": "yours reverses {accuracy:.1%} and, fed the right prefix, gets {forced:.1%} right",
    "raised": "your own run raised an error",
}
"""The diagnosis's sentences (``str.format`` templates); ``diagnoses_zh.CAPSTONE_SAY`` has them in Chinese."""


def _say(language: str, key: str, **fields) -> str:
    """The diagnosis's sentence ``key`` in the notebook's ``language`` ("zh": Chinese), its fields filled in."""
    return (CAPSTONE_SAY if language == "zh" else SAY)[key].format(**fields)


def _component(language: str, text: str) -> str:
    """A component's name, description or hint (``ch12_capstone.COMPONENTS``) in ``language``; English where
    ``diagnoses_zh.CAPSTONE_ZH`` has no Chinese for it (a code name such as ``make_model`` needs none)."""
    return CAPSTONE_ZH.get(text, text) if language == "zh" else text


# ----------------------------------------------------------------------------- Part A's verdicts

def _task():
    from tfm_solution.capstone import ReversalTask

    return ReversalTask(**{k: v for k, v in spec.TASK.items() if k != "module"})


def held_out_pairs(eval_seed: int) -> list:
    """The held-out sequences of ``eval_seed``, drawn here exactly as the worker draws them."""
    return _held_out_pairs(_task(), eval_seed)


@functools.cache
def _held_out_pairs(task, eval_seed: int) -> list:
    from tfm_solution.capstone import reversal_pairs

    return reversal_pairs(task.held_out, task, torch.Generator().manual_seed(eval_seed), evaluation=True)


REPLY = ("greedy", "cached", "forced", "tokens_per_s", "uncached_tokens_per_s", "train_cpu_s", "steps",
         "planned_steps", "curve", "theirs", "changed", "kept_step", "repeatable", "unchanged", "cut_by", "unchanged_count")
"""The entries of Part A's reply, in order (``sandboxed.drivers.capstone_reversal``)."""


def reply(got) -> dict:
    """Part A's reply as a mapping of ``REPLY``'s names; a ``ValueError`` when it is not one."""
    if not (isinstance(got, tuple) and len(got) == len(REPLY)):
        raise ValueError("the training run did not return the decoded ids")
    named = dict(zip(REPLY, got))
    if not all(isinstance(named[k], torch.Tensor) for k in ("greedy", "cached", "forced", "theirs")):
        raise ValueError("the training run did not return the decoded ids")
    return named


def part_a_scores(eval_seed: int, got) -> tuple[float, float, float]:
    """(accuracy, forced accuracy, agreement) of a Part A reply, scored here against our own sequences."""
    from tfm_solution.capstone import scores

    named = reply(got)
    return scores(held_out_pairs(eval_seed), named["greedy"], named["cached"], named["forced"], _task().pad,
                  theirs=named["theirs"])


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and value == value else float("nan")


def _run_lines(got) -> list[str]:
    named = reply(got)
    steps, planned, cpu = _number(named["steps"]), _number(named["planned_steps"]), _number(named["train_cpu_s"])
    budget = spec.TASK["cpu_budget_s"]
    lines = [f"trained {steps:.0f} of {planned:.0f} optimizer steps (counted as the optimizer took them) in "
             f"{cpu:.1f} CPU seconds (the budget: {budget:.0f}); the weights kept are those after step "
             f"{_number(named['kept_step']):.0f}, where the held-out loss was lowest; training changed "
             f"{_number(named['changed']):.1%} of your model's parameters"]
    if steps < planned:
        lines[0] += ("; the budget ran out first: your code is slower than it should be" if cpu >= 0.95 * budget
                     else "; your training loop took fewer optimizer steps than its micro-batches call for")
    lines.append(f"decoding speed, not graded: {_number(named['tokens_per_s']):,.0f} tokens per CPU second cached, "
                 f"{_number(named['uncached_tokens_per_s']):,.0f} uncached")
    return lines


NOT_REPEATABLE = ("built with dropout 0.1 and holding your trained weights, your model in evaluation mode gives "
                  "different outputs for the same input twice: dropout is still on after `model.eval()` (an "
                  "`nn.Dropout` module follows the mode; `F.dropout(x, p)` needs `training=self.training`)")


def _accuracy(band: float, eval_seed: int, got) -> tuple[bool, list[str]]:
    try:
        accuracy, forced, _ = part_a_scores(eval_seed, got)
    except ValueError as exc:
        return False, [str(exc)]
    named = reply(got)
    lines = [f"exact match: {accuracy:.1%} of {_task().held_out} held-out sequences reversed by your model, decoded "
             f"by the course's greedy loop (this line: at least {band:.0%}; full marks from "
             f"{spec.ACCURACY_BANDS[-1]:.0%})",
             f"fed the right prefix (teacher forcing), your model gets every token right on {forced:.1%} of them",
             *_run_lines(got)]
    passed = accuracy >= band
    if _number(named["changed"]) == 0:
        passed = False
        lines.insert(0, "training changed none of your model's parameters: what it reverses, it did not learn")
    if band == spec.ACCURACY_BANDS[-1] and named["repeatable"] is False:
        passed = False
        lines.insert(0, NOT_REPEATABLE + "; full marks need a model that is deterministic in evaluation")
    frozen = _frozen(named)
    if band == spec.ACCURACY_BANDS[-1] and frozen and _number(named["changed"]) > 0:
        passed = False
        lines.insert(0, f"training left {_frozen_count(named, frozen)} of your model's parameter tensors exactly as "
                        f"they were initialised ({_listed(frozen)}): no gradient ever reached them; full marks need "
                        "every parameter to learn")
    return passed, lines


def _frozen(named: dict) -> list[tuple[str, str]]:
    """(parameter, class holding it) of the tensors training never changed that the reply names (``unchanged``:
    the first of them)."""
    entries = named.get("unchanged")
    found = (re.fullmatch(r"(\S+) \((\w+)\)", entry) for entry in (entries if isinstance(entries, tuple) else ())
             if isinstance(entry, str))
    return [(m.group(1), m.group(2)) for m in found if m]


def _frozen_count(named: dict, frozen: list) -> int:
    """How many tensors training never changed (the reply names only the first of them)."""
    count = named.get("unchanged_count")
    return count if type(count) is int and count >= len(frozen) else len(frozen)


def _listed(frozen: list[tuple[str, str]], shown: int = 4) -> str:
    """The first ``shown`` names, then an ellipsis (the line gives the count, in any language)."""
    return ", ".join([f"`{name}`" for name, _ in frozen[:shown]] + ["…"] * (len(frozen) > shown))


def first_difference(cached: torch.Tensor, uncached: torch.Tensor, pad: int) -> int | None:
    """The earliest generated position (1 = the first token after ``<s>``) where the two decoders' ids differ in
    any sequence, or ``None`` where they agree everywhere."""
    width = max(cached.size(1), uncached.size(1))

    def widen(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t.long(), torch.full((t.size(0), width - t.size(1)), pad, dtype=torch.long)], dim=1)

    differs = (widen(cached) != widen(uncached)).any(0).nonzero()
    return int(differs[0]) if len(differs) else None


def _agreement(_: float, eval_seed: int, got) -> tuple[bool, list[str]]:
    try:
        _, _, agreement = part_a_scores(eval_seed, got)
    except ValueError as exc:
        return False, [str(exc)]
    n = _task().held_out
    same = round(agreement * n)
    if same == n:
        return True, [f"your cached and uncached greedy decoders give the same tokens on all {n} sequences",
                      *_run_lines(got)]
    named = reply(got)
    where = first_difference(named["cached"], named["theirs"], _task().pad)
    if where is not None and where <= 1:
        # The first token comes from one position: self-attention over it is the same whatever its scale or cache,
        # and its position is 0 either way, so a difference there lies in what reads the source or the last norm.
        hint = ("they differ already at the first token, which self-attention over one position cannot change: "
                "look at the cached step's cross-attention (its scale 1/sqrt(d_k), the memory's keys and values it "
                "keeps, the source mask) and at the decoder's final norm")
    else:
        hint = (f"they first differ at token {where}: look at the cached step's two attentions (each scaled by "
                "1/sqrt(d_k); cross-attention over the memory's keys and values kept from the first step, "
                "self-attention over keys and values appended in order), the position the positional encoding "
                "adds at each step, and the order of the sublayers")
    return False, [f"your cached decoder differs from your uncached one on {n - same} of {n} sequences; {hint} "
                   "(chapter 11)", *_run_lines(got)]


# ----------------------------------------------------------------------------- Part B's data and verdicts

@functools.cache
def translation_data() -> tuple[list[str], torch.Tensor, object]:
    """The configured split's English references, its German sources as padded ids, and the course's tokenizer."""
    from tfm_solution.course_model import COURSE_MODEL_DIR
    from tfm_solution.data import PAD, TokenizerPair, load_multi30k, multi30k_dir, pad_batch

    split, count = spec.translation_split()
    pairs = load_multi30k(split, multi30k_dir())[:count]
    tokenizer = TokenizerPair.load(COURSE_MODEL_DIR)
    return [en for _, en in pairs], pad_batch([tokenizer.encode_src(de) for de, _ in pairs], PAD), tokenizer


def translations(got) -> list[str]:
    """The texts of a Part B reply (ids from ``<s>``), decoded by the course's tokenizer."""
    references, sources, tokenizer = translation_data()
    if not isinstance(got, torch.Tensor) or got.dim() != 2 or got.size(0) != len(references) \
            or got.is_floating_point():
        raise ValueError(f"expected the ids of {len(references)} translations, got "
                         f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}")
    return [tokenizer.decode_tgt([i for i in row[1:] if 0 <= i < 10**6]) for row in got.tolist()]


def _budget_lines(got) -> list[str]:
    """A line when the translation's CPU budget ran out before every sentence was translated (``translate_part_b``
    leaves those rows as padding alone)."""
    left = int((got[:, 0] == _translation_task_pad()).sum())
    if not left:
        return []
    budget = spec.TRANSLATION["cpu_budget_s"]
    return [f"the translation stopped when its {budget:.0f} CPU seconds ran out, with {left} of {got.size(0)} "
            "sentences left (scored as empty translations); the course model translates them all in about 80. A "
            "model whose hypotheses rarely end with `</s>` runs every beam to its longest: look at what your "
            "model gives `</s>` and at how your `beam_step` finishes hypotheses"]


def _translation_task_pad() -> int:
    from tfm_solution.capstone import TranslationTask

    return TranslationTask().pad


def _translates(_: float, shown: int, got) -> tuple[bool, list[str]]:
    try:
        texts = translations(got)
    except ValueError as exc:
        return False, [str(exc)]
    empty = sum(not t.strip() for t in texts)
    return empty < len(texts), [f"{len(texts)} sentences translated ({empty} of them empty)", *_budget_lines(got)]


def _bleu(band: float, shown: int, got) -> tuple[bool, list[str]]:
    import sacrebleu

    try:
        texts = translations(got)
    except ValueError as exc:
        return False, [str(exc)]
    references = translation_data()[0]
    score = sacrebleu.corpus_bleu(texts, [references]).score
    split, count = spec.translation_split()
    picked = torch.randperm(len(texts), generator=torch.Generator().manual_seed(shown))[:3].tolist()
    examples = "\n".join(f"{texts[i]}\n    (reference: {references[i]})" for i in picked)
    return score >= band, [f"sacreBLEU {score:.2f} on {len(texts)} sentences of Multi30k's {split} split (this line: "
                           f"at least {band:g}; full marks from {spec.BLEU_BANDS[-1]:g})",
                           *_budget_lines(got), "three of your translations:\n\n" + fenced(examples)]


spec.JUDGES.update(accuracy=_accuracy, agreement=_agreement, translates=_translates, bleu=_bleu)


# ----------------------------------------------------------------------------- Part B's weights

class WeightsRejected(ValueError):
    """The weights file cannot be graded; the message says why, for the student."""


def weights_bytes(submission: Path, nb: Notebook) -> bytes:
    """The bytes of ``my_model/model.safetensors`` beside the capstone notebook in the submission."""
    where = PurePosixPath(nb.name).parent / WEIGHTS_FILE
    if zipfile.is_zipfile(submission):
        with zipfile.ZipFile(submission) as archive:
            for member in archive.infolist():
                name = PurePosixPath(member.filename.replace("\\", "/"))
                if PurePosixPath(*[p for p in name.parts if p not in ("", ".", "..", "/")]) == where:
                    if member.file_size > MAX_WEIGHTS_BYTES:
                        raise WeightsRejected(f"{where} is larger than {MAX_WEIGHTS_BYTES // 2**20} MB")
                    with archive.open(member) as handle:
                        return handle.read(MAX_WEIGHTS_BYTES + 1)
        raise WeightsRejected(f"no {where} in the submission")
    folder = submission if submission.is_dir() else submission.parent
    path = folder.joinpath(*where.parts) if submission.is_dir() else folder.joinpath(*WEIGHTS_FILE.parts)
    if path.is_symlink() or not path.is_file():
        raise WeightsRejected(f"no {WEIGHTS_FILE} next to the notebook: export your trained model there "
                              "(the notebook's export cell) and submit it with the notebook")
    if path.stat().st_size > MAX_WEIGHTS_BYTES:
        raise WeightsRejected(f"{WEIGHTS_FILE} is larger than {MAX_WEIGHTS_BYTES // 2**20} MB")
    with open(path, "rb") as handle:
        return handle.read(MAX_WEIGHTS_BYTES + 1)


def read_weights(data: bytes) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, checked before any of it is parsed by a library: the size, the
    header (JSON of at most 1 MB, float dtypes, shapes whose bytes match their place in the file, no
    overlaps), then read by ``safetensors`` (which executes nothing). Names that the file's metadata
    declares as another tensor (how the course's exporter stores shared weights) get that tensor."""
    from safetensors.torch import load

    if len(data) > MAX_WEIGHTS_BYTES:
        raise WeightsRejected(f"the weights file is larger than {MAX_WEIGHTS_BYTES // 2**20} MB")
    if len(data) < 8:
        raise WeightsRejected("the weights file is not a safetensors file (too short)")
    size = int.from_bytes(data[:8], "little")
    if size > MAX_HEADER_BYTES:
        raise WeightsRejected("the weights file is not a safetensors file (its header size is impossible)")
    if 8 + size > len(data):
        raise WeightsRejected(f"the weights file is truncated: it has {len(data):,} bytes, and its header alone "
                              f"needs {8 + size:,} (was the export interrupted, or the upload cut short?)")
    try:
        header = json.loads(data[8:8 + size])
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise WeightsRejected("the weights file is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise WeightsRejected("the weights file's header is not a JSON object")
    metadata = header.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or len(header) > MAX_TENSORS:
        raise WeightsRejected(f"the weights file holds malformed metadata or more than {MAX_TENSORS} tensors")
    body, spans = len(data) - 8 - size, []
    for name, entry in header.items():
        shape = entry.get("shape") if isinstance(entry, dict) else None
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and 0 <= offsets[0] <= offsets[1] and offsets[1] > body):
            raise WeightsRejected(f"the weights file is truncated: tensor {name[:80]!r} needs {offsets[1]:,} bytes "
                                  f"after the header, and the file has {body:,} (was the export interrupted, or "
                                  "the upload cut short?)")
        if (len(name) > 200 or not isinstance(shape, list) or len(shape) > 8
                or not all(isinstance(d, int) and 0 <= d < 2**31 for d in shape)
                or entry.get("dtype") not in WEIGHT_DTYPES or not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) for o in offsets) or not 0 <= offsets[0] <= offsets[1] <= body):
            raise WeightsRejected(f"tensor {name[:80]!r} of the weights file is malformed (float16, bfloat16 and "
                                  "float32 tensors only)")
        if offsets[1] - offsets[0] != WEIGHT_DTYPES[entry["dtype"]] * int(torch.tensor(shape).prod()):
            raise WeightsRejected(f"tensor {name[:80]!r}: its bytes do not match its shape")
        spans.append(offsets)
    spans.sort()
    if any(a[1] > b[0] for a, b in zip(spans, spans[1:])):
        raise WeightsRejected("tensors of the weights file overlap")
    try:
        tensors = load(bytes(data))
    except Exception as exc:  # noqa: BLE001 - the library's own check: any failure is a bad file
        raise WeightsRejected(f"the weights file could not be read: {str(exc)[:200]}") from None
    for alias, target in metadata.items():
        if isinstance(alias, str) and alias not in tensors and target in tensors and len(alias) <= 200:
            tensors[alias] = tensors[target]
    return tensors


COURSE_MODEL = "the course model's own (tfm_solution/assets/course_model)"
PUBLISHED_WEIGHTS = "published_weights.json"
"""Beside the course model's folder: the fingerprints of the other weights the repository publishes (the
solution's Part B weights), by what the instructor's line calls them; ``scripts/capstone_multi30k.py`` writes
it when it exports those weights (``write_published_fingerprint``), and a fast test holds it against them."""


SOLUTION_WEIGHTS = "the solution's published weights (solutions/12_capstone/my_model)"


def write_published_fingerprint(weights: Path) -> None:
    """Record the fingerprint of the solution's Part B weights file ``weights`` in ``PUBLISHED_WEIGHTS``."""
    from tfm_solution.course_model import COURSE_MODEL_DIR

    digests = sorted(_fingerprint(read_weights(weights.read_bytes())))
    (COURSE_MODEL_DIR.parent / PUBLISHED_WEIGHTS).write_text(json.dumps({SOLUTION_WEIGHTS: digests}, indent=1) + "\n")


@functools.cache
def published_fingerprints() -> dict[str, frozenset[str]]:
    """Every set of weights the course publishes -> its fingerprint (``_fingerprint``)."""
    from tfm_solution.course_model import COURSE_MODEL_DIR

    found = {COURSE_MODEL: _fingerprint(read_weights((COURSE_MODEL_DIR / "model.safetensors").read_bytes()))}
    listed = json.loads((COURSE_MODEL_DIR.parent / PUBLISHED_WEIGHTS).read_text())
    return found | {name: frozenset(digests) for name, digests in listed.items()}


def _fingerprint(tensors: dict[str, torch.Tensor]) -> frozenset[str]:
    """A digest per tensor's values, the same whatever the tensors' order, names or float width."""
    return frozenset(hashlib.sha256(v.half().flatten().numpy().tobytes()).hexdigest() for v in tensors.values())


# ----------------------------------------------------------------------------- the run

class CapstoneRun(ExerciseRun):
    """A chapter-12 exercise graded on the student's whole course (see the module docstring)."""

    def __init__(self, nb: Notebook, exercise, *, submission: tuple[Path, list], seed: int | None,
                 public_only: bool, limits: Limits) -> None:
        self.submission, self.notebooks = submission
        beside: list = []
        if self.submission.is_file() and self.submission.suffix == ".ipynb" \
                and self.submission.parent.name == CAPSTONE:
            # A lone capstone notebook is graded with the chapter folders beside its own, as in the notebook.
            beside = chapters_beside(self.submission)
            self.notebooks = [*self.notebooks, *beside]
        super().__init__(nb, exercise, seed=seed, public_only=public_only, limits=limits)
        if beside:
            self.notes.append(f"chapters 1-11: read from the {len(beside)} chapter notebooks in the folders beside "
                              f"{CAPSTONE}/ ({self.submission.parent.parent.name}/)")
        self.part = exercise.cases(0)[0].driver
        self.limits = Limits(**{**self.limits.__dict__, **LIMITS[self.part]})
        self.values: dict[int, object] = {}
        self.cases = [replace(c, rule=self._recording(i, c)) for i, c in enumerate(self.cases)]
        self.attached: tuple = ()
        self.attachment_problem: str | None = None
        if not self.extraction.error:
            self.provided = _compiled(_provided(exercise)[0])
            self.setup = _installing(self.setup, spec.INSTALLED[self.part])
            if self.part == "translation":
                self._attach_translation(nb)

    def extract(self, nb: Notebook) -> Extraction:
        return gather(self.notebooks, nb, self.exercise)

    def _recording(self, number: int, case):
        """``case``'s rule, given the answer and keeping it for the diagnosis. The harness hands a rule the
        worker's whole record, which for a watched case wraps the answer with the arguments after the call
        (already checked for its shape there, ``value_of``)."""
        judge = case.rule

        def recorded(got):
            got = value_of(case, got)
            self.values[number] = got
            return judge(got)

        return recorded

    def _attach_translation(self, nb: Notebook) -> None:
        """Part B's weights (checked) and the configured split's sources, to go before each case's own arguments."""
        try:
            weights = read_weights(weights_bytes(self.submission, nb))
        except WeightsRejected as exc:
            self.attachment_problem = f"Part B needs your trained weights: {exc}."
            return
        try:
            sources = translation_data()[1]
        except Exception as exc:  # noqa: BLE001 - the data is the grader's business, not the student's
            self.attachment_problem = f"{ERROR_NOTE}: the test sentences could not be read ({str(exc)[:300]})"
            return
        # Every tensor of the course model's file among them: an export of the student's model may add
        # buffers that file leaves out (the sinusoid tables, rebuilt on loading).
        submitted = _fingerprint(weights)
        for name, fingerprint in published_fingerprints().items():
            if fingerprint <= submitted:
                self.notes.append(f"Part B: the weights you submitted are {name}, not weights you trained: your "
                                  "instructor sees this line")
        names = list(weights)
        self.attached = ({"module": "weight_names", "names": names}, *(weights[n] for n in names), sources)

    def _run(self, number: int) -> TestResult:
        result = self._run_case(number)
        output = _RAISED_IN.sub(self._located, result.output)
        if self.attached:
            output = _WEIGHT_INPUTS.sub(self._inputs_summary(), output)
        return replace(result, output=output)

    def _inputs_summary(self) -> str:
        """Part B's inputs in one line: a tensor per weight would bury the verdict under pages of shapes."""
        weights, sources = self.attached[1:-1], self.attached[-1]
        dtypes = ", ".join(sorted({str(w.dtype).removeprefix("torch.") for w in weights}))
        task = spec.TRANSLATION
        return (f"Inputs: your {len(weights)} weight tensors ({sum(w.numel() for w in weights):,} numbers, {dtypes}), "
                f"the {sources.size(0):,} test sentences as ids {tuple(sources.shape)}, decoded with beams of "
                f"{task['beam_size']}, length penalty {task['alpha']:g}, at most {task['max_extra']} ids more than "
                f"each batch's longest source, within {task['cpu_budget_s']:g} CPU seconds")

    def _located(self, found: re.Match) -> str:
        """``raised in chunk N, line L`` as the chunk's place in the student's notebooks (chapter, answer, line)."""
        chunks, number, line = self.extraction.chunks, int(found[1]), int(found[2])
        if number >= len(chunks):
            return found[0]
        chunk = chunks[number]
        if "written" not in chunk:  # a chunk of this notebook
            return "raised in " + self.extraction.explain(f"chunk {number}, line {line}: ").removesuffix(": ")
        # a statement of a chapter's answer (``course_code.gather``): the line of its cell it started at
        starts = [old for new, old in chunk.get("lines", {}).items() if new <= line]
        written = chunk["written"].splitlines()
        if not starts or not 0 < starts[-1] <= len(written):
            return f"raised in {chunk['label']}"
        return f"raised in {chunk['label']}, line {starts[-1]}: `{written[starts[-1] - 1].strip()[:200]}`"

    def _run_case(self, number: int) -> TestResult:
        case = self.cases[number]
        if case.driver != "translation" or self.extraction.error:
            return super()._run(number)
        if self.attachment_problem:
            return self._fail(number, self.attachment_problem)
        self.cases[number] = replace(case, args=self.attached + case.args)
        try:
            return super()._run(number)
        finally:
            self.cases[number] = case

    def finish(self, report: Report) -> None:
        self._stop_worker()
        if self.part == "reversal" and not self.extraction.error and self.timeouts == 0:
            line = self.diagnose()
            if line is not None:
                self.notes.append(line)
        super().finish(report)

    # ------------------------------------------------------------------------- the diagnosis

    def diagnose(self) -> str | None:
        """Why Part A misses full marks, when the harness can tell: the decoding, or the first component
        whose replacement by the course's makes the model learn (``None``: full marks, or nothing to say), in the
        notebook's language."""
        top = len(self.cases) - 1
        result = self.results.get(top)
        if result is None or result.score >= result.max_score or self.load_failure:
            return None
        if top not in self.values and "your code raised" not in result.output:
            return None  # the worker died (a limit, a crash): retraining would meet the same fate
        value = self.values.get(top)
        eval_seed = self.cases[top].args[1]
        band = spec.ACCURACY_BANDS[-1]
        yours = _say(self.language, "raised")
        if value is not None:
            try:
                accuracy, forced, _ = part_a_scores(eval_seed, value)
            except ValueError:
                accuracy = forced = None
            if accuracy is not None and accuracy >= band:
                # The model learned: what cost the points (dropout left on, no training) is in its line, except
                # parameters that never learn, whose classes say where to look.
                return self._frozen_diagnosis(reply(value), accuracy)
            if forced is not None and forced >= band:
                return _say(self.language, "greedy", forced=forced, accuracy=accuracy)
            if accuracy is not None:
                yours = _say(self.language, "yours", accuracy=accuracy, forced=forced)
        return self._search(eval_seed, yours, self.language)

    def _frozen_diagnosis(self, named: dict, accuracy: float) -> str | None:
        """Where the gradient stops, when training left parameters as they were (``None``: it left none). A
        component is named only when the classes that cut the graph (measured in the worker) are all its own."""
        frozen = _frozen(named)
        if not frozen or _number(named["changed"]) == 0:
            return None
        cut_by = [c for c in named.get("cut_by") or () if isinstance(c, str)]
        holding = [c for c in spec.COMPONENTS if cut_by and set(cut_by) <= set(c[2])]
        fields = {"accuracy": accuracy, "count": _frozen_count(named, frozen), "tensors": _listed(frozen)}
        if len(holding) != 1:
            classes = dict.fromkeys(holder for _, holder in frozen)
            return _say(self.language, "frozen_several", classes=", ".join(f"`{c}`" for c in classes), **fields)
        name, what, _, _, hint = (_component(self.language, part) if isinstance(part, str) else part
                                  for part in holding[0])
        return _say(self.language, "frozen", name=name, what=what, hint=hint,
                    classes=", ".join(f"`{c}`" for c in cut_by), **fields)

    def _search(self, eval_seed: int, yours: str, language: str = "en") -> str:
        components = spec.COMPONENTS
        runs: list[str] = []
        spent = [0.0]

        seen: dict[tuple[int, ...], bool] = {}

        def fixed(indices: list[int]) -> bool:
            if tuple(indices) in seen:  # the last halving may have tried the culprit alone already
                return seen[tuple(indices)]
            share, why, cpu = self._probe(indices, eval_seed)
            spent[0] += cpu
            names = _say(language, "names").join(_component(language, components[i][0]) for i in indices)
            runs.append(_say(language, "run", names=names, outcome=f"{share:.1%}" if share is not None else why))
            seen[tuple(indices)] = share is not None and share >= spec.ACCURACY_BANDS[-1]
            return seen[tuple(indices)]

        low, high = 1, len(components)  # the shortest prefix that fixes training lies in low .. high
        while low < high and len(runs) < DIAGNOSIS_PROBES - 1:
            middle = (low + high) // 2
            if fixed(list(range(middle))):
                high = middle
            else:
                low = middle + 1
        culprit = components[low - 1]
        alone = fixed([low - 1]) if len(runs) < DIAGNOSIS_PROBES else False
        name, what, _, _, hint = (_component(language, part) if isinstance(part, str) else part for part in culprit)
        return _say(language, "alone" if alone else "several", name=name, what=what, hint=hint, yours=yours,
                    cost=_say(language, "cost", runs=len(runs), cpu=spent[0]),
                    tried="\n".join(f"- {r}" for r in runs))

    def _probe(self, indices: list[int], eval_seed: int) -> tuple[float | None, str, float]:
        """Part A again with the course's components ``indices`` in place of the student's: (the forced
        accuracy or None, why there is none, the CPU seconds its training took)."""
        components = [spec.COMPONENTS[i] for i in indices]
        targets = list(dict.fromkeys(t for c in components for t in c[3]))
        targets += [t for t in spec.PROCEDURES["reversal"] if t not in targets]
        # The exercise's own reference is a component here: the check against it does not apply.
        probe = replace(self.exercise, prerequisites=tuple(targets), reference="tfm_solution.capstone:only_yours")
        source, names, modules = _provided(probe)
        provided = _compiled(source)
        installed = set(spec.INSTALLED["reversal"]) | {n for c in components for n in c[2]}
        setup = _installing({**self.setup, "provided_names": names, "provided_modules": modules}, installed)
        case = self.cases[-1]
        args, kwargs, buffers = _pack_args(case)
        request = {"id": f"probe-{indices}", "seed": self.seed, "args": args, "kwargs": kwargs, "attributes": [],
                   "train": False, "structure": False, "gradients": None, "method": None, "measure": None,
                   "driver": case.driver}
        worker = None
        try:
            worker = Worker(setup, self.limits, [provided])
            reply, out, _ = worker.call(request, buffers)
            if not reply.get("ok"):
                return None, "your code raised " + str(reply.get("error", ""))[:200].split(" (raised in")[0], 0.0
            value = wire.unpack_value(reply.get("value"), out)
            cpu = _number(value[5])
            return part_a_scores(eval_seed, value)[1], "", cpu if cpu == cpu else 0.0
        except WorkerDied as died:
            return None, died.reason, 0.0
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            return None, f"no result ({str(exc)[:200]})", 0.0
        finally:
            if worker is not None:
                worker.kill()


_WEIGHT_INPUTS = re.compile(r"^Inputs: your \d+ weight tensors, .*$", re.MULTILINE)
"""The generic line of a case's inputs, which for Part B lists every weight tensor's shape."""

_RAISED_IN = re.compile(r"raised in chunk (\d+), line (\d+)")
"""Where the worker says an error of the student's code was raised (``sandboxed.drivers._located``)."""

_MODULE_OF_ITS_OWN = "import sys as _sys, types as _types\n_sys.modules.setdefault(__name__, _types.ModuleType(__name__))\n"
"""The provided code's module name gets an (empty) module: dataclasses look their module up while being defined."""


def _compiled(source: str) -> bytes:
    """The worker's provided code, as ``grade.ExerciseRun`` compiles it, with a module of its own to run in."""
    future, _, rest = source.partition("\n")  # `_provided` starts with the `from __future__` line
    tree = without_docstrings(ast.parse("\n".join([future, _MODULE_OF_ITS_OWN, rest])))
    return marshal.dumps(compile(tree, "<provided>", "exec"))


def _installing(setup: dict, installed) -> dict:
    """``setup`` whose prerequisites go into the student's namespace (and ``import tfm_solution``) only if
    ``installed`` names them; the others are reachable from the provided code alone."""
    keep = set(installed)
    return {**setup, "provided_names": [n for n in setup["provided_names"] if n in keep],
            "provided_modules": {m: [n for n in names if n in keep]
                                 for m, names in setup["provided_modules"].items()}}
