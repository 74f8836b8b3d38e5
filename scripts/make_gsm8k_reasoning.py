"""Builds examples/data/gsm8k_reasoning_sample.jsonl, a small reasoning set, from the GSM8K sample.

Each GSM8K answer is a worked solution that ends with a ``#### N`` line. The solution becomes the
record's ``reasoning`` and ``N`` its ``answer``, so a run trains (or, with
``--train_reasoning=false``, only conditions on) the reasoning the chat template renders:

    python scripts/make_gsm8k_reasoning.py examples/data/gsm8k_sample.jsonl \\
        examples/data/gsm8k_reasoning_sample.jsonl
"""

from __future__ import annotations

import json
import sys


def reasoning_record(row: dict) -> dict:
    solution, _, final = row["answer"].rpartition("\n#### ")
    if not solution:
        raise ValueError(f"no '#### N' line in {row['answer']!r}")
    return {"question": row["question"], "reasoning": solution.strip(), "answer": final.strip()}


def main(source: str, target: str) -> None:
    with open(source, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with open(target, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(reasoning_record(row), ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
