"""YAML for configs, sweep files and run files: YAML 1.2's core schema, strict (no duplicate keys,
no aliases), refusing every plain value that YAML 1.1 would read as something else; and a dumper
whose output reads back.

The rule, once for every scalar read (a config, ``--set``, a sweep file, a run's ``config.yaml``): a
plain (unquoted) value that YAML 1.1 and YAML 1.2 read differently is refused, naming the key and
both readings (``train.max_iters: 1:30 reads as 90 in YAML 1.1 and as the text '1:30' in YAML 1.2;
write 90, or quote it``). An explicitly tagged value (``!!int 1:30``, ``!!bool yes``, ``!!str x``,
any ``!tag``) is refused the same way, naming its key: PyYAML would construct it by YAML 1.1's
rules. PyYAML resolves YAML 1.1, where ``1:30`` is 90 (base 60), ``017`` is 15 (octal), ``1_000`` is
1000, ``yes`` is true and ``2024-01-01`` a date; YAML 1.2 (and most other tools) reads the first and
the last two as text and ``017`` as 17. One exception: a float that YAML 1.1 leaves as text
(``3e-4``, ``1e3``: it wants a dot and a signed exponent, ``3.0e-4``) is the float YAML 1.2 reads,
as everyone means it.

The text is read by libyaml (PyYAML's C extension) where PyYAML has it, by PyYAML's own parser
otherwise. The two agree but for tabs: libyaml reads a tab between a key and its value or between a
value and its comment (``seed:<TAB>1337<TAB># c``), as YAML 1.2 allows, where PyYAML's parser
refuses it; a tab at the start of a line (one that indents, or comes before a comment or nothing
else) is refused by both.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

try:
    from yaml.cyaml import CParser, CSafeDumper
except ImportError:  # PyYAML built without libyaml
    CParser = CSafeDumper = None

from ..errors import ConfigError, MinigptError
from ..fileio import YAML_BOUNDS, read_text


def _plain_is_text(text: str) -> bool:
    """Whether ``text`` written plain (unquoted) reads back as that text in YAML 1.1 and YAML 1.2
    both."""
    node = yaml.ScalarNode(_STR, text)
    return (
        _LOADER.resolve(yaml.ScalarNode, text, (True, False)) == _STR and type(_yaml11(node)) is str
    )


class _Dumper(CSafeDumper or yaml.SafeDumper):
    """SafeDumper that writes a string holding a line break as one double-quoted line, and quotes a
    string that :func:`parse_yaml` would not read back as that string (``'08'``, ``'3e-4'``,
    ``'yes'``). On libyaml's emitter where PyYAML has it: the same text, five times sooner."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = '"' if any(c in text for c in "\n\r") else None if _plain_is_text(text) else "'"
    return dumper.represent_scalar(_STR, text, style=style)


_Dumper.add_representer(str, _represent_str)


