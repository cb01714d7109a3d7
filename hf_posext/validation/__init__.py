"""Checks of what users give: typed values (`values`) and what is read from a saved model (`saved_model`).

Each check returns the value normalised or raises ``ValueError`` naming the value and what is allowed.
"""

from .values import (
    BOOLEANS,
    Check,
    anything,
    choice,
    integer,
    mapping,
    number,
    optional,
    parse_bool,
    real_number,
    required,
    whole_number,
)
from .values import FILE_SUFFIXES as FILE_SUFFIXES  # importable from here as before, not in __all__
from .values import MissingExtra as MissingExtra
from .values import path_shape as path_shape
from .values import require as require

__all__ = [
    "BOOLEANS",
    "Check",
    "anything",
    "choice",
    "integer",
    "mapping",
    "number",
    "optional",
    "parse_bool",
    "real_number",
    "required",
    "whole_number",
]
