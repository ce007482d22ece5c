# Sourced by the other scripts: make .venv from requirements-dev.lock once, and again when the lock or pyproject.toml
# changes. Needs only python3 (3.11+) and pip: pip installs uv from the lock's own entry (hash-checked), uv installs
# exactly the locked set (hash-checked; whatever the lock no longer lists is removed) and compiles its bytecode,
# then the project itself, editable, with no dependencies of its own. Nothing is resolved here: scripts/lock does
# that. A change to the lock, pyproject.toml or this file makes it again.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
LOCK="$ROOT/requirements-dev.lock"
stamp="$VENV/.installed-$(cat "$ROOT/pyproject.toml" "$LOCK" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "==> preparing $VENV from requirements-dev.lock (first run installs CrewAI and friends; about a minute)" >&2
  [ -x "$PY" ] || python3 -m venv "$VENV"
  # uv's entry: its pin line and hash lines, up to the first line that does not continue.
  "$PY" -m pip install -qq --disable-pip-version-check --require-hashes --no-deps \
    -r <(awk '/^uv==/ { found = 1 } found { print } found && !/\\$/ { exit }' "$LOCK")
  # --compile-bytecode: uv writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE is set (these VMs set it) no
  # import writes one either, so every process importing CrewAI (each supervisor's fork server, each spawned
  # worker) compiled it from source again: `import crewai` took 12.3-13.0 s of user CPU against 6.8-8.0 s with
  # the bytecode (two runs each, a busy 2-core VM).
  "$VENV/bin/uv" pip sync --quiet --python "$PY" --require-hashes --compile-bytecode "$LOCK"
  # The build backend is the locked one just installed, so the editable install fetches nothing either.
  "$VENV/bin/uv" pip install --quiet --python "$PY" --no-deps --no-build-isolation --editable "$ROOT"
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
