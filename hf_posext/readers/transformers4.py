"""transformers 4.x (4.43-4.57): the legacy fields it reads, and what it does with each method.

4.x reads a top-level ``rope_theta`` and ``rope_scaling``, never ``rope_parameters``, so every
patched config carries both, written from the same parameters (docs/readers/index.md).
"""

from __future__ import annotations

from typing import Any

from .reader import NO_RULE, Finding, Reader, Subject
from .rope import in_words, same_rope

#: Rope types transformers 4.57.6 implements (``ROPE_INIT_FUNCTIONS`` plus ``default``).
KNOWN_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")

#: 4.57.6's default ``rope_theta`` (Llama, Mistral, Qwen2, Qwen3 and Phi-3 configs): a config.json without one runs it.
DEFAULT_THETA = 10000.0

#: Top-level config fields only 4.x (and engines reading a 4.x-style config) need.
LEGACY_FIELDS = (
    "rope_theta",
    "rope_scaling",
    "partial_rotary_factor",
    "original_max_position_embeddings",
    "rope_local_base_freq",
)

#: Model types whose default config has per-layer-type rope parameters in transformers 5.25 and that 4.57.6 does
#: not have (its ``CONFIG_MAPPING``, run): loading raises there ("does not recognize this architecture": the reader
#: matrix's Gemma 4 rows). Of 5.25's others, 4.57 has gemma3_text, gemma3n_text, modernbert(-decoder) and olmo3.
NOT_IN_4X = (
    "beam",
    "deepseek_v4",
    "diffusion_gemma_text",
    "dory",
    "dots3_note_text",
    "embedding_gemma2_text",
    "ergo",
    "gemma4",
    "gemma4_text",
    "gemma4_unified_text",
    "laguna",
    "lfm3",
    "mellum",
    "mimo_v2_flash",
    "neomme",
    "step3p5",
    "t5gemma2_decoder",
    "t5gemma2_text",
    "ultrabert",
    "zaya",
)
#: 4.57.6's Gemma 3 (``Gemma3TextModel.__init__``): the full-attention layers run ``rope_theta`` (default 1e6) with
#: ``rope_scaling``, the sliding ones plain RoPE at ``rope_local_base_freq`` (default 1e4).
GEMMA3 = ("gemma3", "gemma3_text")
GEMMA3_THETAS = {"full_attention": 1e6, "sliding_attention": 1e4}


def legacy_fields(rope_parameters: dict[str, Any]) -> dict[str, Any]:
    """The 4.x fields equivalent to a flat ``rope_parameters`` dict; ``None`` values are left out of config.json.

    Examples:
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


def gemma3_fields(rope_parameters: dict[str, Any]) -> dict[str, Any] | None:
    """4.57's Gemma 3 fields for per-layer-type ``rope_parameters``; ``None`` where 4.57 cannot express them (sliding
    layers with a scaling: it runs them plain).

    Examples:
        >>> gemma3_fields(
        ...     {
        ...         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        ...         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        ...     }
        ... )
        {'rope_theta': 1000000.0, 'rope_scaling': {'rope_type': 'linear', 'factor': 8.0}, \
'partial_rotary_factor': None, 'rope_local_base_freq': 10000.0}
    """
    sliding, full = rope_parameters.get("sliding_attention"), rope_parameters.get("full_attention")
    if set(rope_parameters) != {"sliding_attention", "full_attention"} or not sliding or not full:
        return None
    if sliding.get("rope_type", "default") != "default" or set(sliding) - {"rope_type", "rope_theta"}:
        return None
    return {**legacy_fields(full), "rope_local_base_freq": sliding["rope_theta"]}


def gemma3_reading(config_json: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The per-layer-type rope parameters 4.57.6's Gemma 3 runs for a config.json (`GEMMA3`)."""
    theta = config_json.get("rope_theta")
    full = reading({**config_json, "rope_theta": GEMMA3_THETAS["full_attention"] if theta is None else theta})
    local = config_json.get("rope_local_base_freq")
    local = GEMMA3_THETAS["sliding_attention"] if local is None else local
    return {"full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": local}}


