"""llama.cpp: the GGUF rope keys ``convert_hf_to_gguf.py`` writes for a saved config, and what llama.cpp runs.

Re-written from the converter of llama-cpp-python 0.3.36's source package (copied from no file);
what llama.cpp 0.3.36 runs for those keys was measured by running it. The rules and the
measurements: docs/readers/llamacpp.md ("What the converter writes").
"""

from __future__ import annotations

from typing import Any

from ..rope_utils import yarn_mscale
from .rope import RopeDescription, describe

LENGTH_KEYS = (
    "max_position_embeddings",
    "n_ctx",
    "n_positions",
    "max_length",
    "max_sequence_length",
    "model_max_length",
)


def gguf_rope_keys(config_json: dict[str, Any]) -> dict[str, Any]:
    """The GGUF keys (without the ``{arch}.`` prefix) the converter writes for ``config_json``."""
    rope = dict(config_json.get("rope_parameters") or config_json.get("rope_scaling") or {})
    if "rope_theta" not in rope and config_json.get("rope_theta") is not None:
        rope["rope_theta"] = config_json["rope_theta"]
    if "rope_type" not in rope and rope.get("type") is not None:
        rope["rope_type"] = rope["type"]
    keys: dict[str, Any] = {}
    context = next((config_json[k] for k in LENGTH_KEYS if config_json.get(k) is not None), None)
    if context is not None:
        keys["context_length"] = context
    rope_type, factor = rope.get("rope_type"), rope.get("factor")
    if rope_type == "linear" and factor is not None:
        keys.update({"rope.scaling.type": "linear", "rope.scaling.factor": factor})
    elif rope_type in ("su", "longrope"):
        keys["rope.scaling.type"] = "longrope"
    elif rope_type == "llama3":
        keys["rope_freqs"] = "llama3"  # the tensor, not a key: its per-pair divisors are llama3's
    elif rope_type == "yarn" and factor is not None:
        keys.update(
            {
                "rope.scaling.type": "yarn",
                "rope.scaling.factor": factor,
                "rope.scaling.original_context_length": rope["original_max_position_embeddings"],
            }
        )
        for name, key in (
            ("attention_factor", "yarn_attn_factor"),
            ("beta_fast", "yarn_beta_fast"),
            ("beta_slow", "yarn_beta_slow"),
        ):
            if rope.get(name) is not None:
                keys[f"rope.scaling.{key}"] = rope[name]
    if rope.get("rope_theta") is not None:
        keys["rope.freq_base"] = rope["rope_theta"]
    return keys


def effective_rope(keys: dict[str, Any]) -> RopeDescription:
    """The rope llama.cpp 0.3.36 runs for the GGUF ``keys`` (llama, qwen2, qwen3 graphs), as measured.

    ``yarn_attn_factor`` and ``yarn_beta_fast/slow`` are not read: YaRN runs with betas 32 / 1
    and the attention factor (0.1 ln s + 1) x ``rope.scaling.attn_factor``. ``longrope`` without
    factor tensors runs as plain RoPE.
    """
    theta = keys.get("rope.freq_base", 10000.0)
    kind = keys.get("rope.scaling.type", "none")
    if keys.get("rope_freqs") == "llama3" and kind == "none":
        return {"kind": "llama3", "theta": float(theta)}
    if kind == "linear":
        return describe("linear", theta, factor=keys["rope.scaling.factor"])
    if kind == "yarn":
        factor = float(keys["rope.scaling.factor"])
        attn = keys.get("rope.scaling.attn_factor")
        return describe(
            "yarn",
            theta,
            factor=factor,
            original=keys["rope.scaling.original_context_length"],
            beta_fast=32.0,
            beta_slow=1.0,
            attention_factor=None if attn is None else attn * yarn_mscale(factor),
        )
    return describe("default", theta)


def per_layer_converter(model_type: str | None, rope_parameters: dict[str, Any]) -> tuple[str, str] | None:
    """``(verdict, why)``: llama.cpp 0.3.36's converter on per-layer-type rope parameters, where its source decides
    (``None``: no rule, the full-attention entry's rope would need the flat rules). Run on Gemma 3 and 4:
    tests/readers/test_llamacpp.py; LFM3 read from its source.

    - LFM3: no converter class (``conversion/lfm2.py`` has LFM2 only): refused.
    - Gemma 4: ``Gemma4Model.generate_extra_tensors`` asserts the full-attention rope type is ``proportional``
      (hf-posext's registered p-RoPE types: AssertionError, run in the reader matrix); ``proportional`` is not in
      the converter's scaling list ("Unknown RoPE type"), so a ``factor`` (PI) is dropped, while a base (NTK) is
      written.
    - Gemma 3: the converter writes the full-attention entry's rope and the sliding entry's base
      (``rope.freq_base_swa``); llama.cpp runs sliding layers unscaled (``rope_freq_scale_train_swa`` 1), so a
      scaling there is dropped. Otherwise the full-attention entry would need the flat rules: no verdict.
    """
    full = rope_parameters.get("full_attention") or {}
    sliding = rope_parameters.get("sliding_attention") or {}
    if model_type == "lfm3":
        return "refused", "llama.cpp 0.3.36's converter has no LFM3 (Lfm3ForCausalLM is not supported)"
    if model_type in ("gemma4_text", "gemma4"):
        if full.get("rope_type") != "proportional":
            return "refused", (
                f"the converter asserts Gemma 4's full-attention rope is proportional, not {full.get('rope_type')!r} "
                "(AssertionError)"
            )
        if float(full.get("factor", 1.0)) != 1.0:
            return "misread", "the converter drops proportional's factor ('Unknown RoPE type'): the unextended model"
        return "same", "proportional's base and partial rotary are written (rope.freq_base, rope_freqs)"
    if model_type in ("gemma3_text", "gemma3") and sliding.get("rope_type", "default") != "default":
        return "misread", f"llama.cpp runs Gemma 3's sliding layers unscaled: {sliding['rope_type']} is dropped there"
    return None
