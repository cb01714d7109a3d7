"""Extend a GGUF file's context without touching its tensors: ``hf-posext patch model.gguf out.gguf``.

    hf-posext patch SmolLM2-135M-Instruct.Q4_1.gguf smollm2-32k.gguf --method yarn --factor 4

or, in Python, ``patch_gguf("model.gguf", "out.gguf", "yarn", factor=4)``. The file's rope is read as
llama.cpp runs it and becomes the base the method composes on, by the same rules as for a transformers
checkpoint (`hf_posext.patching.shipped_rope`): [`patch_model`][hf_posext.patch_model] patches that
config, and `hf_posext.gguf.writer` writes the result beside the file's own tensors. It sits here,
beside `hf_posext.publish.config_patch.patch_checkpoint` (the same verb on a folder), above both.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..files import output_file
from ..gguf.reading import rope_keys_problem
from ..gguf.rope import REFUSED_METHODS, gguf_rope_for
from ..gguf.writer import architecture, base_config, check_model_keys, open_gguf, write_gguf
from ..methods import canonical_name
from ..patching import patch_model


def patch_gguf(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    method: str,
    *,
    factor: float = 1.0,
    override: bool = False,
    overwrite: bool = False,
    **kwargs: Any,
) -> Path:
    """Write ``dst``: the GGUF ``src`` with ``method``'s rope, its tensors copied byte for byte.

    Args:
        src: a GGUF file of a `hf_posext.gguf.rope.ARCHITECTURES` architecture.
        dst: the new file; neither ``src`` nor (without ``overwrite``) an existing file.
        method: a static method: linear, ntk, yarn (dynamic and attention-level methods are
            refused with what llama.cpp runs instead).
        factor: the context scale s.
        override: replace the file's own scaling by plain RoPE instead of composing on it.
        overwrite: replace an existing ``dst``.
        **kwargs: the method's other fields (``beta_fast``, ``attention_factor``, ...).

    Returns:
        ``dst`` as a Path.

    Raises:
        ValueError: a bad or unsupported input, named in the message; nothing is written.
    """
    name = method if method in REFUSED_METHODS else canonical_name(method)
    if name in REFUSED_METHODS:
        raise ValueError(f"{method} cannot be written into a GGUF: {REFUSED_METHODS[name]}")
    reader = open_gguf(src)
    check_model_keys(reader, src)
    problem = rope_keys_problem(reader)  # the one reading hf-posext's loaders take (hf_posext.gguf.reading)
    if problem is not None:
        raise ValueError(f"{src}: {problem}")
    arch = architecture(reader)
    config = base_config(reader, override)
    patch_model(config, method, factor=factor, override=override, **kwargs)
    rope = gguf_rope_for(config, arch)
    with output_file(dst, sources=[src], overwrite=overwrite) as tmp:
        write_gguf(reader, tmp, rope)
    return Path(dst)


__all__ = ["patch_gguf"]
