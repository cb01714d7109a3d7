"""The Markdown tables the docs show, rendered from the committed benchmark results.

Each table has a name; a page holds it between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->``
lines, which this script rewrites (any ``.md`` file under ``docs/`` or ``benchmarks/``, and README.md). Results are
rows of one schema (``result_schema.py``) and one renderer makes every table from them
(``pivot.py``: a pivot of one file's rows); below, each table is its rows and columns. A table whose
file is not there yet says so in one line. ``tests/scripts/test_tables.py`` checks that every
committed block equals what this script writes from the committed results. The cell caches of the
resumable real-model evaluations (``real_model/results.json``, ``training_free/results.json``) are
read as rows too (``result_schema.rows_from_cells``, on read: a file in today's cells format needs
no migration step). The tables the scripts' reports show beside Wilson intervals and exact McNemar
tests (``finetune-smollm2``, ``longrope-smollm2``, ``training-free-real-model-paired``) are rendered by
those scripts' functions from the same rows, laid out aligned (``pivot.table(aligned=True)``), so
that each block equals its report's table.

Longer than ~400 lines: one declaration per docs table (about 25), each read on its own; split by
page they would scatter the registry :data:`TABLES` that the page rewriting and the test walk.

    python scripts/tables.py              # rewrite every marked block
    python scripts/tables.py --check      # exit 1 naming the stale blocks
    python scripts/tables.py --print gpu-mfu
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The root for scripts.*; benchmarks/ (a folder of scripts, not a package) for result_schema.py and the
# scripts whose reports some tables are.
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from result_schema import Row, latest, read_rows  # noqa: E402

from scripts.pivot import Column, Pivot, Table, fmt, found_cell, kilo, lengths, ok_or, ratio, reason, value  # noqa: E402
from scripts.readers_table import matrix_table, readers_table  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SEARCHED = ("docs", "benchmarks")
BLOCK = re.compile(r"(<!-- table:(?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /table:(?P=name) -->)", re.S)
GPU_SESSION = "the GPU session of benchmarks/gpu/PLAN.md writes it"


def block(*tables: Table | Callable[[], str | None], missing: str | None = None) -> Callable[[], str]:
    """A docs block: its tables, a blank line apart, or one line saying what is not measured yet."""

    def render() -> str:
        parts = [t.render(RESULTS) if isinstance(t, Table) else t() for t in tables]
        found = [p for p in parts if p is not None]
        if found:
            return "\n\n".join(found)
        source = next(t.source for t in tables if isinstance(t, Table))
        return missing or f"_Not measured yet: no {Path(source).name} ({GPU_SESSION})._"

    return render


# --- The tables: which rows, which columns ---------------------------------------------------------

PATCH_LABELS = {
    "linear": "linear",
    "ntk": "ntk",
    "yarn": "yarn",
    "dynamic_ntk (exact_cache=False)": "dynamic_ntk, `exact_cache=False`",
    "dynamic_yarn (exact_cache=False)": "dynamic_yarn, `exact_cache=False`",
    "dynamic_ntk": "dynamic_ntk (exact, default)",
    "dynamic_yarn": "dynamic_yarn (exact, default)",
}


def patch_label(row: Row) -> tuple[str]:
    name = row.method + (" (exact_cache=False)" if row.setting.get("exact_cache") is False else "")
    return (PATCH_LABELS.get(name, name),)


PATCH_OVERHEAD = Table(
    "patch_overhead.json",
    ["method"],
    [
        Pivot(
            {"benchmark": "patch_overhead", "metric": "ratio"},
            patch_label,
            lambda rows: [
                Column(
                    f"{n} tokens" if i == 0 else str(n),
                    {"length": n},
                    lambda r: f"{r.value:.3f}" if r.value < 2 else f"{r.value:.2f}",
                )
                for i, n in enumerate(lengths(rows))
            ],
            order=list(PATCH_LABELS.values()),
        )
    ],
)

LONG_TRAIN = Table(
    "long_train.json",
    ["tokens"],
    [
        Pivot(
            lambda r: r.benchmark == "long_train" and "tokens" in r.setting and not r.setting.get("extrapolated"),
            lambda r: (str(r.setting["tokens"]),),
            [
                Column("recipe peak", {"method": "recipe", "metric": "peak_step_mib"}, fmt(".2f", " GiB", 1 / 1024)),
                Column(
                    "`Trainer` peak", {"method": "trainer", "metric": "peak_step_mib"}, fmt(".2f", " GiB", 1 / 1024)
                ),
                Column(
                    "memory ratio",
                    compute=ratio(
                        {"method": "recipe", "metric": "peak_step_mib"},
                        {"method": "trainer", "metric": "peak_step_mib"},
                    ),
                ),
                Column("recipe tok/CPU-s", {"method": "recipe", "metric": "tokens_per_cpu_s"}, fmt(".2f")),
                Column("`Trainer` tok/CPU-s", {"method": "trainer", "metric": "tokens_per_cpu_s"}, fmt(".2f")),
                Column(
                    "throughput ratio",
                    compute=ratio(
                        {"method": "recipe", "metric": "tokens_per_cpu_s"},
                        {"method": "trainer", "metric": "tokens_per_cpu_s"},
                    ),
                ),
                Column(
                    "loss recipe / `Trainer`",
                    compute=lambda group, _: " / ".join(
                        f"{v:.6f}" if v is not None else "-"
                        for v in (value(group, method=m, metric="loss") for m in ("recipe", "trainer"))
                    ),
                ),
            ],
            order=lambda r: r.setting["tokens"],
        )
    ],
)

ALIBI_LABELS = {
    "alibi_folded": "`folded`",
    "alibi_flex": "`flex`",
    "alibi_sdpa": "`sdpa` (additive bias)",
    "alibi_eager": "`eager`",
}


def alibi_columns(rows: list[Row]) -> list[Column]:
    ns = lengths(rows)
    return [
        *(Column(kilo(n), {"metric": "time_ratio", "length": n}, fmt(".2f")) for n in ns),
        Column(
            f"memory at {kilo(ns[-1])}",
            {"metric": "memory_ratio", "length": ns[-1]},
            lambda r: f"{r.value:.2f}x" if r.value < 10 else f"{r.value:.1f}x",
        ),
    ]


ALIBI_CPU = Table(
    "alibi.json",
    ["path"],
    [
        Pivot(
            {"benchmark": "alibi"},
            lambda r: (ALIBI_LABELS[r.method],) if r.method in ALIBI_LABELS and r.metric != "status" else None,
            alibi_columns,
            order=list(ALIBI_LABELS.values()),
        )
    ],
)


def alibi_setup(rows: list[Row]) -> str:
    s = next(r for r in rows if r.benchmark == "alibi").setting
    threads = f"{s['threads']} threads" if s.get("threads") else "PyTorch's threads"
    return (
        f"Llama, {s['layers']} layers, {s['heads']} query / {s['kv_heads']} kv heads of {s['head_dim']}, batch 1, "
        f"one forward without cache, {s['dtype']} on {s['device']} ({rows[0].device}, {threads}); median of "
        f"{s['repeats']}. Ratios: path / RoPE+SDPA at the same length (time ratio from CPU time on CPU, wall time "
        "on CUDA).\n\n"
    )


ALIBI_PATHS = Table(
    "alibi.json",
    ["path", "length"],
    [
        Pivot(
            {"benchmark": "alibi"},
            lambda r: (r.method, str(r.setting["length"])),
            [
                Column("wall (s)", {"metric": "time_s"}, fmt(".3f")),
                Column("CPU (s)", {"metric": "cpu_s"}, fmt(".3f")),
                Column("peak (MiB)", {"metric": "peak_mib"}, fmt(".1f")),
                Column("time ratio", {"metric": "time_ratio"}, fmt(".2f")),
                Column("memory ratio", compute=ok_or("memory_ratio", fmt(".2f"), reason)),
            ],
        )
    ],
    before=alibi_setup,
)


def growth_columns(rows: list[Row]) -> list[Column]:
    """log(peak2 / peak1) / log(L2 / L1) between consecutive lengths: ~1 linear, ~2 quadratic."""
    ns = lengths(rows)

    def exponent(a: int, b: int) -> Callable[[list[Row], list[Row]], str]:
        def cell(group: list[Row], rows: list[Row]) -> str:
            m1, m2 = value(group, length=a), value(group, length=b)
            return "-" if not m1 or not m2 else f"{math.log(m2 / m1) / math.log(b / a):.2f}"

        return cell

    return [Column(f"{kilo(a)} to {kilo(b)}", compute=exponent(a, b)) for a, b in zip(ns, ns[1:])]


ALIBI_GROWTH = Table(
    "alibi.json", ["path"], [Pivot({"benchmark": "alibi", "metric": "peak_mib"}, lambda r: (r.method,), growth_columns)]
)


def kernel_setup(rows: list[Row]) -> str:
    s = next(r for r in rows if r.benchmark == "alibi_kernels").setting
    return (
        "Attention kernels alone (one layer's q/k/v, batch 1), against SDPA is_causal at the same length; forward "
        "under no_grad, train = forward + backward of the output's sum (no CPU backward for flex). Median of "
        f"{s['repeats']}, {'CPU' if s['device'] == 'cpu' else 'wall'} time.\n\n"
    )


ALIBI_KERNELS = Table(
    "alibi.json",
    ["kernel", "length"],
    [
        Pivot(
            {"benchmark": "alibi_kernels"},
            lambda r: (r.method, str(r.setting["length"])),
            [
                Column("forward (s)", {"metric": "forward_s"}, fmt(".3f")),
                Column("forward ratio", {"metric": "forward_ratio"}, fmt(".2f")),
                Column("train (s)", {"metric": "train_s"}, fmt(".3f")),
                Column("train ratio", {"metric": "train_ratio"}, fmt(".2f")),
            ],
        )
    ],
    before=kernel_setup,
)

ALIBI_FOLDED_ERROR = Table(
    "alibi_folded_error.json",
    ["heads", "length"],
    [
        Pivot(
            {"benchmark": "alibi_folded_error"},
            lambda r: (str(r.setting["heads"]), str(r.setting["length"])),
            [
                Column("max slope", {"metric": "max_slope"}, fmt(".3f")),
                Column("exact fp32 error", {"metric": "exact_error"}, fmt(".2e")),
                Column("folded error", {"metric": "folded_error"}, fmt(".2e")),
                Column("logit bound", {"metric": "logit_bound"}, fmt(".1e")),
                Column("output bound", {"metric": "output_bound"}, fmt(".1e")),
            ],
        )
    ],
    before=lambda rows: (
        f"Causal attention, batch 1, {rows[0].setting['kv_heads']} kv heads of "
        f"{rows[0].setting['head_dim']}, fp32 on CPU ({rows[0].device}, {rows[0].setting['threads']} "
        f"threads, torch {rows[0].versions.get('torch')}). exact = SDPA with the fp32 bias; folded = "
        "ALiBi as extra query/key channels of SDPA's causal kernel; bound = what folding may add to "
        "the exact path's error by the module's derivation.\n\n"
    ),
)

CPU_BF16_TRAIN = Table(
    "cpu_bf16.json",
    ["recipe step"],
    [
        Pivot(
            {"benchmark": "cpu_bf16_train"},
            lambda r: (
                f"{r.setting['window']} tokens x {r.setting['batch']}, {r.setting['steps']} steps, "
                f"{r.setting['threads']} thread(s)",
            ),
            [
                Column("fp32 tok/s (CPU s)", {"method": "no", "metric": "tokens_per_cpu_s"}, fmt(".1f")),
                Column("bf16 tok/s (CPU s)", {"method": "bf16", "metric": "tokens_per_cpu_s"}, fmt(".1f")),
                Column("speed-up (CPU time)", {"metric": "speedup_cpu_time"}, fmt(".2f", "x")),
                Column("speed-up (wall)", {"metric": "speedup"}, fmt(".2f", "x")),
                Column("max loss difference", {"metric": "max_relative_loss_difference"}, fmt(".2f", "%", 100)),
            ],
        )
    ],
)

CPU_BF16_FORWARD = Table(
    "cpu_bf16.json",
    ["length", "precision"],
    [
        Pivot(
            {"benchmark": "cpu_bf16_forward", "vs": None},
            lambda r: (kilo(r.setting["length"]), r.method),
            [
                Column("perplexity", {"metric": "perplexity"}, fmt(".3f")),
                Column("seconds", {"metric": "ppl_seconds"}, fmt(".0f")),
                Column(
                    "passkeys found",
                    {"metric": "passkeys_found"},
                    lambda r: "".join("y" if c else "n" for c in r.extra["correct"]),
                ),
            ],
        )
    ],
)


def llamacpp_gaps(benchmark: str) -> Table:
    return Table(
        "llamacpp.json",
        ["case"],
        [
            Pivot(
                {"benchmark": benchmark},
                lambda r: (r.method,),
                [
                    Column("`gguf export`", {"metric": "exported"}, fmt(".2e")),
                    Column("GGUF to GGUF", {"metric": "direct"}, fmt(".2e")),
                    Column("converter only", {"metric": "converter_only"}, fmt(".3g")),
                ],
            )
        ],
    )


def kl_to_unpatched(group: list[Row], rows: list[Row]) -> str:
    own = value(rows, method="unpatched", metric="kl_mean", tokens=group[0].setting["tokens"])
    mean = value(group, metric="kl_mean")
    return "-" if own is None or mean is None else f"{mean / own:.2f}"


def ppl_gap(group: list[Row], rows: list[Row]) -> str:
    ours, theirs = value(group, metric="ppl_llamacpp"), value(group, metric="ppl_transformers")
    return "-" if ours is None or not theirs else f"{(ours / theirs - 1):+.2%}"


LLAMACPP_SMOLLM2 = Table(
    "llamacpp_smollm2.json",
    ["tokens", "case"],
    [
        Pivot(
            {"benchmark": "llamacpp_smollm2"},
            lambda r: (kilo(r.setting["tokens"]), r.method),
            [
                Column("mean KL", {"metric": "kl_mean"}, fmt(".4f")),
                Column("KL / unpatched", compute=kl_to_unpatched),
                Column("max abs diff", {"metric": "max_abs_diff"}, fmt(".2f")),
                Column("ppl transformers", {"metric": "ppl_transformers"}, fmt(".3f")),
                Column("ppl llama.cpp", {"metric": "ppl_llamacpp"}, fmt(".3f")),
                Column("ppl gap", compute=ppl_gap),
                Column(
                    "tensor bytes unchanged",
                    {"metric": "tensor_bytes_unchanged"},
                    lambda r: "yes" if r.value else "**no**",
                ),
            ],
            order=lambda r: r.setting["tokens"],
        )
    ],
)


def longrope_label(row: Row) -> tuple[str]:
    """``none``, ``yarn s=8``, ``longrope s=16 (searched, last 127)``: the method, its factor and variant."""
    if row.method == "none":
        return ("none",)
    variant = row.setting.get("variant")
    return (f"{row.method} s={row.setting['factor']:g}" + (f" ({variant})" if variant else ""),)


def longrope_columns(rows: list[Row]) -> list[Column]:
    points = sorted({(r.setting["length"], r.setting["multiple"]) for r in rows if r.metric == "perplexity"})
    return [
        *(Column(f"{n} ({m}x)", {"metric": "perplexity", "length": n}, fmt(".3f")) for n, m in points),
        Column("all tokens at s·128", {"metric": "perplexity_all_tokens"}, fmt(".3f")),
    ]


LONGROPE_MISSING = "_Not measured yet: run `nice -n 10 python benchmarks/longrope_tiny.py`._"
LONGROPE_TINY = Table(
    "longrope_tiny.json",
    ["method"],
    [
        Pivot(
            lambda r: r.benchmark == "longrope_tiny" and r.metric in ("perplexity", "perplexity_all_tokens"),
            longrope_label,
            longrope_columns,
        )
    ],
)


def search_summary(row: Row) -> str:
    history = row.extra["history"]
    return (
        f"{len(history)} rounds, {history[-1]['evaluated'] if history else 1} candidates, {row.extra['seconds']:.0f} s"
    )


def decode_speed(group: list[Row], rows: list[Row]) -> str:
    native, exact = value(group, exact_cache=False), value(group, exact_cache=True)
    return "-" if exact is None else f"exact_cache=True {exact:.2f} ({native / exact:.2f}x the speed)"


LONGROPE_CACHE = Table(
    "longrope_tiny.json",
    ["what"],
    [
        Pivot(
            {"benchmark": "longrope_tiny", "metric": "search_perplexity"},
            lambda r: (f"search {r.setting['factor']:g} {r.setting['fitness']} ({r.setting['length']} tokens)",),
            [
                Column("measured", show=lambda r: f"{r.extra['start_perplexity']:.4f} -> {r.value:.4f}"),
                Column("", show=search_summary),
            ],
        ),
        Pivot(
            {"benchmark": "longrope_tiny", "metric": "max_abs_logit_gap"},
            lambda r: ("cached decoding past the switch, max abs logit gap to a full forward",),
            [
                Column("", {"exact_cache": False}, lambda r: f"transformers' cache {r.value:.1e}"),
                Column("", {"exact_cache": True}, lambda r: f"exact_cache=True {r.value:.1e}"),
            ],
        ),
        Pivot(
            {"benchmark": "longrope_tiny", "metric": "decode_ms"},
            lambda r: ("decode step (ms)",),
            [
                Column("", {"exact_cache": False}, lambda r: f"transformers' cache {r.value:.2f}"),
                Column("", compute=decode_speed),
            ],
        ),
    ],
)


# --- GPU results -----------------------------------------------------------------------------------

CHECK_DETAILS = ("grad_rel_error", "logit_error", "bound", "wrapping", "mfu", "tokens_per_s", "peak_memory_gib")
CHECK_SHOWN = {
    "mfu": lambda v: f"MFU {v:.1%}",
    "tokens_per_s": lambda v: f"{v:,.0f} tokens/s",
    "peak_memory_gib": lambda v: f"{v:.1f} GiB peak",
}


def check_details(group: list[Row], rows: list[Row]) -> str:
    details = []
    for key in CHECK_DETAILS:
        found = value(group, metric=key, rope=None)
        if found is not None:
            details.append(
                CHECK_SHOWN[key](found)
                if key in CHECK_SHOWN
                else f"{key} {found:.3g}"
                if isinstance(found, float)
                else f"{key} {found}"
            )
    status = latest(r for r in group if r.metric == "status")
    if status is not None and "reason" in status.extra:
        details.append(f"reason {status.extra['reason']}")
    if status is not None and "error" in status.extra:
        details.append(status.extra["error"].split(":")[0])
    return "; ".join(details)


def where_run(rows: list[Row]) -> str:
    smoke = " (a CPU smoke run)" if rows[0].setting.get("mode") == "cpu-smoke" else ""
    return f"{rows[0].device}{smoke}, torch {rows[0].versions.get('torch')}.\n\n"


GPU_CHECK = Table(
    "gpu/check.json",
    ["item"],
    [
        Pivot(
            {"benchmark": "gpu_check"},
            lambda r: (f"`{r.method}`",),
            [
                Column("status", {"metric": "status"}),
                Column("seconds", {"metric": "seconds"}, fmt(".1f")),
                Column("details", compute=check_details),
            ],
        )
    ],
    before=where_run,
)


def decode_label(row: Row) -> tuple[str]:
    exact = row.setting.get("exact_cache")
    return (f"{row.method} " + ("(static)" if exact is None else "exact" if exact else "transformers"),)


def decode_table(source: str, before: Callable[[list[Row]], str] | None = None) -> Table:
    """``bench_dynamic_decode.py``'s decode rows: tokens/s, and the ratio to the static method."""
    return Table(
        source,
        [""],
        [
            Pivot(
                {"benchmark": "dynamic_decode"},
                decode_label,
                [
                    Column("decode tokens/s", {"metric": "decode_tokens_per_s"}, fmt(".1f")),
                    Column("vs static", {"metric": "decode_ratio_vs_static"}, fmt(".2f"), missing=""),
                ],
            )
        ],
        before=before,
    )


