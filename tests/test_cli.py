"""The command line, in process through ``tfm_solution.cli.main``: help, train, translate,
evaluate and bench, as a new user runs them."""

import io
import json
import os
import re

import pytest

from tfm_solution.cli import _parser, main


@pytest.mark.fast
@pytest.mark.parametrize("command", ["train", "translate", "evaluate", "bench"])
def test_help_documents_every_option(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    sub = next(a for a in _parser()._actions if a.dest == "command").choices[command]
    for action in sub._actions:
        for flag in action.option_strings:
            assert flag in text
        if action.option_strings and action.dest != "help":
            assert action.help, f"{command} {action.option_strings} has no help text"


@pytest.mark.fast
def test_missing_checkpoint_and_missing_data_are_clear_errors(tmp_path, capsys):
    assert main(["translate", str(tmp_path / "nowhere"), "4 5"]) == 2
    assert "not a checkpoint" in capsys.readouterr().err
    assert main(["train", "--task", "multi30k", "--out", str(tmp_path / "m"), "--data-dir", str(tmp_path)]) == 2
    assert "lacks the Multi30k files" in capsys.readouterr().err


@pytest.mark.fast
def test_python_dash_m_entry_point(monkeypatch, capsys):
    import runpy

    monkeypatch.setattr("sys.argv", ["tfm_solution", "--help"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("tfm_solution", run_name="__main__")
    assert exit_.value.code == 0 and "train,translate,evaluate,bench" in capsys.readouterr().out


@pytest.mark.fast
def test_bench_prints_a_side_by_side_ratio(capsys):
    assert main(["bench", "--config", "tiny", "--new-tokens", "6", "--vocab", "50", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"speedup \d+\.\d+x \(identical tokens\)", out) and "cores" in out


@pytest.mark.slow
def test_new_user_flow_train_translate_evaluate_copy(tmp_path, capsys, monkeypatch):
    out = tmp_path / "copy"
    assert main(["train", "--task", "copy", "--config", "tiny", "--device", "cpu", "--out", str(out),
                 "--max-steps", "150", "--quiet"]) == 0
    assert "checkpoint written" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == {"run.json", "tokenizer.json", "checkpoints", "last", "best",
                                               "metrics.jsonl"}
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["step"] == 150 and lines[-1]["val_loss"] < lines[0]["val_loss"]

    assert main(["translate", str(out), "4 5 6 7 8 9 10 4 5 6"]) == 0
    printed = capsys.readouterr()
    greedy = printed.out.strip()
    assert printed.err == ""
    # Symbols outside the copy vocabulary (1-3 are special ids, 11 is past it) are named, not silently used.
    assert main(["translate", str(out), "1 2 4 11"]) == 0
    assert "sentence 1 has words the model's vocabulary lacks, read as <unk>: '1', '2', '11'" in capsys.readouterr().err
    assert re.fullmatch(r"(\d+ ?)+", greedy)  # ids of the copy vocabulary
    for extra in (["--strategy", "beam", "--beam-size", "3"], ["--no-cache"]):
        assert main(["translate", str(out), "4 5 6 7 8 9 10 4 5 6", *extra]) == 0
        assert capsys.readouterr().out.strip() == greedy
        # Options may also come between the checkpoint and the sentences.
        assert main(["translate", str(out), *extra, "4 5 6 7 8 9 10 4 5 6", "5 6 7"]) == 0
        assert capsys.readouterr().out.strip().splitlines()[0] == greedy
    with pytest.raises(SystemExit):
        main(["translate", str(out), "--strategy", "beam", "4 5 6", "--no-such-option"])
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO("5 5 5\n\n6 7\n"))
    assert main(["translate", str(out), "--strategy", "sample", "--top-k", "2", "--seed", "1"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2

    assert main(["evaluate", str(out), "--limit", "20"]) == 0
    assert re.search(r"test: BLEU \d+\.\d+, exact match \d+\.\d%", capsys.readouterr().out)

    # resume continues the step count from the checkpoint
    assert main(["train", "--task", "copy", "--out", str(out), "--device", "cpu", "--max-steps", "170",
                 "--resume", "--quiet"]) == 0
    capsys.readouterr()
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 170


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("MULTI30K_DIR"), reason="needs the Multi30k mirror (CI sets MULTI30K_DIR)")
def test_multi30k_small_subset_trains_with_falling_validation_loss(tmp_path, capsys):
    out = tmp_path / "m30k"
    assert main(["train", "--task", "multi30k", "--config", "small", "--device", "cpu", "--out", str(out),
                 "--train-subset", "600", "--val-subset", "60", "--vocab-size", "500", "--max-tokens", "800",
                 "--epochs", "3", "--separate-vocab", "--quiet"]) == 0
    capsys.readouterr()
    val = [json.loads(line)["val_loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(val) == 3 and val[0] > val[1] > val[2], val
    assert main(["evaluate", str(out), "--split", "val", "--limit", "10", "--strategy", "beam"]) == 0
    assert "val: BLEU" in capsys.readouterr().out
