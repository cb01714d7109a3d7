"""``hf-posext doctor``'s answers for a config.json transformers 5 cannot read (`diagnose_unreadable`) or whose rope or
sizes are damaged, contradictory or missing (`diagnose_damaged`): no reader that reads a damaged field is ``same``.

The `hf_posext.readers.doctor.Finding` vocabulary; the damage itself is found by
`hf_posext.validation.config_damage`.
"""

from __future__ import annotations

from typing import Any

from ..validation.config_damage import rope_dict
from . import transformers4
from .config_checks import check_config
from .doctor import RULES, Finding, describe, finding, unknown


def _llamacpp_damaged(config_json: dict[str, Any], damaged: list[dict[str, str]], fields: str) -> Finding:
    """llama.cpp on a damaged config.json: its converter runs a number as written (a misread) and fails on a value
    that is no number; ``hf-posext gguf export`` refuses the config (run here: the reader matrix)."""
    values = [_value_at(config_json, c["field"]) for c in damaged]
    not_numbers = [v for v in values if v is not None and not isinstance(v, (int, float))]
    if not_numbers:
        converter = finding(
            "converter",
            "refused",
            f"config.json's {fields}: the converter fails on a value that is no number",
            "run here",
        )
    else:
        converter = finding(
            "converter",
            "misread",
            f"config.json's {fields}: the converter writes the value as "
            "written (or what it guesses for a missing one): not the model meant",
            "run here",
        )
    export = finding(
        "export",
        "refused",
        f"refuses config.json's {fields} (hf-posext writes no GGUF of a damaged config)",
        "run here",
    )
    routes = {"converter": converter, "gguf_export": export}
    return Finding(
        converter.verdict,
        f"converter alone: {converter.why}; `hf-posext gguf export`: {export.why}",
        RULES["converter"],
        converter.checked,
        routes,
    )


def _value_at(config_json: dict[str, Any], field: str) -> Any:
    """The value at a dotted config.json path (``rope_parameters.factor``), or None."""
    value: Any = config_json
    for part in field.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def diagnose_unreadable(config_json: dict[str, Any], error: str) -> dict[str, Any]:
    """The readers of a config.json transformers 5 refuses to read (``error``: what ``AutoConfig`` raised)."""
    refused = f"AutoConfig raises {error}"
    readers = {
        key: finding("transformers5", "refused", refused) for key in ("transformers5", "transformers5_hf_posext")
    }
    try:
        read = transformers4.reading(config_json)
        readers["transformers4"] = unknown(
            "transformers4", f"reads {describe(read)}; not compared: transformers 5 builds no rope to compare with"
        )
    except ValueError as err:
        readers["transformers4"] = finding("transformers4", "refused", str(err))
    for key in ("vllm", "sglang"):
        readers[key] = finding(key, "refused", f"reads config.json through transformers 5: {refused}")
    readers["llamacpp"] = unknown("converter", "not evaluated: transformers 5 cannot read the config")
    rope = {
        "rope_type": rope_dict(config_json).get("rope_type", rope_dict(config_json).get("type")),
        "model_type": config_json.get("model_type"),
    }
    return {
        "rope": rope,
        "checks": check_config(config_json, None),
        "readers": {k: f.to_dict() for k, f in readers.items()},
    }


def diagnose_damaged(
    config_json: dict[str, Any], damaged: list[dict[str, str]], built: dict[str, str | None]
) -> dict[str, Any]:
    """The readers of a config.json whose rope or sizes are damaged, contradictory or missing (``damaged``:
    `hf_posext.validation.config_damage.rope_damage`'s checks): a reader that reads such a field is not ``same``.

    Args:
        built: per ``transformers5`` and ``transformers5_hf_posext``, what transformers 5 raised reading the
            config and building its model, run (``None``: it built one, with the damaged value).
    """
    fields = ", ".join(dict.fromkeys(c["field"] for c in damaged))
    readers = {}
    for key, error in built.items():
        if error is None:
            readers[key] = finding("transformers5", "misread", f"builds the model with {fields} as config.json writes")
        else:
            readers[key] = finding("transformers5", "refused", f"raises {error} (config.json's {fields})")
    readers["transformers4"] = _transformers4_damaged(config_json, damaged)
    for key in ("vllm", "sglang"):
        why = f"config.json's {fields}: it runs the value as written or fails; either way not the model meant"
        readers[key] = finding(key, "misread", why, "read from source")
    readers["llamacpp"] = _llamacpp_damaged(config_json, damaged, fields)
    rope = rope_dict(config_json)
    rope_type = rope.get("rope_type", rope.get("type"))
    summary = {"rope_type": rope_type if isinstance(rope_type, str) else None, "model_type": config_json["model_type"]}
    return {
        "rope": summary,
        "checks": check_config(config_json, None),
        "readers": {k: f.to_dict() for k, f in readers.items()},
    }


def _read_by_4x(field_path: str) -> bool:
    """Whether transformers 4.57 reads a config.json field: the top level and ``rope_scaling`` (never
    ``rope_parameters``, nor a ``rope_theta`` inside ``rope_scaling``)."""
    return not field_path.startswith("rope_parameters") and field_path != "rope_scaling.rope_theta"


def _transformers4_damaged(config_json: dict[str, Any], damaged: list[dict[str, str]]) -> Finding:
    """4.57 on a damaged config: a damaged field it reads is run as written (a string raises TypeError in its rope
    maths, run: the reader matrix); damage only where it does not look leaves its reading to compare."""
    read = [c["field"] for c in damaged if _read_by_4x(c["field"])]
    strings = [f for f in read if isinstance(_value_at(config_json, f), str)]
    if strings:
        return finding("transformers4", "refused", f"its rope maths raises TypeError on the string in {strings[0]}")
    if read:
        return finding("transformers4", "misread", f"runs {', '.join(read)} as config.json writes it")
    try:
        reading = transformers4.reading(config_json)
    except ValueError as error:
        return finding("transformers4", "refused", str(error))
    params = config_json.get("rope_parameters")
    meant = {k: v for k, v in params.items() if k != "type"} if isinstance(params, dict) else {}
    if meant and all(reading.get(k) == v for k, v in meant.items()) and set(reading) <= set(meant) | {"rope_type"}:
        why = "it reads none of the damaged fields; its top-level rope_theta and rope_scaling are rope_parameters'"
        return finding("transformers4", "same", why)
    return finding("transformers4", "misread", f"runs {describe(reading)}, not rope_parameters' {describe(meant)}")


__all__ = ["diagnose_damaged", "diagnose_unreadable"]
