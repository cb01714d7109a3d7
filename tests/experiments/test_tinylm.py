"""Tiny from-scratch pretraining: data split, config validation, caching and resume."""

from __future__ import annotations

import pytest
import torch

from hf_posext.experiments import tinylm
from hf_posext.data import stdlib_files
from hf_posext.experiments.tinylm import TinyLMConfig, pretrain, stdlib_corpus
from hf_posext.testing import BOS_ID

TINY = TinyLMConfig(
    seq_len=16, steps=4, batch_size=2, hidden_size=16, num_layers=1, num_heads=2, warmup_steps=1, max_train_bytes=50_000
)


pytestmark = pytest.mark.usefixtures("one_thread")


def test_stdlib_split_is_a_partition():
    train, test, everything = (set(stdlib_files(s)) for s in ("train", "test", "all"))
    assert train.isdisjoint(test) and train | test == everything
    assert 0.05 < len(test) / len(everything) < 0.15
    assert not any("site-packages" in p.parts for p in everything)


def test_corpus_is_bos_then_file_bytes():
    first = stdlib_files("train")[0]
    corpus = stdlib_corpus("train", max_bytes=first.stat().st_size)
    data = first.read_bytes()
    assert corpus[0] == BOS_ID and corpus.numel() == len(data) + 1
    assert bytes(corpus[1:].to(torch.uint8).tolist()) == data


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seq_len": 4}, "got 4"),
        ({"steps": 0}, "got 0"),
        ({"num_heads": 3}, "num_heads=3"),
        ({"passkey_fraction": 1.5}, "1.5"),
        ({"position": "rotary"}, "'rotary'"),
        ({"lr": -1.0}, "lr=-1.0"),
    ],
)
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TinyLMConfig(**kwargs)


def test_cache_key_follows_every_field():
    assert TinyLMConfig().key() == TinyLMConfig().key()
    assert len({TinyLMConfig(seed=1).key(), TinyLMConfig(seq_len=64).key(), TinyLMConfig().key()}) == 3


def test_interrupted_run_resumes_to_the_same_weights(tmp_path, monkeypatch):
    straight, _, info = pretrain(TINY, tmp_path / "a", progress=False, checkpoint_every=2)
    assert info["config"]["steps"] == 4 and info["final_loss"] < 5.6

    calls = {"n": 0}
    real_clip = torch.nn.utils.clip_grad_norm_

    def crash_on_third_step(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # a crash after the step-2 checkpoint
        return real_clip(*args, **kwargs)

    monkeypatch.setattr(tinylm.torch.nn.utils, "clip_grad_norm_", crash_on_third_step)
    with pytest.raises(KeyboardInterrupt):
        pretrain(TINY, tmp_path / "b", progress=False, checkpoint_every=2)
    monkeypatch.setattr(tinylm.torch.nn.utils, "clip_grad_norm_", real_clip)
    assert not any((tmp_path / "b").glob("tinylm-*/config.json"))
    resumed, _, _ = pretrain(TINY, tmp_path / "b", progress=False, checkpoint_every=2)
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_passkey_task_sequences_fit_and_end_with_the_answer():
    import random

    from hf_posext.eval.passkey import fit_filler
    from hf_posext.testing import PAD_ID, byte_tokenizer

    tok = byte_tokenizer()
    fillers = fit_filler(tok, 120, task="")
    for seed in range(5):
        seq, labels = tinylm._passkey_sequence(random.Random(seed), 128, tok, fillers)
        text = tok.decode([i for i in seq.tolist() if i != PAD_ID], skip_special_tokens=True)
        key = text.split("The pass key is ")[1].split(".")[0]
        assert seq.numel() == 128 and text.endswith(f"The pass key is {key}.")
        scored = [i for i in labels.tolist() if i != -100]
        assert tok.decode(scored) == f" {key}."  # only the answer is scored
