"""``hf-posext plan``: a fine-tune's memory per process, predicted before anything loads.

    hf-posext plan --config run.yaml --processes 8 --memory 80
    hf-posext plan --model path/with/config.json --seq-len 65536 --lora --memory 24 --json

It takes ``hf-posext finetune``'s flags and ``--config`` (the dataset and output folder may be left
out), plus the layout: ``--processes``, ``--strategy`` (FSDP2 by default on more than one),
``--device``, and ``--memory`` (GiB per device). ``--model`` needs only its config.json. It prints
each term (`hf_posext.train.memory`), the peak, whether it fits, the longest ``seq_len`` that
fits, and where a FLOP rate of the device is recorded, the tokens per second. The maths and how far
it was checked: docs/guides/many_gpus.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .arguments import run_command, take_global_flags
from .finetune import build_parser as recipe_parser
from .finetune import parse_recipe_args
from .memory_check import add_layout_arguments, make_plan, read_shape, render, resolve_layout

PROG = "hf-posext plan"
DESCRIPTION = (
    "Predict a fine-tune's memory per process (the same flags as finetune) and the longest sequence that fits."
)
#: Settings a plan does not need; finetune requires them, so the plan stands in for them.
PLAN_DEFAULTS = {"dataset": ["stdlib"], "output_dir": "plan"}


def build_parser() -> Any:
    parser = recipe_parser(DESCRIPTION, PROG)
    add_layout_arguments(parser)
    return parser


def _run(argv: Sequence[str] | None) -> int:
    config, own = parse_recipe_args(argv, build_parser(), PLAN_DEFAULTS)
    layout = resolve_layout(config, own["processes"], own["strategy"], own["device"])
    plan = make_plan(config, read_shape(config.model), layout, own["memory"])
    print(json.dumps(plan) if own["json"] else render(plan))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``hf-posext plan ARGS``."""
    code, debug, rest = take_global_flags(PROG, argv)
    return code or run_command(PROG, lambda: _run(rest), debug=debug)


def add_parser(subparsers: Any) -> None:
    """Register ``hf-posext plan``: the rest of the line goes to the recipe parser plus the plan's flags."""
    p = subparsers.add_parser(
        "plan",
        help="predict a fine-tune's memory per process and the longest sequence that fits (finetune's flags)",
        add_help=False,
        prefix_chars="\0",
    )
    p.add_argument(
        "plan_args",
        nargs="*",
        help="finetune's flags and --config, plus --processes, --strategy, --device, --memory, --json",
    )
    p.set_defaults(func=lambda args: _run(args.plan_args))
