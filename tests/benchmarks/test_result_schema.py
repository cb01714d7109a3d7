"""The one result schema (``benchmarks/result_schema.py``), its writer (``harness.Results``) and its renderer.

Every committed results file of a migrated benchmark must parse as rows; a rerun replaces the rows
it owns and nothing else; the renderer pivots rows into the Markdown the docs hold.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import harness  # noqa: E402  (benchmarks/ is not a package)
from result_schema import (  # noqa: E402
    FIELDS,
    Row,
    dumps,
    merge,
    read_rows,
    row_from_dict,
    rows_from_cells,
    unit_of,
    write_rows,
)

from scripts import pivot, tables  # noqa: E402  (the renderer and the docs' tables)

RESULTS = ROOT / "benchmarks" / "results"
#: The resumable evaluations' cell caches: read as rows (``result_schema.rows_from_cells``), written as cells.
CELL_CACHES = ("real_model/", "training_free/", "training_free_bf16/", "finetune_smollm2/", "longrope_smollm2/")
#: The library commands' own reports: not benchmark results (their commands own them).
NOT_ROWS = (
    *CELL_CACHES,
    "demo/",
    "ruler/smollm2",
    "scratch.json",
    "extension.json",
    "passkey.json",
)
WHEN = "2026-12-01T00:00:00+00:00"


def row(
    method: str = "yarn", metric: str = "ratio", value=1.0, benchmark: str = "demo", time: str = WHEN, **setting
) -> Row:
    return Row(benchmark, method, setting or {"length": 64}, metric, value, unit_of(metric), "cpu", {}, time)


def test_every_committed_results_file_but_the_cell_caches_is_rows_of_the_schema():
    files = [
        p
        for p in sorted(RESULTS.rglob("*.json"))
        if "work" not in p.relative_to(RESULTS).parts and not str(p.relative_to(RESULTS)).startswith(NOT_ROWS)
    ]
    assert len(files) >= 19
    for path in files:
        rows = read_rows(path)
        assert rows, path
        assert all(r.device and r.versions for r in rows), path
        assert path.read_text() == dumps(rows), f"{path}: not written as one row a line"


def test_every_committed_cell_cache_reads_as_rows_one_per_cell():
    files = [
        p
        for p in sorted(RESULTS.rglob("*.json"))
        if "work" not in p.relative_to(RESULTS).parts
        and str(p.relative_to(RESULTS)).startswith(CELL_CACHES)
        and "cells" in json.loads(p.read_text())
    ]
    assert len(files) >= 8
    for path in files:
        cells = json.loads(path.read_text())["cells"]
        rows = read_rows(path)
        assert [r.extra["key"] for r in rows] == list(cells), path
        assert all(r.device and r.versions and r.benchmark for r in rows), path


def test_a_cells_file_in_todays_format_reads_as_rows(tmp_path):
    """The resumable evaluations' format (real_model.Cells), migrated on read: one row per cell."""
    ppl = {"length": 4096, "perplexity": 12.5, "nll": 2.5, "tokens": 2048, "documents": 1}
    content = {
        "settings": {"score_last": 2048, "dtype": "bfloat16", "methods": {"none": None}},
        "cells": {
            "timing": {"seconds": 1.0, "value": {"seconds": {"256": 2.2}}},
            "ppl/yarn@4/4096": {"seconds": 13.8, "value": ppl},
            "passkey/dca/16384/0.111": {"seconds": 670.1, "value": True},
            "llamacpp/ppl/8192": {"seconds": 314.6, "value": 12.8},
        },
        "runs": [{"command": "python x.py", "started": "2026-11-30 09:08:33 UTC", "seconds": 5.0}],
        "environment": {"cpu": "AMD EPYC", "cuda": None, "python": "3.11.7", "torch": "2.13.0", "transformers": "5"},
    }
    path = tmp_path / "training_free" / "results.json"
    path.parent.mkdir()
    path.write_text(json.dumps(content))
    timing, yarn, dca, engine = read_rows(path)
    assert (yarn.benchmark, yarn.method, yarn.metric, yarn.value) == ("training_free", "yarn@4", "ppl", 12.5)
    assert yarn.setting == {"score_last": 2048, "dtype": "bfloat16", "length": 4096}
    assert yarn.extra == {"key": "ppl/yarn@4/4096", "seconds": 13.8, "value": ppl}
    assert (dca.method, dca.metric, dca.value, dca.setting["length"], dca.setting["depth"]) == (
        "dca",
        "passkey",
        True,
        16384,
        0.111,
    )
    assert (engine.method, engine.metric, engine.value) == ("ppl", "llamacpp", 12.8)
    assert (timing.method, timing.metric, timing.value) == ("timing", "timing", None)
    assert timing.extra["value"] == {"seconds": {"256": 2.2}}
    assert yarn.device == "AMD EPYC" and yarn.versions == {"python": "3.11.7", "torch": "2.13.0", "transformers": "5"}
    assert yarn.time == "2026-11-30T09:08:33+00:00"
    assert rows_from_cells(content, "training_free") == [timing, yarn, dca, engine]
    (tmp_path / "rows.json").write_text(dumps([timing, yarn, dca, engine]))
    assert read_rows(tmp_path / "rows.json") == [timing, yarn, dca, engine]  # the migration is lossless


