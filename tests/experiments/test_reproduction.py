"""The laptop reproduction's bookkeeping (hf_posext.experiments.reproduction); the experiments
themselves run end to end, shrunk, in tests/examples/test_run.py."""

from __future__ import annotations

from dataclasses import replace

from hf_posext.experiments import reproduction, tinylm


def test_results_are_keyed_on_how_the_model_was_trained(monkeypatch):
    # After the tiny model's schedule changed (cache format 3), extension.json was reused as it
    # was: its settings held the model's sizes, not how it was trained. The model's cache key
    # (recipe format, Python, transformers) is part of the settings now.
    config = reproduction.QUICK
    settings = reproduction._settings(config, "model", "multiples")
    assert settings["model_key"] == config.model.key()
    assert (
        reproduction._settings(
            replace(config, model=replace(config.model, steps=config.model.steps + 1)), "model", "multiples"
        )
        != settings
    )
    real_key = tinylm.TinyLMConfig.key
    monkeypatch.setattr(tinylm.TinyLMConfig, "key", lambda self: "another-recipe-" + real_key(self))
    assert reproduction._settings(config, "model", "multiples") != settings
