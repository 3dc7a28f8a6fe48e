#!/bin/sh
# Make this machine a GPUlayer worker, without a checkout (ADR 0017):
#
#   curl -fsSL https://example.org/install-worker.sh | sh -s -- --server https://head:8470 --join-token glt_j_...
#   sh install-worker.sh --server URL --join-token TOKEN [OPTIONS]
#
# It makes its own venv, installs the gpulayer wheel the control plane itself runs (fetched from
# it with the join token: versions always match, no package index needed for gpulayer) and a
# torch build that fits the machine's driver, checks the server and the token, runs the GPU
# capability probe, and prints (with --systemd: writes and starts) a systemd unit for
# `gpulayer worker`, which runs as a dedicated user when installed as root. Run it again any
# time: it reuses what it made. A first install that fails leaves nothing behind.
#
# Options:
#   --server URL[,URL]  the control plane (or $GPULAYER_URL); several, comma-separated, for an
#                       active one and its standby: the first that answers is used
#   --join-token TOKEN  a join token (or $GPULAYER_JOIN_TOKEN, which `ps` does not show)
#   --package SPEC      what pip installs: "server" (default: the control plane's own wheel,
#                       GET /api/v1/dist), "gpulayer==0.2.0" from an index, or a wheel path
#   --torch CHOICE      auto (default: a CUDA build when nvidia-smi reports a driver, else CPU),
#                       cpu, cu126, cu128, cu130, none, or a pip requirement taken as written
#                       (or $GPULAYER_TORCH)
#   --prefix DIR        where everything goes (default /opt/gpulayer as root, else
#                       ~/.local/share/gpulayer)
#   --name NAME         the worker's name (default: the host name)
#   --labels K=V,...    labels for job selectors
#   --ca-cert FILE      the CA that signed the server's certificate (a private CA)
#   --run-as USER       as root: the user the unit runs the worker as (default gpulayer, made
#                       if missing, as a system user without a login shell)
#   --systemd           write the unit and enable it now (a system unit as root, else a user unit)
#   --unit-file PATH    write the unit to PATH and do nothing else with systemd
#   --dry-run           print what would be installed (the torch choice) and stop
#   -h, --help          this text
# Environment: PYTHON (an interpreter >= 3.11; default: the newest python3.X found),
# GPULAYER_TORCH_INDEX (where PyTorch's CPU and CUDA builds are; default its download index).
set -eu

TORCH_REQ='torch>=2.4,<2.15'  # the range of gpulayer's own `torch` extra
TORCH_INDEX=${GPULAYER_TORCH_INDEX:-https://download.pytorch.org/whl}

say() { printf 'install-worker: %s\n' "$*"; }
fail() {
  # fail MESSAGE [HINT]: the error, the next step, exit 1 (the EXIT trap cleans up).
  printf 'install-worker: error: %s\n' "$1" >&2
  [ $# -lt 2 ] || printf 'install-worker: hint: %s\n' "$2" >&2
  exit 1
}
usage() {
  if [ -f "$0" ]; then sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; else echo 'usage: install-worker.sh --server URL[,URL] --join-token TOKEN [--package server|SPEC] [--torch auto|cpu|cuXYZ|none|SPEC] [--prefix DIR] [--name NAME] [--labels K=V,...] [--ca-cert FILE] [--run-as USER] [--systemd | --unit-file PATH] [--dry-run]'; fi
}

server=${GPULAYER_URL:-}
token=${GPULAYER_JOIN_TOKEN:-}
package=server
run_as=gpulayer
torch=${GPULAYER_TORCH:-auto}
prefix=
name=
labels=
ca_cert=
systemd=0
unit_file=
dry_run=0
while [ $# -gt 0 ]; do
  case $1 in
    --server | --join-token | --package | --torch | --prefix | --name | --labels | --ca-cert | --unit-file | --run-as)
      [ $# -ge 2 ] || fail "$1 needs a value" "see --help"
      case $1 in
        --server) server=$2 ;;
        --join-token) token=$2 ;;
        --package) package=$2 ;;
        --torch) torch=$2 ;;
        --prefix) prefix=$2 ;;
        --name) name=$2 ;;
        --labels) labels=$2 ;;
        --ca-cert) ca_cert=$2 ;;
        --unit-file) unit_file=$2 ;;
        --run-as) run_as=$2 ;;
      esac
      shift 2
      ;;
    --systemd) systemd=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) fail "unknown option $1" "see --help" ;;
  esac
done

