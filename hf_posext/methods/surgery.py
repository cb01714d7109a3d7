"""The surgery base class: what a method does to a model beyond its rope parameters.

A method's config class says *what* the method is; its [`Surgery`][hf_posext.Surgery] says what it does to a
model (config keys beyond rope parameters, modules added or replaced), how that is redone while a
model is built from a saved patched config, what the loader checks afterwards and what the
architecture check refuses. RoPE-only methods have none (`NO_SURGERY`, every hook a no-op).
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn
from transformers import PreTrainedConfig

from ..attention.guard import install_forward_guard, remove_forward_guard
from .base import MethodConfig

__all__ = ["NO_SURGERY", "Surgery", "install_forward_guard", "remove_forward_guard"]


class Surgery:
    """Model surgery of one method; every hook does nothing by default.

    A family passes an instance (or the class) to [`register_method`][hf_posext.register_method].
    """

    def check(self, method: MethodConfig, config: PreTrainedConfig, model: nn.Module | None) -> None:
        """Refuse, before anything changes, a model the surgery cannot be done on (raise ``ValueError``).

        Args:
            model: ``None`` when a config alone is patched.
        """

    def patch_config(self, method: MethodConfig, config: PreTrainedConfig) -> None:
        """Config changes beyond ``rope_parameters`` (``config.hf_posext`` is already written)."""

    def unpatch_config(self, method: MethodConfig, config: PreTrainedConfig, record: dict[str, Any]) -> None:
        """Undo `patch_config`; ``record`` is the ``config.hf_posext`` being removed."""

    def patch_modules(self, method: MethodConfig, model: nn.Module) -> None:
        """Module surgery after [`patch_model`][hf_posext.patch_model] has rebuilt the rotary modules."""

    def unpatch_modules(self, method: MethodConfig, model: nn.Module) -> None:
        """Undo `patch_modules`."""

    def inherit_modules(self, method: MethodConfig, model: nn.Module, before: dict[str, nn.Module]) -> None:
        """Carry trained state over from the modules a re-patch replaced (``before``: name -> module).

        Called after `patch_modules` when ``model`` was patched before.
        """

    def on_model_init(self, method: MethodConfig, base_model: nn.Module) -> None:
        """Redo `patch_modules` on a base model being built from a patched config.

        Called while the base model (``LlamaModel``...) registers ``embed_tokens`` in its
        ``__init__`` ([`hf_posext.from_pretrained`][hf_posext.from_pretrained]), before the weights are loaded.
        """

    def on_rotary_init(self, method: MethodConfig, base_model: nn.Module, rotary: nn.Module) -> nn.Module | None:
        """The module a base model being built from a patched config registers as its rotary embedding.

        Called when the base model first registers ``rotary_emb`` in its ``__init__``, after its
        attention layers and after transformers has resolved ``config._attn_implementation``.
        ``None`` keeps ``rotary``.
        """
        return None

    def missing(self, method: MethodConfig, model: nn.Module) -> str | None:
        """What of this surgery a loaded ``model`` lacks, in words (``None``: all in place).

        [`hf_posext.from_pretrained`][hf_posext.from_pretrained] raises with it, e.g. when the construction hook
        was off.
        """
        return None


#: The surgery of methods that need none (RoPE-only methods).
NO_SURGERY = Surgery()
