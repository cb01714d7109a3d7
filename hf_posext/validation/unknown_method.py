"""A checkpoint whose ``hf_posext`` record names a method this process has not registered (a plugin not imported).

Plain transformers loads such a checkpoint when its rope types are transformers' own (a plugin method
writing ``linear`` or ``yarn``), ignoring the record; after ``import hf_posext`` it loads the same,
with a warning naming the method and the import that would redo the rest of what the method does. A rope
type that is not transformers' own needs the method's code: refused, naming the method and what to import.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection
from typing import Any

from .. import integration
from ..method_names import ALIASES, METHODS, available_methods
from ..rope_utils import CONFIG_KEY


def unknown_method(record: Any) -> str | None:
    """The method name a record holds when no method or alias of that name is registered, else ``None``."""
    method = record.get("method") if isinstance(record, dict) else None
    if not isinstance(method, str) or method in METHODS or method in ALIASES:
        return None
    return method


def is_native_rope_type(rope_type: Any) -> bool:
    """Whether transformers builds ``rope_type`` with its own code (``"default"``, ``"linear"``, ``"yarn"``...), not
    with a function hf-posext or another plugin registered in its ``ROPE_INIT_FUNCTIONS``."""
    if rope_type == "default":
        return True
    if not isinstance(rope_type, str) or not integration.is_registered_rope_type(rope_type):
        return False
    return getattr(integration.rope_init_function(rope_type), "__module__", "").split(".")[0] == "transformers"


def rope_types_of(config: Any) -> list[Any]:
    """The ``rope_type`` of each entry of ``config.rope_parameters`` (one per layer type if it has them), once each."""
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict):
        return ["default"]
    nested = config.nested_rope_parameter_keys(params) if hasattr(config, "nested_rope_parameter_keys") else []
    entries = [params[key] for key in nested if params[key] is not None] or [params]
    types = [e.get("rope_type", e.get("type", "default")) if isinstance(e, dict) else e for e in entries]
    return list(dict.fromkeys(types))


def refuse_unknown_method(method: str, rope_types: Collection[Any] | None) -> None:
    """Refuse a record's unregistered ``method`` unless every rope type the config holds is transformers' own.

    Args:
        rope_types: the ``rope_type`` of each entry of the config's ``rope_parameters`` (``None``: not known).

    Raises:
        ValueError: naming the method, the rope type that needs its code, and what to import.
    """
    foreign = [repr(t) for t in rope_types if not is_native_rope_type(t)] if rope_types is not None else ["(unknown)"]
    if foreign:
        raise ValueError(
            f"{CONFIG_KEY}['method'] is {method!r}, a method this process has not registered, and rope_type "
            f"{foreign[0]} is not one of transformers' own, so only that method's code can build it: import the "
            f"plugin that registers {method!r} (hf_posext.register_method) before loading; registered methods: "
            f"{', '.join(available_methods())}"
        )


def refuse_to_build(method: str) -> None:
    """Refuse to build the config of a record's unregistered ``method`` (to undo it, re-patch, or return it).

    Raises:
        ValueError: naming the method and what to import.
    """
    raise ValueError(
        f"{CONFIG_KEY}['method'] {method!r} is not registered in this process (a plugin's method?): import the "
        f"plugin that registers {method!r} (hf_posext.register_method) first; registered methods: "
        f"{', '.join(available_methods())}"
    )


def warn_unknown_method(method: str, rope_types: Collection[Any], source: str) -> None:
    """Warn that ``source`` loads as transformers loads it, without what the unregistered ``method`` adds.

    Issued from this one line (`warnings` shows a repeated warning once), however many checks meet it.
    """
    warnings.warn(
        f"{source}: {CONFIG_KEY}['method'] {method!r} is not registered in this process (a plugin's method?): loaded "
        f"as transformers loads it, with transformers' own rope_type {', '.join(map(repr, rope_types))} as saved and "
        f"without anything else the method does to a model; to load it as it was patched, import the plugin that "
        f"registers {method!r} before loading",
        UserWarning,
        stacklevel=1,
    )


__all__ = [
    "is_native_rope_type",
    "refuse_to_build",
    "refuse_unknown_method",
    "rope_types_of",
    "unknown_method",
    "warn_unknown_method",
]
