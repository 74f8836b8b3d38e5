"""JSON-lines inputs written for a test, where their records sit, and a run's filtered/ rows."""

import json
from pathlib import Path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def line_offsets(path: Path) -> list[int]:
    """Each line's byte offset: the position a record of a JSON-lines file is reported at."""
    offsets, at = [], 0
    for line in path.read_bytes().splitlines(keepends=True):
        offsets.append(at)
        at += len(line)
    return offsets


def filtered_rows(output: Path) -> list[dict]:
    """Every row of a run's filtered/ files (--write_filtered), in file order."""
    return [json.loads(line) for path in sorted((output / "filtered").glob("*.jsonl"))
            for line in path.read_text().splitlines()]
