"""transformers 4.x (4.43-4.57): the legacy fields it reads, and what it does with each method.

4.x reads a top-level ``rope_theta`` and ``rope_scaling``, never ``rope_parameters``, so every
patched config carries both, written from the same parameters (docs/readers/index.md).
"""

from __future__ import annotations

from typing import Any

#: Rope types transformers 4.57.6 implements (``ROPE_INIT_FUNCTIONS`` plus ``default``).
KNOWN_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")

#: Top-level config fields only 4.x (and engines reading a 4.x-style config) need.
LEGACY_FIELDS = ("rope_theta", "rope_scaling", "partial_rotary_factor", "original_max_position_embeddings")


def legacy_fields(rope_parameters: dict[str, Any]) -> dict[str, Any]:
    """The 4.x fields equivalent to a flat ``rope_parameters`` dict; ``None`` values are left out of config.json.

    Example:
        >>> legacy_fields({"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0})
        {'rope_theta': 10000.0, 'rope_scaling': {'rope_type': 'linear', 'factor': 4.0}, 'partial_rotary_factor': None}
    """
    scaling = {k: v for k, v in rope_parameters.items() if k not in ("rope_theta", "partial_rotary_factor")}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    fields = {
        "rope_theta": rope_parameters["rope_theta"],
        "rope_scaling": None if rope_type == "default" else scaling,
        "partial_rotary_factor": rope_parameters.get("partial_rotary_factor"),
    }
    if rope_type == "longrope":
        # 4.57's longrope reads L0 from the top level only (else max_position_embeddings: never switches)
        fields["original_max_position_embeddings"] = rope_parameters["original_max_position_embeddings"]
    return fields


def verdict(rope_type: str) -> tuple[str, str]:
    """``("right" | "refused", how)``: how 4.57 reads a checkpoint of ``rope_type``."""
    if rope_type == "dynamic":
        return "right", (
            "transformers' own dynamic NTK, as transformers 5 without hf-posext (frequencies from the "
            "whole sequence's length; hf-posext's exact cache computes them per position)"
        )
    if rope_type in KNOWN_ROPE_TYPES:
        return "right", "same logits as transformers 5, from the legacy rope_theta / rope_scaling"
    return "refused", f"building the model raises KeyError: {rope_type!r}"
