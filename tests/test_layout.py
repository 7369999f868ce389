"""The package's shape: subpackages in layers (cli -> commands -> components -> base), imports
pointing one way without cycles, the model architecture only, the run folder's names spelled in
run/folder.py, and a training loop that fits on a screen."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "minigpt_cli"

#: Each subpackage's layer (the first part of a module's name): a module imports its own layer or
#: lower ones.
LAYERS = {
    "base": {"errors", "fileio", "paths", "config"},
    "components": {"data", "tokenizer", "model", "accounting", "runtime", "run", "sample", "hf"},
    "commands": {"eval", "trainer", "inspection", "bench", "experiments", "speedrun", "launch"},
    "cli": {"cli", "__main__", ""},  # "" is the package itself (the lazy Python API)
}
RANK = {name: rank for rank, layer in enumerate(LAYERS.values()) for name in layer}
#: What may sit at the package's root besides the subpackages.
ROOT_MODULES = {"", "__main__", "errors", "fileio", "paths"}


def unit(module: str) -> str:
    """The subpackage (or root module) a module belongs to."""
    return module.split(".")[0]


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path) -> set[str]:
    """The package modules ``name`` imports, at the top or inside functions (``from . import x``
    counts x)."""
    package = (
        name.split(".")[:-1] if path.name != "__init__.py" else name.split(".") if name else []
    )
    found = set()
    known = modules()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                found.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            found |= {
                a.name.removeprefix("minigpt_cli.")
                for a in node.names
                if a.name.startswith("minigpt_cli.")
            }
    return found - {name}


def graph() -> dict[str, set[str]]:
    return {name: imports(name, path) for name, path in modules().items()}


def test_every_subpackage_has_a_layer():
    assert {unit(m) for m in modules()} <= set(RANK), {unit(m) for m in modules()} - set(RANK)


def test_only_a_handful_of_modules_sit_at_the_root():
    assert {
        m for m in modules() if "." not in m and (m == "" or not (PACKAGE / m).is_dir())
    } == ROOT_MODULES


def test_imports_point_one_way():
    upward = [
        (a, b) for a, targets in graph().items() for b in targets if RANK[unit(b)] > RANK[unit(a)]
    ]
    assert not upward, upward


def unit_graph() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for a, targets in graph().items():
        out.setdefault(unit(a), set()).update(unit(b) for b in targets if unit(b) != unit(a))
    return out


@pytest.mark.parametrize("level", ["module", "subpackage"])
def test_there_are_no_import_cycles(level):
    g, state, cycles = (graph() if level == "module" else unit_graph()), {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(g[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(g):
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


def test_the_model_imports_only_the_config():
    outside = {
        b
        for a, targets in graph().items()
        if unit(a) == "model"
        for b in targets
        if unit(b) not in {"model", "config"}
    }
    assert not outside, outside


#: The run folder's names (runs.py spells them); where else the same words are other files, the
#: exception says so.
RUN_NAMES = {
    "checkpoints",
    "last",
    "best",
    "meta.json",
    "env.json",
    "model.safetensors",
    "trainer_state.pt",
    "tokenizer.json",
    "config.yaml",
    ".lock",
}
OTHER_FILES = {
    "data.preparation": {"meta.json"},  # the prepared token files' own meta.json
    "hf.load": {"model.safetensors", "tokenizer.json"},  # Hugging Face's folder layout
    "hf.export": {"model.safetensors", "tokenizer.json"},  # the same layout, written
    "hf.finetune": {"tokenizer.json"},  # the pretrained folder's tokenizer
    "tokenizer.kinds": {"tokenizer.json"},  # the library's file format, in messages
}


def string_constants(path: Path) -> set[str]:
    """Every string literal of the code (f-string pieces included), without docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    }


def test_the_run_folder_names_are_spelled_in_runs_only():
    spelled = {}
    for name, path in modules().items():
        if name == "run.folder":
            continue
        hits = string_constants(path) & RUN_NAMES
        hits -= OTHER_FILES.get(name, set())
        if hits:
            spelled[name] = hits
    assert not spelled, spelled


@pytest.mark.parametrize("folder", [PACKAGE, PACKAGE.parent / "tests"])
def test_nothing_cites_a_document_outside_the_repository(folder):
    needles = (
        "DESIGN" + " §",
        "DESIGN" + ".md",
    )  # spelled apart, so that this file does not cite it
    cited = [p.name for p in folder.rglob("*.py") if any(n in p.read_text() for n in needles)]
    assert not cited, cited


def test_the_training_loop_fits_on_a_screen():
    tree = ast.parse((PACKAGE / "trainer" / "loop.py").read_text())
    fit = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "fit")
    loop = next(n for n in ast.walk(fit) if isinstance(n, (ast.While, ast.For)))
    assert loop.end_lineno - loop.lineno + 1 <= 80


def test_lines_past_100_characters_are_rare():
    """ruff formats the code at 100 characters (pyproject.toml) but leaves long strings and
    docstrings alone; a sentence may run past, yet under 2% of the Python lines do (the anchors
    keep 0.4-6%; the code was at 13% before ruff)."""
    root = PACKAGE.parent
    files = [
        *PACKAGE.rglob("*.py"),
        *(root / "tests").rglob("*.py"),
        *(root / "scripts").glob("*.py"),
    ]
    lines = [line for f in files for line in f.read_text(encoding="utf-8").splitlines()]
    long = [line for line in lines if len(line) > 100]
    assert len(lines) > 10_000 and len(long) / len(lines) < 0.02, (len(long), len(lines))


def test_no_module_keeps_a_table_of_messages():
    """A message lives at its check (STYLE.md): no module-level _MESSAGES/RULES table of texts
    keyed by name for raise sites elsewhere to format."""
    tables = [
        f"{path.relative_to(PACKAGE)}: {target.id}"
        for path in PACKAGE.rglob("*.py")
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
        and target.id.strip("_") in ("MESSAGES", "RULES")
        and isinstance(node.value, ast.Dict)
    ]
    assert not tables, tables
