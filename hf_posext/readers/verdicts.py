"""Each reader's verdict on a saved config (`support`), and the warning naming the silent failures.

One module per reader (`transformers4`, `transformers5`, `vllm`, `sglang`,
`llamacpp`) holds its rules, re-written from its source; `support` applies them and
`engine_warning` names the readers that run a checkpoint wrong without an error. docs/readers/index.md.
"""

from __future__ import annotations

import sys
from typing import Any

from ..methods.registry import method_class
from ..methods.remapping import AttentionRemapMethod
from ..rope_utils import REMAP_ROPE_TYPE, rotary_dim_of
from ..validation.unknown_method import unknown_method
from . import llamacpp, sglang, transformers4, transformers5, vllm
from .rope import intended_rope

#: The readers, in the order of the README's compatibility table.
READERS = ("transformers 5", "transformers 4.57", "vLLM", "SGLang", "llama.cpp")

#: A reader's verdict: one of `STATUSES` and how it reads the checkpoint.
Verdict = tuple[str, str]
STATUSES = ("same", "misread", "refused")  # refused: an error names the rope type; misread: silently


def _runs(description: dict[str, Any], intended: dict[str, Any]) -> str:
    if description["kind"] == "default" and description["theta"] == intended["theta"]:
        return "plain RoPE: no scaling at any length"
    if description["kind"] == "default":
        return f"plain RoPE with one fixed base {description['theta']:.6g} at every length"
    extra = sorted(set(intended) ^ set(description))
    return f"{description['kind']} without/with {', '.join(extra)}" if extra else f"{description}"


def _engine_verdict(description: Any, intended: dict[str, Any], context: int, target: int, flag: str) -> Verdict:
    if isinstance(description, ValueError):
        return "refused", f"raises {description}"
    if description != intended:
        return "misread", _runs(description, intended)
    if context != target:
        return "same", f"rope right; its default context is {context}: pass {target} ({flag} {target})"
    return "same", f"context {context}"


def _rules(reader, *args):
    try:
        return reader(*args)
    except ValueError as error:
        return error


def support(config: Any, context: int) -> dict[str, Verdict]:
    """``{reader: (status, how)}`` for a patched ``config`` that reaches ``context`` tokens in transformers 5.

    Per-layer-type rope parameters (Gemma 3/4, LFM3): transformers 5 only, whose verdict is its rope types'; the
    other readers' rules compare one rope (``hf-posext doctor`` says so per reader).
    """
    params = config.rope_parameters
    if "rope_theta" not in params:
        types = sorted({entry.get("rope_type", "default") for entry in params.values() if isinstance(entry, dict)})
        custom = [rope_type for rope_type in types if rope_type in transformers5.custom_rope_types()]
        return {"transformers 5": transformers5.verdict(custom[0] if custom else types[0])}
    rope_type = params.get("rope_type", "default")
    intended = intended_rope(params)
    keys = llamacpp.gguf_rope_keys(config.to_dict())
    verdicts = {
        "transformers 5": transformers5.verdict(rope_type),
        "transformers 4.57": transformers4.verdict(rope_type),
        "vLLM": _engine_verdict(
            _rules(vllm.effective_rope, config), intended, vllm.max_model_len(config), context, "--max-model-len"
        ),
        "SGLang": _engine_verdict(
            _rules(sglang.effective_rope, config, rotary_dim_of(config)),
            intended,
            sglang.context_length(config),
            context,
            "--context-length",
        ),
    }
    # config.hf_posext is the patch record (patching.CONFIG_KEY; patching imports this package). A method
    # not registered here (a plugin not imported) is judged on its rope alone: doctor's check says so.
    record = getattr(config, "hf_posext", None)
    record = record if isinstance(record, dict) else {}
    method = None if unknown_method(record) else record.get("method")
    if method is not None and method_class(method).adds_weights:
        verdicts["llama.cpp"] = ("refused", f"the converter cannot map the weights {method} adds (its position table)")
    elif rope_type in transformers5.custom_rope_types():
        verdicts["llama.cpp"] = ("misread", "the converter logs 'Unknown RoPE type' and writes plain RoPE")
    elif rope_type == "dynamic":
        verdicts["llama.cpp"] = ("misread", "the converter drops dynamic scaling without a word: plain RoPE")
    elif rope_type == "yarn" and params.get("truncate") is False:  # run here: the reader matrix
        verdicts["llama.cpp"] = (
            "misread",
            "the converter drops truncate: false and llama.cpp rounds YaRN's ramp bounds (truncate: true); "
            "`hf-posext gguf export` writes the GGUF rope llama.cpp reads",
        )
    else:
        status, how = _engine_verdict(
            llamacpp.effective_rope(keys), intended, int(keys.get("context_length", 0)), context, "-c"
        )
        if status == "misread":  # a static rope the converter writes under keys llama.cpp 0.3.36 does not read
            how += "; `hf-posext gguf export` writes the GGUF rope llama.cpp reads"
        verdicts["llama.cpp"] = (status, how)
    if method is not None and issubclass(method_class(method), AttentionRemapMethod):
        verdicts.update(_remap_verdicts(config, method))
    if method == "longrope" and record.get("factors_by") == "query":
        verdicts.update(_per_query_verdicts(verdicts))
    if rope_type == "dynamic" and record.get("exact_cache"):
        verdicts["transformers 4.57"] = ("misread", WHOLE_SEQUENCE)
    return verdicts


