"""A rule's parameters checked against the types its `Params` dataclass declares.

The registry calls `conform_params` on the values a config, a sweep or a caller gives, before the
rule's own `__post_init__` (which checks ranges and combinations), so a wrong type is one line
naming the parameter, the type expected and the value given, for every rule, built-in or not:

    rule 'clip_cov': parameter 'ratio' (method.params.ratio) expects a number, got 'abc' (a string)

What a declared type accepts (Hydra overrides and YAML give ints, floats, bools, strings, lists):
- `float`: a float, or an integer, which is converted (`W: 1` is `W: 1.0`, the same run id, as for
  the trainer's float keys); the strings "inf", "+inf", "-inf" (what a record writes for an
  infinite float, stare_lab.config.run_config._jsonable) become floats. Any other string is refused, a quoted
  number too ("0.5" in YAML is a string).
- `int`: an integer only; 2.0 is refused (no silent truncation).
- `bool`: true or false only; a bool is not an int here, nor an int a bool (1 for `adaptive` is refused,
  True for `warmup_steps` too).
- `str`: a string only (5 for `normalize` is refused).
- `Literal[...]`: one of its values, of the same type.
- `X | None` / `Optional[X]`: null or an X; other unions: any member, an exact match preferred to a
  conversion (`int | float` keeps 1 an int).
- `tuple[X, ...]` / `list[X]`: a list or tuple whose items are X (the container is kept as given);
  `dict[...]` / `Mapping`: a mapping (items unchecked).
- `Any`, a class of the rule's own: `isinstance` where it is a class, else unchecked.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Union

_INFINITIES = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "infinity": math.inf, "-infinity": -math.inf}
_UNCHECKED = object()  # a field whose annotation could not be resolved


@functools.cache
def field_types(params_cls: type) -> dict[str, Any]:
    """{field name: resolved annotation} of a Params dataclass; a field whose annotation names
    something the rule's module does not define at run time (a TYPE_CHECKING import) is unchecked."""
    try:
        return typing.get_type_hints(params_cls)
    except Exception:  # noqa: BLE001 - resolve field by field, leaving the unresolvable ones unchecked
        pass
    out: dict[str, Any] = {}
    for f in dataclasses.fields(params_cls):
        probe = type("_Probe", (), {"__annotations__": {f.name: f.type}, "__module__": params_cls.__module__})
        try:
            out[f.name] = typing.get_type_hints(probe)[f.name]
        except Exception:  # noqa: BLE001
            out[f.name] = _UNCHECKED
    return out


def conform_params(rule: str, params_cls: type, params: Mapping[str, Any]) -> dict[str, Any]:
    """The given values as the Params fields keep them (module docstring), or a ValueError of one
    line naming the first parameter whose value does not fit its declared type."""
    hints = field_types(params_cls)
    out = {}
    for key, value in params.items():
        hint = hints.get(key, _UNCHECKED)
        if hint is _UNCHECKED:
            out[key] = value
            continue
        fits, converted = conform(value, hint)
        if not fits:
            raise ValueError(
                f"rule {rule!r}: parameter {key!r} (method.params.{key}) expects {describe(hint)}, "
                f"got {given(value)}{_hint(value, hint)}"
            )
        out[key] = converted
    return out


def conform(value: Any, hint: Any) -> tuple[bool, Any]:
    """(whether `value` fits `hint`, the value as the field keeps it): an exact match first, then
    the one conversion allowed (int or an infinity string → float)."""
    fits, _ = _match(value, hint, convert=False)
    return (True, value) if fits else _match(value, hint, convert=True)


def _match(value: Any, hint: Any, convert: bool) -> tuple[bool, Any]:
    if hint is Any or hint is object:
        return True, value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union or origin is types.UnionType:
        if value is None:
            return type(None) in args, None
        for arg in (a for a in args if a is not type(None)):
            fits, out = _match(value, arg, convert=False)
            if fits:
                return True, out
        if convert:
            for arg in (a for a in args if a is not type(None)):
                fits, out = _match(value, arg, convert=True)
                if fits:
                    return True, out
        return False, value
    if hint is type(None) or hint is None:
        return value is None, value
    if value is None:
        return False, value
    if origin is Literal:
        return any(type(value) is type(c) and value == c for c in args), value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        if isinstance(value, float):
            return True, value
        if convert and isinstance(value, int) and not isinstance(value, bool):
            return True, float(value)
        if convert and isinstance(value, str) and value.strip().lower() in _INFINITIES:
            return True, _INFINITIES[value.strip().lower()]
        return False, value
    if hint is str:
        return isinstance(value, str), value
    if origin in (tuple, list) or hint in (tuple, list):
        return _sequence(value, origin or hint, args, convert)
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return isinstance(value, Mapping), value
    if isinstance(hint, type):
        return isinstance(value, hint), value
    return True, value  # a typing construct this module does not read (TypeVar, Callable, ...)


def _sequence(value: Any, kind: type, args: tuple, convert: bool) -> tuple[bool, Any]:
    if not isinstance(value, (list, tuple)):
        return False, value
    if not args:
        return True, value
    if kind is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        items = list(args)
        if len(items) != len(value):
            return False, value
    else:
        items = [args[0]] * len(value)
    out = []
    for item, hint in zip(value, items, strict=True):
        fits, converted = _match(item, hint, convert)
        if not fits:
            return False, value
        out.append(converted)
    return True, type(value)(out)


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_PLURALS = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}


def describe(hint: Any) -> str:
    """The declared type in words: `int | tuple[int, ...] | None` → 'an integer, a list of integers or null'."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union or origin is types.UnionType:
        words = [describe(a) for a in args if a is not type(None)] + (["null"] if type(None) in args else [])
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in args)
    if hint in _NAMES:
        return _NAMES[hint]
    if origin in (tuple, list) or hint in (tuple, list):
        item = args[0] if args else None
        return f"a list of {_PLURALS.get(item, 'values')}" if item is not None else "a list"
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return "a mapping"
    return f"a {getattr(hint, '__name__', str(hint))}"


def given(value: Any) -> str:
    """A value and its YAML kind: `'abc' (a string)`, `True (a boolean)`, `null`."""
    if value is None:
        return "null"
    kinds: list[tuple[Any, str]] = [(bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string")]
    kinds += [((list, tuple), "a list"), (Mapping, "a mapping")]
    kind = next((k for t, k in kinds if isinstance(value, t)), type(value).__name__)
    return f"{value!r} ({kind})"


def _hint(value: Any, hint: Any) -> str:
    """A quoted number where a number is expected: say what to write."""
    words = describe(hint)
    if not isinstance(value, str) or ("number" not in words and "integer" not in words):
        return ""
    try:
        float(value)
    except ValueError:
        return ""
    return "; write the number without quotes"
