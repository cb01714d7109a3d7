"""Evaluation: perplexity against context length, passkey retrieval, the RULER-style suite, result files.

Every function works on an in-memory model, so a notebook can call them directly; the
``hf-posext eval ppl|passkey|ruler`` commands (`hf_posext.commands.eval`) wrap them for checkpoints.
"""

from ..data import encode_documents, load_texts, stdlib_files
from .passkey import PasskeyResult, build_prompt, parse_answer, passkey_accuracy
from .perplexity import PerplexityPoint, sliding_window_perplexity, sliding_windows, truncated_perplexity
from .ruler import ruler_accuracy

__all__ = [
    "PasskeyResult",
    "PerplexityPoint",
    "build_prompt",
    "encode_documents",
    "load_texts",
    "parse_answer",
    "passkey_accuracy",
    "ruler_accuracy",
    "sliding_window_perplexity",
    "sliding_windows",
    "stdlib_files",
    "truncated_perplexity",
]
