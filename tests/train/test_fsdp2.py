"""FSDP2 on CPU: the shipped examples/accelerate/fsdp2.yaml launched with 2 processes (gloo), as a user would.

``accelerate launch --config_file examples/accelerate/fsdp2.yaml --num_processes 2`` on a machine
without GPUs: the recipe runs accelerate's own FSDP2 preparation (``fully_shard`` of every decoder
layer, the embedding, the final norm and LM head, the root; LoRA's adapters and the trainable
norms; the mixed-precision policy) and the chunked loss. Each run is compared with one process
accumulating the same global batch: losses and final weights within 1e-5, a resumed run bit for
bit. One launch runs several configs in turn (the process start is most of the time).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState
from safetensors.torch import load_file

from hf_posext.train.config import TrainConfig
from hf_posext.train.loop import train

ROOT = Path(__file__).resolve().parents[2]
ACCELERATE = shutil.which("accelerate", path=os.path.dirname(sys.executable))

DRIVER = """
import json, sys, torch
from accelerate.state import AcceleratorState
from torch.distributed.tensor import DTensor
from hf_posext.train.config import TrainConfig
from hf_posext.train.loop import train

for name, values in json.loads(open(sys.argv[1]).read()).items():
    result = train(TrainConfig(**values))
    sharded = {{
        key: [list(p.to_local().shape), list(p.shape)]
        for key, p in result.model.named_parameters()
        if isinstance(p, DTensor)
    }}
    trainable = sorted(key for key, p in result.model.named_parameters() if p.requires_grad)
    if torch.distributed.get_rank() == 0:
        with open(f"{out}/{{name}}.json", "w") as handle:
            json.dump({{"losses": result.losses, "sharded": sharded, "trainable": trainable}}, handle)
    AcceleratorState._reset_state(reset_partial_state=True)
