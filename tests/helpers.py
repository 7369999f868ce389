"""Small helpers shared by the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

TINY = Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml"


class CliResult:
    def __init__(self, exit_code: int, stdout: str, stderr: str):
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr

    def __repr__(self) -> str:
        return f"CliResult(exit_code={self.exit_code}, stdout={self.stdout[-800:]!r}, stderr={self.stderr[-800:]!r})"


def assert_user_error(res: CliResult, *fragments: str, notes_ok: bool = False) -> None:
    """Exit 2, one line on stderr starting 'error:', no traceback, each fragment in it.

    With ``notes_ok``, status lines printed before the error (such as
    "downloading it first") are allowed; the error is still one line, the last.
    """
    assert res.exit_code == 2, res
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    if notes_ok:
        assert sum(l.startswith("error:") for l in lines) == 1, res
        lines = lines[-1:]
    assert len(lines) == 1, res
    assert lines[0].startswith("error: "), res
    assert "Traceback" not in res.stderr + res.stdout
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])


@contextmanager
def working_dir(path: Path):
    """Run the body with ``path`` as the current directory (module-scoped fixtures cannot use
    monkeypatch.chdir)."""
    old = os.getcwd()
    os.chdir(path)
    try:
        yield path
    finally:
        os.chdir(old)


def tiny(data_dir, *extra):
    """tiny.yaml on the test corpus: a train line every step, an eval every 20, no samples;
    ``extra`` overrides."""
    from minigpt_cli.config.schema import load_config

    return load_config(
        TINY,
        [
            f"data.data_dir={data_dir}",
            "train.log_interval=1",
            "train.sample_tokens=0",
            "train.eval_interval=20",
            *extra,
        ],
    )


def records(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl events."""
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


def curve(run_dir: Path) -> dict[tuple[str, int], float]:
    """(event, step) -> the train loss or val loss logged there."""
    out = {}
    for r in records(run_dir):
        key = "loss" if r["event"] == "train" else "val_loss"
        out[(r["event"], r["step"])] = r[key]
    return out


def cli_process(args, env_extra=None, cwd=None, **kw) -> subprocess.CompletedProcess:
    """``python -m minigpt_cli ARGS`` in a process of its own (signals, kills, torchrun), its output
    captured."""
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run(
        [sys.executable, "-m", "minigpt_cli", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        **kw,
    )


def small_peak(monkeypatch, n: int = 256) -> None:
    """bench measures its matmul peak on n x n products instead of 2048 x 2048 (24 of those took ~5
    s a call).

    For tests of what bench does with the peak (the JSON, the table, kernels, fallbacks), not of its
    size.
    """
    import minigpt_cli.bench.throughput as bench_mod

    real = bench_mod.measure_peak

    def measure_small(device, dtype, kernel: str = "torch.mm"):
        return real(device, dtype, n, kernel=kernel)

    monkeypatch.setattr(bench_mod, "measure_peak", measure_small)


def wordlevel_tokenizer(chars):
    """A ``tokenizers`` WordLevel tokenizer over ``chars`` (ids in that order), each character split
    off alone, without an unknown token: what an export of a char tokenizer once was, and what some
    Hugging Face folders hold. Its library fails on any other character ("Missing [UNK] token")."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return tok


def record_checksums(ckpt: Path) -> None:
    """Record the sha256 of a checkpoint's files as they are now, as a save would have: for tests of
    what a file's content must be, beyond matching its checksum."""
    import hashlib

    meta = json.loads((Path(ckpt) / "meta.json").read_text())
    meta["sha256"] = {
        name: hashlib.sha256((Path(ckpt) / name).read_bytes()).hexdigest()
        for name in meta["sha256"]
    }
    write_meta(ckpt, meta)


def write_meta(ckpt: Path, meta: dict) -> None:
    """Write a checkpoint's ``meta.json`` with the digest of its fields a save records: for tests of
    what a field's value must be, beyond matching the digest."""
    from minigpt_cli.run.folder import meta_digest

    (Path(ckpt) / "meta.json").write_text(json.dumps({**meta, "meta_sha256": meta_digest(meta)}))
