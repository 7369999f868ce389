"""Muon with batched Newton-Schulz iterations: ``torch.optim.Muon``'s arithmetic, fewer and larger
products.

``torch.optim.Muon`` orthogonalises its matrices one at a time: at
``configs/shakespeare-cpu.yaml``'s size that is 16 matrices of 4 shapes, three small products per
iteration each, 240 a step. :class:`BatchedMuon` stacks the matrices of one shape and runs the
iteration on the stack (``torch.baddbmm``), as nanochat's ``MuonAdamW`` and modded-nanogpt do, and
takes the middle product of every stack whose Gram matrices have one size in a single call: 45 a
step there. Each matrix sees the same bfloat16 operations as under ``torch.optim.Muon``, so the
updates agree (tests/test_optim.py holds them equal over several steps); a CPU that emulates
bfloat16 products runs them in float32 instead (:func:`newton_schulz_dtype`). BENCHMARKS.md,
"Muon's step", has the cost.

Four of today's variants are switches of a group (``train.muon.*``), each off by default, where the
step is the plain one to the bit: Polar Express's coefficients (:data:`POLAR_EXPRESS`), Gram
Newton-Schulz (:func:`gram_newton_schulz`), NorMuon's per-row normalisation
(:func:`normalize_rows`) and cautious weight decay (:func:`cautious_decay`).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch.optim._muon import (
    _adjust_lr,
)  # torch.optim.Muon's own per-shape scale, so both scale alike

from ..runtime.device import cpu_multiplies_bfloat16

#: Polar Express's polynomials, one (a, b, c) per iteration (Amsel, Persson, Musco & Gower 2025,
#: "The Polar Express: Optimal Matrix Sign Methods and Their Application to the Muon Algorithm",
#: arXiv 2505.16932): each is the odd quintic closest to 1 in the worst case over the interval the
#: singular values lie in after the ones before. These are the paper's method run for 5 iterations
#: with a safety factor of 2e-2 and a cushion of 2, as modded-nanogpt's train_gpt.py and nanochat's
#: optim.py list them.
POLAR_EXPRESS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
#: The safety factor the coefficients were computed for: the input is scaled by 1/(‖X‖_F·(1 + it)),
#: so that rounding cannot put a singular value above 1, where the first polynomials blow up.
POLAR_EXPRESS_SAFETY = 2e-2
#: Iterations past the five tuned ones: (15x - 10x³ + 3x⁵)/8, the quintic that keeps 1 fixed with
#: zero slope, which the paper's sequence tends to once the singular values are near 1.
POLAR_EXPRESS_LIMIT = (1.875, -1.25, 0.375)


def iteration_coefficients(
    kind: str, steps: int, quintic: tuple[float, float, float]
) -> tuple[list[tuple[float, float, float]], float]:
    """The (a, b, c) of each of ``steps`` iterations and the safety factor, for
    ``train.muon.coefficients`` ``kind``: ``quintic`` repeats ``quintic`` (a group's
    ``ns_coefficients``) with no safety factor; ``polar-express`` takes the first ``steps`` of
    :data:`POLAR_EXPRESS`, then :data:`POLAR_EXPRESS_LIMIT`, with :data:`POLAR_EXPRESS_SAFETY`."""
    if kind == "quintic":
        return [tuple(quintic)] * steps, 0.0
    assert kind == "polar-express", kind  # the schema allows no other
    tuned = list(POLAR_EXPRESS[:steps])
    return tuned + [POLAR_EXPRESS_LIMIT] * (steps - len(tuned)), POLAR_EXPRESS_SAFETY


def newton_schulz_dtype(device: torch.device) -> torch.dtype:
    """The dtype of the Newton-Schulz products on ``device``: bfloat16, ``torch.optim.Muon``'s, where
    the device multiplies it natively (CUDA; a CPU with AVX512-BF16 or AMX, as oneDNN reports it),
    else float32. An AVX2 CPU emulates bfloat16 products: on an AMD EPYC of family 25, model 1
    (Zen 3) Muon's update took 431 ms a step at configs/speedrun-nanogpt-cpu.yaml's size in
    bfloat16, 21 ms in float32, AdamW's 1.2 ms (BENCHMARKS.md, "Session 21")."""
    if device.type == "cpu" and not cpu_multiplies_bfloat16():
        return torch.float32
    return torch.bfloat16


