"""A hand-edited checkpoint is refused on every load path, with one line naming its config.json and the field.

Values read from a checkpoint are checked as strictly as values a user passes: each bad field (rope
factors non-finite, negative or misshapen, lengths that are not positive integers, the hf-posext
record malformed) is tried on every way in - ``hf_posext.from_pretrained``, transformers'
``AutoModelForCausalLM`` after ``import hf_posext``, the eval commands, ``hf-posext patch`` and
``hf-posext gguf export`` - and never runs.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

import hf_posext
from hf_posext.commands.main import main
from hf_posext.testing import make_tiny_model

#: The methods the bad fields are written into, with their arguments.
BASES = {
    "yarn": ["--factor", "4"],
    "longrope": ["--factor", "4"],
    "dynamic_yarn": ["--factor", "4"],
    "string": ["--factor", "4"],
    "rerope": ["--factor", "4"],
    "alibi": [],
}


def _set(*path):
    def edit(config):
        *keys, last, value = path
        target = config
        for key in keys:
            target = target[key]
        if callable(value):
            target[last] = value(target[last])
        else:
            target[last] = value

    return edit


#: (base method, edit of config.json, the field the message names).
BAD = {
    "factor-nan": ("yarn", _set("rope_parameters", "factor", math.nan), "['factor']"),
    "factor-negative": ("yarn", _set("rope_parameters", "factor", -4.0), "['factor']"),
    "theta-infinite": ("string", _set("rope_parameters", "rope_theta", math.inf), "['rope_theta']"),
    "original-zero": ("yarn", _set("rope_parameters", "original_max_position_embeddings", 0), "original_max"),
    "original-fraction": ("yarn", _set("rope_parameters", "original_max_position_embeddings", 63.5), "original_max"),
    "max-positions-negative": ("yarn", _set("max_position_embeddings", -256), "max_position_embeddings"),
    "short-factor-misshapen": ("longrope", _set("rope_parameters", "short_factor", lambda v: v[:-1]), "short_factor"),
    "long-factor-negative": (
        "longrope",
        _set("rope_parameters", "long_factor", lambda v: [-1.0, *v[1:]]),
        "long_factor",
    ),
    "record-not-a-mapping": ("yarn", _set("hf_posext", [1, 2]), "hf_posext"),
    # on a rope type of its own (STRING's); a plugin's method on transformers' own loads (tests/test_loading.py)
    "record-unknown-method": ("string", _set("hf_posext", "method", "bogus"), "'bogus'"),
    "record-factor-nan": ("dynamic_yarn", _set("hf_posext", "factor", math.nan), "factor"),
    "record-shift-negative": ("string", _set("hf_posext", "shift", -3), "shift"),
    "record-window-fraction": ("rerope", _set("hf_posext", "window", 2.5), "window"),
    "record-context-zero": ("string", _set("hf_posext", "context_length", 0), "context_length"),
    "record-base-theta-nan": ("yarn", _set("hf_posext", "base_rope_parameters", "rope_theta", math.nan), "rope_theta"),
    "record-keep-first-negative": ("longrope", _set("hf_posext", "keep_first", -1), "keep_first"),
    "record-backend-unknown": ("alibi", _set("hf_posext", "backend", "bogus"), "backend"),
    "head-dim-negative": ("string", _set("head_dim", -16), "head_dim"),
    "heads-zero": ("yarn", _set("num_key_value_heads", 0), "num_key_value_heads"),
}
#: Fields transformers' strict config classes refuse first when they build the config (a type error, two
#: lines naming no file): refused there on the paths that read config.json through transformers alone.
STRICT = {"max-positions-fraction": ("yarn", _set("max_position_embeddings", 255.5), "max_position_embeddings")}


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("bases")
    tiny = make_tiny_model(root / "tiny", hidden_size=64, max_position_embeddings=64)
    for method, arguments in BASES.items():
        assert main(["patch", str(tiny), str(root / method), "--method", method, *arguments]) == 0
    (root / "text.txt").write_text("The grass is green. The sky is blue. " * 40)
    return root


def library(load):
    def attempt(folder: Path, tmp_path: Path, capsys) -> str:
        with pytest.raises(ValueError) as error:
            load(folder)
        return str(error.value)

    return attempt


def command(argv):
    def attempt(folder: Path, tmp_path: Path, capsys) -> str:
        assert main([part.format(folder=folder, out=tmp_path / "out") for part in argv]) == 2
        return capsys.readouterr().err

    return attempt


PATHS = {
    "hf_posext.from_pretrained": library(hf_posext.from_pretrained),
    "AutoModelForCausalLM": library(AutoModelForCausalLM.from_pretrained),
    "eval ppl": command(
        ["eval", "ppl", "{folder}", "--lengths", "32", "--data", "{folder}/../text.txt", "--out", "{out}"]
    ),
    "patch": command(["patch", "{folder}", "{out}", "--method", "yarn", "--factor", "2", "--override"]),
    "gguf export": command(["gguf", "export", "{folder}", "{out}.gguf", "--converter", "{folder}"]),
}


def edited(bases, tmp_path, method, edit) -> Path:
    folder = tmp_path / "edited"
    shutil.copytree(bases / method, folder)
    shutil.copy(bases / "text.txt", tmp_path / "text.txt")
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("path", [path for path in PATHS if path != "AutoModelForCausalLM"])
@pytest.mark.parametrize("bad", STRICT)
def test_a_field_transformers_refuses_first_is_one_line_naming_the_file_on_the_plugins_paths(
    bases, tmp_path, capsys, bad, path
):
    method, edit, field = STRICT[bad]
    folder = edited(bases, tmp_path, method, edit)
    capsys.readouterr()
    lines = PATHS[path](folder, tmp_path, capsys).strip().splitlines()
    assert len(lines) == 1 and str(folder / "config.json") in lines[0] and field in lines[0], lines
    with pytest.raises(Exception, match=field):  # transformers' own loader: its error, but refused too
        AutoModelForCausalLM.from_pretrained(folder)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bad", BAD)
def test_a_hand_edited_config_is_refused_in_one_line_on_every_load_path(bases, tmp_path, capsys, bad, path):
    method, edit, field = BAD[bad]
    folder = edited(bases, tmp_path, method, edit)
    capsys.readouterr()
    message = PATHS[path](folder, tmp_path, capsys)
    lines = message.strip().splitlines()
    assert len(lines) == 1, message
    assert str(folder / "config.json") in lines[0] and field in lines[0], lines[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.gguf").exists()
