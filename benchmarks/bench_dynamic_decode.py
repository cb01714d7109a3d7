"""Decode and prefill speed of exact dynamic scaling (hf_posext.attention.exact_dynamic).

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

LongRoPE (``longrope``, its exact cache across the short/long switch) against the plain static
model (the unpatched Llama: one rotation per key, kept in the cache), in two scenarios, each
prefilled afresh every round (untimed): ``across the switch`` decodes ``--new-tokens`` from
``L_orig - new_tokens / 2`` (the steps before L_orig, the one re-rotation of the cache at the
switch, the steps after), ``past the switch`` decodes them from ``factor * L_orig - new_tokens``
after one untimed step (the steady state: a plain cached decode). Rows: transformers' own
``longrope`` (``exact_cache=False``), the exact cache, and the exact cache with ``keep_first=4``.
Their ratio is of the median round (a best round is reported too): on a loaded machine single
rounds of a small model scatter by +-20%, and the best of them is an outlier. ``--interleave steps``
pairs them finer: twins of the model sharing its weights, one per row, take their decoding steps in
turn (step k of every row before step k + 1 of any), so load hits the rows alike within a round.

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

LongRoPE only, small (a minute of one core)::

    .venv/bin/python benchmarks/bench_dynamic_decode.py --longrope-only --hidden 256 --heads 4 --layers 2 \\
        --original-length 128 --new-tokens 64 --repeats 9 --out benchmarks/results/dynamic_decode_longrope.json
    .venv/bin/python benchmarks/bench_dynamic_decode.py --longrope-only --hidden 256 --heads 4 --layers 2 \
        --original-length 128 --new-tokens 64 --repeats 9 --interleave steps \
        --out benchmarks/results/dynamic_decode_longrope_steps.json

``--out`` gets rows (``result_schema.py``): benchmark ``dynamic_decode`` (per method, with
``exact_cache`` for the dynamic ones: ``decode_tokens_per_s``, ``prefill_s`` and their ratios to the
static method), ``dynamic_decode_longrope`` (method ``longrope``, or ``none`` for the plain static
model, per ``scenario``, ``exact_cache`` and ``keep_first``: ``decode_tokens_per_s`` of the median
round, ``decode_ratio_vs_plain``, ``best_round_ratio_vs_plain``, each round's seconds in ``extra``)
and ``dynamic_prefill`` (per method and prompt: ``exact_prefill_s``, ``transformers_prefill_s``,
``ratio``); every row's setting holds the shape and the flags.

Laptop-sized smoke run::

    .venv/bin/python benchmarks/bench_dynamic_decode.py --hidden 128 --layers 2 --original-length 64 --new-tokens 16

GPU (bf16)::

    python benchmarks/bench_dynamic_decode.py --device cuda --dtype bfloat16 --hidden 4096 --heads 32 \\
        --kv-heads 8 --layers 4 --original-length 4096 --new-tokens 256
"""

from __future__ import annotations

import argparse
import copy
import statistics
from pathlib import Path
from typing import Any

import torch
from harness import Clock, Results
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


def greedy(out: Any) -> tuple[Any, torch.Tensor]:
    """``(cache, next token [batch, 1])`` of a forward's output, decoding greedily."""
    return out.cache, out.logits[:, -1:].argmax(-1)


@torch.inference_mode()
def prefill(model: LlamaForCausalLM, prompt: torch.Tensor, device: str) -> tuple[float, Any, torch.Tensor]:
    """``(seconds, cache, next token [batch, 1])`` of the forward over ``prompt`` ``[batch, seq]``."""
    # logits_to_keep=1 as generate(): the next token's logits only
    seconds, out = clock(device).time(lambda: model(prompt, use_cache=True, logits_to_keep=1))
    return seconds, *greedy(out)


@torch.inference_mode()
def decode(model: LlamaForCausalLM, cache: Any, token: torch.Tensor, new_tokens: int, device: str) -> float:
    """Seconds to decode ``new_tokens`` greedily after the prefilled ``cache``, which is cropped back after."""

    def steps() -> None:
        nonlocal cache, token
        for _ in range(new_tokens):
            cache, token = greedy(model(token, cache=cache, use_cache=True))

    seconds, _ = clock(device).time(steps)
    cache.crop(-new_tokens)
    return seconds


#: LongRoPE's rows: (label, exact_cache or None for the plain static model, keep_first), against the first.
LONGROPE_RUNS = (
    ("plain (static)", None, 0),
    ("longrope transformers", False, 0),
    ("longrope exact", True, 0),
    ("longrope exact keep_first=4", True, 4),
)


