"""An extended transformers checkpoint as a GGUF file llama.cpp runs as the same model.

    hf-posext gguf export out/llama-16k llama-16k.gguf --converter llama.cpp/convert_hf_to_gguf.py

llama.cpp's own ``convert_hf_to_gguf.py`` converts the tensors (its version, its tokenizer
handling: hf-posext has no tensor converter of its own); then the GGUF's rope metadata and
``rope_freqs`` tensor are rewritten to what llama.cpp reads for the checkpoint's rope
(:func:`hf_posext.gguf.rope.gguf_rope_for`): the converter writes YaRN's attention factor and
betas under keys llama.cpp does not read, a composition (``longrope``) as plain RoPE, and a
linear checkpoint with ``context_length`` = L0. The converter is ``--converter PATH``, else
``$HF_POSEXT_LLAMACPP_CONVERTER``, else the one unpacked from llama-cpp-python's source package
in hf-posext's cache (``.cache/`` of a source checkout, or ``$HF_POSEXT_CACHE``), e.g. by
``pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`` and ``tar xzf``. Its Python
needs torch, transformers, numpy and sentencepiece (``--python`` picks another interpreter).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from transformers import AutoConfig

from ..files import output_file
from ..validation import choice
from .rope import ARCHITECTURES, MODEL_TYPES, gguf_rope_for
from .writer import architecture, open_gguf, write_gguf

logger = logging.getLogger("hf_posext")

#: The llama-cpp-python release whose llama.cpp hf-posext's GGUF rope rules were measured against.
LLAMA_CPP_PYTHON = "0.3.36"


def cache_root() -> Path:
    """``$HF_POSEXT_CACHE``, else ``.cache/`` of the source checkout, else ``~/.cache/hf_posext``."""
    if os.environ.get("HF_POSEXT_CACHE"):
        return Path(os.environ["HF_POSEXT_CACHE"])
    checkout = Path(__file__).resolve().parent.parent
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


def _architecture_of(config: Any) -> str:
    arch = MODEL_TYPES.get(config.model_type)
    if arch is None:
        raise ValueError(
            f"model_type {config.model_type!r} is not supported for GGUF export: hf-posext writes the rope "
            f"of {', '.join(sorted(MODEL_TYPES))} checkpoints (GGUF architectures {', '.join(ARCHITECTURES)})"
        )
    return arch


def dropped_sliding_window(config: Any) -> int | None:
    """The sliding window ``config`` attends through, which llama.cpp will not: its converter drops it.

    llama.cpp 0.3.36's converter writes no window for Mistral (converted as ``llama``) or Qwen2/3 (read
    from its source), and their graphs attend to every position: measured on a tiny Mistral with a
    128-token window, logits past position 128 differ by 0.34 (5.5e-4 before it). None if no window.
    """
    window = getattr(config, "sliding_window", None)
    used = config.model_type == "mistral" or getattr(config, "use_sliding_window", False)
    return int(window) if used and window else None


#: The converter's ``--outtype`` values (llama.cpp's ``convert_hf_to_gguf.py`` argparse choices).
OUTTYPES = ("f32", "f16", "bf16", "q8_0", "tq1_0", "tq2_0", "auto")


def export_gguf(
    checkpoint: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    converter: str | os.PathLike | None = None,
    outtype: str | None = None,
    python: str | os.PathLike | None = None,
    overwrite: bool = False,
    keep_converted: str | os.PathLike | None = None,
) -> Path:
    """Convert ``checkpoint`` with llama.cpp's converter and write its rope as llama.cpp reads it.

    Args:
        checkpoint: a local transformers checkpoint folder (from ``hf-posext patch`` or the recipe).
        dst: the GGUF file to write (atomically; an existing one only with ``overwrite``).
        converter: ``convert_hf_to_gguf.py`` (:func:`find_converter`).
        outtype: the converter's ``--outtype`` (one of :data:`OUTTYPES`); its default if None.
        python: the interpreter running the converter (default: this one).
        overwrite: replace an existing ``dst``.
        keep_converted: also keep the converter's own output (its rope as it wrote it, before this function
            writes the rope llama.cpp reads) at this path, replacing any file there: what the converter alone
            makes of the checkpoint, for comparison.

    Raises:
        ValueError: an ``outtype`` the converter does not take, or the checkpoint's rope has no GGUF
            form (both checked before converting).
        RuntimeError: the converter failed (its last output lines are in the message).
    """
    if outtype is not None:
        choice(OUTTYPES)("outtype", outtype)
    source = Path(checkpoint)
    if not (source / "config.json").is_file():
        raise ValueError(f"{str(checkpoint)!r} is not a checkpoint folder (no config.json)")
    config = AutoConfig.from_pretrained(source)
    gguf_rope_for(config, _architecture_of(config))  # refuse before converting
    window = dropped_sliding_window(config)
    if window:
        logger.warning(
            "%s attends through a %d-token sliding window; llama.cpp's converter drops it, so llama.cpp "
            "attends to all positions and runs a different model past token %d",
            source,
            window,
            window,
        )
    script = find_converter(converter)
    with output_file(dst, sources=[], overwrite=overwrite) as tmp:
        raw = tmp.with_name(tmp.name + ".converted")
        command = [str(python or sys.executable), str(script), str(source), "--outfile", str(raw)]
        if outtype:
            command += ["--outtype", outtype]
        try:
            done = subprocess.run(command, check=False, capture_output=True, text=True)
            if done.returncode != 0 or not raw.is_file():
                tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
                raise RuntimeError(f"llama.cpp's converter failed ({' '.join(command)}):\n{tail}")
            reader = open_gguf(raw)
            write_gguf(reader, tmp, gguf_rope_for(config, architecture(reader)))
            del reader  # its memory map, before the file goes
        finally:
            if keep_converted is not None and raw.is_file():
                shutil.move(raw, keep_converted)
            raw.unlink(missing_ok=True)
    return Path(dst)


__all__ = ["LLAMA_CPP_PYTHON", "OUTTYPES", "dropped_sliding_window", "export_gguf", "find_converter"]
