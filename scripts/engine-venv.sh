#!/usr/bin/env bash
# Creates the Python venv the engine's benchmark and client tests use: DuckDB, DataFusion and
# Polars (the peers of `bypass bench engine`), pyarrow, and the clients the engine's server is
# tested with: psycopg (a real PostgreSQL driver), SQLAlchemy and pandas. Idempotent; prints the venv's python path.
# Usage: scripts/engine-venv.sh [VENV_DIR]   (default: $HOME/.cache/bypass/engine-venv)
set -euo pipefail

venv="${1:-${BYPASS_ENGINE_VENV:-$HOME/.cache/bypass/engine-venv}}"
packages=(duckdb==2.0.0 datafusion==55.0.0 polars==2.1.0 pyarrow==26.0.1 "psycopg[binary]==3.3.9"
  sqlalchemy==2.0.58 pandas==2.3.3)

if ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then
  echo "engine-venv: python3-venv is missing (apt-get install python3-venv)" >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import duckdb, datafusion, polars, pyarrow, psycopg, sqlalchemy, pandas" >/dev/null 2>&1; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${packages[@]}"
fi
echo "$venv/bin/python"
