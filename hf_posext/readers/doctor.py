"""``hf-posext doctor``'s answers: how each reader reads a checkpoint's config, from the readers' own rules.

`diagnose` takes a config.json and transformers 5's reading of it and gives, per reader, a
`Finding`: ``same`` (runs what transformers 5 with hf-posext runs), ``misread`` (loads it and runs
something else, silently) or ``refused`` (a loud error), the reader matrix's vocabulary
(`hf_posext.experiments.reader_matrix`, whose measured cells ``tests/experiments/test_reader_matrix.py``
holds these rules to), or ``unknown``
(no rule here covers it). transformers 5 is two readers: ``transformers5`` (no ``import hf_posext``) and
``transformers5_hf_posext``. Configs with damaged fields, or that transformers 5 cannot read:
`hf_posext.readers.doctor_damaged`.
The engines' verdicts are `hf_posext.readers.support`'s; which rules ran against a real reader:
`RULES`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers

from .. import integration
from ..gguf.rope import ARCHITECTURES, MODEL_TYPES, gguf_rope_for, reach_of
from ..rope_utils import default_inv_freq, rotary_dim_of
from . import llamacpp, transformers4, transformers5
from .config_checks import check_config
from .verdicts import PER_QUERY, WHOLE_SEQUENCE, support

VERDICTS = ("same", "misread", "refused", "unknown")  # unknown: no rule here covers it (not a verdict)
#: The readers, keyed as ``--json`` prints them, with `support`'s names.
READERS = {"transformers5": "transformers 5", "transformers5_hf_posext": "transformers 5"}
READERS.update(transformers4="transformers 4.57", vllm="vLLM")
READERS.update(sglang="SGLang", llamacpp="llama.cpp")
#: Rope types whose 4.57 reading was run here against a real transformers 4.57.6 (logits compared):
#: tests/readers/test_transformers4.py and tests/readers/test_doctor_readers.py.
RUN_IN_TRANSFORMERS4 = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
#: Rope types whose converter keys were run here through the real ``convert_hf_to_gguf.py`` (0.3.36):
#: tests/readers/test_llamacpp.py and tests/gguf/test_export.py (hf-posext's own types: its unknown-type rule).
RUN_IN_CONVERTER = ("default", "linear", "dynamic", "yarn", "longrope")
#: Each reader's rules: the version they were written from and how they were checked.
RULES = {
    "transformers5": f"transformers {transformers.__version__}, the installed one (run here)",
    "transformers4": "transformers 4.57.6 (hf_posext/readers/transformers4.py; run here against a real 4.57.6 for "
    f"rope types {', '.join(RUN_IN_TRANSFORMERS4)} and hf-posext's own; read from its source otherwise)",
    "vllm": "vLLM main, commits 0052a5b (max_model_len), 07b12f1 (get_rope), 3cfbaf3 (dynamic NTK): "
    "read from source, not run",
    "sglang": "SGLang 0.5.x, commit 108c36c (get_context_length, get_rope): read from source, not run",
    "converter": "convert_hf_to_gguf.py of llama-cpp-python 0.3.36 (run here for rope types "
    f"{', '.join(RUN_IN_CONVERTER)} and hf-posext's own: tests/readers/test_llamacpp.py; read from its source "
    "otherwise) and llama.cpp 0.3.36 on its keys (run and measured: tests/gguf/test_export.py)",
    "export": "hf-posext gguf export, then llama.cpp 0.3.36 (run and compared: tests/gguf/test_export.py)",
}
RULES["transformers5_hf_posext"] = RULES["transformers5"]
#: Whether each reader's rules were run against the real reader here; transformers 4.57: per rope type.
CHECKED = {"transformers5": "run here", "transformers4": "run here", "vllm": "read from source"}
CHECKED["transformers5_hf_posext"] = "run here"
CHECKED.update(sglang="read from source", converter="run here", export="run here")


@dataclass(frozen=True)
class Finding:
    """One reader's answer: its verdict, why in one line, the rules used, and the routes it summarises."""

    verdict: str
    why: str
    rules: str
    checked: str  # "run here" or "read from source"
    routes: dict[str, Finding] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} is not one of {', '.join(VERDICTS)}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"verdict": self.verdict, "why": self.why, "rules": self.rules, "checked": self.checked}
        if self.routes:
            out["routes"] = {name: route.to_dict() for name, route in self.routes.items()}
        return out


