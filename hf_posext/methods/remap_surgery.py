"""Surgery of training-free methods (``self_extend``, ``dca``, ``string``, ``rerope``): the remapping attention wrapper.

The rotary modules keep the checkpoint's frequencies; the attention modules get the method's
remapping and ``config._attn_implementation`` names the wrapper of the model's kernel
(:mod:`hf_posext.attention.remap_install`, :mod:`hf_posext.attention.wrapper`), in :func:`~hf_posext.patch_model`
and again while a saved checkpoint is built (so ``attn_implementation="sdpa"`` at load picks the sdpa wrapper).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers import PreTrainedConfig

from ..architectures import check_wrappable_attention
from ..attention.remap import ATTENTION_PREFIX, SAVED_ATTENTION, STATE_ATTR, remap_attention
from ..attention.remap_install import FALLBACK, install_remapping, uninstall_remapping
from ..attention.guard import check_attention_kept, install_forward_guard, remove_forward_guard
from ..attention.wrapper import SUPPORTED_KERNELS
from .registry import AttentionFunctions
from .remapping import AttentionRemapMethod
from .surgery import Surgery

#: The wrapper of each kernel, masked as that kernel is, and the name saved checkpoints carry.
REMAP_ATTENTIONS = {
    SAVED_ATTENTION: AttentionFunctions(remap_attention, "sdpa"),
    **{ATTENTION_PREFIX + kernel: AttentionFunctions(remap_attention, kernel) for kernel in SUPPORTED_KERNELS},
}

_BASE_FIELDS = "base_config_fields"
#: The attribute of the base model holding the handle of its attention guard.
_GUARD_HANDLE = "_hf_posext_remap_guard"


def _is_remapping(implementation: str | None) -> bool:
    return implementation == SAVED_ATTENTION or str(implementation).startswith(ATTENTION_PREFIX)


def _refuse_changed_attention(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
    """Forward pre-hook of a remapped base model: its attention implementation must still be the remapping's."""
    method = module.config.hf_posext["method"]
    check_attention_kept(
        module.config,
        _is_remapping,
        what=method,
        needs=f"the remapping attention {ATTENTION_PREFIX}<kernel>; without it the model runs plain RoPE past its "
        f"context",
        advice=f"to run {method} on another kernel, unpatch, set the implementation, then call "
        f"hf_posext.patch_model(model, {method!r}, ...) again",
    )


def _original(config: PreTrainedConfig) -> int:
    return int(config.hf_posext["original_max_position_embeddings"])


class RemapSurgery(Surgery):
    def check(self, method: AttentionRemapMethod, config: PreTrainedConfig, model: nn.Module | None) -> None:
        """Interleaved rotary pairs, multi-head latent attention, per-layer-type rope: refused before any change."""
        check_wrappable_attention(
            config,
            model,
            purpose=f"{method.name} (model_type={getattr(config, 'model_type', None)!r})",
            fallback=FALLBACK,
        )

    def patch_config(self, method: AttentionRemapMethod, config: PreTrainedConfig) -> None:
        fields = method.config_fields(_original(config))
        config.hf_posext[_BASE_FIELDS] = {key: config.__dict__.get(key) for key in fields}
        config.__dict__.update(fields)
        # written to config.json: transformers without hf-posext then refuses the checkpoint
        config.attn_implementation = SAVED_ATTENTION

    def unpatch_config(self, method: AttentionRemapMethod, config: PreTrainedConfig, record: dict[str, Any]) -> None:
        config.__dict__.pop("attn_implementation", None)
        for key, value in record.get(_BASE_FIELDS, {}).items():
            if value is None:
                config.__dict__.pop(key, None)
            else:
                config.__dict__[key] = value

    def patch_modules(self, method: AttentionRemapMethod, model: nn.Module) -> None:
        install_remapping(model, method.remapping(_original(model.config)))
        install_forward_guard(getattr(model, "base_model", model), _GUARD_HANDLE, _refuse_changed_attention)

    def unpatch_modules(self, method: AttentionRemapMethod, model: nn.Module) -> None:
        uninstall_remapping(model)
        remove_forward_guard(getattr(model, "base_model", model), _GUARD_HANDLE)

    def on_rotary_init(
        self, method: AttentionRemapMethod, base_model: nn.Module, rotary: nn.Module
    ) -> nn.Module | None:
        install_remapping(base_model, method.remapping(_original(base_model.config)), rotary)
        install_forward_guard(base_model, _GUARD_HANDLE, _refuse_changed_attention)
        return None

    def missing(self, method: AttentionRemapMethod, model: nn.Module) -> str | None:
        if not any(STATE_ATTR in module.__dict__ for module in model.modules()):
            return f"the remapping attention ({method.name})"
        return None
