#!/usr/bin/env bash
# Set up GPUlayer in ./.venv (idempotent: run it again any time).
#
#   ./install.sh          the package with torch and Jupyter: enough to use GPUlayer
#   ./install.sh --dev    also everything the test suite needs (test tools; Chromium for the
#                         browser tests, PostgreSQL for the store tests, Slurm, munge and
#                         OpenSSH for the provider tests, when run as root with apt)
#
# Environment: PYTHON (default python3, must be >= 3.11); GPULAYER_TORCH (default torch==2.13.0,
# the CPU build; set e.g. GPULAYER_TORCH="torch" to let pip choose a CUDA build).
set -euo pipefail
cd "$(dirname "$0")"

dev=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $arg (try --help)" >&2; exit 2 ;;
  esac
done

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "install.sh: $PYTHON is missing or older than Python 3.11; set PYTHON=/path/to/python3.11" >&2
  exit 1
fi

step() { printf '\033[1m==> %s\033[0m\n' "$*"; }

if [ ! -x .venv/bin/python ]; then
  step "creating .venv"
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
# The browser tests drive Debian's Chromium; Playwright must never download a browser of its own.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1

step "installing torch (${GPULAYER_TORCH:-torch==2.13.0})"
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  "${PIP[@]}" install "${GPULAYER_TORCH:-torch==2.13.0}" numpy
fi

extras="torch,jupyter"
if [ "$dev" = 1 ]; then
  extras="$extras,dev,docs"
fi
step "installing gpulayer[$extras] (builds the JupyterLab panel when Node.js is here)"
"${PIP[@]}" install -e ".[$extras]"
# The editable build of the panel only warns when it fails: say so plainly instead.
if [ ! -f gpulayer_kernel/labextension/static/style.js ]; then
  if command -v node >/dev/null; then
    echo "install.sh: building the JupyterLab panel failed; run: PATH=.venv/bin:\$PATH jlpm build" >&2
    exit 1
  fi
  echo "install.sh: no Node.js here, so the JupyterLab panel was not built (the rest works)" >&2
fi

if [ "$dev" = 1 ]; then
  if [ -x /usr/bin/chromium ]; then
    :
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    step "installing Chromium for the browser tests (apt)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "install.sh: Chromium not found and not root: the browser tests will be skipped" >&2
  fi
  # The PostgreSQL store, its conformance suite and the standby tests run a real server (and
  # tests/store/test_deploy_doc.py runs deploy.md's curl commands).
  if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && command -v curl >/dev/null; then
    :
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    step "installing PostgreSQL and curl for the store tests (apt)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 \
      postgresql curl >/dev/null
  else
    echo "install.sh: PostgreSQL not found and not root: the PostgreSQL tests will be skipped" >&2
  fi
fi
if [ "$dev" = 1 ]; then
  # The metrics test scrapes a served control plane with a real Prometheus (tests/api).
  if command -v prometheus >/dev/null || [ -x /usr/bin/prometheus ]; then
    :
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    step "installing Prometheus for the metrics test (apt)"
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
      --no-install-recommends prometheus >/dev/null
  else
    echo "install.sh: Prometheus not found and not root: the metrics scrape test will be skipped" >&2
  fi
fi
if [ "$dev" = 1 ]; then
  # The provider tests run a real Slurm 22.05 and sshd (tests/providers); they skip without them.
  # rsync: benchmarks/bench_workspace.py compares the first sync of a workspace with it.
  if [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ] \
    && command -v sbatch >/dev/null && [ -x /usr/sbin/sshd ] && command -v rsync >/dev/null; then
    :
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    step "installing Slurm, munge, OpenSSH and rsync for the provider tests (apt)"
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
      slurmctld slurmd slurm-client munge openssh-server rsync >/dev/null
  else
    echo "install.sh: Slurm/sshd not found and not root: the provider tests will be skipped" >&2
  fi
fi
step "ready: .venv/bin/gpulayer --help"
