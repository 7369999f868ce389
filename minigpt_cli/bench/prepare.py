"""``minigpt bench --prepare``: data preparation's throughput against a bare ``encode_batch`` loop,
in MB/s."""

from __future__ import annotations

import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from ..config.schema import Config
from ..data.pipeline import configured_corpus, ensure_tokenizer
from ..data.preparation import prepare

#: Bytes of lines the baseline hands to one ``encode_batch`` call.
BARE_BATCH_BYTES = 1 << 22


def bare_encode(paths: list[Path], tok) -> int:
    """Tokens of ``paths`` encoded line by line in batches of :data:`BARE_BATCH_BYTES` with
    ``encode_batch``."""
    n = 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            while lines := f.readlines(BARE_BATCH_BYTES):
                n += sum(len(ids) for ids in tok.encode_batch(lines))
    return n


def bench_prepare(cfg: Config, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Time the bare loop, then :func:`prepare`, on the config's corpus; raises as it and
    configured_corpus."""
    corpus, root = configured_corpus(cfg, echo)
    tok, tok_path = ensure_tokenizer(cfg, corpus, echo, root)
    mb = corpus.size / 1e6
    echo(f"bare encode_batch over {corpus.source} ({mb:,.1f} MB) ...")
    t0 = time.perf_counter()
    bare_tokens = bare_encode([f.path for f in corpus.files], tok)
    bare_s = time.perf_counter() - t0
    echo("minigpt's preparation ...")
    with tempfile.TemporaryDirectory(prefix="minigpt-bench-prepare-") as tmp:
        t0 = time.perf_counter()
        data = prepare(
            corpus, tok, Path(tmp), cfg.data.val_fraction, log=lambda m: None, progress=False
        )
        ours_s = time.perf_counter() - t0
        tokens = len(data.train) + len(data.val)
    return {
        "corpus": corpus.source,
        "corpus_mb": round(mb, 3),
        "files": len(corpus.files),
        "tokenizer": f"{tok.kind} {tok.vocab_size:,} ({tok_path})",
        "bare_mb_s": round(mb / bare_s, 3),
        "prepare_mb_s": round(mb / ours_s, 3),
        "ratio": round(bare_s / ours_s, 3),
        "bare_tokens": bare_tokens,
        "prepared_tokens": tokens,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
    }


def format_bench_prepare(r: dict[str, Any]) -> str:
    """The result of :func:`bench_prepare` as a few lines."""
    return "\n".join(
        [
            f"corpus               {r['corpus']}: {r['corpus_mb']:,.1f} MB in {r['files']:,} file(s); {r['tokenizer']}",
            f"bare encode_batch    {r['bare_mb_s']:.2f} MB/s ({r['bare_tokens']:,} tokens, lines in 4 MiB batches)",
            f"minigpt prepare      {r['prepare_mb_s']:.2f} MB/s ({r['prepared_tokens']:,} tokens, train + val memmaps)",
            f"ratio                {r['ratio']:.2f} (prepare / bare; 1.0: no overhead of its own)",
            f"peak RSS             {r['peak_rss_mib']:,.0f} MiB (the process, both runs); {r['cores']} core(s)",
        ]
    )
