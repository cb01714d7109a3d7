"""transformers 4.x (4.43-4.57): the legacy fields it reads, and what it does with each method.

transformers 4.x never reads ``rope_parameters`` (the 5.x field): its configs take a top-level
``rope_theta`` and a ``rope_scaling`` dict whose ``rope_type`` picks the rope function
(``modeling_rope_utils.ROPE_INIT_FUNCTIONS``, 4.57.6). A config with only ``rope_parameters``
builds plain RoPE with the default base while ``max_position_embeddings`` still advertises the
extended context: silently the unextended model. So every patched config also carries the legacy
fields, written from the same ``rope_parameters``:

* ``rope_theta`` at the top level (4.57.6 ``_compute_default_rope_parameters`` and
  ``_compute_yarn_parameters`` read ``config.rope_theta``); static NTK is nothing but this base;
* ``rope_scaling`` = ``rope_parameters`` without ``rope_theta``/``partial_rotary_factor``, keyed
  ``rope_type`` as Llama 3.1's config.json is (4.43+ read ``rope_type``, falling back to ``type``).
  ``rope_type`` rather than vicuna-13b-v1.5-16k's ``type``: transformers 5 reads a legacy
  ``rope_scaling`` *instead of* ``rope_parameters`` when both are present
  (``RotaryEmbeddingConfigMixin.convert_rope_params_to_dict``, 5.24), and with the same keys it
  rebuilds exactly the ``rope_parameters`` that were saved. No ``rope_scaling`` for plain
  ``default`` rope (CodeLlama's convention for a raised base: ``rope_scaling: null``);
* ``partial_rotary_factor`` at the top level when the rope has one (4.57 reads
  ``getattr(config, "partial_rotary_factor", 1.0)``).

A rope type 4.x does not know (hf-posext's own) makes 4.57.6's rotary module raise
``KeyError: '<rope type>'`` while building the model: the type names say what is missing
(:mod:`hf_posext.readers.transformers5`).
"""

from __future__ import annotations

from typing import Any

#: Rope types transformers 4.57.6 implements (``ROPE_INIT_FUNCTIONS`` plus ``default``).
KNOWN_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")

#: Top-level config fields only 4.x (and engines reading a 4.x-style config) need.
LEGACY_FIELDS = ("rope_theta", "rope_scaling", "partial_rotary_factor")


def legacy_fields(rope_parameters: dict[str, Any]) -> dict[str, Any]:
    """The 4.x fields equivalent to a flat ``rope_parameters`` dict; ``None`` values are left out of config.json.

    Example:
        >>> legacy_fields({"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0})
        {'rope_theta': 10000.0, 'rope_scaling': {'rope_type': 'linear', 'factor': 4.0}, 'partial_rotary_factor': None}
    """
    scaling = {k: v for k, v in rope_parameters.items() if k not in ("rope_theta", "partial_rotary_factor")}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    return {
        "rope_theta": rope_parameters["rope_theta"],
        "rope_scaling": None if rope_type == "default" else scaling,
        "partial_rotary_factor": rope_parameters.get("partial_rotary_factor"),
    }


def verdict(rope_type: str) -> tuple[str, str]:
    """``("right" | "refused", how)``: how 4.57 reads a checkpoint of ``rope_type``."""
    if rope_type == "dynamic":
        return "right", ("transformers' own dynamic NTK, as transformers 5 without hf-posext (frequencies from the "
                         "whole sequence's length; hf-posext's exact cache computes them per position)")
    if rope_type in KNOWN_ROPE_TYPES:
        return "right", "same logits as transformers 5, from the legacy rope_theta / rope_scaling"
    return "refused", f"building the model raises KeyError: {rope_type!r}"
