"""Tiny real transformers models of four architectures, built from configs (no network, milliseconds each).

Shared by the tests (``tests.helpers.models`` re-exports them) and the benchmarks that build tiny cases
(benchmarks/llamacpp_gguf.py).
"""

from __future__ import annotations

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

ARCHITECTURES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
}

VOCAB = 97


def tiny_config(
    arch: str = "llama",
    head_dim: int = 32,
    heads: int = 4,
    kv_heads: int = 2,
    layers: int = 2,
    max_positions: int = 64,
    **overrides,
):
    """A 2-layer GQA config; ``head_dim`` is explicit where the architecture has the field."""
    config_cls, _ = ARCHITECTURES[arch]
    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=heads * head_dim,
        intermediate_size=2 * heads * head_dim,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        attn_implementation="eager",
    )
    if arch != "qwen2":
        kwargs["head_dim"] = head_dim
    if arch == "mistral":
        # A window shorter than the test sequences, so the sliding mask is really exercised.
        kwargs["sliding_window"] = 2 * max_positions
    kwargs.update(overrides)
    return config_cls(**kwargs)


def tiny_model(arch: str = "llama", seed: int = 0, **config_kwargs) -> PreTrainedModel:
    _, model_cls = ARCHITECTURES[arch]
    torch.manual_seed(seed)
    model = model_cls(tiny_config(arch, **config_kwargs)).eval()
    # Random init gives near-uniform attention, which hides position effects; sharpen q/k.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(4.0)
    return model