def finetune_goals(rows: list[Row]) -> str:
    """The fine-tune's steps, time and losses, the device, and whether the goals were met."""
    tuned = [r for r in rows if r.method == "fine-tuned"]
    training = latest(r for r in tuned if r.metric == "steps")
    if training is None:
        return ""
    plan, trained = training.setting["plan"], training.setting["original_context"]
    ppl = lengths([r for r in rows if r.metric == "perplexity"])
    passkey = lengths([r for r in rows if r.metric == "passkey"])
    losses, met = training.extra["losses"], lambda name: "met" if value(tuned, metric=name) else "not met"
    return (
        f"\n\n{training.value} steps of {plan['global_batch']} x "
        f"{plan.get('train_seq_len') or int(plan['factor'] * trained)} tokens in "
        f"{value(rows, method='run', metric='wall_s', part='fine-tune'):.0f} s "
        f"({value(tuned, metric='stopped_by')}), loss {losses[0]:.3f} -> {losses[-1]:.3f}; {training.device}. "
        f"Goals: passkey >= 90% at {kilo(max(passkey))} {met('goal_passkey_at_longest')}; perplexity at "
        f"{kilo(max(ppl))} <= the base model's at {kilo(trained)} {met('goal_ppl_longest_vs_base_at_trained')}."
    )


