"""GGUF files, both ways: in as a model source, out as a file llama.cpp runs as the patched model.

`source` converts a ``.gguf`` file once into a cached safetensors checkpoint (its names are
re-exported here: ``from hf_posext.gguf import gguf_checkpoint``); `rope` is the rope llama.cpp
reads, `writer` extends a GGUF file without touching its tensors (``patch_gguf``) and
`export` turns an extended checkpoint into a GGUF file through llama.cpp's converter. Only
`source` is imported here: ``import hf_posext`` stays light (tests/test_import_cost.py).
"""

from .source import HASH_CHUNK as HASH_CHUNK  # importable from here as before the move, not in __all__
from .source import SOURCE_RECORD as SOURCE_RECORD
from .source import (
    cached_checkpoint_path,
    check_model_source,
    default_cache_dir,
    gguf_checkpoint,
    gguf_identity,
    is_gguf,
    load_gguf,
    resolve_model_source,
    save_checkpoint,
)

__all__ = [
    "cached_checkpoint_path",
    "check_model_source",
    "default_cache_dir",
    "gguf_checkpoint",
    "gguf_identity",
    "is_gguf",
    "load_gguf",
    "resolve_model_source",
    "save_checkpoint",
]
