"""``hf-posext finetune``: the recipe's flags behind the sub-command, ``python -m`` and the closing summary."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from hf_posext.commands.finetune import config_from_args
from hf_posext.commands.finetune import main as finetune_main
from hf_posext.commands.finetune import summary
from hf_posext.commands.main import main
from hf_posext.train.loop import TrainResult


def test_help_is_the_recipe_parsers(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["finetune", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: hf-posext finetune") and "--max_train_steps" in text and "--set" in text


def test_help_shows_no_default_that_is_not_one(capsys):
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    # --no-NAME's store_false "default" is the flag's opposite, not a setting; None means "see the help"
    assert "turn overwrite off (default" not in text and "turn lora off (default" not in text
    assert "--no-activation-checkpointing turn activation_checkpointing off --activation_offload" in text
    assert "(default: None)" not in text
    assert "default 16 (the YaRN paper's)" in text


def test_sub_command_and_module_report_bad_input_alike(tmp_path, capsys):
    argv = ["--config", str(tmp_path / "missing.yaml")]
    assert main(["finetune", *argv]) == 2
    assert finetune_main(argv) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors == [
        f"hf-posext: error: config file '{tmp_path / 'missing.yaml'}' does not exist",
        f"hf-posext finetune: error: config file '{tmp_path / 'missing.yaml'}' does not exist",
    ]


def test_debug_on_the_module_entry_point_shows_the_traceback(tmp_path):
    with pytest.raises(FileNotFoundError):
        finetune_main(["--config", str(tmp_path / "missing.yaml"), "--debug"])


def test_python_dash_m_runs_the_command(tmp_path):
    # What `accelerate launch -m hf_posext.commands.finetune` starts in every process.
    done = subprocess.run(
        [sys.executable, "-m", "hf_posext.commands.finetune", "--model", "m", "--dataset", "d.txt"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().endswith(
        "output_dir is required: the folder the fine-tuned checkpoint is written to (--output-dir)"
    )


def test_summary_prints_perplexity_before_and_after():
    result = TrainResult(
        output_dir=Path("out/m"),
        steps=30,
        tokens=100,
        final_loss=1.23456,
        losses=[2.0, 1.23456],
        eval={"before": 12.3456, "after": 6.54321},
    )
    assert summary(result).splitlines() == [
        "wrote out/m (30 steps, final loss 1.2346)",
        "",
        "held-out perplexity (eval_blocks)",
        "| before | after |",
        "|---:|---:|",
        "| 12.3456 | 6.5432 |",
    ]
    assert summary(TrainResult(Path("o"), 1, 1, 0.5, [0.5])) == "wrote o (1 steps, final loss 0.5000)"


def test_a_hub_dataset_without_datasets_names_the_extra(tmp_path, capsys, monkeypatch):
    from hf_posext.testing import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny", hidden_size=32, max_position_embeddings=32)
    monkeypatch.setitem(sys.modules, "datasets", None)  # what a missing package looks like to `import datasets`
    argv = ["--model", str(model), "--dataset", "wikitext", "--output-dir", str(tmp_path / "out")]
    capsys.readouterr()
    assert finetune_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'wikitext'" in err[0] and "pip install 'hf-posext[train]'" in err[0], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("factor: four", "factor"),
        ("max-train-steps: many", "max_train_steps"),
        ("seq_len: 1.5", "seq_len"),
        ("lora: maybe", "lora"),
    ],
)
def test_a_bad_yaml_value_is_one_line_naming_the_file_and_field(tmp_path, capsys, line, field):
    config = tmp_path / "run.yaml"
    config.write_text(f"model: m\ndataset: d.txt\noutput-dir: {tmp_path / 'out'}\n{line}\n")
    assert finetune_main(["--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(config) in err[0] and field in err[0] and "usage" not in err[0], err


@pytest.mark.parametrize("method", [["string"], ["rerope", "--set", "leak=16"]], ids=["string", "rerope-leaky"])
def test_bf16_fine_tuning_of_a_remapping_method_gets_past_step_one(tmp_path, capsys, method):
    # The recipe's batches pad, and bf16 autocast gives bf16 scores: fp32's minimum overflowed them at step 1.
    from hf_posext.testing import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny", hidden_size=32, num_heads=2, num_kv_heads=1, max_position_embeddings=32)
    data = Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py"
    argv = ["--model", str(model), "--method", *method, "--factor", "4", "--dataset", str(data)]
    argv += ["--output-dir", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), "--eval-blocks", "0"]
    argv += [
        "--max-train-steps",
        "2",
        "--global-batch-size",
        "2",
        "--micro-batch-size",
        "2",
        "--mixed-precision",
        "bf16",
    ]
    assert finetune_main(argv) == 0, capsys.readouterr().err
    assert "(2 steps, final loss" in capsys.readouterr().out


def test_the_window_schedule_and_longrope_factors_are_yaml_keys_and_flags(tmp_path):
    """``longrope-factors`` is the old key of LongRoPE's training option ``factors``: still read, with a warning."""
    config = tmp_path / "run.yaml"
    config.write_text(
        "model: m\ndataset: d.txt\noutput-dir: out\nmethod: longrope\nfactor: 4\nwindow-schedule: step\n"
        "window-start: '512'\nwindow-ramp-steps: 100\nlongrope-factors: long\n"
    )
    with pytest.warns(FutureWarning, match=r"longrope_factors is deprecated and goes in 0\.3\.0.*--set factors=long"):
        parsed = config_from_args(["--config", str(config), "--window-schedule", "linear"])
    assert (parsed.window_schedule, parsed.window_start, parsed.window_ramp_steps, parsed.training_options) == (
        "linear",
        512,
        100,
        {"factors": "long"},
    )
    assert parsed.method_kwargs == {"factors": "long"} and parsed.method_arguments == {}
    with pytest.warns(FutureWarning):
        assert config_from_args(["--config", str(config), "--longrope-factors", "mixed"]).training_options == {
            "factors": "mixed"
        }, "the flag wins over the file"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--window-schedule", "cosine"], "--window-schedule"),
        (["--window-start", "8"], "--window-start"),
        (["--window-schedule", "linear", "--window-ramp-steps", "500"], "window_ramp_steps=500 with max_train_steps"),
        (["--longrope-factors", "long"], "longrope_factors"),
        (["--method", "longrope", "--longrope-factors", "short"], "--longrope-factors"),
        (["--method", "longrope", "--set", "factors=short"], "--set factors='short'"),
        (["--method", "longrope", "--set", "factors=long", "--longrope-factors", "mixed"], "disagree"),
    ],
)
def test_a_bad_schedule_or_factor_setting_is_one_line(tmp_path, capsys, argv, named):
    try:
        code = finetune_main(["--model", "m", "--dataset", "d.txt", "--output-dir", str(tmp_path / "out"), *argv])
    except SystemExit as exit_:  # argparse's own refusal of a choice
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0] and "usage" not in err[0], err
    assert not (tmp_path / "out").exists()
