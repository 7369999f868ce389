"""The run folder: its names, the newest-run and resume lookups, meta.json, env.json, and old
runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
import torch
from helpers import TINY, assert_user_error, tiny

from minigpt_cli.config.schema import load_config
from minigpt_cli.errors import MinigptError
from minigpt_cli.model.gpt import GPT
from minigpt_cli.run import claim as claims
from minigpt_cli.run import env as run_env
from minigpt_cli.run import folder as runs
from minigpt_cli.trainer import train

OLD_LAYOUT = Path(__file__).resolve().parent / "fixtures" / "old-layout"


def fake_run(
    root: Path,
    name: str,
    which: str = "last",
    *,
    old: bool = False,
    meta: dict | None = None,
    mtime: float = 1_000_000.0,
) -> Path:
    """A run folder holding one checkpoint's files (empty weights: the lookups read names and times
    only)."""
    run = root / name
    ckpt = runs.checkpoint_dir(run, which)
    folder = runs.old_copy(ckpt) if old else ckpt
    folder.mkdir(parents=True)
    (folder / runs.WEIGHTS).write_bytes(b"")
    (folder / runs.META).write_text(
        json.dumps(meta if meta is not None else {"name": "tiny", "step": 1})
    )
    os.utime(folder / runs.WEIGHTS, (mtime, mtime))
    return run


def test_the_layout_names_checkpoints_and_kept_steps(tmp_path):
    assert runs.checkpoint_dir(tmp_path, runs.LAST) == tmp_path / "checkpoints" / "last"
    assert runs.kept_name(500) == "step-0000500"
    assert (
        runs.old_copy(tmp_path / "checkpoints" / "best") == tmp_path / "checkpoints" / ".best.old"
    )


def test_resolve_falls_back_to_the_copy_a_cut_swap_left(tmp_path):
    run = fake_run(tmp_path, "a", old=True)
    last = runs.checkpoint_dir(run, runs.LAST)
    assert runs.resolve(last) == runs.old_copy(last)
    assert runs.has_weights(last) and runs.has_checkpoint(run)
    (runs.old_copy(last) / runs.WEIGHTS).unlink()
    with pytest.raises(MinigptError, match="no checkpoint at"):
        runs.resolve(last)
    assert not runs.has_checkpoint(run)


def test_generate_and_resume_agree_on_the_newest_run(tmp_path):
    """One finder: a run that holds only the .old copy counts for both (they used to disagree)."""
    fake_run(tmp_path, "older", mtime=1_000_000)
    fake_run(tmp_path, "newer-only-old", old=True, mtime=2_000_000)
    fake_run(tmp_path, "other-name", meta={"name": "other"}, mtime=3_000_000)
    (tmp_path / "no-checkpoint").mkdir()
    assert runs.latest_run(tmp_path).name == "other-name"
    assert runs.find_resume_dir(tmp_path, "tiny", "auto").name == "newer-only-old"
    assert runs.newest_run(tmp_path, "tiny") == runs.find_resume_dir(tmp_path, "tiny", "auto")
    assert runs.find_resume_dir(tmp_path, "nobody", "auto") is None


def test_a_run_whose_meta_is_damaged_is_not_taken_for_one_of_that_name(tmp_path):
    run = fake_run(tmp_path, "damaged")
    (runs.checkpoint_dir(run, runs.LAST) / runs.META).write_text("[1, 2")
    assert runs.newest_run(tmp_path, "tiny") is None
    assert runs.newest_run(tmp_path) == run  # without a name, the weights alone count
    with pytest.raises(MinigptError, match="meta.json is missing or damaged"):
        runs.read_meta(runs.checkpoint_dir(run, runs.LAST))
    (runs.checkpoint_dir(run, runs.LAST) / runs.META).write_text("[1, 2]")
    with pytest.raises(MinigptError, match="meta.json is missing or damaged .*object") as err:
        runs.read_meta(runs.checkpoint_dir(run, runs.LAST))
    # this run has no best: the fix may not send the user to it (QA: "--checkpoint best" in a
    # circle)
    assert "--checkpoint best" not in str(err.value) and "no other checkpoint" in str(err.value)


def test_no_run_is_one_clear_error(tmp_path):
    with pytest.raises(MinigptError, match="no trained run found under"):
        runs.latest_run(tmp_path / "runs")
    with pytest.raises(MinigptError, match="no such run folder"):
        runs.find_resume_dir(tmp_path, "tiny", str(tmp_path / "missing"))
    (tmp_path / "input.txt").write_text("text")
    with pytest.raises(
        MinigptError, match=r"input.txt is a file, not a run folder; pass the run's folder"
    ):
        runs.find_resume_dir(tmp_path, "tiny", str(tmp_path / "input.txt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(MinigptError, match="no checkpoint at"):
        runs.find_resume_dir(tmp_path, "tiny", str(tmp_path / "empty"))


def test_env_json_keeps_the_earlier_sessions_oldest_first(tmp_path):
    run_env.write_env(tmp_path, {"session": 1})
    first = run_env.earlier_sessions(tmp_path)
    assert first == [{"session": 1}]
    run_env.write_env(tmp_path, {"session": 2, "earlier_sessions": first})
    assert run_env.earlier_sessions(tmp_path) == [{"session": 1}, {"session": 2}]
    (tmp_path / runs.ENV).write_text("not json")
    assert run_env.earlier_sessions(tmp_path) == []


def test_evaluate_and_compare_find_a_runs_relative_corpus_from_any_folder(
    cli, data_dir, tmp_path, monkeypatch
):
    """Relative data.data_dir and data.path are relative to where train ran (env.json's cwd; for an
    older run, the folder its relative train.out_dir hangs from), not to where evaluate or compare
    run; a corpus that is gone is one line naming where it was."""
    from minigpt_cli.experiments.compare import summarize

    project = tmp_path / "project"
    (project / "books").mkdir(parents=True)
    (project / "data").symlink_to(
        data_dir
    )  # the shared corpus and its prepared files, under a relative name
    (project / "books" / "a.txt").write_text(
        (data_dir / "tinyshakespeare" / "input.txt").read_text()[:100_000]
    )
    monkeypatch.chdir(project)
    for name, extra in (("named", []), ("own", ["data.path=books"])):
        train(
            tiny("data", "train.max_iters=2", "train.eval_at_start=false", *extra),
            name,
            echo=lambda m: None,
            progress=False,
        )
    named, own = project / "runs" / "named", project / "runs" / "own"
    assert json.loads((named / runs.ENV).read_text())["cwd"] == str(project)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    for run in (named, own):
        res = cli("evaluate", "--run", run, "--json")
        assert res.exit_code == 0, res
        got = json.loads(res.stdout)
        assert abs(got["loss"] - got["logged_loss"]) < 1e-6, got
    result = summarize([named, own])
    assert all(row["bits_per_byte"] for row in result["rows"]) and not any(
        "no bits" in n for n in result["notes"]
    )
    env = json.loads((named / runs.ENV).read_text())
    del env["cwd"]  # a run trained before env.json said where
    (named / runs.ENV).write_text(json.dumps(env))
    assert cli("evaluate", "--run", named).exit_code == 0
    (project / "books").rename(project / "moved")
    assert_user_error(
        cli("evaluate", "--run", own),
        f"nothing at {project / 'books'}",
        "put the corpus back there",
    )
    assert any(f"nothing at {project / 'books'}" in n for n in summarize([named, own])["notes"])


def test_a_project_moved_whole_still_evaluates_its_runs(cli, data_dir, tmp_path, monkeypatch):
    """The corpus fingerprint named each file by its absolute path, so moving a project (its runs
    and data together) made evaluate refuse the corpus as edited, and from outside the project it
    looked for the corpus where the project had been; now names are relative to the corpus's folder,
    and the run folder's own place says where the project went."""
    text = (data_dir / "tinyshakespeare" / "input.txt").read_text()
    project = tmp_path / "a"
    (project / "books").mkdir(parents=True)
    (project / "books" / "a.txt").write_text(text[:100_000])
    (project / "data" / "tinyshakespeare").mkdir(parents=True)
    (project / "data" / "tinyshakespeare" / "input.txt").write_text(
        text
    )  # a copy, not a link: it moves too
    monkeypatch.chdir(project)
    for name, extra in (("named", []), ("own", ["data.path=books"])):
        train(
            tiny("data", "train.max_iters=2", "train.eval_at_start=false", *extra),
            name,
            echo=lambda m: None,
            progress=False,
        )
    monkeypatch.chdir(tmp_path)
    moved = project.rename(tmp_path / "b")
    for where in (moved, tmp_path):  # inside the moved project, and outside it
        monkeypatch.chdir(where)
        for name in ("named", "own"):
            res = cli("evaluate", "--run", moved / "runs" / name, "--json")
            assert res.exit_code == 0, res
            got = json.loads(res.stdout)
            assert abs(got["loss"] - got["logged_loss"]) < 1e-6, got
    assert not (tmp_path / "data").exists()  # nothing downloaded beside the project
    # A file renamed or edited since is named where it is (or was) in the moved project, for
    # evaluate too.
    books = moved / "books"
    (books / "a.txt").rename(books / "a2.txt")
    res = cli("evaluate", "--run", moved / "runs" / "own")
    assert_user_error(res, f"corpus file {books / 'a.txt'} was removed since run", "--text-file")
    (books / "a2.txt").rename(books / "a.txt")
    with open(books / "a.txt", "a") as f:
        f.write("more")
    assert_user_error(
        cli("evaluate", "--run", moved / "runs" / "own"),
        f"corpus file {books / 'a.txt'} was changed",
        "now ",
    )
    assert any(
        f"{books / 'a.txt'} was changed" in n for n in summarize_notes(moved / "runs" / "own")
    )


