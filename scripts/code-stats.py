"""How much of a package is error handling: raise and except densities, guard and message lines,
comments.

    python scripts/code-stats.py [PACKAGE_DIR] [--per-module] [--json]

Counted with the ast module, per file, over the package's ``*.py`` files:

- lines: every physical line (``wc -l``); code lines: those that are not blank, not a comment alone
  and not inside a docstring;
- raise, except: ``raise`` statements and ``except`` clauses, per 1,000 lines;
- guard lines: the code lines of a ``raise`` statement, of an ``except ...:`` clause's header, and
  of the test of an ``if`` whose body ends in a ``raise``;
- message lines: the code lines spanned by a string of prose (a literal or f-string, outside
  docstrings, of 20 characters or more with at least three words) that is not already a guard line.
  Documentation is not counted as message prose: docstrings, and the strings given as ``help=``,
  ``description=`` or ``epilog=`` (the ``--help`` texts and the schema's key reference);
- comment lines: lines that hold a ``#`` comment, as a share of code lines plus comment-only lines.

The guard/message share is (guard lines + message lines) / code lines.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import tokenize
from pathlib import Path

#: Keyword arguments whose strings are documentation (Typer's --help texts, pydantic's key
#: descriptions).
_DOC_KEYWORDS = {"help", "description", "epilog", "short_help"}


def _docstring_lines(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
        ):
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                out.update(range(first.lineno, first.end_lineno + 1))
    return out


def _span(node: ast.AST) -> range:
    return range(node.lineno, node.end_lineno + 1)


def _prose(node: ast.AST) -> bool:
    """A string literal or f-string whose literal text reads as a sentence (20+ characters, 3+
    words)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, ast.JoinedStr):
        text = "".join(
            v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
        )
    else:
        return False
    return len(text) >= 20 and len(text.split()) >= 3


def file_stats(path: Path) -> dict[str, int]:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    lines = source.splitlines()
    docstrings = _docstring_lines(tree)
    comment_lines, comment_only = set(), set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comment_lines.add(tok.start[0])
            if not lines[tok.start[0] - 1][: tok.start[1]].strip():
                comment_only.add(tok.start[0])
    code = {
        i
        for i, text in enumerate(lines, 1)
        if text.strip() and i not in docstrings and i not in comment_only
    }
    guard, message = set(), set()
    raises = excepts = 0
    inside_fstring = set()
    documentation = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.keyword) and node.arg in _DOC_KEYWORDS
        for n in ast.walk(node.value)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise):
            raises += 1
            guard.update(_span(node))
        elif isinstance(node, ast.ExceptHandler):
            excepts += 1
            header_end = (
                node.body[0].lineno - 1
                if node.body and node.body[0].lineno > node.lineno
                else node.lineno
            )
            guard.update(range(node.lineno, header_end + 1))
        elif isinstance(node, ast.If) and node.body and isinstance(node.body[-1], ast.Raise):
            guard.update(_span(node.test))
        if isinstance(node, ast.JoinedStr):
            inside_fstring.update(id(v) for v in node.values)
    for node in ast.walk(tree):
        if id(node) not in inside_fstring and id(node) not in documentation and _prose(node):
            message.update(_span(node))
    guard &= code
    message = (message & code) - guard
    return {
        "lines": len(lines),
        "code": len(code),
        "raise": raises,
        "except": excepts,
        "guard": len(guard),
        "message": len(message),
        "comments": len(comment_lines & (code | comment_only)),
        "commentable": len(code | comment_only),
    }


def summary(totals: dict[str, int]) -> dict[str, float]:
    k = totals["lines"] / 1000
    return {
        "lines": totals["lines"],
        "code_lines": totals["code"],
        "raise_per_1000": round(totals["raise"] / k, 1),
        "except_per_1000": round(totals["except"] / k, 1),
        "guard_message_share": round((totals["guard"] + totals["message"]) / totals["code"], 3),
        "comment_share": round(totals["comments"] / totals["commentable"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "package", nargs="?", default=str(Path(__file__).resolve().parent.parent / "minigpt_cli")
    )
    parser.add_argument("--per-module", action="store_true", help="also one row per subpackage")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    root = Path(args.package)
    per_file = {p: file_stats(p) for p in sorted(root.rglob("*.py"))}
    groups: dict[str, dict[str, int]] = {}
    for p, st in per_file.items():
        rel = p.relative_to(root)
        group = rel.parts[0] if len(rel.parts) > 1 else "(root)"
        for name in ("(all)", group):
            acc = groups.setdefault(name, dict.fromkeys(st, 0))
            for key, value in st.items():
                acc[key] += value
    rows = {
        name: summary(t) for name, t in sorted(groups.items()) if args.per_module or name == "(all)"
    }
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(
        f"{'':14} {'lines':>7} {'code':>7} {'raise/k':>8} {'except/k':>8} {'guard+msg':>9} {'comments':>8}"
    )
    for name, r in rows.items():
        print(
            f"{name:14} {r['lines']:>7,} {r['code_lines']:>7,} {r['raise_per_1000']:>8.1f} {r['except_per_1000']:>8.1f}"
            f" {r['guard_message_share']:>9.1%} {r['comment_share']:>8.1%}"
        )


if __name__ == "__main__":
    main()
