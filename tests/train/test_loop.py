"""End-to-end runs of the fine-tune recipe on a tiny local model (CPU, fp32, a few seconds each).

What the recipe promises: the saved checkpoint reloads in vanilla transformers (a fresh
interpreter that never imports hf_posext) with identical logits and the extended config; a run
killed (SIGKILL) after a checkpoint and resumed ends bit-identical to an uninterrupted run; the
LoRA path's merged checkpoint reproduces the PEFT model's logits; bad input fails before training.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_posext.commands.finetune import main as finetune_main
from hf_posext.files import MARKER
from hf_posext.train.saved_state import latest_checkpoint, list_checkpoints
from hf_posext.train.config import TrainConfig
from hf_posext.testing import byte_tokenizer, make_tiny_model
from tests.helpers.finetune import train_config, write_finetune_assets
from hf_posext.train.lora import merged_state_dict
from hf_posext.train.loop import FinetuneRecipe, train

ROOT = Path(__file__).resolve().parents[2]
ORIGINAL_CONTEXT = 32
#: One intra-op thread: on a small shared CPU, OpenMP threads fighting over busy cores make these
#: tiny matmuls ~40x slower. Subprocesses get the same setting, so results compare bit for bit.
SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """The tiny Llama with its tokenizer limited to its 32-token context, and real text (two stdlib modules)."""
    return write_finetune_assets(
        tmp_path_factory.mktemp("train"), tokenizer_limit=True, sources=("textwrap.py", "glob.py")
    )


def config(assets: Path, out: Path, **overrides) -> TrainConfig:
    settings = {"max_train_steps": 6, "global_batch_size": 4, "activation_checkpointing": True, **overrides}
    return train_config(assets, out / "model", **settings)


def vanilla_logits(model_dir: Path, input_ids: torch.Tensor, out_file: Path) -> tuple[torch.Tensor, dict]:
    """Logits and config from a fresh interpreter that loads ``model_dir`` (and its tokenizer)
    without hf_posext."""
    torch.save(input_ids, out_file.with_suffix(".in.pt"))
    code = textwrap.dedent(f"""
        import sys, json, torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        model = AutoModelForCausalLM.from_pretrained({str(model_dir)!r}).eval()
        with torch.no_grad():
            logits = model(torch.load({str(out_file.with_suffix(".in.pt"))!r})).logits
        tokenizer = AutoTokenizer.from_pretrained({str(model_dir)!r})
        assert tokenizer("héllo").input_ids == [256, *"héllo".encode()], "the byte tokenizer travels along"
        assert "hf_posext" not in sys.modules, "the checkpoint must load without hf_posext"
        torch.save(logits, {str(out_file)!r})
        print(json.dumps(model.config.rope_parameters))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", env=SUBPROCESS_ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    return torch.load(out_file), json.loads(done.stdout.strip().splitlines()[-1])


