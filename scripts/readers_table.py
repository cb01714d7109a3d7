"""The compatibility table (README, docs/readers/index.md): ``hf-posext doctor``'s verdicts, one row per saved config.

Every registered method's config as ``patch_model`` + ``save_pretrained`` write it (on a tiny Llama;
``dca`` also on Qwen2, ``longrope`` also with ``keep_first``, ``yarn`` also composed on Llama 3.1's
``llama3``), and the released configs of :data:`hf_posext.readers.shipped.SHIPPED`, go through the same
:func:`hf_posext.commands.doctor.diagnose_path` a user runs; rows with the same verdicts are merged.

    python scripts/tables.py --print readers
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformers import LlamaConfig, Qwen2Config

import hf_posext
from hf_posext.commands.doctor import diagnose_path
from hf_posext.methods import available_methods, method_class
from hf_posext.readers.registry import READERS as REGISTRY
from hf_posext.readers.shipped import SHIPPED, shipped_config_json
from scripts import ROOT

READERS = [reader.key for reader in REGISTRY]

HEADER = [
    "checkpoint",
    "transformers 5 (no `import hf_posext`)",
    "transformers 5 + `import hf_posext`",
    "transformers 4.57",
    "vLLM",
    "SGLang",
    "llama.cpp: converter alone",
    "llama.cpp: `hf-posext gguf export`",
]
WORDS = {
    "same": "same",
    "misread": "**misread**",
    "refused": "refused",
    "unknown": "not checked",
}
MARK = {"run here": "run", "read from source": "source"}


def _tiny(cls: type = LlamaConfig, **rope: Any) -> Any:
    return cls(
        vocab_size=97,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=64,
        **rope,
    )


def _method_configs() -> Iterator[tuple[str, Any]]:
    for method in available_methods():
        yield (
            f"`{method}`",
            hf_posext.patch_model(_tiny(), method, **({"factor": 4} if method_class(method).scales_rope else {})),
        )
    yield "`longrope` with `keep_first`", hf_posext.patch_model(_tiny(), "longrope", factor=4, keep_first=4)
    yield "`dca` on Qwen2/Qwen3", hf_posext.patch_model(_tiny(Qwen2Config), "dca", factor=4)
    llama3 = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
        "rope_theta": 500000.0,
    }
    yield "`yarn` on Llama 3.1's `llama3`", hf_posext.patch_model(_tiny(rope_parameters=llama3), "yarn", factor=2)


def _cell(finding: dict[str, Any]) -> str:
    if finding["verdict"] == "unknown":
        return WORDS["unknown"]
    return f"{WORDS[finding['verdict']]} ({MARK[finding['checked']]})"


def rows() -> list[tuple[str, list[str]]]:
    """``(label, cells)`` per saved config, each cell a verdict with ``(run)`` or ``(source)``."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        folders = []
        for i, (label, config) in enumerate(_method_configs()):
            config.save_pretrained(Path(tmp) / f"m{i}")
            folders.append((label, Path(tmp) / f"m{i}"))
        for i, name in enumerate(SHIPPED):
            (Path(tmp) / f"s{i}").mkdir()
            (Path(tmp) / f"s{i}" / "config.json").write_text(json.dumps(shipped_config_json(name)))
            folders.append((name, Path(tmp) / f"s{i}"))
        for label, folder in folders:
            readers = diagnose_path(str(folder))["readers"]
            cells = [_cell(readers[key]) for key in READERS if key != "llamacpp"]
            routes = readers["llamacpp"].get("routes", {})
            cells += [_cell(routes.get(route, readers["llamacpp"])) for route in ("converter", "gguf_export")]
            out.append((label, cells))
    return out


def readers_table() -> str:
    """The Markdown table: rows with identical verdicts merged (``linear``, ``ntk``, ``yarn`` ...)."""
    merged: dict[tuple[str, ...], list[str]] = {}
    for label, cells in rows():
        merged.setdefault(tuple(cells), []).append(label)
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += [f"| {', '.join(labels)} | " + " | ".join(cells) + " |" for cells, labels in merged.items()]
    return "\n".join(lines)


#: The measured reader matrix (benchmarks/reader_matrix.py) and its columns, in order.
MATRIX = ROOT / "benchmarks" / "results" / "reader_matrix.json"
MATRIX_COLUMNS = {
    "transformers5": "transformers 5 (no `import hf_posext`)",
    "transformers5_hf_posext": "transformers 5 + `import hf_posext`",
    "hf_posext": "`hf_posext.from_pretrained`",
    "transformers4": "transformers 4.57",
    "llamacpp_converter": "llama.cpp, its converter",
    "llamacpp": "llama.cpp, `hf-posext gguf export`",
    "hf_posext_gguf": "`hf_posext.from_pretrained`, exported GGUF",
}


def _matrix_cell(row: Any) -> str:
    if row.value == "same":
        return "same"
    if row.value == "refused":
        return f"refused: `{row.extra['error'].split(':')[0]}`"
    past, before = row.extra["gap_past_l0"], row.extra["gap_before_l0"]
    if past is None:
        return "**misread** (NaN logits)"
    return f"**misread** ({past:.3g} past L₀, {before:.3g} before)"


def matrix_table() -> str:
    """The reader matrix as Markdown: a row per saved config, a column per reader run, from the committed rows."""
    from scripts.pivot import read_rows  # result_schema's, importable once scripts.pivot put benchmarks/ on the path

    if not MATRIX.is_file():
        return "_Not measured yet: run `python benchmarks/reader_matrix.py`._"
    cells = [r for r in read_rows(MATRIX) if r.benchmark == "reader_matrix"]
    readers = [key for key in MATRIX_COLUMNS if any(r.setting["reader"] == key for r in cells)]
    by_row: dict[tuple[str, str], dict[str, Any]] = {}
    for row in cells:
        by_row.setdefault((row.setting["kind"], row.method), {})[row.setting["reader"]] = row
    lines = [
        "| saved config | kind | " + " | ".join(MATRIX_COLUMNS[k] for k in readers) + " |",
        "|" + "---|" * (len(readers) + 2),
    ]
    for (kind, name), found in by_row.items():
        lines.append(
            f"| {name} | {kind} | "
            + " | ".join(_matrix_cell(found[k]) if k in found else "not run¹" for k in readers)
            + " |"
        )
    first = cells[0]
    versions = ", ".join(
        f"{k} {v}" for k, v in sorted(first.versions.items()) if k.endswith(":transformers") or k == "commit"
    )
    lines += [
        "",
        f"_{first.setting['length']} tokens, L₀ {first.setting['l0']}, fp32, {first.device}; {versions}; "
        f"measured {first.time[:10]}._",
        "",
        "¹ llama.cpp's converter runs on the llama and qwen rows only: the other model types' tiny models are "
        "another model in llama.cpp before any rope change (unpatched Gemma 3 is 0.92 off before L₀; Phi-3's "
        "converter wants a sentencepiece `tokenizer.model`), so a cell would measure the graph, not the rope.",
    ]
    return "\n".join(lines)
