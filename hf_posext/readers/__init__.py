"""Who reads a saved config, and what hf-posext writes so that each reads the same model.

One module per reader (`transformers4`, `transformers5`, `vllm`, `sglang`,
`llamacpp`) holds its rules, re-written from its source; `verdicts` applies them
(`support`) and names the silent failures (`engine_warning`); `fields` writes the
fields those readers need into a patched config. Conventions: docs/readers/index.md.
"""

from . import llamacpp, sglang, transformers4, transformers5, vllm
from .fields import clear_reader_fields, restore_on_load, saved_fields, write_reader_fields
from .verdicts import (
    READERS,
    STATUSES,
    VLLM_DUAL_CHUNK_MODEL_TYPES,
    Verdict,
    engine_warning,
    print_engine_warning,
    support,
)

__all__ = [
    "READERS",
    "STATUSES",
    "VLLM_DUAL_CHUNK_MODEL_TYPES",
    "Verdict",
    "clear_reader_fields",
    "engine_warning",
    "llamacpp",
    "print_engine_warning",
    "restore_on_load",
    "saved_fields",
    "sglang",
    "support",
    "transformers4",
    "transformers5",
    "vllm",
    "write_reader_fields",
]
