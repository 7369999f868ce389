"""Save and load checkpoints atomically, each file's sha256 in meta.json, and when a run saves
(:class:`Checkpointer`).

A checkpoint is written into a temporary sibling, fsynced and renamed into place, so a kill at any
moment leaves the previous one loadable (:func:`~.folder.resolve`); the README describes its files.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from ..config.schema import Config, ConfigError, ModelConfig, load_config
from ..errors import MinigptError
from ..fileio import (
    Bounds,
    check_readable,
    chmod_quietly,
    dir_mode,
    errors_as,
    new_file_mode,
    open_regular,
    os_error,
    read_problem,
)
from ..model.gpt import GPT, sinusoidal_table
from ..runtime.distributed import load_model_state
from .folder import (
    BEST,
    CONFIG,
    EMA,
    LAST,
    META,
    STATE,
    WEIGHTS,
    checkpoint_dir,
    kept_name,
    meta_digest,
    old_copy,
    read_meta,
    resolve,
    steady,
)

#: Prefixes of a wrapped model's state dict: torch.compile's and DistributedDataParallel's.
_PREFIXES = ("_orig_mod.", "module.")


#: Test hook: "NAME:N:POINT" SIGKILLs the process in the N-th save of folder NAME, at POINT ("weights": half-way
#: through the temporary folder; "swap": between moving the old folder aside and renaming the new one in).
_KILL_HOOK = "MINIGPT_TEST_KILL_DURING_SAVE"
_save_counts: dict[str, int] = {}


def _maybe_die(name: str, point: str) -> None:
    if os.environ.get(_KILL_HOOK) == f"{name}:{_save_counts.get(name, 0)}:{point}":
        os.kill(os.getpid(), signal.SIGKILL)


def _fsync_dir(path: Path) -> None:
    with suppress(OSError):  # a file system that cannot fsync a folder: the rename still happened
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _unprefixed(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``sd`` without a compiled or DDP-wrapped model's key prefixes (:data:`_PREFIXES`)."""
    out = {}
    for key, value in sd.items():
        while key.startswith(_PREFIXES):
            key = key.split(".", 1)[1]
        out[key] = value
    return out