def finding(key: str, verdict: str, why: str, checked: str | None = None) -> Finding:
    return Finding(verdict, why, RULES[key], checked or CHECKED[key])


def describe(params: dict[str, Any]) -> str:
    """``"yarn (factor 4, original 4096, theta 10000)"``: a rope in a few words."""
    rope_type = params.get("rope_type", "default")
    parts = [
        f"{k.replace('original_max_position_embeddings', 'original')} {params[k]:g}"
        for k in ("factor", "original_max_position_embeddings", "rope_theta")
        if isinstance(params.get(k), (int, float))
    ]
    return f"{'plain RoPE' if rope_type == 'default' else rope_type} ({', '.join(parts)})"


def _known(rope_type: str) -> bool:
    """Whether transformers 5 (after ``import hf_posext``) builds a rope of this type."""
    try:
        return rope_type == "default" or integration.rope_init_function(rope_type) is not None
    except KeyError:
        return False


def _rope_at(config: Any, params: dict[str, Any], seq_len: int) -> tuple[torch.Tensor, float]:
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":  # transformers 5 computes plain RoPE in the rotary module, not in ROPE_INIT_FUNCTIONS
        return default_inv_freq(float(params["rope_theta"]), rotary_dim_of(config, params)).double(), 1.0
    probe = copy.deepcopy(config)
    probe.rope_parameters = dict(params)
    if "original_max_position_embeddings" in params and hasattr(probe, "original_max_position_embeddings"):
        # standardize_rope_params (run by the rope functions) prefers Phi-3's top-level field over the params'
        probe.original_max_position_embeddings = params["original_max_position_embeddings"]
    inv_freq, attention = integration.rope_init_function(rope_type)(probe, "cpu", seq_len=seq_len)
    return inv_freq.double(), float(attention)


def same_rope(config: Any, a: dict[str, Any], b: dict[str, Any], lengths: tuple[int, ...]) -> bool:
    """Whether transformers' rope functions give the same frequencies and attention factor for ``a`` and ``b``."""
    if a.get("rope_type", "default") != b.get("rope_type", "default"):
        return False
    for n in lengths:
        (fa, aa), (fb, ab) = _rope_at(config, a, n), _rope_at(config, b, n)
        if fa.shape != fb.shape or not torch.allclose(fa, fb, rtol=1e-9, atol=0) or abs(aa - ab) > 1e-9 * abs(ab):
            return False
    return True


def _custom(config: Any, config_json: dict[str, Any]) -> str | None:
    """What transformers 5 without ``import hf_posext`` cannot build: a rope type or attention hf-posext registers."""
    rope_type = config.rope_parameters.get("rope_type", "default")
    if rope_type in transformers5.custom_rope_types():
        return f"rope type {rope_type!r}"
    attention = config_json.get("attn_implementation")
    if isinstance(attention, str) and "hf_posext" in attention:
        return f"attention {attention!r}"
    return None


def _transformers5(config: Any, config_json: dict[str, Any]) -> dict[str, Finding]:
    """transformers 5 without ``import hf_posext`` and with it (``transformers5``, ``transformers5_hf_posext``)."""
    rope_type = config.rope_parameters.get("rope_type", "default")
    if not _known(rope_type):
        why = f"building the model raises KeyError: {rope_type!r} (neither transformers 5 nor hf-posext knows it)"
        refused = finding("transformers5", "refused", why)
        return {"transformers5": refused, "transformers5_hf_posext": refused}
    with_plugin = finding("transformers5", "same", "after `import hf_posext`: hf-posext registers every type it writes")
    custom = _custom(config, config_json)
    record = getattr(config, "hf_posext", None) or {}
    if custom is not None:
        why = f"the {custom} is hf-posext's: a KeyError or ValueError naming it, which says to `import hf_posext`"
        without = finding("transformers5", "refused", why)
    elif rope_type == "dynamic" and record.get("exact_cache"):
        without = finding("transformers5", "misread", WHOLE_SEQUENCE)
    elif rope_type == "longrope" and record.get("factors_by") == "query":
        without = finding("transformers5", "misread", PER_QUERY)
    else:
        without = finding("transformers5", "same", f"native rope type {rope_type!r}: loads with or without hf-posext")
    return {"transformers5": without, "transformers5_hf_posext": with_plugin}


