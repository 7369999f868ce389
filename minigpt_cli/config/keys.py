"""The config key reference (``minigpt config-keys``, docs/config.md): type, default, meaning."""

from __future__ import annotations

import json
import re
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from .schema import DEVICE_PATTERN, UserPath, _fields, _is_section


def _type_name(ann: Any) -> str:
    """``int``, ``float or null``, ``cosine | linear | ...`` for a field's annotation."""
    origin, args = get_origin(ann), get_args(ann)
    if origin is Literal:
        return " | ".join(str(a) for a in args)
    if origin is Annotated:
        if any(DEVICE_PATTERN in str(getattr(m, "pattern", "")) for m in args[1:]):
            return "auto | cpu | cuda | cuda:N | mps"
        return "path" if ann == UserPath else _type_name(args[0])
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args if a is not type(None)) + " or null"
    if origin is list:
        return f"list of {_type_name(args[0])}"
    return getattr(ann, "__name__", str(ann))


def yaml_value(value: Any) -> str:
    """A value as YAML (a config file, ``--set``) would spell it: null, true, 0.001, a bare word, or
    a quoted string."""
    if isinstance(value, str) and re.fullmatch(r"[\w./<>-]+", value):
        return value
    return json.dumps(value)


def run_value(value: Any) -> str:
    """A run's value in a refusal: a string quoted as Python does (``'layernorm'``), anything else
    as :func:`yaml_value` (``true``, ``null``, ``15.0``)."""
    return repr(value) if isinstance(value, str) else yaml_value(value)


def _range(field: Any) -> str:
    """`` (1 .. 1,024)``, `` (> 0)``: a field's bounds, as the meaning's last words; empty when it
    has none."""
    names = [type(m).__name__.lower() for m in field.metadata]
    bounds = {
        name: getattr(m, name)
        for name, m in zip(names, field.metadata)
        if name in ("ge", "gt", "le", "lt")
    }
    if "ge" in bounds and "le" in bounds:
        return f" ({bounds['ge']:,} .. {bounds['le']:,})"
    ops = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    shown = {k: f"{v:,}" if isinstance(v, int) else f"{v:g}" for k, v in bounds.items()}
    return f" ({', '.join(f'{ops[k]} {v}' for k, v in shown.items())})" if bounds else ""


def key_rows() -> list[tuple[str, str, str, str]]:
    """(key, type or choices, default, meaning and range) for every key, ``section.key`` in a
    section, in schema order."""
    return [
        (
            key,
            _type_name(field.rebuild_annotation()),
            yaml_value(field.get_default(call_default_factory=True)),
            (field.description or "") + _range(field),
        )
        for key, field in _fields()
        if not _is_section(field)
    ]


def describe_keys() -> str:
    """Every config key as a table: key, type or choices, default, one-line meaning with the key's
    range."""
    rows = [("key", "type", "default", "meaning"), *key_rows()]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3] for row in rows
    )


def markdown_reference() -> str:
    """Every config key as a Markdown table, the one docs/config.md holds (tests/test_docs.py checks
    it).

    Choices and defaults are set as code; the meaning's ``<``, ``>``, ``|`` and ``*`` are escaped so
    that Markdown shows them as written.
    """

    def text(s: str) -> str:
        for raw, escaped in (("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("*", "\\*")):
            s = s.replace(raw, escaped)
        return s

    lines = ["| key | type or choices | default | meaning |", "| --- | --- | --- | --- |"]
    for key, kind, default, meaning in key_rows():
        if " | " in kind:  # choices: each one as code
            kind = ", ".join(f"`{choice}`" for choice in kind.split(" | "))
        lines.append(f"| `{key}` | {kind} | `{default}` | {text(meaning)} |")
    return "\n".join(lines)
