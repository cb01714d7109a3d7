"""Recipe settings: defaults are the YaRN paper's, YAML and flags agree, bad values are named."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml

from hf_posext import available_methods
from hf_posext.methods import method_class
from hf_posext.commands.finetune import build_parser, config_from_args
from hf_posext.train.config import FIELD_CHECKS, TrainConfig, build_scheduler
from hf_posext.train.settings import CHECKS, SETTING_GROUPS, DataSettings, ScheduleSettings

REQUIRED = dict(model="m", output_dir="o", dataset=["d.txt"])


def test_defaults_are_the_yarn_recipe():
    config = TrainConfig(**REQUIRED)
    assert (config.max_train_steps, config.learning_rate, config.warmup_steps, config.lr_scheduler) == (
        400,
        2e-5,
        20,
        "linear",
    )
    assert (config.adam_beta1, config.adam_beta2, config.weight_decay, config.global_batch_size) == (0.9, 0.95, 0.0, 64)
    assert config.mixed_precision == "auto" and config.activation_checkpointing
    assert str(config.checkpoint_path) == "o-checkpoints"


def test_the_recipe_flags_exist():
    flags = {opt for action in build_parser()._actions for opt in action.option_strings}
    for flag in (
        "--model",
        "--method",
        "--factor",
        "--dataset",
        "--seq-len",
        "--max-train-steps",
        "--output-dir",
        "--checkpointing-steps",
        "--resume",
        "--lora",
        "--pose",
        "--config",
    ):
        assert flag in flags


def test_every_setting_is_a_flag():
    flags = {opt for action in build_parser()._actions for opt in action.option_strings}
    for item in dataclasses.fields(TrainConfig):
        flag = "--set" if item.name == "method_kwargs" else "--" + item.name.replace("_", "-")
        assert flag in flags, item.name


def test_flags_win_over_yaml(tmp_path):
    (tmp_path / "run.yaml").write_text(
        "model: tiny\nmethod: yarn\nfactor: 8\ndataset: a.txt\noutput-dir: out\nmax_train_steps: 7\nwarmup-steps: 2\n"
        "lora: true\nmethod_kwargs: {}\n"
    )
    config = config_from_args(
        [
            "--config",
            str(tmp_path / "run.yaml"),
            "--factor",
            "4",
            "--no-lora",
            "--dataset",
            "b.txt",
            "c.jsonl",
            "--resume",
            "--method-arg",
            "beta_fast=64",
        ]
    )
    assert (config.model, config.method, config.factor, config.max_train_steps) == ("tiny", "yarn", 4.0, 7)
    assert config.dataset == ["b.txt", "c.jsonl"] and config.lora is False
    assert config.resume == "latest" and config.method_kwargs == {"beta_fast": 64}
    assert config_from_args(["--config", str(tmp_path / "run.yaml"), "--resume", "ck/step_00000002"]).resume == (
        "ck/step_00000002"
    )


@pytest.mark.parametrize("method", available_methods())
def test_every_registered_method_is_accepted(method):
    factor = 16 if method_class(method).scales_rope else 1  # methods that replace RoPE take factor 1
    assert TrainConfig(method=method, factor=factor, **REQUIRED).method == method


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"method": "rope-magic"}, r"unknown method 'rope-magic'; available methods: .*yarn"),
        ({"factor": 0.5}, r"factor must be >= 1.*0.5"),
        ({"max_train_steps": 0}, r"max_train_steps must be an integer >= 1, got 0"),
        ({"seq_len": 1}, r"seq_len must be an integer >= 2, got 1"),
        ({"warmup_steps": 500}, r"warmup_steps=500 exceeds max_train_steps=400"),
        ({"learning_rate": -1.0}, r"learning_rate must be a positive number, got -1.0"),
        ({"adam_beta2": 1.0}, r"adam_beta2 must be in \[0, 1\), got 1.0"),
        ({"lr_scheduler": "sawtooth"}, r"lr_scheduler must be one of linear, cosine, .*constant, .*got 'sawtooth'"),
        ({"lr_scheduler": "cosine_with_min_lr"}, r"lr_scheduler='cosine_with_min_lr'.*min_lr_rate"),
        ({"lr_scheduler_kwargs": {"power": 2}}, r"lr_scheduler='linear' with .*unexpected keyword argument 'power'"),
        ({"mixed_precision": "fp8"}, r"mixed_precision must be one of auto, no, bf16, fp16; got 'fp8'"),
        ({"pose": True, "seq_len": 64, "pose_window": 128}, r"pose_window=128 exceeds seq_len=64"),
        ({"dataset": []}, r"dataset is required"),
        ({"model": ""}, r"model is required"),
    ],
)
def test_bad_settings_are_named(overrides, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**{**REQUIRED, **overrides})


def test_unknown_yaml_key_is_named(tmp_path):
    (tmp_path / "bad.yaml").write_text("model: m\noutput_dir: o\ndataset: d.txt\nlearning-rat: 1e-4\n")
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['learning_rat'\]"):
        config_from_args(["--config", str(tmp_path / "bad.yaml")])


def test_missing_yaml_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        config_from_args(["--config", str(tmp_path / "nope.yaml")])


def test_badly_indented_yaml_is_one_line_naming_the_place(tmp_path):
    (tmp_path / "bad.yaml").write_text("method: yarn\n factor: 4\n  seq-len: 128\n")
    with pytest.raises(ValueError, match=r"bad.yaml: line 2, column 8 not valid YAML \(mapping values") as raised:
        config_from_args(["--config", str(tmp_path / "bad.yaml")])
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(("steps", "warmup"), [(1, 0), (2, 0), (40, 4), (199, 19), (200, 20), (400, 20)])
def test_the_default_warm_up_fits_a_short_run(steps, warmup):
    """20 steps (the paper's), or a tenth of a shorter run: ``--max-train-steps 2`` alone is not refused."""
    assert TrainConfig(**{**REQUIRED, "max_train_steps": steps}).warmup_steps == warmup
    assert TrainConfig(**{**REQUIRED, "max_train_steps": steps, "warmup_steps": 1}).warmup_steps == 1


def test_method_arguments_are_checked_by_the_method():
    with pytest.raises(ValueError, match=r"method 'yarn' does not take \['beta_fastest'\]"):
        TrainConfig(method="yarn", method_kwargs={"beta_fastest": 3}, **REQUIRED)
    if "alibi" in available_methods():
        with pytest.raises(ValueError, match="alibi: factor must be 1"):
            TrainConfig(method="alibi", factor=4, **REQUIRED)


def test_every_flag_has_help_from_its_field():
    helps: dict[str, str] = {}
    for action in build_parser()._actions:
        helps.setdefault(action.dest, action.help)  # the field's flag, not its --no- complement
    for item in dataclasses.fields(TrainConfig):
        assert item.metadata.get("help") and helps[item.name].startswith(item.metadata["help"]), item.name


def test_set_wins_over_yaml_key_by_key_and_method_arg_still_works(tmp_path):
    (tmp_path / "run.yaml").write_text(
        "model: m\noutput_dir: o\ndataset: d.txt\nmethod_kwargs: {beta_fast: 16, beta_slow: 2}\n"
        "lr_scheduler: cosine_with_min_lr\nlr-scheduler-kwargs: {min_lr_rate: 0.1}\n"
    )
    config = config_from_args(["--config", str(tmp_path / "run.yaml"), "--set", "beta_fast=64"])
    assert config.method_kwargs == {"beta_fast": 64, "beta_slow": 2}
    assert config.lr_scheduler_kwargs == {"min_lr_rate": 0.1}
    config = config_from_args(
        [
            "--config",
            str(tmp_path / "run.yaml"),
            "--method-arg",
            "beta_slow=1",
            "--lr-scheduler-kwargs",
            "min_lr_rate=0.2",
        ]
    )
    assert config.method_kwargs == {"beta_fast": 16, "beta_slow": 1} and config.lr_scheduler_kwargs == {
        "min_lr_rate": 0.2
    }


def test_bad_set_item_exits_with_the_message(capsys):
    with pytest.raises(SystemExit):
        config_from_args(["--model", "m", "--output-dir", "o", "--dataset", "d.txt", "--set", "beta_fast"])
    assert "--set expects KEY=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text,expected",
    [
        ('"false"', False),
        ("'FALSE'", False),
        ("'No'", False),
        ("0", False),
        ('"yes"', True),
        ("true", True),
        ("'1'", True),
    ],
)
def test_yaml_booleans_are_read_strictly(tmp_path, text, expected):
    (tmp_path / "run.yaml").write_text(f"model: m\noutput_dir: o\ndataset: d.txt\nlora: {text}\n")
    assert config_from_args(["--config", str(tmp_path / "run.yaml")]).lora is expected
    assert TrainConfig(**REQUIRED, lora=yaml.safe_load(text)).lora is expected


