"""download of Tiny Shakespeare against the local corpus server (no internet)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
from pathlib import Path

import pytest
from conftest import CORPUS_SHA256, REPO

from minigpt_cli.data import download
from minigpt_cli.data.download import file_ok, resolve_url
from minigpt_cli.data.download_files import PART_GLOB
from minigpt_cli.errors import MinigptError

TS = download.get_dataset("tinyshakespeare")
DEFAULT_URL, URL_ENV, SHA256, SIZE = TS.url, TS.url_env, TS.sha256, TS.size
FAST = dict(progress=False, timeout=5.0, retries=2, backoff_factor=0.01)


def fetch(data_dir, url=None, **kw):
    return download.download("tinyshakespeare", data_dir, url=url, **{**FAST, **kw})


def leftovers(data_dir):
    """Every file under data_dir (temp files included)."""
    return sorted(str(p.relative_to(data_dir)) for p in data_dir.rglob("*") if p.is_file())


def one_line(msg: str) -> str:
    assert "\n" not in msg and "\r" not in msg, msg
    return msg


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(URL_ENV, raising=False)


# --- resolve_url / file_ok -------------------------------------------------------


def test_resolve_url_order(monkeypatch):
    monkeypatch.delenv(URL_ENV, raising=False)
    assert resolve_url() == DEFAULT_URL
    assert resolve_url("") == DEFAULT_URL
    monkeypatch.setenv(URL_ENV, "http://mirror/env.txt")
    assert resolve_url() == "http://mirror/env.txt"
    assert resolve_url("http://mirror/explicit.txt") == "http://mirror/explicit.txt"
    monkeypatch.setenv(URL_ENV, "  ")
    assert resolve_url() == DEFAULT_URL


def test_file_ok(tmp_path, corpus_file):
    assert file_ok(corpus_file)
    assert not file_ok(tmp_path / "absent.txt")
    assert not file_ok(tmp_path)  # a directory
    bad = tmp_path / "bad.txt"
    bad.write_bytes(corpus_file.read_bytes().upper())  # same size, other bytes
    assert not file_ok(bad)


def test_registry_entry_is_the_char_rnn_corpus():
    ts = download.datasets()["tinyshakespeare"]
    assert (ts.name, ts.url_env) == ("tinyshakespeare", "MINIGPT_TINYSHAKESPEARE_URL")
    assert ts.url.endswith("karpathy/char-rnn/master/data/tinyshakespeare/input.txt")
    # The shipped file itself: the session may serve another corpus under this name (conftest.py).
    shipped = json.loads((REPO / "minigpt_cli" / "config" / "datasets.json").read_text())
    entry = shipped["tinyshakespeare"]
    assert (entry["size"], entry["sha256"]) == (1_115_394, CORPUS_SHA256)


def test_a_second_dataset_needs_only_a_registry_entry(tmp_path, corpus_server, monkeypatch, capsys):
    """An entry in the registry file's form (url, sha256, size) makes a dataset: no code."""
    from minigpt_cli import paths

    registry = dict(
        paths.dataset_registry(),
        other={
            "url": corpus_server.url("/input.txt?t=registry"),
            "sha256": SHA256,
            "size": SIZE,
            "description": "a copy",
        },
    )
    monkeypatch.setattr(paths, "dataset_registry", lambda: registry)
    monkeypatch.delenv("MINIGPT_OTHER_URL", raising=False)
    path, downloaded = download.download("other", tmp_path, **FAST)
    assert (path, downloaded) == (tmp_path / "other" / "input.txt", True) and file_ok(path, "other")
    monkeypatch.setenv("MINIGPT_OTHER_URL", "http://mirror/other.txt")
    assert resolve_url(None, "other") == "http://mirror/other.txt"
    with pytest.raises(MinigptError) as ei:
        download.download("other", tmp_path / "x", url=corpus_server.url("/missing.txt"), **FAST)
    assert one_line(str(ei.value)).endswith("check the URL or set MINIGPT_OTHER_URL to a mirror")
    with pytest.raises(
        MinigptError,
        match="unknown dataset 'nope'; known datasets: tinyshakespeare, shakespeare-gutenberg, other",
    ):
        download.download("nope", tmp_path)


def test_a_failure_that_is_no_network_failure_keeps_its_traceback():
    attempt = download._Attempt(TS, "http://x", Path("input.txt"), "", 1.0, 0)
    with (
        pytest.raises(ValueError, match="a bug"),
        attempt.failing("read"),
    ):  # not a network failure: let through
        raise ValueError("a bug")


