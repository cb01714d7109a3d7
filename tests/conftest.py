"""Shared test setup: tests import their helpers (models.py, vanilla.py) from this folder."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from models import single_thread  # noqa: E402  (needs the path above)


@pytest.fixture
def one_thread():
    """Opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``; see models.single_thread."""
    with single_thread():
        yield


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    """Each test starts without accelerate's process-wide state, as a new process would.

    ``Accelerator()`` refuses a second precision in one process; the recipe's ``auto`` precision is
    bf16 on CPUs with bf16 instructions and fp32 elsewhere, so tests would otherwise depend on order.
    """
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
