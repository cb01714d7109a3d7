"""The adapter registry: what a method does to a model beyond its rope parameters.

A method's config class (:mod:`hf_posext.methods`) says *what* the method is: its
hyper-parameters and the ``rope_parameters`` a patched config carries. Its adapter says what
the method does to a model: config keys beyond rope parameters, modules added or replaced, and
how that is redone while a model is built from a saved patched config. RoPE-only methods need
no adapter (the base :class:`Adapter` does nothing); a family registers one with
:func:`register_adapter`, and subclasses of its config class share it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn as nn
from transformers import PreTrainedConfig

from ..methods.base import PositionMethod


class Adapter:
    """Module surgery of one method family; every hook does nothing by default."""

    def patch_config(self, method: PositionMethod, config: PreTrainedConfig) -> None:
        """Config changes beyond ``rope_parameters`` (``config.hf_posext`` is already written)."""

    def unpatch_config(self, method: PositionMethod, config: PreTrainedConfig, record: dict[str, Any]) -> None:
        """Undo :meth:`patch_config`; ``record`` is the ``config.hf_posext`` being removed."""

    def patch_modules(self, method: PositionMethod, model: nn.Module) -> None:
        """Module surgery after :func:`~hf_posext.patch_model` has rebuilt the rotary modules."""

    def unpatch_modules(self, method: PositionMethod, model: nn.Module) -> None:
        """Undo :meth:`patch_modules`."""

    def inherit_modules(self, method: PositionMethod, model: nn.Module, before: dict[str, nn.Module]) -> None:
        """Carry trained state over from the modules a re-patch replaced (``before``: name -> module).

        Called after :meth:`patch_modules` when ``model`` was patched before.
        """

    def on_model_init(self, method: PositionMethod, base_model: nn.Module) -> None:
        """Redo :meth:`patch_modules` on a base model being built from a patched config.

        Called while the base model (``LlamaModel``...) registers ``embed_tokens`` in its
        ``__init__`` (:func:`hf_posext.from_pretrained`), before the weights are loaded.
        """

    def on_rotary_init(self, method: PositionMethod, base_model: nn.Module, rotary: nn.Module) -> nn.Module | None:
        """The module a base model being built from a patched config registers as its rotary embedding.

        Called when the base model first registers ``rotary_emb`` in its ``__init__``, after its
        attention layers and after transformers has resolved ``config._attn_implementation``.
        ``None`` keeps ``rotary``.
        """
        return None


_ADAPTERS: dict[type[PositionMethod], Adapter] = {}
_NO_SURGERY = Adapter()


def register_adapter(method_class: type[PositionMethod]) -> Callable[[type[Adapter]], type[Adapter]]:
    """Class decorator: the adapter of ``method_class`` and of its subclasses.

    Raises:
        ValueError: if ``method_class`` already has one.
    """

    def wrap(cls: type[Adapter]) -> type[Adapter]:
        if method_class in _ADAPTERS:
            raise ValueError(f"{method_class.__name__} already has the adapter {type(_ADAPTERS[method_class]).__name__}")
        _ADAPTERS[method_class] = cls()
        return cls

    return wrap


def adapter_for(method: PositionMethod | type[PositionMethod]) -> Adapter:
    """The adapter registered for ``method``'s class or its nearest base class (a no-op one if none)."""
    cls = method if isinstance(method, type) else type(method)
    for base in cls.__mro__:
        if base in _ADAPTERS:
            return _ADAPTERS[base]
    return _NO_SURGERY


def needs_surgery(method: PositionMethod | type[PositionMethod]) -> bool:
    """Whether ``method`` does more to a model than new rope parameters (then saved checkpoints need
    :func:`hf_posext.from_pretrained`)."""
    return adapter_for(method) is not _NO_SURGERY
