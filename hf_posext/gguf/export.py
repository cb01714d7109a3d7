"""An extended transformers checkpoint as a GGUF file llama.cpp runs as the same model.

    hf-posext gguf export out/llama-16k llama-16k.gguf --converter llama.cpp/convert_hf_to_gguf.py

llama.cpp's own ``convert_hf_to_gguf.py`` converts the tensors (`converter`: where it comes
from, what its Python needs); then the GGUF's rope metadata and ``rope_freqs`` tensor are rewritten
to what llama.cpp reads for the checkpoint's rope (`hf_posext.gguf.rope.gguf_rope_for`): the
converter writes YaRN's attention factor and betas under keys llama.cpp does not read, a
composition (``longrope``) as plain RoPE, and a linear checkpoint with ``context_length`` = L0.
Everything is checked before the converter runs (the checkpoint, the output paths, the converter
and its Python); the outputs appear complete or not at all, and nothing else is left behind.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..files import check_output_file, output_file, same_file
from ..validation import choice
from ..validation.config_damage import damaged_fields, missing_original, rope_damage, theta_disagreements
from ..validation.saved_model import check_weight_files, read_config
from .converter import LLAMA_CPP_PYTHON, check_converter, find_converter, run_converter
from .rope import ARCHITECTURES, MODEL_TYPES, gguf_rope_for
from .writer import architecture, open_gguf, write_gguf

logger = logging.getLogger("hf_posext")


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


def _refuse_damage(config_file: Path) -> None:
    """Refuse a config.json whose rope says two models or none (``hf-posext doctor``'s damage checks): a damaged
    value, a ``rope_theta`` unlike ``rope_parameters``', a rope that needs L0 without it. The converter would write
    one guess of it (the reader matrix measured each as another model in llama.cpp)."""
    config_json = json.loads(config_file.read_text(encoding="utf-8"))
    damaged = rope_damage(damaged_fields(config_json) + theta_disagreements(config_json))
    problems = [c["message"] for c in damaged]
    if missing_original(config_json):
        problems.append("original_max_position_embeddings: missing (each reader guesses another L0)")
    if problems:
        raise ValueError(
            f"{config_file}: no GGUF is written of a config whose rope is damaged or ambiguous ({'; '.join(problems)});"
            " fix config.json (hf-posext doctor names each field)"
        )


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
        converter: ``convert_hf_to_gguf.py`` (`converter.find_converter`).
        outtype: the converter's ``--outtype`` (one of `OUTTYPES`); its default if None.
        python: the interpreter running the converter (default: this one).
        overwrite: replace an existing ``dst`` (and ``keep_converted``).
        keep_converted: also keep the converter's own output (its rope as it wrote it, before this function
            writes the rope llama.cpp reads) at this file path, for comparison: what the converter alone
            makes of the checkpoint. Written atomically with ``dst``, under the same rules.

    Raises:
        ValueError: before converting: an ``outtype`` the converter does not take, a checkpoint whose config
            or weights are refused (`hf_posext.validation.saved_model.read_config`) or whose rope has no
            GGUF form, an output path that is a folder, lies under a file, exists (without ``overwrite``), is
            a file of the checkpoint, or (``keep_converted``) is ``dst`` itself or in the checkpoint's folder; a
            converter Python that cannot run it or lacks a module it imports (`converter.check_converter`).
        FileNotFoundError: no converter (`converter.find_converter`).
        RuntimeError: the converter failed (its last output lines are in the message).
    """
    if outtype is not None:
        choice(OUTTYPES)("outtype", outtype)
    source = Path(checkpoint)
    if not (source / "config.json").is_file():
        raise ValueError(f"{str(checkpoint)!r} is not a checkpoint folder (no config.json)")
    config = read_config(source)
    _refuse_damage(source / "config.json")
    check_weight_files(source)  # the converter reads them: a missing or truncated shard is named here
    gguf_rope_for(config, _architecture_of(config))  # refuse before converting
    outputs = _check_outputs(source, Path(dst), None if keep_converted is None else Path(keep_converted), overwrite)
    script = find_converter(converter)
    window = dropped_sliding_window(config)
    if window:
        logger.warning(
            "%s attends through a %d-token sliding window; llama.cpp's converter drops it, so llama.cpp "
            "attends to all positions and runs a different model past token %d",
            source,
            window,
            window,
        )
    interpreter = str(python or sys.executable)
    # the converter's own output goes to a folder on dst's filesystem that clean_stale removes if this process dies
    staging = f".{Path(dst).name}.tmp-{os.getpid()}-"
    with (
        output_file(dst, sources=outputs, overwrite=overwrite) as tmp,
        tempfile.TemporaryDirectory(dir=tmp.parent, prefix=staging) as scratch,
    ):
        check_converter(interpreter, script, source, Path(scratch))
        raw = Path(scratch) / "converted.gguf"
        run_converter(interpreter, script, source, raw, ["--outtype", outtype] if outtype else [])
        reader = open_gguf(raw)
        write_gguf(reader, tmp, gguf_rope_for(config, architecture(reader)))
        del reader  # its memory map, before the file moves
        if keep_converted is not None:
            with output_file(keep_converted, sources=outputs, overwrite=overwrite) as kept:
                shutil.move(raw, kept)
    return Path(dst)


def _check_outputs(source: Path, dst: Path, keep: Path | None, overwrite: bool) -> list[Path]:
    """Refuse the output paths before anything runs; returns the checkpoint's files (which no output may be).

    Raises:
        ValueError: as `hf_posext.files.check_output_file`, ``keep`` naming the same file as ``dst`` or a
            file in the checkpoint folder.
    """
    protected = sorted(path for path in source.iterdir() if path.is_file())
    check_output_file(dst, sources=protected, overwrite=overwrite)
    if keep is not None:
        check_output_file(keep, sources=protected, overwrite=overwrite, what="keep_converted")
        if source.resolve() in keep.expanduser().resolve().parents:  # a comparison file is no part of the checkpoint
            raise ValueError(
                f"keep_converted {str(keep)!r} lies in the checkpoint folder {str(source)!r}; keep the converter's "
                "own output outside it (nothing was written)"
            )
        if same_file(keep, dst):
            raise ValueError(
                f"keep_converted {str(keep)!r} is the output file {str(dst)!r}; give the converter's own output "
                "another path (nothing was written)"
            )
    return protected


__all__ = ["LLAMA_CPP_PYTHON", "OUTTYPES", "dropped_sliding_window", "export_gguf", "find_converter"]