GPU_FINETUNE_REAL = Table(
    "gpu/finetune_real/finetune_real.json",
    ["model"],
    [
        Pivot(
            lambda r: r.benchmark == "gpu_finetune_real" and r.metric in ("perplexity", "passkey"),
            lambda r: (r.method,),
            lambda rows: [
                *(
                    Column(f"ppl {kilo(n)}", {"metric": "perplexity", "length": n}, fmt(".2f"))
                    for n in lengths([r for r in rows if r.metric == "perplexity"])
                ),
                *(
                    Column(f"passkey {kilo(n)}", {"metric": "passkey", "length": n}, fmt(".0%"))
                    for n in lengths([r for r in rows if r.metric == "passkey"])
                ),
            ],
        )
    ],
    after=finetune_goals,
)

GPU_MFU = Table(
    "gpu/mfu/mfu.json",
    ["variant", "tokens"],
    [
        Pivot(
            lambda r: r.benchmark == "gpu_mfu" and r.method != "run",
            lambda r: (f"`{r.method}`", str(r.setting.get("tokens", "-"))),
            [
                Column("step (s)", compute=ok_or("step_s", fmt(".3f"), lambda status: str(status.value))),
                Column("tokens/s", compute=ok_or("tokens_per_s", fmt(",.0f"))),
                Column("MFU", compute=ok_or("mfu", fmt(".1%"))),
                Column("peak memory", compute=ok_or("peak_memory_mib", fmt(".1f", " GiB", 1 / 1024), reason)),
            ],
        )
    ],
)


