"""What the training-free methods that remap positions inside attention share (Self-Extend, DCA, STRING, ReRoPE).

Their config's base, their rope type and attention functions as registered, and their surgery. They
keep the checkpoint's rotary embedding and score some (query, key) pairs at other positions: the kernel,
its install and its rope type are `hf_posext.attention.remap`; this module is what the method
registry and patching need of them (it stays in ``methods/``: ``attention/`` imports nothing above it).
The surgery selects the remapping attention wrapper in [`patch_model`][hf_posext.patch_model] and again while a
saved checkpoint is built (so ``attn_implementation="sdpa"`` at load picks the sdpa wrapper).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn
from transformers import PreTrainedConfig

from ..architectures import check_wrappable_attention
from ..attention.remap import (
    ATTENTION_PREFIX,
    FALLBACK,
    SAVED_ATTENTION,
    STATE_ATTR,
    compute_remap_rope_parameters,
    install_remap_guard,
    install_remapping,
    remap_attention,
    remap_rope_parameters,
    remove_remap_guard,
    shipped_parameters,  # noqa: F401 (importable from here before 0.2, issue 48 item 5)
    uninstall_remapping,
    validate_remap_rope_parameters,
)
from ..attention.wrapper import SUPPORTED_KERNELS
from ..rope_utils import REMAP_ROPE_TYPE
from .base import BaseRope, MethodConfig
from .registry import AttentionFunctions, RopeType
from .surgery import Surgery


#: Registered by both families (the same functions, so the second registration is a no-op).
REMAP_ROPE_TYPES = {REMAP_ROPE_TYPE: RopeType(compute_remap_rope_parameters, validate_remap_rope_parameters)}


@dataclass(frozen=True)
class AttentionRemapMethod(MethodConfig):
    """Shared by methods that leave RoPE's frequencies alone and remap positions in attention."""

    scales_rope: ClassVar[bool] = False
    #: The attention wrapper runs one remapping in every layer, so per-layer-type rope parameters (sliding and
    #: full layers) are refused (architectures.check_wrappable_attention) and other methods' refusals do not
    #: list these as fitting.
    per_layer_type_rope: ClassVar[bool] = False
    #: They run on top of whatever static scaling the checkpoint ships: its frequencies stay.
    composes: ClassVar[bool] = True

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        """The checkpoint's rope under `hf_posext.rope_utils.REMAP_ROPE_TYPE` (same frequencies)."""
        return remap_rope_parameters(base.rope_parameters)

    def composed_rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        return remap_rope_parameters(base.rope_parameters)

    def max_position_embeddings(self, base: BaseRope) -> int:
        return self.reach(base.original_max_position_embeddings)

    def resolve(self, original: int) -> Any:
        """The method's sizes for the checkpoint's context ``original`` (L0), checked against it.

        Raises:
            ValueError: a size that does not fit L0.
        """
        raise NotImplementedError

    def _fit(self, field: str, value: int, low: int, high: int, bound: str, *, at_most: bool = False) -> int:
        """``value``, the resolved ``field``, if it lies in ``[low, high)`` (``[low, high]`` when ``at_most``).

        Raises:
            ValueError: ``"{name}: {field} must be an int in [low, high) (below {bound}), got {value}"``.
        """
        if low <= value < high or (at_most and value == high):
            return value
        closing, relation = ("]", "at most") if at_most else (")", "below")
        raise ValueError(
            f"{self.name}: {field} must be an int in [{low}, {high}{closing} ({relation} {bound}), got {value!r}"
        )

    def reach(self, original: int) -> int:
        """The context the patched model advertises, for the checkpoint's context ``original`` (L0).

        Default: ``factor * L0``, once `resolve` accepts the method's sizes for L0.
        """
        self.resolve(original)
        return round(self.factor * original)

    def config_fields(self, original: int) -> dict[str, Any]:
        """Config keys beyond rope parameters that a patched config carries (what engines read)."""
        return {}

    def remapping(self, original: int) -> Any:
        """The `hf_posext.attention.remap.Remapping` for L0 = ``original`` (validates against it)."""
        raise NotImplementedError


#: The wrapper of each kernel, masked as that kernel is, and the name saved checkpoints carry.
REMAP_ATTENTIONS = {
    SAVED_ATTENTION: AttentionFunctions(remap_attention, "sdpa"),
    **{ATTENTION_PREFIX + kernel: AttentionFunctions(remap_attention, kernel) for kernel in SUPPORTED_KERNELS},
}

_BASE_FIELDS = "base_config_fields"


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
        install_remap_guard(getattr(model, "base_model", model))

    def unpatch_modules(self, method: AttentionRemapMethod, model: nn.Module) -> None:
        uninstall_remapping(model)
        remove_remap_guard(getattr(model, "base_model", model))

    def on_rotary_init(
        self, method: AttentionRemapMethod, base_model: nn.Module, rotary: nn.Module
    ) -> nn.Module | None:
        install_remapping(base_model, method.remapping(_original(base_model.config)), rotary)
        install_remap_guard(base_model)
        return None

    def missing(self, method: AttentionRemapMethod, model: nn.Module) -> str | None:
        if not any(STATE_ATTR in module.__dict__ for module in model.modules()):
            return f"the remapping attention ({method.name})"
        return None
