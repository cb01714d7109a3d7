"""Tiny real transformers models built from configs (no network, milliseconds each)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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


def tiny_config(arch: str = "llama", head_dim: int = 32, heads: int = 4, kv_heads: int = 2, layers: int = 2,
                max_positions: int = 64, **overrides):
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


def tokens(length: int, batch: int = 1, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=generator)


def train_steps(model: PreTrainedModel, ids: torch.Tensor, steps: int = 10, lr: float = 1e-2) -> list[float]:
    """AdamW on the language-model loss of ``ids`` for ``steps`` steps; the losses, first to last."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = model(ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """One intra-op thread: tiny models gain nothing from more, and on a small shared CPU OpenMP
    threads contending for busy cores make their matmuls tens of times slower. It also keeps
    runs that are compared bit for bit (resumes, subprocesses) on the same reduction order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
