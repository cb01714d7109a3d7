"""The rope fields of released checkpoints' config.json, the examples ``hf-posext doctor``'s rules are checked on.

Each entry is what the checkpoint ships (its rope fields and ``max_position_embeddings``; LongRoPE's factor
lists have Phi-3's length, 48 pairs, with values made up here); `shipped_config_json` gives it a tiny
attention shape so that it loads, and a model from it runs, in seconds (tests/readers/, the README's table).
"""

from __future__ import annotations

from typing import Any

#: Name -> the config.json fields a released checkpoint ships.
SHIPPED: dict[str, dict[str, Any]] = {
    "Llama 3.1 (`llama3`)": {
        "model_type": "llama",
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
    },
    "Qwen2.5 with YaRN (`yarn`, as its model card adds it)": {
        "model_type": "qwen2",
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
    },
    "Phi-3 mini 128k (`longrope`)": {
        "model_type": "phi3",
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "type": "longrope",
            "short_factor": [1.0 + 0.01 * i for i in range(48)],
            "long_factor": [1.0 + 0.5 * i for i in range(48)],
        },
    },
    "vicuna-13b-v1.5-16k (`linear`)": {
        "model_type": "llama",
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {"factor": 4.0, "type": "linear"},
    },
    "dynamic NTK in `rope_scaling`": {
        "model_type": "llama",
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {"factor": 2.0, "type": "dynamic"},
    },
    "a plain model (no rope fields)": {"model_type": "llama", "max_position_embeddings": 4096},
    "YaRN saved by transformers 5 alone (`rope_parameters` only)": {
        "model_type": "llama",
        "max_position_embeddings": 16384,
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 4096,
            "rope_theta": 10000.0,
        },
    },
}


def shipped_config_json(name: str, heads: int = 2, layers: int = 1, vocab_size: int = 97) -> dict[str, Any]:
    """`SHIPPED`'s ``name`` with a tiny attention shape (Phi-3's head size, 96, keeps its 48 factor pairs).

    Raises:
        ValueError: an unknown name, naming the known ones.
    """
    if name not in SHIPPED:
        raise ValueError(f"no shipped config {name!r}; the known ones: {', '.join(SHIPPED)}")
    head_dim = 96 if SHIPPED[name]["model_type"] == "phi3" else 32
    shape = {
        "hidden_size": heads * head_dim,
        "intermediate_size": 2 * heads * head_dim,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "num_hidden_layers": layers,
        "vocab_size": vocab_size,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": None,
    }
    return {**shape, **SHIPPED[name]}