def orthogonalize(
    stacks: Sequence[torch.Tensor],
    iterations: Sequence[tuple[float, float, float]],
    eps: float,
    safety: float = 0.0,
    dtype: Optional[torch.dtype] = None,
    method: str = "standard",
) -> list[torch.Tensor]:
    """Odd quintic Newton-Schulz iterations on stacks of matrices, in bfloat16 (``dtype``; None:
    :func:`newton_schulz_dtype` of their device): those of ``torch.optim.Muon`` with one (a, b, c)
    for all iterations, Polar Express's with one each (:func:`iteration_coefficients`).

    ``stacks``: tensors of shape (B_i, m_i, n_i); ``iterations``: the (a, b, c) of each iteration;
    ``safety``: the input is scaled by 1/(‖X‖_F·(1 + safety)). Returns one (B_i, m_i, n_i)
    ``dtype`` tensor each (a view, transposed for a wide stack), every matrix about U·S'·Vᵀ (S' near
    1) where U·S·Vᵀ is its SVD (Jordan et al. 2024, "Muon: an optimizer for hidden layers";
    torch/optim/_muon.py's ``_zeropower_via_newtonschulz``; Amsel et al. 2025, arXiv 2505.16932,
    Algorithm 1). An iteration is X ← aX + (bA + cA²)X with
    A = XXᵀ. ``torch.optim.Muon`` iterates a tall matrix Y transposed; here Y stays as it is and the
    iteration reads Y ← aY + Y(bA + cA²) with A = YᵀY, the same products of the same numbers, since
    A and bA + cA² are symmetric. A wide stack is iterated transposed, tall, in one stack with the
    tall ones of its shape (an MLP's two matrices); the bA + cA² of all stacks whose A has one size
    is one ``torch.baddbmm`` call. ``method="gram"`` iterates the stacks whose rows number more than
    1.5 times their columns on their Gram matrices instead (:func:`gram_newton_schulz`).
    """
    # A wide stack (m < n) iterates transposed: its Y = Xᵀ is tall, YᵀY = XXᵀ and Y(bA + cA²) =
    # ((bA + cA²)X)ᵀ are the same products of the same numbers. Stacks of one shape so oriented (an
    # MLP's c_fc, 4C × C, and its c_proj, C × 4C) are then iterated as one: fewer, larger calls.
    wide = [g.size(-2) < g.size(-1) for g in stacks]
    groups: dict[tuple, list[int]] = {}  # (m, n) once oriented, device -> the stacks
    for i, g in enumerate(stacks):
        m, n = g.shape[-2:]
        groups.setdefault(((n, m) if wide[i] else (m, n), g.device), []).append(i)
    xs, where = [], [None] * len(stacks)  # the groups' iterates; each stack's group and rows
    for (shape, device), members in groups.items():
        dt = dtype or newton_schulz_dtype(device)
        x = torch.empty(sum(stacks[i].size(0) for i in members), *shape, dtype=dt, device=device)
        row = 0
        for i in members:
            g = stacks[i].to(dt)
            norm = g.norm(dim=(-2, -1), keepdim=True)
            if safety:  # (1 + safety) only where asked: the quintic's scaling stays torch's
                norm = norm * (1 + safety)
            rows = slice(row, row + g.size(0))
            torch.div(g.mT if wide[i] else g, norm.clamp(min=eps), out=x[rows])  # spectral norm ≤ 1
            where[i], row = (len(xs), rows), row + g.size(0)
        xs.append(x)
    tall = [x.size(-2) > x.size(-1) for x in xs]
    by_side: dict[int, list[int]] = {}  # the side of A -> the groups with an A of that size
    gram: dict[int, list[int]] = {}  # likewise, the groups iterated on their Gram matrices
    for i, x in enumerate(xs):
        side = min(x.shape[-2:])
        pays = method == "gram" and max(x.shape[-2:]) > GRAM_PAYS * side
        (gram if pays else by_side).setdefault(side, []).append(i)
    for members in gram.values():
        for i, x in zip(members, gram_newton_schulz([xs[i] for i in members], iterations)):
            xs[i] = x
    sides = [
        (
            members,
            [xs[i].size(0) for i in members],  # each side's Gram matrices, one buffer for all steps
            torch.empty(
                sum(xs[i].size(0) for i in members),
                side,
                side,
                dtype=xs[members[0]].dtype,
                device=xs[members[0]].device,
            ),
        )
        for side, members in by_side.items()
    ]
    for a, b, c in iterations:
        for members, sizes, grams in sides:
            for i, gram in zip(members, grams.split(sizes)):
                torch.bmm(xs[i].mT, xs[i], out=gram) if tall[i] else torch.bmm(
                    xs[i], xs[i].mT, out=gram
                )
            polys = torch.baddbmm(grams, grams, grams, beta=b, alpha=c).split(sizes)
            for i, poly in zip(members, polys):
                xs[i] = (
                    torch.baddbmm(xs[i], xs[i], poly, beta=a)
                    if tall[i]
                    else torch.baddbmm(xs[i], poly, xs[i], beta=a)
                )
    out = [xs[group][rows] for group, rows in where]
    return [x.mT if w else x for x, w in zip(out, wide)]


