"""ALiBi's surgery: the attention implementation, in the config and while a checkpoint is loaded.

ALiBi's position signal is its attention function: a model whose attention implementation is
changed behind the patch (``model.set_attn_implementation("sdpa")``) would run with no position
information at all, so a guard on the base model refuses that forward (as exact dynamic scaling does).
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn
from transformers import PreTrainedConfig

from ... import integration
from ...attention.guard import check_attention_kept, install_forward_guard, remove_forward_guard
from ..surgery import Surgery
from .attention import ALIBI_ATTENTION, NATIVE_TO_BACKEND, OLD_ALIBI_ATTENTION
from .config import AlibiConfig


#: The attribute of the base model holding the handle of its attention guard.
_GUARD_HANDLE = "_hf_posext_alibi_guard"


def _refuse_changed_attention(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
    """Forward pre-hook of an ALiBi base model: its attention implementation must still be ALiBi's."""
    backend = NATIVE_TO_BACKEND.get(integration.attention_implementation(module.config), "sdpa")
    check_attention_kept(
        module.config,
        _is_alibi,
        what="ALiBi",
        needs=f"{ALIBI_ATTENTION!r}; without it the model has no position information",
        advice=f"to run ALiBi on that kernel call hf_posext.patch_model(model, 'alibi', backend={backend!r}) instead",
    )


def _is_alibi(implementation: str | None) -> bool:
    return implementation in (ALIBI_ATTENTION, OLD_ALIBI_ATTENTION)


def _base_model(model: nn.Module) -> nn.Module:
    return getattr(model, "base_model", model)


class AlibiSurgery(Surgery):
    def patch_config(self, method: AlibiConfig, config: PreTrainedConfig) -> None:
        record = config.hf_posext
        previous = integration.attention_implementation(config)
        if previous not in (ALIBI_ATTENTION, OLD_ALIBI_ATTENTION):
            record["base_attn_implementation"] = previous
        integration.set_attention_implementation(config, ALIBI_ATTENTION)
        # transformers never saves the implementation in use, but applies an ``attn_implementation``
        # key found in config.json when it loads the config.
        config.attn_implementation = ALIBI_ATTENTION

    def unpatch_config(self, method: AlibiConfig, config: PreTrainedConfig, record: dict[str, Any]) -> None:
        integration.set_attention_implementation(config, record.get("base_attn_implementation"))
        config.__dict__.pop("attn_implementation", None)

    def patch_modules(self, method: AlibiConfig, model: nn.Module) -> None:
        install_forward_guard(_base_model(model), _GUARD_HANDLE, _refuse_changed_attention)

    def unpatch_modules(self, method: AlibiConfig, model: nn.Module) -> None:
        remove_forward_guard(_base_model(model), _GUARD_HANDLE)

    def on_model_init(self, method: AlibiConfig, base_model: nn.Module) -> None:
        """A model is being built from an ALiBi config: keep it ALiBi.

        Loading with ``attn_implementation="sdpa"`` (or eager, flex_attention, flash_attention_2)
        picks that ALiBi path instead of running without any position information; a checkpoint
        saved under the old attention name gets the current one.
        """
        config = base_model.config
        config.attn_implementation = ALIBI_ATTENTION
        requested = integration.attention_implementation(config)
        if requested != ALIBI_ATTENTION:
            if requested in NATIVE_TO_BACKEND:
                config.hf_posext["backend"] = NATIVE_TO_BACKEND[requested]
            integration.set_attention_implementation(config, ALIBI_ATTENTION)
        install_forward_guard(base_model, _GUARD_HANDLE, _refuse_changed_attention)

    def missing(self, method: AlibiConfig, model: nn.Module) -> str | None:
        if integration.attention_implementation(model.config) != ALIBI_ATTENTION:
            return f"the ALiBi attention ({ALIBI_ATTENTION})"
        return None
