"""The ``minigpt`` command (Typer). One short function per subcommand.

Each function parses its options, loads the config, calls one library function
and prints the result. torch is imported inside the commands that need it, so
``minigpt --help`` answers at once. A :class:`~minigpt_cli.errors.MinigptError`,
a usage error, a file or standard output that cannot be written ends as one
line on stderr and exit status 2; a closed pipe (``minigpt generate | head``)
ends quietly with status 0.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import List, Optional

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

try:  # Typer >= 0.20 carries its own copy of click
    from typer._click import exceptions as _click_exc
except ImportError:  # pragma: no cover - older Typer uses click itself
    from click import exceptions as _click_exc

from .errors import Interrupted, MinigptError

EXIT_USAGE = 2


class _StdoutError(Exception):
    """Writing to standard output failed (``> /dev/full``, a full disk); not an OSError, so no file is blamed."""

    def __init__(self, exc: OSError):
        super().__init__(exc.strerror or str(exc))


class _StdoutClosed(Exception):
    """The reader of standard output left (``minigpt generate | head``); not an error.

    Not a BrokenPipeError, which click would turn into exit status 1.
    """


class _GuardedStdout:
    """``sys.stdout`` while a command runs: a failed write raises :class:`_StdoutError` or :class:`_StdoutClosed`.

    Every other attribute is the wrapped stream's.
    """

    def __init__(self, stream):
        self._stream = stream

    def _guard(self, method, *args):
        try:
            return method(*args)
        except BrokenPipeError:
            raise _StdoutClosed() from None
        except OSError as exc:
            raise _StdoutError(exc) from None

    def write(self, text):
        return self._guard(self._stream.write, text)

    def flush(self):
        return self._guard(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _drop_stdout() -> None:
    """Send what is left of standard output to /dev/null, so the flush at exit cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        sys.stdout = open(os.devnull, "w")


class _Group(TyperGroup):
    """Turns user errors into one line on stderr and exit 2, without a traceback.

    Besides :class:`~minigpt_cli.errors.MinigptError` and usage errors, that
    covers a file that cannot be written (an OSError naming a path, or a full
    or read-only disk) and a standard output that cannot be written.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        real_stdout = sys.stdout
        sys.stdout = _GuardedStdout(real_stdout)
        old_term = _install_termination_handlers()
        try:
            rv = super().main(args=args, prog_name=prog_name or "minigpt", complete_var=complete_var,
                              standalone_mode=False, **extra)
            sys.stdout.flush()  # buffered output fails here, not silently at exit
        except _click_exc.NoArgsIsHelpError as exc:  # bare `minigpt`: the help, not an error
            sys.stdout = real_stdout
            print(exc.format_message().rstrip("\n"))
            rv = 0
        except _click_exc.UsageError as exc:
            path = exc.ctx.command_path if exc.ctx is not None else "minigpt"
            _fail(f"{exc.format_message()} (see '{path} --help')")
        except Interrupted as exc:  # asked for: what was saved and how to go on, not an error
            if _other_rank():  # under torchrun every rank stops; rank 0 says so
                sys.exit(exc.exit_code)
            _fail(str(exc), exc.exit_code, prefix="")
        except MinigptError as exc:
            _fail(str(exc), exc.exit_code)
        except _Terminated as exc:
            _fail(f"stopped by {signal.Signals(exc.signum).name} (partial files removed)", 128 + exc.signum,
                  prefix="")
        except (typer.Abort, KeyboardInterrupt):
            print("aborted", file=sys.stderr)
            sys.exit(130)
        except (_StdoutClosed, BrokenPipeError):  # e.g. `minigpt generate | head`: the reader left
            sys.stdout = real_stdout
            _drop_stdout()
            sys.exit(0)
        except _StdoutError as exc:
            sys.stdout = real_stdout
            _drop_stdout()
            _fail(f"cannot write to standard output: {exc}")
        except OSError as exc:
            # A write the library did not wrap: a path (run folder, data folder) that is
            # read-only, full, a file where a folder should be, ... Others are bugs.
            from .fileio import os_error_message

            if exc.filename is None and exc.errno not in _DISK_ERRNOS:
                raise
            _fail(os_error_message(exc))
        except _click_exc.ClickException as exc:
            _fail(exc.format_message())
        finally:
            for sig, handler in old_term.items():
                signal.signal(sig, handler)
            if isinstance(sys.stdout, _GuardedStdout):
                sys.stdout = real_stdout
        code = rv if isinstance(rv, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code


class _Terminated(BaseException):
    """SIGTERM or SIGHUP outside the training loop (which saves and stops on its own)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum, frame):
    raise _Terminated(signum)


