"""Download a named corpus (:func:`datasets`): streamed, checksummed, written atomically; built
from a downloaded archive where the registry says so; Tiny Shakespeare's fallback
(:func:`download_or_fallback`) where its source cannot be reached.

A network failure is classified in one place (:meth:`_Attempt.failing`), which words it too.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import os
import re
import shlex
import sys
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from http import HTTPStatus
from itertools import takewhile
from pathlib import Path
from typing import IO, Callable, Iterator

import requests
import urllib3
from requests.adapters import HTTPAdapter
from tqdm import tqdm

from .. import paths
from ..errors import MinigptError
from ..fileio import errors_as, os_error_message
from ..paths import CORPUS_FILE, corpus_path
from .corpus import _sha256
from .download_files import install, open_part, sweep_partial_files
from .gutenberg import build_corpus


@dataclass(frozen=True)
class Archive:
    """The ``.tar.gz`` a corpus is built from (:func:`~.gutenberg.build_corpus`): its sha256, size
    in bytes, and the text files taken from it, in order."""

    sha256: str
    size: int
    members: tuple[str, ...]


@dataclass(frozen=True)
class Dataset:
    """A corpus: its folder under ``data/``, default address, sha256 and size in bytes of
    ``input.txt``, mirror variable; the archive it is built from (None: the address serves
    ``input.txt`` itself) and the corpus to use where the default address cannot be reached."""

    name: str
    url: str
    sha256: str
    size: int
    url_env: str
    description: str = ""
    archive: Archive | None = None
    fallback: str | None = None

    @property
    def served_size(self) -> int:
        """Bytes the address serves: the archive's, else the corpus's."""
        return self.archive.size if self.archive else self.size

    @property
    def served_sha256(self) -> str:
        """sha256 of what the address serves: the archive's, else the corpus's."""
        return self.archive.sha256 if self.archive else self.sha256


def datasets() -> dict[str, Dataset]:
    """The corpora ``minigpt download`` knows, by name
    (:func:`~minigpt_cli.paths.dataset_registry`)."""
    return {
        name: Dataset(
            name=name,
            url=e["url"],
            sha256=e["sha256"],
            size=int(e["size"]),
            url_env="MINIGPT_" + re.sub(r"[^A-Z0-9]+", "_", name.upper()) + "_URL",
            description=e.get("description", ""),
            archive=(
                Archive(a["sha256"], int(a["size"]), tuple(a["members"]))
                if (a := e.get("archive"))
                else None
            ),
            fallback=e.get("fallback"),
        )
        for name, e in paths.dataset_registry().items()
    }


class Unreachable(MinigptError):
    """The address could not be reached (no name resolution, connection refused or reset, a
    timeout): the one failure a fallback corpus stands in for. ``reason``: the short cause."""

    def __init__(self, what: str, *, reason: str):
        super().__init__(what)
        self.reason = reason


#: Tiny Shakespeare's folder name, the default dataset.
DATASET = "tinyshakespeare"

_CHUNK = 64 * 1024
_RETRY_STATUSES = (429, 500, 502, 503, 504)


def get_dataset(dataset: str | Dataset) -> Dataset:
    """The :func:`datasets` entry named ``dataset`` (an entry as is). Raises MinigptError: an
    unknown name, listing the known ones."""
    if isinstance(dataset, Dataset):
        return dataset
    known = datasets()
    if dataset not in known:
        raise MinigptError(f"unknown dataset {dataset!r}; known datasets: {', '.join(known)}")
    return known[dataset]


def resolve_url(url: str | None = None, dataset: str | Dataset = DATASET) -> str:
    """``url`` (``--url``), else the dataset's variable, else its default; a blank value is not
    given."""
    ds = get_dataset(dataset)
    if url is not None and url.strip():
        return url.strip()
    return os.environ.get(ds.url_env, "").strip() or ds.url


def file_ok(path: str | Path, dataset: str | Dataset = DATASET) -> bool:
    """Whether ``path`` is a readable regular file holding exactly the genuine corpus of
    ``dataset``."""
    ds, p = get_dataset(dataset), Path(path)
    with suppress(OSError, MinigptError):  # unreadable: not OK
        return (
            p.is_file() and p.stat().st_size == ds.size and _sha256(p, lambda n: None) == ds.sha256
        )
    return False


def url_corpus_on_disk(data_dir: str | Path, dataset: str, url: str | None) -> bool:
    """Whether ``data.url`` is set while the named corpus is already on disk and genuine (so not
    fetched)."""
    return bool(url and url.strip()) and file_ok(corpus_path(data_dir, dataset), dataset)


# ----------------------------------------------------------------------------- network


def _session(retries: int, backoff_factor: float) -> requests.Session:
    """A session that retries failed connections and 429/5xx answers to GET, then hands back the
    last answer (no RetryError), so the message can say "HTTP 503 Service Unavailable"."""
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
    """A short reason for a network failure: the operating system's error ("Connection refused")
    first, a phrase for a body cut short or a timeout, else the outermost message."""
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

    @property
    def fix(self) -> str:
        return f"check the URL or {self.hint}"

    @contextmanager
    def failing(self, phase: str) -> Iterator[None]:
        """Turn a network failure that ends ``phase`` ("request" or "read") into its one-line
        :class:`MinigptError` (first match wins)."""
        try:
            yield
        except MinigptError:
            raise
        except Exception as exc:
            reason = _reason(exc, self.timeout, self.retries, time.monotonic() - self.started)
            failure = self._failure(phase, exc, reason)
            if failure is exc:  # not a network failure: a bug keeps its traceback
                raise
            raise failure from None

    def _failure(self, phase: str, exc: Exception, reason: str) -> Exception:
        url = self.url
        if phase == "read":
            # ChunkedEncodingError (IncompleteRead / ProtocolError), ConnectionError (reset,
            # timeout).
            if isinstance(exc, requests.exceptions.ContentDecodingError):
                return MinigptError(
                    f"download of {url} sent a {self.encoding} body that does not decode; "
                    f"the mirror serves a damaged file; {self.fix}"
                )
            if isinstance(exc, (requests.RequestException, urllib3.exceptions.HTTPError, OSError)):
                of_total = f" of {self.total:,}" if self.total is not None else ""
                return MinigptError(
                    f"download of {url} was cut off after {self.received:,}{of_total} bytes "
                    f"({reason}); try again or {self.hint}"
                )
            return exc
        if isinstance(exc, requests.HTTPError):  # raise_for_status: the answer is an HTTP error
            code, phrase = exc.response.status_code, exc.response.reason
            phrase = phrase or next((s.phrase for s in HTTPStatus if s == code), "")
            status = _one_line(f"HTTP {code} {phrase}")
            return MinigptError(f"download of {url} failed: {status}; {self.fix}")
        invalid = (
            requests.exceptions.MissingSchema,
            requests.exceptions.InvalidSchema,
            requests.exceptions.InvalidURL,
        )
        if isinstance(exc, invalid):
            return MinigptError(
                f"cannot download {url!r}: not a valid http(s) URL ({_one_line(exc)}); pass a full "
                f"https://... address with --url, data.url or in {self.ds.url_env}"
            )
        if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
            return Unreachable(
                f"cannot reach {url} ({reason}); check your network, {self.hint}, or copy the "
                f"file to {self.dest}",
                reason=reason,
            )
        if isinstance(exc, requests.RequestException):
            return MinigptError(f"download of {url} failed ({reason}); {self.fix}")
        return exc

    def check(self, resp: requests.Response) -> None:
        """Refuse a Content-Length other than the dataset's size (gzip's counts compressed bytes:
        not compared)."""
        self.encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
        with suppress(KeyError, ValueError):
            if self.encoding in ("", "identity"):
                self.total = int(resp.headers["Content-Length"])
        if self.total is not None and self.total != self.ds.served_size:
            raise MinigptError(
                f"download of {self.url} announces {self.total:,} bytes (Content-Length), expected "
                f"{self.ds.served_size:,}; the mirror serves a different file; {self.fix}"
            )

    def _chunks(self, resp: requests.Response) -> Iterator[bytes]:
        with self.failing("read"):
            yield from (chunk for chunk in resp.iter_content(chunk_size=_CHUNK) if chunk)

    def save(self, resp: requests.Response, progress: bool | None) -> None:
        """Stream the body into :attr:`part` with a tqdm bar on stderr, fsync it, and check its
        sha256 (the backstop naming a body cut short)."""
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
                    self.received + len(chunk) > self.ds.served_size
                )  # a server streaming without end: not on disk
                if over:
                    break
                f.write(chunk)
                digest.update(chunk)
                self.received += len(chunk)
                bar.update(len(chunk))
            f.flush()
            os.fsync(f.fileno())
        if over or digest.hexdigest() != self.ds.served_sha256:
            short = self.total is not None and self.received < self.total
            if over:
                raise MinigptError(
                    f"download of {self.url} sent more than the expected "
                    f"{self.ds.served_size:,} bytes; stopped and deleted the partial file; the "
                    f"mirror serves a different file; {self.fix}"
                )
            if short:
                raise MinigptError(
                    f"download of {self.url} was cut off after {self.received:,} of "
                    f"{self.total:,} bytes; try again or {self.hint}"
                )
            raise MinigptError(
                f"download of {self.url} has sha256 {digest.hexdigest()} ({self.received:,} "
                f"bytes), expected {self.ds.served_sha256} ({self.ds.served_size:,} bytes); the "
                f"mirror serves a different file; {self.fix}"
            )


def _build(ds: Dataset, archive: Path, dest: Path, url: str) -> IO[bytes]:
    """The corpus built from ``archive`` (:func:`~.gutenberg.build_corpus`), checked against the
    registry's size and sha256, in a new partial file beside ``dest`` (closed). Raises
    MinigptError: a built file other than the registry's."""
    assert ds.archive is not None
    text = build_corpus(archive, ds.archive.members)
    digest = hashlib.sha256(text).hexdigest()
    if len(text) != ds.size or digest != ds.sha256:  # the archive matched: the build changed
        raise MinigptError(
            f"the {ds.name} corpus built from {url} has sha256 {digest} ({len(text):,} bytes), "
            f"expected {ds.sha256} ({ds.size:,} bytes); this minigpt builds it differently from "
            "the one that pinned it: report it, and copy a genuine file into "
            f"{dest} meanwhile"
        )
    part = open_part(dest)
    with part:
        part.write(text)
        part.flush()
        os.fsync(part.fileno())
    return part


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
    """Stream ``url`` into ``dest`` atomically; return where a differing file at ``dest`` was kept,
    or None."""
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
            if ds.archive is not None:  # the archive is checked: build the corpus, then drop it
                archive, att.part = att.part, None
                try:
                    att.part = _build(ds, Path(archive.name), dest, att.url)
                finally:
                    os.remove(archive.name)
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
    """Make sure ``<data_dir>/<dataset>/input.txt`` holds the genuine corpus; return ``(path,
    downloaded now)``. ``timeout``: seconds to connect and between bytes; ``mirror_hint``: how the
    user names another mirror. A failure leaves no new file or folder behind. Raises MinigptError:
    the URL, the problem and the fix, or the file."""
    ds = get_dataset(dataset)
    url = resolve_url(url, ds)
    path = corpus_path(data_dir, ds.name)
    unreadable = path.is_file() and not os.access(path, os.R_OK)
    if path.is_dir() or unreadable:  # the user's to fix, never replaced as a failed checksum
        raise MinigptError(
            os_error_message(OSError(errno.EACCES, os.strerror(errno.EACCES)), path, "read")
            if unreadable
            else f"{path} is a folder where the corpus file belongs; move or delete it, then rerun"
        )
    if path.parent.is_dir() and (
        swept := sweep_partial_files(path.parent)
    ):  # even when the corpus is there
        tqdm.write(
            f"removed {len(swept)} partial file(s) of an earlier, interrupted download in "
            f"{path.parent}",
            file=sys.stderr,
        )
    exists = path.exists()
    good = exists and file_ok(path, ds)
    if good and not force:
        return path, False
    if exists and not good and not force:
        tqdm.write(f"{path} fails its checksum; downloading it again", file=sys.stderr)
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
        tqdm.write(f"kept the earlier {path} (it failed the checksum) as {backup}", file=sys.stderr)
    return path, True


