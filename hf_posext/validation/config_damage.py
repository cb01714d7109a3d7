"""config.json values no reader can run as meant: ``hf-posext doctor``'s ``damaged-value``, ``theta-disagrees``
and ``missing-original`` (read by doctor's checks and by the GGUF export, which writes no GGUF of such a config).

Every field the readers' rope and context come from is checked for its type and range before any rule
reads it (a string, NaN, inf, a zero or negative size, a LongRoPE list of the wrong length, a record that
is not a mapping), so that a damaged config.json gets a report naming the field, never a traceback. Each
check names the field by its path in config.json (``rope_parameters.factor``).
"""

from __future__ import annotations

import math
from typing import Any

#: The patch record's key in config.json (a field path prefix: the record's own fields are not modules).
CONFIG_FIELD = "hf" + "_posext"

#: Top-level sizes: a positive integer each where present (``null`` is transformers' "not set").
SIZES = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_hidden_layers",
    "max_position_embeddings",
    "vocab_size",
    "original_max_position_embeddings",
)
#: Rope-dict keys and what each must hold (LongRoPE's lists are checked apart, against the rotary dimension).
POSITIVE = ("rope_theta", "attention_factor", "low_freq_factor", "high_freq_factor")
FINITE = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "short_mscale", "long_mscale")
#: Rope types whose maths needs the pretraining length L0.
NEEDS_ORIGINAL = ("yarn", "longrope", "llama3")
#: Fields that do not change what a reader computes: damaged, they are an error but no reader runs another model.
RECORD_FIELDS = ("hf_posext",)


def number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def positive_int(value: Any) -> bool:
    """An int > 0 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _error(field: str, value: Any, allowed: str, check: str = "damaged-value") -> dict[str, str]:
    return {"check": check, "severity": "error", "field": field, "message": f"{field} = {value!r}: {allowed}"}


def rope_entries(config_json: dict[str, Any]) -> list[tuple[str, Any]]:
    """``(path, rope dict)`` for ``rope_parameters`` (each per-layer-type entry apart) and ``rope_scaling``."""
    out: list[tuple[str, Any]] = []
    params = config_json.get("rope_parameters")
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        out += [(f"rope_parameters.{layer}", entry) for layer, entry in params.items()]
    elif params is not None:
        out.append(("rope_parameters", params))
    if config_json.get("rope_scaling") is not None:
        out.append(("rope_scaling", config_json["rope_scaling"]))
    return out


def pairs_of(config_json: dict[str, Any], rope: dict[str, Any]) -> int | None:
    """Rotated pairs per head from config.json's sizes, or ``None`` where they are missing or damaged."""
    head_dim, hidden, heads = (config_json.get(k) for k in ("head_dim", "hidden_size", "num_attention_heads"))
    if not positive_int(head_dim):
        head_dim = hidden // heads if positive_int(hidden) and positive_int(heads) else None
    partial = rope.get("partial_rotary_factor", config_json.get("partial_rotary_factor"))
    partial = 1.0 if partial is None else partial
    return int(head_dim * partial) // 2 if head_dim is not None and number(partial) and 0 < partial <= 1 else None


