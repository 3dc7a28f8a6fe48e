#!/bin/sh
# The GPU check: what only a machine with an NVIDIA GPU can show, in one run (issue 14, item 7).
#
#   sh benchmarks/gpu_check.sh [--report FILE] [--quick]
#
# Steps, each against a fresh $GPULAYER_HOME and per-machine probe cache (nothing of yours is
# touched), each with a time limit; about 3 minutes on one H200:
#   1. probe        nvidia-smi, the full probe (torch imported) and the first answer without torch
#                   (NVML through ctypes): the same GPUs, CUDA available, NCCL there
#   2. placement    `gpulayer run --gpus 1`: the job sees exactly its device in
#                   CUDA_VISIBLE_DEVICES, and torch inside it sees one GPU
#   3. cell         a one-shot torch cell on CUDA (the path of `%%gpulayer --gpus 1`), its value back
#   4. session      a session on one GPU: state kept on the device between two cells
#   5. nccl         torch.distributed with the nccl backend on one device, inside a gpulayer job
#   6. trainer      benchmarks/bench_trainer.py --gpu: bf16 GPT, raw loop vs Trainer, with MFU
#   7. fsdp         the Trainer's strategy='fsdp' (torch's fully_shard) on NCCL against DDP and a
#                   hand-written fully_shard loop: same parameters, and samples/s side by side
#                   (every GPU, up to 2 ranks; one GPU: a one-rank group, still sharded by FSDP)
#
# Before anything else it makes sure the project's dependencies import. A machine with Python
# and torch but nothing else and no package index: run benchmarks/gpu_wheels.sh where an index is
# reachable, bring the checkout with its .whl/ folder; this script then makes .whl/env (a venv
# that sees $PYTHON's torch), installs every wheel there with `pip install --no-index --no-deps
# --target`, puts it on PYTHONPATH and runs every step with that venv's python (so the worker's
# jobs, session ranks and torchrun's ranks, which start from sys.executable, have them too).
# Everything each step printed goes to the report (default ./gpu-check-report.txt), then one line
# per step, PASS or FAIL, and the verdict.
#
# On a machine without an NVIDIA driver it says "no GPU here", checks nothing and exits 0. On a
# machine with one (a driver loaded, /dev/nvidiactl, or nvidia-smi installed), every step must
# pass: a step that fails, or cannot run, makes the check fail loudly and exit 1; nothing is
# skipped. Environment: PYTHON (default: the checkout's .venv/bin/python, else python3),
# GPU_CHECK_STEP_TIMEOUT (seconds per step, default 240).
set -eu

say() { printf 'gpu_check: %s\n' "$*"; }
die() { printf 'gpu_check: error: %s\n' "$*" >&2; exit 2; }

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
REPORT=gpu-check-report.txt
QUICK=""
while [ $# -gt 0 ]; do
  case "$1" in
    --report) [ $# -ge 2 ] || die "--report needs a file"; REPORT=$2; shift 2 ;;
    --quick) QUICK=--quick; shift ;;
    -h|--help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (try --help)" ;;
  esac
done
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi
STEP_TIMEOUT=${GPU_CHECK_STEP_TIMEOUT:-240}
: > "$REPORT" || die "cannot write the report $REPORT"
REPORT=$(cd "$(dirname "$REPORT")" && pwd)/$(basename "$REPORT")

