"""Damaged run files: one line naming the file (and the line), never a traceback or a silent answer
(issue 27, section 2); what the tool may delete or replace (section 1)."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
from helpers import TINY, assert_user_error, tiny

from minigpt_cli.errors import MinigptError
from minigpt_cli.run import claim as claims
from minigpt_cli.run import folder as runs
from minigpt_cli.run.metrics import RunLogger, read_events
from minigpt_cli.trainer import train

OLD_LAYOUT = Path(__file__).resolve().parent / "fixtures" / "old-layout"


def _event(step, kind="train"):
    if kind == "train":
        return {"step": step, "event": "train", "elapsed_s": 0.1 * step, "loss": 4.0, "lr": 1e-3}
    return {
        "step": step,
        "event": "eval",
        "elapsed_s": 0.1 * step,
        "train_loss": 4.0,
        "val_loss": 4.1,
    }


@pytest.mark.parametrize(
    "bad",
    [
        b"\xff\xfe not text",
        b"[]",
        b"42",
        b'{"foo": 1}',
        b'{"step": "x", "event": "eval"}',
        b'{"step": 1, "event": "eval", "elapsed_s": 1.0}',
        b'{"step": true, "event": "train"}',
        # impossible losses: a cross-entropy is never negative, and never NaN in a log
        b'{"step": 9, "event": "eval", "elapsed_s": 1.0, "train_loss": NaN, "val_loss": NaN}',
        b'{"step": 9, "event": "eval", "elapsed_s": 1.0, "train_loss": 1.0, "val_loss": -5.0}',
    ],
)
def test_a_damaged_metrics_line_is_one_error_naming_the_file_and_line(tmp_path, bad):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps(_event(i)).encode() for i in range(4)]
    path.write_bytes(b"\n".join([*lines[:2], bad, *lines[2:]]) + b"\n")
    with pytest.raises(MinigptError, match=r"metrics.jsonl line 3 is not a metrics event") as info:
        read_events(path)
    assert "\n" not in str(info.value)
    logger = RunLogger(tmp_path)
    with pytest.raises(
        MinigptError, match="line 3"
    ):  # a resume refuses it too: nothing of the history is lost
        logger.truncate_to(3, True)
    assert path.read_bytes().count(b"\n") == 5


def test_only_a_last_line_cut_short_is_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    full = "".join(json.dumps(_event(i, "eval" if i % 2 else "train")) + "\n" for i in range(9))
    path.write_text(full + '{"step": 9, "event": "tr')
    assert [e["step"] for e in read_events(path)] == list(range(9))
    logger = RunLogger(tmp_path)
    logger.truncate_to(9, True)
    assert path.read_text() == full
    assert len(logger.train_points) == 5 and len(logger.eval_points) == 4


def test_compare_refuses_a_damaged_metrics_file_in_one_line(cli, data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=2"), run_name="a", echo=lambda m: None, progress=False)
    metrics = tmp_path / "runs" / "a" / "metrics.jsonl"
    metrics.write_text('{"step": "x", "event": "eval"}\n' + metrics.read_text())
    assert_user_error(
        cli("compare", "runs/a", "--output", "cmp"), "metrics.jsonl line 1", "fix or remove"
    )
    metrics.write_bytes(b"\xff\n" + metrics.read_bytes())
    assert_user_error(cli("compare", "runs/a", "--output", "cmp"), "metrics.jsonl line 1")


@pytest.mark.parametrize(
    "field,value,fragment",
    [
        ("step", "abc", "step"),
        ("world_size", "two", "world_size"),
        ("world_size", 0, "world_size"),
        ("step", -1, "step"),
        # well-typed edits: only the digest of the fields shows them
        ("step", 7, "digest"),
        ("val_loss", 0.5, "digest"),
    ],
)
def test_a_damaged_meta_json_is_one_line(
    cli, data_dir, tmp_path, monkeypatch, field, value, fragment
):
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=2"), run_name="m", echo=lambda m: None, progress=False)
    for which in ("best", "last"):
        path = tmp_path / "runs" / "m" / "checkpoints" / which / "meta.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))
    assert_user_error(
        cli("evaluate", "--run", "runs/m"), "meta.json is missing or damaged", fragment
    )


def test_a_meta_json_from_before_its_digest_still_loads(data_dir, tmp_path, monkeypatch):
    from minigpt_cli.eval.evaluate import evaluate

    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=2"), run_name="old", echo=lambda m: None, progress=False)
    path = tmp_path / "runs" / "old" / "checkpoints" / "last" / "meta.json"
    meta = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in meta.items() if k != "meta_sha256"}))
    assert evaluate("runs/old", checkpoint="last")["step"] == meta["step"] == 2


def test_evaluate_with_a_huge_loss_reports_an_infinite_perplexity(data_dir, tmp_path, monkeypatch):
    from minigpt_cli.eval import evaluate as ev

    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=2"), run_name="e", echo=lambda m: None, progress=False)
    monkeypatch.setattr(ev, "_score_full", lambda model, tokens, *a: 800.0 * (len(tokens) - 1))
    result = ev.evaluate("runs/e", full=True)
    assert result["loss"] == pytest.approx(800.0) and result["perplexity"] == math.inf
    assert "perplexity      inf" in ev.format_evaluation(result)


@pytest.mark.parametrize("name", ["model.safetensors", "trainer_state.pt", "config.yaml"])
def test_a_flipped_bit_in_a_checkpoint_file_is_refused(cli, data_dir, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=2"), run_name="c", echo=lambda m: None, progress=False)
    for which in ("best", "last"):
        path = tmp_path / "runs" / "c" / "checkpoints" / which / name
        data = bytearray(path.read_bytes())
        if (
            name == "config.yaml"
        ):  # cut at a line boundary: still valid YAML, silently defaults before
            data = data[: data.index(b"\n", len(data) // 2) + 1]
        else:
            data[len(data) // 2] ^= 0x10
        path.write_bytes(bytes(data))
    sets = ["--set", f"data.data_dir={data_dir}", "--set", "train.max_iters=4", "--no-progress"]
    assert_user_error(
        cli("train", TINY, "--resume", "runs/c", *sets), name, "sha256", notes_ok=True
    )
    if name != "trainer_state.pt":
        for command in (
            ["generate", "--run", "runs/c", "--max-new-tokens", "3"],
            ["evaluate", "--run", "runs/c"],
            ["export", "runs/c", "--output", "exp"],
        ):
            assert_user_error(cli(*command), name, "sha256")
        assert not (tmp_path / "exp").exists()


def test_a_checkpoint_from_before_the_checksums_loads_with_a_note(tmp_path, capsys):
    from minigpt_cli.run import checkpoint

    run = tmp_path / "old"
    shutil.copytree(OLD_LAYOUT, run)
    model, cfg = checkpoint.load_model(runs.checkpoint_dir(run, runs.LAST))
    assert cfg.name == "tiny" and model.wte.weight.shape[0] == cfg.model.vocab_size
    assert checkpoint.load_trainer_state(runs.checkpoint_dir(run, runs.LAST))["step"] == 4
    err = capsys.readouterr().err
    assert err.count("note:") == 1 and "before checkpoints recorded their sha256" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
@pytest.mark.parametrize("name", ["model.safetensors", "meta.json", "trainer_state.pt"])
def test_an_unreadable_checkpoint_file_is_called_unreadable(data_dir, tmp_path, monkeypatch, name):
    from minigpt_cli.run import checkpoint

    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=2"), run_name="u", echo=lambda m: None, progress=False)
    last = runs.checkpoint_dir(tmp_path / "runs" / "u", runs.LAST)
    (last / name).chmod(0)
    with pytest.raises(MinigptError, match=f"cannot read .*{name}': permission denied") as info:
        checkpoint.load_model(
            last
        ) if name != "trainer_state.pt" else checkpoint.load_trainer_state(last)
    assert "corrupt" not in str(info.value) and "cannot write" not in str(info.value)


def test_a_run_whose_last_write_failed_offers_best(cli, data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=2"), run_name="b", echo=lambda m: None, progress=False)
    shutil.rmtree(tmp_path / "runs" / "b" / "checkpoints" / "last")
    sets = ["--set", f"data.data_dir={data_dir}", "--set", "train.max_iters=4", "--no-progress"]
    res = cli("train", TINY, "--resume", "runs/b", *sets)
    assert_user_error(res, "no last checkpoint", "best, step 2, is intact", "cp -r", notes_ok=True)
    command = res.stderr.split("resume from best: ")[1].split(" && ")[0].split()
    shutil.copytree(command[2], command[3])  # what the line says to do
    assert cli("train", TINY, "--resume", "runs/b", *sets).exit_code == 0
    assert runs.read_meta(runs.checkpoint_dir(tmp_path / "runs" / "b", runs.LAST))["step"] == 4


def test_a_lock_that_cannot_be_written_names_its_path(tmp_path, monkeypatch):
    import errno

    real = os.write

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(
        MinigptError, match=rf"cannot write {tmp_path / '.lock'}: No space left on device"
    ):
        claims.RunLock(tmp_path).acquire("wait")
    monkeypatch.setattr(os, "write", real)


def test_a_run_name_folder_of_the_users_files_is_not_called_a_stopped_run(tmp_path):
    (tmp_path / "runs" / "mine").mkdir(parents=True)
    (tmp_path / "runs" / "mine" / "thesis.tex").write_text("precious")
    for call in (claims.check_run_name, lambda out, name: claims.new_run_dir(out, "tiny", name)):
        with pytest.raises(MinigptError, match="holds files minigpt did not make") as info:
            call(tmp_path / "runs", "mine")
        assert "stopped before" not in str(info.value) and "delete" not in str(info.value)
    assert (tmp_path / "runs" / "mine" / "thesis.tex").read_text() == "precious"
    (tmp_path / "runs" / "stopped").mkdir()
    (tmp_path / "runs" / "stopped" / ".lock").write_text("1\n")
    (tmp_path / "runs" / "stopped" / "config.yaml").write_text("name: tiny\n")
    with pytest.raises(MinigptError, match="stopped before its first save"):
        claims.check_run_name(tmp_path / "runs", "stopped")


@pytest.mark.parametrize("text", ['{"sweep": {}', "[]", '{"sweep": {}, "base": {}, "done": "all"}'])
def test_a_damaged_sweep_json_is_one_line(cli, data_dir, tmp_path, monkeypatch, text):
    monkeypatch.chdir(tmp_path)
    spec = {
        "name": "s",
        "base": str(TINY),
        "set": [f"data.data_dir={data_dir}"],
        "variants": {"v": {}},
        "budget": {"iters": 2},
    }
    (tmp_path / "s.yaml").write_text(json.dumps(spec))
    (tmp_path / "runs" / "s").mkdir(parents=True)
    (tmp_path / "runs" / "s" / "sweep.json").write_text(text)
    assert_user_error(cli("sweep", "s.yaml"), "sweep.json is damaged", notes_ok=True)


def test_an_unreadable_checkpoint_file_is_called_unreadable_even_as_root(
    data_dir, tmp_path, monkeypatch
):
    """As the test above, with the permission error injected (root reads any file)."""
    import errno

    from minigpt_cli.run import checkpoint

    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=2"), run_name="r", echo=lambda m: None, progress=False)
    last = runs.checkpoint_dir(tmp_path / "runs" / "r", runs.LAST)

    def denied(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(checkpoint, "sha256", denied)
    for load in (checkpoint.load_model, checkpoint.load_trainer_state):
        with pytest.raises(
            MinigptError, match=r"cannot read .*': permission denied; give your user read access"
        ) as info:
            load(last)
        assert "corrupt" not in str(info.value) and "write" not in str(info.value)


def test_a_checkpoint_write_that_fails_in_torch_says_what_the_os_would(tmp_path, monkeypatch):

    from minigpt_cli.config.schema import load_config
    from minigpt_cli.model.gpt import GPT
    from minigpt_cli.run import checkpoint

    cfg = load_config(TINY, ["model.vocab_size=65"])
    monkeypatch.setattr(checkpoint, "_disk_low", lambda directory: True)

    def full(*args, **kwargs):
        raise RuntimeError(
            "[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file"
        )

    monkeypatch.setattr(checkpoint.torch, "save", full)
    with pytest.raises(MinigptError) as info:
        checkpoint.save(tmp_path / "last", GPT(cfg.model), cfg, {"step": 1}, {"step": 1})
    assert str(info.value) == (
        f"cannot write {tmp_path / 'last'}: No space left on device; free some disk space "
        "or choose another train.out_dir"
    )
    assert not any(tmp_path.iterdir())


def test_download_refuses_an_unreadable_corpus_instead_of_replacing_it(cli, tmp_path, monkeypatch):
    from minigpt_cli.data import download

    corpus = tmp_path / "data" / "tinyshakespeare" / "input.txt"
    corpus.parent.mkdir(parents=True)
    corpus.write_text("the user's own text")
    real = os.access
    monkeypatch.setattr(
        download.os, "access", lambda p, mode: False if Path(p) == corpus else real(p, mode)
    )
    with pytest.raises(MinigptError, match=rf"cannot read {corpus}: Permission denied"):
        download.download("tinyshakespeare", tmp_path / "data", url="http://127.0.0.1:9/none")
    assert corpus.read_text() == "the user's own text" and not list(corpus.parent.glob("*.bak*"))


def test_evaluate_refuses_conflicting_or_out_of_range_arguments_in_one_line(
    data_dir, tmp_path, monkeypatch
):
    from minigpt_cli.eval import evaluate as ev

    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=2"), run_name="a", echo=lambda m: None, progress=False)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "some.txt").write_text("some text")
    for kwargs, fragment in [
        ({"split": "val", "text_file": "some.txt"}, "not both"),
        ({"stride": 2}, "add --full"),
        ({"split": "test"}, "use train or val"),
        ({"full": True, "stride": 10_000}, "must be between 1 and the run's block_size"),
        ({"full": True, "stride": 0}, "must be between 1"),
        ({"text_file": "empty.txt"}, "empty.txt holds 0 token"),
    ]:
        with pytest.raises(MinigptError, match=fragment) as info:
            ev.evaluate("runs/a", **kwargs)
        assert "\n" not in str(info.value)
