"""torchrun: the process group (:class:`Dist`, collectives) and how a run spreads over it,
``train.parallelism``.

- ``ddp``: DistributedDataParallel (Li et al. 2020): every process holds the whole model and its
  AdamW moments; gradients are all-reduced during the backward pass.
- ``fsdp``: FSDP2 ``fully_shard``, ZeRO stage 3's sharding (Rajbhandari et al. 2020, §5): each
  block, then the root, is sharded along dim 0, so a process keeps 1/world of the weights, gradients
  and moments, gathers a block's weights around its forward and backward, and reduce-scatters the
  gradients.

Both make the update one process would make on the global batch (to float32 rounding). Checkpoints
have one layout in every mode: :func:`gather_state` (a collective) gives rank 0 the one-process
safetensors weights and ``torch.optim`` state, and
:func:`load_model_state`/:func:`load_optimizer_state` read it in either mode, so a DDP run resumes
under FSDP and back. oneDNN linear layers stay on under FSDP (its weight gradient is
reduce-scattered like ``F.linear``'s)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import torch

from ..errors import MinigptError


@dataclass
class Dist:
    """Where this process stands in a torchrun job (world 1 without torchrun)."""

    rank: int = 0
    local_rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        """Whether this is rank 0, the one process of the job that writes the run's files."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @classmethod
    def from_env(cls) -> "Dist":
        """This process's place as torchrun's variables give it (RANK, LOCAL_RANK, WORLD_SIZE),
        without joining the group; one process alone without them."""
        env = os.environ
        if "RANK" not in env or "WORLD_SIZE" not in env:
            return cls()
        return cls(int(env["RANK"]), int(env.get("LOCAL_RANK", 0)), int(env["WORLD_SIZE"]))


@dataclass(frozen=True)
class Elastic:
    """What torchrun's elastic agent tells its workers about restarts (``TORCHELASTIC_*``).

    ``torchrun --max-restarts K`` starts the whole group again (at most K times) when a worker
    fails; each group's processes see ``restart`` 0, 1, ... and the ``run_id`` of the job (the
    ``--rdzv-id``; a fresh uuid per ``--standalone`` torchrun), which stays the same across
    restarts: the key a restarted group finds its run folder by."""

    run_id: str
    restart: int  # TORCHELASTIC_RESTART_COUNT: 0 in the first group
    max_restarts: int  # TORCHELASTIC_MAX_RESTARTS: --max-restarts

    @classmethod
    def from_env(cls) -> Optional["Elastic"]:
        """This process's restart facts; None outside torchrun."""
        env = os.environ
        if "TORCHELASTIC_RUN_ID" not in env:
            return None
        return cls(
            env["TORCHELASTIC_RUN_ID"],
            int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
            int(env.get("TORCHELASTIC_MAX_RESTARTS", "0")),
        )

    @property
    def restarts_left(self) -> bool:
        """Whether torchrun would start another group if this one failed."""
        return self.restart < self.max_restarts

    def describe(self) -> str:
        return f"torchrun restart {self.restart} of {self.max_restarts} (run id {self.run_id})"


def shared_store_note() -> Optional[str]:
    """The note for ``--max-restarts`` over several machines while torchrun shares its agent's store
    with the workers (PyTorch's default since 2.5); None otherwise.

    The shared store keeps the keys of the last group, and the per-attempt prefix that
    :func:`init_distributed` puts on them needs the same restart count on every machine, which a
    machine restarted by another's failure does not have (pytorch/pytorch#135712)."""
    env = os.environ
    several = int(env.get("GROUP_WORLD_SIZE", "1")) > 1
    restarts = int(env.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0
    if several and restarts and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return (
            "note: torchrun --max-restarts over several machines: export "
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 on each before torchrun, or a restarted job can "
            "hang at its start (the workers would read the last group's addresses)"
        )
    return None


def _store(info: "Dist", timeout: timedelta):
    """The store the process group starts from: under torchrun's shared agent store, a client of it
    whose keys carry this group's restart count; else None (``init_process_group`` reads
    MASTER_ADDR and MASTER_PORT itself).

    torchrun (2.5 and later) keeps one store for every group it starts; the keys the last group's
    processes left there (their addresses) would be read as the new ones', and a restarted group
    fails to connect or hangs. PyTorch 2.4's ``env://`` prefixed them with the attempt, as here."""
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    import torch.distributed as dist

    agent = dist.TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), info.world, is_master=False, timeout=timeout
    )
    return dist.PrefixStore(f"minigpt/attempt_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", agent)