def model_state(model: torch.nn.Module | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's tensors for safetensors: no wrapper prefix, tied head stored once. ``model`` may
    also be its full state dict already gathered (FSDP's
    :func:`~minigpt_cli.runtime.distributed.gather_state`)."""
    if isinstance(model, Mapping):
        return {k: v.detach().contiguous().cpu() for k, v in _unprefixed(model).items()}
    model = getattr(model, "_orig_mod", model)
    model = getattr(model, "module", model)  # DistributedDataParallel
    sd = {k: v.detach().contiguous().cpu() for k, v in _unprefixed(model.state_dict()).items()}
    if getattr(model, "config", None) is not None and model.config.tie_weights:
        sd.pop("lm_head.weight", None)
    return sd


def sha256(path: Path) -> str:
    """The hex sha256 of a regular file, read 16 MiB at a time. Raises OSError
    (:class:`~minigpt_cli.fileio.NotRegularFile` for a FIFO, socket or device)."""
    digest = hashlib.sha256()
    with open_regular(path) as f:
        while chunk := f.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


_unchecked_said: set[Path] = set()
#: What :func:`~minigpt_cli.fileio.read_problem` calls each file of a checkpoint folder.
_KINDS = {
    WEIGHTS: "checkpoint weights",
    EMA: "checkpoint EMA weights",
    STATE: "trainer state",
    CONFIG: "checkpoint config",
    META: "checkpoint metadata",
}


def verify(directory: Path, name: str, what: str, fix: str) -> Path:
    """``directory/name`` once its sha256 matches the one ``meta.json`` recorded (else the error
    ``what``; ``fix``); one from before the checksums loads unverified, with a note on stderr.
    Raises MinigptError: unreadable, damaged."""
    path = directory / name
    recorded = (read_meta(directory).get("sha256") or {}).get(name)
    with errors_as(
        {OSError: lambda exc: read_problem(exc, path, _KINDS.get(name, "checkpoint file"), fix)}
    ):
        intact = recorded is None or sha256(path) == recorded
    if not intact:
        raise MinigptError(f"{what} (not the sha256 its meta.json recorded)", fix, path=path)
    if recorded is None and directory not in _unchecked_said:
        _unchecked_said.add(directory)
        print(
            f"note: {directory} was written before checkpoints recorded their sha256; its files are "
            "not verified",
            file=sys.stderr,
        )
    return path


def save(
    directory: Path,
    model: torch.nn.Module,
    config: Config,
    trainer_state: Optional[dict[str, Any]] = None,
    meta: Optional[dict[str, Any]] = None,
    ema: Optional[Mapping[str, torch.Tensor]] = None,
) -> Path:
    """Write the checkpoint folder ``directory`` atomically, each file's sha256 in its meta.json.
    ``model``: the GPT (compiled or DDP-wrapped) or its full state dict (FSDP's, gathered);
    ``ema``: the moving average of its weights (``train.ema_decay``), saved beside them. Raises
    MinigptError when it cannot be written (disk full, read-only); the previous checkpoint is kept
    and no temporary folder is left."""
    directory = Path(directory)
    _save_counts[directory.name] = _save_counts.get(directory.name, 0) + 1
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.tmp-"))
    chmod_quietly(tmp, dir_mode())  # mkdtemp makes 0700; a checkpoint is as readable as any file
    try:
        with errors_as(
            {
                OSError: os_error(directory, "write"),
                (SafetensorError, RuntimeError): lambda exc: _failed_write(exc, directory),
            }
        ):
            _write_folder(tmp, directory, model, config, trainer_state, meta, ema)
    finally:  # a failure or an interrupt: no temporary folder stays (after the swap, the name is gone already)
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def _write_folder(
    tmp: Path, directory: Path, model, config: Config, trainer_state, meta, ema
) -> None:
    """:func:`save`'s files into ``tmp``, fsynced, then ``tmp`` swapped in as ``directory``."""
    save_file(model_state(model), str(tmp / WEIGHTS), metadata={"format": "pt"})
    chmod_quietly(tmp / WEIGHTS, new_file_mode())  # safetensors creates it 0600
    if ema is not None:
        save_file(model_state(ema), str(tmp / EMA), metadata={"format": "pt"})
        chmod_quietly(tmp / EMA, new_file_mode())
    _maybe_die(directory.name, "weights")
    if trainer_state is not None:
        torch.save(trainer_state, tmp / STATE)
    (tmp / CONFIG).write_text(config.to_yaml(), encoding="utf-8")
    sums = {f.name: sha256(f) for f in sorted(tmp.iterdir())}
    fields = {**(meta or {}), "sha256": sums}
    (tmp / META).write_text(
        json.dumps({**fields, "meta_sha256": meta_digest(fields)}, indent=1), encoding="utf-8"
    )
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    _fsync_dir(tmp)
    old = old_copy(directory)
    if directory.exists():
        # The current checkpoint becomes the old one; a previous .old is stale then.
        if old.exists():
            shutil.rmtree(old)
        os.replace(directory, old)
    # Else a kill inside an earlier swap left .old as the only complete copy: it
    # stays until the new folder is in place.
    _maybe_die(directory.name, "swap")
    os.replace(tmp, directory)
    _fsync_dir(directory.parent)
    shutil.rmtree(old, ignore_errors=True)


def _failed_write(exc: BaseException, directory: Path) -> Optional[MinigptError]:
    """A failed write (disk full) that safetensors or torch.save reports as its own error, in C++
    words ("[enforce fail at inline_container.cc:672]"), said as the OS would say it; None for
    anything else (a bug)."""
    text = str(exc).lower()
    if not isinstance(exc, SafetensorError) and not (
        any(w in text for w in _WRITE_FAILURES) or _disk_low(directory)
    ):
        return None
    full = _disk_low(directory) or any(
        w in text for w in ("no space", "storagefull", "os error 28")
    )
    reason = os.strerror(errno.ENOSPC) if full else "the write failed"
    return MinigptError(
        f"cannot write {directory}: {reason}",
        "free some disk space or choose another train.out_dir",
    )


#: Words of torch.save's and safetensors' messages for a write that failed (a full disk shows as
#: "basic_ios::clear: iostream error" or "unexpected pos N vs M" from PyTorch's zip writer).
_WRITE_FAILURES = ("writ", "iostream", "unexpected pos", "no space", "disk")


def _disk_low(directory: Path, least: int = 64 << 20) -> bool:
    """Whether the file system of ``directory`` has less than ``least`` bytes free (unknown:
    False)."""
    with suppress(OSError):
        return shutil.disk_usage(directory.parent).free < least
    return False


def sweep_stale_temps(checkpoints_dir: Path) -> list[Path]:
    """Remove (and return) the temporary folders ``.NAME.tmp-*`` a process killed inside
    :func:`save` left; only under the run's lock. The ``.NAME.old`` copies stay: :func:`resolve` may
    need one."""
    removed = []
    for entry in sorted(Path(checkpoints_dir).glob(".*.tmp-*")):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _read_weights(weights: Path, fix: str) -> dict[str, torch.Tensor]:
    """The verified (:func:`verify`) tensors of a checkpoint's safetensors file, without wrapper
    prefixes."""
    verify(
        weights.parent,
        weights.name,
        f"checkpoint weights {str(weights)!r} are corrupt or truncated",
        fix,
    )
    check_readable(
        weights, _KINDS[WEIGHTS]
    )  # unreadable is not corrupt (checkpoints without sha256)
    with errors_as(
        {
            (SafetensorError, OSError, ValueError, RuntimeError): lambda exc: MinigptError(
                f"checkpoint weights {str(weights)!r} are corrupt or truncated "
                f"({str(exc).splitlines()[0]})",
                fix,
            )
        }
    ):
        return _unprefixed(load_file(str(weights), device="cpu"))


def saved_config(directory: Path) -> Config:
    """The verified config.yaml of a checkpoint folder (resolved as :func:`resolve` does, read as
    :func:`~.folder.steady` reads). Raises MinigptError: missing, damaged or not matching its sha256
    (the message says the checkpoint's copy is the problem)."""
    return steady(directory, lambda: _saved_config(directory))


def _saved_config(directory: Path) -> Config:
    directory = resolve(directory)
    path = directory / CONFIG
    fix = f"restore {path} from the run's own config.yaml, which has the same content"
    verify(directory, CONFIG, "the checkpoint's config is damaged", fix)
    check_readable(path, _KINDS[CONFIG])  # unreadable is not damaged (checkpoints without sha256)
    with errors_as(
        {ConfigError: lambda exc: MinigptError(f"the checkpoint's config is damaged ({exc})", fix)}
    ):
        return load_config(path)


@contextmanager
def _no_init():
    """``torch.nn.init``'s initialisers as no-ops, for a model whose every weight is loaded next (as
    transformers' ``no_init_weights``); the tensors keep whatever memory held."""
    names = ("normal_", "uniform_", "kaiming_uniform_", "zeros_", "ones_")
    saved = {name: getattr(torch.nn.init, name) for name in names}
    for name in names:
        setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def _check_keys(sd: dict[str, torch.Tensor], model: GPT, weights: Path, what: str) -> None:
    """Refuse weights whose names are not the model's, or that do not fit its shapes."""
    if model.config.tie_weights:
        sd.pop("lm_head.weight", None)
    expected, got = (
        set(model.state_dict()) - ({"lm_head.weight"} if model.config.tie_weights else set()),
        set(sd),
    )
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    wrong = next(
        (k for k, v in sd.items() if tuple(v.shape) != shapes.get(k, tuple(v.shape))), None
    )
    if expected != got or wrong is not None:
        why = wrong and f"{wrong}: shape {tuple(sd[wrong].shape)}, the model's {shapes[wrong]}"
        missing, extra = sorted(expected - got)[:3], sorted(got - expected)[:3]
        raise MinigptError(
            f"checkpoint weights {str(weights)!r} do not match {what} (missing {missing}, "
            f"unexpected {extra}); the checkpoint is damaged"
            if expected != got
            else f"checkpoint weights {str(weights)!r} do not fit {what} ({why})"
        )


def _other_hint(directory: Path) -> str:
    # Every command that loads a model (generate, evaluate, export, inspect) takes --checkpoint.
    other = {BEST: LAST, LAST: BEST}.get(directory.name.strip(".").removesuffix(".old"))
    return (
        f"use the other checkpoint (--checkpoint {other}) or retrain"
        if other
        else "use another checkpoint or retrain"
    )


def load_model(
    directory: Path, device: str | torch.device = "cpu", ema: bool = False
) -> tuple[GPT, Config]:
    """Rebuild the model (eval mode) from a checkpoint folder alone, each file verified, all from
    one checkpoint while a run saves (:func:`~.folder.steady`); ``ema``: with the moving average of
    the weights where the checkpoint holds one (:func:`has_ema`). Raises MinigptError, naming the
    file: missing, truncated, corrupt or altered files, or weights that do not fit the config."""
    return steady(directory, lambda: _load_model(directory, device, ema))


def has_ema(directory: Path) -> bool:
    """Whether a checkpoint holds the moving average of its weights (a run with
    ``train.ema_decay``): its meta.json lists ``ema.safetensors``, or, written before the
    checksums, the file is there. A listed file that is missing is the loader's error, not a run
    without EMA."""
    directory = resolve(directory)
    return EMA in (read_meta(directory).get("sha256") or {}) or (directory / EMA).is_file()


def _missing_ema(directory: Path, fix: str) -> None:
    """Refuse a checkpoint whose meta.json lists ``ema.safetensors`` where there is none: its
    weights would pass for the run's average."""
    if not (directory / EMA).is_file():
        raise MinigptError(
            f"{directory / EMA} is missing, and this checkpoint's meta.json lists it (the run kept "
            "a moving average of its weights)",
            fix,
        )


def _load_model(directory: Path, device: str | torch.device, ema: bool) -> tuple[GPT, Config]:
    directory = resolve(directory)
    config = saved_config(directory)
    averaged = ema and has_ema(directory)
    if averaged:
        _missing_ema(
            directory,
            "restore it, read another checkpoint (--checkpoint), or take the trained weights "
            "with --raw-weights",
        )
    weights = directory / (EMA if averaged else WEIGHTS)
    sd = _read_weights(weights, _other_hint(directory))
    if config.model.vocab_size is None:
        config.model.vocab_size = int(sd["wte.weight"].shape[0]) if "wte.weight" in sd else 1
    # Big models are built on the meta device (no memory for weights about to be replaced); small
    # ones on the CPU with the initialisers off: initialising meta tensors imports torch._dynamo (2
    # s, longer than generating 200 tokens takes) and real ones draw random numbers for nothing
    # (0.15-0.7 s at 10.7M parameters).
    m = config.model  # about 12·L·d² + V·d parameters (Kaplan et al. 2020 §2.1)
    big = 12 * m.n_layer * m.n_embd**2 + m.vocab_size * m.n_embd > 100_000_000
    with torch.device("meta") if big else _no_init():
        model = GPT(config.model)
    _check_keys(sd, model, weights, "its config.yaml")
    model.load_state_dict(sd, strict=False, assign=True)
    if config.model.tie_weights:
        model.lm_head.weight = model.wte.weight
    # Buffers that are not saved (sinusoidal table) are rebuilt on a real device.
    if config.model.pos_encoding == "sinusoidal":
        model.pos_table = sinusoidal_table(config.model.block_size, config.model.n_embd)
    model.to(device)
    model.eval()
    return model, config


_RESUME_FIX = "start a new run or restore the file"


def verify_weights(directory: Path) -> Path:
    """The checkpoint's weights file once its sha256 matches meta.json's (what resuming loads;
    ``--dry-run`` checks it without loading). Raises MinigptError: an unreadable, corrupt or altered
    file."""
    weights = resolve(directory) / WEIGHTS
    return verify(
        weights.parent,
        weights.name,
        f"checkpoint weights {str(weights)!r} are corrupt or truncated",
        _RESUME_FIX,
    )


def check_resume_weights(directory: Path, config: Optional[ModelConfig]) -> Path:
    """The checkpoint's weights file once it is intact (:func:`verify_weights`) and its header names
    the tensors of a model of ``config``, in their shapes (nothing is loaded): what resuming refuses
    before it writes into the run folder. Raises MinigptError: an unreadable, corrupt or altered
    file, or other tensors."""
    weights = verify_weights(directory)
    if config is None:
        return weights
    with errors_as(
        {
            (SafetensorError, OSError, ValueError, RuntimeError): lambda exc: MinigptError(
                f"checkpoint weights {str(weights)!r} are corrupt or truncated "
                f"({str(exc).splitlines()[0]})",
                _RESUME_FIX,
            )
        }
    ):
        with safe_open(str(weights), framework="pt") as f:
            header = {k: torch.empty(f.get_slice(k).get_shape(), device="meta") for k in f.keys()}
    with torch.device("meta"), _no_init():
        model = GPT(config)
    _check_keys(_unprefixed(header), model, weights, "the model of the run's config")
    ema = weights.parent / EMA
    if ema.is_file():  # its tensors are checked when the resume loads it (read_ema)
        verify(ema.parent, EMA, f"checkpoint EMA weights {str(ema)!r} are corrupt", _RESUME_FIX)
    return weights


def load_weights_into(model: GPT, directory: Path) -> None:
    """Load a checkpoint's verified weights into an existing model (resuming), FSDP-sharded or not.
    Raises MinigptError: a corrupt, truncated or altered file, or weights of another shape."""
    weights = resolve(directory) / WEIGHTS
    sd = _read_weights(weights, _RESUME_FIX)
    _check_keys(sd, model, weights, "the model of the run's config")
    load_model_state(model, sd)


def read_ema(directory: Path, model: GPT) -> Optional[dict[str, torch.Tensor]]:
    """A checkpoint's verified moving average of the weights, checked to fit ``model``; None when
    it holds none (trained without ``train.ema_decay``). Raises MinigptError: a corrupt,
    truncated or altered file, or tensors of another model."""
    path = resolve(directory) / EMA
    if not has_ema(path.parent):
        return None
    _missing_ema(path.parent, "restore it, or resume from another checkpoint of the run")
    sd = _read_weights(path, _RESUME_FIX)
    _check_keys(sd, model, path, "the model of the run's config")
    return sd


def state_bounds(weights_bytes: int) -> Bounds:
    """The most a ``trainer_state.pt`` beside a weights file of ``weights_bytes`` may hold: the
    optimizer's moments (AdamW keeps two float32 values per weight: 4x a bfloat16 weights file at
    most) and 64 MiB for the rest (RNG states, the schedule's and the data order's counters)."""
    return Bounds(4 * weights_bytes + (64 << 20))


def load_trainer_state(directory: Path) -> dict[str, Any]:
    """The verified ``trainer_state.pt``, read with ``weights_only=True`` (no code runs on load).
    Raises MinigptError, naming it: a missing, truncated, altered or unsafe file."""
    directory = resolve(directory)
    path = directory / STATE
    if path.is_file() and (directory / WEIGHTS).is_file():  # else verify names what is missing
        check_readable(path, _KINDS[STATE], state_bounds((directory / WEIGHTS).stat().st_size))
    verify(
        directory,
        STATE,
        f"trainer state {str(path)!r} is corrupt",
        "use another checkpoint or start a new run",
    )
    # An OSError is the file's (unreadable, a dangling link); unpickling errors come in many types.
    with errors_as(
        {
            FileNotFoundError: lambda exc: (
                read_problem(exc, path, _KINDS[STATE])
                if path.is_symlink()
                else MinigptError(f"{str(path)!r} not found; this checkpoint cannot be resumed")
            ),
            OSError: lambda exc: read_problem(exc, path, _KINDS[STATE]),
            Exception: lambda exc: MinigptError(
                f"trainer state {str(path)!r} is corrupt or unsafe to load ({type(exc).__name__})",
                "use another checkpoint or start a new run",
            ),
        }
    ):
        return torch.load(path, map_location="cpu", weights_only=True)


@dataclass
class Checkpointer:
    """When a run saves, and where (after each eval ``best`` if improved, then ``last``;
    ``step-NNNNNNN`` every ``train.keep_every`` steps; ``last`` on a stop). ``snapshot()`` gives
    ``(model, trainer_state, meta)``; rank 0 (``enabled``) writes, and with ``collective`` (FSDP's
    gather) every rank snapshots. ``ema`` gives the moving average of the weights to save beside
    them (``train.ema_decay``)."""

    run_dir: Path
    config: Config
    snapshot: Callable[[], tuple[torch.nn.Module, dict[str, Any], dict[str, Any]]]
    enabled: bool = True
    collective: bool = False
    ema: Optional[Callable[[], Mapping[str, torch.Tensor]]] = None

    @property
    def last(self) -> Path:
        """The folder of the ``last`` checkpoint."""
        return checkpoint_dir(self.run_dir, LAST)

    def save(self, which: str) -> None:
        """Write checkpoint ``which`` (``last``, ``best`` or a kept step's name) now."""
        if self.enabled or self.collective:
            model, state, meta = self.snapshot()
            if self.enabled:
                ema = self.ema() if self.ema is not None else None
                save(checkpoint_dir(self.run_dir, which), model, self.config, state, meta, ema)

    def after_eval(self, improved: bool) -> None:
        """An eval ended: ``best`` if its val loss is the lowest so far, then ``last``."""
        if improved:
            self.save(BEST)
        self.save(LAST)

    def after_step(self, step: int) -> None:
        """Optimizer step ``step`` ended: keep ``step-NNNNNNN`` every ``train.keep_every`` steps."""
        keep = self.config.train.keep_every
        if keep and step % keep == 0:
            self.save(kept_name(step))

    def on_stop(self) -> None:
        """A stop was requested: save ``last`` so that ``--resume`` continues from here."""
        self.save(LAST)

    def last_step(self) -> Optional[int]:
        """The step of the ``last`` checkpoint on disk; None when there is none (or it is
        unreadable)."""
        with suppress(MinigptError):
            return read_meta(self.last).get("step")
        return None
