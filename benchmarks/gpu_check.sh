#!/usr/bin/env bash
# GPU check (issue 39, item 5): keras_preact's trainer on JAX in bfloat16 against PyTorch on
# one GPU, in under 8 minutes (benchmarks/gpu_check.py says what it measures).
#
# For a machine with one GPU, Python with jax[cuda], PyTorch and NumPy, and no network:
# Keras and the wheels it needs that such a machine lacks travel in a folder of wheels
# (default: .whl at the tree's root; $KERAS_PREACT_WHEELS names another), keras_preact is
# imported from this tree. Nothing is installed outside a temporary folder.
#
#   benchmarks/gpu_check.sh                       # on the GPU machine
#   benchmarks/gpu_check.sh --dry-run             # anywhere: host CPU devices, tiny nets
#   benchmarks/gpu_check.sh --download-wheels     # beforehand, on a machine with a network:
#                                                 # Keras and its missing wheels into .whl
#
# Other arguments go to gpu_check.py (--budget-s, --steps, --depth).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tree=$(dirname "$here")
wheels=${KERAS_PREACT_WHEELS:-$tree/.whl}
python=${PYTHON:-python3}

if [[ "${1:-}" == "--download-wheels" ]]; then
  # Keras' own dependencies that the GPU image lacks (its others, absl-py, h5py, ml-dtypes,
  # numpy, packaging and rich, are there), for its Python (3.12, x86-64 Linux).
  mkdir -p "$wheels"
  "$python" -m pip download --no-deps --only-binary=:all: --python-version "${GPU_PYTHON:-3.12}" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$wheels" \
    "keras==${KERAS_VERSION:-3.15.1}" namex optree
  ls "$wheels"
  exit 0
fi

if compgen -G "$wheels/*.whl" >/dev/null; then
  site=$(mktemp -d)
  trap 'rm -rf "$site"' EXIT
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target "$site" "$wheels"/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}"
export KERAS_BACKEND=jax PYTHONUNBUFFERED=1

# Fails here, in a second, if Keras or keras_preact cannot be imported without TensorFlow.
"$python" - <<'PY'
import sys

import keras
import keras_preact

assert keras.backend.backend() == "jax", keras.backend.backend()
loaded = "tensorflow" in sys.modules
print(f"keras {keras.__version__} ({keras.__file__}), keras_preact {keras_preact.__version__} "
      f"({keras_preact.__file__}); TensorFlow imported: {loaded}")
PY

"$python" "$here/gpu_check.py" "$@"
