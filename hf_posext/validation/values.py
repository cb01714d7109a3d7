"""Checks of user-given values, shared by the method configs, the fine-tune settings and the commands.

Each check returns the value normalised (a float, an int, a bool) or raises ``ValueError`` naming
the value and what is allowed. Booleans are never numbers; numpy scalars are. The ``Check``
builders (`integer`, `number`, `choice`...) make a declarative table of them.
Also `require` (an optional dependency, or `MissingExtra` naming its extra) and
`path_shape` (whether a source can only be a path).
"""

from __future__ import annotations

import importlib
import math
import numbers
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: ``check(name, value) -> normalised value``; raises ``ValueError`` naming ``name``.
Check = Callable[[str, Any], Any]

#: The spellings of a boolean, any case; nothing else is one.
BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


class MissingExtra(ImportError):
    """An optional dependency the input needs is not installed; the message names the extra to install.

    The commands report it in one line, like bad input (the user fixes it, not the code).
    """


def require(module: str, extra: str, why: str) -> Any:
    """``import module``, or `MissingExtra`.

    Its message: ``"<why> needs the <module> package: pip install 'hf-posext[<extra>]'"``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingExtra(f"{why} needs the {module!r} package: pip install 'hf-posext[{extra}]'") from err


#: Suffixes only a file has (a Hub id never ends with one).
FILE_SUFFIXES = (".gguf", ".safetensors", ".json", ".bin", ".pt", ".pth", ".yaml", ".yml", ".txt", ".jsonl")


def path_shape(source: str) -> str | None:
    """Why ``source`` can only be a local path, not a Hub id (``org/name`` or ``name``); None if it may be one.

    A path: it starts with ``.``, ``/`` or ``~``, holds a backslash or more than one ``/``, ends
    with a file suffix (``.gguf``, ``.safetensors``...), or is ``A/B`` where the folder ``A`` exists
    here (``out/typo`` beside an ``out/`` folder). Only ``org/name`` and ``name`` may be Hub ids.
    """
    if source.startswith((".", "/", "~")):
        return f"it starts with {source[0]!r}"
    if "\\" in source or source.count("/") > 1:
        return "a Hub id is org/name"
    if source.lower().endswith(FILE_SUFFIXES):
        return f"it ends with {source[source.rfind('.') :]!r}"
    if "/" in source and Path(source.split("/")[0]).is_dir():
        return f"the folder {source.split('/')[0]!r} exists here"
    return None


def _label(owner: str, name: str) -> str:
    return f"{owner}: {name}" if owner else name


def real_number(owner: str, name: str, value: Any, allowed: str) -> float:
    """``value`` as a float if it is a finite real number (numpy scalars included, booleans not).

    Args:
        owner: what the value belongs to (a method's name), prefixed to the message; ``""``: nothing.
        name: the value's name.
        value: the value to check.
        allowed: what is allowed, e.g. ``"> 0"``, for the message.

    Raises:
        ValueError: naming ``owner``, ``name``, ``value`` and what is ``allowed``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{_label(owner, name)} must be a finite number {allowed}, got {value!r}")
    return float(value)


def whole_number(owner: str, name: str, value: Any, minimum: int, allowed: str) -> int:
    """``value`` as an int if it is an integer >= ``minimum`` (numpy integers included, booleans not).

    Raises:
        ValueError: naming ``owner``, ``name``, ``value`` and what is ``allowed``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{_label(owner, name)} must be {allowed}, got {value!r}")
    return int(value)


def parse_bool(value: Any, name: str = "value") -> bool:
    """``value`` as a boolean: ``True``/``False``, 1/0, or true/false/yes/no/1/0 in any case.

    Raises:
        ValueError: anything else (``"t"``, ``2``, ``"off"``...), naming ``name`` and the spellings.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in BOOLEANS:
        return BOOLEANS[value.strip().lower()]
    raise ValueError(f"{name} must be true or false (or yes/no/1/0, any case), got {value!r}")


def integer(minimum: int) -> Check:
    """A check: an integer >= ``minimum``."""
    return lambda name, value: whole_number("", name, value, minimum, f"an integer >= {minimum}")


def number(
    low: float | None = None, high: float | None = None, *, low_open: bool = False, high_open: bool = False
) -> Check:
    """A check: a finite real number in the interval from ``low`` to ``high`` (``None``: unbounded).

    ``low_open``/``high_open`` exclude the bound; the message names the interval, e.g.
    ``"must be in [0, 1)"``, ``"must be a number >= 0"``, ``"must be a positive number"``.
    """
    if low is not None and high is not None:
        allowed = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low == 0 and low_open:
        allowed = "a positive number"
    elif low is not None:
        allowed = f"a number {'>' if low_open else '>='} {low:g}"
    elif high is not None:
        allowed = f"a number {'<' if high_open else '<='} {high:g}"
    else:
        allowed = "a finite number"

    def check(name: str, value: Any) -> Any:
        fine = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
        if fine and low is not None:
            fine = value > low if low_open else value >= low
        if fine and high is not None:
            fine = value < high if high_open else value <= high
        if not fine:
            raise ValueError(f"{name} must be {allowed}, got {value!r}")
        return value

    return check


def choice(allowed: Sequence[str]) -> Check:
    """A check: one of ``allowed``."""

    def check(name: str, value: Any) -> Any:
        if value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
        return value

    return check


def required(what: str) -> Check:
    """A check: a non-empty value; ``what`` says what it is and how to give it, for the message."""

    def check(name: str, value: Any) -> Any:
        if not value:
            raise ValueError(f"{name} is required: {what}")
        return value

    return check


def optional(inner: Check) -> Check:
    """A check: ``None``, or a value ``inner`` accepts."""
    return lambda name, value: None if value is None else inner(name, value)


def mapping(what: str = "a mapping") -> Check:
    """A check: a ``dict``; ``what`` names its contents for the message."""

    def check(name: str, value: Any) -> dict:
        if not isinstance(value, dict):
            raise ValueError(f"{name} must be {what}, got {value!r}")
        return value

    return check


def anything(name: str, value: Any) -> Any:
    """A check that accepts every value (a setting whose type is its only rule)."""
    return value
