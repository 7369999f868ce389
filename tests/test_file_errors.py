"""Each way a file cannot be read, on each kind of file minigpt reads, named by its cause in one
line.

The causes: unreadable (its permissions), missing, a dangling link, damaged, too large, nested too
deeply. The kinds: config, corpus, tokenizer, weights, meta, trainer state, sweep file, study. The
refusals come from the real CLI on real files; an unreadable file is tried as a user whose
permissions count (root reads a mode-000 file anyway): root without the capabilities that override
permissions (``setpriv``), or the user the suite runs as when it is not root."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import optuna
import pytest
from helpers import TINY, assert_user_error, working_dir

from minigpt_cli import fileio
from minigpt_cli.errors import MinigptError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def files(tmp_path_factory, corpus_file):
    """A tiny trained run, its config, corpus and tokenizer, a sweep file and a study's journal: the
    files of every kind, by kind, with the command that reads each (``args``) and what it calls the
    file."""
    root = tmp_path_factory.mktemp("file-errors")
    corpus = root / "corpus.txt"
    corpus.write_bytes(corpus_file.read_bytes()[:60_000])
    config = root / "tiny.yaml"
    config.write_text(
        TINY.read_text()
        + f"data:\n  path: {corpus}\n  data_dir: {root / 'data'}\n"
        + "  val_fraction: 0.1\n"
    )
    overrides = ["--set", "train.max_iters=2", "--set", "train.eval_interval=2"]
    overrides += ["--set", "train.sample_tokens=0", "--set", f"train.out_dir={root / 'runs'}"]
    from typer.testing import CliRunner

    from minigpt_cli.cli import app

    with working_dir(root):
        res = CliRunner().invoke(app, ["train", str(config), *overrides, "--run-name", "r"])
    assert res.exit_code == 0, res.stderr
    run = root / "runs" / "r"
    last = run / "checkpoints" / "last"
    tokenizer = root / "tok.json"
    shutil.copy(run / "tokenizer.json", tokenizer)
    sweep = root / "s.yaml"
    sweep.write_text(
        json.dumps(
            {"base": str(config), "variants": {"a": {}}, "seeds": [1], "budget": {"iters": 2}}
        )
    )
    journal = root / "study.journal"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal))
    )
    optuna.create_study(storage=storage, study_name="x")
    generate = ["generate", "--run", run, "--checkpoint", "last", "--max-new-tokens", "2"]
    resume = ["train", config, *overrides[:1], "train.max_iters=4", "--resume", run]
    return root, {
        "config": (config, ["train", config, "--dry-run"], "config"),
        "corpus": (corpus, ["prepare", config], "corpus file"),
        "tokenizer": (
            tokenizer,
            ["inspect", "tokenize", "--tokenizer", tokenizer],
            "tokenizer file",
        ),
        "weights": (last / "model.safetensors", generate, "checkpoint weights"),
        "meta": (last / "meta.json", generate, "checkpoint metadata"),
        "trainer state": (last / "trainer_state.pt", resume, "trainer state"),
        "sweep file": (sweep, ["sweep", sweep], "sweep file"),
        "study": (journal, ["compare", "--storage", journal], "--storage study"),
    }


@pytest.fixture
def kept(files):
    """Each file of ``files`` as it was, put back after the test (bytes and mode; a link made
    replaced)."""
    root, kinds = files
    saved = {path: path.read_bytes() for path, _, _ in kinds.values()}
    run_config = root / "runs" / "r" / "config.yaml"
    saved[run_config] = run_config.read_bytes()
    yield
    for path, data in saved.items():
        if path.is_symlink():
            path.unlink()
        path.write_bytes(data)
        path.chmod(0o644)


# Damaged: what each kind's message calls it, and text that is no such file.
DAMAGED = {
    "config": ("invalid YAML", b"model: [unclosed\n"),
    "corpus": ("is not UTF-8 text", b"caf\xe9\n" * 10),
    "tokenizer": ("is damaged", b"{not json"),
    "weights": ("corrupt or truncated", b"\0" * 64),
    "meta": ("is missing or damaged", b"{not json"),
    "trainer state": ("is corrupt", b"\0" * 64),
    "sweep file": ("invalid YAML", b"variants: [unclosed\n"),
    "study": ("is damaged", b"{}\n"),
}
# Missing: how each kind's message says it is not there.
MISSING = {
    "config": "not found",
    "corpus": "does not exist",
    "tokenizer": "not found",
    "weights": "holds no model.safetensors",
    "meta": "is missing or damaged (No such file or directory)",
    "trainer state": "not found; use another checkpoint or start a new run",
    "sweep file": "no such sweep file",
    "study": "not found",
}


def _one_line(res) -> str:
    assert_user_error(res, notes_ok=True)
    return [line for line in res.stderr.splitlines() if line.startswith("error:")][0]


@pytest.mark.parametrize("kind", list(DAMAGED))
def test_a_damaged_missing_or_dangling_file_is_named_by_its_cause(cli, files, kept, kind):
    root, kinds = files
    path, args, what = kinds[kind]
    with working_dir(root):
        word, text = DAMAGED[kind]
        path.write_bytes(text)
        line = _one_line(cli(*args))
        assert word in line and str(path) in line, line
        assert "cannot write" not in line and "permission" not in line, line

        path.unlink()
        line = _one_line(cli(*args))
        assert MISSING[kind] in line, line
        assert "link" not in line and "damaged" not in line.replace("missing or damaged", ""), line

        path.symlink_to(root / "nowhere" / path.name)
        line = _one_line(cli(*args))
        assert f"is a link to '{root / 'nowhere' / path.name}', which does not exist" in line, line
        assert str(path) in line and "damaged" not in line.replace("missing or damaged", ""), line


# Run as a user whose permissions count: each case chmods its file to 000, runs the CLI in-process,
# puts the mode back, and prints the exit code and the stderr of each, as JSON.
_DRIVER = """
import json, os, sys
from typer.testing import CliRunner
from minigpt_cli.cli import app
os.chdir(sys.argv[1])
out = []
for path, args in json.loads(sys.argv[2]):
    os.chmod(path, 0)
    try:
        res = CliRunner().invoke(app, args, catch_exceptions=False)
    finally:
        os.chmod(path, 0o644)
    out.append((res.exit_code, res.stderr))
