"""PoSE skip-wise position ids (hf_posext.train.pose) and the attention mask they need."""

from __future__ import annotations

import pytest
import torch

from hf_posext.train.pose import pose_position_ids
from tests.helpers.models import tiny_model


@pytest.mark.parametrize(("window", "target", "chunks"), [(16, 64, 2), (16, 16, 2), (32, 256, 4), (8, 100, 1)])
def test_pose_positions_follow_the_paper(window, target, chunks):
    generator = torch.Generator().manual_seed(0)
    positions = pose_position_ids(window, target, chunks, batch_size=64, generator=generator)
    assert positions.shape == (64, window)
    assert positions[:, 0].eq(0).all()  # u_0 = 0: the first chunk starts at position 0
    steps = positions.diff(dim=1)
    assert (steps >= 1).all() and (positions < target).all()
    jumps = (steps > 1).sum(dim=1)
    assert (jumps <= chunks - 1).all()  # contiguous content within a chunk, one skip between chunks
    if target > window and chunks > 1:
        assert positions.max() > 0.8 * target  # the skips do reach the far end of the target context


def test_pose_rejects_a_window_longer_than_the_target():
    with pytest.raises(ValueError, match="window 65 exceeds the target context 64"):
        pose_position_ids(65, 64)


def test_skipped_positions_need_the_explicit_attention_mask():
    """Without a mask transformers reads a position jump as a new packed document (pose.py).

    It does so only without a KV cache, i.e. in training, hence ``use_cache=False`` as in the loop.
    """
    model = tiny_model("llama", max_positions=256)
    input_ids = torch.randint(0, 90, (1, 24), generator=torch.Generator().manual_seed(0))
    positions = torch.cat([torch.arange(12), torch.arange(12) + 100]).unsqueeze(0)
    other = input_ids.clone()
    other[0, :12] = (other[0, :12] + 1) % 90  # change only the first chunk
    with torch.no_grad():
        mask = torch.ones_like(input_ids)
        masked = model(input_ids, position_ids=positions, attention_mask=mask, use_cache=False).logits
        masked_other = model(other, position_ids=positions, attention_mask=mask, use_cache=False).logits
        unmasked = model(input_ids, position_ids=positions, use_cache=False).logits
        unmasked_other = model(other, position_ids=positions, use_cache=False).logits
    # With the mask the second chunk attends to the first; without it, it does not.
    assert not torch.allclose(masked[0, 12:], masked_other[0, 12:])
    assert torch.equal(unmasked[0, 12:], unmasked_other[0, 12:])
