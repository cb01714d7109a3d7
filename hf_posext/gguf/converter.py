"""llama.cpp's converter, ``convert_hf_to_gguf.py``: where it is, whether its Python can run it, running it.

hf-posext has no tensor converter of its own: `export` runs llama.cpp's. It is a Python script
of a llama.cpp checkout, or of llama-cpp-python's source package (``pip download --no-deps
--no-binary :all: llama-cpp-python==0.3.36``, unpacked: ``vendor/llama.cpp/convert_hf_to_gguf.py``),
beside its ``conversion/`` and ``gguf-py/`` folders. Its Python needs torch, transformers, numpy,
pyyaml and, for Llama-family vocabularies, sentencepiece (read from llama-cpp-python 0.3.36's
source). `check_converter` runs the converter on the checkpoint's vocabulary alone first
(``--vocab-only``: its start-up imports and the vocabulary's, without converting a tensor), so a
missing module is one line naming it and the interpreter before anything is converted.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

#: The llama-cpp-python release whose llama.cpp hf-posext's GGUF rope rules were measured against.
LLAMA_CPP_PYTHON = "0.3.36"
#: A module's distribution where the two names differ (``pip install`` takes the distribution).
_DISTRIBUTIONS = {"yaml": "pyyaml"}
_MISSING_MODULE = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '([^']+)'")


def cache_root() -> Path:
    """``$HF_POSEXT_CACHE``, else ``.cache/`` of the source checkout, else ``~/.cache/hf_posext``."""
    if os.environ.get("HF_POSEXT_CACHE"):
        return Path(os.environ["HF_POSEXT_CACHE"])
    checkout = Path(__file__).resolve().parent.parent.parent
    if (checkout / "pyproject.toml").is_file():
        return checkout / ".cache"
    return Path.home() / ".cache" / "hf_posext"


def find_converter(path: str | os.PathLike | None = None) -> Path:
    """The ``convert_hf_to_gguf.py`` to run: ``path``, ``$HF_POSEXT_LLAMACPP_CONVERTER`` or the cached sdist's.

    Raises:
        FileNotFoundError: none of them exists; the message says how to get one.
    """
    given = path or os.environ.get("HF_POSEXT_LLAMACPP_CONVERTER")
    candidates = (
        [Path(given)]
        if given
        else sorted(cache_root().glob("llama-cpp-python-*/llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    )
    for candidate in candidates:
        if candidate.is_dir():
            candidate = candidate / "convert_hf_to_gguf.py"
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"no llama.cpp converter {'at ' + repr(str(given)) if given else 'found'}: pass --converter "
        "PATH/convert_hf_to_gguf.py (a llama.cpp checkout, or llama-cpp-python's source package: "
        f"pip download --no-deps --no-binary :all: llama-cpp-python=={LLAMA_CPP_PYTHON}; tar xzf it and take "
        "vendor/llama.cpp/convert_hf_to_gguf.py)"
    )


def run_converter(python: str, script: Path, checkpoint: Path, out: Path, options: Sequence[str] = ()) -> None:
    """``python script checkpoint --outfile out [options]``; a failure raised as one error.

    Raises:
        ValueError: ``python`` cannot be run, or lacks a module the converter imports (naming both).
        RuntimeError: the converter failed otherwise (its last output lines in the message) or wrote nothing.
    """
    command = [python, str(script), str(checkpoint), "--outfile", str(out), *options]
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True)
    except OSError as err:  # no such interpreter, or not executable
        raise ValueError(
            f"cannot run the converter's Python {python!r} ({err.strerror or err}); pass --python an interpreter "
            "with torch, transformers, numpy, pyyaml and sentencepiece"
        ) from None
    output = (done.stderr or "") + (done.stdout or "")
    if done.returncode != 0:
        missing = _MISSING_MODULE.findall(output)
        if missing:
            module = missing[-1]
            top = module.split(".")[0]
            raise ValueError(
                f"llama.cpp's converter ({script}) imports {module!r}, which {python} cannot import: install it "
                f"there ({python} -m pip install {_DISTRIBUTIONS.get(top, top)}) or pass --python an interpreter "
                "that has it"
            )
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise RuntimeError(f"llama.cpp's converter failed ({' '.join(command)}):\n{tail}")
    if not out.is_file():
        raise RuntimeError(f"llama.cpp's converter wrote no {out} ({' '.join(command)})")


def check_converter(python: str, script: Path, checkpoint: Path, scratch: Path) -> None:
    """Run the converter on the checkpoint's vocabulary alone (into ``scratch``, removed after): what it imports.

    Raises:
        ValueError, RuntimeError: as `run_converter`, before any tensor is converted.
    """
    vocab = scratch / "vocab-only.gguf"
    try:
        run_converter(python, script, checkpoint, vocab, ["--vocab-only"])
    finally:
        vocab.unlink(missing_ok=True)


__all__ = ["LLAMA_CPP_PYTHON", "cache_root", "check_converter", "find_converter", "run_converter"]
