"""Data: the copy task, Multi30k download and checksum verification (against a local HTTP server),
subword tokenizers trained on the training split, and token-budget batches."""

import functools
import gzip
import hashlib
import http.server
import os
import threading

import pytest
import torch

from tfm_solution import data
from tfm_solution.data import (BOS, EOS, PAD, UNK, DataUnavailableError, TokenizerPair, collate, copy_examples,
                               copy_tokenizer, load_multi30k, multi30k_dir, pad_batch, token_batches,
                               train_tokenizer)

pytestmark = pytest.mark.fast

FAKE = {  # stand-in for the six Multi30k files
    "train": (["ein Hund läuft .", "zwei Katzen schlafen .", "ein Mann liest ein Buch ."],
              ["a dog runs .", "two cats sleep .", "a man reads a book ."]),
    "val": (["ein Hund schläft ."], ["a dog sleeps ."]),
    "test_2016_flickr": (["eine Frau singt ."], ["a woman sings ."]),
}


@pytest.fixture
def fake_multi30k(tmp_path, monkeypatch):
    """Six gzip files and, patched in, their checksums."""
    folder = tmp_path / "served"
    folder.mkdir()
    sums = {}
    for stem, sides in FAKE.items():
        for lang, lines in zip(("de", "en"), sides):
            path = folder / f"{stem}.{lang}.gz"
            path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
            sums[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    monkeypatch.setattr(data, "MULTI30K_SHA256", sums)
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    return folder


@pytest.fixture
def server(fake_multi30k):
    """A local HTTP server on 127.0.0.1 serving the fake files; yields its base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(fake_multi30k))
    handler.log_message = lambda *args: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def test_copy_examples_use_a_start_symbol_distinct_from_pad():
    examples = copy_examples(50, 6, 11, torch.Generator().manual_seed(0))
    assert BOS != PAD
    for src, tgt in examples:
        assert tgt == [BOS] + src[:-1] + [EOS] and src[-1] == EOS
        assert all(4 <= t < 11 for t in src[:-1])
    with pytest.raises(ValueError, match="vocab"):
        copy_examples(1, 3, 5, torch.Generator())


def test_copy_tokenizer_maps_words_to_their_ids():
    tok = copy_tokenizer(11)
    assert tok.encode("4 10 7").ids == [4, 10, 7]
    assert tok.get_vocab_size() == 11
    pair = TokenizerPair(tok, tok)
    assert pair.decode_tgt([5, 9, EOS, 6]) == "5 9"


def test_download_verifies_checksums(server, fake_multi30k, tmp_path):
    cache = tmp_path / "cache"
    folder = multi30k_dir(cache_dir=cache, base_url=server)
    assert folder == cache
    for name in data.MULTI30K_SHA256:
        assert (cache / name).read_bytes() == (fake_multi30k / name).read_bytes()
    assert load_multi30k("train", folder)[1] == ("zwei Katzen schlafen .", "two cats sleep .")
    assert load_multi30k("test", folder) == [("eine Frau singt .", "a woman sings .")]
    # a second call finds the verified files and downloads nothing
    assert multi30k_dir(cache_dir=cache, base_url="http://127.0.0.1:9/") == cache


def test_download_with_wrong_checksum_is_discarded(server, tmp_path, monkeypatch):
    monkeypatch.setitem(data.MULTI30K_SHA256, "val.en.gz", "0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(DataUnavailableError, match="checksum mismatch.*val.en.gz"):
        multi30k_dir(cache_dir=cache, base_url=server)
    assert not (cache / "val.en.gz").exists()
    assert not [p for p in cache.iterdir() if p.name not in data.MULTI30K_SHA256]  # no temporary left behind


def test_offline_without_data_gives_one_clear_error(fake_multi30k, tmp_path):
    with socket_closed_port() as url, pytest.raises(DataUnavailableError) as err:
        multi30k_dir(cache_dir=tmp_path / "empty", base_url=url)
    message = str(err.value)
    assert "--data-dir" in message and "MULTI30K_DIR" in message and "multi30k/dataset" in message


class socket_closed_port:
    """A URL on 127.0.0.1 where nothing listens."""

    def __enter__(self):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return f"http://127.0.0.1:{port}/"

    def __exit__(self, *exc):
        return False


def test_local_folder_from_argument_or_environment(fake_multi30k, tmp_path, monkeypatch):
    assert multi30k_dir(fake_multi30k) == fake_multi30k
    monkeypatch.setenv("MULTI30K_DIR", str(fake_multi30k))
    assert multi30k_dir() == fake_multi30k
    with pytest.raises(DataUnavailableError, match="lacks the Multi30k files"):
        multi30k_dir(tmp_path)
    (fake_multi30k / "val.de.gz").write_bytes(gzip.compress(b"tampered\n"))
    with pytest.raises(DataUnavailableError, match="checksum mismatch"):
        multi30k_dir(fake_multi30k)


def test_load_rejects_bad_split_and_misaligned_files(fake_multi30k):
    with pytest.raises(ValueError, match="split"):
        load_multi30k("dev", fake_multi30k)
    (fake_multi30k / "val.en.gz").write_bytes(gzip.compress(b"one\ntwo\n"))
    with pytest.raises(ValueError, match="1 German but 2 English"):
        load_multi30k("val", fake_multi30k)


@pytest.mark.skipif(not os.environ.get("MULTI30K_DIR"), reason="needs the Multi30k mirror (CI sets MULTI30K_DIR)")
def test_real_multi30k_mirror_verifies_and_has_the_documented_sizes():
    folder = multi30k_dir()
    sizes = {split: len(load_multi30k(split, folder)) for split in ("train", "val", "test")}
    assert sizes == {"train": 29000, "val": 1014, "test": 1000}


def test_tokenizer_learns_from_training_split_only_and_round_trips():
    train = [("der Hund", "the dog"), ("die Katze", "the cat")] * 20
    pair = TokenizerPair.train(train, vocab_size=60, shared=False)
    assert "dog" in pair.tgt.get_vocab() or "▁dog" in pair.tgt.get_vocab()
    assert not any("zebra" in w for w in pair.tgt.get_vocab())  # a word never seen in training
    assert pair.src is not pair.tgt and "Hund" not in "".join(pair.tgt.get_vocab())
    ids = pair.tgt.encode("the cat").ids
    assert pair.decode_tgt(ids + [EOS, 7]) == "the cat"
    shared = TokenizerPair.train(train, vocab_size=60, shared=True)
    assert shared.src is shared.tgt
    tok = train_tokenizer(["a b"], 30)
    # the notes' numbering, so their defaults (Batch(..., pad=2), start symbol 0) are right
    assert [tok.token_to_id(t) for t in ("<s>", "</s>", "<blank>", "<unk>")] == [0, 1, 2, 3]
    assert (BOS, EOS, PAD, UNK) == (0, 1, 2, 3)


def test_tokenizers_save_and_load(tmp_path):
    pair = TokenizerPair.train([("ein Hund", "a dog")] * 5, vocab_size=40, shared=False)
    pair.save(tmp_path)
    loaded = TokenizerPair.load(tmp_path)
    assert loaded.src.encode("ein Hund").ids == pair.src.encode("ein Hund").ids
    assert loaded.tgt.encode("a dog").ids == pair.tgt.encode("a dog").ids


def test_long_pairs_are_counted_and_left_out_never_cropped():
    tok = copy_tokenizer(11)
    pair = TokenizerPair(tok, tok)
    pairs = [("4 5", "4 5"), ("4 5 6 7 8 9", "4"), ("4", "4 5 6 7 8 9"), ("6", "7")]
    kept, too_long = pair.encode_pairs(pairs, max_len=5)
    assert too_long == 2
    assert kept == [([4, 5, EOS], [BOS, 4, 5, EOS]), ([6, EOS], [BOS, 7, EOS])]


def random_examples(n=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(2, 40, (n, 2), generator=g).tolist()
    return [([5] * a, [1] + [6] * b) for a, b in lens]


def test_token_batches_cover_every_example_once_within_budget():
    examples = random_examples()
    batches = token_batches(examples, max_tokens=200, generator=torch.Generator().manual_seed(1))
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(examples)))
    for b in batches:
        batch = collate(examples, b)
        assert batch.src.numel() <= 200 and (batch.tgt.size(0) * (batch.tgt.size(1) + 1)) <= 200
    # sorted by length: the padding wasted is a small share of the batch
    pad_share = sum(int((collate(examples, b).tgt_y == PAD).sum()) for b in batches) / sum(
        collate(examples, b).tgt_y.numel() for b in batches)
    assert pad_share < 0.1
    again = token_batches(examples, max_tokens=200, generator=torch.Generator().manual_seed(1))
    assert again == batches
    assert sorted(map(len, token_batches(examples, 200))) == sorted(map(len, batches))


def test_token_batches_reject_an_example_over_the_budget():
    with pytest.raises(ValueError, match="over the budget"):
        token_batches([([5] * 30, [1, 2])], max_tokens=20)


def test_pad_batch_pads_right():
    assert pad_batch([[4, 5, 6], [7]]).tolist() == [[4, 5, 6], [7, PAD, PAD]]
