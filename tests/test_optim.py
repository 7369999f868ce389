"""train.optimizer muon (the batched Newton-Schulz held against torch.optim.Muon, which parameters
go where, an exact resume) and train.lr_schedule wsd (its formula, the cool-down from a stable-phase
checkpoint)."""

from __future__ import annotations

import math
import signal

import pytest
import torch
from helpers import TINY, assert_user_error, curve, tiny
from safetensors.torch import load_file
from test_resume import signals_after_step

from minigpt_cli.config.schema import ConfigError, TrainConfig, load_config
from minigpt_cli.errors import Interrupted, MinigptError
from minigpt_cli.model.gpt import GPT
from minigpt_cli.runtime import device as device_module
from minigpt_cli.trainer import lr_at, train
from minigpt_cli.trainer import muon as muon_module
from minigpt_cli.trainer.optim import MuonAdamW, make_optimizer, muon_params, set_lr
from minigpt_cli.trainer.run_notes import MUON_UNUSED, config_notes
from minigpt_cli.trainer.schedule import wsd_decay_start

#: The CPU's own choice of Newton-Schulz dtype, before the fixture below replaces it.
NEWTON_SCHULZ_DTYPE = muon_module.newton_schulz_dtype


@pytest.fixture(autouse=True)
def _bfloat16_newton_schulz(monkeypatch):
    """torch.optim.Muon's Newton-Schulz runs in bfloat16 on any CPU, ours in float32 where the CPU
    emulates bfloat16 products (an AVX2 CPU): the tests held against its arithmetic run ours in
    bfloat16 too, whatever the CPU."""
    monkeypatch.setattr(muon_module, "newton_schulz_dtype", lambda device: torch.bfloat16)


def tiny_model(*extra: str) -> GPT:
    torch.manual_seed(0)
    return GPT(load_config(TINY, ["model.vocab_size=65", *extra]).model)


@pytest.mark.parametrize("tie", [True, False])
def test_muon_takes_the_blocks_matrices_and_adamw_the_rest(tie):
    model = tiny_model(f"model.tie_weights={str(tie).lower()}", "model.bias=true")
    muon, rest = muon_params(model)
    shapes = dict(model.named_parameters())
    assert muon and all(n.startswith("h.") and shapes[n].dim() == 2 for n in muon)
    assert "wte.weight" in rest and ("lm_head.weight" in rest) != tie  # a tied head is wte itself
    assert all(
        shapes[n].dim() == 1
        for n in rest
        if n not in ("wte.weight", "lm_head.weight", "wpe.weight")
    )
    assert any(
        n.startswith("h.") and shapes[n].dim() == 1 for n in rest
    )  # the blocks' gains and biases
    assert sorted(muon + rest) == sorted(shapes)  # every parameter, once
    opt = MuonAdamW(model, TrainConfig(optimizer="muon"))
    assert [p for g in opt.muon.param_groups for p in g["params"]] == [shapes[n] for n in muon]
    assert {id(p) for g in opt.adamw.param_groups for p in g["params"]} == {
        id(shapes[n]) for n in rest
    }


def _steps(model: GPT, opt, n: int) -> list[torch.Tensor]:
    """``n`` steps on fixed random batches with the schedule's lr; the weights after each."""
    g = torch.Generator().manual_seed(1)
    out = []
    for step in range(n):
        x = torch.randint(0, 65, (4, 32), generator=g)
        _, loss = model(x, torch.roll(x, -1, 1))
        loss.backward()
        set_lr(opt, 3e-3 * (step + 1) / n)  # a changing rate, as a schedule gives
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    return out