def test_run_saves_hub_ready_checkpoint_that_reloads_in_vanilla_transformers(assets, tmp_path):
    result = train(config(assets, tmp_path, eval_blocks=4, checkpointing_steps=3))
    out = Path(result.output_dir)
    assert sorted(p.name for p in out.iterdir()) == [
        MARKER,
        "README.md",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "train_results.json",
    ]
    assert result.steps == 6 and len(result.losses) == 6
    assert sum(result.losses[-2:]) < sum(result.losses[:2])  # loss falls
    assert result.eval["after"] < result.eval["before"]
    # Two training states (steps 3 and 6), each complete, no temporary folder left behind.
    assert [step for step, _ in list_checkpoints(tmp_path / "model-checkpoints")] == [3, 6]
    assert not [p for p in (tmp_path / "model-checkpoints").iterdir() if p.name.startswith(".")]

    input_ids = torch.randint(0, 256, (1, 2 * ORIGINAL_CONTEXT), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = result.model.eval()(input_ids).logits
    logits, rope = vanilla_logits(out, input_ids, tmp_path / "logits.pt")
    assert torch.equal(logits, expected)
    assert rope == {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 2.0,
        "original_max_position_embeddings": ORIGINAL_CONTEXT,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    }
    saved = json.loads((out / "config.json").read_text())
    assert saved["max_position_embeddings"] == 2 * ORIGINAL_CONTEXT
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 2 * ORIGINAL_CONTEXT
    assert saved["hf_posext"]["method"] == "yarn" and saved["use_cache"] is True

    card = (out / "README.md").read_text()
    for line in (
        "- hf-posext",
        "| method | yarn |",
        "| factor | 2.0 |",
        f"| original context | {ORIGINAL_CONTEXT} |",
        f"| extended context | {2 * ORIGINAL_CONTEXT} |",
        "| steps | 6 |",
        f"| final training loss | {result.final_loss:.4f} |",
        f"held-out perplexity at {2 * ORIGINAL_CONTEXT} tokens, after training | {result.eval['after']:.3f} |",
    ):
        assert line in card
    results = json.loads((out / "train_results.json").read_text())
    assert results["losses"] == result.losses and results["tokens"] == 6 * 4 * 2 * ORIGINAL_CONTEXT


KILL_SCRIPT = """
import os, signal, sys
from hf_posext.train.config import TrainConfig
from hf_posext.train.loop import FinetuneRecipe, train

def kill_at(progress):
    if progress.step == {kill_step}:
        os.kill(os.getpid(), signal.SIGKILL)  # a real crash: no cleanup, no exception handlers

train(TrainConfig(**{values!r}), callbacks=[kill_at])
"""


def test_killed_and_resumed_run_ends_bit_identical(assets, tmp_path):
    reference = train(config(assets, tmp_path / "straight", checkpointing_steps=2))
    expected = load_file(Path(reference.output_dir) / "model.safetensors")

    crashed = config(assets, tmp_path / "crashed", checkpointing_steps=2)
    script = KILL_SCRIPT.format(kill_step=5, values=crashed.to_dict())
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=SUBPROCESS_ENV)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert not Path(crashed.output_dir).exists()
    # Killed after step 5: the newest complete state is step 4, one step of work is lost.
    assert latest_checkpoint(crashed.checkpoint_path).name == "step_00000004"

    resumed = train(config(assets, tmp_path / "crashed", checkpointing_steps=2, resume="latest"))
    assert resumed.losses == reference.losses
    got = load_file(Path(resumed.output_dir) / "model.safetensors")
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_resume_refuses_changed_settings(assets, tmp_path):
    train(config(assets, tmp_path, max_train_steps=2, warmup_steps=0, checkpointing_steps=2))
    with pytest.raises(ValueError, match=r"learning_rate: 0.003 -> 0.001"):
        train(config(assets, tmp_path, max_train_steps=2, warmup_steps=0, learning_rate=1e-3, resume="latest"))


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def saved_states(assets, tmp_path_factory):
    """Training states of a full fine-tune and of a LoRA rank-16 one (one step each)."""
    states = {}
    for name, lora in (("full", {}), ("lora16", {"lora": True, "lora_rank": 16, "lora_alpha": 32})):
        root = tmp_path_factory.mktemp(name)
        train(config(assets, root, max_train_steps=1, warmup_steps=0, checkpointing_steps=1, **lora))
        states[name] = Path(f"{root / 'model'}-checkpoints")
    return states


