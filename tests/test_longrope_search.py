"""LongRoPE's factor search (hf_posext.search_longrope) and ``hf-posext search longrope``.

Properties from the paper's algorithm: every candidate non-decreasing and between 1 and s, never a
repeat, the result never worse than its start, the same seed the same search, a killed search
resumed equal to an uninterrupted one, and the fitness equal to a perplexity computed by hand.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from tests.helpers.models import tiny_model, tokens
from transformers import AutoConfig, AutoModelForCausalLM

import hf_posext
from hf_posext import longrope_population, longrope_search
from hf_posext.commands.main import main
from hf_posext.testing import make_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

L_ORIG = 16


def search(model, ids, **kwargs):
    settings = dict(factor=4, length=48, population=6, rounds=3, seed=0, progress=False)
    return hf_posext.search_longrope(model, ids, **{**settings, **kwargs})


def test_search_properties_and_determinism(monkeypatch):
    model = tiny_model("llama", max_positions=L_ORIG)
    ids = tokens(64, batch=2)
    seen: list[tuple[float, ...]] = []
    evaluate = longrope_population.Population.perplexity

    def recording(self, factors):
        if factors not in self.evaluated:
            seen.append(factors)
        return evaluate(self, factors)

    monkeypatch.setattr(longrope_population.Population, "perplexity", recording)
    result = search(model, ids)
    assert len(seen) == len(set(seen)) > 6  # repeats are skipped
    for factors in seen:
        assert len(factors) == 16 and all(1 <= a <= b <= 4 for a, b in zip(factors, factors[1:]))
    assert result.perplexity <= result.start_perplexity
    assert [h["round"] for h in result.history] == [1, 2, 3]
    assert all(a["best_perplexity"] >= b["best_perplexity"] for a, b in zip(result.history, result.history[1:]))
    assert hf_posext.patched_method(model) is None  # the model is left as it was
    assert search(model, ids).to_dict() == result.to_dict()


def test_fitness_is_the_perplexity_of_transformers_longrope_model():
    model = tiny_model("llama", max_positions=L_ORIG)
    ids = tokens(64, batch=2)
    result = search(model, ids, rounds=1)
    hf_posext.patch_model(
        model,
        "longrope",
        factor=4,
        long_factor=result.long_factor,
        attention_factor=result.attention_factor,
        exact_cache=False,
    )
    with torch.no_grad():
        logits = model(ids[:, :48]).logits[:, :-1]
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:48].reshape(-1))
    assert math.isclose(result.perplexity, math.exp(nll.item()), rel_tol=1e-5)


def perplexity_by_hand(model, ids, length, score_last):
    with torch.no_grad():
        logits = model(ids[:, :length]).logits[:, -score_last - 1 : -1]
    targets = ids[:, length - score_last : length]
    return math.exp(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).item())


@pytest.mark.parametrize("arch", ("llama", "qwen3"))
def test_the_start_is_yarn_exactly(arch):
    """The starting individual is YaRN at the searched length: its factors and its attention factor 0.1 ln s + 1."""
    model = tiny_model(arch, max_positions=L_ORIG)
    ids = tokens(64, batch=2)
    result = search(model, ids, rounds=0, population=2)
    assert result.attention_factor == pytest.approx(0.1 * math.log(4) + 1, rel=1e-12)
    hf_posext.patch_model(model, "yarn", factor=4)
    assert math.isclose(result.start_perplexity, perplexity_by_hand(model, ids, 48, 47), rel_tol=1e-5)


def test_score_last_scores_the_last_tokens_of_each_window():
    model = tiny_model("llama", max_positions=L_ORIG)
    ids = tokens(64, batch=2)
    result = search(model, ids, rounds=1, score_last=10)
    hf_posext.patch_model(
        model,
        "longrope",
        factor=4,
        long_factor=result.long_factor,
        attention_factor=result.attention_factor,
        exact_cache=False,
    )
    assert result.score_last == 10
    assert math.isclose(result.perplexity, perplexity_by_hand(model, ids, 48, 10), rel_tol=1e-5)


def test_keep_first_scores_every_candidate_with_its_first_positions_on_plain_rope():
    """The paper's n-hat, fixed for the search: fitness = the perplexity of patch_model(..., keep_first=n)."""
    model = tiny_model("llama", max_positions=L_ORIG)
    ids = tokens(64, batch=2)
    result = search(model, ids, rounds=1, keep_first=4)
    assert result.keep_first == 4 and result.perplexity <= result.start_perplexity
    hf_posext.patch_model(
        model,
        "longrope",
        factor=4,
        long_factor=result.long_factor,
        attention_factor=result.attention_factor,
        keep_first=4,
        exact_cache=False,
    )
    assert math.isclose(result.perplexity, perplexity_by_hand(model, ids, 48, 47), rel_tol=1e-5)
    hf_posext.unpatch_model(model)
    assert search(model, ids, rounds=1, keep_first=0).to_dict() == search(model, ids, rounds=1).to_dict()
    assert (
        search(model, ids, rounds=0, population=2, keep_first=4).start_perplexity
        != search(model, ids, rounds=0, population=2).start_perplexity
    )


