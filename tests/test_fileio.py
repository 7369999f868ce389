"""Atomic writes and write failures: file modes, paths that cannot be written, a full disk, a full
stdout.

We run as root here, where a chmod-ed read-only folder is no obstacle; the
failures are made with paths that no user can write (a folder below a regular
file, a folder where a file should go), a simulated ENOSPC, and /dev/full.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_user_error

from minigpt_cli import fileio
from minigpt_cli.errors import MinigptError
from minigpt_cli.fileio import atomic_write_bytes, atomic_write_text
from minigpt_cli.run import folder as runs

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "configs" / "tiny.yaml"


@pytest.fixture
def umask():
    """Set the umask for one test: ``umask(0o027)``; the old one comes back afterwards."""
    old = os.umask(0o022)
    try:
        yield os.umask
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_gets_the_umask_mode_like_open(tmp_path, umask):
    for mask in (0o022, 0o027, 0o002):
        umask(mask)
        ours, plain = tmp_path / f"ours-{mask:o}.txt", tmp_path / f"plain-{mask:o}.txt"
        atomic_write_text(ours, "x")
        plain.write_text("x")
        assert _mode(ours) == _mode(plain) == 0o666 & ~mask, oct(_mode(ours))


def test_an_existing_file_keeps_its_mode(tmp_path, umask):
    umask(0o022)
    path = tmp_path / "secret.json"
    path.write_text("old")
    path.chmod(0o600)
    atomic_write_text(path, "new")
    assert path.read_text() == "new" and _mode(path) == 0o600
    path.chmod(0o664)
    atomic_write_text(path, "newer")
    assert _mode(path) == 0o664


def _no_temp_files(folder: Path) -> bool:
    return not [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


def test_a_folder_below_a_regular_file_is_a_one_line_error(tmp_path):
    (tmp_path / "afile").write_text("keep me")
    target = tmp_path / "afile" / "sub" / "tok.json"
    with pytest.raises(MinigptError) as e:
        atomic_write_text(target, "{}")
    msg = str(e.value)
    assert msg.startswith(f"cannot write {target}: ") and "\n" not in msg, msg
    assert (tmp_path / "afile").read_text() == "keep me"


def test_a_folder_in_place_of_the_file_is_a_one_line_error(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "inside.txt").write_text("keep me")
    with pytest.raises(MinigptError) as e:
        atomic_write_text(tmp_path / "out", "{}")
    assert str(e.value).startswith(f"cannot write {tmp_path / 'out'}: Is a directory; ")
    assert (tmp_path / "out" / "inside.txt").read_text() == "keep me"
    assert _no_temp_files(tmp_path)


def test_a_full_disk_keeps_the_old_file_and_leaves_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "train.bin"
    path.write_bytes(b"old bytes")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fileio.os, "fsync", full)
    with pytest.raises(MinigptError) as e:
        atomic_write_bytes(path, b"new bytes" * 1000)
    msg = str(e.value)
    assert (
        msg
        == f"cannot write {path}: No space left on device; free some disk space or choose another location"
    )
    assert path.read_bytes() == b"old bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.bin"]


@pytest.mark.skipif(
    os.name != "posix" or os.geteuid() == 0, reason="root writes into a read-only folder anyway"
)
def test_a_read_only_folder_is_a_one_line_error(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "old.json").write_text("old")
    folder.chmod(0o555)
    try:
        with pytest.raises(MinigptError, match="Permission denied; check the permissions"):
            atomic_write_text(folder / "old.json", "new")
        assert (folder / "old.json").read_text() == "old"
    finally:
        folder.chmod(0o755)


def test_os_error_message_names_the_target_of_a_rename():
    exc = OSError(errno.EISDIR, "Is a directory", "/x/.tmp123", None, "/x/out")
    assert (
        fileio.os_error_message(exc)
        == "cannot write /x/out: Is a directory; give the path of a file, not of a folder"
    )
    assert fileio.os_error_message(OSError(errno.ENOSPC, "No space left on device")).startswith(
        "cannot write: No space left on device; free some disk space"
    )


# ----------------------------------------------------------------------------- through the CLI


def test_cli_output_paths_that_cannot_be_written(cli, tmp_path, monkeypatch, data_dir):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    base = ("train-tokenizer", "--set", f"data.data_dir={data_dir}", "--kind", "char")
    assert_user_error(cli(*base, "--output", "afile/tok.json"), "cannot write afile/tok.json")
    assert_user_error(cli(*base, "--output", "adir"), "cannot write adir: Is a directory")
    assert (tmp_path / "afile").read_text() == "x" and not any((tmp_path / "adir").iterdir())


def test_cli_run_and_data_folders_below_a_file(cli, tmp_path, monkeypatch, data_dir, corpus_server):
    """The library does not wrap every write (mkdir of runs/): the CLI's handler catches the
    rest."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    res = cli(
        "train",
        TINY,
        "--no-progress",
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        "train.out_dir=afile/runs",
    )
    assert_user_error(res, "cannot write afile/runs", "Not a directory", notes_ok=True)
    res = cli(
        "download", "--data-dir", "afile/data", "--url", corpus_server.url("/input.txt?t=afile")
    )
    assert_user_error(res, "afile/data")
    assert (tmp_path / "afile").read_text() == "x"


