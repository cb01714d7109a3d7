"""The compatibility table (README, docs/readers/index.md): ``hf-posext doctor``'s verdicts, one row per saved config.

Every registered method's config as ``patch_model`` + ``save_pretrained`` write it (on a tiny Llama;
``dca`` also on Qwen2, ``longrope`` also with ``keep_first``, ``yarn`` also composed on Llama 3.1's
``llama3``), and the released configs of :data:`hf_posext.readers.shipped.SHIPPED`, go through the same
:func:`hf_posext.commands.doctor.diagnose_path` a user runs; rows with the same verdicts are merged.

    python benchmarks/tables.py --print readers
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
from hf_posext.readers.doctor import READERS
from hf_posext.readers.shipped import SHIPPED, shipped_config_json

HEADER = [
    "checkpoint",
    "transformers 5",
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
    "needs-plugin": "needs `import hf_posext`",
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