def test_killed_search_resumes_to_the_same_result(tmp_path, monkeypatch):
    model = tiny_model("llama", max_positions=L_ORIG)
    ids = tokens(64)
    uninterrupted = search(model, ids)
    state = tmp_path / "state.json"
    written = longrope_search.write_text
    calls = []

    def killed_after_two_rounds(path, text):
        written(path, text)
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(longrope_search, "write_text", killed_after_two_rounds)
    with pytest.raises(KeyboardInterrupt):
        search(model, ids, state_path=state)
    assert json.loads(state.read_text())["round"] == 2 and hf_posext.patched_method(model) is None
    monkeypatch.setattr(longrope_search, "write_text", written)
    assert search(model, ids, state_path=state).to_dict() == uninterrupted.to_dict()
    with pytest.raises(ValueError, match="holds the state of another search"):
        search(model, ids, state_path=state, seed=5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"factor": 0.5}, "factor must be >= 1"),
        ({"length": 16}, "length must be above the original context 16"),
        ({"length": 65}, "length 65 is beyond the text"),
        ({"population": 1}, "population must be"),
        ({"rounds": -1}, "rounds must be"),
        ({"score_last": 48}, "score_last must be an int in \\[1, 47\\]"),
        ({"attention_factor": 0}, "attention_factor must be a positive number"),
        (
            {"keep_first": -1},
            r"keep_first must be an int in \[0, 15\] \(the first positions .* below length 48\), got -1",
        ),
        ({"keep_first": 48}, r"keep_first must be an int in \[0, 15\] .*got 48"),
        ({"keep_first": 16}, r"keep_first must be an int in \[0, 15\] .*got 16"),
        ({"keep_first": 2.0}, r"keep_first must be an int in \[0, 15\] .*got 2.0"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        search(tiny_model("llama", max_positions=L_ORIG), tokens(64), **kwargs)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("search")
    path = make_tiny_model(root / "tiny", hidden_size=32, max_position_embeddings=16)
    text = root / "doc.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 6)
    return path, text


def test_cli_writes_a_checkpoint_with_the_factors_and_a_log(checkpoint, tmp_path, capsys):
    path, text = checkpoint
    out = tmp_path / "out"
    assert (
        main(
            [
                "search",
                "longrope",
                str(path),
                str(out),
                "--factor",
                "4",
                "--length",
                "40",
                "--data",
                str(text),
                "--population",
                "4",
                "--rounds",
                "2",
                "--no-progress",
            ]
        )
        == 0
    )
    log = json.loads((out / "longrope_search.json").read_text())
    config = AutoConfig.from_pretrained(out)
    assert config.rope_parameters["rope_type"] == "longrope"
    assert config.rope_parameters["long_factor"] == log["result"]["long_factor"]
    assert config.rope_parameters["attention_factor"] == log["result"]["attention_factor"] == 0.1 * math.log(4) + 1
    assert len(log["result"]["history"]) == 2 and not (tmp_path / "out.search-state.json").exists()
    assert isinstance(AutoModelForCausalLM.from_pretrained(out), torch.nn.Module)
    assert "wrote" in capsys.readouterr().out


def test_cli_keep_first_writes_the_plugins_rope_type(checkpoint, tmp_path):
    path, text = checkpoint
    out = tmp_path / "out"
    assert (
        main(
            [
                "search",
                "longrope",
                str(path),
                str(out),
                "--factor",
                "4",
                "--length",
                "40",
                "--data",
                str(text),
                "--population",
                "2",
                "--rounds",
                "0",
                "--keep-first",
                "3",
                "--no-progress",
            ]
        )
        == 0
    )
    log = json.loads((out / "longrope_search.json").read_text())
    assert log["settings"]["keep_first"] == log["result"]["keep_first"] == 3
    model = hf_posext.from_pretrained(out)
    assert model.config.rope_parameters["rope_type"] == hf_posext.rope_utils.LONGROPE_KEEP_FIRST_ROPE_TYPE
    assert model.config.rope_parameters["keep_first"] == 3


@pytest.mark.parametrize(
    ("flag", "expected"), [("longrope", math.sqrt(1 + math.log(4) / math.log(16))), ("1.25", 1.25)]
)
def test_cli_attention_factor_is_every_candidates_and_the_checkpoints(checkpoint, tmp_path, flag, expected):
    path, text = checkpoint
    out = tmp_path / "out"
    argv = ["search", "longrope", str(path), str(out), "--factor", "4", "--length", "40", "--data", str(text)]
    assert main([*argv, "--population", "2", "--rounds", "0", "--attention-factor", flag, "--no-progress"]) == 0
    log = json.loads((out / "longrope_search.json").read_text())
    assert log["settings"]["attention_factor"] == log["result"]["attention_factor"] == pytest.approx(expected)
    assert AutoConfig.from_pretrained(out).rope_parameters["attention_factor"] == pytest.approx(expected)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--attention-factor", "0"],
            "argument --attention-factor: expected a finite number > 0 or 'longrope', got '0'",
        ),
        (
            ["--attention-factor", "yarn"],
            "argument --attention-factor: expected a finite number > 0 or 'longrope', got 'yarn'",
        ),
        (["--factor", "0.5"], "argument --factor: expected a finite number >= 1, got '0.5'"),
        (["--length", "16"], "--length must be above the model's original context 16"),
        (["--length", "4000"], "--length 4000 is beyond the text"),
        (["--population", "1"], "argument --population: expected an integer >= 2, got '1'"),
        (["--score-last", "40"], "--score-last must be in [1, 39]"),
        (["--keep-first", "-1"], "argument --keep-first: expected an integer >= 0, got '-1'"),
        (
            ["--keep-first", "16"],
            "--keep-first must be in [0, 15] (positions kept on plain RoPE, within the model's "
            "original context 16), got 16",
        ),
    ],
)
def test_cli_bad_input_is_one_line_naming_the_flag_and_writes_nothing(checkpoint, tmp_path, capsys, flags, message):
    path, text = checkpoint
    args = {"--factor": "4", "--length": "40", "--population": "4", "--rounds": "1"}
    args.update(dict(zip(flags[::2], flags[1::2])))
    argv = ["search", "longrope", str(path), str(tmp_path / "out"), "--data", str(text), "--no-progress"]
    try:
        code = main([*argv, *(x for kv in args.items() for x in kv)])
    except SystemExit as exit_:  # a value outside a flag's declared range: argparse's one line
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


