"""The Markdown tables the docs show, generated from the committed benchmark JSON.

Each table has a name; a page holds it between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->``
lines, which this script rewrites (any ``.md`` file under ``docs/`` or ``benchmarks/``). A table
whose JSON is not there yet says so in one line. ``tests/benchmarks/test_tables.py`` checks that
every committed block equals what this script writes from the committed JSON.

    python benchmarks/tables.py              # rewrite every marked block
    python benchmarks/tables.py --check      # exit 1 naming the stale blocks
    python benchmarks/tables.py --print gpu-mfu
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SEARCHED = ("docs", "benchmarks")
BLOCK = re.compile(r"(<!-- table:(?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /table:(?P=name) -->)", re.S)


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def load(relative: str) -> dict[str, Any] | None:
    path = RESULTS / relative
    return json.loads(path.read_text()) if path.is_file() else None


def missing(relative: str) -> str:
    return f"_Not measured yet: no {Path(relative).name} (the GPU session of benchmarks/gpu/PLAN.md writes it)._"


def kilo(n: int | str) -> str:
    return f"{int(n) // 1024}k" if int(n) % 1024 == 0 else str(n)


# --- CPU results ---------------------------------------------------------------------------------

def real_model_rows(kind: str) -> tuple[list[int], list[tuple[str, list[Any]]]]:
    """``(lengths, [(row name, [cell value or None])])`` of ``real_model/results.json`` for ppl or passkey."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import real_model

    cells = load("real_model/results.json")["cells"]
    plan = real_model.WITH_PASSKEY_4X
    lengths = list(plan.lengths if kind == "ppl" else plan.passkey_lengths)
    lengths = [n for n in lengths if any(k.startswith(f"{kind}/") and k.endswith(f"/{n}") for k in cells)]
    rows: dict[str, list[Any]] = {}
    for i, n in enumerate(lengths):
        for name, method, factor in [*real_model.variants(plan, n, kind == "ppl"), ("tuned", "tuned", None)]:
            key = f"{kind}/tuned/{n}" if method == "tuned" else real_model.cell_key(kind, method, factor, n)
            rows.setdefault(name, [None] * len(lengths))[i] = cells.get(key, {}).get("value")
    return lengths, list(rows.items())


def row_label(name: str) -> str:
    if name == "tuned":
        return "YaRN s = 4 after the fine-tune"
    return name.replace(" s=", ", s = ")


def real_model_ppl() -> str:
    lengths, rows = real_model_rows("ppl")
    header = ["method", *[f"{kilo(n)} ({n / 8192:g}x)" for n in lengths]]
    return table(header, [[row_label(name), *[f"{v['perplexity']:.2f}" if v else "-" for v in values]]
                          for name, values in rows])


def real_model_passkey() -> str:
    lengths, rows = real_model_rows("passkey")

    def cell(value: dict[str, Any] | None) -> str:
        if not value:
            return "-"
        found = [value["correct"][d][0] for d in range(len(value["depths"]))]
        return f"{sum(found)}/{len(found) * value['trials']} ({''.join('x' if f else '.' for f in found)})"

    header = ["method", *[f"{kilo(n)} ({n / 8192:g}x)" for n in lengths]]
    return table(header, [[row_label(name), *map(cell, values)] for name, values in rows if any(values)])


def patch_overhead() -> str:
    data = load("patch_overhead.json")
    order = ["linear", "ntk", "yarn", "dynamic_ntk (exact_cache=False)", "dynamic_yarn (exact_cache=False)",
             "dynamic_ntk", "dynamic_yarn"]
    labels = {"dynamic_ntk (exact_cache=False)": "dynamic_ntk, `exact_cache=False`",
              "dynamic_yarn (exact_cache=False)": "dynamic_yarn, `exact_cache=False`",
              "dynamic_ntk": "dynamic_ntk (exact, default)", "dynamic_yarn": "dynamic_yarn (exact, default)"}
    lengths = sorted({r["length"] for r in data["rows"]})
    ratio = {(r["method"], r["length"]): r["ratio"] for r in data["rows"]}
    methods = [m for m in order if any(k[0] == m for k in ratio)]
    header = ["method", f"{lengths[0]} tokens", *map(str, lengths[1:])]
    fmt = lambda v: f"{v:.3f}" if v < 2 else f"{v:.2f}"  # noqa: E731
    return table(header, [[labels.get(m, m), *[fmt(ratio[m, n]) for n in lengths]] for m in methods])