@pytest.mark.parametrize(
    "saved, flags, changed",
    [
        ("lora16", ["--lora", "--lora-rank", "8", "--lora-alpha", "32"], "lora_rank: 16 -> 8"),
        ("lora16", ["--lora-rank", "16", "--lora-alpha", "32"], "lora: True -> False"),
        ("full", ["--lora"], "lora: False -> True"),
        (
            "lora16",
            ["--lora", "--lora-rank", "16", "--lora-alpha", "32", "--lora-target-modules", "q_proj", "v_proj"],
            "lora_target_modules: ['q_proj', 'k_proj', 'v_proj', 'o_proj'] -> ['q_proj', 'v_proj']",
        ),
        ("lora16", ["--lora", "--lora-rank", "16", "--lora-alpha", "16"], "lora_alpha: 32 -> 16"),
    ],
    ids=["rank", "lora-dropped", "lora-added", "targets", "alpha"],
)
def test_resume_with_another_lora_shape_is_one_line_and_keeps_the_states(
    assets, tmp_path, capsys, saved_states, saved, flags, changed
):
    """The settings are compared before any weights load: a state of another shape is a refusal, not a traceback."""
    states = saved_states[saved]
    before = _files(states)
    argv = [
        *("--model", str(assets / "llama"), "--method", "yarn", "--factor", "2"),
        *("--dataset", str(assets / "data.txt"), "--output-dir", str(tmp_path / "out")),
        *("--max-train-steps", "1", "--warmup-steps", "0", "--learning-rate", "3e-3", "--seed", "7"),
        *("--global-batch-size", "4", "--micro-batch-size", "2", "--mixed-precision", "no"),
        *("--cache-dir", str(assets / "cache"), "--checkpoint-dir", str(states), "--resume", *flags),
    ]
    assert finetune_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hf-posext finetune: error: cannot resume:"), err
    assert changed in err[0]
    assert not (tmp_path / "out").exists()
    assert _files(states) == before


@pytest.mark.newest
def test_lora_merged_checkpoint_reproduces_peft_logits(assets, tmp_path):
    result = train(
        config(
            assets,
            tmp_path,
            lora=True,
            lora_rank=4,
            learning_rate=1e-2,
            max_train_steps=4,
            activation_checkpointing=False,
        )
    )
    peft_model = result.model.eval()
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert any("lora_A" in n for n in trainable)
    assert any("embed_tokens.modules_to_save" in n for n in trainable)  # LongLoRA: embeddings and norms
    assert any("input_layernorm.modules_to_save" in n for n in trainable)
    assert not any(n.endswith("mlp.up_proj.weight") for n in trainable)
    input_ids = torch.randint(0, 256, (1, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = peft_model(input_ids).logits
    logits, rope = vanilla_logits(Path(result.output_dir), input_ids, tmp_path / "logits.pt")
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    assert rope["rope_type"] == "yarn"
    # The adapters really changed the model: the merged weights differ from the base checkpoint.
    base = load_file(assets / "llama" / "model.safetensors")
    merged = load_file(Path(result.output_dir) / "model.safetensors")
    assert merged.keys() == base.keys()
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )
    assert not torch.equal(merged["model.norm.weight"], base["model.norm.weight"])


def test_lora_run_writes_its_adapter_and_patch_rebuilds_the_merged_checkpoint(assets, tmp_path):
    """The small adapter is what gets published; base + adapter through `hf-posext patch` is the run's model."""
    from hf_posext.commands.main import main

    result = train(
        config(
            assets,
            tmp_path,
            lora=True,
            lora_rank=4,
            learning_rate=1e-2,
            max_train_steps=2,
            activation_checkpointing=False,
        )
    )
    adapter = Path(result.output_dir) / "adapter"
    assert (adapter / "adapter_config.json").is_file()
    saved = load_file(adapter / "adapter_model.safetensors")
    assert any("lora_A" in k for k in saved) and any("input_layernorm" in k for k in saved)
    assert not any("mlp.up_proj.weight" in k for k in saved)  # frozen weights stay out of the adapter
    # Its own card (not PEFT's empty template) says how to rebuild; its config names no local folder.
    card = (adapter / "README.md").read_text()
    assert "library_name: peft" in card and "More Information Needed" not in card
    assert "hf-posext patch BASE OUT --method yarn --factor 2 --adapter adapter" in card
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] is None
    rebuilt = tmp_path / "rebuilt"
    assert (
        main(
            [
                "patch",
                str(assets / "llama"),
                str(rebuilt),
                "--method",
                "yarn",
                "--factor",
                "2",
                "--adapter",
                str(adapter),
            ]
        )
        == 0
    )
    want = load_file(Path(result.output_dir) / "model.safetensors")
    got = load_file(rebuilt / "model.safetensors")
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-6, msg=name)
    input_ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(2))
    logits, rope = vanilla_logits(rebuilt, input_ids, tmp_path / "rebuilt.pt")
    expected, _ = vanilla_logits(Path(result.output_dir), input_ids, tmp_path / "run.pt")
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    assert rope["rope_type"] == "yarn" and (rebuilt / "adapter" / "adapter_config.json").is_file()


