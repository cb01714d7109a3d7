"""Import hooks (``sys.meta_path`` finders): post-import callbacks, and the old paths of moved modules.

`when_imported` runs a callback once a module is imported, without importing it:
`hf_posext.integration` registers attention functions and wraps ``from_config`` this way, so that
``import hf_posext`` loads neither transformers' ``modeling_utils`` nor its ``masking_utils`` (about half
the time of ``import torch``; tests/test_import_cost.py). `keep_moved_modules` keeps each old path
of `MOVED` importable as the module it moved to, with a ``DeprecationWarning`` naming the new path
and `deprecated_attribute` does the same for each old name of `RENAMED`: one policy for both, and
one removal release, `REMOVED_IN` (docs/import_effects.md).
Imports nothing of the package, so that every module may use it. Internal: not part of the public API.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]

#: ``{module name: callbacks}`` to run once that module is imported (see `when_imported`).
_PENDING: dict[str, list[Callback]] = {}


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` entry that runs `_PENDING` callbacks right after a module executes.

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
    """Drop ``callback`` if `when_imported` still holds it for ``module_name`` (the module not yet imported)."""
    pending = _PENDING.get(module_name, [])
    if callback in pending:
        pending.remove(callback)


#: The release that drops the old paths of `MOVED` and the old names of `RENAMED` and `MOVED_NAMES`.
REMOVED_IN = "0.3.0"

#: Old name -> the name that replaced it (0.2), on the same module.
RENAMED = {
    "PositionMethod": "MethodConfig",
    "make_method": "method_config",
    "EXACT_DYNAMIC_UNSUPPORTED": "WRAPPED_ATTENTION_UNSUPPORTED",  # it gates every attention wrapper
    "KeepFirstRotaryEmbedding": "LongRopeRotaryEmbedding",  # it runs every longrope model's default cache
    "extend_checkpoint": "patch_checkpoint",  # issue 48: `hf-posext patch`'s library side, like patch_model, patch_gguf
}


#: ``old module.name`` -> the module the name moved to (issue 48: the GGUF side of ``hf-posext patch`` sits in
#: publish/ beside patch_checkpoint, above the patching it uses; gguf/ no longer imports patching/).
MOVED_NAMES = {"hf_posext.gguf.writer.patch_gguf": "hf_posext.publish.gguf_patch"}


def deprecated_attribute(module: str, name: str) -> Any:
    """What ``module.name`` resolves to for a deprecated ``name`` (for the module's ``__getattr__``).

    Each old name of `RENAMED` stays importable from every module it was importable from (a module
    ``__getattr__`` calling this), is in no ``__all__``, and on each access warns a ``DeprecationWarning``
    attributed to the caller (so Python shows it once per call site) naming its replacement on the same
    module; a name of `MOVED_NAMES` likewise, naming the module it moved to, where it is looked up.
    The package itself uses only the new names (tests/methods/test_registry.py).

    Raises:
        AttributeError: ``name`` is not a deprecated name, as for any missing attribute.
    """
    moved = MOVED_NAMES.get(f"{module}.{name}")
    if moved is not None:
        message = f"{module}.{name} has moved to {moved}; import it from there (the old name goes in {REMOVED_IN})"
        warnings.warn(message, DeprecationWarning, stacklevel=3)
        return getattr(importlib.import_module(moved), name)
    new = RENAMED.get(name)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    message = f"{module}.{name} is deprecated; use {module}.{new} (the old name goes in {REMOVED_IN})"
    warnings.warn(message, DeprecationWarning, stacklevel=3)
    return getattr(sys.modules[module], new)


#: Old module path -> the module now there (0.2: issue 33 item 2, the package root grouped by feature; issue 48
#: item 4, one name one meaning: a module named for what it holds).
MOVED = {
    "hf_posext.attention.flash_segments": "hf_posext.attention.remap.flash_segments",  # 0.2, issue 48 item 5
    "hf_posext.attention.layout": "hf_posext.attention.remap.layout",
    "hf_posext.attention.remap_install": "hf_posext.attention.remap.install",
    "hf_posext.checkpoint_rope": "hf_posext.patching.shipped_rope",
    "hf_posext.config_checks": "hf_posext.validation.saved_model",
    "hf_posext.eval.checkpoint": "hf_posext.eval.evaluated_model",
    "hf_posext.exact_dynamic": "hf_posext.attention.exact_dynamic",
    "hf_posext.exact_dynamic.attention": "hf_posext.attention.exact_dynamic.attention",
    "hf_posext.exact_dynamic.complex_rowwise": "hf_posext.attention.exact_dynamic.complex_rowwise",
    "hf_posext.exact_dynamic.forward_plan": "hf_posext.attention.exact_dynamic.forward_plan",
    "hf_posext.exact_dynamic.frequencies": "hf_posext.attention.exact_dynamic.frequencies",
    "hf_posext.exact_dynamic.install": "hf_posext.attention.exact_dynamic.install",
    "hf_posext.exact_dynamic.kept": "hf_posext.attention.exact_dynamic.kept",
    "hf_posext.exact_dynamic.rotation": "hf_posext.attention.exact_dynamic.rotation",
    "hf_posext.exact_dynamic.rowwise": "hf_posext.attention.exact_dynamic.rowwise",
    "hf_posext.experiments.reproduce": "hf_posext.experiments.reproduction",
    "hf_posext.export": "hf_posext.publish",
    "hf_posext.export.adapter": "hf_posext.publish.adapter",
    "hf_posext.export.card": "hf_posext.publish.card",
    "hf_posext.export.extend": "hf_posext.publish.config_patch",
    "hf_posext.export.hub": "hf_posext.publish.hub",
    "hf_posext.export.hub_card": "hf_posext.publish.hub_card",
    "hf_posext.export.repository": "hf_posext.publish.repository",
    "hf_posext.export.tokenizer": "hf_posext.publish.tokenizer",
    "hf_posext.gguf_export": "hf_posext.gguf.export",
    "hf_posext.gguf_rope": "hf_posext.gguf.rope",
    "hf_posext.gguf_writer": "hf_posext.gguf.writer",
    "hf_posext.hub": "hf_posext.publish.hub",
    "hf_posext.methods.deprecated": "hf_posext.post_import",  # 0.2, issue 48: the one deprecation policy
    "hf_posext.methods.remap_surgery": "hf_posext.methods.remapping",  # 0.2, issue 48 item 5: one module
    "hf_posext.patching.checkpoint_rope": "hf_posext.patching.shipped_rope",
    "hf_posext.readers.hub_card": "hf_posext.publish.hub_card",
    "hf_posext.readers.tokenizer": "hf_posext.publish.tokenizer",
    "hf_posext.train.checkpointing": "hf_posext.train.saved_state",
    "hf_posext.train.final_checkpoint": "hf_posext.train.final_model",
    "hf_posext.transaction": "hf_posext.patching.transaction",
    "hf_posext.validation.checkpoint": "hf_posext.validation.saved_model",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A ``sys.meta_path`` entry that imports an old path of `MOVED` as the very module it moved to.

    Python asks it only while the old path is not in ``sys.modules``; once imported, the old path is
    an alias there, so a process warns once per old path.
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        # stacklevel 2: the frame with the import statement (warnings skips the import system's own frames).
        message = f"{spec.name} has moved to {new}; import {new} instead (the old path goes in {REMOVED_IN})"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system gave the module the old path's spec: give it its own back.
        module.__spec__ = module.__spec__.loader_state


_MOVED_FINDER = _MovedModuleFinder()


def keep_moved_modules() -> None:
    """Make the old paths of `MOVED` importable (``hf_posext/__init__.py`` calls it; idempotent)."""
    if _MOVED_FINDER not in sys.meta_path:
        # First: an old path always means the new module, even where another finder would find a stale file
        # (an editable install's finder maps hf_posext.* to its own checkout, whatever sys.path says).
        sys.meta_path.insert(0, _MOVED_FINDER)
