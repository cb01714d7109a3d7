"""The README and the docs site say only what is true of the repository.

* every command in a ``bash`` block parses: ``hf-posext ...`` with the real argument parser (and
  its ``--method``/``--factor``/``--set`` make a method), so do the ``hf-posext ...`` examples of
  the package's module docstrings; ``python -m X`` names an importable module, ``python path.py`` / ``bash path.sh``
  a file that exists; every ``python`` block compiles and every ``yaml`` block loads;
* every repository path the package, the tests, the scripts and the docs cite exists;
* module docstrings stay short (what the module is for; the long form lives in ``docs/``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import shlex
import warnings
from pathlib import Path

import pytest
import yaml

from hf_posext import method_config
from hf_posext.commands.arguments import check_factor, method_kwargs
from hf_posext.post_import import MOVED

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
SHELL = {"bash", "sh", "shell", "console"}
#: Commands a page may show that are not this repository's: installers and the developer tools.
EXTERNAL = {"pip", "mkdocs", "ruff", "mypy", "pre-commit", "git", "cd", "export", "source", "time", "echo", "ls"}
#: Wrappers whose own flags come first, then the real command.
WRAPPERS = {"nice": 2, "nohup": 0, "env": 0}
MAX_DOCSTRING_LINES = 15


def blocks(page: Path) -> list[tuple[str, str]]:
    return [(m.group("lang").lower(), m.group("body")) for m in FENCE.finditer(page.read_text())]


def shell_lines(body: str) -> list[str]:
    """Logical lines of a shell block: continuations joined, prompts and comments dropped."""
    lines = []
    for line in body.replace("\\\n", " ").splitlines():
        line = line.strip().removeprefix("$ ")
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def _parser():
    for module in ("hf_posext.commands.main", "hf_posext.cli"):
        try:
            return importlib.import_module(module).build_parser()
        except ModuleNotFoundError:
            continue
    raise AssertionError("no hf-posext argument parser found (hf_posext.commands.main or hf_posext.cli)")


COMMANDS = [
    (page, line) for page in PAGES for lang, body in blocks(page) if lang in SHELL for line in shell_lines(body)
]
SNIPPETS = [(page, lang, body) for page in PAGES for lang, body in blocks(page) if lang in ("python", "yaml")]


def _ids(items):
    return [f"{item[0].relative_to(ROOT)}:{index}" for index, item in enumerate(items)]


@pytest.fixture(scope="module")
def parser():
    return _parser()


def check_command(line: str, parser) -> None:
    if re.match(r"^[A-Za-z_]\w*=\$\(", line):  # VAR=$(...): a shell variable for the next lines
        return
    tokens = [t for t in shlex.split(line, comments=True) if not (t.startswith("[") and t.endswith("]"))]
    while tokens and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[0]):  # VAR=value prefixes
        tokens.pop(0)
    while tokens and tokens[0] in WRAPPERS:
        tokens = tokens[1 + WRAPPERS[tokens[0]] :]
    if not tokens or tokens[0] in EXTERNAL:
        return
    head, args = tokens[0], tokens[1:]
    if head == "hf-posext":
        try:
            namespace = parser.parse_args(args)
        except SystemExit as exit_:
            raise AssertionError(f"`{line}` does not parse (exit {exit_.code})") from None
        check_method_arguments(line, namespace)
    elif head in ("python", "python3"):
        if args[:1] == ["-m"]:
            assert importlib.util.find_spec(args[1]) is not None, f"`{line}`: no module {args[1]}"
            if args[1] in ("hf_posext", "hf_posext.cli", "hf_posext.commands.main"):
                check_command(" ".join(["hf-posext", *map(shlex.quote, args[2:])]), parser)
        elif args[:1] != ["-c"]:
            assert (ROOT / args[0]).is_file(), f"`{line}`: no file {args[0]}"
    elif head in ("bash", "accelerate", "torchrun"):
        scripts = [t for t in args if t.endswith((".py", ".sh", ".yaml"))]
        assert scripts, f"`{line}` runs nothing of this repository"
        for script in scripts:
            assert (ROOT / script).is_file(), f"`{line}`: no file {script}"
    else:
        raise AssertionError(f"`{line}`: unknown command {head!r} (add it to EXTERNAL if it is not ours)")


def check_method_arguments(line: str, namespace) -> None:
    """The command's ``--method``, ``--factor`` and ``--set`` make a method, as the command checks before it runs."""
    if not isinstance(getattr(namespace, "method", None), str):
        return
    kwargs = method_kwargs(getattr(namespace, "set", None))
    for name in (n.strip() for n in namespace.method.split(",")):
        if name and name != "none":
            factor = getattr(namespace, "factor", None)
            try:
                check_factor(name, factor, kwargs)
                method_config(name, **({} if factor is None else {"factor": factor}), **kwargs)
            except (ValueError, TypeError) as err:
                raise AssertionError(f"`{line}`: the command would refuse it: {err}") from None