def prefill_label(row: Row) -> tuple[str, str]:
    if row.metric == "status":
        return str(row.setting["tokens"]), "skipped"
    return str(row.setting["tokens"]), row.method + (
        " (one forward each, first call)" if row.setting.get("probe") else ""
    )


GPU_PREFILL = Table(
    "gpu/prefill/prefill.json",
    ["prompt tokens (4x L_orig)", "method"],
    [
        Pivot(
            {"benchmark": "dynamic_prefill"},
            prefill_label,
            [
                Column("exact (s)", compute=ok_or("exact_prefill_s", fmt(".3f"))),
                Column("transformers (s)", compute=ok_or("transformers_prefill_s", fmt(".3f"))),
                Column("ratio", compute=ok_or("ratio", fmt(".1f", "x"), reason)),
            ],
        )
    ],
)


def decode_span(rows: list[Row]) -> str:
    s = next(r for r in rows if r.benchmark == "dynamic_decode").setting
    return f"Decode of the last {s['new_tokens']} tokens up to {int(s['factor'] * s['original_length'])}:\n\n"


GPU_PREFILL_DECODE = decode_table("gpu/prefill/prefill.json", before=decode_span)


def sedca_skipped() -> str | None:
    path = RESULTS / "gpu/sedca/sedca.json"
    status = (
        latest(r for r in read_rows(path) if r.method == "all" and r.metric == "status") if path.is_file() else None
    )
    return None if status is None else f"_Skipped: {status.extra['reason']}._"


