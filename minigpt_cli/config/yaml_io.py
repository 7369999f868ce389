"""YAML for configs: a strict loader (no duplicate keys, no aliases, ``3e-4`` is a float, booleans only ``true`` and
``false``) and a dumper."""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Any, NoReturn

import yaml

from ..errors import ConfigError


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes a string holding a line break as one double-quoted line."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = '"' if any(c in text for c in "\n\r") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _represent_str)


def dump_yaml(data: Any) -> str:
    """``data`` as YAML in its own key order; strings with line breaks double-quoted ("\\n"), on one line."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


class _Refused(yaml.MarkedYAMLError):
    """Valid YAML that a config may not use (a duplicate key, an alias); ``problem`` holds the whole message."""

    def __init__(self, problem: str, mark):
        super().__init__(problem=problem, problem_mark=mark)


#: What :class:`_Loader` refuses, by kind.
_REFUSALS = {
    "alias": "alias *{anchor}: a config may not use anchors and aliases; write the value out",
    "duplicate": "duplicate key {key!r}, first given on line {line}; keep one of them",
    "digits": (
        "an integer of {digits:,} digits: no setting takes a number that large; give a smaller one "
        "(config-keys lists each key's range)"
    ),
}


def _refuse(kind: str, mark, **fields) -> NoReturn:
    raise _Refused(_REFUSALS[kind].format(**fields), mark)


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads ``3e-4`` as a float (YAML 1.1 wants ``3.0e-4``) and refuses what a config never needs:
    a key given twice (PyYAML keeps the last), aliases (nested ones, "billion laughs", make a few lines too large
    to validate or print) and an integer too long for Python to read (4,300 digits)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            _refuse("alias", event.start_mark, anchor=event.anchor)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True) if key_node.tag != _MERGE else _MERGE
            if key is _MERGE or not isinstance(
                key, Hashable
            ):  # SafeConstructor refuses an unhashable key itself
                continue
            first = seen.get(key)
            if first is not None:
                _refuse("duplicate", key_node.start_mark, key=key, line=first.line + 1)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        # int() refuses a string of more than sys.get_int_max_str_digits() digits with a bare ValueError.
        if len(node.value) > _MAX_DIGITS:
            _refuse("digits", node.start_mark, digits=len(node.value))
        return super().construct_yaml_int(node)


_MERGE = "tag:yaml.org,2002:merge"
#: Longest integer literal read (underscores and a sign included), far below Python's limit of 4,300 digits.
_MAX_DIGITS = 400
_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)

# Booleans as YAML 1.2 spells them: true and false only. YAML 1.1's yes/no/on/off stay text, which a switch
# refuses (``bias: no`` read as false, or a country code ``NO`` as a boolean, surprises more than it helps).
_BOOL = "tag:yaml.org,2002:bool"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL]
    for first, resolvers in _Loader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def parse_yaml(text: str, source: str = "<string>") -> Any:
    """Parse YAML text; a syntax error (or what :class:`_Loader` refuses) becomes a one-line :class:`ConfigError`."""
    try:
        return yaml.load(text, Loader=_Loader)
    except (RecursionError, yaml.YAMLError) as exc:
        raise ConfigError(f"{source}{_yaml_problem(exc)}") from None


def _yaml_problem(exc: Exception) -> str:
    """``: line L, column C: problem`` for a YAML error (PyYAML's own marked ``invalid YAML``)."""
    if isinstance(exc, RecursionError):
        return ": invalid YAML (nested too deeply); a config is a few flat sections"
    mark = getattr(exc, "problem_mark", None)
    where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    if isinstance(exc, _Refused):
        return f":{where}: {exc.problem}"
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f":{where}: invalid YAML ({problem}); fix the syntax"
