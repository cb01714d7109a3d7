"""The registered method names, and which name an alias means.

The names half of the method registry (`hf_posext.methods.registry` fills these tables, one
``register_method`` or ``register_family`` call per family folder, and maps a name to its config
class), kept below every module that checks a method name: `hf_posext.validation.saved_model`
checks the method a checkpoint's ``hf_posext`` record names, and the method families import that
module, so the check cannot import the ``methods`` package they make up. Imports nothing of the package.
"""

from __future__ import annotations

from typing import Any

#: ``{registered name: config class}``, written by [`register_family`][hf_posext.register_family] only
#: ([`method_class`][hf_posext.method_class] reads it, typed).
METHODS: dict[str, type[Any]] = {}
#: ``{alias: registered name}``, written by [`register_family`][hf_posext.register_family] only.
ALIASES: dict[str, str] = {}


def available_methods() -> list[str]:
    """The registered method names (aliases excluded), sorted."""
    return sorted(METHODS)


def method_aliases() -> dict[str, str]:
    """``{alias: registered name}`` of every alias (e.g. ``"pi": "linear"``)."""
    return dict(sorted(ALIASES.items()))


def registered_name(name: str) -> str:
    """The key ``name`` (a registered name or an alias) is registered under in `METHODS`.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    key = ALIASES.get(name, name) if isinstance(name, str) else name
    if key not in METHODS:
        known = ", ".join(available_methods())
        aliases = ", ".join(f"{a} (= {n})" for a, n in sorted(ALIASES.items()))
        raise ValueError(f"unknown method {name!r}; available methods: {known}; aliases: {aliases}")
    return key


__all__ = ["ALIASES", "METHODS", "available_methods", "method_aliases", "registered_name"]
