"""Chapter 12's Part A over many training seeds: the exact match correct courses reach, to set the bands on.

    python scripts/capstone_seeds.py                   # every course of STYLES, seeds 0-19, two processes
    python scripts/capstone_seeds.py --seeds 5 --jobs 1 solution

A correct course can be written in many ways that change only the rounding of its sums (one fused product for
the three projections, a standard deviation written out by hand, ``* d_k ** -0.5`` for ``/ math.sqrt(d_k)``).
After a few hundred steps of training, a change in the last bit is as good as another seed: the band that gives
full marks must hold for every seed, not for the course's own. For each course of ``STYLES`` (the solution's
answers, with the listed answers replaced) and each seed, this trains Part A exactly as the grader does
(``tfm_solution.capstone.train_reversal`` on ``ch12_capstone.TASK`` with that seed) and decodes 500 held-out
sequences with the course's greedy loop. Writes ``tfm_solution/assets/capstone_seeds.json``: the command, the
task, and per course and seed the exact match, the teacher-forced share, the step whose weights were kept and
the training's CPU seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import shlex
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from autograder.course_code import run_course  # noqa: E402
from autograder.exercises.ch12_capstone import TASK  # noqa: E402
from capstone_diagnosis import submission_with  # noqa: E402
from tfm_solution.capstone import ReversalTask, evaluate_reversal, scores, train_reversal  # noqa: E402

OUT = REPO / "tfm_solution" / "assets" / "capstone_seeds.json"

FUSED_ATTENTION = '''
from torch import nn
from torch.nn import functional as F


class MultiHeadedAttention(nn.Module):
    def __init__(self, h, d_model, dropout=0.1):
        super().__init__()
        assert d_model % h == 0
        self.d_k = d_model // h
        self.h = h
        self.linears = clones(nn.Linear(d_model, d_model), 4)
        self.attn = None
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query, key, value, mask=None):
        if mask is not None:
            mask = mask.unsqueeze(1)
        if query is key and key is value:  # self-attention: one product for the three projections
            weight = torch.cat([lin.weight for lin in self.linears[:3]])
            bias = torch.cat([lin.bias for lin in self.linears[:3]])
            query, key, value = F.linear(query, weight, bias).chunk(3, dim=-1)
        else:
            query, key, value = (lin(x) for lin, x in zip(self.linears, (query, key, value)))
        query, key, value = (split_heads(x, self.h) for x in (query, key, value))
        x, self.attn = attention(query, key, value, mask=mask, dropout=self.dropout)
        return self.linears[3](merge_heads(x))
'''

FRESH_MODULES = '''
from torch import nn


def make_model(src_vocab, tgt_vocab, N=6, d_model=512, d_ff=2048, h=8, dropout=0.1):
    def attn():
        return MultiHeadedAttention(h, d_model, dropout)

    def ff():
        return PositionwiseFeedForward(d_model, d_ff, dropout)

    model = EncoderDecoder(
        Encoder(EncoderLayer(d_model, attn(), ff(), dropout), N),
        Decoder(DecoderLayer(d_model, attn(), attn(), ff(), dropout), N),
        nn.Sequential(Embeddings(d_model, src_vocab), PositionalEncoding(d_model, dropout)),
        nn.Sequential(Embeddings(d_model, tgt_vocab), PositionalEncoding(d_model, dropout)),
        Generator(d_model, tgt_vocab),
    )
    for p in reversed(list(model.parameters())):
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    return model
'''

XAVIER_BACKWARDS = '''
import copy

from torch import nn


def make_model(src_vocab, tgt_vocab, N=6, d_model=512, d_ff=2048, h=8, dropout=0.1):
    c = copy.deepcopy
    attn = MultiHeadedAttention(h, d_model, dropout)
    ff = PositionwiseFeedForward(d_model, d_ff, dropout)
    position = PositionalEncoding(d_model, dropout)
    model = EncoderDecoder(
        Encoder(EncoderLayer(d_model, c(attn), c(ff), dropout), N),
        Decoder(DecoderLayer(d_model, c(attn), c(attn), c(ff), dropout), N),
        nn.Sequential(Embeddings(d_model, src_vocab), c(position)),
        nn.Sequential(Embeddings(d_model, tgt_vocab), c(position)),
        Generator(d_model, tgt_vocab),
    )
    for p in reversed(list(model.parameters())):
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    return model
'''

EXP_LOG_TABLE = '''
def positional_encoding(seq_len, d_model):
    position = torch.arange(seq_len, dtype=torch.float32).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * -(math.log(10000.0) / d_model))
    pe = torch.zeros(seq_len, d_model)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe
'''

HAND_STD = '''
from torch import nn


class LayerNorm(nn.Module):
    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).sum(-1, keepdim=True) / (x.size(-1) - 1)
        return self.a_2 * (x - mean) / (var.sqrt() + self.eps) + self.b_2
'''

XLOGY_LOSS = '''
from torch import nn


class LabelSmoothing(nn.Module):
    def __init__(self, size, padding_idx, smoothing=0.0):
        super().__init__()
        self.criterion = nn.KLDivLoss(reduction="sum")
        self.padding_idx = padding_idx
        self.confidence = 1.0 - smoothing
        self.smoothing = smoothing
        self.size = size
        self.true_dist = None

    def forward(self, x, target):
        true_dist = torch.full_like(x.detach(), self.smoothing / (self.size - 2))
        true_dist.scatter_(1, target.unsqueeze(1), self.confidence)
        true_dist[:, self.padding_idx] = 0
        true_dist[target == self.padding_idx] = 0
        self.true_dist = true_dist
        return (torch.xlogy(true_dist, true_dist) - true_dist * x).sum()
'''

REVERSED_MICRO_BATCHES = '''
def train_with_accumulation(model, batches, loss_compute, optimizer, scheduler, accum_iter):
    model.train()
    steps = 0
    iterator = iter(batches)
    while True:
        group = [batch for _, batch in zip(range(accum_iter), iterator)]
        if not group:
            return steps
        total = sum(int(batch.ntokens) for batch in group)
        for batch in reversed(group):
            out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
            _, loss_node = loss_compute(out, batch.tgt_y, total)
            loss_node.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        steps += 1
'''

POWER_SCALE = '''
def attention(query, key, value, mask=None, dropout=None):
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) * d_k ** -0.5
    if mask is not None:
        scores = scores.masked_fill(mask == 0, torch.finfo(scores.dtype).min)
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn
'''

STYLES: dict[str, tuple[str, dict[str, str]]] = {
    "solution": ("the solution notebooks' answers", {}),
    "another hand": ("one fused product for the three projections of self-attention, fresh modules instead of deep "
                     "copies and Xavier in reverse parameter order, a float32 exp/log table, a standard deviation "
                     "written out, KL written with xlogy, each group's micro-batches in reverse order",
                     {"ch05-multiheaded-attention": FUSED_ATTENTION, "ch08-make-model": FRESH_MODULES,
                      "ch02-positional-encoding": EXP_LOG_TABLE, "ch07-layer-norm": HAND_STD,
                      "ch09-label-smoothing": XLOGY_LOSS, "ch09-train-with-accumulation": REVERSED_MICRO_BATCHES}),
    "scale as a power": ("the solution with `* d_k ** -0.5` for `/ math.sqrt(d_k)` (rounding only)",
                         {"ch03-attention": POWER_SCALE}),
    "std by hand": ("the solution with the standard deviation written out (rounding only)",
                    {"ch07-layer-norm": HAND_STD}),
    "Xavier backwards": ("the solution initialising its matrices in reverse order (other random draws)",
                         {"ch08-make-model": XAVIER_BACKWARDS}),
}
"""Correct courses: (what differs from the solution, the answer cells replaced by grade id)."""


def course(style: str, scratch: Path) -> dict:
    """The namespace of the course ``style``: the solution's notebooks with its answers replaced, run."""
    folder = scratch / "course"
    replaced = STYLES[style][1]
    if not replaced:
        return run_course(REPO / "solutions")
    for number, (grade_id, source) in enumerate(replaced.items()):
        # The first replacement copies the solutions; the next ones rewrite that copy.
        submission_with(folder, grade_id, source, fresh=number == 0)
    return run_course(folder)