def long_train() -> str:
    data = load("long_train.json")
    header = ["tokens", "recipe peak", "`Trainer` peak", "memory ratio", "recipe tok/CPU-s", "`Trainer` tok/CPU-s",
              "throughput ratio", "loss recipe / `Trainer`"]
    rows = []
    for length in sorted(data["ratios"], key=int):
        recipe, trainer = data["runs"][length]["recipe"], data["runs"][length]["trainer"]
        ratio = data["ratios"][length]
        rows.append([length, f"{recipe['peak_step_mib'] / 1024:.2f} GiB", f"{trainer['peak_step_mib'] / 1024:.2f} GiB",
                     f"{ratio['memory_ratio']:.2f}", f"{recipe['tokens_per_cpu_s']:.2f}",
                     f"{trainer['tokens_per_cpu_s']:.2f}", f"{ratio['throughput_ratio']:.2f}",
                     f"{recipe['loss']:.6f} / {trainer['loss']:.6f}"])
    return table(header, rows)


def alibi_cpu() -> str:
    data = load("alibi.json")
    lengths = data["settings"]["lengths"]
    by = {(r["path"], r["length"]): r for r in data["rows"] if "skipped" not in r}
    labels = {"alibi_folded": "`folded`", "alibi_flex": "`flex`", "alibi_sdpa": "`sdpa` (additive bias)",
              "alibi_eager": "`eager`"}
    rows = []
    for path, label in labels.items():
        if not any(p == path for p, _ in by):
            continue
        cells = [f"{by[path, n]['time_ratio']:.2f}" if (path, n) in by else "-" for n in lengths]
        last = by.get((path, lengths[-1]))
        memory = last["memory_ratio"] if last else None
        rows.append([label, *cells, "-" if memory is None else f"{memory:.2f}x" if memory < 10 else f"{memory:.1f}x"])
    return table(["path", *map(kilo, lengths), f"memory at {kilo(lengths[-1])}"], rows)


def training_free_real_model() -> str:
    """Passkeys found / asked with 95% Wilson intervals, and perplexity, per method (training_free/results.json)."""
    from hf_posext.eval.ruler.score import wilson_interval

    data = load("training_free/results.json")
    cells = data["cells"]
    # The script's rows in its own order (training_free_real_model.METHODS), any others after them.
    order = ["none", "yarn s=4", "self_extend f=4", "dca", "self_extend f=2 on yarn s=2"]
    seen = list(dict.fromkeys(k.split("/")[1] for k in cells))
    methods = [m for m in order if m in seen] + [m for m in seen if m not in order]
    passkey_lengths = sorted({int(k.split("/")[2]) for k in cells if k.startswith("passkey/")})
    ppl_lengths = sorted({int(k.split("/")[2]) for k in cells if k.startswith("ppl/")})
    rows = []
    for method in methods:
        row = [method]
        for n in passkey_lengths:
            found = [c["value"] for k, c in cells.items() if k.startswith(f"passkey/{method}/{n}/")]
            low, high = wilson_interval(sum(found), len(found)) if found else (0.0, 0.0)
            row.append(f"{sum(found)}/{len(found)} ({low:.2f}-{high:.2f})" if found else "-")
        for n in ppl_lengths:
            value = cells.get(f"ppl/{method}/{n}", {}).get("value")
            row.append(f"{value:.2f}" if value else "-")
        rows.append(row)
    header = ["method", *[f"passkey {kilo(n)} (95% interval)" for n in passkey_lengths],
              *[f"ppl {kilo(n)}" for n in ppl_lengths]]
    return table(header, rows)


def finetune_smollm2() -> str:
    """The fine-tuned SmolLM2 against the training-free rows (finetune_smollm2/results.md, its tables only).

    ``benchmarks/finetune_real_model.py --report`` writes that file from its cells and the training-free ones.
    """
    text = (RESULTS / "finetune_smollm2" / "results.md").read_text()
    return text[text.index("\n|") + 1:].rstrip()


