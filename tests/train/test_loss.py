"""The chunked LM-head loss equals the plain one: loss, hidden-state and weight gradients (fp32).

The reference is transformers itself: the model called with ``labels``/``shift_labels`` (its
``ForCausalLMLoss`` on full logits), or ``F.cross_entropy`` on full logits for the bare function.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.distributed as dist
from tests.helpers.models import tiny_model, tokens
from peft import LoraConfig, get_peft_model
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import Gemma2Config, Gemma2ForCausalLM, GraniteConfig, GraniteForCausalLM

from tests.helpers.finetune import train_config
from hf_posext.train.loop import train
from hf_posext.train.loss import IGNORE_INDEX, causal_lm_loss, chunked_head_loss

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = dict(rtol=1e-5, atol=1e-6)


def shifted(input_ids: torch.Tensor, ignore_every: int = 0) -> torch.Tensor:
    labels = torch.nn.functional.pad(input_ids[:, 1:], (0, 1), value=IGNORE_INDEX)
    if ignore_every:
        labels[:, ::ignore_every] = IGNORE_INDEX
    return labels


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("chunk_size", [1, 3, 7, 40, 10_000])
@pytest.mark.parametrize("softcap", [None, 0.7])
def test_chunked_head_loss_equals_full_logits(chunk_size, softcap, recompute):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=True)
    hidden = torch.randn(2, 20, 16, requires_grad=True)
    labels = torch.randint(0, 50, (2, 20))
    labels[0, :5] = IGNORE_INDEX
    labels[1, -1] = IGNORE_INDEX

    loss = chunked_head_loss(head, hidden, labels, chunk_size, softcap=softcap, recompute=recompute)
    (3 * loss).backward()  # an incoming gradient other than 1 (a loss scale) must scale them all
    got = loss.detach(), hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()
    hidden.grad, head.weight.grad, head.bias.grad = None, None, None

    logits = head(hidden)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    want = torch.nn.functional.cross_entropy(logits.float().reshape(-1, 50), labels.reshape(-1))
    (3 * want).backward()
    torch.testing.assert_close(got[0], want.detach(), **TOL)
    torch.testing.assert_close(got[1], hidden.grad, **TOL)
    torch.testing.assert_close(got[2], head.weight.grad, **TOL)
    torch.testing.assert_close(got[3], head.bias.grad, **TOL)


def test_without_gradients_it_is_the_same_loss():
    head = torch.nn.Linear(16, 50)
    hidden, labels = torch.randn(1, 30, 16), torch.randint(0, 50, (1, 30))
    with torch.no_grad():
        got = chunked_head_loss(head, hidden, labels, 7)
        want = torch.nn.functional.cross_entropy(head(hidden).reshape(-1, 50), labels.reshape(-1))
    torch.testing.assert_close(got, want, **TOL)


def test_a_diverged_model_gives_a_nan_loss_not_a_wrong_head_error():
    """NaN logits are not "a transform the chunked loss does not know": the loss is NaN and the recipe says so."""
    model = tiny_model("llama")
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))
    ids = tokens(24)
    labels = torch.nn.functional.pad(ids[:, 1:], (0, 1), value=IGNORE_INDEX)
    loss = causal_lm_loss(model, ids, torch.arange(24)[None], labels, 8)
    assert torch.isnan(loss)


@pytest.mark.parametrize("recompute", [False, True])
def test_chunked_head_loss_keeps_no_logits_for_the_backward(recompute):
    """Once the forward returns, no tensor the graph saved has the vocabulary's width."""
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(1, 30, 16, requires_grad=True)
    labels = torch.zeros(1, 30, dtype=torch.long)

    def kept_for_backward(loss_fn) -> list[torch.Size]:
        saved: list[weakref.ref] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(weakref.ref(t)) or t, lambda t: t):
            loss = loss_fn()
        gc.collect()
        kept = [ref().shape for ref in saved if ref() is not None]
        del loss
        return kept

    # The plain loss keeps its logits: the check sees them, so it would see the chunked loss's.
    plain = kept_for_backward(lambda: torch.nn.functional.cross_entropy(head(hidden)[0], labels[0]))
    assert any(len(shape) and shape[-1] == 50 for shape in plain), plain
    chunked = kept_for_backward(lambda: chunked_head_loss(head, hidden, labels, chunk_size=8, recompute=recompute))
    assert all(len(shape) == 0 or shape[-1] != 50 for shape in chunked), chunked


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def model_loss(model, input_ids, position_ids, labels, chunk_size=None, **kwargs) -> torch.Tensor:
    """The chunked loss, or (``chunk_size=None``) the model's own loss, as the recipe calls them."""
    if chunk_size:
        return causal_lm_loss(model, input_ids, position_ids, labels, chunk_size, **kwargs)
    return model(
        input_ids=input_ids, position_ids=position_ids, labels=labels, shift_labels=labels, use_cache=False, **kwargs
    ).loss


