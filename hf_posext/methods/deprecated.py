"""Deprecated names, one policy: they keep working, warn naming the new name, and are not exported.

Each old name stays importable from every module it was importable from (a module ``__getattr__``
calling :func:`deprecated_attribute`), is in no ``__all__``, and on each access warns a
``DeprecationWarning`` attributed to the caller (so Python shows it once per call site) naming
its replacement on the same module. The package itself uses only the new names
(tests/methods/test_registry.py). Modules that moved keep their old paths by the same policy, through
an import hook (:data:`hf_posext.post_import.MOVED`).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

#: Old name -> the name that replaced it (0.2), on the same module.
RENAMED = {
    "PositionMethod": "MethodConfig",
    "make_method": "method_config",
    "EXACT_DYNAMIC_UNSUPPORTED": "WRAPPED_ATTENTION_UNSUPPORTED",  # it gates every attention wrapper
    "KeepFirstRotaryEmbedding": "LongRopeRotaryEmbedding",  # it runs every longrope model's default cache
}


def deprecated_attribute(module: str, name: str) -> Any:
    """What ``module.name`` resolves to for a deprecated ``name`` (for the module's ``__getattr__``).

    Raises:
        AttributeError: ``name`` is not a deprecated name, as for any missing attribute.
    """
    new = RENAMED.get(name)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(f"{module}.{name} is deprecated; use {module}.{new}", DeprecationWarning, stacklevel=3)
    return getattr(sys.modules[module], new)
