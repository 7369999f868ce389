"""Download Tiny Shakespeare: streamed, checksummed, written atomically.

The corpus (1,115,394 bytes) comes from the char-rnn repository's raw file
address, or from a mirror given by ``--url`` or ``$MINIGPT_TINYSHAKESPEARE_URL``.
The body is streamed into a temporary file beside the target while its sha256
is computed, then fsynced and renamed over ``data/tinyshakespeare/input.txt``,
so a reader never sees half a file. Nothing is printed to stdout: the progress
bar and notices go to stderr and the CLI reports the result.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import tempfile
import time
import urllib.parse
from http import HTTPStatus
from pathlib import Path

import requests
import urllib3
from requests.adapters import HTTPAdapter
from tqdm import tqdm

try:
    import fcntl
except ImportError:  # not on Windows: stale partial files are then judged by age alone
    fcntl = None

from .errors import MinigptError
from .paths import CORPUS_FILE, corpus_path

#: Where the corpus is fetched from unless ``--url`` or :data:`URL_ENV` say otherwise.
DEFAULT_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
#: Environment variable naming a mirror of the corpus.
URL_ENV = "MINIGPT_TINYSHAKESPEARE_URL"
#: sha256 of the genuine corpus.
SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
#: Size of the genuine corpus in bytes.
SIZE = 1_115_394
#: Name of the dataset folder under ``data/``.
DATASET = "tinyshakespeare"

_CHUNK = 64 * 1024
_RETRY_STATUSES = (429, 500, 502, 503, 504)
_MIRROR_HINT = f"set {URL_ENV} to a mirror"
#: Glob of the temporary files a download streams into (``NamedTemporaryFile`` names).
PART_GLOB = f".{CORPUS_FILE}.*.part"
#: A partial file modified this recently may belong to a download still running.
_STALE_AFTER_S = 5.0 if fcntl is not None else 3600.0


def resolve_url(url: str | None = None) -> str:
    """The address to download from: ``url``, else the env var, else the default.

    The order is ``url``, then ``$MINIGPT_TINYSHAKESPEARE_URL``, then
    :data:`DEFAULT_URL`. Empty or blank values count as not given.

    Args:
        url: an explicit address (the CLI's ``--url``), or None.
    """
    if url is not None and url.strip():
        return url.strip()
    env = os.environ.get(URL_ENV, "").strip()
    return env or DEFAULT_URL


def _sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_ok(path: str | Path) -> bool:
    """True when ``path`` is a regular file holding exactly the genuine corpus.

    The size is compared first, so a wrong file is rejected without hashing it.
    An unreadable file counts as not OK.

    Args:
        path: the file to check.
    """
    p = Path(path)
    try:
        if not p.is_file() or p.stat().st_size != SIZE:
            return False
        return _sha256_of(p) == SHA256
    except OSError:
        return False


class _Retry(urllib3.util.Retry):
    """urllib3's Retry, whose final MaxRetryError says how many ``attempts`` were made."""

    def increment(self, *args, **kwargs):
        try:
            return super().increment(*args, **kwargs)
        except urllib3.exceptions.MaxRetryError as exc:
            exc.attempts = len(self.history) + 1  # each earlier failure left one history entry
            raise


def _session(retries: int, backoff_factor: float) -> requests.Session:
    """A session that retries failed connections and 429/5xx answers to GET."""
    retry = _Retry(
        total=retries,
        backoff_factor=backoff_factor,
        status_forcelist=_RETRY_STATUSES,
        allowed_methods=["GET"],
        # Hand back the last 5xx response instead of raising RetryError, so the
        # message can say "HTTP 503 Service Unavailable".
        raise_on_status=False,
    )
    session = requests.Session()
    adapter = HTTPAdapter(max_retries=retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _chain(exc: BaseException):
    """Every exception reachable from ``exc``: causes, contexts, ``.reason``, args."""
    seen: set[int] = set()
    stack: list[object] = [exc]
    while stack:
        e = stack.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        stack.extend(a for a in e.args if isinstance(a, BaseException))
        stack.extend([getattr(e, "reason", None), e.__context__, e.__cause__])


def _reason(exc: BaseException, timeout: float, elapsed: float | None = None) -> str:
    """A short, one-line reason for a network failure.

    requests wraps urllib3 which wraps the socket error, and the outer messages
    are long reprs of connection objects. Prefer the operating system's error
    ("Connection refused", "Name or service not known"); a body cut short and
    a timeout get a plain phrase; otherwise the outermost message, on one line.
    A timeout that urllib3 retried until its retries ran out says how many
    attempts there were and, given ``elapsed``, how long they took in all.
    """
    chain = list(_chain(exc))
    if any(isinstance(e, http.client.IncompleteRead) for e in chain):
        return "the server closed the connection early"
    for e in chain:
        # requests' exceptions subclass OSError too; we want the socket's own error.
        if (
            isinstance(e, OSError)
            and not isinstance(e, (requests.RequestException, TimeoutError))
            and (e.strerror or str(e))
        ):
            return _one_line(e.strerror or str(e))
    # NewConnectionError subclasses ConnectTimeoutError, hence the OSError pass first.
    for e in chain:
        if isinstance(e, (requests.Timeout, urllib3.exceptions.TimeoutError, TimeoutError)):
            retry = next((r for r in chain if isinstance(r, urllib3.exceptions.MaxRetryError)), None)
            attempts = getattr(retry, "attempts", None) if retry is not None else None
            if attempts and attempts > 1:
                total = f", {elapsed:.{1 if elapsed < 10 else 0}f} s in all" if elapsed is not None else ""
                return f"timed out: no answer within {timeout:g} s on each of {attempts} attempts{total}"
            return f"timed out after {timeout:g} s"
    return _one_line(str(exc) or type(exc).__name__)


def _file_mode() -> int:
    """The mode a newly created regular file gets under the current umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _missing_dirs(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    d = folder
    while not d.exists() and d != d.parent:
        missing.append(d)
        d = d.parent
    return missing


def sweep_partial_files(folder: Path) -> list[Path]:
    """Delete the partial downloads (:data:`PART_GLOB`) that a killed earlier download left in ``folder``.

    A running download holds an exclusive ``flock`` on its partial file (and
    writes to it), so only files that are unlocked and were not modified in the
    last few seconds are removed; without ``fcntl`` only files an hour old are.
    Files that cannot be removed are left alone.

    Returns:
        The files removed.
    """
    removed = []
    try:
        candidates = sorted(folder.glob(PART_GLOB))
    except OSError:
        return removed
    now = time.time()
    for part in candidates:
        try:
            if not part.is_file() or part.is_symlink() or now - part.stat().st_mtime < _STALE_AFTER_S:
                continue
            with open(part, "rb") as f:
                if fcntl is not None:
                    try:
                        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except OSError:
                        continue  # a live download holds it
                part.unlink()
            removed.append(part)
        except OSError:
            continue
    return removed


def _backup_name(path: Path) -> Path:
    """``input.txt.bak``, else the first free ``input.txt.bak-N`` (N = 1, 2, ...)."""
    bak = path.with_name(path.name + ".bak")
    n = 0
    while os.path.lexists(bak):
        n += 1
        bak = path.with_name(f"{path.name}.bak-{n}")
    return bak


def _back_up(path: Path) -> Path | None:
    """Keep the user's own file at ``path`` (one that fails the checksum) under a backup name.

    It is hard-linked to the backup name, so ``path`` itself stays in place until
    the verified download is renamed over it; where links are not possible it
    is renamed. Nothing is kept for an absent, empty or genuine file, or a symlink
    (replacing a link leaves the file it points to untouched).

    Returns:
        The backup path, or None when nothing needed keeping.

    Raises:
        OSError: the backup could not be made.
    """
    if path.is_symlink() or not path.is_file() or path.stat().st_size == 0 or file_ok(path):
        return None
    for _ in range(100):
        bak = _backup_name(path)
        try:
            os.link(path, bak, follow_symlinks=False)
            return bak
        except FileExistsError:
            continue  # taken meanwhile: pick the next name
        except OSError:
            if os.path.lexists(bak):
                continue
            os.rename(path, bak)
            return bak
    raise OSError(f"no free backup name beside {path}")


def _redact(url: str) -> str:
    """``url`` for messages: a password in it (``user:secret@host``) shown as ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _fetch(url: str, dest: Path, *, progress: bool | None, timeout: float, retries: int,
           backoff_factor: float, mirror_hint: str = _MIRROR_HINT) -> Path | None:
    """Stream ``url`` into ``dest`` atomically; see :func:`download_tinyshakespeare`.

    Returns:
        Where a differing file that was at ``dest`` was kept, or None.
    """
    real_url, url = url, _redact(url)  # ``url`` from here on is for messages only
    fix_url = f"check the URL or {mirror_hint}"
    created = _missing_dirs(dest.parent)
    if not created:
        swept = sweep_partial_files(dest.parent)
        if swept:
            tqdm.write(f"removed {len(swept)} partial file(s) of an earlier, interrupted download "
                       f"in {dest.parent}", file=sys.stderr)
    tmp_name: str | None = None
    try:
        with _session(retries, backoff_factor) as session:
            started = time.monotonic()
            try:
                resp = session.get(real_url, stream=True, timeout=timeout)
            except (requests.exceptions.MissingSchema, requests.exceptions.InvalidSchema,
                    requests.exceptions.InvalidURL) as e:
                raise MinigptError(
                    f"cannot download {url!r}: not a valid http(s) URL ({_one_line(e)}); "
                    f"pass a full https://... address with --url or in {URL_ENV}"
                ) from None
            except (requests.ConnectionError, requests.Timeout) as e:
                raise MinigptError(
                    f"cannot reach {url} ({_reason(e, timeout, time.monotonic() - started)}); "
                    f"check your network or {mirror_hint}"
                ) from None
            except requests.RequestException as e:
                raise MinigptError(
                    f"download of {url} failed ({_reason(e, timeout)}); {fix_url}"
                ) from None

            with resp:
                if not 200 <= resp.status_code < 300:
                    phrase = resp.reason
                    if not phrase:
                        try:
                            phrase = HTTPStatus(resp.status_code).phrase
                        except ValueError:
                            phrase = ""
                    status = _one_line(f"HTTP {resp.status_code} {phrase or ''}")
                    raise MinigptError(f"download of {url} failed: {status}; {fix_url}")

                # With Content-Encoding (gzip), Content-Length counts compressed
                # bytes while iter_content yields decoded ones: no total then.
                total = None
                encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
                if encoding in ("", "identity"):
                    try:
                        total = int(resp.headers["Content-Length"])
                    except (KeyError, ValueError):
                        total = None
                if total is not None and total != SIZE:
                    raise MinigptError(
                        f"download of {url} announces {total:,} bytes (Content-Length), expected "
                        f"{SIZE:,}; the mirror serves a different file; {fix_url}"
                    )

                try:
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    tmp = tempfile.NamedTemporaryFile(
                        dir=dest.parent, delete=False, prefix=f".{CORPUS_FILE}.", suffix=".part"
                    )
                except OSError as e:
                    raise MinigptError(
                        f"cannot write into {dest.parent}: {_one_line(e)}; "
                        f"check the folder's permissions or pass another data directory"
                    ) from None
                tmp_name = tmp.name
                if fcntl is not None:
                    try:  # tells sweep_partial_files() of a later download that this one is alive
                        fcntl.flock(tmp.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except OSError:
                        pass

                digest = hashlib.sha256()
                received = 0
                with tmp, tqdm(
                    total=total, unit="B", unit_scale=True, unit_divisor=1024,
                    desc=str(dest), file=sys.stderr, leave=False,
                    disable=None if progress is None else not progress,  # None: only on a terminal
                ) as bar:
                    try:
                        for chunk in resp.iter_content(chunk_size=_CHUNK):
                            if not chunk:
                                continue
                            if received + len(chunk) > SIZE:
                                # A server streaming without end must not fill the disk.
                                raise MinigptError(
                                    f"download of {url} sent more than the expected {SIZE:,} bytes; "
                                    f"stopped and deleted the partial file; the mirror serves a "
                                    f"different file; {fix_url}"
                                )
                            try:
                                tmp.write(chunk)
                            except OSError as e:
                                raise MinigptError(
                                    f"cannot write {dest}: {_one_line(e)}; "
                                    f"free some disk space or pass another data directory"
                                ) from None
                            digest.update(chunk)
                            received += len(chunk)
                            bar.update(len(chunk))
                    except MinigptError:
                        raise
                    except requests.exceptions.ContentDecodingError:
                        raise MinigptError(
                            f"download of {url} sent a {encoding} body that does not decode; the mirror serves a "
                            f"damaged file; {fix_url}"
                        ) from None
                    except (requests.RequestException, urllib3.exceptions.HTTPError,
                            OSError) as e:
                        # ChunkedEncodingError (IncompleteRead / ProtocolError),
                        # ConnectionError (reset, read timeout), ContentDecodingError.
                        of_total = f" of {total:,}" if total is not None else ""
                        raise MinigptError(
                            f"download of {url} was cut off after {received:,}{of_total} bytes "
                            f"({_reason(e, timeout)}); try again or {mirror_hint}"
                        ) from None
                    try:
                        tmp.flush()
                        os.fsync(tmp.fileno())
                    except OSError as e:
                        raise MinigptError(
                            f"cannot write {dest}: {_one_line(e)}; "
                            f"free some disk space or pass another data directory"
                        ) from None

        if total is not None and received < total:
            # urllib3 normally raises IncompleteRead first; this is the backstop.
            raise MinigptError(
                f"download of {url} was cut off after {received:,} of {total:,} bytes; "
                f"try again or {mirror_hint}"
            )
        got = digest.hexdigest()
        if got != SHA256:
            raise MinigptError(
                f"download of {url} has sha256 {got} ({received:,} bytes), expected "
                f"{SHA256} ({SIZE:,} bytes); the mirror serves a different file"
            )
        try:
            # NamedTemporaryFile creates mode 0600; give the corpus the usual mode.
            os.chmod(tmp_name, _file_mode())
            backup = _back_up(dest)
            try:
                os.replace(tmp_name, dest)
            except OSError:
                if backup is not None:  # undo the backup: the user's file stays where it was
                    if not os.path.lexists(dest):
                        os.rename(backup, dest)
                    else:
                        os.remove(backup)
                raise
        except OSError as e:
            raise MinigptError(
                f"cannot write {dest}: {_one_line(e)}; "
                f"check the folder's permissions or pass another data directory"
            ) from None
        tmp_name = None
        return backup
    except BaseException:
        # Leave no trace of a failed download: the temp file and any folder we made.
        if tmp_name is not None:
            try:
                os.remove(tmp_name)
            except OSError:
                pass
        for d in created:
            try:
                d.rmdir()
            except OSError:
                break
        raise


def download_tinyshakespeare(
    data_dir: str | Path = "data",
    url: str | None = None,
    force: bool = False,
    progress: bool | None = None,
    timeout: float = 30.0,
    retries: int = 3,
    backoff_factor: float = 0.5,
    mirror_hint: str | None = None,
) -> tuple[Path, bool]:
    """Make sure ``data/tinyshakespeare/input.txt`` holds the genuine corpus.

    A file already there that passes the sha256 check is kept and no request
    is made (unless ``force``). A file that fails the check (empty, truncated,
    edited) is reported on stderr and downloaded again; once the download is
    verified, a non-empty such file is kept as ``input.txt.bak`` (or
    ``input.txt.bak-N``), and stderr says where. The download streams into a
    temporary file in the same folder, is checked against :data:`SHA256`,
    fsynced, and renamed over the target. It stops as soon as the server
    announces (Content-Length) or sends a size other than :data:`SIZE`, so a
    server streaming without end cannot fill the disk. Partial files that a
    killed earlier download left in the folder are removed first
    (:func:`sweep_partial_files`).

    After a failure no new file is left behind: the temporary file and any
    folder created for it are removed. A pre-existing file that passes the
    checksum (the ``force`` case) is left exactly as it was, and so is one that
    fails the checksum: only a verified download replaces a file on disk.

    Retries (with exponential backoff) cover failed connections and
    429/500/502/503/504 answers; a body cut off mid-stream is not retried.

    Args:
        data_dir: the data folder; the corpus goes to ``<data_dir>/tinyshakespeare/input.txt``.
        url: where to download from; None uses ``$MINIGPT_TINYSHAKESPEARE_URL``,
            then :data:`DEFAULT_URL` (see :func:`resolve_url`).
        force: download even when a good file is already there.
        progress: show a tqdm bar on stderr; None: only when stderr is a terminal.
        timeout: seconds to wait to connect and between received bytes.
        retries: how many times to retry a failed connection or a 429/5xx answer.
        backoff_factor: urllib3's backoff factor for the pauses between retries.
        mirror_hint: how the user points at another mirror, for error messages
            (default: set ``$MINIGPT_TINYSHAKESPEARE_URL``; a config's ``data.url`` says so).

    Returns:
        ``(path, downloaded)``: the corpus path and whether it was downloaded now.

    Raises:
        MinigptError: with a one-line message naming the URL, the problem and
            the fix, when the URL is invalid, the server cannot be reached or
            times out, it answers with an HTTP error, the body is cut off or
            longer than :data:`SIZE`, its sha256 differs from :data:`SHA256`, or the file cannot be written.
    """
    url = resolve_url(url)
    path = corpus_path(data_dir, DATASET)
    if path.is_dir():
        raise MinigptError(f"{path} is a folder where the corpus file belongs; move or delete it, then rerun")
    exists = path.exists()
    good = exists and file_ok(path)
    if good and not force:
        return path, False
    if exists and not good and not force:
        tqdm.write(f"{path} fails its checksum; downloading it again", file=sys.stderr)
    try:
        backup = _fetch(url, path, progress=progress, timeout=timeout, retries=retries,
                        backoff_factor=backoff_factor, mirror_hint=mirror_hint or _MIRROR_HINT)
    except MinigptError:
        # A file already there is the user's: a failed download never deletes it,
        # bad checksum or not (it is replaced only by a verified download).
        raise
    if backup is not None:
        tqdm.write(f"kept the earlier {path} (it failed the checksum) as {backup}", file=sys.stderr)
    return path, True
