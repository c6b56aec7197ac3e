#!/usr/bin/env bash
# Build the documentation site into docs/_build/html. Warnings are errors, so a broken
# link, reference or include fails the build. Nothing is fetched from the network.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh

ensure_venv dev

exec "$VENV/bin/sphinx-build" -W --keep-going -b html docs docs/_build/html "$@"
