"""Sequence parallelism (DeepSpeed Ulysses) for every method family: 2 processes on gloo against 1.

Each family's patched tiny model gets DeepSpeed's Ulysses attention the way accelerate installs it
(``UlyssesSPAttentionHF.register_with_transformers`` with the model's own attention name); each
process scores its slice of the sequence through the recipe's ``forward_loss`` (its
``sequence_parallel`` path). Logits, the loss and the gradients averaged over the processes (as
DeepSpeed reduces them) equal one process's full forward and backward within 1e-5. The refusals of
what cannot work run in-process. Needs ``pip install "hf-posext[deepspeed]"``; skipped without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hf_posext.attention.head_sharding import held_heads, shard_heads
from hf_posext.testing import make_tiny_model
from hf_posext.train.config import TrainConfig
from hf_posext.train.sequence_parallel import check_sequence_parallel

TORCHRUN = shutil.which("torchrun", path=os.path.dirname(sys.executable))

DRIVER = """
import contextlib, json, sys, traceback
import torch, torch.distributed as dist
dist.init_process_group("gloo")
import deepspeed
deepspeed.init_distributed(dist_backend="gloo")
import deepspeed.runtime.sequence_parallel.parallel_state_sp as mpu
from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
from transformers import AutoModelForCausalLM
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from hf_posext import patch_model
from hf_posext.attention.head_sharding import shard_heads
from hf_posext.methods.longrope import pinned_factors
from hf_posext.train.sequence_parallel import shard_sequence
from hf_posext.train.steps import forward_loss

model_dir, out, families = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
rank, world = dist.get_rank(), dist.get_world_size()
B, L = 2, 48  # past the 32-token original context: every method's scaling or remapping acts
ids = torch.randint(0, 200, (B, L), generator=torch.Generator().manual_seed(0))
positions = torch.arange(L)[None]
results = {}

def run(model, ids, positions, sp=None):
    model.zero_grad()
    logits = model(input_ids=ids if sp is None else shard_sequence(ids, *sp[:2]),
                   position_ids=positions if sp is None else shard_sequence(positions, *sp[:2]),
                   use_cache=False).logits.detach()
    loss = forward_loss(model, ids, positions, loss_chunk_size=16, sequence_parallel=sp)
    loss.backward()
    return logits, loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

for name, (method, kwargs) in families.items():
    try:
        torch.manual_seed(0)  # a new position table (learned) is the same on both processes
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
        patch_model(model, method, **kwargs)
        model.train()
        ref_logits, ref_loss, ref_grads = run(model, ids, positions)
        impl = model.config._attn_implementation
        original = ALL_ATTENTION_FUNCTIONS[impl]
        mpu._SEQUENCE_PARALLEL_GROUP = mpu._SEQUENCE_DATA_PARALLEL_GROUP = None  # one registration per family
        UlyssesSPAttentionHF.register_with_transformers(  # the arguments accelerate's prepare passes
            model_name_or_path=model, core_attn_implementation=impl, sequence_parallel_size=world,
            seq_length=L, seq_length_is_variable=False, micro_batch_size=B)
        shard_heads(model, rank, world)
        # LongRoPE picks its factor set by the sequence's length, which a process holding a slice does not see: the
        # recipe pins the set the whole sequence takes on every micro-batch (train/loop.py), and so does this run
        sequence_set = pinned_factors(model, "long") if method == "longrope" else contextlib.nullcontext()
        try:
            with sequence_set:
                logits, loss, grads = run(model, ids, positions, (rank, world, mpu.get_sequence_parallel_group()))
        finally:
            ALL_ATTENTION_FUNCTIONS[impl] = original
        gathered = [torch.empty_like(logits) for _ in range(world)]
        dist.all_gather(gathered, logits)
        for grad in grads.values():
            dist.all_reduce(grad)
            grad /= world
        results[name] = {
            "attention": impl,
            "logits": float((torch.cat(gathered, dim=1) - ref_logits).abs().max()),
            "loss": float((loss - ref_loss).abs()),
            "grads": max(float((grads[n] - g).abs().max()) for n, g in ref_grads.items()),
            "same_parameters": sorted(grads) == sorted(ref_grads),
        }
    except Exception:
        results[name] = {"error": traceback.format_exc()[-2000:]}
if rank == 0:
    json.dump(results, open(out, "w"), indent=1)
