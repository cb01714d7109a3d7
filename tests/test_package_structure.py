"""The package's import structure: no import cycle, imports at the top, modules small enough to read.

Checked on the source (ast), so a new module is covered without a list:

* no cycle among the package's modules through module-level imports (``if TYPE_CHECKING:`` blocks
  excluded, since they never run), ``importlib.import_module`` calls included: a package that loads its
  sub-packages with it (``methods/__init__.py`` its family folders) has an edge to each of them, so a
  module they import that imports a name from the package, still initialising, closes a cycle
  (:func:`_dynamic_targets`). A submodule's implicit import of its parent packages is not an edge:
  importing ``hf_posext.methods.yarn`` runs ``hf_posext/__init__.py`` first whatever it imports, which
  is how every package works;
* no import inside a function or class except of an optional dependency (:data:`OPTIONAL`), a heavy
  part of transformers (:data:`DEFERRED`), or in the command handlers (:data:`LAZY`), which import
  what they run when they run so that ``hf-posext --help`` loads none of it;
* a method family folder imports no other family's folder (shared code lives beside them);
* ``rope_utils`` imports nothing of the package;
* only ``integration.py`` touches transformers' internals (:func:`transformers_internals` says what
  counts);
* the method modules' docstrings are a few lines (the maths is in ``docs/methods/``);
* no module over :data:`MAX_LINES` lines unless its docstring says why, in a sentence starting
  "Longer than ~400 lines" (the convention docs/layout.md states);
* a package's ``__init__.py`` is its face: imports, ``__all__`` and at most one registration call (the
  logic lives in named modules), but for :data:`NOT_A_FACE`.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch.nn as nn
import transformers
from transformers import GenerationMixin, HfArgumentParser, PreTrainedConfig, PreTrainedModel

import hf_posext

PACKAGE_DIR = Path(hf_posext.__file__).parent
PACKAGE = "hf_posext"

#: Top-level names that may be imported inside a function: optional extras, or parts of torch that
#: older supported releases lack.
OPTIONAL = {"datasets", "flash_attn", "gguf", "lm_eval", "matplotlib", "deepspeed", "torch.nn.attention.flex_attention"}

#: Parts of transformers imported inside the functions that use them, so that ``import hf_posext``
#: loads none of them (tests/test_import_cost.py): its model and mask machinery and the Auto classes;
#: and peft, which only ``hf_posext.publish.merge_adapter`` needs of the modules ``hf-posext eval`` loads.
DEFERRED = {
    "peft",
    "transformers.modeling_utils",
    "transformers.masking_utils",
    "transformers.cache_utils",
    "transformers.AutoConfig",
    "transformers.AutoModelForCausalLM",
    "transformers.AutoTokenizer",
    # a GGUF's rope as a config (it loads transformers' config classes): only a conversion reads it
    "hf_posext.gguf.reading",
    # the export's rope and model types (the same config classes): only doctor's llama.cpp routes judge them
    "hf_posext.gguf.rope",
}

#: Packages whose functions may import anything: the command handlers.
LAZY = ("hf_posext.commands",)

#: About 400 lines as the modules were written before `ruff format` (issue 33 item 6): its one-argument-per-line
#: calls grew them by 5-35% (commands/eval.py 382 -> 471), so the formatted limit is 480. A longer module's
#: docstring says "Longer than ~400 lines" and why.
MAX_LINES = 480


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The package modules an import statement executes (beyond implicit parent packages)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in MODULES]
    source = _resolve(module, node)
    found = []
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        if sub in MODULES:
            found.append(sub)
        elif source in MODULES:
            found.append(source)
    return found


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, (ast.If, ast.Try)) and not _is_type_checking(node):
                for block in ("body", "orelse", "finalbody"):
                    visit(getattr(node, block, []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    return found


def _module_level_nodes(tree: ast.Module) -> list[ast.AST]:
    """Every node that runs when the module is imported: not inside a function, a class body's methods or an
    ``if TYPE_CHECKING:`` block."""
    found: list[ast.AST] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or (
                isinstance(child, ast.stmt) and _is_type_checking(child)
            ):
                continue
            found.append(child)
            visit(child)

    visit(tree)
    return found


def _dynamic_targets(module: str, tree: ast.Module) -> list[str]:
    """The package modules a module loads at import time through ``importlib.import_module``: a constant name, or
    ``f"{__name__}.{...}"`` in a package, which may be any module directly inside it."""
    found = []
    for node in _module_level_nodes(tree):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func) in {"importlib.import_module", "import_module"}):
            continue
        argument = node.args[0] if node.args else None
        if isinstance(argument, ast.Constant) and argument.value in MODULES:
            found.append(argument.value)
        elif (
            isinstance(argument, ast.JoinedStr)
            and _is_package(module)
            and ast.unparse(argument).startswith("f'{__name__}.")
        ):
            found += [name for name in MODULES if name.rpartition(".")[0] == module]
    return found


def _trees() -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph[node]:
            if succ not in index:
                connect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return components


def test_the_walk_sees_the_whole_package():
    assert {"hf_posext", "hf_posext.patching", "hf_posext.rope_utils"} <= set(MODULES)
    assert len(MODULES) > 20


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def test_the_graph_sees_what_a_package_loads_with_importlib():
    tree = ast.parse(
        "import importlib\nFAMILIES = tuple(importlib.import_module(f'{__name__}.{name}') for name in NAMES)\n"
        "def later():\n    importlib.import_module('hf_posext.eval')\n"
    )
    assert set(_dynamic_targets("hf_posext.methods", tree)) >= {"hf_posext.methods.yarn", "hf_posext.methods.dca"}
    assert "hf_posext.eval" not in _dynamic_targets("hf_posext.methods", tree)


#: Run in a fresh interpreter: every ``from X import name`` a package module runs while ``X`` is a package still
#: initialising (its ``__init__.py`` running further up the stack), from a module outside ``X``.
HALF_BUILT_IMPORTS = """
import builtins, importlib.util, sys

