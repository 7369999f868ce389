"""Download a named corpus (:func:`datasets`): streamed, checksummed, written atomically.

A network failure is classified in one place (:data:`_FAILURES`); :data:`_MESSAGES` holds the text.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import os
import re
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from http import HTTPStatus
from itertools import takewhile
from pathlib import Path
from typing import IO, Iterator

import requests
import urllib3
from requests.adapters import HTTPAdapter
from tqdm import tqdm

from .. import paths
from ..errors import MinigptError
from ..fileio import errors_as, os_error_message
from ..paths import corpus_path
from .corpus import _sha256
from .download_files import install, open_part, sweep_partial_files


@dataclass(frozen=True)
class Dataset:
    """A corpus: its folder under ``data/``, default address, sha256, size in bytes and mirror variable."""

    name: str
    url: str
    sha256: str
    size: int
    url_env: str


def datasets() -> dict[str, Dataset]:
    """The corpora ``minigpt download`` knows, by name (:func:`~minigpt_cli.paths.dataset_registry`)."""
    return {
        name: Dataset(
            name=name,
            url=e["url"],
            sha256=e["sha256"],
            size=int(e["size"]),
            url_env="MINIGPT_" + re.sub(r"[^A-Z0-9]+", "_", name.upper()) + "_URL",
        )
        for name, e in paths.dataset_registry().items()
    }


#: Tiny Shakespeare's folder name, the default dataset.
DATASET = "tinyshakespeare"

_CHUNK = 64 * 1024
_RETRY_STATUSES = (429, 500, 502, 503, 504)

#: Every message a download gives, by kind; the fields are those of :meth:`_Attempt.error`.
_MESSAGES = {
    "invalid_url": "cannot download {url!r}: not a valid http(s) URL ({detail}); pass a full https://... "
    "address with --url, data.url or in {env}",
    "unreachable": "cannot reach {url} ({reason}); check your network or {hint}",
    "request_failed": "download of {url} failed ({reason}); {fix}",
    "http_status": "download of {url} failed: {status}; {fix}",
    "wrong_length": "download of {url} announces {total:,} bytes (Content-Length), expected {size:,}; "
    "the mirror serves a different file; {fix}",
    "too_long": "download of {url} sent more than the expected {size:,} bytes; stopped and deleted the "
    "partial file; the mirror serves a different file; {fix}",
    "bad_encoding": "download of {url} sent a {encoding} body that does not decode; the mirror serves a "
    "damaged file; {fix}",
    "cut_off": "download of {url} was cut off after {received:,}{of_total} bytes ({reason}); try again or {hint}",
    "cut_short": "download of {url} was cut off after {received:,} of {total:,} bytes; try again or {hint}",
    "checksum": "download of {url} has sha256 {got} ({received:,} bytes), expected {sha256} ({size:,} bytes); "
    "the mirror serves a different file; {fix}",
    "is_folder": "{path} is a folder where the corpus file belongs; move or delete it, then rerun",
    "unknown_dataset": "unknown dataset {name!r}; known datasets: {known}",
    # Notices on stderr, not errors.
    "swept": "removed {n} partial file(s) of an earlier, interrupted download in {folder}",
    "refetch": "{path} fails its checksum; downloading it again",
    "backup": "kept the earlier {path} (it failed the checksum) as {backup}",
}

#: The network failures of a download's request and of its body's read, by exception (first match wins): their kind.
_FAILURES: dict[str, tuple[tuple[tuple[type, ...], str], ...]] = {
    "request": (
        ((requests.HTTPError,), "http_status"),  # raise_for_status: the answer is an HTTP error
        (
            (
                requests.exceptions.MissingSchema,
                requests.exceptions.InvalidSchema,
                requests.exceptions.InvalidURL,
            ),
            "invalid_url",
        ),
        ((requests.ConnectionError, requests.Timeout), "unreachable"),
        ((requests.RequestException,), "request_failed"),
    ),
    # ChunkedEncodingError (IncompleteRead / ProtocolError), ConnectionError (reset, read timeout).
    "read": (
        ((requests.exceptions.ContentDecodingError,), "bad_encoding"),
        ((requests.RequestException, urllib3.exceptions.HTTPError, OSError), "cut_off"),
    ),
}


def get_dataset(dataset: str | Dataset) -> Dataset:
    """The :func:`datasets` entry named ``dataset`` (an entry as is). Raises MinigptError: an unknown name, listing the
    known ones."""
    if isinstance(dataset, Dataset):
        return dataset
    known = datasets()
    if dataset not in known:
        raise MinigptError(
            _MESSAGES["unknown_dataset"].format(name=dataset, known=", ".join(known))
        )
    return known[dataset]


def resolve_url(url: str | None = None, dataset: str | Dataset = DATASET) -> str:
    """``url`` (``--url``), else the dataset's variable, else its default; a blank value is not given."""
    ds = get_dataset(dataset)
    if url is not None and url.strip():
        return url.strip()
    return os.environ.get(ds.url_env, "").strip() or ds.url


