"""The package's shape: imports point one way without cycles, the model is architecture only, the run
folder's names live in runs.py, modules stay short and the training loop fits on a screen."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "minigpt_cli"

#: Each module's layer: a module imports its own layer or lower ones, never a higher one.
LAYERS = {
    "base": {"config", "config_io", "config_docs", "config_errors", "paths", "errors", "fileio", "special_tokens"},
    "components": {"runs", "checkpoint", "runtime", "kernels", "kernels.onednn", "kernels.dropout", "kernels.flags", "model", "data", "tokenizer", "tokenizer_base",
                   "tokenizer_training", "wordpiece", "params", "params_report", "params_memory", "metrics", "hf",
                   "sampling", "parallel", "corpus", "preparation", "splits", "pretrained", "download", "download_files", "trainer.schedule", "trainer.step",
                   "trainer.evaluate", "trainer.signals", "trainer.resume", "trainer.setup", "trainer.describe", "trainer.estimate", "notes",
                   "trainer.preflight", "decoding"},
    "commands": {"trainer", "trainer.loop", "generation", "count", "bench", "bench_prepare", "bench_generation", "train_tokenizer",
                 "evaluation", "hf_export", "sweep", "compare",
                 "inspection", "inspection.figures", "inspection.run_model", "inspection.positions", "inspection.block",
                 "inspection.residual", "inspection.attention", "inspection.activations", "inspection.ffn",
                 "inspection.tokenize", "inspection.tokenize_figures"},
    "cli": {"cli", "cli_base", "cli_hf", "cli_inspect", "cli_sweep", "__main__", ""},  # "" is the package itself (the lazy Python API)
}
RANK = {name: rank for rank, layer in enumerate(LAYERS.values()) for name in layer}


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path) -> set[str]:
    """The package modules ``name`` imports, at the top or inside functions (``from . import x`` counts x)."""
    package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".") if name else []
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
            found |= {a.name.removeprefix("minigpt_cli.") for a in node.names if a.name.startswith("minigpt_cli.")}
    return found - {name}


def graph() -> dict[str, set[str]]:
    return {name: imports(name, path) for name, path in modules().items()}


def test_every_module_has_a_layer():
    assert set(modules()) <= set(RANK), set(modules()) - set(RANK)


def test_imports_point_one_way():
    upward = [(a, b) for a, targets in graph().items() for b in targets if RANK[b] > RANK[a]]
    assert not upward, upward


def test_there_are_no_import_cycles():
    g, state, cycles = graph(), {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(g[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(g):
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


def test_the_model_imports_only_the_config():
    assert imports("model", PACKAGE / "model.py") == {"config"}


#: The run folder's names (runs.py spells them); where else the same words are other files, the exception says so.
RUN_NAMES = {"checkpoints", "last", "best", "meta.json", "env.json", "model.safetensors", "trainer_state.pt",
             "tokenizer.json", "config.yaml", ".lock"}
OTHER_FILES = {
    "preparation.py": {"meta.json"},  # the prepared token files' own meta.json
    "hf.py": {"model.safetensors", "tokenizer.json"},  # Hugging Face's folder layout
    "hf_export.py": {"model.safetensors", "tokenizer.json"},  # the same layout, written
    "pretrained.py": {"tokenizer.json"},  # the pretrained folder's tokenizer
    "tokenizer.py": {"tokenizer.json"},  # the library's file format, in messages
}


def string_constants(path: Path) -> set[str]:
    """Every string literal of the code (f-string pieces included), without docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return {n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings}


def test_the_run_folder_names_are_spelled_in_runs_only():
    spelled = {}
    for name, path in modules().items():
        if name == "runs":
            continue
        hits = string_constants(path) & RUN_NAMES
        hits -= OTHER_FILES.get(path.name, set())
        if hits:
            spelled[name] = hits
    assert not spelled, spelled


@pytest.mark.parametrize("folder", [PACKAGE, PACKAGE.parent / "tests"])
def test_nothing_cites_a_document_outside_the_repository(folder):
    needles = ("DESIGN" + " §", "DESIGN" + ".md")  # spelled apart, so that this file does not cite it
    cited = [p.name for p in folder.rglob("*.py") if any(n in p.read_text() for n in needles)]
    assert not cited, cited


def test_no_module_is_over_500_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > 500}
    assert not long, long


def test_the_training_loop_fits_on_a_screen():
    tree = ast.parse((PACKAGE / "trainer" / "loop.py").read_text())
    fit = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "fit")
    loop = next(n for n in ast.walk(fit) if isinstance(n, (ast.While, ast.For)))
    assert loop.end_lineno - loop.lineno + 1 <= 80
