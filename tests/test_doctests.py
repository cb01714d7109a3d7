"""The docstrings' examples run: each module's ``>>>`` examples, with ``hf_posext`` imported and ``model`` a
fresh tiny Llama (`tests.helpers.models.tiny_model`). An example that needs a saved checkpoint is
marked ``# doctest: +SKIP`` where it stands; this test lists every module that has examples, so a new one runs."""

from __future__ import annotations

import doctest
import importlib
import pathlib

import pytest
from tests.helpers.models import tiny_model

import hf_posext

PACKAGE = pathlib.Path(hf_posext.__file__).parent


def _modules_with_examples() -> list[str]:
    return sorted(
        "hf_posext." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        for path in PACKAGE.rglob("*.py")
        if ">>>" in path.read_text()
    )


def test_the_modules_with_examples_are_found():
    assert "hf_posext.methods.registry" in _modules_with_examples()


@pytest.mark.parametrize("name", _modules_with_examples())
def test_the_examples_of_a_module_run(name):
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    tests = [test for test in doctest.DocTestFinder().find(module, name) if test.examples]
    assert tests, f"{name} has '>>>' but no example doctest finds"
    for test in tests:
        test.globs.update(hf_posext=hf_posext, model=tiny_model())
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed (output above)"
