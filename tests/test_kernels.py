"""The oneDNN linear layers: equal to F.linear with their gradients, taken only where they pay,
swapped in by the commands without touching the state dict."""

from __future__ import annotations

import copy

import pytest
import torch

from minigpt_cli.config.schema import ModelConfig
from minigpt_cli.errors import MinigptError
from minigpt_cli.model.gpt import GPT
from minigpt_cli.runtime.kernels import onednn
from minigpt_cli.runtime.kernels.onednn import (
    ONEDNN_MIN_FLOPS,
    ONEDNN_MIN_WEIGHT,
    linear,
    linear_kernel,
)

# Every test here compares the oneDNN path with PyTorch's: without oneDNN (not x86-64, or a PyTorch
# without the op) there is nothing to compare, and the comparison would be F.linear against itself.
pytestmark = pytest.mark.skipif(
    not onednn.available(), reason="oneDNN's linear op is not available here"
)


def small(**kw) -> ModelConfig:
    base = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=65, dropout=0.0)
    base.update(kw)
    return ModelConfig(**base)


# Every case is above ONEDNN_MIN_FLOPS (2·M·K·N ≥ 4 MFLOP), so on x86-64 it takes the oneDNN path;
# out > in and out < in take the two weight-gradient orientations.
@pytest.mark.parametrize(
    "shape,out,bias,transposed",
    [
        ((4, 64, 96), 160, True, False),
        ((600, 96), 48, False, False),
        ((64, 8, 96), 48, True, True),
        ((64, 8, 96), 160, True, True),
        ((600, 96), 65, False, False),
    ],
)  # 65: PyTorch's transpose
def test_linear_equals_f_linear_with_its_gradients(shape, out, bias, transposed):
    torch.manual_seed(0)
    x = torch.randn(*shape)
    if transposed:  # a non-contiguous input, as last_only's slice gives the head
        x = x.transpose(0, 1)
    x.requires_grad_(True)
    w = torch.randn(out, 96, requires_grad=True)
    b = torch.randn(out, requires_grad=True) if bias else None
    leaves = [t for t in (x, w, b) if t is not None]
    g = torch.randn(*x.shape[:-1], out)

    y = linear(x, w, b)
    # On x86-64 (this project's CI) the oneDNN path must be the one taken.
    assert "OneDNN" in type(y.grad_fn).__name__
    ours = torch.autograd.grad(y, leaves, g)
    ref = torch.autograd.grad(torch.nn.functional.linear(x, w, b), leaves, g)
    # Float32 rounding of sums over 96 (forward, input gradient) or 256-600 terms (weight gradient).
    y_f = torch.nn.functional.linear(x, w, b)
    torch.testing.assert_close(y, y_f, rtol=1e-5, atol=1e-6 * float(y_f.detach().abs().max()))
    for a, r in zip(ours, ref):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-6 * float(r.abs().max()))
    with torch.no_grad():  # the inference path skips autograd but computes the same
        torch.testing.assert_close(linear(x, w, b), y.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(768, 128), (7, 16), (5, 13), (1, 8)])
def test_transposed_copies_the_transpose(shape):
    x = torch.randn(*shape)
    out = onednn.transposed(x)
    assert out.is_contiguous() and torch.equal(out, x.t())
    assert torch.equal(
        onednn.transposed(x.t().contiguous().t()), x.t()
    )  # a non-contiguous input too


def test_model_loss_and_gradients_do_not_depend_on_the_matmul_kernel():
    torch.manual_seed(0)
    # Big enough for every product (lm_head's 256 x 128 x 65 too) to pass ONEDNN_MIN_FLOPS.
    plain = GPT(small(bias=True, n_embd=128, block_size=64))
    fast = copy.deepcopy(plain)
    assert onednn.swap_linears(fast, enabled=True) is fast
    assert fast.state_dict().keys() == plain.state_dict().keys()
    assert fast.lm_head.weight is fast.wte.weight  # tying survives the swap
    x = torch.randint(0, 65, (4, 64))
    y = torch.randint(0, 65, (4, 64))
    results = []
    for model, kernel in ((fast, True), (plain, False)):
        logits, loss = model(x, y)
        assert ("OneDNN" in type(logits.grad_fn).__name__) == kernel
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (l1, g1), (l2, g2) = results
    torch.testing.assert_close(l1, l2, rtol=1e-5, atol=1e-6)
    assert g1.keys() == g2.keys()
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], rtol=1e-4, atol=1e-6, msg=name)


