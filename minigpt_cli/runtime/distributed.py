"""How a run spreads over torchrun's processes: ``train.parallelism`` ``ddp`` or ``fsdp``.

- ``ddp``: DistributedDataParallel (Li et al. 2020, "PyTorch Distributed").
  Every process holds the whole model and its AdamW moments; gradients are
  all-reduced (averaged) during the backward pass.
- ``fsdp``: FSDP2, ``torch.distributed.fsdp.fully_shard``, the sharding of
  ZeRO stage 3 (Rajbhandari et al. 2020, §5). Each Transformer block, then
  the root module (embeddings, final norm, head), is sharded along dim 0
  over the processes: a process keeps 1/world of the weights, gradients and
  AdamW moments (16 bytes a float32 parameter with AdamW, ZeRO §3.1, become
  16/world), gathers a block's full weights just before its forward and its
  backward, frees them after, and reduce-scatters (averages) the gradients.

Both make the update one process would make on the global batch (to float32
rounding). With one process (no torchrun) neither changes anything.

Checkpoints have one layout whatever the mode. Under FSDP every process joins
:func:`gather_state` (a collective): full tensors, moved to the CPU of rank 0,
which writes the same safetensors weights and the same ``torch.optim``
optimizer state (parameters numbered in the optimizer's order) as a
one-process run. :func:`load_model_state` and :func:`load_optimizer_state`
take that layout in either mode, so a DDP run resumes under FSDP and back,
and ``generate`` reads either.

oneDNN linear layers (:func:`~minigpt_cli.runtime.kernels.onednn.swap_linears`)
stay on under FSDP: FSDP2 puts the gathered weights on each module as
ordinary tensors for its forward and backward, and the oneDNN autograd
function's weight gradient is reduce-scattered like ``F.linear``'s.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import torch

from .device import Dist


def shards(parallelism: str, dist: Dist) -> int:
    """Over how many processes the model states are split: the world size under FSDP, else 1."""
    return dist.world if parallelism == "fsdp" and dist.enabled else 1


def single_process_note(parallelism: str, dist: Dist) -> Optional[str]:
    """The note for ``train.parallelism: fsdp`` without torchrun (nothing to shard over); else None."""
    if parallelism == "fsdp" and not dist.enabled:
        return ("note: train.parallelism: fsdp shards the model over torchrun's processes; this run has one "
                "process, so it trains the whole model as without it (start it with torchrun to shard)")
    return None


def place(model: torch.nn.Module, device: torch.device, dist: Dist, parallelism: str) -> torch.nn.Module:
    """Put a freshly built GPT on ``device``; under FSDP with more than one process, :func:`shard` it there.

    Returns:
        ``model``, moved or sharded in place.
    """
    if shards(parallelism, dist) == 1:
        return model.to(device)
    return shard(model, device, dist.world)


def shard(model: torch.nn.Module, device: torch.device, world: int) -> torch.nn.Module:
    """FSDP2 over the default process group's ``world`` processes: each block of ``model.h``, then the model.

    Each ``fully_shard`` call moves only its own module's shard to
    ``device``, so the whole model is never on the device at once. The model
    keeps its class and parameter names (they become DTensors, split along
    dim 0); build the optimizer after this call.

    Returns:
        ``model``, sharded in place.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    for block in model.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or the model ``torch.compile`` wraps) was sharded by :func:`shard`."""
    if "torch.distributed.fsdp" not in sys.modules:  # nothing was sharded; importing FSDP costs a second or two
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(getattr(model, "_orig_mod", model), FSDPModule)


def reshard(model: torch.nn.Module) -> None:
    """Under FSDP, put every module back on its shards (``FSDPModule.reshard``); else nothing.

    A forward without gradients (an eval, a sample) leaves the root module's
    gathered weights on it: FSDP2 keeps the root unsharded after a forward,
    since a backward usually follows. Until they are resharded,
    ``model.parameters()`` names those gathered tensors, not the shards the
    optimizer holds (gradient clipping over them would miss the root's
    gradients), and they take the memory sharding saves.
    """
    if not is_sharded(model):
        return
    from torch.distributed.fsdp import FSDPModule

    for module in getattr(model, "_orig_mod", model).modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def wrap(model: torch.nn.Module, device: torch.device, dist: Dist) -> torch.nn.Module:
    """The module the training step calls: DDP around ``model`` under torchrun, unless FSDP already shards it."""
    if not dist.enabled or is_sharded(model):
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def _names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """The names of each parameter the optimizer holds, in the optimizer's order; first the one
    ``named_parameters()`` gives (a tied weight has two: ``wte.weight``, then ``lm_head.weight``)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def gather_state(model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer) -> tuple[torch.nn.Module | dict[str, torch.Tensor], dict[str, Any]]:
    """What a checkpoint saves: the weights and the optimizer state, in a one-process run's layout.

    Unsharded: ``model`` itself and ``optimizer.state_dict()``. Sharded: a
    collective, every process must call it; rank 0 gets the full weights
    (name -> CPU tensor, as ``state_dict()`` of the unsharded model, a tied
    head left out) and the full optimizer state keyed by parameter index as
    ``torch.optim`` numbers them; the other ranks get two empty dicts.
    """
    if not is_sharded(model):
        return model, optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    reshard(model)  # the parameters' names must be the shards' (see reshard)
    weights = get_model_state_dict(model, options=_options(cpu_offload=True))
    # Before the first step the optimizer has no state, and get_optimizer_state_dict would make one by
    # stepping with zero gradients and lr 0, which counts a step in AdamW's bias correction: not called then.
    full = get_optimizer_state_dict(model, optimizer, options=_options(cpu_offload=True)) if optimizer.state else None
    if not weights:
        return {}, {}  # not rank 0
    if getattr(getattr(model, "config", None), "tie_weights", False):
        weights.pop("lm_head.weight", None)  # stored once, as wte.weight (as checkpoint.model_state does)
    state, index = {}, 0
    for names in _names(model, optimizer):
        found = [full["state"][n] for n in names if n in full["state"]] if full else []
        if found:
            state[index] = found[0]
        index += 1
    groups, index = [], 0
    for group in optimizer.param_groups:  # as torch.optim.Optimizer.state_dict packs them
        groups.append({**{k: v for k, v in group.items() if k != "params"},
                       "params": list(range(index, index + len(group["params"])))})
        index += len(group["params"])
    return weights, {"state": state, "param_groups": groups}


