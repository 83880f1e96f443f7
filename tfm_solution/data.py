"""Chapter 9 — data (数据): the copy task, Multi30k German→English, subword tokenizers and
batches by approximate length under a token budget (as the paper batches).

Special ids are the notes' everywhere: ``<s>`` 0 (the start symbol, never the pad id), ``</s>`` 1,
``<blank>`` 2 (padding, the default of ``Batch(src, tgt=None, pad=2)``), ``<unk>`` 3.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .masks import Batch

BOS, EOS, PAD, UNK = 0, 1, 2, 3
SPECIALS = ["<s>", "</s>", "<blank>", "<unk>"]

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
MULTI30K_ENV = "MULTI30K_DIR"
MULTI30K_SPLITS = {"train": "train", "val": "val", "test": "test_2016_flickr"}
MULTI30K_SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
}

Example = tuple[list[int], list[int]]


class DataUnavailableError(RuntimeError):
    """The Multi30k files are neither on disk nor downloadable."""


# --- the copy task -------------------------------------------------------------------------


def copy_examples(n: int, seq_len: int, vocab: int, generator: torch.Generator) -> list[Example]:
    """``n`` random sequences of ``seq_len`` ordinary ids (``4 .. vocab-1``) to copy.

    Source: the ids then ``</s>``; target: ``<s>``, the same ids, ``</s>``.
    """
    if vocab <= len(SPECIALS) + 1:
        raise ValueError(f"vocab must leave at least two ordinary ids after the {len(SPECIALS)} specials")
    data = torch.randint(len(SPECIALS), vocab, (n, seq_len), generator=generator).tolist()
    return [(row + [EOS], [BOS] + row + [EOS]) for row in data]


def copy_tokenizer(vocab: int) -> Tokenizer:
    """A word-level tokenizer whose words are the ids themselves (``"7 4 9"`` -> ``[7, 4, 9]``)."""
    words = {w: i for i, w in enumerate(SPECIALS)} | {str(i): i for i in range(len(SPECIALS), vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


# --- Multi30k ------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _verify(path: Path) -> None:
    got = sha256(path)
    if got != MULTI30K_SHA256[path.name]:
        raise DataUnavailableError(f"checksum mismatch for {path}: sha256 {got}, expected {MULTI30K_SHA256[path.name]}")


def _default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tfm_solution" / "multi30k"


def multi30k_dir(data_dir: str | Path | None = None, cache_dir: str | Path | None = None,
                 base_url: str = MULTI30K_URL) -> Path:
    """A directory holding all six verified Multi30k task-1 raw files.

    Order: ``data_dir``; else the ``MULTI30K_DIR`` environment variable; else ``cache_dir``
    (default ``~/.cache/tfm_solution/multi30k``), downloading missing files from ``base_url``.
    Every file is checked against its sha256; a mismatch or a failed download raises
    ``DataUnavailableError`` saying how to get the data.
    """
    given = data_dir or os.environ.get(MULTI30K_ENV)
    if given:
        folder = Path(given)
        missing = [n for n in MULTI30K_SHA256 if not (folder / n).is_file()]
        if missing:
            raise DataUnavailableError(f"{folder} lacks the Multi30k files {missing}")
    else:
        folder = Path(cache_dir) if cache_dir else _default_cache()
        folder.mkdir(parents=True, exist_ok=True)
        for name in MULTI30K_SHA256:
            if not (folder / name).is_file():
                _download(base_url + name, folder / name)
    for name in MULTI30K_SHA256:
        _verify(folder / name)
    return folder


def _download(url: str, dest: Path) -> None:
    try:
        with urllib.request.urlopen(url, timeout=30) as response, tempfile.NamedTemporaryFile(
            dir=dest.parent, delete=False
        ) as tmp:
            shutil.copyfileobj(response, tmp)
    except (urllib.error.URLError, OSError) as err:
        raise DataUnavailableError(
            f"cannot download {url} ({err}). Multi30k (task 1, raw) is needed: with internet access "
            f"run again; offline, copy train/val/test_2016_flickr .de.gz/.en.gz from the public "
            f"multi30k/dataset repository (data/task1/raw/) into a folder and pass --data-dir FOLDER "
            f"or set {MULTI30K_ENV}=FOLDER."
        ) from err
    tmp_path = Path(tmp.name)
    if sha256(tmp_path) != MULTI30K_SHA256[dest.name]:
        tmp_path.unlink()
        raise DataUnavailableError(f"checksum mismatch for the download of {url}; the file was discarded")
    tmp_path.replace(dest)


def load_multi30k(split: str, folder: Path) -> list[tuple[str, str]]:
    """``(german, english)`` sentence pairs of ``split`` (``train``, ``val`` or ``test``)."""
    if split not in MULTI30K_SPLITS:
        raise ValueError(f"split must be one of {sorted(MULTI30K_SPLITS)}, got {split!r}")
    sides = []
    for lang in ("de", "en"):
        with gzip.open(folder / f"{MULTI30K_SPLITS[split]}.{lang}.gz", "rt", encoding="utf-8") as f:
            sides.append([line.strip() for line in f])
    if len(sides[0]) != len(sides[1]):
        raise ValueError(f"{split}: {len(sides[0])} German but {len(sides[1])} English lines")
    return list(zip(*sides))


# --- subword tokenizers --------------------------------------------------------------------


def train_tokenizer(sentences: Iterable[str], vocab_size: int) -> Tokenizer:
    """A BPE subword tokenizer trained on ``sentences`` (give it the training split only).

    The Metaspace pre-tokenizer marks word starts with ``▁`` so ``decode`` restores the spaces.
    """
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(sentences, trainer)
    return tok


@dataclass
class TokenizerPair:
    """Source and target tokenizers; the same object when the vocabulary is shared."""

    src: Tokenizer
    tgt: Tokenizer

    @classmethod
    def train(cls, pairs: Sequence[tuple[str, str]], vocab_size: int, shared: bool) -> "TokenizerPair":
        if shared:
            tok = train_tokenizer((s for pair in pairs for s in pair), vocab_size)
            return cls(tok, tok)
        return cls(train_tokenizer((p[0] for p in pairs), vocab_size),
                   train_tokenizer((p[1] for p in pairs), vocab_size))

    def save(self, folder: Path) -> None:
        """``tokenizer.json`` once for a shared vocabulary, else ``tokenizer_src.json`` and ``tokenizer_tgt.json``."""
        if self.src is self.tgt:
            self.src.save(str(folder / "tokenizer.json"))
        else:
            self.src.save(str(folder / "tokenizer_src.json"))
            self.tgt.save(str(folder / "tokenizer_tgt.json"))

    @classmethod
    def load(cls, folder: Path) -> "TokenizerPair":
        folder = Path(folder)
        if (folder / "tokenizer.json").is_file():
            shared = Tokenizer.from_file(str(folder / "tokenizer.json"))
            return cls(shared, shared)
        return cls(Tokenizer.from_file(str(folder / "tokenizer_src.json")),
                   Tokenizer.from_file(str(folder / "tokenizer_tgt.json")))

    def encode_src(self, text: str) -> list[int]:
        return self.src.encode(text).ids + [EOS]

    def unknown_words(self, text: str) -> list[str]:
        """The pieces of ``text`` the source tokenizer maps to ``<unk>`` (the model never saw them)."""
        encoding = self.src.encode(text)
        return [text[start:end] for i, (start, end) in zip(encoding.ids, encoding.offsets) if i == UNK]

    def decode_tgt(self, ids: Sequence[int]) -> str:
        """Text of target ids, stopping at ``</s>`` and dropping the other specials."""
        ids = list(ids)
        if EOS in ids:
            ids = ids[: ids.index(EOS)]
        return self.tgt.decode([i for i in ids if i >= len(SPECIALS)])

    def encode_pairs(self, pairs: Sequence[tuple[str, str]], max_len: int) -> tuple[list[Example], int]:
        """Ids of each pair (source + ``</s>``; ``<s>`` + target + ``</s>``).

        Pairs with either side longer than ``max_len`` ids are left out, never cropped (a
        cropped target would lose its ``</s>``); returns the kept examples and how many were left out.
        """
        kept, too_long = [], 0
        for de, en in pairs:
            src = self.encode_src(de)
            tgt = [BOS] + self.tgt.encode(en).ids + [EOS]
            if len(src) > max_len or len(tgt) > max_len:
                too_long += 1
            else:
                kept.append((src, tgt))
        return kept, too_long


# --- batching ------------------------------------------------------------------------------


def token_batches(examples: Sequence[Example], max_tokens: int, generator: torch.Generator | None = None
                  ) -> list[list[int]]:
    """Group example indices by approximate length so each padded batch holds at most
    ``max_tokens`` source and at most ``max_tokens`` target positions.

    Examples are sorted by length (ties broken at random when a generator is given) and cut
    greedily; the batch order is shuffled with ``generator``. An example longer than the
    budget raises rather than being cut.
    """
    n = len(examples)
    noise = torch.rand(n, generator=generator).tolist() if generator is not None else [0.0] * n
    order = sorted(range(n), key=lambda i: (len(examples[i][1]), len(examples[i][0]), noise[i]))
    batches: list[list[int]] = []
    current: list[int] = []
    longest_src = longest_tgt = 0
    for i in order:
        s, t = len(examples[i][0]), len(examples[i][1])
        if max(s, t) > max_tokens:
            raise ValueError(f"example {i} has {max(s, t)} ids, over the budget of {max_tokens} tokens")
        ls, lt = max(longest_src, s), max(longest_tgt, t)
        if current and max(ls, lt) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, ls, lt = [], s, t
        current.append(i)
        longest_src, longest_tgt = ls, lt
    if current:
        batches.append(current)
    if generator is not None:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
    return batches


def pad_batch(seqs: Sequence[Sequence[int]], pad: int = PAD) -> torch.Tensor:
    """Right-pad id lists into a ``(batch, longest)`` long tensor."""
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad, dtype=torch.long)
    for row, s in enumerate(seqs):
        out[row, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def collate(examples: Sequence[Example], indices: Sequence[int]) -> Batch:
    """A training ``Batch`` (padded with ``<blank>``) of the chosen examples."""
    return Batch(pad_batch([examples[i][0] for i in indices]), pad_batch([examples[i][1] for i in indices]), pad=PAD)


def iterate_batches(examples: Sequence[Example], batches: Sequence[Sequence[int]]) -> Iterator[Batch]:
    for indices in batches:
        yield collate(examples, indices)