def assert_same_loss_and_grads(model, input_ids, position_ids, labels, chunk_size, **kwargs):
    want = model_loss(model, input_ids, position_ids, labels, **kwargs)
    want.backward()
    want_grads = grads(model)
    model.zero_grad(set_to_none=True)
    got = model_loss(model, input_ids, position_ids, labels, chunk_size, **kwargs)
    got.backward()
    got_grads = grads(model)
    torch.testing.assert_close(got.detach(), want.detach(), **TOL)
    assert got_grads.keys() == want_grads.keys() and want_grads
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("chunk_size", [5, 64])
def test_model_loss_and_gradients_equal_the_models_own(tied, chunk_size):
    model = tiny_model("llama", layers=2, tie_word_embeddings=tied).train()
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    input_ids = tokens(37, batch=2)
    labels = shifted(input_ids, ignore_every=4)
    positions = torch.arange(37).unsqueeze(0)
    assert_same_loss_and_grads(model, input_ids, positions, labels, chunk_size)


def test_under_bf16_autocast_it_differs_from_the_plain_loss_less_than_bf16_itself_does():
    model = tiny_model("llama", layers=2).train()
    input_ids = tokens(37, batch=2)
    labels, positions = shifted(input_ids, ignore_every=4), torch.arange(37).unsqueeze(0)

    def run(chunked: bool, autocast: bool):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model_loss(model, input_ids, positions, labels, chunk_size=5 if chunked else None)
        loss.backward()
        return loss.detach(), grads(model)

    fp32_loss, fp32_grads = run(chunked=False, autocast=False)
    plain_loss, plain_grads = run(chunked=False, autocast=True)
    got_loss, got_grads = run(chunked=True, autocast=True)
    for name, want in plain_grads.items():
        assert got_grads[name].dtype == torch.float32
        bf16_error = (want - fp32_grads[name]).abs().max()
        assert (got_grads[name] - want).abs().max() <= bf16_error, name
    assert (got_loss - plain_loss).abs() <= (plain_loss - fp32_loss).abs() + 1e-6


def test_pose_positions_and_attention_mask_pass_through():
    """PoSE's skipped positions and all-ones mask reach the model unchanged."""
    model = tiny_model("qwen3", layers=2).train()
    input_ids = tokens(24, batch=2)
    positions = torch.cat([torch.arange(12), torch.arange(40, 52)]).expand(2, -1)
    assert_same_loss_and_grads(
        model, input_ids, positions, shifted(input_ids), 7, attention_mask=torch.ones_like(input_ids)
    )


def test_peft_lora_model_including_an_adapted_head():
    model = tiny_model("llama", layers=2)
    model = get_peft_model(
        model,
        LoraConfig(
            r=4,
            lora_alpha=8,
            target_modules=["q_proj", "v_proj", "lm_head"],
            modules_to_save=["embed_tokens"],
            init_lora_weights=False,
        ),
    ).train()
    input_ids = tokens(20, batch=1)
    assert_same_loss_and_grads(model, input_ids, torch.arange(20).unsqueeze(0), shifted(input_ids, 3), 6)


