"""The readers, in the order of the docs' tables and ``hf-posext doctor``'s report, and every reader's answer.

A reader is one module of this package holding a `hf_posext.readers.reader.Reader`; adding one is that module
and a line in `READERS`. `judge` asks each its `hf_posext.readers.reader.Finding` on a config, then applies the
one rule that spans readers: a checkpoint whose method computes something only hf-posext computes
(`hf_posext.readers.reader.Subject.only_hf_posext`) is misread by every reader but hf-posext's own that reads
its rope right (a reader with routes applies it per route: `hf_posext.readers.llamacpp`).
"""

from __future__ import annotations

from dataclasses import replace

from . import llamacpp, sglang, transformers4, transformers5, vllm
from .reader import Finding, Reader, Subject

#: Every reader, once.
READERS: tuple[Reader, ...] = (
    transformers5.WITHOUT,
    transformers5.WITH,
    transformers4.READER,
    vllm.READER,
    sglang.READER,
    llamacpp.READER,
)


def reader(key: str) -> Reader:
    """The reader whose ``key`` (as ``hf-posext doctor --json`` prints it) is ``key``.

    Raises:
        KeyError: no reader has that key; the message lists the keys.
    """
    for each in READERS:
        if each.key == key:
            return each
    raise KeyError(f"no reader {key!r}; readers: {', '.join(r.key for r in READERS)}")


def judge(subject: Subject) -> dict[str, Finding]:
    """``{reader key: Finding}`` for ``subject``, in `READERS`' order."""
    findings = {each.key: each.judge(subject) for each in READERS}
    only = subject.only_hf_posext
    if only is None:
        return findings
    for each in READERS:
        found = findings[each.key]
        if not each.runs_hf_posext and found.verdict == "same":
            findings[each.key] = replace(found, verdict="misread", why=only)
    return findings


__all__ = ["READERS", "judge", "reader"]
