"""What a missing, damaged or misnamed tokenizer file is told to do: a run's own (where a copy is),
a pretrained folder's (the user's file), one ``inspect tokenize`` is given, one a resume names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from helpers import assert_user_error, tiny, wordlevel_tokenizer  # noqa: E402

from minigpt_cli.config.schema import load_config  # noqa: E402
from minigpt_cli.run import folder as runs  # noqa: E402
from minigpt_cli.trainer import train  # noqa: E402

FINETUNE = Path(__file__).resolve().parent.parent / "configs" / "finetune-gpt2.yaml"


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory, corpus_file):
    """A tiny GPT-2 folder whose tokenizer.json is a WordLevel vocabulary of the corpus's
    characters."""
    from transformers import GPT2Config, GPT2LMHeadModel

    chars = sorted(set(corpus_file.read_text()))
    folder = tmp_path_factory.mktemp("hf") / "hf"
    torch.manual_seed(0)
    GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=48, vocab_size=len(chars))
    ).save_pretrained(folder)
    wordlevel_tokenizer(chars).save(str(folder / "tokenizer.json"))
    return folder


def _finetune(cli, folder, data_dir, tmp_path, *extra):
    """``train`` fine-tuning ``folder``: each of ``extra`` a --set value, or from the first flag on,
    arguments."""
    flag = next((i for i, e in enumerate(extra) if str(e).startswith("--")), len(extra))
    sets = [
        f"data.data_dir={data_dir}",
        f"train.out_dir={tmp_path}/runs",
        "model.block_size=32",
        "device=cpu",
        "train.batch_size=2",
        "train.eval_iters=1",
        "train.sample_tokens=0",
        *extra[:flag],
    ]
    return cli(
        "train",
        FINETUNE,
        "--init-from",
        folder,
        *[w for s in sets for w in ("--set", s)],
        *extra[flag:],
        "--no-progress",
    )


def test_a_damaged_pretrained_tokenizer_is_the_users_file(cli, hf_folder, data_dir, tmp_path):
    folder = tmp_path / "hf"
    shutil.copytree(hf_folder, folder)
    text = (folder / "tokenizer.json").read_text()
    for damaged in (text[: len(text) // 2], json.dumps({"model": {"type": "BPE", "vocab": 3}})):
        (folder / "tokenizer.json").write_text(damaged)
        res = _finetune(cli, folder, data_dir, tmp_path, "--dry-run")
        assert_user_error(res, str(folder / "tokenizer.json"), "save_pretrained(folder)")
        assert "train it again" not in res.stderr


def test_a_fine_tuning_run_without_its_tokenizer_names_a_copy_only_where_one_is(
    cli, hf_folder, data_dir, tmp_path
):
    folder = tmp_path / "hf"
    shutil.copytree(hf_folder, folder)
    assert (
        _finetune(
            cli, folder, data_dir, tmp_path, "train.max_iters=0", "--run-name", "ft"
        ).exit_code
        == 0
    )
    run = tmp_path / "runs" / "ft"
    assert (
        _finetune(cli, folder, data_dir, tmp_path, "train.max_iters=0", "--resume", run).exit_code
        == 0
    )
    (run / runs.TOKENIZER).unlink()
    own = repr(str(run / runs.TOKENIZER))
    res = _finetune(cli, folder, data_dir, tmp_path, "--resume", run, "--dry-run")
    assert_user_error(res, f"copy it back from {str(folder / 'tokenizer.json')!r} to {own}")
    folder.rename(tmp_path / "elsewhere")
    for res in (
        _finetune(cli, folder, data_dir, tmp_path, "--resume", run, "--dry-run"),
        cli("generate", "--run", run, "--prompt", "x"),
        cli("inspect", "tokenize", "--run", run),
    ):
        assert_user_error(res, "no copy of it is known", f"restore {own}")
        assert "copy it back" not in res.stderr


def test_a_relative_tokenizer_path_is_named_from_where_train_ran(
    cli, data_dir, tmp_path, monkeypatch
):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    train(
        tiny(data_dir, "train.max_iters=1", "tokenizer.path=tok.json", "train.out_dir=runs"),
        run_name="t",
        echo=lambda m: None,
        progress=False,
    )
    run = tmp_path / "a" / "runs" / "t"
    (run / runs.TOKENIZER).write_text("{}")
    monkeypatch.chdir(tmp_path / "b")
    for res in (
        cli("generate", "--run", "../a/runs/t", "--prompt", "x"),
        cli("inspect", "tokenize", "--run", "../a/runs/t"),
    ):
        assert_user_error(res, f"copy it back from {str(tmp_path / 'a' / 'tok.json')!r}")
    (tmp_path / "a" / "tok.json").unlink()
    assert_user_error(
        cli("generate", "--run", "../a/runs/t", "--prompt", "x"), "no copy of it is known"
    )
    assert load_config(run / runs.CONFIG).tokenizer.path == "tok.json"


def test_a_data_path_runs_tokenizer_is_found_in_its_corpus_folder_after_a_move(
    cli, data_dir, tmp_path, monkeypatch
):
    """A data.path corpus keeps its tokenizer in <data_dir>/<name>-<fingerprint>/, not in the named
    dataset's folder, where the hint looked ("no copy is known" while one was there); and a project
    moved whole is looked for where it is now."""
    project = tmp_path / "p"
    (project / "books").mkdir(parents=True)
    (project / "books" / "a.txt").write_text(
        (data_dir / "tinyshakespeare" / "input.txt").read_text()[:50_000]
    )
    monkeypatch.chdir(project)
    train(
        tiny("data", "train.max_iters=1", "data.path=books"),
        run_name="t",
        echo=lambda m: None,
        progress=False,
    )
    monkeypatch.chdir(tmp_path)
    moved = project.rename(tmp_path / "q")
    run = moved / "runs" / "t"
    kept = (run / runs.TOKENIZER).read_bytes()
    (run / runs.TOKENIZER).unlink()
    copy = next((moved / "data").glob("books-*/tokenizer-char.json"))
    res = cli("evaluate", "--run", run)
    assert_user_error(res, f"copy it back from {str(copy)!r}")
    shutil.copy(copy, run / runs.TOKENIZER)  # the hint, followed
    assert (run / runs.TOKENIZER).read_bytes() == kept
    assert cli("evaluate", "--run", run).exit_code == 0


def test_resuming_a_fine_tuning_run_refuses_another_tokenizer_path(
    cli, hf_folder, data_dir, tmp_path, corpus_file
):
    assert (
        _finetune(
            cli, hf_folder, data_dir, tmp_path, "train.max_iters=0", "--run-name", "ft"
        ).exit_code
        == 0
    )
    run = tmp_path / "runs" / "ft"
    other = tmp_path / "other.json"
    wordlevel_tokenizer(sorted(set(corpus_file.read_text()), reverse=True)).save(str(other))
    for dry in (["--dry-run"], []):
        res = _finetune(
            cli,
            hf_folder,
            data_dir,
            tmp_path,
            "train.max_iters=1",
            f"tokenizer.path={other}",
            "--resume",
            run,
            *dry,
        )
        assert_user_error(res, "differs from", "tokenizer.path")
    res = _finetune(
        cli,
        hf_folder,
        data_dir,
        tmp_path,
        "train.max_iters=1",
        f"tokenizer.path={run / runs.TOKENIZER}",
        "--resume",
        run,
        "--dry-run",
    )
    assert res.exit_code == 0, res


def test_inspect_tokenize_reads_a_folders_tokenizer_json_and_names_other_paths(
    cli, hf_folder, tmp_path
):
    res = cli(
        "inspect",
        "tokenize",
        "--tokenizer",
        hf_folder,
        "--text",
        "ROMEO",
        "--json",
        "--output",
        tmp_path,
    )
    assert res.exit_code == 0 and json.loads(res.stdout)["pieces"] == list("ROMEO"), res
    assert json.loads(res.stdout)["source"] == str(hf_folder / "tokenizer.json")
    assert_user_error(
        cli("inspect", "tokenize", "--tokenizer", tmp_path),
        "is a folder",
        "holds no tokenizer.json",
        "pass a tokenizer file",
    )
    assert_user_error(
        cli("inspect", "tokenize", "--tokenizer", "/dev/null"), "'/dev/null' is not a regular file"
    )