def sedca_parity(rows: list[Row]) -> str:
    parity = [r for r in rows if r.benchmark == "gpu_sedca_parity"]
    lines = []
    for method in dict.fromkeys(r.method for r in parity if r.metric in ("ok", "status")):
        mine = [r for r in parity if r.method == method]
        status = latest(r for r in mine if r.metric == "status")
        lines.append(
            f"{method}: {status.extra['error']}"
            if status is not None
            else f"{method}: {'ok' if value(mine, metric='ok') else 'FAIL'} "
            f"({value(mine, metric='ratio_to_native'):.2f}x the native bf16 error)"
        )
    tokens = parity[0].setting["tokens"] if parity else "?"
    return (
        f"\n\nbf16 parity at {tokens} tokens (bound 3x the native model's bf16 error): " + "; ".join(lines) + "."
        if lines
        else ""
    )


GPU_SEDCA = Table(
    "gpu/sedca/sedca.json",
    ["variant", "tokens"],
    [
        Pivot(
            lambda r: r.benchmark == "gpu_sedca" and "tokens" in r.setting,
            lambda r: (f"`{r.method}`", str(r.setting["tokens"])),
            [
                Column("prefill (s)", compute=ok_or("prefill_s", fmt(".3f"), lambda status: str(status.value))),
                Column("peak memory", compute=ok_or("peak_memory_mib", fmt(".2f", " GiB", 1 / 1024))),
                Column("time vs SDPA", compute=ok_or("time_vs_sdpa", fmt(".2f", "x"))),
                Column("memory vs SDPA", compute=ok_or("memory_vs_sdpa", fmt(".2f", "x"))),
            ],
        )
    ],
    after=sedca_parity,
)