#: Seconds a collective may wait before the job fails, unless MINIGPT_DIST_TIMEOUT gives another number. It
#: covers the longest wait of a run: the other processes of a node wait in a barrier while its first process
#: prepares the data (a tokenizer trained on a large corpus can take many minutes; ``minigpt prepare`` first
#: makes it seconds). NCCL's own default is 10 minutes.
DIST_TIMEOUT_S = 1800


def dist_timeout() -> timedelta:
    """How long a collective may wait: MINIGPT_DIST_TIMEOUT seconds, else :data:`DIST_TIMEOUT_S`.

    Raises:
        MinigptError: MINIGPT_DIST_TIMEOUT is not a positive number of seconds.
    """
    text = os.environ.get("MINIGPT_DIST_TIMEOUT", "").strip()
    if not text:
        return timedelta(seconds=DIST_TIMEOUT_S)
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise MinigptError(
            f"MINIGPT_DIST_TIMEOUT={text!r}: give the seconds a collective may wait, a number above 0 "
            f"(unset: {DIST_TIMEOUT_S})"
        )
    return timedelta(seconds=seconds)


def init_distributed(device: torch.device) -> tuple[Dist, torch.device]:
    """Join the torchrun process group (NCCL on CUDA, gloo on CPU) if launched by torchrun.

    On CUDA each process takes the GPU of its LOCAL_RANK and names it as the group's ``device_id``
    (NCCL connects eagerly, and a barrier knows its device). Every collective may wait
    :func:`dist_timeout`. A group torchrun restarted (``--max-restarts``) meets in a store of its
    own (:func:`_store`).

    Raises:
        MinigptError: MINIGPT_DIST_TIMEOUT is not a number of seconds.
    """
    info = Dist.from_env()
    if info.world == 1:
        return info, device
    timeout = dist_timeout()
    import torch.distributed as dist

    if dist.is_initialized():
        return info, torch.device("cuda", info.local_rank) if device.type == "cuda" else device
    store = _store(info, timeout)
    where = {} if store is None else {"store": store, "rank": info.rank, "world_size": info.world}
    if device.type == "cuda":
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl", device_id=device, timeout=timeout, **where)
    else:
        dist.init_process_group(backend="gloo", timeout=timeout, **where)
    return info, device


def all_sum(value: torch.Tensor, d: Dist) -> torch.Tensor:
    """The sum of ``value`` over every rank (itself without torchrun)."""
    if d.enabled:
        import torch.distributed as dist

        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def all_max(value: torch.Tensor, d: Dist) -> torch.Tensor:
    """The elementwise maximum of ``value`` over every rank (itself without torchrun)."""
    if d.enabled:
        import torch.distributed as dist

        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value


def all_agree(ok: bool, d: Dist, device: torch.device) -> bool:
    """Whether ``ok`` holds on every rank: one all-reduce of one number (``ok`` itself without
    torchrun)."""
    if not d.enabled:
        return ok
    return not all_max(torch.tensor([float(not ok)], device=device), d).item()


def all_mean(value: torch.Tensor, d: Dist) -> torch.Tensor:
    """The mean of ``value`` over every rank (itself without torchrun)."""
    return all_sum(value, d) / d.world if d.enabled else value


def broadcast(obj: Any, d: Dist) -> Any:
    """Rank 0's ``obj`` on every rank (a picklable value): for set-up only, as it pickles on the
    host and syncs it; in the loop, agree through tensor collectives (:func:`all_max`)."""
    if not d.enabled:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(d: Dist) -> None:
    """Wait until every rank gets here."""
    if d.enabled:
        import torch.distributed as dist

        dist.barrier()


def close_distributed(d: Dist) -> None:
    """Wait for every rank, then leave the process group (a no-op without torchrun)."""
    if d.enabled:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


def shards(parallelism: str, dist: Dist) -> int:
    """Over how many processes the model states are split: the world size under FSDP, else 1."""
    return dist.world if parallelism == "fsdp" and dist.enabled else 1


def single_process_note(parallelism: str, dist: Dist) -> Optional[str]:
    """The note for ``train.parallelism: fsdp`` without torchrun (nothing to shard over); else
    None."""
    if parallelism == "fsdp" and not dist.enabled:
        return (
            "note: train.parallelism: fsdp shards the model over torchrun's processes; this run has one "
            "process, so it trains the whole model as without it (start it with torchrun to shard)"
        )
    return None


def place(
    model: torch.nn.Module, device: torch.device, dist: Dist, parallelism: str
) -> torch.nn.Module:
    """Put a freshly built GPT on ``device``, or :func:`shard` it there under FSDP with more than
    one process; returns ``model``."""
    if shards(parallelism, dist) == 1:
        return model.to(device)
    return shard(model, device, dist.world)


