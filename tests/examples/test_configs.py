"""Every shipped config parses, means what its header says, and its launch command is valid.

accelerate configs go through accelerate's own loader and ``accelerate launch`` argument
validation (``_validate_launch_command``, what the CLI runs before starting processes), and
for FSDP/DDP the environment the launcher would hand to the training processes. The recipe
configs and the ``hf-posext finetune`` (or ``-m hf_posext.commands.finetune``) arguments of every
header command go through the recipe's own parser.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils.launch import prepare_multi_gpu_env

from hf_posext.commands.finetune import config_from_args
from hf_posext.commands.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
ACCELERATE_CONFIGS = sorted((ROOT / "examples" / "accelerate").glob("*.yaml"))
RECIPE_CONFIGS = sorted((ROOT / "examples").glob("finetune*.yaml"))

EXPECTED = {
    "single_gpu.yaml": {"distributed_type": "NO", "num_processes": 1},
    "ddp.yaml": {"distributed_type": "MULTI_GPU", "multi_gpu": True},
    "fsdp2.yaml": {
        "distributed_type": "FSDP",
        "FSDP_VERSION": "2",
        "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT",
        "FSDP_CPU_RAM_EFFICIENT_LOADING": "true",
    },
    "deepspeed_zero3.yaml": {"distributed_type": "DEEPSPEED", "zero_stage": 3, "zero3_save_16bit_model": "true"},
    "deepspeed_ulysses.yaml": {"distributed_type": "DEEPSPEED", "zero_stage": 3, "zero3_save_16bit_model": "true"},
    "context_parallel.yaml": {
        "distributed_type": "FSDP",
        "FSDP_VERSION": "2",
        "PARALLELISM_CONFIG_CP_SIZE": "8",
        "PARALLELISM_CONFIG_CP_BACKEND": "torch",
    },
}


def header_commands(path: Path) -> list[list[str]]:
    """The shell commands in a file's leading comment block (backslash continuations joined)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = re.sub(r"\\\s*\n\s*", " ", "\n".join(lines))
    return [shlex.split(line) for line in text.splitlines() if line.startswith(("accelerate launch", "hf-posext "))]


def test_every_expected_config_ships():
    assert sorted(p.name for p in ACCELERATE_CONFIGS) == sorted(EXPECTED)
    assert [p.name for p in RECIPE_CONFIGS] == [
        "finetune_chat_tiny.yaml",
        "finetune_smollm2_32k.yaml",
        "finetune_smollm2_32k_chat.yaml",
        "finetune_smollm2_32k_long.yaml",
        "finetune_tiny.yaml",
    ]


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=lambda p: p.name)
def test_accelerate_config_loads_and_validates_as_a_launch(path):
    expected = EXPECTED[path.name]
    cluster = load_config_from_file(str(path))
    assert str(cluster.distributed_type).split(".")[-1] == expected["distributed_type"]
    assert cluster.mixed_precision == "bf16"

    args = launch_command_parser().parse_args(["--config_file", str(path), "-m", "hf_posext.commands.finetune"])
    assert args.module and args.training_script == "hf_posext.commands.finetune"
    args, _, _ = _validate_launch_command(args)
    if "num_processes" in expected:
        assert args.num_processes == expected["num_processes"]
    if expected.get("multi_gpu"):
        assert args.multi_gpu
    if expected["distributed_type"] == "DEEPSPEED":
        assert args.use_deepspeed and args.zero_stage == expected["zero_stage"]
        assert str(args.zero3_save_16bit_model).lower() == expected["zero3_save_16bit_model"]
    if expected["distributed_type"] == "FSDP":
        env = prepare_multi_gpu_env(args)
        for key, value in expected.items():
            if key.isupper():
                assert env[key] == value, key
    if "PARALLELISM_CONFIG_CP_SIZE" in expected:
        cp = int(expected["PARALLELISM_CONFIG_CP_SIZE"])
        assert args.parallelism_config_dp_shard_size * cp == args.num_processes


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS + RECIPE_CONFIGS, ids=lambda p: p.name)
def test_header_launch_commands_are_valid(path):
    commands = header_commands(path)
    assert commands, f"{path.name} has no launch command in its header"
    for command in commands:
        if command[:2] == ["accelerate", "launch"]:
            assert command[command.index("--config_file") + 1] == f"examples/accelerate/{path.name}"
            assert command[command.index("-m") + 1] == "hf_posext.commands.finetune"
            script = command.index("-m") + 1
        else:
            script = 1
            if command[1] != "finetune":
                build_parser().parse_args(command[1:])  # e.g. hf-posext tiny-model: its flags parse
                continue
        config = config_from_args(command[script + 1 :])
        if "--model" in command:
            assert config.model == command[command.index("--model") + 1]
        elif "--config" in command:
            # The file's relative paths are read against its folder: out/ beside examples/.
            assert Path(config.model).resolve() == ROOT / "out" / "tiny-llama"
        else:
            assert config.method == "yarn" and config.factor >= 4


def test_real_model_recipe_config_is_the_documented_run():
    """examples/finetune_smollm2_32k.yaml: what docs/results/finetune_smollm2.md says it runs."""
    config = config_from_args(
        ["--config", str(ROOT / "examples" / "finetune_smollm2_32k.yaml"), "--model", "x.gguf", "--output-dir", "out"]
    )
    assert (config.method, config.factor, config.seq_len, config.max_train_steps) == ("yarn", 4, 32768, 400)
    assert config.lora and config.pose and config.pose_window == 1024 and config.mixed_precision == "auto"
    assert config.dataset == ["stdlib", "!*/pydoc_data/*"]


def test_tiny_recipe_config_is_a_short_cpu_run():
    config = config_from_args(["--config", str(ROOT / "examples" / "finetune_tiny.yaml")])
    assert config.dataset == ["stdlib"] and config.mixed_precision == "no"
    assert config.max_train_steps * config.global_batch_size * 64 * config.factor <= 100_000  # ~1 min on 2 cores


def test_chat_recipe_config_reads_its_conversations_and_template_beside_it():
    config = config_from_args(["--config", str(ROOT / "examples" / "finetune_chat_tiny.yaml")])
    assert config.short_dataset == [str(ROOT / "examples" / "data" / "chat_tiny.jsonl")]
    assert config.chat_template == str(ROOT / "examples" / "data" / "chatml.jinja")
    assert config.loss_on == "assistant" and config.short_fraction == 0.5


def test_chat_real_model_config_is_the_published_recipe_plus_a_conversation_mix():
    def read(name):
        return config_from_args(["--config", str(ROOT / "examples" / name), "--model", "x.gguf", "--output-dir", "o"])

    published, chat = read("finetune_smollm2_32k.yaml"), read("finetune_smollm2_32k_chat.yaml")
    # as many long windows a step (half of the micro-batches), each short one a block of conversations
    assert chat.global_batch_size * (1 - chat.short_fraction) == published.global_batch_size
    assert chat.short_dataset == [str(ROOT / "examples" / "data" / "chat_smollm2.jsonl")]
    same = ("method", "factor", "seq_len", "max_train_steps", "learning_rate", "lora_rank", "pose_window", "dataset")
    assert all(getattr(chat, name) == getattr(published, name) for name in same)