# --- success paths ---------------------------------------------------------------


def test_download_then_cached(tmp_path, corpus_server, capsys):
    target = "/input.txt?t=cached"
    path, downloaded = fetch(tmp_path, corpus_server.url(target))
    assert downloaded is True
    assert path == tmp_path / "tinyshakespeare" / "input.txt"
    assert path.stat().st_size == SIZE
    assert sha(path) == SHA256
    assert leftovers(tmp_path) == ["tinyshakespeare/input.txt"]
    # Not the 0600 a NamedTemporaryFile gets: the usual mode under the umask.
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert corpus_server.hit_count(target) == 1

    path2, downloaded2 = fetch(tmp_path, corpus_server.url(target))
    assert (path2, downloaded2) == (path, False)
    assert corpus_server.hit_count(target) == 1  # no network the second time
    out, _ = capsys.readouterr()
    assert out == ""


def test_cached_file_needs_no_network(tmp_path, corpus_file):
    dest = tmp_path / "tinyshakespeare" / "input.txt"
    dest.parent.mkdir()
    dest.write_bytes(corpus_file.read_bytes())
    # An unroutable URL: any request would fail.
    assert fetch(tmp_path, "http://127.0.0.1:9/never") == (dest, False)


def test_env_var_honoured(tmp_path, corpus_server, monkeypatch):
    target = "/input.txt?t=env"
    monkeypatch.setenv(URL_ENV, corpus_server.url(target))
    path, downloaded = fetch(tmp_path)
    assert downloaded and sha(path) == SHA256
    assert corpus_server.hit_count(target) == 1


def test_shakespeare_env_fixture(tmp_path, shakespeare_env):
    assert os.environ[URL_ENV] == shakespeare_env
    path, downloaded = fetch(tmp_path)
    assert downloaded and file_ok(path)


def test_flaky_server_retried(tmp_path, corpus_server):
    target = "/flaky.txt?t=retry"
    path, downloaded = fetch(tmp_path, corpus_server.url(target))
    assert downloaded and sha(path) == SHA256
    assert corpus_server.hit_count(target) == 2  # one 503, one success


def test_flaky_server_without_retries_fails(tmp_path, corpus_server):
    url = corpus_server.url("/flaky.txt?t=noretry")
    with pytest.raises(MinigptError) as ei:
        fetch(tmp_path, url, retries=0)
    msg = one_line(str(ei.value))
    assert url in msg and "503" in msg
    assert leftovers(tmp_path) == []


def test_progress_bar_goes_to_stderr(tmp_path, corpus_server, capsys):
    fetch(tmp_path, corpus_server.url("/input.txt?t=progress"), progress=True)
    out, _ = capsys.readouterr()
    assert out == ""


# --- failures leave nothing behind -------------------------------------------------


def test_404(tmp_path, corpus_server):
    url = corpus_server.url("/missing.txt")
    with pytest.raises(MinigptError) as ei:
        fetch(tmp_path, url)
    msg = one_line(str(ei.value))
    assert url in msg and "404" in msg and URL_ENV in msg
    assert leftovers(tmp_path) == []
    assert not (tmp_path / "tinyshakespeare").exists()  # the folder we made is gone too


def test_a_password_in_the_url_is_not_shown(tmp_path, corpus_server):
    url = corpus_server.url("/missing.txt").replace("http://", "http://user:s3cret@")
    with pytest.raises(MinigptError) as ei:
        fetch(tmp_path, url)
    msg = one_line(str(ei.value))
    assert "404" in msg and "s3cret" not in msg and "user:***@127.0.0.1" in msg


def test_the_fix_names_where_the_url_came_from(tmp_path, corpus_server, cli, shakespeare_env):
    """--url and a config's data.url override the environment, so the fix names them instead."""
    bad = corpus_server.url("/missing.txt")
    res = cli("download", "--data-dir", tmp_path, "--url", bad, "--no-progress")
    assert res.exit_code == 2 and "404" in res.stderr and "pass another --url" in res.stderr, res
    assert URL_ENV not in res.stderr
    from minigpt_cli.config.schema import load_config
    from minigpt_cli.data.pipeline import ensure_corpus

    cfg = load_config(
        Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml",
        [f"data.data_dir={tmp_path}", f"data.url={bad}"],
    )
    with pytest.raises(MinigptError, match="fix data.url in the config"):
        ensure_corpus(cfg, log=lambda m: None, progress=False)


