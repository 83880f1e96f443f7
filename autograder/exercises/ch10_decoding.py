"""Chapter 10 grading: ``top_k_top_p_filter`` and ``beam_step``."""

from __future__ import annotations

import torch

from autograder.exercises.shared import Case, Contract, Exercise, Mistake, Mutant, dim, generators, randn, variants

CHAPTER, NOTEBOOK = "10_decoding", "decoding.ipynb"


def _p(gen: torch.Generator, low: float, high: float) -> float:
    """A probability threshold drawn uniformly from ``[low, high)``, rounded to 3 decimals."""
    return round(low + (high - low) * float(torch.rand(1, generator=gen)), 3)


def top_k_top_p_filter_cases(seed: int) -> list[Case]:
    """``top_k_top_p_filter(logits, top_k=None, top_p=None)``."""
    pub, gen = generators(seed)
    cases = [Case("top-3 of one row", "the 3 largest logits kept, the others -inf (public)", True,
                  (randn(pub, 1, 8, scale=2.0),), {"top_k": 3}),
             Case("top-2 of one row, a tie at the 2nd", "the logits 2 > 1 = 1 > 0.5 > 0 > -1: both 1s equal the "
                  "2nd largest, so 3 tokens are kept (public)", True,
                  (torch.tensor([[1.0, 0.0, 2.0, -1.0, 1.0, 0.5]]),), {"top_k": 2}),
             Case("top_p = 1 on one row, a dominant token", "the logit 60 leaves the others about 5e-26 of the "
                  "mass (its float64 probability rounds to 1), yet p >= 1 keeps all 5 tokens (public)", True,
                  (torch.tensor([[60.0, 0.0, -1.0, 1.0, 0.5]]),), {"top_p": 1.0}),
             Case("top-4 then top-p 0.5 of one row, an exact boundary", "4 of the 8 logits are 0, the others -1: "
                  "top_k=4 leaves the four 0s, each of probability exactly 1/4 once renormalised, so 2 of them "
                  "reach p = 0.5 and the 3rd, whose preceding mass equals top_p, is removed; which 2 of the equal "
                  "4 are kept is left open (public)", True,
                  (torch.tensor([[0.0, -1.0, 0.0, -1.0, -1.0, 0.0, 0.0, -1.0]]),), {"top_k": 4, "top_p": 0.5},
                  judge="nucleus")]
    rows, vocab = dim(gen, 2, 4), dim(gen, 15, 40)
    cases.append(Case("top-p on random rows", "the smallest set of most probable tokens reaching p, the token "
                      "crossing p included", False, (randn(gen, rows, vocab, scale=2.0),),
                      {"top_p": _p(gen, 0.3, 0.9)}))
    b, n, vocab = dim(gen, 2, 3), dim(gen, 2, 3), dim(gen, 30, 50)
    # flat rows: the k best hold a small share of the mass, so top-p must be measured after top-k
    cases.append(Case("top-k then top-p, 3-D", "top-p measured on the distribution top-k leaves, renormalised; "
                      "any leading shape", False, (randn(gen, b, n, vocab, scale=0.5),),
                      {"top_k": dim(gen, 3, 6), "top_p": _p(gen, 0.4, 0.7)}))
    logits = randn(gen, 3, dim(gen, 6, 12))
    logits[:, 0] += 60.0  # a dominant token: its probability rounds to exactly 1
    cases.append(Case("top_p = 1", "p >= 1 keeps every token, even when one token holds almost all the mass",
                      False, (logits,), {"top_p": 1.0}))
    logits = randn(gen, 2, dim(gen, 5, 9), scale=0.1)
    logits[:, 0] += 20.0
    cases.append(Case("p just below 1, float32 logits", "the running mass is summed in float64: the tail before "
                      "p = 1 - 1e-9 is not cut early", False, (logits,), {"top_p": 1 - 1e-9}))
    cases.append(Case("no filter, float64", "top_k=None and top_p=None return the logits unchanged; dtype kept",
                      False, (randn(gen, 2, dim(gen, 5, 12), dtype=torch.float64),), rtol=0, atol=0))
    vocab = dim(gen, 4, 8)
    cases.append(Case("top_k at least the vocabulary", "top_k >= vocab keeps everything", False,
                      (randn(gen, 2, vocab),), {"top_k": vocab + dim(gen, 0, 3)}))
    k, vocab = dim(gen, 2, 5), dim(gen, 10, 20)
    cases.append(Case("ties at the k-th logit", "tokens whose logit equals the top_k-th largest are all kept", False,
                      (_tied_at(gen, dim(gen, 2, 4), vocab, k),), {"top_k": k}))
    cases.append(Case("the exact top-p boundary", "probabilities of exactly 1/4 or 1/8: a token whose preceding mass "
                      "equals top_p is removed; among tokens of equal probability any may be kept", False,
                      (_exact_masses(gen, dim(gen, 2, 4), dim(gen, 10, 20)),), {"top_p": 0.5}, judge="nucleus"))
    return cases


