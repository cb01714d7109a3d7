"""The old paths of moved modules (``hf_posext.post_import.MOVED``): each is the module it moved to, and warns once.

The post-import callbacks are tested where they matter, in tests/test_import_cost.py.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import pytest

import hf_posext
from hf_posext.post_import import MOVED, REMOVED_IN

ROOT = Path(hf_posext.__file__).resolve().parents[1]


def _forget_old_paths() -> None:
    for old in MOVED:
        sys.modules.pop(old, None)
        parent, _, leaf = old.rpartition(".")
        if parent in sys.modules:
            vars(sys.modules[parent]).pop(leaf, None)


@pytest.fixture
def no_old_path_imported():
    """Each test imports the old paths afresh, and leaves none behind for the next."""
    _forget_old_paths()
    yield
    _forget_old_paths()


def _import_here(statement: str, namespace: dict) -> list[warnings.WarningMessage]:
    """Run ``statement`` as if written in this file; the DeprecationWarnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(statement, __file__, "exec"), namespace)
    return [w for w in caught if issubclass(w.category, DeprecationWarning)]


def _warnings_for(old: str) -> list[str]:
    """The warnings of a first ``import old``: one per moved path along it (a moved package's, then its module's)."""
    parts = old.split(".")
    paths = [".".join(parts[:n]) for n in range(1, len(parts) + 1)]
    return [
        f"{p} has moved to {MOVED[p]}; import {MOVED[p]} instead (the old path goes in {REMOVED_IN})"
        for p in paths
        if p in MOVED
    ]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_moved_module_and_warns_once_naming_it(old, no_old_path_imported):
    new = MOVED[old]
    namespace: dict = {}
    first = _import_here(f"import {old} as module", namespace)
    module = namespace["module"]
    assert module is importlib.import_module(new)
    assert (module.__name__, module.__spec__.name) == (new, new)  # the module keeps its own name and spec
    assert [str(w.message) for w in first] == _warnings_for(old)  # a moved package's old path warns first
    assert all(w.filename == __file__ for w in first)  # attributed to the import statement, not to the import system
    assert _import_here(f"import {old}", {}) == []  # once: the old path is an alias in sys.modules now


@pytest.mark.parametrize("old", sorted(MOVED))
def test_from_an_old_parent_import_the_old_name(old, no_old_path_imported):
    parent, _, leaf = old.rpartition(".")
    namespace: dict = {}
    caught = [str(w.message) for w in _import_here(f"from {parent} import {leaf} as module", namespace)]
    assert caught and set(caught) <= set(_warnings_for(old))
    assert namespace["module"] is importlib.import_module(MOVED[old])


def test_no_file_is_left_at_an_old_path_and_every_new_path_is_a_module():
    for old, new in MOVED.items():
        assert not (ROOT / f"{old.replace('.', '/')}.py").exists(), old
        assert not (ROOT / old.replace(".", "/")).exists(), old
        path = ROOT / new.replace(".", "/")
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), new


def test_an_unknown_name_is_still_missing():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("hf_posext.gguf_nothing")


#: Issue 48 item 4 (one name, one meaning): a statement as code written before the renames has it -> the object it
#: must bind (new module, new name): ``extend_checkpoint`` is ``patch_checkpoint`` now, like ``patch_model``.
RENAMED_MODULE_IMPORTS = [
    ("from hf_posext.validation.checkpoint import read_config", "hf_posext.validation.saved_model", "read_config"),
    ("from hf_posext.eval.checkpoint import load_model", "hf_posext.eval.evaluated_model", "load_model"),
    ("from hf_posext.train.checkpointing import latest_checkpoint", "hf_posext.train.saved_state", "latest_checkpoint"),
    ("from hf_posext.train.final_checkpoint import save_final", "hf_posext.train.final_model", "save_final"),
    ("from hf_posext.patching.checkpoint_rope import base_rope", "hf_posext.patching.shipped_rope", "base_rope"),
    ("from hf_posext.experiments.reproduce import write_report", "hf_posext.experiments.reproduction", "write_report"),
    ("from hf_posext.export import extend_checkpoint", "hf_posext.publish", "patch_checkpoint"),
    ("from hf_posext.export.extend import extend_checkpoint", "hf_posext.publish.config_patch", "patch_checkpoint"),
    ("from hf_posext.export.hub import push_to_hub", "hf_posext.publish.hub", "push_to_hub"),
]


@pytest.mark.parametrize(("statement", "new", "name"), RENAMED_MODULE_IMPORTS)
def test_a_renamed_module_old_import_gives_the_same_object_and_warns_once(statement, new, name, no_old_path_imported):
    _, old, _, old_name = statement.split()
    renamed = [f"{new}.{old_name} is deprecated; use {new}.{name} (the old name goes in {REMOVED_IN})"]
    renamed = renamed if old_name != name else []
    namespace: dict = {}
    first = _import_here(statement, namespace)
    assert namespace[old_name] is getattr(importlib.import_module(new), name)
    # One warning per renamed path along it, and the name's: a package's ``from ... import`` looks a name up twice
    # (the import system's hasattr, then the binding), each look-up of a deprecated name warns, at the same line.
    assert list(dict.fromkeys(str(w.message) for w in first)) == _warnings_for(old) + renamed
    assert any(new in str(w.message) for w in first)
    again = {str(w.message) for w in _import_here(statement, {})}
    assert again == set(renamed)  # the module paths warn once per process, a deprecated name at each use


def test_a_name_moved_to_another_module_is_the_same_object_and_warns_naming_its_module():
    """Issue 48: ``patch_gguf`` left gguf/writer.py (gguf/ imported patching/, a floor above it) for publish/."""
    from hf_posext.publish.gguf_patch import patch_gguf

    with pytest.warns(
        DeprecationWarning, match=r"gguf\.writer\.patch_gguf has moved to hf_posext\.publish\.gguf_patch"
    ):
        from hf_posext.gguf.writer import patch_gguf as old
    assert old is patch_gguf
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        _ = importlib.import_module("hf_posext.gguf.writer").nothing
