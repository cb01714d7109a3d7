"""SHA-256 of a file's bytes, computed once per version of the file: the content keys of caches and resumes.

A digest is kept by the file's ``(device, inode, size, mtime_ns, ctime_ns)``, in this process and
in ``$HF_POSEXT_CACHE/digests.json``, so a later run reads none of an unchanged file (hashing
SmolLM2-135M's 538 MB takes 2.65 s). ``ctime`` is in the key because it cannot be set back:
weights rewritten in place with their old size and ``os.utime``'s old mtime still get a new one.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .files import atomic_file, default_cache_dir

#: Bytes read at a time while hashing.
HASH_CHUNK = 8 << 20
#: Digests already known to this process, by (version of the file, prefix).
_MEMO: dict[tuple[tuple[int, ...], bytes], str] = {}


def _cache_file() -> Path:
    return default_cache_dir() / "digests.json"


def _hash_file(path: Path, prefix: bytes) -> str:
    digest = hashlib.sha256(prefix)
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _read_cache(cache: Path) -> dict[str, list]:
    try:
        entries = json.loads(cache.read_text())
    except (OSError, ValueError):  # none yet, unreadable, or half-written by an older version: rebuilt
        return {}
    return entries if isinstance(entries, dict) else {}


def file_digest(path: str | os.PathLike, prefix: bytes = b"") -> str:
    """The hex SHA-256 of ``prefix`` followed by the bytes of ``path``.

    Raises:
        OSError: ``path`` cannot be read.
    """
    file = Path(path).resolve()
    stat = file.stat()
    version = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if (version, prefix) in _MEMO:
        return _MEMO[version, prefix]
    cache = _cache_file()
    entries = _read_cache(cache)
    name = f"{file}\0{prefix.hex()}"
    entry = entries.get(name)
    if isinstance(entry, list) and len(entry) == 2 and entry[0] == list(version) and isinstance(entry[1], str):
        digest = entry[1]
    else:
        digest = _hash_file(file, prefix)
        # Re-read: another process's entries are kept; files gone since are dropped, so it stays small.
        entries = {key: value for key, value in _read_cache(cache).items() if os.path.exists(key.split("\0")[0])}
        entries[name] = [list(version), digest]
        try:
            with atomic_file(cache) as tmp:
                tmp.write_text(json.dumps(entries))
        except OSError:  # a read-only home: the digest is only remembered for this process
            pass
    _MEMO[version, prefix] = digest
    return digest


__all__ = ["HASH_CHUNK", "file_digest"]
