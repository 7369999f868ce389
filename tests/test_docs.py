"""The manual's examples, run: every ```bash, ```sh and ```console block of README.md and docs/.

Each page is a test class (pytest-xdist's ``--dist loadscope`` hands a class to one worker) and each
block one test. A page's blocks run in order in one folder of their own, so that a page's
``generate`` finds the run its ``train`` made; a block run alone (``-k``) runs the page's blocks
before it first. The folder holds the corpus in ``data/tinyshakespeare/`` (copied: no download) and
the inputs the examples name: ``notes.txt``, ``books/`` (two .txt files), ``shards/*.jsonl`` and
``scene.txt``, cut from the corpus. In a ``console`` block only the lines after ``$ `` are
commands; the rest is the output shown to the reader.

A block preceded by ``<!-- needs: X -->`` is skipped unless X is there: ``gpu`` (CUDA),
``network``, ``many-machines`` and ``newer`` (never, here), or the name of a Python module that
must import (``llama_cpp``). An unmarked block that fails fails its test, naming page and line.

What the harness changes, so that every example runs in seconds (and nothing else):

- ``minigpt train``: step counts are divided by :data:`SHRINK` (rounded up): ``train.max_iters``,
  ``keep_every``, ``warmup_iters``, ``eval_interval``, ``lr_decay_iters`` given with ``--set``, and
  the step of a ``checkpoints/step-NNNNNNN`` folder; ``train.max_iters`` is 6 when not given; and
  :data:`TINY_TRAIN` is appended (small batches, a 32-token context, 2 eval batches, 8 sampled
  tokens). The model's width and depth are the example's.
- ``minigpt sweep``: ``--budget iters=N`` becomes N / SHRINK (rounded up), or ``iters=4`` when not
  given, and :data:`TINY_TRAIN` is passed with ``--set``.
- ``minigpt generate``: ``--max-new-tokens 8`` is appended; ``minigpt bench``: ``--iters 2`` and
  :data:`TINY_BENCH` (its steps at 4 sequences of 32 tokens, on one layer: the optimizers' rows
  run torch.optim.Muon's bfloat16 products, emulated on a CPU without bfloat16 units);
  ``minigpt evaluate --full``: ``--stride 32`` (whole windows, a quarter of the default's work);
  ``minigpt train-tokenizer --compare`` without ``--input``: ``--input compare.txt``, the corpus's
  first 150,000 characters (each kind still reaches the manual's 2,048 entries; the whole corpus
  took 8 s a run on a Zen 3, twice in the manual).
- Set-up segments of a command (``python3 -m venv``, ``. .venv/bin/activate``, ``pip install``,
  ``git clone``, ``cd minigpt``) are not run: the test runs in the suite's own environment; nor is
  ``python -m pytest`` (the suite inside itself).
- ``http://127.0.0.1:8000/`` (the mirror of docs/offline.md) becomes the local corpus server.

``minigpt`` commands without pipes or redirections run in-process (the real Typer app, as the
``cli`` fixture runs it), and so does ``python -c CODE`` (as ``__main__``, its output captured); any
other command runs in ``bash`` with the suite's ``minigpt`` on PATH.
"""

from __future__ import annotations

import contextlib
import html
import importlib.util
import io
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

#: Step counts in the examples are divided by this (rounded up).
SHRINK = 50
#: Appended to every ``minigpt train`` (and passed to every sweep's runs).
TINY_TRAIN = [
    "train.batch_size=4",
    "train.grad_accum_steps=1",
    "model.block_size=32",
    "train.eval_iters=2",
    "train.sample_tokens=8",
]
#: Appended to every ``minigpt bench``: the batch and context of its timed steps, and one layer.
TINY_BENCH = ["train.batch_size=4", "model.block_size=32", "model.n_layer=1"]
#: Step-count keys that are shrunk where an example gives them.
STEP_KEYS = (
    "train.max_iters",
    "train.keep_every",
    "train.warmup_iters",
    "train.eval_interval",
    "train.lr_decay_iters",
)
NEVER_HERE = {"network", "many-machines", "newer"}
MIRROR = "http://127.0.0.1:8000/"


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    needs: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    """The page's shell blocks, with the ``needs`` of an HTML comment on the line before each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\w+)\s*$", lines[i])
        if not m:
            if lines[i].startswith("```"):  # a fence without a language, or its close
                i = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```")) + 1
                continue
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if m.group(1) in ("bash", "sh", "console"):
            before = lines[i - 1] if i else ""
            marker = re.match(r"^<!--\s*needs:\s*(.+?)\s*-->$", before)
            needs = [n.strip() for n in marker.group(1).split(",")] if marker else []
            found.append(Block(page, i + 1, m.group(1), "\n".join(lines[i + 1 : end]), needs))
        i = end + 1
    return found


def missing(needs: list[str]) -> str | None:
    """What of ``needs`` this machine lacks, or None."""
    for need in needs:
        if need in NEVER_HERE:
            return need
        if need == "gpu":
            import torch

            if not torch.cuda.is_available():
                return "gpu"
        elif need not in NEVER_HERE and importlib.util.find_spec(need) is None:
            return need
    return None


def commands(block: Block) -> list[str]:
    """The block's command lines: continuations joined, comments and output left out."""
    lines, out, pending = block.text.splitlines(), [], ""
    for line in lines:
        if block.lang == "console":
            if not line.startswith("$ ") and not pending:
                continue  # output shown to the reader
            line = line[2:] if line.startswith("$ ") else line
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(line.strip())
    return out


