"""LongRoPE2's mixed-window training in the recipe: each micro-batch's LongRoPE factor set.

What it promises (LongRoPE's training option ``factors``, ``--set factors=...``; ``longrope_factors``
before): ``mixed`` trains a micro-batch that stands for a sequence
within the original context (the short side of the long/short mix, a window no longer than it)
with the short factors and every other one (PoSE samples whatever their largest position) with
the long factors at every position; ``long`` trains every micro-batch with the long factors. The
proof: the rotary frequencies each micro-batch of a real run used are the expected set, and its
loss is the loss of the same weights patched with only that set (nothing to switch).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from hf_posext import integration, patch_model
from hf_posext.attention.exact_dynamic import ExactDynamicRope
from hf_posext.rope_utils import default_inv_freq
from hf_posext.train import steps
from hf_posext.train.loop import train
from hf_posext.train.micro_batches import MicroBatches
from hf_posext.train.plan import Plan
from hf_posext.train.schedule import WindowSchedule

from tests.helpers.finetune import record_forward_loss
from tests.train.test_mix import ORIGINAL_CONTEXT, make_assets, mixed

pytestmark = pytest.mark.usefixtures("one_thread")

SHARPEN = 8.0


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """test_mix's assets, the model's q/k sharpened: random weights attend nearly uniformly, which hides positions."""
    root = make_assets(tmp_path_factory.mktemp("micro_batches"))
    model = AutoModelForCausalLM.from_pretrained(root / "llama", dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(SHARPEN)
    model.save_pretrained(root / "llama")
    return root


def expected_inv_freq(rope_parameters: dict, factors: str) -> torch.Tensor:
    """transformers' longrope frequencies written out: plain RoPE's divided by each pair's factor."""
    divisors = torch.tensor(rope_parameters[f"{factors}_factor"], dtype=torch.float32)
    return default_inv_freq(float(rope_parameters["rope_theta"]), 2 * len(divisors)) / divisors


def only(assets, rope_parameters: dict, factors: str):
    """The base checkpoint patched with only the ``factors`` set (both lists equal: nothing switches)."""
    model = AutoModelForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32, attn_implementation="sdpa")
    chosen = list(rope_parameters[f"{factors}_factor"])
    return patch_model(
        model,
        "longrope",
        factor=rope_parameters["factor"],
        short_factor=chosen,
        long_factor=chosen,
        attention_factor=rope_parameters["attention_factor"],
    )