def summarize_notes(run: Path) -> list[str]:
    from minigpt_cli.experiments.compare import summarize

    return summarize([run])["notes"]


def test_a_fingerprint_from_before_names_relative_to_the_corpus_is_still_accepted(tmp_path):
    """Runs and configs of before carry the fingerprint of each file's absolute path (the formula
    below is the one minigpt used); it still names the corpus where it has not moved."""
    import hashlib

    from minigpt_cli.data.corpus import open_corpus

    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x.txt").write_text("hello")
    corpus = open_corpus(tmp_path / "c")
    f = corpus.files[0]
    old = hashlib.sha256(
        json.dumps(
            {"files": [{"path": str(f.path), "size": f.size, "sha256": f.sha256}]}, sort_keys=True
        ).encode("utf-8")
    ).hexdigest()
    assert corpus.legacy_fingerprint == old != corpus.fingerprint
    assert (
        corpus.matches(old) and corpus.matches(corpus.fingerprint) and not corpus.matches("0" * 64)
    )
    (tmp_path / "c").rename(tmp_path / "d")
    assert open_corpus(tmp_path / "d").fingerprint == corpus.fingerprint  # moved: the same corpus


def test_unnamed_runs_started_in_the_same_second_get_their_own_folders(tmp_path, monkeypatch):
    monkeypatch.setattr(runs.time, "strftime", lambda fmt, *a: "20250101-120000")
    first = claims.new_run_dir(tmp_path, "tiny", None)
    second = claims.new_run_dir(tmp_path, "tiny", None)
    try:
        assert (
            first.path.name == "tiny-20250101-120000"
            and second.path.name == "tiny-20250101-120000-2"
        )
        assert first.created and second.created
    finally:
        first.lock.release()
        second.lock.release()


