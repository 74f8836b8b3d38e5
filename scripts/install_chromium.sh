#!/usr/bin/env bash
# Installs headless Chromium from the distribution's packages, for tests/test_report.py (which
# calls this when no Chromium is found). Debian and Ubuntu only; needs root or sudo.
set -euo pipefail

for name in chromium chromium-browser; do
  if command -v "$name" >/dev/null 2>&1; then
    command -v "$name"
    exit 0
  fi
done
if ! command -v apt-get >/dev/null 2>&1; then
  echo "no apt-get here: install Chromium with your system's package manager" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >&2
# fonts-dejavu-core: the report's text needs a font to render in the screenshot.
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2
command -v chromium