def test_patch_with_a_missing_adapter_is_one_line(assets, tmp_path, capsys):
    from hf_posext.commands.main import main

    assert (
        main(
            [
                "patch",
                str(assets / "llama"),
                str(tmp_path / "out"),
                "--method",
                "yarn",
                "--factor",
                "2",
                "--adapter",
                str(tmp_path / "nothing"),
            ]
        )
        == 2
    )
    assert "no PEFT adapter at" in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def lora_adapter(assets, tmp_path_factory) -> Path:
    """The adapter of a one-step LoRA run (rank 4) on the 2-layer, 32-wide Llama."""
    root = tmp_path_factory.mktemp("adapter")
    result = train(config(assets, root, lora=True, lora_rank=4, max_train_steps=1, warmup_steps=0))
    return Path(result.output_dir) / "adapter"


@pytest.mark.parametrize(
    "base, damage, message",
    [
        (
            {"hidden_size": 48},
            None,
            "adapter tensor base_model.model.model.embed_tokens.weight has shape (264, 32); "
            "the base's model.embed_tokens.weight is (264, 48)",
        ),
        (
            {"hidden_size": 48, "num_heads": 3},
            "lora-pairs-only",
            "adapter tensor base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight has shape (4, 32); "
            "the base's model.layers.0.self_attn.k_proj (48 -> 16 features) takes (4, 48)",
        ),
        ({"num_layers": 3}, None, "model.layers.2.self_attn.q_proj"),
        ({"num_layers": 1}, None, "base_model.model.model.layers.1."),
        ({}, "adapter_model.safetensors", "adapter_model.safetensors"),
        ({}, "r=8", "has rank 4 but"),
        ({}, "config-not-json", "adapter_config.json is not valid JSON"),
        ({}, "weights-truncated", "adapter_model.safetensors cannot be read"),
    ],
    ids=[
        "wider-base",
        "wider-base-lora-pair",
        "deeper-base",
        "shallower-base",
        "weights-missing",
        "config-rank-not-the-weights",
        "config-damaged",
        "weights-damaged",
    ],
)
def test_patch_with_an_adapter_of_another_base_is_one_line(
    assets, tmp_path, capsys, lora_adapter, base, damage, message
):
    """The adapter is checked against the base before anything merges: no traceback, nothing at OUT."""
    from hf_posext.commands.main import main

    adapter = tmp_path / "adapter"
    shutil.copytree(lora_adapter, adapter)
    if damage == "lora-pairs-only":  # an adapter without trained embeddings and norms
        weights = load_file(adapter / "adapter_model.safetensors")
        save_file({k: v for k, v in weights.items() if ".lora_" in k}, adapter / "adapter_model.safetensors")
    elif damage == "r=8":  # the config of another run beside these rank-4 weights
        settings = json.loads((adapter / "adapter_config.json").read_text())
        (adapter / "adapter_config.json").write_text(json.dumps({**settings, "r": 8}))
    elif damage == "config-not-json":
        (adapter / "adapter_config.json").write_text('{"r": 4, ')
    elif damage == "weights-truncated":
        weights = (adapter / "adapter_model.safetensors").read_bytes()
        (adapter / "adapter_model.safetensors").write_bytes(weights[: len(weights) // 2])
    elif damage:
        (adapter / damage).unlink()
    base_dir = tmp_path / "base"
    shape = {"hidden_size": 32, "num_heads": 2, "num_kv_heads": 1, "max_position_embeddings": ORIGINAL_CONTEXT}
    make_tiny_model(base_dir, **{**shape, **base})
    byte_tokenizer(model_max_length=ORIGINAL_CONTEXT).save_pretrained(base_dir)
    argv = ["patch", str(base_dir), str(tmp_path / "out"), "--method", "yarn", "--factor", "2", "--adapter"]
    capsys.readouterr()
    assert main([*argv, str(adapter)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line or "Traceback" in line]
    assert len(err) == 1 and err[0].startswith("hf-posext: error: "), err
    assert message in err[0] and str(adapter) in err[0], err
    assert not (tmp_path / "out").exists()


def test_state_dict_merge_matches_peft_merge_and_unload(assets):
    from transformers import AutoModelForCausalLM

    from hf_posext.train.lora import apply_lora

    model = AutoModelForCausalLM.from_pretrained(assets / "llama")
    peft_model = apply_lora(model, rank=4, alpha=8)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in peft_model.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn_like(param))
    ours = merged_state_dict(peft_model.state_dict(), peft_model.peft_config["default"])
    reference = peft_model.merge_and_unload().state_dict()
    assert ours.keys() == reference.keys()
    for name in reference:
        torch.testing.assert_close(ours[name], reference[name], rtol=0, atol=1e-6)


def test_apply_lora_keeps_peft_s_deprecation_warning_out_of_the_log(assets):
    """PEFT reads transformers 5's deprecated ``is_gradient_checkpointing``; a LoRA run's log stays clean."""
    import warnings

    from transformers import AutoModelForCausalLM

    from hf_posext.train.lora import apply_lora

    model = AutoModelForCausalLM.from_pretrained(assets / "llama")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_lora(model, rank=4, alpha=8)
        model.is_gradient_checkpointing  # noqa: B018 - the filter is scoped: the user's own reads still warn
    messages = [str(w.message) for w in caught if "is_gradient_checkpointing" in str(w.message)]
    assert len(messages) == (1 if hasattr(type(model), "is_activation_checkpointing") else 0), messages


def test_pose_run_trains_a_short_window_for_the_long_context(assets, tmp_path):
    result = train(config(assets, tmp_path, pose=True, factor=4, pose_window=ORIGINAL_CONTEXT, max_train_steps=3))
    saved = json.loads((Path(result.output_dir) / "train_results.json").read_text())
    assert (saved["window"], saved["seq_len"], saved["context"]) == (
        ORIGINAL_CONTEXT,
        4 * ORIGINAL_CONTEXT,
        4 * ORIGINAL_CONTEXT,
    )
    assert result.tokens == 3 * 4 * ORIGINAL_CONTEXT


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"dataset": ["missing/notes.txt"]}, FileNotFoundError, "missing/notes.txt"),
        ({"seq_len": 65}, ValueError, r"seq_len=65 exceeds the 64 tokens"),
        ({"method": "rotary-magic"}, ValueError, r"unknown method 'rotary-magic'.*yarn"),
        (
            {"lora": True, "lora_target_modules": ["query_key_value"]},
            ValueError,
            r"\['query_key_value'\] are not linear layers.*q_proj",
        ),
        ({"global_batch_size": 3}, ValueError, "global_batch_size=3 is not a multiple"),
        ({"pose": True, "pose_window": 80, "seq_len": 64}, ValueError, "pose_window=80 exceeds seq_len=64"),
        ({"resume": "nowhere/step_00000002"}, FileNotFoundError, "nowhere/step_00000002"),
    ],
)
def test_bad_input_fails_before_training(assets, tmp_path, monkeypatch, overrides, error, match):
    def no_training(*args, **kwargs):
        raise AssertionError("an optimizer was built: the error came too late")

    monkeypatch.setattr(torch.optim, "AdamW", no_training)
    with pytest.raises(error, match=match):
        train(config(assets, tmp_path, **overrides))
    assert not (tmp_path / "model").exists()
    assert not (tmp_path / "model-checkpoints").exists()


