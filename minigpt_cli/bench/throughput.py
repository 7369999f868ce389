"""``minigpt bench``: training throughput, MFU against a peak measured in the same run, generation
speed.

Model FLOPs per token: 6·N + 12·L·n_head·head_dim·T, N without position embeddings and a tied
embedding once (PaLM, Chowdhery et al. 2022, appendix B; nanoGPT's ``estimate_mfu``). Peak: on a GPU
the datasheet's dense peak of a known board (:func:`~minigpt_cli.runtime.device.spec_peak`, as
nanochat and torchtitan take it), with a measured one beside it (:data:`CUDA_MATMUL_N`³ products
back to back, timed with CUDA events); elsewhere the fastest kernel's 2048² product."""

from __future__ import annotations

import resource
import statistics
import time
from contextlib import nullcontext
from typing import Any, Callable, Iterator, Optional

import torch

from ..accounting import params as P
from ..config.schema import Config
from ..errors import MinigptError
from ..model.gpt import GPT
from ..runtime.device import (
    CpuThreads,
    check_memory,
    emulated_bfloat16_note,
    resolve_device,
    resolve_dtype,
    spec_peak,
    tune_runtime,
)
from ..runtime.kernels import dropout, onednn
from ..runtime.kernels import swap as swap_kernels
from ..sample.sampling import generate_tokens, resolve_window_stride
from ..tokenizer.kinds import Tokenizer
from ..trainer.optim import make_optimizer
from ..trainer.step import train_step
from .generation import measure_generation
from .generation import sync as _sync

MATMUL_N = 2048
#: A GPU's measured peak: products this large, :data:`CUDA_BACK_TO_BACK` at a time between two CUDA
#: events, so that launches and the host's wait do not count (one 2048³ product with a sync reads an
#: H100 low).
CUDA_MATMUL_N = 8192
CUDA_BACK_TO_BACK = 10


#: Timed optimizer steps by default.
DEFAULT_ITERS = 20


def peak_kernels(device: torch.device, dtype: torch.dtype) -> list[str]:
    """The kernels measured for the peak: ``torch.mm``, and ``oneDNN`` for float32 on a CPU where
    PyTorch has it."""
    kernels = ["torch.mm"]
    if device.type == "cpu" and dtype == torch.float32 and onednn.matmul_op() is not None:
        kernels.append("oneDNN")
    return kernels


def measure_peak(
    device: torch.device,
    dtype: torch.dtype,
    n: int = MATMUL_N,
    repeats: int = 10,
    kernel: str = "torch.mm",
) -> float:
    """Median FLOP/s of an n×n by n×n matrix product (2·n³ FLOPs) in ``dtype`` on ``device``,
    through ``kernel``; on CUDA, of :func:`measure_cuda_peak`'s rounds instead."""
    if device.type == "cuda":
        return measure_cuda_peak(device, dtype, repeats=repeats)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    op = onednn.matmul_op() if kernel == "oneDNN" else None

    def product():
        return (
            a @ b if op is None else op(a, b, None, "none", [], "")
        )  # oneDNN's linear takes b as (out, in)

    for _ in range(2):
        product()
    _sync(device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        product()
        _sync(device)
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times)