#: What every reader but hf-posext runs for LongRoPE saved with ``factors_by="query"``.
PER_QUERY = (
    "past L_orig it applies the long factors to every position (transformers' longrope); factors_by='query' "
    "keeps the rows before L_orig on the short ones, which only hf-posext computes"
)
#: What transformers 4.57 and 5 without hf-posext run for a dynamic checkpoint saved with hf-posext's exact cache.
WHOLE_SEQUENCE = (
    "transformers' own dynamic NTK: frequencies from the whole sequence's length, at every position once it passes "
    "L_orig; this checkpoint's exact cache computes them per position, which only hf-posext does"
)


def _per_query_verdicts(verdicts: dict[str, Verdict]) -> dict[str, Verdict]:
    """LongRoPE with ``factors_by="query"``: hf-posext's own definition, under transformers' ``longrope`` entry.

    Every other reader of the entry applies the long factors to all positions of a sequence past L_orig
    (docs/methods/longrope.md), so a reader that reads the rope right computes another model past the switch.
    """
    changed: dict[str, Verdict] = {
        "transformers 5": ("same", f"after `import hf_posext`; without it, {PER_QUERY}"),
    }
    for reader, (status, _) in verdicts.items():
        if reader != "transformers 5" and status == "same":
            changed[reader] = ("misread", PER_QUERY)
    return changed


#: Model types whose vLLM model file reads ``dual_chunk_attention_config`` (vLLM main: qwen2.py,
#: qwen2_moe.py, qwen3.py, qwen3_moe.py).
VLLM_DUAL_CHUNK_MODEL_TYPES = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")


def _remap_verdicts(config: Any, method: str) -> dict[str, Verdict]:
    """Readers of a remapping method's checkpoint (docs/methods/training_free.md), beyond its rope type's verdicts.

    Its rope type (`hf_posext.rope_utils.REMAP_ROPE_TYPE`) is one only hf-posext registers,
    so the other readers refuse it as they refuse every custom type; vLLM's Qwen-family files take
    ``dual_chunk_attention_config`` before they look at the rope type.
    """
    verdicts: dict[str, Verdict] = {
        "transformers 5": (
            "same",
            "after `import hf_posext`; without it, from_pretrained refuses the "
            "attn_implementation config.json names, and with an explicit attn_implementation "
            f"building the model raises KeyError: {REMAP_ROPE_TYPE!r}",
        ),
    }
    if method == "dca" and getattr(config, "model_type", None) in VLLM_DUAL_CHUNK_MODEL_TYPES:
        verdicts["vLLM"] = (
            "same",
            "reads dual_chunk_attention_config before the rope type (get_rope's dual-chunk "
            "branch, DualChunkFlashAttention; plain-theta frequencies; not run here)",
        )
    return verdicts


def engine_warning(config: Any, context: int, method: str) -> str | None:
    """One warning naming the readers that would run ``config`` wrong without an error, or ``None``."""
    verdicts = support(config, context)
    wrong = [f"{reader} ({how})" for reader, (status, how) in verdicts.items() if status == "misread"]
    if not wrong:
        return None
    right = [reader for reader, (status, _) in verdicts.items() if status == "same"]
    text = (
        f"{method} checkpoints are read wrong, without an error, by: "
        + "; ".join(wrong)
        + f". Read as patched by: {', '.join(right)}."
    )
    static = method_class(method).static_equivalent
    if static is not None:
        text += f" To serve it with those engines, patch with the static equivalent --method {static} instead."
    return text


def print_engine_warning(config: Any, context: int, method: str, file: Any = None) -> None:
    """Print `engine_warning` as ``hf-posext: warning: ...`` to ``file`` (stderr), if there is one."""
    text = engine_warning(config, context, method)
    if text is not None:
        print(f"hf-posext: warning: {text}", file=file or sys.stderr)


__all__ = [
    "READERS",
    "STATUSES",
    "VLLM_DUAL_CHUNK_MODEL_TYPES",
    "Verdict",
    "engine_warning",
    "print_engine_warning",
    "support",
]
