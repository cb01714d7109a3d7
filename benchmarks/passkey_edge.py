"""Is a passkey miss at the prompt's edge the length or the prompt? Ten keys at a few depths of one length.

docs/results/finetune_smollm2.md's passkey cells put key i (``training_free_real_model.key_seed``) at one
depth each (``key_schedule``), so a miss at depth 1.0 (the key line right before the
question) cannot tell the key from the depth. This asks ``--keys`` keys (the same seeds) at each of
``--depths`` of one ``--length``: a miss that stays at one depth for every key, at a length inside the
model's trained context, is the prompt's, not the context extension's. Rows (``result_schema``), one per
key, resumed per key:

    python benchmarks/passkey_edge.py SmolLM2-135M-Instruct.Q4_1.gguf --row none
    python benchmarks/passkey_edge.py runs/smollm2-32k-long --row "long-short mix, 400 steps"
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from harness import Results

from training_free_real_model import key_seed, passkey_sample

from hf_posext.eval.evaluated_model import load_model

OUT = Path(__file__).resolve().parent / "results" / "finetune_smollm2" / "passkey_edge.json"
BENCHMARK = "passkey_edge"


def summary(rows: list, length: int) -> str:
    """``row depth: found/asked`` lines of ``rows`` at ``length``."""
    cells: dict[tuple[str, float], list[bool]] = {}
    for row in rows:
        if row.setting["length"] == length:
            cells.setdefault((row.method, row.setting["depth"]), []).append(bool(row.value))
    return "\n".join(f"{name} {length} depth {depth}: {sum(hits)}/{len(hits)}" for (name, depth), hits in cells.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a checkpoint folder or a .gguf file")
    parser.add_argument("--row", required=True, help="the row's name (the results page's row names)")
    parser.add_argument("--length", type=int, default=4096, help="prompt length in tokens (default 4096)")
    parser.add_argument("--keys", type=int, default=10, help="keys per depth, seeds 1000 i + 7 (default 10)")
    parser.add_argument("--depths", type=float, nargs="+", default=[1.0, 0.95, 0.0])
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.keys < 1:
        parser.error(f"--keys must be at least 1, got {args.keys}")
    torch.set_num_threads(args.threads)
    results = Results(args.out, BENCHMARK, setting={"dtype": args.dtype}, scope={"dtype": args.dtype}, resume=True)
    done = {(r.method, r.setting["length"], r.setting["depth"], r.setting["key"]) for r in results.rows}
    model, tokenizer = load_model(args.model, dtype=args.dtype, device="cpu", attn_implementation="sdpa")
    for depth in args.depths:
        for key in range(args.keys):
            if (args.row, args.length, depth, key) in done:
                continue
            found = passkey_sample(model, tokenizer, args.length, key, depth)
            setting = {"length": args.length, "depth": depth, "key": key, "seed": key_seed(key)}
            results.add(args.row, "passkey", bool(found["correct"]), setting=setting, output=found["continuation"])
            results.save()
    print(summary([r for r in results.rows if r.method == args.row], args.length))
    return 0


if __name__ == "__main__":
    sys.exit(main())
