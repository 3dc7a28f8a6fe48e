#!/bin/sh
# The wheels benchmarks/gpu_check.sh needs on a GPU machine that has Python 3.12 and torch but
# none of GPUlayer's other dependencies, and no package index (issue 36).
#
#   sh benchmarks/gpu_wheels.sh [DEST]        # default DEST: .whl/ in the checkout (git-ignored)
#
# Run it here, where an index is reachable; carry the checkout with DEST to the GPU machine;
# gpu_check.sh finds DEST there and installs from it with `pip --no-index --no-deps`. Downloads the
# cp312 manylinux x86_64 wheels (or pure-Python ones) of the project's runtime dependencies
# (pyproject's [project] dependencies), of what the check's steps use beyond them (ipykernel,
# IPython and jupyter_client for the session step, numpy for the Trainer), and of everything those
# pull in; never torch, which the machine has. Fails when they come to more than 64 MiB (what the
# GPU machine accepts with a checkout). Environment: PYTHON (runs pip; default: the checkout's
# .venv/bin/python, else python3), GPU_WHEELS_PYTHON_VERSION (default 3.12).
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
DEST=${1:-$ROOT/.whl}
LIMIT_MIB=64
VERSION=${GPU_WHEELS_PYTHON_VERSION:-3.12}
ABI=cp$(echo "$VERSION" | tr -d .)
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi

# The requirements, read from pyproject.toml: the runtime dependencies, then the few the check's
# steps add (by name, from the extras that declare them, so their pins stay in one place).
REQS=$("$PYTHON" - "$ROOT/pyproject.toml" <<'EOF'
import re
import sys
import tomllib

project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = project["optional-dependencies"]
wanted = {"ipykernel", "ipython", "jupyter_client", "numpy"}
picked = [r for r in extras["jupyter"] + extras["torch"] if re.split(r"[<>=!~; \[]", r)[0] in wanted]
for requirement in project["dependencies"] + picked:
    print(requirement)
EOF
)
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
echo "$REQS" > "$DEST/requirements.txt"
echo "gpu_wheels: downloading for CPython $VERSION, manylinux x86_64, into $DEST:"
echo "$REQS" | sed 's/^/  /'
# --platform takes several tags: manylinux_2_28 first (torch's own), then the older ones most
# wheels still ship; pure-Python wheels (py3-none-any) match any platform.
"$PYTHON" -m pip download --quiet --dest "$DEST" --only-binary=:all: \
  --python-version "$VERSION" --implementation cp --abi "$ABI" --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 \
  -r "$DEST/requirements.txt"
if ls "$DEST"/torch-*.whl >/dev/null 2>&1; then
  echo "gpu_wheels: error: torch was pulled in; the GPU machine has its own" >&2
  exit 1
fi
set -- "$DEST"/*.whl
count=$#
bytes=$(cat "$DEST"/*.whl | wc -c)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "gpu_wheels: $count wheels, $mib MiB (limit $LIMIT_MIB MiB)"
if [ "$bytes" -gt $(( LIMIT_MIB * 1048576 )) ]; then
  echo "gpu_wheels: error: $mib MiB is over the $LIMIT_MIB MiB limit" >&2
  du -k "$DEST"/*.whl | sort -rn | head -5 >&2
  exit 1
fi
