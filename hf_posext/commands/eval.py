r"""``hf-posext eval ppl|passkey``: evaluate a checkpoint, optionally patched, against context length.

    hf-posext eval ppl path/to/model --data stdlib --lengths 2048,4096,8192 --method none,yarn --factor 4
    hf-posext eval ppl path/to/model --data docs/ --lengths 4096,8192 --mode sliding --stride 256
    hf-posext eval passkey path/to/model --lengths 4096,8192,16384 --trials 10 --method yarn --factor 4
    hf-posext eval ruler path/to/model --lengths 4096,8192,16384 --tasks niah,vt --samples 50 \
        --method none,yarn --factor 2

Each writes ``ppl.{json,csv,png}``, ``passkey.{json,csv,png}`` or ``ruler.{json,csv,md}`` and ``ruler_{niah,tasks}.png``
under ``--out``. Results are saved after every method, and a rerun with the same settings on the same model content
(not the same path) skips the methods already done; passkey and ruler keep each finished prompt of a result cut short
(Ctrl-C, a kill) in ``*.prompts.jsonl`` and ask only the rest. Every method name, argument and length is checked first.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..files import check_output_dir, write_text
from ..methods import method_config
from ..patching import patch_info, patch_model, snapshot_model
from ..patching.transaction import Snapshot, restore
from . import harness
from .arguments import check_factor, default_out, method_kwargs, real, whole

if TYPE_CHECKING:
    from ..eval.evaluated_model import load_model, model_fingerprint

#: ``--dtype`` choices: `hf_posext.eval.evaluated_model.DTYPES`, spelled here so that ``--help`` does not
#: import the evaluation package (tests/commands/test_eval.py checks the two agree).
DTYPES = ("auto", "float32", "bfloat16", "float16")


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


_ints.checked = True  # type: ignore[attr-defined]


def _depths(text: str) -> list[float]:
    depth = real(0.0, 1.0)
    values = [depth(v.strip()) for v in text.split(",") if v.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated depths in [0, 1], got {text!r}")
    return values


_depths.checked = True  # type: ignore[attr-defined]


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """Everything the results depend on, the model by its content (`model_fingerprint`)."""
    from ..eval.evaluated_model import model_fingerprint

    settings = {
        k: v
        for k, v in vars(args).items()
        if k not in ("func", "out", "overwrite", "no_progress", "debug", "model", "command_argv")
    }
    return {"model_content": model_fingerprint(args.model), **settings}


class _Patched:
    """``with _Patched(model, "yarn", factor=4):`` patches for the block; ``"none"`` leaves the model alone.

    Leaving the block restores the model as it was on entry (a checkpoint saved patched stays
    patched for the next method and for ``none``), not the checkpoint's base rope.
    """

    def __init__(self, model: Any, method: str, factor: float | None, extra: dict[str, Any]) -> None:
        self.model, self.method, self.factor, self.extra = model, method, factor, extra
        self.saved: Snapshot | None = None

    def __enter__(self) -> dict[str, Any]:
        if self.method != "none":
            self.saved = snapshot_model(self.model)
            patch_model(self.model, self.method, factor=self.factor, **self.extra)
        return patch_info(self.model)

    def __exit__(self, *exc: Any) -> None:
        if self.saved is not None:
            restore(self.saved)
            self.saved = None


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
            check_factor(method, args.factor, extra)
            method_config(method, **({} if args.factor is None else {"factor": args.factor}), **extra)
    return methods, extra


def _ppl(args: argparse.Namespace) -> int:
    from ..data import encode_documents, load_texts
    from ..eval import evaluated_model
    from ..eval.perplexity import sliding_window_perplexity, truncated_perplexity
    from ..eval.report import ResultFile, markdown_table, plot_curves, write_csv

    methods, extra = _checked_methods(args)
    modes = ["truncated", "sliding"] if args.mode == "both" else [args.mode]
    settings = _settings(args)
    out = check_output_dir(args.out, overwrite=args.overwrite, owns=("ppl.*",), reuse_own=True)
    done = ResultFile(out / "ppl.json", settings, overwrite=args.overwrite)
    results = done.results
    model, tokenizer = evaluated_model.load_model(args.model, args.dtype, args.device, args.attn_implementation)
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
                            model,
                            docs,
                            args.lengths,
                            score_last=args.score_last,
                            max_documents=args.max_documents,
                            batch_size=args.batch_size,
                            progress=not args.no_progress,
                        )
                    else:
                        points = sliding_window_perplexity(
                            model,
                            docs,
                            args.lengths,
                            args.stride,
                            max_documents=args.max_documents,
                            document_tokens=args.document_tokens,
                            progress=not args.no_progress,
                        )
                return {"patch": info, "points": [p.to_dict() for p in points]}

            done.get(key, measure)
    rows = [{"method": k.split("/")[0], "mode": k.split("/")[1], **p} for k, r in results.items() for p in r["points"]]
    write_csv(out / "ppl.csv", rows)
    lengths = sorted(args.lengths)
    table = markdown_table(
        ["method/mode", *map(str, lengths)],
        [
            [k, *[{p["length"]: p["perplexity"] for p in r["points"]}.get(n) for n in lengths]]
            for k, r in results.items()
        ],
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
    from ..eval import evaluated_model
    from ..eval.passkey import passkey_accuracy
    from ..eval.prompt_log import PromptLog
    from ..eval.report import ResultFile, markdown_table, plot_heatmaps, write_csv

    methods, extra = _checked_methods(args)
    settings = _settings(args)
    out = check_output_dir(args.out, overwrite=args.overwrite, owns=("passkey.*",), reuse_own=True)
    done = ResultFile(out / "passkey.json", settings, overwrite=args.overwrite)
    prompts = PromptLog(out / "passkey.prompts.jsonl", settings)  # a method cut short keeps its finished prompts
    results = done.results
    model, tokenizer = evaluated_model.load_model(args.model, args.dtype, args.device, args.attn_implementation)
    for method in methods:
        if method in done:
            print(f"{method}: done in an earlier run, skipped")
            continue

        def measure(method: str = method) -> dict[str, Any]:
            with _Patched(model, method, args.factor, extra) as info:
                result = passkey_accuracy(
                    model,
                    tokenizer,
                    args.lengths,
                    args.depths,
                    args.trials,
                    seed=args.seed,
                    progress=not args.no_progress,
                    finished=prompts.finished(method),
                    on_prompt=lambda index, sample: prompts.add(method, index, sample),
                )
            return {"patch": info, **result.to_dict()}

        done.get(method, measure)
        prompts.forget(method)
    write_csv(
        out / "passkey.csv",
        [
            {
                "method": m,
                "length": n,
                "prompt_tokens": r["prompt_tokens"][j],
                "depth": d,
                "accuracy": r["accuracy"][i][j],
                "n": r["trials"],
                "low": r["interval"][i][j][0],
                "high": r["interval"][i][j][1],
            }
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
    print(
        markdown_table(
            ["method", *map(str, args.lengths)],
            [
                [m, *[f"{c['accuracy']:.0f}% [{c['low']:.0f}, {c['high']:.0f}] n={c['n']}" for c in r["by_length"]]]
                for m, r in results.items()
            ],
        )
    )
    print(f"wrote {out / 'passkey.json'}, {out / 'passkey.csv'}, {out / 'passkey.png'}")
    return 0


def _context_limit(model: str, methods: list[str], factor: float | None, extra: dict[str, Any]) -> tuple[int, int, str]:
    """``(pretrained, reachable, as saved)``: the checkpoint's pretraining context, the longest any of ``methods``
    gives it (``none``: the checkpoint as saved, an hf-posext patch included), and what a patch saved gives, in words
    (config only)."""
    from transformers import AutoConfig

    from ..gguf import resolve_model_source

    config = AutoConfig.from_pretrained(resolve_model_source(model))
    info = patch_info(config)
    pretrained = int(info.get("original_max_position_embeddings") or config.max_position_embeddings)
    reach = int(info.get("context_length") or config.max_position_embeddings)
    saved = f"; as saved: {info['method']} to {reach}" if info.get("method") else ""
    for method in methods:
        if method != "none":
            patched = patch_model(copy.deepcopy(config), method, factor=factor, **extra)
            patched_info = patch_info(patched)
            reach = max(reach, int(patched_info.get("context_length") or patched_info["max_position_embeddings"]))
    return pretrained, reach, saved


class _MethodCells:
    """``ruler_accuracy``'s store for one method: cells kept in the result file as ``method/task/length``."""

    def __init__(self, done: Any, method: str, patch: dict[str, Any]) -> None:
        self.done, self.method, self.patch = done, method, patch

    def get(self, key: str, compute: Any) -> Any:
        return self.done.get(f"{self.method}/{key}", lambda: {"patch": self.patch, **compute()})