def cpu_bf16() -> str:
    """The recipe's step and the long forward in bf16 against fp32 on this CPU (cpu_bf16.json)."""
    data = load("cpu_bf16.json") or {}
    lines = []
    if "train" in data:
        t = data["train"]
        lines.append(table(
            ["recipe step", "fp32 tok/s (CPU s)", "bf16 tok/s (CPU s)", "speed-up (CPU time)", "speed-up (wall)",
             "max loss difference"],
            [[f"{t['window']} tokens x {t['batch']}, {t['steps']} steps, {t['threads']} thread(s)",
              f"{t['tokens_per_cpu_s']['no']:.1f}", f"{t['tokens_per_cpu_s']['bf16']:.1f}",
              f"{t['speedup_cpu_time']:.2f}x", f"{t['speedup']:.2f}x", f"{100 * t['max_relative_loss_difference']:.2f}%"]]))
    if "forward" in data:
        rows = [[kilo(r["length"]), r["precision"], f"{r['perplexity']:.3f}", f"{r['ppl_seconds']:.0f}",
                 "".join("y" if c else "n" for c in r["passkey_correct"])] for r in data["forward"]["rows"]]
        lines.append(table(["length", "precision", "perplexity", "seconds", "passkeys found"], rows))
    return "\n\n".join(lines) if lines else "_Not measured yet: no cpu_bf16.json (benchmarks/bench_cpu_bf16.py)._"


def llamacpp_gaps(key: str) -> str:
    data = load("llamacpp.json")
    if not data or key not in data:
        return f"_Not measured yet: no {key} in llamacpp.json (python benchmarks/llamacpp_gguf.py)._"
    rows = [[name, f"{row['exported']:.2e}", f"{row['direct']:.2e}" if "direct" in row else "-",
             f"{row['converter_only']:.3g}"] for name, row in data[key]["cases"].items()]
    return table(["case", "`gguf export`", "GGUF to GGUF", "converter only"], rows)


def llamacpp_smollm2() -> str:
    data = load("llamacpp_smollm2.json")
    rows = []
    for key in sorted((k for k in data if k.startswith("smollm2_q4_1_")), key=lambda k: int(k.rsplit("_", 1)[1])):
        own = data[key]["cases"]["unpatched"]["kl_mean"]
        for name, row in data[key]["cases"].items():
            rows.append([kilo(row["tokens"]), name, f"{row['kl_mean']:.4f}", f"{row['kl_mean'] / own:.2f}",
                         f"{row['max_abs_diff']:.2f}", f"{row['ppl_transformers']:.3f}", f"{row['ppl_llamacpp']:.3f}",
                         f"{(row['ppl_llamacpp'] / row['ppl_transformers'] - 1):+.2%}",
                         "yes" if row["tensor_bytes_unchanged"] else "**no**"])
    return table(["tokens", "case", "mean KL", "KL / unpatched", "max abs diff", "ppl transformers", "ppl llama.cpp",
                  "ppl gap", "tensor bytes unchanged"], rows)


# --- GPU results ---------------------------------------------------------------------------------

def gpu_check() -> str:
    data = load("gpu/check.json")
    keys = ("grad_rel_error", "logit_error", "bound", "wrapping", "mfu", "tokens_per_s", "peak_memory_gib", "reason")
    shown = {"mfu": lambda v: f"MFU {v:.1%}", "tokens_per_s": lambda v: f"{v:,.0f} tokens/s",
             "peak_memory_gib": lambda v: f"{v:.1f} GiB peak"}
    rows = []
    for name, item in data["items"].items():
        details = [shown[k](item[k]) if k in shown else f"{k} {item[k]:.3g}" if isinstance(item[k], float)
                   else f"{k} {item[k]}" for k in keys if k in item]
        if "error" in item:
            details.append(item["error"].split(":")[0])
        rows.append([f"`{name}`", item["status"], f"{item['seconds']:.1f}", "; ".join(details)])
    return f"{data['device']}, torch {data['torch']}.\n\n" + table(["item", "status", "seconds", "details"], rows)


def decode_rows(results: list[dict[str, Any]]) -> list[list[Any]]:
    return [[r["label"], f"{r['decode_tokens_per_s']:.1f}",
             f"{r['decode_ratio_vs_static']:.2f}" if "decode_ratio_vs_static" in r else ""] for r in results]


def gpu_dynamic_decode() -> str:
    data = load("gpu/dynamic_decode.json")
    return table(["", "decode tokens/s", "vs static"], decode_rows(data["results"]))


