"""``--plugin MODULE`` / ``HF_POSEXT_PLUGINS``: every command imports a plugin first, so its methods are choices.

The plugin is docs/methods/adding-a-method.md's ``slow`` method as written, saved as a module; the commands
run in a subprocess (a plugin's registration would stay in this process's registry).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hf_posext.commands.arguments import PLUGINS_ENV, load_plugins, take_plugins
from tests.helpers import ROOT
from tests.helpers.models import tiny_model
from tests.helpers.plugins import plugin_examples

#: The page's one-method plugin, ``slow``, written to ``slowplug.py``.
PLUGIN = plugin_examples()[0]


def hf_posext_cli(tmp_path, *args, env=None):
    """``hf-posext ARGS`` in a subprocess that can import the plugin module ``slowplug``."""
    (tmp_path / "slowplug.py").write_text(PLUGIN)
    environ = {k: v for k, v in os.environ.items() if k != PLUGINS_ENV}
    environ.update(PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]), OMP_NUM_THREADS="1", **(env or {}))
    command = [sys.executable, "-m", "hf_posext.commands.main", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=environ, cwd=tmp_path)


@pytest.mark.parametrize(
    "argv, modules, rest",
    [
        (["--plugin", "a", "methods"], ["a"], ["methods"]),
        (["doctor", "x", "--plugin=b.c", "--json", "--plugin", "d"], ["b.c", "d"], ["doctor", "x", "--json"]),
        (["finetune", "--", "--plugin", "e"], [], ["finetune", "--", "--plugin", "e"]),  # after "--": not ours
        (["methods", "--plugin"], [""], ["methods"]),  # no module: the empty name, refused by load_plugins
    ],
)
def test_plugin_is_taken_anywhere_before_a_double_dash(argv, modules, rest):
    assert take_plugins(argv) == (modules, rest)


def test_loaded_plugins_are_exported_to_the_processes_a_command_starts(monkeypatch):
    monkeypatch.setenv(PLUGINS_ENV, "json, colorsys")
    assert load_plugins(["json", "keyword"]) == 0
    assert os.environ[PLUGINS_ENV] == "json,colorsys,keyword"


@pytest.mark.parametrize(
    "name, words", [("", "dotted identifiers"), ("a-b", "dotted identifiers"), ("no_such_mod", "cannot be imported")]
)
def test_a_module_that_cannot_be_imported_is_refused_naming_it(monkeypatch, name, words):
    monkeypatch.delenv(PLUGINS_ENV, raising=False)
    with pytest.raises(ValueError, match=words) as error:
        load_plugins([name])
    assert repr(name) in str(error.value)
    assert PLUGINS_ENV not in os.environ


def test_a_plugins_method_patches_from_the_command_line_and_doctor_judges_it_with_or_without_the_plugin(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path / "base")
    assert "slow" not in hf_posext_cli(tmp_path, "methods").stdout
    listed = hf_posext_cli(tmp_path, "methods", env={PLUGINS_ENV: "slowplug"})
    assert listed.returncode == 0 and "slow" in listed.stdout.split(), listed.stderr

    patched = hf_posext_cli(
        tmp_path, "patch", "base", "out", "--method", "slow", "--factor", "2", "--plugin", "slowplug"
    )
    assert patched.returncode == 0, patched.stderr
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["hf_posext"]["method"] == "slow" and config["rope_parameters"]["rope_type"] == "linear"

    def doctor(*extra):
        done = hf_posext_cli(tmp_path, "doctor", "out", "--json", *extra)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        return {c["check"] for c in report["checks"]}, {k: r["verdict"] for k, r in report["readers"].items()}

    checks, verdicts = doctor()  # without the plugin: judged on the rope alone, and said so
    assert "unregistered-method" in checks and verdicts["transformers5"] == "same"
    checks_with, verdicts_with = doctor("--plugin", "slowplug")
    assert "unregistered-method" not in checks_with and verdicts_with == verdicts


def test_a_plugin_that_cannot_be_imported_is_one_line_and_exit_2(tmp_path):
    done = hf_posext_cli(tmp_path, "--plugin", "no_such_plugin", "methods")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "hf-posext: error: --plugin 'no_such_plugin' (or HF_POSEXT_PLUGINS): the module cannot be imported "
        "(ModuleNotFoundError: No module named 'no_such_plugin')"
    ]


@pytest.mark.parametrize(
    "body, raised, entry, via_env",
    [
        ("raise RuntimeError('boom')", "RuntimeError: boom", "hf_posext.commands.main", False),
        ("{}['missing']", "KeyError: 'missing'", "hf_posext.commands.finetune", False),
        ("def broken(:\n    pass", "SyntaxError", "hf_posext.commands.main", True),
        ("raise RuntimeError('boom')", "RuntimeError: boom", "hf_posext.commands.finetune", True),
    ],
)
def test_a_plugin_whose_import_raises_is_one_line_and_exit_2_through_every_entry_point(
    tmp_path, body, raised, entry, via_env
):
    (tmp_path / "badplug.py").write_text(body + "\n")
    environ = {k: v for k, v in os.environ.items() if k != PLUGINS_ENV}
    environ.update(PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]), OMP_NUM_THREADS="1")
    argv = ["methods"] if entry.endswith("main") else ["--help"]
    if via_env:
        environ[PLUGINS_ENV] = "badplug"
    else:
        argv = ["--plugin", "badplug", *argv]
    command = [sys.executable, "-m", entry, *argv]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environ, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "'badplug'" in lines[0] and raised in lines[0], lines


#: A plugin whose methods write rope parameters no reader can build, each with the field its message names.
HOSTILE_ROPES = {
    "neg_factor": ({"rope_type": "linear", "factor": -2.0}, "factor"),
    "nan_factor": ({"rope_type": "linear", "factor": float("nan")}, "factor"),
    "neg_theta": ({"rope_type": "linear", "factor": 2.0, "rope_theta": -5.0}, "rope_theta"),
    "yarn_no_original": ({"rope_type": "yarn", "factor": 2.0}, "original_max_position_embeddings"),
    "nobodys_type": ({"rope_type": "nobodys_type", "factor": 2.0}, "nobodys_type"),
}

HOSTILE_PLUGIN = """
import json, sys
from dataclasses import dataclass
import hf_posext
from hf_posext.commands.main import main

