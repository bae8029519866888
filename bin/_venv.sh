# Sourced by bin/up and bin/test: make the project's own environment (.venv), install the
# project into it with the extras named in $1 when pyproject.toml changed since the last
# install, and put it first on PATH, so every program started from here (daphne, celery,
# honcho, ruff, pytest) is the project's, whatever shell the command was typed in.
# shellcheck shell=bash

psyevo_venv() {
  local extras=$1
  local python=${PYTHON:-}
  if [ -z "$python" ]; then
    for candidate in python3.11 /usr/bin/python3.11 /usr/local/bin/python3.11; do
      if command -v "$candidate" >/dev/null 2>&1; then python=$candidate; break; fi
    done
  fi
  if [ ! -x .venv/bin/python ]; then
    if [ -z "$python" ] || ! command -v "$python" >/dev/null 2>&1; then
      echo "error: Python 3.11 not found; install it or set PYTHON=/path/to/python3.11" >&2
      return 1
    fi
    echo "==> creating .venv with $python"
    "$python" -m venv .venv
  fi
  # One stamp per extras set: a second start with an unchanged pyproject.toml skips pip
  # (which otherwise spends half a minute asking the index about every dependency).
  local digest stamp
  digest=$(sha256sum pyproject.toml | cut -d' ' -f1)
  stamp=".venv/.psyevo-installed-${extras//,/-}"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ] \
    && [ "$(cat .venv/.psyevo-installed-dev-embedded 2>/dev/null)" != "$digest" ]; then
    echo "==> installing the application into .venv ($extras; the first run takes a few minutes)"
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".[$extras]"
    echo "$digest" >"$stamp"
  fi
  VIRTUAL_ENV="$PWD/.venv"
  PATH="$VIRTUAL_ENV/bin:$PATH"
  export VIRTUAL_ENV PATH
  unset PYTHONHOME
}
