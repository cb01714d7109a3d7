"""``hf-posext gguf export CKPT OUT.gguf``: an extended checkpoint as a GGUF llama.cpp runs as the same model.

The library side is :mod:`hf_posext.gguf.export` (llama.cpp's own converter, then the rope fix).
"""

from __future__ import annotations

import argparse
from typing import Any


def _export(args: argparse.Namespace) -> int:
    from ..gguf.export import OUTTYPES, export_gguf
    from ..validation import choice

    if args.outtype is not None:
        choice(OUTTYPES)("--outtype", args.outtype)  # the flag's name in the message, before any conversion
    out = export_gguf(
        args.checkpoint,
        args.output,
        converter=args.converter,
        outtype=args.outtype,
        python=args.python,
        overwrite=args.overwrite,
    )
    print(f"wrote {out}")
    return 0


def add_parser(subparsers: Any) -> None:
    """``hf-posext gguf export CKPT OUT.gguf``."""
    gguf = subparsers.add_parser("gguf", help="GGUF files for llama.cpp").add_subparsers(
        dest="gguf_command", required=True
    )
    p = gguf.add_parser(
        "export", help="convert a checkpoint with llama.cpp's converter, then write its rope as llama.cpp reads it"
    )
    p.add_argument("checkpoint", help="a transformers checkpoint folder")
    p.add_argument("output", help="the .gguf file to write")
    p.add_argument(
        "--converter",
        default=None,
        help="llama.cpp's convert_hf_to_gguf.py (default: "
        "$HF_POSEXT_LLAMACPP_CONVERTER, else the one in hf-posext's cache)",
    )
    p.add_argument(
        "--outtype", default=None, help="the converter's --outtype: f32, f16, bf16, q8_0, tq1_0, tq2_0 or auto"
    )
    p.add_argument(
        "--python",
        default=None,
        help="the Python that runs the converter (needs torch, transformers, numpy, sentencepiece); default: this one",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    p.set_defaults(func=_export)