def one_run(job: tuple[str, int]) -> dict:
    style, seed = job
    task = dataclasses.replace(ReversalTask(**{k: v for k, v in TASK.items() if k != "module"}), seed=seed)
    with tempfile.TemporaryDirectory(prefix="capstone-style-") as scratch:
        parts = course(style, Path(scratch))
        trained = train_reversal(parts, task)
        found = evaluate_reversal(parts, trained.model, task, eval_seed=1000 + seed)
    accuracy, forced, agreement = scores(found.pairs, found.greedy, found.cached, found.forced, task.pad,
                                         theirs=found.theirs)
    return {"style": style, "seed": seed, "accuracy": accuracy, "forced": forced, "agreement": agreement,
            "kept_step": trained.kept_step, "train_cpu_s": round(trained.train_cpu_s, 1),
            "unchanged": list(trained.unchanged), "repeatable": found.repeatable}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("styles", nargs="*", choices=[[], *STYLES], default=[])
    parser.add_argument("--seeds", type=int, default=20, help="training seeds 0 .. SEEDS-1")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    styles = args.styles or list(STYLES)
    jobs = [(style, seed) for style in styles for seed in range(args.seeds)]
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        runs = []
        for row in pool.imap(one_run, jobs):
            runs.append(row)
            print(json.dumps(row), flush=True)
    summary = {style: {"what": STYLES[style][0], "worst": min(r["accuracy"] for r in runs if r["style"] == style),
                       "mean": sum(r["accuracy"] for r in runs if r["style"] == style) / args.seeds}
               for style in styles}
    for style, row in summary.items():
        print(f"{style:18s} worst {row['worst']:.1%}  mean {row['mean']:.1%}")
    if args.styles or args.seeds < 20:
        return 0  # a partial run is printed, not recorded
    command = shlex.join(["python", "scripts/capstone_seeds.py", *(argv if argv is not None else sys.argv[1:])])
    OUT.write_text(json.dumps({"command": command, "task": TASK, "courses": summary, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
