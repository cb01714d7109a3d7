"""Decode and prefill speed of exact dynamic scaling (hf_posext.exact_dynamic).

Every configuration decodes the last ``--new-tokens`` tokens up to ``factor * L_orig`` with a KV
cache, on one random-weight Llama re-patched before each run (separate copies of the weights
differ by a few percent in speed), in one process; runs are interleaved (``--repeats``
rounds) so that machine load hits all of them alike, and the best round of each is kept. On CPU
the clock is the process's CPU time with one torch thread, so that other jobs on the machine do
not decide the ratio; on a GPU it is wall time. The
ratios are against the static method measured in the same run:

* ``dynamic_ntk`` (exact) vs ``ntk`` (static NTK-aware at ``factor``);
* ``dynamic_yarn`` (exact) vs ``yarn`` (static YaRN at ``factor``);
* transformers' own dynamic path (``exact_cache=False``, stale cached keys) for reference.

The prompt (``factor * L_orig - new_tokens`` tokens) is prefilled once per configuration and its
time reported; every round decodes from that cache and crops it back.

Prefill is measured on its own against transformers' dynamic path (``exact_cache=False``: one
frequency set per forward), the comparison issue 15 sets its goal in: a prompt of each of
``--prefill-multiples`` times ``L_orig`` tokens, patched with ``--prefill-factor`` (8 by default,
so that up to 8x L_orig every row past L_orig has its own frequencies, for YaRN too), best of
``--repeats`` interleaved rounds, each timed after one untimed forward of the freshly patched
model (whose first forward allocates the scratch memory the next ones reuse). Past ``L_orig``
every row of the prompt needs its own rotation of the keys, attended in batched chunks
(docs/notes/exact_dynamic.md).

Run (CPU, a few minutes on 2 cores)::

    .venv/bin/python benchmarks/bench_dynamic_decode.py --out benchmarks/results/dynamic_decode.json

The real model (SmolLM2-135M, L_orig 8192) at 16k tokens, prefill only (about an hour of one core)::

    .venv/bin/python benchmarks/bench_dynamic_decode.py --checkpoint SmolLM2-135M-Instruct.Q4_1.gguf \\
        --prefill-only --prefill-multiples 2 --prefill-factor 4 --repeats 1 --no-prefill-warm-up \\
        --out benchmarks/results/real_model_prefill.json

Laptop-sized smoke run::

    .venv/bin/python benchmarks/bench_dynamic_decode.py --hidden 128 --layers 2 --original-length 64 --new-tokens 16

GPU (bf16)::

    python benchmarks/bench_dynamic_decode.py --device cuda --dtype bfloat16 --hidden 4096 --heads 32 \\
        --kv-heads 8 --layers 4 --original-length 4096 --new-tokens 256
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from harness import Clock, environment, write_results
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import hf_posext
from hf_posext.gguf import resolve_model_source

#: (label, method, exact_cache or None for static methods, label of the static baseline)
RUNS = (
    ("ntk (static)", "ntk", None, None),
    ("dynamic_ntk exact", "dynamic_ntk", True, "ntk (static)"),
    ("dynamic_ntk transformers", "dynamic_ntk", False, "ntk (static)"),
    ("yarn (static)", "yarn", None, None),
    ("dynamic_yarn exact", "dynamic_yarn", True, "yarn (static)"),
    ("dynamic_yarn transformers", "dynamic_yarn", False, "yarn (static)"),
)


def build(args: argparse.Namespace) -> LlamaForCausalLM:
    """The random-weight Llama every configuration runs on (re-patched, so that all share its weights' memory),
    or the ``--checkpoint`` model, whose ``max_position_embeddings`` and vocabulary replace the arguments'."""
    if args.checkpoint is not None:
        model = AutoModelForCausalLM.from_pretrained(
            resolve_model_source(args.checkpoint), dtype=getattr(torch, args.dtype), attn_implementation=args.attention
        )
        config = model.config
        args.original_length, args.vocab = config.max_position_embeddings, config.vocab_size
        args.hidden, args.heads, args.layers = config.hidden_size, config.num_attention_heads, config.num_hidden_layers
        args.kv_heads = config.num_key_value_heads  # recorded in --out as measured
        return model.eval().to(args.device)
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.original_length,
        attn_implementation=args.attention,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval().to(device=args.device, dtype=getattr(torch, args.dtype))


def patch(model: LlamaForCausalLM, args: argparse.Namespace, method: str, exact_cache: bool | None) -> None:
    """Re-patch ``model`` in place (a patch replaces the previous one; it never stacks)."""
    kwargs = {} if exact_cache is None else {"exact_cache": exact_cache}
    hf_posext.patch_model(model, method, factor=args.factor, **kwargs)


def clock(device: str) -> Clock:
    """CPU time of this process on CPU (robust to other jobs sharing the cores), wall time on a GPU."""
    return Clock(device, cpu_time=None)


@torch.inference_mode()
def prefill(model: LlamaForCausalLM, prompt: torch.Tensor, device: str) -> tuple[float, Any, torch.Tensor]:
    """``(seconds, cache, next token [batch, 1])`` of the forward over ``prompt`` ``[batch, seq]``."""
    # logits_to_keep=1 as generate(): the next token's logits only
    seconds, out = clock(device).time(lambda: model(prompt, use_cache=True, logits_to_keep=1))
    return seconds, out.cache, out.logits[:, -1:].argmax(-1)


@torch.inference_mode()
def decode(model: LlamaForCausalLM, cache: Any, token: torch.Tensor, new_tokens: int, device: str) -> float:
    """Seconds to decode ``new_tokens`` greedily after the prefilled ``cache``, which is cropped back after."""

    def steps() -> None:
        nonlocal cache, token
        for _ in range(new_tokens):
            out = model(token, cache=cache, use_cache=True)
            cache, token = out.cache, out.logits[:, -1:].argmax(-1)

    seconds, _ = clock(device).time(steps)
    cache.crop(-new_tokens)
    return seconds


def prefill_ratios(model: LlamaForCausalLM, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Exact prefill against transformers' dynamic prefill, per method and prompt length (best of the rounds)."""
    generator = torch.Generator().manual_seed(2)
    best: dict[tuple[str, bool, int], float] = {}
    for _ in range(args.repeats):
        for multiple in args.prefill_multiples:
            prompt = torch.randint(0, args.vocab, (args.batch, multiple * args.original_length), generator=generator)
            for method in ("dynamic_ntk", "dynamic_yarn"):
                for exact in (True, False):
                    hf_posext.patch_model(model, method, factor=args.prefill_factor, exact_cache=exact)
                    if args.prefill_warm_up:
                        prefill(model, prompt.to(args.device), args.device)  # a patched model's first forward allocates
                    seconds = prefill(model, prompt.to(args.device), args.device)[0]
                    best[method, exact, multiple] = min(seconds, best.get((method, exact, multiple), seconds))
    rows = []
    for multiple in args.prefill_multiples:
        for method in ("dynamic_ntk", "dynamic_yarn"):
            exact, native = best[method, True, multiple], best[method, False, multiple]
            rows.append({"method": method, "multiple_of_original": multiple, "tokens": multiple * args.original_length,
                         "exact_prefill_s": exact, "transformers_prefill_s": native, "ratio": exact / native})
            print(f"prefill {method:13s} {multiple}x L_orig: exact {exact:7.3f} s, transformers {native:7.3f} s, "
                  f"{exact / native:.2f}x")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--original-length", type=int, default=256, help="L_orig")
    parser.add_argument("--factor", type=float, default=4.0)
    parser.add_argument("--new-tokens", type=int, default=64, help="decoded tokens, ending at factor * L_orig")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--attention", default="sdpa", choices=("sdpa", "eager"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: stable CPU-time numbers)")
    parser.add_argument("--prefill-multiples", type=lambda text: [int(v) for v in text.split(",")], default=[4, 8],
                        help="prompt lengths of the prefill comparison, in multiples of L_orig")
    parser.add_argument("--prefill-factor", type=float, default=8.0, help="the factor the prefill comparison patches")
    parser.add_argument("--checkpoint", default=None,
                        help="a pretrained model (folder or .gguf file) instead of the random Llama; its "
                             "max_position_embeddings is L_orig (the shape arguments are ignored)")
    parser.add_argument("--prefill-warm-up", action=argparse.BooleanOptionalAction, default=True,
                        help="one untimed forward before each timed prefill (--no-prefill-warm-up for long prompts, "
                             "whose scratch memory is not kept between forwards anyway)")
    parser.add_argument("--prefill-only", action="store_true", help="only the prefill comparison (no decoding)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = build(args)
    results = [] if args.prefill_only else decode_ratios(model, args)
    prefills = prefill_ratios(model, args)
    if args.out is not None:
        report = {"args": {k: str(v) for k, v in vars(args).items()}, "results": results, "prefill": prefills,
                  "clock": clock(args.device).name, "environment": environment(args.device)}
        write_results(args.out, report, results + prefills)


def decode_ratios(model: LlamaForCausalLM, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Decoding speed of every configuration of :data:`RUNS`, and its ratio to the static method."""
    total = int(args.factor * args.original_length)
    if args.new_tokens >= total:
        raise ValueError(f"--new-tokens must be below factor * L_orig = {total}, got {args.new_tokens}")
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, args.vocab, (args.batch, total - args.new_tokens), generator=generator)
    prompt = prompt.to(args.device)
    # The prompt is prefilled once per configuration (a prompt past L_orig is the exact path's slow
    # part); each round then decodes from that state (the cache is cropped back after a round).
    prefilled = {}
    for label, method, exact, _ in RUNS:
        patch(model, args, method, exact)
        prefilled[label] = prefill(model, prompt, args.device)
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.repeats):
        for label, method, exact, _ in RUNS:
            patch(model, args, method, exact)
            seconds_prefill, cache, token = prefilled[label]
            seconds = decode(model, cache, token, args.new_tokens, args.device)
            best[label] = (seconds_prefill, min(seconds, best.get(label, (0, seconds))[1]))

    results = []
    for label, method, exact, baseline in RUNS:
        prefill_s, seconds = best[label]
        row = {
            "label": label,
            "method": method,
            "exact_cache": exact,
            "decode_tokens_per_s": args.batch * args.new_tokens / seconds,
            "prefill_s": prefill_s,
        }
        if baseline is not None:
            row["decode_ratio_vs_static"] = best[baseline][1] / seconds
            row["prefill_ratio_vs_static"] = best[baseline][0] / prefill_s
        results.append(row)
        ratio = f"  {row['decode_ratio_vs_static']:.3f}x static" if baseline else ""
        print(f"{label:28s} {row['decode_tokens_per_s']:9.1f} tok/s  prefill {prefill_s:7.3f} s{ratio}")
    return results


if __name__ == "__main__":
    main()