def test_a_body_that_does_not_decode_is_named_so(tmp_path, corpus_server):
    with pytest.raises(MinigptError) as ei:
        fetch(tmp_path, corpus_server.url("/badgzip.txt"))
    msg = one_line(str(ei.value))
    assert (
        "sent a gzip body that does not decode" in msg and "cut off" not in msg and "(('" not in msg
    )
    assert leftovers(tmp_path) == []


def test_a_folder_where_the_corpus_belongs_is_named(tmp_path, corpus_server):
    (tmp_path / "tinyshakespeare" / "input.txt").mkdir(parents=True)
    with pytest.raises(
        MinigptError, match="is a folder where the corpus file belongs; move or delete it"
    ):
        fetch(tmp_path, corpus_server.url("/input.txt?t=folder"))
    assert corpus_server.hits["/input.txt?t=folder"] == 0  # refused before any download


def test_wrong_checksum(tmp_path, corpus_server):
    url = corpus_server.url("/wrong.txt")
    with pytest.raises(MinigptError) as ei:
        fetch(tmp_path, url)
    msg = one_line(str(ei.value))
    assert url in msg and "sha256" in msg and SHA256 in msg and "different file" in msg
    assert leftovers(tmp_path) == []


def test_truncated_body(tmp_path, corpus_server):
    url = corpus_server.url("/truncated.txt")
    with pytest.raises(MinigptError) as ei:
        fetch(tmp_path, url)
    msg = one_line(str(ei.value))
    assert (
        url in msg
        and "cut off" in msg
        and f"{SIZE:,}" in msg
        and "closed the connection early" in msg
    )
    assert leftovers(tmp_path) == []


