"""Checks of a checkpoint's rope config itself: missing, mismatched, ignored or damaged fields (``hf-posext doctor``).

Each check names the field, its value and what the readers do with it. The keys each reader reads per
rope type are re-written from transformers 5.25's ``RotaryEmbeddingConfigMixin._validate_*_rope_parameters``,
vLLM's and SGLang's ``get_rope`` (the commits of `vllm` and `sglang`) and the fields
hf-posext writes for them (docs/readers/index.md).
"""

from __future__ import annotations

import math
from typing import Any

from ..rope_utils import CONFIG_KEY
from ..validation.unknown_method import unknown_method
from . import transformers5
from ..validation.config_damage import damaged_fields, missing_original, rope_dict, theta_disagreements

#: Keys transformers 5 reads per native rope type (``rope_type``, ``type``, ``rope_theta`` and
#: ``partial_rotary_factor`` always).
TRANSFORMERS5_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "yarn": {
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    },
    "longrope": {"short_factor", "long_factor", "original_max_position_embeddings", "attention_factor", "factor"},
    "llama3": {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"},
    "proportional": {"factor"},
}
ALWAYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
#: Keys vLLM / SGLang read that transformers 5 does not (per rope type).
ENGINE_KEYS = {
    "yarn": {"extrapolation_factor": "vLLM, SGLang", "attn_factor": "vLLM, SGLang", "apply_yarn_scaling": "vLLM"},
    "longrope": {"short_mscale": "vLLM, SGLang", "long_mscale": "vLLM, SGLang"},
    "dynamic": {"alpha": "vLLM, SGLang (dynamic NTK-alpha)"},
}


def _check(name: str, severity: str, message: str) -> dict[str, str]:
    return {"check": name, "severity": severity, "message": message}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _reach(rope: dict[str, Any], config_json: dict[str, Any], config: Any) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    factor, original = rope.get("factor"), rope.get("original_max_position_embeddings")
    max_positions = config_json.get("max_position_embeddings")
    if rope_type == "yarn" and _number(factor) and isinstance(original, int) and isinstance(max_positions, int):
        reach = round(factor * original)
        if max_positions not in (original, reach):
            out.append(
                _check(
                    "reach-mismatch",
                    "warning",
                    f"yarn factor {factor:g} over original {original} reaches "
                    f"{reach}, but max_position_embeddings is {max_positions} (neither {original} nor "
                    f"{reach}): transformers 5 uses the factor, SGLang and llama.cpp default to {max_positions}",
                )
            )
    sizes = isinstance(original, int) and isinstance(max_positions, int)
    if rope_type == "longrope" and _number(factor) and sizes and abs(max_positions / original - factor) > 1e-6 * factor:
        out.append(
            _check(
                "reach-mismatch",
                "warning",
                f"longrope factor {factor:g} but max_position_embeddings / "
                f"original = {max_positions}/{original} = {max_positions / original:g}: transformers 4.57 "
                "takes the ratio for the attention factor, transformers 5 the factor",
            )
        )
    record = config_json.get("hf_posext")
    record = record if isinstance(record, dict) else {}
    context = record.get("context_length")
    if _number(record.get("factor")) and _number(factor) and abs(float(record["factor"]) - factor) > 1e-9:
        out.append(
            _check(
                "reach-mismatch",
                "warning",
                f"the hf_posext record says factor {record['factor']:g} "
                f"(context {context}), the rope says {factor:g}: edited after patching?",
            )
        )
    return out


def _unknown_keys(rope: dict[str, Any]) -> list[dict[str, str]]:
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if not isinstance(rope_type, str) or rope_type in transformers5.custom_rope_types():
        return []
    if rope_type not in TRANSFORMERS5_KEYS:
        return []  # hf-posext's own types validate their fields when they load; unknown types are a refusal
    engines = ENGINE_KEYS.get(rope_type, {})
    out = []
    for key in sorted(set(rope) - ALWAYS - TRANSFORMERS5_KEYS[rope_type]):
        if key in engines:
            out.append(
                _check(
                    "ignored-key",
                    "info",
                    f"{key} ({rope[key]!r}) is read by {engines[key]} but not by "
                    f"transformers 5 for rope type {rope_type!r}",
                )
            )
        else:
            out.append(
                _check(
                    "unknown-key",
                    "warning",
                    f"{key} ({rope[key]!r}) is read by no reader for rope type {rope_type!r}: a typo? "
                    f"(transformers 5 reads {', '.join(sorted(TRANSFORMERS5_KEYS[rope_type])) or 'rope_theta only'})",
                )
            )
    return out


