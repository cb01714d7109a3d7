"""The GPU session's scripts on CPU: each ``benchmarks/gpu/*.py --cpu-smoke`` runs tiny, as on the GPU machine.

Each runs in a real subprocess with this checkout on the path (as ``session.sh`` starts them)
and must write its rows (``benchmarks/result_schema.py``) with the device, the versions and wall
times; the carry helper splits and joins a file byte for byte.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hf_posext

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "benchmarks" / "gpu"
sys.path.insert(0, str(ROOT / "benchmarks"))
from result_schema import Row, read_rows  # noqa: E402  (benchmarks/ is not a package)

from scripts import tables  # noqa: E402


def smoke(script: str, out: Path, *extra: str) -> list[Row]:
    done = subprocess.run(
        [sys.executable, str(GPU / f"{script}.py"), "--cpu-smoke", "--out", str(out), *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = read_rows(out / f"{script}.json")
    assert all(r.setting["mode"] == "cpu-smoke" and r.versions["torch"] and r.versions["transformers"] for r in rows)
    assert tables.value(rows, method="run", metric="wall_s", part="total") > 0
    return rows


def of(rows: list[Row], **match) -> dict[str, Row]:
    """``{method: row}`` of the rows that match."""
    return {r.method: r for r in rows if r.matches(**match)}


def docs_table(name: str, script: str, out: Path, monkeypatch) -> str:
    """The docs table ``name`` generated from this run's JSON, placed where the GPU session commits it."""
    results = out.parent / "results"
    (results / "gpu" / script).mkdir(parents=True, exist_ok=True)
    (results / "gpu" / script / f"{script}.json").write_text((out / f"{script}.json").read_text())
    monkeypatch.setattr(tables, "RESULTS", results)
    return tables.render(name)


