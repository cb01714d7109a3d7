"""``hf-posext demo``'s last line: rounded times, and whether the models came from the cache."""

from __future__ import annotations

from hf_posext.commands.demo import footer


def report(cached: bool) -> dict:
    return {"seconds": 12.34, "cached": {"rope": cached, "alibi": cached},
            "train": {"rope": {"train_seconds": 123.4}, "alibi": {"train_seconds": 124.5}}}


def test_a_cached_run_says_the_training_time_is_not_this_runs():
    # 123.4 + 124.5 is 247.89999999999998 in floating point.
    assert footer(report(True), "hf_posext_out/demo") == (
        "wall time 12.3 s (the models came from the cache; training them took 247.9 s); files in hf_posext_out/demo"
    )


def test_a_training_run_says_what_it_cost():
    assert footer(report(False), "out") == "wall time 12.3 s (training 247.9 s, cached for the next run); files in out"