def _ruler(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from ..eval import evaluated_model
    from ..eval.prompt_log import PromptLog
    from ..eval.report import ResultFile, write_csv, write_json
    from ..eval.ruler import QUICK, TASKS, resolve_tasks, ruler_accuracy
    from ..eval.ruler.fit import minimum_length, wrapper_for
    from ..eval.ruler.results import csv_rows, plot_results, summarise, task_table
    from ..gguf import resolve_model_source

    methods, extra = _checked_methods(args)
    tasks = resolve_tasks(args.tasks or (",".join(QUICK) if args.quick else "all"))
    samples = args.samples or (2 if args.quick else 20)
    if samples < 1:
        raise ValueError(f"--samples must be >= 1, got {samples}")
    trained, reach, saved = _context_limit(args.model, methods, args.factor, extra)
    if max(args.lengths) > reach:
        raise ValueError(
            f"--lengths {max(args.lengths)} is longer than the model can take with --method {args.method}: "
            f"{reach} tokens (pretrained context {trained}{saved}); use a method that extends it (e.g. --method "
            f"none,yarn --factor {math.ceil(100 * max(args.lengths) / trained) / 100:g}) or shorter lengths"
        )
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_source(args.model))
    wrapper = wrapper_for(tokenizer, False if args.no_chat_template else None)
    for task in tasks:
        shortest = minimum_length(tokenizer, TASKS[task], min(args.lengths), wrapper)
        if min(args.lengths) < shortest:
            raise ValueError(
                f"--lengths {min(args.lengths)} is too short for {task}: its prompt and answer need at "
                f"least {shortest} tokens with this tokenizer"
            )
    # Cells are keyed method/task/length, so adding lengths, tasks or methods later resumes the rest.
    settings = {
        k: v for k, v in _settings(args).items() if k not in ("lengths", "tasks", "method", "quick", "batch_size")
    } | {"samples": samples}
    out = check_output_dir(args.out, overwrite=args.overwrite, owns=("ruler.*", "ruler_*"), reuse_own=True)
    done = ResultFile(out / "ruler.json", settings, overwrite=args.overwrite)
    prompts = PromptLog(out / "ruler.prompts.jsonl", settings)
    model, tokenizer = evaluated_model.load_model(args.model, args.dtype, args.device, args.attn_implementation)
    for method in methods:
        if all(f"{method}/{t}/{n}" in done for t in tasks for n in args.lengths):
            print(f"{method}: done in an earlier run, skipped")
            continue
        with _Patched(model, method, args.factor, extra) as info:
            ruler_accuracy(
                model,
                tokenizer,
                args.lengths,
                tasks,
                samples,
                seed=args.seed,
                batch_size=args.batch_size,
                chat_template=False if args.no_chat_template else None,
                max_new_tokens=args.max_new_tokens,
                store=_MethodCells(done, method, info),
                progress=not args.no_progress,
                prompts=prompts.under(method),  # a cell cut short keeps its finished prompts
            )
    results = done.results
    # The report covers every cell of the folder: earlier runs may have added other lengths, tasks, methods.
    keys = [k.split("/") for k in results]
    methods = list(dict.fromkeys([*methods, *(m for m, _, _ in keys)]))
    tasks = [t for t in TASKS if any(k[1] == t for k in keys)]
    lengths = sorted({int(n) for _, _, n in keys})
    summary_ = summarise(results, methods, tasks, lengths, trained_length=trained)
    payload = json.loads(done.save().read_text())  # a rerun's ResultFile reads settings and results, not the summary
    write_json(out / "ruler.json", {**payload, "summary": summary_})
    write_csv(out / "ruler.csv", csv_rows(results, summary_, methods, tasks, lengths))
    table = task_table(results, summary_, methods, tasks, lengths)
    write_text(out / "ruler.md", table + "\n")
    written = plot_results(out, results, methods, tasks, lengths, Path(args.model).name)
    print(table)
    print(f"wrote {out / 'ruler.json'}, {out / 'ruler.csv'}, {out / 'ruler.md'}" + "".join(f", {p}" for p in written))
    return 0