@pytest.mark.parametrize("value", ["t", "off", 2, "", None])
def test_anything_else_is_not_a_boolean(value):
    with pytest.raises(ValueError, match=rf"lora must be true or false \(or yes/no/1/0, any case\), got {value!r}"):
        TrainConfig(**REQUIRED, lora=value)


def test_boolean_flags_take_the_same_spellings(capsys):
    argv = ["--model", "m", "--output-dir", "o", "--dataset", "d.txt"]
    assert config_from_args([*argv, "--pose", "YES"]).pose is True
    assert config_from_args([*argv, "--activation_checkpointing", "No"]).activation_checkpointing is False
    with pytest.raises(SystemExit):
        config_from_args([*argv, "--lora", "t"])
    assert "lora must be true or false" in capsys.readouterr().err


def test_quoted_numbers_read_as_their_flags_read_them(tmp_path):
    (tmp_path / "run.yaml").write_text('model: m\noutput_dir: o\ndataset: d.txt\nfactor: "4"\nseq_len: "128"\n')
    by_yaml = config_from_args(["--config", str(tmp_path / "run.yaml")])
    by_flags = config_from_args(
        ["--model", "m", "--output-dir", "o", "--dataset", "d.txt", "--factor", "4", "--seq-len", "128"]
    )
    # The file's relative paths are read against its folder (flags against the working directory).
    assert by_yaml == dataclasses.replace(by_flags, output_dir=str(tmp_path / "o"), dataset=[str(tmp_path / "d.txt")])
    assert by_flags == TrainConfig(**REQUIRED, factor="4", seq_len="128")
    assert (by_yaml.factor, by_yaml.seq_len) == (4.0, 128)
    with pytest.raises(ValueError, match=r"factor must be a number \(float\), got 'four'"):
        TrainConfig(**REQUIRED, factor="four")


