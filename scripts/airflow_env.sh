#!/usr/bin/env bash
# Creates the virtual environment that loads and test-runs the Composer DAG: Airflow 3 with the
# Google and Apache Beam providers, pinned by templates/composer/requirements.txt and
# constraints.txt. It lives apart from .venv because Airflow's pins clash with the pipeline's.
#
# Idempotent and cached: the venv records a hash of the two pin files and is rebuilt only when
# they change (about 4 minutes and 2.2 GB the first time). Prints the venv's python.
#   AIRFLOW_VENV  where to create it (default .venv-airflow in the repository root)
#   PYTHON        the interpreter to create it with (default python3; Python 3.11 as in Composer)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${AIRFLOW_VENV:-$ROOT/.venv-airflow}"
REQUIREMENTS="$ROOT/templates/composer/requirements.txt"
CONSTRAINTS="$ROOT/templates/composer/constraints.txt"
STAMP="$VENV/.installed"

want="$(cat "$REQUIREMENTS" "$CONSTRAINTS" | sha256sum | cut -d' ' -f1)"

# One installer at a time: a second caller waits, then finds the stamp.
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9

if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$want" ]]; then
  echo "creating $VENV (Airflow, pinned by templates/composer/)" >&2
  rm -rf "$VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r "$REQUIREMENTS" -c "$CONSTRAINTS"
  "$VENV/bin/python" -m pip check >&2
  echo "$want" > "$STAMP"
fi
echo "$VENV/bin/python"
