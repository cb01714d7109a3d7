"""The ``hf-posext`` command line: the entry point, ``hf-posext methods`` and ``hf-posext patch``.

    hf-posext methods                                        # list the methods and their aliases
    hf-posext patch path/to/llama out/llama-16k --method yarn --factor 4
    hf-posext patch model.Q4_1.gguf model-32k.Q4_1.gguf --method yarn --factor 4   # GGUF to GGUF

Every other sub-command is a module of this package with ``add_parser(subparsers)``
(`SUBCOMMAND_MODULES`); handlers import their heavy modules when they run, not on ``--help``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..methods import available_methods, method_aliases, method_class
from .arguments import (
    OneLineParser,
    add_set_argument,
    check_factor,
    method_kwargs,
    plain,
    real,
    run_command,
    take_global_flags,
    whole,
)


def aliases_by_method() -> dict[str, list[str]]:
    """``{"linear": ["pi"], ...}``: each registered method's aliases (methods without one left out)."""
    aliases: dict[str, list[str]] = {}
    for alias, name in method_aliases().items():
        aliases.setdefault(name, []).append(alias)
    return aliases


def method_names() -> str:
    """``"linear (alias pi), ntk (alias ntk_aware), ..."``: every method with its aliases, from the registry."""
    aliases = aliases_by_method()
    return ", ".join(
        f"{name} (alias {', '.join(aliases[name])})" if name in aliases else name for name in available_methods()
    )


def methods_markdown() -> str:
    """The Markdown table of methods and aliases (``hf-posext methods --markdown``; docs/guides/cli.md holds it)."""
    aliases = aliases_by_method()
    rows = [
        f"| `{name}` | {', '.join(f'`{a}`' for a in aliases.get(name, [])) or '-'} |" for name in available_methods()
    ]
    return "\n".join(["| method | aliases |", "|---|---|", *rows])


def _methods(args: argparse.Namespace) -> int:
    if args.markdown:
        print(methods_markdown())
        return 0
    aliases = aliases_by_method()
    rows = [("method", "aliases", "what it is", "paper")]
    for name in available_methods():
        cls = method_class(name)
        summary = plain((cls.__doc__ or "").strip().splitlines()[0])
        rows.append((name, ", ".join(aliases.get(name, [])) or "-", summary, cls.paper))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])
    return 0


def _patch(args: argparse.Namespace) -> int:
    from transformers import AutoConfig

    from ..publish import patch_checkpoint, merge_adapter
    from ..gguf import is_gguf, resolve_model_source
    from ..patching import patch_info
    from ..readers import print_engine_warning

    extra = method_kwargs(args.set)
    check_factor(args.method, args.factor, extra)
    if args.original_max_position_embeddings is not None:
        extra["original_max_position_embeddings"] = args.original_max_position_embeddings
    if args.layer_types is not None:
        extra["layer_types"] = [name for name in args.layer_types.split(",") if name]
    if args.adapter is not None and is_gguf(args.output_dir):
        raise ValueError(
            f"--adapter writes a transformers checkpoint folder, not {args.output_dir}; merge first, "
            "then hf-posext gguf export"
        )
    if is_gguf(args.model) and is_gguf(args.output_dir):  # GGUF to GGUF: rope metadata only, tensors as stored
        from ..gguf.writer import open_gguf, read_rope
        from ..publish.gguf_patch import patch_gguf

        out = patch_gguf(
            args.model,
            args.output_dir,
            args.method,
            factor=args.factor or 1.0,
            override=args.override,
            overwrite=args.overwrite,
            **extra,
        )
        print(f"wrote {out}")
        before, after = read_rope(open_gguf(args.model)), read_rope(open_gguf(out))
        if not args.override and (before.factor > 1 or before.rope_freqs is not None):
            _note(
                f"{args.model} already carries a {before.scaling_type} rope scaling (x{before.factor:g}, context "
                f"{before.context_length}); {args.method} composes on it: {out} now reaches {after.context_length} "
                "(--override starts from plain RoPE instead)"
            )
        return 0
    if is_gguf(args.output_dir):  # a folder named out.gguf would be no GGUF, and hf-posext could not read it
        raise ValueError(
            f"{args.output_dir!r} ends in .gguf but {args.model!r} is no .gguf file: patch writes a transformers "
            f"checkpoint folder from it; write one, then convert it: hf-posext patch {args.model} OUT ... && "
            f"hf-posext gguf export OUT {args.output_dir}"
        )
    source = resolve_model_source(args.model)  # a .gguf file -> its cached safetensors conversion
    if Path(source).is_file():
        raise ValueError(f"{args.model} is a file; pass the checkpoint folder that holds it ({Path(source).parent})")
    if args.adapter is not None:
        out = merge_adapter(
            source,
            args.output_dir,
            args.adapter,
            args.method,
            args.factor,
            override=args.override,
            overwrite=args.overwrite,
            **extra,
        )
    else:
        out = patch_checkpoint(
            source, args.output_dir, args.method, args.factor, override=args.override, overwrite=args.overwrite, **extra
        )
    print(f"wrote {out}")
    saved = AutoConfig.from_pretrained(out)  # what every reader will read: the engines' verdict on it
    extended = patch_info(saved).get("layer_types")
    if extended:
        kept = [key for key in saved.rope_parameters if key not in extended]
        print(f"extended layer types: {', '.join(extended)}; kept as they were: {', '.join(kept) or 'none'}")
    _note_what_it_composes_on(args, source, saved)
    print_engine_warning(saved, patch_info(saved)["context_length"], args.method)
    return 0