def _transformers4(config: Any, config_json: dict[str, Any], reach: int, base: tuple[str, str]) -> Finding:
    try:
        read = transformers4.reading(config_json)
    except ValueError as error:
        return finding("transformers4", "refused", str(error))
    if _custom(config, config_json) is not None:
        return finding("transformers4", *base)
    ran = "run here" if read["rope_type"] in RUN_IN_TRANSFORMERS4 else "read from source"
    intended = dict(config.rope_parameters)
    original = int(intended.get("original_max_position_embeddings") or config.max_position_embeddings)
    lengths = tuple(sorted({original, max(reach, original + 1)}))
    if not same_rope(config, read, intended, lengths):
        legacy = "config.json has no rope_scaling" if not config_json.get("rope_scaling") else "its legacy fields"
        why = (
            f"4.57 reads the top-level rope_theta/rope_scaling, never rope_parameters ({legacy}): it runs "
            f"{describe(read)} where transformers 5 runs {describe(intended)}"
        )
        if read.get("rope_type") == "longrope":
            why = (
                f"4.57 takes LongRoPE's L0 from a top-level original_max_position_embeddings only (here "
                f"{read['original_max_position_embeddings']}, transformers 5: {original}): another switch point and "
                "attention factor"
            )
        return finding("transformers4", "misread", why, ran)
    return finding("transformers4", *base, ran)


def _engine(key: str, base: tuple[str, str]) -> Finding:
    return finding(key, *base)


def _export_route(config: Any) -> Finding:
    arch = MODEL_TYPES.get(getattr(config, "model_type", None))
    if arch is None:
        return finding(
            "export",
            "refused",
            f"model_type {config.model_type!r}: the export writes the rope of "
            f"{', '.join(sorted(MODEL_TYPES))} checkpoints only",
        )
    try:
        rope = gguf_rope_for(config, arch)
    except ValueError as error:
        return finding("export", "refused", str(error))
    record = getattr(config, "hf_posext", None)
    if isinstance(record, dict) and record.get("method") == "longrope" and record.get("factors_by") == "query":
        return finding(  # run here: the reader matrix
            "export",
            "misread",
            "writes LongRoPE's long factors, which llama.cpp runs at every position of a sequence past L0 "
            "(factors_by='sequence'), not per query",
        )
    what = (
        "plain RoPE"
        if rope.scaling_type == "none" and rope.rope_freqs is None
        else ("a rope_freqs tensor" if rope.rope_freqs is not None else f"{rope.scaling_type} x{rope.factor:g}")
    )
    return finding("export", "same", f"writes {what} with context_length {rope.context_length}, as llama.cpp reads it")


def _llamacpp(config: Any, base: tuple[str, str]) -> Finding:
    arch = MODEL_TYPES.get(getattr(config, "model_type", None))
    if arch is None:
        converter = finding(
            "converter",
            "unknown",
            f"model_type {config.model_type!r}: these rules cover the "
            f"{', '.join(ARCHITECTURES)} GGUF graphs (model types {', '.join(sorted(MODEL_TYPES))})",
        )
    else:
        rope_type = config.rope_parameters.get("rope_type", "default")
        ran = rope_type in RUN_IN_CONVERTER or rope_type in transformers5.custom_rope_types()
        converter = finding("converter", *base, "run here" if ran else "read from source")
    export = _export_route(config)
    routes = {"converter": converter, "gguf_export": export}
    if converter.verdict == "same":
        return Finding("same", converter.why, RULES["converter"], converter.checked, routes)
    if export.verdict == "same":
        why = f"only through `hf-posext gguf export` ({export.why}); the converter alone: {converter.why}"
        return Finding(converter.verdict, why, RULES["converter"], converter.checked, routes)
    why = f"converter alone: {converter.why}; `hf-posext gguf export`: {export.why}"
    return Finding(converter.verdict, why, RULES["converter"], converter.checked, routes)


def unknown(key: str, why: str) -> Finding:
    return finding(key, "unknown", why)


