"""A model source that names a local path which does not exist is one line naming it, never a Hub lookup."""

from __future__ import annotations

import time

import pytest
import huggingface_hub.utils

from hf_posext.commands.finetune import main as finetune_main
from hf_posext.commands.main import main
from hf_posext.gguf import check_model_source
from hf_posext.testing import make_tiny_model


@pytest.fixture
def no_network(monkeypatch):
    """Any Hub request fails the test: a mistyped path must never reach the network."""

    def refuse(*args, **kwargs):
        raise AssertionError("a Hub request was made for a local path")

    monkeypatch.setattr(huggingface_hub.utils._http, "http_backoff", refuse, raising=False)
    monkeypatch.setattr(huggingface_hub.utils._http, "get_session", refuse, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


PATHS = [
    "./does-not-exist",
    "../nope/model",
    "/no/such/model",
    "~/no-such-model",
    "out/sub/model",
    "model.gguf",
    "weights/model.safetensors",
]


@pytest.mark.parametrize("source", PATHS)
def test_a_path_shaped_source_that_does_not_exist_is_refused(source):
    with pytest.raises(FileNotFoundError, match=rf"model {source!r} does not exist"):
        check_model_source(source)


def test_a_missing_path_under_an_existing_folder_is_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    with pytest.raises(FileNotFoundError, match="'out/does-not-exist' does not exist"):
        check_model_source("out/does-not-exist")


@pytest.mark.parametrize("source", ["meta-llama/Llama-2-7b-hf", "gpt2", "HuggingFaceTB/SmolLM2-135M"])
def test_hub_ids_stay_hub_ids(source, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    asked = []
    monkeypatch.setattr(huggingface_hub, "model_info", lambda repo_id, **kwargs: asked.append(repo_id))
    check_model_source(source)  # nothing local of that name, no folder it starts with: a Hub id
    assert asked == [source]


class _ConnectError(Exception):
    """What the Hub client raises with the network down (httpx's ConnectError)."""


def test_a_name_that_is_no_local_path_is_refused_at_once_when_the_hub_does_not_answer(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *args, **kwargs: None)

    def no_answer(repo_id, **kwargs):
        assert kwargs["timeout"] <= 10
        raise _ConnectError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub, "model_info", no_answer)
    with pytest.raises(FileNotFoundError, match="nothing at .*models/llama.*the Hub did not answer") as error:
        check_model_source("models/llama")
    assert str(tmp_path / "models" / "llama") in str(error.value)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match="not in the cache with HF_HUB_OFFLINE set"):
        check_model_source("models/llama")
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *args, **kwargs: "/cache/config.json")
    check_model_source("models/llama")  # offline, in the cache: transformers reads it from there


@pytest.mark.parametrize(
    "argv", [["patch", "models/llama", "out", "--method", "yarn", "--factor", "2"], ["doctor", "models/llama"]]
)
def test_a_missing_relative_path_is_one_line_through_the_command_without_hub_retries(
    tmp_path, capsys, monkeypatch, argv
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *args, **kwargs: None)
    monkeypatch.setattr(huggingface_hub, "model_info", lambda *a, **k: (_ for _ in ()).throw(_ConnectError("down")))
    start = time.perf_counter()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'models/llama' is no local path" in err[0], err
    assert time.perf_counter() - start < 5
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["patch", "ppl", "passkey", "ruler", "finetune"])
def test_every_command_names_the_missing_path_at_once(command, tmp_path, capsys, monkeypatch, no_network):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    missing = "out/does-not-exist"
    data = make_tiny_model(tmp_path / "tiny", hidden_size=32, max_position_embeddings=32) / "config.json"
    argv = {
        "patch": ["patch", missing, "extended", "--method", "yarn", "--factor", "2"],
        "ppl": ["eval", "ppl", missing, "--lengths", "16", "--data", str(data)],
        "passkey": ["eval", "passkey", missing, "--lengths", "300"],
        "ruler": ["eval", "ruler", missing, "--lengths", "300"],
        "finetune": ["finetune", "--model", missing, "--dataset", str(data), "--output-dir", "run"],
    }[command]
    capsys.readouterr()
    start = time.perf_counter()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"'{missing}' does not exist" in err[0], err
    assert time.perf_counter() - start < 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tiny"]  # nothing written


def test_relative_paths_in_a_config_file_resolve_against_its_folder(tmp_path, capsys, monkeypatch, no_network):
    folder = tmp_path / "configs"
    folder.mkdir()
    make_tiny_model(folder / "models" / "tiny", hidden_size=32, max_position_embeddings=32)
    (folder / "data.txt").write_text("hello " * 200)
    (folder / "run.yaml").write_text(
        "model: models/tiny\ndataset: data.txt\noutput-dir: runs/out\nmethod: yarn\n"
        "factor: 2\nmax-train-steps: 1\nwarmup-steps: 0\nglobal-batch-size: 1\n"
        "micro-batch-size: 1\nseq-len: 32\nmixed-precision: 'no'\n"
        "activation-checkpointing: false\ncache-dir: cache\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert finetune_main(["--config", str(folder / "run.yaml")]) == 0, capsys.readouterr().err
    assert (folder / "runs" / "out" / "model.safetensors").is_file() and not list(elsewhere.iterdir())

    # Exclusions: a relative pattern is read against the file's folder too; one starting with * matches anywhere.
    from hf_posext.commands.finetune import config_from_args

    (folder / "held_out.txt").write_text("x")
    (folder / "excl.yaml").write_text(
        "model: models/tiny\ndataset: [., '!held_out.txt', '!*/models/*']\noutput-dir: runs/excl\n"
    )
    config = config_from_args(["--config", str(folder / "excl.yaml")])
    assert config.dataset == [str(folder), f"!{folder / 'held_out.txt'}", "!*/models/*"]

    (folder / "bad.yaml").write_text("model: ./models/typo\ndataset: data.txt\noutput-dir: runs/bad\n")
    capsys.readouterr()
    assert finetune_main(["--config", str(folder / "bad.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(folder / "models" / "typo") in err[0] and "does not exist" in err[0], err