def test_a_file_neither_rows_nor_cells_is_refused_naming_both_formats(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"settings": {}}))
    with pytest.raises(ValueError, match="a JSON list of rows.*or a cells file"):
        read_rows(path)


def test_a_row_names_what_is_wrong_with_it():
    with pytest.raises(ValueError, match="value must be a number"):
        row(value=[1, 2])
    with pytest.raises(ValueError, match="with its offset"):
        row(time="2026-12-01T00:00:00")
    with pytest.raises(ValueError, match="JSON values only"):
        row(length=(1, 2))
    with pytest.raises(ValueError, match="method must be a non-empty string"):
        row(method="")
    with pytest.raises(ValueError, match=r"missing \['time'\], unknown \['when'\]"):
        row_from_dict({**{k: v for k, v in row().to_dict().items() if k != "time"}, "when": WHEN})
    assert list(row().to_dict()) == list(FIELDS)


def test_merge_replaces_a_rows_identity_in_place_drops_what_replace_accepts_and_appends_the_rest():
    old = [row("a"), row("b"), row("c", benchmark="other"), row("d")]
    new = [row("b", value=2.0), row("e")]
    merged = merge(old, new, replace=lambda r: r.benchmark == "demo" and r.method == "d")
    assert [(r.method, r.value) for r in merged] == [("a", 1.0), ("b", 2.0), ("c", 1.0), ("e", 1.0)]
    assert merge([row(length=1)], [row(length=2)]) == [row(length=1), row(length=2)]  # the setting is the identity


