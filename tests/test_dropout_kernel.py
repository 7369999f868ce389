"""The fast CPU dropout: its masks drop the right share and keep E[y] = x, its attention equals
PyTorch's with the same mask, its gradients are the masked ones, and a swapped model computes as
before."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from minigpt_cli.config.schema import ModelConfig
from minigpt_cli.errors import MinigptError
from minigpt_cli.model.gpt import GPT
from minigpt_cli.runtime.kernels import dropout as fast
from minigpt_cli.runtime.kernels import swap


def small(**kw) -> ModelConfig:
    base = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=65, dropout=0.2)
    base.update(kw)
    return ModelConfig(**base)


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5, 0.9])
def test_keep_mask_drops_p_and_keeps_the_mean(p):
    torch.manual_seed(0)
    n = 1_000_000
    mask = fast.keep_mask((1000, 1000), p)
    dropped = fast.drop_threshold(p) / fast.LEVELS
    assert abs(dropped - p) <= 2**-17
    scale = 1 / (1 - dropped)
    values = mask.unique().tolist()
    assert values[0] == 0.0 and values[1] == pytest.approx(scale, rel=1e-7) and len(values) == 2
    # Binomial: the dropped share within 5 standard deviations of the drop probability.
    share = float((mask == 0).double().mean())
    assert abs(share - dropped) < 5 * math.sqrt(dropped * (1 - dropped) / n)
    # Inverted dropout: E[mask] = 1 (the kept share times 1/(1 - dropped)).
    assert abs(float(mask.double().mean()) - 1) < 5 * math.sqrt(dropped / (1 - dropped) / n)


def test_keep_mask_bits_are_uniform_and_independent_between_neighbours():
    """Both int16 halves of each 64-bit word are used: neighbouring elements are uncorrelated."""
    torch.manual_seed(1)
    mask = fast.keep_mask((2_000_000,), 0.5) > 0
    a, b = mask[:-1].double(), mask[1:].double()
    corr = float(((a - a.mean()) * (b - b.mean())).mean() / (a.std() * b.std()))
    assert abs(corr) < 5 / math.sqrt(mask.numel())
    for offset in range(4):  # each of the four int16 lanes of a word drops half
        assert abs(float(mask[offset::4].double().mean()) - 0.5) < 5 * 0.5 / math.sqrt(
            mask.numel() / 4
        )


def test_keep_mask_follows_the_global_seed():
    torch.manual_seed(7)
    first = fast.keep_mask((64, 64), 0.2)
    torch.manual_seed(7)
    assert torch.equal(first, fast.keep_mask((64, 64), 0.2))
    assert not torch.equal(first, fast.keep_mask((64, 64), 0.2))  # the generator moved on


def test_dropout_gradient_is_the_forward_mask():
    torch.manual_seed(0)
    x = torch.randn(8, 16, 32, requires_grad=True)
    y = fast.dropout(x, 0.2, training=True)
    assert type(y.grad_fn).__name__ == "_DropoutBackward"
    mask = y.detach() / x.detach()
    g = torch.randn_like(y)
    y.backward(g)
    torch.testing.assert_close(x.grad, g * mask, rtol=1e-6, atol=1e-6)
    assert set((y.detach() == 0).unique().tolist()) == {True, False}


def test_dropout_keeps_pytorchs_where_it_does_not_apply():
    x = torch.randn(4, 8)
    assert torch.equal(fast.dropout(x, 0.2, training=False), x)  # evaluation mode
    assert torch.equal(fast.dropout(x, 0.0, training=True), x)
    assert torch.equal(fast.dropout(x, 1.0, True), torch.zeros_like(x))


def test_bfloat16_dropout_keeps_the_float32_masks_drops():
    """A bfloat16 tensor takes the fast path with the float32 mask's drops, from the same random
    draws (so the seed reproduces it), its kept values scaled by the mask's scale rounded to bfloat16
    (65536/52429 becomes 1.25 for p = 0.2); the gradient is the output's mask."""
    x = torch.randn(64, 96).bfloat16().requires_grad_()
    torch.manual_seed(5)
    reference = fast.keep_mask(x.shape, 0.2)
    torch.manual_seed(5)
    y = fast.dropout(x, 0.2, True)
    assert y.dtype == torch.bfloat16 and type(y.grad_fn).__name__ == "_DropoutBackward"
    assert torch.equal(y == 0, (reference == 0) | (x == 0))
    assert torch.equal(y, x.detach() * reference.bfloat16())
    y.backward(torch.ones_like(y))
    assert x.grad.dtype == torch.bfloat16 and torch.equal(x.grad, reference.bfloat16())