def _tied_at(gen: torch.Generator, rows: int, vocab: int, k: int) -> torch.Tensor:
    """``(rows, vocab)`` logits where the (k+1)-th largest of each row equals the k-th: a tie at the cut."""
    logits = randn(gen, rows, vocab, scale=2.0)
    order = logits.argsort(dim=-1, descending=True)
    for row in range(rows):
        logits[row, order[row, k]] = logits[row, order[row, k - 1]]
    return logits


def _exact_masses(gen: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    """``(rows, vocab)`` logits: 4 or 8 tokens at 0, the others at -50, in random places. The top tokens' float64
    probabilities are exactly 1/4 or 1/8 (the others add less than a rounding step to the sum), so the mass before
    the 3rd (or 5th) of them is exactly 0.5."""
    logits = torch.full((rows, vocab), -50.0)
    for row in range(rows):
        top = 4 * dim(gen, 1, 2)
        logits[row, torch.randperm(vocab, generator=gen)[:top]] = 0.0
    return logits


def beam_step_cases(seed: int) -> list[Case]:
    """``beam_step(scores, log_probs, beam_size)``."""
    pub, gen = generators(seed)

    def beams(g: torch.Generator, batch: int, k: int, vocab: int, dtype=torch.float32, empty: int = 0):
        scores = randn(g, batch, k, dtype=dtype, scale=3.0) - 5.0
        if empty:
            scores[:, k - empty:] = float("-inf")
        log_probs = randn(g, batch, k, vocab, dtype=dtype, scale=2.0).log_softmax(-1)
        return scores, log_probs

    cases = [Case("1 sentence, 2 beams, 5 tokens", "the 2 best of the 10 candidates (public)", True,
                  (*beams(pub, 1, 2, 5), 2))]
    k = dim(gen, 3, 5)
    cases.append(Case("a batch, float64", "scores summed with the beams' scores, pruned over all beams of each "
                      "sentence, best first", False, (*beams(gen, dim(gen, 2, 4), k, dim(gen, 6, 12),
                                                            torch.float64), k), rtol=1e-9, atol=1e-12))
    k = dim(gen, 3, 5)
    cases.append(Case("empty slots", "beams scored -inf (the first step: only one beam is real) produce no "
                      "survivor", False, (*beams(gen, 2, k, dim(gen, 8, 16), empty=k - 1), k)))
    size = dim(gen, 2, 4)
    cases.append(Case("one beam in, several out", "k = 1 beam expanded into beam_size children", False,
                  (*beams(gen, 3, 1, dim(gen, 8, 16)), size)))
    k = dim(gen, 4, 6)
    cases.append(Case("a larger vocabulary", "parents and tokens recovered from the flat candidate index", False,
                      (*beams(gen, 2, k, dim(gen, 40, 80)), k)))
    return cases


_filter = variants('''
def top_k_top_p_filter(logits, top_k=None, top_p=None):
    original = logits
    if top_k is not None and top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill({k_test}, -math.inf)
    if top_p is not None and {p_guard}:
        probs, order = {probs}.softmax(dim=-1).sort(dim=-1, descending=True)
        before = probs.cumsum(dim=-1) - probs
        drop_sorted = {drop}
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, -math.inf)
    return {result}
''', k_test="logits < kth", p_guard="top_p < 1", probs="logits.double()", drop="before >= top_p",
                   result="logits")

_UNSORTED_P = '''
def top_k_top_p_filter(logits, top_k=None, top_p=None):
    if top_k is not None and top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p is not None and top_p < 1:
        probs = logits.double().softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs
        logits = logits.masked_fill(before >= top_p, -math.inf)
    return logits
'''

_beam = variants('''
def beam_step(scores, log_probs, beam_size):
    batch, k, vocab = log_probs.shape
    candidates = ({candidates}).reshape(batch, k * vocab)
    new_scores, flat = candidates.topk(beam_size, dim=-1{largest})
    return new_scores, {parents}, {tokens}
''', candidates="scores.unsqueeze(-1) + log_probs", largest="", parents="flat // vocab", tokens="flat % vocab")

_FILTER_OWN = '''
def top_k_top_p_filter(logits, top_k=None, top_p=None):
    if top_k is not None and top_k < logits.size(-1):
        kth = logits.sort(dim=-1, descending=True).values[..., top_k - 1:top_k]
        logits = torch.where(logits >= kth, logits, torch.full_like(logits, -math.inf))
    if top_p is not None and top_p < 1:
        probs, order = torch.sort(torch.softmax(logits.double(), dim=-1), dim=-1, descending=True, stable=True)
        before = torch.cat([torch.zeros_like(probs[..., :1]), probs.cumsum(dim=-1)[..., :-1]], dim=-1)
        keep = torch.empty_like(before, dtype=torch.bool).scatter_(-1, order, before < top_p)
        logits = logits.masked_fill(~keep, -math.inf)
    return logits
'''

_BEAM_OWN = '''
def beam_step(scores, log_probs, beam_size):
    batch, k, vocab = log_probs.shape
    {body}
'''

_PER_PARENT = '''
def beam_step(scores, log_probs, beam_size):
    # each beam keeps its own best token, then the beams are sorted
    best, tokens = (scores.unsqueeze(-1) + log_probs).max(dim=-1)
    new_scores, parents = best.sort(dim=-1, descending=True)
    tokens = tokens.gather(1, parents)
    return new_scores[:, :beam_size], parents[:, :beam_size], tokens[:, :beam_size]
'''

EXERCISES = (
    Exercise(
        id="ch10.top_k_top_p_filter",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="top_k_top_p_filter",
        kind="function",
        signature="top_k_top_p_filter(logits, top_k=None, top_p=None) -> torch.Tensor",
        points=3,
        solution_grade_id="ch10-top-k-top-p-filter",
        test_grade_id="ch10-top-k-top-p-filter-tests",
        reference="tfm_solution.decoding:top_k_top_p_filter",
        cases=top_k_top_p_filter_cases,
        contract=Contract(
            dtype="the result has the dtype of `logits` (float32 in, float32 out; float64 in, float64 out)",
            keeps_dtype=True,
            rules=(
                ("ties", "every token whose logit is at least the `top_k`-th largest stays, so tokens tied with the "
                         "k-th are all kept"),
                ("boundary", "a token stays exactly when the probability of the more probable tokens before it is "
                             "below `top_p`: where it equals `top_p` the token goes"),
                ("order", "among tokens of equal probability the order is yours: any choice that keeps the right "
                          "number of them is accepted"),
            ),
        ),
        alternatives={
            "shifted_cumsum_stable_sort": _FILTER_OWN,
            "kth_by_sort": _filter(k_test="logits < logits.sort(dim=-1, descending=True).values[..., top_k - 1:top_k]"),
            "mass_before_as_difference": _filter(drop="~(before < top_p)"),
        },
        mutants={
            "filled_in_place": Mutant("inputs", _filter(k_test="logits < kth").replace(
                "logits = logits.masked_fill({k_test}, -math.inf)".format(k_test="logits < kth"),
                "logits.masked_fill_(logits < kth, -math.inf)")),
        },
        mistakes={
            "drops_crossing_token": Mistake(
                "top-p drops the token that crosses p: keep each token while the mass *before* it is below p, "
                "so the kept set reaches p",
                _filter(drop="probs.cumsum(dim=-1) > top_p")),
            "keeps_one_more": Mistake(
                "top-p keeps one token too many: the token after the one that crosses p must go",
                _filter(drop="before - probs >= top_p")),
            "top_p_ignores_top_k": Mistake(
                "top-p was measured on the original distribution; it applies to what top-k left, renormalised",
                _filter(probs="original.double()")),
            "unsorted_mass": Mistake(
                "the running mass was summed in vocabulary order; sort the probabilities, largest first",
                _UNSORTED_P),
            "float32_mass": Mistake(
                "the running mass was summed in float32: a dominant token's probability rounds to 1.0 and the "
                "tail is cut before p is reached (p = 1 must keep everything)",
                _filter(probs="logits.float()", p_guard="True")),
            "top_p_one_filters": Mistake(
                "top_p = 1 still filtered: p >= 1 means no filtering (the mass can round to 1.0 before the tail)",
                _filter(p_guard="True")),
            "top_k_off_by_one": Mistake(
                "top-k kept k - 1 tokens: keep the logits >= the k-th largest (`logits < kth` are removed)",
                _filter(k_test="logits <= kth")),
            "returns_probabilities": Mistake(
                "returned probabilities; return the logits, with the removed ones set to -inf",
                _filter(result="logits.softmax(dim=-1)")),
            "ties_dropped": Mistake(
                "exactly top_k tokens were kept, so a token tied with the k-th largest logit was removed: keep every "
                "token whose logit is at least the k-th largest",
                _filter(k_test="torch.ones_like(logits, dtype=torch.bool).scatter(-1, logits.topk(top_k, dim=-1)"
                               ".indices, False)")),
            "boundary_token_kept": Mistake(
                "a token whose preceding mass equals top_p exactly was kept: keep a token only while the mass before "
                "it is below top_p (before < top_p), so the kept set just reaches p",
                _filter(drop="before > top_p")),
        },
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch10.beam_step",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="beam_step",
        kind="function",
        signature="beam_step(scores, log_probs, beam_size) -> (new_scores, parents, tokens)",
        points=3,
        solution_grade_id="ch10-beam-step",
        test_grade_id="ch10-beam-step-tests",
        reference="tfm_solution.decoding:beam_step",
        cases=beam_step_cases,
        return_names=("new_scores", "parents", "tokens"),
        contract=Contract(
            dtype="`new_scores` has the dtype of `scores + log_probs`, or float64 if you score in float64 (both are "
                  "accepted); `parents` and `tokens` are `long`",
            may_widen=("new_scores",),
            rules=(("ties", "no two candidates of a sentence tie in the graded cases, so the order is unique"),),
        ),
        alternatives={
            "float64_scoring": _BEAM_OWN.format(
                body="candidates = (scores.double().unsqueeze(-1) + log_probs.double()).view(batch, -1)\n"
                     "    new_scores, flat = candidates.topk(beam_size, dim=-1)\n"
                     "    return new_scores, flat // vocab, flat % vocab"),
            "sorted_and_unravelled": _BEAM_OWN.format(
                body="candidates = (scores[:, :, None] + log_probs).flatten(1)\n"
                     "    values, flat = candidates.sort(dim=-1, descending=True)\n"
                     "    parents, tokens = torch.unravel_index(flat[:, :beam_size], (k, vocab))\n"
                     "    return values[:, :beam_size], parents, tokens"),
            "floor_division": _beam(parents="torch.div(flat, vocab, rounding_mode='floor')",
                                    tokens="torch.remainder(flat, vocab)"),
        },
        mutants={
            "added_in_place": Mutant("inputs", _beam(candidates="log_probs.add_(scores.unsqueeze(-1))")),
        },
        mistakes={
            "scores_not_accumulated": Mistake(
                "the beams' scores were not added: a candidate's score is scores[parent] + log_probs[parent, token]",
                _beam(candidates="log_probs")),
            "pruned_per_parent": Mistake(
                "each beam kept only its own best continuation: prune the k * vocab candidates of a sentence "
                "together, so a good beam can have several children",
                _PER_PARENT),
            "parent_token_swapped": Mistake(
                "parents and tokens are swapped: for the flat index j * vocab + v the parent is // vocab, "
                "the token % vocab",
                _beam(parents="flat % vocab", tokens="flat // vocab")),
            "worst_first": Mistake(
                "the worst candidates were kept (topk with largest=False); keep the best, best first",
                _beam(largest=", largest=False")),
            "log_probs_multiplied": Mistake(
                "log-probabilities were multiplied; they are added (probabilities multiply, their logs add)",
                _beam(candidates="scores.unsqueeze(-1) * log_probs")),
            "flat_row_parents": Mistake(
                "parents are rows of the flattened batch (b * k + j); return the beam index j within the sentence",
                _beam(parents="flat // vocab + k * torch.arange(batch).unsqueeze(1)")),
        },
        time_budget_s=1.0,
    ),
)
