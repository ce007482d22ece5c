# Sourced by the other scripts: make .venv once, reinstall when pyproject.toml changes.
# Needs only python3 (3.11+) and pip; everything else comes from the package index.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
stamp="$VENV/.installed-$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "==> preparing $VENV (first run installs CrewAI and friends; about two minutes)" >&2
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$PY" -m pip install -qq --upgrade pip
  "$PY" -m pip install -qq -e "$ROOT[test]"
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
