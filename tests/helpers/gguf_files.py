"""Small GGUF files written by the gguf package: the tiny config's attention shape, a Q4_1 tensor, chosen keys."""

from __future__ import annotations

from hf_posext.gguf.writer import open_gguf

L_ORIG = 64
HEAD_DIM = 32
#: A shipped llama3 scaling over the tiny context (reaching L_ORIG from L_ORIG / 4): what the tests compose on.
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": L_ORIG // 4,
}


def write_tiny_gguf(
    path, arch="llama", rope_freqs=None, freq_base=10000.0, heads=True, layers=True, context=L_ORIG, **keys
):
    """A GGUF with the attention shape of tests/helpers/models.py's tiny config, one F32 and one Q4_1 tensor.

    ``heads=False`` leaves out the head counts, ``layers=False`` the one layer's tensor (``blk.0.*``).
    """
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(path, arch)
    writer.add_context_length(context)
    writer.add_embedding_length(4 * HEAD_DIM)
    writer.add_block_count(1)
    if heads:
        writer.add_head_count(4)
        writer.add_head_count_kv(2)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(freq_base)
    writer.add_string("general.name", "tiny")
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    for key, value in keys.items():
        writer.add_key_value(
            f"{arch}.{key}", value, gguf.GGUFValueType.STRING if isinstance(value, str) else gguf.GGUFValueType.FLOAT32
        )
    writer.add_tensor("token_embd.weight", np.arange(3 * 8, dtype=np.float32).reshape(3, 8))
    # 2 blocks of Q4_1 (20 bytes each: fp16 scale, fp16 min, 16 bytes of nibbles) = 64 weights
    raw = np.random.default_rng(0).integers(0, 255, (2, 40), dtype=np.uint8)
    if layers:
        writer.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def fields(path):
    return {name: field.contents() for name, field in open_gguf(path).fields.items() if not name.startswith("GGUF.")}


def _interleave(weight, heads):
    """llama.cpp's order of a Llama q/k projection: transformers' GGUF reader undoes it on load."""
    pairs = weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
    return pairs.swapaxes(1, 2).reshape(weight.shape)


def write_model_gguf(path, model, **keys):
    """A whole GGUF of a tiny Llama (tests/helpers/models.py, untied): F32 tensors, a 97-token byte-level vocabulary.

    transformers' GGUF reader loads it as ``model`` (logits within float rounding); ``keys`` (without ``llama.``)
    are written as given (strings as strings, numbers as F32).
    """
    import gguf
    import numpy as np

    config = model.config
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([chr(0x100 + i) for i in range(config.vocab_size)])
    writer.add_token_types([1] * config.vocab_size)
    writer.add_token_scores([0.0] * config.vocab_size)
    writer.add_token_merges([])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    rope_freqs = keys.pop("rope_freqs", None)
    for key, value in keys.items():
        kind = gguf.GGUFValueType.STRING if isinstance(value, str) else gguf.GGUFValueType.FLOAT32
        writer.add_key_value(f"llama.{key}", value, kind)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, dtype=np.float32))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        array = tensor.detach().float().numpy()
        if name.endswith("q_proj.weight"):
            array = _interleave(array, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            array = _interleave(array, config.num_key_value_heads)
        writer.add_tensor(names.get_name(name.removesuffix(".weight")) + ".weight", array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