# --- The resumable real-model evaluations: their cell caches, read as rows (result_schema.rows_from_cells) ---


def real_model_view(kind: str) -> Callable[[list[Row]], list[Row]]:
    """``real_model/results.json``'s ``kind`` (ppl or passkey) rows as the table shows them: one per label and length.

    One cell serves several labels (``yarn s=L/8k`` at 8k is the ``none`` cell; at 32k ``yarn s=4``'s):
    each (label, length) of ``real_model.variants`` of the full plan gets a copy of its cell's row (value
    ``None`` where the cell is not computed yet), the fine-tuned row (``tuned``) last, at the lengths
    with a cell of ``kind``. The passkey table leaves out labels with no cell.
    """

    def derive(rows: list[Row]) -> list[Row]:
        import real_model

        plan = real_model.WITH_PASSKEY_4X
        cells = {(r.method, r.setting.get("length")): r for r in rows if r.metric == kind}
        ns = [n for n in (plan.lengths if kind == "ppl" else plan.passkey_lengths) if any(k[1] == n for k in cells)]
        view: list[Row] = []
        for n in ns:
            for name, method, factor in [*real_model.variants(plan, n, kind == "ppl"), ("tuned", "tuned", None)]:
                cell = "tuned" if method == "tuned" else real_model.cell_key(kind, method, factor, n).split("/")[1]
                found = cells.get((cell, n))
                empty = Row("real_model", name, {}, kind, None, "", "", {}, "1970-01-01T00:00:00+00:00")
                view.append(dataclasses.replace(found or empty, method=name, setting={"length": n}))
        shown = {r.method for r in view if r.value is not None or r.extra.get("value")} if kind == "passkey" else None
        return [r for r in view if shown is None or r.method in shown]

    return derive


def row_label(row: Row) -> tuple[str]:
    if row.method == "tuned":
        return ("YaRN s = 4 after the fine-tune",)
    return (row.method.replace(" s=", ", s = "),)


def real_model_columns(show: Callable[[Row], str]) -> Callable[[list[Row]], list[Column]]:
    return lambda rows: [
        Column(f"{kilo(n)} ({n / 8192:g}x)", {"length": n}, show)
        for n in dict.fromkeys(r.setting["length"] for r in rows)
    ]


def passkey_found(row: Row) -> str:
    """``found/asked (x.x)``: the keys found per depth of a real_model passkey cell."""
    result = row.extra["value"]
    found = [result["correct"][d][0] for d in range(len(result["depths"]))]
    return f"{sum(found)}/{len(found) * result['trials']} ({''.join('x' if f else '.' for f in found)})"


REAL_MODEL_MISSING = "_Not measured yet: run `python benchmarks/real_model.py`._"
REAL_MODEL_PPL = Table(
    "real_model/results.json",
    ["method"],
    [Pivot({"metric": "ppl"}, row_label, real_model_columns(fmt(".2f")))],
    derive=real_model_view("ppl"),
)
REAL_MODEL_PASSKEY = Table(
    "real_model/results.json",
    ["method"],
    [Pivot({"metric": "passkey"}, row_label, real_model_columns(passkey_found))],
    derive=real_model_view("passkey"),
)