def test_card_describes_the_data_with_its_exclusions(assets, tmp_path):
    from hf_posext.train.final_model import describe_data

    def described(dataset):
        return describe_data(config(assets, tmp_path, dataset=dataset))

    assert (
        described(["stdlib", "!*/pydoc_data/*"])
        == "Python standard library sources (train split), without `*/pydoc_data/*`"
    )
    assert described(["stdlib"]) == "Python standard library sources (train split)"
    assert described(["a/x.txt", "b/y.md", "!*/y.md"]) == "local files: x.txt, y.md, without `*/y.md`"


def test_finetune_command_runs_from_flags(assets, tmp_path, capsys):
    code = finetune_main(
        [
            "--model",
            str(assets / "llama"),
            "--method",
            "linear",
            "--factor",
            "2",
            "--dataset",
            str(assets / "data.txt"),
            "--output-dir",
            str(tmp_path / "out"),
            "--max-train-steps",
            "2",
            "--warmup-steps",
            "0",
            "--global-batch-size",
            "2",
            "--micro-batch-size",
            "2",
            "--mixed-precision",
            "no",
            "--cache-dir",
            str(assets / "cache"),
        ]
    )
    assert code == 0
    assert f"wrote {tmp_path / 'out'} (2 steps" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "config.json").read_text())["rope_parameters"]["rope_type"] == "linear"
    assert "| data | local files: data.txt |" in (tmp_path / "out" / "README.md").read_text()
    assert finetune_main(["--config", str(tmp_path / "missing.yaml")]) == 2