def test_a_file_is_a_json_list_one_row_a_line_and_reads_back(tmp_path):
    path = write_rows(tmp_path / "r.json", [row("a"), row("b", value=None, metric="status")])
    lines = path.read_text().splitlines()
    assert lines[0] == "[" and lines[-1] == "]" and len(lines) == 4
    assert read_rows(path) == [row("a"), row("b", value=None, metric="status")]
    (tmp_path / "old.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="not a benchmark results file"):
        read_rows(tmp_path / "old.json")


def test_a_rerun_replaces_the_rows_it_owns_and_keeps_the_others(tmp_path):
    path = tmp_path / "r.json"
    write_rows(path, [row("kept", benchmark="other"), row("yarn", length=128), row("ntk", length=64, scope=1)])
    results = harness.Results(path, "demo", setting={"length": 64})
    results.add("yarn", "ratio", 1.5, setting={"extra_setting": 1})
    results.save()
    rows = read_rows(path)
    assert [(r.benchmark, r.method) for r in rows] == [("other", "kept"), ("demo", "yarn")]
    new = rows[1]
    assert new.setting == {"length": 64, "extra_setting": 1} and new.unit == "x" and new.extra["command"]
    assert new.versions["torch"] and new.versions["hf_posext"] and new.device
    scoped = harness.Results(path, "demo", scope={"extra_setting": 2})
    scoped.add("ntk", "ratio", 2.0)
    scoped.save()
    assert [r.method for r in read_rows(path)] == ["kept", "yarn", "ntk"]


def test_resume_starts_from_the_rows_of_the_same_settings_and_an_unchanged_row_keeps_its_time(tmp_path):
    path = tmp_path / "r.json"
    write_rows(path, [row("yarn", length=64, threads=1), row("ntk", length=64, threads=2)])
    results = harness.Results(path, "demo", setting={"threads": 1}, resume=True)
    assert [r.method for r in results.rows] == ["yarn"] and [r.method for r in results.stale] == ["ntk"]
    assert results.find("yarn", "ratio", {"length": 64}).time == WHEN
    kept = results.add("yarn", "ratio", 1.0, setting={"length": 64})
    assert kept.time == WHEN and kept.extra == {}  # the same measurement: not rewritten
    assert results.add("yarn", "ratio", 3.0, setting={"length": 64}).time != WHEN
    results.save()
    assert [(r.method, r.value) for r in read_rows(path)] == [("yarn", 3.0)]


@pytest.mark.parametrize(
    ("metric", "unit"),
    [
        ("tokens_per_cpu_s", "tokens/s"),
        ("model_tflops_per_s", "TFLOP/s"),
        ("decode_ms", "ms"),
        ("step_s", "s"),
        ("seconds", "s"),
        ("peak_mib", "MiB"),
        ("peak_memory_gib", "GiB"),
        ("time_vs_sdpa", "x"),
        ("speedup", "x"),
        ("fit_prompts_per_minute", "per minute"),
        ("perplexity", ""),
    ],
)
def test_a_metric_name_implies_its_unit(metric, unit):
    assert unit_of(metric) == unit


def test_the_pivot_puts_each_rows_value_in_its_rows_key_and_its_columns_match(tmp_path, monkeypatch):
    rows = [
        row("yarn", length=64),
        row("ntk", length=64, value=2.5),
        row("yarn", length=128, value=0.5),
        row("yarn", length=128, value=0.75, time="2026-12-02T00:00:00+00:00"),
        row("yarn", "status", "skip"),
    ]
    write_rows(tmp_path / "demo.json", rows)
    monkeypatch.setattr(tables, "RESULTS", tmp_path)  # where tables.block reads
    spec = pivot.Table(
        "demo.json",
        ["method"],
        [
            pivot.Pivot(
                {"metric": "ratio"},
                lambda r: (r.method,),
                lambda rs: [pivot.Column(str(n), {"length": n}, pivot.fmt(".2f", "x")) for n in pivot.lengths(rs)],
                order=["ntk"],
            )
        ],
    )
    assert (
        spec.render(tmp_path) == "| method | 64 | 128 |\n|---|---|---|\n| ntk | 2.50x | - |\n| yarn | 1.00x | 0.75x |"
    )
    assert tables.block(spec)() == spec.render(tmp_path)
    assert tables.block(pivot.Table("none.json", ["x"], spec.pivots))().startswith("_Not measured yet: no none.json")


def test_a_migrated_tables_cell_is_the_value_of_its_row():
    rows = read_rows(RESULTS / "patch_overhead.json")
    ratio = next(r for r in rows if r.method == "yarn" and r.metric == "ratio" and r.setting["length"] == 1024)
    line = next(line for line in tables.render("patch-overhead").splitlines() if line.startswith("| yarn |"))
    assert line.split(" | ")[2] == f"{ratio.value:.3f}"


def test_an_aligned_table_is_laid_out_as_the_librarys_reports_are():
    """``pivot.table(aligned=True)`` pads as ``hf_posext.eval.report.markdown_table`` does (strings and ints)."""
    from hf_posext.eval.report import markdown_table

    header, body = ["row", "passkey 16k", "p"], [["yarn s=4", "12/20 (0.39-0.78)", 7], ["dca fine-tuned", "-", 1]]
    assert pivot.table(header, body, aligned=True) == markdown_table(header, body)
    assert pivot.table(header, [], aligned=True) == markdown_table(header, [])


def test_a_pivot_with_only_order_shows_exactly_those_rows_in_that_order():
    rows = [row("yarn", length=64), row("other", length=64, value=3.0)]
    columns = [pivot.Column("64", {"length": 64}, pivot.fmt(".1f"))]
    spec = pivot.Pivot({"metric": "ratio"}, lambda r: (r.method,), columns, order=["ntk", "yarn"], only_order=True)
    assert spec.body(rows) == [["ntk", "-"], ["yarn", "1.0"]]