@pytest.mark.parametrize(
    "muon",
    [
        {},
        {
            "nesterov": False,
            "adjust_lr": "match_rms_adamw",
            "weight_decay": 0.1,
            "ns_steps": 3,
            "momentum": 0.8,
        },
    ],
)
def test_the_batched_newton_schulz_makes_torch_optim_muons_updates(muon):
    """BatchedMuon against torch.optim.Muon itself, on a GPT's matrices (three shapes, tall and
    wide), 4 steps."""
    tc = TrainConfig(optimizer="muon", learning_rate=3e-3, muon=muon)
    ours, theirs = tiny_model("model.ffn=swiglu"), tiny_model("model.ffn=swiglu")
    a = _steps(ours, MuonAdamW(ours, tc), 4)
    b = _steps(theirs, MuonAdamW(theirs, tc, muon_class=torch.optim.Muon), 4)
    start = torch.cat([p.detach().flatten() for p in tiny_model("model.ffn=swiglu").parameters()])
    for x, y in zip(a, b):
        assert (x - start).abs().max() > 1e-4  # the weights moved
        assert torch.allclose(x, y, atol=1e-6, rtol=0), (x - y).abs().max()


def test_orthogonalize_equals_torch_optim_muons_newton_schulz_on_each_matrix():
    """Stacks of several shapes in one call (tall, wide, square; Gram sides 24 and 40, so two middle
    products) give each matrix what torch.optim.Muon's own iteration gives it alone."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    from minigpt_cli.trainer.muon import orthogonalize

    g = torch.Generator().manual_seed(0)
    stacks = [
        torch.randn(b, m, n, generator=g)
        for b, m, n in ((3, 96, 24), (2, 24, 64), (4, 24, 24), (2, 40, 72), (2, 24, 96))
    ]  # the last is iterated transposed, in one stack with the first
    coefficients, steps, eps = (3.4445, -4.7750, 2.0315), 5, 1e-7
    for stack, ortho in zip(stacks, orthogonalize(stacks, [coefficients] * steps, eps)):
        assert ortho.shape == stack.shape and ortho.dtype == torch.bfloat16
        for x, y in zip(stack, ortho):
            expected = _zeropower_via_newtonschulz(x, coefficients, steps, eps)
            assert torch.allclose(y.float(), expected.float(), atol=1e-6, rtol=0), (
                (y.float() - expected).abs().max()
            )
            s = torch.linalg.svdvals(y.float())
            assert (
                s.max() < 1.5 and 0.6 < s.median() < 1.3
            )  # singular values pulled towards 1 (S' about 0.5..1.5)


def test_gram_newton_schulz_is_the_same_polynomial_where_it_pays_and_the_plain_one_elsewhere():
    """ns_method gram: in float64 the same iterates as the standard iteration (tall, wide and
    square stacks; quintic and Polar Express, 5 iterations, so a restart and an odd chunk), a
    square stack the standard iteration's to the bit in bfloat16, and the bfloat16 iterates of the
    others within 5% of float64's and 3 times the standard iteration's distance (1.4-1.8% here),
    singular values near 1."""
    from minigpt_cli.trainer.muon import iteration_coefficients, orthogonalize

    g = torch.Generator().manual_seed(0)
    shapes = ((3, 96, 24), (2, 24, 64), (4, 24, 24), (2, 30, 24), (2, 24, 96))  # 30/24 is no gain
    stacks = [torch.randn(b, m, n, generator=g, dtype=torch.float64) for b, m, n in shapes]
    for kind in ("quintic", "polar-express"):
        iterations, safety = iteration_coefficients(kind, 5, (3.4445, -4.7750, 2.0315))
        plain, gram = (
            orthogonalize(stacks, iterations, 1e-7, safety, torch.float64, method)
            for method in ("standard", "gram")
        )
        for x, y in zip(plain, gram):
            assert torch.allclose(x, y, atol=1e-12, rtol=0), (x - y).abs().max()
    iterations = [(3.4445, -4.7750, 2.0315)] * 5
    reference = orthogonalize(stacks, iterations, 1e-7, dtype=torch.float64)
    plain, gram = (
        orthogonalize(stacks, iterations, 1e-7, dtype=torch.bfloat16, method=method)
        for method in ("standard", "gram")
    )
    assert torch.equal(plain[2], gram[2]) and torch.equal(plain[3], gram[3])  # no gain: plain
    assert not torch.equal(plain[0], gram[0])  # the Gram iteration ran where it pays
    for ref, x, y in zip(reference, plain, gram):
        assert y.dtype == torch.bfloat16 and y.shape == ref.shape
        error = [(t.double() - ref).norm() / ref.norm() for t in (x, y)]
        assert error[0] < 0.02 and error[1] < min(0.05, 3 * error[0]), error
        s = torch.linalg.svdvals(y.double())
        assert s.max() < 1.5 and 0.6 < s.median() < 1.3


def test_a_cpu_that_emulates_bfloat16_products_iterates_in_float32(monkeypatch):
    """newton_schulz_dtype: bfloat16 where the CPU multiplies it natively (oneDNN's check), else
    float32, whose iterates follow a float64 iteration far closer than bfloat16's."""
    from minigpt_cli.trainer.muon import orthogonalize

    cpu = torch.device("cpu")
    for native in (True, False):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native)
        device_module.cpu_multiplies_bfloat16.cache_clear()
        expected = torch.bfloat16 if native else torch.float32
        assert NEWTON_SCHULZ_DTYPE(cpu) == expected
    device_module.cpu_multiplies_bfloat16.cache_clear()
    g = torch.Generator().manual_seed(0)
    stacks = [torch.randn(2, 96, 24, generator=g), torch.randn(2, 24, 64, generator=g)]
    coefficients, steps, eps = (3.4445, -4.7750, 2.0315), 5, 1e-7
    wide = orthogonalize(stacks, [coefficients] * steps, eps, dtype=torch.float32)
    narrow = orthogonalize(stacks, [coefficients] * steps, eps, dtype=torch.bfloat16)
    for stack, ours, rounded in zip(stacks, wide, narrow):
        assert ours.dtype == torch.float32 and ours.shape == stack.shape
        for x, y, z in zip(stack, ours, rounded):
            # The same iteration in float64 (torch's casts to bfloat16), wide side first.
            x64 = x.double() / x.double().norm().clamp(min=eps)
            tall = x64.size(0) > x64.size(1)
            x64 = x64.T if tall else x64
            a, b, c = coefficients
            for _ in range(steps):
                gram = x64 @ x64.T
                x64 = a * x64 + (b * gram + c * gram @ gram) @ x64
            exact = x64.T if tall else x64
            assert (y.double() - exact).abs().max() < 1e-4
            assert (z.double() - exact).abs().max() > 10 * (y.double() - exact).abs().max()


