"""What the recipe does for a method is the method's to say (its registered `Training`), never its name.

A method registered here, outside the package (a plugin: one ``register_method`` call, nothing in
hf_posext/train/), with a training option, a length constraint, a state pinned per micro-batch and a
model-card line: the recipe honours each. LongRoPE's ``longrope_factors``, now its training option
``factors``, is still read (flag, YAML key, keyword) with a warning, and a run saved with it resumes.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from accelerate import Accelerator

import hf_posext
from hf_posext import LinearConfig, Training, TrainingOption, register_method
from hf_posext.commands.finetune import build_parser, config_from_args
from hf_posext.method_names import ALIASES, METHODS
from hf_posext.methods import registry, training_for
from hf_posext.methods.training import TRAININGS, old_training_settings
from hf_posext.train.config import TrainConfig
from hf_posext.train.loop import train
from hf_posext.train.resume import RUN_CONFIG_STATE, as_trained, check_resume_config
from hf_posext.train.saved_state import list_checkpoints

from tests.helpers.finetune import record_forward_loss
from tests.train.test_mix import ORIGINAL_CONTEXT, make_assets, mixed

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclasses.dataclass(frozen=True)
class SidedConfig(LinearConfig):
    """Linear interpolation whose fine-tune pins a "side" per micro-batch (a stand-in for LongRoPE's factor sets)."""


class SidedTraining(Training):
    """Every hook of `Training`, recording what the recipe asked."""

    options = (TrainingOption("side", ("near", "far"), "near", help="which side", old_setting="sided_side"),)

    def __init__(self) -> None:
        self.active: list[object] = []  # the pins in force (a stack)

    def check_lengths(self, options, *, original_context, short_len):
        if short_len is not None and short_len > original_context // 2:
            raise ValueError(f"sided: short_seq_len={short_len} exceeds half the original context {original_context}")

    def pin_for(self, options, *, length, original_context):
        return ("far" if options["side"] == "far" or length > original_context else "near", length)

    @contextlib.contextmanager
    def pinned(self, model, pin):
        assert model is not None
        self.active.append(pin)
        try:
            yield
        finally:
            self.active.pop()

    def describe(self, options):
        return {"sided fine-tune": f"side {options['side']}"}


@pytest.fixture
def sided():
    """``sided_test`` registered for one test, the registry as it was afterwards."""
    tables = (METHODS, ALIASES, registry._SURGERY, TRAININGS, registry._FAMILIES)
    kept = [dict(table) for table in tables]
    training = SidedTraining()
    register_method("sided_test", SidedConfig, training=training)
    try:
        yield training
    finally:
        for table, before in zip(tables, kept):
            table.clear()
            table.update(before)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("method_training"))


def test_a_plugin_method_with_a_training_constraint_is_honoured(sided, assets, tmp_path, monkeypatch):
    """Pinned around each micro-batch's forward and backward, to the pin its length calls for; its card line."""
    assert training_for("sided_test") is sided and training_for("linear") is hf_posext.methods.NO_TRAINING
    backward_pins = []
    real_backward = Accelerator.backward

    def backward(self, loss, **kwargs):
        backward_pins.append(list(sided.active))
        return real_backward(self, loss, **kwargs)

    monkeypatch.setattr(Accelerator, "backward", backward)
    seen = record_forward_loss(monkeypatch, lambda model, ids, positions, pose, kw, loss: (pose, list(sided.active)))
    run = mixed(
        assets,
        tmp_path,
        method="sided_test",
        method_kwargs={"side": "near"},
        max_train_steps=1,
        warmup_steps=0,
        global_batch_size=4,
    )
    assert run.method_arguments == {} and run.training_options == {"side": "near"}
    result = train(run)
    long_pin, short_pin = ("far", run.factor * ORIGINAL_CONTEXT), ("near", 16)
    assert seen == [(True, [long_pin]), (False, [short_pin]), (True, [long_pin]), (False, [short_pin])]
    assert backward_pins == [[long_pin], [short_pin], [long_pin], [short_pin]]
    assert sided.active == []
    assert "side near" in (result.output_dir / "README.md").read_text()


def test_a_plugin_methods_length_constraint_refuses_the_run(sided, assets, tmp_path):
    with pytest.raises(ValueError, match=r"sided: short_seq_len=24 exceeds half the original context 32"):
        train(mixed(assets, tmp_path, method="sided_test", short_seq_len=24, max_train_steps=1, warmup_steps=0))
    assert not (tmp_path / "model").exists()
    mixed(assets, tmp_path, method="yarn", short_seq_len=24)  # the constraint is the method's alone