def gpu_finetune_real() -> str:
    data = load("gpu/finetune_real/finetune_real.json")
    if data is None:
        return missing("gpu/finetune_real/finetune_real.json")
    plan = data["settings"]["plan"]
    header = ["model", *[f"ppl {kilo(n)}" for n in plan["ppl_lengths"]],
              *[f"passkey {kilo(n)}" for n in plan["passkey_lengths"]]]
    rows = [[name, *[f"{r['perplexity'][str(n)]:.2f}" for n in plan["ppl_lengths"]],
             *[f"{r['passkey'][str(n)]:.0%}" if "passkey" in r else "-" for n in plan["passkey_lengths"]]]
            for name, r in data["results"].items()]
    t, goals, trained = data["training"], data["goals"], data["original_context"]
    longest, met = kilo(max(plan["passkey_lengths"])), lambda goal: "met" if goal["met"] else "not met"
    where = (data["environment"].get("gpu") or {}).get("name", data["device"])
    return (table(header, rows) + f"\n\n{t['steps']} steps of {plan['global_batch']} x "
            f"{plan.get('train_seq_len') or int(plan['factor'] * trained)} tokens in {data['wall_s']['fine-tune']:.0f} s ({t['stopped_by']}), loss "
            f"{t['losses'][0]:.3f} -> {t['losses'][-1]:.3f}; {where}. Goals: passkey >= 90% at {longest} "
            f"{met(goals['passkey_at_longest'])}; perplexity at {kilo(max(plan['ppl_lengths']))} <= the base model's "
            f"at {kilo(trained)} {met(goals['ppl_longest_vs_base_at_trained'])}.")


def gpu_mfu() -> str:
    data = load("gpu/mfu/mfu.json")
    if data is None:
        return missing("gpu/mfu/mfu.json")
    rows = []
    for r in data["rows"]:
        if r.get("status") == "ok":
            mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "-"
            rows.append([f"`{r['variant']}`", r["tokens"], f"{r['step_s']:.3f}", f"{r['tokens_per_s']:,.0f}", mfu,
                         f"{r['peak_memory_mib'] / 1024:.1f} GiB"])
        else:
            rows.append([f"`{r['variant']}`", r.get("tokens", "-"), r.get("status"), "", "",
                         (r.get("reason") or r.get("error", ""))[:80].replace("|", "/").replace("\n", " ")])
    return table(["variant", "tokens", "step (s)", "tokens/s", "MFU", "peak memory"], rows)


def gpu_prefill() -> str:
    data = load("gpu/prefill/prefill.json")
    if data is None:
        return missing("gpu/prefill/prefill.json")
    rows = [[r["tokens"], r["method"] + (" (one forward each, first call)" if r["status"] == "probe" else ""),
             f"{r['exact_prefill_s']:.3f}", f"{r['transformers_prefill_s']:.3f}", f"{r['ratio']:.1f}x"]
            if r["status"] in ("ok", "probe") else [r["tokens"], "skipped", "", "", r["reason"]]
            for r in data["prefill"]]
    text = table(["prompt tokens (4x L_orig)", "method", "exact (s)", "transformers (s)", "ratio"], rows)
    if "decode" in data:
        text += (f"\n\nDecode of the last {data['settings']['new_tokens']} tokens up to {data['decode']['tokens']}:\n\n"
                 + table(["", "decode tokens/s", "vs static"], decode_rows(data["decode"]["rows"])))
    return text


def gpu_sedca() -> str:
    data = load("gpu/sedca/sedca.json")
    if data is None:
        return missing("gpu/sedca/sedca.json")
    if data.get("status") == "skip":
        return f"_Skipped: {data['reason']}._"
    rows = [[f"`{r['variant']}`", r["tokens"], f"{r['prefill_s']:.3f}", f"{r['peak_memory_mib'] / 1024:.2f} GiB",
             f"{r.get('time_vs_sdpa', float('nan')):.2f}x", f"{r.get('memory_vs_sdpa', float('nan')):.2f}x"]
            if r["status"] == "ok" else [f"`{r['variant']}`", r["tokens"], r["status"], "", "", ""]
            for r in data["speed"]]
    parity = data["parity"]
    lines = [f"{m}: {'ok' if p['ok'] else 'FAIL'} ({p['ratio_to_native']:.2f}x the native bf16 error)"
             if "ratio_to_native" in p else f"{m}: {p['error']}" for m, p in parity["methods"].items()]
    return (table(["variant", "tokens", "prefill (s)", "peak memory", "time vs SDPA", "memory vs SDPA"], rows)
            + f"\n\nbf16 parity at {parity['tokens']} tokens (bound 3x the native model's bf16 error): "
            + "; ".join(lines) + ".")