def test_muon_follows_the_schedule_from_its_own_rate_and_its_state_reloads():
    model = tiny_model()
    tc = TrainConfig(optimizer="muon", learning_rate=2e-3, muon={"learning_rate": 0.05})
    opt = make_optimizer(model, tc)
    set_lr(opt, 1e-3)  # half the peak
    assert {g["lr"] for g in opt.adamw.param_groups} == {1e-3}
    assert [g["lr"] for g in opt.muon.param_groups] == [pytest.approx(0.025)]
    _steps(model, opt, 2)
    state = opt.state_dict()
    assert sorted(state["state"]) == list(
        range(len(list(model.parameters())))
    )  # one index per parameter
    fresh = make_optimizer(model, tc)
    fresh.load_state_dict(state)
    for p in model.parameters():
        for k, v in opt.state[p].items():
            assert torch.equal(fresh.state[p][k], v), k


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize(
    "extra",
    [
        (),
        (
            "model.bias=true",
            "model.tie_weights=false",
            "model.value_embeddings=true",
            "model.qk_norm=true",
        ),
    ],
)
def test_the_memory_estimate_counts_the_optimizer_state_it_makes(optimizer, extra):
    """count-params' and the dry run's optimizer-state bytes equal the float32 state tensors the
    optimizer holds after a step: Adam's two moments per parameter, Muon's one momentum buffer per
    matrix of the blocks."""
    from minigpt_cli.accounting.params import memory

    model = tiny_model(*extra)
    opt = make_optimizer(model, TrainConfig(optimizer=optimizer))
    _steps(model, opt, 1)
    held = sum(
        v.numel() * v.element_size()
        for p in model.parameters()
        for v in opt.state[p].values()
        if torch.is_tensor(v) and v.dim() > 0
    )  # the moments, not AdamW's step counters
    mem = memory(model.config, "float32", 4, 32, optimizer=optimizer)
    assert mem["adam_moments"] + mem["muon_momentum"] == held
    assert (mem["muon_momentum"] > 0) == (optimizer == "muon")


