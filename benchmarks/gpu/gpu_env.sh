# Sourced by the device-check scripts (run from the repository root): the environment they share.
#   OUT (results folder, $OUT on the device machine), PY (python), carried wheels from .whl/ installed
#   into /tmp/site, carried tokenizers in .gpudata/ as SURECALL_DATA, and `surecall` importable
#   through a symlink tree of its package-dir mapping (nothing is installed into the image).
OUT="${OUT:-benchmarks/results}"
mkdir -p "$OUT" benchmarks/results
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" || echo "warning: carried wheels did not install"
fi
if [ -d .gpudata ]; then export SURECALL_DATA="$PWD/.gpudata"; fi
PKG=/tmp/surecall_pkg
rm -rf "$PKG" && mkdir -p "$PKG/surecall"
for entry in engine/*; do ln -s "$PWD/$entry" "$PKG/surecall/$(basename "$entry")"; done
ln -sfn "$PWD/kernels" "$PKG/surecall/kernels"
ln -sfn "$PWD/grammars" "$PKG/surecall/grammars"
export PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}"