def _common(p: argparse.ArgumentParser, out: str) -> None:
    p.add_argument("model", help="checkpoint folder or Hub id (with its tokenizer), or a local .gguf file")
    p.add_argument("--lengths", type=_ints, required=True, help="comma-separated context lengths, e.g. 2048,4096,8192")
    p.add_argument(
        "--method",
        default="none",
        help="comma-separated methods to compare (hf-posext methods lists them), 'none' = the checkpoint "
        "as is (default: none)",
    )
    p.add_argument("--factor", type=real(1.0), default=None, help="context scale s >= 1 for --method")
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="a method argument, e.g. beta_fast=32 (repeatable)"
    )
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="weights' dtype; auto: the checkpoint's (default)")
    p.add_argument(
        "--device",
        default="auto",
        help="auto (spread over every visible GPU; CPU without one), or one device: cpu, cuda:1 ...",
    )
    p.add_argument("--attn-implementation", default=None, help="sdpa, eager, flash_attention_2 ...")
    p.add_argument("--out", default=out, help=f"output folder (default: ./{out})")
    p.add_argument(
        "--overwrite", action="store_true", help="write into an output folder holding other files (they are kept)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_parser(subparsers: Any) -> None:
    """Register ``hf-posext eval ppl``, ``hf-posext eval passkey`` and ``hf-posext eval ruler``."""
    parser = subparsers.add_parser(
        "eval", help="perplexity, passkey retrieval or RULER-style tasks against context length"
    )
    sub = parser.add_subparsers(dest="eval_command", required=True)

    p = sub.add_parser("ppl", help="perplexity against context length (JSON, CSV, PNG)")
    _common(p, default_out("eval-ppl"))
    p.add_argument(
        "--data",
        nargs="+",
        default=["stdlib"],
        help="files, folders, globs, 'stdlib' (held-out stdlib sources) or one dataset name, as the recipe's "
        "--dataset (default: stdlib)",
    )
    p.add_argument("--split", default="test", help="dataset split, or the stdlib split (default: test)")
    p.add_argument(
        "--text-field",
        "--text-column",
        dest="text_field",
        default="text",
        help=".jsonl field or dataset column with the text (default: text), as in the recipe",
    )
    p.add_argument(
        "--mode",
        default="truncated",
        choices=["truncated", "sliding", "both"],
        help="truncated: first L tokens of each document, one forward; sliding: windows of L with --stride",
    )
    p.add_argument("--stride", type=whole(1), default=256, help="sliding-window stride (default 256, as YaRN)")
    p.add_argument(
        "--document-tokens",
        type=whole(1),
        default=None,
        help="sliding mode: read the first N tokens of each document (default: the longest length)",
    )
    p.add_argument("--score-last", type=whole(1), default=None, help="truncated mode: score only the last N tokens")
    p.add_argument("--max-documents", type=whole(1), default=20, help="documents per length (default 20)")
    p.add_argument("--batch-size", type=whole(1), default=1, help="truncated mode: documents per forward")
    p.set_defaults(func=_ppl)

    p = sub.add_parser("passkey", help="passkey retrieval accuracy by length and key depth (JSON, CSV, heat-map PNG)")
    _common(p, default_out("eval-passkey"))
    p.add_argument("--depths", type=_depths, default=[0.0, 0.25, 0.5, 0.75, 1.0], help="key depths in [0, 1]")
    p.add_argument("--trials", type=whole(1), default=5, help="prompts per (length, depth) (default 5)")
    p.add_argument("--seed", type=whole(0), default=0, help="seeds the keys")
    p.set_defaults(func=_passkey)

    p = sub.add_parser("ruler", help="RULER-style long-context tasks by length, with Wilson intervals (JSON, CSV, PNG)")
    _common(p, default_out("eval-ruler"))
    p.add_argument(
        "--tasks",
        default=None,
        help="comma-separated tasks or groups: all, niah, niah_single, niah_multikey, multihop, aggregation, "
        "qa, or names such as niah_single_1,vt,cwe (default: all; --quick: one per category)",
    )
    p.add_argument("--samples", type=whole(1), default=None, help="prompts per (task, length) (default 20; --quick: 2)")
    p.add_argument("--quick", action="store_true", help="a smoke run: one task per category, 2 samples")
    p.add_argument("--seed", type=whole(0), default=0, help="seeds every prompt")
    p.add_argument(
        "--batch-size", type=whole(1), default=None, help="prompts per generate call (default: what fits in memory)"
    )
    p.add_argument(
        "--max-new-tokens",
        type=whole(1),
        default=None,
        help="cap every task's generation budget (RULER's: niah 128, vt 30, cwe 120, fwe 50, qa 32) to save time",
    )
    p.add_argument(
        "--no-chat-template", action="store_true", help="plain prompts even if the tokenizer has a chat template"
    )
    p.set_defaults(func=_ruler)
    harness.add_parser(sub, DTYPES)


def __getattr__(name: str) -> Any:
    """``load_model`` and ``model_fingerprint`` (`hf_posext.eval.evaluated_model`), imported on first use."""
    if name in ("load_model", "model_fingerprint"):
        from ..eval import evaluated_model

        return getattr(evaluated_model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["add_parser", "load_model", "model_fingerprint"]
