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


def write_tiny_gguf(path, arch="llama", rope_freqs=None, heads=True, layers=True, **keys):
    """A GGUF with the attention shape of tests/helpers/models.py's tiny config, one F32 and one Q4_1 tensor.

    ``heads=False`` leaves out the head counts, ``layers=False`` the one layer's tensor (``blk.0.*``).
    """
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(path, arch)
    writer.add_context_length(L_ORIG)
    writer.add_embedding_length(4 * HEAD_DIM)
    writer.add_block_count(1)
    if heads:
        writer.add_head_count(4)
        writer.add_head_count_kv(2)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
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