def test_wsd_schedule_follows_its_formula():
    """Hägele et al. 2024: peak until the decay's start, then min + (peak - min)·(1 -
    f(progress))."""
    base = dict(
        learning_rate=1e-3,
        min_lr=1e-4,
        warmup_iters=10,
        max_iters=100,
        lr_schedule="wsd",
        decay_fraction=0.3,
    )
    lin, sqrt = TrainConfig(**base, decay_shape="linear"), TrainConfig(**base, decay_shape="1-sqrt")
    assert wsd_decay_start(lin) == 70
    for tc in (lin, sqrt):
        assert lr_at(0, tc) == pytest.approx(1e-3 / 11)  # the warmup as every schedule's
        assert (
            lr_at(10, tc) == lr_at(45, tc) == lr_at(70, tc) == 1e-3
        )  # the stable phase: the peak, exactly
        assert lr_at(100, tc) == pytest.approx(1e-4)
    assert lr_at(85, lin) == pytest.approx(1e-4 + 9e-4 * (1 - 15 / 30))
    assert lr_at(85, sqrt) == pytest.approx(1e-4 + 9e-4 * (1 - math.sqrt(15 / 30)))
    assert lr_at(99, sqrt) == pytest.approx(1e-4 + 9e-4 * (1 - math.sqrt(29 / 30)))
    # The decay never starts inside the warmup: decay_fraction 1 decays from the warmup's end.
    whole = TrainConfig(**{**base, "decay_fraction": 1.0})
    assert wsd_decay_start(whole) == 10 and lr_at(10, whole) == 1e-3 and lr_at(55, whole) < 1e-3


def test_bad_optimizer_and_schedule_settings_are_refused_in_one_line(cli, tmp_path, monkeypatch):
    for bad in (0, -0.1, 1.5):
        with pytest.raises(ConfigError, match="train.decay_fraction"):
            load_config(TINY, [f"train.decay_fraction={bad}"])
    monkeypatch.chdir(tmp_path)
    res = cli(
        "train",
        TINY,
        "--dry-run",
        "--set",
        "train.optimizer=muon",
        "--set",
        "train.parallelism=fsdp",
    )
    assert_user_error(
        res, "train.optimizer muon cannot run with train.parallelism fsdp", "train.parallelism=ddp"
    )
    res = cli(
        "train",
        TINY,
        "--dry-run",
        "--set",
        "train.lr_schedule=wsd",
        "--set",
        "train.decay_fraction=0",
    )
    assert_user_error(res, "train.decay_fraction")


def test_muon_settings_under_adamw_get_a_note_not_a_refusal():
    cfg = load_config(
        TINY, ["train.muon.learning_rate=0.05", "train.muon.nesterov=true"]
    )  # nesterov: the default
    assert MUON_UNUSED.format(keys="train.muon.learning_rate") in config_notes(
        cfg, corpus_on_disk=False
    )
    muon = load_config(TINY, ["train.muon.learning_rate=0.05", "train.optimizer=muon"])
    assert not any("train.muon" in n for n in config_notes(muon, corpus_on_disk=False))


@pytest.mark.parametrize(
    "settings, said",
    [
        (["train.muon.cautious_weight_decay=true"], "set train.muon.weight_decay too"),
        (["train.muon.beta2=0.9"], "set train.muon.normuon=true to use it"),
        (["train.muon.cautious_weight_decay=true", "train.muon.weight_decay=0.1"], None),
        (["train.muon.beta2=0.9", "train.muon.normuon=true"], None),
    ],
)
def test_a_muon_variant_setting_that_does_nothing_gets_a_note(settings, said):
    notes = config_notes(
        load_config(TINY, ["train.optimizer=muon", *settings]), corpus_on_disk=False
    )
    found = [n for n in notes if "train.muon" in n]
    assert (found == []) if said is None else (len(found) == 1 and said in found[0]), found


