"""``hf-posext search longrope``: LongRoPE's factor search on your own model and text, then a checkpoint carrying them.

    hf-posext search longrope path/to/model out/model-lr8 --factor 8 --length 1024 --data notes.txt \\
        --population 16 --rounds 8

Writes OUT (the model with a native ``longrope`` config holding the searched factors, loadable
by vanilla transformers; with ``--keep-first N``, hf-posext's own rope type, which needs
``import hf_posext``) and ``OUT/longrope_search.json`` (settings, result, per-round history).
The search state is written after every round to ``OUT.search-state.json`` beside OUT; rerunning
the same command resumes from it, and it is removed once OUT is written (docs/methods/longrope.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..files import check_output_dir
from .arguments import positive_number, real, whole

if TYPE_CHECKING:  # torch and the search load on first use: the CLI's start stays light
    import torch

    from ..longrope_search import LongRopeSearchResult


def _check_args(args: argparse.Namespace) -> None:
    """Refuse bad flags before anything is loaded or written (one line naming the flag)."""
    if not args.factor >= 1:
        raise ValueError(f"--factor must be >= 1 (the context scale s), got {args.factor}")
    if args.population < 2:
        raise ValueError(f"--population must be >= 2 (the best half are kept as parents), got {args.population}")
    if args.rounds < 0:
        raise ValueError(f"--rounds must be >= 0, got {args.rounds}")
    if args.score_last is not None and not 1 <= args.score_last < args.length:
        raise ValueError(f"--score-last must be in [1, {args.length - 1}] (below --length), got {args.score_last}")
    if args.documents < 1:
        raise ValueError(f"--documents must be >= 1, got {args.documents}")


def _longrope(args: argparse.Namespace) -> int:
    """``hf-posext search longrope``: check, search (resuming a state left beside OUT), write OUT (module docs)."""
    from ..gguf import resolve_model_source

    _check_args(args)
    source = Path(resolve_model_source(args.model))  # a .gguf file -> its cached safetensors conversion
    if not (source / "config.json").is_file():
        raise ValueError(f"MODEL {args.model!r} is not a checkpoint folder with a config.json (or a .gguf file)")
    check_output_dir(args.out, overwrite=args.overwrite, sources=[source])
    original = _original_context(args, source)
    documents = _documents(args, source)
    result = _search(args, source, documents, original)
    out = _write_checkpoint(args, source, len(documents), result)
    _state_path(args).unlink(missing_ok=True)
    print(f"perplexity at {args.length}: {result.start_perplexity:.4g} (YaRN's factors) -> {result.perplexity:.4g}")
    print(f"wrote {out} and {out / 'longrope_search.json'}")
    return 0


def _state_path(args: argparse.Namespace) -> Path:
    """The search's state file: ``OUT.search-state.json`` beside OUT."""
    return Path(f"{str(args.out).rstrip('/')}.search-state.json")


def _original_context(args: argparse.Namespace, source: Path) -> int:
    """The model's original context L_orig, read from ``source``'s config; refuses a model that ships another
    scaling without ``--override``, and ``--length`` or ``--keep-first`` that do not fit L_orig."""
    from ..methods import method_config
    from ..patching.shipped_rope import base_rope, shipped_rope
    from ..validation.saved_model import read_config

    config = read_config(source)
    shipped = shipped_rope(config)[0]
    rope_type = shipped.get("rope_type", shipped.get("type", "default"))
    if rope_type != "default" and not args.override:
        # The factors are scored over plain RoPE (every candidate replaces the shipped scaling), so
        # the checkpoint written must replace it too: asked now, not after every round has run.
        raise ValueError(
            f"MODEL {args.model!r} already ships rope_type={rope_type!r}; the search scores LongRoPE's factors "
            "over plain RoPE at its pretraining context, replacing that scaling: pass --override to do so"
        )
    original = base_rope(config, method_config("longrope"), override=True).original_max_position_embeddings
    if args.length <= original:
        raise ValueError(
            f"--length must be above the model's original context {original} (the long factors are used "
            f"past it), got {args.length}"
        )
    if args.keep_first >= original:
        raise ValueError(
            f"--keep-first must be in [0, {original - 1}] (positions kept on plain RoPE, within the "
            f"model's original context {original}), got {args.keep_first}"
        )
    return original


def _documents(args: argparse.Namespace, source: Path) -> list[torch.Tensor]:
    """The first ``--length`` tokens of the first ``--documents`` documents of ``--data`` that are that long
    (token id tensors, ``source``'s tokenizer); refuses text with none."""
    from transformers import AutoTokenizer

    from ..data import encode_documents, load_texts

    documents = encode_documents(load_texts(args.data, split=args.split), AutoTokenizer.from_pretrained(source))
    long_enough = [d[: args.length] for d in documents if len(d) >= args.length][: args.documents]
    if not long_enough:
        longest = max((len(d) for d in documents), default=0)
        raise ValueError(
            f"--length {args.length} is beyond the text: the longest document of --data has {longest} tokens"
        )
    return long_enough