def diagnose(config_json: dict[str, Any], config: Any) -> dict[str, Any]:
    """Every reader's `Finding` for a config.json, and the checks of the config itself.

    Args:
        config_json: config.json as a dict, as the readers that parse it themselves (transformers 4.x,
            llama.cpp's converter) see it.
        config: transformers 5's reading of it (``AutoConfig.from_pretrained`` after ``import hf_posext``).

    Returns:
        ``{"rope": {rope_type, reach, ...}, "checks": [{"check", "severity", "message"}],
        "readers": {"transformers5": Finding.to_dict(), "transformers4": ..., "vllm": ..., "sglang": ...,
        "llamacpp": ...}}``.
    """
    params = config.rope_parameters or {}
    checks = check_config(config_json, config)
    rope = {"rope_type": params.get("rope_type"), "model_type": getattr(config, "model_type", None)}
    if "rope_theta" not in params:  # per-layer-type parameters (Gemma 3): no single rope to compare
        record = getattr(config, "hf_posext", None) or {}
        rope.update(
            rope_types=", ".join(f"{key}={(entry or {}).get('rope_type')}" for key, entry in sorted(params.items())),
            method=record.get("method"),
            extended_layer_types=", ".join(record["layer_types"]) if record.get("layer_types") else None,
        )
        why = f"per-layer-type rope parameters ({', '.join(sorted(params))}): these rules compare a single rope"
        readers = {key: unknown(key if key != "llamacpp" else "converter", why) for key in READERS}
        converter = readers["llamacpp"]
        by_source = llamacpp.per_layer_converter(getattr(config, "model_type", None), params)
        if by_source is not None:
            converter = finding("converter", *by_source, "run here")  # tests/readers/test_llamacpp.py
        routes = {"converter": converter, "gguf_export": _export_route(config)}
        readers["llamacpp"] = Finding(converter.verdict, converter.why, converter.rules, converter.checked, routes)
        readers.update(_transformers5_nested(config))
        readers.update(_transformers4_nested(config, config_json))
        return {"rope": rope, "checks": checks, "readers": {k: f.to_dict() for k, f in readers.items()}}
    reach = reach_of(config)
    rope.update(
        reach=reach,
        max_position_embeddings=config.max_position_embeddings,
        method=(getattr(config, "hf_posext", None) or {}).get("method"),
        description=describe(params),
    )
    ruled = support(config, reach)
    verdicts = {key: ruled[name] for key, name in READERS.items()}
    readers = {
        **_transformers5(config, config_json),
        "transformers4": _transformers4(config, config_json, reach, verdicts["transformers4"]),
        "vllm": _engine("vllm", verdicts["vllm"]),
        "sglang": _engine("sglang", verdicts["sglang"]),
        "llamacpp": _llamacpp(config, verdicts["llamacpp"]),
    }
    return {"rope": rope, "checks": checks, "readers": {k: f.to_dict() for k, f in readers.items()}}


def _transformers4_nested(config: Any, config_json: dict[str, Any]) -> dict[str, Finding]:
    """4.57 on per-layer-type rope parameters: a model type it does not know is refused; Gemma 3's fields are
    compared entry by entry (`transformers4.gemma3_reading`); no rule covers the other model types."""
    model_type = config_json.get("model_type")
    if model_type in transformers4.NOT_IN_4X:
        why = f"4.57 has no model type {model_type!r}: loading raises ValueError (does not recognize this architecture)"
        return {"transformers4": finding("transformers4", "refused", why, "run here")}
    if model_type not in transformers4.GEMMA3:
        return {}
    try:
        read = transformers4.gemma3_reading(config_json)
    except ValueError as error:
        return {"transformers4": finding("transformers4", "refused", str(error), "run here")}
    params = config.rope_parameters
    differ = [key for key in sorted(read) if read[key] != {k: v for k, v in params[key].items() if v is not None}]
    if not differ:
        why = "4.57's Gemma 3 reads rope_theta/rope_scaling (full attention) and rope_local_base_freq (sliding) alike"
        return {"transformers4": finding("transformers4", "same", why, "run here")}
    runs = "; ".join(
        f"{key}: {describe(read[key])} where transformers 5 runs {describe(params[key])}" for key in differ
    )
    why = (
        "4.57's Gemma 3 reads rope_theta/rope_scaling for full attention and plain RoPE at rope_local_base_freq for "
        f"sliding attention, never rope_parameters: {runs}"
    )
    return {"transformers4": finding("transformers4", "misread", why, "run here")}


def _transformers5_nested(config: Any) -> dict[str, Finding]:
    entries = [e for e in (config.rope_parameters or {}).values() if isinstance(e, dict)]
    custom = [e["rope_type"] for e in entries if e.get("rope_type") in transformers5.custom_rope_types()]
    with_plugin = finding("transformers5", "same", "after `import hf_posext`: hf-posext registers every type it writes")
    if custom:
        without = finding("transformers5", "refused", f"rope types {custom} are hf-posext's: a KeyError naming them")
    else:
        without = finding("transformers5", "same", "native per-layer-type rope: loads with or without hf-posext")
    return {"transformers5": without, "transformers5_hf_posext": with_plugin}