def reading(config_json: dict[str, Any]) -> dict[str, Any]:
    """The ``rope_parameters`` 4.57.6 runs for a config.json: from its top-level ``rope_theta`` and ``rope_scaling``.

    4.57 never reads ``rope_parameters``: a config.json written by transformers 5 alone (``rope_scaling: null``)
    runs plain RoPE with `DEFAULT_THETA` there. ``type`` wins over ``rope_type`` (``LlamaConfig.__init__``
    copies it over); LongRoPE takes L0 from a top-level ``original_max_position_embeddings`` only, else
    ``max_position_embeddings``, and then its factor from their ratio (``_compute_longrope_parameters``,
    ``longrope_frequency_update``); YaRN without an original takes ``max_position_embeddings``. A Phi-3
    config's ``rope_scaling`` must hold ``type``, ``short_factor`` and ``long_factor`` and nothing else.

    Raises:
        ValueError: a rope type 4.57 does not know (building the model raises ``KeyError``), naming it.
    """
    scaling = dict(config_json.get("rope_scaling") or {})
    if config_json.get("model_type") == "phi3" and scaling:
        # Phi3Config._rope_scaling_validation (4.57.6): exactly these three fields, the type longrope (or su, yarn)
        if set(scaling) != {"type", "short_factor", "long_factor"} or scaling["type"] not in ("longrope", "su", "yarn"):
            raise ValueError(
                "Phi3Config raises ValueError: `rope_scaling` must be a dictionary with three fields, `type`, "
                f"`short_factor` and `long_factor` (got {', '.join(sorted(scaling))})"
            )
        scaling["type"] = "longrope"
    rope_type = scaling.pop("type", None) or scaling.pop("rope_type", None) or "default"
    scaling.pop("rope_type", None)
    if rope_type not in KNOWN_ROPE_TYPES:
        raise ValueError(f"building the model raises KeyError: {rope_type!r}")
    theta = config_json.get("rope_theta")
    params: dict[str, Any] = {
        **scaling,
        "rope_type": rope_type,
        "rope_theta": DEFAULT_THETA if theta is None else theta,
    }
    if config_json.get("partial_rotary_factor") is not None:
        params["partial_rotary_factor"] = config_json["partial_rotary_factor"]
    max_positions = config_json.get("max_position_embeddings")
    if rope_type == "longrope":
        top = config_json.get("original_max_position_embeddings")
        if not top and params.get("factor") is None:
            raise ValueError(
                "building the rope raises TypeError: LongRoPE without a top-level original_max_position_embeddings "
                "needs rope_scaling's factor (_compute_longrope_parameters compares it with 1.0)"
            )
        params["original_max_position_embeddings"] = top or max_positions
        if top and max_positions:
            params["factor"] = max_positions / top
    elif rope_type == "yarn" and not params.get("original_max_position_embeddings"):
        params["original_max_position_embeddings"] = max_positions
    if rope_type == "default":  # the rope_scaling of a plain rope is not read
        return {k: v for k, v in params.items() if k in ("rope_type", "rope_theta", "partial_rotary_factor")}
    return params


def verdict(rope_type: str) -> tuple[str, str]:
    """``("same" | "refused", how)``: how 4.57 reads a checkpoint of ``rope_type``."""
    if rope_type == "dynamic":
        return "same", (
            "transformers' own dynamic NTK, as transformers 5 without hf-posext (frequencies from the "
            "whole sequence's length; hf-posext's exact cache computes them per position)"
        )
    if rope_type in KNOWN_ROPE_TYPES:
        return "same", "same logits as transformers 5, from the legacy rope_theta / rope_scaling"
    return "refused", f"building the model raises KeyError: {rope_type!r}"


#: Rope types whose 4.57 reading was run here against a real transformers 4.57.6 (logits compared):
#: tests/readers/test_transformers4.py and tests/readers/test_doctor_readers.py.
RUN_IN_TRANSFORMERS4 = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")


