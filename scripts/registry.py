"""Every causal LM in transformers' registry, built from a tiny config (no network, tens of ms each).

The candidates are the model types of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` whose default
config is a decoder's, is not composite (multimodal: patch the text model) and carries
``rope_parameters``. Each config's defaults are shrunk to the same tiny sizes; per-layer-type
models keep one layer of each layer type they declare.
"""

from __future__ import annotations

import copy
import functools

import torch
from transformers import PreTrainedModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

L_ORIG = 64
VOCAB = 97

#: Fields set wherever a config has them: 4 heads of 32 (2 KV heads), 2 layers, 4 experts, MLA ranks.
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=128,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    q_lora_rank=32,
    kv_lora_rank=32,
    qk_rope_head_dim=16,
    qk_nope_head_dim=16,
    v_head_dim=32,
    max_position_embeddings=L_ORIG,
    original_max_position_embeddings=L_ORIG,
    sliding_window=L_ORIG // 2,  # a window shorter than the test inputs, so that sliding masks matter
    vocab_size_per_layer_input=VOCAB,  # Gemma 3n/4's per-layer embeddings (262144 x 256 per layer by default)
    hidden_size_per_layer_input=16,
)
#: Scalings a checkpoint may ship; the tiny configs replace them with plain RoPE of the same theta
#: (composition on them is tested elsewhere; here the architecture is under test).
SHIPPED_SCALINGS = ("linear", "dynamic", "yarn", "llama3", "longrope")
#: Weights scaled by 4 so that attention is not near-uniform (which would hide position effects).
SHARPENED = ("q_proj.weight", "k_proj.weight", "qkv_proj.weight", "query_key_value.weight")


@functools.cache
def candidates() -> tuple[str, ...]:
    """Registry model types whose default config is a non-composite decoder with rope parameters."""
    found = []
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        try:
            config = CONFIG_MAPPING[model_type]()
        except Exception:  # a config class with required arguments: not buildable from defaults
            continue
        if getattr(config, "is_encoder_decoder", False) or getattr(config, "sub_configs", None):
            continue
        if getattr(config, "rope_parameters", None):
            found.append(model_type)
    return tuple(found)


def tiny_config(model_type: str, layers: int = 2, **overrides):
    default = CONFIG_MAPPING[model_type]()
    kwargs = {key: value for key, value in TINY.items() if _has(default, key)}
    if "head_dim" in (default.per_layer_attributes or ()):
        # Gemma 4: full-attention layers have their own head_dim (global_head_dim), twice the sliding one here
        kwargs["global_head_dim"] = 2 * TINY["head_dim"]
    if hasattr(default, "qk_rope_head_dim"):
        # MLA: the rotary head dim is qk_rope_head_dim, and keys have as many heads as queries
        kwargs.pop("head_dim", None)
        kwargs["num_key_value_heads"] = kwargs["num_attention_heads"]
    layer_types = getattr(default, "layer_types", None)
    if layer_types:
        distinct = list(dict.fromkeys(layer_types))
        kwargs["layer_types"] = (distinct * layers)[: max(layers, len(distinct))]
        kwargs["num_hidden_layers"] = len(kwargs["layer_types"])
    else:
        kwargs["num_hidden_layers"] = layers
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(default, key, None)
        if isinstance(value, int) and value >= VOCAB or isinstance(value, list):
            kwargs[key] = 1
    kwargs["attn_implementation"] = "eager"
    if "rope_parameters" not in overrides:
        kwargs["rope_parameters"] = plain_rope(default)
    kwargs.update(overrides)
    return CONFIG_MAPPING[model_type](**kwargs)


def _has(config, key: str) -> bool:
    """Whether ``config`` has ``key``, global or per layer (reading a per-layer one globally raises)."""
    return key in (config.per_layer_attributes or ()) or hasattr(config, key)


def plain_rope(config) -> dict:
    """``config.rope_parameters`` with each shipped scaling replaced by plain RoPE of the same theta."""
    params = copy.deepcopy(config.rope_parameters)
    keys = config.nested_rope_parameter_keys(params)
    for entry in [params[key] for key in keys if params[key] is not None] if keys else [params]:
        if entry.get("rope_type", entry.get("type")) in SHIPPED_SCALINGS:
            kept = {k: entry[k] for k in ("rope_theta", "partial_rotary_factor") if k in entry}
            entry.clear()
            entry.update(rope_type="default", **kept)
    return params


def model_class(config) -> type[PreTrainedModel]:
    return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]


def build(config, seed: int = 0) -> PreTrainedModel:
    torch.manual_seed(seed)
    model = model_class(config)(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(SHARPENED):
                param.mul_(4.0)
    return model


def tiny_model(model_type: str, seed: int = 0, **overrides) -> PreTrainedModel:
    return build(tiny_config(model_type, **overrides), seed)
