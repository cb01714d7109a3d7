"""``hf-posext gguf export CKPT OUT.gguf``: an extended checkpoint as a GGUF llama.cpp runs as the same model.

The library side is `hf_posext.gguf.export` (llama.cpp's own converter, then the rope fix);
where the converter comes from and what its Python needs: `hf_posext.gguf.converter`.
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
        keep_converted=args.keep_converted,
    )
    print(f"wrote {out}")
    return 0


def add_parser(subparsers: Any) -> None:
    """``hf-posext gguf export CKPT OUT.gguf``."""
    gguf = subparsers.add_parser("gguf", help="GGUF files for llama.cpp").add_subparsers(
        dest="gguf_command", required=True
    )
    p = gguf.add_parser(
        "export",
        help="convert a checkpoint with llama.cpp's converter, then write its rope as llama.cpp reads it",
        description="Convert a checkpoint with llama.cpp's own converter (convert_hf_to_gguf.py: hf-posext has "
        "none of its own), then write its rope as llama.cpp reads it. The converter is a script of a llama.cpp "
        "checkout, or of llama-cpp-python's source package (pip download --no-deps --no-binary :all: "
        "llama-cpp-python==0.3.36, unpacked: vendor/llama.cpp/convert_hf_to_gguf.py); its Python needs torch, "
        "transformers, numpy, pyyaml and sentencepiece (pip install sentencepiece: hf-posext's extras do not "
        "install it). Both are checked before anything is converted.",
    )
    p.add_argument("checkpoint", help="a transformers checkpoint folder")
    p.add_argument("output", help="the .gguf file to write")
    p.add_argument(
        "--converter",
        default=None,
        help="llama.cpp's convert_hf_to_gguf.py, or the folder holding it (default: "
        "$HF_POSEXT_LLAMACPP_CONVERTER, else the one unpacked in hf-posext's cache)",
    )
    p.add_argument(
        "--outtype", default=None, help="the converter's --outtype: f32, f16, bf16, q8_0, tq1_0, tq2_0 or auto"
    )
    p.add_argument(
        "--python",
        default=None,
        help="the Python that runs the converter (needs torch, transformers, numpy, pyyaml, sentencepiece); "
        "default: this one",
    )
    p.add_argument(
        "--keep-converted",
        default=None,
        metavar="PATH",
        help="also keep the converter's own GGUF (its rope as it wrote it) at this file path, for comparison",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    p.set_defaults(func=_export)
