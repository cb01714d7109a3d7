"""The memory plan (hf_posext/train/memory.py): its counts against transformers' and PEFT's own models,
its terms against the recipe's settings, and its peaks against the committed CPU measurements."""

from __future__ import annotations

from pathlib import Path

import json

import pytest
from transformers import AutoConfig, AutoModelForCausalLM

from hf_posext.train.config import TrainConfig
from hf_posext.train.lora import apply_lora
from hf_posext.train.memory import GIB, Layout, ModelShape, estimate_memory, longest_fit, reference_data

ROOT = Path(__file__).resolve().parents[2]
SHAPES = {
    "llama_tied": dict(model_type="llama", tie_word_embeddings=True),
    "llama_untied": dict(model_type="llama", tie_word_embeddings=False),
    "qwen2_bias": dict(model_type="qwen2", tie_word_embeddings=False),
    "mistral_head_dim": dict(model_type="mistral", head_dim=24, tie_word_embeddings=False),
}


def tiny_config(**overrides) -> dict:
    return {
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 300,
        "max_position_embeddings": 128,
        **overrides,
    }


def recipe(**values) -> TrainConfig:
    return TrainConfig(**{"model": "m", "dataset": ["stdlib"], "output_dir": "o", "factor": 16, **values})


@pytest.mark.parametrize("name", SHAPES)
def test_parameter_count_is_transformers_own(name):
    values = tiny_config(**SHAPES[name])
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**values))
    assert ModelShape.from_config(values).params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["llama_tied", "llama_untied"])
def test_lora_trainable_count_is_peft_s(name):
    values = tiny_config(**SHAPES[name])
    model = apply_lora(
        AutoModelForCausalLM.from_config(AutoConfig.for_model(**values)), ["q_proj", "v_proj"], 4, 8, 0.0
    )
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    held = sum(p.numel() for p in model.parameters())
    estimate = estimate_memory(
        ModelShape.from_config(values),
        recipe(lora=True, lora_rank=4, lora_target_modules=["q_proj", "v_proj"]),
        Layout(device="cpu", bf16=False),
    )
    assert estimate.trainable_params == trained
    assert estimate.terms["weights"] == 4 * held  # the frozen model, the adapters and modules_to_save's copies


@pytest.mark.parametrize("field", ["hidden_size", "vocab_size", "num_hidden_layers"])
def test_a_config_without_a_size_is_refused_by_name(field):
    values = tiny_config(model_type="llama")
    del values[field]
    with pytest.raises(ValueError, match=f"cfg/config.json: {field} is None"):
        ModelShape.from_config(values, "cfg/config.json")


SHAPE = ModelShape.from_config(
    {
        **tiny_config(model_type="llama"),
        "vocab_size": 32000,
        "hidden_size": 512,
        "num_hidden_layers": 8,
        "max_position_embeddings": 4096,
    }
)


def peak(**values) -> int:
    layout = values.pop("layout", Layout(device="cuda"))
    return estimate_memory(SHAPE, recipe(**values), layout).peak_bytes


def test_each_saving_setting_saves():
    base = dict(seq_len=32768)
    assert peak(**base) < peak(**base, loss_chunk_size=0)
    assert peak(**base) < peak(**base, activation_checkpointing=False)
    assert peak(**base, lora=True) < peak(**base)
    assert peak(**base, activation_offload=True) < peak(**base)
    assert peak(**base, layout=Layout(8, "fsdp2")) < peak(**base, layout=Layout(8, "ddp"))
    assert peak(seq_len=8192) < peak(seq_len=16384) < peak(seq_len=32768)
    assert peak(**base) < peak(**base, attn_implementation="eager")


def test_pose_and_sequence_parallelism_shorten_what_a_process_holds():
    pose = estimate_memory(SHAPE, recipe(seq_len=32768, pose=True), Layout(device="cuda"))
    assert (pose.seq_len, pose.window, pose.tokens) == (32768, 4096, 4096)  # the original context is the window
    assert pose.peak_bytes == peak(seq_len=4096)
    split = estimate_memory(SHAPE, recipe(seq_len=2048, sp_size=4), Layout(4, "zero3"))
    assert split.tokens == 512
    with pytest.raises(ValueError, match="sp_size=3 must divide"):
        estimate_memory(SHAPE, recipe(seq_len=2048, sp_size=3), Layout(4, "zero3"))


def test_a_sequence_beyond_the_patched_context_is_refused_as_the_recipe_refuses_it():
    shape = ModelShape.from_config(tiny_config(model_type="llama"))  # 128 tokens x 16
    with pytest.raises(ValueError, match=r"seq_len=4096 exceeds the 2048 tokens .* use seq_len <= 2048"):
        estimate_memory(shape, recipe(seq_len=4096), Layout())


def test_longest_fit_is_the_longest_length_under_the_budget():
    config, layout = recipe(), Layout(device="cuda")
    budget = peak(seq_len=1024) + GIB // 8
    shape = SHAPE
    found = longest_fit(shape, config, layout, budget)
    assert found is not None and found % 128 == 0
    assert estimate_memory(shape, config, layout, found).peak_bytes <= budget
    assert estimate_memory(shape, config, layout, found + 128).peak_bytes > budget
    assert longest_fit(shape, config, layout, GIB // 1024) is None


def test_the_reference_models_are_read_from_their_config_alone():
    models = {k: v for k, v in reference_data()["models"].items() if isinstance(v, dict)}
    counts = {name: ModelShape.from_config(values).params for name, values in models.items()}
    # The published sizes: Llama-3-8B 8.03B, Qwen2.5-7B 7.62B, Mistral-7B-v0.3 7.25B.
    assert round(counts["meta-llama/Meta-Llama-3-8B"] / 1e9, 2) == 8.03
    assert round(counts["Qwen/Qwen2.5-7B"] / 1e9, 2) == 7.62
    assert round(counts["mistralai/Mistral-7B-v0.3"] / 1e9, 2) == 7.25


def test_the_plan_is_within_20_percent_of_the_committed_cpu_measurements():
    """Recomputes every prediction of benchmarks/plan_memory.py with today's code against its measured peaks."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from plan_memory import predict

    rows = [r for r in json.loads((ROOT / "benchmarks/results/plan_memory.json").read_text())]
    measured = [r for r in rows if r["metric"] == "measured_peak_mib"]
    assert len(measured) == 20  # lengths 1k-16k x full, LoRA x 1, 2 processes
    for row in measured:
        setting = row["setting"]
        predicted, _ = predict(setting["tokens"], row["method"] == "lora", setting["processes"])
        assert abs(predicted / row["value"] - 1) <= 0.2, (row["method"], setting, predicted, row["value"])