def longrope_tiny() -> str:
    """Perplexity by context length per method and factor on the demo's tiny model (longrope_tiny.json)."""
    data = load("longrope_tiny.json")
    if data is None:
        return "_Not measured yet: run `nice -n 10 python benchmarks/longrope_tiny.py`._"
    header = ["method", *[f"{n} ({m}x)" for n, m in zip(data["lengths"], data["multiples"])],
              "all tokens at s·128"]
    rows = [[name, *[f"{p['perplexity']:.3f}" for p in row["points"]],
             f"{row['all_tokens']['perplexity']:.3f}" if "all_tokens" in row else "-"]
            for name, row in data["rows"].items()]
    return table(header, rows)


def longrope_cache() -> str:
    """The search's result per factor, the cache gap past the switch and the decode speed (longrope_tiny.json)."""
    data = load("longrope_tiny.json")
    if data is None:
        return "_Not measured yet: run `nice -n 10 python benchmarks/longrope_tiny.py`._"
    rows = [[f"search {key} ({r['length']} tokens)", f"{r['start_perplexity']:.4f} -> {r['perplexity']:.4f}",
             f"{len(r['history'])} rounds, {r['history'][-1]['evaluated'] if r['history'] else 1} candidates, "
             f"{r['seconds']:.0f} s"] for key, r in data["searches"].items()]
    cache, speed = data["cache"], data["decode_ms"]
    rows.append(["cached decoding past the switch, max abs logit gap to a full forward",
                 f"transformers' cache {cache['transformers']:.1e}", f"exact_cache=True {cache['exact_cache']:.1e}"])
    rows.append(["decode step (ms)", f"transformers' cache {speed['transformers']:.2f}",
                 f"exact_cache=True {speed['exact_cache']:.2f} ({speed['transformers'] / speed['exact_cache']:.2f}x "
                 "the speed)"])
    return table(["what", "measured", ""], rows)


TABLES: dict[str, Callable[[], str]] = {
    "real-model-ppl": real_model_ppl,
    "real-model-passkey": real_model_passkey,
    "patch-overhead": patch_overhead,
    "long-train": long_train,
    "alibi-cpu": alibi_cpu,
    "training-free-real-model": training_free_real_model,
    "cpu-bf16": cpu_bf16,
    "finetune-smollm2": finetune_smollm2,
    "llamacpp-tiny": lambda: llamacpp_gaps("tiny_llama_3x"),
    "llamacpp-architectures": lambda: llamacpp_gaps("tiny_architectures_3x"),
    "llamacpp-smollm2": llamacpp_smollm2,
    "gpu-check": gpu_check,
    "gpu-dynamic-decode": gpu_dynamic_decode,
    "gpu-finetune-real": gpu_finetune_real,
    "gpu-mfu": gpu_mfu,
    "gpu-prefill": gpu_prefill,
    "gpu-sedca": gpu_sedca,
    "longrope-tiny": longrope_tiny,
    "longrope-cache": longrope_cache,
}


def render(name: str) -> str:
    if name not in TABLES:
        raise ValueError(f"unknown table {name!r}; the tables are: {', '.join(TABLES)}")
    return TABLES[name]()


def rewrite(text: str, cache: dict[str, str] | None = None) -> str:
    """``text`` with every marked block replaced by its table."""
    cache = {} if cache is None else cache

    def block(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in cache:
            cache[name] = render(name)
        return f"{match[1]}{cache[name]}\n{match[4]}"

    return BLOCK.sub(block, text)


def marked_pages(root: Path = ROOT) -> list[Path]:
    """The Markdown files under :data:`SEARCHED` holding at least one marked block."""
    pages = [p for folder in SEARCHED for p in sorted((root / folder).rglob("*.md"))]
    return [p for p in pages if BLOCK.search(p.read_text())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    parser.add_argument("--print", dest="show", metavar="NAME", help="print one table")
    args = parser.parse_args(argv)
    if args.show:
        print(render(args.show))
        return 0
    cache: dict[str, str] = {}
    stale = []
    for page in marked_pages():
        text = page.read_text()
        new = rewrite(text, cache)
        if new != text:
            stale.append(page.relative_to(ROOT))
            if not args.check:
                page.write_text(new)
    verb = "stale" if args.check else "rewrote"
    print(f"{verb}: {', '.join(map(str, stale))}" if stale else "every marked table is current")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
