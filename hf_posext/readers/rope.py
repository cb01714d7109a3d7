"""One description of "the rope a reader runs", so that readers can be compared with transformers 5.

`intended_rope` says what transformers 5 runs for a ``rope_parameters`` dict; each reader
module has an ``effective_rope`` that says what that reader runs for the same saved config,
re-written from its source. Two descriptions are equal exactly when the reader rotates queries
and keys as transformers 5 does (for the positions it accepts).
"""

from __future__ import annotations

from typing import Any

RopeDescription = dict[str, Any]


def describe(kind: str, theta: float, **params: Any) -> RopeDescription:
    """``{"kind": ..., "theta": ..., **params}`` with ``None`` parameters dropped and numbers as floats."""
    out: RopeDescription = {"kind": kind, "theta": float(theta)}
    out.update({k: float(v) for k, v in params.items() if v is not None})
    return out


def intended_rope(rope_parameters: dict[str, Any]) -> RopeDescription:
    """What transformers 5 runs for a flat ``rope_parameters`` dict (hf-posext's types by their name)."""
    rope_type = rope_parameters.get("rope_type", rope_parameters.get("type", "default"))
    theta = rope_parameters["rope_theta"]
    if rope_type == "default":
        return describe("default", theta)
    if rope_type in ("linear", "dynamic"):
        return describe(rope_type, theta, factor=rope_parameters["factor"])
    if rope_type == "yarn":
        return describe(
            "yarn",
            theta,
            factor=rope_parameters["factor"],
            original=rope_parameters["original_max_position_embeddings"],
            beta_fast=rope_parameters.get("beta_fast", 32.0),
            beta_slow=rope_parameters.get("beta_slow", 1.0),
            attention_factor=rope_parameters.get("attention_factor"),
        )
    return {"kind": rope_type, "theta": float(theta)}