def _rope_damage(path: str, rope: Any, config_json: dict[str, Any]) -> list[dict[str, str]]:
    if not isinstance(rope, dict):
        return [_error(path, rope, "a JSON object (a mapping of rope fields) or null is required")]
    out = []
    for key in ("rope_type", "type"):
        if key in rope and not isinstance(rope[key], str):
            out.append(_error(f"{path}.{key}", rope[key], "a rope type name (a string) is required"))
    for key in POSITIVE:
        if rope.get(key) is not None and not (number(rope[key]) and rope[key] > 0):
            out.append(_error(f"{path}.{key}", rope[key], "a positive finite number is required"))
    for key in FINITE:
        if rope.get(key) is not None and not number(rope[key]):
            out.append(_error(f"{path}.{key}", rope[key], "a finite number is required"))
    factor = rope.get("factor")
    if factor is not None and not (number(factor) and factor >= 1):
        out.append(_error(f"{path}.factor", factor, "a finite number >= 1 is required"))
    original = rope.get("original_max_position_embeddings")
    if original is not None and not positive_int(original):
        out.append(_error(f"{path}.original_max_position_embeddings", original, "a positive integer is required"))
    partial = rope.get("partial_rotary_factor")
    if partial is not None and not (number(partial) and 0 < partial <= 1):
        out.append(_error(f"{path}.partial_rotary_factor", partial, "a number in (0, 1] is required"))
    if "truncate" in rope and not isinstance(rope["truncate"], bool):
        out.append(_error(f"{path}.truncate", rope["truncate"], "true or false is required"))
    beta_fast, beta_slow = rope.get("beta_fast", 32), rope.get("beta_slow", 1)
    if number(beta_fast) and number(beta_slow) and beta_fast < beta_slow:
        out.append(
            _error(
                f"{path}.beta_fast",
                beta_fast,
                f"beta_fast < beta_slow = {beta_slow}: YaRN's ramp runs backwards (transformers 5 warns; the engines "
                "run it as written)",
            )
        )
    if rope.get("rope_type", rope.get("type")) in ("longrope", "su"):
        pairs = pairs_of(config_json, rope)
        for name in ("short_factor", "long_factor"):
            value = rope.get(name)
            if not (isinstance(value, list) and value and all(number(v) and v > 0 for v in value)):
                out.append(_error(f"{path}.{name}", _short(value), "a list of positive finite numbers is required"))
            elif pairs is not None and len(value) != pairs:
                out.append(
                    _error(
                        f"{path}.{name}",
                        _short(value),
                        f"{len(value)} entries; the rotary dimension needs {pairs} (one per pair)",
                    )
                )
    return out


def _short(value: Any) -> Any:
    return value if not isinstance(value, list) or len(value) <= 4 else [*value[:3], f"... ({len(value)} entries)"]


def damaged_fields(config_json: dict[str, Any]) -> list[dict[str, str]]:
    """The ``damaged-value`` errors of a config.json: ``{"check", "severity", "field", "message"}`` each.

    Covers the sizes (`SIZES`), the top-level ``rope_theta`` and ``partial_rotary_factor``, every rope
    dict (`rope_entries`) and the ``hf_posext`` record (a mapping, its ``factor`` and ``context_length``).
    """
    out = []
    for key in SIZES:
        if config_json.get(key) is not None and not positive_int(config_json[key]):
            out.append(_error(key, config_json[key], "a positive integer is required"))
    theta = config_json.get("rope_theta")
    if theta is not None and not (number(theta) and theta > 0):
        out.append(_error("rope_theta", theta, "a positive finite number is required"))
    partial = config_json.get("partial_rotary_factor")
    if partial is not None and not (number(partial) and 0 < partial <= 1):
        out.append(_error("partial_rotary_factor", partial, "a number in (0, 1] is required"))
    for path, rope in rope_entries(config_json):
        out += _rope_damage(path, rope, config_json)
    record = config_json.get("hf_posext")
    if record is not None and not isinstance(record, dict):
        out.append(_error("hf_posext", record, "hf-posext's patch record must be a JSON object"))
    elif isinstance(record, dict):
        if record.get("factor") is not None and not (number(record["factor"]) and record["factor"] > 0):
            out.append(_error(f"{CONFIG_FIELD}.factor", record["factor"], "a positive finite number is required"))
        if record.get("context_length") is not None and not positive_int(record["context_length"]):
            out.append(
                _error(f"{CONFIG_FIELD}.context_length", record["context_length"], "a positive integer is required")
            )
        if record.get("method") is not None and not isinstance(record["method"], str):
            out.append(_error(f"{CONFIG_FIELD}.method", record["method"], "a method name (a string) is required"))
    return out


