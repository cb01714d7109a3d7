"""``hf-posext patch`` and the command-line error policy: bad input is one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers.models import tiny_model

import hf_posext
from hf_posext.commands.arguments import plain
from hf_posext.commands.main import build_parser, main, methods_markdown

L_ORIG = 64


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "base"
    tiny_model(max_positions=L_ORIG).save_pretrained(path)
    return path


@pytest.mark.parametrize("method", ["alibi", "sinusoidal", "learned"])
def test_patch_takes_no_factor_for_methods_without_one(base, tmp_path, method):
    assert main(["patch", str(base), str(tmp_path / "out"), "--method", method]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["hf_posext"]["method"] == method


@pytest.mark.parametrize("method", ["yarn", "dynamic", "pi", "self_extend"])
def test_patch_needs_a_factor_for_methods_that_are_the_identity_without_one(base, tmp_path, capsys, method):
    assert main(["patch", str(base), str(tmp_path / "out"), "--method", method]) == 2
    assert f"--method {method} needs --factor" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_self_extend_with_a_group_size_needs_no_factor(base, tmp_path):
    assert main(["patch", str(base), str(tmp_path / "out"), "--method", "self_extend", "--set", "group_size=4"]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["hf_posext"]["group_size"] == 4


def one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


def test_patch_of_a_config_file_asks_for_its_folder(base, tmp_path, capsys):
    assert main(["patch", str(base / "config.json"), str(tmp_path / "out"), "--method", "yarn", "--factor", "2"]) == 2
    assert f"pass the checkpoint folder that holds it ({base})" in one_line_error(capsys)


def test_patch_refuses_factor_in_set(base, tmp_path, capsys):
    assert (
        main(["patch", str(base), str(tmp_path / "out"), "--method", "yarn", "--factor", "2", "--set", "factor=8"]) == 2
    )
    assert "factor has its own flag, use --factor 8" in one_line_error(capsys)


def test_patch_refuses_a_factor_beyond_any_context(base, tmp_path, capsys):
    assert main(["patch", str(base), str(tmp_path / "out"), "--method", "yarn", "--factor", "1e308"]) == 2
    assert "factor=1e+308 times the original context 64" in one_line_error(capsys)


def test_an_invalid_config_json_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama", ')
    argv = ["patch", str(broken), str(tmp_path / "out"), "--method", "yarn", "--factor", "2"]
    assert main(argv) == 2
    assert str(broken / "config.json") in one_line_error(capsys)
    with pytest.raises(OSError):  # the traceback on request
        main(["--debug", *argv])
    with pytest.raises(OSError):  # after the sub-command too
        main([*argv, "--debug"])
    monkeypatch.setenv("HF_POSEXT_DEBUG", "1")
    with pytest.raises(OSError):
        main(argv)


def test_help_loads_nothing_beyond_the_package(tmp_path):
    # `import hf_posext` registers with transformers (torch, transformers); building every
    # command's parser must import no other library (peft, accelerate, matplotlib...: the handlers').
    # The standard library's modules do not count (hf_posext.data, which the parsers name, loads sysconfig).
    probe = (
        "import sys, hf_posext; before = set(sys.modules)\n"
        "from hf_posext.commands.main import build_parser; build_parser()\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before} - {m.split('.')[0] for m in before}\n"
        "print(sorted(new - set(sys.stdlib_module_names)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_python_dash_m_is_the_command():
    done = subprocess.run([sys.executable, "-m", "hf_posext", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: hf-posext")


def test_a_deprecation_warning_is_one_line_naming_the_command_and_debug_keeps_pythons_format(tmp_path):
    model = tmp_path / "tiny"
    tiny_model().save_pretrained(model)
    argv = [sys.executable, "-m", "hf_posext", "plan", "--model", str(model), "--method", "longrope"]
    argv += ["--seq-len", "128", "--longrope-factors", "mixed"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if "deprecated" in line or "return " in line]
    assert warned == [warned[0]] and warned[0].startswith("hf-posext: FutureWarning: longrope_factors is deprecated")
    debug = subprocess.run([*argv, "--debug"], capture_output=True, text=True, timeout=120)
    assert "config.py:" in debug.stderr and "FutureWarning: longrope_factors" in debug.stderr


def _commands(parser: argparse.ArgumentParser, prefix: str = "hf-posext") -> dict[str, argparse.ArgumentParser]:
    """Every (sub-)sub-command's parser by its full name."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[f"{prefix} {name}"] = sub
                found.update(_commands(sub, f"{prefix} {name}"))
    return found


