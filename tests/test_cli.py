"""End to end through the real CLI: download -> train -> generate, and the bad inputs a user
tries."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import assert_user_error, record_checksums, working_dir
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "configs" / "tiny.yaml"
RUN_FILES = [
    "config.yaml",
    "tokenizer.json",
    "metrics.jsonl",
    "train.log",
    "loss.png",
    "samples.txt",
    "env.json",
]
CKPT_FILES = ["model.safetensors", "trainer_state.pt", "config.yaml"]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, corpus_server):
    """download + train tiny through the CLI, once for this module, in a fresh folder."""
    from typer.testing import CliRunner

    from minigpt_cli.cli import app

    work = tmp_path_factory.mktemp("e2e")
    with working_dir(work), pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINIGPT_TINYSHAKESPEARE_URL", corpus_server.url("/input.txt?t=e2e"))
        runner = CliRunner()
        dl = runner.invoke(app, ["download"])
        tr = runner.invoke(app, ["train", str(TINY), "--run-name", "e2e", "--no-progress"])
    return work, dl, tr, corpus_server.hit_count("/input.txt?t=e2e")


def test_download_fetches_and_verifies(trained_run, corpus_in_use):
    work, dl, _, hits = trained_run
    assert dl.exit_code == 0, dl.stderr
    fetched = work / "data" / "tinyshakespeare" / "input.txt"
    assert hashlib.sha256(fetched.read_bytes()).hexdigest() == corpus_in_use.sha256
    assert "downloaded" in dl.stdout and f"{corpus_in_use.size:,}" in dl.stdout
    assert hits == 1  # train found the good copy and did not fetch again


def test_train_leaves_the_run_folder_of_the_design(trained_run, corpus_in_use):
    work, _, tr, _ = trained_run
    assert tr.exit_code == 0, tr.stderr
    run = work / "runs" / "e2e"
    for name in RUN_FILES:
        assert (run / name).is_file(), name
    for which in ("last", "best"):
        for name in CKPT_FILES:
            assert (run / "checkpoints" / which / name).is_file(), (which, name)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    vocab = len(corpus_in_use.chars)  # the genuine corpus: 65
    assert cfg["model"]["vocab_size"] == vocab  # resolved from the tokenizer before step 0
    weights = load_file(run / "checkpoints" / "last" / "model.safetensors")
    assert weights["wte.weight"].shape == (vocab, 32)
    lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["event"] == "eval" and lines[-1]["step"] == 30
    env = json.loads((run / "env.json").read_text())
    assert env["device"] == "cpu" and env["torch"]
    assert env["linear_kernel"] == "torch.mm"  # tiny's products are all below the oneDNN threshold
    assert env["dropout_kernel"] == "none"  # tiny has dropout 0
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "step 30" in (run / "samples.txt").read_text()
    assert "final val loss" in tr.stdout


def test_generate_from_the_latest_run(trained_run, cli, monkeypatch):
    work, *_ = trained_run
    monkeypatch.chdir(work)
    res = cli("generate", "--prompt", "ROMEO:", "--max-new-tokens", "50", "--seed", "1")
    assert res.exit_code == 0, res
    assert res.stdout.startswith("ROMEO:")
    assert len(res.stdout) == len("ROMEO:") + 50 + 1  # 50 characters and a newline
    again = cli(
        "generate",
        "--run",
        "runs/e2e",
        "--prompt",
        "ROMEO:",
        "--max-new-tokens",
        "50",
        "--seed",
        "1",
    )
    assert again.stdout == res.stdout  # same seed, same text
    other = cli("generate", "--prompt", "ROMEO:", "--max-new-tokens", "50", "--seed", "2")
    assert other.stdout != res.stdout


def test_generate_greedy_with_and_without_cache(trained_run, cli, monkeypatch):
    work, *_ = trained_run
    monkeypatch.chdir(work)
    a = cli("generate", "--prompt", "KING", "--temperature", "0", "--max-new-tokens", "80")
    b = cli(
        "generate",
        "--prompt",
        "KING",
        "--temperature",
        "0",
        "--max-new-tokens",
        "80",
        "--no-kv-cache",
    )
    assert a.exit_code == b.exit_code == 0
    assert a.stdout == b.stdout


def test_long_prompt_is_cropped_with_a_note(trained_run, cli, monkeypatch):
    work, *_ = trained_run
    monkeypatch.chdir(work)
    res = cli("generate", "--prompt", "To be or not to be " * 10, "--max-new-tokens", "5")
    assert res.exit_code == 0, res
    assert "block_size" in res.stderr and "only the last 32" in res.stderr


def test_top_k_above_vocab_is_clamped_with_a_warning(trained_run, cli, monkeypatch, corpus_in_use):
    work, *_ = trained_run
    monkeypatch.chdir(work)
    res = cli("generate", "--top-k", "1000", "--max-new-tokens", "5")
    assert res.exit_code == 0 and f"using {len(corpus_in_use.chars)}" in res.stderr


def test_prompt_with_unknown_characters(trained_run, cli, monkeypatch):
    work, *_ = trained_run
    monkeypatch.chdir(work)
    res = cli("generate", "--prompt", "Zoë says ☃ and ☃ again")
    assert_user_error(res, "'ë'", "'☃'")
    assert res.stderr.count("☃") == 1
    assert res.stdout == ""  # nothing generated


def test_top_k_zero_and_bad_top_p(trained_run, cli, monkeypatch):
    work, *_ = trained_run
    monkeypatch.chdir(work)
    assert_user_error(cli("generate", "--top-k", "0"), "--top-k")
    assert_user_error(cli("generate", "--top-p", "1.5"), "--top-p")


@pytest.mark.parametrize(
    "args",
    [
        ["count-params", "--preset", ""],  # was a traceback
        ["compare", "--storage", ""],  # was a traceback
        ["speedrun", "--recipe", "", "--seeds", "2"],  # trained the track's own recipe
        ["download", "--url", ""],  # fetched the default URL
        ["evaluate", "--split", ""],  # scored the val split
        ["train-tokenizer", "--kind", ""],  # trained the config's kind
        ["download", "--data-dir", ""],  # downloaded into the current folder
        ["download", "--data-dir= "],  # into a folder named " "
        ["inspect", "positions", "--output", " "],  # drew into a folder named " "
        ["export", "runs/x", "-o", ""],  # the current folder
    ],
)
def test_an_empty_or_blank_option_value_is_refused_not_read_as_not_given(
    cli, tmp_path, monkeypatch, args
):
    monkeypatch.chdir(tmp_path)
    res = cli(*args)
    given = next(a for a in args if a.startswith("-"))
    option, eq, value = given.partition("=")
    value = value if eq else args[args.index(given) + 1]
    what = "an empty value" if not value else f"a blank value {value!r}"
    assert_user_error(
        res, f"{option} {value!r}: {what}; give one, or leave {option} out for its default"
    )
    assert not list(tmp_path.iterdir())  # nothing made


def test_generate_with_no_runs(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_user_error(cli("generate"), "no trained run", "minigpt train")


def test_generate_with_missing_run(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_user_error(cli("generate", "--run", "runs/nope"), "runs/nope")


def test_corrupt_checkpoint_is_refused(trained_run, cli, tmp_path, monkeypatch):
    import shutil

    work, *_ = trained_run
    run = tmp_path / "runs" / "broken"
    shutil.copytree(work / "runs" / "e2e", run)
    for which in ("best", "last"):
        w = run / "checkpoints" / which / "model.safetensors"
        w.write_bytes(w.read_bytes()[:100])
    monkeypatch.chdir(tmp_path)
    assert_user_error(cli("generate", "--run", "runs/broken"), "model.safetensors", "corrupt")


def test_unknown_config_key(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "bad.yaml"
    p.write_text(TINY.read_text().replace("learning_rate:", "learnig_rate:"))
    assert_user_error(cli("train", p), "train.learnig_rate", "did you mean train.learning_rate")
    assert not (tmp_path / "runs").exists()


def test_n_embd_not_divisible(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = cli("train", TINY, "--set", "model.n_embd=33")
    assert_user_error(res, "model.n_embd (33)", "model.n_head (2)")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()


def test_missing_config_file(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_user_error(cli("train", "nope.yaml"), "nope.yaml", "not found")


def test_bad_set_override(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_user_error(cli("train", TINY, "--set", "train.max_iters=lots"), "train.max_iters")
    assert_user_error(cli("train", TINY, "--set", "nonsense"), "section.key=value")


def test_train_without_network_fails_cleanly(cli, tmp_path, monkeypatch):
    """No corpus, and the mirror is unreachable: one line naming the URL, nothing left behind."""
    monkeypatch.chdir(tmp_path)
    res = cli("train", TINY)
    assert_user_error(res, "127.0.0.1:9", "MINIGPT_TINYSHAKESPEARE_URL", notes_ok=True)
    assert "downloading it first" in res.stderr
    assert not (tmp_path / "data" / "tinyshakespeare" / "input.txt").exists()
    assert not (tmp_path / "runs").exists()


def test_download_404_via_cli(cli, tmp_path, monkeypatch, corpus_server):
    monkeypatch.chdir(tmp_path)
    url = corpus_server.url("/missing.txt")
    assert_user_error(cli("download", "--url", url), url, "404")
    assert not any((tmp_path / "data").rglob("*")) if (tmp_path / "data").exists() else True


def test_existing_run_name_is_refused(trained_run, cli, monkeypatch, data_dir):
    work, *_ = trained_run
    monkeypatch.chdir(work)
    before = (work / "runs" / "e2e" / "metrics.jsonl").read_bytes()
    assert_user_error(cli("train", TINY, "--run-name", "e2e"), "already exists")
    assert (work / "runs" / "e2e" / "metrics.jsonl").read_bytes() == before
    # Names that would need quoting in the printed hints, or escape runs/, are refused up front.
    for bad in ("sp ace", "new\nline", "../up", "a/b", "..", ""):
        assert_user_error(
            cli("train", TINY, "--run-name", bad, "--set", f"data.data_dir={data_dir}"),
            "--run-name",
            "letters, digits" if bad else "an empty value; give one, or leave --run-name out",
            notes_ok=True,
        )
    assert sorted(p.name for p in (work / "runs").iterdir()) == ["e2e"]


def test_count_params_gpt2_small(cli):
    res = cli("count-params", "--preset", "gpt2-small")
    assert res.exit_code == 0, res
    assert "124,439,808" in res.stdout
    js = json.loads(cli("count-params", "--preset", "gpt2-small", "--json").stdout)
    assert js["total"] == 124_439_808
    for key in (
        "non_embedding",
        "embedding",
        "per_layer",
        "flops_per_token_forward",
        "flops_per_token_train",
        "seq_len",
    ):
        assert key in js


def test_count_params_bad_input(cli, tmp_path):
    assert_user_error(cli("count-params", "--preset", "gpt5"), "gpt5", "gpt2-small")
    assert_user_error(cli("count-params", "--config", tmp_path / "x.yaml"), "not found")
    assert_user_error(cli("count-params"), "--preset")


def test_train_tokenizer_char(cli, tmp_path, monkeypatch, data_dir, corpus_in_use):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "tok.json"
    res = cli(
        "train-tokenizer", "--set", f"data.data_dir={data_dir}", "--kind", "char", "--output", out
    )
    assert res.exit_code == 0, res
    n_val = corpus_in_use.size - int(
        corpus_in_use.size * 0.9
    )  # nanoGPT's split (the genuine corpus: 111,540)
    assert f"vocabulary size     {len(corpus_in_use.chars)}" in res.stdout, res.stdout
    assert f"{n_val:,}" in res.stdout and "exact" in res.stdout
    assert json.loads(out.read_text())["kind"] == "char"
    # an output that cannot be written is refused before the training, not after it (QA)
    (tmp_path / "small.txt").write_text("to be or not to be, that is the question\n" * 50)
    res = cli(
        "train-tokenizer",
        "--kind",
        "bpe",
        "--vocab-size",
        "300",
        "--input",
        tmp_path / "small.txt",
        "--output",
        out / "t.json",
    )
    assert_user_error(res, f"cannot write {out / 't.json'}", "a file is in the way")
    assert "training a" not in res.stderr


def test_help_is_fast_because_torch_is_lazy():
    """`minigpt --help` must not import torch (2.5 s here); measured as imports, not time."""
    code = (
        "import sys; from minigpt_cli.cli import app; from typer.testing import CliRunner;"
        "r = CliRunner().invoke(app, ['--help']); assert r.exit_code == 0, r.output;"
        "r = CliRunner().invoke(app, ['download', '--help']); assert r.exit_code == 0;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_console_script_exit_code(tmp_path):
    """The installed entry point: a user error exits 2 with one line and no traceback."""
    out = subprocess.run(
        [sys.executable, "-m", "minigpt_cli", "train", str(tmp_path / "x.yaml")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert out.stderr.strip().startswith("error:") and len(out.stderr.strip().splitlines()) == 1


def test_progress_bars_only_on_a_terminal_unless_asked(
    cli, data_dir, corpus_server, tmp_path, monkeypatch
):
    """CliRunner's stderr is not a terminal: no bars by default; --progress forces them,
    --no-progress still works."""
    monkeypatch.chdir(tmp_path)
    common = [
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        "train.max_iters=3",
        "--set",
        "train.sample_tokens=0",
    ]
    quiet = cli("train", TINY, "--run-name", "quiet", *common)
    assert quiet.exit_code == 0, quiet
    assert "%|" not in quiet.stderr and "step 3: train loss" in quiet.stderr
    forced = cli("train", TINY, "--run-name", "forced", "--progress", *common)
    assert forced.exit_code == 0, forced
    assert "train: 100%|" in forced.stderr
    off = cli("train", TINY, "--run-name", "off", "--no-progress", *common)
    assert off.exit_code == 0 and "%|" not in off.stderr
    url = corpus_server.url("/input.txt?t=progress")
    dl = cli("download", "--url", url, "--data-dir", tmp_path / "d1")
    assert dl.exit_code == 0, dl
    assert "%|" not in dl.stderr
    dl = cli("download", "--url", url, "--data-dir", tmp_path / "d2", "--progress")
    assert dl.exit_code == 0, dl
    assert "%|" in dl.stderr


def test_bare_minigpt_prints_the_help_and_no_error(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "minigpt_cli"], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Usage: minigpt [OPTIONS] COMMAND") and "generate" in out.stdout
    assert out.stderr == ""


@pytest.mark.parametrize(
    "command", ["train", "generate", "train-tokenizer", "count-params", "download", "bench"]
)
def test_help_shows_metavars_not_python_types(cli, monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "80")
    res = cli(command, "--help")
    assert res.exit_code == 0, res
    text = res.stdout
    for odd in (
        "<int",
        "<float",
        "<str",
        "<path",
        "<list",
        "<bool",
        "{config",
        "{CONFIG",
        "│",
        "╭",
    ):
        assert odd not in text, (odd, text)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "  -h, --help" in text


def test_help_reads_well_and_uses_the_terminal_width(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    train = cli("train", "--help").stdout
    assert "Usage: minigpt train [OPTIONS] CONFIG\n" in train
    assert "--set KEY=VALUE" in train and "--run-name NAME" in train and "\n  CONFIG  " in train
    assert (
        "Example: minigpt train configs/shakespeare-cpu.yaml --set train.max_iters=500\n" in train
    )  # not wrapped
    gen = cli("generate", "--help").stdout
    for opt in (
        "--top-k K",
        "--top-p P",
        "--temperature T",
        "--seed S",
        "--max-new-tokens N",
        "--run DIR",
        "--checkpoint best|last",
    ):
        assert opt in gen, opt
    assert (
        "Usage: minigpt train-tokenizer [OPTIONS] [CONFIG]"
        in cli("train-tokenizer", "--help").stdout
    )

    # The width comes from the terminal (CliRunner pins it at 80, so through a real process).
    def help_at(columns: int) -> str:
        env = {**os.environ, "COLUMNS": str(columns)}
        return subprocess.run(
            [sys.executable, "-m", "minigpt_cli", "generate", "--help"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    narrow = help_at(80)
    assert max(len(line) for line in narrow.splitlines()) <= 80
    wide = help_at(160)
    assert (
        80 < max(len(line) for line in wide.splitlines()) <= 120
    )  # wider terminal, wider help, up to 120
    assert len(wide.splitlines()) < len(narrow.splitlines())


def test_generate_says_which_run_it_picked(trained_run, cli, monkeypatch):
    work, *_ = trained_run
    monkeypatch.chdir(work)
    step = json.loads((work / "runs" / "e2e" / "checkpoints" / "best" / "meta.json").read_text())[
        "step"
    ]
    res = cli("generate", "--prompt", "ROMEO:", "--max-new-tokens", "5")
    assert res.exit_code == 0, res
    assert res.stderr.splitlines() == [
        f"using {Path('runs') / 'e2e'} (checkpoint best, step {step})"
    ]
    assert res.stdout.startswith("ROMEO:") and "using" not in res.stdout
    last = json.loads((work / "runs" / "e2e" / "checkpoints" / "last" / "meta.json").read_text())[
        "step"
    ]
    res = cli("generate", "--prompt", "ROMEO:", "--max-new-tokens", "5", "--checkpoint", "last")
    assert f"(checkpoint last, step {last})" in res.stderr
    named = cli("generate", "--run", "runs/e2e", "--prompt", "ROMEO:", "--max-new-tokens", "5")
    assert named.exit_code == 0 and named.stderr == ""  # the user named the run: nothing to say
    # ... unless the checkpoint asked for is not there yet and the other one is used.
    import shutil

    shutil.copytree(work / "runs" / "e2e", work / "nobest")
    shutil.rmtree(work / "nobest" / "checkpoints" / "best")
    res = cli("generate", "--run", "nobest", "--prompt", "ROMEO:", "--max-new-tokens", "5")
    assert res.exit_code == 0, res
    assert res.stderr.splitlines() == [
        f"using checkpoint last, step {last}: the run has no best checkpoint yet"
    ]


def test_checkpoint_with_nan_weights_is_refused(trained_run, cli, tmp_path, monkeypatch):
    import shutil

    import torch
    from safetensors.torch import save_file

    work, *_ = trained_run
    run = tmp_path / "runs" / "diverged"
    shutil.copytree(work / "runs" / "e2e", run)
    for which, bad in (("best", float("nan")), ("last", float("inf"))):
        w = run / "checkpoints" / which / "model.safetensors"
        sd = load_file(w)
        sd["wte.weight"][3, 5] = bad
        save_file(sd, str(w), metadata={"format": "pt"})
        record_checksums(w.parent)  # a diverged run saves its NaNs with their checksum
    monkeypatch.chdir(tmp_path)
    res = cli("generate", "--run", "runs/diverged", "--max-new-tokens", "5")
    assert_user_error(res, "checkpoints/best", "NaN or infinite", "wte.weight", "--checkpoint last")
    assert res.stdout == ""
    res = cli("generate", "--run", "runs/diverged", "--max-new-tokens", "5", "--checkpoint", "last")
    assert_user_error(res, "checkpoints/last", "--checkpoint best")
    assert torch.isfinite(
        load_file(work / "runs" / "e2e" / "checkpoints" / "best" / "model.safetensors")[
            "wte.weight"
        ]
    ).all()  # the original is untouched


def test_generate_into_a_full_device(trained_run):
    work, *_ = trained_run
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    with open("/dev/full", "w") as full:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "minigpt_cli",
                "generate",
                "--run",
                "runs/e2e",
                "--max-new-tokens",
                "20",
            ],
            cwd=work,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert out.returncode == 2, out.stderr
    assert out.stderr == "error: cannot write to standard output: No space left on device\n"


def test_home_in_paths_and_a_pasteable_hint(cli, data_dir, tmp_path, monkeypatch):
    """``~`` in out_dir is the home folder, as in a shell; the printed generate command survives a
    space."""
    import shlex

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    res = cli(
        "train",
        TINY,
        "--run-name",
        "h",
        "--no-progress",
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        "train.out_dir=~/my runs",
        "--set",
        "train.max_iters=2",
        "--set",
        "train.sample_tokens=0",
    )
    assert res.exit_code == 0, res
    run = tmp_path / "home" / "my runs" / "h"
    assert (run / "checkpoints" / "last").is_dir() and not (tmp_path / "~").exists()
    assert "trained to step 2" in res.stdout
    hint = next(l for l in res.stdout.splitlines() if l.startswith("sample from it with: "))
    words = shlex.split(hint.removeprefix("sample from it with: "))
    assert words[:3] == ["minigpt", "generate", "--run"] and Path(words[3]) == run
    gen = cli(*words[1:], "--prompt", "A", "--max-new-tokens", "3")
    assert gen.exit_code == 0 and gen.stdout.startswith("A"), gen


@pytest.mark.parametrize(
    "args,line",
    [
        (
            ["generate", "--top-k", "0"],
            "error: --top-k 0: input should be greater than or equal to 1 (see 'minigpt generate --help')",
        ),
        (
            ["generate", "--max-new-tokens", "many"],
            "error: --max-new-tokens many: input should be a valid integer, unable to parse string as an integer "
            "(see 'minigpt generate --help')",
        ),
        (["train", "--dry-run"], "error: Missing argument 'CONFIG'. (see 'minigpt train --help')"),
    ],
)
def test_typers_own_errors_read_like_the_tools_one_liners(cli, tmp_path, monkeypatch, args, line):
    monkeypatch.chdir(tmp_path)
    res = cli(*args)
    assert_user_error(res)
    assert res.stderr.strip() == line


def test_generate_says_nothing_about_cpu_threads(trained_run, cli, monkeypatch):
    """The thread count changes generate's speed, not its text: its CpuThreads gets no echo for its
    notes."""
    from minigpt_cli.runtime.device import CpuThreads
    from minigpt_cli.sample import generate as gen

    work, *_ = trained_run
    monkeypatch.chdir(work)
    made = []

    def recording(device, **kwargs):
        made.append(kwargs)
        return CpuThreads(device, **kwargs)

    monkeypatch.setattr(gen, "CpuThreads", recording)
    res = cli("generate", "--prompt", "ROMEO:", "--max-new-tokens", "20", "--seed", "1")
    assert res.exit_code == 0 and len(made) == 1 and "echo" not in made[0], made


def test_a_ctrl_c_in_prepare_or_sweep_is_the_common_stopped_line(cli, monkeypatch, tmp_path):
    """prepare answers a Ctrl-C as every other command (one line, 130); sweep adds how to continue
    it."""
    import minigpt_cli.data.pipeline as pipeline
    import minigpt_cli.experiments.sweep as sweep
    from minigpt_cli.errors import Interrupted

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "prepare_configured", interrupted)
    res = cli("prepare", TINY)
    assert (res.exit_code, res.stderr.splitlines()) == (
        130,
        ["stopped by Ctrl-C (no file left half-written)"],
    ), res

    def stopped(*args, **kwargs):
        raise Interrupted("stopped by SIGINT at step 3", resume_dir=tmp_path)

    monkeypatch.setattr(sweep, "run_sweep", stopped)
    res = cli("sweep", tmp_path / "my sweep.yaml")
    assert res.exit_code == 130, res
    assert res.stderr.splitlines() == [
        f"stopped by SIGINT at step 3; continue the sweep with: minigpt sweep "
        f"'{tmp_path / 'my sweep.yaml'}'"
    ], res


def test_version_is_the_installed_packages(cli):
    from importlib.metadata import version

    res = cli("--version")
    assert res.exit_code == 0 and res.stdout == f"minigpt {version('minigpt-cli')}\n", res
