"""The reader matrix: each saved config, each reader that runs here, run for real and compared with the model meant.

A row is a tiny Llama (random weights, seed 0, L0 = `L0`) written to a folder the way a user gets it:
``patch_model`` + ``save_pretrained`` for every registered method (and each option that changes what is saved),
transformers' own scalings written into ``rope_parameters``, and configs changed after saving (legacy fields,
hostile values). The model meant is the one in memory before saving (hf-posext's patched model, or the clean
config a hostile value damaged); its logits over `LENGTH` tokens are the reference. Each reader loads the
folder in a fresh interpreter (`READ_SCRIPT`) and its logits are compared: ``same`` (max |diff| <=
`TOLERANCE` at every position), ``misread`` (with the gap past L0 and before it) or ``refused`` (an
exception, its first line kept). ``benchmarks/reader_matrix.py`` runs it; docs/readers/matrix.md shows it.

Longer than ~400 lines: the rows are one declaration each (about 40, read on their own), and the two ways of
running the readers (`measure`: interpreters on folders; `measure_gguf`: llama.cpp and the GGUF
loader) share them, the model meant and the verdict rule; split, each half would import the other.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..gguf.converter import run_converter
from ..gguf.export import export_gguf
from ..gguf.rope import MODEL_TYPES
from ..loading import from_pretrained
from ..methods import available_methods, method_class
from ..patching import patch_model

#: The pretraining length of every row, the tokens each reader runs, and the gap that still counts as the same.
L0 = 64
LENGTH = 150
TOLERANCE = 1e-4
VERDICTS = ("same", "misread", "refused")
#: Readers run here: key -> (label, how it loads a folder). The interpreter of each is the caller's to give.
READERS = {
    "transformers5": "transformers 5, in a process that never imports hf_posext",
    "transformers5_hf_posext": "transformers 5 after `import hf_posext` (AutoModelForCausalLM.from_pretrained)",
    "hf_posext": "hf_posext.from_pretrained on the folder",
    "transformers4": "transformers 4.57 (a side environment without hf_posext)",
    "llamacpp_converter": "llama.cpp 0.3.36 on the GGUF llama.cpp's own converter writes (f32)",
    "llamacpp": "llama.cpp 0.3.36 on the GGUF `hf-posext gguf export` writes (f32)",
    "hf_posext_gguf": "hf_posext.from_pretrained on the GGUF `hf-posext gguf export` writes",
}
#: The readers of a GGUF (`measure_gguf`): they read each row saved with a vocabulary llama.cpp's converter
#: knows, and llama.cpp's own arithmetic (f32, its kernels) is the same model within `GGUF_TOLERANCE`.
GGUF_READERS = ("llamacpp_converter", "llamacpp", "hf_posext_gguf")
#: llama.cpp's f32 logits against torch's on the same weights and rope: at most 3.8e-4 where the model is the same,
#: 3.9e-3 and more where the rope differs (YaRN's attention factor left out), in this matrix's rows.
GGUF_TOLERANCE = 1e-3
#: The model types `hf-posext gguf export` writes (`hf_posext.gguf.rope.MODEL_TYPES`, the graphs doctor's llama.cpp
#: rules cover), whose tiny models llama.cpp runs as transformers does before any rope change. Others are not run
#: through the converter: their unpatched tiny model is already another model there (Gemma 3: 0.92 off before L0;
#: Phi-3: the converter wants a sentencepiece tokenizer.model), so a cell would measure the graph, not the rope.
#: ``hf-posext gguf export`` is still run on them (it refuses).
GGUF_MODEL_TYPES = tuple(MODEL_TYPES)

# argv: mode (vanilla | plugin | hf_posext), tag, ids file, folders. Writes logits-TAG.pt or error-TAG.txt per
# folder, then prints the versions it ran as JSON.
READ_SCRIPT = """
import json, sys
from pathlib import Path
mode, tag, ids_file, *folders = sys.argv[1:]
if mode == "vanilla":
    sys.modules["hf_posext"] = None  # any `import hf_posext` now raises ImportError
else:
    import hf_posext
import torch, transformers
from transformers import AutoModelForCausalLM
ids = torch.load(ids_file)
for folder in map(Path, folders):
    try:
        if mode == "hf_posext":
            model = hf_posext.from_pretrained(folder)
        else:
            model = AutoModelForCausalLM.from_pretrained(folder)
        with torch.no_grad():
            logits = model.eval()(ids).logits
        torch.save(logits, folder / f"logits-{tag}.pt")
    except Exception as error:
        (folder / f"error-{tag}.txt").write_text(f"{type(error).__name__}: {error}")