"""

#: One run per family (settings that act within 48 tokens); the first of each kind run in every CI lane.
FAMILIES = {
    "yarn": ["yarn", {"factor": 2}],
    "dynamic_yarn": ["dynamic_yarn", {"factor": 2}],
    "alibi": ["alibi", {}],
    "sinusoidal": ["sinusoidal", {}],
    "self_extend": ["self_extend", {"group_size": 2, "window_size": 4}],
}
MORE_FAMILIES = {
    "linear": ["linear", {"factor": 2}],
    "ntk": ["ntk", {"factor": 2}],
    "longrope": ["longrope", {"factor": 2}],
    "dynamic_ntk": ["dynamic_ntk", {"factor": 2}],
    "alibi_folded": ["alibi", {"backend": "folded"}],
    "alibi_eager": ["alibi", {"backend": "eager"}],
    "learned": ["learned", {"max_length": 64}],
    "dca": ["dca", {"factor": 2, "chunk_size": 8, "local_size": 2}],
    "string": ["string", {"factor": 2, "shift": 6, "local_window": 2}],
    "rerope": ["rerope", {"factor": 2, "window": 4}],
}

needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None or TORCHRUN is None,
    reason='needs deepspeed (pip install "hf-posext[deepspeed]") and torchrun',
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sp")
    return make_tiny_model(root / "llama", hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=32)


def launch(model_dir: Path, families: dict) -> dict:
    out = model_dir.parent / f"results-{len(families)}.json"
    (model_dir.parent / "driver.py").write_text(DRIVER)
    command = [TORCHRUN, "--standalone", "--nproc_per_node", "2", str(model_dir.parent / "driver.py")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*command, str(model_dir), str(out), json.dumps(families)], capture_output=True, text=True, env=env, timeout=540
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def check(name: str, result: dict) -> None:
    assert "error" not in result, f"{name}: {result.get('error')}"
    assert result["same_parameters"], name
    assert result["logits"] <= 1e-5 and result["loss"] <= 1e-5 and result["grads"] <= 1e-5, (name, result)


@pytest.fixture(scope="module")
def families(model_dir):
    return launch(model_dir, FAMILIES)


@needs_deepspeed
@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_family_under_ulysses_equals_one_process(families, name):
    """ALiBi failed (its mask dropped, the slopes of 2 heads for the 2 it holds) before the head shards."""
    check(name, families[name])


@needs_deepspeed
@pytest.mark.slow
def test_every_other_method_under_ulysses_equals_one_process(model_dir):
    results = launch(model_dir, MORE_FAMILIES)
    assert results.keys() == MORE_FAMILIES.keys()
    for name, result in results.items():
        check(name, result)


def recipe_config(**overrides) -> TrainConfig:
    values = dict(model="m", dataset=["d"], output_dir="o", method="yarn", factor=2, attn_implementation="sdpa")
    return TrainConfig(**{**values, **overrides})


@pytest.mark.parametrize(
    "overrides, sp_size, window, refused",
    [
        (dict(method="dynamic_ntk", method_kwargs={"exact_cache": False}), 2, 64, "exact_cache=False under sp_size"),
        (dict(attn_implementation="eager"), 2, 64, "the eager kernel without one is not causal"),
        (dict(short_fraction=0.5), 2, 64, "packed short documents are kept apart by the attention mask"),
        (dict(packing=True), 2, 64, "packing with sp_size > 1: packed documents are kept apart"),
        (dict(eval_blocks=2), 2, 64, "eval_blocks=2 with sp_size > 1"),
        ({}, 3, 63, "sp_size=3 must divide the 4 attention heads"),
        ({}, 2, 63, "must divide the 63-token training sequence"),
    ],
    ids=["native-dynamic", "eager", "short-mix", "packing", "eval", "heads", "window"],
)
def test_what_sequence_parallelism_cannot_run_is_refused_by_name(model_dir, overrides, sp_size, window, refused):
    from transformers import AutoConfig

    model = type("Model", (), {"config": AutoConfig.from_pretrained(model_dir)})()
    with pytest.raises(ValueError, match=refused):
        check_sequence_parallel(recipe_config(**overrides), model, sp_size, window)
    check_sequence_parallel(recipe_config(), model, 2, 64)


def test_split_heads_without_their_shard_are_refused():
    from tests.helpers.models import tiny_model

    model = tiny_model(heads=4, kv_heads=2)
    attention = model.model.layers[0].self_attn
    assert held_heads(attention, 4) == (0, 4)
    with pytest.raises(ValueError, match="attends over 2 of its 4 heads.*shard_heads"):
        held_heads(attention, 2)
    shard_heads(model, 1, 2)
    assert held_heads(attention, 2) == (2, 4)


def test_the_recipe_hands_accelerate_the_patched_attention_and_the_window(model_dir):
    """What accelerate's prepare passes to register_with_transformers comes from the patched model."""
    from types import SimpleNamespace

    from accelerate import ParallelismConfig

    from hf_posext import patch_model
    from hf_posext.train.sequence_parallel import setup_sequence_parallel
    from tests.helpers.models import tiny_model

    model = patch_model(tiny_model(heads=4, kv_heads=2, attn_implementation="sdpa"), "self_extend", group_size=2)
    accelerator = SimpleNamespace(
        parallelism_config=ParallelismConfig(sp_backend="deepspeed", sp_size=2), process_index=3
    )
    assert setup_sequence_parallel(accelerator, model, 64) == (1, 2)  # ranks 2 and 3 share a sequence
    handler = accelerator.parallelism_config.sp_handler
    assert handler.sp_attn_implementation == model.config._attn_implementation != "sdpa"
    assert (handler.sp_seq_length, handler.sp_seq_length_is_variable) == (64, False)
    assert held_heads(model.model.layers[1].self_attn, 2) == (2, 4)