def docstring_commands() -> list[tuple[Path, str]]:
    """``hf-posext SUBCOMMAND ...`` lines of the package's module docstrings (prose like "hf-posext plugs" skipped)."""
    subcommands = next(a for a in _parser()._actions if a.dest == "command").choices
    found = []
    for module in sorted(ROOT.glob("hf_posext/**/*.py")):
        doc = ast.get_docstring(ast.parse(module.read_text())) or ""
        for line in shell_lines(doc):
            words = line.split()
            if words[0] == "hf-posext" and len(words) > 1 and words[1] in subcommands:
                found.append((module, line))
    return found


DOCSTRING_COMMANDS = docstring_commands()


@pytest.mark.parametrize(("module", "line"), DOCSTRING_COMMANDS, ids=_ids(DOCSTRING_COMMANDS))
def test_every_command_in_a_module_docstring_parses(module, line, parser):
    check_command(line, parser)


def test_module_docstrings_hold_commands_to_check():
    assert {m.name for m, _ in DOCSTRING_COMMANDS} >= {"arguments.py", "eval.py", "main.py", "tiny_model.py"}


@pytest.mark.parametrize(("page", "line"), COMMANDS, ids=_ids(COMMANDS))
def test_every_shell_command_in_the_docs_parses(page, line, parser):
    check_command(line, parser)


@pytest.mark.parametrize(("page", "lang", "body"), SNIPPETS, ids=_ids(SNIPPETS))
def test_every_python_and_yaml_snippet_in_the_docs_parses(page, lang, body):
    if lang == "python":
        compile(body, f"{page.relative_to(ROOT)} snippet", "exec")
    else:
        yaml.safe_load(body)


@pytest.mark.parametrize(
    "line",
    [
        "hf-posext patch a b --method yarn --factor 4",
        "python -m hf_posext.no_such_module",
        "python scripts/no_such.py",
        "hf-posext no-such-command",
        "frobnicate --now",
        "hf-posext patch a b --method yarn --factor 4 --set nope=1",
        "hf-posext eval ppl m --lengths 8 --method none,yarn",
    ],
)
def test_the_command_check_can_fail(line, parser):
    if line == "hf-posext patch a b --method yarn --factor 4":
        check_command(line, parser)
        return
    with pytest.raises(AssertionError):
        check_command(line, parser)


# A repository path: one of the top-level folders, not preceded by a word character, a dot or a slash
# (so `~/.cache/hf_posext/` and `hf_posext.methods` are not paths).
PATH = re.compile(r"(?<![\w./~$-])((?:hf_posext|tests|benchmarks|docs|scripts|examples)/[\w./*{},-]*)")
SOURCES = sorted(
    {
        *PAGES,
        *ROOT.glob("hf_posext/**/*.py"),
        *ROOT.glob("tests/**/*.py"),
        *ROOT.glob("scripts/*.py"),
        *ROOT.glob("benchmarks/**/*.py"),
        *ROOT.glob("examples/**/*"),
        ROOT / "mkdocs.yml",
        ROOT / "pyproject.toml",
        ROOT / ".ci" / "run",
    }
    - {Path(__file__).resolve()}
)
#: Paths that exist only once something has run (caches and scratch folders, ignored by git).
GENERATED = ("benchmarks/results/work", "benchmarks/results/**/work")