SHIPPED_SCALINGS = {
    "llama3": {"factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    "yarn": {"factor": 2.0, "original_max_position_embeddings": 16},
}


@pytest.fixture(params=sorted(SHIPPED_SCALINGS))
def scaled_checkpoint(checkpoint, tmp_path, request):
    """The tiny checkpoint shipping a static scaling to 32 tokens (as Llama 3.1 ships llama3)."""
    path, text = checkpoint
    scaled = tmp_path / "scaled"
    shutil.copytree(path, scaled)
    config = json.loads((scaled / "config.json").read_text())
    rope = {"rope_type": request.param, "rope_theta": 10_000.0, **SHIPPED_SCALINGS[request.param]}
    config.update(rope_parameters=rope, max_position_embeddings=32)
    (scaled / "config.json").write_text(json.dumps(config))
    return scaled, text, request.param


def test_cli_on_a_shipped_scaling_refuses_before_the_first_round_naming_override(
    scaled_checkpoint, tmp_path, capsys, monkeypatch
):
    path, text, rope_type = scaled_checkpoint

    def no_round(*args, **kwargs):
        raise AssertionError("the search ran before the refusal")

    monkeypatch.setattr(longrope_search, "search_longrope", no_round)
    out = tmp_path / "out"
    argv = ["search", "longrope", str(path), str(out), "--factor", "4", "--length", "40", "--data", str(text)]
    assert main([*argv, "--population", "2", "--rounds", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"rope_type={rope_type!r}" in err[0] and "--override" in err[0], err
    assert "override=True" not in err[0]  # the Python API's spelling, which the command does not take
    assert not out.exists() and not (tmp_path / "out.search-state.json").exists()


def test_cli_override_writes_the_searched_factors_over_plain_rope(scaled_checkpoint, tmp_path):
    path, text, _ = scaled_checkpoint
    out = tmp_path / "out"
    argv = ["search", "longrope", str(path), str(out), "--factor", "4", "--length", "40", "--data", str(text)]
    assert main([*argv, "--population", "4", "--rounds", "1", "--override", "--no-progress"]) == 0
    log = json.loads((out / "longrope_search.json").read_text())
    rope = AutoConfig.from_pretrained(out).rope_parameters
    assert rope["rope_type"] == "longrope" and rope["long_factor"] == log["result"]["long_factor"]
    # The factors divide plain RoPE at the pretraining context, as every candidate was scored.
    assert rope["original_max_position_embeddings"] == 16 and rope["factor"] == 4
    assert not (tmp_path / "out.search-state.json").exists()