def test_finetune_real_trains_until_its_deadline_saves_and_evaluates_before_and_after(tmp_path, monkeypatch):
    # --train-minutes 0: the deadline passes during the first step, so training stops after it.
    rows = smoke("finetune_real", tmp_path / "out", "--work", str(tmp_path / "work"), "--train-minutes", "0")
    tuned = [r for r in rows if r.method == "fine-tuned"]
    steps = of(tuned, metric="steps")["fine-tuned"]
    assert tables.value(tuned, metric="stopped_by") == "deadline" and steps.value == 1
    assert steps.extra["config"]["loss_chunk_size"] > 0 and steps.extra["config"]["activation_checkpointing"]
    assert set(of(rows, metric="perplexity")) == {"base", "yarn s=4, no fine-tune", "fine-tuned"}
    assert {r.setting["length"] for r in tuned if r.metric == "perplexity"} == {256, 512, 1024}
    assert {r.setting["length"] for r in tuned if r.metric == "passkey"} == {1024}
    has_ruler = importlib.util.find_spec("hf_posext.eval.ruler") is not None
    ruler = of(tuned, metric="ruler")["fine-tuned"]
    assert ruler.value == ("ok" if has_ruler else "skip"), ruler.extra
    assert of(tuned, metric="goal_passkey_at_longest")["fine-tuned"].extra["goal"] == ">= 0.9"
    card = (tmp_path / "out" / "MODEL_CARD.md").read_text()
    assert "## Evaluation" in card and "| fine-tuned" in card
    assert (tmp_path / "out" / "perplexity.png").is_file() and (tmp_path / "out" / "passkey.png").is_file()
    for png in ("perplexity.png", "passkey.png"):
        (tmp_path / "out" / png).unlink()
    redraw = subprocess.run(
        [sys.executable, str(GPU / "finetune_real.py"), "--replot", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert redraw.returncode == 0 and (tmp_path / "out" / "passkey.png").is_file(), redraw.stderr[-2000:]
    table = docs_table("gpu-finetune-real", "finetune_real", tmp_path / "out", monkeypatch)
    assert table.startswith("| model | ppl 256 | ppl 512 | ppl 1k | passkey 1k |") and "(deadline)" in table


def test_mfu_measures_the_recipe_and_the_plain_step_and_skips_liger_on_cpu(tmp_path, monkeypatch):
    rows = smoke("mfu", tmp_path / "out", "--lengths", "128", "--profile")
    assert set(of(rows, metric="step_s")) == {"recipe", "plain"}
    assert {m: r.value for m, r in of(rows, metric="status").items()} == {
        "liger": "skip",
        "liger_kernels_chunked_loss": "skip",
    }
    # Same weights, same tokens: the chunked loss is the model's own loss.
    first_loss = of(rows, metric="first_loss")
    assert first_loss["recipe"].value == pytest.approx(first_loss["plain"].value, rel=1e-5)
    assert "Name" in of(rows, metric="step_s")["recipe"].extra["profile"]
    table = docs_table("gpu-mfu", "mfu", tmp_path / "out", monkeypatch)
    assert "| `recipe` | 128 |" in table and "| `liger` | - | skip |" in table


def test_prefill_reports_exact_against_transformers_and_decode_against_static(tmp_path, monkeypatch):
    rows = smoke("prefill", tmp_path / "out", "--original-lengths", "16")
    ratios = [r for r in rows if r.benchmark == "dynamic_prefill" and r.metric == "ratio"]
    assert {r.method for r in ratios} == {"dynamic_ntk", "dynamic_yarn"}
    assert all(r.setting["tokens"] == 64 and r.value > 0 for r in ratios)
    decode = [r.value for r in rows if r.metric == "decode_ratio_vs_static"]
    assert len(decode) == 4 and all(r > 0 for r in decode)
    table = docs_table("gpu-prefill", "prefill", tmp_path / "out", monkeypatch)
    assert "| 64 | dynamic_ntk |" in table and "vs static" in table


def test_sedca_skips_with_a_line_without_the_methods_and_measures_any_registered_ones(tmp_path, monkeypatch):
    rows = smoke("sedca", tmp_path / "default")
    registered = {"self_extend", "dca"} <= set(hf_posext.available_methods())
    assert ("all" in of(rows, metric="status")) is not registered
    # The measuring path itself, on methods every checkout has.
    rows = smoke("sedca", tmp_path / "yarn", "--methods", "yarn", "--method-args", '{"yarn": {"factor": 4}}')
    assert set(of(rows, metric="prefill_s")) == {"sdpa", "yarn"} and not of(rows, metric="status")
    assert of(rows, benchmark="gpu_sedca_parity", metric="ok")["yarn"].value
    table = docs_table("gpu-sedca", "sedca", tmp_path / "yarn", monkeypatch)
    assert "| `yarn` | 256 |" in table and "yarn: ok" in table


def test_carry_model_splits_under_the_call_limit_and_joins_byte_for_byte(tmp_path):
    model = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model.write_bytes(os.urandom(3 * 2**20 + 7))
    carry, device = tmp_path / "carry", tmp_path / "device"
    tool = [sys.executable, str(GPU / "carry_model.py"), "--carry", str(carry)]
    subprocess.run([*tool, "prepare", "--gguf", str(model), "--no-wheels"], check=True, capture_output=True)
    assert (carry / "a" / "part").stat().st_size + (carry / "b" / "part").stat().st_size == model.stat().st_size
    missing = subprocess.run([*tool, "receive", "b", "--dir", str(device)], capture_output=True, text=True)
    assert missing.returncode != 0 and "went cold" in missing.stderr
    for part in ("a", "b"):
        subprocess.run(
            [*tool, "receive", part, "--dir", str(device), "--site", str(tmp_path / "site")],
            check=True,
            capture_output=True,
        )
    joined = device / model.name
    assert hashlib.sha256(joined.read_bytes()).digest() == hashlib.sha256(model.read_bytes()).digest()
    assert "PYTHONPATH" in (device / "env.sh").read_text()


def test_the_real_split_fits_two_calls():
    sys.path.insert(0, str(GPU))
    try:
        import carry_model
    finally:
        sys.path.remove(str(GPU))
    first, second = carry_model.split_sizes(98_362_432, 14_578_482)  # the GGUF and the three wheels
    assert first + 14_578_482 <= carry_model.CALL_LIMIT - 4 * 2**20 and second <= carry_model.CALL_LIMIT - 4 * 2**20
    with pytest.raises(ValueError, match="do not fit"):
        carry_model.split_sizes(200 * 2**20, 0)


def test_the_training_child_prints_one_result_line_the_launcher_reads(tmp_path, capsys):
    from hf_posext.testing import make_tiny_model

    sys.path.insert(0, str(GPU))
    try:
        import finetune_real
    finally:
        sys.path.remove(str(GPU))
    base = make_tiny_model(tmp_path / "base", max_position_embeddings=32)
    config = dict(
        model=str(base),
        method="yarn",
        factor=2,
        output_dir=str(tmp_path / "out"),
        dataset=finetune_real.training_files(smoke=True),
        max_train_steps=2,
        warmup_steps=0,
        global_batch_size=1,
        micro_batch_size=1,
        mixed_precision="no",
        cache_dir=str(tmp_path / "cache"),
    )
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"config": config, "deadline": 4e9}))  # far away: max_train_steps ends the run
    assert finetune_real.main(["--train-child", str(spec)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("RESULT ")]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["steps"] == 2 and result["stopped_by"] == "max_train_steps" and len(result["losses"]) == 2
    assert (tmp_path / "out" / "config.json").is_file()


def test_the_console_command_runs_the_projects_cli_without_an_installed_script():
    sys.path.insert(0, str(GPU))
    try:
        import common
    finally:
        sys.path.remove(str(GPU))
    done = subprocess.run(
        [*common.console_command(), "eval", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0 and "passkey" in done.stdout, done.stderr[-2000:]


def test_plan_memory_compares_the_plan_with_the_measured_peak_of_each_run(tmp_path):
    rows = smoke("plan_memory", tmp_path / "out")
    for mode in ("full", "lora"):
        found = {r.metric: r for r in rows if r.method == mode and r.benchmark == "plan_memory_gpu"}
        measured, predicted = found["measured_peak_mib"].value, found["predicted_peak_mib"].value
        assert measured > 0 and predicted > 0
        assert found["error"].value == pytest.approx(predicted / measured - 1, abs=1e-3)