def test_every_subcommand_has_help_without_markup():
    commands = _commands(build_parser())
    assert {
        f"hf-posext {name}"
        for name in (
            "methods",
            "patch",
            "eval ppl",
            "eval passkey",
            "finetune",
            "demo",
            "reproduce",
            "push",
            "tiny-model",
        )
    } <= set(commands)
    for name, sub in commands.items():
        if name == "hf-posext finetune":
            continue  # its flags are the recipe parser's (test_finetune.py)
        text = sub.format_help()
        assert "``" not in text and ":func:" not in text, name
        for action in sub._actions:
            if not isinstance(action, argparse._SubParsersAction):
                assert action.help, f"{name} {action.option_strings or action.dest} has no help"


def test_patch_lists_the_aliases_from_the_registry(capsys):
    with pytest.raises(SystemExit):
        main(["patch", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for alias, name in hf_posext.method_aliases().items():
        assert f"{name} (alias {alias})" in text


def test_plain_strips_rst():
    assert plain("See :func:`~hf_posext.patch_model` and ``--set``.") == "See hf_posext.patch_model and --set."


def test_tiny_model_writes_a_loadable_checkpoint(tmp_path, capsys):
    assert main(["tiny-model", str(tmp_path / "tiny"), "--max-position-embeddings", "48", "--arch", "qwen3"]) == 0
    config = json.loads((tmp_path / "tiny" / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["max_position_embeddings"] == 48
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'tiny'}"
    assert main(["tiny-model", str(tmp_path / "gpt"), "--arch", "gpt2"]) == 2
    assert "unknown architecture 'gpt2'; choose one of llama" in one_line_error(capsys)


CLI_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "cli.md"


def test_the_cli_guide_lists_every_command_and_the_registrys_aliases():
    text = CLI_GUIDE.read_text()
    block = re.search(r"<!-- methods -->\n(.*?)\n<!-- /methods -->", text, re.S)
    assert block and block.group(1) == methods_markdown(), "run hf-posext methods --markdown into docs/guides/cli.md"
    commands = build_parser()._subparsers._group_actions[0].choices
    for name in commands:
        assert f"| `hf-posext {name}" in text, f"docs/guides/cli.md does not list hf-posext {name}"


def test_dca_without_a_factor_or_chunk_size_is_refused(base, tmp_path, capsys):
    """With no factor DCA would advertise no longer context yet change logits inside it (its chunks are < L0)."""
    assert main(["patch", str(base), str(tmp_path / "out"), "--method", "dca"]) == 2
    assert "--method dca needs --factor" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert main(["patch", str(base), str(tmp_path / "out"), "--method", "dca", "--factor", "2"]) == 0
    assert main(["patch", str(base), str(tmp_path / "sized"), "--method", "dca", "--set", "chunk_size=48"]) == 0


def test_debug_after_a_sub_command_with_its_own_parser(tmp_path, capsys):
    argv = ["finetune", "--config", str(tmp_path / "missing.yaml")]
    assert main(argv) == 2
    assert "missing.yaml" in one_line_error(capsys)
    with pytest.raises(FileNotFoundError):
        main([*argv, "--debug"])


def test_repatching_a_patched_checkpoint_says_it_replaces_the_patch_and_what_it_reaches(base, tmp_path, capsys):
    assert main(["patch", str(base), str(tmp_path / "x4"), "--method", "yarn", "--factor", "4"]) == 0
    assert "note:" not in capsys.readouterr().err
    assert main(["patch", str(tmp_path / "x4"), str(tmp_path / "x2"), "--method", "linear", "--factor", "2"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "note:" in line]
    assert len(notes) == 1, notes
    assert f"already patched by hf-posext (yarn, reaching {4 * L_ORIG})" in notes[0]
    assert f"now reaches {2 * L_ORIG}" in notes[0]


def test_patching_a_checkpoint_with_a_shipped_scaling_says_it_composes_on_it(tmp_path, capsys):
    from tests.helpers.gguf_files import LLAMA3

    tiny_model(max_positions=L_ORIG, rope_parameters=dict(LLAMA3)).save_pretrained(tmp_path / "llama3")
    assert main(["patch", str(tmp_path / "llama3"), str(tmp_path / "out"), "--method", "yarn", "--factor", "2"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "note:" in line]
    assert len(notes) == 1 and f"ships a llama3 rope scaling (reaching {L_ORIG})" in notes[0], notes
    assert f"now reaches {2 * L_ORIG}" in notes[0]