def patch_longrope(model: LlamaForCausalLM, args: argparse.Namespace, exact: bool | None, keep_first: int) -> None:
    """``longrope`` at ``--factor``, or the plain model back (``exact`` None)."""
    if exact is None:
        if hf_posext.patched_method(model) is not None:
            hf_posext.unpatch_model(model)
        return
    hf_posext.patch_model(model, "longrope", factor=args.factor, exact_cache=exact, keep_first=keep_first)


Scenarios = dict[str, tuple[int, int]]  # name: (prompt tokens, untimed decoding steps before the timed ones)


@torch.inference_mode()
def _prefilled(model: LlamaForCausalLM, prompt: torch.Tensor, warm: int, device: str) -> tuple[Any, torch.Tensor]:
    """``(cache, next token)`` after ``prompt`` and ``warm`` untimed decoding steps."""
    _, cache, token = prefill(model, prompt, device)
    for _ in range(warm):
        cache, token = greedy(model(token, cache=cache, use_cache=True))
    return cache, token


def longrope_rounds(
    model: LlamaForCausalLM, args: argparse.Namespace, ids: torch.Tensor, scenarios: Scenarios
) -> dict[tuple[str, str], list[float]]:
    """Seconds of each round per ``(scenario, label)``: each row decodes its ``--new-tokens`` in one go, in turn."""
    rounds: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats):
        for scenario, (prompt, warm) in scenarios.items():
            for label, exact, keep_first in LONGROPE_RUNS:
                patch_longrope(model, args, exact, keep_first)
                cache, token = _prefilled(model, ids[:, :prompt], warm, args.device)
                rounds.setdefault((scenario, label), []).append(
                    decode(model, cache, token, args.new_tokens, args.device)
                )
    patch_longrope(model, args, None, 0)
    return rounds


def longrope_steps(
    model: LlamaForCausalLM, args: argparse.Namespace, ids: torch.Tensor, scenarios: Scenarios
) -> dict[tuple[str, str], list[float]]:
    """As :func:`longrope_rounds`, with the rows' decoding steps interleaved one by one (``--interleave steps``).

    Each row is a twin of ``model`` sharing its weight tensors (so no row runs on other memory), patched
    its way and prefilled with its own cache; then step k of every row runs before step k + 1 of any, in
    an order that rotates with k, so that a burst of load on the machine hits every row alike. A round's
    seconds are the sum of its steps.
    """
    shared = {id(p): p for p in model.parameters()}
    twins = {}
    for label, exact, keep_first in LONGROPE_RUNS:
        twins[label] = copy.deepcopy(model, memo=dict(shared))
        patch_longrope(twins[label], args, exact, keep_first)
    labels, tick = list(twins), clock(args.device)
    rounds: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats):
        for scenario, (prompt, warm) in scenarios.items():
            state = {label: _prefilled(twins[label], ids[:, :prompt], warm, args.device) for label in labels}
            seconds = dict.fromkeys(labels, 0.0)
            for step in range(args.new_tokens):
                for label in labels[step % len(labels) :] + labels[: step % len(labels)]:
                    cache, token = state[label]
                    with torch.inference_mode():
                        spent, out = tick.time(lambda m=twins[label], t=token, c=cache: m(t, cache=c, use_cache=True))
                    seconds[label] += spent
                    state[label] = greedy(out)
            for label in labels:
                rounds.setdefault((scenario, label), []).append(seconds[label])
    return rounds