def test_bf16_autocast_keeps_torchs_kernels():
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(3, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = linear(x, w)
    assert y.dtype == torch.bfloat16 and "OneDNN" not in type(y.grad_fn).__name__


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.func.jvp's own torch.jit use
def test_linear_keeps_f_linear_where_onednn_would_lose_or_differ():
    torch.manual_seed(0)
    w = torch.randn(160, 96, requires_grad=True)
    big = torch.randn(256, 96, requires_grad=True)
    assert 2 * big.numel() * 160 >= ONEDNN_MIN_FLOPS
    assert "OneDNN" in type(linear(big, w).grad_fn).__name__
    # A one-token product (generation) is below the threshold: a oneDNN call costs more than it
    # saves ...
    one = torch.randn(1, 96, requires_grad=True)
    assert "OneDNN" not in type(linear(one, w).grad_fn).__name__
    # ... unless the weight is big enough that streaming it dominates.
    big_w = torch.randn(ONEDNN_MIN_WEIGHT // 96 + 1, 96, requires_grad=True)
    assert "OneDNN" in type(linear(one, big_w).grad_fn).__name__
    # An empty batch has nothing to gain and oneDNN's backward refuses it.
    empty = torch.randn(0, 96, requires_grad=True)
    linear(empty, big_w).sum().backward()
    assert empty.grad.shape == (0, 96) and not big_w.grad.any()
    # A strided bias must be read with its strides (oneDNN would read it as dense).
    with torch.no_grad():
        b = torch.randn(320)[::2]
        torch.testing.assert_close(
            linear(big, w, b), torch.nn.functional.linear(big, w, b), rtol=1e-5, atol=1e-5
        )
        # Mismatched shapes get PyTorch's own message, not oneDNN's.
        with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
            linear(torch.randn(256, 95), w)
    # Forward-mode AD (torch.func.jvp) needs F.linear's derivative formulas: the tangent must be
    # right.
    v = torch.randn_like(big)
    wd = w.detach()
    _, tangent = torch.func.jvp(lambda a: linear(a, wd), (big.detach(),), (v,))
    torch.testing.assert_close(tangent, v @ wd.t(), rtol=1e-5, atol=1e-4)


def test_linear_kernel_reports_what_runs():
    """env.json's and bench's linear_kernel: the same rule as linear() itself, both thresholds."""
    cpu, f32 = torch.device("cpu"), torch.float32
    seen = set()

    def record(module, args, out):
        seen.add("oneDNN" if "OneDNN" in type(out.grad_fn).__name__ else "torch.mm")

    for n_embd, B, T in ((32, 8, 32), (128, 8, 64), (256, 1, 4), (64, 8, 32)):
        model = onednn.swap_linears(GPT(small(n_embd=n_embd, block_size=T)), enabled=True)
        handles = [
            m.register_forward_hook(record)
            for m in model.modules()
            if isinstance(m, torch.nn.Linear)
        ]
        seen.clear()
        model(torch.randint(0, 65, (B, T)))
        for h in handles:
            h.remove()
        expected = "+".join(sorted(seen))
        assert linear_kernel(model, B * T, cpu, f32) == expected, (n_embd, B, T)
        if n_embd >= 128:
            assert "oneDNN" in expected  # (256, 1 x 4): by the weight rule alone
        assert linear_kernel(model, B * T, cpu, f32, compiled=True) == "torch.mm"
        assert linear_kernel(model, B * T, cpu, torch.bfloat16) == "torch.mm"
        # An unswapped model computes with nn.Linear: PyTorch's kernel whatever the size.
        assert linear_kernel(GPT(small(n_embd=n_embd, block_size=T)), B * T, cpu, f32) == "torch.mm"


def test_onednn_setting_is_read_when_a_model_is_swapped(monkeypatch):
    """MINIGPT_ONEDNN decides at swap time (no flag frozen at import); a bad value is a clear
    error. It swaps where oneDNN wins (an AVX-512 CPU), whatever the CPU running the test."""
    for wins in (True, False):
        monkeypatch.setattr(onednn, "wins", lambda: wins)
        for value, swapped in (("0", False), ("off", False), ("1", wins), ("", wins)):
            monkeypatch.setenv("MINIGPT_ONEDNN", value)
            model = onednn.swap_linears(GPT(small()))
            assert isinstance(model.lm_head, onednn.OneDNNLinear) == swapped, (value, wins)
    monkeypatch.setenv("MINIGPT_ONEDNN", "bogus")
    with pytest.raises(MinigptError, match="MINIGPT_ONEDNN='bogus'"):
        onednn.swap_linears(GPT(small()))
