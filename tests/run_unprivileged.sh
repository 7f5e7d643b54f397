#!/usr/bin/env bash
# The security-boundary tests again, as an unprivileged user (uid 65534), when this runs as root.
# The project's .venv lives where that user may not read (a root home), so this builds a small
# venv in /tmp from the system python with what these tests import (no torch), and a symlink tree
# that makes `surecall` importable from the checkout. Bounded: pip installs a few wheels; the tests
# take about a minute. Skips (exit 0, with the reason) when not root or setpriv/python3 is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then echo "run_unprivileged: not root, nothing to drop (the suite already ran unprivileged)"; exit 0; fi
PY=${UNPRIV_PYTHON:-/usr/bin/python3}
if ! command -v setpriv >/dev/null || [ ! -x "$PY" ]; then echo "run_unprivileged: skipped (needs setpriv and $PY)"; exit 0; fi
work=$(mktemp -d /tmp/surecall-unpriv.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$PY" -m venv "$work/venv"
"$work/venv/bin/pip" install -q pydantic regex jsonschema-rs rfc8785 redis pytest numpy tqdm jsonschema >/dev/null
# a copy of the sources the user can read (the checkout may sit under a folder it cannot enter)
mkdir -p "$work/src" "$work/pkg/surecall"
cp -r engine grammars kernels tests "$work/src/"
for entry in "$work"/src/engine/*; do ln -s "$entry" "$work/pkg/surecall/$(basename "$entry")"; done
ln -s "$work/src/kernels" "$work/pkg/surecall/kernels"; ln -s "$work/src/grammars" "$work/pkg/surecall/grammars"
chmod -R a+rX "$work"; chmod a+rwx "$work"
tests=(test_toolbox_files test_toolbox_race test_toolbox_search test_sandbox_isolation test_sandbox_limits
       test_toolbox_sandbox test_capability_chain test_capability test_runtime_hardening test_runtime)
paths=(); for t in "${tests[@]}"; do paths+=("$(find "$work/src/tests" -name "$t.py" | head -1)"); done
cd "$work"
setpriv --reuid=65534 --regid=65534 --clear-groups env -i PATH=/usr/bin:/bin HOME="$work" \
  PYTHONPATH="$work/pkg" SURECALL_DATA="${SURECALL_DATA:-}" \
  timeout 900 "$work/venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir="$work" -c /dev/null "${paths[@]}"