@pytest.mark.parametrize(
    ("choice", "method_kwargs", "checkpointing", "lora"),
    [
        ("mixed", {}, False, False),
        ("mixed", {}, True, False),
        ("mixed", {}, False, True),
        ("mixed", {"exact_cache": False}, False, False),
        ("mixed", {"factors_by": "query"}, False, False),
        ("mixed", {"factors_by": "query"}, True, False),
        ("long", {}, False, False),
        ("long", {"factors_by": "query"}, False, False),
    ],
    ids=[
        "mixed",
        "mixed-checkpointing",
        "mixed-lora",
        "mixed-no-exact-cache",
        "mixed-query",
        "mixed-query-checkpointing",
        "long",
        "long-query",
    ],
)
def test_each_micro_batch_trains_its_factor_set(
    assets, tmp_path, monkeypatch, choice, method_kwargs, checkpointing, lora
):
    """The first step's micro-batches all see the initial weights (LoRA's B starts at 0): the references' own.

    transformers' own rotary module rotates the default (``factors_by="sequence"``, with or without the
    exact cache's switch hooks); the exact dynamic rope plans ``factors_by="query"``.
    """
    by_query = method_kwargs.get("factors_by") == "query"
    plans = []
    real_plan = ExactDynamicRope.plan

    def planning(self, position_ids, batch):
        plan = real_plan(self, position_ids, batch)
        plans.append(plan)
        return plan

    def entry(model, input_ids, position_ids, pose, kwargs, loss):
        if by_query:
            assert {id(plan) for plan in plans} == {id(plans[0])}, "one plan for the forward"
            (plan,) = plans[:1]
            assert plan.rowwise is None and len(plan.calls) == 1, "one frequency set for every row"
            used = plan.calls[0].inv_freq
        else:
            used = next(rotary for _, rotary in integration.rotary_modules(model)).inv_freq
        return input_ids, position_ids, pose, kwargs.get("shift_labels"), loss.detach(), used.clone()

    monkeypatch.setattr(ExactDynamicRope, "plan", planning)
    seen = record_forward_loss(monkeypatch, entry, before=plans.clear)
    run = mixed(
        assets,
        tmp_path,
        method="longrope",
        method_kwargs={**method_kwargs, "factors": choice},
        max_train_steps=1,
        warmup_steps=0,
        global_batch_size=4,
        activation_checkpointing=checkpointing,
        lora=lora,
    )
    result = train(run)
    card = (result.output_dir / "README.md").read_text()
    assert ("(LongRoPE2)" if choice == "mixed" else "long factors on every sequence") in card
    params = result.model.config.rope_parameters
    assert params["short_factor"] != params["long_factor"]
    assert [pose for _, _, pose, _, _, _ in seen] == [True, False, True, False], "long, short, long, short"
    assert any(int(positions.min()) < ORIGINAL_CONTEXT for positions, *_ in seen[::2]), "long rows straddle L_orig"
    references = {}
    for input_ids, positions, pose, labels, loss, used in seen:
        factors = "short" if choice == "mixed" and not pose else "long"
        torch.testing.assert_close(used.flatten(), expected_inv_freq(params, factors), rtol=1e-6, atol=0)
        for name in ("short", "long"):
            references.setdefault(name, only(assets, params, name))
        want, other = (
            steps.forward_loss(references[name], input_ids, positions, pose=pose, shift_labels=labels).detach()
            for name in (factors, "long" if factors == "short" else "short")
        )
        torch.testing.assert_close(loss, want, rtol=0, atol=2e-6)
        assert abs(float(loss - other)) > 1e-4, "the other set's loss is told apart: the check can fail"


def test_a_window_within_the_original_context_is_a_short_sequence(assets, tmp_path):
    """Without PoSE a micro-batch is the sequence it holds: a scheduled window up to L_orig trains the short set."""
    run = mixed(
        assets,
        tmp_path,
        method="longrope",
        pose=False,
        seq_len=128,
        short_fraction=0.0,
        window_schedule="step",
        window_start=16,
        window_ramp_steps=3,
        max_train_steps=4,
    )
    schedule = WindowSchedule("step", 16, 128, 3)
    plan = Plan(ORIGINAL_CONTEXT, 128, 128, 128, 16, accumulation=2, dp_size=1, dp_rank=0, schedule=schedule)
    source = MicroBatches(run, plan, np.zeros((8, 128), dtype=np.int64), None, "cpu")
    got = [(source.next(step, 2 * step).input_ids.shape[1], source.pin_for(plan.window_at(step))) for step in range(4)]
    assert got == [(16, "short"), (32, "short"), (64, "long"), (128, "long")]


def test_no_factor_set_for_other_methods(assets, tmp_path):
    run = mixed(assets, tmp_path)  # yarn
    plan = Plan(ORIGINAL_CONTEXT, 128, 128, 32, 16, accumulation=2, dp_size=1, dp_rank=0)
    source = MicroBatches(run, plan, np.zeros((8, 32), dtype=np.int64), np.ones((8, 2, 16), dtype=np.int32), "cpu")
    assert {source.next(0, k).pin for k in range(4)} == {None}


def test_short_documents_past_the_original_context_are_refused_for_mixed_training(assets, tmp_path):
    with pytest.raises(ValueError, match=r"short_seq_len=48 would train longer documents.*short_seq_len <= 32"):
        train(mixed(assets, tmp_path, method="longrope", short_seq_len=48))
    assert not (tmp_path / "model").exists()


def test_long_factors_for_a_method_without_them_is_refused(assets, tmp_path):
    with pytest.raises(ValueError, match=r"method 'yarn' does not take \['factors'\]"):
        mixed(assets, tmp_path, method_kwargs={"factors": "long"})
    with (
        pytest.warns(FutureWarning),
        pytest.raises(
            ValueError,
            match=r"longrope_factors='long' is method longrope's.*"
            r"method 'yarn' has none",
        ),
    ):
        mixed(assets, tmp_path, longrope_factors="long")