def test_factor_in_set_is_refused_naming_its_own_flag():
    with pytest.raises(ValueError, match=r"sets factor=8; factor has its own setting: --factor 8"):
        config_from_args(["--model", "m", "--output-dir", "o", "--dataset", "d.txt", "--set", "factor=8"])


def test_yaml_mapping_setting_must_be_a_mapping(tmp_path):
    (tmp_path / "run.yaml").write_text("model: m\noutput_dir: o\ndataset: d.txt\nmethod_kwargs: [beta_fast=3]\n")
    with pytest.raises(ValueError, match=r"method_kwargs must be a mapping"):
        config_from_args(["--config", str(tmp_path / "run.yaml")])


@pytest.mark.parametrize("scheduler", ["linear", "constant"])
def test_schedules_through_get_scheduler_keep_the_recipe_shapes(scheduler):
    """``linear`` decays to 0 after the warm-up; ``constant`` holds the peak after it."""
    config = TrainConfig(lr_scheduler=scheduler, warmup_steps=2, max_train_steps=6, learning_rate=1.0, **REQUIRED)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    schedule = build_scheduler(config, optimizer)
    rates = []
    for _ in range(6):
        rates.append(schedule.get_last_lr()[0])
        optimizer.step()
        schedule.step()
    expected = [0.0, 0.5, 1.0, 0.75, 0.5, 0.25] if scheduler == "linear" else [0.0, 0.5, 1.0, 1.0, 1.0, 1.0]
    assert rates == pytest.approx(expected)