def training_free_columns(rows: list[Row]) -> list[Column]:
    """Passkeys found / asked (95% Wilson interval) per passkey length, then perplexity per cut."""

    def found(n: int) -> Callable[[list[Row], list[Row]], str]:
        return lambda group, _: found_cell([r.value for r in group if r.matches(metric="passkey", length=n)])

    return [
        *(Column(f"passkey {kilo(n)} (95% interval)", compute=found(n)) for n in lengths(rows_of(rows, "passkey"))),
        *(
            Column(f"ppl {kilo(n)}", {"metric": "ppl", "length": n}, lambda r: f"{r.value:.2f}" if r.value else "-")
            for n in lengths(rows_of(rows, "ppl"))
        ),
    ]


def rows_of(rows: list[Row], metric: str) -> list[Row]:
    return [r for r in rows if r.metric == metric]


TRAINING_FREE_REAL_MODEL = Table(
    "training_free/results.json",
    ["method"],
    [
        Pivot(
            lambda r: r.metric in ("passkey", "ppl"),
            lambda r: (r.method,),
            training_free_columns,
            # The script's rows in its own order (training_free_real_model.METHODS), any others after them.
            order=["none", "yarn s=4", "self_extend f=4", "dca", "self_extend f=2 on yarn s=2"],
        )
    ],
)


def training_free_real_model_paired() -> str:
    """The exact McNemar tests of the training-free cells (``training_free_real_model.paired_table``, from the rows)."""
    import training_free_real_model

    return training_free_real_model.paired_table()


def longrope_smollm2() -> str:
    """LongRoPE searched on SmolLM2 against YaRN and the base model (``longrope_real_model.ppl_table``, from the rows).

    The training-free cells and llama.cpp's (``longrope_smollm2/llamacpp.json``) read as rows; ``--report`` writes
    the same table into ``longrope_smollm2/results.md``.
    """
    import longrope_real_model

    return longrope_real_model.ppl_table()


def finetune_smollm2() -> str:
    """The fine-tuned SmolLM2 against the training-free rows: the tables of its report, from the rows.

    ``finetune_real_model.tables_text``: the recipe's, the experiments', llama.cpp's and the training-free
    cells read as rows (``result_schema.rows_from_cells``), pivoted; ``--report`` writes the same tables
    into ``finetune_smollm2/results.md`` after its introduction.
    """
    import finetune_real_model

    return finetune_real_model.tables_text().rstrip()


def switch_columns(rows: list[Row]) -> list[Column]:
    columns = []
    for cache, header in (
        ("transformers", "transformers' `longrope`"),
        ("recompute", "default"),
        ("per_query", '`factors_by="query"`'),
    ):
        for step, metric in (("crossing step", "crossing"), ("steady step", "steady")):
            columns.append(
                Column(
                    f"{header}, {step}",
                    compute=lambda group, _, c=cache, m=metric: _switch(group, c, m),
                )
            )
    return columns


def _switch(group: list[Row], cache: str, metric: str) -> str:
    seconds = value(group, cache=cache, metric=f"{metric}_step_s")
    times = value(group, cache=cache, metric=f"{metric}_ratio_vs_transformers")
    return "-" if seconds is None or times is None else f"{seconds * 1e3:.2f} ms ({times:.2f}x)"


def switch_model(row: Row) -> tuple[str, str]:
    s = row.setting
    prefill = f"{s['layers']} layers, hidden {s['hidden']}, {s['heads']}/{s['kv_heads']} heads, vocab {s['vocab']}"
    return (prefill, f"{s['original_length']}")


def switch_prefill(group: list[Row], rows: list[Row]) -> str:
    seconds = value(group, cache="transformers", metric="prefill_s")
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


LONGROPE_SWITCH = Table(
    "longrope_switch.json",
    ["model (random weights, fp32, sdpa)", "L₀"],
    [
        Pivot(
            {"benchmark": "longrope_switch"},
            switch_model,
            lambda rows: [*switch_columns(rows), Column("transformers' prefill of L₀ tokens", compute=switch_prefill)],
            order=lambda r: r.setting["layers"],
        )
    ],
)


SWEEP = RESULTS / "model_sweep.json"
SWEEP_STATUS = {"native": "native", "plugin": "plugin"}


def supported_model_types() -> str:
    """``hf_posext.SUPPORTED_MODEL_TYPES`` (the model types tests/test_architectures.py passes on), wrapped."""
    import textwrap

    from hf_posext.architectures import SUPPORTED_MODEL_TYPES

    return "\n".join(textwrap.wrap(", ".join(f"`{name}`" for name in SUPPORTED_MODEL_TYPES), 100))