def assert_bit_equal(a, b) -> None:
    """The same losses at every logged step and the same final weights, bit for bit."""
    assert curve(a) == curve(b)
    wa, wb = (load_file(r / "checkpoints" / "last" / "model.safetensors") for r in (a, b))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_muon_run_resumes_bit_exact_and_keeps_its_optimizer(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tiny(data_dir, "train.max_iters=30", "train.optimizer=muon", "model.dropout=0.1")
    train(cfg, run_name="whole", echo=lambda m: None, progress=False)
    import minigpt_cli.trainer.loop as T

    real_step = signals_after_step(monkeypatch, 13, signal.SIGINT)
    with pytest.raises(Interrupted, match="step 13"):
        train(cfg, run_name="cut", echo=lambda m: None, progress=False)
    monkeypatch.setattr(T, "train_step", real_step)
    state = torch.load(tmp_path / "runs/cut/checkpoints/last/trainer_state.pt", weights_only=True)
    assert any(
        "momentum_buffer" in s for s in state["optimizer"]["state"].values()
    )  # Muon's state is saved
    with pytest.raises(
        MinigptError, match="train.optimizer is adamw here but muon in the checkpoint"
    ):
        train(
            tiny(data_dir, "train.max_iters=30", "model.dropout=0.1"),
            resume="runs/cut",
            echo=lambda m: None,
            progress=False,
        )
    train(cfg, resume="runs/cut", echo=lambda m: None, progress=False)
    assert_bit_equal(tmp_path / "runs/whole", tmp_path / "runs/cut")


def test_a_wsd_cool_down_from_the_stable_phase_equals_the_run_trained_straight_to_it(
    data_dir, tmp_path, monkeypatch
):
    """A run planned for 60 steps (decay from step 30) is stopped at step 17 and cooled down to 40
    steps: the same run, bit for bit, as one trained to 40 from the start (decay from step 20),
    since every step before 17 ran at the same rates in both. A checkpoint past the new decay start
    (step 25) could not be: the schedules part before it."""
    monkeypatch.chdir(tmp_path)
    wsd = ("train.lr_schedule=wsd", "train.decay_fraction=0.5", "model.dropout=0.1")
    straight = tiny(data_dir, "train.max_iters=40", *wsd)
    train(straight, run_name="straight", echo=lambda m: None, progress=False)
    planned = tiny(data_dir, "train.max_iters=60", *wsd)
    assert wsd_decay_start(planned.train) == 30 and wsd_decay_start(straight.train) == 20
    import minigpt_cli.trainer.loop as T

    real_step = signals_after_step(monkeypatch, 17, signal.SIGINT)
    with pytest.raises(Interrupted, match="step 17"):
        train(planned, run_name="cool", echo=lambda m: None, progress=False)
    monkeypatch.setattr(T, "train_step", real_step)
    said = []
    train(straight, resume="runs/cool", echo=said.append, progress=False)
    assert any("train.max_iters 60 -> 40" in n and "(unchanged)" in n for n in said), said
    assert_bit_equal(tmp_path / "runs/straight", tmp_path / "runs/cool")
    assert lr_at(25, planned.train) != lr_at(25, straight.train)


def test_a_resume_note_gives_muons_learning_rate_too():
    """A resumed Muon run with a new schedule (or Muon rate) names Muon's group's rate before and
    after, which set_lr gives as the schedule's lr times train.muon.learning_rate /
    train.learning_rate."""
    from minigpt_cli.trainer.schedule import schedule_note

    saved = load_config(
        TINY, ["train.optimizer=muon", "train.max_iters=10", "train.muon.learning_rate=0.02"]
    )
    now = load_config(
        TINY, ["train.optimizer=muon", "train.max_iters=30", "train.muon.learning_rate=0.04"]
    )
    note = schedule_note(now, saved, 10)
    old, new = lr_at(10, saved.train, 32), lr_at(10, now.train, 32)
    assert "train.max_iters 10 -> 30" in note and "train.muon.learning_rate 0.02 -> 0.04" in note, (
        note
    )
    ratio_old, ratio_new = 0.02 / saved.train.learning_rate, 0.04 / now.train.learning_rate
    assert note.endswith(
        f"lr {new:.3e} at step 10 (was {old:.3e}), Muon's {new * ratio_new:.3e} "
        f"(was {old * ratio_old:.3e})"
    ), note
    adamw = load_config(TINY, ["train.max_iters=30"])
    assert "Muon" not in schedule_note(adamw, load_config(TINY, ["train.max_iters=10"]), 10)


# ---------------------------------------------------------------- Muon's variants (issue 39)

QUINTIC = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's default (a, b, c)


def _matrices(*shapes: tuple[int, int]) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(*s, generator=g) * 0.1) for s in shapes]


