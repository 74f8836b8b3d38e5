"""The README's first command: `make demo`'s summary is the one the README shows, and its
outputs are the reference ones byte for byte (``tests/data/demo_outputs.json``).

The reference holds the SHA-256 of every output file and of the manifest's counting sections.
A change that alters a row on purpose rewrites it:

    .venv/bin/python -m tests.test_readme out/demo > tests/data/demo_outputs.json
"""

import ast
import contextlib
import hashlib
import io
import json
import re
import shlex
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from beam_pipeline.cli import main
from tests.conftest import ROOT, TEST_DATA
from transforms.core.vocabulary import FILTERED, REASONS, REJECTED

REFERENCE = TEST_DATA / "demo_outputs.json"
# The manifest's sections that depend only on the inputs and the configuration (not on the
# time, the machine, the package versions or the output path).
COUNTED = ("records", "knowledge", "instruction", "inputs")


def demo_arguments(output: str) -> list[str]:
    """The pipeline arguments of the Makefile's ``demo`` recipe, writing to ``output``."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    words = shlex.split(recipe.replace("\\\n", " "))
    assert words[:3] == ["$(PY)", "-m", "beam_pipeline"]
    arguments = words[3:]
    at = arguments.index("--output")
    arguments[at + 1] = output
    return arguments


def readme_summary() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"prints a summary such as:\n\n```\n(.*?)```", readme, re.S).group(1)
    return block.strip("\n").split("\n")


def output_digests(output: Path) -> dict[str, str]:
    """SHA-256 of every output file, and of the manifest's counting sections."""
    digests = {path.relative_to(output).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
               for path in sorted(output.rglob("*"))
               # the report and the card hold the run's time and folder: not reference bytes
               if path.is_file() and path.name not in ("manifest.json", "report.html",
                                                       "README.md")}
    manifest = json.loads((output / "manifest.json").read_text())
    counted = json.dumps({key: manifest[key] for key in COUNTED}, sort_keys=True)
    digests["manifest.json#" + ",".join(COUNTED)] = hashlib.sha256(counted.encode()).hexdigest()
    return digests


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, list[str]]:
    """One run of the demo recipe, and what it printed."""
    output = tmp_path_factory.mktemp("demo") / "demo"
    printed = io.StringIO()
    # The recipe's inputs are relative to the repository.
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(printed):
        main(demo_arguments(str(output)))
    return output, printed.getvalue().strip("\n").split("\n")


def test_the_demo_prints_the_summary_the_readme_shows(demo):
    _, printed = demo
    shown = readme_summary()
    assert len(shown) >= 5
    assert printed[:len(shown)] == shown


def test_the_demo_writes_the_reference_outputs_byte_for_byte(demo):
    output, _ = demo
    assert output_digests(output) == json.loads(REFERENCE.read_text())


def test_the_readme_reading_example_runs_on_the_demo(demo, capsys):
    """The README's Python example, on the demo's outputs: it prints the first row's segment
    lengths and trained text, which holds no role header and no system prompt."""
    output, _ = demo
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    assert '"out/demo/sft"' in code
    exec(compile(code.replace('"out/demo/', f'"{output}/'), "README.md", "exec"), {})
    first, *trained = capsys.readouterr().out.split("\n")
    row = pq.ParquetFile(sorted((output / "sft").glob("*.parquet"))[0]).read_row_group(0)
    assert ast.literal_eval(first) == row["seq_lengths"][0].as_py()
    text = "\n".join(trained)
    assert text.strip() and "<|im_start|>" not in text and "You are a helpful" not in text


def test_the_demo_card_declares_a_licence_for_every_input(demo):
    """The Makefile's inputs declare the licences of examples/data/SOURCES.md, so the card
    names one per source and never says "not declared" nor falls back to "other"."""
    output, _ = demo
    card = (output / "README.md").read_text()
    header = yaml.safe_load(card.split("---\n")[1])
    assert header["license"] == ["apache-2.0", "mit", "odc-by"]
    rows = [line for line in card.splitlines() if line.startswith("| `examples/data/")]
    assert len(rows) == 9 and "not declared" not in card
    assert "| `examples/data/c4_sample.jsonl` |  | odc-by | 120 |" in rows


def test_every_reason_the_demo_counts_is_in_the_vocabulary(demo):
    output, _ = demo
    records = json.loads((output / "manifest.json").read_text())["records"]
    for kind in (REJECTED, FILTERED):
        assert records[kind]
        assert {REASONS[code].kind for code in records[kind]} == {kind}


if __name__ == "__main__":
    print(json.dumps(output_digests(Path(sys.argv[1])), indent=1, sort_keys=True))
