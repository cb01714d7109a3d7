"""Command-line values shared by every command: ``hf-posext patch``, ``hf-posext eval``, ``scripts/finetune.py``.

A method argument is given the same way everywhere, ``--set KEY=VALUE`` (repeatable)::

    hf-posext patch base out --method yarn --factor 4 --set beta_fast=64 --set mscale_all_dim=1
    python scripts/finetune.py --config run.yaml --set beta_fast=64

KEY may use ``-`` or ``_``; VALUE is read as JSON when it parses (``64``, ``0.1``, ``true``,
``[1, 2]``) and kept as a string otherwise (``mode=tail``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from typing import Any


class KeyValueError(ValueError, argparse.ArgumentTypeError):
    """A malformed ``KEY=VALUE``; an ``ArgumentTypeError`` so that argparse prints its message."""


def parse_key_value(text: str) -> tuple[str, Any]:
    """``"beta-fast=64"`` -> ``("beta_fast", 64)``.

    Raises:
        KeyValueError: no ``=`` or an empty key.
    """
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise KeyValueError(f"--set expects KEY=VALUE (e.g. beta_fast=32), got {text!r}")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = value
    return key.strip().replace("-", "_"), parsed


def parse_key_values(items: Iterable[str | tuple[str, Any]] | None) -> dict[str, Any]:
    """A mapping from ``KEY=VALUE`` strings (or pairs already parsed); later keys win."""
    pairs = (item if isinstance(item, tuple) else parse_key_value(item) for item in items or ())
    return dict(pairs)


def add_set_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *aliases: str,
                     dest: str = "set", help: str = "a method argument, e.g. beta_fast=32 (repeatable)") -> None:
    """Add ``--set KEY=VALUE`` (repeatable; parsed to pairs, see :func:`parse_key_values`)."""
    parser.add_argument("--set", *aliases, dest=dest, action="append", type=parse_key_value, metavar="KEY=VALUE",
                        help=help)