# ----------------------------------------------------------------------------- a run written before
# the split


def old_run(tmp_path: Path, data_dir: Path) -> Path:
    """The fixture run (trained by the code before the trainer was split into components) in
    ``tmp_path``.

    Its config says ``data_dir: data``; the corpus is linked there.
    """
    shutil.copytree(OLD_LAYOUT, tmp_path / "runs" / "old-layout")
    (tmp_path / "data").symlink_to(data_dir, target_is_directory=True)
    return tmp_path / "runs" / "old-layout"


def test_the_fixture_is_small_and_in_the_old_layout():
    files = {str(p.relative_to(OLD_LAYOUT)) for p in OLD_LAYOUT.rglob("*") if p.is_file()}
    assert {
        "checkpoints/last/model.safetensors",
        "checkpoints/last/trainer_state.pt",
        "checkpoints/last/meta.json",
        "checkpoints/last/config.yaml",
        "config.yaml",
        "tokenizer.json",
    } <= files
    assert sum(p.stat().st_size for p in OLD_LAYOUT.rglob("*") if p.is_file()) < 100 * 1024


def test_a_checkpoint_of_the_old_layout_generates(tmp_path, data_dir, monkeypatch):
    from minigpt_cli.sample.generate import generate

    monkeypatch.chdir(tmp_path)
    run = old_run(tmp_path, data_dir)
    out = StringIO()
    texts = generate(run, {"prompt": "ROMEO:", "max_new_tokens": 20}, device="cpu", out=out)
    assert len(texts) == 1 and texts[0].startswith("ROMEO:") and len(texts[0]) == len("ROMEO:") + 20
    assert out.getvalue() == texts[0] + "\n"


