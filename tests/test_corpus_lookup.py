"""Where the tests find the corpus (conftest.locate_corpus): env var, ../shared, data/, the user
cache; no network."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import CORPUS_ENV, CorpusNotFound, corpus_cache_dir, fetch_corpus, locate_corpus

REL = Path("data") / "tinyshakespeare" / "input.txt"


def _put(path: Path, body: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    return path


@pytest.fixture
def layout(tmp_path, corpus_file):
    """A fake checkout (``work/repo``) with no corpus anywhere yet; returns (repo, environ,
    body)."""
    repo = tmp_path / "work" / "repo"
    repo.mkdir(parents=True)
    environ = {"HOME": str(tmp_path / "home")}
    return repo, environ, corpus_file.read_bytes()


def test_cache_dir_follows_xdg_then_home(tmp_path):
    assert corpus_cache_dir({"HOME": str(tmp_path)}) == tmp_path / ".cache" / "minigpt"
    assert (
        corpus_cache_dir({"HOME": str(tmp_path), "XDG_CACHE_HOME": ""})
        == tmp_path / ".cache" / "minigpt"
    )
    assert (
        corpus_cache_dir({"HOME": "/nowhere", "XDG_CACHE_HOME": str(tmp_path / "c")})
        == tmp_path / "c" / "minigpt"
    )


def test_lookup_order(layout):
    repo, environ, body = layout
    shared = repo.parent / "shared" / REL
    checkout = repo / REL
    cache = corpus_cache_dir(environ) / "tinyshakespeare" / "input.txt"
    assert locate_corpus(environ, repo) is None

    _put(cache, body)
    assert locate_corpus(environ, repo) == cache
    _put(checkout, body)
    assert locate_corpus(environ, repo) == checkout
    _put(shared, body)
    assert locate_corpus(environ, repo) == shared

    explicit = _put(repo.parent / "elsewhere" / "corpus.txt", body)
    assert locate_corpus({**environ, CORPUS_ENV: str(explicit)}, repo) == explicit
    assert locate_corpus({**environ, CORPUS_ENV: ""}, repo) == shared  # empty counts as unset


def test_unverified_copies_are_passed_over(layout):
    """Only a file with the right size and sha256 counts: a wrong shared/ or data/ copy falls
    through."""
    repo, environ, body = layout
    _put(repo.parent / "shared" / REL, body.upper())  # same size, other bytes
    _put(repo / REL, body[: len(body) // 2])  # truncated
    assert locate_corpus(environ, repo) is None
    cache = _put(corpus_cache_dir(environ) / "tinyshakespeare" / "input.txt", body)
    assert locate_corpus(environ, repo) == cache


def test_an_explicit_file_must_be_the_corpus(layout):
    """$MINIGPT_TEST_CORPUS naming a missing or wrong file is an error, not a silent fallback."""
    repo, environ, body = layout
    _put(repo.parent / "shared" / REL, body)
    for bad in (repo.parent / "missing.txt", _put(repo.parent / "wrong.txt", body.upper())):
        with pytest.raises(CorpusNotFound) as e:
            locate_corpus({**environ, CORPUS_ENV: str(bad)}, repo)
        assert CORPUS_ENV in str(e.value) and "\n" not in str(e.value)


def test_fetch_into_the_cache(layout, corpus_server):
    """With no copy anywhere: one download (from the local server here) into the user cache, then
    found there."""
    repo, environ, _ = layout
    url = corpus_server.url("/input.txt?t=corpus-lookup")
    path = fetch_corpus(environ, url=url).path
    assert path == corpus_cache_dir(environ) / "tinyshakespeare" / "input.txt"
    assert locate_corpus(environ, repo) == path
    assert corpus_server.hit_count("/input.txt?t=corpus-lookup") == 1


def test_a_failed_fetch_is_one_line(layout, corpus_server):
    repo, environ, _ = layout
    with pytest.raises(CorpusNotFound) as e:
        fetch_corpus(environ, url=corpus_server.url("/missing.txt"))
    msg = str(e.value)
    assert (
        "\n" not in msg
        and "the tests need the Tiny Shakespeare corpus" in msg
        and CORPUS_ENV in msg
    )
    assert not (corpus_cache_dir(environ) / "tinyshakespeare" / "input.txt").exists()