found, real_import = [], builtins.__import__

def spy(name, globals=None, locals=None, fromlist=(), level=0):
    importer = (globals or {}).get("__name__", "")
    if fromlist and importer.startswith("hf_posext"):
        package = (globals or {}).get("__package__") or ""
        target = importlib.util.resolve_name("." * level + name, package) if level else name
        spec = getattr(sys.modules.get(target), "__spec__", None)
        if getattr(spec, "_initializing", False) and not importer.startswith(target + ".") and importer != target:
            found.append(f"{importer} imports {', '.join(fromlist)} from {target}, still initialising")
    return real_import(name, globals, locals, fromlist, level)

builtins.__import__ = spy
import hf_posext
print(found)
"""


def test_no_module_imports_from_a_package_still_initialising():
    """The circle the static graph cannot see unless it follows ``importlib``: a package's ``__init__.py`` loads a
    module that imports a name from that very package, bound only because it happens to come earlier there."""
    run = subprocess.run([sys.executable, "-c", HALF_BUILT_IMPORTS], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"


#: Package ``__init__.py`` files that do more than a face, and why.
NOT_A_FACE = {
    "hf_posext": "it exports the config classes found in the registry and loads two names on first use",
}


def face_problems(tree: ast.Module) -> list[str]:
    """What a package ``__init__.py`` holds beyond a face: a docstring, imports, ``__all__``, ``if TYPE_CHECKING:``
    imports, a module ``__getattr__`` (deprecated names) and at most one call (a registration)."""
    problems, calls = [], 0
    for index, node in enumerate(tree.body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)) or _is_type_checking(node):
            continue
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]:
            continue
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__" and len(node.body) == 1:
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and calls == 0:
            calls += 1
            continue
        problems.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0][:80]}")
    return problems


@pytest.mark.parametrize("name", sorted(n for n in MODULES if _is_package(n) and n not in NOT_A_FACE))
def test_a_package_init_is_a_face(name):
    problems = face_problems(ast.parse(MODULES[name].read_text(encoding="utf-8")))
    assert problems == [], f"{MODULES[name]} holds logic (move it to a named module): {problems}"


def test_the_face_check_can_fail():
    face = '"""A face."""\nfrom .a import b\nregister(b)\n__all__ = ["b"]\n'
    assert face_problems(ast.parse(face)) == []
    assert face_problems(ast.parse(face + "def helper():\n    return 1\nregister(helper)\nX = 1\n")) == [
        "line 5: def helper():",
        "line 7: register(helper)",
        "line 8: X = 1",
    ]


def test_the_cycle_check_can_fail():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_inside_functions_are_optional_dependencies(name):
    if any(name == lazy or name.startswith(lazy + ".") for lazy in LAZY):
        return
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    offending = []
    for scope in ast.walk(tree):
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for node in ast.walk(scope):
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                imported = [f"{_resolve(name, node)}.{alias.name}" for alias in node.names]
            else:
                continue
            for module in imported:
                if not any(module == opt or module.startswith(opt + ".") for opt in OPTIONAL | DEFERRED):
                    offending.append(f"line {node.lineno}: {module}")
    assert offending == [], f"{MODULES[name]} imports inside a function: {offending}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_are_small_or_say_why(name):
    text = MODULES[name].read_text(encoding="utf-8")
    lines = text.count("\n")
    if lines <= MAX_LINES:
        return
    docstring = ast.get_docstring(ast.parse(text)) or ""
    assert "Longer than ~400 lines" in docstring, (
        f"{MODULES[name]} has {lines} lines and its docstring does not say why it is not split"
    )


def _graph() -> dict[str, set[str]]:
    return {
        name: {t for node in _module_level_imports(tree) for t in _targets(name, node) if t != name}
        | set(_dynamic_targets(name, tree)) - {name}
        for name, tree in _trees().items()
    }


def _family(module: str) -> str | None:
    """The method family folder ``module`` belongs to (``hf_posext.methods.<family>...``), or ``None``."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == "methods" and _is_package(".".join(parts[:3])):
        return parts[2]
    return None


