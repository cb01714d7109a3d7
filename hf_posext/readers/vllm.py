"""vLLM: the context (``max_model_len``) and rope it derives from a saved config.

Re-written from vLLM's ``_get_and_verify_max_len`` and ``get_rope`` (commits 0052a5b, 07b12f1,
3cfbaf3; copied from no file); what each rule says: docs/readers/index.md.
"""

from __future__ import annotations

from typing import Any

from .reader import Finding, Reader, Subject, engine_verdict
from .rope import RopeDescription, describe, engine_rope, intended_rope

#: ``_get_and_verify_max_len``'s ``possible_keys``, in its order (the smallest value wins).
LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
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
    """The rope ``get_rope`` builds for ``config``, described as in `hf_posext.readers.rope`.

    Raises:
        ValueError: for a rope type vLLM does not know, as vLLM does.
    """
    rope = config.rope_parameters or {}
    theta = rope.get("rope_theta", 10000)
    rope_type = rope.get("rope_type", "default")
    if rope_type == "dynamic":
        return describe("default", theta)  # base * (s - (s - 1))^(d/(d-2)) = base
    return engine_rope(rope_type, theta, rope)


#: Model types whose vLLM model file reads ``dual_chunk_attention_config`` (vLLM main: qwen2.py,
#: qwen2_moe.py, qwen3.py, qwen3_moe.py).
DUAL_CHUNK_MODEL_TYPES = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")


def _judge(subject: Subject) -> Finding:
    answer = READER.through_transformers5(subject)
    if answer is not None:
        return answer
    config = subject.config
    if getattr(config, "dual_chunk_attention_config", None) and config.model_type in DUAL_CHUNK_MODEL_TYPES:
        why = (
            "reads dual_chunk_attention_config before the rope type (get_rope's dual-chunk branch, "
            "DualChunkFlashAttention; plain-theta frequencies; not run here)"
        )
        return READER.finding("same", why)
    intended, context = intended_rope(subject.params), max_model_len(config)
    return READER.finding(
        *engine_verdict(lambda: effective_rope(config), intended, context, subject.context, "--max-model-len")
    )


#: vLLM, from its source.
READER = Reader(
    "vllm",
    "vLLM",
    "vLLM main, commits 0052a5b (max_model_len), 07b12f1 (get_rope), 3cfbaf3 (dynamic NTK): read from source, not run",
    "read from source",
    _judge,
)
