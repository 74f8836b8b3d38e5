#!/usr/bin/env bash
# Creates the virtual environment that loads and test-runs the Composer DAG: Airflow 3 with the
# Google and Apache Beam providers, pinned by templates/composer/requirements.txt and
# constraints.txt. It lives apart from .venv because Airflow's pins clash with the pipeline's.
# About 4 minutes and 2.2 GB the first time, then cached (scripts/side_env.sh). Prints the venv's
# python.
#   AIRFLOW_VENV  where to create it (default .venv-airflow in the repository root)
#   PYTHON        the interpreter to create it with (default python3; Python 3.11 as in Composer)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec "$ROOT/scripts/side_env.sh" "${AIRFLOW_VENV:-$ROOT/.venv-airflow}" \
  "$ROOT/templates/composer/requirements.txt" "$ROOT/templates/composer/constraints.txt"