def test_alibi_fine_tunes_beyond_the_original_context(assets, tmp_path):
    result = train(config(assets, tmp_path, method="alibi", factor=1, seq_len=2 * ORIGINAL_CONTEXT, max_train_steps=3))
    saved = json.loads((Path(result.output_dir) / "config.json").read_text())
    assert saved["hf_posext"]["method"] == "alibi"
    assert result.tokens == 3 * 4 * 2 * ORIGINAL_CONTEXT and result.losses[-1] < result.losses[0]


def test_an_error_inside_train_is_one_line_with_exit_code_2(assets, tmp_path, capsys, monkeypatch):
    # seq_len passes the settings' checks; only train() knows the model's context.
    argv = [
        "--model",
        str(assets / "llama"),
        "--method",
        "linear",
        "--factor",
        "2",
        "--dataset",
        str(assets / "data.txt"),
        "--output-dir",
        str(tmp_path / "out"),
        "--seq-len",
        "65",
        "--cache-dir",
        str(assets / "cache"),
    ]
    assert finetune_main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line or "Traceback" in line]
    assert len(errors) == 1 and errors[0].startswith("hf-posext finetune: error: seq_len=65 exceeds the 64 tokens"), (
        errors
    )
    monkeypatch.setenv("HF_POSEXT_DEBUG", "1")
    with pytest.raises(ValueError, match="seq_len=65"):
        finetune_main(argv)


def test_the_recipe_run_part_by_part_is_train(assets, tmp_path):
    # setup / train_step / save by hand (a custom loop) ends where train() ends, bit for bit on CPU fp32.
    whole = train(config(assets, tmp_path / "whole", max_train_steps=3, eval_blocks=2))
    recipe = FinetuneRecipe(config(assets, tmp_path / "parts", max_train_steps=3, eval_blocks=2))
    try:
        recipe.setup()
        losses = [recipe.train_step() for _ in range(3)]
        parts = recipe.save()
    finally:
        recipe.cleanup()
    assert losses == whole.losses == parts.losses and parts.eval == whole.eval
    assert set(parts.eval) == {"before", "after"} and parts.eval["after"] < parts.eval["before"]
    for name, tensor in whole.model.state_dict().items():
        assert torch.equal(parts.model.state_dict()[name], tensor), name


def test_cleanup_closes_the_bar_when_a_step_fails(assets, tmp_path, monkeypatch):
    recipe = FinetuneRecipe(config(assets, tmp_path, max_train_steps=3))
    recipe.setup()

    def broken_step() -> float:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(recipe, "train_step", broken_step)
    with pytest.raises(RuntimeError, match="out of memory"):
        try:
            recipe.train()
        finally:
            bar = recipe.bar
            recipe.cleanup()
    assert bar is not None and bar.disable  # it existed while training failed, and cleanup closed it
    assert recipe.bar is None