def shard(model: torch.nn.Module, device: torch.device, world: int) -> torch.nn.Module:
    """FSDP2 over the default process group's ``world`` processes: each block of ``model.h``, then
    the model.

    Each ``fully_shard`` moves only its module's shard to ``device``; parameter names stay (as
    DTensors split along dim 0). Build the optimizer after this call. Returns ``model``, sharded in
    place."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    for block in model.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or the model ``torch.compile`` wraps) was sharded by :func:`shard`."""
    if (
        "torch.distributed.fsdp" not in sys.modules
    ):  # nothing was sharded; importing FSDP costs a second or two
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(getattr(model, "_orig_mod", model), FSDPModule)


def reshard(model: torch.nn.Module) -> None:
    """Under FSDP, put every module back on its shards (``FSDPModule.reshard``); else nothing.

    FSDP2 leaves the root's gathered weights on it after a forward without gradients (an eval, a
    sample); until resharded, ``model.parameters()`` names them, not the optimizer's shards
    (clipping would miss the root's gradients), and they hold the memory sharding saves."""
    if not is_sharded(model):
        return
    from torch.distributed.fsdp import FSDPModule

    for module in getattr(model, "_orig_mod", model).modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def wrap(model: torch.nn.Module, device: torch.device, dist: Dist) -> torch.nn.Module:
    """The module the training step calls: DDP around ``model`` under torchrun, unless FSDP already
    shards it."""
    if not dist.enabled or is_sharded(model):
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def _names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """The names of each parameter the optimizer holds, in the optimizer's order; first the one
    ``named_parameters()`` gives (a tied weight has two: ``wte.weight``, then
    ``lm_head.weight``)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def gather_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[torch.nn.Module | dict[str, torch.Tensor], dict[str, Any]]:
    """What a checkpoint saves, in a one-process run's layout: the weights and the optimizer state.

    Unsharded: ``model`` and ``optimizer.state_dict()``. Sharded, a collective: rank 0 gets the full
    weights (name -> CPU tensor, a tied head left out) and the optimizer state keyed by
    ``torch.optim``'s parameter index; the other ranks get two empty dicts."""
    if not is_sharded(model):
        return model, optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    reshard(model)  # the parameters' names must be the shards' (see reshard)
    weights = get_model_state_dict(model, options=_options(cpu_offload=True))
    # Before the first step the optimizer has no state, and get_optimizer_state_dict would make one
    # by stepping with zero gradients and lr 0, which counts a step in AdamW's bias correction: not
    # called then.
    full = (
        get_optimizer_state_dict(model, optimizer, options=_options(cpu_offload=True))
        if optimizer.state
        else None
    )
    if not weights:
        return {}, {}  # not rank 0
    if getattr(getattr(model, "config", None), "tie_weights", False):
        weights.pop(
            "lm_head.weight", None
        )  # stored once, as wte.weight (as checkpoint.model_state does)
    state, index = {}, 0
    for names in _names(model, optimizer):
        found = [full["state"][n] for n in names if n in full["state"]] if full else []
        if found:
            state[index] = found[0]
        index += 1
    groups, index = [], 0
    for group in optimizer.param_groups:  # as torch.optim.Optimizer.state_dict packs them
        groups.append(
            {
                **{k: v for k, v in group.items() if k != "params"},
                "params": list(range(index, index + len(group["params"]))),
            }
        )
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
        state["lm_head.weight"] = state[
            "wte.weight"
        ]  # the same parameter; both names are asked for
    set_model_state_dict(model, state, options=_options(strict=False))


def load_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load a checkpoint's optimizer state (the layout :func:`gather_state` writes) into
    ``optimizer``.

    Unsharded: ``optimizer.load_state_dict``. Sharded: each process keeps its
    shard of every moment (a collective).

    Raises:
        ValueError: the state holds another number of parameters or groups (``torch.optim``'s
        message).
    """
    if not is_sharded(model) or not state["state"]:
        # No moments yet (saved before the first step): only the groups' values, the same on every
        # process. (set_optimizer_state_dict would make moments by a zero step, counted by AdamW's
        # bias correction.)
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    reshard(model)
    names = [n[0] for n in _names(model, optimizer)]
    if len(state["param_groups"]) != len(optimizer.param_groups) or sum(
        len(g["params"]) for g in state["param_groups"]
    ) != len(names):
        raise ValueError(
            "loaded state dict contains a parameter group that doesn't match the size of "
            "optimizer's group"
        )
    by_name = {
        "state": {names[int(i)]: s for i, s in state["state"].items()},
        "param_groups": [
            {**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=_options())
