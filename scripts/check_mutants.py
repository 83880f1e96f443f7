"""Break the reference on purpose, one known mistake at a time, and check that the tests notice.

Each mutant is a textual edit of one file of ``tfm_solution``. The package and the tests are
copied into a temporary directory, so the working tree is never touched. A mutant that leaves
the tests green is reported as SURVIVED and the script exits 1.

    .venv/bin/python scripts/check_mutants.py          # all mutants
    .venv/bin/python scripts/check_mutants.py -k mask  # those whose name contains "mask"
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (name, file, text to replace, replacement)
MUTANTS: list[tuple[str, str, str, str]] = [
    ("no 1/sqrt(d_k) scale", "attention.py", "/ math.sqrt(d_k)", ""),
    ("softmax over queries", "attention.py", "scores.softmax(dim=-1)", "scores.softmax(dim=-2)"),
    ("mask filled with -1e9", "attention.py", "mask_fill_value(scores.dtype))", "-1e9)"),
    ("mask filled with -inf", "attention.py", "mask_fill_value(scores.dtype))", "float('-inf'))"),
    ("inverted mask", "attention.py", "masked_fill(mask == 0,", "masked_fill(mask != 0,"),
    ("dropout not applied to weights", "attention.py", "p_attn = dropout(p_attn)", "pass"),
    ("sdpa with raw bool mask", "multihead.py", "attn_mask=attn_mask,", "attn_mask=mask.bool() if mask is not None else None,"),
    ("heads merged without transpose", "multihead.py", "return x.transpose(1, 2).contiguous().view(", "return x.contiguous().view("),
    ("make_model drops attention dropout", "encoder_decoder.py", "MultiHeadedAttention(h, d_model, dropout, kernel", "MultiHeadedAttention(h, d_model, kernel"),
    ("encoder ignores its mask", "encoder_decoder.py", "self.self_attn(y, y, y, mask)", "self.self_attn(y, y, y, None)"),
    ("decoder cross-attention ignores src_mask", "encoder_decoder.py", "self.src_attn(y, m, m, src_mask)", "self.src_attn(y, m, m, None)"),
    ("post-LN normalises the sublayer only", "norm.py", "return self.norm(x + self.dropout(sublayer(x)))", "return x + self.norm(self.dropout(sublayer(x)))"),
    ("notes LayerNorm with biased std", "norm.py", "std = x.std(-1, keepdim=True)", "std = x.std(-1, keepdim=True, unbiased=False)"),
    ("torch LayerNorm eps ignored", "norm.py", "self.a_2, self.b_2, self.eps)", "self.a_2, self.b_2, 1e-3)"),
    ("generator not tied", "encoder_decoder.py", "model.generator.proj.weight = shared", "pass"),
    ("no final norm in pre-LN stacks", "encoder_decoder.py", "return LayerNorm(layer.size, kind=connection.norm.kind)", "return nn.Identity()"),
    ("embeddings unscaled", "embeddings.py", "self.lut(x) * math.sqrt(self.d_model)", "self.lut(x)"),
    ("PE indexes dimensions, not pairs", "positional_encoding.py", "-two_i / d_model", "-two_i / 2 / d_model"),
    ("PE sin and cos swapped", "positional_encoding.py", "pe[:, 0::2] = torch.sin(angle)", "pe[:, 0::2] = torch.cos(angle)"),
    ("rotation turns the wrong way", "positional_encoding.py", "r[even, even + 1] = s", "r[even, even + 1] = -s"),
    ("causal mask hides the diagonal", "masks.py", "dtype=torch.bool).tril()", "dtype=torch.bool).tril(-1)"),
    ("target padding not masked", "masks.py", "return tgt_pad_mask & subsequent_mask", "return tgt_pad_mask | subsequent_mask"),
    ("labels not shifted", "masks.py", "self.tgt_y = tgt[:, 1:]", "self.tgt_y = tgt[:, :-1]"),
    ("warm-up exponent wrong", "schedule.py", "warmup ** (-1.5)", "warmup ** (-0.5)"),
    ("FFN without ReLU", "feed_forward.py", "self.w_1(x).relu()", "self.w_1(x)"),
]


def run_fast_tests(work: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-m", "fast", "-p", "no:cacheprovider", "tests"],
        cwd=work,
        env={**os.environ, "PYTHONPATH": str(work)},
        capture_output=True,
        text=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", default="", help="only mutants whose name contains this text")
    args = parser.parse_args()
    survived = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copytree(ROOT / "tfm_solution", work / "tfm_solution")
        shutil.copytree(ROOT / "tests", work / "tests")
        if run_fast_tests(work).returncode != 0:
            print("the unmutated package fails its fast tests: fix that first")
            return 2
        for name, filename, old, new in MUTANTS:
            if args.k not in name:
                continue
            shutil.rmtree(work / "tfm_solution", ignore_errors=True)
            shutil.copytree(ROOT / "tfm_solution", work / "tfm_solution")
            target = work / "tfm_solution" / filename
            source = target.read_text()
            if source.count(old) != 1:
                print(f"STALE     {name}: the text to mutate is not found exactly once in {filename}")
                survived.append(name)
                continue
            target.write_text(source.replace(old, new))
            start = time.perf_counter()
            result = run_fast_tests(work)
            verdict = "killed" if result.returncode == 1 else ("SURVIVED" if result.returncode == 0 else "ERROR")
            if verdict != "killed":
                survived.append(name)
            print(f"{verdict:9} {name}  ({time.perf_counter() - start:.1f} s)")
    print(f"{len(survived)} of the selected mutants survived" if survived else "every mutant was killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