print(json.dumps(out))
"""


def _as_unprivileged(tmp_path: Path) -> list[str]:
    """The command prefix that runs Python without the power to read a mode-000 file; skips the test
    when there is none (root without ``setpriv``, or a kernel that keeps the capabilities)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root reads files whatever their permissions, and setpriv is not installed")
    prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search"]
    probe = tmp_path / "probe"
    probe.write_text("x")
    probe.chmod(0)
    done = subprocess.run(
        [*prefix, sys.executable, "-c", f"open({str(probe)!r})"], capture_output=True, text=True
    )
    if "PermissionError" not in done.stderr:
        pytest.skip(
            f"root reads files whatever their permissions, even under setpriv: {done.stderr}"
        )
    return prefix


def test_an_unreadable_file_is_called_unreadable_never_damaged(files, kept, tmp_path):
    root, kinds = files
    prefix = _as_unprivileged(tmp_path)
    # The tokenizer minigpt prepared for the corpus (the one the issue found called "not valid JSON
    # ...; delete it"), and the checkpoint folder itself (found called "cannot write
    # ...model.safetensors").
    own = next((root / "data").glob("*/tokenizer-char*.json"))
    sweep = kinds["sweep file"][0]
    last = root / "runs" / "r" / "checkpoints" / "last"
    cases = {
        **{kind: (path, args, what) for kind, (path, args, what) in kinds.items()},
        "own tokenizer": (own, ["prepare", kinds["config"][0]], "tokenizer file"),
        "checkpoint folder": (last, kinds["weights"][1], "checkpoint folder"),
        # A config that no option's check reads first: a sweep file's base.
        "base config": (kinds["config"][0], kinds["sweep file"][1], f"{sweep}: base: config"),
    }
    order = list(cases)
    plan = [(str(cases[k][0]), [str(a) for a in cases[k][1]]) for k in order]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    done = subprocess.run(
        [*prefix, sys.executable, "-c", _DRIVER, str(root), json.dumps(plan)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    for kind, (code, stderr) in zip(order, json.loads(done.stdout.splitlines()[-1])):
        path, _, what = cases[kind]
        lines = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert code == 2 and len(lines) == 1 and "Traceback" not in stderr, (kind, stderr)
        line = lines[0]
        if kind in ("config", "tokenizer", "sweep file"):  # the command line checks (readable=True)
            assert f"path '{path}' is not readable" in line, line
        else:
            assert f"cannot read {what} '{path}': permission denied" in line, (kind, line)
        for wrong in ("delete", "write", "damaged", "corrupt", "not found", "train first"):
            assert wrong not in line, (kind, line)


# ----------------------------------------------------------------------------- bounded input


@pytest.mark.parametrize(
    "kind,limit",
    [
        ("config", fileio.YAML_BOUNDS.max_bytes),
        ("sweep file", fileio.YAML_BOUNDS.max_bytes),
        ("tokenizer", fileio.TOKENIZER_BOUNDS.max_bytes),
        ("meta", fileio.STATE_BOUNDS.max_bytes),
        ("study", fileio.STUDY_BOUNDS.max_bytes),
    ],
)
def test_a_file_past_its_size_limit_is_refused_before_it_is_read(cli, files, kept, kind, limit):
    root, kinds = files
    path, args, what = kinds[kind]
    # One byte over the limit, as a sparse file: its size is all that is checked, and it takes no
    # disk.
    with open(path, "r+b") as f:
        f.truncate(limit + 1)
    with working_dir(root):
        line = _one_line(cli(*args))
    assert f"{what} '{path}' is {limit + 1:,} bytes" in line, line
    assert f"over the limit of {limit:,} bytes" in line, line


def test_a_trainer_state_past_its_bound_is_refused_before_it_is_read(cli, files, kept):
    from minigpt_cli.run.checkpoint import state_bounds

    root, kinds = files
    path, args, what = kinds["trainer state"]
    limit = state_bounds(kinds["weights"][0].stat().st_size).max_bytes
    with open(path, "r+b") as f:
        f.truncate(limit + 1)
    with working_dir(root):
        line = _one_line(cli(*args))
    assert f"{what} '{path}' is {limit + 1:,} bytes" in line, line


def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("levels", [fileio.TOKENIZER_BOUNDS.max_depth, 200_000])
def test_a_tokenizer_nested_too_deeply_is_one_line_in_train_and_inspect(cli, files, kept, levels):
    root, kinds = files
    path, inspect_args, _ = kinds["tokenizer"]
    # One level under the model's key: the limit's own depth plus one, or far past Python's stack.
    path.write_text('{"model": ' + _nested(levels) + "}")
    train = ["train", kinds["config"][0], "--dry-run", "--set", "tokenizer.kind=hf"]
    train += ["--set", f"tokenizer.path={path}"]
    with working_dir(root):
        for args in (inspect_args, train):
            line = _one_line(cli(*args))
            assert f"tokenizer file '{path}' is nested more than 64 levels deep" in line, line


def test_json_and_yaml_depth_limits_hold_at_the_limit_and_refuse_past_it(tmp_path):
    bounds = fileio.Bounds(1 << 20, 5)
    assert fileio.depth(fileio.parse_json(_nested(5), "f.json", "file", bounds)) == 5
    with pytest.raises(MinigptError, match="'f.json' is nested more than 5 levels deep, the limit"):
        fileio.parse_json(_nested(6), "f.json", "file", bounds)
    from minigpt_cli.config.yaml_io import parse_yaml

    limit = fileio.YAML_BOUNDS.max_depth
    assert parse_yaml("a: " + _nested(limit - 1))  # the mapping is the first level
    with pytest.raises(MinigptError, match=f"nested too deeply \\(more than {limit} levels"):
        parse_yaml("a: " + _nested(limit))


def test_a_json_lines_document_nested_too_deeply_is_one_line(cli, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "hello there"}\n' * 50 + '{"text": ' + _nested(100_000) + "}\n")
    with working_dir(tmp_path):
        line = _one_line(cli("prepare", TINY, "--set", f"data.path={corpus}"))
    assert f"{corpus}:51: does not parse as JSON (nested more than 64 levels deep" in line, line


# ----------------------------------------------------------------------------- links and leftovers


def _export(cli, files, out, *extra):
    root, _ = files
    return cli("export", root / "runs" / "r", "--checkpoint", "last", "-o", out, *extra)


def test_export_to_a_link_writes_through_it_and_leaves_no_link_behind(cli, files, tmp_path):
    target = tmp_path / "exports" / "m"
    assert _export(cli, files, target).exit_code == 0
    link = tmp_path / "m-link"
    link.symlink_to(target)
    # A link an earlier version moved aside (it replaced the link with a folder): cleaned up too.
    left = tmp_path / ".m-link.minigpt-export-abc123.old"
    left.symlink_to(target)
    before = (target / "config.json").stat().st_ino
    res = _export(cli, files, link, "--force")
    assert res.exit_code == 0, res
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert (target / "config.json").stat().st_ino != before  # the target holds the new export
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exports", "m-link"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["m"]


def test_export_to_a_link_refuses_what_it_would_refuse_at_the_target(cli, files, tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "config.json").write_text("{}")
    link = tmp_path / "link"
    link.symlink_to(theirs)
    assert_user_error(_export(cli, files, link, "--force"), "not an export minigpt wrote")
    assert (theirs / "config.json").read_text() == "{}" and link.is_symlink()
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    assert_user_error(
        _export(cli, files, dangling),
        f"--output {dangling} is a link to '{tmp_path / 'nowhere'}', which does not exist",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "link", "theirs"]


_WRITER = """
import sys
from contextlib import ExitStack
from pathlib import Path
from minigpt_cli.data.preparation import _locked_temp
stack = ExitStack()
path, _ = _locked_temp(Path(sys.argv[1]), "train", stack)
print(path, flush=True)
sys.stdin.read()  # holds the file (and its lock) until killed
"""


def _writer(folder: Path) -> tuple[subprocess.Popen, Path]:
    """A process with prepare's own temporary token file open in ``folder``; the file, once it
    exists."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])},
    )
    return proc, Path(proc.stdout.readline().strip())


def test_prepare_removes_the_temporaries_of_dead_writers_and_keeps_a_live_ones(cli, files):
    root, kinds = files
    config = kinds["config"][0]
    folder = next(p for p in (root / "data").glob("*/char-*") if p.is_dir())
    dead, dead_file = _writer(folder)
    live, live_file = _writer(folder)
    try:
        dead.send_signal(signal.SIGKILL)  # as a prepare killed mid-write: its lock goes with it
        dead.wait()
        assert dead_file.exists() and live_file.exists()
        with working_dir(root):
            res = cli("prepare", config)  # the data is prepared already: nothing else to do
        assert res.exit_code == 0, res
        assert not dead_file.exists()
        assert live_file.exists()  # its writer holds the lock: however old, it stays
    finally:
        live.kill()
        live.wait()
        live_file.unlink(missing_ok=True)


def test_an_output_through_a_dangling_link_is_named_as_one(cli, files, tmp_path):
    root, kinds = files
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone" / "runs")
    said = (
        f"cannot write {link}: {link} is a link to '{tmp_path / 'gone' / 'runs'}', which does not"
    )
    res = cli("train", kinds["config"][0], "--set", f"train.out_dir={link}", "--dry-run")
    assert_user_error(res, said, "point the link at an existing folder", notes_ok=True)
    res = cli("compare", root / "runs" / "r", "--output", link)
    assert_user_error(res, said, notes_ok=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@contextmanager
def _fifo_at(path: Path):
    """A FIFO in place of ``path`` (its bytes put back after). A writer waits on it and closes as
    soon as anything opens it: a reader that would block on it sees its end (and fails the test)
    instead of hanging it."""
    saved = path.read_bytes() if path.is_file() else None
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    writer = threading.Thread(target=lambda: os.close(os.open(path, os.O_WRONLY)))
    writer.start()
    try:
        yield
    finally:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # frees the writer if nothing opened it
        writer.join()
        os.close(fd)
        path.unlink()
        if saved is not None:
            path.write_bytes(saved)


def _fifo_cases(root: Path, kinds: dict) -> dict:
    """Each kind of file a command reads, as (path, command, what the message calls it): the kinds
    of ``files`` and the others the QA round found hanging on a FIFO."""
    run = root / "runs" / "r"
    config = kinds["config"][0]
    resume = kinds["trainer state"][1]
    return {
        **kinds,
        "sweep base": (config, ["sweep", kinds["sweep file"][0], "--dry-run"], "config"),
        "checkpoint config": (
            run / "checkpoints" / "last" / "config.yaml",
            resume,
            "checkpoint config",
        ),
        "metrics": (run / "metrics.jsonl", ["plot", run, "-o", root / "p.png"], "metrics.jsonl"),
        "text file": (
            root / "text.txt",
            ["evaluate", "--run", run, "--text-file", root / "text.txt"],
            "--text-file",
        ),
        "tokenizer to train": (
            root / "new-tok.json",
            ["train", config, "--set", f"tokenizer.path={root / 'new-tok.json'}", "--dry-run"],
            "tokenizer file",
        ),
    }


@pytest.mark.parametrize(
    "kind",
    [
        *DAMAGED,
        "sweep base",
        "checkpoint config",
        "metrics",
        "text file",
        "tokenizer to train",
    ],
)
def test_a_fifo_in_place_of_any_file_is_refused_as_not_a_regular_file(cli, files, kept, kind):
    """Every reader stats (or opens without blocking) before it reads: a FIFO would wait forever
    for a writer."""
    root, kinds = files
    path, args, what = _fifo_cases(root, kinds)[kind]
    with working_dir(root), _fifo_at(path):
        line = _one_line(cli(*args))
    assert "is not a regular file (a FIFO)" in line and str(path) in line, line
    assert what in line and "not found" not in line and "empty" not in line, line


@pytest.mark.parametrize("kind", list(DAMAGED))
def test_a_link_loop_in_place_of_any_file_is_named_as_one(cli, files, kept, kind):
    root, kinds = files
    path, args, _ = kinds[kind]
    path.unlink()
    path.symlink_to(path.name)  # a link to itself: every open ends in ELOOP
    with working_dir(root):
        line = _one_line(cli(*args))
    assert "is a link loop" in line and str(path) in line, line
    assert "does not exist" not in line and "damaged" not in line, line


@pytest.mark.parametrize("target", ["nowhere", "self"])
def test_resume_through_a_dangling_or_looping_last_link_names_the_link(cli, files, target):
    root, kinds = files
    run = root / "runs" / "r"
    last = run / "checkpoints" / "last"
    aside = last.with_name("last-aside")
    last.rename(aside)
    last.symlink_to(root / "nowhere" if target == "nowhere" else "last")
    try:
        with working_dir(root):
            line = _one_line(cli(*kinds["trainer state"][1]))
    finally:
        last.unlink()
        aside.rename(last)
    said = "is a link to" if target == "nowhere" else "is a link loop"
    assert str(last) in line and said in line and "cp -r" not in line, line


@pytest.mark.parametrize("command", ["export", "plot"])
@pytest.mark.parametrize("target", ["nowhere", "self"])
def test_an_output_through_a_dangling_or_looping_link_is_refused_alike(
    cli, files, tmp_path, command, target
):
    """Every output: a link to nothing (whose folders writing would make elsewhere) or to itself."""
    root, _ = files
    link = tmp_path / "out.png"
    link.symlink_to(tmp_path / "no-dir" / "x.png" if target == "nowhere" else link.name)
    if command == "export":
        res = _export(cli, files, link, "--force")
    else:
        res = cli("plot", root / "runs" / "r", "-o", link)
    said = "is a link to" if target == "nowhere" else "is a link loop"
    assert said in _one_line(res)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.png"]


def test_a_step_never_kept_names_the_kept_steps(cli, files, tmp_path):
    root, _ = files
    res = cli("export", root / "runs" / "r", "--checkpoint", "step-99", "-o", tmp_path / "m")
    line = _one_line(res)
    assert "kept no checkpoint at step 99" in line and "train first" not in line, line
