"""``benchmarks/passkey_edge.py`` on a tiny Llama: one row per key and depth, resumed per key, other rows kept."""

from __future__ import annotations

import sys

from hf_posext.testing import byte_tokenizer
from tests.helpers import ROOT
from tests.helpers.models import tiny_model

sys.path.insert(0, str(ROOT / "benchmarks"))
import passkey_edge  # noqa: E402  (benchmarks/ is not a package)
from result_schema import read_rows  # noqa: E402


def test_a_row_per_key_and_depth_resumed_per_key_beside_other_rows(tmp_path, capsys, monkeypatch):
    model = tiny_model(vocab_size=260, max_position_embeddings=1024)
    model.save_pretrained(tmp_path / "model")
    byte_tokenizer().save_pretrained(tmp_path / "model")
    out = tmp_path / "edge.json"
    args = [str(tmp_path / "model"), "--length", "400", "--keys", "2", "--depths", "1.0", "0.0", "--out", str(out)]

    assert passkey_edge.main([*args, "--row", "tiny", "--threads", "1"]) == 0
    rows = read_rows(out)
    assert sorted((r.method, r.setting["depth"], r.setting["key"], r.setting["seed"]) for r in rows) == [
        ("tiny", 0.0, 0, 7),
        ("tiny", 0.0, 1, 1007),
        ("tiny", 1.0, 0, 7),
        ("tiny", 1.0, 1, 1007),
    ]
    assert all(isinstance(r.value, bool) and r.metric == "passkey" and "output" in r.extra for r in rows)
    found = {d: sum(r.value for r in rows if r.setting["depth"] == d) for d in (1.0, 0.0)}
    assert f"tiny 400 depth 1.0: {found[1.0]}/2" in capsys.readouterr().out

    # a rerun asks nothing again; another row joins the file
    def asked(*args, **kwargs):
        raise AssertionError("a key on file was asked again")

    with monkeypatch.context() as patch:
        patch.setattr(passkey_edge, "passkey_sample", asked)
        assert passkey_edge.main([*args, "--row", "tiny", "--threads", "1"]) == 0
    assert read_rows(out) == rows
    assert passkey_edge.main([*args, "--row", "other", "--threads", "1", "--keys", "1"]) == 0
    assert sorted({r.method for r in read_rows(out)}) == ["other", "tiny"] and len(read_rows(out)) == 6


def test_no_keys_is_refused_naming_the_value(tmp_path, capsys):
    try:
        passkey_edge.main([str(tmp_path), "--row", "x", "--keys", "0"])
    except SystemExit as stop:
        assert stop.code == 2
    assert "--keys must be at least 1, got 0" in capsys.readouterr().err