def _note(text: str) -> None:
    print(f"hf-posext: note: {text}", file=sys.stderr)


def _note_what_it_composes_on(args: argparse.Namespace, source: str, saved: Any) -> None:
    """One line when the patch did not start from plain RoPE: the patch ``source`` carried (replaced) or the
    scaling it shipped (composed on), and what the output reaches now (a second patch silently reached 16x)."""
    record = saved.hf_posext
    config_file = Path(source) / "config.json"
    previous = json.loads(config_file.read_text()).get("hf_posext") if config_file.is_file() else None
    if isinstance(previous, dict) and previous.get("method"):
        _note(
            f"{args.model} was already patched by hf-posext ({previous['method']}, reaching "
            f"{previous.get('context_length')}); this patch replaces it, starting from the checkpoint's own rope: "
            f"{args.output_dir} now reaches {record['context_length']}"
        )
    elif "composed_on" in record:
        _note(
            f"{args.model} ships a {record['composed_on']} rope scaling (reaching "
            f"{record['base_original_max_position_embeddings']}); {args.method} composes on it: {args.output_dir} "
            f"now reaches {record['context_length']} (--override starts from plain RoPE instead)"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="hf-posext",
        description="Extend the context window of rotary decoders "
        "(PI, NTK, YaRN, dynamic scaling, ALiBi...) in Hugging Face checkpoints.",
        epilog="hf-posext COMMAND --help shows a command's flags.",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show the traceback of an error; anywhere on the line (also: HF_POSEXT_DEBUG=1)",
    )
    parser.add_argument(
        "--plugin",
        metavar="MODULE",
        action="append",
        help="import MODULE first (a plugin registering its methods: hf_posext.register_family); repeatable, "
        "anywhere on the line (also: HF_POSEXT_PLUGINS=mod1,mod2, which the processes a command starts inherit)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("methods", help="list the position-encoding methods and their aliases")
    p.add_argument("--markdown", action="store_true", help="print the methods and aliases as a Markdown table")
    p.set_defaults(func=_methods)

    p = sub.add_parser("patch", help="write a checkpoint with an extended context (weights untouched)")
    p.add_argument("model", help="checkpoint folder, Hub id or local .gguf file")
    p.add_argument(
        "output_dir",
        help="the folder the patched checkpoint is written to; a .gguf file for a .gguf model: "
        "the same GGUF with the method's rope as llama.cpp reads it",
    )
    p.add_argument("--method", required=True, help=f"one of: {method_names()}")
    p.add_argument(
        "--factor",
        type=real(1.0),
        default=None,
        help="context scale s >= 1; required by the methods that scale RoPE, not by "
        f"{', '.join(m for m in available_methods() if not method_class(m).scales_rope)}",
    )
    p.add_argument(
        "--original-max-position-embeddings",
        type=whole(1),
        default=None,
        help="the pretraining context L_orig (default: the checkpoint's)",
    )
    p.add_argument(
        "--override",
        action="store_true",
        help="replace a rope scaling the checkpoint already has (llama3, yarn...) by plain RoPE at its "
        "pretraining context; without it the method composes on that scaling",
    )
    p.add_argument(
        "--layer-types",
        default=None,
        metavar="TYPE[,TYPE...]",
        help="with per-layer-type rope parameters (Gemma 3/4, LFM3...), the layer types to extend, e.g. "
        "full_attention,sliding_attention (default: all but the local ones: sliding, chunked)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a non-empty output folder: its checkpoint files are replaced, other files kept",
    )
    p.add_argument(
        "--adapter",
        default=None,
        metavar="FOLDER",
        help="a PEFT LoRA adapter trained on the patched model (a LoRA fine-tune's <output>/adapter): "
        "merged into the weights, which are then written in full",
    )
    add_set_argument(p)
    p.set_defaults(func=_patch)

    for module in SUBCOMMAND_MODULES:
        importlib.import_module(module).add_parser(sub)
    return parser


#: The modules of the other sub-commands, in ``--help`` order, each with ``add_parser(subparsers)``.
SUBCOMMAND_MODULES: tuple[str, ...] = tuple(
    f"hf_posext.commands.{name}"
    for name in (
        "eval",
        "finetune",
        "plan",
        "demo",
        "reproduce",
        "push",
        "tiny_model",
        "gguf",
        "search",
        "doctor",
    )
)


def main(argv: Sequence[str] | None = None) -> int:
    """``hf-posext ARGS``; returns the exit code (2: bad input, reported in one line)."""
    # --debug and --plugin anywhere: each sub-command's parser (and the recipe's own) would refuse them
    code, debug, argv = take_global_flags("hf-posext", argv)
    if code:
        return code
    args = build_parser().parse_args(argv)
    args.command_argv = argv[argv.index(args.command) + 1 :]  # what followed the command's name
    return run_command("hf-posext", lambda: args.func(args), debug=debug)


if __name__ == "__main__":
    sys.exit(main())
