"""What a checkpoint's rotary embedding already is, before a method is applied on top.

`base_rope` reads it from the config (or from an earlier patch's record, so patches never
stack): plain RoPE with the pretraining context, or a shipped static scaling (llama3, linear, yarn,
longrope) read as per-pair divisors and an attention factor, with L0 = the context it already
reaches - the base a method composes on (`hf_posext.methods`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import PreTrainedConfig

from .. import integration
from ..methods.base import CONFIG_KEY, BaseRope, MethodConfig
from ..methods.registry import available_methods, composable_methods, method_class
from ..rope_utils import default_inv_freq, head_dim_of, layer_config, rotary_dim_of

#: Shipped rope types a method can compose on: static per-pair scalings of theta's frequencies.
COMPOSABLE_ROPE_TYPES = ("linear", "llama3", "yarn", "longrope")


def _reach(rope_parameters: dict[str, Any], max_positions: int, config: PreTrainedConfig) -> int:
    """The context a checkpoint with a shipped scaling already reaches, L0.

    ``max_position_embeddings`` (Llama 3.1: 131072, Phi-3: 131072), or ``factor`` times its
    ``original_max_position_embeddings`` when that is longer (Qwen2.5 ships yarn 4 over 32768 and
    keeps max_position_embeddings at 32768).
    """
    original = rope_parameters.get("original_max_position_embeddings") or getattr(
        config, "original_max_position_embeddings", None
    )
    factor = rope_parameters.get("factor")
    if original and factor:
        return max(max_positions, int(round(float(factor) * int(original))))
    return max_positions


def _scaled_base(
    config: PreTrainedConfig, rope_parameters: dict[str, Any], max_positions: int, reach: int, layer_type: str | None
) -> tuple[torch.Tensor, float]:
    """The per-pair divisors and attention factor of a shipped scaling, computed by transformers itself.

    The checkpoint's frequencies are what transformers' own rope-init function gives at a
    length past its original context (longrope's long factors), so composition starts from
    exactly what the checkpoint runs.
    """
    probe = copy.deepcopy(layer_config(config, layer_type))  # the layer type's own head_dim (Gemma 4)
    probe.rope_parameters = copy.deepcopy(rope_parameters)
    probe.max_position_embeddings = max_positions
    rotary_dim = rotary_dim_of(probe, rope_parameters)
    inv_freq, attention_factor = integration.rope_init_function(rope_parameters["rope_type"])(
        probe, "cpu", seq_len=reach
    )
    if rope_parameters["rope_type"] == "longrope":
        # its divisors are written down: take them as they are, so that the pairs a method keeps
        # are bit for bit the checkpoint's (a divisor recovered from fp32 frequencies is not)
        kind = "long_factor" if reach > int(rope_parameters["original_max_position_embeddings"]) else "short_factor"
        return torch.tensor(rope_parameters[kind], dtype=torch.float64), float(attention_factor)
    plain = default_inv_freq(float(rope_parameters["rope_theta"]), rotary_dim)
    return plain.double() / inv_freq.double(), float(attention_factor)


def shipped_rope(config: PreTrainedConfig, layer_type: str | None = None) -> tuple[dict[str, Any], int, int]:
    """The checkpoint's own rope parameters, ``max_position_embeddings`` and the context it reaches (L0).

    Read from an earlier patch's record when there is one (whatever that patch was, ``override``
    included), else from the config; L0 is `_reach` for a shipped static scaling and the
    pretraining context for plain RoPE. No method's own ``original_max_position_embeddings``
    enters it: every patch starts from the checkpoint.
    """
    record = getattr(config, CONFIG_KEY, None)
    if record is not None:
        shipped = copy.deepcopy(rope_entry(record["base_rope_parameters"], layer_type))
        return (
            shipped,
            int(record["base_max_position_embeddings"]),
            int(record["base_original_max_position_embeddings"]),
        )
    shipped = copy.deepcopy(dict(rope_entry(config.rope_parameters or {}, layer_type)))
    max_positions = int(config.max_position_embeddings)
    if shipped.get("rope_type", shipped.get("type", "default")) in COMPOSABLE_ROPE_TYPES:
        return shipped, max_positions, _reach(shipped, max_positions, config)
    return shipped, max_positions, _pretraining_context(shipped, max_positions, config)


def _pretraining_context(shipped: dict[str, Any], max_positions: int, config: PreTrainedConfig) -> int:
    return int(
        shipped.get("original_max_position_embeddings")
        or getattr(config, "original_max_position_embeddings", None)
        or max_positions
    )


def base_rope(
    config: PreTrainedConfig, method: MethodConfig, override: bool, layer_type: str | None = None
) -> BaseRope:
    """What the checkpoint had before hf-posext, with ``L_orig`` resolved for ``method``.

    A checkpoint that ships a static scaling (`COMPOSABLE_ROPE_TYPES`) is the base the method
    composes on, with ``L_orig`` = the context it reaches (`_reach`); ``override=True``
    replaces its scaling with plain RoPE at its pretraining context instead.

    Args:
        layer_type: the entry of per-layer-type rope parameters to read; ``None`` for a flat config.
    """
    shipped, max_positions, reach = shipped_rope(config, layer_type)
    rope_type = shipped.get("rope_type", shipped.get("type", "default"))
    if rope_type == "proportional":
        return _proportional_base(config, shipped, max_positions, reach, method, override, layer_type)
    original = reach if rope_type == "default" else _pretraining_context(shipped, max_positions, config)
    compose = rope_type != "default" and not override
    if compose:
        if rope_type not in COMPOSABLE_ROPE_TYPES or not method.composes:
            raise ValueError(
                f"this checkpoint already uses rope_type={rope_type!r} ({shipped}); hf-posext composes "
                f"{', '.join(composable_methods())} on a checkpoint's own "
                f"{', '.join(COMPOSABLE_ROPE_TYPES)} scaling, not "
                f"{method.name!r} on {rope_type!r}. Pass override=True to replace its scaling with {method.name!r} on "
                f"top of plain RoPE with rope_theta={shipped.get('rope_theta')} and original context {original}."
            )
        original = reach
        if method.original_max_position_embeddings is not None:
            original = method.original_max_position_embeddings
        divisors, attention_factor = _scaled_base(config, shipped, max_positions, original, layer_type)
        return BaseRope(
            rope_parameters=shipped,
            max_position_embeddings=max_positions,
            original_max_position_embeddings=original,
            rotary_dim=rotary_dim_of(config, shipped, layer_type),
            pair_divisors=divisors,
            attention_factor=attention_factor,
        )
    rope_parameters = {"rope_type": "default", "rope_theta": shipped.get("rope_theta", config.default_theta)}
    if "partial_rotary_factor" in shipped:
        rope_parameters["partial_rotary_factor"] = shipped["partial_rotary_factor"]
    if method.original_max_position_embeddings is not None:
        original = method.original_max_position_embeddings
    return BaseRope(
        rope_parameters=rope_parameters,
        max_position_embeddings=max_positions,
        original_max_position_embeddings=original,
        rotary_dim=rotary_dim_of(config, rope_parameters, layer_type),
    )


def p_rope_methods() -> list[str]:
    """The registered methods that extend p-RoPE: the static ones that compose on a shipped scaling."""
    return [name for name in available_methods() if method_class(name).composes and not method_class(name).dynamic]


def _proportional_base(
    config: PreTrainedConfig,
    shipped: dict[str, Any],
    max_positions: int,
    reach: int,
    method: MethodConfig,
    override: bool,
    layer_type: str | None,
) -> BaseRope:
    """p-RoPE (``proportional``) as the base a method composes on: full RoPE at head_dim, divided by its own ``factor``.

    p-RoPE has no plain-RoPE form to fall back to (``default`` with its partial_rotary_factor rotates other
    frequencies), so it is always composed on; ``override=True`` drops only its own ``factor``.

    Raises:
        ValueError: a dynamic method or one that replaces RoPE, naming the model type, the layer type and why.
    """
    if method.dynamic or not method.composes:
        why = (
            "transformers' dynamic update recomputes frequencies with rope types (dynamic, dynamic YaRN) that have no "
            "p-RoPE form"
            if method.dynamic
            else "it replaces RoPE, and p-RoPE's unrotated channels are part of the checkpoint"
        )
        where = "" if layer_type is None else f", layer type {layer_type!r}"
        raise ValueError(
            f"{method.name} cannot extend rope_type='proportional' (p-RoPE, model_type {config.model_type!r}{where}): "
            f"{why}; methods that extend p-RoPE: {', '.join(p_rope_methods())}"
        )
    head_dim = head_dim_of(config, layer_type)
    own_factor = 1.0 if override else float(shipped.get("factor", 1.0))
    parameters = {k: v for k, v in shipped.items() if k != "factor"} if override else shipped
    return BaseRope(
        rope_parameters=parameters,
        max_position_embeddings=max_positions,
        original_max_position_embeddings=method.original_max_position_embeddings or reach,
        rotary_dim=head_dim,
        pair_divisors=torch.full((head_dim // 2,), own_factor, dtype=torch.float64),
    )


def rope_entry(rope_parameters: dict[str, Any], layer_type: str | None) -> dict[str, Any]:
    return rope_parameters if layer_type is None else rope_parameters[layer_type]