def load_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load full weights (a checkpoint's, a tied head stored once) into ``model``, sharded or not.

    Every process passes the same full tensors; under FSDP each keeps its shard.

    Raises:
        RuntimeError: a tensor of another shape (the caller words it).
    """
    if not is_sharded(model):
        model.load_state_dict(state, strict=False)
        return
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    state = dict(state)
    if getattr(getattr(model, "config", None), "tie_weights", False) and "wte.weight" in state:
        state["lm_head.weight"] = state["wte.weight"]  # the same parameter; both names are asked for
    set_model_state_dict(model, state, options=_options(strict=False))


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a checkpoint's optimizer state (the layout :func:`gather_state` writes) into ``optimizer``.

    Unsharded: ``optimizer.load_state_dict``. Sharded: each process keeps its
    shard of every moment (a collective).

    Raises:
        ValueError: the state holds another number of parameters or groups (``torch.optim``'s message).
    """
    if not is_sharded(model) or not state["state"]:
        # No moments yet (saved before the first step): only the groups' values, the same on every process.
        # (set_optimizer_state_dict would make moments by a zero step, counted by AdamW's bias correction.)
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    reshard(model)
    names = [n[0] for n in _names(model, optimizer)]
    if len(state["param_groups"]) != len(optimizer.param_groups) or \
            sum(len(g["params"]) for g in state["param_groups"]) != len(names):
        raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                         "optimizer's group")
    by_name = {"state": {names[int(i)]: s for i, s in state["state"].items()},
               "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, by_name, options=_options())
