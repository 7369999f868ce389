"""The training loop: data, AdamW, schedule, evaluation, checkpoints, logging.

The loop body stays short; each component decides when it acts
(:meth:`Schedule.lr`, :func:`should_eval`, :class:`~minigpt_cli.metrics.RunLogger`).
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from . import checkpoint
from .config import Config, TrainConfig
from .device import resolve_device, resolve_dtype
from .data import BatchSampler, PreparedData, ensure_corpus, ensure_tokenizer, prepare
from .errors import MinigptError
from .generate import generate_tokens
from .metrics import RunLogger
from .model import GPT
from .paths import dataset_dir
from .tokenizer import Tokenizer


# ----------------------------------------------------------------------------- schedule


def lr_at(step: int, tc: TrainConfig, n_embd: int = 512) -> float:
    """Learning rate for optimizer step ``step`` (0-based).

    Linear warmup reaching ``learning_rate`` after ``warmup_iters`` steps and
    above zero on the first (nanoGPT: lr·(step+1)/(warmup+1)), then

    - cosine: half a cosine from learning_rate down to min_lr at lr_decay_iters
      (Loshchilov & Hutter 2017, SGDR, without restarts);
    - linear: a straight line down to min_lr;
    - constant: learning_rate;
    - inverse_sqrt: d^-0.5 · min(s^-0.5, s · warmup^-1.5) with s = step+1,
      scaled by learning_rate (Vaswani et al. 2017 §5.3; learning_rate 1 gives
      the paper's values).
    """
    if tc.lr_schedule == "inverse_sqrt":
        s = step + 1
        w = max(tc.warmup_iters, 1)
        return tc.learning_rate * n_embd ** -0.5 * min(s ** -0.5, s * w ** -1.5)
    if step < tc.warmup_iters:
        return tc.learning_rate * (step + 1) / (tc.warmup_iters + 1)
    if tc.lr_schedule == "constant":
        return tc.learning_rate
    decay_iters = tc.lr_decay_iters or tc.max_iters
    if step >= decay_iters:
        return tc.min_lr
    span = max(decay_iters - tc.warmup_iters, 1)
    ratio = (step - tc.warmup_iters) / span
    if tc.lr_schedule == "linear":
        coeff = 1.0 - ratio
    else:
        coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return tc.min_lr + coeff * (tc.learning_rate - tc.min_lr)


def should_eval(step: int, tc: TrainConfig) -> bool:
    """Evaluate before the first step, every ``eval_interval`` steps, and after the last."""
    return step % tc.eval_interval == 0 or step == tc.max_iters


def make_optimizer(model: GPT, tc: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019) with weight decay on matrices only (nanoGPT).

    Biases, norm gains and other vectors get no decay. Fused on CUDA.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": tc.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    kwargs = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=tc.learning_rate, betas=(tc.beta1, tc.beta2), **kwargs)


# ----------------------------------------------------------------------------- setup


def new_run_dir(cfg: Config, run_name: Optional[str]) -> Path:
    """``runs/<run_name>``, or ``runs/<name>-<YYYYmmdd-HHMMSS>``; refuses to reuse a folder.

    Raises:
        MinigptError: the run folder already exists.
    """
    root = Path(cfg.train.out_dir)
    name = run_name or f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if run_name is not None and (not name or "/" in name or name in (".", "..")):
        raise MinigptError(f"--run-name {name!r} must be a plain folder name")
    run_dir = root / name
    if run_dir.exists() and any(run_dir.iterdir()):
        raise MinigptError(f"run folder {str(run_dir)!r} already exists; pick another --run-name or delete it")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def git_commit() -> Optional[str]:
    """The project's git commit, if the package runs from a checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=5,
        )
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def env_info(device: torch.device, dtype: torch.dtype) -> dict:
    """Versions, device and git commit, for env.json."""
    import importlib.metadata as md

    def ver(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    info = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "minigpt": ver("minigpt-cli"),
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "git_commit": git_commit(),
        "argv": sys.argv,
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ----------------------------------------------------------------------------- loop


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    train_loss: Optional[float]
    val_loss: Optional[float]
    best_val_loss: Optional[float]


@torch.no_grad()
def estimate_loss(model: GPT, samplers: dict[str, BatchSampler], iters: int, autocast) -> dict[str, float]:
    """Mean loss over ``iters`` batches of each split, in eval mode, without gradients."""
    model.eval()
    out = {}
    for split, sampler in samplers.items():
        losses = torch.zeros(iters)
        for i in range(iters):
            x, y = sampler.next()
            with autocast:
                _, loss = model(x, y)
            losses[i] = loss.float()
        out[split] = losses.mean().item()
    model.train()
    return out


def sample_text(model: GPT, tok: Tokenizer, device: torch.device, n_tokens: int, seed: int) -> str:
    """A short sample from a newline prompt (char) or the first token, for samples.txt."""
    model.eval()
    try:
        prompt = tok.encode("\n")
    except MinigptError:
        prompt = [0]
    idx = torch.tensor([prompt], dtype=torch.long, device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    ids = [int(t[0]) for t in generate_tokens(model, idx, n_tokens, temperature=0.8, top_k=200, generator=g)]
    model.train()
    return tok.decode(prompt + ids)


def train(cfg: Config, run_name: Optional[str] = None, echo: Callable[[str], None] = print,
          progress: bool = True) -> TrainResult:
    """Train a GPT as ``cfg`` says and leave a run folder (DESIGN §4).

    Args:
        cfg: the validated config.
        run_name: folder name under ``train.out_dir``; default ``<name>-<timestamp>``.
        echo: where status lines go (the CLI prints them to stderr).
        progress: show a tqdm bar.

    Returns:
        The run folder, the final step and losses.

    Raises:
        MinigptError: device not available, data cannot be fetched, run exists.
    """
    from tqdm.auto import tqdm

    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    if dtype != torch.float32 and device.type == "cpu" and dtype == torch.float16:
        raise MinigptError("dtype: float16 needs a GPU; use dtype: auto, float32 or bfloat16 on the CPU")
    tc, mc = cfg.train, cfg.model

    corpus = ensure_corpus(cfg, echo)
    tok, tok_path = ensure_tokenizer(cfg, corpus, echo)
    if mc.vocab_size is None:
        mc = mc.model_copy(update={"vocab_size": tok.vocab_size})
    elif mc.vocab_size < tok.vocab_size:
        raise MinigptError(
            f"model.vocab_size ({mc.vocab_size}) is smaller than the tokenizer's {tok.vocab_size} entries; "
            "set model.vocab_size: null to take it from the tokenizer"
        )
    cfg = cfg.model_copy(update={"model": mc})
    data: PreparedData = prepare(corpus, tok, dataset_dir(cfg.data.data_dir, cfg.data.dataset),
                                 cfg.data.val_fraction, log=echo)

    run_dir = new_run_dir(cfg, run_name)
    logger = RunLogger(run_dir, echo=None)
    (run_dir / "config.yaml").write_text(cfg.to_yaml(), encoding="utf-8")
    tok.save(run_dir / "tokenizer.json")
    (run_dir / "env.json").write_text(json.dumps(env_info(device, dtype), indent=1), encoding="utf-8")

    seed_everything(cfg.seed)
    model = GPT(mc).to(device)
    optimizer = make_optimizer(model, tc, device)
    use_scaler = device.type == "cuda" and dtype == torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=use_scaler)
    autocast = (torch.autocast(device_type=device.type, dtype=dtype)
                if dtype != torch.float32 else nullcontext())
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    train_model = model
    if cfg.compile:
        try:
            train_model = torch.compile(model)
        except Exception as exc:  # compile support varies by platform
            echo(f"warning: torch.compile unavailable ({type(exc).__name__}); training without it")

    train_sampler = BatchSampler(data.train, mc.block_size, tc.batch_size, cfg.seed + 1, device)
    eval_samplers = {
        "train": BatchSampler(data.train, mc.block_size, tc.batch_size, cfg.seed + 2, device),
        "val": BatchSampler(data.val, mc.block_size, tc.batch_size, cfg.seed + 3, device),
    }
    tokens_per_step = tc.batch_size * mc.block_size * tc.grad_accum_steps
    n_params = model.num_params()
    logger.log(f"run folder {run_dir}")
    logger.log(f"device {device}, dtype {str(dtype).removeprefix('torch.')}, {n_params:,} parameters, "
               f"vocab {mc.vocab_size} ({tok.kind}), {tokens_per_step:,} tokens per step "
               f"(batch {tc.batch_size} x block {mc.block_size} x accum {tc.grad_accum_steps})")
    logger.log(f"data {data.directory}: {len(data.train):,} train / {len(data.val):,} val tokens")
    echo(f"training {n_params / 1e6:.2f}M parameters on {device} ({str(dtype).removeprefix('torch.')}); "
         f"run folder {run_dir}")

    best_val = math.inf
    last_losses: dict[str, float] = {}
    train_loss = None
    step = 0
    t0 = time.perf_counter()
    t_log, tokens_since_log = t0, 0
    bar = tqdm(total=tc.max_iters, desc="train", unit="step", disable=not progress, dynamic_ncols=True,
               file=sys.stderr)

    def evaluate_and_save(step: int) -> None:
        nonlocal best_val, last_losses, t_log
        t_eval = time.perf_counter()
        losses = estimate_loss(model, eval_samplers, tc.eval_iters, autocast)
        last_losses = losses
        elapsed = time.perf_counter() - t0
        logger.event({"step": step, "event": "eval", "elapsed_s": round(elapsed, 3),
                      "train_loss": losses["train"], "val_loss": losses["val"]})
        logger.log(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        bar.write(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}", file=sys.stderr)
        meta = {"step": step, "train_loss": losses["train"], "val_loss": losses["val"]}
        state = {"step": step, "optimizer": optimizer.state_dict(), "best_val_loss": min(best_val, losses["val"]),
                 "data_rng": train_sampler.state(), "torch_rng": torch.get_rng_state()}
        if losses["val"] < best_val:
            best_val = losses["val"]
            checkpoint.save(run_dir / "checkpoints" / "best", model, cfg, state, meta)
        checkpoint.save(run_dir / "checkpoints" / "last", model, cfg, state, meta)
        if tc.sample_tokens > 0:
            logger.sample(step, sample_text(model, tok, device, tc.sample_tokens, cfg.seed))
        logger.plot()
        t_log += time.perf_counter() - t_eval  # tokens/s counts training time only

    model.train()
    try:
        for step in range(tc.max_iters + 1):
            if should_eval(step, tc):
                evaluate_and_save(step)
            if step == tc.max_iters:
                break
            lr = lr_at(step, tc, mc.n_embd)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros((), device=device)
            for _ in range(tc.grad_accum_steps):
                x, y = train_sampler.next()
                with autocast:
                    _, loss = train_model(x, y)
                    loss = loss / tc.grad_accum_steps
                scaler.scale(loss).backward()
                loss_sum += loss.detach()
            if tc.grad_clip > 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            tokens_since_log += tokens_per_step
            bar.update(1)
            done = step + 1
            if done % tc.log_interval == 0 or done == tc.max_iters:
                train_loss = loss_sum.item()  # the only host sync of the step, once per log
                now = time.perf_counter()
                tps = tokens_since_log / max(now - t_log, 1e-9)
                t_log, tokens_since_log = now, 0
                logger.event({"step": done, "event": "train", "elapsed_s": round(now - t0, 3),
                              "loss": train_loss, "lr": lr, "tokens_per_sec": round(tps, 1)})
                bar.set_postfix(loss=f"{train_loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tps:,.0f}", refresh=False)
                if not math.isfinite(train_loss):
                    raise MinigptError(
                        f"the training loss became {train_loss} at step {done}; "
                        "lower train.learning_rate or raise train.warmup_iters"
                    )
    except KeyboardInterrupt:
        bar.close()
        meta = {"step": step, "interrupted": True}
        checkpoint.save(run_dir / "checkpoints" / "last", model, cfg,
                        {"step": step, "optimizer": optimizer.state_dict(), "best_val_loss": best_val}, meta)
        logger.log(f"interrupted at step {step}; saved {run_dir / 'checkpoints' / 'last'}")
        raise MinigptError(
            f"interrupted at step {step}; weights saved in {run_dir / 'checkpoints' / 'last'} "
            f"(sample with: minigpt generate --run {run_dir})"
        ) from None
    bar.close()
    logger.log(f"done: {tc.max_iters} steps in {time.perf_counter() - t0:.1f}s; best val loss {best_val:.4f}")
    return TrainResult(run_dir, tc.max_iters, last_losses.get("train"), last_losses.get("val"),
                       best_val if math.isfinite(best_val) else None)
