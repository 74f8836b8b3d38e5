#!/usr/bin/env bash
# Creates the virtual environment in which MosaicML's own reader (`streaming.StreamingDataset`)
# reads the MDS output back in tests/test_output_formats.py: mosaicml-streaming 0.13.0 pins
# numpy < 2.2 and transformers < 5, so it cannot live in .venv. Pinned by
# tests/support/streaming/requirements.txt and constraints.txt; about a minute the first time,
# then cached (scripts/side_env.sh). Prints the venv's python.
#   STREAMING_VENV  where to create it (default .venv-streaming in the repository root)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec "$ROOT/scripts/side_env.sh" "${STREAMING_VENV:-$ROOT/.venv-streaming}" \
  "$ROOT/tests/support/streaming/requirements.txt" "$ROOT/tests/support/streaming/constraints.txt"