# -- Python >= 3.11, one the worker's user can run ---------------------------------------------
# As root the worker runs as --run-as USER: an interpreter under a private home (/root/.pyenv)
# would build a venv that user cannot run. Each candidate is tried as that user (or, before the
# user is made, as nobody); the first that user can run is taken.
checker=
if [ "$(id -u)" = 0 ] && command -v runuser >/dev/null 2>&1; then
  if id -u "$run_as" >/dev/null 2>&1; then checker=$run_as
  elif id -u nobody >/dev/null 2>&1; then checker=nobody; fi
fi
python_ok() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' </dev/null >/dev/null 2>&1; }
user_runs() {
  [ -z "$checker" ] || runuser -u "$checker" -- "$1" -c 'import sys' </dev/null >/dev/null 2>&1
}
private_hint="install a Python the user can run (Debian/Ubuntu 'apt-get install python3.11 python3.11-venv'), or point PYTHON at one outside a private home"
if [ -n "${PYTHON:-}" ]; then
  python_ok "$PYTHON" || fail "PYTHON=$PYTHON is not a Python 3.11 or newer" \
    "point PYTHON at a python3.11 (or newer) interpreter, or unset it to search PATH"
  user_runs "$PYTHON" || fail "PYTHON=$PYTHON cannot be run by the user ${run_as} the worker runs as (Permission denied: it lives where only root can reach, such as /root/.pyenv)" "$private_hint"
  python=$PYTHON
else
  python=
  private=
  for candidate in python3.14 python3.13 python3.12 python3.11 python3; do
    old_ifs=$IFS
    IFS=:
    for dir in $PATH; do
      IFS=$old_ifs
      if [ -z "$dir" ] || [ ! -x "$dir/$candidate" ] || ! python_ok "$dir/$candidate"; then
        continue
      fi
      if user_runs "$dir/$candidate"; then python=$dir/$candidate; break 2; fi
      private=${private:-$dir/$candidate}
    done
    IFS=$old_ifs
  done
  if [ -z "$python" ] && [ -n "$private" ]; then
    fail "no Python 3.11 or newer that the user ${run_as} can run: $private lives where only root can reach (such as /root/.pyenv)" "$private_hint"
  fi
  [ -n "$python" ] || fail "no Python 3.11 or newer found (tried python3.14 ... python3.11, python3)" \
    "install one: Debian/Ubuntu 'apt-get install python3.11 python3.11-venv' (older Ubuntu: the deadsnakes PPA), RHEL/Rocky 'dnf install python3.11', or 'uv python install 3.12'; then run this again, with PYTHON=/path/to/python3.11 if it is not on PATH"
fi
"$python" -c 'import ensurepip, venv' </dev/null >/dev/null 2>&1 \
  || fail "$python cannot make a venv (no ensurepip)" "install its venv module, e.g. 'apt-get install python3.11-venv'"

# -- which torch ---------------------------------------------------------------------------------
# The CUDA build each driver can run (NVIDIA's minimum Linux driver per CUDA toolkit): 13.0 needs
# 580.65, 12.8 needs 570.26, 12.6 runs on 525.60 and newer (CUDA 12 minor-version compatibility).
version_ge() {
  awk -v a="$1" -v b="$2" 'BEGIN { n = split(a, x, "."); split(b, y, ".");
    for (i = 1; i <= 3; i++) { if (x[i] + 0 > y[i] + 0) exit 0; if (x[i] + 0 < y[i] + 0) exit 1 }
    exit 0 }'
}
driver=
if [ "$torch" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null </dev/null | head -n 1 | tr -d ' \r' || true)
    case $driver in [0-9]*.[0-9]*) ;; *) driver= ;; esac
  fi
  if [ -z "$driver" ]; then
    torch=cpu
    why="no NVIDIA driver answered (nvidia-smi)"
  elif version_ge "$driver" 580.65; then
    torch=cu130; why="NVIDIA driver $driver"
  elif version_ge "$driver" 570.26; then
    torch=cu128; why="NVIDIA driver $driver"
  elif version_ge "$driver" 525.60; then
    torch=cu126; why="NVIDIA driver $driver"
  else
    torch=cpu
    why="NVIDIA driver $driver is older than any CUDA build of torch supports (525.60); update the driver for GPU jobs"
  fi
else
  why="asked for"
