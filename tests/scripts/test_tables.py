"""The docs' benchmark tables are generated: every marked block equals what ``scripts/tables.py`` writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from scripts import tables  # its import puts benchmarks/ (not a package) on sys.path: result_schema, the reports

ROOT = Path(__file__).resolve().parents[2]


def test_every_marked_block_in_the_docs_is_what_the_generator_writes_from_the_committed_json():
    pages = tables.marked_pages()
    assert pages, "no page holds a <!-- table:NAME --> block"
    cache: dict[str, str] = {}
    stale = [str(p.relative_to(ROOT)) for p in pages if tables.rewrite(p.read_text(), cache) != p.read_text()]
    assert not stale, f"run `python scripts/tables.py`: stale tables in {stale}"


@pytest.mark.parametrize("name", sorted(tables.TABLES))
def test_every_table_renders_from_what_is_committed(name):
    text = tables.render(name)
    if name in tables.LISTS:
        assert re.fullmatch(r"`[^`]+`(,[ \n]`[^`]+`)*", text), text[:200]
        return
    assert text.startswith(("_Not measured yet", "_Skipped")) or re.search(r"^\|-", text, re.M), text[:200]


def test_a_table_cell_is_the_json_value_of_its_row_and_column():
    cells = json.loads((ROOT / "benchmarks/results/real_model/results.json").read_text())["cells"]
    rows = {
        line.split(" | ")[0].lstrip("| "): line.strip("|").split("|")
        for line in tables.render("real-model-ppl").splitlines()[2:]
    }
    assert rows["yarn, s = 4"][4].strip() == f"{cells['ppl/yarn@4/32768']['value']['perplexity']:.2f}"
    assert rows["linear, s = L/8k"][3].strip() == f"{cells['ppl/linear@2/16384']['value']['perplexity']:.2f}"


def test_rewrite_replaces_the_blocks_only_and_check_names_a_stale_page(tmp_path, monkeypatch, capsys):
    page = tmp_path / "site" / "page.md"
    page.parent.mkdir()
    page.write_text(
        "# Title\n\ntext before\n<!-- table:patch-overhead -->\nold\n<!-- /table:patch-overhead -->\nafter\n"
    )
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    monkeypatch.setattr(tables, "marked_pages", lambda root=tmp_path: [page])
    assert tables.main(["--check"]) == 1 and "stale: site/page.md" in capsys.readouterr().out
    assert "old" in page.read_text()
    assert tables.main([]) == 0
    text = page.read_text()
    assert text.startswith("# Title\n\ntext before\n<!-- table:patch-overhead -->\n| method |")
    assert text.endswith("|\n<!-- /table:patch-overhead -->\nafter\n") and "old" not in text
    assert tables.main(["--check"]) == 0


def test_an_unknown_table_name_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="gpu-mfu"):
        tables.render("no-such-table")


@pytest.mark.parametrize(
    ("name", "files"),
    [
        ("real-model-ppl", ["real_model/results.json"]),
        ("real-model-passkey", ["real_model/results.json"]),
        ("training-free-real-model", ["training_free/results.json"]),
    ],
)
def test_a_cells_file_in_todays_format_renders_the_rows_of_its_migration(name, files, tmp_path, monkeypatch):
    """The committed cell caches (today's cells format, read on the fly) and the same cells as rows render alike."""
    from result_schema import dumps, read_rows

    committed = tables.render(name)
    for kind in ("cells", "rows"):
        folder = tmp_path / kind
        for relative in files:
            source, target = tables.RESULTS / relative, folder / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(source.read_text() if kind == "cells" else dumps(read_rows(source)))
        assert isinstance(json.loads(target.read_text()), dict if kind == "cells" else list)
        monkeypatch.setattr(tables, "RESULTS", folder)
        assert tables.render(name) == committed, kind


#: The blocks of the scripts' reports: (table, the folders their rows come from, {module: {name: folder}}).
REPORT_BLOCKS = [
    (
        "finetune-smollm2",
        ["finetune_smollm2", "training_free", "training_free_bf16"],
        {
            "finetune_real_model": {
                "OUT": "finetune_smollm2",
                "EXPERIMENTS": "finetune_smollm2/experiments",
                "TRAINING_FREE": "training_free",
            }
        },
    ),
    ("training-free-real-model-paired", ["training_free"], {"training_free_real_model": {"OUT": "training_free"}}),
    (
        "longrope-smollm2",
        ["longrope_smollm2", "training_free"],
        {"longrope_real_model": {"OUT": "longrope_smollm2", "TRAINING_FREE": "training_free"}},
    ),
]


@pytest.mark.parametrize(("name", "folders", "paths"), REPORT_BLOCKS)
def test_a_reports_block_is_rendered_from_the_cells_as_rows_not_quoted_from_the_report(
    name, folders, paths, tmp_path, monkeypatch
):
    """Its cells (today's cells format, or migrated to rows) without the report's .md, the same block."""
    import importlib

    from result_schema import dumps, read_rows

    committed = tables.render(name)
    for kind in ("cells", "rows"):
        folder = tmp_path / kind
        for source in (p for name in folders for p in (tables.RESULTS / name).rglob("*.json")):
            target = folder / source.relative_to(tables.RESULTS)
            target.parent.mkdir(parents=True, exist_ok=True)
            content = json.loads(source.read_text())
            cells = isinstance(content, dict) and "cells" in content
            target.write_text(dumps(read_rows(source)) if cells and kind == "rows" else source.read_text())
        assert not list(folder.rglob("*.md"))  # no report to quote
        monkeypatch.setattr(tables, "RESULTS", folder)
        for module, names in paths.items():
            for attribute, relative in names.items():
                monkeypatch.setattr(importlib.import_module(module), attribute, folder / relative)
        assert tables.render(name) == committed, kind