@pytest.mark.genuine_corpus  # the old run's char tokenizer holds the genuine corpus's 65 characters
def test_a_checkpoint_of_the_old_layout_resumes(tmp_path, data_dir, monkeypatch):

    monkeypatch.chdir(tmp_path)
    run = old_run(tmp_path, data_dir)
    overrides = [
        "model.n_layer=1",
        "model.n_embd=16",
        "model.n_head=2",
        "model.block_size=16",
        "train.eval_interval=2",
        "train.eval_iters=2",
        "train.sample_tokens=10",
        "train.max_iters=6",
    ]
    notes: list[str] = []
    res = train(load_config(TINY, overrides), resume=str(run), echo=notes.append, progress=False)
    assert res.step == 6 and not res.already_done
    assert any("resuming" in n and "from step 4" in n for n in notes), notes
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 6 and 4 in steps  # the old run's records kept, the new ones after them
    env = json.loads((run / runs.ENV).read_text())
    assert len(env["earlier_sessions"]) == 1  # the old session, kept


def test_a_run_folder_in_use_is_refused(cli, data_dir, tmp_path, monkeypatch):
    """Another process holds runs/m's lock: --resume and --run-name m both fail with its pid;
    nothing changes."""
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=3"), run_name="m", echo=lambda m: None, progress=False)
    (tmp_path / "runs" / "e").mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from minigpt_cli.run.claim import RunLock; "
            "[RunLock(Path(p)).acquire('-') for p in sys.argv[1:]]; print('locked', flush=True); "
            "time.sleep(3600)",
            "runs/m",
            "runs/e",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = (tmp_path / "runs" / "m" / "metrics.jsonl").read_bytes()
        common = [
            "--no-progress",
            "--set",
            f"data.data_dir={data_dir}",
            "--set",
            "train.max_iters=6",
        ]
        res = cli("train", TINY, "--resume", "runs/m", *common)
        assert_user_error(
            res, f"runs/m is in use by another minigpt train (pid {holder.pid})", "wait for it"
        )
        res = cli("train", TINY, "--run-name", "e", *common)
        assert_user_error(
            res, f"runs/e is in use by another minigpt train (pid {holder.pid})", "--run-name"
        )
        assert (tmp_path / "runs" / "m" / "metrics.jsonl").read_bytes() == before
        assert [p.name for p in (tmp_path / "runs" / "e").iterdir()] == [".lock"]
    finally:
        holder.kill()
        holder.wait()
    res = cli("train", TINY, "--resume", "runs/m", *common)  # the lock died with its holder
    assert res.exit_code == 0, res


def test_a_new_run_that_fails_before_its_first_checkpoint_leaves_no_folder(
    cli, data_dir, tmp_path, monkeypatch
):
    """The error comes after the run folder exists; the same --run-name works right after."""
    monkeypatch.chdir(tmp_path)
    args = ["train", TINY, "--run-name", "x", "--no-progress", "--set", f"data.data_dir={data_dir}"]
    assert_user_error(cli(*args, "--set", "model.block_size=200000"), "block_size", notes_ok=True)
    assert not (tmp_path / "runs" / "x").exists()
    ok = cli(*args, "--set", "train.max_iters=2")
    assert ok.exit_code == 0, ok


