"""What a config means: ``config-keys`` (the schema's reference) and ``count-params`` (its
accounting)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..errors import MinigptError
from ..run import folder as runs
from .base import Command, JsonOption, SetOption, app, echo


@app.command("config-keys", cls=Command)
def config_keys() -> None:
    """List every config key: its type or choices, its default and what it means.

    \b
    Example: minigpt config-keys | grep train.
    """
    from ..config.keys import describe_keys

    print(describe_keys())


@app.command("count-params", cls=Command)
def count_params(
    preset: Optional[str] = typer.Option(
        None, "--preset", metavar="NAME", help="A preset name (see --list)."
    ),
    config: Optional[Path] = typer.Option(
        None, "--config", metavar="CONFIG", help="A config file."
    ),
    seq_len: Optional[int] = typer.Option(
        None, "--seq-len", min=1, metavar="T", help="Context length for FLOPs (default block_size)."
    ),
    tokens: Optional[float] = typer.Option(
        None, "--tokens", min=1, metavar="N", help="Training tokens, for total FLOPs (e.g. 3e11)."
    ),
    vocab_size: Optional[int] = typer.Option(
        None,
        "--vocab-size",
        min=1,
        help="Vocabulary size; overrides the config's (needed where it is null), e.g. 50304 for a padded GPT-2.",
    ),
    dtype: Optional[str] = typer.Option(
        None,
        "--dtype",
        metavar="DTYPE",
        help="float32, bfloat16 or float16, for the memory estimate (default: the config's dtype; float32 for auto).",
    ),
    batch_size: Optional[int] = typer.Option(
        None,
        "--batch-size",
        min=1,
        help="Sequences per micro-batch, for the activation estimate (default: the config's train.batch_size; 1 for a preset).",
    ),
    as_json: JsonOption = False,
    list_: bool = typer.Option(False, "--list", help="List the presets and exit."),
    set_: SetOption = [],
) -> None:
    """Exact parameter, FLOP and memory accounting for a preset or config.

    \b
    Example: minigpt count-params --preset gpt2-small --seq-len 1024
    """
    from .. import paths
    from ..config.schema import load_config

    if list_:
        for name in paths.list_presets():
            print(name)
        return
    if (preset is None) == (config is None):
        raise MinigptError(
            "pass exactly one of --preset NAME or --config FILE (--list shows the presets)"
        )
    from ..accounting import params
    from ..accounting.count import count_params as count
    from ..accounting.count import overrides_in_effect
    from ..hf.finetune import resolve_init_from

    source = paths.preset_path(preset) if preset else paths.resolve_config(config, echo)
    folder = Path(
        source
    ).parent  # a run's config.yaml: the run's record, wherever its init_from folder is now
    run = folder if Path(source).name == runs.CONFIG and runs.has_checkpoint(folder) else None
    cfg = resolve_init_from(load_config(source, set_), run, echo)
    rep = count(
        cfg,
        seq_len=seq_len,
        tokens=tokens,
        vocab_size=vocab_size,
        dtype=dtype,
        batch_size=batch_size,
        echo=echo,
    )
    if as_json:
        print(json.dumps(rep, indent=1))
    else:
        flags = {"--vocab-size": vocab_size, "--batch-size": batch_size, "--dtype": dtype}
        print(
            params.format_report(
                rep, title=preset or str(config), overrides=overrides_in_effect(set_, flags)
            )
        )