def _paper_iteration(g: torch.Tensor, iterations, safety: float) -> torch.Tensor:
    """Amsel et al. 2025's iteration as the paper writes it, in float64 on one matrix: X₀ =
    G/(‖G‖_F·(1 + safety)), then X ← aX + b(XXᵀ)X + c(XXᵀ)²X, on the wide orientation."""
    x = g.double()
    tall = x.size(0) > x.size(1)
    x = (x.T if tall else x) / (x.norm() * (1 + safety))
    for a, b, c in iterations:
        gram = x @ x.T
        x = a * x + b * gram @ x + c * gram @ gram @ x
    return x.T if tall else x


def test_polar_express_follows_the_papers_iteration_and_lands_nearer_the_polar_factor():
    """The batched bfloat16 iteration with Polar Express's coefficients is the paper's iteration
    (float64, one matrix at a time) up to bfloat16's rounding; its result is nearer U·Vᵀ (the
    exact polar factor, from the SVD) than the quintic's after the same 5 iterations; and the
    iterations past the 5 tuned ones converge to U·Vᵀ."""
    from minigpt_cli.trainer.muon import (
        POLAR_EXPRESS,
        POLAR_EXPRESS_LIMIT,
        POLAR_EXPRESS_SAFETY,
        iteration_coefficients,
        orthogonalize,
    )

    assert iteration_coefficients("quintic", 3, QUINTIC) == ([QUINTIC] * 3, 0.0)
    assert iteration_coefficients("polar-express", 3, QUINTIC) == (
        list(POLAR_EXPRESS[:3]),
        POLAR_EXPRESS_SAFETY,
    )
    seven, safety = iteration_coefficients("polar-express", 7, QUINTIC)
    assert seven == [*POLAR_EXPRESS, POLAR_EXPRESS_LIMIT, POLAR_EXPRESS_LIMIT]
    g = torch.Generator().manual_seed(0)
    stacks = [
        torch.randn(b, m, n, generator=g) for b, m, n in ((2, 96, 24), (2, 24, 64), (1, 48, 48))
    ]
    pe, _ = iteration_coefficients("polar-express", 5, QUINTIC)
    ours = orthogonalize(stacks, pe, 1e-7, safety)
    quintic = orthogonalize(stacks, [QUINTIC] * 5, 1e-7)
    for stack, x_pe, x_q in zip(stacks, ours, quintic):
        for g1, y_pe, y_q in zip(stack, x_pe, x_q):
            u, _, vh = torch.linalg.svd(g1.double(), full_matrices=False)
            polar = u @ vh
            exact = _paper_iteration(g1, pe, safety)
            assert (y_pe.double() - exact).abs().max() < 0.02  # bfloat16 over 5 iterations
            err_pe, err_q = ((y.double() - polar).norm() / polar.norm() for y in (y_pe, y_q))
            assert err_pe < 0.5 * err_q, (err_pe, err_q)  # about 0.1 against 0.22 here
            assert (_paper_iteration(g1, seven, safety) - polar).abs().max() < 1e-5


