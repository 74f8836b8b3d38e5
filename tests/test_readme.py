"""The README's first command: `make demo`'s summary is the one the README shows."""

import re
import shlex

from beam_pipeline.pipeline import main
from tests.conftest import ROOT


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


def test_the_demo_prints_the_summary_the_readme_shows(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the recipe's inputs are relative to the repository
    main(demo_arguments(str(tmp_path / "demo")))
    printed = capsys.readouterr().out.strip("\n").split("\n")
    shown = readme_summary()
    assert len(shown) >= 5
    assert printed[:len(shown)] == shown
