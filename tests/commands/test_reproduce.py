"""``hf-posext reproduce``: names checked before anything runs (the pipeline itself: tests/examples/test_run.py)."""

from __future__ import annotations

from hf_posext.commands.main import main
from hf_posext.commands.reproduce import main as reproduce_main


def test_an_unknown_experiment_is_one_line_listing_them(tmp_path, capsys):
    assert main(["reproduce", "--only", "scratch", "nope", "--out", str(tmp_path / "out")]) == 2
    assert reproduce_main(["--only", "nope", "--out", str(tmp_path / "out")]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors == [
        "hf-posext: error: --only: unknown experiment(s) ['nope']; the experiments are: scratch, extension, passkey",
        "hf-posext reproduce: error: --only: unknown experiment(s) ['nope']; the experiments are: scratch, extension, "
        "passkey",
    ]
    assert not (tmp_path / "out").exists()