def test_a_method_family_imports_no_other_family():
    sideways = [
        f"{name} -> {target}"
        for name, targets in _graph().items()
        for target in targets
        if _family(name) and _family(target) and _family(target) != _family(name)
    ]
    assert sideways == []


def test_rope_utils_imports_nothing_of_the_package():
    assert _graph()["hf_posext.rope_utils"] == set()


MAX_DOCSTRING_LINES = 15


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith(f"{PACKAGE}.methods")))
def test_method_module_docstrings_say_what_the_module_is_for_in_a_few_lines(name):
    docstring = ast.get_docstring(ast.parse(MODULES[name].read_text(encoding="utf-8"))) or ""
    assert docstring, f"{MODULES[name]} has no module docstring"
    assert docstring.count("\n") + 1 <= MAX_DOCSTRING_LINES, f"{MODULES[name]}: the maths goes to docs/methods/"


#: The one module that may touch transformers' internals (its docstring lists what it touches).
BOUNDARY = f"{PACKAGE}.integration"
#: transformers submodules the rest of the package may import: its documented logging API.
PUBLIC_SUBMODULES = {"transformers.utils.logging"}


def _private_transformers_attributes() -> set[str]:
    """The private (``_name``, not dunder) attributes of transformers' config, model and argument parser
    classes, less those they inherit from torch's ``nn.Module``, argparse or ``object``."""
    inherited = set(dir(nn.Module)) | set(dir(argparse.ArgumentParser)) | set(dir(object))
    classes = (PreTrainedConfig, PreTrainedModel, GenerationMixin, HfArgumentParser)
    return {n for c in classes for n in dir(c) if n.startswith("_") and not n.startswith("__")} - inherited


def _is_internal(module: str, name: str | None = None) -> bool:
    """Whether ``from module import name`` (``name=None``: ``import module``) reaches past transformers'
    public top level: a submodule (``modeling_rope_utils``, ``masking_utils``...) or a private name."""
    if module in PUBLIC_SUBMODULES or (name is not None and f"{module}.{name}" in PUBLIC_SUBMODULES):
        return False
    if module != "transformers":
        return module.startswith("transformers.")
    if name is None:
        return False
    return name.startswith("_") and name != "__version__" or isinstance(getattr(transformers, name, None), ModuleType)


