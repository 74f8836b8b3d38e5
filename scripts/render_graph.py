"""Renders the real pipeline graph of the demo's inputs to an image, with Beam's RenderRunner.

    .venv/bin/python scripts/render_graph.py docs/pipeline.svg    # needs Graphviz's `dot`

Each branch's steps and the top-level transforms are drawn as boxes; what happens inside a step
is left out, so the picture reads as the path of a record. Nothing is run and nothing is written
but the image.
"""

from __future__ import annotations

import sys
import tempfile

import apache_beam.runners.render  # noqa: F401  (makes --render_output an option)

from beam_pipeline.cli import main

INPUTS = ("examples/data/c4_sample.jsonl", "examples/data/sharegpt_sample.json")
# The boxes: every top-level transform but the branches, each step of a branch, and each step
# of deduplication's first pass.
LEAVES = (r"^((?!KnowledgeBranch$|InstructionBranch$)[^/]+"
          r"|KnowledgeBranch/[^/]+|InstructionBranch/[^/]+"
          r"|KnowledgeBranch/FindDuplicateDocuments/[^/]+)$")


def render(path: str) -> None:
    with tempfile.TemporaryDirectory() as output:
        main([*(f"--input={name}" for name in INPUTS), f"--output={output}/run",
              "--runner=apache_beam.runners.render.RenderRunner", f"--render_output={path}",
              f"--render_leaf_composite_nodes={LEAVES}"])


if __name__ == "__main__":
    render(sys.argv[1])