for name, rope in json.loads(sys.argv[1]).items():
    @dataclass(frozen=True)
    class Hostile(hf_posext.MethodConfig):
        paper = "none"

        def rope_parameters(self, base, rope=rope):
            kept = {k: v for k, v in base.rope_parameters.items() if k != "original_max_position_embeddings"}
            return {**kept, **rope}

    hf_posext.register_method(name, Hostile)
    print("CASE", name, main(["patch", "base", "out_" + name, "--method", name, "--factor", "2"]), file=sys.stderr)
"""


def test_a_plugins_rope_no_reader_can_build_is_refused_naming_method_and_field_before_anything_is_written(tmp_path):
    tiny_model().save_pretrained(tmp_path / "base")
    ropes = json.dumps({name: rope for name, (rope, _) in HOSTILE_ROPES.items()})  # NaN as JSON's NaN
    environ = {k: v for k, v in os.environ.items() if k != PLUGINS_ENV}
    environ.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    command = [sys.executable, "-c", HOSTILE_PLUGIN, ropes]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environ, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("hf-posext: error:")]
    cases = [line.split() for line in done.stderr.splitlines() if line.startswith("CASE ")]
    assert [(name, code) for _, name, code in cases] == [(name, "2") for name in HOSTILE_ROPES]
    assert len(errors) == len(HOSTILE_ROPES)
    for (name, (_, field)), error in zip(HOSTILE_ROPES.items(), errors):
        assert f"'{name}'" in error and field in error, error
        assert not (tmp_path / f"out_{name}").exists()