def _minigpt(*args: str, cwd: Path, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "minigpt_cli", *args],
        cwd=cwd,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_stdout_on_a_full_device_is_one_line(tmp_path):
    with open("/dev/full", "w") as full:
        out = _minigpt("count-params", "--preset", "gpt2-small", cwd=tmp_path, stdout=full)
    assert out.returncode == 2, out.stderr
    assert out.stderr == "error: cannot write to standard output: No space left on device\n"


def test_a_closed_pipe_exits_quietly(tmp_path):
    """`minigpt count-params ... | head -c 1`: the reader leaves; exit 0, nothing on stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "minigpt_cli", "count-params", "--preset", "gpt2-small"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # before the child writes: its first write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert err == ""


@pytest.mark.parametrize("failure", ["safetensors", "torch.save", "torch.save-iostream", "oserror"])
def test_a_checkpoint_write_that_fails_keeps_the_previous_one(tmp_path, monkeypatch, failure):
    """A full disk while saving: one line naming the folder; the old checkpoint loads; no temporary
    folder."""
    import torch
    from safetensors import SafetensorError

    from minigpt_cli.config.schema import load_config
    from minigpt_cli.model.gpt import GPT
    from minigpt_cli.run import checkpoint

    cfg = load_config(TINY)
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"vocab_size": 65})})
    torch.manual_seed(0)
    model = GPT(cfg.model)
    target = tmp_path / "checkpoints" / "last"
    checkpoint.save(target, model, cfg, meta={"step": 1})
    before = (target / runs.WEIGHTS).read_bytes()

    def full(*args, **kwargs):
        if failure == "safetensors":
            raise SafetensorError(
                "Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                'message: "No space left on device" })'
            )
        if failure == "torch.save":
            raise RuntimeError(
                "[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0: "
                "PytorchStreamWriter failed writing file data/0"
            )
        if failure == "torch.save-iostream":  # what a full disk gave in QA
            raise RuntimeError("basic_ios::clear: iostream error")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if failure.startswith("torch.save"):
        monkeypatch.setattr(checkpoint.torch, "save", full)
    else:
        monkeypatch.setattr(checkpoint, "save_file", full)
    with torch.no_grad():
        model.wte.weight.add_(1.0)
    with pytest.raises(MinigptError) as info:
        checkpoint.save(target, model, cfg, trainer_state={"step": 2}, meta={"step": 2})
    msg = str(info.value)
    assert msg.startswith(f"cannot write {target}") and "\n" not in msg, msg
    assert "free some disk space" in msg
    assert (target / runs.WEIGHTS).read_bytes() == before
    assert sorted(p.name for p in target.parent.iterdir()) == ["last"]


def test_a_runtime_error_that_is_not_a_failed_write_is_not_hidden(tmp_path, monkeypatch):
    from minigpt_cli.config.schema import load_config
    from minigpt_cli.model.gpt import GPT
    from minigpt_cli.run import checkpoint

    cfg = load_config(TINY)
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"vocab_size": 65})})

    def bug(*args, **kwargs):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(checkpoint.torch, "save", bug)
    with pytest.raises(RuntimeError, match="a bug of ours"):
        checkpoint.save(tmp_path / "last", GPT(cfg.model), cfg, trainer_state={"step": 1})
    assert list(tmp_path.iterdir()) == []  # its temporary folder is gone all the same


def test_a_link_is_written_through_and_a_fifo_is_refused(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    atomic_write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(MinigptError, match="not a regular file"):
        atomic_write_text(fifo, "x")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


@pytest.mark.parametrize("kind", ["symlink", "fifo", "folder"])
def test_a_lock_path_that_is_not_a_file_is_refused_untouched(tmp_path, kind):
    """runs/NAME/.lock as a link (its target must not be truncated), a FIFO (no hang) or a
    folder."""
    from minigpt_cli.run.claim import RunLock

    run = tmp_path / "run"
    run.mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    lock = run / ".lock"
    {
        "symlink": lambda: lock.symlink_to(precious),
        "fifo": lambda: os.mkfifo(lock),
        "folder": lock.mkdir,
    }[kind]()
    with pytest.raises(MinigptError, match=r"\.lock is not a regular file.*remove it"):
        RunLock(run).acquire("wait")
    assert precious.read_text() == "keep me"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_under_a_run_file_names_the_file(tmp_path):
    """A write to an open file fails without a file name; the run's files add theirs for the error
    line."""
    import errno

    from minigpt_cli.fileio import os_error_message
    from minigpt_cli.run.metrics import RunLogger

    logger = RunLogger(tmp_path)
    (tmp_path / "samples.txt").symlink_to("/dev/full")  # every write: ENOSPC
    with pytest.raises(OSError) as info:
        logger.sample(10, "some text")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(tmp_path / "samples.txt")
    assert os_error_message(info.value).startswith(
        f"cannot write {tmp_path / 'samples.txt'}: No space left"
    )


def test_errors_as_turns_the_first_matching_type_into_its_error_and_passes_the_rest(tmp_path):
    table = {
        FileNotFoundError: lambda exc: MinigptError("gone"),
        OSError: lambda exc: MinigptError("other"),
        ValueError: lambda exc: None,
    }
    with pytest.raises(MinigptError, match="^gone$"):
        with fileio.errors_as(table):
            open(tmp_path / "missing")
    with pytest.raises(MinigptError, match="^other$"):
        with fileio.errors_as(table):
            raise OSError(errno.EIO, "I/O error")
    with pytest.raises(
        ValueError, match="left alone"
    ):  # an entry that builds nothing lets the error pass
        with fileio.errors_as(table):
            raise ValueError("left alone")
    with fileio.os_errors(tmp_path / "a", "read", in_run=True) as at:
        pass
    with pytest.raises(MinigptError) as info:
        with at:
            at.path = tmp_path / "b"  # the block names the file it has moved on to
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    assert (
        str(info.value)
        == f"cannot read {tmp_path / 'b'}: Permission denied; check the permissions of the run "
        "folder and of its files"
    )


def test_read_text_file_says_which_way_a_named_file_cannot_be_read(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfa\r\nb")
    assert fileio.read_text_file(tmp_path / "bom.txt", "--text-file") == "a\nb"
    for name, fragment in [
        ("none.txt", "not found"),
        (".", "is a folder"),
        ("latin1.txt", "is not UTF-8 text"),
    ]:
        with pytest.raises(MinigptError, match=f"^--text-file '.*' {fragment}"):
            fileio.read_text_file(tmp_path / name, "--text-file")


def _special(kind: str, tmp_path: Path) -> Path:
    """A file of ``kind`` that is not a regular one: a FIFO, a bound socket, a character device."""
    if kind == "a character device":
        return Path("/dev/null")
    path = tmp_path / "special"
    if kind == "a FIFO":
        os.mkfifo(path)
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()  # the socket file stays
    return path


@pytest.mark.parametrize("kind", ["a FIFO", "a socket", "a character device"])
def test_every_reader_refuses_a_file_that_is_not_regular_before_reading(tmp_path, kind):
    """A FIFO without a writer would block the read forever; each reader names the kind."""
    path = _special(kind, tmp_path)
    for read in (
        lambda: fileio.read_bytes(path, "config"),
        lambda: fileio.read_text_file(path, "--text-file"),
        lambda: fileio.check_readable(path, "config"),
    ):
        with pytest.raises(MinigptError, match=f"is not a regular file \\({kind}\\)"):
            read()
    problem = fileio.write_problem(path, folder=False)
    assert isinstance(problem, fileio.NotRegularFile) and problem.kind == kind
