"""Write a tiny random-weight checkpoint with the byte tokenizer, for laptop runs and tests.

    python scripts/make_tiny_model.py out/tiny-llama
    python scripts/make_tiny_model.py out/tiny-qwen3 --arch qwen3 --max-position-embeddings 256
"""

from __future__ import annotations

import argparse

from hf_posext.testing import TINY_ARCHITECTURES, make_tiny_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output_dir")
    parser.add_argument("--arch", default="llama", choices=TINY_ARCHITECTURES)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--max-position-embeddings", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = make_tiny_model(
        args.output_dir,
        args.arch,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        max_position_embeddings=args.max_position_embeddings,
        seed=args.seed,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
