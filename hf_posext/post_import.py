"""Post-import hooks: run a callback once a module is imported, without importing it.

:mod:`hf_posext.integration` registers attention functions and wraps ``from_config`` this way, so that
``import hf_posext`` loads neither transformers' ``modeling_utils`` nor its ``masking_utils`` (about half
the time of ``import torch``; tests/test_import_cost.py). Internal: not part of the public API.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]

#: ``{module name: callbacks}`` to run once that module is imported (see :func:`when_imported`).
_PENDING: dict[str, list[Callback]] = {}


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` entry that runs :data:`_PENDING` callbacks right after a module executes.

    It finds the module's spec through the finders after it and wraps that spec's loader; modules
    with no callback pending are not touched (``None``: the next finder finds them as usual).
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _PENDING:
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            if finder is self or find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                execute = spec.loader.exec_module

                def exec_module(module: ModuleType, execute: Callback = execute) -> None:
                    execute(module)
                    for callback in _PENDING.pop(fullname, ()):
                        callback(module)

                spec.loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
            if spec is not None:
                return spec
        return None


_FINDER = _PostImportFinder()


def when_imported(module_name: str, callback: Callback) -> None:
    """Run ``callback(module)`` once ``module_name`` is imported: now if it already is, else right after its import."""
    module = sys.modules.get(module_name)
    if module is not None and module_name not in _PENDING:
        callback(module)
        return
    _PENDING.setdefault(module_name, []).append(callback)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def forget(module_name: str, callback: Callback) -> None:
    """Drop ``callback`` if :func:`when_imported` still holds it for ``module_name`` (the module not yet imported)."""
    pending = _PENDING.get(module_name, [])
    if callback in pending:
        pending.remove(callback)