def split_and(command: str) -> list[str]:
    """``a && b`` -> ``[a, b]``, outside quotes."""
    parts, quote, start, i = [], None, 0, 0
    while i < len(command):
        c = command[i]
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif command.startswith("&&", i):
            parts.append(command[start:i].strip())
            start = i = i + 2
            continue
        i += 1
    return [*parts, command[start:].strip()]


def is_setup(argv: list[str]) -> bool:
    """The environment's set-up, or the suite itself: not run here (see the module docstring)."""
    head = argv[0] if argv else ""
    return (
        argv[:3] in (["python3", "-m", "venv"], ["python", "-m", "venv"])
        or head in (".", "source", "pip", "pip3", "cd")
        or argv[:2] == ["git", "clone"]
        or argv[1:3] in (["-m", "pip"], ["-m", "pytest"])
    )


def plain(segment: str) -> bool:
    """Whether a segment is one command without pipes, redirections or substitutions."""
    lexer = shlex.shlex(segment, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return (
        "$(" not in segment
        and "`" not in segment
        and not any(tok and set(tok) <= set("|&;<>()") for tok in lexer)
    )


def shrink(n: str) -> str:
    return str(max(1, math.ceil(int(float(n)) / SHRINK)))


def tiny(argv: list[str]) -> list[str]:
    """The ``minigpt`` argv at tiny sizes (the module docstring lists the changes)."""
    if len(argv) < 2:
        return argv
    cmd, out = argv[1], []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in STEP_KEYS and value.isdigit():
            arg = f"{key}={shrink(value)}"
        arg = re.sub(r"step-(\d{7})", lambda m: f"step-{int(shrink(m.group(1))):07d}", arg)
        if arg.startswith("iters=") and out and out[-1] == "--budget":
            arg = f"iters={shrink(arg[6:])}"
        out.append(arg)
    sets = [f"--set={s}" for s in TINY_TRAIN]
    if cmd == "train":
        if not any(a.startswith("train.max_iters=") for a in out):
            sets.insert(0, "--set=train.max_iters=6")
        out += sets
    elif cmd == "sweep":
        if "--budget" not in out:
            out += ["--budget", "iters=4"]
        out += sets
    elif cmd == "generate":
        out += ["--max-new-tokens", "8"]
    elif cmd == "bench":
        out += ["--iters", "2", *(f"--set={s}" for s in TINY_BENCH)]
    elif cmd == "evaluate" and "--full" in out:
        out += ["--stride", "32"]
    elif (
        cmd == "train-tokenizer"
        and "--compare" in out
        and not any(a.partition("=")[0] == "--input" for a in out)
    ):
        out += ["--input", "compare.txt"]
    return out


class Page:
    """One page's folder and how far its blocks have run."""

    def __init__(self, folder: Path, env: dict[str, str]):
        self.folder, self.env, self.done = folder, env, 0

    def run(self, block: Block) -> None:
        from typer.testing import CliRunner

        from minigpt_cli.cli import app

        for command in commands(block):
            for segment in split_and(command):
                argv = shlex.split(segment, comments=True)
                if not argv or is_setup(argv):
                    continue
                if argv[0] == "export" and len(argv) == 2 and "=" in argv[1]:
                    name, _, value = argv[1].partition("=")
                    self.env[name] = value.replace(MIRROR, self.env["MIRROR"])
                    continue
                old_env, old_cwd = dict(os.environ), os.getcwd()
                os.environ.update(self.env)
                os.chdir(self.folder)
                try:
                    if argv[0] == "minigpt" and plain(segment):
                        res = CliRunner().invoke(app, tiny(argv)[1:], catch_exceptions=False)
                        code, output = res.exit_code, res.stdout + res.stderr
                    elif (
                        argv[0] in ("python", "python3") and argv[1:2] == ["-c"] and plain(segment)
                    ):
                        code, output = python_c(argv[2], argv[3:])
                    else:
                        proc = subprocess.run(
                            ["bash", "-c", segment.replace(MIRROR, self.env["MIRROR"])],
                            capture_output=True,
                            text=True,
                        )
                        code, output = proc.returncode, proc.stdout + proc.stderr
                finally:
                    os.chdir(old_cwd)
                    os.environ.clear()
                    os.environ.update(old_env)
                assert code == 0, f"{block.where}: `{segment}` exited {code}:\n{output[-3000:]}"


def python_c(source: str, args: list[str]) -> tuple[int, str]:
    """``python -c SOURCE ARGS``, run in this process (whose imports a new interpreter would spend
    5 s on: torch and transformers): the exit status and the output, stdout then stderr."""
    out, err, argv = io.StringIO(), io.StringIO(), sys.argv
    sys.argv = ["-c", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            exec(compile(source, "<string>", "exec"), {"__name__": "__main__"})
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (e.code is not None)
    finally:
        sys.argv = argv
    return code, out.getvalue() + err.getvalue()


def make_folder(folder: Path, corpus: Path) -> None:
    """The corpus where ``minigpt download`` puts it, and the inputs the examples name."""
    text = corpus.read_text(encoding="utf-8")
    (folder / "data" / "tinyshakespeare").mkdir(parents=True)
    shutil.copy(corpus, folder / "data" / "tinyshakespeare" / "input.txt")
    (folder / "notes.txt").write_text(text[:60_000], encoding="utf-8")
    (folder / "scene.txt").write_text(text[:400], encoding="utf-8")
    (folder / "compare.txt").write_text(text[:150_000], encoding="utf-8")
    (folder / "books").mkdir()
    for i in range(2):
        (folder / "books" / f"book-{i}.txt").write_text(
            text[i * 50_000 : (i + 1) * 50_000], encoding="utf-8"
        )
    (folder / "shards").mkdir()
    scenes = [s for s in text[:120_000].split("\n\n") if s.strip()]
    for i in range(2):
        rows = [json.dumps({"text": s}) for s in scenes[i::2]]
        (folder / "shards" / f"part-{i}.jsonl").write_text("\n".join(rows) + "\n")


def _page_class(page: Path) -> type:
    blocks = blocks_of(page)
    name = re.sub(r"\W", "_", str(page.relative_to(REPO)).removesuffix(".md"))

    @pytest.fixture(scope="class")
    @classmethod
    def state(cls, tmp_path_factory, corpus_file, corpus_server):
        folder = tmp_path_factory.mktemp(f"docs-{name}")
        make_folder(folder, corpus_file)
        env = {
            "MIRROR": corpus_server.url("/"),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
        }
        return Page(folder, env)

    @pytest.mark.parametrize("index", range(len(blocks)), ids=[f"line{b.line}" for b in blocks])
    def test_block(self, state, index):
        for earlier in blocks[state.done : index]:  # a block run alone: the page's blocks before it
            if missing(earlier.needs) is None:
                state.run(earlier)
        state.done = max(state.done, index + 1)
        block = blocks[index]
        lacking = missing(block.needs)
        if lacking:
            pytest.skip(f"{block.where} needs {lacking}")
        if not any(
            not is_setup(shlex.split(s, comments=True))
            for c in commands(block)
            for s in split_and(c)
            if shlex.split(s, comments=True)
        ):
            pytest.skip(f"{block.where}: set-up only (the suite's environment is already set up)")
        state.run(block)

    return type(f"Test_{name}", (), {"state": state, "test_block": test_block})


for _page in PAGES:
    if blocks_of(_page):
        _cls = _page_class(_page)
        globals()[_cls.__name__] = _cls


# ----------------------------------------------------------------------------- the manual itself


def test_every_page_is_in_the_sites_navigation():
    import yaml

    nav = json.dumps(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    pages = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")}
    assert pages and all(f'"{p}"' in nav for p in pages), pages


def test_the_config_reference_is_the_schemas():
    from minigpt_cli.config.keys import key_rows, markdown_reference

    text = (REPO / "docs" / "config.md").read_text(encoding="utf-8")
    table = markdown_reference()
    assert table in text, "docs/config.md is stale: run python scripts/config-reference.py"
    # Every key once, and what the page shows is config-keys' text.
    for key, _, _, meaning in key_rows():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{key}` |"))
        assert html.unescape(row.replace("\\|", "|").replace("\\*", "*")).endswith(f" {meaning} |")


def test_the_readme_is_the_front_door():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    links = set(re.findall(r"\]\((docs/[^)#]+)", readme))
    assert links and all((REPO / link).is_file() for link in links), links


def test_the_harness_shrinks_what_it_says():
    argv = "minigpt train c.yaml --set train.max_iters=1000 --set train.keep_every=250".split()
    assert tiny(argv)[4:7] == ["train.max_iters=20", "--set", "train.keep_every=5"]
    resume = tiny("minigpt train c.yaml --resume runs/x/checkpoints/step-0000250".split())
    assert "runs/x/checkpoints/step-0000005" in resume and "--set=train.max_iters=6" in resume
    assert tiny("minigpt sweep ffn --budget iters=80".split())[2:5] == [
        "ffn",
        "--budget",
        "iters=2",
    ]
    compare = "minigpt train-tokenizer --compare --vocab-size 2048".split()
    assert tiny(compare)[-2:] == ["--input", "compare.txt"]
    assert tiny([*compare, "--input", "books/"])[-2:] == ["--input", "books/"]
    assert tiny([*compare, "--input=books/"])[-1] == "--input=books/"
    assert split_and("a 'x && y' && b") == ["a 'x && y'", "b"]
    assert is_setup(["pip", "install", "-e", "."]) and not is_setup(["minigpt", "train", "x"])
    assert plain("minigpt train x") and not plain("minigpt config-keys | grep train.")
    assert python_c("import sys; print(sys.argv[1:], __name__); sys.exit(3)", ["a"]) == (
        3,
        "['a'] __main__\n",
    )