def file_ok(path: str | Path, dataset: str | Dataset = DATASET) -> bool:
    """Whether ``path`` is a readable regular file holding exactly the genuine corpus of ``dataset``."""
    ds, p = get_dataset(dataset), Path(path)
    with suppress(OSError, MinigptError):  # unreadable: not OK
        return (
            p.is_file() and p.stat().st_size == ds.size and _sha256(p, lambda n: None) == ds.sha256
        )
    return False


def url_corpus_on_disk(data_dir: str | Path, dataset: str, url: str | None) -> bool:
    """Whether ``data.url`` is set while the named corpus is already on disk and genuine (so not fetched)."""
    return bool(url and url.strip()) and file_ok(corpus_path(data_dir, dataset), dataset)


# ----------------------------------------------------------------------------- network


def _session(retries: int, backoff_factor: float) -> requests.Session:
    """A session that retries failed connections and 429/5xx answers to GET, then hands back the last
    answer (no RetryError), so the message can say "HTTP 503 Service Unavailable"."""
    retry = urllib3.util.Retry(
        total=retries,
        backoff_factor=backoff_factor,
        status_forcelist=_RETRY_STATUSES,
        allowed_methods=["GET"],
        raise_on_status=False,
    )
    session, adapter = requests.Session(), HTTPAdapter(max_retries=retry)
    for scheme in ("http://", "https://"):
        session.mount(scheme, adapter)
    return session


