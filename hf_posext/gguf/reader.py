"""Reading a GGUF file's metadata and tensor list, memory-mapped: what every GGUF command opens first.

`open_gguf` refuses a file that is not a whole GGUF (a wrong magic, a truncated tensor), and
`check_model_keys` one that is not a whole model (no head count, no layer tensors). Light on
purpose (no torch or transformers model code): `hf_posext.gguf.source` checks a file with it before
transformers reads it, and ``import hf_posext`` loads that module (tests/test_import_cost.py).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..validation import require


def _gguf() -> Any:
    return require("gguf", "gguf", "writing GGUF files")


@functools.cache
def _reader_class() -> type:
    """``gguf.GGUFReader`` slicing a plain ``ndarray`` view of its memory map instead of the ``np.memmap``.

    The stock reader slices the ``np.memmap`` once per value read, and each slice runs numpy's memmap
    bookkeeping: SmolLM2's 49k-token vocabulary and merges (~150k strings) took 2.4-2.7 s to open, 0.7 s this
    way (benchmarks/bench_gguf_open.py). Same file mapping, same fields and tensors (tests/gguf/test_writer.py);
    tensor data are ``ndarray`` views of the mapping rather than ``np.memmap`` objects.
    """
    gguf = _gguf()

    class Reader(gguf.GGUFReader):  # type: ignore[misc, name-defined]
        def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self._plain = self.data.view(np.ndarray)
            dtype, count = np.dtype(dtype), int(count)
            array = plain[offset : offset + dtype.itemsize * count].view(dtype)[:count]
            return array.view(array.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    return Reader


def open_gguf(path: str | os.PathLike) -> Any:
    """A ``gguf.GGUFReader`` of ``path`` (memory-mapped, read-only).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not a GGUF file, or is truncated or damaged.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no GGUF file at {str(path)!r}")
    with file.open("rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{str(path)!r} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    try:
        reader = _reader_class()(file, "r")
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except (ValueError, IndexError, OSError, KeyError, OverflowError) as err:
        raise ValueError(f"{str(path)!r} is a damaged or truncated GGUF file ({type(err).__name__}: {err})") from err
    if end > file.stat().st_size:
        raise ValueError(
            f"{str(path)!r} is a truncated GGUF file: its tensors need {end} bytes, it has {file.stat().st_size}"
        )
    return reader


def _value(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def architecture(reader: Any) -> str:
    """``general.architecture`` of the file."""
    arch = _value(reader, "general.architecture")
    if arch is None:
        raise ValueError("the GGUF file has no general.architecture key")
    return str(arch)


def check_model_keys(reader: Any, path: str | os.PathLike) -> None:
    """Refuse a GGUF that is not a whole model: no attention head count or embedding width, or no layer tensors.

    transformers and `base_config` read these without a check (a ``TypeError`` on ``int(None)``, a
    ``RuntimeError`` on tensors it expects and does not find).

    Raises:
        ValueError: naming the file and what it lacks.
    """
    arch = architecture(reader)
    for key in (f"{arch}.attention.head_count", f"{arch}.embedding_length", f"{arch}.block_count"):
        value = _value(reader, key)
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
            raise ValueError(
                f"{str(path)!r} lacks the model shape key {key} (a positive integer, got {value!r}): "
                "not a complete GGUF model"
            )
    blocks = int(_value(reader, f"{arch}.block_count"))
    present = {
        int(t.name.split(".")[1])
        for t in reader.tensors
        if t.name.startswith("blk.") and t.name.count(".") > 1 and t.name.split(".")[1].isdigit()
    }
    missing = [i for i in range(blocks) if i not in present]
    if missing:
        raise ValueError(
            f"{str(path)!r} has no tensors for layers {missing[:5]}{' ...' if len(missing) > 5 else ''} of the "
            f"{blocks} its {arch}.block_count names (blk.N.*): not a complete GGUF model"
        )


__all__ = ["architecture", "check_model_keys", "open_gguf"]
