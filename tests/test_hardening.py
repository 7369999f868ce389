"""Issue 18's kinds, through the real CLI where they are about it: what ``train`` refuses before
step 0, ``--dry-run`` refuses with the same line (paths it cannot write, a sample.prompt the
tokenizer lacks); samples.txt samples as ``generate`` does; notes for settings that cannot take
effect; a Ctrl-C as a run or the process ends is answered in one line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TINY, assert_user_error, working_dir

from minigpt_cli.errors import MinigptError

LONG = "x" * 300  # past every file system's 255-byte names
#: The files train writes in the folder of a run it resumes, in the order run_files names them.
RUN_FILES = [
    ".lock",
    "metrics.jsonl",
    "train.log",
    "samples.txt",
    "config.yaml",
    "env.json",
    "loss.png",
]


def _train(cli, data_dir, *sets, dry=False):
    args = [
        "train",
        TINY,
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        "train.max_iters=2",
        "--set",
        "train.warmup_iters=0",
        "--no-progress",
    ]
    return cli(
        *args, *[a for item in sets for a in ("--set", item)], *(["--dry-run"] if dry else [])
    )


def _last_error(res) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and lines and lines[-1].startswith("error: "), res
    assert (
        sum(line.startswith("error:") for line in lines) == 1 and "Traceback" not in res.stderr
    ), res
    return lines[-1]


# ----------------------------------------------------------------------------- paths train writes


@pytest.mark.parametrize(
    "setting, fragment",
    [
        ("train.out_dir=afile", "cannot write afile: File exists; a file is in the way"),
        ("train.out_dir=afile/runs", "cannot write afile/runs: Not a directory"),
        (f"train.out_dir={LONG}", "File name too long; choose a shorter name"),
        ("data.data_dir=afile", "cannot write afile/tinyshakespeare: Not a directory"),
        ("tokenizer.path=afile/tok.json", "cannot write afile/tok.json: File exists"),
        (
            f"tokenizer.path={LONG[:250]}.json",
            "File name too long",
        ),  # fits, but not with atomic writes' temp name
    ],
)
def test_dry_run_refuses_an_unwritable_path_with_the_line_train_gives(
    cli, data_dir, tmp_path, setting, fragment
):
    (tmp_path / "afile").write_text("in the way\n")
    with working_dir(tmp_path):
        dry = _train(cli, data_dir, setting, dry=True)
        real = _train(cli, data_dir, setting)
    assert_user_error(dry, fragment)
    assert_user_error(real, fragment)  # refused before anything is fetched or written: one line
    assert dry.stderr == real.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders"
)
def test_a_read_only_folder_is_refused_by_both(cli, data_dir, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with working_dir(tmp_path):
            for setting in (
                "train.out_dir=ro/runs",
                "tokenizer.path=ro/tok.json",
                "data.data_dir=ro/data",
            ):
                dry = _train(cli, data_dir, setting, dry=True)
                assert_user_error(dry, "Permission denied", "check the permissions")
                assert _train(cli, data_dir, setting).stderr == dry.stderr, setting
    finally:
        ro.chmod(0o755)


def test_write_problem_names_what_mkdir_and_atomic_writes_would(tmp_path, monkeypatch):
    from minigpt_cli.fileio import write_problem

    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    assert write_problem(tmp_path / "new" / "deeper", folder=True) is None
    assert write_problem(tmp_path / "d" / "t.json", folder=False) is None
    assert write_problem(tmp_path / "f", folder=False) is None  # an existing file is replaced
    assert write_problem(tmp_path / "d", folder=False).errno == 21  # EISDIR
    assert write_problem(tmp_path / "f" / "a" / "b", folder=True).filename == str(
        tmp_path / "f" / "a" / "b"
    )
    # A folder nobody may write into: mkdir fails on the first folder it must make, atomic writes
    # name the file.
    real = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode: False if str(p) == str(tmp_path / "d") else real(p, mode)
    )
    assert write_problem(tmp_path / "d" / "x" / "y", folder=True).filename == str(
        tmp_path / "d" / "x"
    )
    assert write_problem(tmp_path / "d" / "t.json", folder=False).filename == str(
        tmp_path / "d" / "t.json"
    )
    assert write_problem(tmp_path / "d", folder=True).errno in (13, 30)  # EACCES, or EROFS


def test_a_prepared_data_folder_is_not_written_so_not_checked(cli, data_dir, tmp_path, monkeypatch):
    """Train writes nothing in a data folder that holds the corpus, the tokenizer and token files: a
    read-only shared copy must not be refused (os.access stands in for a read-only mount)."""
    with working_dir(tmp_path):
        assert (
            _train(cli, data_dir, "train.max_iters=0").exit_code == 0
        )  # prepares, if no test did yet
        real = os.access
        monkeypatch.setattr(
            os, "access", lambda p, mode: False if str(data_dir) in str(p) else real(p, mode)
        )
        for dry in (True, False):
            res = _train(cli, data_dir, "train.max_iters=0", dry=dry)
            assert res.exit_code == 0, res


def test_dry_run_checks_the_folder_of_the_run_it_resumes(cli, data_dir, tmp_path, monkeypatch):
    """A resumed run writes its lock, logs and checkpoints in its own folder: one that cannot be
    written is refused by --dry-run as by train, before anything is written (os.access stands in for
    a read-only mount: root writes through modes)."""
    from minigpt_cli.trainer.setup import run_files

    with working_dir(tmp_path):
        assert _train(cli, data_dir, "train.max_iters=1", "train.eval_interval=1").exit_code == 0
        run = next((tmp_path / "runs").iterdir())
        assert [p.relative_to(run) for p in run_files(run)[0]] == [Path(name) for name in RUN_FILES]
        before = sorted((p.name, p.stat().st_mtime_ns) for p in run.rglob("*"))
        real = os.access
        # --resume auto continues the newest run of the config's name: the same folder, found under
        # runs/.
        for given, folder in ((run, run), ("auto", run.relative_to(tmp_path))):
            resume = [
                "train",
                TINY,
                "--set",
                f"data.data_dir={data_dir}",
                "--set",
                "train.max_iters=3",
                "--no-progress",
                "--resume",
                given,
            ]
            for blocked in (folder, folder / "checkpoints"):
                monkeypatch.setattr(
                    os, "access", lambda p, mode: False if str(p) == str(blocked) else real(p, mode)
                )
                dry, train = cli(*resume, "--dry-run"), cli(*resume)
                assert_user_error(dry, f"cannot write {blocked}: Permission denied")
                assert train.stderr == dry.stderr
        assert (
            sorted((p.name, p.stat().st_mtime_ns) for p in run.rglob("*")) == before
        )  # nothing written


def test_a_resumed_run_whose_files_cannot_be_written_is_refused_before_anything_is_written(
    cli, data_dir, tmp_path, monkeypatch
):
    """A folder where a resumed run's file goes (or a read-only file it appends to, os.access
    standing in for a read-only mount) is refused by --dry-run and train with one line that says
    what to remove, before train rewrites config.yaml or anything else."""
    with working_dir(tmp_path):
        assert _train(cli, data_dir, "train.max_iters=1", "train.eval_interval=1").exit_code == 0
        run = next((tmp_path / "runs").iterdir())
        (tmp_path / "cfg.yaml").write_text(
            (run / "config.yaml").read_text()
        )  # config.yaml itself is blocked
        resume = [
            "train",
            "cfg.yaml",
            "--resume",
            str(run),
            "--set",
            "train.max_iters=14",
            "--no-progress",
        ]
        for name in RUN_FILES[1:]:
            path = run / name
            kept = path.with_name(name + ".kept")
            path.rename(kept)
            path.mkdir()
            before = sorted((p.name, p.stat().st_mtime_ns) for p in run.rglob("*"))
            dry, train = cli(*resume, "--dry-run"), cli(*resume)
            assert_user_error(
                dry,
                f"cannot write {path}: Is a directory; a folder is in the way of that file; "
                "remove or rename the folder",
            )
            assert train.stderr == dry.stderr, name
            assert sorted((p.name, p.stat().st_mtime_ns) for p in run.rglob("*")) == before, name
            path.rmdir()
            kept.rename(path)
        real = os.access
        metrics = run / "metrics.jsonl"
        monkeypatch.setattr(
            os, "access", lambda p, mode: False if str(p) == str(metrics) else real(p, mode)
        )
        dry, train = cli(*resume, "--dry-run"), cli(*resume)
        assert_user_error(
            dry,
            f"cannot write {metrics}:",
            "check the permissions of the run folder and of its files",
        )
        assert train.stderr == dry.stderr
        assert "max_iters: 14" not in (run / "config.yaml").read_text()


# ----------------------------------------------------------------------------- sample.prompt


def test_a_prompt_the_tokenizer_lacks_is_refused_by_dry_run_and_train_alike(
    cli, data_dir, tmp_path
):
    with working_dir(tmp_path):
        dry = _train(cli, data_dir, "sample.prompt=Café", dry=True)
        real = _train(cli, data_dir, "sample.prompt=Café")
        empty = _train(cli, data_dir, "sample.prompt=", dry=True)
    line = "error: sample.prompt has characters the tokenizer's vocabulary lacks: 'é'; remove or replace them"
    assert_user_error(dry)
    assert dry.stderr.strip() == line == _last_error(real)
    assert not list(
        (tmp_path / "runs").glob("*")
    )  # the run folder made before the check is removed
    assert_user_error(empty, "sample.prompt is empty")


def test_a_prompt_the_new_tokenizer_lacks_is_refused_before_it_or_the_token_files_are_written(
    cli, corpus_file, tmp_path
):
    data = tmp_path / "data"
    (data / "tinyshakespeare").mkdir(parents=True)
    shutil.copy(corpus_file, data / "tinyshakespeare" / "input.txt")
    with working_dir(tmp_path):
        res = _train(cli, data, "sample.prompt=1:30")
    assert res.exit_code == 2 and "Traceback" not in res.stderr, res
    assert _last_error(res) == (
        "error: sample.prompt has characters the tokenizer's vocabulary lacks: '1', '0'; "
        "remove or replace them"
    )
    assert [p.name for p in (data / "tinyshakespeare").iterdir()] == ["input.txt"]


# ----------------------------------------------------------------------------- samples.txt and
# notes


def test_samples_txt_samples_as_generate_does(cli, data_dir, tmp_path):
    """The sample section's prompt and greedy decoding: samples.txt's last sample is generate's
    text."""
    with working_dir(tmp_path):
        res = _train(
            cli,
            data_dir,
            "train.max_iters=15",
            "train.eval_interval=15",
            "train.sample_tokens=25",
            "sample.prompt=ROMEO:",
            "sample.temperature=0",
        )
        assert res.exit_code == 0, res
        run = next((tmp_path / "runs").iterdir())
        gen = cli("generate", "--run", run, "--checkpoint", "last", "--max-new-tokens", "25")
    assert gen.exit_code == 0, gen
    last = (run / "samples.txt").read_text().split("===== step 15 =====\n")[-1]
    assert last[-2:] == "\n\n" and gen.stdout[-1] == "\n"
    assert (
        last[:-2] == gen.stdout[:-1]
        and last.startswith("ROMEO:")
        and len(last[:-2]) == len("ROMEO:") + 25
    )


@pytest.mark.parametrize(
    "sets, noted",
    [
        (
            ["train.early_stop_patience=3"],
            "train.early_stop_patience (3) can never stop this run: it evaluates 3",
        ),
        (
            ["train.early_stop_patience=2"],
            None,
        ),  # evals at 0, 15, 30: two can follow the first without a new best
        (
            ["train.early_stop_patience=1", "train.eval_at_start=false", "train.eval_interval=30"],
            "train.early_stop_patience (1) can never stop this run: it evaluates 1",
        ),
        (
            ["sample.window_stride=4", "sample.max_new_tokens=10", "train.sample_tokens=0"],
            "sample.window_stride has no effect: the context window never slides",
        ),
        (
            ["sample.window_stride=4", "sample.max_new_tokens=10", "train.sample_tokens=40"],
            None,
        ),  # samples.txt slides
    ],
)
def test_settings_that_cannot_take_effect_are_noted(cli, data_dir, tmp_path, sets, noted):
    with working_dir(tmp_path):
        res = cli(
            "train",
            TINY,
            "--set",
            f"data.data_dir={data_dir}",
            *[a for s in sets for a in ("--set", s)],
            "--dry-run",
        )
    assert res.exit_code == 0, res
    found = [
        line
        for line in res.stdout.splitlines()
        if line.startswith("note: ") and ("early_stop" in line or "window_stride" in line)
    ]
    assert found == ([] if noted is None else [found[0]]) and (
        noted is None or noted in found[0]
    ), found


def test_evals_in_run_counts_the_evals_the_schedule_makes():
    from minigpt_cli.config.notes import evals_in_run
    from minigpt_cli.config.schema import TrainConfig
    from minigpt_cli.trainer.schedule import should_eval

    for max_iters in (0, 1, 14, 15, 16, 30, 31):
        for interval in (1, 7, 15):
            for at_start in (True, False):
                tc = TrainConfig(
                    max_iters=max_iters,
                    eval_interval=interval,
                    eval_at_start=at_start,
                    warmup_iters=0,
                )
                assert evals_in_run(tc) == sum(should_eval(s, tc) for s in range(max_iters + 1)), tc


def test_memory_does_not_grow_with_gradient_accumulation(cli, data_dir, tmp_path):
    """Accumulation frees each micro-batch's activations in its backward pass, and the eval reads
    its windows a chunk at a time, so the estimate is per micro-batch and a huge accumulation
    changes nothing."""
    from minigpt_cli.data.pipeline import EVAL_CHUNK, eval_offsets

    first = next(eval_offsets(1000, 32, 10**15, seed=1))
    assert len(first) == EVAL_CHUNK
    with working_dir(tmp_path):
        one, huge = (
            cli(
                "train",
                TINY,
                "--set",
                f"data.data_dir={data_dir}",
                "--set",
                f"train.grad_accum_steps={n}",
                "--dry-run",
            )
            for n in (1, 10**12)
        )
    memory = [
        next(line for line in r.stdout.splitlines() if "memory to train" in line)
        for r in (one, huge)
    ]
    assert memory[0] == memory[1] and "batch 8" in memory[0], memory


# ----------------------------------------------------------------------------- Ctrl-C as things end


def test_a_ctrl_c_after_the_last_eval_is_answered_with_what_was_saved(
    cli, data_dir, tmp_path, monkeypatch
):
    """The signal comes while the final eval's loss plot is drawn: the run is complete, and says so
    in one line (exit 130); before, the stop request was dropped and the command said nothing of
    it."""
    from minigpt_cli.run.metrics import RunLogger

    calls, plot = [], RunLogger.plot

    def plot_then_ctrl_c(self, *args, **kwargs):
        calls.append(1)
        plot(self, *args, **kwargs)
        if len(calls) == 2:  # evals at 0 and 2: the last
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(RunLogger, "plot", plot_then_ctrl_c)
    with working_dir(tmp_path):
        res = _train(cli, data_dir, "train.eval_interval=2", "train.sample_tokens=0")
    assert res.exit_code == 130, res
    lines = [line for line in res.stderr.splitlines() if line.startswith("stopped")]
    assert len(lines) == 1 and "as the run ended at step 2: it is complete" in lines[0], res
    assert "/checkpoints/last" in lines[0] and "--resume" not in res.stderr
    assert (
        json.loads(
            (next((tmp_path / "runs").iterdir()) / "checkpoints" / "last" / "meta.json").read_text()
        )["step"]
        == 2
    )


def test_a_signal_as_the_process_exits_gets_a_line_not_a_silent_130():
    """The interpreter's teardown took ~2 s with torch loaded, and a Ctrl-C there killed the process
    without a word; now the process ends right after the atexit functions, and a signal in them is
    answered."""
    code = (
        "import atexit, os, signal\n"
        "from minigpt_cli.cli.base import run_and_exit\n"
        "atexit.register(lambda: os.kill(os.getpid(), signal.SIGINT))\n"
        "run_and_exit(lambda: print('the output'))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 130 and res.stdout == "the output\n", res
    assert res.stderr.splitlines() == [
        "stopped by SIGINT as minigpt was exiting: the command had finished and its "
        "output is complete"
    ], res
    quiet = subprocess.run(
        [sys.executable, "-c", code.replace("atexit.register", "(lambda f: None)")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "the output\n", "")


def test_an_escape_that_makes_no_text_is_one_line():
    from minigpt_cli.cli.base import unescape

    for bad, fragment in (
        (r"\xe9", "not UTF-8"),
        (r"\ud800", "not a character"),
        (r"\777", "beyond a byte"),
    ):
        with pytest.raises(MinigptError, match=fragment):
            unescape(bad)


def test_a_resume_keeps_a_hand_edited_run_config_and_says_so(cli, data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = _train(cli, data_dir, "train.eval_interval=2", "train.sample_tokens=0")
    assert res.exit_code == 0, res
    run = next((tmp_path / "runs").iterdir())
    config = run / "config.yaml"
    edited = config.read_text().replace("learning_rate: 0.003", "learning_rate: 0.1")
    assert edited != config.read_text()
    config.write_text(edited)
    res = cli(
        "train",
        TINY,
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        "train.max_iters=4",
        "--set",
        "train.warmup_iters=0",
        "--set",
        "train.eval_interval=2",
        "--set",
        "train.sample_tokens=0",
        "--no-progress",
        "--resume",
        str(run),
    )
    assert res.exit_code == 0, res
    assert (
        "config.yaml was edited since the last checkpoint" in res.stderr
        and "config.yaml.edited" in res.stderr
    )
    assert (run / "config.yaml.edited").read_text() == edited  # the edit is kept
    assert "learning_rate: 0.003" in config.read_text()  # config.yaml is what the session ran with


def test_a_ctrl_c_inside_any_command_says_so(cli, monkeypatch):
    """Typer turned a Ctrl-C inside a command into exit status 130 without a word (generate, export,
    ...); now every command that does not answer it itself says it stopped, in one line."""
    import minigpt_cli.accounting.count as count

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(count, "count_params", interrupted)
    res = cli("count-params", "--preset", "gpt2-small")
    assert res.exit_code == 130, res
    assert res.stderr.splitlines() == ["stopped by Ctrl-C (no file left half-written)"], res