def test_every_setting_is_in_one_group_and_has_its_check():
    # A field declared with a plain HfArg has no check: settings.py's import fails with a KeyError naming it.
    grouped = [f.name for group in SETTING_GROUPS for f in dataclasses.fields(group)]
    assert sorted(grouped) == sorted(f.name for f in dataclasses.fields(TrainConfig))
    assert len(set(grouped)) == len(grouped)
    for group in SETTING_GROUPS:
        for item in dataclasses.fields(group):
            assert callable(CHECKS[item.name]), f"{group.__name__}.{item.name} has no check"
    assert list(FIELD_CHECKS) == [f.name for f in dataclasses.fields(TrainConfig)]


def test_help_lists_each_flag_under_its_group():
    parser = build_parser()
    titles = {group.title: group for group in parser._action_groups}
    for group in SETTING_GROUPS:
        section = titles[group._argument_group_name]
        dests = {action.dest for action in section._group_actions}
        assert dests == {f.name for f in dataclasses.fields(group)}, group.__name__


def test_a_yaml_value_is_checked_once_and_a_flag_wins_over_a_bad_one(tmp_path, monkeypatch):
    calls = []
    check = FIELD_CHECKS["seq_len"]

    def counted(name, value):
        calls.append(value)
        return check(name, value)

    monkeypatch.setitem(FIELD_CHECKS, "seq_len", counted)
    (tmp_path / "run.yaml").write_text("model: m\ndataset: d.txt\noutput_dir: o\nseq_len: 64\nwarmup_steps: -3\n")
    assert config_from_args(["--config", str(tmp_path / "run.yaml"), "--warmup-steps", "2"]).seq_len == 64
    assert calls == [64]  # once, when the TrainConfig was built; the file's warmup_steps lost to the flag
    with pytest.raises(ValueError, match=r"run\.yaml: warmup_steps must be"):
        config_from_args(["--config", str(tmp_path / "run.yaml")])


def test_transformers_hf_argument_parser_takes_the_config_and_its_groups():
    from transformers import HfArgumentParser

    argv = ["--model", "m", "--dataset", "d.txt", "--output_dir", "o", "--seq_len", "64"]
    (config,) = HfArgumentParser(TrainConfig).parse_args_into_dataclasses(argv)
    assert isinstance(config, TrainConfig) and config.seq_len == 64 and config.warmup_steps == 20
    data, schedule = HfArgumentParser((DataSettings, ScheduleSettings)).parse_args_into_dataclasses(
        ["--seq_len", "64", "--max_train_steps", "9"], return_remaining_strings=True
    )[:2]
    assert (data.seq_len, schedule.max_train_steps) == (64, 9)


def test_a_group_is_the_runs_settings_of_that_group():
    config = TrainConfig(**REQUIRED, max_train_steps=30, lr_scheduler="cosine")
    schedule = config.group(ScheduleSettings)
    assert isinstance(schedule, ScheduleSettings) and not isinstance(schedule, TrainConfig)
    assert (schedule.max_train_steps, schedule.lr_scheduler, schedule.warmup_steps) == (30, "cosine", 3)
    with pytest.raises(ValueError, match="not a settings group; the groups are"):
        config.group(TrainConfig)