def dump_yaml(data: Any) -> str:
    """``data`` as YAML in its own key order; strings with line breaks double-quoted ("\\n"), on one
    line."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


class _Refused(yaml.MarkedYAMLError):
    """Valid YAML that a config may not use (a duplicate key, an alias, a value YAML 1.1 reads
    otherwise); ``problem`` holds the whole message."""

    def __init__(self, problem: str, mark):
        super().__init__(problem=problem, problem_mark=mark)


class _Ambiguous(_Refused):
    """A plain value that YAML 1.1 reads otherwise than YAML 1.2; its message names its key."""


_TAG_PREFIX = "tag:yaml.org,2002:"
_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
#: Longest integer literal read (underscores and a sign included), far below Python's limit of 4,300
#: digits.
_MAX_DIGITS = 400


class _Rules:
    """What a config's loader reads: YAML 1.2's core schema (null, true/false, decimal, ``0o`` and
    ``0x`` integers, floats with or without a dot), refusing what a config never needs: a key given
    twice (PyYAML keeps the last), aliases (nested ones, "billion laughs", make a few lines too
    large to validate or print), an integer too long for Python to read (4,300 digits), and a plain
    value YAML 1.1 reads otherwise. Mixed into :class:`_Loader` and :class:`_PyLoader`."""

    #: The config key the whole text is the value of (``--set``); paths inside it extend it.
    key = ""
    #: Whether plain values that YAML 1.1 reads otherwise are refused.
    check = True

    _depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(
                f"alias *{event.anchor}: a config may not use anchors and aliases; write the value out",
                event.start_mark,
            )
        # Refused on the way down, before the nodes of a deep nesting are built (or Python's stack
        # runs out).
        if self._depth >= YAML_BOUNDS.max_depth:
            raise _Refused(
                f"nested too deeply (more than {YAML_BOUNDS.max_depth} levels, the limit); "
                "a config or a sweep file is a few flat sections",
                self.peek_event().start_mark,
            )
        tag = getattr(self.peek_event(), "tag", None)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        # An explicit tag (``!!int 1:30``, ``!foo``, the non-specific ``! 5``, a text) is kept for
        # the check, which refuses it with its key; a quoted scalar has none.
        node.explicit_tag = tag
        return node

    def construct_document(self, node):
        _check_scalars(self, node, self.key, readings=self.check)
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):  # SafeConstructor refuses an unhashable key itself
                continue
            first = seen.get(key)
            if first is not None:
                raise _Refused(
                    f"duplicate key {key!r}, first given on line {first.line + 1}; keep one of them",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        """An integer as YAML 1.2 writes it: decimal with a sign, ``0o`` octal or ``0x``
        hexadecimal."""
        text = node.value
        if len(text) > _MAX_DIGITS:  # int() refuses more than 4,300 digits with a bare ValueError
            raise _Refused(
                f"an integer of {len(text):,} digits: no setting takes a number that large; give a "
                "smaller one (config-keys lists each key's range)",
                node.start_mark,
            )
        base = {"0o": 8, "0x": 16}.get(text[:2], 10)
        return int(text[2:] if base != 10 else text, base)

    def construct_yaml_float(self, node):
        """A float as YAML 1.2 writes it (``3e-4`` and ``.5`` included); ``.inf`` and ``.nan`` as
        YAML spells them."""
        text = node.value.lower()
        if text.lstrip("+-") == ".inf":
            return -math.inf if text[0] == "-" else math.inf
        return math.nan if text == ".nan" else float(text)


class _PyLoader(_Rules, yaml.SafeLoader):
    """The rules on PyYAML's pure-Python scanner and parser: what :func:`parse_yaml` reads a text
    with when libyaml is missing, and what names a syntax error (its messages show the character
    at fault: ``found character '\\t' that cannot start any token``, where libyaml's do not)."""


if CParser is not None:

    class _Loader(_Rules, Composer, CParser, SafeConstructor, Resolver):
        """The rules on libyaml's scanner and parser (PyYAML's C extension, in its wheels): the
        same events as PyYAML's own, about ten times sooner, composed and constructed in Python as
        there."""

        def __init__(self, stream):
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

else:  # a PyYAML built without libyaml
    _Loader = _PyLoader

for _cls in {_Loader, _PyLoader}:
    _cls.add_constructor(_INT, _Rules.construct_yaml_int)
    _cls.add_constructor(_FLOAT, _Rules.construct_yaml_float)
    # YAML 1.2's core schema (yaml.org/spec/1.2.2, 10.3.2), in place of PyYAML's YAML 1.1
    # resolvers: no sexagesimal, leading-zero octal, binary, underscores, yes/no/on/off,
    # timestamps, merge keys or ``=``.
    _cls.yaml_implicit_resolvers = {}
    for _tag, _pattern, _first in (
        (_NULL, r"~|null|Null|NULL|", ["~", "n", "N", ""]),
        (_BOOL, r"true|True|TRUE|false|False|FALSE", list("tTfF")),
        (_INT, r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", list("-+0123456789")),
        (
            _FLOAT,
            r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
            r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
            list("-+0123456789."),
        ),
    ):
        _cls.add_implicit_resolver(_tag, re.compile(f"^(?:{_pattern})$"), _first)
_LOADER = _PyLoader(
    ""
)  # resolves and constructs single scalars for the checks (no state between them)

#: PyYAML's YAML 1.1 reading (its SafeLoader), to find where it differs from YAML 1.2's.
_YAML11 = yaml.SafeLoader("")


def _yaml11(node: yaml.ScalarNode) -> Any:
    """What YAML 1.1 reads a plain scalar as: a value, or the name of a kind of key it builds
    nothing for."""
    tag = _YAML11.resolve(yaml.ScalarNode, node.value, (True, False))
    if tag == _INT and len(node.value) > _MAX_DIGITS:
        return _Syntax("long")  # not built: Python's int() refuses 4,300 digits
    construct = _YAML11.yaml_constructors.get(tag)
    if construct is None:  # ``<<`` (a merge key) and ``=`` (a default value): syntax, no value
        return _Syntax(tag.rsplit(":", 1)[1])
    try:
        return construct(_YAML11, yaml.ScalarNode(tag, node.value))
    except ValueError:  # 2024-13-45 (no such date), 0x_ (no digits): YAML 1.1 cannot read it at all
        return _Syntax("unreadable")


class _Syntax(str):
    """A YAML 1.1 key type (``merge``, ``value``) that a plain scalar stands for."""


def _check_scalars(loader: _Rules, root: yaml.Node, key: str, readings: bool = True) -> None:
    """Refuse the first explicit tag under ``root`` and (``readings``) the first plain scalar that
    YAML 1.1 reads otherwise than YAML 1.2, naming its path from ``key`` (``train.max_iters``,
    ``tokenizer.special_tokens[1]``) and both readings.

    Raises _Refused: which becomes a one-line ConfigError."""
    todo = [(root, key)]  # a list, not recursion: depth is the composer's to bound
    while todo:
        node, path = todo.pop()
        tag = getattr(node, "explicit_tag", None)
        if tag:
            # A tag makes PyYAML construct the value by YAML 1.1's rules (``!!int 1_000`` is 1000,
            # ``!!bool yes`` true) or fail with a traceback (``!!int 1:30``): refused, whatever it
            # is.
            shown = "!!" + tag[len(_TAG_PREFIX) :] if tag.startswith(_TAG_PREFIX) else tag
            raise _Ambiguous(
                f"{path + ': ' if path else ''}the tag {shown} is not read; write the value plainly "
                "(quote it for text)",
                node.start_mark,
            )
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in reversed(node.value):
                name = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                child = f"{path}.{name}" if path else str(name)
                todo += [(value_node, child), (key_node, child)]
        elif isinstance(node, yaml.SequenceNode):
            todo += [(item, f"{path}[{i}]") for i, item in reversed(list(enumerate(node.value)))]
        elif readings and not node.style:  # plain: None from PyYAML's parser, '' from libyaml's
            _check_scalar(loader, node, path)


def _check_scalar(loader: _Rules, node: yaml.ScalarNode, path: str) -> None:
    new = loader.yaml_constructors[node.tag](loader, node)
    old = _yaml11(node)
    if _same(old, new):
        return
    if type(old) is str and isinstance(new, float):
        return  # 3e-4, 1e3, +.5: YAML 1.1 wants a dot and a signed exponent; no one means the text
    spellings = list(dict.fromkeys(s for s in (_spelling(old), _spelling(new)) if s))
    fixes = [f"write {' or '.join(spellings)}"] if spellings else []
    fixes += ["quote it"] if str in (type(old), type(new)) or isinstance(old, _Syntax) else []
    text = node.value if len(node.value) <= 40 else node.value[:40] + "..."
    raise _Ambiguous(
        f"{path + ': ' if path else ''}{text} reads as {_reading(old)} in YAML 1.1 and as "
        f"{_reading(new)} in YAML 1.2; {', or '.join(fixes)}",
        node.start_mark,
    )


def _same(a: Any, b: Any) -> bool:
    """Whether two readings are one value of one type (``1`` is not ``true``; NaN is NaN)."""
    if type(a) is not type(b):
        return False
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


def _reading(value: Any) -> str:
    """A reading in words: ``90``, ``90.5``, ``true``, ``the text '1:30'``, ``the date
    2024-01-01``."""
    if isinstance(value, _Syntax):
        return {
            "merge": "a merge key (<<)",
            "value": "a default-value key (=)",
            "unreadable": "an invalid number or date",
            "long": f"an integer of more than {_MAX_DIGITS} characters",
        }.get(value, value)
    if isinstance(value, str):
        return f"the text {value if len(value) <= 40 else value[:40] + '...'!r}"
    if isinstance(value, (datetime.date, datetime.datetime)):
        return (
            f"the {'time' if isinstance(value, datetime.datetime) else 'date'} {value.isoformat()}"
        )
    return _spelling(value) or repr(value)


def _spelling(value: Any) -> str | None:
    """How to write a number or boolean so that both YAML versions read it alike; None for text or a
    date."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    return None


def parse_yaml(
    text: str, source: str = "<string>", key: str = "", *, text_key: bool = False
) -> Any:
    """Parse YAML text as the module's rule says; ``key``: the config key the whole text is the
    value of (``--set``), which a refusal names; ``text_key``: that key takes text, which the caller
    keeps as typed (no value is refused for what YAML 1.1 would read; a tag still is). Raises
    ConfigError: a syntax
    error or what :class:`_Loader` refuses, in one line."""
    try:
        return _load(_Loader, text, key, text_key)
    except _Refused as exc:
        raise ConfigError(f"{source}{_yaml_problem(exc, key)}") from None
    except (RecursionError, yaml.YAMLError):
        pass  # libyaml's message: read the text again for PyYAML's, which names the character
    try:
        return _load(_PyLoader, text, key, text_key)
    except (RecursionError, yaml.YAMLError) as exc:
        raise ConfigError(f"{source}{_yaml_problem(exc, key)}") from None


def _load(loader_class: type, text: str, key: str, text_key: bool) -> Any:
    loader = loader_class(text)
    loader.key, loader.check = key, not text_key
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_yaml(path: str | Path, what: str, fix: str | None = None) -> Any:
    """The YAML file ``path`` (a config, a sweep file) parsed, within
    :data:`~minigpt_cli.fileio.YAML_BOUNDS`: its size checked before it is read, its depth while it
    is parsed. Raises ConfigError: unreadable, missing, too large, not UTF-8
    (:func:`~minigpt_cli.fileio.read_problem`), not valid YAML, nested too deeply, or what
    :class:`_Loader` refuses."""
    try:
        text = read_text(path, what, YAML_BOUNDS, fix)
    except MinigptError as exc:  # a config's problem, whatever its cause
        raise ConfigError(exc.what, exc.fix, path=exc.path) from None
    return parse_yaml(text, str(path))


def _yaml_problem(exc: Exception, key: str) -> str:
    """``: line L, column C: problem`` for a YAML error (PyYAML's own marked ``invalid YAML``); a
    ``--set`` value (``key``) is one line, named by its key instead."""
    if isinstance(exc, RecursionError):
        return f"{': ' + key if key else ''}: invalid YAML (nested too deeply); a config is a few flat sections"
    mark = getattr(exc, "problem_mark", None)
    where = f": line {mark.line + 1}, column {mark.column + 1}" if mark and not key else ""
    named = (
        "" if isinstance(exc, _Ambiguous) or not key else f": {key}"
    )  # _Ambiguous names its path
    if isinstance(exc, _Refused):
        return f"{where}{named}: {exc.problem}"
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{where}{named}: invalid YAML ({problem}); fix the syntax"
