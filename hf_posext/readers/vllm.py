"""vLLM: the context (``max_model_len``) and rope it derives from a saved config.

Re-written from vLLM's source (main at the commits named; copied from no file):

* ``vllm/config/model.py`` ``_get_and_verify_max_len`` (commit 0052a5b): the smallest of the
  length keys below, then, unless the rope type is ``su``/``longrope``/``llama3``, multiplied by
  ``rope_parameters["factor"]`` (1 if absent), starting from ``original_max_position_embeddings``
  for ``yarn``. So a linear or dynamic checkpoint must keep ``max_position_embeddings`` at the
  original context (lmsys/vicuna-13b-v1.5-16k: 4096 with factor 4 -> 16384), and a yarn one gets
  ``original x factor`` whatever ``max_position_embeddings`` says.
* ``vllm/model_executor/layers/rotary_embedding/__init__.py`` ``get_rope`` (commit 07b12f1) with
  ``max_position = config.max_position_embeddings``: ``linear`` divides positions by the factor;
  ``dynamic`` builds ``DynamicNTKScalingRotaryEmbedding`` (``dynamic_ntk_scaling_rope.py``,
  commit 3cfbaf3), whose base is ``theta * (max_len / max_position - (factor - 1))^(d/(d-2))``
  with ``max_len = max_position x factor``: exactly ``theta``, i.e. plain RoPE at every length;
  ``yarn`` passes ``beta_fast``/``beta_slow``/``truncate``/``attn_factor`` but not
  transformers' ``attention_factor``, so a fixed YaRN temperature is read as 0.1 ln(s) + 1;
  any other type raises ``ValueError("Unknown RoPE scaling type ...")``.

vLLM reads the config through transformers 5 (``config.rope_parameters``), so these functions
take a loaded transformers config.
"""

from __future__ import annotations

from typing import Any

from .rope import RopeDescription, describe

#: ``_get_and_verify_max_len``'s ``possible_keys``, in its order (the smallest value wins).
LENGTH_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
    "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len",
)


def max_model_len(config: Any) -> int:
    """vLLM's default ``max_model_len`` for ``config`` (no user value).

    vLLM caps it at the tokenizer's ``model_max_length`` only for pooling models with absolute
    positions (``ModelConfig.get_and_verify_max_len``), never for a rotary decoder.
    """
    lengths = [getattr(config, key) for key in LENGTH_KEYS if getattr(config, key, None) is not None]
    derived = min(lengths) if lengths else 2048
    if getattr(config, "model_max_length", None):
        derived = config.model_max_length
    rope = getattr(config, "rope_parameters", None)
    if rope:
        factor = 1.0
        if rope["rope_type"] not in ("su", "longrope", "llama3"):
            factor = rope.get("factor", factor)
            if rope["rope_type"] == "yarn":
                derived = rope["original_max_position_embeddings"]
        derived *= factor
    return int(derived)


def effective_rope(config: Any) -> RopeDescription:
    """The rope ``get_rope`` builds for ``config``, described as in :mod:`hf_posext.readers.rope`.

    Raises:
        ValueError: for a rope type vLLM does not know, as vLLM does.
    """
    rope = config.rope_parameters or {}
    theta = rope.get("rope_theta", 10000)
    rope_type = rope.get("rope_type", "default")
    if rope_type == "default":
        return describe("default", theta)
    if rope_type == "linear":
        return describe("linear", theta, factor=rope["factor"])
    if rope_type == "dynamic":
        return describe("default", theta)  # base * (s - (s - 1))^(d/(d-2)) = base
    if rope_type == "yarn":
        return describe(
            "yarn", theta, factor=rope["factor"], original=rope["original_max_position_embeddings"],
            beta_fast=rope.get("beta_fast", 32), beta_slow=rope.get("beta_slow", 1),
        )
    raise ValueError(f"Unknown RoPE scaling type {rope_type}")