def test_normuon_normalises_each_row_as_computed_by_hand():
    """Two NorMuon steps on three matrices (two of one shape, stacked) against the paper's
    arithmetic done here in float64 on torch.optim.Muon's own Newton-Schulz output (momentum 0:
    the update is the gradient): v ← β₂v + (1 − β₂)·mean_j O_ij², Ô = O/(√v + ε) scaled back to
    ‖O‖_F. After one step every row of a matrix moves by the same RMS, which O's rows do not."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    from minigpt_cli.trainer.muon import NORMUON_EPS, BatchedMuon

    shapes = [(48, 16), (48, 16), (16, 40)]
    params = _matrices(*shapes)
    expected = [p.detach().double().clone() for p in params]
    lr, beta2 = 0.02, 0.9
    opt = BatchedMuon(
        params, lr=lr, momentum=0.0, nesterov=False, weight_decay=0.0, normuon=True, beta2=beta2
    )
    g = torch.Generator().manual_seed(1)
    v = [torch.zeros(m, 1, dtype=torch.float64) for m, _ in shapes]
    for step in range(2):
        grads = [torch.randn(*s, generator=g) for s in shapes]
        before = [p.detach().clone() for p in params]
        for p, grad in zip(params, grads):
            p.grad = grad.clone()
        opt.step()
        for i, ((m, n), grad) in enumerate(zip(shapes, grads)):
            o = _zeropower_via_newtonschulz(grad, QUINTIC, 5, 1e-7).double()
            v[i] = beta2 * v[i] + (1 - beta2) * o.square().mean(dim=1, keepdim=True)
            hat = o / (v[i].sqrt() + NORMUON_EPS)
            hat = hat * (o.norm() / hat.norm())
            expected[i] -= lr * max(1, m / n) ** 0.5 * hat
            if step == 0:
                moved = (params[i].detach() - before[i]).square().mean(dim=1).sqrt()
                assert torch.allclose(moved, moved.mean().expand_as(moved), rtol=1e-3)
                rows = o.square().mean(dim=1).sqrt()
                assert i == 2 or rows.max() > 1.1 * rows.min()  # O's rows differ (tall matrices)
    for p, e, vi in zip(params, expected, v):
        assert torch.allclose(p.detach().double(), e, atol=1e-6, rtol=0), (p - e).abs().max()
        kept = opt.state[p]["second_momentum_buffer"]
        assert kept.shape == (p.size(0), 1) and kept.dtype == torch.float32
        assert torch.allclose(kept.double(), vi, rtol=1e-5, atol=0)


def test_cautious_weight_decay_decays_only_where_update_and_weight_agree_in_sign():
    """A crafted case: the weight takes the sign of torch.optim.Muon's update on half the entries
    (a checkerboard) and the opposite sign on the other half; one step decays the first half by
    1 - lr·wd and leaves the second undecayed, then subtracts the update everywhere."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    from minigpt_cli.trainer.muon import BatchedMuon

    g = torch.Generator().manual_seed(2)
    grad = torch.randn(24, 16, generator=g)
    update = _zeropower_via_newtonschulz(
        grad, QUINTIC, 5, 1e-7
    ).float()  # momentum 0: the gradient's
    agree = (torch.arange(24)[:, None] + torch.arange(16)) % 2 == 0
    start = (0.5 + torch.rand(24, 16, generator=g)) * update.sign() * torch.where(agree, 1.0, -1.0)
    lr, wd = 0.05, 0.5
    runs = {}
    for cautious in (True, False):
        p = torch.nn.Parameter(start.clone())
        p.grad = grad.clone()
        BatchedMuon(
            [p],
            lr=lr,
            momentum=0.0,
            nesterov=False,
            weight_decay=wd,
            cautious_weight_decay=cautious,
        ).step()
        runs[cautious] = p.detach()
    alr = lr * (24 / 16) ** 0.5  # adjust_lr original: sqrt(max(1, rows/cols))
    expected = torch.where(agree, start * (1 - lr * wd), start) - alr * update
    assert torch.allclose(runs[True], expected, atol=1e-6, rtol=0)
    assert torch.allclose(runs[False], start * (1 - lr * wd) - alr * update, atol=1e-6, rtol=0)
    assert torch.equal(runs[True][agree], runs[False][agree])  # decayed alike where they agree
    assert not torch.isclose(runs[True][~agree], runs[False][~agree]).any()


