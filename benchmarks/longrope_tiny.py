"""LongRoPE on the demo's tiny byte-level Llama: searched factors against YaRN, PI and NTK, and the exact cache.

    nice -n 10 python benchmarks/longrope_tiny.py           # ~35 min on 2 loaded CPU cores (+ ~3 min once: the model)
    python benchmarks/longrope_tiny.py --quick              # seconds: the demo's QUICK sizes, nothing written

Searches long factors at 8x and 16x the training length on training-split stdlib text
(hf_posext.search_longrope) twice: fitness on the last 127 tokens of each window (the table's
protocol) and on all tokens (the paper's); then measures every method at a fixed factor s on
held-out files with the demo's protocol (the same last 127 bytes read with 1x-16x of context) and
the all-token perplexity of the held-out files at s x 128 tokens; then cached decoding
across the switch against the full forward, with transformers' native cache and with
exact_cache=True, and the decode speed of both. Writes rows (``result_schema.py``) to
benchmarks/results/longrope_tiny.json: per method, factor and variant, ``perplexity`` at each context
length (the last 127 bytes scored) and ``perplexity_all_tokens`` at s x 128; per search (factor,
fitness), ``search_perplexity`` with the search's result in ``extra`` (``long_factor``,
``start_perplexity``, ``history``, ``seconds``); ``max_abs_logit_gap`` and ``decode_ms`` with and
without exact_cache. docs/methods/longrope.md shows its tables (scripts/tables.py).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Results  # noqa: E402
from result_schema import Row, read_rows  # noqa: E402

import hf_posext  # noqa: E402
from hf_posext.data import encode_documents, iter_local_documents, stdlib_files  # noqa: E402
from hf_posext.eval.perplexity import truncated_perplexity  # noqa: E402
from hf_posext.experiments.demo import FULL, QUICK, held_out_documents  # noqa: E402
from hf_posext.experiments.tinylm import pretrain  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "longrope_tiny.json"


def training_documents(tokenizer: Any, min_tokens: int, count: int, seed: int = 0) -> torch.Tensor:
    """``[count, min_tokens]``: the first ``min_tokens`` bytes of training-split stdlib files (search text)."""
    files = [p for p in stdlib_files("train") if p.stat().st_size >= 2 * min_tokens]
    chosen = sorted(random.Random(seed).sample(files, 4 * count))
    docs = [
        d[:min_tokens] for d in encode_documents(iter_local_documents(chosen), tokenizer) if d.numel() >= min_tokens
    ]
    return torch.stack(docs[:count])


def cache_gaps(model: Any, ids: torch.Tensor, prompt: int) -> float:
    """Max |logits| difference between cached decoding from a ``prompt``-token prefill and full forwards."""
    worst = 0.0
    with torch.no_grad():
        out = model(ids[:, :prompt], use_cache=True)
        cache = out.cache
        for t in range(prompt, ids.shape[1]):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = out.cache
            full = model(ids[:, : t + 1], use_cache=False).logits[:, -1]
            worst = max(worst, (out.logits[:, -1] - full).abs().max().item())
    return worst


def decode_ms(model: Any, ids: torch.Tensor, prompt: int, steps: int) -> float:
    """CPU milliseconds per decoding step after a ``prompt``-token prefill (teacher-forced, DynamicCache);
    process time, so that other jobs on the machine do not decide the ratio (run with one torch thread)."""
    with torch.no_grad():
        cache = model(ids[:, :prompt], use_cache=True).cache
        start = time.process_time()
        for t in range(prompt, prompt + steps):
            cache = model(ids[:, t : t + 1], cache=cache, use_cache=True).cache
    return 1000 * (time.process_time() - start) / steps


def search_key(row: Row) -> str:
    return f"{row.setting['factor']:g} {row.setting['fitness']}"


def search_result(row: Row) -> dict[str, Any]:
    """A ``search_perplexity`` row as the search's ``to_dict()`` (plus its seconds)."""
    return {
        **{k: v for k, v in row.extra.items() if k != "command"},
        "perplexity": row.value,
        "factor": row.setting["factor"],
        "length": row.setting["length"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the demo's QUICK sizes; writes nothing")
    parser.add_argument("--population", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--search-documents", type=int, default=4)
    parser.add_argument(
        "--searches-from", type=Path, default=None, help="reuse the searches of this results file (re-measure only)"
    )
    parser.add_argument(
        "--cache-only",
        action="store_true",
        help="with --searches-from: reuse its perplexity rows too; re-measure the cache and speed",
    )
    args = parser.parse_args(argv)
    config = QUICK if args.quick else FULL
    model, tokenizer, _ = pretrain(config.model, progress=False)
    train_len = config.model.seq_len
    multiples = config.multiples
    lengths = [m * train_len for m in multiples]
    docs = held_out_documents(tokenizer, lengths[-1] + 1, config.documents, config.seed)
    factors = (8.0, 16.0) if not args.quick else (4.0, 16.0)
    results = Results(OUT, "longrope_tiny", setting={"documents": len(docs)})
    previous = read_rows(args.searches_from) if args.searches_from is not None else []
    searches: dict[str, Any] = {}
    for row in previous:
        if row.metric == "search_perplexity":  # kept as measured then
            searches[search_key(row)] = search_result(row)
            results.rows.append(row)
    tail = train_len - 1
    for s in factors:
        length = int(s * train_len)
        text = training_documents(tokenizer, length, args.search_documents)
        for fitness, score_last in ((f"last {tail}", tail), ("all", None)):
            if f"{s:g} {fitness}" in searches:
                continue
            t0 = time.perf_counter()
            result = hf_posext.search_longrope(
                model,
                text,
                factor=s,
                length=length,
                population=args.population,
                rounds=args.rounds,
                seed=0,
                score_last=score_last,
                progress=False,
            )
            found = result.to_dict()
            row = results.add(
                "longrope",
                "search_perplexity",
                result.perplexity,
                setting={
                    "factor": s,
                    "fitness": fitness,
                    "length": length,
                    "population": args.population,
                    "rounds": args.rounds,
                    "search_documents": args.search_documents,
                },
                **{k: v for k, v in found.items() if k not in ("perplexity", "factor", "length")},
                seconds=round(time.perf_counter() - t0, 1),
            )
            searches[search_key(row)] = search_result(row)
            print(
                f"search {s:g} {fitness} at {length}: {result.start_perplexity:.4f} -> {result.perplexity:.4f}",
                flush=True,
            )

    def measure(method: str, s: float, variant: str | None = None, **kwargs: Any) -> None:
        if method != "none":
            hf_posext.patch_model(model, method, factor=s, **kwargs)
        points = truncated_perplexity(
            model, docs, lengths, score_last=train_len - 1, end_at=lengths[-1], progress=False
        )
        target = int(s * train_len) if s > 1 else train_len
        whole = truncated_perplexity(model, docs, [target], progress=False)[0]
        if method != "none":
            hf_posext.unpatch_model(model)
        setting = {
            "factor": s,
            **({"variant": variant} if variant else {}),
            **{k: v for k, v in kwargs.items() if k != "long_factor"},
        }
        for p in points:
            results.add(
                method,
                "perplexity",
                p.perplexity,
                setting={**setting, "length": p.length, "multiple": p.length // train_len, "score_last": train_len - 1},
                nll=p.nll,
                tokens=p.tokens,
                documents=p.documents,
            )
        results.add(
            method,
            "perplexity_all_tokens",
            whole.perplexity,
            setting={**setting, "length": whole.length},
            nll=whole.nll,
            tokens=whole.tokens,
            documents=whole.documents,
        )
        name = "none" if method == "none" else f"{method} s={s:g}" + (f" ({variant})" if variant else "")
        print(
            f"{name:<44}" + " ".join(f"{p.perplexity:9.3f}" for p in points) + f" | all {whole.perplexity:.3f}",
            flush=True,
        )

    reuse = args.cache_only and args.searches_from is not None
    if reuse:  # kept as measured then
        results.rows += [r for r in previous if r.metric in ("perplexity", "perplexity_all_tokens")]
    else:
        measure("none", 1.0)
    for s in factors if not reuse else ():
        measure("linear", s)
        measure("ntk", s)
        measure("yarn", s)
        start = searches[f"{s:g} all"]
        measure("longrope", s, "YaRN start", attention_factor=start["attention_factor"], exact_cache=False)
        for key, label in ((f"{s:g} last {tail}", f"searched, last {tail}"), (f"{s:g} all", "searched, all tokens")):
            measure(
                "longrope",
                s,
                label,
                long_factor=searches[key]["long_factor"],
                attention_factor=searches[key]["attention_factor"],
                exact_cache=False,
            )
    s = factors[-1]
    best = searches[f"{s:g} last {tail}"]
    if not args.cache_only:
        measure(
            "longrope",
            s,
            f"searched, last {tail}, exact_cache",
            long_factor=best["long_factor"],
            attention_factor=best["attention_factor"],
            exact_cache=True,
        )

    ids = docs[0][None, : 2 * train_len]
    prompt = train_len - 28
    cache: dict[str, float] = {}
    for exact in (False, True):
        hf_posext.patch_model(
            model,
            "longrope",
            factor=s,
            long_factor=best["long_factor"],
            attention_factor=best["attention_factor"],
            exact_cache=exact,
        )
        cache["exact_cache" if exact else "transformers"] = cache_gaps(model, ids, prompt)
        hf_posext.unpatch_model(model)
    decode_ids = docs[0][None, : lengths[-1]]
    steps = 64 if not args.quick else 4
    times: dict[str, list[float]] = {"transformers": [], "exact_cache": []}
    for _ in range(5):
        for exact in (False, True):
            hf_posext.patch_model(
                model,
                "longrope",
                factor=s,
                long_factor=best["long_factor"],
                attention_factor=best["attention_factor"],
                exact_cache=exact,
            )
            times["exact_cache" if exact else "transformers"].append(
                decode_ms(model, decode_ids, lengths[-1] // 2, steps)
            )
            hf_posext.unpatch_model(model)
    speed = {k: statistics.median(v) for k, v in times.items()}
    print(f"cache gap past the switch: {cache}; decode ms/token at {lengths[-1] // 2}: {speed}")
    searched = {"factor": s, "variant": f"searched, last {tail}"}
    for exact, name in ((False, "transformers"), (True, "exact_cache")):
        results.add(
            "longrope",
            "max_abs_logit_gap",
            cache[name],
            "logit",
            {**searched, "exact_cache": exact, "prompt": prompt, "to": 2 * train_len},
        )
        results.add(
            "longrope",
            "decode_ms",
            speed[name],
            setting={**searched, "exact_cache": exact, "prompt": lengths[-1] // 2, "steps": steps, "repeats": 5},
        )
    if not args.quick:
        print(f"wrote {results.save()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
