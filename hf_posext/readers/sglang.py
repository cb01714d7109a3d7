"""SGLang: the context length and rope it derives from a saved config.

Re-written from SGLang's ``get_context_length`` and ``get_rope`` (0.5.x, commit 108c36c; ``longrope``:
``Phi3LongRoPEScaledRotaryEmbedding``; copied from no file); what each rule says: docs/readers/index.md.
"""

from __future__ import annotations

from typing import Any

from ..rope_utils import rotary_dim_of
from .reader import Finding, Reader, Subject, engine_verdict
from .rope import RopeDescription, describe, engine_rope, intended_rope

#: ``CONTEXT_LENGTH_KEYS``, in SGLang's order (the first present wins).
LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")


def context_length(config: Any) -> int:
    """SGLang's ``get_context_length(config)``."""
    rope = getattr(config, "rope_scaling", None)
    factor = 1.0
    if rope:
        factor = rope.get("factor", 1)
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1.0
    for key in LENGTH_KEYS:
        value = getattr(config, key, None)
        if value is not None:
            return int(factor * value)
    return 2048


def effective_rope(config: Any, rotary_dim: int) -> RopeDescription:
    """The rope ``get_rope`` builds for ``config``; ``rotary_dim`` is d in the dynamic NTK base.

    Raises:
        ValueError: for a rope type SGLang does not know, as SGLang does.
    """
    rope = config.rope_parameters or {}
    theta = rope.get("rope_theta", 10000)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "dynamic":
        s = float(rope["factor"])
        return describe("default", theta * (s * s - (s - 1)) ** (rotary_dim / (rotary_dim - 2)))
    return engine_rope(rope_type, theta, rope)


def _judge(subject: Subject) -> Finding:
    answer = READER.through_transformers5(subject)
    if answer is not None:
        return answer
    config = subject.config
    return READER.finding(
        *engine_verdict(
            lambda: effective_rope(config, rotary_dim_of(config)),
            intended_rope(subject.params),
            context_length(config),
            subject.context,
            "--context-length",
        )
    )


#: SGLang, from its source.
READER = Reader(
    "sglang",
    "SGLang",
    "SGLang 0.5.x, commit 108c36c (get_context_length, get_rope): read from source, not run",
    "read from source",
    _judge,
)