def _install_termination_handlers() -> dict:
    """Make SIGTERM and SIGHUP unwind like Ctrl-C does, so ``finally`` blocks remove partial files
    (a download's ``.part``, a new run folder without a checkpoint). The training loop installs
    its own handlers, which save ``checkpoints/last`` first. Returns the handlers replaced."""
    old = {}
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is None:
            continue
        try:
            old[sig] = signal.signal(sig, _raise_terminated)
        except ValueError:  # not the main thread
            pass
    return old


#: OSErrors that mean "the disk said no" even without a file name (a write to an open file).
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


def _fail(message: str, code: int = EXIT_USAGE, prefix: str = "error: ") -> None:
    first = " ".join(str(message).split("\n")).strip()
    if len(first) > _MAX_ERROR:
        first = first[: _MAX_ERROR - 3] + "..."
    print(f"{prefix}{first}", file=sys.stderr)
    sys.exit(code)


#: Longest error line printed; a message quoting a huge value is cut there.
_MAX_ERROR = 2000


class _Command(TyperCommand):
    """A subcommand whose ``--help`` reads like a Unix tool's: ``--top-k K``, ``train [OPTIONS] CONFIG``.

    Typer labels values by Python type (``<int range>``, ``<list[str]>``,
    ``<path>``) and writes a required argument as ``{config}``. Here every
    value shows its metavar: the one the option declares, else one derived
    from its type (:func:`_default_metavar`); arguments appear as ``CONFIG``
    (required) or ``[CONFIG]`` (optional).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.metavar is None and not getattr(param, "is_flag", False):
                param.metavar = _default_metavar(param)

    def collect_usage_pieces(self, ctx):
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                pieces.append(param.metavar if param.required else f"[{param.metavar}]")
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces

    def format_options(self, ctx, formatter):
        arguments, options = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if isinstance(param, TyperArgument):
                arguments.append((param.metavar, record[1]))  # without Typer's type label
            else:
                options.append(record)
        for title, rows in (("Arguments", arguments), ("Options", options)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def _default_metavar(param) -> str:
    """``N`` for integers, ``X`` for other numbers, ``PATH``, ``TEXT``; an argument's own name in capitals."""
    if isinstance(param, TyperArgument):
        return param.name.upper()
    annotation = param.type_descriptor.annotation
    args = getattr(annotation, "__args__", None)
    if param.type_descriptor.is_list and args:
        annotation = args[0]
    return {int: "N", float: "X", Path: "PATH"}.get(annotation, "TEXT")


app = typer.Typer(
    name="minigpt",
    cls=_Group,
    help="Train, sample and measure small GPT models (decoder-only Transformers).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain click help: no boxes or type labels, and as wide as the terminal (up to 120 columns).
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120},
)