def test_the_variants_are_off_by_default_and_a_resume_takes_them_from_the_config():
    """Every Muon group carries the variant settings (the config's), also after loading a state
    saved without them (a checkpoint from before the variants) or with other values (a resume
    that changes a switch); turning NorMuon off drops its second moment."""
    model = tiny_model()
    plain = make_optimizer(model, TrainConfig(optimizer="muon"))
    from minigpt_cli.trainer.optim import MUON_PLAIN

    assert all({k: g[k] for k in MUON_PLAIN} == MUON_PLAIN for g in plain.muon.param_groups)
    on = {"coefficients": "polar-express", "normuon": True, "beta2": 0.9}
    variant = make_optimizer(model, TrainConfig(optimizer="muon", muon=on))
    _steps(model, variant, 2)
    saved = variant.state_dict()
    assert any("second_momentum_buffer" in s for s in saved["state"].values())
    old = {
        **saved,
        "param_groups": [
            {k: v for k, v in g.items() if k not in MUON_PLAIN} for g in saved["param_groups"]
        ],
    }
    for state, tc_muon in ((old, on), (saved, {})):
        fresh = make_optimizer(model, TrainConfig(optimizer="muon", muon=tc_muon))
        fresh.load_state_dict(state)
        want = {**MUON_PLAIN, **tc_muon}
        assert all({k: g[k] for k in MUON_PLAIN} == want for g in fresh.muon.param_groups)
        held = any("second_momentum_buffer" in s for s in fresh.muon.state.values())
        assert held == bool(tc_muon)
        _steps(model, fresh, 1)  # and it steps


@pytest.mark.parametrize(
    "variant",
    [
        ["train.muon.coefficients=polar-express"],
        ["train.muon.ns_method=gram"],
        ["train.muon.normuon=true", "train.muon.beta2=0.9"],
        ["train.muon.cautious_weight_decay=true", "train.muon.weight_decay=0.5"],
    ],
    ids=["polar-express", "gram", "normuon", "cautious-wd"],
)
def test_a_muon_variant_run_resumes_bit_exact(variant, data_dir, tmp_path, monkeypatch):
    """20 steps straight against 10, a Ctrl-C and a resume to 20: the same losses and weights to
    the bit; and not those of plain Muon, so the switch took effect."""
    monkeypatch.chdir(tmp_path)
    cfg = tiny(data_dir, "train.max_iters=20", "train.optimizer=muon", *variant)
    train(cfg, run_name="whole", echo=lambda m: None, progress=False)
    import minigpt_cli.trainer.loop as T

    real_step = signals_after_step(monkeypatch, 10, signal.SIGINT)
    with pytest.raises(Interrupted, match="step 10"):
        train(cfg, run_name="cut", echo=lambda m: None, progress=False)
    monkeypatch.setattr(T, "train_step", real_step)
    state = torch.load(tmp_path / "runs/cut/checkpoints/last/trainer_state.pt", weights_only=True)
    held = any("second_momentum_buffer" in s for s in state["optimizer"]["state"].values())
    assert held == ("train.muon.normuon=true" in variant)  # NorMuon's state is saved
    train(cfg, resume="runs/cut", echo=lambda m: None, progress=False)
    assert_bit_equal(tmp_path / "runs/whole", tmp_path / "runs/cut")
    plain = tiny(data_dir, "train.max_iters=20", "train.optimizer=muon", *variant[1:])
    train(plain, run_name="plain", echo=lambda m: None, progress=False)
    assert curve(tmp_path / "runs/plain") != curve(tmp_path / "runs/whole")
