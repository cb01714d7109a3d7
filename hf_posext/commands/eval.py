"""``hf-posext eval ppl|passkey``: evaluate a checkpoint, optionally patched, against context length.

    hf-posext eval ppl path/to/model --data stdlib --lengths 2048,4096,8192 --method none,yarn --factor 4
    hf-posext eval ppl path/to/model --data docs/ --lengths 4096,8192 --mode sliding --stride 256
    hf-posext eval passkey path/to/model --lengths 4096,8192,16384 --trials 10 --method yarn --factor 4

Each writes ``ppl.{json,csv,png}`` or ``passkey.{json,csv,png}`` under ``--out``. Results are
saved after every method, and a rerun with the same settings on the same model content (not the
same path: a model retrained in place is evaluated again) skips the methods already done. Every
method name, argument and length is checked before the model loads.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..eval.checkpoint import DTYPES, load_model, model_fingerprint
from ..files import check_output_dir
from ..methods import make_method
from ..patching import patch_info, patch_model, unpatch_model
from .arguments import check_factor, default_out, method_kwargs

def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one integer, got {text!r}")
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"lengths must be positive integers, got {text!r}")
    return values


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """Everything the results depend on, the model by its content (:func:`model_fingerprint`)."""
    settings = {k: v for k, v in vars(args).items() if k not in ("func", "out", "overwrite", "no_progress", "debug", "model", "command_argv")}
    return {"model_content": model_fingerprint(args.model), **settings}


class _Patched:
    """``with _Patched(model, "yarn", factor=4):`` patches for the block; ``"none"`` leaves the model alone."""

    def __init__(self, model: Any, method: str, factor: float | None, extra: dict[str, Any]) -> None:
        self.model, self.method, self.factor, self.extra = model, method, factor, extra

    def __enter__(self) -> dict[str, Any]:
        if self.method != "none":
            patch_model(self.model, self.method, factor=self.factor, **self.extra)
        return patch_info(self.model)

    def __exit__(self, *exc: Any) -> None:
        if self.method != "none":
            unpatch_model(self.model)


def _checked_methods(args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    """``--method``'s names and ``--set``'s arguments, every one checked before a model loads.

    Raises:
        ValueError: an unknown method, a scaling method without ``--factor``, an argument a method
            does not take or a bad value, naming it.
    """
    methods, extra = _names(args.method), method_kwargs(args.set)
    if not methods:
        raise ValueError(f"--method names no method, got {args.method!r}")
    for method in methods:
        if method != "none":
            # A context-scaling method without --factor would silently be the identity.
            check_factor(method, args.factor)
            make_method(method, **({} if args.factor is None else {"factor": args.factor}), **extra)
    return methods, extra


def _ppl(args: argparse.Namespace) -> int:
    from ..data import encode_documents, load_texts
    from ..eval.perplexity import sliding_window_perplexity, truncated_perplexity
    from ..eval.report import ResultFile, markdown_table, plot_curves, write_csv

    methods, extra = _checked_methods(args)
    modes = ["truncated", "sliding"] if args.mode == "both" else [args.mode]
    settings = _settings(args)
    out = check_output_dir(args.out, overwrite=args.overwrite, owns=("ppl.*",), reuse_own=True)
    done = ResultFile(out / "ppl.json", settings)
    results = done.results
    model, tokenizer = load_model(args.model, args.dtype, args.device, args.attn_implementation)
    docs = encode_documents(load_texts(args.data, split=args.split, text_field=args.text_field), tokenizer)
    for method in methods:
        for mode in modes:
            key = f"{method}/{mode}"
            if key in done:
                print(f"{key}: done in an earlier run, skipped")
                continue

            def measure(method: str = method, mode: str = mode) -> dict[str, Any]:
                with _Patched(model, method, args.factor, extra) as info:
                    if mode == "truncated":
                        points = truncated_perplexity(
                            model, docs, args.lengths, score_last=args.score_last, max_documents=args.max_documents,
                            batch_size=args.batch_size, progress=not args.no_progress,
                        )
                    else:
                        points = sliding_window_perplexity(
                            model, docs, args.lengths, args.stride, max_documents=args.max_documents,
                            document_tokens=args.document_tokens, progress=not args.no_progress,
                        )
                return {"patch": info, "points": [p.to_dict() for p in points]}

            done.get(key, measure)
    rows = [{"method": k.split("/")[0], "mode": k.split("/")[1], **p} for k, r in results.items() for p in r["points"]]
    write_csv(out / "ppl.csv", rows)
    lengths = sorted(args.lengths)
    table = markdown_table(
        ["method/mode", *map(str, lengths)],
        [[k, *[{p["length"]: p["perplexity"] for p in r["points"]}.get(n) for n in lengths]] for k, r in results.items()],
    )
    plot_curves(
        out / "ppl.png",
        {k: ([p["length"] for p in r["points"]], [p["perplexity"] for p in r["points"]]) for k, r in results.items()},
        title=f"{Path(args.model).name}: perplexity vs context",
        vline=getattr(model.config, "max_position_embeddings", None),
    )
    print(table)
    print(f"wrote {out / 'ppl.json'}, {out / 'ppl.csv'}, {out / 'ppl.png'}")
    return 0


def _passkey(args: argparse.Namespace) -> int:
    from ..eval.passkey import passkey_accuracy
    from ..eval.report import ResultFile, markdown_table, plot_heatmaps, write_csv

    methods, extra = _checked_methods(args)
    settings = _settings(args)
    out = check_output_dir(args.out, overwrite=args.overwrite, owns=("passkey.*",), reuse_own=True)
    done = ResultFile(out / "passkey.json", settings)
    results = done.results
    model, tokenizer = load_model(args.model, args.dtype, args.device, args.attn_implementation)
    for method in methods:
        if method in done:
            print(f"{method}: done in an earlier run, skipped")
            continue

        def measure(method: str = method) -> dict[str, Any]:
            with _Patched(model, method, args.factor, extra) as info:
                result = passkey_accuracy(
                    model, tokenizer, args.lengths, args.depths, args.trials, seed=args.seed,
                    progress=not args.no_progress,
                )
            return {"patch": info, **result.to_dict()}

        done.get(method, measure)
    write_csv(
        out / "passkey.csv",
        [
            {"method": m, "length": n, "prompt_tokens": r["prompt_tokens"][j], "depth": d, "accuracy": r["accuracy"][i][j]}
            for m, r in results.items()
            for i, d in enumerate(r["depths"])
            for j, n in enumerate(r["lengths"])
        ],
    )
    plot_heatmaps(
        out / "passkey.png",
        {m: (r["lengths"], r["depths"], r["accuracy"]) for m, r in results.items()},
        title=f"{Path(args.model).name}: passkey retrieval",
    )
    print(markdown_table(["method", *map(str, args.lengths)], [[m, *r["accuracy_by_length"]] for m, r in results.items()]))
    print(f"wrote {out / 'passkey.json'}, {out / 'passkey.csv'}, {out / 'passkey.png'}")
    return 0


def _common(p: argparse.ArgumentParser, out: str) -> None:
    p.add_argument("model", help="checkpoint folder or Hub id (with its tokenizer), or a local .gguf file")
    p.add_argument("--lengths", type=_ints, required=True, help="comma-separated context lengths, e.g. 2048,4096,8192")
    p.add_argument("--method", default="none",
                   help="comma-separated methods to compare (hf-posext methods lists them), 'none' = the checkpoint "
                        "as is (default: none)")
    p.add_argument("--factor", type=float, default=None, help="context scale s for --method")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="a method argument, e.g. beta_fast=32 (repeatable)")
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="weights' dtype; auto: the checkpoint's (default)")
    p.add_argument("--device", default="auto",
                   help="auto (spread over every visible GPU; CPU without one), or one device: cpu, cuda:1 ...")
    p.add_argument("--attn-implementation", default=None, help="sdpa, eager, flash_attention_2 ...")
    p.add_argument("--out", default=out, help=f"output folder (default: ./{out})")
    p.add_argument("--overwrite", action="store_true",
                   help="write into an output folder holding other files (they are kept)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_parser(subparsers: Any) -> None:
    """Register ``hf-posext eval ppl`` and ``hf-posext eval passkey``."""
    parser = subparsers.add_parser("eval", help="perplexity or passkey retrieval against context length")
    sub = parser.add_subparsers(dest="eval_command", required=True)

    p = sub.add_parser("ppl", help="perplexity against context length (JSON, CSV, PNG)")
    _common(p, default_out("eval-ppl"))
    p.add_argument("--data", nargs="+", default=["stdlib"],
                   help="files, folders, globs, 'stdlib' (held-out stdlib sources) or one dataset name, as the recipe's "
                        "--dataset (default: stdlib)")
    p.add_argument("--split", default="test", help="dataset split, or the stdlib split (default: test)")
    p.add_argument("--text-field", "--text-column", dest="text_field", default="text",
                   help=".jsonl field or dataset column with the text (default: text), as in the recipe")
    p.add_argument("--mode", default="truncated", choices=["truncated", "sliding", "both"],
                   help="truncated: first L tokens of each document, one forward; sliding: windows of L with --stride")
    p.add_argument("--stride", type=int, default=256, help="sliding-window stride (default 256, as YaRN)")
    p.add_argument("--document-tokens", type=int, default=None,
                   help="sliding mode: read the first N tokens of each document (default: the longest length)")
    p.add_argument("--score-last", type=int, default=None, help="truncated mode: score only the last N tokens")
    p.add_argument("--max-documents", type=int, default=20, help="documents per length (default 20)")
    p.add_argument("--batch-size", type=int, default=1, help="truncated mode: documents per forward")
    p.set_defaults(func=_ppl)

    p = sub.add_parser("passkey", help="passkey retrieval accuracy by length and key depth (JSON, CSV, heat-map PNG)")
    _common(p, default_out("eval-passkey"))
    p.add_argument("--depths", type=_floats, default=[0.0, 0.25, 0.5, 0.75, 1.0], help="key depths in [0, 1]")
    p.add_argument("--trials", type=int, default=5, help="prompts per (length, depth) (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seeds the keys")
    p.set_defaults(func=_passkey)


__all__ = ["add_parser", "load_model", "model_fingerprint"]