#: Gram Newton-Schulz pays on a matrix whose long side exceeds this many times its short side: with a
#: restart every :data:`GRAM_RESTART` iterations it takes 4 long products and 10 short ones for 4
#: iterations against 8 long and 4 short, counting a long product as long/short short ones.
GRAM_PAYS = 1.5
#: Iterations between restarts of :func:`gram_newton_schulz` from the rectangular matrix: the
#: Dao AI Lab's choice for half precision, where the Gram matrix drifts from the iterate's.
GRAM_RESTART = 2


def gram_newton_schulz(
    xs: Sequence[torch.Tensor], iterations: Sequence[tuple[float, float, float]]
) -> list[torch.Tensor]:
    """The iterations of :func:`orthogonalize` on tall stacks, run on their Gram matrices: the same
    polynomial of the same matrix in exact arithmetic, with fewer FLOPs where a stack is much
    taller than wide (Zhang, Amsel, Chen & Dao 2026, "Gram Newton-Schulz", Dao AI Lab's blog).

    ``xs``: (B_i, m_i, n) tensors of one dtype, m_i > n, spectral norm at most 1. An iteration
    Y ← Y·P, P = aI + bA + cA², A = YᵀY, leaves Y = Y₀·Q with Q the product of the P's, and
    the next A = P·A·P: so A (n × n) is iterated, Q gathered, and Y₀·Q formed once, every
    :data:`GRAM_RESTART` iterations, after which A is taken afresh from Y (a restart: in bfloat16
    the iterated A drifts from YᵀY). The n × n products of all stacks are each one call. Returns
    the stacks' (B_i, m_i, n) iterates.
    """
    sizes = [x.size(0) for x in xs]
    for start in range(0, len(iterations), GRAM_RESTART):
        chunk = iterations[start : start + GRAM_RESTART]
        n = xs[0].size(-1)
        grams = xs[0].new_empty(sum(sizes), n, n)
        for x, gram in zip(xs, grams.split(sizes)):
            torch.bmm(x.mT, x, out=gram)
        q = None
        for j, (a, b, c) in enumerate(chunk):
            p = torch.baddbmm(grams, grams, grams, beta=b, alpha=c)
            p.diagonal(dim1=-2, dim2=-1).add_(a)
            q = p if q is None else torch.bmm(q, p)
            if j < len(chunk) - 1:  # the last A of a chunk is taken afresh from Y
                grams = torch.bmm(torch.bmm(p, grams), p)
        xs = [torch.bmm(x, qi) for x, qi in zip(xs, q.split(sizes))]
    return xs


#: NorMuon's guard against a zero second moment or norm (the authors' reference code's).
NORMUON_EPS = 1e-10


