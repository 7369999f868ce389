"""The torch pyproject.toml declares is one the code runs on: every module of the package imports,
and the pin's lower bound is at least the first release of every newer torch API the code names."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.version import Version

import minigpt_cli

REPO = Path(__file__).resolve().parent.parent
PACKAGE = Path(minigpt_cli.__file__).resolve().parent

#: The torch APIs the package names that torch 2.1 lacked: (how the source spells it, the object it
#: names, the first torch release that shipped it, from PyTorch's release notes).
NEWER_TORCH = [
    (
        "torch.optim._muon",
        "torch.optim._muon._zeropower_via_newtonschulz",
        "2.9",
    ),  # with torch.optim.Muon
    ("torch.optim.Muon", "torch.optim.Muon", "2.9"),
    ("import fully_shard", "torch.distributed.fsdp.fully_shard", "2.6"),  # FSDP2, public in 2.6
    ("torch.OutOfMemoryError", "torch.OutOfMemoryError", "2.5"),  # the device-generic OOM error
    ("F.rms_norm", "torch.nn.functional.rms_norm", "2.4"),
    ("torch.amp.GradScaler", "torch.amp.GradScaler", "2.3"),  # the device-generic scaler
]


def _source() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py")))


def _torch_requirement() -> Requirement:
    tomllib = pytest.importorskip("tomllib")
    data = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    reqs = [Requirement(r) for r in data["project"]["dependencies"]]
    return next(r for r in reqs if r.name == "torch")


def _lower_bound(req: Requirement) -> Version:
    bounds = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
    assert bounds, f"{req} has no lower bound"
    return max(bounds)


def _resolve(dotted: str):
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def test_every_module_of_the_package_imports():
    """pkgutil.walk_packages over minigpt_cli: a module that fails to import (a torch API this torch
    lacks, a moved module) fails here, naming it. ``__main__`` runs the CLI when imported: left
    out."""
    names = []
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="minigpt_cli.", onerror=pytest.fail):
        if info.name.endswith(".__main__"):
            continue
        importlib.import_module(info.name)
        names.append(info.name)
    assert "minigpt_cli.trainer.muon" in names and len(names) > 50, names


def test_the_torch_pin_covers_every_newer_api_the_code_names():
    """Each newer API of :data:`NEWER_TORCH` the source names needs its release within the pin; each
    row is still named in the source (a stale row fails) and exists in the installed torch."""
    req = _torch_requirement()
    lowest = _lower_bound(req)
    source = _source()
    for spelled, dotted, first in NEWER_TORCH:
        assert spelled in source, f"{spelled!r} is no longer in the package: drop its row"
        assert _resolve(dotted) is not None
        assert Version(first) <= lowest, (
            f"the code uses {dotted} (torch {first}) but pyproject.toml allows {req}"
        )
    installed = Version(torch.__version__.split("+")[0])
    assert req.specifier.contains(installed), (req, installed)
