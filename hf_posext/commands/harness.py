"""``hf-posext eval harness``: lm-evaluation-harness tasks on a patched model (lm-eval's numbers and results JSON).

    hf-posext eval harness path/to/model --method yarn --factor 4 --tasks hellaswag --out yarn.json
    hf-posext eval harness path/to/model --method yarn --factor 2 --tasks mytask --include-path tasks/   # offline

Needs lm-eval 0.4.x (``pip install 'hf-posext[harness]'``); the library side is `hf_posext.eval.harness`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .arguments import add_set_argument, check_factor, default_out, method_kwargs, real, whole


def _metadata(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--metadata must be a JSON object, got {text!r} ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"--metadata must be a JSON object, got {text!r}")
    return value


def _main(args: argparse.Namespace) -> int:
    from ..eval.harness import lm_eval_module, run_harness, write_results
    from ..files import check_output_file
    from ..methods import method_config

    lm_eval_module()  # before anything loads: one line naming the extra
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise ValueError(f"--tasks names no task, got {args.tasks!r}")
    extra = method_kwargs(args.set)
    if args.method == "none" and (args.factor is not None or extra):
        given = "--factor" if args.factor is not None else "--set"
        raise ValueError(
            f"{given} applies to --method, which is not given: add --method (hf-posext methods lists them)"
        )
    if args.method != "none":
        check_factor(args.method, args.factor, extra)
        method_config(args.method, **({} if args.factor is None else {"factor": args.factor}), **extra)
    if args.include_path is not None and not Path(args.include_path).is_dir():
        raise FileNotFoundError(f"--include-path {args.include_path!r} is not a folder (of lm-eval task YAMLs)")
    metadata = _metadata(args.metadata)
    out = check_output_file(args.out, sources=[args.model], overwrite=args.overwrite)  # before lm-eval runs
    from ..eval.evaluated_model import load_model
    from ..gguf import resolve_model_source
    from ..patching import patch_model

    metadata.setdefault("tokenizer", resolve_model_source(args.model))  # RULER sizes its prompts with it

    model, tokenizer = load_model(args.model, args.dtype, args.device, args.attn_implementation)
    if args.method != "none":
        patch_model(model, args.method, **({} if args.factor is None else {"factor": args.factor}), **extra)
    results = run_harness(
        model,
        tokenizer,
        tasks,
        include_path=args.include_path,
        batch_size=args.batch_size,
        limit=args.limit,
        num_fewshot=args.num_fewshot,
        max_length=args.max_length,
        seed=args.seed,
        metadata=metadata,
    )
    from lm_eval.utils import make_table

    print(make_table(results))
    print(f"wrote {write_results(results, out, overwrite=args.overwrite)}")
    return 0


def add_parser(sub: Any, dtypes: tuple[str, ...]) -> None:
    """Register ``hf-posext eval harness`` under ``hf-posext eval``'s ``sub`` (``dtypes``: ``--dtype``'s choices)."""
    p = sub.add_parser("harness", help="lm-evaluation-harness tasks on the patched model (lm-eval's results JSON)")
    p.add_argument("model", help="checkpoint folder or Hub id (with its tokenizer), or a local .gguf file")
    p.add_argument(
        "--tasks", required=True, help="comma-separated lm-eval tasks or groups, e.g. hellaswag,niah_single_1"
    )
    p.add_argument("--method", default="none", help="the method to patch with (hf-posext methods); none: as saved")
    p.add_argument("--factor", type=real(1.0), default=None, help="context scale s >= 1 for --method")
    add_set_argument(p)
    p.add_argument("--include-path", default=None, help="a folder of extra lm-eval task YAMLs (local tasks)")
    p.add_argument(
        "--out",
        default=f"{default_out('eval-harness')}/results.json",
        help="lm-eval's results JSON (default: %(default)s)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.add_argument("--limit", type=whole(1), default=None, help="documents per task (default: all)")
    p.add_argument("--num-fewshot", type=whole(0), default=None, help="few-shot examples (default: each task's own)")
    p.add_argument("--batch-size", type=whole(1), default=1, help="requests per forward (default 1)")
    p.add_argument(
        "--max-length",
        type=whole(1),
        default=None,
        help="the context lm-eval uses (default: the patch's context_length, else lm-eval's own)",
    )
    p.add_argument(
        "--metadata",
        default=None,
        help="JSON given to every task, as lm-eval's --metadata: e.g. '{\"max_seq_lengths\": [8192, 16384]}' for "
        "RULER (its tokenizer defaults to the model's)",
    )
    p.add_argument("--seed", type=whole(0), default=0, help="lm-eval's random, numpy, torch and few-shot seeds")
    p.add_argument("--dtype", default="auto", choices=dtypes, help="weights' dtype; auto: the checkpoint's (default)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ...")
    p.add_argument("--attn-implementation", default=None, help="sdpa, eager, flash_attention_2 ...")
    p.set_defaults(func=_main)
