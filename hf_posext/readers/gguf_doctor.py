"""``hf-posext doctor`` on a GGUF file: llama.cpp reads its keys directly, transformers converts it.

The same `hf_posext.readers.reader.Finding` per reader as for a config.json; a file whose rope keys or
sizes are damaged (`hf_posext.validation.config_damage.gguf_damage`) gets `diagnose_damaged_gguf`.
"""

from __future__ import annotations

from typing import Any

import transformers

from ..gguf.rope import ARCHITECTURES, ROPE_FREQS_ARCHITECTURES
from .reader import NO_RULE, Finding
from .registry import reader

#: What transformers 5 reads of a GGUF file's rope (``integrations/ggml.py``'s config mapping, 5.25.0:
#: ``context_length`` and ``rope.freq_base`` for llama, qwen2, qwen3; ``rope.scaling.*`` for gpt-oss only).
GGUF_TRANSFORMERS = (
    "transformers {version}'s GGUF loader (integrations/ggml.py; run here: tests/readers/test_doctor.py)"
)
#: GGUF keys the converter writes that llama.cpp 0.3.36 does not read for these graphs, and their defaults.
GGUF_UNREAD = {
    "rope.scaling.yarn_attn_factor": None,
    "rope.scaling.yarn_beta_fast": 32.0,
    "rope.scaling.yarn_beta_slow": 1.0,
}


def diagnose_gguf(arch: str, rope: Any, keys: dict[str, Any]) -> dict[str, Any]:
    """Every reader's `Finding` for a GGUF file: llama.cpp reads it directly, transformers converts it.

    Args:
        arch: ``general.architecture``.
        rope: the file's `hf_posext.gguf.rope.GGUFRope` (as llama.cpp reads it).
        keys: the file's ``{arch}.rope.*`` keys without the prefix.
    """
    scaled = (rope.scaling_type in ("linear", "yarn") and rope.factor > 1) or rope.rope_freqs is not None
    scaled = scaled or rope.attn_factor != 1.0 or rope.scaling_type == "longrope"
    what = f"{rope.scaling_type} x{rope.factor:g}" + (", a rope_freqs tensor" if rope.rope_freqs is not None else "")
    summary = {
        "architecture": arch,
        "context_length": rope.context_length,
        "freq_base": rope.freq_base,
        "scaling": what if scaled else "none",
    }
    checks: list[dict[str, str]] = []
    rules = GGUF_TRANSFORMERS.format(version=transformers.__version__)
    if scaled:
        why = (
            "transformers' GGUF loader maps context_length and rope.freq_base only: plain RoPE, the file's "
            f"{what} dropped; hf-posext's GGUF source converts through it (the same)"
        )
        t5 = Finding("misread", why, rules, "run here")
    else:
        t5 = Finding("same", "plain RoPE: transformers maps context_length and rope.freq_base", rules, "run here")
    readers = {"transformers5": t5, "transformers5_hf_posext": t5}
    for key in ("transformers4", "vllm", "sglang"):
        readers[key] = reader(key).finding(NO_RULE, "not checked for GGUF files (these rules read config.json)")
    if arch not in ARCHITECTURES:
        readers["llamacpp"] = reader("llamacpp").finding(
            NO_RULE, f"GGUF architecture {arch!r}: these rules cover the {', '.join(ARCHITECTURES)} graphs"
        )
        return {"rope": summary, "checks": checks, "readers": {k: f.to_dict() for k, f in readers.items()}}
    unread = {k: v for k, v in keys.items() if k in GGUF_UNREAD and v != GGUF_UNREAD[k]}
    rules = "llama.cpp 0.3.36 (what it reads, measured: tests/gguf/test_export.py, docs/readers/llamacpp.md)"
    if rope.scaling_type == "longrope" and rope.rope_freqs is None:
        llama = Finding(
            "misread", "rope.scaling.type longrope without factor tensors: llama.cpp runs plain RoPE", rules, "run here"
        )
    elif rope.rope_freqs is not None and arch not in ROPE_FREQS_ARCHITECTURES:
        llama = Finding(
            "refused",
            f"a rope_freqs tensor, which llama.cpp's {arch} graph does not load (wrong tensor count)",
            rules,
            "read from source",
        )
    elif unread and rope.scaling_type == "yarn":
        llama = Finding(
            "misread",
            f"llama.cpp does not read {', '.join(sorted(unread))} for {arch}: it runs betas "
            "32/1 and the attention factor (0.1 ln s + 1) x rope.scaling.attn_factor",
            rules,
            "run here",
        )
    elif rope.scaling_type not in ("none", "linear", "yarn"):
        llama = Finding(
            NO_RULE, f"rope.scaling.type {rope.scaling_type!r}: not one these rules cover", rules, "read from source"
        )
    else:
        llama = Finding(
            "same",
            f"llama.cpp runs the file's rope ({what if scaled else 'plain RoPE'}), default "
            f"context {rope.context_length}",
            rules,
            "run here",
        )
    readers["llamacpp"] = llama
    return {"rope": summary, "checks": checks, "readers": {k: f.to_dict() for k, f in readers.items()}}


def diagnose_damaged_gguf(arch: str, damaged: list[dict[str, str]]) -> dict[str, Any]:
    """The readers of a GGUF file whose rope keys or sizes are damaged or missing (``damaged``:
    `hf_posext.validation.config_damage.gguf_damage`'s checks): no reader runs the model meant, so none is
    ``same``."""
    fields = ", ".join(c["field"] for c in damaged)
    why = f"the file's {fields}: it runs the value as written or fails; either way not the model meant"
    rules = GGUF_TRANSFORMERS.format(version=transformers.__version__)
    t5 = Finding("misread", why, rules, "read from source")
    readers = {"transformers5": t5, "transformers5_hf_posext": t5}
    for key in ("transformers4", "vllm", "sglang"):
        readers[key] = reader(key).finding(NO_RULE, "not checked for GGUF files (these rules read config.json)")
    rules = "llama.cpp 0.3.36 (what it reads, measured: tests/gguf/test_export.py, docs/readers/llamacpp.md)"
    readers["llamacpp"] = Finding("misread", why, rules, "read from source")
    return {
        "rope": {"architecture": arch},
        "checks": damaged,
        "readers": {k: f.to_dict() for k, f in readers.items()},
    }