def longrope_ratios(model: LlamaForCausalLM, args: argparse.Namespace) -> list[dict[str, Any]]:
    """LongRoPE's decoding speed across its switch and past it, against the plain static model (best of the rounds)."""
    total, half = int(args.factor * args.original_length), args.new_tokens // 2
    if not 1 <= half < args.original_length or args.new_tokens + 1 >= total:
        raise ValueError(
            f"--new-tokens must be in [2, {min(2 * args.original_length - 1, total - 2)}] for the "
            f"longrope scenarios, got {args.new_tokens}"
        )
    ids = torch.randint(0, args.vocab, (args.batch, total), generator=torch.Generator().manual_seed(3))
    ids = ids.to(args.device)
    scenarios = {
        "across the switch": (args.original_length - half, 0),
        "past the switch": (total - args.new_tokens - 1, 1),
    }  # (prompt tokens, untimed steps first)
    timed = longrope_steps if args.interleave == "steps" else longrope_rounds
    rounds = timed(model, args, ids, scenarios)
    rows = []
    for scenario, (prompt, warm) in scenarios.items():
        plain = rounds[scenario, LONGROPE_RUNS[0][0]]
        for label, exact, keep_first in LONGROPE_RUNS:
            seconds = rounds[scenario, label]
            rows.append(
                {
                    "scenario": scenario,
                    "label": label,
                    "exact_cache": exact,
                    "keep_first": keep_first,
                    "context_from": prompt + warm,
                    "context_to": prompt + warm + args.new_tokens,
                    "decode_tokens_per_s": args.batch * args.new_tokens / statistics.median(seconds),
                    "decode_ratio_vs_plain": statistics.median(plain) / statistics.median(seconds),
                    "best_round_ratio_vs_plain": min(plain) / min(seconds),
                    "round_seconds": seconds,
                }
            )
            print(
                f"longrope {scenario:17s} {label:28s} {rows[-1]['decode_tokens_per_s']:9.1f} tok/s  "
                f"{rows[-1]['decode_ratio_vs_plain']:.3f}x plain (median round; best rounds "
                f"{rows[-1]['best_round_ratio_vs_plain']:.3f}x)"
            )
    return rows


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
            rows.append(
                {
                    "method": method,
                    "multiple_of_original": multiple,
                    "tokens": multiple * args.original_length,
                    "exact_prefill_s": exact,
                    "transformers_prefill_s": native,
                    "ratio": exact / native,
                }
            )
            print(
                f"prefill {method:13s} {multiple}x L_orig: exact {exact:7.3f} s, transformers {native:7.3f} s, "
                f"{exact / native:.2f}x"
            )
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
    parser.add_argument(
        "--prefill-multiples",
        type=lambda text: [int(v) for v in text.split(",")],
        default=[4, 8],
        help="prompt lengths of the prefill comparison, in multiples of L_orig",
    )
    parser.add_argument("--prefill-factor", type=float, default=8.0, help="the factor the prefill comparison patches")
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="a pretrained model (folder or .gguf file) instead of the random Llama; its "
        "max_position_embeddings is L_orig (the shape arguments are ignored)",
    )
    parser.add_argument(
        "--prefill-warm-up",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="one untimed forward before each timed prefill (--no-prefill-warm-up for long prompts, "
        "whose scratch memory is not kept between forwards anyway)",
    )
    parser.add_argument("--prefill-only", action="store_true", help="only the prefill comparison (no decoding)")
    parser.add_argument(
        "--longrope-only",
        action="store_true",
        help="only LongRoPE's decoding against the plain static model (no dynamic methods, no prefill)",
    )
    parser.add_argument(
        "--interleave",
        default="rounds",
        choices=("rounds", "steps"),
        help="LongRoPE's rows: each decodes its tokens in one go, in turn (rounds), or the rows' steps "
        "alternate one by one, on twins sharing the weights (steps: finer pairing on a busy machine)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = build(args)
    decode_rows = [] if args.prefill_only or args.longrope_only else decode_ratios(model, args)
    longrope = [] if args.prefill_only else longrope_ratios(model, args)
    prefills = [] if args.longrope_only else prefill_ratios(model, args)
    if args.out is not None:
        ignored = ("out", "device", "prefill_multiples")
        setting = {k: v for k, v in vars(args).items() if k not in ignored and v is not None}
        results = Results(
            args.out,
            ["dynamic_decode", "dynamic_prefill", "dynamic_decode_longrope"],
            device=args.device,
            setting={**setting, "clock": clock(args.device).name},
        )
        add_rows(results, decode_rows, prefills, longrope_rows=longrope)
        results.save()


def add_rows(
    results: Results,
    decode_rows: list[dict[str, Any]],
    prefill_rows: list[dict[str, Any]],
    setting: dict[str, Any] | None = None,
    longrope_rows: list[dict[str, Any]] | None = None,
) -> None:
    """The rows of :func:`decode_ratios`, :func:`prefill_ratios` and :func:`longrope_ratios`, ``setting`` added to
    the decode rows' (``benchmarks/gpu/prefill.py`` writes them too)."""
    for row in decode_rows:
        exact = {} if row["exact_cache"] is None else {"exact_cache": row["exact_cache"]}
        results.add_all(
            row["method"],
            {k: v for k, v in row.items() if k not in ("label", "method", "exact_cache")},
            {**(setting or {}), **exact},
            benchmark="dynamic_decode",
        )
    for row in longrope_rows or []:
        case = {k: row[k] for k in ("scenario", "keep_first", "context_from", "context_to")}
        if row["exact_cache"] is not None:
            case["exact_cache"] = row["exact_cache"]
        results.add_all(
            "none" if row["exact_cache"] is None else "longrope",
            {k: row[k] for k in ("decode_tokens_per_s", "decode_ratio_vs_plain", "best_round_ratio_vs_plain")},
            case,
            benchmark="dynamic_decode_longrope",
            round_seconds=row["round_seconds"],
        )
    for row in prefill_rows:
        results.add_all(
            row["method"],
            {k: row[k] for k in ("exact_prefill_s", "transformers_prefill_s", "ratio")},
            {k: row[k] for k in row if k not in ("method", "exact_prefill_s", "transformers_prefill_s", "ratio")},
            benchmark="dynamic_prefill",
        )


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
