"""Atomic writes: every file and folder the package writes appears complete or not at all.

A reader (another process of the run, the next run after a crash, ``hf-posext push``) never sees
half a checkpoint, half a result file or half a data cache. Everything goes through
:func:`atomic_file` (one file), :func:`atomic_directory` (a folder written by one process) or
:func:`replace_directory` (a folder staged by several processes, e.g. a training state).
Temporary names start with a dot, so folder listings and Hub uploads skip them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def replace_directory(staged: str | os.PathLike, target: str | os.PathLike) -> Path:
    """Move the complete folder ``staged`` to ``target``, replacing what is there.

    Replacing an existing folder takes two renames; a crash between them leaves the old folder
    as ``.NAME.old-PID``, which :func:`restore_orphan` (called by :func:`atomic_directory`)
    puts back before the next write.
    """
    staged, target = Path(staged), Path(target)
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    os.replace(staged, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def restore_orphan(target: str | os.PathLike) -> None:
    """Put back a previous ``target`` that a crash inside :func:`replace_directory` left hidden."""
    target = Path(target)
    if target.exists():
        return
    for orphan in sorted(target.parent.glob(f".{target.name}.old-*")):
        os.replace(orphan, target)
        break


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling of ``path``; on success it replaces ``path`` in one rename.

    A crash (or an exception) inside the block leaves ``path`` as it was: either the previous
    complete folder or nothing. The temporary folder is removed on failure.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Restored first, so that a failure of this write still leaves the previous folder in place.
    restore_orphan(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        replace_directory(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; write the file there, it is renamed onto ``path``.

    The temporary name holds the process id, so processes writing the same file (the ranks of a
    run filling one cache) never write into each other's temporary file.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically; returns ``path`` as a Path."""
    with atomic_file(path) as tmp:
        tmp.write_text(text)
    return Path(path)
