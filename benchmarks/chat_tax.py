"""The chat tax on SmolLM2-135M-Instruct (8k -> 32k): short chat answers of extended models against the base's.

100 instructions about documented functions of the standard library's held-out files
(:func:`hf_posext.eval.agreement.docstring_instructions`, disjoint from every training prompt), asked
through the chat template. The base model's greedy answers (32 new tokens) are the reference; each
row reports ``agreement`` (the share of answers equal to the base's) and ``answer_loglik`` (the mean
log-likelihood per token of the base's answers). Every answer is appended to
``results/chat_tax/cells/<row>.jsonl`` (the row's name as a slug) as it is computed, so a stopped run
resumes where it stopped;
``--report`` writes the rows to ``results/chat_tax.json`` and the table to ``results/chat_tax.md``.

    GGUF=$(cd benchmarks && python -c "from harness import smollm2_gguf; print(smollm2_gguf())")
    python benchmarks/chat_tax.py row base "$GGUF"                                  # the reference answers
    python benchmarks/chat_tax.py row "yarn s=4" "$GGUF" --method yarn --factor 4   # untrained static YaRN
    python benchmarks/chat_tax.py row "recipe" runs/smollm2-32k-published           # a checkpoint folder
    python benchmarks/chat_tax.py passkey "yarn s=4" "$GGUF" --method yarn --factor 4  # 20 keys at 16k and 32k
    python benchmarks/chat_tax.py training-data examples/data/chat_smollm2.jsonl --count 400  # self-distilled
    python benchmarks/chat_tax.py --report
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from collections.abc import Callable
from typing import Any, TextIO

from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import current_versions, device_name, now  # noqa: E402
from result_schema import Row, write_rows  # noqa: E402

from hf_posext import patch_model  # noqa: E402
from hf_posext.eval.agreement import (  # noqa: E402
    agreement,
    answer_loglik,
    docstring_instructions,
    greedy_answer,
    self_distilled_conversations,
)
from hf_posext.eval.evaluated_model import load_model, model_fingerprint  # noqa: E402
from hf_posext.eval.passkey import passkey_accuracy  # noqa: E402
from training_free_real_model import key_schedule, key_seed  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "chat_tax"
INSTRUCTIONS = 100
MAX_NEW_TOKENS = 32
#: The rows in the report's order; the first is the reference.
ROWS = ("base", "yarn s=4", "recipe", "recipe + conversations")
PASSKEY_LENGTHS = (16384, 32768)


def slug(row: str) -> str:
    """A row's file name: ``yarn s=4`` -> ``yarn-s4``, ``recipe + conversations`` -> ``recipe-conversations``."""
    return "-".join("".join(c for c in word if c.isalnum()) for word in row.split() if any(c.isalnum() for c in word))


def instructions() -> list[str]:
    return docstring_instructions("test", INSTRUCTIONS, seed=0)


def read_log(kind: str, row: str, key: Callable[[dict[str, Any]], Any]) -> dict[Any, dict[str, Any]]:
    """The cells ``results/chat_tax/<kind>/<row>.jsonl`` holds, by ``key``; a line cut by a kill is asked again."""
    path = log_path(kind, row)
    cells = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            cell = json.loads(line)
        except json.JSONDecodeError:
            continue
        cells[key(cell)] = cell
    return cells


def log_path(kind: str, row: str) -> Path:
    return OUT / kind / f"{slug(row)}.jsonl"


def open_log(kind: str, row: str, done: dict[Any, dict[str, Any]], fingerprint: dict[str, Any]) -> TextIO:
    """``row``'s log opened for appending, refused when its cells were measured on another model."""
    path = log_path(kind, row)
    if done and next(iter(done.values()))["fingerprint"] != fingerprint:
        raise SystemExit(f"{path} was measured on another model: move it aside first")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("a")


def read_cells(row: str) -> dict[int, dict[str, Any]]:
    return read_log("cells", row, lambda cell: cell["index"])


def run_row(row: str, model_path: str, method: str | None, factor: float | None) -> None:
    """Every instruction's greedy answer (and the base answer's log-likelihood) for ``row``, resumable."""
    prompts = instructions()
    reference = read_cells("base") if row != "base" else {}
    if row != "base" and len(reference) < len(prompts):
        raise SystemExit(f"the base row has {len(reference)} of {len(prompts)} answers: run it first")
    model, tokenizer, fingerprint = load_row(model_path, method, factor)
    done = read_cells(row)
    with open_log("cells", row, done, fingerprint) as handle:
        for index, prompt in enumerate(tqdm(prompts, desc=row)):
            if index in done:
                continue
            answer = greedy_answer(model, tokenizer, prompt, MAX_NEW_TOKENS)
            base_answer = reference[index]["answer"] if row != "base" else answer
            cell = {
                "index": index,
                "fingerprint": fingerprint,
                "answer": answer,
                "loglik": answer_loglik(model, tokenizer, prompt, base_answer),
            }
            handle.write(json.dumps(cell) + "\n")
            handle.flush()


def load_row(model_path: str, method: str | None, factor: float | None) -> tuple[Any, Any, dict[str, Any]]:
    model, tokenizer = load_model(model_path, dtype="float32", device="cpu")
    if method:
        patch_model(model, method, factor=factor)
    return model, tokenizer, {"model": model_fingerprint(model_path), "method": method, "factor": factor}


def read_keys(row: str) -> dict[tuple[int, int], dict[str, Any]]:
    return read_log("passkey", row, lambda cell: (cell["length"], cell["index"]))