def test_a_crash_before_the_first_checkpoint_undoes_only_what_the_run_made(
    data_dir, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)

    real = GPT.forward

    def broken(
        self, *a, **k
    ):  # at the first eval (no grad), past the estimate's timed steps (grad)
        if torch.is_grad_enabled():
            return real(self, *a, **k)
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(GPT, "forward", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        train(tiny(data_dir), run_name="oom", echo=lambda m: None, progress=False)
    assert not (tmp_path / "runs" / "oom").exists()
    # A folder the user made (empty) is emptied again, not removed.
    (tmp_path / "runs" / "mine").mkdir()
    with pytest.raises(RuntimeError, match="out of memory"):
        train(tiny(data_dir), run_name="mine", echo=lambda m: None, progress=False)
    assert (tmp_path / "runs" / "mine").is_dir() and not any((tmp_path / "runs" / "mine").iterdir())
    # A run with a checkpoint is kept whatever fails later.
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=3"), run_name="kept", echo=lambda m: None, progress=False)
    monkeypatch.setattr(GPT, "forward", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        train(
            tiny(data_dir, "train.max_iters=6"),
            resume="runs/kept",
            echo=lambda m: None,
            progress=False,
        )
    assert (tmp_path / "runs" / "kept" / "checkpoints" / "last" / "model.safetensors").is_file()


def test_dry_run_refuses_a_run_name_train_would_refuse(cli, data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    (tmp_path / "runs" / "taken" / "notes.txt").write_text("mine")
    (tmp_path / "runs" / "empty").mkdir()
    common = ["--set", f"data.data_dir={data_dir}", "--dry-run"]
    assert_user_error(
        cli("train", TINY, "--run-name", "taken", *common), "holds files minigpt did not make"
    )
    assert_user_error(
        cli("train", TINY, "--run-name", "a b", *common), "--run-name 'a b'", "letters, digits"
    )
    assert cli("train", TINY, "--run-name", "empty", *common).exit_code == 0
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        "empty",
        "taken",
    ]  # dry-run made nothing


def test_a_kept_checkpoint_is_named_step_n_by_every_command(cli, data_dir, tmp_path, monkeypatch):
    """train.keep_every writes checkpoints/step-0000002/: generate, evaluate and export take it as
    step-2 (or step-0000002); a step that was not kept is one line naming the folder."""
    monkeypatch.chdir(tmp_path)
    train(
        tiny(data_dir, "train.max_iters=4", "train.eval_interval=2", "train.keep_every=2"),
        run_name="k",
        echo=lambda m: None,
        progress=False,
    )
    run = tmp_path / "runs" / "k"
    assert (run / "checkpoints" / "step-0000002").is_dir()
    gen = cli(
        "generate", "--run", run, "--checkpoint", "step-2", "--max-new-tokens", "3", "--seed", "1"
    )
    assert gen.exit_code == 0, gen
    ev = cli("evaluate", "--run", run, "--checkpoint", "step-0000002", "--json")
    assert ev.exit_code == 0 and json.loads(ev.stdout)["step"] == 2, ev
    assert cli("export", run, "--checkpoint", "step-2", "--output", tmp_path / "x").exit_code == 0
    assert_user_error(
        cli("evaluate", "--run", run, "--checkpoint", "step-3"),
        "kept no checkpoint at step 3; the kept steps are step-0000002, step-0000004",
    )


def test_evaluates_bits_per_byte_label_says_what_was_scored(cli, data_dir, tmp_path, monkeypatch):
    """The training eval's windows score a few thousand tokens: their bits per byte is converted at
    the split's tokens per byte, and the label says so instead of naming the split's byte count as
    if it had been scored."""
    monkeypatch.chdir(tmp_path)
    train(
        tiny(data_dir, "train.max_iters=2", "train.eval_interval=2"),
        run_name="e",
        echo=lambda m: None,
        progress=False,
    )
    res = cli("evaluate", "--run", tmp_path / "runs" / "e")
    assert res.exit_code == 0, res
    scored = int(re.search(r"over ([\d,]+) tokens", res.stdout)[1].replace(",", ""))
    line = next(x for x in res.stdout.splitlines() if x.strip().startswith("bits per byte"))
    assert (
        f"(the {scored:,} scored tokens, at the split's" in line and "tokens per byte)" in line
    ), line
    full = cli("evaluate", "--run", tmp_path / "runs" / "e", "--full")
    assert re.search(r"bits per byte +[\d.]+ \([\d,]+ bytes\)", full.stdout), (
        full
    )  # full: the bytes it scored


def test_a_minigpt_run_given_as_a_hugging_face_folder_is_named_as_one(tmp_path):
    from minigpt_cli.hf.load import read_hf_config

    run = fake_run(tmp_path, "mine")
    with pytest.raises(
        MinigptError,
        match=rf"{run} is a minigpt run, not a Hugging Face folder; continue it with "
        rf"--resume {run}, or export it first",
    ):
        read_hf_config(run)
    with pytest.raises(
        MinigptError, match=rf"^{run} is a minigpt run"
    ):  # its checkpoint folder names the run
        read_hf_config(runs.checkpoint_dir(run, runs.LAST))
    with pytest.raises(
        MinigptError, match="config.json not found"
    ):  # a plain folder: what it must hold
        read_hf_config(tmp_path)