def transformers_internals(tree: ast.Module, private: set[str]) -> list[str]:
    """What a module's source reaches of transformers beyond its public top-level names, anywhere in it:

    * ``import transformers.x`` or ``from transformers.x import ...`` (but :data:`PUBLIC_SUBMODULES`);
    * ``from transformers import name`` or ``transformers.name`` with ``name`` private or a submodule;
    * ``obj._name``, ``getattr(obj, "_name")`` or ``def _name`` (an override) with ``_name`` in ``private``,
      the private attributes of transformers' classes (``config._attn_implementation``).
    """
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if _is_internal(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("transformers"):
            module = node.module or ""
            found += [
                f"line {node.lineno}: from {module} import {a.name}" for a in node.names if _is_internal(module, a.name)
            ]
        elif isinstance(node, ast.Attribute):
            if (
                isinstance(node.value, ast.Name)
                and node.value.id == "transformers"
                and _is_internal("transformers", node.attr)
            ):
                found.append(f"line {node.lineno}: transformers.{node.attr}")
            elif node.attr in private:
                found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Constant) and node.value in private:
            found.append(f"line {node.lineno}: {node.value!r}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in private:
            found.append(f"line {node.lineno}: def {node.name}")
    return found


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n != BOUNDARY))
def test_only_integration_touches_transformers_internals(name):
    found = transformers_internals(
        ast.parse(MODULES[name].read_text(encoding="utf-8")), _private_transformers_attributes()
    )
    assert found == [], f"{MODULES[name]} reaches transformers' internals (go through {BOUNDARY}): {found}"


@pytest.mark.parametrize(
    "source",
    [
        "from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS",
        "import transformers.modeling_utils",
        "from transformers import masking_utils",
        "from transformers import _private",
        "import transformers\ntransformers.cache_utils.StaticLayer",
        "config._attn_implementation = 'eager'",
        "getattr(config, '_attn_implementation', None)",
        "class P(HfArgumentParser):\n    def _parse_dataclass_field(self, parser, field): ...",
    ],
)
def test_the_boundary_check_can_fail(source):
    assert transformers_internals(ast.parse(source), _private_transformers_attributes()) != []


@pytest.mark.parametrize(
    "source",
    [
        "from transformers import AutoConfig, PreTrainedConfig",
        "import transformers\ntransformers.__version__",
        "from transformers.utils import logging",
        "config.rope_parameters",
    ],
)
def test_the_boundary_check_passes_public_names(source):
    assert transformers_internals(ast.parse(source), _private_transformers_attributes()) == []


TESTS_DIR = Path(__file__).resolve().parent
#: Test folders that mirror the repository's other top-level folders, and the helpers' package.
NOT_MIRRORS = {"benchmarks", "examples", "helpers", "scripts"}


def mirror_problems(tests_dir: Path, package_dir: Path) -> list[str]:
    """Test folders with no package folder of the same path, and top-level test files named after a subpackage
    (a ``test_gguf_writer.py`` beside this file belongs in ``gguf/``)."""
    problems = []
    for folder in sorted(p for p in tests_dir.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        relative = folder.relative_to(tests_dir)
        if relative.parts[0] not in NOT_MIRRORS and not (package_dir / relative).is_dir():
            where = relative.as_posix()
            problems.append(f"{tests_dir.name}/{where}/ mirrors no {package_dir.name}/{where}/")
    subpackages = {p.name for p in package_dir.iterdir() if (p / "__init__.py").is_file()}
    for test in sorted(tests_dir.glob("test_*.py")):
        owner = next((s for s in subpackages if test.stem == f"test_{s}" or test.stem.startswith(f"test_{s}_")), None)
        if owner:
            problems.append(f"{tests_dir.name}/{test.name} tests {package_dir.name}/{owner}/: move it to {owner}/")
    return problems


def test_the_tests_mirror_the_package():
    assert not mirror_problems(TESTS_DIR, PACKAGE_DIR)


def test_the_mirror_check_can_fail(tmp_path):
    (tmp_path / "pkg" / "gguf").mkdir(parents=True)
    (tmp_path / "pkg" / "gguf" / "__init__.py").touch()
    (tmp_path / "suite" / "nowhere").mkdir(parents=True)
    (tmp_path / "suite" / "helpers").mkdir()
    (tmp_path / "suite" / "test_gguf_writer.py").touch()
    assert mirror_problems(tmp_path / "suite", tmp_path / "pkg") == [
        "suite/nowhere/ mirrors no pkg/nowhere/",
        "suite/test_gguf_writer.py tests pkg/gguf/: move it to gguf/",
    ]
