"""Who reads a saved config, and what hf-posext writes so that each reads the same model.

One module per reader (`transformers5`, `transformers4`, `vllm`, `sglang`, `llamacpp`) holds its
`hf_posext.readers.reader.Reader`: its rules, re-written from its source, and its answer for a config;
`registry` lists them and asks them all (`registry.judge`); `verdicts` gives those answers for a config in
memory (`support`) and names the silent failures (`engine_warning`); `fields` writes the fields those readers
need into a patched config. Conventions: docs/readers/index.md.
"""

from . import llamacpp, sglang, transformers4, transformers5, vllm
from .fields import clear_reader_fields, restore_on_load, saved_fields, write_reader_fields
from .reader import ANSWERS, NO_RULE, VERDICTS, Finding, Reader, Subject, Verdict
from .registry import READERS, judge
from .verdicts import engine_warning, print_engine_warning, support

__all__ = [
    "ANSWERS",
    "NO_RULE",
    "READERS",
    "VERDICTS",
    "Finding",
    "Reader",
    "Subject",
    "Verdict",
    "clear_reader_fields",
    "engine_warning",
    "judge",
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
