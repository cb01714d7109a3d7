"""transformers 5, two readers: without ``import hf_posext`` (`WITHOUT`) and with it (`WITH`).

hf-posext's rope types read ``... (requires: import hf_posext)``; the families' ``RopeType.old_names`` keep
checkpoints with the older names loadable (docs/readers/index.md).
"""

from __future__ import annotations

import transformers

from .. import integration
from ..methods.registry import rope_types
from ..validation.unknown_method import is_native_rope_type
from .reader import Finding, Reader, Subject


def renamed_rope_types() -> dict[str, str]:
    """Old rope type name -> current one, for every rope type a method family registered."""
    return {old: name for name, entry in rope_types().items() for old in entry.old_names}


def custom_rope_types() -> tuple[str, ...]:
    """hf-posext's own rope types (old names included): transformers 5 loads them only after ``import hf_posext``."""
    return (*rope_types(), *renamed_rope_types())


def current_rope_type(rope_type: str) -> str:
    """``rope_type`` under its current name (old checkpoints carry the names before the rename)."""
    return renamed_rope_types().get(rope_type, rope_type)


def verdict(rope_type: str) -> tuple[str, str]:
    """``(status, how)``: transformers 5 reads hf-posext's own rope types after ``import hf_posext`` and its native
    ones always; a plugin's rope type, or one nobody registered, it refuses (a plugin's: unless it is imported)."""
    current = current_rope_type(rope_type)
    if current in rope_types() and not rope_types()[current].init.__module__.startswith("hf_posext."):
        return "refused", f"KeyError: {rope_type!r} unless the plugin that registers it is imported first"
    if rope_type in custom_rope_types():
        return "same", f"after `import hf_posext`; without it, KeyError: {rope_type!r}"
    if not is_native_rope_type(rope_type):
        return "refused", f"KeyError: {rope_type!r}: no rope type of that name is registered in this process"
    return "same", "native rope type: loads with or without hf-posext"


def _known(rope_type: str) -> bool:
    """Whether transformers 5 (after ``import hf_posext``) builds a rope of this type."""
    try:
        return rope_type == "default" or integration.rope_init_function(rope_type) is not None
    except KeyError:
        return False


def _custom(subject: Subject) -> str | None:
    """What transformers 5 without ``import hf_posext`` cannot build: a rope type or attention hf-posext registers."""
    entries = [subject.params] if subject.situation == "rope" else list(subject.params.values())
    custom = [e.get("rope_type") for e in entries if isinstance(e, dict) and e.get("rope_type") in custom_rope_types()]
    if custom:
        return f"rope type {custom[0]!r}" if len(custom) == 1 else f"rope types {custom}"
    attention = subject.config_json.get("attn_implementation")
    if isinstance(attention, str) and "hf_posext" in attention:
        return f"attention {attention!r}"
    return None


def _built(reader: Reader, subject: Subject) -> Finding | None:
    """The answer where transformers 5 could not read the config, or ran it with damaged values (run)."""
    if subject.situation == "unreadable":
        return reader.finding("refused", f"AutoConfig raises {subject.error}")
    if subject.situation == "damaged":
        error = subject.built.get(reader.key)
        if error is None:
            return reader.finding("misread", f"builds the model with {subject.fields} as config.json writes")
        return reader.finding("refused", f"raises {error} (config.json's {subject.fields})")
    return None


def _without(subject: Subject) -> Finding:
    answer = _built(WITHOUT, subject)
    if answer is not None:
        return answer
    if subject.situation == "rope" and not _known(subject.rope_type):
        why = f"building the model raises KeyError: {subject.rope_type!r} (not transformers 5's, nor hf-posext's)"
        return WITHOUT.finding("refused", why)
    custom = _custom(subject)
    if custom is not None:
        why = f"the {custom} is hf-posext's: a KeyError or ValueError naming it, which says to `import hf_posext`"
        return WITHOUT.finding("refused", why)
    if subject.situation == "layered":
        return WITHOUT.finding("same", "native per-layer-type rope: loads with or without hf-posext")
    return WITHOUT.finding("same", f"native rope type {subject.rope_type!r}: loads with or without hf-posext")


def _with(subject: Subject) -> Finding:
    answer = _built(WITH, subject)
    if answer is not None:
        return answer
    if subject.situation == "layered":
        return WITH.finding("same", "after `import hf_posext`: hf-posext registers every type it writes")
    status, how = verdict(subject.rope_type)
    if status != "same":
        return WITH.finding(status, how)
    if subject.only_hf_posext is not None:
        return WITH.finding(status, f"after `import hf_posext`; without it, {subject.only_hf_posext}")
    without = _without(subject)
    if without.verdict != "same":
        how = f"after `import hf_posext`; without it, {without.why}"
    return WITH.finding(status, how)


RULES = f"transformers {transformers.__version__}, the installed one (run here)"
#: transformers 5 in a process that never imports hf_posext.
WITHOUT = Reader("transformers5", "transformers 5 without hf-posext", RULES, "run here", _without)
#: transformers 5 after ``import hf_posext``: hf-posext's own code runs.
WITH = Reader("transformers5_hf_posext", "transformers 5", RULES, "run here", _with, runs_hf_posext=True)