def _search(
    args: argparse.Namespace, source: Path, documents: list[torch.Tensor], original: int
) -> LongRopeSearchResult:
    """`search_longrope` on the model at ``source`` and ``documents``, its state beside OUT (resumed from there);
    ``--attention-factor longrope`` is LongRoPE's for L_orig ``original``."""
    import torch

    from ..eval.evaluated_model import load_model
    from ..longrope_search import search_longrope
    from ..methods.longrope.config import longrope_attention_factor

    attention_factor = args.attention_factor
    if attention_factor == "longrope":
        attention_factor = longrope_attention_factor(args.factor, original)
    model, _ = load_model(str(source), args.dtype, args.device)
    return search_longrope(
        model,
        torch.stack(documents),
        factor=args.factor,
        length=args.length,
        population=args.population,
        rounds=args.rounds,
        seed=args.seed,
        state_path=_state_path(args),
        score_last=args.score_last,
        attention_factor=attention_factor,
        keep_first=args.keep_first,
        progress=not args.no_progress,
    )


def _write_checkpoint(args: argparse.Namespace, source: Path, documents: int, result: LongRopeSearchResult) -> Path:
    """OUT: ``source`` patched with the searched factors, and ``longrope_search.json`` (settings and ``result``,
    a `LongRopeSearchResult`, over ``documents`` documents) in it."""
    from ..publish import patch_checkpoint

    log: dict[str, Any] = {
        "model": str(source),
        "data": list(args.data),
        "documents": documents,
        "settings": {
            "factor": args.factor,
            "length": args.length,
            "population": args.population,
            "rounds": args.rounds,
            "seed": args.seed,
            "score_last": result.score_last,
            "attention_factor": result.attention_factor,
            "keep_first": result.keep_first,
        },
        "result": result.to_dict(),
    }
    return patch_checkpoint(
        source,
        args.out,
        "longrope",
        args.factor,
        long_factor=result.long_factor,
        attention_factor=result.attention_factor,
        keep_first=result.keep_first,
        override=args.override,
        overwrite=args.overwrite,
        extra_files={"longrope_search.json": json.dumps(log, indent=2)},
    )


def _attention_factor(text: str) -> float | str:
    """``--attention-factor``: ``longrope``, or a finite number > 0 (argparse's message otherwise)."""
    if text == "longrope":
        return text
    return positive_number(text, "expected a finite number > 0 or 'longrope'")


_attention_factor.checked = True  # type: ignore[attr-defined]  # a declared range (tests/commands/test_numeric_flags.py)


def add_parser(subparsers: Any) -> None:
    """Register ``hf-posext search longrope``."""
    parser = subparsers.add_parser("search", help="search a method's parameters on your model and text (longrope)")
    sub = parser.add_subparsers(dest="search_command", required=True)
    p = sub.add_parser("longrope", help="LongRoPE's evolutionary search of per-pair factors; writes a checkpoint")
    p.add_argument("model", help="checkpoint folder (with its tokenizer) or a local .gguf file")
    p.add_argument("out", help="the folder the checkpoint with the searched factors is written to")
    p.add_argument("--factor", type=real(1.0), required=True, help="context scale s >= 1")
    p.add_argument(
        "--length",
        type=whole(2),
        required=True,
        help="target length L (above the original context): "
        "fitness is the perplexity of the first L tokens of each document",
    )
    p.add_argument("--data", nargs="+", required=True, help="text files, folders or globs (as hf-posext eval ppl)")
    p.add_argument("--split", default="train", help="the stdlib split or dataset split of --data (default: train)")
    p.add_argument("--population", type=whole(2), default=64, help="candidates per round (default 64, as LongRoPE)")
    p.add_argument("--rounds", type=whole(0), default=40, help="evolution rounds (default 40, as LongRoPE)")
    p.add_argument(
        "--score-last",
        type=whole(1),
        default=None,
        help="score only the last N tokens of each L-token window (default: all of them)",
    )
    p.add_argument(
        "--keep-first",
        type=whole(0),
        default=0,
        help="keep the first N positions on plain RoPE past "
        "the switch (the paper's n-hat; default 0). N > 0 writes a rope type only hf-posext reads",
    )
    p.add_argument(
        "--attention-factor",
        type=_attention_factor,
        default=None,
        help="the cos/sin multiplier of every candidate: a number > 0, or 'longrope' for LongRoPE's "
        "sqrt(1 + ln s / ln L_orig) (default: YaRN's 0.1 ln s + 1, so the start is YaRN exactly)",
    )
    p.add_argument("--documents", type=whole(1), default=5, help="documents of at least L tokens scored (default 5)")
    p.add_argument("--seed", type=whole(0), default=0, help="random seed (default 0)")
    p.add_argument("--dtype", default="float32", help="weights' dtype (default float32)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1 ...")
    p.add_argument(
        "--override",
        action="store_true",
        help="a checkpoint that ships a scaling (llama3, yarn...): search and write LongRoPE over plain RoPE instead",
    )
    p.add_argument("--overwrite", action="store_true", help="write into a non-empty output folder")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_longrope)
