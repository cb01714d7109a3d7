"""The rope of a GGUF file as llama.cpp runs it, and the GGUF rope that runs a transformers config.

`GGUFRope` holds the fields llama.cpp's loader reads (llama-cpp-python 0.3.36's
``vendor/llama.cpp``: ``llama_model::load_hparams``, ``llama_context``'s constructor and ggml's
``rope_yarn``; re-written from them, copied from no file). `gguf_rope_for` turns a
transformers config (patched by hf-posext or not) into the `GGUFRope` that makes llama.cpp
rotate queries and keys as transformers does; `rope_config_of` reads a `GGUFRope`
back as the config a method composes on. What llama.cpp reads, measured, is in
``docs/readers/llamacpp.md``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from transformers import LlamaConfig, PreTrainedConfig, Qwen2Config, Qwen3Config

from .. import integration
from ..rope_utils import (
    DYNAMIC_YARN_ROPE_TYPE,
    LONGROPE_KEEP_FIRST_ROPE_TYPE,
    NO_ROPE_TYPE,
    default_inv_freq,
    rotary_dim_of,
    yarn_mscale,
)

#: GGUF architectures whose rope llama.cpp applies as transformers' Llama/Qwen2/Qwen3 do (one
#: rotation per pair, theta^(-2i/d) / factor_i). Mistral 7B, SmolLM2, Llama 2/3 GGUFs are ``llama``.
ARCHITECTURES: dict[str, type[PreTrainedConfig]] = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}
#: transformers model types and the GGUF architecture llama.cpp's converter gives them.
MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
#: The architectures whose llama.cpp graph loads a ``rope_freqs`` tensor (per-pair divisors):
#: only these run a per-pair scaling (llama3, a composition, YaRN with other betas). llama.cpp's
#: qwen2 and qwen3 graphs have none, and refuse a file that carries one (wrong tensor count).
ROPE_FREQS_ARCHITECTURES = ("llama",)
#: The tensor of per-pair divisors, ``[rotary_dim // 2]`` F32.
ROPE_FREQS = "rope_freqs.weight"

#: What llama.cpp runs instead of a method hf-posext cannot write into a GGUF.
REFUSED_METHODS = {
    "dynamic_ntk": "llama.cpp has no dynamic scaling (GGUF rope types: none, linear, yarn); use --method ntk",
    "dynamic_yarn": "llama.cpp has no dynamic scaling (GGUF rope types: none, linear, yarn); use --method yarn",
    "alibi": "llama.cpp applies ALiBi only to the architectures trained with it (bloom, mpt, ...), never to a "
    "rotary model; use --method yarn",
    "sinusoidal": "llama.cpp has no position table for a rotary architecture; use --method yarn",
    "learned": "llama.cpp has no position table for a rotary architecture; use --method yarn",
    "self_extend": "Self-Extend's grouped attention is a run-time option in llama.cpp, not a file field: run the "
    "unchanged GGUF with llama-completion --grp-attn-n G --grp-attn-w W",
    "dca": "llama.cpp has no dual-chunk attention; its nearest run-time option is llama-completion's grouped "
    "attention (--grp-attn-n G --grp-attn-w W), or write a static method (--method yarn)",
    "string": "llama.cpp has no STRING (positions shifted inside attention, not a file field); run the unchanged GGUF",
    "rerope": "llama.cpp has no ReRoPE (positions capped inside attention, not a file field); its nearest run-time "
    "option is llama-completion's grouped attention (--grp-attn-n G --grp-attn-w W), or write a static "
    "method (--method yarn)",
}


@dataclass(frozen=True)
class GGUFRope:
    """The rope fields of a GGUF file, as llama.cpp 0.3.36 reads them (keys without ``{arch}.``).

    Attributes:
        freq_base: ``rope.freq_base``, theta.
        context_length: ``context_length``: llama.cpp's default context and its YaRN L0 when
            ``original_context_length`` is absent.
        scaling_type: ``rope.scaling.type``: ``none``, ``linear`` or ``yarn`` (``longrope``:
            factor tensors, which Llama and Qwen2 GGUFs do not have: plain RoPE).
        factor: ``rope.scaling.factor``; llama.cpp divides frequencies by it for linear and yarn.
        original_context_length: ``rope.scaling.original_context_length``, YaRN's L_orig; for
            linear the L0 its factor multiplies (llama.cpp's linear does not read it).
        attn_factor: ``rope.scaling.attn_factor``, multiplied into cos and sin. For yarn llama.cpp
            multiplies in 0.1 ln(s) + 1 itself, so a YaRN attention factor a is written as
            a / (0.1 ln s + 1). (``rope.scaling.yarn_attn_factor``, which the converter writes, and
            ``yarn_beta_fast/slow`` are not read for these architectures.)
        rope_freqs: the ``rope_freqs`` tensor: per-pair divisors of theta^(-2i/d), or ``None``.
    """

    freq_base: float
    context_length: int
    scaling_type: str = "none"
    factor: float = 1.0
    original_context_length: int | None = None
    attn_factor: float = 1.0
    rope_freqs: tuple[float, ...] | None = None

    def keys(self) -> dict[str, Any]:
        """The metadata keys (without ``{arch}.``) to write, each with a Python value."""
        keys: dict[str, Any] = {
            "context_length": int(self.context_length),
            "rope.freq_base": float(self.freq_base),
            "rope.scaling.type": self.scaling_type,
        }
        if self.scaling_type in ("linear", "yarn"):
            keys["rope.scaling.factor"] = float(self.factor)
        if self.original_context_length is not None:
            keys["rope.scaling.original_context_length"] = int(self.original_context_length)
        if self.attn_factor != 1.0:
            keys["rope.scaling.attn_factor"] = float(self.attn_factor)
        return keys


def _refusal(rope_type: str, method: str | None) -> str | None:
    if method in REFUSED_METHODS:
        return REFUSED_METHODS[method]
    if rope_type == "dynamic":
        return REFUSED_METHODS["dynamic_ntk"]
    if rope_type == DYNAMIC_YARN_ROPE_TYPE:
        return REFUSED_METHODS["dynamic_yarn"]
    if rope_type == NO_ROPE_TYPE:
        return REFUSED_METHODS["alibi"]
    if rope_type == LONGROPE_KEEP_FIRST_ROPE_TYPE:
        return (
            "longrope with keep_first has no GGUF form: llama.cpp has no position-dependent rope (its first "
            "positions on plain RoPE, the others with the long factors); export longrope without keep_first"
        )
    return None


def reach_of(config: PreTrainedConfig) -> int:
    """The context a config runs: an hf-posext patch's ``context_length``, else by its rope type.

    linear keeps ``max_position_embeddings`` at L0 (vicuna-13b-v1.5-16k), so it reaches
    factor x that; yarn, llama3 and longrope reach factor x their original context (Qwen2.5 keeps
    ``max_position_embeddings`` at the original).
    """
    record = getattr(config, "hf_posext", None) or {}
    if record.get("context_length"):
        return int(record["context_length"])
    params, max_positions = config.rope_parameters, int(config.max_position_embeddings)
    factor = float(params.get("factor") or 1.0)
    if params.get("rope_type") == "linear":
        return round(max_positions * factor)
    original = params.get("original_max_position_embeddings")
    return max(max_positions, round(factor * int(original))) if original else max_positions


def _rope_init(config: PreTrainedConfig, reach: int) -> tuple[torch.Tensor, float]:
    """transformers' own (inv_freq, attention_factor) for ``config`` at length ``reach``."""
    probe = copy.deepcopy(config)
    return integration.rope_init_function(probe.rope_parameters["rope_type"])(probe, "cpu", seq_len=reach)


def _default_yarn(params: dict[str, Any]) -> bool:
    """Whether llama.cpp's own YaRN runs these parameters: it reads no betas, no ``truncate``, no mscale."""
    return (
        float(params.get("beta_fast", 32.0)) == 32.0
        and float(params.get("beta_slow", 1.0)) == 1.0
        and params.get("truncate", True) is True
        and not any(params.get(k) for k in ("mscale", "mscale_all_dim", "extrapolation_factor"))
    )


def gguf_rope_for(config: PreTrainedConfig, arch: str) -> GGUFRope:
    """The GGUF rope with which llama.cpp runs ``config``'s rope as transformers does.

    plain and NTK (a raised theta): ``none``; linear: ``linear``; YaRN with the default ramp:
    ``yarn`` with its attention factor corrected for llama.cpp's own mscale; every other static
    scaling (llama3, a composition saved as ``longrope``, YaRN with other betas): a ``rope_freqs``
    tensor of per-pair divisors plus ``attn_factor``. ``context_length`` is the reach.

    Args:
        config: a transformers config with flat ``rope_parameters``.
        arch: the GGUF architecture (``general.architecture``).

    Raises:
        ValueError: an architecture outside `ARCHITECTURES`, a dynamic or attention-level
            method (the message names what llama.cpp does run), a per-pair scaling on an
            architecture without ``rope_freqs``, per-layer-type rope parameters.
    """
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported: hf-posext writes the rope of "
            f"{', '.join(ARCHITECTURES)} GGUFs, whose rope llama.cpp applies as transformers does"
        )
    params = dict(config.rope_parameters or {})
    if "rope_type" not in params and "rope_theta" not in params:
        raise ValueError(f"per-layer-type rope parameters ({sorted(params)}) have no single GGUF rope")
    rope_type = params.get("rope_type", "default")
    method = (getattr(config, "hf_posext", None) or {}).get("method")
    refusal = _refusal(rope_type, method)
    if refusal is not None:
        raise ValueError(f"{method or rope_type} cannot be written into a GGUF: {refusal}")
    theta, reach = float(params["rope_theta"]), reach_of(config)
    if rope_type == "default":
        return GGUFRope(theta, reach)
    if rope_type == "linear":  # original_context_length: the L0 that factor multiplies (llama.cpp's linear ignores it)
        factor = float(params["factor"])
        return GGUFRope(theta, reach, "linear", factor, round(reach / factor))
    if rope_type not in ("yarn", "llama3", "longrope"):
        raise ValueError(
            f"rope_type {rope_type!r} has no GGUF form; static types written: default, linear, yarn, llama3, longrope"
        )
    inv_freq, attention = _rope_init(config, reach)
    if rope_type == "yarn" and _default_yarn(params):
        factor = float(params["factor"])
        return GGUFRope(
            theta,
            reach,
            "yarn",
            factor,
            int(params["original_max_position_embeddings"]),
            float(attention) / yarn_mscale(factor),
        )
    if arch not in ROPE_FREQS_ARCHITECTURES:
        raise ValueError(
            f"{rope_type} {'with beta_fast/beta_slow/truncate other than 32/1/True ' if rope_type == 'yarn' else ''}"
            f"is a per-pair scaling, which llama.cpp runs only through a rope_freqs tensor, and its {arch!r} graph "
            f"loads none (it does for: {', '.join(ROPE_FREQS_ARCHITECTURES)}); write linear, ntk or yarn with "
            "default betas instead"
        )
    rotary_dim = rotary_dim_of(config, params)
    if rope_type == "longrope":  # the divisors are written down: take them exactly
        kind = "long_factor" if reach > int(params["original_max_position_embeddings"]) else "short_factor"
        divisors = [float(c) for c in params[kind]]
    else:
        divisors = (default_inv_freq(theta, rotary_dim).double() / inv_freq.double()).tolist()
    return GGUFRope(theta, reach, "none", attn_factor=float(attention), rope_freqs=tuple(divisors))


