"""Shared test setup. Helpers live in the package tests/helpers/ (``from tests.helpers.models import ...``)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.helpers.finetune import write_finetune_assets
from tests.helpers.models import single_thread

# Under pytest-xdist (`-n auto`: one worker per core) each worker gets its share of the cores: workers
# each running torch's default (all cores) would contend for them, which on a small CPU makes matmuls
# many times slower than one thread each.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


@pytest.fixture
def one_thread():
    """Opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``; see models.single_thread."""
    with single_thread():
        yield


@pytest.fixture(scope="module")
def finetune_assets(tmp_path_factory):
    """The tiny fine-tune's model and text (tests/helpers/finetune.py), written once per test module."""
    return write_finetune_assets(tmp_path_factory.mktemp("finetune"))


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    """Each test starts without accelerate's process-wide state, as a new process would.

    ``Accelerator()`` refuses a second precision in one process; the recipe's ``auto`` precision is
    bf16 on CPUs with bf16 instructions and fp32 elsewhere, so tests would otherwise depend on order.
    """
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
