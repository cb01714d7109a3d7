"""``hf-posext tiny-model OUT``: write a tiny random-weight checkpoint with the byte tokenizer (laptop runs, tests).

hf-posext tiny-model out/tiny-llama --max-position-embeddings 64
hf-posext tiny-model out/tiny-qwen3 --arch qwen3
"""

from __future__ import annotations

import argparse
from typing import Any

from .arguments import plain, whole


def _tiny_model(args: argparse.Namespace) -> int:
    from ..testing import make_tiny_model

    path = make_tiny_model(
        args.output_dir,
        args.arch,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        max_position_embeddings=args.max_position_embeddings,
        seed=args.seed,
    )
    print(f"wrote {path}")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``hf-posext tiny-model``."""
    p.add_argument("output_dir", help="the checkpoint folder to write (config, safetensors weights, byte tokenizer)")
    p.add_argument(
        "--arch",
        default="llama",
        help="model type: llama (default) or another hf-posext supports tiny (an unknown one lists them)",
    )
    p.add_argument(
        "--hidden-size",
        type=whole(8, multiple_of=8),
        default=64,
        help="model width, a multiple of 8: split over 4 query heads and 2 key/value heads "
        "of an even size (default 64)",
    )
    p.add_argument("--num-layers", type=whole(1), default=2, help="decoder layers (default 2)")
    p.add_argument(
        "--max-position-embeddings",
        type=whole(2),
        default=128,
        help="the pretraining context L_orig the methods extend (default 128)",
    )
    p.add_argument("--seed", type=whole(0), default=0, help="seeds the random weights (default 0)")


def add_parser(subparsers: Any) -> None:
    """Register ``hf-posext tiny-model``."""
    p = subparsers.add_parser(
        "tiny-model",
        help="write a tiny random-weight checkpoint (laptop runs, tests)",
        description=plain(__doc__.split("\n\n")[0]),
    )
    add_arguments(p)
    p.set_defaults(func=_tiny_model)
