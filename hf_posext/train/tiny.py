"""Tiny local checkpoints (config + random weights + byte tokenizer) for laptop and CI runs.

Nothing can be downloaded here, so smoke runs of the fine-tune recipe start from a checkpoint
folder written by :func:`make_tiny_model`; it loads through ``AutoModelForCausalLM`` and
``AutoTokenizer`` exactly like a Hub model::

    python scripts/make_tiny_model.py out/tiny-llama            # ~0.2M parameters, 128-token context
    python scripts/finetune.py --config examples/finetune_tiny.yaml
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ..files import atomic_directory
from .tokenizer import BOS_ID, BYTE_VOCAB_SIZE, EOS_ID, PAD_ID, byte_tokenizer

#: Architectures :func:`make_tiny_model` can build (the ones hf-posext supports).
TINY_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")

#: The byte vocabulary padded to a multiple of 8. Padding is the usual habit for fast matmuls,
#: and it is needed here: ``AutoTokenizer`` loads a qwen2 checkpoint's tokenizer as
#: ``Qwen2Tokenizer``, which adds ``<|endoftext|>`` (id 259) to any vocabulary.
TINY_VOCAB_SIZE = -(-(BYTE_VOCAB_SIZE + 1) // 8) * 8


def make_tiny_model(
    output_dir: str | os.PathLike,
    arch: str = "llama",
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_position_embeddings: int = 128,
    rope_theta: float = 10_000.0,
    seed: int = 0,
) -> Path:
    """Write a randomly initialised ``arch`` model and the byte tokenizer to ``output_dir``.

    Args:
        output_dir: the checkpoint folder, written atomically (replaced if it exists).
        arch: one of :data:`TINY_ARCHITECTURES`.
        hidden_size: model width; the head size is ``hidden_size // num_heads``.
        num_layers: decoder layers.
        num_heads: query heads; must divide ``hidden_size``.
        num_kv_heads: key/value heads (grouped-query attention); must divide ``num_heads``.
        max_position_embeddings: the pretraining context ``L_orig`` the checkpoint advertises.
        rope_theta: RoPE base.
        seed: ``torch`` seed of the weight initialisation.

    Returns:
        ``output_dir`` as a Path.

    Raises:
        ValueError: an unknown architecture or inconsistent head counts.
    """
    if arch not in TINY_ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {', '.join(TINY_ARCHITECTURES)}")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads={num_heads} must divide hidden_size={hidden_size} and num_kv_heads={num_kv_heads} "
            "must divide num_heads"
        )
    config = AutoConfig.for_model(
        arch,
        vocab_size=TINY_VOCAB_SIZE,
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
    )
    if arch == "mistral":
        config.sliding_window = None  # full attention, like Llama: the window is not under test here
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with atomic_directory(output_dir) as tmp:
        model.save_pretrained(tmp)
        byte_tokenizer().save_pretrained(tmp)
    return Path(output_dir)