"""

BASE = dict(
    method="yarn",
    factor=2,
    max_train_steps=3,
    learning_rate=3e-3,
    warmup_steps=1,
    global_batch_size=4,
    micro_batch_size=2,
    mixed_precision="no",
    loss_chunk_size=16,  # 64-token rows in 4 chunks: the chunked loss really chunks
    seed=3,
)
#: One run per family: a RoPE method, ALiBi and a remapping method, each with LoRA off and on.
RUNS = {
    "yarn": dict(max_train_steps=4, checkpointing_steps=2, checkpoints_total_limit=0),
    "yarn_lora": dict(lora=True),
    "yarn_bf16": dict(mixed_precision="auto"),  # the launcher's bf16: FSDP2's mixed-precision policy
    "alibi": dict(method="alibi", factor=1, seq_len=64),
    "alibi_lora": dict(method="alibi", factor=1, seq_len=64, lora=True),
    "self_extend": dict(method="self_extend", attn_implementation="eager"),
    "self_extend_lora": dict(method="self_extend", attn_implementation="eager", lora=True),
}

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(ACCELERATE is None, reason="the accelerate command is not installed next to this Python"),
]


@pytest.fixture(scope="module")
def assets(finetune_assets):
    return finetune_assets


def values(assets: Path, name: str, **overrides) -> dict:
    return {
        **BASE,
        "model": str(assets / "llama"),
        "dataset": [str(assets / "data.txt")],
        "cache_dir": str(assets / "cache"),
        "output_dir": str(assets / "out" / name),
        **RUNS.get(name.removesuffix("_resumed"), {}),
        **overrides,
    }


def launch_fsdp2(assets: Path, runs: dict[str, dict], tag: str) -> str:
    """Run ``runs`` in turn under ``accelerate launch`` with the shipped FSDP2 config and 2 processes."""
    (assets / f"{tag}.json").write_text(json.dumps(runs))
    (assets / "driver.py").write_text(DRIVER.format(out=assets))
    command = [ACCELERATE, "launch", "--config_file", str(ROOT / "examples" / "accelerate" / "fsdp2.yaml")]
    command += ["--num_processes", "2", str(assets / "driver.py"), str(assets / f"{tag}.json")]
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=540
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout


def single_process(assets: Path, name: str) -> tuple[list[float], dict[str, torch.Tensor], list[str]]:
    """One process, the same global batch through gradient accumulation."""
    AcceleratorState._reset_state(reset_partial_state=True)
    config = TrainConfig(**values(assets, name, output_dir=str(assets / "single" / name), checkpointing_steps=0))
    result = train(config)
    trainable = sorted(key for key, p in result.model.named_parameters() if p.requires_grad)
    return result.losses, load_file(Path(config.output_dir) / "model.safetensors"), trainable


def check_equal_to_one_process(assets: Path, name: str) -> None:
    losses, weights, trainable = single_process(assets, name)
    record = json.loads((assets / f"{name}.json").read_text())
    assert record["trainable"] == trainable  # LoRA adapters and the LongLoRA extras, under fully_shard too
    torch.testing.assert_close(torch.tensor(record["losses"]), torch.tensor(losses), rtol=0, atol=1e-5)
    sharded = load_file(assets / "out" / name / "model.safetensors")  # gathered from the shards by the save
    assert sharded.keys() == weights.keys()
    for key, value in weights.items():
        torch.testing.assert_close(sharded[key], value, rtol=0, atol=1e-5, msg=key)


@pytest.fixture(scope="module")
def rope_runs(assets):
    state = assets / "out" / "yarn-checkpoints" / "step_00000002"
    runs = {name: values(assets, name) for name in ("yarn", "yarn_lora", "yarn_bf16")}
    # Then the first run again from its state at step 2 (sharded, one file set per process).
    runs["yarn_resumed"] = values(assets, "yarn_resumed", resume=str(state), checkpointing_steps=0)
    return launch_fsdp2(assets, runs, "rope")


def test_fsdp2_config_shards_on_cpu_and_says_so(assets, rope_runs):
    assert "distributed: FSDP, 2 process(es), data-parallel 2; FSDP2 (torch fully_shard over gloo)" in rope_runs
    assert "LlamaDecoderLayer x2" in rope_runs and "SHARDED_STATE_DICT" in rope_runs
    record = json.loads((assets / "yarn.json").read_text())
    local, full = record["sharded"]["model.layers.0.mlp.up_proj.weight"]
    assert local == [full[0] // 2, full[1]]  # half of every weight on each process
    state = assets / "out" / "yarn-checkpoints" / "step_00000002"
    assert {"pytorch_model_fsdp_0", "optimizer_0", "random_states_0.pkl", "random_states_1.pkl"} <= {
        p.name for p in state.iterdir()
    }


def test_fsdp2_equals_one_process_with_accumulation(assets, rope_runs):
    check_equal_to_one_process(assets, "yarn")


def test_fsdp2_with_lora_and_the_chunked_loss_equals_one_process(assets, rope_runs):
    """Was a segfault in backward at step 1 on both ranks (the chunked loss's backward inside the forward)."""
    check_equal_to_one_process(assets, "yarn_lora")


def test_fsdp2_resume_is_bitwise_the_uninterrupted_run(assets, rope_runs):
    full = json.loads((assets / "yarn.json").read_text())["losses"]
    resumed = json.loads((assets / "yarn_resumed.json").read_text())["losses"]
    assert resumed == full
    uninterrupted = load_file(assets / "out" / "yarn" / "model.safetensors")
    again = load_file(assets / "out" / "yarn_resumed" / "model.safetensors")
    for key, value in uninterrupted.items():
        assert torch.equal(again[key], value), key


@pytest.mark.slow
@pytest.mark.parametrize("name", ["alibi", "alibi_lora", "self_extend", "self_extend_lora"])
def test_fsdp2_alibi_and_remapping_equal_one_process(assets, name, request):
    if not (assets / "alibi.json").exists():
        launch_fsdp2(assets, {key: values(assets, key) for key in RUNS if key.startswith(("alibi", "self_"))}, "more")
    check_equal_to_one_process(assets, name)


def test_fsdp2_takes_the_launcher_s_bf16_as_its_mixed_precision_policy(assets, rope_runs):
    assert "mixed precision: params in torch.bfloat16, gradients reduced in torch.bfloat16" in rope_runs
    losses, _, _ = single_process(assets, "yarn_bf16")
    record = json.loads((assets / "yarn_bf16.json").read_text())
    # bf16 weights in the layers (FSDP2) against bf16 autocast over fp32 weights (one process): the
    # same rounding class, not the same roundings; measured 6.6e-4 apart on this model.
    torch.testing.assert_close(torch.tensor(record["losses"]), torch.tensor(losses), rtol=0, atol=3e-3)
