"""The one object an attention call's arguments travel in (:class:`hf_posext.attention.inputs.AttentionInputs`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from hf_posext.attention.inputs import AttentionInputs


def test_the_fields_are_the_attention_call_in_order_and_cannot_be_changed():
    module, query, key, value = nn.Module(), torch.zeros(2, 6, 3, 8), torch.zeros(2, 2, 5, 8), torch.ones(2, 2, 5, 8)
    mask, kwargs = torch.ones(2, 1, 3, 5, dtype=torch.bool), {"scaling": 0.5}
    inputs = AttentionInputs(module, query, key, value, mask, kwargs)  # fn(module, query, key, value, mask, **kwargs)
    held = [getattr(inputs, field.name) for field in dataclasses.fields(inputs)]
    assert all(a is b for a, b in zip(held, (module, query, key, value, mask, kwargs), strict=True))
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.query = key  # type: ignore[misc]