def _one_line(text: object, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """Every exception reachable from ``exc``: causes, contexts, ``.reason``, args."""
    seen: set[int] = set()
    stack: list[object] = [exc]
    while stack:
        e = stack.pop()
        if isinstance(e, BaseException) and id(e) not in seen:
            seen.add(id(e))
            yield e
            stack.extend(
                [
                    *(a for a in e.args if isinstance(a, BaseException)),
                    getattr(e, "reason", None),
                    e.__context__,
                    e.__cause__,
                ]
            )


def _reason(exc: BaseException, timeout: float, retries: int, elapsed: float) -> str:
    """A short reason for a network failure: the operating system's error ("Connection refused") first, a
    phrase for a body cut short or a timeout, else the outermost message."""
    chain = list(_chain(exc))
    if any(isinstance(e, http.client.IncompleteRead) for e in chain):
        return "the server closed the connection early"
    for e in chain:  # requests' exceptions subclass OSError too; we want the socket's own error.
        if (
            isinstance(e, OSError)
            and not isinstance(e, (requests.RequestException, TimeoutError))
            and (e.strerror or str(e))
        ):
            return _one_line(e.strerror or str(e))
    # NewConnectionError subclasses ConnectTimeoutError, hence the OSError pass first.
    if any(
        isinstance(e, (requests.Timeout, urllib3.exceptions.TimeoutError, TimeoutError))
        for e in chain
    ):
        # Retry raises MaxRetryError only once its total is spent: after retries + 1 attempts.
        if retries and any(isinstance(e, urllib3.exceptions.MaxRetryError) for e in chain):
            return (
                f"timed out: no answer within {timeout:g} s on each of {retries + 1} attempts, "
                f"{elapsed:.{1 if elapsed < 10 else 0}f} s in all"
            )
        return f"timed out after {timeout:g} s"
    return _one_line(str(exc) or type(exc).__name__)


def _redact(url: str) -> str:
    """``url`` for messages: a password in it (``user:secret@host``) shown as ``***``."""
    return re.sub(r"^([^:/?#]+://[^/?#@:]*:)[^/?#@]*@", r"\1***@", url, count=1)


# ----------------------------------------------------------------------------- one download


@dataclass
class _Attempt:
    """One download under way: what it has received so far, and the messages its failures get."""

    ds: Dataset
    url: str  # redacted: for messages only
    dest: Path
    hint: str
    timeout: float
    retries: int
    started: float = 0.0
    total: int | None = None  # the announced Content-Length
    received: int = 0
    encoding: str = "identity"
    part: IO[bytes] | None = None

    def error(self, kind: str, exc: BaseException | None = None, **extra: object) -> MinigptError:
        """The :class:`MinigptError` of :data:`_MESSAGES` ``[kind]``, filled from this download and ``exc``."""
        fields = dict(
            url=self.url,
            env=self.ds.url_env,
            hint=self.hint,
            fix=f"check the URL or {self.hint}",
            size=self.ds.size,
            sha256=self.ds.sha256,
            total=self.total,
            received=self.received,
            encoding=self.encoding,
            of_total=f" of {self.total:,}" if self.total is not None else "",
        )
        if exc is not None:
            elapsed = time.monotonic() - self.started
            fields.update(
                detail=_one_line(exc), reason=_reason(exc, self.timeout, self.retries, elapsed)
            )
        if isinstance(exc, requests.HTTPError):
            code, phrase = exc.response.status_code, exc.response.reason
            phrase = phrase or next((s.phrase for s in HTTPStatus if s == code), "")
            fields.update(status=_one_line(f"HTTP {code} {phrase}"))
        return MinigptError(_MESSAGES[kind].format(**fields, **extra))

    def failing(self, phase: str) -> errors_as:
        """A network failure that ends ``phase`` (:data:`_FAILURES`) as its one-line :class:`MinigptError`."""
        return errors_as(
            {
                types: lambda exc, kind=kind: self.error(kind, exc)
                for types, kind in _FAILURES[phase]
            }
        )

    def check(self, resp: requests.Response) -> None:
        """Refuse a Content-Length other than the dataset's size (gzip's counts compressed bytes: not compared)."""
        self.encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
        with suppress(KeyError, ValueError):
            if self.encoding in ("", "identity"):
                self.total = int(resp.headers["Content-Length"])
        if self.total is not None and self.total != self.ds.size:
            raise self.error("wrong_length")

    def _chunks(self, resp: requests.Response) -> Iterator[bytes]:
        with self.failing("read"):
            yield from (chunk for chunk in resp.iter_content(chunk_size=_CHUNK) if chunk)

    def save(self, resp: requests.Response, progress: bool | None) -> None:
        """Stream the body into :attr:`part` with a tqdm bar on stderr, fsync it, and check its sha256 (the
        backstop naming a body cut short)."""
        digest, over = hashlib.sha256(), False
        with (
            self.part as f,
            tqdm(
                total=self.total,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                leave=False,
                desc=str(self.dest),
                file=sys.stderr,
                disable=None if progress is None else not progress,
            ) as bar,
        ):  # None: a terminal
            for chunk in self._chunks(resp):
                over = (
                    self.received + len(chunk) > self.ds.size
                )  # a server streaming without end: not on disk
                if over:
                    break
                f.write(chunk)
                digest.update(chunk)
                self.received += len(chunk)
                bar.update(len(chunk))
            f.flush()
            os.fsync(f.fileno())
        if over or digest.hexdigest() != self.ds.sha256:
            short = self.total is not None and self.received < self.total
            raise self.error(
                "too_long" if over else "cut_short" if short else "checksum", got=digest.hexdigest()
            )


def _fetch(
    ds: Dataset,
    url: str,
    dest: Path,
    *,
    progress: bool | None,
    timeout: float,
    retries: int,
    backoff_factor: float,
    mirror_hint: str,
) -> Path | None:
    """Stream ``url`` into ``dest`` atomically; return where a differing file at ``dest`` was kept, or None."""
    att = _Attempt(ds, _redact(url), dest, mirror_hint, timeout, retries)
    created = list(
        takewhile(lambda d: not d.exists() and d != d.parent, [dest.parent, *dest.parent.parents])
    )
    # The network's failures are MinigptErrors by now: an OSError is a file that cannot be written.
    written = errors_as(
        {
            OSError: lambda exc: MinigptError(
                os_error_message(exc, None if exc.filename else dest, "write")
            )
        }
    )
    try:
        with written, _session(retries, backoff_factor) as session:
            att.started = time.monotonic()
            with att.failing("request"):
                resp = session.get(url, stream=True, timeout=timeout)
                resp.raise_for_status()
            with resp:
                att.check(resp)
                att.part = open_part(dest)
                att.save(resp, progress)
            backup = install(att.part.name, dest, genuine=lambda p: file_ok(p, ds))
            att.part = None
            return backup
    finally:
        # Leave no trace of a failed download: the partial file and the (now empty) folders we made,
        # deepest first; after a success the part is installed and the folder holds it.
        with suppress(OSError):
            if att.part is not None:
                os.remove(att.part.name)
        with suppress(OSError):
            for d in created:
                d.rmdir()


def download(
    dataset: str | Dataset,
    data_dir: str | Path = "data",
    url: str | None = None,
    force: bool = False,
    progress: bool | None = None,
    timeout: float = 30.0,
    retries: int = 3,
    backoff_factor: float = 0.5,
    mirror_hint: str | None = None,
) -> tuple[Path, bool]:
    """Make sure ``<data_dir>/<dataset>/input.txt`` holds the genuine corpus; return ``(path, downloaded now)``.
    ``timeout``: seconds to connect and between bytes; ``mirror_hint``: how the user names another mirror. A failure
    leaves no new file or folder behind. Raises MinigptError: the URL, the problem and the fix, or the file."""
    ds = get_dataset(dataset)
    url = resolve_url(url, ds)
    path = corpus_path(data_dir, ds.name)
    unreadable = path.is_file() and not os.access(path, os.R_OK)
    if path.is_dir() or unreadable:  # the user's to fix, never replaced as a failed checksum
        raise MinigptError(
            os_error_message(OSError(errno.EACCES, os.strerror(errno.EACCES)), path, "read")
            if unreadable
            else _MESSAGES["is_folder"].format(path=path)
        )
    if path.parent.is_dir() and (
        swept := sweep_partial_files(path.parent)
    ):  # even when the corpus is there
        tqdm.write(_MESSAGES["swept"].format(n=len(swept), folder=path.parent), file=sys.stderr)
    exists = path.exists()
    good = exists and file_ok(path, ds)
    if good and not force:
        return path, False
    if exists and not good and not force:
        tqdm.write(_MESSAGES["refetch"].format(path=path), file=sys.stderr)
    backup = _fetch(
        ds,
        url,
        path,
        progress=progress,
        timeout=timeout,
        retries=retries,
        backoff_factor=backoff_factor,
        mirror_hint=mirror_hint or f"set {ds.url_env} to a mirror",
    )
    if backup is not None:
        tqdm.write(_MESSAGES["backup"].format(path=path, backup=backup), file=sys.stderr)
    return path, True