def expand(path: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    if "," not in match.group(1):  # an f-string field: only the folder before it is a path
        return [path[: match.start()].rpartition("/")[0] + "/"]
    return [
        p for option in match.group(1).split(",") for p in expand(path[: match.start()] + option + path[match.end() :])
    ]


def cited_paths(text: str) -> set[str]:
    found = set()
    for raw in PATH.findall(text):
        for path in expand(raw.rstrip(".,:;")):
            if path.strip("/") and not path.startswith(GENERATED):
                found.add(path)
    return found


def exists(path: str) -> bool:
    if any(c in path for c in "*?["):
        return any(ROOT.glob(path.rstrip("/")))
    return (ROOT / path).exists()


def moved_module(path: str) -> bool:
    """Whether ``path`` is the file of a module that moved (an old path of :data:`hf_posext.post_import.MOVED`),
    the folder of a package that moved or that folder's mirror under ``tests/`` (which moved with it), a module
    that became the package of its name (``hf_posext/attention/remap.py``), a test file that moved to another
    folder of ``tests/`` with its module, or a tool that moved to ``scripts/`` from ``benchmarks/`` or
    ``tests/helpers/`` (``benchmarks/tables.py``)."""
    if path.startswith("tests/") and path.endswith("/"):
        path = "hf_posext/" + path.removeprefix("tests/")
    if not path.endswith((".py", "/")):
        return False
    if path.removesuffix(".py").rstrip("/").replace("/", ".") in MOVED:
        return True
    if not path.endswith(".py"):
        return False
    if (ROOT / path.removesuffix(".py") / "__init__.py").is_file():
        return True
    if path.startswith(("benchmarks/", "tests/helpers/")) and (ROOT / "scripts" / Path(path).name).is_file():
        return True
    return path.startswith("tests/") and any((ROOT / "tests").rglob(Path(path).name))


@pytest.mark.parametrize("source", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_every_cited_repository_path_exists(source):
    if not source.is_file() or source.suffix in (".png", ".json", ".gguf"):
        return
    # The CHANGELOG keeps the paths of its day where a module moved (it still imports, with a warning).
    history = source == ROOT / "CHANGELOG.md"
    cited = cited_paths(source.read_text(errors="replace"))
    missing = sorted(p for p in cited if not exists(p) and not (history and moved_module(p)))
    assert not missing, f"{source.relative_to(ROOT)} cites paths that do not exist: {missing}"


def test_the_path_check_finds_paths_and_can_fail():
    text = "see `tests/test_docs.py`, examples/accelerate/{ddp,fsdp2}.yaml and ~/.cache/hf_posext/x, hf_posext.methods"
    assert cited_paths(text) == {"tests/test_docs.py", "examples/accelerate/ddp.yaml", "examples/accelerate/fsdp2.yaml"}
    assert all(exists(p) for p in cited_paths(text))
    assert not exists("tests/test_no_such_file.py")
    assert moved_module("hf_posext/attention/remap.py") and moved_module("tests/test_flash_segments.py")
    assert not moved_module("tests/test_no_such_file.py") and not moved_module("hf_posext/no_such_module.py")
    assert moved_module("benchmarks/tables.py") and moved_module("tests/helpers/vanilla.py")
    assert not moved_module("benchmarks/no_such_tool.py")


# A dotted name of the package (`hf_posext.eval.ruler.mcnemar_exact`), not part of a path or of a longer word.
DOTTED = re.compile(r"(?<![\w./~$-])hf_posext(?:\.[A-Za-z_]\w*)+")
#: Pages and modules whose dotted names must resolve (the CHANGELOG keeps the names of its day).
NAMED = sorted({*PAGES, *ROOT.glob("hf_posext/**/*.py")} - {ROOT / "CHANGELOG.md"})


def resolves(name: str) -> bool:
    """Whether ``name`` is a module of the package or an attribute reached from one."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


@pytest.mark.parametrize("source", NAMED, ids=[str(p.relative_to(ROOT)) for p in NAMED])
def test_every_dotted_name_in_the_docs_resolves(source):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # an old module path resolves (it warns once)
        stale = sorted({name for name in DOTTED.findall(source.read_text()) if not resolves(name)})
    assert not stale, f"{source.relative_to(ROOT)} names what does not exist: {stale}"


def test_the_dotted_name_check_can_fail():
    text = "`hf_posext.cli`, hf_posext.eval.ruler.mcnemar_exact, hf_posext/eval/ and ~/.cache/hf_posext.x"
    assert DOTTED.findall(text) == ["hf_posext.cli", "hf_posext.eval.ruler.mcnemar_exact"]
    assert [resolves(name) for name in DOTTED.findall(text)] == [False, True]
    assert not resolves("hf_posext.patch_model.no_such_attribute")


MODULES = sorted(ROOT.glob("hf_posext/**/*.py"))


def test_module_docstrings_are_short():
    long = {}
    for module in MODULES:
        doc = ast.get_docstring(ast.parse(module.read_text()), clean=False) or ""
        if len(doc.splitlines()) > MAX_DOCSTRING_LINES:
            long[str(module.relative_to(ROOT))] = len(doc.splitlines())
    assert not long, f"module docstrings over {MAX_DOCSTRING_LINES} lines (move the long form to docs/): {long}"


# A Sphinx role (`:func:`x``): the docs site (mkdocstrings) shows it as raw text. Write [`x`][hf_posext.x] for
# an object the API page renders, a code span `x` for anything else.
SPHINX_ROLE = re.compile(r":(?:func|class|mod|meth|data|attr|exc|obj|ref):`")


def sphinx_roles(text: str) -> int:
    return len(SPHINX_ROLE.findall(text))


def test_no_sphinx_role_in_the_package():
    roles = {str(m.relative_to(ROOT)): n for m in MODULES if (n := sphinx_roles(m.read_text()))}
    assert not roles, f"Sphinx roles the docs site shows raw (write [`x`][hf_posext.x] or `x`): {roles}"


def test_the_sphinx_role_check_can_fail():
    text = ":func:`patch_model`, :class:`~.base.MethodConfig`, :mod:`.source`; [`x`][hf_posext.x], `y`, ``z``"
    assert sphinx_roles(text) == 3
    assert sphinx_roles("[`patch_model`][hf_posext.patch_model] and `hf_posext.gguf.source`") == 0


def test_the_install_lines_name_pyprojects_torch_minimum():
    pinned = re.search(r'"torch>=(\d+\.\d+)', (ROOT / "pyproject.toml").read_text()).group(1)
    for page in (ROOT / "README.md", ROOT / "docs" / "getting_started.md"):
        named = re.findall(r"torch >= (\d+\.\d+)", page.read_text())
        assert named and set(named) == {pinned}, (page.name, named, pinned)


def test_every_cache_folder_the_docs_and_ci_name_is_the_packages(monkeypatch):
    from hf_posext.files import default_cache_dir

    monkeypatch.delenv("HF_POSEXT_CACHE", raising=False)
    name = default_cache_dir().name
    texts = [page.read_text() for page in PAGES] + [(ROOT / ".ci" / "run").read_text()]
    folders = {folder for text in texts for folder in re.findall(r"\.cache/(hf[-_]posext)\b", text)}
    assert folders == {name}, folders


def test_the_readme_says_patch_writes_a_folder_unless_the_names_end_in_gguf():
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "`patch` writes a transformers checkpoint folder unless both names end in `.gguf`" in text