def download_or_fallback(
    dataset: str | Dataset,
    data_dir: str | Path = "data",
    url: str | None = None,
    *,
    log: Callable[[str], None],
    action: str = "using",
    force: bool = False,
    progress: bool | None = None,
    mirror_hint: str | None = None,
) -> tuple[Dataset, Path, bool]:
    """:func:`download` ``dataset``, or its registry ``fallback`` where the dataset's default
    address cannot be reached (:class:`Unreachable`: no name resolution, refused, timed out), said
    in one ``log`` line that begins "note: cannot reach ..., so {action} <fallback>". Returns ``(the
    dataset used, path, downloaded now)``. A mirror the user named (``url``, the dataset's
    variable) never falls back, nor does a wrong file: those failures are the user's to see.

    Raises:
        MinigptError: as :func:`download` does; both addresses unreachable: one line naming both.
    """
    ds = get_dataset(dataset)
    fetch = dict(force=force, progress=progress)
    try:
        return ds, *download(ds, data_dir, url, mirror_hint=mirror_hint, **fetch)
    except Unreachable as exc:
        if ds.fallback is None or resolve_url(url, ds) != ds.url:
            raise
        primary = exc
    here = corpus_path(data_dir, ds.name)
    if force and here.is_file() and file_ok(here, ds):  # --force, and a good copy is already here
        raise MinigptError(
            f"cannot reach {_redact(ds.url)} ({primary.reason}) to fetch {ds.name} again; "
            f"{here} is kept as it was (sha256 verified)",
            f"drop --force to use it, or set {ds.url_env} to a mirror",
        )
    alt = get_dataset(ds.fallback)
    log(
        f"note: cannot reach {_redact(ds.url)} ({primary.reason}), so {action} {alt.name} "
        f"({alt.description}), not {ds.description}, whose figures the docs quote; for "
        f"{ds.name}, put its {CORPUS_FILE} there (mkdir -p {shlex.quote(str(here.parent))} && cp "
        f"PATH/{CORPUS_FILE} {shlex.quote(str(here.parent) + '/')}) or set {ds.url_env} to a "
        "mirror (docs/offline.md)"
    )
    try:
        return alt, *download(alt, data_dir, **fetch)
    except Unreachable as exc:
        raise MinigptError(
            f"cannot reach {_redact(ds.url)} ({primary.reason}), nor its fallback "
            f"{_redact(resolve_url(None, alt))} ({exc.reason})",
            f"check your network, set {ds.url_env} to a mirror, or copy the file to "
            f"{corpus_path(data_dir, ds.name)}",
        ) from None
