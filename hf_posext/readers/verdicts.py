"""Each reader's verdict on a config in memory (`support`), and the warning naming the silent failures.

The readers and their rules: `hf_posext.readers.registry`; ``hf-posext doctor`` gives the same answers with
their rules and routes (`hf_posext.readers.doctor`). docs/readers/index.md.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

from ..methods.registry import method_class
from ..rope_utils import CONFIG_KEY
from .fields import write_reader_fields
from .reader import NO_RULE, Subject, Verdict
from . import registry


def support(config: Any, context: int) -> dict[str, Verdict]:
    """``{reader name: (verdict, how)}`` for a patched ``config`` that reaches ``context`` tokens in transformers 5.

    The readers whose rules cover the config, in `hf_posext.readers.registry.READERS`' order (per-layer-type rope
    parameters: those with a rule for the model type). A config hf-posext patched is judged as hf-posext saves it:
    with the legacy fields `hf_posext.readers.fields.write_reader_fields` writes (transformers 5 drops them when it
    loads a config.json).
    """
    if isinstance(getattr(config, CONFIG_KEY, None), dict):
        config = copy.deepcopy(config)
        write_reader_fields(config)
    findings = registry.judge(Subject(config.to_dict(), config, context))
    return {
        each.name: (findings[each.key].verdict, findings[each.key].why)
        for each in registry.READERS
        if findings[each.key].verdict != NO_RULE
    }


def engine_warning(config: Any, context: int, method: str) -> str | None:
    """One warning naming the readers that would run ``config`` wrong without an error, or ``None``."""
    verdicts = support(config, context)
    wrong = [f"{reader} ({how})" for reader, (status, how) in verdicts.items() if status == "misread"]
    if not wrong:
        return None
    right = [reader for reader, (status, _) in verdicts.items() if status == "same"]
    text = (
        f"{method} checkpoints are read wrong, without an error, by: "
        + "; ".join(wrong)
        + f". Read as patched by: {', '.join(right)}."
    )
    static = method_class(method).static_equivalent
    if static is not None:
        text += f" To serve it with those engines, patch with the static equivalent --method {static} instead."
    return text


def print_engine_warning(config: Any, context: int, method: str, file: Any = None) -> None:
    """Print `engine_warning` as ``hf-posext: warning: ...`` to ``file`` (stderr), if there is one."""
    text = engine_warning(config, context, method)
    if text is not None:
        print(f"hf-posext: warning: {text}", file=file or sys.stderr)


__all__ = [
    "engine_warning",
    "print_engine_warning",
    "support",
]