def run_passkeys(
    row: str, model_path: str, method: str | None, factor: float | None, lengths: list[int], keys: int
) -> None:
    """Passkeys through the chat template: the schedule's ``keys`` keys at each length (every row the same prompts)."""
    model, tokenizer, fingerprint = load_row(model_path, method, factor)
    done = read_keys(row)
    with open_log("passkey", row, done, fingerprint) as handle:
        for length in lengths:
            for index, depth in tqdm(key_schedule(keys), desc=f"{row} {length}"):
                if (length, index) in done:
                    continue
                result = passkey_accuracy(
                    model, tokenizer, [length - 10], [depth], 1, seed=key_seed(index), progress=False, chat=True
                )
                sample = result.samples[0]
                cell = {"length": length, "index": index, "depth": depth, "fingerprint": fingerprint}
                cell.update(correct=sample["correct"], continuation=sample["continuation"])
                handle.write(json.dumps(cell) + "\n")
                handle.flush()


def training_data(out: Path, count: int, model_path: str) -> None:
    """Self-distilled conversations on the train split's functions (the base model's own answers)."""
    model, tokenizer = load_model(model_path, dtype="float32", device="cpu")
    prompts = docstring_instructions("train", count, seed=1)
    done = {json.loads(line)["instruction"] for line in out.read_text().splitlines()} if out.is_file() else set()
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as handle:
        for index, prompt in enumerate(tqdm(prompts, desc="self-distilling")):
            if index in done:
                continue
            for record in self_distilled_conversations(model, tokenizer, [prompt]):
                # "instruction": which one, so a stopped run resumes (an empty answer writes no record)
                handle.write(json.dumps({**record, "instruction": index}) + "\n")
            handle.flush()


def report() -> str:
    prompts = instructions()
    base = read_cells("base")
    rows, lines = [], ["| row | agreement | answer log-likelihood | instructions |", "|---|---|---|---|"]
    for name in ROWS:
        cells = read_cells(name)
        if len(cells) < len(prompts):
            lines.append(f"| {name} | not measured ({len(cells)}/{len(prompts)}) | | |")
            continue
        share = agreement(
            [cells[i]["answer"] for i in range(len(prompts))], [base[i]["answer"] for i in range(len(prompts))]
        )
        loglik = sum(cells[i]["loglik"] for i in range(len(prompts))) / len(prompts)
        fingerprint = cells[0]["fingerprint"]
        setting = {"instructions": len(prompts), "max_new_tokens": MAX_NEW_TOKENS, "row": name}
        for metric, value, unit in (("agreement", share, "share"), ("answer_loglik", loglik, "nats/token")):
            rows.append(
                Row(
                    "chat_tax",
                    fingerprint["method"] or "none",
                    setting,
                    metric,
                    value,
                    unit,
                    device_name(),
                    current_versions(),
                    now(),
                    {"fingerprint": fingerprint},
                )
            )
        lines.append(f"| {name} | {share:.2f} | {loglik:.3f} | {len(prompts)} |")
    lines += ["", "Passkeys through the chat template (found / asked):", ""]
    header = "| row | " + " | ".join(f"{n // 1024}k" for n in PASSKEY_LENGTHS) + " |"
    lines += [header, "|---" * (len(PASSKEY_LENGTHS) + 1) + "|"]
    for name in ROWS:
        keys = read_keys(name)
        found = []
        for length in PASSKEY_LENGTHS:
            cells = [cell for (n, _), cell in keys.items() if n == length]
            found.append(f"{sum(c['correct'] for c in cells)}/{len(cells)}" if cells else "not measured")
            if cells:
                setting = {"length": length, "keys": len(cells), "row": name, "chat_template": True}
                rows.append(
                    Row(
                        "chat_tax",
                        cells[0]["fingerprint"]["method"] or "none",
                        setting,
                        "passkey_found",
                        sum(c["correct"] for c in cells),
                        "keys",
                        device_name(),
                        current_versions(),
                        now(),
                        {"fingerprint": cells[0]["fingerprint"]},
                    )
                )
        lines.append(f"| {name} | " + " | ".join(found) + " |")
    write_rows(OUT.parent / "chat_tax.json", rows, replace=lambda row: row.benchmark == "chat_tax")
    text = "\n".join(lines) + "\n"
    (OUT.parent / "chat_tax.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", action="store_true", help="write the rows and the table from the cells")
    sub = parser.add_subparsers(dest="command")
    row = sub.add_parser("row", help="answer every instruction with one model")
    row.add_argument("name", choices=ROWS)
    row.add_argument("model", help="a checkpoint folder or a .gguf file")
    row.add_argument("--method", default=None)
    row.add_argument("--factor", type=float, default=None)
    keys = sub.add_parser("passkey", help="passkeys through the chat template, the same prompts for every row")
    keys.add_argument("name", choices=ROWS)
    keys.add_argument("model", help="a checkpoint folder or a .gguf file")
    keys.add_argument("--method", default=None)
    keys.add_argument("--factor", type=float, default=None)
    keys.add_argument("--lengths", type=int, nargs="+", default=list(PASSKEY_LENGTHS))
    keys.add_argument("--keys", type=int, default=20)
    data = sub.add_parser("training-data", help="self-distilled conversations for the recipe's short side")
    data.add_argument("out", type=Path)
    data.add_argument("--count", type=int, default=400)
    data.add_argument("--model", required=True)
    args = parser.parse_args(argv)
    if args.command == "row":
        run_row(args.name, args.model, args.method, args.factor)
    elif args.command == "passkey":
        run_passkeys(args.name, args.model, args.method, args.factor, args.lengths, args.keys)
    elif args.command == "training-data":
        training_data(args.out, args.count, args.model)
    if args.report:
        print(report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