def _judge(subject: Subject) -> Finding:
    if subject.situation == "unreadable":
        try:
            read = reading(subject.config_json)
        except ValueError as error:
            return READER.finding("refused", str(error))
        why = f"reads {in_words(read)}; not compared: transformers 5 builds no rope to compare with"
        return READER.finding(NO_RULE, why)
    if subject.situation == "damaged":
        return _damaged(subject)
    if subject.situation == "layered":
        return _layered(subject)
    try:
        read = reading(subject.config_json)
    except ValueError as error:
        return READER.finding("refused", str(error))
    base = verdict(subject.rope_type)
    if base[0] != "same":  # a rope type only transformers 5 (or hf-posext) has
        return READER.finding(*base)
    ran = "run here" if read["rope_type"] in RUN_IN_TRANSFORMERS4 else "read from source"
    intended, config = subject.params, subject.config
    original = int(intended.get("original_max_position_embeddings") or config.max_position_embeddings)
    lengths = tuple(sorted({original, max(subject.context, original + 1)}))
    if same_rope(config, read, intended, lengths):
        return READER.finding(*base, ran)
    legacy = "config.json has no rope_scaling" if not subject.config_json.get("rope_scaling") else "its legacy fields"
    why = (
        f"4.57 reads the top-level rope_theta/rope_scaling, never rope_parameters ({legacy}): it runs "
        f"{in_words(read)} where transformers 5 runs {in_words(intended)}"
    )
    if read.get("rope_type") == "longrope":
        why = (
            f"4.57 takes LongRoPE's L0 from a top-level original_max_position_embeddings only (here "
            f"{read['original_max_position_embeddings']}, transformers 5: {original}): another switch point and "
            "attention factor"
        )
    return READER.finding("misread", why, ran)


def _layered(subject: Subject) -> Finding:
    """4.57 on per-layer-type rope parameters: a model type it does not know is refused; Gemma 3's fields are
    compared entry by entry (`gemma3_reading`); no rule covers the other model types."""
    model_type = subject.config_json.get("model_type")
    if model_type in NOT_IN_4X:
        why = f"4.57 has no model type {model_type!r}: loading raises ValueError (does not recognize this architecture)"
        return READER.finding("refused", why, "run here")
    if model_type not in GEMMA3:
        return READER.one_rope_only(subject)
    try:
        read = gemma3_reading(subject.config_json)
    except ValueError as error:
        return READER.finding("refused", str(error), "run here")
    params = subject.params
    differ = [key for key in sorted(read) if read[key] != {k: v for k, v in params[key].items() if v is not None}]
    if not differ:
        why = "4.57's Gemma 3 reads rope_theta/rope_scaling (full attention) and rope_local_base_freq (sliding) alike"
        return READER.finding("same", why, "run here")
    runs = "; ".join(
        f"{key}: {in_words(read[key])} where transformers 5 runs {in_words(params[key])}" for key in differ
    )
    why = (
        "4.57's Gemma 3 reads rope_theta/rope_scaling for full attention and plain RoPE at rope_local_base_freq for "
        f"sliding attention, never rope_parameters: {runs}"
    )
    return READER.finding("misread", why, "run here")


def _read_by_4x(field_path: str) -> bool:
    """Whether transformers 4.57 reads a config.json field: the top level and ``rope_scaling`` (never
    ``rope_parameters``, nor a ``rope_theta`` inside ``rope_scaling``)."""
    return not field_path.startswith("rope_parameters") and field_path != "rope_scaling.rope_theta"


def _damaged(subject: Subject) -> Finding:
    """4.57 on a damaged config: a damaged field it reads is run as written (a string raises TypeError in its rope
    maths, run: the reader matrix); damage only where it does not look leaves its reading to compare."""
    read = [c["field"] for c in subject.damaged if _read_by_4x(c["field"])]
    strings = [f for f in read if isinstance(subject.value_at(f), str)]
    if strings:
        return READER.finding("refused", f"its rope maths raises TypeError on the string in {strings[0]}")
    if read:
        return READER.finding("misread", f"runs {', '.join(read)} as config.json writes it")
    try:
        runs = reading(subject.config_json)
    except ValueError as error:
        return READER.finding("refused", str(error))
    params = subject.config_json.get("rope_parameters")
    meant = {k: v for k, v in params.items() if k != "type"} if isinstance(params, dict) else {}
    if meant and all(runs.get(k) == v for k, v in meant.items()) and set(runs) <= set(meant) | {"rope_type"}:
        why = "it reads none of the damaged fields; its top-level rope_theta and rope_scaling are rope_parameters'"
        return READER.finding("same", why)
    return READER.finding("misread", f"runs {in_words(runs)}, not rope_parameters' {in_words(meant)}")


#: transformers 4.57.6, in the tests' side environment.
READER = Reader(
    "transformers4",
    "transformers 4.57",
    "transformers 4.57.6 (hf_posext/readers/transformers4.py; run here against a real 4.57.6 for rope types "
    f"{', '.join(RUN_IN_TRANSFORMERS4)} and hf-posext's own; read from its source otherwise)",
    "run here",
    _judge,
)