# -- the dependencies: from .whl/ without an index, when it is there ------------------------------
WHEELS=${GPU_CHECK_WHEELS:-$ROOT/.whl}
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  ENV_DIR=$WHEELS/env
  rm -rf "$ENV_DIR"
  "$PYTHON" -m venv --without-pip --system-site-packages "$ENV_DIR" ||
    die "cannot make a venv with $PYTHON"
  SITE=$("$ENV_DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  set -- "$WHEELS"/*.whl
  say "installing $# wheels from $WHEELS (no index)"
  "$PYTHON" -m pip install --quiet --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl \
    >> "$REPORT" 2>&1 || die "pip install --no-index from $WHEELS failed (see $REPORT)"
  # $PYTHON's torch, wherever it lives (its own venv, the user site, the system): on the path
  # after the wheels, through a .pth file in the venv's site-packages
  "$PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' \
    > "$SITE/gpu-check-torch.pth" 2>/dev/null || rm -f "$SITE/gpu-check-torch.pth"
  PYTHON=$ENV_DIR/bin/python
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
# Every dependency a step imports, named when missing; torch's version (or its absence).
if ! PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" "$HERE/gpu_check.py" deps \
  >> "$REPORT" 2>&1; then
  die "a dependency is missing: $(grep '^missing:' "$REPORT" | tail -1); without a package index, run benchmarks/gpu_wheels.sh where there is one and bring its .whl/"
fi
say "the dependencies import with $PYTHON"

# -- is there a GPU to check? ---------------------------------------------------------------------
# GPU_CHECK_ROOT: where /proc and /dev are looked for (the suite's tests point it elsewhere).
R=${GPU_CHECK_ROOT:-}
signs=""
[ -e "$R/proc/driver/nvidia/version" ] && signs="$signs /proc/driver/nvidia"
[ -e "$R/dev/nvidiactl" ] && signs="$signs /dev/nvidiactl"
command -v nvidia-smi >/dev/null 2>&1 && signs="$signs nvidia-smi"
{
  echo "# gpulayer GPU check, $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(uname -n)"
  echo "# python: $("$PYTHON" -c 'import sys; print(sys.version.split()[0])' 2>&1)"
  echo "# signs of an NVIDIA driver:${signs:- none}"
} >> "$REPORT"
if [ -z "$signs" ]; then
  say "no GPU here: no NVIDIA driver (no /proc/driver/nvidia, no /dev/nvidiactl, no nvidia-smi);" \
    "nothing was checked"
  echo "VERDICT: no GPU here; nothing was checked" >> "$REPORT"
  say "report: $REPORT"
  exit 0
fi
say "an NVIDIA driver is here (${signs# }): every step must pass"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export GPULAYER_HOME="$WORK/home" GPULAYER_CACHE_DIR="$WORK/cache"
unset GPULAYER_URL GPULAYER_TOKEN GPULAYER_SIMULATE_GPUS GPULAYER_SIMULATE_KIND
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" GPU_CHECK_WORK="$WORK"
FAILED=""
SUMMARY="$WORK/summary"
: > "$SUMMARY"

run_step() {
  # run_step NAME COMMAND...: run it with the time limit, its output to the report; PASS/FAIL.
  name=$1
  shift
  say "step $name ..."
  echo "" >> "$REPORT"
  echo "## $name: $*" >> "$REPORT"
  started=$(date +%s)
  if command -v timeout >/dev/null 2>&1; then
    set -- timeout "$STEP_TIMEOUT" "$@"
  fi
  if "$@" >> "$REPORT" 2>&1; then
    verdict=PASS
  else
    verdict="FAIL (exit $?)"
    FAILED="$FAILED $name"
  fi
  took=$(( $(date +%s) - started ))
  echo "## $name: $verdict in ${took}s" >> "$REPORT"
  echo "$name: $verdict in ${took}s" >> "$SUMMARY"
  if [ "$verdict" = PASS ]; then
    say "step $name: PASS (${took}s)"
  else
    say "step $name: $verdict after ${took}s; see $REPORT" >&2
  fi
}

STEPS="$HERE/gpu_check.py"
run_step probe "$PYTHON" "$STEPS" probe
run_step placement "$PYTHON" "$STEPS" placement
run_step cell "$PYTHON" "$STEPS" cell
run_step session "$PYTHON" "$STEPS" session
run_step nccl "$PYTHON" "$STEPS" nccl
run_step trainer "$PYTHON" "$STEPS" trainer ${QUICK:+"$QUICK"}
run_step fsdp "$PYTHON" "$STEPS" fsdp ${QUICK:+"$QUICK"}

{
  echo ""
  echo "# summary"
  cat "$SUMMARY"
} >> "$REPORT"
if [ -n "$FAILED" ]; then
  echo "VERDICT: FAILED:$FAILED" >> "$REPORT"
  printf 'gpu_check: FAILED:%s (report: %s)\n' "$FAILED" "$REPORT" >&2
  exit 1
fi
echo "VERDICT: every step passed" >> "$REPORT"
say "every step passed (report: $REPORT)"