fi
picked=$torch  # auto's pick may fall back below; an explicit choice never does
[ "$why" = "asked for" ] && picked=
case $torch in
  none) torch_args= ; torch_text="no torch ($why): command and Python jobs only" ;;
  cpu | cu[0-9]*)
    torch_args="$TORCH_REQ --index-url $TORCH_INDEX/$torch"
    torch_text="torch, the $torch build ($why): pip install '$TORCH_REQ' --index-url $TORCH_INDEX/$torch"
    # auto needs that host: said now, and a fallback when it cannot be reached (below)
    [ -z "$picked" ] || torch_text="$torch_text (needs $TORCH_INDEX; if it cannot be reached: torch from the package index, else none)"
    ;;
  *) torch_args=$torch; torch_text="$torch ($why): pip install '$torch'" ;;
esac

if [ -z "$prefix" ]; then
  if [ "$(id -u)" = 0 ]; then prefix=/opt/gpulayer; else prefix=${XDG_DATA_HOME:-$HOME/.local/share}/gpulayer; fi
fi
case $prefix in /*) ;; *) prefix=$(pwd)/$prefix ;; esac
venv=$prefix/venv
case $package in
  */* | *.whl) [ -f "$package" ] || fail "no wheel at $package" "pass --package with an existing .whl path, or a package name"
    case $package in /*) ;; *) package=$(pwd)/$package ;; esac ;;
esac

say "python: $python ($("$python" -c 'import platform; print(platform.python_version())'))"
say "torch: $torch_text"
if [ "$package" = server ]; then
  say "gpulayer: the control plane's own wheel (GET /api/v1/dist), into $venv"
else
  say "gpulayer: $package, into $venv"
fi
if [ "$dry_run" = 1 ]; then
  say "dry run: nothing installed"
  exit 0
fi

[ -n "$server" ] || fail "no server given" "pass --server https://head:8470 (what 'gpulayer serve' prints), or set GPULAYER_URL"
server=$(printf '%s' "$server" | tr -d ' ')
[ -n "$token" ] || fail "no join token given" "create one on the server with 'gpulayer token create --kind join --ttl 1h' and pass --join-token (or set GPULAYER_JOIN_TOKEN)"
[ -z "$ca_cert" ] || [ -f "$ca_cert" ] || fail "no CA certificate at $ca_cert" "pass --ca-cert with the PEM file of the CA that signed the server's certificate"
case $ca_cert in "" | /*) ;; *) ca_cert=$(pwd)/$ca_cert ;; esac

# A wrong URL fails here, before anything is made: /health takes no token, so none is sent.
"$python" - "$server" "$ca_cert" <<'PY' || fail "no GPUlayer control plane answers at $server" "check --server: the URL 'gpulayer serve' printed (scheme, host and port); --ca-cert for a private CA"
import json, ssl, sys, urllib.request
urls, ca = [u.rstrip("/") for u in sys.argv[1].split(",") if u], sys.argv[2] or None
ctx = ssl.create_default_context(cafile=ca)
for url in urls:  # an active server and its standby: one answering is enough
    try:
        with urllib.request.urlopen(f"{url}/api/v1/health", timeout=15, context=ctx) as answer:
            health = json.load(answer)
        assert health.get("status") == "ok", health
    except Exception as exc:
        print(f"install-worker: {url}/api/v1/health: {exc}", file=sys.stderr)
        continue
    print(f"install-worker: server: {url} answers (gpulayer {health.get('version')})")
    sys.exit(0)
sys.exit(1)
PY

# -- the venv (a first install that fails is removed whole) -----------------------------------
made=
cleanup() {
  status=$?
  if [ "$status" != 0 ] && [ -n "$made" ]; then
    rm -rf "$made"
    printf 'install-worker: removed %s: nothing is left half-installed\n' "$made" >&2
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -x "$venv/bin/gpulayer" ]; then
  say "reusing $venv (already installed; pip brings it up to date)"
else
  [ -e "$prefix" ] || made=$prefix
  [ -n "$made" ] || [ -e "$venv" ] || made=$venv
  [ ! -e "$venv" ] || [ -n "$made" ] || fail "$venv exists but is not a gpulayer venv" "remove it, or pass another --prefix"
  mkdir -p "$prefix"
  say "creating $venv"
  "$python" -m venv "$venv" </dev/null || fail "could not create a venv at $venv"
fi
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@" </dev/null; }
if [ "$package" = server ]; then
  # The wheel the control plane runs, checked against the sha256 it states; the join token is
  # the credential (a wrong or expired one fails here, before anything large is fetched).
  mkdir -p "$prefix/dist"
  package=$(GPULAYER_JOIN_TOKEN=$token "$python" - "$server" "$ca_cert" "$prefix/dist" <<'PY'
import hashlib, json, os, ssl, sys, urllib.error, urllib.request
urls, ca, folder = [u.rstrip("/") for u in sys.argv[1].split(",") if u], sys.argv[2] or None, sys.argv[3]
ctx = ssl.create_default_context(cafile=ca)
auth = {"Authorization": f"Bearer {os.environ['GPULAYER_JOIN_TOKEN']}"}
def get(url):
    with urllib.request.urlopen(urllib.request.Request(url, headers=auth), timeout=300, context=ctx) as r:
        return r.read()
said = ""
for url in urls:
    try:
        info = json.loads(get(f"{url}/api/v1/dist"))
        data = get(f"{url}/api/v1/dist/{info['wheel']}")
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read())
            said = f"{body['message']} ({body.get('hint', '')})"
        except Exception:
            said = str(exc)
        print(f"install-worker: {url}/api/v1/dist: {said}", file=sys.stderr)
        continue
    except Exception as exc:
        print(f"install-worker: {url}/api/v1/dist: {exc}", file=sys.stderr)
        continue
    if hashlib.sha256(data).hexdigest() != info["sha256"]:
        print(f"install-worker: {url}: the wheel does not match its sha256", file=sys.stderr)
        continue
    path = os.path.join(folder, os.path.basename(info["wheel"]))
    with open(path, "wb") as f:
        f.write(data)
    print(f"install-worker: fetched {info['wheel']} (gpulayer {info['version']}) from {url}", file=sys.stderr)
    print(path)
    sys.exit(0)
sys.exit(1)
PY
) || fail "could not fetch gpulayer's wheel from the control plane at $server" \
    "check the join token ('gpulayer token create --kind join --ttl 1h'); a server run from a checkout needs GPULAYER_DIST (docs/install-worker.md); or pass --package SPEC"
fi
say "installing $package"
pip install "$package" || fail "pip could not install $package" "check the package name or wheel path, and that this machine reaches the package index (for gpulayer's dependencies)"

# The server and the token, checked with the installed gpulayer (its TLS and URL rules) before the
# large part (torch) is fetched. `--check` enrols nothing and spends no instance token.
set -- --server "$server"
[ -z "$ca_cert" ] || set -- "$@" --ca-cert "$ca_cert"
if ! GPULAYER_JOIN_TOKEN=$token "$venv/bin/gpulayer" worker --check "$@" </dev/null; then
  fail "the control plane at $server did not accept this worker (see the error above)" \
    "check --server (what 'gpulayer serve' printed) and ask for a fresh join token ('gpulayer token create --kind join --ttl 1h')"
fi

if [ -n "$torch_args" ]; then
  say "installing $torch_text"
  # shellcheck disable=SC2086 # torch_args is a requirement and, for a build, its index option
  if pip install $torch_args numpy; then
    :
  elif [ -n "$picked" ]; then
    # --torch auto: PyTorch's own index may be unreachable from here (a proxy, an air gap).
    say "warning: could not install torch from $TORCH_INDEX/$picked; trying the package index"
    if pip install "$TORCH_REQ" numpy; then
      say "installed torch from the package index (its default build, not the $picked one)"
    else
      say "warning: no torch installed: this worker runs command and Python jobs only; add torch later with $venv/bin/pip install '$TORCH_REQ' --index-url $TORCH_INDEX/$picked"
    fi
  else
    fail "pip could not install torch ($torch_args)" \
      "pass --torch cpu, --torch none, or a requirement that fits this machine (see --help)"
  fi
fi

# -- the capability probe (what the worker will advertise) --------------------------------------
say "probing this machine's GPUs (an isolated subprocess, as the worker does)"
"$venv/bin/python" -m gpulayer_kernel.capabilities.probe </dev/null >"$prefix/probe.json"
"$venv/bin/python" - "$prefix/probe.json" "$driver" <<'PY'
import json, sys
caps = json.load(open(sys.argv[1]))
devices, host = caps.get("devices", []), caps.get("host") or {}
gpus = ", ".join(f"{d['index']}: {d['name']}" for d in devices) or "none"
torch = caps.get("torch") or {}
print(f"install-worker: GPUs: {gpus}; torch: {torch.get('version') or 'not installed'}")
for line in caps.get("probe_errors", []):
    print(f"install-worker: probe: {line}")
if sys.argv[2] and not devices:
    print("install-worker: warning: nvidia-smi reports a driver but the probe found no usable GPU; "
          "see the probe lines above (a torch build that does not fit the driver?)")
PY

# -- who runs the worker: as root, a dedicated user (never root itself; docs/security.md) -------
unit_user=
if [ "$(id -u)" = 0 ]; then
  unit_user=$run_as
  if ! id -u "$unit_user" >/dev/null 2>&1; then
    command -v useradd >/dev/null 2>&1 || fail "useradd is missing: cannot create the user $unit_user" \
      "create a system user $unit_user yourself (no login shell), then run this again"
    useradd --system --user-group --home-dir "$prefix/home" --no-create-home \
      --shell /usr/sbin/nologin --comment "GPUlayer worker" "$unit_user" </dev/null \
      || fail "could not create the user $unit_user" "create it yourself, or pass --run-as USER"
    say "created the system user $unit_user"
  fi
  mkdir -p "$prefix/home"
  chown "$unit_user:" "$prefix/home"
  chmod 700 "$prefix/home"
fi

# -- what runs the worker -----------------------------------------------------------------------
umask 077
env_file=$prefix/worker.env
{
  echo "# gpulayer worker settings (install-worker.sh); holds the join token: keep it 0600"
  echo "GPULAYER_URL=$server"
  echo "GPULAYER_JOIN_TOKEN=$token"
  echo "GPULAYER_HOME=$prefix/home"
} >"$env_file"
chmod 600 "$env_file"
if [ -n "$unit_user" ]; then
  chgrp "$(id -gn "$unit_user")" "$env_file"  # readable by the worker's user, writable by root
  chmod 640 "$env_file"
fi
umask 022
set -- worker
[ -z "$name" ] || set -- "$@" --name "$name"
[ -z "$labels" ] || set -- "$@" --labels "$labels"
[ -z "$ca_cert" ] || set -- "$@" --ca-cert "$ca_cert"
launcher=$prefix/run-worker
{
  echo '#!/bin/sh'
  echo "# Starts this machine's gpulayer worker (written by install-worker.sh; the unit runs it)."
  echo 'set -a'
  echo ". '$env_file'"
  echo 'set +a'
  printf "exec '%s'" "$venv/bin/gpulayer"
  for word in "$@"; do printf " '%s'" "$word"; done
  echo ' "$@"'
} >"$launcher"
chmod 755 "$launcher"

if [ "$(id -u)" = 0 ]; then wanted=multi-user.target; else wanted=default.target; fi
unit="[Unit]
Description=GPUlayer worker (joins $server)
Wants=network-online.target
After=network-online.target

[Service]
${unit_user:+User=$unit_user
Group=$(id -gn "$unit_user")
}ExecStart=$launcher
Restart=on-failure
RestartSec=5
# The worker stops its jobs' process groups itself on SIGTERM; give it time to report them.
KillMode=mixed
TimeoutStopSec=60

[Install]
WantedBy=$wanted"

# The last check, as the unit runs the worker: its user, its launcher, its settings file. A venv
# or a settings file that user cannot read fails here, not at the first start of the unit.
if [ -n "$unit_user" ]; then
  say "checking the worker as $unit_user, as the unit will start it"
  runuser -u "$unit_user" -- "$launcher" --check </dev/null \
    || fail "the worker does not start as $unit_user (see the error above)" \
      "the user must be able to run $venv/bin/gpulayer and read $env_file; $private_hint"
else
  "$launcher" --check </dev/null >/dev/null \
    || fail "the worker does not start with $launcher (see the error above)" "run it by hand to see why"
fi

if [ -n "$unit_file" ]; then
  mkdir -p "$(dirname "$unit_file")"
  printf '%s\n' "$unit" >"$unit_file"
  say "wrote the unit to $unit_file"
elif [ "$systemd" = 1 ]; then
  if [ "$(id -u)" = 0 ]; then unit_dir=/etc/systemd/system; user=; else unit_dir=${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user; user=--user; fi
  mkdir -p "$unit_dir"
  printf '%s\n' "$unit" >"$unit_dir/gpulayer-worker.service"
  say "wrote $unit_dir/gpulayer-worker.service"
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl $user daemon-reload
    systemctl $user enable --now gpulayer-worker.service
    say "started: systemctl $user status gpulayer-worker; logs: journalctl $user -u gpulayer-worker -f"
  else
    say "systemd is not running here: start the worker with $launcher"
  fi
else
  say "the systemd unit (install it as /etc/systemd/system/gpulayer-worker.service, or rerun with --systemd):"
  printf '%s\n' "$unit"
fi
say "done: start the worker with $launcher (settings and the token in $env_file)"
