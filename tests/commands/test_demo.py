"""``hf-posext demo``'s last line: rounded times, and whether the models came from the cache."""

from __future__ import annotations

import pytest

from hf_posext.commands.demo import footer


def report(cached: bool) -> dict:
    return {
        "seconds": 12.34,
        "cached": {"rope": cached, "alibi": cached},
        "train": {"rope": {"train_seconds": 123.4}, "alibi": {"train_seconds": 124.5}},
    }


def test_a_cached_run_says_the_training_time_is_not_this_runs():
    # 123.4 + 124.5 is 247.89999999999998 in floating point.
    assert footer(report(True), "hf_posext_out/demo") == (
        "wall time 12.3 s (the models came from the cache; training them took 247.9 s); files in hf_posext_out/demo"
    )


def test_a_training_run_says_what_it_cost():
    assert footer(report(False), "out") == "wall time 12.3 s (training 247.9 s, cached for the next run); files in out"


def test_results_of_the_other_configuration_are_replaced_only_with_overwrite(tmp_path, capsys, monkeypatch):
    import dataclasses
    import json

    from hf_posext.commands.main import main
    from hf_posext.experiments import demo

    out = tmp_path / "out"
    out.mkdir()
    full = {"config": json.loads(json.dumps(dataclasses.asdict(demo.FULL))), "results": {"yarn": []}}
    (out / "demo.json").write_text(json.dumps(full))
    ran = []
    monkeypatch.setattr(demo, "run_demo", lambda *a, **k: ran.append(1) or (_ for _ in ()).throw(SystemExit(0)))
    assert main(["demo", "--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "demo.json" in err and "--overwrite" in err and ran == []
    assert json.loads((out / "demo.json").read_text()) == full
    for argv in (["demo", "--out", str(out)], ["demo", "--quick", "--out", str(out), "--overwrite"]):
        with pytest.raises(SystemExit):  # the same configuration, or --overwrite: the demo runs
            main(argv)
    assert ran == [1, 1]