def test_a_non_finite_loss_stops_training_before_anything_is_saved(assets, tmp_path, monkeypatch):
    """A NaN step raises naming the step and the loss; no training state or model is written for it."""
    import hf_posext.train.loop as loop

    real = loop.forward_loss
    calls = []

    def nan_from_step_2(*args, **kwargs):
        calls.append(1)
        loss = real(*args, **kwargs)
        return loss * float("nan") if len(calls) > 2 else loss  # two micro-batches per step

    monkeypatch.setattr(loop, "forward_loss", nan_from_step_2)
    cfg = config(assets, tmp_path, max_train_steps=3, checkpointing_steps=1)
    with pytest.raises(ValueError, match=r"step 2: the training loss is nan"):
        train(cfg)
    assert not Path(cfg.output_dir).exists()
    assert sorted(p.name for p in cfg.checkpoint_path.iterdir()) == ["step_00000001"]


@pytest.mark.parametrize("method", ["self_extend", "dca"])
@pytest.mark.parametrize("chunk", [0, 64])
def test_remapping_methods_train_on_the_eager_kernel(assets, tmp_path, method, chunk):
    """Was NaN from step 2 (loss_chunk_size 0) or "logits are not its LM head's output" (chunked)."""
    result = train(
        config(
            assets,
            tmp_path,
            method=method,
            factor=2,
            max_train_steps=3,
            attn_implementation="eager",
            loss_chunk_size=chunk,
            activation_checkpointing=False,
        )
    )
    assert all(math.isfinite(loss) for loss in result.losses), result.losses


def test_resume_invariants_are_every_setting_but_the_ones_said_not_to_change_the_result(assets, tmp_path):
    """Derived from TrainConfig's fields: a new field is refused on a change until classified as free."""
    import dataclasses

    from hf_posext.train.resume import RESUME_FREE, RESUME_INVARIANTS, resume_invariants
    from hf_posext.train.resume import check_resume_config as _check_resume_config

    names = {field.name for field in dataclasses.fields(TrainConfig)}
    assert set(RESUME_FREE) <= names and all(RESUME_FREE.values())  # no stale name, every one with its reason
    assert set(RESUME_INVARIANTS) == names - set(RESUME_FREE)
    for name in (
        "weight_decay",
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "max_grad_norm",
        "lora_dropout",
        "mixed_precision",
        "loss_chunk_size",
        "attn_implementation",
    ):
        assert name in RESUME_INVARIANTS

    @dataclasses.dataclass
    class Extended(TrainConfig):
        new_setting: int = 0

    assert "new_setting" in resume_invariants(Extended)
    current = config(assets, tmp_path)
    saved = {**current.to_dict(), "weight_decay": 0.1, "adam_beta2": 0.999, "output_dir": "elsewhere"}
    with pytest.raises(ValueError, match=r"adam_beta2: 0.999 -> 0.95; weight_decay: 0.1 -> 0.0"):
        _check_resume_config(saved, current)
    _check_resume_config({**current.to_dict(), "output_dir": "elsewhere", "report_to": "tensorboard"}, current)


def test_a_resume_with_more_steps_says_how_to_train_longer(assets, tmp_path):
    from hf_posext.train.resume import check_resume_config as _check_resume_config

    current = config(assets, tmp_path)
    saved = {**current.to_dict(), "max_train_steps": current.max_train_steps - 1}
    with pytest.raises(ValueError, match="a resume cannot train longer") as error:
        _check_resume_config(saved, current)
    assert f"resume with the saved --max-train-steps {current.max_train_steps - 1}" in str(error.value)
    assert "without --resume" in str(error.value)
    fewer = {**current.to_dict(), "max_train_steps": current.max_train_steps + 1}
    with pytest.raises(ValueError) as error:
        _check_resume_config(fewer, current)
    assert "train longer" not in str(error.value)