def theta_disagreements(config_json: dict[str, Any]) -> list[dict[str, str]]:
    """``theta-disagrees`` errors: a ``rope_theta`` in ``rope_scaling`` or at the top level unlike ``rope_parameters``'.

    transformers 5.25 takes ``rope_scaling``'s (it standardises the legacy dict over ``rope_parameters``, run
    here), 4.57 the top level's: two readers, two bases.
    """
    params = config_json.get("rope_parameters")
    if not isinstance(params, dict) or not number(params.get("rope_theta")):
        return []
    out = []
    scaling = config_json.get("rope_scaling")
    others = {
        "rope_scaling.rope_theta": scaling.get("rope_theta") if isinstance(scaling, dict) else None,
        "rope_theta": config_json.get("rope_theta"),
    }
    for field, theta in others.items():
        if number(theta) and theta != params["rope_theta"]:
            out.append(
                _error(
                    field,
                    theta,
                    f"differs from rope_parameters.rope_theta = {params['rope_theta']!r}: transformers 5 runs "
                    "rope_scaling's base where there is one, transformers 4.57 the top-level one: one base is "
                    "required",
                    check="theta-disagrees",
                )
            )
    return out


def rope_dict(config_json: dict[str, Any]) -> dict[str, Any]:
    """The rope as config.json writes it: ``rope_parameters``, else the legacy ``rope_scaling`` plus ``rope_theta``."""
    rope = config_json.get("rope_parameters") or config_json.get("rope_scaling") or {}
    rope = dict(rope) if isinstance(rope, dict) else {}
    if "rope_theta" not in rope and config_json.get("rope_theta") is not None:
        rope["rope_theta"] = config_json["rope_theta"]
    return rope


def missing_original(config_json: dict[str, Any]) -> bool:
    """Whether a rope that needs L0 (`NEEDS_ORIGINAL`) has no ``original_max_position_embeddings`` in its
    dict or at the top level (Phi-3 keeps it there): each reader then guesses another L0."""
    rope = rope_dict(config_json)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    top = config_json.get("original_max_position_embeddings")
    return rope_type in NEEDS_ORIGINAL and rope.get("original_max_position_embeddings") is None and top is None


def rope_damage(checks: list[dict[str, str]]) -> list[dict[str, str]]:
    """The damaged, contradictory or missing fields among ``checks`` that change what a reader computes (the
    record's do not): where there is one, no reader runs the model meant."""
    kinds = ("damaged-value", "theta-disagrees", "missing-original")
    return [c for c in checks if c["check"] in kinds and c.get("field", "").split(".")[0] not in RECORD_FIELDS]


#: GGUF keys (after ``{arch}.``) and what each must hold: a positive integer, a positive finite number, or
#: (``rope.scaling.factor``: llama.cpp's 0 is "unset") a finite number >= 0.
GGUF_INTS = ("context_length", "embedding_length", "attention.head_count", "attention.head_count_kv")
GGUF_INTS_OPTIONAL = ("attention.head_count_kv", "rope.scaling.original_context_length", "rope.dimension_count")
GGUF_POSITIVE = ("rope.freq_base", "rope.scaling.attn_factor")


def gguf_damage(arch: str, keys: dict[str, Any]) -> list[dict[str, str]]:
    """The ``damaged-value`` errors of a GGUF file's metadata; ``keys``: its ``{arch}.*`` keys without the prefix."""
    out = []
    for key in (*GGUF_INTS, *GGUF_INTS_OPTIONAL):
        value = keys.get(key)
        if value is None and key in GGUF_INTS and key not in GGUF_INTS_OPTIONAL:
            out.append(_error(f"{arch}.{key}", None, "the key is required (transformers and llama.cpp read it)"))
        elif value is not None and not (number(value) and value > 0 and value == int(value)):  # whole floats: as read
            out.append(_error(f"{arch}.{key}", value, "a positive integer is required"))
    for key in GGUF_POSITIVE:
        if keys.get(key) is not None and not (number(keys[key]) and keys[key] > 0):
            out.append(_error(f"{arch}.{key}", keys[key], "a positive finite number is required"))
    for key in ("rope.scaling.factor", "rope.scale_linear"):
        if keys.get(key) is not None and not (number(keys[key]) and keys[key] >= 0):
            out.append(_error(f"{arch}.{key}", keys[key], "a finite number >= 1 (or 0: unset) is required"))
    return out


__all__ = [
    "SIZES",
    "damaged_fields",
    "gguf_damage",
    "number",
    "pairs_of",
    "positive_int",
    "rope_damage",
    "rope_entries",
]