def test_a_plugin_methods_options_are_checked_and_its_old_setting_read(sided, assets, tmp_path):
    with pytest.raises(ValueError, match=r"--set side='middle': method sided_test's training option side is one of"):
        mixed(assets, tmp_path, method="sided_test", method_kwargs={"side": "middle"})
    assert old_training_settings()["sided_side"][0] == "sided_test"
    with pytest.warns(FutureWarning, match=r"sided_side is deprecated and goes in 0\.3\.0.*--set side=far"):
        run = mixed(assets, tmp_path, method="sided_test", sided_side="far")
    assert run.training_options == {"side": "far"}
    assert "--sided-side" in build_parser().format_help()


def test_longrope_is_the_only_built_in_method_with_training_options():
    with_options = {name: training_for(name).options for name in hf_posext.available_methods()}
    assert {name for name, options in with_options.items() if options} == {"longrope"}
    assert [(o.name, o.choices, o.default, o.old_setting) for o in with_options["longrope"]] == [
        ("factors", ("mixed", "long"), "mixed", "longrope_factors")
    ]


def test_a_training_option_that_clashes_with_a_config_argument_is_refused():
    class Clashing(Training):
        options = (TrainingOption("beta_fast", ("a", "b"), "a"),)

    @dataclasses.dataclass(frozen=True)
    class Yarnish(hf_posext.YarnConfig):
        pass

    with pytest.raises(ValueError, match=r"training option 'beta_fast' is also an argument of Yarnish"):
        register_method("yarnish_test", Yarnish, training=Clashing)
    assert "yarnish_test" not in hf_posext.available_methods()
    with pytest.raises(ValueError, match=r"training must be a Training"):
        register_method("yarnish_test", Yarnish, training=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"default 'c' is not one of"):
        TrainingOption("x", ("a", "b"), "c")


def test_the_old_longrope_factors_setting_is_an_alias_of_set_factors(assets, tmp_path):
    with pytest.warns(FutureWarning) as caught:
        old = mixed(assets, tmp_path, method="longrope", longrope_factors="long")
    assert len(caught) == 1, "warned once"
    new = mixed(assets, tmp_path, method="longrope", method_kwargs={"factors": "long"})
    assert old == new and old.training_options == {"factors": "long"}
    with pytest.warns(FutureWarning):  # at its default, for another method: ignored, as before
        assert mixed(assets, tmp_path, longrope_factors="mixed").method_kwargs == {}
    assert "longrope_factors" not in {f.name for f in dataclasses.fields(TrainConfig)}


def test_the_settings_of_a_run_saved_with_longrope_factors_compare_equal(assets, tmp_path):
    """A state saved before the rename holds ``longrope_factors`` (always: it had a default) and no option."""
    for choice, now in (("mixed", {}), ("mixed", {"factors": "mixed"}), ("long", {"factors": "long"})):
        current = mixed(assets, tmp_path, method="longrope", method_kwargs=now)
        saved = {**current.to_dict(), "method_kwargs": {}, "longrope_factors": choice}
        check_resume_config(saved, current)
        assert as_trained(saved)["method_kwargs"] == as_trained(current.to_dict())["method_kwargs"]
    other = mixed(assets, tmp_path, method="longrope", method_kwargs={"factors": "long"})
    with pytest.raises(ValueError, match=r"method_kwargs: \{'factors': 'mixed'\} -> \{'factors': 'long'\}"):
        check_resume_config({**other.to_dict(), "method_kwargs": {}, "longrope_factors": "mixed"}, other)
    yarn = mixed(assets, tmp_path)
    check_resume_config({**yarn.to_dict(), "longrope_factors": "mixed"}, yarn)


def test_a_run_saved_with_longrope_factors_resumes(assets, tmp_path):
    """A real state rewritten as the release before wrote it (``longrope_factors`` in its settings) resumes,
    with the old flag or the new option."""
    values = dict(method="longrope", max_train_steps=2, warmup_steps=0, checkpointing_steps=1, short_fraction=0.0)
    train(mixed(assets, tmp_path / "a", method_kwargs={"factors": "long"}, **values))
    (step, state), *_ = list_checkpoints(mixed(assets, tmp_path / "a", **values).checkpoint_path)
    assert step == 1
    file = state / f"custom_checkpoint_{RUN_CONFIG_STATE}.pkl"
    saved = torch.load(file, weights_only=True)
    assert saved["method_kwargs"] == {"factors": "long"}
    torch.save({**saved, "method_kwargs": {}, "longrope_factors": "long"}, file)
    with pytest.warns(FutureWarning):
        old_flag = config_from_args(
            ["--model", str(assets / "llama"), "--dataset", str(assets / "data.txt"), "--output-dir", str(tmp_path)]
            + ["--method", "longrope", "--longrope-factors", "long"]
        )
    assert old_flag.method_kwargs == {"factors": "long"}
    resumed = train(
        mixed(assets, tmp_path / "a", method_kwargs={"factors": "long"}, resume=str(state), overwrite=True, **values)
    )
    assert resumed.steps == 2 and len(resumed.losses) == 2
