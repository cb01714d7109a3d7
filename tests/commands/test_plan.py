"""``hf-posext plan``: finetune's flags and --config, a model folder holding only config.json, bad input."""

from __future__ import annotations

import json

import pytest

from hf_posext.commands.main import main
from hf_posext.train.config import TrainConfig
from hf_posext.train.memory import GIB, Layout, ModelShape, estimate_memory

CONFIG = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 1024,
}


@pytest.fixture
def model(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG))  # no weights, no tokenizer
    return folder


def plan_json(capsys, *argv) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_the_peak_per_process_and_whether_it_fits(model, capsys):
    plan = plan_json(capsys, "--model", str(model), "--seq-len", "4096", "--device", "cpu", "--mixed-precision", "no")
    config = TrainConfig(model=str(model), dataset=["stdlib"], output_dir="o", seq_len=4096, mixed_precision="no")
    expected = estimate_memory(ModelShape.from_config(CONFIG), config, Layout(device="cpu", bf16=False))
    assert plan["peak_bytes"] == expected.peak_bytes and plan["fits"] is None
    small = plan_json(capsys, "--model", str(model), "--seq-len", "4096", "--device", "cpu", "--memory", "0.01")
    assert small["fits"] is False and small["longest_fit"] is None
    large = plan_json(capsys, "--model", str(model), "--seq-len", "4096", "--device", "cpu", "--memory", "64")
    assert large["fits"] is True and large["longest_fit"] == 16384  # the patched context: 1024 x 16


def test_config_file_and_flags_as_finetune_reads_them(model, tmp_path, capsys):
    (tmp_path / "run.yaml").write_text("model: model\nseq_len: 2048\nlora: true\nmicro_batch_size: 2\n")
    plan = plan_json(capsys, "--config", str(tmp_path / "run.yaml"), "--seq-len", "8192", "--device", "cuda")
    assert (plan["seq_len"], plan["lora"], plan["tokens_per_process"]) == (8192, True, 16384)
    assert plan["precision"] == "bf16" and plan["tokens_per_s"] is None  # no GPU FLOP rate is recorded


def test_sharding_over_processes_divides_the_model_states(model, capsys):
    one = plan_json(capsys, "--model", str(model), "--device", "cuda")
    eight = plan_json(capsys, "--model", str(model), "--device", "cuda", "--processes", "8")
    assert eight["strategy"] == "fsdp2"
    assert eight["terms_bytes"]["optimizer"] == one["terms_bytes"]["optimizer"] // 8


def test_the_text_report_names_every_term(model, capsys):
    assert main(["plan", "--model", str(model), "--device", "cpu", "--memory", "8"]) == 0
    text = capsys.readouterr().out
    for word in ("weights", "optimizer", "gradients", "activations", "loss", "overhead", "peak", "fits", "longest"):
        assert word in text
    assert "tokens/s" in text  # the CPU's FLOP rate is recorded


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--memory", "0"], "argument --memory: must be > 0 (GiB of memory per device), got '0'"),
        (["--memory", "-3"], "argument --memory: must be > 0"),
        (["--lora-rank", "0"], "--lora-rank: lora_rank must be"),
        (["--pose", "--pose-window", "4096", "--seq-len", "2048"], "pose_window=4096 exceeds seq_len=2048"),
        (["--seq-len", "65536"], "seq_len=65536 exceeds the 16384 tokens"),
        (["--device", "cpu", "--activation-offload"], "activation_offload"),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(model, capsys, argv, message):
    try:  # the recipe's parser exits 2 itself for a bad flag value, as finetune's does
        code = main(["plan", "--model", str(model), *argv])
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_config_without_the_sizes_is_refused_naming_the_field(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in CONFIG.items() if k != "intermediate_size"}))
    assert main(["plan", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'config.json'}: intermediate_size is None" in err and err.count("\n") == 1


def test_memory_per_gib_is_gib(model, capsys):
    plan = plan_json(capsys, "--model", str(model), "--memory", "1.5", "--device", "cpu")
    assert plan["memory_bytes"] == int(1.5 * GIB)


def finetune_argv(model, tmp_path, *argv) -> list[str]:
    return ["--model", str(model), "--dataset", "stdlib", "--output-dir", str(tmp_path / "out"), *argv]


def test_finetune_refuses_a_run_that_cannot_fit_before_the_model_loads(model, tmp_path, capsys):
    from hf_posext.commands.finetune import main as finetune_main

    argv = finetune_argv(model, tmp_path, "--seq-len", "16384", "--mixed-precision", "no", "--memory", "0.6")
    # the folder holds no weights: loading it would fail otherwise, so the refusal came first
    assert finetune_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out.startswith("memory plan: peak ")
    longest = plan_json(
        capsys, *argv[:2], "--seq-len", "16384", "--device", "cpu", "--mixed-precision", "no", "--memory", "0.6"
    )["longest_fit"]
    assert 128 <= longest < 16384
    assert f"the longest seq_len that fits is {longest} " in captured.err and captured.err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_finetune_force_runs_anyway_with_a_warning(model, tmp_path, capsys, monkeypatch):
    import hf_posext.train.loop as loop
    from hf_posext.commands.finetune import main as finetune_main

    trained = []
    monkeypatch.setattr(
        loop, "train", lambda config: trained.append(config) or (_ for _ in ()).throw(ValueError("stop"))
    )
    assert finetune_main(finetune_argv(model, tmp_path, "--seq-len", "16384", "--memory", "0.6", "--force")) == 2
    assert len(trained) == 1 and trained[0].seq_len == 16384  # --force and --memory are no settings
    err = capsys.readouterr().err
    assert "warning: --force: the memory plan's peak is" in err


def test_finetune_on_cpu_without_memory_only_reports(model, tmp_path, capsys, monkeypatch):
    import hf_posext.train.loop as loop
    from hf_posext.commands.finetune import main as finetune_main

    monkeypatch.setattr(loop, "train", lambda config: (_ for _ in ()).throw(ValueError("stop")))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert finetune_main(finetune_argv(model, tmp_path, "--seq-len", "16384")) == 2
    out, err = capsys.readouterr()
    assert "memory plan: peak" in out and "not checked on CPU" in out and "stop" in err
