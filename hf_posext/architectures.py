"""Which models hf-posext can patch: decided by transformers' rotary contract, not by a list of names.

A decoder config with ``rope_parameters`` and rotary modules that read ``ROPE_INIT_FUNCTIONS``
(probed); the attention wrappers (exact dynamic cache, remapping) also need rotate-half pairing.
[`SUPPORTED_MODEL_TYPES`][hf_posext.SUPPORTED_MODEL_TYPES] is the tested list (docs/methods/index.md).
Longer than ~400 lines: some 120 of them are that list and the wrappers' refusals, data the checks here read.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn
from transformers import PreTrainedConfig

from . import integration
from .post_import import deprecated_attribute
from .validation.saved_model import check_rope_config

#: ``config.model_type`` values on which tests/test_architectures.py passes every check
#: (parity with transformers' own rope types, cached generation, save and reload); a test keeps it
#: equal to what passes, and scripts/tables.py writes docs/methods/index.md's list from it.
SUPPORTED_MODEL_TYPES = (
    "afmoe",
    "apertus",
    "apertus1p5_text",
    "arcee",
    "aria_text",
    "axk1",
    "axk2",
    "bailing_hybrid",
    "bitnet",
    "cohere",
    "cohere2",
    "cohere2_moe",
    "cwm",
    "deepseek_v2",
    "deepseek_v3",
    "deepseek_v32",
    "deepseek_v4",
    "diffllama",
    "doge",
    "dots1",
    "ernie4_5",
    "ernie4_5_moe",
    "exaone",
    "exaone4",
    "exaone_moe",
    "flex_olmo",
    "flint",
    "gemma",
    "gemma2",
    "gemma3_text",
    "glm",
    "glm4",
    "glm4_moe",
    "glm4_moe_lite",
    "glm_moe_dsa",
    "gpt_neox",
    "gpt_neox_japanese",
    "gpt_oss",
    "granite",
    "granitemoe",
    "granitemoeshared",
    "helium",
    "hrm_text",
    "hunyuan_v1_dense",
    "hunyuan_v1_moe",
    "hy_v3",
    "hy_v4",
    "hyperclovax",
    "internlm3",
    "iquestcoder",
    "jais2",
    "jetmoe",
    "kolibri1",
    "laguna",
    "lara_mini",
    "lfm2",
    "llama",
    "llama4_text",
    "mellum",
    "mimo_v2_flash",
    "minicpm3",
    "minicpm5_moe",
    "minimax",
    "minimax_m2",
    "minimax_m3_vl_text",
    "ministral",
    "mistral",
    "mixtral",
    "modernbert-decoder",
    "nanochat",
    "nemotron",
    "olmo",
    "olmo2",
    "olmo3",
    "olmo_hybrid",
    "olmoe",
    "param2moe",
    "persimmon",
    "phi",
    "phi3",
    "phimoe",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_5_moe_text",
    "qwen3_5_text",
    "qwen3_moe",
    "qwen3_next",
    "sarvam_mla",
    "sarvam_moe",
    "seed_oss",
    "smollm3",
    "solar_open",
    "stablelm",
    "starcoder2",
    "vaultgemma",
    "youtu",
)

#: Model types whose attention passes the checks below but treats RoPE otherwise than the attention
#: wrappers assume, found by tests/test_architectures.py (the exact dynamic path differed from the
#: unpatched model within L_orig, or could not run): refused by `check_wrappable_attention`.
WRAPPED_ATTENTION_UNSUPPORTED = {
    "afmoe": "some layers use no RoPE",
    "exaone4": "some layers use no RoPE",
    "exaone_moe": "some layers use no RoPE",
    "flint": "some layers use no RoPE",
    "kolibri1": "some layers use no RoPE",
    "lara_mini": "some layers use no RoPE",
    "gpt_neox_japanese": "its attention rotates with its own rotary layout",
    # found with longrope's attention factor; with trained (non-unit) q/k norm weights dynamic_ntk
    # differed from the unpatched model by 0.21 within L_orig too
    "hunyuan_v1_dense": "its attention normalises queries and keys after RoPE",
    "hunyuan_v1_moe": "its attention normalises queries and keys after RoPE",
    "persimmon": "its attention does not pass position_ids to the attention function",
    "qwen3_5_text": "multimodal (3D) position ids",
    "qwen3_5_moe_text": "multimodal (3D) position ids",
}

#: Substrings of a layer type whose layers attend locally (sliding window, chunks): per-layer-type
#: rope parameters of those layers are left as they are unless ``layer_types`` names them.
LOCAL_LAYER_MARKERS = ("sliding", "chunked", "local")


def _unsupported(config: PreTrainedConfig, missing: str) -> ValueError:
    model_type = getattr(config, "model_type", None)
    return ValueError(
        f"unsupported architecture {model_type!r}: {missing}. hf-posext patches decoders whose rotary embedding "
        f"follows transformers' rope_parameters / ROPE_INIT_FUNCTIONS contract; tested on: "
        f"{', '.join(SUPPORTED_MODEL_TYPES)}"
    )


def nested_rope_keys(config: PreTrainedConfig) -> list[str]:
    """The layer types ``config.rope_parameters`` is nested under (Gemma 3); ``[]`` when it is flat."""
    params = getattr(config, "rope_parameters", None) or {}
    return list(config.nested_rope_parameter_keys(params)) if hasattr(config, "nested_rope_parameter_keys") else []


def check_config(config: PreTrainedConfig) -> None:
    """Refuse a config that cannot carry a rope method: encoder-decoder, composite or without rope parameters.

    Raises:
        ValueError: naming what the config lacks and the tested model types.
    """
    if getattr(config, "is_encoder_decoder", False):
        raise _unsupported(config, "it is an encoder-decoder model")
    if getattr(config, "sub_configs", None):
        raise _unsupported(
            config,
            f"its config is composite ({', '.join(config.sub_configs)}); patch its text model "
            f"(config.get_text_config()) instead",
        )
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict) or not params:
        raise _unsupported(config, "its config has no rope_parameters (no rotary embedding transformers configures)")
    keys = nested_rope_keys(config)
    entries = [params[key] for key in keys if params[key] is not None] if keys else [params]
    if not entries or any(
        isinstance(entry, dict) and "rope_type" not in entry and "type" not in entry for entry in entries
    ):
        raise _unsupported(config, f"its rope_parameters {params} name no rope_type")
    check_rope_config(config)


def rope_layer_types(config: PreTrainedConfig, requested: Sequence[str] | None, scales_rope: bool) -> list[str]:
    """The nested rope-parameter keys a patch rewrites; ``[]`` for a flat config.

    Args:
        requested: the ``layer_types`` argument of [`patch_model`][hf_posext.patch_model]; ``None``: every
            layer type with rope parameters except local ones (`LOCAL_LAYER_MARKERS`) for a
            rope scaling, all of them for a method that replaces rope (ALiBi, absolute encodings).
        scales_rope: whether the method rescales RoPE.

    Raises:
        ValueError: ``requested`` on a flat config, or naming a layer type without rope parameters.
    """
    keys = [key for key in nested_rope_keys(config) if config.rope_parameters[key] is not None]
    if not keys:
        if requested is not None:
            raise ValueError(
                f"layer_types={list(requested)!r} given, but model_type {config.model_type!r} has one set of rope "
                f"parameters for every layer; leave layer_types unset"
            )
        return []
    if requested is not None:
        unknown = [key for key in requested if key not in keys]
        if unknown or not requested:
            raise ValueError(
                f"layer_types={list(requested)!r}: each must be one of {keys} (layer types with rope parameters)"
            )
        return [key for key in keys if key in requested]
    if not scales_rope:
        return keys
    chosen = [key for key in keys if not any(marker in key for marker in LOCAL_LAYER_MARKERS)]
    if not chosen:
        raise ValueError(
            f"model_type {config.model_type!r} has rope parameters only for local layer types {keys}; pass "
            f"layer_types= naming the ones to extend"
        )
    return chosen


def _probe_config(config: PreTrainedConfig) -> PreTrainedConfig:
    """A copy of ``config`` with every rope-parameter entry scaled by ``rope_type="linear"``, factor 2."""
    probe = copy.deepcopy(config)
    params = copy.deepcopy(probe.rope_parameters)
    keys = nested_rope_keys(probe)
    for entry in [params[key] for key in keys if params[key] is not None] if keys else [params]:
        theta = entry.get("rope_theta", getattr(probe, "default_theta", 10000.0))
        partial = entry.get("partial_rotary_factor")
        entry.clear()
        entry.update({"rope_type": "linear", "factor": 2.0, "rope_theta": theta})
        if partial is not None:
            entry["partial_rotary_factor"] = partial
    probe.rope_parameters = params
    return probe


def _frequency_buffers(module: nn.Module) -> dict[str | None, torch.Tensor]:
    """``{layer_type or None: inv_freq}`` of a rotary module (Gemma 3's keep one per layer type)."""
    if isinstance(module.rope_type, dict):
        return {key: getattr(module, f"{key}_inv_freq") for key in module.rope_type}
    return {None: module.inv_freq}


def check_rotary_modules(model: nn.Module) -> None:
    """Refuse a model whose rotary modules do not take their frequencies from ``ROPE_INIT_FUNCTIONS``.

    Each rotary class is rebuilt on a copy of its config scaled with transformers' ``linear``
    type; its frequencies must equal ``ROPE_INIT_FUNCTIONS["linear"]``'s for every layer type.

    Raises:
        ValueError: no rotary module, a constructor that does not take ``config`` alone, or other frequencies.
    """
    config = getattr(model, "config", None)
    modules = list(integration.rotary_modules(model))
    if not modules:
        raise _unsupported(config, f"{type(model).__name__} has no rotary embedding module (with rope_type and config)")
    seen: set[tuple[type, int]] = set()
    for name, module in modules:
        if module.config is not config:
            raise _unsupported(
                config,
                f"its rotary module {name} ({type(module).__name__}) keeps its own copy of the config (e.g. one per "
                f"rope_theta), which a patch of the model's config does not reach",
            )
        if (type(module), id(module.config)) in seen:
            continue
        seen.add((type(module), id(module.config)))
        probe = _probe_config(module.config)
        try:
            rebuilt = type(module)(config=probe)
        except TypeError as error:
            raise _unsupported(
                config,
                f"its rotary module {name} ({type(module).__name__}) cannot be rebuilt from its config alone ({error})",
            ) from error
        init = integration.rope_init_function("linear")
        for layer_type, inv_freq in _frequency_buffers(rebuilt).items():
            expected, _ = init(probe, inv_freq.device, layer_type=layer_type)
            if inv_freq.shape != expected.shape or not torch.allclose(
                inv_freq.float(), expected.float(), rtol=1e-6, atol=0
            ):
                raise _unsupported(
                    config,
                    f"its rotary module {name} ({type(module).__name__}) does not take its frequencies from "
                    f"ROPE_INIT_FUNCTIONS[rope_type] (a linear-scaled copy of its config gave other frequencies"
                    f"{'' if layer_type is None else f' for layer type {layer_type!r}'})",
                )


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention modules: classes named ``...Attention`` that carry a ``layer_idx``."""
    return [m for m in model.modules() if type(m).__name__.endswith("Attention") and hasattr(m, "layer_idx")]


def _reference_rotation(x: torch.Tensor, angles: torch.Tensor, scaling: float) -> torch.Tensor:
    """Rotate-half RoPE of ``x`` [..., seq, width] by ``angles`` [seq, half]: pairs (i, i + half), the rest passed."""
    half = angles.shape[-1]
    first, second, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    cos, sin = angles.cos() * scaling, angles.sin() * scaling
    return torch.cat((first * cos - second * sin, second * cos + first * sin, rest), dim=-1)


def _check_rotary_built_after_attention(
    model: nn.Module, rotary: nn.Module | None, *, purpose: str, fallback: str
) -> None:
    """Refuse a model that builds its rotary before its attention modules (HRM-Text): a saved checkpoint is
    rebuilt by installing the wrapper when the rotary registers (loading.py), which then finds no attention."""
    if rotary is None:
        return
    order = {id(module): index for index, module in enumerate(model.modules())}
    if any(order[id(module)] > order[id(rotary)] for module in attention_modules(model)):
        raise ValueError(
            f"{purpose}: {type(model).__name__} builds its rotary embedding before its attention modules, so a "
            f"saved checkpoint could not be rebuilt with the wrapper; {fallback}"
        )


def check_wrappable_attention(
    config: PreTrainedConfig,
    model: nn.Module | None,
    rotary: nn.Module | None = None,
    *,
    purpose: str,
    fallback: str,
) -> list[nn.Module]:
    """Refuse a model whose attention an hf-posext attention wrapper cannot rotate for.

    The wrappers (exact dynamic scaling, the training-free methods' remapping) rotate queries and
    keys themselves in the rotate-half pairing, so they need one set of flat rope parameters,
    attention modules they can find, and the model's own ``apply_rotary_pos_emb`` to rotate
    exactly that way.

    Args:
        model: ``None`` checks only what the config decides.
        rotary: the rotary module to check with; default: the model's first (a base model being
            built has not registered its own yet).
        purpose, fallback: what needs the check (``"exact_cache=True"``, ``"self_extend (model_type=...)"``)
            and what to do instead, for the messages.

    Returns:
        The attention modules (none without a model).

    Raises:
        ValueError: naming what does not fit, ``purpose`` and ``fallback``.
    """
    _check_wrappable_config(config, purpose=purpose, fallback=fallback)
    if model is None:
        return []
    attention = attention_modules(model)
    if not attention:
        raise ValueError(
            f"{purpose}: {type(model).__name__} has no attention module (a ...Attention class "
            f"with layer_idx) to wrap; {fallback}"
        )
    if rotary is None:
        rotary = next((m for _, m in integration.rotary_modules(model)), None)
        _check_rotary_built_after_attention(model, rotary, purpose=purpose, fallback=fallback)
    _check_rotate_half(attention[0], rotary, purpose=purpose, fallback=fallback)
    return attention


def _check_wrappable_config(config: PreTrainedConfig, *, purpose: str, fallback: str) -> None:
    """What the config alone rules out: per-layer-type rope parameters, the model types in
    `WRAPPED_ATTENTION_UNSUPPORTED`, and multi-head latent attention."""
    model_type = getattr(config, "model_type", None)
    if nested_rope_keys(config):
        raise ValueError(
            f"{purpose} does not support per-layer-type rope parameters (model_type={model_type!r}, layer "
            f"types {nested_rope_keys(config)}); {fallback}"
        )
    if model_type in WRAPPED_ATTENTION_UNSUPPORTED:
        raise ValueError(
            f"{purpose} does not support model_type={model_type!r}: "
            f"{WRAPPED_ATTENTION_UNSUPPORTED[model_type]}; {fallback}"
        )
    if getattr(config, "qk_rope_head_dim", None):
        raise ValueError(
            f"{purpose} does not support multi-head latent attention (model_type={model_type!r}: rope on "
            f"qk_rope_head_dim={config.qk_rope_head_dim} channels after the un-rotated ones); {fallback}"
        )


def _check_rotate_half(attention: nn.Module, rotary: nn.Module | None, *, purpose: str, fallback: str) -> None:
    """Refuse unless the ``apply_rotary_pos_emb`` of ``attention``'s modeling module, with ``rotary``'s tables for
    7 positions, rotates channel pairs ``(i, i + rotary_dim / 2)`` as the wrappers do (`_reference_rotation`)."""
    source = sys.modules[type(attention).__module__]
    apply = getattr(source, "apply_rotary_pos_emb", None)
    if apply is None or rotary is None:
        raise ValueError(
            f"{purpose}: {source.__name__} has no apply_rotary_pos_emb (or the model no rotary "
            f"module) whose convention can be checked; {fallback}"
        )
    device = rotary.inv_freq.device
    if device.type == "meta":  # a model being built by from_pretrained: the same module with values, on CPU
        device = torch.device("cpu")
        with device:
            rotary = type(rotary)(config=rotary.config)
    with device, torch.no_grad():  # `with device`: from_pretrained builds models under torch.device("meta")
        positions = torch.arange(7)[None]
        cos, sin = rotary(torch.zeros(1), positions)
        x = torch.randn(1, 1, 7, cos.shape[-1], generator=torch.Generator(device).manual_seed(0))
        try:
            rotated, _ = apply(x, x, cos, sin)
        except Exception as error:  # any failure means the convention cannot be confirmed
            raise ValueError(
                f"{purpose}: {source.__name__}.apply_rotary_pos_emb could not be checked "
                f"({type(error).__name__}: {error}); {fallback}"
            ) from error
        angles = positions[0, :, None].float() * rotary.inv_freq.float()
        expected = _reference_rotation(x, angles, float(getattr(rotary, "attention_scaling", 1.0)))
    if rotated.shape != expected.shape or not torch.allclose(rotated, expected, rtol=1e-4, atol=1e-5):
        raise ValueError(
            f"{purpose}: {source.__name__}.apply_rotary_pos_emb does not rotate channel pairs (i, i + "
            f"rotary_dim / 2) as the wrapper does (e.g. interleaved pairs, as in Cohere); {fallback}"
        )


def __getattr__(name: str) -> Any:  # EXACT_DYNAMIC_UNSUPPORTED, the 0.1 name of WRAPPED_ATTENTION_UNSUPPORTED
    return deprecated_attribute(__name__, name)
