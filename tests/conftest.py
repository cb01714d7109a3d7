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