def check_config(config_json: dict[str, Any], config: Any) -> list[dict[str, str]]:
    """The problems of a config.json's rope fields, each ``{"check", "severity", "message"}`` (empty: none).

    ``config`` is transformers 5's reading of it (``None``: it could not read it). Checks: ``no-rope-fields``
    (plain RoPE at the model type's default base), ``legacy-disagrees`` (``rope_scaling`` and
    ``rope_parameters`` say different things), ``missing-original``, ``reach-mismatch``, ``unknown-key`` /
    ``ignored-key``, ``damaged-value`` and ``theta-disagrees`` (`damage`: every field's type and range,
    the record's included), and of the ``hf_posext`` record ``unregistered-method`` (a plugin's method not
    imported: only the rope it wrote is judged). A check about one field also names it under ``"field"``.
    """
    out = []
    unregistered = unknown_method(config_json.get(CONFIG_KEY))
    if unregistered is not None:
        out.append(
            _check(
                "unregistered-method",
                "warning",
                f"{CONFIG_KEY}['method'] is {unregistered!r}, a method this process has not registered (a plugin's "
                "method?): the readers are judged on the rope alone, not on what the method adds to attention or "
                "weights; name the module that registers it with --plugin MODULE (or HF_POSEXT_PLUGINS) to judge the "
                "checkpoint as it was patched",
            )
        )
    damaged = damaged_fields(config_json) + theta_disagreements(config_json)
    rope = rope_dict(config_json)
    if not rope and config is not None:
        theta = (config.rope_parameters or {}).get("rope_theta")
        out.append(
            _check(
                "no-rope-fields",
                "info",
                f"config.json names no rope: plain RoPE with the {config.model_type} default base {theta}",
            )
        )
        return out + damaged
    legacy, current = config_json.get("rope_scaling"), config_json.get("rope_parameters")
    if isinstance(legacy, dict) and isinstance(current, dict):
        differ = sorted(
            k
            for k in set(legacy) | set(current) - {"rope_theta", "type", "rope_type"}
            if k not in ("rope_theta", "type", "rope_type") and legacy.get(k) != current.get(k)
        )
        legacy_type = legacy.get("rope_type", legacy.get("type"))
        if legacy_type != current.get("rope_type", current.get("type")) or differ:
            out.append(
                _check(
                    "legacy-disagrees",
                    "error",
                    f"rope_scaling ({legacy_type}) and rope_parameters "
                    f"({current.get('rope_type')}) differ{' in ' + ', '.join(differ) if differ else ''}: "
                    "transformers 4.x and 5 both read rope_scaling, vLLM and SGLang what transformers 5 makes of it",
                )
            )
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if missing_original(config_json):
        fallback = config_json.get("max_position_embeddings")
        missing = _check(
            "missing-original",
            "error",
            f"{rope_type} without original_max_position_embeddings: "
            f"transformers takes max_position_embeddings ({fallback}) as the pretraining length, "
            "so the scaling starts there; vLLM's get_rope raises KeyError",
        )
        out.append({**missing, "field": "original_max_position_embeddings"})
    nested = _nested_entries(rope)
    if nested:  # per-layer-type rope parameters (Gemma 3, Gemma 4, LFM3): each entry on its own, named
        for layer_type, entry in nested.items():
            checks = _reach(entry, config_json, config) + _unknown_keys(entry)
            out += [{**check, "message": f"{layer_type}: {check['message']}"} for check in checks]
        return out + damaged
    return out + _reach(rope, config_json, config) + _unknown_keys(rope) + damaged


def _nested_entries(rope: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{layer type: entry}`` of per-layer-type rope parameters; ``{}`` for one flat entry."""
    if "rope_type" in rope or "type" in rope or not rope:
        return {}
    if not all(isinstance(entry, dict) or entry is None for key, entry in rope.items() if key != "rope_theta"):
        return {}
    return {key: entry for key, entry in rope.items() if isinstance(entry, dict)}