def test_connection_refused(tmp_path, no_env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/input.txt"  # nothing listens there now
    with pytest.raises(MinigptError) as ei:
        fetch(tmp_path, url, retries=1)
    msg = one_line(str(ei.value))
    assert msg.startswith(f"cannot reach {url} (")
    assert "refused" in msg.lower() and URL_ENV in msg
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("retries", [0, 2])
def test_timeout(tmp_path, retries):
    """A listening socket that never answers: the read times out; retried, the message counts every
    attempt."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        url = f"http://127.0.0.1:{s.getsockname()[1]}/input.txt"
        with pytest.raises(MinigptError) as ei:
            fetch(tmp_path, url, timeout=0.2, retries=retries)
    msg = one_line(str(ei.value))
    assert url in msg and "timed out" in msg, msg
    if retries:
        assert "0.2 s on each of 3 attempts" in msg and " s in all" in msg, msg
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("bad", ["notaurl", "ftp://example.invalid/input.txt", "http://"])
def test_invalid_url(tmp_path, bad):
    with pytest.raises(MinigptError) as ei:
        fetch(tmp_path, bad)
    msg = one_line(str(ei.value))
    assert bad in msg and "URL" in msg
    assert leftovers(tmp_path) == []


# --- an existing file ------------------------------------------------------------


@pytest.mark.parametrize(
    "content", [b"", b"First Citizen:\nBefore we proceed"], ids=["empty", "truncated"]
)
def test_bad_existing_file_replaced(tmp_path, corpus_server, capsys, content):
    dest = tmp_path / "tinyshakespeare" / "input.txt"
    dest.parent.mkdir()
    dest.write_bytes(content)
    path, downloaded = fetch(tmp_path, corpus_server.url("/input.txt"))
    assert (path, downloaded) == (dest, True)
    assert sha(dest) == SHA256
    out, err = capsys.readouterr()
    assert out == ""
    assert f"{dest} fails its checksum; downloading it again" in err
    if content:  # the user's own text is kept aside; an empty file holds nothing to keep
        assert leftovers(tmp_path) == ["tinyshakespeare/input.txt", "tinyshakespeare/input.txt.bak"]
        assert (dest.parent / "input.txt.bak").read_bytes() == content
        assert f"kept the earlier {dest} (it failed the checksum) as {dest}.bak" in err
    else:
        assert leftovers(tmp_path) == ["tinyshakespeare/input.txt"]
        assert ".bak" not in err


def test_backup_takes_a_free_name(tmp_path, corpus_server, capsys):
    """An edited corpus is never lost: a second replacement goes to .bak-1, leaving .bak as it
    was."""
    dest = tmp_path / "tinyshakespeare" / "input.txt"
    dest.parent.mkdir()
    dest.write_text("my first edit\n")
    fetch(tmp_path, corpus_server.url("/input.txt?t=bak1"))
    dest.write_text("my second edit\n")
    fetch(tmp_path, corpus_server.url("/input.txt?t=bak2"))
    assert sha(dest) == SHA256
    assert (dest.parent / "input.txt.bak").read_text() == "my first edit\n"
    assert (dest.parent / "input.txt.bak-1").read_text() == "my second edit\n"
    _, err = capsys.readouterr()
    assert f"as {dest}.bak-1" in err
    # A genuine file replaced with --force needs no backup.
    fetch(tmp_path, corpus_server.url("/input.txt?t=bak3"), force=True)
    assert leftovers(tmp_path) == [
        "tinyshakespeare/input.txt",
        "tinyshakespeare/input.txt.bak",
        "tinyshakespeare/input.txt.bak-1",
    ]


def test_bad_existing_file_kept_on_failure(tmp_path, corpus_server):
    """A failed re-download never deletes what the user had (an edited corpus stays)."""
    dest = tmp_path / "tinyshakespeare" / "input.txt"
    dest.parent.mkdir()
    dest.write_text("edited by hand\n")
    with pytest.raises(MinigptError):
        fetch(tmp_path, corpus_server.url("/missing.txt"))
    assert dest.read_text() == "edited by hand\n"
    assert leftovers(tmp_path) == ["tinyshakespeare/input.txt"]  # no temporary file beside it


@pytest.mark.parametrize("route", ["/missing.txt", "/wrong.txt", "/truncated.txt"])
def test_force_failure_keeps_good_file(tmp_path, corpus_server, corpus_file, route):
    dest = tmp_path / "tinyshakespeare" / "input.txt"
    dest.parent.mkdir()
    dest.write_bytes(corpus_file.read_bytes())
    before = dest.stat()
    with pytest.raises(MinigptError):
        fetch(tmp_path, corpus_server.url(route), force=True)
    assert sha(dest) == SHA256
    after = dest.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert leftovers(tmp_path) == ["tinyshakespeare/input.txt"]


def test_force_redownloads(tmp_path, corpus_server, corpus_file):
    target = "/input.txt?t=force"
    dest = tmp_path / "tinyshakespeare" / "input.txt"
    dest.parent.mkdir()
    dest.write_bytes(corpus_file.read_bytes())
    assert fetch(tmp_path, corpus_server.url(target), force=True) == (dest, True)
    assert corpus_server.hit_count(target) == 1
    assert sha(dest) == SHA256


# --- servers that send too much; partial files of a killed download ----------------

#: How much the endless routes send at most (so that code without the size limit fails, not hangs).
ENDLESS_CAP = 64 * SIZE


@pytest.fixture(scope="module")
def endless_server(corpus_file):
    """A local server whose routes send more than the corpus.

    /endless: the corpus and then more of it, no Content-Length, until the client
    hangs up (or ENDLESS_CAP bytes). /huge-length: announces ENDLESS_CAP bytes and
    sends them. ``sent[path]`` records the bytes written for each request target.
    """
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = corpus_file.read_bytes()
    sent: dict[str, int] = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format, *args):  # noqa: A002
            pass

        def do_GET(self):  # noqa: N802
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            if self.path.startswith("/huge-length"):
                self.send_header("Content-Length", str(ENDLESS_CAP))
            self.send_header("Connection", "close")
            self.end_headers()
            n = 0
            try:
                while n < ENDLESS_CAP:
                    self.wfile.write(body)
                    n += len(body)
                self.wfile.flush()
            except OSError:
                pass  # the client hung up: what it should do
            sent[self.path] = n

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request, client_address):
            pass

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NO_PROXY", "127.0.0.1")
        mp.setenv("no_proxy", "127.0.0.1")
        yield f"http://127.0.0.1:{server.server_address[1]}", sent
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_endless_stream_stops_at_the_expected_size(tmp_path, endless_server):
    base, sent = endless_server
    url = f"{base}/endless?t=1"
    largest = 0

    # Watch the partial file grow: it must never hold more than SIZE bytes.
    def sizes():
        return [p.stat().st_size for p in (tmp_path / "tinyshakespeare").glob(PART_GLOB)]

    import threading

    stop = threading.Event()

    def watch():
        nonlocal largest
        while not stop.is_set():
            try:
                largest = max([largest, *sizes()])
            except OSError:
                pass
            stop.wait(0.001)

    (tmp_path / "tinyshakespeare").mkdir()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with pytest.raises(MinigptError) as ei:
            fetch(tmp_path, url)
    finally:
        stop.set()
        watcher.join()
    msg = one_line(str(ei.value))
    assert url in msg and f"more than the expected {SIZE:,} bytes" in msg and "deleted" in msg, msg
    assert leftovers(tmp_path) == []
    assert largest <= SIZE
    # The client hung up long before the server's cap: the server's writes failed.
    import time

    deadline = (
        time.monotonic() + 120
    )  # the server's thread notes it at once; a loaded machine delays it
    while "/endless?t=1" not in sent and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sent["/endless?t=1"] < ENDLESS_CAP // 2


def test_content_length_other_than_the_corpus_refused(tmp_path, endless_server):
    base, sent = endless_server
    url = f"{base}/huge-length?t=1"
    with pytest.raises(MinigptError) as ei:
        fetch(tmp_path, url)
    msg = one_line(str(ei.value))
    assert (
        url in msg and f"announces {ENDLESS_CAP:,} bytes" in msg and f"expected {SIZE:,}" in msg
    ), msg
    assert leftovers(tmp_path) == []
    assert not (tmp_path / "tinyshakespeare").exists()


def test_stale_partial_files_swept(tmp_path, corpus_server, capsys):
    """Partial files of a killed download go; one a live download holds (locked), or a fresh one,
    stays."""
    import fcntl
    import time

    folder = tmp_path / "tinyshakespeare"
    folder.mkdir()
    old = time.time() - 3600
    stale = [folder / ".input.txt.k1ll3d.part", folder / ".input.txt.0ther.part"]
    for p in stale:
        p.write_bytes(b"x" * 1000)
        os.utime(p, (old, old))
    live = folder / ".input.txt.l1ve.part"
    live.write_bytes(b"y" * 10)
    os.utime(live, (old, old))
    fresh = folder / ".input.txt.fr3sh.part"
    fresh.write_bytes(b"z")
    unrelated = folder / "notes.part"
    unrelated.write_bytes(b"mine")
    os.utime(unrelated, (old, old))
    with open(live, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        fetch(tmp_path, corpus_server.url("/input.txt?t=sweep"))
    assert sha(folder / "input.txt") == SHA256
    assert not any(p.exists() for p in stale)
    assert live.exists() and fresh.exists() and unrelated.exists()
    _, err = capsys.readouterr()
    assert f"removed 2 partial file(s) of an earlier, interrupted download in {folder}" in err


def test_no_torch_import():
    import subprocess
    import sys

    code = "import sys, minigpt_cli.data.download; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert download.DATASET == "tinyshakespeare"


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_termination_during_a_download_leaves_no_partial_file(tmp_path, sig):
    """SIGTERM/SIGHUP while the server trickles bytes: exit 128+N, one line, no .part file left."""
    import signal
    import subprocess
    import sys
    import threading
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        conns = []
        done = threading.Event()

        def trickle():  # an HTTP answer that starts, then sends a byte a second until the test ends
            try:
                c, _ = s.accept()
                conns.append(c)
                c.recv(4096)
                c.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\n\r\n".encode())
                while not done.wait(1):
                    c.sendall(b"x")
            except OSError:
                pass

        threading.Thread(target=trickle, daemon=True).start()
        url = f"http://127.0.0.1:{s.getsockname()[1]}/input.txt"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "minigpt_cli",
                "download",
                "--url",
                url,
                "--data-dir",
                str(tmp_path / "data"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Until the partial file appears or the process ends (an error); the deadline only ends a
        # hang, and holds at 10x a quiet machine's start-up (about 2 s).
        deadline = time.monotonic() + 300
        while (
            time.monotonic() < deadline
            and proc.poll() is None
            and not list((tmp_path / "data").rglob("*.part*"))
        ):
            time.sleep(0.05)
        assert list((tmp_path / "data").rglob("*.part*")), "the download never started writing"
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=300)
        done.set()
        for c in conns:
            c.close()
    assert proc.returncode == 128 + getattr(signal, sig), err
    assert err.strip().splitlines()[-1] == f"stopped by {sig} (no file left half-written)", err
    assert "Traceback" not in err
    assert leftovers(tmp_path / "data") == []
