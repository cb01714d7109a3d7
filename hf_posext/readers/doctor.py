"""``hf-posext doctor``'s answers: how each reader reads a checkpoint's config, from the readers' own rules.

`diagnose` takes a config.json and transformers 5's reading of it and gives every reader's
`hf_posext.readers.reader.Finding` (`hf_posext.readers.registry.judge`) with the checks of the config itself;
`diagnose_damaged` and `diagnose_unreadable` do the same for a config whose rope or sizes are damaged (no reader
that reads a damaged field is ``same``) and for one transformers 5 cannot read. The verdicts are the reader
matrix's vocabulary (`hf_posext.experiments.reader_matrix`), whose measured cells
``tests/experiments/test_reader_matrix.py`` holds these rules to.
"""

from __future__ import annotations

from typing import Any

from ..gguf.rope import reach_of
from ..validation.config_damage import rope_dict
from .config_checks import check_config
from .reader import Subject
from .registry import judge
from .rope import in_words


def _report(rope: dict[str, Any], checks: list[dict[str, str]], subject: Subject) -> dict[str, Any]:
    return {"rope": rope, "checks": checks, "readers": {k: f.to_dict() for k, f in judge(subject).items()}}


def diagnose(config_json: dict[str, Any], config: Any) -> dict[str, Any]:
    """Every reader's `Finding` for a config.json, and the checks of the config itself.

    Args:
        config_json: config.json as a dict, as the readers that parse it themselves (transformers 4.x,
            llama.cpp's converter) see it.
        config: transformers 5's reading of it (``AutoConfig.from_pretrained`` after ``import hf_posext``).

    Returns:
        ``{"rope": {rope_type, reach, ...}, "checks": [{"check", "severity", "message"}],
        "readers": {"transformers5": Finding.to_dict(), "transformers5_hf_posext": ..., "transformers4": ...,
        "vllm": ..., "sglang": ..., "llamacpp": ...}}``.
    """
    params = config.rope_parameters or {}
    record = getattr(config, "hf_posext", None) or {}
    rope = {"rope_type": params.get("rope_type"), "model_type": getattr(config, "model_type", None)}
    if "rope_theta" not in params:  # per-layer-type parameters (Gemma 3): one rope per layer type
        rope.update(
            rope_types=", ".join(f"{key}={(entry or {}).get('rope_type')}" for key, entry in sorted(params.items())),
            method=record.get("method"),
            extended_layer_types=", ".join(record["layer_types"]) if record.get("layer_types") else None,
        )
        return _report(rope, check_config(config_json, config), Subject(config_json, config))
    reach = reach_of(config)
    rope.update(
        reach=reach,
        max_position_embeddings=config.max_position_embeddings,
        method=record.get("method"),
        description=in_words(params),
    )
    return _report(rope, check_config(config_json, config), Subject(config_json, config, reach))


def diagnose_unreadable(config_json: dict[str, Any], error: str) -> dict[str, Any]:
    """The readers of a config.json transformers 5 refuses to read (``error``: what ``AutoConfig`` raised)."""
    rope_type = rope_dict(config_json).get("rope_type", rope_dict(config_json).get("type"))
    rope = {"rope_type": rope_type, "model_type": config_json.get("model_type")}
    return _report(rope, check_config(config_json, None), Subject(config_json, error=error))


def diagnose_damaged(
    config_json: dict[str, Any], damaged: list[dict[str, str]], built: dict[str, str | None]
) -> dict[str, Any]:
    """The readers of a config.json whose rope or sizes are damaged, contradictory or missing (``damaged``:
    `hf_posext.validation.config_damage.rope_damage`'s checks): a reader that reads such a field is not ``same``.

    Args:
        built: per ``transformers5`` and ``transformers5_hf_posext``, what transformers 5 raised reading the
            config and building its model, run (``None``: it built one, with the damaged value).
    """
    rope_type = rope_dict(config_json).get("rope_type", rope_dict(config_json).get("type"))
    rope = {
        "rope_type": rope_type if isinstance(rope_type, str) else None,
        "model_type": config_json["model_type"],
    }
    subject = Subject(config_json, damaged=tuple(damaged), built=built)
    return _report(rope, check_config(config_json, None), subject)


__all__ = ["diagnose", "diagnose_damaged", "diagnose_unreadable"]
