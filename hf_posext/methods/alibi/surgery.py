"""ALiBi's surgery: the attention implementation, in the config and while a checkpoint is loaded."""

from __future__ import annotations

from typing import Any

import torch.nn as nn
from transformers import PreTrainedConfig

from ..surgery import Surgery
from .attention import ALIBI_ATTENTION, NATIVE_TO_BACKEND, OLD_ALIBI_ATTENTION
from .config import AlibiConfig


class AlibiSurgery(Surgery):
    def patch_config(self, method: AlibiConfig, config: PreTrainedConfig) -> None:
        record = config.hf_posext
        previous = config._attn_implementation
        if previous not in (ALIBI_ATTENTION, OLD_ALIBI_ATTENTION):
            record["base_attn_implementation"] = previous
        config._attn_implementation = ALIBI_ATTENTION
        # transformers never saves _attn_implementation, but applies an ``attn_implementation``
        # key found in config.json when it loads the config.
        config.attn_implementation = ALIBI_ATTENTION

    def unpatch_config(self, method: AlibiConfig, config: PreTrainedConfig, record: dict[str, Any]) -> None:
        config._attn_implementation = record.get("base_attn_implementation")
        config.__dict__.pop("attn_implementation", None)

    def on_model_init(self, method: AlibiConfig, base_model: nn.Module) -> None:
        """A model is being built from an ALiBi config: keep it ALiBi.

        Loading with ``attn_implementation="sdpa"`` (or eager, flex_attention, flash_attention_2)
        picks that ALiBi path instead of running without any position information; a checkpoint
        saved under the old attention name gets the current one.
        """
        config = base_model.config
        config.attn_implementation = ALIBI_ATTENTION
        requested = config._attn_implementation
        if requested != ALIBI_ATTENTION:
            if requested in NATIVE_TO_BACKEND:
                config.hf_posext["backend"] = NATIVE_TO_BACKEND[requested]
            config._attn_implementation = ALIBI_ATTENTION

    def missing(self, method: AlibiConfig, model: nn.Module) -> str | None:
        if model.config._attn_implementation != ALIBI_ATTENTION:
            return f"the ALiBi attention ({ALIBI_ATTENTION})"
        return None
