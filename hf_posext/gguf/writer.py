"""A GGUF file rewritten with a new rope, its tensors untouched: what ``hf-posext patch model.gguf out.gguf`` writes.

`base_config` reads the file's rope (plain, a raised base, linear, yarn, a ``rope_freqs``
tensor) as llama.cpp runs it, as a transformers config a method composes on; `write_gguf`
writes a rope as the metadata and ``rope_freqs`` tensor llama.cpp reads (`hf_posext.gguf.rope`).
Every other key and every tensor is copied byte for byte (a quantized file stays quantized), through
the ``gguf`` package's reader and writer; the output appears complete or not at all. The method is
applied above this package, by `hf_posext.publish.gguf_patch.patch_gguf`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..files import output_file
from ..post_import import deprecated_attribute as _deprecated_attribute
from .reader import _gguf, _value, architecture
from .reader import _reader_class as _reader_class  # the fast reader: tests/gguf/test_writer.py compares it
from .reader import check_model_keys as check_model_keys
from .reader import open_gguf as open_gguf
from .rope import (
    ROPE_FREQS,
    GGUFRope,
    rope_config_of,
)

#: Key suffixes (after ``{arch}.``) this module owns: removed from the source, written anew.
OWNED_SUFFIXES = ("context_length", "rope.freq_base", "rope.scaling.")


def read_rope(reader: Any) -> GGUFRope:
    """The rope fields of the file as llama.cpp 0.3.36 reads them (`hf_posext.gguf.rope.GGUFRope`).

    llama.cpp's default scaling type is ``linear`` with factor 0 (= 1), the same as ``none``.
    """
    arch = architecture(reader)
    key = (
        f"{arch}.rope.scaling.factor" if f"{arch}.rope.scaling.factor" in reader.fields else f"{arch}.rope.scale_linear"
    )
    factor = float(_value(reader, key, 0.0))
    scaling_type = str(_value(reader, f"{arch}.rope.scaling.type", "linear"))
    # llama.cpp scales linear and yarn by 1 / factor (0: unset, no scaling) and never scales type none
    if scaling_type in ("linear", "yarn") and factor != 0 and not factor >= 1:
        raise ValueError(
            f"{key} = {factor!r} with rope.scaling.type {scaling_type!r}: a scaling factor must be >= 1 "
            "(or 0: unset); below 1 llama.cpp would compress positions, which hf-posext does not model"
        )
    freqs = next((t for t in reader.tensors if t.name == ROPE_FREQS), None)
    context = _value(reader, f"{arch}.context_length")
    if context is None:
        raise ValueError(f"the GGUF file has no {arch}.context_length key")
    return GGUFRope(
        freq_base=float(_value(reader, f"{arch}.rope.freq_base", 10000.0)),
        context_length=int(context),
        scaling_type=scaling_type,
        factor=factor or 1.0,
        original_context_length=_value(reader, f"{arch}.rope.scaling.original_context_length"),
        attn_factor=float(_value(reader, f"{arch}.rope.scaling.attn_factor", 1.0)),
        rope_freqs=None if freqs is None else tuple(float(x) for x in np.asarray(freqs.data, dtype=np.float64)),
    )


def base_config(reader: Any, override: bool = False) -> Any:
    """The transformers config of the file's attention shape and rope, as the base of a patch.

    ``override``: plain RoPE at the file's original context instead (``original_context_length``,
    else ``context_length``), whatever its scaling.
    """
    arch = architecture(reader)
    heads = int(_value(reader, f"{arch}.attention.head_count"))
    kv = _value(reader, f"{arch}.attention.head_count_kv", heads)
    embedding = int(_value(reader, f"{arch}.embedding_length"))
    head_dim = int(_value(reader, f"{arch}.attention.key_length", embedding // heads))
    rotary_dim = int(_value(reader, f"{arch}.rope.dimension_count", head_dim))
    rope = read_rope(reader)
    if override:
        rope = GGUFRope(rope.freq_base, int(rope.original_context_length or rope.context_length))
    return rope_config_of(rope, arch, heads, int(kv), embedding, head_dim, rotary_dim)


def _owned(key: str, arch: str) -> bool:
    return any(key == f"{arch}.{s}" or (s.endswith(".") and key.startswith(f"{arch}.{s}")) for s in OWNED_SUFFIXES)


def write_gguf(reader: Any, dst: str | os.PathLike, rope: GGUFRope) -> None:
    """Write ``reader``'s file to ``dst`` with ``rope`` as its rope metadata and ``rope_freqs`` tensor.

    Every other key and tensor is copied as stored (quantized blocks as bytes).
    """
    gguf = _gguf()
    arch = architecture(reader)
    writer = gguf.GGUFWriter(dst, arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF.") or _owned(field.name, arch):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    types = {
        "context_length": gguf.GGUFValueType.UINT32,
        "rope.scaling.original_context_length": gguf.GGUFValueType.UINT32,
        "rope.scaling.type": gguf.GGUFValueType.STRING,
    }
    for key, value in rope.keys().items():
        writer.add_key_value(f"{arch}.{key}", value, types.get(key, gguf.GGUFValueType.FLOAT32))
    tensors = [t for t in reader.tensors if t.name != ROPE_FREQS]
    freqs = None if rope.rope_freqs is None else np.asarray(rope.rope_freqs, dtype=np.float32)
    if freqs is not None:  # first, where the converter puts it
        writer.add_tensor_info(ROPE_FREQS, freqs.shape, freqs.dtype, freqs.nbytes, gguf.GGMLQuantizationType.F32)
    for tensor in tensors:
        writer.add_tensor_info(
            tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    if freqs is not None:
        writer.write_tensor_data(freqs)
    for tensor in tensors:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()


def rewrite_gguf(src: str | os.PathLike, dst: str | os.PathLike, rope: GGUFRope, overwrite: bool = False) -> Path:
    """Copy ``src`` to ``dst`` (atomically, under the output policy) with ``rope`` written into it."""
    reader = open_gguf(src)
    with output_file(dst, sources=[src], overwrite=overwrite) as tmp:
        write_gguf(reader, tmp, rope)
    return Path(dst)


def __getattr__(name: str) -> object:  # patch_gguf, moved to hf_posext.publish.gguf_patch (post_import.MOVED_NAMES)
    return _deprecated_attribute(__name__, name)


__all__ = ["architecture", "base_config", "open_gguf", "read_rope", "rewrite_gguf", "write_gguf"]
