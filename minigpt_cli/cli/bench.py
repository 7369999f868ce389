"""``bench``: training and generation speed, measured in one run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .base import Command, JsonOption, SetOption, app, echo

#: What ``bench`` refuses.

#: The options each other mode leaves unread: given with it, they are refused rather than silently
#: dropped.
_UNREAD = {
    "--optimizers": ("prompt_len", "max_new_tokens", "generation"),
    "--prepare": ("iters", "prompt_len", "max_new_tokens", "generation", "stream_tokens"),
    "--no-generation": ("prompt_len", "max_new_tokens"),
}


@app.command(cls=Command)
def bench(
    ctx: typer.Context,
    config: Path = typer.Argument(
        ..., help="YAML config whose model, batch, device and dtype to measure."
    ),
    set_: SetOption = [],
    iters: Optional[int] = typer.Option(
        None,
        "--iters",
        min=1,
        max=1_000_000,
        show_default=False,
        help="Timed optimizer steps: 20 by default, after 3 warm-up steps; with --optimizers, steps of each "
        "optimizer: 100 by default (20 rounds), after a warm-up round; 30 or more give a 95% interval.",
    ),
    prompt_len: int = typer.Option(
        1, "--prompt-len", min=1, help="Prompt tokens for the generation measurement."
    ),
    max_new_tokens: int = typer.Option(
        500, "--max-new-tokens", min=1, help="Tokens generated with and without the cache."
    ),
    generation: bool = typer.Option(
        True, "--generation/--no-generation", help="Also measure generation."
    ),
    stream_tokens: int = typer.Option(
        0,
        "--stream-tokens",
        min=0,
        metavar="N",
        help="Also time generate's streaming over N tokens: decoded at the end, streamed, streamed with a stop "
        "string; reports the overheads (needs the corpus and the config's tokenizer; 0: off).",
    ),
    prepare: bool = typer.Option(
        False,
        "--prepare",
        help="Instead, time data preparation of the config's corpus (data.path or the dataset) with its tokenizer "
        "against a bare tokenizers encode_batch loop over the same files, in MB/s.",
    ),
    optimizers: bool = typer.Option(
        False,
        "--optimizers",
        help="Instead, time the training step under AdamW, Muon (train.muon.*, its variants off), "
        "torch.optim.Muon and Muon with each variant alone (muon+polar-express, muon+normuon, "
        "muon+cautious-wd) in alternating rounds of 5 steps (--iters steps each, rounded up to "
        "whole rounds), as ratios to AdamW's step with a 95% interval.",
    ),
    as_json: JsonOption = False,
) -> None:
    """Measure training tokens/s, MFU (against a matmul peak measured in the same run) and
    generation speed.

    \b
    Examples:
      minigpt bench configs/shakespeare-cpu.yaml --iters 50 --json
      minigpt bench configs/shakespeare-bpe.yaml --stream-tokens 8000
      minigpt bench configs/shakespeare-bpe.yaml --set data.path=books/ --prepare
      minigpt bench configs/shakespeare-cpu.yaml --optimizers --iters 100
    """
    from ..config.schema import load_config
    from ..errors import MinigptError

    if optimizers and (prepare or stream_tokens):
        raise MinigptError(
            f"--optimizers and {'--prepare' if prepare else '--stream-tokens'} are two different "
            "measurements; give one of them"
        )
    mode = (
        "--optimizers"
        if optimizers
        else "--prepare"
        if prepare
        else None
        if generation
        else "--no-generation"
    )
    given = [
        p
        for p in ctx.command.params
        if p.name in _UNREAD.get(mode, ()) and ctx.get_parameter_source(p.name).name != "DEFAULT"
    ]
    if given:
        names = ["/".join(p.opts + p.secondary_opts) for p in given]
        raise MinigptError(
            f"{mode} leaves {', '.join(names)} unread; drop {'it' if len(names) == 1 else 'them'}"
        )
    cfg = load_config(config, set_, note=echo)
    if prepare:
        from ..bench.prepare import bench_prepare, format_bench_prepare

        result = bench_prepare(cfg, echo=echo)
        print(json.dumps(result, indent=1) if as_json else format_bench_prepare(result))
        return
    if optimizers:
        from ..bench.optimizer import DEFAULT_ITERS, bench_optimizers, format_bench_optimizers

        result = bench_optimizers(cfg, iters=iters or DEFAULT_ITERS, echo=echo)
        print(json.dumps(result, indent=1) if as_json else format_bench_optimizers(result))
        return
    from ..bench.throughput import DEFAULT_ITERS, format_bench
    from ..bench.throughput import bench as run_bench

    result = run_bench(
        cfg,
        iters=iters or DEFAULT_ITERS,
        prompt_len=prompt_len,
        max_new_tokens=max_new_tokens,
        generation=generation,
        stream_tokens=stream_tokens,
        echo=echo,
    )
    print(json.dumps(result, indent=1) if as_json else format_bench(result))
