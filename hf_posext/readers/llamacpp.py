"""llama.cpp: the GGUF rope keys ``convert_hf_to_gguf.py`` writes for a saved config, and what llama.cpp runs.

Re-written from the converter of llama-cpp-python 0.3.36's source package (copied from no file);
what llama.cpp 0.3.36 runs for those keys was measured by running it. The rules and the
measurements: docs/readers/llamacpp.md ("What the converter writes").
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..methods.registry import method_class
from ..rope_utils import yarn_mscale
from . import transformers5
from .reader import NO_RULE, Finding, Reader, Subject, engine_verdict
from .rope import RopeDescription, describe, intended_rope

LENGTH_KEYS = (
    "max_position_embeddings",
    "n_ctx",
    "n_positions",
    "max_length",
    "max_sequence_length",
    "model_max_length",
)


def gguf_rope_keys(config_json: dict[str, Any]) -> dict[str, Any]:
    """The GGUF keys (without the ``{arch}.`` prefix) the converter writes for ``config_json``."""
    rope = dict(config_json.get("rope_parameters") or config_json.get("rope_scaling") or {})
    if "rope_theta" not in rope and config_json.get("rope_theta") is not None:
        rope["rope_theta"] = config_json["rope_theta"]
    if "rope_type" not in rope and rope.get("type") is not None:
        rope["rope_type"] = rope["type"]
    keys: dict[str, Any] = {}
    context = next((config_json[k] for k in LENGTH_KEYS if config_json.get(k) is not None), None)
    if context is not None:
        keys["context_length"] = context
    rope_type, factor = rope.get("rope_type"), rope.get("factor")
    if rope_type == "linear" and factor is not None:
        keys.update({"rope.scaling.type": "linear", "rope.scaling.factor": factor})
    elif rope_type in ("su", "longrope"):
        keys["rope.scaling.type"] = "longrope"
    elif rope_type == "llama3":
        keys["rope_freqs"] = "llama3"  # the tensor, not a key: its per-pair divisors are llama3's
    elif rope_type == "yarn" and factor is not None:
        keys.update(
            {
                "rope.scaling.type": "yarn",
                "rope.scaling.factor": factor,
                "rope.scaling.original_context_length": rope["original_max_position_embeddings"],
            }
        )
        for name, key in (
            ("attention_factor", "yarn_attn_factor"),
            ("beta_fast", "yarn_beta_fast"),
            ("beta_slow", "yarn_beta_slow"),
        ):
            if rope.get(name) is not None:
                keys[f"rope.scaling.{key}"] = rope[name]
    if rope.get("rope_theta") is not None:
        keys["rope.freq_base"] = rope["rope_theta"]
    return keys


def effective_rope(keys: dict[str, Any]) -> RopeDescription:
    """The rope llama.cpp 0.3.36 runs for the GGUF ``keys`` (llama, qwen2, qwen3 graphs), as measured.

    ``yarn_attn_factor`` and ``yarn_beta_fast/slow`` are not read: YaRN runs with betas 32 / 1
    and the attention factor (0.1 ln s + 1) x ``rope.scaling.attn_factor``. ``longrope`` without
    factor tensors runs as plain RoPE.
    """
    theta = keys.get("rope.freq_base", 10000.0)
    kind = keys.get("rope.scaling.type", "none")
    if keys.get("rope_freqs") == "llama3" and kind == "none":
        return {"kind": "llama3", "theta": float(theta)}
    if kind == "linear":
        return describe("linear", theta, factor=keys["rope.scaling.factor"])
    if kind == "yarn":
        factor = float(keys["rope.scaling.factor"])
        attn = keys.get("rope.scaling.attn_factor")
        return describe(
            "yarn",
            theta,
            factor=factor,
            original=keys["rope.scaling.original_context_length"],
            beta_fast=32.0,
            beta_slow=1.0,
            attention_factor=None if attn is None else attn * yarn_mscale(factor),
        )
    return describe("default", theta)


def per_layer_converter(model_type: str | None, rope_parameters: dict[str, Any]) -> tuple[str, str] | None:
    """``(verdict, why)``: llama.cpp 0.3.36's converter on per-layer-type rope parameters, where its source decides
    (``None``: no rule, the full-attention entry's rope would need the flat rules). Run on Gemma 3 and 4:
    tests/readers/test_llamacpp.py; LFM3 read from its source.

    - LFM3: no converter class (``conversion/lfm2.py`` has LFM2 only): refused.
    - Gemma 4: ``Gemma4Model.generate_extra_tensors`` asserts the full-attention rope type is ``proportional``
      (hf-posext's registered p-RoPE types: AssertionError, run in the reader matrix); ``proportional`` is not in
      the converter's scaling list ("Unknown RoPE type"), so a ``factor`` (PI) is dropped, while a base (NTK) is
      written.
    - Gemma 3: the converter writes the full-attention entry's rope and the sliding entry's base
      (``rope.freq_base_swa``); llama.cpp runs sliding layers unscaled (``rope_freq_scale_train_swa`` 1), so a
      scaling there is dropped. Otherwise the full-attention entry would need the flat rules: no verdict.
    """
    full = rope_parameters.get("full_attention") or {}
    sliding = rope_parameters.get("sliding_attention") or {}
    if model_type == "lfm3":
        return "refused", "llama.cpp 0.3.36's converter has no LFM3 (Lfm3ForCausalLM is not supported)"
    if model_type in ("gemma4_text", "gemma4"):
        if full.get("rope_type") != "proportional":
            return "refused", (
                f"the converter asserts Gemma 4's full-attention rope is proportional, not {full.get('rope_type')!r} "
                "(AssertionError)"
            )
        if float(full.get("factor", 1.0)) != 1.0:
            return "misread", "the converter drops proportional's factor ('Unknown RoPE type'): the unextended model"
        return "same", "proportional's base and partial rotary are written (rope.freq_base, rope_freqs)"
    if model_type in ("gemma3_text", "gemma3") and sliding.get("rope_type", "default") != "default":
        return "misread", f"llama.cpp runs Gemma 3's sliding layers unscaled: {sliding['rope_type']} is dropped there"
    return None


#: Rope types whose converter keys were run here through the real ``convert_hf_to_gguf.py`` (0.3.36):
#: tests/readers/test_llamacpp.py and tests/gguf/test_export.py (hf-posext's own types: its unknown-type rule).
RUN_IN_CONVERTER = ("default", "linear", "dynamic", "yarn", "longrope")
#: The advice for a static rope the converter writes wrong.
EXPORT_ADVICE = "`hf-posext gguf export` writes the GGUF rope llama.cpp reads"


def _converter_rope(subject: Subject) -> tuple[str, str]:
    """``(verdict, why)`` of llama.cpp 0.3.36 on the keys its converter writes for a one-rope config."""
    params, rope_type, method = subject.params, subject.rope_type, subject.method
    if method is not None and method_class(method).adds_weights:
        return "refused", f"the converter cannot map the weights {method} adds (its position table)"
    if rope_type in transformers5.custom_rope_types():
        return "misread", "the converter logs 'Unknown RoPE type' and writes plain RoPE"
    if rope_type == "dynamic":
        return "misread", "the converter drops dynamic scaling without a word: plain RoPE"
    if rope_type == "yarn" and params.get("truncate") is False:  # run here: the reader matrix
        return "misread", (
            "the converter drops truncate: false and llama.cpp rounds YaRN's ramp bounds (truncate: true); "
            + EXPORT_ADVICE
        )
    keys = gguf_rope_keys(subject.config.to_dict())
    status, how = engine_verdict(
        lambda: effective_rope(keys), intended_rope(params), int(keys.get("context_length", 0)), subject.context, "-c"
    )
    if status == "misread":  # a static rope the converter writes under keys llama.cpp 0.3.36 does not read
        how += f"; {EXPORT_ADVICE}"
    return status, how


def _converter(subject: Subject) -> Finding:
    """The converter route: ``convert_hf_to_gguf.py``, then llama.cpp on its keys."""
    from ..gguf.rope import ARCHITECTURES, MODEL_TYPES  # gguf.rope loads transformers' models: ~4 s not at import

    config = subject.config
    if subject.situation == "layered":
        by_source = per_layer_converter(getattr(config, "model_type", None), subject.params)
        if by_source is None:
            return READER.one_rope_only(subject)
        return READER.finding(*by_source, "run here")  # tests/readers/test_llamacpp.py
    if MODEL_TYPES.get(getattr(config, "model_type", None)) is None:
        return READER.finding(
            NO_RULE,
            f"model_type {config.model_type!r}: these rules cover the "
            f"{', '.join(ARCHITECTURES)} GGUF graphs (model types {', '.join(sorted(MODEL_TYPES))})",
        )
    ran = subject.rope_type in RUN_IN_CONVERTER or subject.rope_type in transformers5.custom_rope_types()
    return READER.finding(*_converter_rope(subject), "run here" if ran else "read from source")


def _export(subject: Subject) -> Finding:
    """The ``hf-posext gguf export`` route (the rope it writes, or why it refuses), then llama.cpp."""
    from ..gguf.rope import MODEL_TYPES, gguf_rope_for  # as in _converter: not at `import hf_posext`

    config = subject.config
    if subject.situation == "damaged":
        why = f"refuses config.json's {subject.fields} (hf-posext writes no GGUF of a damaged config)"
        return EXPORT.finding("refused", why)
    if MODEL_TYPES.get(getattr(config, "model_type", None)) is None:
        why = f"model_type {config.model_type!r}: the export writes the rope of {', '.join(sorted(MODEL_TYPES))}"
        return EXPORT.finding("refused", f"{why} checkpoints only")
    try:
        rope = gguf_rope_for(config, MODEL_TYPES[config.model_type])
    except ValueError as error:
        return EXPORT.finding("refused", str(error))
    what = (
        "plain RoPE"
        if rope.scaling_type == "none" and rope.rope_freqs is None
        else ("a rope_freqs tensor" if rope.rope_freqs is not None else f"{rope.scaling_type} x{rope.factor:g}")
    )
    return EXPORT.finding("same", f"writes {what} with context_length {rope.context_length}, as llama.cpp reads it")


def _damaged(subject: Subject) -> Finding:
    """The converter on a damaged config.json runs a number as written (a misread) and fails on a value that is no
    number (run here: the reader matrix)."""
    values = [subject.value_at(check["field"]) for check in subject.damaged]
    if any(v is not None and not isinstance(v, (int, float)) for v in values):
        why = f"config.json's {subject.fields}: the converter fails on a value that is no number"
        return READER.finding("refused", why, "run here")
    why = (
        f"config.json's {subject.fields}: the converter writes the value as written (or what it guesses for a "
        "missing one): not the model meant"
    )
    return READER.finding("misread", why, "run here")


def _judge(subject: Subject) -> Finding:
    """llama.cpp through either route: ``same`` where the converter alone gives the model, else the converter's
    verdict, saying whether `hf-posext gguf export` gives it."""
    if subject.situation == "unreadable":
        return READER.finding(NO_RULE, "not evaluated: transformers 5 cannot read the config")
    converter = _damaged(subject) if subject.situation == "damaged" else _converter(subject)
    export = _export(subject)
    if subject.only_hf_posext is not None:  # run here for LongRoPE factors_by="query": the reader matrix
        converter, export = (
            replace(route, verdict="misread", why=subject.only_hf_posext) if route.verdict == "same" else route
            for route in (converter, export)
        )
    routes = {"converter": converter, "gguf_export": export}
    if converter.verdict == "same":
        why = converter.why
    elif export.verdict == "same":
        why = f"only through `hf-posext gguf export` ({export.why}); the converter alone: {converter.why}"
    else:
        why = f"converter alone: {converter.why}; `hf-posext gguf export`: {export.why}"
    return READER.finding(converter.verdict, why, converter.checked, routes)


#: llama.cpp 0.3.36, through its converter; the `EXPORT` route is a reader's own.
READER = Reader(
    "llamacpp",
    "llama.cpp",
    "convert_hf_to_gguf.py of llama-cpp-python 0.3.36 (run here for rope types "
    f"{', '.join(RUN_IN_CONVERTER)} and hf-posext's own: tests/readers/test_llamacpp.py; read from its source "
    "otherwise) and llama.cpp 0.3.36 on its keys (run and measured: tests/gguf/test_export.py)",
    "run here",
    _judge,
)
#: ``hf-posext gguf export``, then llama.cpp 0.3.36 on the GGUF it writes.
EXPORT = Reader(
    "gguf_export",
    "llama.cpp via `hf-posext gguf export`",
    "hf-posext gguf export, then llama.cpp 0.3.36 (run and compared: tests/gguf/test_export.py)",
    "run here",
    _export,
)
