"""minigpt bench: the JSON contract and the FLOP accounting behind MFU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import small_peak

from minigpt_cli.config.schema import load_config
from minigpt_cli.model.gpt import GPT

TINY = Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml"


def test_bench_json(cli, monkeypatch):
    small_peak(
        monkeypatch
    )  # the products are 256 x 256 here; bench still names the 2048 x 2048 it runs
    res = cli("bench", TINY, "--iters", "2", "--max-new-tokens", "5", "--json")
    assert res.exit_code == 0, res
    r = json.loads(res.stdout)
    assert r["peak_matmul"] == f"2048x2048 @ 2048x2048, float32, median of 10, {r['peak_kernel']}"
    for key in (
        "train_tokens_per_sec",
        "achieved_flops",
        "peak_flops",
        "mfu",
        "gen_tokens_per_sec_cached",
        "gen_tokens_per_sec_uncached",
        "gen_tokens_per_sec_batched",
    ):
        assert r[key] > 0, key
    # Generation: 8 samples in a batch; on a CPU without compile: true, no compiled figure, and why.
    from minigpt_cli.bench.generation import CPU_COMPILE_OFF

    assert (
        r["gen_batch"] == 8
        and r["gen_batched_speedup"]
        == r["gen_tokens_per_sec_batched"] / r["gen_tokens_per_sec_cached"]
    )
    assert r["gen_tokens_per_sec_compiled"] is None and r["gen_compiled_note"] == CPU_COMPILE_OFF
    assert abs(r["mfu"] - r["achieved_flops"] / r["peak_flops"]) < 1e-12
    # The peak is the fastest kernel measured, and the kernel of the model's linear layers is among
    # them.
    from minigpt_cli.runtime.kernels.onednn import ONEDNN_MIN_FLOPS, matmul_op

    by_kernel = r["peak_flops_by_kernel"]
    assert r["peak_flops"] == max(by_kernel.values()) == by_kernel[r["peak_kernel"]]
    # MFU against each kernel's peak; the headline one is the smallest (against the fastest kernel).
    assert set(r["mfu_by_kernel"]) == set(by_kernel)
    for kernel, mfu in r["mfu_by_kernel"].items():
        assert abs(mfu - r["achieved_flops"] / by_kernel[kernel]) < 1e-12
    assert r["mfu"] == min(r["mfu_by_kernel"].values())
    # tiny.yaml, 8 x 32 tokens, n_embd 32: every product is below the oneDNN threshold (the call
    # would cost more).
    assert 2 * 256 * 32 * 128 < ONEDNN_MIN_FLOPS
    assert r["linear_kernel"] == "torch.mm"
    assert set(by_kernel) == ({"torch.mm", "oneDNN"} if matmul_op() is not None else {"torch.mm"})
    assert (
        abs(r["achieved_flops"] - r["flops_per_token"] * r["train_tokens_per_sec"])
        < 1e-3 * r["achieved_flops"]
    )
    # PaLM appendix B: 6·N + 12·L·H·Q·T, N without position embeddings, the tied embedding once.
    cfg = load_config(TINY).model.model_copy(update={"vocab_size": 65})
    model = GPT(cfg)
    n = model.num_params() - model.wpe.weight.numel()
    L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.head_dim, cfg.block_size
    assert r["flops_per_token"] == 6 * n + 12 * L * H * Q * T


def test_bench_table(cli, monkeypatch):
    small_peak(monkeypatch)
    res = cli("bench", TINY, "--iters", "1", "--no-generation")
    assert res.exit_code == 0, res
    assert (
        "MFU" in res.stdout and "training tokens/s" in res.stdout and "KV cache" not in res.stdout
    )
    from minigpt_cli.runtime.kernels.onednn import matmul_op as onednn_matmul_op

    assert ("against torch.mm peak" in res.stdout) == (onednn_matmul_op() is not None)


def test_bench_refuses_impossible_sizes_before_allocating(cli):
    from helpers import assert_user_error

    assert_user_error(
        cli("bench", TINY, "--prompt-len", "1000000000"),
        "--prompt-len 1000000000",
        "block_size = 32",
    )
    assert_user_error(
        cli("bench", TINY, "--set", "train.batch_size=100000000"),
        "this model needs about",
        "train.batch_size",
        notes_ok=True,
    )


def test_peak_is_the_machines_even_with_onednn_turned_off(cli, monkeypatch):
    from minigpt_cli.runtime.kernels import onednn

    # n_embd 128: the MLP's products are big enough for oneDNN, so only the switch keeps them off
    # it.
    monkeypatch.setenv("MINIGPT_ONEDNN", "0")
    small_peak(monkeypatch)
    res = cli(
        "bench", TINY, "--iters", "1", "--no-generation", "--json", "--set", "model.n_embd=128"
    )
    assert res.exit_code == 0, res
    r = json.loads(res.stdout)
    assert r["linear_kernel"] == "torch.mm"
    if onednn.matmul_op() is not None:  # the peak still tries both kernels
        assert set(r["peak_flops_by_kernel"]) == {"torch.mm", "oneDNN"}
    # A value that is neither on nor off is refused before any work.
    from helpers import assert_user_error

    monkeypatch.setenv("MINIGPT_ONEDNN", "bogus")
    assert_user_error(cli("bench", TINY, "--iters", "1"), "MINIGPT_ONEDNN='bogus'", "use 1")


def test_an_mfu_above_one_against_a_slower_kernel_is_explained(monkeypatch):
    from minigpt_cli.bench.throughput import bench, format_bench

    small_peak(monkeypatch)

    r = bench(load_config(TINY), iters=1, generation=False, echo=lambda m: None)
    r["mfu_by_kernel"] = {
        "torch.mm": 1.06,
        "oneDNN": 0.49,
    }  # linear layers on oneDNN, beyond MKL's peak
    lines = format_bench(r).splitlines()
    above = [l for l in lines if "against torch.mm peak" in l]
    assert (
        len(above) == 1
        and "1.060" in above[0]
        and "above 1: the model's products run on a faster kernel" in above[0]
    )
    assert not any("above 1" in l for l in lines if "against oneDNN peak" in l)


def test_known_gpus_have_their_datasheet_peaks():
    """Dense bf16 and fp16 peaks (NVIDIA's datasheets print them doubled, with 2:4 sparsity), found
    by the names torch.cuda.get_device_name gives; none for float32, an unknown board or a CPU."""
    import torch

    from minigpt_cli.runtime.device import spec_peak

    datasheets = {  # name -> (board, dense TFLOP/s): the datasheets' sparsity figures halved
        "NVIDIA H100 80GB HBM3": ("H100 SXM", 989),  # 1,979 with sparsity
        "NVIDIA H100 PCIe": ("H100 PCIe", 756),  # 1,513
        "NVIDIA H100 NVL": ("H100 NVL", 835),  # 1,671
        "NVIDIA H200": ("H200 SXM", 989),  # 1,979
        "NVIDIA H200 NVL": ("H200 NVL", 835),  # 1,671
        "NVIDIA A100-SXM4-80GB": ("A100", 312),  # 624
        "NVIDIA L4": ("L4", 121),  # 242
        "NVIDIA L40S": ("L40S", 362),  # 733
    }
    for name, (board, tflops) in datasheets.items():
        for dtype in (torch.bfloat16, torch.float16):
            assert spec_peak(name, dtype) == (board, tflops * 1e12), name
        assert spec_peak(name, torch.float32) is None
    for unknown in ("NVIDIA A10G", "NVIDIA GeForce RTX 4090", "cpu"):
        assert spec_peak(unknown, torch.bfloat16) is None


def test_on_a_known_gpu_mfu_is_against_the_datasheet_and_the_measured_peak_stays_beside_it(
    monkeypatch,
):
    """What the table shows for a result with a datasheet peak (bench sets one on a known GPU
    only)."""
    from minigpt_cli.bench.throughput import bench, format_bench

    small_peak(monkeypatch)
    r = bench(load_config(TINY), iters=1, generation=False, echo=lambda m: None)
    assert r["spec_peak_flops"] is None and r["mfu_spec"] is None and r["gpu"] is None
    assert r["mfu"] == r["mfu_measured"] == r["achieved_flops"] / r["peak_flops"]
    assert "datasheet" not in format_bench(r)
    r.update(gpu="NVIDIA H100 80GB HBM3", spec_peak_flops=989e12, spec_peak_board="H100 SXM")
    r["mfu"] = r["mfu_spec"] = r["achieved_flops"] / 989e12
    lines = format_bench(r).splitlines()
    assert lines[0].startswith("device cpu (NVIDIA H100 80GB HBM3), ")
    assert any(l.startswith("peak (datasheet)") and "(H100 SXM)" in l for l in lines), lines
    (mfu,) = [l for l in lines if l.startswith("MFU")]
    assert "against the datasheet's peak" in mfu and f"{r['mfu']:.3f}" in mfu
    (measured,) = [l for l in lines if "against the measured peak" in l]
    assert f"{r['mfu_measured']:.3f}" in measured


def test_bench_streaming_goes_through_generates_text_path(cli, data_dir, monkeypatch):
    """--stream-tokens: the same seeded tokens through generation.write_sample three ways; the
    overheads are the extra text-path seconds over the decode-at-the-end pass, against that pass's
    generation time."""
    import minigpt_cli.sample.generate as gen_mod
    from minigpt_cli.bench.throughput import STREAM_STOP

    calls = []
    real = gen_mod.write_sample

    def spy(tok, tokens, stops, out, stream):
        calls.append((tok.kind, stream, list(stops)))
        return real(tok, tokens, stops, out, stream)

    monkeypatch.setattr(gen_mod, "write_sample", spy)
    small_peak(monkeypatch)
    res = cli(
        "bench",
        TINY,
        "--iters",
        "1",
        "--no-generation",
        "--stream-tokens",
        "60",
        "--json",
        "--set",
        f"data.data_dir={data_dir}",
    )
    assert res.exit_code == 0, res
    r = json.loads(res.stdout)
    # A warm-up, then decoded at the end, streamed, streamed with a stop string that never occurs.
    assert calls == [
        ("char", True, [STREAM_STOP]),
        ("char", False, []),
        ("char", True, []),
        ("char", True, [STREAM_STOP]),
    ]
    assert (
        r["stream_tokens"] == 60
        and r["stream_tokenizer"] == "char"
        and r["stream_text_equal"] is True
    )
    wall, text = r["stream_seconds"], r["stream_text_seconds"]
    assert set(wall) == set(text) == {"plain", "stream", "stop"}
    assert all(0 < text[m] < wall[m] for m in wall)
    for mode, key in (("stream", "stream_overhead"), ("stop", "stop_overhead")):
        sampling = wall[mode] - text[mode]
        assert r[key] == pytest.approx((text[mode] - text["plain"]) / (sampling + text["plain"]))
    from minigpt_cli.bench.throughput import format_bench

    lines = format_bench(r).splitlines()
    assert "streaming (60 new tokens, char tokenizer, KV cache)" in lines
    stop_line = next(l for l in lines if l.startswith("  streamed with --stop s"))
    assert f"overhead {r['stop_overhead']:+.1%}" in stop_line


def test_bench_streaming_needs_a_model_vocabulary_that_holds_the_tokenizer(
    cli, data_dir, corpus_in_use
):
    from helpers import assert_user_error

    assert_user_error(
        cli(
            "bench",
            TINY,
            "--stream-tokens",
            "5",
            "--set",
            f"data.data_dir={data_dir}",
            "--set",
            "model.vocab_size=10",
        ),
        # the genuine corpus: 65 entries
        f"model.vocab_size (10) is smaller than the tokenizer's {len(corpus_in_use.chars)} entries",
        notes_ok=True,
    )  # the tokenizer may be trained first, with a line that says so


def test_bench_generation_compares_the_compiled_path_with_the_eager_cache(monkeypatch):
    """measure_generation with compile on: the compiled figure, its compile time and whether its
    tokens equal the eager cache's (the same seeds); a compile failure becomes a null figure with
    the reason."""
    import torch

    import minigpt_cli.sample.decoding as decoding
    from minigpt_cli.bench.generation import measure_generation

    model = GPT(load_config(TINY).model.model_copy(update={"vocab_size": 65})).eval()
    prompt = torch.zeros(1, 1, dtype=torch.long)
    # The real torch.compile is tests/test_generate.py's; here the same step, eagerly.
    monkeypatch.setattr(decoding, "compiled_step", lambda mode, backend: decoding._step)
    r = measure_generation(model, prompt, 40, 8, compile=True, batch=3, echo=lambda m: None)
    assert r["gen_compiled_tokens_equal"] is True and r["gen_compiled_note"] is None
    assert (
        r["gen_compiled_speedup"]
        == r["gen_tokens_per_sec_compiled"] / r["gen_tokens_per_sec_cached"]
    )
    assert r["gen_compile_seconds"] > 0 and r["gen_batch"] == 3

    def broken(mode, backend):
        def step(*args):
            raise RuntimeError("no C++ compiler here")

        return step

    monkeypatch.setattr(decoding, "compiled_step", broken)
    notes = []
    r = measure_generation(model, prompt, 10, 8, compile=True, echo=notes.append)
    assert r["gen_tokens_per_sec_compiled"] is None and r["gen_compiled_tokens_equal"] is None
    assert r["gen_compiled_note"] == "torch.compile failed: RuntimeError: no C++ compiler here"
    assert "warning: torch.compile failed: RuntimeError: no C++ compiler here" in notes


def test_bench_optimizers_gives_paired_ratios_to_adamw_at_the_configs_muon_settings(cli):
    res = cli(
        "bench",
        TINY,
        "--optimizers",
        "--iters",
        "7",
        "--set",
        "train.muon.ns_steps=3",
        "--set",
        "train.muon.normuon=true",  # off in every row but its own: torch.optim.Muon has none
        "--json",
    )
    assert res.exit_code == 0, res
    r = json.loads(res.stdout)  # 7 steps: rounded up to 2 rounds of 5
    names = {"adamw", "muon", "torch.optim.Muon"}
    variants = {"muon+polar-express", "muon+gram", "muon+normuon", "muon+cautious-wd"}  # alone
    assert r["ns_steps"] == 3 and r["n_rounds"] == 2 and set(r["step_s"]) == names | variants
    assert r["step_ratio_interval"] == dict.fromkeys(names | variants)  # 2 rounds: too few
    for name, steps in r["rounds"][
        "step"
    ].items():  # the update is timed inside the step that contains it
        assert all(0 < u < s for u, s in zip(r["rounds"]["optimizer"][name], steps)), name
    import statistics

    for kind in ("step", "optimizer"):
        rounds = r["rounds"][kind]
        assert all(len(v) == 2 and min(v) > 0 for v in rounds.values())
        for (
            name,
            times,
        ) in rounds.items():  # each ratio is the median of the rounds' ratios, not of the medians
            paired = statistics.median(a / b for a, b in zip(times, rounds["adamw"]))
            assert r[f"{kind}_ratio"][name] == paired
            assert r[f"{kind}_s"][name] == statistics.median(times)
    table = cli("bench", TINY, "--optimizers", "--iters", "5")
    assert table.exit_code == 0 and "muon's step / AdamW's, by round:" in table.stdout, table
    assert (
        "n/a (<6 rounds)" in table.stdout and "over 1 round;" in table.stdout
    )  # 1 round: no interval
    from helpers import assert_user_error

    assert_user_error(
        cli("bench", TINY, "--optimizers", "--prepare"), "--optimizers and --prepare", "give one"
    )
    assert_user_error(
        cli("bench", TINY, "--optimizers", "--stream-tokens", "10"),
        "--optimizers and --stream-tokens",
    )
    # what a mode does not read is refused, not dropped without a word (QA)
    assert_user_error(
        cli("bench", TINY, "--optimizers", "--prompt-len", "5", "--no-generation"),
        "--optimizers leaves --prompt-len, --generation/--no-generation unread",
        "drop them",
    )
    assert_user_error(
        cli("bench", TINY, "--prepare", "--iters", "5"),
        "--prepare leaves --iters unread",
        "drop it",
    )
    assert_user_error(
        cli("bench", TINY, "--prepare", "--stream-tokens", "3"), "--prepare leaves --stream-tokens"
    )
    assert_user_error(
        cli("bench", TINY, "--no-generation", "--max-new-tokens", "5"),
        "--no-generation leaves --max-new-tokens unread",
    )


def test_each_muon_variant_row_is_the_configs_muon_with_that_variant_alone():
    from minigpt_cli.bench.optimizer import OPTIMIZERS
    from minigpt_cli.config.schema import TrainConfig, load_config
    from minigpt_cli.model.gpt import GPT
    from minigpt_cli.trainer.optim import MUON_PLAIN

    model = GPT(load_config(TINY, ["model.vocab_size=65"]).model)
    tc = TrainConfig(optimizer="muon", muon={"ns_steps": 3})
    alone = {
        "muon": {},
        "muon+polar-express": {"coefficients": "polar-express"},
        "muon+gram": {"ns_method": "gram"},
        "muon+normuon": {"normuon": True},
        "muon+cautious-wd": {"cautious_weight_decay": True},
    }
    for name, on in alone.items():
        (group,) = OPTIMIZERS[name](model, tc).muon.param_groups
        assert {k: group[k] for k in MUON_PLAIN} == {**MUON_PLAIN, **on}, name
        assert group["ns_steps"] == 3  # the config's other Muon settings hold
        assert group["weight_decay"] == (0.1 if "cautious_weight_decay" in on else 0.0), name


def test_the_ratios_interval_is_the_sign_tests_interval_for_the_median():
    """Conover's table (Practical Nonparametric Statistics, 3.2): at 95%, the 6th and 15th of 20
    values, the 40th and 61st of 100, the extremes of 6; none from 5."""
    from minigpt_cli.bench.optimizer import median_interval

    assert median_interval([float(x) for x in range(20, 0, -1)]) == (
        6.0,
        15.0,
    )  # ranks, whatever the order
    assert median_interval(list(range(1, 101))) == (40, 61)
    assert (
        median_interval([3, 1, 2, 6, 5, 4]) == (1, 6) and median_interval([1, 2, 3, 4, 5]) is None
    )
    assert median_interval(list(range(1, 21)), confidence=0.5) == (8, 13)


def test_bench_builds_a_trained_tokenizers_model_at_its_vocabulary():
    """model.vocab_size null: a bpe config's model has tokenizer.vocab_size entries (as train gives
    it), a char config's Tiny Shakespeare's 65; a model.vocab_size given wins."""
    from minigpt_cli.bench.throughput import CHAR_VOCAB, bench_vocab

    bpe = load_config(Path(__file__).resolve().parent.parent / "configs" / "shakespeare-bpe.yaml")
    assert (
        bpe.model.vocab_size is None and bench_vocab(bpe) == bpe.tokenizer.vocab_size != CHAR_VOCAB
    )
    assert bench_vocab(load_config(TINY)) == CHAR_VOCAB
    assert bench_vocab(load_config(TINY, ["model.vocab_size=100"])) == 100
