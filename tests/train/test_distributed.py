"""A real two-process run of the recipe: ``torchrun --nproc_per_node 2`` on CPU (gloo), ~20-30 s.

``accelerate launch --cpu --num_processes 2`` starts only one process (accelerate's CPU launcher), so the
test launches torchrun itself; accelerate picks the gloo backend from torchrun's environment.
It checks that the two ranks end with identical weights, that one training state holds both
ranks' RNG states, that the loss falls, and that data parallelism computes what one process
with gradient accumulation over the same global batch computes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_posext.train.config import TrainConfig
from hf_posext.train.loop import train
from hf_posext.testing import make_tiny_model

DRIVER = """
import sys, torch
from hf_posext.train.config import TrainConfig
from hf_posext.train.loop import train

result = train(TrainConfig(**{values!r}))
rank = torch.distributed.get_rank()
torch.save({{k: v.detach().clone() for k, v in result.model.state_dict().items()}}, f"{out}/rank{{rank}}.pt")
torch.save(result.losses, f"{out}/losses{{rank}}.pt")
"""


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("native", [True, False])
def test_auto_precision_on_a_cpu_is_bf16_only_where_bf16_is_native(monkeypatch, native):
    from hf_posext.train import distributed

    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    monkeypatch.setattr(distributed, "cpu_has_native_bf16", lambda: native)
    assert distributed.resolve_mixed_precision("auto") == ("bf16" if native else "no")
    assert distributed.resolve_mixed_precision("no") == "no"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    assert distributed.resolve_mixed_precision("auto") is None  # the launcher's setting


def test_auto_precision_keeps_the_precision_of_an_earlier_run_in_the_process(monkeypatch):
    from accelerate import Accelerator

    from hf_posext.train import distributed

    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    monkeypatch.setattr(distributed, "cpu_has_native_bf16", lambda: True)
    Accelerator(mixed_precision="no", cpu=True)
    assert distributed.resolve_mixed_precision("auto") is None  # bf16 now would be refused by accelerate
    assert Accelerator(mixed_precision=distributed.resolve_mixed_precision("auto"), cpu=True).mixed_precision == "no"


@pytest.mark.skipif(
    shutil.which("torchrun", path=os.path.dirname(sys.executable)) is None,
    reason="torchrun is not installed next to this Python",
)
def test_two_process_run_stays_in_sync_and_matches_gradient_accumulation(tmp_path):
    make_tiny_model(tmp_path / "llama", hidden_size=32, num_heads=2, num_kv_heads=1, max_position_embeddings=32)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    (tmp_path / "data.txt").write_text((stdlib / "textwrap.py").read_text())
    common = dict(
        model=str(tmp_path / "llama"),
        method="yarn",
        factor=2,
        dataset=[str(tmp_path / "data.txt")],
        max_train_steps=4,
        learning_rate=3e-3,
        warmup_steps=1,
        global_batch_size=4,
        micro_batch_size=2,
        mixed_precision="no",
        cache_dir=str(tmp_path / "cache"),
        seed=3,
    )
    ddp = TrainConfig(output_dir=str(tmp_path / "ddp"), checkpointing_steps=4, **common)
    (tmp_path / "driver.py").write_text(DRIVER.format(values=ddp.to_dict(), out=tmp_path))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", str(tmp_path / "driver.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]

    rank0, rank1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), f"ranks diverged at {name}"
    losses = torch.load(tmp_path / "losses0.pt")
    assert losses == torch.load(tmp_path / "losses1.pt")  # the logged loss is the mean over ranks
    assert losses[-1] < losses[0]
    state = tmp_path / "ddp-checkpoints" / "step_00000004"
    assert sorted(p.name for p in (tmp_path / "ddp-checkpoints").iterdir()) == ["step_00000004"]
    assert {"random_states_0.pkl", "random_states_1.pkl", "model.safetensors", "optimizer.bin"} <= {
        p.name for p in state.iterdir()
    }

    # One process, same global batch through 2 accumulation steps: the same blocks per step and
    # the same mean gradient, so the same weights up to the order of float additions.
    single = train(TrainConfig(output_dir=str(tmp_path / "single"), **common))
    ddp_weights = load_file(tmp_path / "ddp" / "model.safetensors")
    single_weights = load_file(tmp_path / "single" / "model.safetensors")
    for name, value in single_weights.items():
        torch.testing.assert_close(ddp_weights[name], value, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.tensor(single.losses), torch.tensor(losses), rtol=1e-4, atol=1e-5)