print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__}))
"""


def tiny_config(model_type: str = "llama", **changes: Any) -> Any:
    """The rows' tiny config: 2 layers, 4 heads of 32, vocabulary 97, L0 positions unless changed."""
    from transformers import AutoConfig

    shape = dict(
        vocab_size=97,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=L0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return AutoConfig.for_model(model_type, **{**shape, **changes})


Edit = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Row:
    """One saved config: the model meant (a base rope, then a method), and the edits config.json gets after saving."""

    name: str
    kind: str  # method, scaling, layout, legacy or hostile
    method: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    rope: dict[str, Any] | None = None  # the base config's rope_parameters (a shipped scaling)
    config: dict[str, Any] = field(default_factory=dict)  # other changes to the base config
    edit: Edit | None = None
    model_type: str = "llama"


def _set(path: str, value: Any) -> Edit:
    def edit(config_json: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = config_json
        for key in parents:
            target = target[key]
        target[last] = value

    return edit


def _drop(path: str) -> Edit:
    def edit(config_json: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = config_json
        for key in parents:
            target = target[key]
        target.pop(last, None)

    return edit


def _legacy_only(config_json: dict[str, Any]) -> None:
    """As a 4.x checkpoint ships: ``rope_scaling`` and a top-level ``rope_theta``, no ``rope_parameters``."""
    params = config_json.pop("rope_parameters")
    config_json["rope_theta"] = params.pop("rope_theta")
    config_json["rope_scaling"] = params


def _both(*edits: Edit) -> Edit:
    def edit(config_json: dict[str, Any]) -> None:
        for one in edits:
            one(config_json)

    return edit


def _yarn(**extra: Any) -> dict[str, Any]:
    return {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L0, "rope_theta": 1e4, **extra}


LLAMA3 = {
    "rope_type": "llama3",
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": L0 // 4,
    "rope_theta": 1e4,
}
LONGROPE = {
    "rope_type": "longrope",
    "factor": 4.0,
    "original_max_position_embeddings": L0,
    "short_factor": [1.0 + 0.02 * i for i in range(16)],
    "long_factor": [1.0 + 0.5 * i for i in range(16)],
    "rope_theta": 1e4,
}


_SLIDING_FULL = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 32}
#: Per-layer-type rope dicts: Gemma 3 (default RoPE on both, thetas 1e4 / 1e6) and Gemma 4 (p-RoPE, p = 0.25,
#: on its full-attention layers, whose heads are twice as wide); windows shorter than `LENGTH`.
GEMMA3: dict[str, Any] = {"model_type": "gemma3_text", "config": _SLIDING_FULL}
GEMMA4: dict[str, Any] = {
    "model_type": "gemma4_text",
    "config": {
        **_SLIDING_FULL,
        "global_head_dim": 64,
        "vocab_size_per_layer_input": 97,
        "hidden_size_per_layer_input": 16,
    },
}


def default_options(method: str) -> dict[str, Any]:
    """A method's options in its row: factor 4 where it takes one (at factor 1 the remappings are the identity),
    a position table past `LENGTH`."""
    if method == "learned":
        return {"max_length": 4 * L0}
    return {"factor": 4} if method_class(method).takes_factor else {}


def rows() -> list[Row]:
    """Every row, in the order the matrix shows them."""
    out = [Row(f"`{m}`", "method", m, default_options(m)) for m in available_methods()]
    out += [
        Row("`dynamic_ntk`, `exact_cache=False`", "method", "dynamic_ntk", {"factor": 4, "exact_cache": False}),
        Row("`dynamic_yarn`, `exact_cache=False`", "method", "dynamic_yarn", {"factor": 4, "exact_cache": False}),
        Row("`longrope`, `exact_cache=False`", "method", "longrope", {"factor": 4, "exact_cache": False}),
        Row('`longrope`, `factors_by="query"`', "method", "longrope", {"factor": 4, "factors_by": "query"}),
        Row("`longrope`, `keep_first=4`", "method", "longrope", {"factor": 4, "keep_first": 4}),
        Row("`yarn`, `attention_factor=1.2`", "method", "yarn", {"factor": 4, "attention_factor": 1.2}),
        Row("`yarn` on `llama3`", "method", "yarn", {"factor": 2}, LLAMA3, {"max_position_embeddings": L0}),
        Row("`linear` on `longrope`", "method", "linear", {"factor": 2}, LONGROPE, {"max_position_embeddings": 4 * L0}),
    ]
    out += [
        Row("`rope_type: linear`", "scaling", rope={"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}),
        Row("`rope_type: dynamic`", "scaling", rope={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e4}),
        Row("`rope_type: yarn`", "scaling", rope=_yarn(), config={"max_position_embeddings": 4 * L0}),
        Row(
            "`rope_type: yarn`, `truncate: false`",
            "scaling",
            rope=_yarn(truncate=False),
            config={"max_position_embeddings": 4 * L0},
        ),
        Row("`rope_type: yarn`, `attention_factor: 1.2`", "scaling", rope=_yarn(attention_factor=1.2)),
        Row("`rope_type: llama3`", "scaling", rope=LLAMA3, config={"max_position_embeddings": L0}),
        Row("`rope_type: longrope`", "scaling", rope=LONGROPE, config={"max_position_embeddings": 4 * L0}),
        Row(
            "Phi-3 with `partial_rotary_factor: 0.5`, `longrope`",  # transformers 5's Llama rotates every channel
            "layout",
            "longrope",
            {"factor": 4},
            config={"partial_rotary_factor": 0.5},
            model_type="phi3",
        ),
        Row("Qwen3, `yarn`", "layout", "yarn", {"factor": 4}, model_type="qwen3"),  # llama.cpp's qwen3 graph
        Row("Gemma 3, `yarn` (its full-attention layers)", "layout", "yarn", {"factor": 4}, **GEMMA3),
        Row(
            "Gemma 3, `yarn` on both layer types",
            "layout",
            "yarn",
            {"factor": 4, "layer_types": ["sliding_attention", "full_attention"]},
            **GEMMA3,
        ),
        Row(
            "Gemma 3, `rope_type: linear` on full attention (as it ships)",
            "layout",
            rope={
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
            },
            **GEMMA3,
        ),
        Row("Gemma 4 p-RoPE, `linear` (its full-attention layers)", "layout", "linear", {"factor": 4}, **GEMMA4),
        Row("Gemma 4 p-RoPE, `yarn` (its full-attention layers)", "layout", "yarn", {"factor": 4}, **GEMMA4),
        Row("`rope_type: yarn` in `rope_scaling` only (4.x style)", "legacy", rope=_yarn(), edit=_legacy_only),
        Row(
            "`rope_theta` in `rope_scaling` unlike `rope_parameters`'",
            "legacy",
            "linear",
            {"factor": 4},
            edit=_set("rope_scaling.rope_theta", 5e5),
        ),
        Row(
            "top-level `rope_theta` unlike `rope_parameters`'",
            "legacy",
            "linear",
            {"factor": 4},
            edit=_set("rope_theta", 5e5),
        ),
        Row(
            '`factor: "4"` (a string)',
            "hostile",
            "linear",
            {"factor": 4},
            edit=_both(_set("rope_parameters.factor", "4"), _set("rope_scaling.factor", "4")),
        ),
        Row(
            "`factor: NaN`",
            "hostile",
            "linear",
            {"factor": 4},
            edit=_both(_set("rope_parameters.factor", math.nan), _set("rope_scaling.factor", math.nan)),
        ),
        Row(
            "`factor: Infinity`",
            "hostile",
            "linear",
            {"factor": 4},
            edit=_both(_set("rope_parameters.factor", math.inf), _set("rope_scaling.factor", math.inf)),
        ),
        Row(
            "`factor: -4`",
            "hostile",
            "linear",
            {"factor": 4},
            edit=_both(_set("rope_parameters.factor", -4.0), _set("rope_scaling.factor", -4.0)),
        ),
        Row(
            "`rope_type: yarn` without `original_max_position_embeddings`",
            "hostile",
            rope=_yarn(),
            config={"max_position_embeddings": 4 * L0},
            edit=_drop("rope_parameters.original_max_position_embeddings"),
        ),
    ]
    names = [row.name for row in out]
    if len(set(names)) != len(names):
        raise RuntimeError(f"two rows share a name: {sorted(n for n in names if names.count(n) > 1)}")
    return out


def _rows_named(names: set[str] | None) -> list[Row]:
    """The rows named in ``names``, in the matrix's order (``None``: every row)."""
    return [row for row in rows() if names is None or row.name in names]


def write_row(
    row: Row, folder: Path, ids: torch.Tensor | None = None, tokenizer: Path | None = None
) -> torch.Tensor | None:
    """Save ``row``'s checkpoint into ``folder``; the logits of the model meant for ``ids`` (``None``: not run).

    ``tokenizer``: a folder whose ``tokenizer.json`` and ``tokenizer_config.json`` are saved with the row, the
    vocabulary sized to it (for llama.cpp's converter, which refuses a vocabulary it does not know).
    """
    from transformers import AutoModelForCausalLM

    changes = dict(row.config)
    if tokenizer is not None:
        changes["vocab_size"] = len(json.loads((tokenizer / "tokenizer.json").read_text())["model"]["vocab"])
    config = tiny_config(
        row.model_type, **({"rope_parameters": copy.deepcopy(row.rope)} if row.rope else {}), **changes
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    if row.method is not None:
        model = patch_model(model, row.method, **row.options)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json") if tokenizer is not None else ():
        shutil.copy(tokenizer / name, folder / name)
    logits = None
    if ids is not None:
        with torch.no_grad():
            logits = model(ids).logits
    if row.edit is not None:
        config_json = json.loads((folder / "config.json").read_text())
        row.edit(config_json)
        (folder / "config.json").write_text(json.dumps(config_json, indent=2))
    return logits


def run_reader(python: str | Path, mode: str, tag: str, ids_file: Path, folders: list[Path]) -> dict[str, str]:
    """Run `READ_SCRIPT` under ``python``; the versions it reports.

    Raises:
        RuntimeError: the interpreter failed outside a load (the end of its standard error in the message).
    """
    done = subprocess.run(
        [str(python), "-c", READ_SCRIPT, mode, tag, str(ids_file), *map(str, folders)],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())},
    )
    if done.returncode != 0:
        raise RuntimeError(f"{python} ({mode}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _gap(a: torch.Tensor, b: torch.Tensor) -> float | None:
    gap = (a - b).abs().max().item() if a.numel() else 0.0
    return None if math.isnan(gap) else gap


def token_ids() -> torch.Tensor:
    """The `LENGTH` token ids every reader runs (seed 1, inside every row's vocabulary)."""
    return torch.randint(3, 97, (1, LENGTH), generator=torch.Generator().manual_seed(1))


def cell(folder: Path, tag: str, intended: torch.Tensor) -> dict[str, Any]:
    """``{"verdict", "gap_past_l0", "gap_before_l0", "error"}`` of one reader's output in ``folder``.

    A gap is ``None`` where the reader's logits hold NaN (a misread).
    """
    error_file = folder / f"error-{tag}.txt"
    if error_file.exists():
        return _refused(error_file.read_text(), folder)
    return _compare(torch.load(folder / f"logits-{tag}.pt"), intended, TOLERANCE)


def measure(
    scratch: Path, pythons: dict[str, str | Path | None], names: set[str] | None = None
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Every row (or those named in ``names``) x every reader of ``pythons`` (reader key -> interpreter; ``None``:
    this one).

    Returns:
        ``([{"row", "kind", "reader", "verdict", "gap_past_l0", "gap_before_l0", "error"}], versions)``.
    """
    ids = token_ids()
    torch.save(ids, scratch / "ids.pt")
    chosen = _rows_named(names)
    intended, folders = {}, {}
    for i, row in enumerate(chosen):
        folders[row.name] = scratch / f"row{i:02d}"
        intended[row.name] = write_row(row, folders[row.name], ids)
    modes = {"transformers5": "vanilla", "transformers5_hf_posext": "plugin", "hf_posext": "hf_posext"}
    modes["transformers4"] = "vanilla"
    versions: dict[str, str] = {}
    for reader, python in pythons.items():
        ran = run_reader(python or sys.executable, modes[reader], reader, scratch / "ids.pt", list(folders.values()))
        versions.update({f"{reader}:{k}": v for k, v in ran.items()})
    out = [
        {"row": row.name, "kind": row.kind, "reader": reader, **cell(folders[row.name], reader, intended[row.name])}
        for row in chosen
        for reader in pythons
    ]
    return out, versions


@dataclass(frozen=True)
class GgufTools:
    """What the GGUF readers need from outside the package: llama.cpp's converter and a way to run llama.cpp.

    Attributes:
        converter: ``convert_hf_to_gguf.py``; ``python``: the interpreter that runs it.
        tokenizer: a folder with a tokenizer the converter knows (its vocabulary sizes the rows' models).
        logits_files: ``(gguf files, ids) -> .npy files`` of llama.cpp's logits, ``[len(ids), vocab]`` each.
    """

    converter: Path
    python: Path
    tokenizer: Path
    logits_files: Callable[[list[Path], list[int]], list[Path]]


def measure_gguf(scratch: Path, tools: GgufTools, names: set[str] | None = None) -> list[dict[str, Any]]:
    """Every row x `GGUF_READERS`: the row saved with ``tools.tokenizer``'s vocabulary, converted by llama.cpp's
    converter alone and by ``hf-posext gguf export``, run by llama.cpp and read back by ``hf_posext.from_pretrained``.

    A row the export refuses is refused by its two readers (the export's message); one the converter refuses, by
    all three. A row off `GGUF_MODEL_TYPES` has no converter cell. ``names``: these rows only (default: every
    row). Returns the cells as `measure`'s.
    """
    ids = token_ids()
    results: dict[tuple[str, str], dict[str, Any]] = {}
    intended, runs = {}, {}  # runs: gguf file -> (row, reader)
    chosen = _rows_named(names)
    for i, row in enumerate(chosen):
        folder = scratch / f"gguf{i:02d}"
        intended[row.name] = write_row(row, folder, ids, tools.tokenizer)
        exported, converted = scratch / f"gguf{i:02d}-export.gguf", scratch / f"gguf{i:02d}-converter.gguf"
        try:
            export_gguf(
                folder,
                exported,
                converter=tools.converter,
                python=tools.python,
                outtype="f32",
                keep_converted=converted,
            )
            runs[exported], runs[converted] = (row, "llamacpp"), (row, "llamacpp_converter")
        except Exception as error:  # refused before or by the converter: the converter alone, then
            for reader in ("llamacpp", "hf_posext_gguf"):
                results[(row.name, reader)] = _refused(error, scratch)
            if row.model_type not in GGUF_MODEL_TYPES:
                continue
            try:
                run_converter(str(tools.python), tools.converter, folder, converted, ["--outtype", "f32"])
                runs[converted] = (row, "llamacpp_converter")
            except Exception as converter_error:
                results[(row.name, "llamacpp_converter")] = _refused(converter_error, scratch)
            continue
        try:
            model = from_pretrained(exported).eval()
            with torch.no_grad():
                results[(row.name, "hf_posext_gguf")] = _compare(model(ids).logits, intended[row.name], TOLERANCE)
        except Exception as error:
            results[(row.name, "hf_posext_gguf")] = _refused(error, scratch)
    files = list(runs)
    try:
        outputs = tools.logits_files(files, ids[0].tolist()) if files else []
    except RuntimeError:  # one file llama.cpp cannot load stops its process: run them one by one
        outputs = []
        for gguf in files:
            try:
                outputs += tools.logits_files([gguf], ids[0].tolist())
            except RuntimeError as one:
                outputs.append(None)
                results[(runs[gguf][0].name, runs[gguf][1])] = _refused(one, scratch)
    for gguf, output in zip(files, outputs):
        if output is not None:
            row, reader = runs[gguf]
            logits = torch.from_numpy(np.load(output))[None]
            results[(row.name, reader)] = _compare(logits, intended[row.name], GGUF_TOLERANCE)
    return [
        {"row": row.name, "kind": row.kind, "reader": reader, **results[(row.name, reader)]}
        for row in chosen
        for reader in GGUF_READERS
        if (row.name, reader) in results
    ]


def _refused(error: BaseException | str, scratch: Path) -> dict[str, Any]:
    """A refusal's cell: the first line of its message, the scratch folder's name out of it (no part of the answer)."""
    message = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    lines = message.strip().splitlines() or ["(no message)"]
    first = lines[0]
    if first.endswith(":") and len(lines) > 1:  # "the converter failed (COMMAND):" then its output: its last line
        first = f"{first.split(' (')[0]}: {lines[-1].strip()}"
    return {
        "verdict": "refused",
        "gap_past_l0": None,
        "gap_before_l0": None,
        "error": first.replace(str(scratch), "FOLDER")[:300],
    }


def _compare(logits: torch.Tensor, intended: torch.Tensor, tolerance: float) -> dict[str, Any]:
    if logits.shape != intended.shape:
        return {"verdict": "misread", "gap_past_l0": None, "gap_before_l0": None, "error": f"shape {logits.shape}"}
    past, before = _gap(logits[:, L0:], intended[:, L0:]), _gap(logits[:, :L0], intended[:, :L0])
    same = past is not None and before is not None and max(past, before) <= tolerance
    return {"verdict": "same" if same else "misread", "gap_past_l0": past, "gap_before_l0": before, "error": None}


__all__ = [
    "GGUF_READERS",
    "GGUF_TOLERANCE",
    "GgufTools",
    "L0",
    "LENGTH",
    "READERS",
    "TOLERANCE",
    "VERDICTS",
    "Row",
    "cell",
    "measure",
    "measure_gguf",
    "rows",
    "write_row",
]