def supported_models() -> str:
    """The model sweep (benchmarks/model_sweep.py): a row per model type, a column per swept method, each refusal's
    line numbered below, and the model types that do not build as a tiny model."""
    if not SWEEP.is_file():
        return "_Not measured yet: run `python benchmarks/model_sweep.py`._"
    rows = [r for r in read_rows(SWEEP) if r.benchmark == "model_sweep"]
    unbuildable = [r for r in rows if r.value == "unbuildable"]
    outcomes = [r for r in rows if r.value != "unbuildable"]
    methods = list(dict.fromkeys(r.method for r in outcomes))
    by_type: dict[str, dict[str, Row]] = {}
    for row in outcomes:
        by_type.setdefault(row.setting["model_type"], {})[row.method] = row
    reasons: dict[str, int] = {}

    def cell(row: Row | None) -> str:
        if row is None:
            return ""
        if row.value in SWEEP_STATUS:
            return SWEEP_STATUS[row.value]
        number = reasons.setdefault(row.extra["why"], len(reasons) + 1)
        return f"refused [{number}]"

    lines = ["| model type | " + " | ".join(f"`{m}`" for m in methods) + " |", "|" + "---|" * (len(methods) + 1)]
    lines += [
        f"| `{model_type}` | " + " | ".join(cell(found.get(m)) for m in methods) + " |"
        for model_type, found in sorted(by_type.items())
    ]
    every = sum(all(found[m].value in SWEEP_STATUS for m in methods if m in found) for found in by_type.values())
    first = rows[0]
    lines += [
        "",
        f"_{len(by_type)} model types built tiny; {every} extend with every swept method; "
        f"transformers {first.versions.get('transformers')}, torch {first.versions.get('torch')}, "
        f"commit {first.versions.get('commit')}, {first.device}, measured {first.time[:10]}._",
    ]
    if reasons:
        lines += ["", "Refusals (each one `ValueError` line):", ""]
        lines += [f"{number}. {why if len(why) <= 300 else why[:300] + ' …'}" for why, number in reasons.items()]
    if unbuildable:
        lines += ["", "Not built as a tiny model here (the registry's defaults do not shrink to a working one):", ""]
        lines += [f"- `{r.setting['model_type']}`: {r.extra['why']}" for r in unbuildable]
    return "\n".join(lines)


TABLES: dict[str, Callable[[], str]] = {
    "supported-models": supported_models,
    "supported-model-types": supported_model_types,
    "readers": readers_table,
    "reader-matrix": matrix_table,
    "real-model-ppl": block(REAL_MODEL_PPL, missing=REAL_MODEL_MISSING),
    "real-model-passkey": block(REAL_MODEL_PASSKEY, missing=REAL_MODEL_MISSING),
    "training-free-real-model": block(
        TRAINING_FREE_REAL_MODEL, missing="_Not measured yet: run `python benchmarks/training_free_real_model.py`._"
    ),
    "training-free-real-model-paired": training_free_real_model_paired,
    "finetune-smollm2": finetune_smollm2,
    "longrope-smollm2": longrope_smollm2,
    "patch-overhead": block(PATCH_OVERHEAD),
    "long-train": block(LONG_TRAIN),
    "alibi-cpu": block(ALIBI_CPU),
    "alibi-paths": block(ALIBI_PATHS),
    "alibi-growth": block(ALIBI_GROWTH),
    "alibi-kernels": block(ALIBI_KERNELS),
    "alibi-folded-error": block(ALIBI_FOLDED_ERROR),
    "cpu-bf16": block(
        CPU_BF16_TRAIN, CPU_BF16_FORWARD, missing="_Not measured yet: no cpu_bf16.json (benchmarks/bench_cpu_bf16.py)._"
    ),
    "llamacpp-tiny": block(
        llamacpp_gaps("llamacpp_tiny"),
        missing="_Not measured yet: no llamacpp_tiny rows in llamacpp.json (python benchmarks/llamacpp_gguf.py)._",
    ),
    "llamacpp-architectures": block(
        llamacpp_gaps("llamacpp_architectures"),
        missing="_Not measured yet: no "
        "llamacpp_architectures rows in llamacpp.json (python benchmarks/llamacpp_gguf.py)._",
    ),
    "llamacpp-smollm2": block(LLAMACPP_SMOLLM2),
    "longrope-tiny": block(LONGROPE_TINY, missing=LONGROPE_MISSING),
    "longrope-cache": block(LONGROPE_CACHE, missing=LONGROPE_MISSING),
    "longrope-switch": block(
        LONGROPE_SWITCH, missing="_Not measured yet: run `python benchmarks/bench_longrope_switch.py`._"
    ),
    "gpu-check": block(GPU_CHECK),
    "gpu-dynamic-decode": block(decode_table("gpu/dynamic_decode.json")),
    "gpu-finetune-real": block(GPU_FINETUNE_REAL),
    "gpu-mfu": block(GPU_MFU),
    "gpu-prefill": block(GPU_PREFILL, GPU_PREFILL_DECODE),
    "gpu-sedca": block(sedca_skipped, GPU_SEDCA),
}


#: The blocks that are a list of names, not a table.
LISTS = ("supported-model-types",)


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
    """The Markdown files under :data:`SEARCHED`, and the README, holding at least one marked block."""
    pages = [root / "README.md", *(p for folder in SEARCHED for p in sorted((root / folder).rglob("*.md")))]
    pages = [p for p in pages if p.is_file()]
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