def reference_attention(q, k, v, mask):
    """Causal attention with weights times mask, in plain autograd ops (float64)."""
    T = q.size(-2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) * mask) @ v


def full_mask(masks, B, H, T):
    """The blocks' masks placed in one (B, H, T, T) mask (above the diagonal: anything, the weights
    are 0)."""
    full = torch.zeros(B * H, T, T, dtype=torch.float64)
    for (r0, r1), mask in zip(fast.query_blocks(T), masks):
        full[:, r0:r1, :r1] = mask
    return full.view(B, H, T, T)


@pytest.mark.parametrize("T", [24, 128, 150, 300])  # one block, then 2, 3 and 4 of them
def test_causal_attention_equals_plain_ops_with_the_same_mask(T):
    torch.manual_seed(0)
    B, H, D = 2, 3, 16
    qkv = [torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(3)]
    masks = fast.attention_masks(B, H, T, 0.3)
    assert [m.shape[1:] for m in masks] == [(r1 - r0, r1) for r0, r1 in fast.query_blocks(T)]
    assert fast.query_blocks(T)[-1][1] == T and len(masks) == min(4, -(-T // 64))
    ours_in = [t.float().requires_grad_() for t in qkv]
    ref_in = [t.clone().requires_grad_() for t in qkv]
    y = fast.causal_attention(*ours_in, masks)
    y_ref = reference_attention(*ref_in, full_mask(masks, B, H, T))
    g = torch.randn_like(y_ref)
    y.backward(g.float())
    y_ref.backward(g)
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-5, atol=1e-5)
    for ours, ref in zip(ours_in, ref_in):
        torch.testing.assert_close(ours.grad.double(), ref.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("T", [24, 150, 300])
def test_bfloat16_causal_attention_is_the_float64_one_to_bfloat16_rounding(T):
    """The kernel in bfloat16 (q, k, v and masks): its values and gradients are the float64 plain
    ops' on the same bfloat16 numbers and masks to bfloat16's rounding (a few parts in 1,000, as the
    float32 kernel is to float32's), with the gradients in bfloat16."""
    torch.manual_seed(0)
    B, H, D = 2, 3, 16
    qkv = [torch.randn(B, H, T, D).bfloat16() for _ in range(3)]
    masks = fast.attention_masks(B, H, T, 0.3, dtype=torch.bfloat16)
    assert all(m.dtype == torch.bfloat16 for m in masks)
    ours_in = [t.clone().requires_grad_() for t in qkv]
    ref_in = [t.double().requires_grad_() for t in qkv]
    y = fast.causal_attention(*ours_in, masks)
    y_ref = reference_attention(*ref_in, full_mask([m.double() for m in masks], B, H, T))
    g = torch.randn_like(y_ref).bfloat16()
    y.backward(g)
    y_ref.backward(g.double())
    assert y.dtype == torch.bfloat16

    def relative(a, b):
        return ((a.double() - b).norm() / b.norm()).item()

    assert relative(y, y_ref) < 1e-2
    for ours, ref in zip(ours_in, ref_in):
        assert ours.grad.dtype == torch.bfloat16 and relative(ours.grad, ref.grad) < 1e-2


@pytest.mark.parametrize("units", [True, False])
def test_attention_with_dropout_under_bfloat16_autocast_runs_in_bfloat16_on_bfloat16_units(
    monkeypatch, units
):
    """Under a CPU's bfloat16 autocast, causal attention with dropout runs the kernel in bfloat16
    with bfloat16 masks where the CPU has bfloat16 units (q and k, float32 from RoPE, rounded to
    bfloat16), else in float32 with float32 masks, cast back; the same random draws either way, and
    q's gradient in q's dtype."""
    monkeypatch.setattr(fast, "multiplies_bfloat16", lambda: units)
    torch.manual_seed(0)
    B, H, T, D = 2, 2, 80, 8
    q, k = (torch.randn(B, H, T, D).requires_grad_() for _ in range(2))
    v = torch.randn(B, H, T, D).bfloat16().requires_grad_()
    torch.manual_seed(5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fast.attention(q, k, v, dropout_p=0.2, is_causal=True)
    torch.manual_seed(5)
    dtype = torch.bfloat16 if units else torch.float32
    masks = fast.attention_masks(B, H, T, 0.2, dtype=dtype)
    expected = fast.causal_attention(q.to(dtype), k.to(dtype), v.to(dtype), masks).bfloat16()
    assert y.dtype == torch.bfloat16 and torch.equal(y, expected)
    y.float().sum().backward()
    assert q.grad.dtype == torch.float32 and v.grad.dtype == torch.bfloat16


def test_causal_attention_without_drops_equals_sdpa():
    """With a mask of ones, the values and gradients of PyTorch's flash kernel."""
    torch.manual_seed(0)
    B, H, T, D = 2, 4, 200, 8
    base = [torch.randn(B, H, T, D) for _ in range(3)]
    ours_in = [t.clone().requires_grad_() for t in base]
    ref_in = [t.clone().requires_grad_() for t in base]
    ones = [torch.ones(B * H, r1 - r0, r1) for r0, r1 in fast.query_blocks(T)]
    y = fast.causal_attention(*ours_in, ones)
    y_ref = F.scaled_dot_product_attention(*ref_in, is_causal=True)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
    for ours, ref in zip(ours_in, ref_in):
        torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-5, atol=1e-5)


def test_attention_takes_sdpa_where_the_fast_path_does_not_apply():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    flash = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(fast.attention(q, k, v, is_causal=True), flash)  # no dropout
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    torch.manual_seed(1)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.5)
    torch.manual_seed(1)
    assert torch.equal(
        fast.attention(q, k, v, attn_mask=mask, dropout_p=0.5), expected
    )  # a mask: PyTorch's


def test_swapped_model_is_the_same_model_with_faster_dropout(monkeypatch):
    torch.manual_seed(0)
    plain = GPT(small())
    swapped = swap(GPT(small()))
    swapped.load_state_dict(plain.state_dict())
    assert swapped.state_dict().keys() == plain.state_dict().keys()
    assert any(isinstance(m, fast.FastDropout) for m in swapped.modules())
    assert not any(type(m) is nn.Dropout for m in swapped.modules())
    assert all(block.attn.attend is fast.attention for block in swapped.h)
    x = torch.randint(0, 65, (3, 16))
    plain.eval(), swapped.eval()
    torch.testing.assert_close(
        swapped(x, x)[1], plain(x, x)[1], rtol=1e-5, atol=1e-6
    )  # no dropout in eval
    swapped.train()
    losses = []
    for _ in range(2):  # training mode: random, and reproducible from the seed
        torch.manual_seed(5)
        losses.append(float(swapped(x, x)[1].detach()))
    assert losses[0] == losses[1]
    assert float(swapped(x, x)[1].detach()) != losses[0]
    monkeypatch.setenv(fast.ENV, "0")
    assert not any(isinstance(m, fast.FastDropout) for m in swap(GPT(small())).modules())
    monkeypatch.setenv(fast.ENV, "maybe")
    with pytest.raises(MinigptError, match="MINIGPT_FAST_DROPOUT='maybe'"):
        swap(GPT(small()))


def test_swapped_model_with_dropout_trains():
    """A few AdamW steps on one batch with dropout 0.2 lower the loss (masks and gradients line
    up)."""
    torch.manual_seed(0)
    model = swap(GPT(small(n_embd=64)))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.randint(0, 65, (8, 16))
    y = torch.roll(x, -1, 1)
    first = None
    for _ in range(30):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = float(loss.detach()) if first is None else first
    model.eval()
    assert float(model(x, y)[1].detach()) < first - 1.0


def test_dropout_kernel_names_what_runs(monkeypatch):
    cpu, f32 = torch.device("cpu"), torch.float32
    assert fast.dropout_kernel(swap(GPT(small())), cpu, f32) == "minigpt"
    assert fast.dropout_kernel(swap(GPT(small(dropout=0.0))), cpu, f32) == "none"
    assert fast.dropout_kernel(GPT(small()), cpu, f32) == "torch"  # not swapped
    # Compiled: PyTorch's in the graph, the attention's ours (it leaves the graph on a CPU).
    assert fast.dropout_kernel(swap(GPT(small())), cpu, f32, compiled=True) == "minigpt+torch"
    # Autocast: the bfloat16 activations and the float32 embeddings alike take ours.
    assert fast.dropout_kernel(swap(GPT(small())), cpu, torch.bfloat16) == "minigpt"
    monkeypatch.setenv(fast.ENV, "off")
    assert fast.dropout_kernel(swap(GPT(small())), cpu, f32) == "torch"


def test_a_bad_setting_is_refused_before_any_work(monkeypatch):
    """resolve_device, which train, bench, generate and --dry-run call first, checks both kernel
    variables."""
    from minigpt_cli.runtime.device import resolve_device

    monkeypatch.setenv(fast.ENV, "bogus")
    with pytest.raises(MinigptError, match="MINIGPT_FAST_DROPOUT='bogus': use 1 .* or 0"):
        resolve_device("cpu")
    monkeypatch.setenv(fast.ENV, "1")
    assert resolve_device("cpu").type == "cpu"


def test_attention_under_cpu_bfloat16_autocast_runs_in_float32():
    """Under a CPU's bfloat16 autocast the attention of bfloat16 q, k, v is float32 SDPA on their
    values, cast back to bfloat16 (PyTorch's bfloat16 CPU kernel is 5x slower), and its gradients
    reach q, k and v as bfloat16."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 8).bfloat16().requires_grad_() for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fast.attention(q, k, v, is_causal=True)
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert y.dtype == torch.bfloat16 and torch.equal(y, expected.bfloat16())
    y.float().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.bfloat16 for t in (q, k, v))


def test_compiled_attention_with_dropout_runs_eagerly_on_a_cpu():
    """Inside torch.compile on a CPU, attention with dropout leaves the graph (Inductor's backward of
    it under bfloat16 autocast gave NaN gradients): the compiled call draws the same masks from the
    same generator as the eager one, so both give the same output and gradients; without dropout it
    stays in the graph."""
    q, k, v = (torch.randn(2, 2, 16, 8, requires_grad=True) for _ in range(3))

    def attend(q, k, v, p):
        return fast.attention(q, k, v, dropout_p=p, is_causal=True)

    torch.manual_seed(11)
    expected = attend(q, k, v, 0.3)
    expected.sum().backward()
    eager_grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    torch._dynamo.reset()
    compiled = torch.compile(attend, backend="eager")
    torch.manual_seed(11)
    y = compiled(q, k, v, 0.3)
    y.sum().backward()
    assert torch.equal(y, expected)  # SDPA's dropout in the graph would draw other masks
    assert all(torch.equal(t.grad, g) for t, g in zip((q, k, v), eager_grads))
    torch._dynamo.reset()
    within = torch._dynamo.explain(attend)(q, k, v, 0.0)
    assert (within.graph_count, within.graph_break_count) == (1, 0)
    torch._dynamo.reset()
