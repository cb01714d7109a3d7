"""``import hf_posext`` changes what hf_posext.import_effects.EFFECTS lists, and docs/import_effects.md lists EFFECTS.

A fresh interpreter records transformers' module and class attributes (and the dicts among them), torch's
module-registration hooks and ``sys.meta_path``, imports hf_posext, and names every difference the way
``Effect.touches`` does; the union of ``touches`` must be exactly that, so a new change at import fails here
until the module and the page list it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hf_posext.import_effects import EFFECTS
from hf_posext.methods.registry import attention_functions, families, rope_types

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "import_effects.md"

#: Run in a fresh interpreter: prints the changes ``import hf_posext`` makes, named as ``Effect.touches`` names them.
PROBE = r"""
import json, sys
import torch
import torch.nn.modules.module as torch_module
import transformers, transformers.modeling_rope_utils
if sys.argv[1] == "loaded":
    import transformers.modeling_utils, transformers.masking_utils

def state():
    seen, dicts = {}, set()
    for name, module in list(sys.modules.items()):  # import order: a shared dict is named where it was made
        if not name.startswith("transformers.") or module is None:  # transformers itself: a lazy module's cache
            continue
        for attr, value in list(vars(module).items()):
            owners = [(f"{name}.{attr}", value)]
            if isinstance(value, type) and value.__module__ == name:
                owners += [(f"{name}.{attr}.{k}", v) for k, v in list(vars(value).items())]
            for label, obj in owners:
                if isinstance(obj, dict):
                    if id(obj) in dicts:
                        continue
                    dicts.add(id(obj))
                seen[label] = (name, id(obj), sorted(map(str, obj)) if isinstance(obj, dict) else None)
    hooks = [f"{f.__module__}.{f.__qualname__}" for f in torch_module._global_module_registration_hooks.values()]
    return seen, hooks, [type(f) for f in sys.meta_path]

before, hooks, meta_path = state()
loaded = set(sys.modules)
import hf_posext
if sys.argv[1] == "later":
    import transformers.modeling_utils, transformers.masking_utils
after, new_hooks, new_meta_path = state()
changes = set()
for label, (module, ident, keys) in after.items():
    if label not in before:
        if module in loaded:
            changes.add(label)  # a new attribute of a module or class loaded before (not of a module loaded now)
        continue
    _, old_ident, old_keys = before[label]
    if ident != old_ident:
        changes.add(label)
    elif keys is not None and keys != old_keys:
        changes.update(f"{label}[{key}]" for key in sorted(set(keys) ^ set(old_keys)))
changes.update(f"torch module registration hook: {h}" for h in new_hooks if h not in hooks)
changes.update(f"sys.meta_path: {t.__module__}.{t.__qualname__}" for t in new_meta_path if t not in meta_path)
print(json.dumps(sorted(changes)))
"""


def _import_changes(when: str) -> set[str]:
    """What ``import hf_posext`` changes, in touches' names. ``when``: transformers' modeling_utils and masking_utils
    "loaded" before (every object the import changes exists before it), or imported "later" (the import itself
    loads neither; then only ``sys.meta_path`` and torch's hooks tell, the rest being new)."""
    run = subprocess.run([sys.executable, "-c", PROBE, when], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    found = set(json.loads(run.stdout.strip().splitlines()[-1]))
    rope, attention = set(rope_types()), set(attention_functions())
    for family in families().values():
        rope |= {old for entry in family.rope_types.values() for old in entry.old_names}
    return {_named(change, rope, attention) for change in found}


def _named(change: str, rope: set[str], attention: set[str]) -> str:
    """``change`` with a registered rope type or attention name replaced by ``<rope type>`` / ``<attention>``."""
    entry = re.fullmatch(r"(.*)\[(.*)\]", change)
    if entry is not None:
        names, placeholder = (
            (attention, "<attention>") if entry[1].endswith("._global_mapping") else (rope, "<rope type>")
        )
        return f"{entry[1]}[{placeholder}]" if entry[2] in names else change
    validator = re.fullmatch(r"(.*\._validate_)(.*)(_rope_parameters)", change)
    if validator is not None and validator[2] in rope:
        return f"{validator[1]}<rope type>{validator[3]}"
    return change


def _touches(*excluded: str) -> set[str]:
    return {t for e in EFFECTS for t in e.touches if not t.startswith(excluded)}


#: Not an object the import changes, but what the construction hook does with the families' load-time hooks.
LOAD_TIME_HOOKS = ("hf_posext.methods.",)
POST_IMPORT_HOOK = "sys.meta_path: hf_posext.post_import._PostImportFinder"
HOOKS = ("sys.meta_path: ", "torch module registration hook: ")


def test_an_import_changes_exactly_what_the_effects_list():
    """With transformers' modules loaded first every changed object is there before; the post-import hook is
    then not installed (the page's way to do without it), and is when they load later."""
    assert _import_changes("loaded") == _touches(*LOAD_TIME_HOOKS) - {POST_IMPORT_HOOK}
    later = {change for change in _import_changes("later") if change.startswith(HOOKS) and "hf_posext" in change}
    assert later == {t for t in _touches() if t.startswith(HOOKS)}


def test_the_only_load_time_hooks_are_the_adoptions_the_effects_list():
    hooks = {f"hf_posext.methods.{name}: the load-time hook" for name, f in families().items() if f.shipped_config}
    assert hooks == {t for t in _touches() if t.startswith(LOAD_TIME_HOOKS)}


def _sections() -> dict[str, str]:
    text = PAGE.read_text(encoding="utf-8").split("\n## What it changes in a process\n", 1)[1]
    parts = re.split(r"^### (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_page_lists_the_effects_in_order():
    assert list(_sections()) == [e.name for e in EFFECTS]


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_the_page_names_what_each_effect_touches(effect):
    section = " ".join(_sections()[effect.name].split())
    missing = [t for t in effect.touches if f"`{t}`" not in section]
    assert missing == [], f"docs/import_effects.md, '### {effect.name}' does not name {missing}"
    assert "**Why.**" in section and "**Without it.**" in section


def test_the_page_gives_the_removal_release_of_the_moved_modules():
    from hf_posext.post_import import REMOVED_IN

    assert f"hf-posext {REMOVED_IN}" in _sections()["moved-module aliases"]
