"""Outside hf_posext/methods/, the recipe, the commands and evaluation ask a method's spec, never its name.

A comparison of a method setting with a registered method name or alias (``config.method ==
"longrope"``, ``method in ("alibi", ...)``) is how a method's needs leak out of its folder; its
registered `Training` / `Surgery` / class attributes say them instead (issue 62 item 1); the readers ask
``MethodConfig.only_hf_posext_computes`` and the config's own fields (issue 57).
"""

from __future__ import annotations

import ast
from pathlib import Path

import hf_posext
from hf_posext.method_names import ALIASES

PACKAGE = Path(hf_posext.__file__).parent
CHECKED = ("train", "commands", "eval", "readers")


def method_name_comparisons(source: str, names: set[str]) -> list[str]:
    """``line: code`` of each comparison of an expression naming a method with one of ``names``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        constants = {
            n.value for o in operands for n in ast.walk(o) if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }
        if constants & names and any("method" in ast.unparse(o) for o in operands):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_method_name_is_compared_outside_methods():
    names = set(hf_posext.available_methods()) | set(ALIASES)
    found = {
        str(path.relative_to(PACKAGE)): hits
        for folder in CHECKED
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        if (hits := method_name_comparisons(path.read_text(encoding="utf-8"), names))
    }
    assert found == {}


def test_the_check_can_fail():
    names = {"longrope", "alibi"}
    source = (
        "if config.method != 'longrope':\n    pass\n"
        "ok = self.method in ('alibi', 'x')\n"
        "kind = schedule == 'linear'\n"  # not a method setting
        "formula = attention_factor == 'longrope'\n"  # an option's value, not a method
    )
    assert method_name_comparisons(source, names) == [
        "1: config.method != 'longrope'",
        "3: self.method in ('alibi', 'x')",
    ]