def _echo(message: str) -> None:
    """A status line on stderr. A stderr that cannot be written (closed pipe, full disk) loses
    the line, not the run: a training must not die, unsaved, because `2>&1 | head` went away."""
    try:
        print(message, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


# ----------------------------------------------------------------------------- download


@app.command(cls=_Command)
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
    from .download import DATASET, download_tinyshakespeare

    if dataset != DATASET:
        raise MinigptError(f"unknown dataset {dataset!r}; known datasets: {DATASET}")
    path, fetched = download_tinyshakespeare(data_dir, url=url, force=force, progress=progress,
                                             mirror_hint="pass another --url" if url else None)
    size = path.stat().st_size
    if fetched:
        print(f"downloaded {path} ({size:,} bytes, sha256 verified)")
    else:
        print(f"{path} is already here ({size:,} bytes, sha256 verified); --force fetches it again")


# ----------------------------------------------------------------------------- tokenizer


@app.command("train-tokenizer", cls=_Command)
def train_tokenizer_cmd(
    config: Optional[Path] = typer.Argument(None, help="A config whose tokenizer and data sections to use."),
    kind: Optional[str] = typer.Option(None, "--kind", metavar="KIND", help="char, bpe, wordpiece or unigram (default: the config's)."),
    vocab_size: Optional[int] = typer.Option(
        None, "--vocab-size", min=1, help="Entries in all, special tokens included (ignored for char)."
    ),
    input: Optional[Path] = typer.Option(None, "--input", metavar="FILE", help="Text to train on (default: the config's corpus)."),
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

    cfg = load_config(config, set_) if config else validate(apply_overrides({}, set_), "--set")
    if compare:
        if kind is not None or output is not None:
            raise MinigptError("--compare trains every kind and writes nothing; drop --kind and --output")
        print(run_compare(cfg, vocab_size=vocab_size, input_path=input, special_tokens=special_tokens, echo=_echo))
        return
    print(run_train_tokenizer(cfg, kind=kind, vocab_size=vocab_size, input_path=input, output_path=output,
                              special_tokens=special_tokens, echo=_echo))


# ----------------------------------------------------------------------------- train


@app.command(cls=_Command)
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
    DistributedDataParallel.

    \b
    Example: minigpt train configs/shakespeare-cpu.yaml --set train.max_iters=500
    """
    from .config import load_config

    cfg = load_config(config, set_)
    if resume is not None and run_name is not None:
        raise MinigptError("pass either --resume or --run-name, not both (a resumed run keeps its folder)")
    from .train import describe_resume, describe_schedule, train as run_training

    if dry_run:
        print(describe_schedule(cfg))
        if resume is not None:
            print("\n" + "\n".join(describe_resume(cfg, resume)))
        return
    result = run_training(cfg, run_name=run_name, echo=_echo, progress=progress, resume=resume,
                          config_path=config, overrides=set_)
    if result.already_done:
        n = cfg.train.max_iters
        where = "reached" if result.step == n else f"is at step {result.step}, past"
        print(f"{result.run_dir} already {where} train.max_iters={n}; nothing was trained. To train longer, "
              f"raise it, e.g. --set train.max_iters={max(2 * result.step, result.step + 1)}")
        return
    if _other_rank():  # under torchrun, rank 0 reports for all
        return
    val = f"{result.val_loss:.4f}" if result.val_loss is not None else "n/a"
    print(f"trained to step {result.step}; final val loss {val}; run folder {result.run_dir}")
    print(f"sample from it with: minigpt generate --run {shlex.quote(str(result.run_dir))}")


# ----------------------------------------------------------------------------- generate


@app.command(cls=_Command)
def generate(
    run: Optional[Path] = typer.Option(None, "--run", metavar="DIR", help="Run folder (default: the most recent under runs/)."),
    prompt: Optional[str] = typer.Option(
        None, "--prompt", metavar="TEXT", help="Text to continue; '-' reads it from standard input (default: the config's sample.prompt)."
    ),
    prompt_file: Optional[Path] = typer.Option(None, "--prompt-file", metavar="FILE", help="Read the prompt from this UTF-8 file."),
    max_new_tokens: Optional[int] = typer.Option(
        None, "--max-new-tokens", min=0, help="Tokens to generate; 0 prints the prompt back unchanged."
    ),
    temperature: Optional[float] = typer.Option(None, "--temperature", min=0.0, metavar="T", help="0 means greedy."),
    top_k: Optional[int] = typer.Option(None, "--top-k", min=1, metavar="K", help="Keep only the k most likely tokens."),
    top_p: Optional[float] = typer.Option(None, "--top-p", metavar="P",
                                          help="Nucleus sampling, 0 < p <= 1: keep the smallest set of tokens reaching mass p."),
    stop: List[str] = typer.Option(
        [], "--stop", metavar="TEXT", help="End a sample when this text appears in the generated text; it is not printed (repeatable)."
    ),
    num_samples: Optional[int] = typer.Option(
        None, "--num-samples", min=1, help="Independent samples, each after a '----- sample N -----' line (20 dashes each side)."
    ),
    seed: int = typer.Option(1337, "--seed", metavar="S", help="Random seed for sampling, 0 .. 2**63-1."),
    stream: bool = typer.Option(True, "--stream/--no-stream", help="Print tokens as they are produced."),
    kv_cache: bool = typer.Option(True, "--kv-cache/--no-kv-cache", help="Reuse past keys and values."),
    window_stride: Optional[int] = typer.Option(
        None, "--window-stride", min=1,
        help="Past block_size, drop this many oldest tokens at once (1: slide token by token; "
             "default: the run's sample.window_stride, else block_size // 4).",
    ),
    checkpoint: str = typer.Option(
        "best", "--checkpoint", metavar="best|last",
        help="best: the weights with the lowest val loss; last: the most recent save.",
    ),
    device: str = typer.Option("auto", "--device", metavar="DEVICE", help="auto, cpu, cuda, cuda:N or mps."),
) -> None:
    """Sample text from a trained run.

    Each sample is printed as the prompt, the new text and a newline.

    \b
    Example:
      minigpt generate --prompt "ROMEO:" --max-new-tokens 300 --stop "JULIET:"
    """
    from .generate import read_prompt, run_generate

    run_generate(
        run=run, prompt=read_prompt(prompt, prompt_file, sys.stdin), max_new_tokens=max_new_tokens,
        temperature=temperature, top_k=top_k, top_p=top_p, num_samples=num_samples, seed=seed, stream=stream,
        use_cache=kv_cache, which=checkpoint, device=device, out=sys.stdout, echo=_echo, stop=stop,
        window_stride=window_stride,
    )


# ----------------------------------------------------------------------------- count-params


@app.command("count-params", cls=_Command)
def count_params(
    preset: Optional[str] = typer.Option(None, "--preset", metavar="NAME", help="A preset name (see --list)."),
    config: Optional[Path] = typer.Option(None, "--config", metavar="CONFIG", help="A config file."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", min=1, metavar="T", help="Context length for FLOPs (default block_size)."),
    tokens: Optional[float] = typer.Option(None, "--tokens", min=1, metavar="N", help="Training tokens, for total FLOPs (e.g. 3e11)."),
    vocab_size: Optional[int] = typer.Option(None, "--vocab-size", min=1, help="Vocabulary size; overrides the config's (needed where it is null), e.g. 50304 for a padded GPT-2."),
    dtype: str = typer.Option("float32", "--dtype", metavar="DTYPE", help="float32, bfloat16 or float16, for the memory estimate."),
    batch_size: int = typer.Option(1, "--batch-size", min=1, help="Sequences per step, for the activation estimate."),
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
    if dtype not in ("float32", "bfloat16", "float16"):
        raise MinigptError(f"--dtype {dtype!r}: use float32, bfloat16 or float16")
    if tokens is not None and tokens == float("inf"):
        raise MinigptError("--tokens inf: give a finite number of training tokens, e.g. --tokens 3e11")
    if tokens is not None and tokens != int(tokens):
        raise MinigptError(f"--tokens {tokens:g}: give a whole number of training tokens, e.g. --tokens 3e11")
    from . import params

    source = paths.preset_path(preset) if preset else config
    cfg = load_config(source, set_)
    vocab = vocab_size or cfg.model.vocab_size or cfg.tokenizer.vocab_size
    if vocab is None and cfg.tokenizer.kind == "char":
        specials = len(cfg.tokenizer.special_tokens)
        vocab = 65 + specials  # Tiny Shakespeare's alphabet, as train would find it
        _echo(f"note: model.vocab_size is null; counting with {vocab} entries (Tiny Shakespeare's 65 characters"
              f"{f' and {specials} special token' + 's' * (specials > 1) if specials else ''}); "
              "pass --vocab-size N for another corpus")
    mc = cfg.model
    if seq_len is not None and seq_len > mc.block_size:
        _echo(f"note: --seq-len {seq_len:,} is beyond block_size {mc.block_size:,}, the longest context the "
              f"model takes; the FLOPs and memory at {seq_len:,} are arithmetic only")
    rep = params.report(mc, seq_len=seq_len, tokens=int(tokens) if tokens else None,
                        vocab_size=vocab, dtype=dtype, batch_size=batch_size)
    if as_json:
        print(json.dumps(rep, indent=1))
    else:
        print(params.format_report(rep, title=preset or str(config)))


# ----------------------------------------------------------------------------- bench


@app.command(cls=_Command)
def bench(
    config: Path = typer.Argument(..., help="YAML config whose model, batch, device and dtype to measure."),
    set_: List[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="Override a config key: section.key=value (repeatable)."),
    iters: int = typer.Option(20, "--iters", min=1, help="Timed optimizer steps (after 3 warm-up steps)."),
    prompt_len: int = typer.Option(1, "--prompt-len", min=1, help="Prompt tokens for the generation measurement."),
    max_new_tokens: int = typer.Option(500, "--max-new-tokens", min=1, help="Tokens generated with and without the cache."),
    generation: bool = typer.Option(True, "--generation/--no-generation", help="Also measure generation."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Measure training tokens/s, MFU (against a matmul peak measured in the same run) and generation speed.

    \b
    Example: minigpt bench configs/shakespeare-cpu.yaml --iters 50 --json
    """
    from .config import load_config

    cfg = load_config(config, set_)
    from .bench import bench as run_bench, format_bench

    result = run_bench(cfg, iters=iters, prompt_len=prompt_len, max_new_tokens=max_new_tokens,
                       generation=generation, echo=_echo)
    print(json.dumps(result, indent=1) if as_json else format_bench(result))


def _other_rank() -> bool:
    """True in a torchrun process other than rank 0 (``RANK`` set and not 0)."""
    return os.environ.get("RANK", "0").strip() not in ("", "0")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
