"""A real two-process run of the recipe: ``torchrun --nproc_per_node 2`` on CPU (gloo), ~20-30 s.

``accelerate launch --cpu --num_processes 2`` starts only one process (accelerate's CPU launcher), so the
test launches torchrun itself; accelerate picks the gloo backend from torchrun's environment.
It checks that the two ranks end with identical weights, that one training state holds both
ranks' RNG states, that the loss falls, and that data parallelism computes what one process
with gradient accumulation over the same global batch computes, PoSE's drawn positions included;
and that the two processes' state is not resumed by one. One launch runs the configs in turn.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from accelerate.state import AcceleratorState
from safetensors.torch import load_file

from hf_posext.commands.finetune import main as finetune_main
from hf_posext.train.loop import train

from tests.helpers.finetune import train_config, write_finetune_assets

DRIVER = """
import sys, torch
from accelerate.state import AcceleratorState
from hf_posext.train.config import TrainConfig
from hf_posext.train.loop import train

for name, values in {runs!r}.items():
    result = train(TrainConfig(**values))
    rank = torch.distributed.get_rank()
    weights = {{k: v.detach().clone() for k, v in result.model.state_dict().items()}}
    torch.save(weights, f"{out}/{{name}}-rank{{rank}}.pt")
    torch.save(result.losses, f"{out}/{{name}}-losses{{rank}}.pt")
    AcceleratorState._reset_state(reset_partial_state=True)
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
def test_two_process_run_stays_in_sync_and_matches_gradient_accumulation(tmp_path, capsys):
    assets = write_finetune_assets(tmp_path)
    common = dict(max_train_steps=4, global_batch_size=4, seed=3)
    pose = {**common, "max_train_steps": 3, "pose": True}
    ddp = train_config(assets, tmp_path / "ddp", checkpointing_steps=4, **common)
    runs = {"ddp": ddp.to_dict(), "pose": train_config(assets, tmp_path / "pose", **pose).to_dict()}
    (tmp_path / "driver.py").write_text(DRIVER.format(runs=runs, out=tmp_path))
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

    rank0, rank1 = torch.load(tmp_path / "ddp-rank0.pt"), torch.load(tmp_path / "ddp-rank1.pt")
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), f"ranks diverged at {name}"
    losses = torch.load(tmp_path / "ddp-losses0.pt")
    assert losses == torch.load(tmp_path / "ddp-losses1.pt")  # the logged loss is the mean over ranks
    assert losses[-1] < losses[0]
    state = tmp_path / "ddp-checkpoints" / "step_00000004"
    assert sorted(p.name for p in (tmp_path / "ddp-checkpoints").iterdir()) == ["step_00000004"]
    assert {"random_states_0.pkl", "random_states_1.pkl", "model.safetensors", "optimizer.bin"} <= {
        p.name for p in state.iterdir()
    }

    # One process, same global batch through 2 accumulation steps: the same blocks per step and
    # the same mean gradient, so the same weights up to the order of float additions.
    single = train(train_config(assets, tmp_path / "single", **common))
    ddp_weights = load_file(tmp_path / "ddp" / "model.safetensors")
    single_weights = load_file(tmp_path / "single" / "model.safetensors")
    for name, value in single_weights.items():
        torch.testing.assert_close(ddp_weights[name], value, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.tensor(single.losses), torch.tensor(losses), rtol=1e-4, atol=1e-5)

    # PoSE: each sample draws its positions by its place in the global batch, not by process
    # (each rank drew its own: 1.2e-4 off in the loss, 1.4e-2 in the weights).
    AcceleratorState._reset_state(reset_partial_state=True)
    single = train(train_config(assets, tmp_path / "pose-single", **pose))
    torch.testing.assert_close(
        torch.tensor(single.losses), torch.tensor(torch.load(tmp_path / "pose-losses0.pt")), rtol=0, atol=1e-5
    )
    pose_weights = load_file(tmp_path / "pose" / "model.safetensors")
    for name, value in load_file(tmp_path / "pose-single" / "model.safetensors").items():
        torch.testing.assert_close(pose_weights[name], value, rtol=0, atol=1e-5, msg=name)

    # The two processes' state resumed by one: refused in one line before a model is built (it was
    # accepted and trained on other blocks: the data position counts per-process micro-batches).
    AcceleratorState._reset_state(reset_partial_state=True)
    (tmp_path / "resume.yaml").write_text(yaml.safe_dump({**ddp.to_dict(), "resume": str(state)}))
    capsys.readouterr()
    code = finetune_main(["--config", str(tmp_path / "resume.yaml")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "cannot resume" in err and "num_processes 2" in err and "this run has num_processes 1" in err


def launcher_env(config_file: str) -> dict[str, str]:
    """The environment ``accelerate launch --config_file examples/accelerate/<config_file> --num_processes 2``
    hands its processes (accelerate's own argument checks and environment builders)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    path = Path(__file__).resolve().parents[2] / "examples" / "accelerate" / config_file
    args = launch_command_parser().parse_args(["--config_file", str(path), "--num_processes", "2", "-m", "x"])
    args, _, _ = _validate_launch_command(args)
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ""  # what launch_command sets before calling it
        env = prepare_deepspeed_cmd_env(args)[1]
    else:
        env = prepare_multi_gpu_env(args)
    return {key: value for key, value in env.items() if key.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_"))}


@pytest.mark.parametrize(
    "config_file, changes, flags, refused",
    [
        (
            "deepspeed_zero3.yaml",
            {},
            [],
            "asks for DeepSpeed, which accelerate runs on GPUs only|DeepSpeed runs on GPUs only",
        ),
        ("fsdp2.yaml", {"FSDP_VERSION": "1"}, [], "asks for FSDP version 1, which does not run on CPU"),
        ("context_parallel.yaml", {}, [], r"context parallelism \(cp_size=8\), which has no CPU path"),
        (
            "ddp.yaml",
            {"ACCELERATE_USE_PARALLELISM_CONFIG": "true", "PARALLELISM_CONFIG_TP_SIZE": "2"},
            [],
            r"tensor parallelism \(tp_size=2\), which the recipe does not run",
        ),
        (
            "ddp.yaml",
            {},
            ["--sp-size", "2"],
            "sp_size=2: DeepSpeed Ulysses .* this run is on CPU|sp_size=2 runs inside DeepSpeed",
        ),
    ],
    ids=["zero3", "fsdp1", "context-parallel", "tensor-parallel", "sequence-parallel"],
)
def test_a_parallelism_the_cpu_run_cannot_give_is_one_line_with_exit_code_2(
    tmp_path, monkeypatch, capsys, config_file, changes, flags, refused
):
    """Was: exit 0 after a run as plain DDP, nothing sharded, no word (accelerate drops FSDP/DeepSpeed on CPU)."""
    import re

    from hf_posext.commands.finetune import main

    write_finetune_assets(tmp_path)
    for key, value in {**launcher_env(config_file), **changes}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    capsys.readouterr()
    argv = ["--model", str(tmp_path / "llama"), "--dataset", str(tmp_path / "data.txt"), "--output-dir"]
    code = main([*argv, str(tmp_path / "out"), "--factor", "2", "--cache-dir", str(tmp_path / "cache"), *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and re.search(refused, err), err
    assert not (tmp_path / "out").exists()


def test_a_state_saved_before_layouts_were_recorded_counts_its_processes(tmp_path):
    from hf_posext.train.resume import check_resume_layout, process_layout

    for rank in range(2):
        (tmp_path / f"random_states_{rank}.pkl").write_bytes(b"")
    check_resume_layout({}, tmp_path, process_layout(2, 2, "MULTI_CPU"))
    with pytest.raises(ValueError, match="saved by num_processes 2, this run has num_processes 1"):
        check_resume_layout({}, tmp_path, process_layout(1, 1, "NO"))