def measure_cuda_peak(
    device: torch.device,
    dtype: torch.dtype,
    n: int = CUDA_MATMUL_N,
    back_to_back: int = CUDA_BACK_TO_BACK,
    repeats: int = 10,
) -> float:
    """Median FLOP/s over ``repeats`` rounds of ``back_to_back`` n×n products (2·n³ FLOPs each)
    queued at once and timed with CUDA events, after a warm-up round (cuBLAS picks its kernel, the
    clocks rise)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    rates = []
    for i in range(repeats + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(back_to_back):
            torch.mm(a, b, out=c)
        end.record()
        end.synchronize()
        if i:  # round 0 warms up
            rates.append(back_to_back * 2 * n**3 / (start.elapsed_time(end) / 1000))  # ms
    del a, b, c
    torch.cuda.empty_cache()
    return statistics.median(rates)


def peak_description(device: torch.device, dtype: torch.dtype, kernel: str) -> str:
    """What the measured peak timed, for the JSON and the table."""
    name = str(dtype).removeprefix("torch.")
    if device.type == "cuda":
        n = CUDA_MATMUL_N
        return (
            f"{n}x{n} @ {n}x{n}, {name}, {CUDA_BACK_TO_BACK} back to back per CUDA-event timing, "
            f"median of 10, {kernel}"
        )
    return f"{MATMUL_N}x{MATMUL_N} @ {MATMUL_N}x{MATMUL_N}, {name}, median of 10, {kernel}"


#: A stop string no corpus holds (U+2403): the search runs at every token and never ends a sample.
STREAM_STOP = "\u2403 never \u2403"


def measure_streaming(
    model: GPT,
    tok: Tokenizer,
    cfg: Config,
    n_tokens: int,
    device: torch.device,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """What streaming costs ``generate``: ``n_tokens`` decoded at the end, streamed, and streamed
    with :data:`STREAM_STOP`; an overhead is a pass's extra seconds over the first's, per second of
    generation."""
    from ..sample.generate import Nowhere, write_sample  # the command's own path

    sc = cfg.sample
    prompt = tok.encode(sc.prompt) or [0]
    idx = torch.tensor([prompt[-model.config.block_size :]], dtype=torch.long, device=device)
    stride = resolve_window_stride(model.config.block_size, sc.window_stride)
    top_k = min(sc.top_k, tok.vocab_size) if sc.top_k is not None else None

    def run(n: int, stream: bool, stops: list[str]) -> tuple[float, float, str]:
        """(wall seconds, sampling seconds, text) of one pass."""
        g = torch.Generator(device=device).manual_seed(cfg.seed)
        sampled = generate_tokens(
            model,
            idx,
            n,
            sc.temperature,
            top_k,
            sc.top_p,
            True,
            g,
            vocab_limit=tok.vocab_size,
            window_stride=stride,
        )
        sampling = 0.0

        def tokens():
            nonlocal sampling
            while True:
                t = time.perf_counter()
                nxt = next(sampled, None)
                if nxt is None:
                    return
                token = int(nxt[0])  # waits for the device: sampling's time
                sampling += time.perf_counter() - t
                yield token

        t = time.perf_counter()
        text = write_sample(tok, tokens(), stops, Nowhere(), stream)
        return time.perf_counter() - t, sampling, text

    run(min(16, n_tokens), True, [STREAM_STOP])  # warm-up
    passes = {}
    for mode, stream, stops, what in (
        ("plain", False, [], "decoded at the end"),
        ("stream", True, [], "streamed"),
        ("stop", True, [STREAM_STOP], "streamed with a stop string"),
    ):
        echo(f"streaming: {n_tokens} new tokens, {tok.kind} tokenizer, {what}")
        passes[mode] = run(n_tokens, stream, stops)
    wall, sampling, text = passes["plain"]
    base_text = wall - sampling

    def overhead(mode: str) -> float:
        w, s, _ = passes[mode]
        return ((w - s) - base_text) / (s + base_text)

    return {
        "stream_tokens": n_tokens,
        "stream_tokenizer": tok.kind,
        "stream_seconds": {mode: p[0] for mode, p in passes.items()},
        "stream_text_seconds": {mode: p[0] - p[1] for mode, p in passes.items()},
        "stream_overhead": overhead("stream"),
        "stop_overhead": overhead("stop"),
        "stream_text_equal": all(p[2] == text for p in passes.values()),
    }


def _peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


#: The vocabulary measured when neither the model nor a trained tokenizer kind gives one: Tiny
#: Shakespeare's characters.
CHAR_VOCAB = 65


def bench_vocab(cfg: Config) -> int:
    """The vocabulary a benchmark builds ``cfg``'s model with: ``model.vocab_size``, else a trained
    tokenizer's ``tokenizer.vocab_size`` (what train would give the model), else
    :data:`CHAR_VOCAB`."""
    trained = cfg.tokenizer.vocab_size if cfg.tokenizer.kind != "char" else None
    return cfg.model.vocab_size or trained or CHAR_VOCAB


def random_batches(
    vocab_size: int, batch: int, block: int, device: torch.device, seed: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (x, y) batches (batch, block) int64 of uniform random ids on ``device``, y shifted by
    one."""
    g = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randint(0, vocab_size, (batch, block + 1), generator=g)
        yield x[:, :-1].to(device), x[:, 1:].to(device)


