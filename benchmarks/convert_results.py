"""One-off: the committed benchmark JSON of each script's own shape, rewritten as rows of result_schema.py.

Run once, from the repository root, on the files as main left them:

    PYTHONPATH=. python benchmarks/convert_results.py

Each row's time is the author time of the commit from which its part of the old file (a top-level
key, or the whole file) holds the value it holds now; versions are what the file recorded (its
environment, or its "torch" key) plus that commit; device is the CPU or GPU model it recorded,
else "CPU (model not recorded)". Metric names are the old keys; units follow result_schema.unit_of.
The command that made a part, where the file recorded it, goes into ``extra["command"]``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from result_schema import Row, dumps, read_rows, unit_of  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
UNRECORDED_CPU = "CPU (model not recorded)"


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def since(relative: str, key: str | None = None) -> tuple[str, str]:
    """``(time, short commit)`` of the oldest commit since which ``key`` of the file (or all of it) is unchanged."""
    path = f"benchmarks/results/{relative}"
    current = json.loads((ROOT / path).read_text())
    current = current if key is None else current[key]
    found = None
    for line in git("log", "--format=%H %h %aI", "--", path).splitlines():
        full, short, when = line.split()
        try:
            then = json.loads(git("show", f"{full}:{path}"))
        except (subprocess.CalledProcessError, json.JSONDecodeError):
            break
        if (then if key is None else then.get(key)) != current:
            break
        found = (when, short)
    if found is None:
        raise SystemExit(f"{path}: no commit holds its current {key or 'content'}")
    return found


def versions(environment: dict[str, Any] | None, commit: str, **more: str) -> dict[str, str]:
    env = environment or {}
    found = {k: env[k] for k in ("python", "torch", "transformers") if env.get(k)}
    found.update({k: v for k, v in (env.get("packages") or {}).items() if v})
    found.update({k: v for k, v in more.items() if v})
    found["commit"] = commit
    return found


def device(environment: dict[str, Any] | None, default: str = UNRECORDED_CPU) -> str:
    env = environment or {}
    return (env.get("gpu") or {}).get("name") or env.get("cuda") or env.get("cpu") or default


class Maker:
    """Rows of one part of one old file: its device, versions, time and command in common."""

    def __init__(self, relative: str, key: str | None, environment: dict | None, benchmark: str,
                 setting: dict | None = None, command: str | None = None, device_name: str | None = None,
                 **more_versions: str) -> None:
        self.time, commit = since(relative, key)
        self.versions = versions(environment, commit, **more_versions)
        self.device = device_name or device(environment)
        self.benchmark, self.setting = benchmark, dict(setting or {})
        if command is None and environment and environment.get("argv"):
            command = " ".join(environment["argv"])
        self.command = command
        self.rows: list[Row] = []

    def add(self, method: str, metric: str, value: Any, setting: dict | None = None, unit: str | None = None,
            benchmark: str | None = None, **extra: Any) -> None:
        if self.command:
            extra["command"] = self.command
        self.rows.append(Row(benchmark or self.benchmark, method, json.loads(json.dumps({**self.setting, **(setting or {})})),
                             metric, value, unit_of(metric) if unit is None else unit, self.device, self.versions,
                             self.time, extra))

    def add_all(self, method: str, values: dict[str, Any], setting: dict | None = None, unit: str | None = None,
                benchmark: str | None = None, **extra: Any) -> None:
        for metric, value in values.items():
            self.add(method, metric, value, setting, unit, benchmark, **extra)


def load(relative: str) -> dict[str, Any]:
    return json.loads((RESULTS / relative).read_text())


def patch_overhead() -> list[Row]:
    data = load("patch_overhead.json")
    meta = data["meta"]
    make = Maker("patch_overhead.json", None, data.get("environment"), "patch_overhead",
                 {k: meta[k] for k in ("factor", "original", "clock", "threads")}, torch=meta["torch"],
                 transformers=meta["transformers"])
    for r in data["rows"]:
        method = r["method"].removesuffix(" (exact_cache=False)")
        setting = {"length": r["length"], **({"exact_cache": False} if r["method"] != method else {})}
        make.add_all(method, {k: r[k] for k in ("native_ms", "patched_ms", "ratio")}, setting)
    return make.rows


LONG_TRAIN_METRICS = ("baseline_mib", "peak_step_mib", "peak_mib", "step_s", "step_cpu_s", "tokens_per_s",
                      "tokens_per_cpu_s", "loss")


def long_train(relative: str) -> list[Row]:
    data = load(relative)
    setup = dict(data["setup"])
    setup["rope"] = setup.pop("method")
    setup.setdefault("mmap_threshold", 0)  # measured before the option existed: glibc's dynamic default
    make = Maker(relative, None, data.get("environment"), "long_train", setup)
    for length, sides in sorted(data["runs"].items(), key=lambda item: int(item[0])):
        for side in ("recipe", "trainer"):
            if side in sides:
                make.add_all(side, {k: sides[side][k] for k in LONG_TRAIN_METRICS}, {"tokens": int(length)})
    for length, estimate in data.get("extrapolated", {}).items():
        for side in ("recipe", "trainer"):
            make.add(side, "peak_step_mib", estimate[f"{side}_peak_step_mib"],
                     {"tokens": int(length), "extrapolated": True})
    for side, fit in data.get("largest_fit_24gib", {}).items():
        if fit:
            make.add(side, "largest_fit_tokens", fit["tokens"], {"budget_gib": 24}, unit="tokens",
                     **{k: v for k, v in fit.items() if k != "tokens"})
    return make.rows


def alibi() -> list[Row]:
    data = load("alibi.json")
    settings = {k: v for k, v in data["settings"].items() if k != "lengths"}
    make = Maker("alibi.json", None, None, "alibi", settings, torch=data["torch"])
    for r in data["rows"]:
        if "skipped" in r:
            make.add(r["path"], "status", "skip", {"length": r["length"]}, reason=r["skipped"])
        else:
            make.add_all(r["path"], {k: r[k] for k in ("time_s", "cpu_s", "peak_mib", "time_ratio", "memory_ratio")},
                         {"length": r["length"]})
    for r in data["kernels"]:
        values = {k: r[k] for k in ("forward_s", "train_s", "forward_ratio", "train_ratio") if k in r}
        make.add_all(r["kernel"], values, {"length": r["length"]}, benchmark="alibi_kernels")
    return make.rows


def alibi_folded_error() -> list[Row]:
    data = load("alibi_folded_error.json")
    threads = int(data["machine"].split()[1])
    make = Maker("alibi_folded_error.json", None, None, "alibi_folded_error",
                 {"kv_heads": 2, "head_dim": 64, "dtype": "float32", "threads": threads}, torch=data["torch"])
    for r in data["rows"]:
        make.add_all("alibi_folded", {k: r[k] for k in ("max_slope", "exact_error", "folded_error", "logit_bound",
                                                         "output_bound")}, {"heads": r["heads"], "length": r["length"]})
    return make.rows


def cpu_bf16() -> list[Row]:
    data = load("cpu_bf16.json")
    rows = []
    t = data["train"]
    make = Maker("cpu_bf16.json", "train", t["environment"], "cpu_bf16_train",
                 {"window": t["window"], "batch": t["batch"], "steps": t["steps"], "threads": t["threads"],
                  "native_bf16": t["native_bf16"]})
    for precision in ("no", "bf16"):
        make.add_all(precision, {"tokens_per_s": t["tokens_per_s"][precision],
                                 "tokens_per_cpu_s": t["tokens_per_cpu_s"][precision]},
                     seconds=t["seconds"][precision], cpu_seconds=t["cpu_seconds"][precision],
                     losses=t["losses"][precision], part_wall_seconds=t["wall_seconds"])
    make.add_all("bf16", {k: t[k] for k in ("speedup", "speedup_cpu_time", "max_relative_loss_difference")},
                 {"vs": "no"}, part_wall_seconds=t["wall_seconds"])
    rows += make.rows
    f = data["forward"]
    make = Maker("cpu_bf16.json", "forward", f["environment"], "cpu_bf16_forward", {"native_bf16": f["native_bf16"]})
    for r in f["rows"]:
        setting = {"length": r["length"]}
        make.add_all(r["precision"], {"perplexity": r["perplexity"], "ppl_seconds": r["ppl_seconds"],
                                      "passkey_seconds": r["passkey_seconds"]}, setting,
                     part_wall_seconds=f["wall_seconds"])
        make.add(r["precision"], "passkeys_found", sum(r["passkey_correct"]), setting, unit="keys",
                 correct=r["passkey_correct"], answers=r["passkey_answers"], part_wall_seconds=f["wall_seconds"])
    for name, summary in f["summary"].items():
        precision, _, length = name.partition(" @ ")
        make.add_all(precision, summary, {"length": int(length), "vs": "fp32"}, part_wall_seconds=f["wall_seconds"])
    rows += make.rows
    s = data["sdpa"]
    make = Maker("cpu_bf16.json", "sdpa", s["environment"], "cpu_bf16_sdpa",
                 {"threads": s["threads"], "repeats": s["repeats"], "native_bf16": s["native_bf16"]})
    for r in s["rows"]:
        setting = {"kind": r["kind"], "length": r["length"]}
        wall = {"part_wall_seconds": s["wall_seconds"]}
        for dtype in ("float32", "bfloat16"):
            make.add(dtype, "seconds", r["seconds"][dtype], setting, **wall)
            make.add(dtype, "gflops", r["gflops"][dtype], setting, unit="GFLOP/s", **wall)
        make.add("bfloat16", "speedup", r["speedup"], {**setting, "vs": "float32"}, **wall)
    return rows + make.rows


LLAMACPP_PYTHON = "0.3.36"


def llamacpp() -> list[Row]:
    data = load("llamacpp.json")
    rows = []
    for key, benchmark in (("tiny_llama_3x", "llamacpp_tiny"), ("tiny_architectures_3x", "llamacpp_architectures")):
        part = data[key]
        make = Maker("llamacpp.json", key, None, benchmark, {"tokens": part["tokens"]}, command=part["command"],
                     **{"llama-cpp-python": data["llama_cpp_python"]})
        for case, values in part["cases"].items():
            make.add_all(case, values, unit="logit")
        rows += make.rows
    return rows


def llamacpp_smollm2() -> list[Row]:
    data = load("llamacpp_smollm2.json")
    rows = []
    for key in sorted((k for k in data if k.startswith("smollm2_q4_1_")), key=lambda k: int(k.rsplit("_", 1)[1])):
        part = data[key]
        threads = int(part["command"].rsplit("--threads", 1)[1])
        make = Maker("llamacpp_smollm2.json", key, None, "llamacpp_smollm2", {"threads": threads},
                     command=part["command"], **{"llama-cpp-python": data["llama_cpp_python"]})
        for case, values in part["cases"].items():
            setting = {"tokens": values["tokens"]}
            for metric, value in values.items():
                if metric != "tokens":
                    make.add(case, metric, value, setting, unit="logit" if metric == "max_abs_diff" else None)
        rows += make.rows
    return rows


def longrope_label(name: str) -> tuple[str, dict[str, Any]]:
    """``"longrope s=8 (searched, last 127)"`` -> ``("longrope", {"factor": 8.0, "variant": "searched, last 127"})``."""
    if name == "none":
        return "none", {"factor": 1.0}
    head, _, variant = name.partition(" (")
    method, _, factor = head.partition(" s=")
    return method, {"factor": float(factor), **({"variant": variant.rstrip(")")} if variant else {})}


def longrope_rows(make: Maker, rows: dict[str, Any], lengths: list[int], train_len: int) -> None:
    for name, row in rows.items():
        method, setting = longrope_label(name)
        setting.update({k: row[k] for k in ("attention_factor", "exact_cache") if k in row})
        for point in row["points"]:
            make.add(method, "perplexity", point["perplexity"],
                     {**setting, "length": point["length"], "multiple": point["length"] // train_len,
                      "score_last": train_len - 1}, **{k: point[k] for k in ("nll", "tokens", "documents")})
        whole = row["all_tokens"]
        make.add(method, "perplexity_all_tokens", whole["perplexity"], {**setting, "length": whole["length"]},
                 **{k: whole[k] for k in ("nll", "tokens", "documents")})


def longrope_search(make: Maker, fitness: str, search: dict[str, Any], documents: int, seconds: float | None) -> None:
    extra = {k: v for k, v in search.items() if k not in ("perplexity", "factor", "length")}
    if seconds is not None:
        extra["seconds"] = seconds
    make.add("longrope", "search_perplexity", search["perplexity"],
             {"factor": search["factor"], "fitness": fitness, "length": search["length"], "population": 16,
              "rounds": 10, "search_documents": documents}, **extra)


def longrope_tiny() -> list[Row]:
    data = load("longrope_tiny.json")
    make = Maker("longrope_tiny.json", None, data["environment"], "longrope_tiny", {"documents": 16})
    train_len = data["lengths"][0]
    longrope_rows(make, data["rows"], data["lengths"], train_len)
    for key, search in data["searches"].items():
        fitness = key.split(" ", 1)[1]
        longrope_search(make, fitness, {k: v for k, v in search.items() if k != "seconds"}, 4, search["seconds"])
    for exact in (False, True):
        name = "exact_cache" if exact else "transformers"
        make.add("longrope", "max_abs_logit_gap", data["cache"][name],
                 {"factor": 16.0, "variant": "searched, last 127", "exact_cache": exact, "prompt": 100, "to": 256},
                 unit="logit")
        make.add("longrope", "decode_ms", data["decode_ms"][name],
                 {"factor": 16.0, "variant": "searched, last 127", "exact_cache": exact, "prompt": 1024, "steps": 64,
                  "repeats": 5})
    return make.rows


def longrope_tiny_12_files() -> list[Row]:
    relative = "longrope_tiny_8x_12_files.json"
    data = load(relative)
    make = Maker(relative, None, data["environment"], "longrope_tiny", {"documents": 16})
    search = data["search"]
    longrope_search(make, "last 127", search, 12, None)
    rows = {"yarn s=8": data["rows"]["yarn s=8"],
            "longrope s=8 (searched on 12 files, last 127)": data["rows"]["longrope s=8 (searched on 12 files, last 127)"]}
    rows["longrope s=8 (searched on 12 files, last 127)"] = {
        **rows["longrope s=8 (searched on 12 files, last 127)"], "attention_factor": search["attention_factor"],
        "exact_cache": False}
    longrope_rows(make, rows, data["lengths"], data["lengths"][0])
    return make.rows


def number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"True": True, "False": False, "None": None}.get(text, text)


def dynamic_decode(relative: str, device_name: str | None = None, torch: str | None = None) -> list[Row]:
    data = load(relative)
    args = {k: number(v) for k, v in data["args"].items() if k not in ("out", "device", "prefill_multiples")}
    args = {k: v for k, v in args.items() if v is not None}
    if "clock" in data:
        args["clock"] = data["clock"]
    make = Maker(relative, None, data.get("environment"), "dynamic_decode", args, device_name=device_name, torch=torch)
    for r in data["results"]:
        setting = {} if r["exact_cache"] is None else {"exact_cache": r["exact_cache"]}
        make.add_all(r["method"], {k: r[k] for k in ("decode_tokens_per_s", "prefill_s", "decode_ratio_vs_static",
                                                      "prefill_ratio_vs_static") if k in r}, setting)
    for r in data["prefill"]:
        make.add_all(r["method"], {k: r[k] for k in ("exact_prefill_s", "transformers_prefill_s", "ratio")},
                     {"multiple_of_original": r["multiple_of_original"], "tokens": r["tokens"]},
                     benchmark="dynamic_prefill")
    for r in data.get("longrope", []):
        case = {k: r[k] for k in ("scenario", "keep_first", "context_from", "context_to")}
        if r["exact_cache"] is not None:
            case["exact_cache"] = r["exact_cache"]
        make.add_all("none" if r["exact_cache"] is None else "longrope",
                     {k: r[k] for k in ("decode_tokens_per_s", "decode_ratio_vs_plain", "best_round_ratio_vs_plain")},
                     case, benchmark="dynamic_decode_longrope", round_seconds=r["round_seconds"])
    return make.rows


def gpu_check() -> list[Row]:
    data = load("gpu/check.json")
    make = Maker("gpu/check.json", None, None, "gpu_check", {"mode": "gpu"}, device_name=data["device"],
                 torch=data["torch"])
    for name, item in data["items"].items():
        extra = {k: item[k] for k in ("reason", "error", "traceback", "losses") if k in item}
        make.add(name, "status", item["status"], **extra)
        for key, value in item.items():
            if key in ("status", *extra):
                continue
            if key == "methods":
                for method, result in value.items():
                    make.add_all(name, result, {"rope": method})
            else:
                make.add(name, key, value)
    return make.rows


def bench_train() -> list[Row]:
    data = load("bench_train.json")
    make = Maker("bench_train.json", None, data.get("environment"), "bench_train", data["setup"])
    for side, runs in data["runs"].items():
        for metric in ("tokens_per_s", "peak_mib"):
            make.add(side, metric, data["median"][side][metric], statistic="median of the repeats",
                     repeats=[r[metric] for r in runs])
    return make.rows


def training_free_bench(relative: str) -> list[Row]:
    data = load(relative)
    make = Maker(relative, None, data["environment"], "training_free_bench",
                 {"layers": data["layers"], "repeats": data["repeats"]}, command=data["command"])
    for length, variants in data["results"].items():
        for variant, values in variants.items():
            make.add_all(variant, values, {"length": int(length), **(data["variants"][variant] or {})})
    return make.rows


def bench_ruler(relative: str) -> list[Row]:
    data = load(relative)
    env = data["environment"]
    setting = {"model": "SmolLM2-135M-Instruct Q4_1", "task": data["task"], "length": data["length"],
               "samples": data["samples"], "threads": env["torch_threads"]}
    make = Maker(relative, None, env, "ruler_throughput", setting, command=data["command"])
    make.add("none", "fit_prompts_per_minute", data["fit_prompts_per_minute"])
    if "prompts_per_minute" in data:
        cell = {k: data[k] for k in ("batch_size", "max_new_tokens")}
        make.add_all("none", {"prompts_per_minute": data["prompts_per_minute"], "cell_seconds": data["cell_seconds"]},
                     cell)
        make.add("none", "accuracy", data["accuracy"], cell, unit="%", low=data["low"], high=data["high"])
    return make.rows


def main() -> int:
    h200 = load("gpu/check.json")
    converted = {
        "patch_overhead.json": patch_overhead(),
        "long_train.json": long_train("long_train.json"),
        "long_train_glibc_default.json": long_train("long_train_glibc_default.json"),
        "alibi.json": alibi(),
        "alibi_folded_error.json": alibi_folded_error(),
        "cpu_bf16.json": cpu_bf16(),
        "llamacpp.json": llamacpp(),
        "llamacpp_smollm2.json": llamacpp_smollm2(),
        "longrope_tiny.json": longrope_tiny(),
        "longrope_tiny_8x_12_files.json": longrope_tiny_12_files(),
        "dynamic_decode.json": dynamic_decode("dynamic_decode.json"),
        "real_model_prefill.json": dynamic_decode("real_model_prefill.json"),
        "dynamic_decode_longrope.json": dynamic_decode("dynamic_decode_longrope.json"),
        "gpu/dynamic_decode.json": dynamic_decode("gpu/dynamic_decode.json", h200["device"], h200["torch"]),
        "gpu/check.json": gpu_check(),
        "bench_train.json": bench_train(),
        "training_free_bench.json": training_free_bench("training_free_bench.json"),
        "training_free_bench_string_rerope.json": training_free_bench("training_free_bench_string_rerope.json"),
        "ruler/bench_ruler.json": bench_ruler("ruler/bench_ruler.json"),
        "ruler/bench_ruler_fit.json": bench_ruler("ruler/bench_ruler_fit.json"),
    }
    for relative, rows in converted.items():
        (RESULTS / relative).write_text(dumps(rows))
        assert read_rows(RESULTS / relative) == rows, relative
        print(f"{relative}: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
