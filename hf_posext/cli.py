"""The ``hf-posext`` command line.

    hf-posext methods                                        # list the methods
    hf-posext patch path/to/llama out/llama-16k --method yarn --factor 4
    hf-posext patch path/to/llama out/llama-alibi --method alibi    # methods without a factor
    hf-posext patch model.Q4_1.gguf model-32k.Q4_1.gguf --method yarn --factor 4   # GGUF to GGUF

Each sub-command lives in the module that holds its logic and exposes
``add_parser(subparsers)``, which registers the parser and sets ``func`` to the handler.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from transformers import AutoConfig

from .arguments import add_set_argument, check_factor, method_kwargs, run_command
from .export import extend_checkpoint
from .gguf import is_gguf, resolve_model_source
from .methods import available_methods, method_class
from .patching import patch_info
from .readers import print_engine_warning


def _methods(args: argparse.Namespace) -> int:
    for name in available_methods():
        cls = method_class(name)
        summary = (cls.__doc__ or "").strip().splitlines()[0]
        print(f"{name:<14} {summary}  [{cls.paper}]")
    return 0


def _patch(args: argparse.Namespace) -> int:
    check_factor(args.method, args.factor)
    extra = method_kwargs(args.set)
    if args.original_max_position_embeddings is not None:
        extra["original_max_position_embeddings"] = args.original_max_position_embeddings
    if is_gguf(args.model) and is_gguf(args.output_dir):  # GGUF to GGUF: rope metadata only, tensors as stored
        from .gguf_writer import patch_gguf

        out = patch_gguf(args.model, args.output_dir, args.method, factor=args.factor or 1.0, override=args.override,
                         overwrite=args.overwrite, **extra)
        print(f"wrote {out}")
        return 0
    source = resolve_model_source(args.model)  # a .gguf file -> its cached safetensors conversion
    if Path(source).is_file():
        raise ValueError(f"{args.model} is a file; pass the checkpoint folder that holds it ({Path(source).parent})")
    out = extend_checkpoint(
        source, args.output_dir, args.method, args.factor, override=args.override, overwrite=args.overwrite,
        **extra
    )
    print(f"wrote {out}")
    saved = AutoConfig.from_pretrained(out)  # what every reader will read: the engines' verdict on it
    print_engine_warning(saved, patch_info(saved)["context_length"], args.method)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-posext", description=__doc__.split("\n\n")[0])
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error (also: HF_POSEXT_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("methods", help="list the position-encoding methods")
    p.set_defaults(func=_methods)

    p = sub.add_parser("patch", help="write a checkpoint with an extended context (weights untouched)")
    p.add_argument("model", help="checkpoint folder, Hub id or local .gguf file")
    p.add_argument("output_dir", help="the checkpoint folder to write; a .gguf file for a .gguf model: the same GGUF "
                   "with the method's rope as llama.cpp reads it")
    p.add_argument("--method", required=True, help=f"one of: {', '.join(available_methods())}")
    p.add_argument("--factor", type=float, default=None,
                   help="context scale s >= 1; required by the methods that scale RoPE, not by alibi, sinusoidal, learned")
    p.add_argument("--original-max-position-embeddings", type=int, default=None)
    p.add_argument("--override", action="store_true", help="replace a rope scaling the checkpoint already has (llama3, yarn...) by plain RoPE at its "
                   "pretraining context; without it the method composes on that scaling")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty output folder: its checkpoint files are replaced, other files kept")
    add_set_argument(p)
    p.set_defaults(func=_patch)

    for module in _SUBCOMMAND_MODULES:
        importlib.import_module(module).add_parser(sub)
    return parser


#: Modules defining a sub-command next to its logic, each with ``add_parser(subparsers)``.
_SUBCOMMAND_MODULES: tuple[str, ...] = ("hf_posext.eval.cli", "hf_posext.experiments.demo", "hf_posext.hub",
                                         "hf_posext.gguf_export")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command("hf-posext", lambda: args.func(args), debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