def rope_config_of(
    rope: GGUFRope,
    arch: str,
    head_count: int,
    head_count_kv: int,
    embedding_length: int,
    head_dim: int,
    rotary_dim: int,
) -> PreTrainedConfig:
    """The transformers config whose rope is what llama.cpp runs for ``rope`` (the base of a patch).

    A ``rope_freqs`` tensor or an attention factor outside YaRN becomes a ``longrope`` entry with
    equal short and long factors (one factor set at every length, as llama.cpp applies it).

    Raises:
        ValueError: an architecture outside `ARCHITECTURES`; a ``rope_freqs`` tensor together
            with yarn scaling; ``longrope`` without factor tensors (llama.cpp runs it as plain RoPE).
    """
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported: hf-posext patches {', '.join(ARCHITECTURES)} GGUFs"
        )
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": float(rope.freq_base)}
    if rotary_dim != head_dim:
        params["partial_rotary_factor"] = rotary_dim / head_dim
    kind, factor, max_positions = rope.scaling_type, float(rope.factor or 1.0), int(rope.context_length)
    if kind == "longrope":
        raise ValueError(
            "this GGUF says rope.scaling.type = longrope but has no factor tensors: llama.cpp runs it as "
            "plain RoPE. Re-export it from its HF checkpoint with `hf-posext gguf export`, or pass "
            "override=True (--override) to patch it as plain RoPE"
        )
    if kind not in ("none", "linear", "yarn"):
        raise ValueError(f"rope.scaling.type {kind!r} is not one llama.cpp's {arch} graph runs (none, linear, yarn)")
    if kind == "yarn" and rope.rope_freqs is not None:
        raise ValueError("a GGUF with both yarn scaling and a rope_freqs tensor is not supported as a base")
    if kind == "yarn" and factor > 1:
        original = int(rope.original_context_length or rope.context_length)
        params.update(rope_type="yarn", factor=factor, original_max_position_embeddings=original)
        if rope.attn_factor != 1.0:
            params["attention_factor"] = rope.attn_factor * yarn_mscale(factor)
    elif rope.rope_freqs is not None or rope.attn_factor != 1.0:
        pairs = rotary_dim // 2
        divisors = [float(c) for c in (rope.rope_freqs or [1.0] * pairs)]
        if len(divisors) != pairs:
            raise ValueError(f"rope_freqs has {len(divisors)} entries; the rotary dimension {rotary_dim} needs {pairs}")
        if kind == "linear":
            divisors = [c * factor for c in divisors]
        params.update(
            rope_type="longrope",
            short_factor=divisors,
            long_factor=list(divisors),
            factor=1.0,
            original_max_position_embeddings=int(rope.context_length),
            attention_factor=rope.attn_factor,
        )
    elif kind == "linear" and factor > 1:
        # transformers' convention: max_position_embeddings is the L0 that factor multiplies. The
        # converter writes it as context_length; hf-posext writes the reach there and L0 as the original.
        params.update(rope_type="linear", factor=factor)
        max_positions = int(rope.original_context_length or rope.context_length)
    return ARCHITECTURES[arch](
        vocab_size=8,
        hidden_size=embedding_length,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=head_count,
        num_key_value_heads=head_count_kv,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        rope_parameters=params,
    )
