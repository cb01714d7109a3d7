"""ALiBi's flex backend when inductor cannot compile flex_attention (issue 24, item 9).

PyTorch 2.13's CPU flex-decoding template does not compile for a left-padded batch's decoding
steps; the backend then runs flex_attention uncompiled (same maths) and says so once.
"""

from __future__ import annotations

import logging

import pytest
import torch
from tests.helpers.models import tiny_model, tokens
from torch._dynamo.exc import BackendCompilerFailed
from torch._inductor.exc import InductorError

import hf_posext
from hf_posext.methods.alibi import attention as alibi_module


def padded_generate(backend):
    model = hf_posext.patch_model(tiny_model(heads=4, kv_heads=2), "alibi", backend=backend)
    model.generation_config.eos_token_id = None
    ids = tokens(12, batch=2)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, :5] = False
    return model.generate(
        ids.masked_fill(~mask, 0), attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0
    )


@pytest.fixture
def fresh_flex(monkeypatch):
    monkeypatch.setattr(alibi_module, "FLEX_COMPILE", True)
    monkeypatch.setattr(alibi_module, "_FLEX_COMPILE_FAILED", set(), raising=False)


def test_a_flex_compile_failure_falls_back_to_uncompiled_flex_once(fresh_flex, monkeypatch, caplog):
    calls = []

    def failing_compiled(*args, **kwargs):
        calls.append(1)
        error = InductorError(RuntimeError("CppCompileError: 'cur_kvSplitSize0' was not declared"), None)
        raise BackendCompilerFailed(failing_compiled, error, None)

    monkeypatch.setattr(alibi_module, "_compiled_flex", failing_compiled)
    with caplog.at_level(logging.WARNING, logger="hf_posext"):
        got = padded_generate("flex")
    assert torch.equal(got, padded_generate("sdpa"))
    assert len(calls) == 1  # one failure, then uncompiled for the rest of the process on this device type
    warnings = [r.getMessage() for r in caplog.records if "could not compile flex_attention" in r.getMessage()]
    assert len(warnings) == 1 and torch.__version__ in warnings[0] and "backend='sdpa'" in warnings[0]


@pytest.mark.slow
def test_compiled_flex_left_padded_generate_on_cpu(fresh_flex):
    """The real failure (about a minute of compiling): the result equals the sdpa backend's."""
    assert torch.equal(padded_generate("flex"), padded_generate("sdpa"))