def normalize_rows(
    ortho: torch.Tensor, second: torch.Tensor, beta2: float, eps: float = NORMUON_EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """NorMuon's per-neuron normalisation of orthogonalised updates (Li, Liu, Liang, Chen & Zhao
    2025, "NorMuon: Making Muon more efficient and scalable", arXiv 2510.05491, Algorithm 1).

    ``ortho``: (B, m, n), one orthogonalised update per matrix, whose m rows are its neurons (an
    ``nn.Linear`` weight is (out, in)); ``second``: (B, m, 1) float32, each row's second moment so
    far. Returns the new second moment v ← β₂·v + (1 − β₂)·mean_j O_ij², and the float32 update
    Ô = O / (√v + eps) rescaled to O's Frobenius norm, so that the learning rate and ``adjust_lr``
    mean what they mean for Muon (the authors' reference code, normuon.py; the paper's Algorithm 1
    rescales to AdamW's RMS instead, which ``adjust_lr: match_rms_adamw`` gives here). There is no
    bias correction: a scale common to all rows cancels in the rescaling.
    """
    o = ortho.float()
    v = second.lerp(o.square().mean(dim=-1, keepdim=True), 1 - beta2)
    scaled = o / (v.sqrt() + eps)
    norm, scaled_norm = (t.norm(dim=(-2, -1), keepdim=True) for t in (o, scaled))
    return v, scaled * (norm / (scaled_norm + eps))


def cautious_decay(params: torch.Tensor, update: torch.Tensor, factor: float) -> torch.Tensor:
    """Decoupled weight decay only where the update and the weight agree in sign: ``params`` ×
    ``factor`` where update·params ≥ 0, ``params`` elsewhere (Chen et al. 2025, "Cautious Weight
    Decay", arXiv 2510.12402: x ← x − η·(u + λ·𝟙(u ⊙ x ≥ 0) ⊙ x), u the update that is subtracted;
    here ``factor`` = 1 − ηλ and the update is added after).

    ``params``, ``update``: one shape (any dtypes); returns a new tensor of ``params``' dtype. Where
    the two agree the decay pulls the weight the way the update does, towards zero; where they
    disagree it would undo part of the update, and is left out.
    """
    return torch.where(update * params >= 0, params * factor, params)


class _Stack:
    """The matrices of one shape in one group, with each of their state buffers
    (``momentum_buffer``; NorMuon's ``second_momentum_buffer``) as views of one stacked tensor, so
    that updating a buffer is one operation on the stack rather than one per matrix.
    ``state[p][key]`` holds the views (for the momentum, torch.optim.Muon's state, so checkpoints
    load in either)."""

    def __init__(self, params: list[torch.Tensor]):
        self.params = params
        self.held: dict[str, tuple[torch.Tensor, list[torch.Tensor]]] = {}  # key -> stack, views

    def buffers(
        self, state, key: str = "momentum_buffer", shape: Optional[tuple[int, ...]] = None
    ) -> torch.Tensor:
        """The stacked buffers ``key`` (zeros of ``shape``, each matrix's own by default, before the
        first step); rebuilt from ``state`` when ``load_state_dict`` has put tensors of its own
        there."""
        stack, views = self.held.get(key, (None, []))
        if stack is None or any(state[p].get(key) is not v for p, v in zip(self.params, views)):
            stack = torch.stack(
                [
                    state[p][key]
                    if key in state[p]
                    else torch.zeros_like(p)
                    if shape is None
                    else p.new_zeros(shape)
                    for p in self.params
                ]
            )
            views = list(stack.unbind(0))
            for p, v in zip(self.params, views):
                state[p][key] = v
            self.held[key] = (stack, views)
        return stack


class BatchedMuon(torch.optim.Muon):
    """``torch.optim.Muon`` (same arguments, same ``momentum_buffer`` state, so checkpoints load in
    either) whose step orthogonalises all the matrices of a group in one :func:`orthogonalize`
    call, with three variants as group settings, each off by default:

    - ``coefficients``: ``quintic`` (the group's ``ns_coefficients`` at every iteration) or
      ``polar-express`` (:func:`iteration_coefficients`);
    - ``ns_method``: ``standard`` or ``gram`` (:func:`gram_newton_schulz` where it pays);
    - ``normuon`` with its ``beta2``: :func:`normalize_rows` on each orthogonalised update, its
      (rows, 1) second moment kept as ``state[p]["second_momentum_buffer"]``;
    - ``cautious_weight_decay``: :func:`cautious_decay` in place of the plain decay.
    """

    def __init__(
        self,
        params,
        *args,
        coefficients: str = "quintic",
        ns_method: str = "standard",
        normuon: bool = False,
        beta2: float = 0.95,
        cautious_weight_decay: bool = False,
        **kwargs,
    ):
        super().__init__(params, *args, **kwargs)
        self.variants = {
            "coefficients": coefficients,
            "ns_method": ns_method,
            "normuon": normuon,
            "beta2": beta2,
            "cautious_weight_decay": cautious_weight_decay,
        }
        self.defaults.update(self.variants)
        for group in self.param_groups:
            for key, value in self.variants.items():
                group.setdefault(key, value)
        self._stacks: dict[tuple, list[_Stack]] = {}

    def load_state_dict(self, state_dict: dict) -> None:
        """``torch.optim``'s load, then this optimizer's own variant settings in every group: a
        checkpoint from before the variants has none, and a resume that changes one (its note says
        so) trains with the new value. A NorMuon second moment is dropped when NorMuon is off here,
        so that turning it on again later starts it afresh rather than from a stale one.

        Raises:
            ValueError: another number of parameters or groups (``torch.optim``'s message).
        """
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            group.update(self.variants)
        if not self.variants["normuon"]:
            for s in self.state.values():
                s.pop("second_momentum_buffer", None)

    def _stacks_of(self, gi: int, group: dict) -> list[_Stack]:
        """The group's matrices that have a gradient, stacked by shape (kept from step to step)."""
        live = [p for p in group["params"] if p.grad is not None]
        key = (gi, *map(id, live))
        if key not in self._stacks:
            shapes: dict[tuple, list[torch.Tensor]] = {}
            for p in live:
                shapes.setdefault((p.shape, p.dtype, p.device), []).append(p)
            self._stacks[key] = [_Stack(params) for params in shapes.values()]
        return self._stacks[key]

    @torch.no_grad()
    def step(self, closure=None):
        """One Muon step: Nesterov (or plain) momentum, the orthogonalised update (NorMuon's
        normalisation on it where set), decoupled weight decay (cautious where set).

        With a ``found_inf`` attribute (a 0-dim float32 tensor, torch.amp's protocol, set by
        :func:`~.optim.step_unless`) of 1.0 every momentum buffer, second moment and weight keeps
        its value, chosen on the device by ``torch.where``; each new value is computed out of place
        by the same operations as in place, so a step that is taken is the same to the bit."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = getattr(self, "found_inf", None)
        keep = None if found_inf is None else found_inf.bool()
        for gi, group in enumerate(self.param_groups):
            lr, momentum, decay = group["lr"], group["momentum"], group["weight_decay"]
            stacks = self._stacks_of(gi, group)
            updates = []
            for s in stacks:
                bufs = s.buffers(self.state)
                grads = torch.stack([p.grad for p in s.params])
                # In place when every step is taken (no flag): the copies of the masked path cost
                # ~10% of the optimizer step on a CPU, and the values are the same.
                moved = (
                    bufs.lerp_(grads, 1 - momentum)
                    if keep is None
                    else bufs.lerp(grads, 1 - momentum)
                )
                updates.append(grads.lerp_(moved, momentum) if group["nesterov"] else moved)
                if keep is not None:
                    _assign(bufs, moved, keep)
            iterations, safety = iteration_coefficients(
                group["coefficients"], group["ns_steps"], group["ns_coefficients"]
            )
            orthos = orthogonalize(
                updates, iterations, group["eps"], safety, method=group["ns_method"]
            )
            for s, ortho in zip(stacks, orthos):
                alpha = -_adjust_lr(lr, group["adjust_lr_fn"], s.params[0].shape)
                if group["normuon"]:
                    second = s.buffers(self.state, "second_momentum_buffer", (len(s.params[0]), 1))
                    moved, ortho = normalize_rows(ortho, second, group["beta2"])
                    _assign(second, moved, keep)
                if decay and group["cautious_weight_decay"]:
                    stacked = torch.stack(s.params)
                    new = list(cautious_decay(stacked, ortho, 1 - lr * decay).unbind(0))
                elif keep is None:  # in place, as the momentum above
                    if decay:
                        torch._foreach_mul_(s.params, 1 - lr * decay)
                    # a bfloat16 update into a float32 weight, as Muon adds it (NorMuon's, and on a
                    # CPU without bfloat16 products, float32)
                    torch._foreach_add_(s.params, ortho.unbind(0), alpha=alpha)
                    continue
                else:
                    new = torch._foreach_mul(s.params, 1 - lr * decay) if decay else list(s.params)
                new = torch._foreach_add(new, ortho.unbind(0), alpha=alpha)
                for p, value in zip(s.params, new):
                    _assign(p, value, keep)
        return loss


def _assign(old: torch.Tensor, new: torch.Tensor, keep: Optional[torch.Tensor]) -> None:
    """``old`` ← ``new`` in place, unless ``keep`` (a 0-dim bool tensor) is true: then ``old``
    stays."""
    old.copy_(new if keep is None else torch.where(keep, old, new))