def busy_warning(
    threads: CpuThreads, mark, what: str, echo: Callable[[str], None]
) -> Optional[float]:
    """The cores other processes kept busy since ``mark`` (None where unknown), with a warning
    through ``echo`` when they took cores this process's threads wanted while ``what`` was timed."""
    others = threads.others_since(mark)
    if others is not None and others + torch.get_num_threads() > threads.cpus + 0.25:
        echo(
            f"warning: other processes kept {others:.1f} of {threads.cpus} CPU cores busy while {what} were "
            f"timed; these figures are not this machine's (rerun on a quiet machine)"
        )
    return others


def bench(
    cfg: Config,
    iters: int = DEFAULT_ITERS,
    warmup: int = 3,
    prompt_len: int = 1,
    max_new_tokens: int = 500,
    generation: bool = True,
    stream_tokens: int = 0,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Training and generation speed of ``cfg``'s model on its device, as a JSON-ready dict. Raises
    MinigptError: impossible sizes (memory, ``prompt_len``), a model vocabulary smaller than the
    tokenizer's, no corpus."""
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    if note := emulated_bfloat16_note(device, dtype):
        echo(note)
    mc, tok = cfg.model, None
    if stream_tokens > 0:
        from ..data.pipeline import configured_corpus, ensure_tokenizer, with_vocab

        corpus, root = configured_corpus(cfg, echo)
        tok, _ = ensure_tokenizer(cfg, corpus, echo, root)
        mc = with_vocab(cfg, tok.vocab_size).model
    if mc.vocab_size is None:
        mc = mc.model_copy(update={"vocab_size": bench_vocab(cfg)})
    tc = cfg.train
    T, B = mc.block_size, tc.batch_size
    torch.manual_seed(cfg.seed)
    tune_runtime(device)
    threads = CpuThreads(device, echo=echo)  # decides once, over the warm-up below
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    if generation and prompt_len > T:
        raise MinigptError(
            f"--prompt-len {prompt_len}: the model sees at most block_size = {T} tokens; "
            f"use 1 .. {T}"
        )
    check_memory(cfg.model_copy(update={"model": mc}), device, dtype)
    model = swap_kernels(GPT(mc).to(device))
    train_model = torch.compile(model) if cfg.compile else model
    eager_kernel = onednn.linear_kernel(model, B * T, device, dtype)
    if cfg.compile and "oneDNN" in eager_kernel:
        echo(onednn.COMPILE_NOTE)
    optimizer = make_optimizer(model, tc)
    scaler = torch.amp.GradScaler(
        device.type, enabled=device.type == "cuda" and dtype == torch.float16
    )
    autocast = (
        torch.autocast(device_type=device.type, dtype=dtype)
        if dtype != torch.float32
        else nullcontext()
    )
    params_list = [p for p in model.parameters() if p.requires_grad]
    it = random_batches(mc.vocab_size, B, T, device, cfg.seed)

    def step():  # train_model is read at each call: the eager model once compiling has failed
        return train_step(
            train_model,
            optimizer,
            it,
            tc.grad_accum_steps,
            autocast,
            scaler,
            tc.grad_clip,
            params_list,
        )

    echo(
        f"training: {warmup} warm-up + {iters} timed steps, batch {B} x {T} x accum {tc.grad_accum_steps}"
    )
    model.train()
    compiled = cfg.compile
    try:  # torch.compile fails lazily, at the first call: measure eager then, as train falls back to it
        step()
    except Exception as exc:
        if not compiled:
            raise
        echo(
            f"warning: torch.compile failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
            "measuring without it"
        )
        optimizer.zero_grad(set_to_none=True)
        train_model, compiled = model, False
    for _ in range(warmup - 1):
        step()
    if threads.enabled and threads.poll(force=True) != threads.max_threads:
        # Other processes kept cores busy during the warm-up: warm up again with fewer threads.
        for _ in range(warmup):
            step()
    _sync(device)
    kernels = peak_kernels(device, dtype)
    n = CUDA_MATMUL_N if device.type == "cuda" else MATMUL_N
    echo(
        f"measuring the peak: {n}x{n} matmul in {str(dtype).removeprefix('torch.')} on {device} "
        f"({', '.join(kernels)})"
    )
    peaks = {k: measure_peak(device, dtype, kernel=k) for k in kernels}
    peak_kernel = max(peaks, key=peaks.get)
    peak = peaks[peak_kernel]
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    spec = spec_peak(gpu, dtype) if gpu is not None else None
    if device.type == "cuda":
        # The peak's matrices are freed: the steps below set the training's own peak memory again.
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(
        warmup
    ):  # back to the training steady state (caches, allocator) after the big matmul
        step()
    _sync(device)
    mark = threads.mark() if device.type == "cpu" else None
    t = time.perf_counter()
    for _ in range(iters):
        loss, _ = step()
    float(loss)  # waits for the device
    _sync(device)
    dt = (time.perf_counter() - t) / iters
    others = busy_warning(threads, mark, "the training steps", echo)
    tokens_per_step = B * T * tc.grad_accum_steps
    fl = P.flops(mc, T)
    flops_per_token = fl["mfu_train"]
    tps = tokens_per_step / dt
    achieved = flops_per_token * tps
    out: dict[str, Any] = {
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "compile": compiled,
        "parameters": model.num_params(),
        "batch_size": B,
        "block_size": T,
        "grad_accum_steps": tc.grad_accum_steps,
        "iters": iters,
        "train_tokens_per_sec": tps,
        "ms_per_step": dt * 1000,
        "flops_per_token": flops_per_token,
        "flops_per_step": flops_per_token * tokens_per_step,
        "achieved_flops": achieved,
        "gpu": gpu,
        "peak_flops": peak,
        "peak_matmul": peak_description(device, dtype, peak_kernel),
        # A known GPU's datasheet peak (dense, this dtype): the MFU the field reports is against it.
        "spec_peak_flops": spec[1] if spec else None,
        "spec_peak_board": spec[0] if spec else None,
        "mfu_spec": achieved / spec[1] if spec else None,
        "peak_kernel": peak_kernel,
        "peak_flops_by_kernel": peaks,
        "linear_kernel": "torch.mm"
        if compiled
        else eager_kernel,  # torch.compile keeps PyTorch's kernels
        "dropout_kernel": dropout.dropout_kernel(model, device, dtype, compiled),
        # Against the datasheet's peak where the GPU is known, else against the measured one.
        "mfu": achieved / spec[1] if spec else achieved / peak,
        "mfu_measured": achieved / peak,
        # Against each kernel's peak: torch.mm's alone overstates MFU where the linear layers run on
        # a faster one.
        "mfu_by_kernel": {k: achieved / f for k, f in peaks.items()},
        "peak_memory_bytes": _peak_memory(device),
        "torch_threads": torch.get_num_threads(),
        # Cores other processes kept busy while the training steps were timed (CPU; null if
        # unknown).
        "other_cores_busy": others,
    }
    if generation:
        model.eval()
        seeded = torch.Generator().manual_seed(cfg.seed)
        prompt = torch.randint(0, mc.vocab_size, (1, prompt_len), generator=seeded).to(device)
        stride = resolve_window_stride(mc.block_size, cfg.sample.window_stride)
        out.update(
            {"prompt_len": prompt_len, "window_stride": stride, "max_new_tokens": max_new_tokens}
        )
        # Compiled where generate compiles by default (CUDA), or where the config asks for compile.
        out.update(
            measure_generation(
                model,
                prompt,
                max_new_tokens,
                stride,
                compile=device.type == "cuda" or cfg.compile,
                echo=echo,
            )
        )
    if tok is not None:
        model.eval()
        out.update(measure_streaming(model, tok, cfg, stream_tokens, device, echo))
    return out


def _row(label: str, value: str, note: str = "") -> str:
    """One line of :func:`format_bench`'s table: the label, the value right-aligned, a note in
    brackets."""
    return f"{label:<27}{value:>14}" + (f"   ({note})" if note else "")


def format_bench(r: dict[str, Any]) -> str:
    """A readable table of :func:`bench`'s result."""
    flops = {k: P.human_flops(r[k]) + "/s" for k in ("achieved_flops", "peak_flops")}
    memory = "(CUDA allocator)" if r["device"].startswith("cuda") else "(process max RSS)"
    lines = [
        f"device {r['device']}{f' ({g})' if (g := r.get('gpu')) else ''}, {r['dtype']}, "
        f"{r['torch_threads']} thread{'s' if r['torch_threads'] != 1 else ''}, "
        f"compile {r['compile']}",
        f"model {r['parameters']:,} parameters; batch {r['batch_size']} x block {r['block_size']} "
        f"x accum {r['grad_accum_steps']}; linear layers on {r['linear_kernel']}; dropout: {r['dropout_kernel']}",
        "",
        _row("training tokens/s", f"{r['train_tokens_per_sec']:,.0f}"),
        _row("ms per optimizer step", f"{r['ms_per_step']:.1f}"),
        _row("model FLOPs per token", f"{r['flops_per_token']:,}", "6N + 12·L·H·Q·T, PaLM app. B"),
        _row("model FLOPs per step", f"{r['flops_per_step']:,}"),
        _row("achieved", flops["achieved_flops"]),
        *(
            [
                _row(
                    "peak (datasheet)",
                    P.human_flops(r["spec_peak_flops"]) + "/s",
                    r["spec_peak_board"],
                )
            ]
            if r.get("spec_peak_flops")
            else []
        ),
        _row("peak (measured)", flops["peak_flops"], r["peak_matmul"]),
        *(
            _row(f"  {kernel} peak", P.human_flops(f) + "/s")
            for kernel, f in r["peak_flops_by_kernel"].items()
            if len(r["peak_flops_by_kernel"]) > 1
        ),
        *(
            [
                _row("MFU", f"{r['mfu']:.3f}", "against the datasheet's peak"),
                _row("  against the measured peak", f"{r['mfu_measured']:.3f}"),
            ]
            if r.get("spec_peak_flops")
            else [_row("MFU", f"{r['mfu']:.3f}", "against the fastest peak")]
        ),
        *(
            _row(
                f"  against {kernel} peak",
                f"{m:.3f}",
                "above 1: the model's products run on a faster kernel" if m > 1 else "",
            )
            for kernel, m in r["mfu_by_kernel"].items()
            if len(r["mfu_by_kernel"]) > 1
        ),
        _row(f"peak memory {memory}", P.human_bytes(r["peak_memory_bytes"])),
    ]
    if "gen_tokens_per_sec_cached" in r:
        lines += [
            "",
            f"generation ({r['max_new_tokens']} new tokens, prompt {r['prompt_len']}, "
            f"window stride {r['window_stride']})",
            _row("  with KV cache tokens/s", f"{r['gen_tokens_per_sec_cached']:,.1f}"),
            _row("  without cache tokens/s", f"{r['gen_tokens_per_sec_uncached']:,.1f}"),
            _row("  speed-up", f"{r['gen_speedup']:.2f}") + "x",
            f"  {r['gen_batch']} samples, batch tokens/s {r['gen_tokens_per_sec_batched']:>11,.1f}   "
            f"({r['gen_batched_speedup']:.2f}x one sample's)",
        ]
        if r["gen_tokens_per_sec_compiled"] is not None:
            same = (
                "the same tokens"
                if r["gen_compiled_tokens_equal"]
                else "tokens DIFFER from the eager cache's"
            )
            lines.append(
                _row(
                    "  compiled tokens/s",
                    f"{r['gen_tokens_per_sec_compiled']:,.1f}",
                    f"{r['gen_compiled_speedup']:.2f}x eager; compiled in {r['gen_compile_seconds']:.1f} s; "
                    f"{same}",
                )
            )
        else:
            lines.append(_row("  compiled tokens/s", "n/a", r["gen_compiled_note"]))
    if "stream_overhead" in r:
        sec, txt = r["stream_seconds"], r["stream_text_seconds"]
        lines += [
            "",
            f"streaming ({r['stream_tokens']} new tokens, {r['stream_tokenizer']} tokenizer, KV cache)",
            _row("  decoded at the end s", f"{sec['plain']:.3f}", f"text {txt['plain']:.3f}"),
            *(
                _row(
                    label,
                    f"{sec[mode]:.3f}",
                    f"text {txt[mode]:.3f}; overhead {r[mode + '_overhead']:+.1%}",
                )
                for mode, label in (
                    ("stream", "  streamed s"),
                    ("stop", "  streamed with --stop s"),
                )
            ),
        ]
    return "\n".join(lines)
