#!/usr/bin/env bash
# Creates a virtual environment of its own for a tool whose pins clash with the pipeline's, from a
# requirements file and a constraints file that pins every package, and prints its python.
#   side_env.sh VENV REQUIREMENTS CONSTRAINTS
#   PYTHON  the interpreter to create it with (default python3)
#
# Idempotent and cached: the venv records a hash of the two pin files and is rebuilt only when
# they change. One installer at a time: a second caller waits, then finds the stamp.
set -euo pipefail

VENV="$1"
REQUIREMENTS="$2"
CONSTRAINTS="$3"
STAMP="$VENV/.installed"

want="$(cat "$REQUIREMENTS" "$CONSTRAINTS" | sha256sum | cut -d' ' -f1)"

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9

if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$want" ]]; then
  echo "creating $VENV (pinned by $(basename "$(dirname "$REQUIREMENTS")")/)" >&2
  rm -rf "$VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r "$REQUIREMENTS" -c "$CONSTRAINTS"
  "$VENV/bin/python" -m pip check >&2
  echo "$want" > "$STAMP"
fi
echo "$VENV/bin/python"