@pytest.mark.parametrize("tied", [False, True])
def test_under_fsdp2_sharding(tmp_path, tied):
    """FSDP2 as accelerate applies it (each decoder layer, then the root), one CPU process (gloo):
    the head's parameters are the root's, gathered by the model's forward, not by ours."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        input_ids = tokens(33, batch=2)
        labels, positions = shifted(input_ids, ignore_every=5), torch.arange(33).unsqueeze(0)
        results = []
        for chunked in (False, True):
            model = tiny_model("llama", tie_word_embeddings=tied).train()
            model.activation_checkpointing_enable()
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            loss = model_loss(model, input_ids, positions, labels, chunk_size=5 if chunked else None)
            loss.backward()
            results.append((loss.detach(), {n: p.grad.full_tensor() for n, p in model.named_parameters()}))
        (want, want_grads), (got, got_grads) = results
        assert type(model).__name__.startswith("FSDP")
        torch.testing.assert_close(got, want, **TOL)
        for name in want_grads:
            torch.testing.assert_close(got_grads[name], want_grads[name], **TOL)
    finally:
        dist.destroy_process_group()


def test_final_logit_softcapping_is_applied_per_chunk():
    config = Gemma2Config(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        final_logit_softcapping=0.5,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(config).train()
    input_ids = tokens(18, batch=2)
    assert_same_loss_and_grads(model, input_ids, torch.arange(18).unsqueeze(0), shifted(input_ids, 5), 4)


def test_unknown_logit_transform_is_refused():
    """Granite divides its logits by ``logits_scaling``: the chunked loss would differ, so it refuses."""
    config = GraniteConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        logits_scaling=8.0,
    )
    torch.manual_seed(0)
    model = GraniteForCausalLM(config)
    input_ids = tokens(10)
    with pytest.raises(ValueError, match="loss_chunk_size=0"):
        causal_lm_loss(model, input_ids, torch.arange(10).unsqueeze(0), shifted(input_ids), 4)


@pytest.mark.parametrize("chunk_size", [0, -3, 2.5, True])
def test_bad_chunk_size_is_refused(chunk_size):
    with pytest.raises(ValueError, match=f"chunk_size must be an integer >= 1, got {chunk_size!r}"):
        chunked_head_loss(torch.nn.Linear(4, 5), torch.randn(1, 3, 4), torch.zeros(1, 3, dtype=torch.long), chunk_size)


def test_labels_that_do_not_match_are_refused():
    with pytest.raises(ValueError, match=r"shift_labels \(1, 2\) do not match the hidden states \(1, 3, 4\)"):
        chunked_head_loss(torch.nn.Linear(4, 5), torch.randn(1, 3, 4), torch.zeros(1, 2, dtype=torch.long), 2)


@pytest.mark.parametrize("pose", [False, True])
def test_recipe_steps_with_and_without_the_chunked_loss_agree(finetune_assets, tmp_path, pose):
    extra = dict(pose=True, factor=4, pose_window=32) if pose else {}
    plain = train(train_config(finetune_assets, tmp_path / "plain", loss_chunk_size=0, **extra))
    chunked = train(train_config(finetune_assets, tmp_path / "chunked", loss_chunk_size=7, **extra))
    torch.testing.assert_close(torch.tensor(chunked.losses), torch.tensor(plain.losses), **TOL)
    want, got = plain.model.state_dict(), chunked.model.state_dict()
    for name in want:
        torch.testing.assert_close(got[name], want[name], **TOL)


def test_recipe_in_bf16_autocast_trains_with_the_chunked_loss(finetune_assets, tmp_path):
    """The chunked head runs under the forward's autocast (it was fp32 and refused the bf16 logits)."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        fp32 = train(train_config(finetune_assets, tmp_path / "fp32", loss_chunk_size=7))
        AcceleratorState._reset_state(reset_partial_state=True)
        plain = train(train_config(finetune_assets, tmp_path / "plain", loss_chunk_size=0, mixed_precision="bf16"))
        AcceleratorState._reset_state(reset_partial_state=True)
        chunked = train(train_config(finetune_assets, tmp_path / "chunked", loss_chunk_size=7, mixed_precision="bf16"))
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    bf16_error = (torch.tensor(plain.losses) - torch.tensor(fp32.losses)).abs().max()
    assert (torch.tensor(chunked.losses) - torch.tensor(plain.losses)).abs().max() <= bf16_error + 1e-3
    assert (torch.tensor(chunked.losses) - torch.tensor(fp32.losses)).abs().max() / fp32.losses[0] < 0.02


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"loss_chunk_size": -1}, "loss_chunk_size must be an integer >= 0, got -1"),
        ({"activation_offload": True, "activation_checkpointing": False}, "needs activation_checkpointing=True"),
    ],
)
def test_bad_memory_settings_are_refused(finetune_assets, tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        train_config(finetune_assets, tmp_path, **overrides)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for CPU training")
def test_activation_offload_is_refused_on_cpu(finetune_assets, tmp_path):
    with pytest.raises(ValueError, match="activation_offload moves checkpointed activations"):
        train(train_config(finetune_assets, tmp_path / "out", activation_offload=True))
    assert not (tmp_path / "out").exists()
