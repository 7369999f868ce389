"""The ``minigpt`` command (Typer). One short function per subcommand.

Each function parses its options, loads the config, calls one library function
and prints the result. torch is imported inside the commands that need it, so
``minigpt --help`` answers at once. Errors become one line and an exit status
in :mod:`minigpt_cli.cli_base`.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import List, Optional

import typer

from . import runs
from .cli_base import (Command, Group, echo, other_rank, run_and_exit, sample_flags, say_when_stopped_late,
                       unescape)
from .paths import resolve_config
from .errors import Interrupted, MinigptError

app = typer.Typer(
    name="minigpt",
    cls=Group,
    help="Train, sample and measure small GPT models (decoder-only Transformers).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain click help: no boxes or type labels, and as wide as the terminal (up to 120 columns).
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120},
)


# ----------------------------------------------------------------------------- download


@app.command(cls=Command)
def download(
    dataset: str = typer.Argument("tinyshakespeare", help="Corpus to fetch (only tinyshakespeare for now)."),
    url: Optional[str] = typer.Option(
        None, "--url", metavar="URL", help="Mirror to fetch from; default $MINIGPT_TINYSHAKESPEARE_URL, else the char-rnn repository."
    ),
    force: bool = typer.Option(False, "--force", help="Fetch again even if a good copy is on disk."),
    data_dir: Path = typer.Option(Path("data"), "--data-dir", metavar="DIR", help="Where corpora live."),
    progress: Optional[bool] = typer.Option(
        None, "--progress/--no-progress", help="Show a progress bar (default: only when stderr is a terminal)."
    ),
) -> None:
    """Download a corpus into data/<dataset>/input.txt (checksum-verified).

    \b
    Example: minigpt download --url http://127.0.0.1:8000/input.txt
    """
    from .download import download as fetch

    path, fetched = fetch(dataset, data_dir, url=url, force=force, progress=progress,
                          mirror_hint="pass another --url" if url else None)
    size = path.stat().st_size
    if fetched:
        print(f"downloaded {path} ({size:,} bytes, sha256 verified)")
    else:
        print(f"{path} is already here ({size:,} bytes, sha256 verified); --force fetches it again")


# ----------------------------------------------------------------------------- tokenizer


@app.command("train-tokenizer", cls=Command)
def train_tokenizer_cmd(
    config: Optional[Path] = typer.Argument(None, help="A config whose tokenizer and data sections to use."),
    kind: Optional[str] = typer.Option(None, "--kind", metavar="KIND", help="char, bpe, wordpiece or unigram (default: the config's)."),
    vocab_size: Optional[int] = typer.Option(
        None, "--vocab-size", min=1, help="Entries in all, special tokens included (ignored for char)."
    ),
    input: Optional[Path] = typer.Option(None, "--input", metavar="PATH", help="Text to train on: a UTF-8 file, a folder of .txt/.jsonl files, a glob or a .jsonl file (default: the config's corpus)."),
    output: Optional[Path] = typer.Option(
        None, "--output", metavar="FILE", help="Tokenizer file to write (default: data/<dataset>/tokenizer-<kind>[-<size>][-special-<hash>].json)."
    ),
    special_tokens: Optional[List[str]] = typer.Option(
        None, "--special-tokens", metavar="TEXT",
        help="A text that becomes one id, e.g. '<|endoftext|>' (repeatable; default: the config's).",
    ),
    compare: bool = typer.Option(
        False, "--compare", help="Train all four kinds at --vocab-size on the same corpus and print one table; writes nothing."
    ),
    set_: List[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="Override a config key: section.key=value."),
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
    from .config import apply_overrides, load_config, validate
    from .train_tokenizer import run_compare, run_train_tokenizer

    cfg = load_config(resolve_config(config, echo), set_) if config else validate(apply_overrides({}, set_), "--set")
    if compare:
        if kind is not None or output is not None:
            raise MinigptError("--compare trains every kind and writes nothing; drop --kind and --output")
        print(run_compare(cfg, vocab_size=vocab_size, input_path=input, special_tokens=special_tokens, echo=echo))
        return
    print(run_train_tokenizer(cfg, kind=kind, vocab_size=vocab_size, input_path=input, output_path=output,
                              special_tokens=special_tokens, echo=echo))


# ----------------------------------------------------------------------------- train


@app.command(cls=Command)
def train(
    config: Path = typer.Argument(..., help="YAML config, e.g. configs/shakespeare-cpu.yaml."),
    set_: List[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help="Override a config key, e.g. --set train.learning_rate=3e-4 (repeatable)."
    ),
    run_name: Optional[str] = typer.Option(
        None, "--run-name", metavar="NAME", help="Folder name under runs/ (default: <name>-<date>-<time>)."
    ),
    resume: Optional[str] = typer.Option(
        None, "--resume", metavar="auto|DIR", help="Continue a run: 'auto' (the newest run of this config's name) or runs/NAME."
    ),
    init_from: Optional[Path] = typer.Option(
        None, "--init-from", metavar="DIR", help="Fine-tune: start from a local Hugging Face GPT-2 or Llama folder "
        "(config.json, model.safetensors, tokenizer.json); the same as --set model.init_from=DIR."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved config and learning rates (with --resume: the run and step it would continue from); train nothing."),
    progress: Optional[bool] = typer.Option(
        None, "--progress/--no-progress", help="Show a progress bar (default: only when stderr is a terminal)."
    ),
) -> None:
    """Train a GPT as the config says; the run lands in runs/<name>/.

    Downloads the corpus and trains the tokenizer first if they are missing.
    The run folder holds config.yaml, tokenizer.json, metrics.jsonl, train.log,
    loss.png, samples.txt, env.json and checkpoints/{last,best}.

    Ctrl-C (or SIGTERM) saves checkpoints/last, even in the middle of an eval
    (exit status 130, or 143 for SIGTERM); a second Ctrl-C aborts without
    saving. --resume continues from it with the same losses the uninterrupted
    run would have had; a larger train.max_iters trains a run further (the
    learning-rate schedule then follows the new values). Under torchrun
    (torchrun --nproc_per_node=N -m minigpt_cli train CONFIG) it trains with
    DistributedDataParallel. minigpt config-keys lists every key a config or
    --set may give.

    \b
    Example: minigpt train configs/shakespeare-cpu.yaml --set train.max_iters=500
    """
    from .config import load_config
    from .pretrained import resolve_init_from, resumed_run

    set_ = [*set_, f"model.init_from={init_from}"] if init_from is not None else set_
    cfg = load_config(resolve_config(config, echo), set_)
    cfg = resolve_init_from(cfg, resumed_run(cfg, resume))
    if resume is not None and run_name is not None:
        raise MinigptError("pass either --resume or --run-name, not both (a resumed run keeps its folder)")
    from .trainer import describe_resume, describe_schedule, train as run_training

    if dry_run:
        from .trainer.preflight import check_paths

        check_paths(cfg, resume)  # train's own check, before it writes anything
        if run_name is not None:
            runs.check_run_name(cfg.train.out_dir, run_name)
        resuming = describe_resume(cfg, resume) if resume is not None else []  # refused before anything prints
        print(describe_schedule(cfg))
        if resuming:
            print("\n" + "\n".join(resuming))
        return
    try:
        result = run_training(cfg, run_name, resume=resume, echo=echo, progress=progress)
    except Interrupted as exc:
        if exc.resume_dir is not None:  # how to go on: this command again, with --resume
            words = ["minigpt", "train", str(config), *[w for item in set_ for w in ("--set", item)]]
            exc.args = (f"{exc}; continue with: {shlex.join([*words, '--resume', str(exc.resume_dir)])}",)
        raise
    if result.already_done:
        n = cfg.train.max_iters
        where = "reached" if result.step == n else f"is at step {result.step}, past"
        print(f"{result.run_dir} already {where} train.max_iters={n}; nothing was trained. To train longer, "
              f"raise it, e.g. --set train.max_iters={max(2 * result.step, result.step + 1)}")
        return
    if other_rank():  # under torchrun, rank 0 reports for all
        return
    val = f"{result.val_loss:.4f}" if result.val_loss is not None else "n/a"
    say_when_stopped_late(f"the run had finished at step {result.step} and is saved in "
                          f"{runs.checkpoint_dir(result.run_dir, runs.LAST)}")
    print(f"trained to step {result.step}; final val loss {val}; run folder {result.run_dir}")
    print(f"sample from it with: minigpt generate --run {shlex.quote(str(result.run_dir))}")


@app.command(cls=Command)
def prepare(
    config: Path = typer.Argument(..., help="YAML config whose data and tokenizer sections to use."),
    set_: List[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="Override a config key (repeatable)."),
    progress: Optional[bool] = typer.Option(
        None, "--progress/--no-progress", help="Show progress bars (default: only when stderr is a terminal)."
    ),
) -> None:
    """Prepare a config's data as train would, and stop: corpus, tokenizer, token files.

    Downloads the named dataset, or reads data.path (a file, a folder of
    .txt/.jsonl files, a glob), trains the tokenizer if its file is missing,
    and writes the train and val token files; a later train reuses them.

    \b
    Example: minigpt prepare configs/shakespeare-bpe.yaml --set data.path=books/
    """
    from .config import load_config
    from .data import prepare_configured

    cfg = load_config(resolve_config(config, echo), set_)
    try:
        corpus, tok, tok_path, data = prepare_configured(cfg, echo, progress)
    except KeyboardInterrupt:
        echo("interrupted: no token files were completed (nothing half-written is kept); run the same "
             "command again to start over")
        raise typer.Exit(130) from None
    meta = data.meta
    print(f"corpus      {corpus.source}: {corpus.size:,} bytes in {len(corpus.files):,} file(s), "
          f"{meta.get('documents', 1):,} document(s); fingerprint {corpus.fingerprint[:12]}")
    print(f"tokenizer   {tok.kind}, {tok.vocab_size:,} entries ({tok_path})")
    split = "whole documents" if meta.get("split") == "documents" else "the end of the text"
    print(f"token files {data.directory}: {len(data.train):,} train / {len(data.val):,} val tokens "
          f"({data.train.dtype}; validation: {split})")


@app.command("config-keys", cls=Command)
def config_keys() -> None:
    """List every config key: its type or choices, its default and what it means.

    \b
    Example: minigpt config-keys | grep train.
    """
    from .config_docs import describe_keys

    print(describe_keys())


# ----------------------------------------------------------------------------- generate


@app.command(cls=Command)
def generate(
    run: Optional[Path] = typer.Option(None, "--run", metavar="DIR", help="Run folder (default: the most recent under runs/)."),
    prompt: Optional[str] = typer.Option(
        None, "--prompt", metavar="TEXT", help="Text to continue; '-' reads it from standard input (default: the config's sample.prompt)."
    ),
    prompt_file: Optional[Path] = typer.Option(None, "--prompt-file", metavar="FILE", help="Read the prompt from this UTF-8 file."),
    max_new_tokens: Optional[int] = typer.Option(
        None, "--max-new-tokens", min=0, help="Tokens to generate; 0 prints the prompt back unchanged."
    ),
    temperature: Optional[float] = typer.Option(None, "--temperature", metavar="T",
                                                help="Divides the logits: a finite number >= 0; 0 means greedy."),
    top_k: Optional[int] = typer.Option(None, "--top-k", min=1, metavar="K", help="Keep only the k most likely tokens."),
    top_p: Optional[float] = typer.Option(None, "--top-p", metavar="P",
                                          help="Nucleus sampling, 0 < p <= 1: keep the smallest set of tokens reaching mass p."),
    stop: List[str] = typer.Option(
        [], "--stop", metavar="TEXT",
        help="End a sample when this text appears in the generated text; it is not printed (repeatable). "
             "Escapes as in printf: '\\n\\n' is a blank line; also \\t \\r \\a \\b \\e \\f \\v \\\" \\' \\\\ (a "
             "backslash), \\uHHHH and \\UHHHHHHHH (a character: \\u00e9 is é), \\xHH and octal \\NNN (bytes, read "
             "as UTF-8: \\xc3\\xa9 is é); any other backslash stays as typed.",
    ),
    num_samples: Optional[int] = typer.Option(
        None, "--num-samples", min=1,
        help="Independent samples, decoded together as one batch and printed when all have ended, each after a "
             "'----- sample N -----' line (20 dashes each side). Sample N uses seed S+N-1, so it is the text "
             "--num-samples 1 --seed S+N-1 gives (to float rounding).",
    ),
    seed: int = typer.Option(1337, "--seed", metavar="S", help="Random seed for sampling, 0 .. 2**63-1."),
    stream: bool = typer.Option(True, "--stream/--no-stream", help="Print tokens as they are produced."),
    kv_cache: bool = typer.Option(True, "--kv-cache/--no-kv-cache", help="Reuse past keys and values."),
    compile_: Optional[bool] = typer.Option(
        None, "--compile/--no-compile",
        help="Decode through a static KV cache with the one-token step compiled (torch.compile; CUDA graphs on "
             "a GPU); the same tokens. Default: on for CUDA, off on a CPU, where it does not pay.",
    ),
    dtype: str = typer.Option(
        "float32", "--dtype", metavar="float32|bfloat16",
        help="Weights and arithmetic: bfloat16 reads half the bytes per token (faster where memory is the "
             "limit, as on CPUs); its text drifts from float32's after some tokens.",
    ),
    window_stride: Optional[int] = typer.Option(
        None, "--window-stride", min=1,
        help="Past block_size, drop this many oldest tokens at once (1: slide token by token; "
             "default: the run's sample.window_stride, else block_size // 4).",
    ),
    checkpoint: str = typer.Option(
        runs.BEST, "--checkpoint", metavar=f"{runs.BEST}|{runs.LAST}",
        help="best: the weights with the lowest val loss; last: the most recent save.",
    ),
    device: str = typer.Option("auto", "--device", metavar="DEVICE", help="auto, cpu, cuda, cuda:N or mps."),
) -> None:
    """Sample text from a trained run.

    Each sample is printed as the prompt, the new text and a newline, token
    by token for a single sample (--no-stream: at the end).

    \b
    Example:
      minigpt generate --prompt "ROMEO:" --max-new-tokens 300 --stop "JULIET:"
      minigpt generate --stop '\\n\\n'        # end at the first blank line
    """
    from .generation import generate as run_generate, read_prompt

    given = {"prompt": read_prompt(prompt, prompt_file, sys.stdin), "max_new_tokens": max_new_tokens,
             "temperature": temperature, "top_k": top_k, "top_p": top_p, "num_samples": num_samples,
             "window_stride": window_stride}
    run_generate(run, sample_flags({k: v for k, v in given.items() if v is not None}), checkpoint=checkpoint,
                 device=device, seed=seed, stream=stream, use_cache=kv_cache, compile=compile_, dtype=dtype,
                 stop=[unescape(s) for s in stop], out=sys.stdout, echo=echo)


# ----------------------------------------------------------------------------- count-params


@app.command("count-params", cls=Command)
def count_params(
    preset: Optional[str] = typer.Option(None, "--preset", metavar="NAME", help="A preset name (see --list)."),
    config: Optional[Path] = typer.Option(None, "--config", metavar="CONFIG", help="A config file."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", min=1, metavar="T", help="Context length for FLOPs (default block_size)."),
    tokens: Optional[float] = typer.Option(None, "--tokens", min=1, metavar="N", help="Training tokens, for total FLOPs (e.g. 3e11)."),
    vocab_size: Optional[int] = typer.Option(None, "--vocab-size", min=1, help="Vocabulary size; overrides the config's (needed where it is null), e.g. 50304 for a padded GPT-2."),
    dtype: Optional[str] = typer.Option(None, "--dtype", metavar="DTYPE", help="float32, bfloat16 or float16, for the memory estimate (default: the config's dtype; float32 for auto)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help="Sequences per micro-batch, for the activation estimate (default: the config's train.batch_size; 1 for a preset)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    list_: bool = typer.Option(False, "--list", help="List the presets and exit."),
    set_: List[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="Override a key, e.g. --set model.tie_weights=false."),
) -> None:
    """Exact parameter, FLOP and memory accounting for a preset or config.

    \b
    Example: minigpt count-params --preset gpt2-small --seq-len 1024
    """
    from . import paths
    from .config import load_config

    if list_:
        for name in paths.list_presets():
            print(name)
        return
    if (preset is None) == (config is None):
        raise MinigptError("pass exactly one of --preset NAME or --config FILE (--list shows the presets)")
    from . import params
    from .count import count_params as count, overrides_in_effect

    from .pretrained import resolve_init_from

    source = paths.preset_path(preset) if preset else paths.resolve_config(config, echo)
    folder = Path(source).parent  # a run's config.yaml: the run's record, wherever its init_from folder is now
    run = folder if Path(source).name == runs.CONFIG and runs.has_checkpoint(folder) else None
    cfg = resolve_init_from(load_config(source, set_), run)
    rep = count(cfg, seq_len=seq_len, tokens=tokens, vocab_size=vocab_size, dtype=dtype, batch_size=batch_size,
                echo=echo)
    if as_json:
        print(json.dumps(rep, indent=1))
    else:
        flags = {"--vocab-size": vocab_size, "--batch-size": batch_size, "--dtype": dtype}
        print(params.format_report(rep, title=preset or str(config), overrides=overrides_in_effect(set_, flags)))


# ----------------------------------------------------------------------------- bench


@app.command(cls=Command)
def bench(
    config: Path = typer.Argument(..., help="YAML config whose model, batch, device and dtype to measure."),
    set_: List[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="Override a config key: section.key=value (repeatable)."),
    iters: int = typer.Option(20, "--iters", min=1, help="Timed optimizer steps (after 3 warm-up steps)."),
    prompt_len: int = typer.Option(1, "--prompt-len", min=1, help="Prompt tokens for the generation measurement."),
    max_new_tokens: int = typer.Option(500, "--max-new-tokens", min=1, help="Tokens generated with and without the cache."),
    generation: bool = typer.Option(True, "--generation/--no-generation", help="Also measure generation."),
    stream_tokens: int = typer.Option(
        0, "--stream-tokens", min=0, metavar="N",
        help="Also time generate's streaming over N tokens: decoded at the end, streamed, streamed with a stop "
             "string; reports the overheads (needs the corpus and the config's tokenizer; 0: off).",
    ),
    prepare: bool = typer.Option(
        False, "--prepare",
        help="Instead, time data preparation of the config's corpus (data.path or the dataset) with its tokenizer "
             "against a bare tokenizers encode_batch loop over the same files, in MB/s.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Measure training tokens/s, MFU (against a matmul peak measured in the same run) and generation speed.

    \b
    Examples:
      minigpt bench configs/shakespeare-cpu.yaml --iters 50 --json
      minigpt bench configs/shakespeare-bpe.yaml --stream-tokens 8000
      minigpt bench configs/shakespeare-bpe.yaml --set data.path=books/ --prepare
    """
    from .config import load_config

    cfg = load_config(resolve_config(config, echo), set_)
    if prepare:
        from .bench_prepare import bench_prepare, format_bench_prepare

        result = bench_prepare(cfg, echo=echo)
        print(json.dumps(result, indent=1) if as_json else format_bench_prepare(result))
        return
    from .bench import bench as run_bench, format_bench

    result = run_bench(cfg, iters=iters, prompt_len=prompt_len, max_new_tokens=max_new_tokens,
                       generation=generation, stream_tokens=stream_tokens, echo=echo)
    print(json.dumps(result, indent=1) if as_json else format_bench(result))


from . import cli_hf, cli_sweep  # noqa: E402 - their commands join the app here
cli_hf.register(app)
cli_sweep.register(app)

from . import cli_inspect  # noqa: E402 - the inspect topics join the app here
app.add_typer(cli_inspect.app, name="inspect")


def main() -> None:
    """Console-script entry point: runs the CLI and ends the process (:func:`~.cli_base.run_and_exit`)."""
    run_and_exit(app)


if __name__ == "__main__":
    main()
