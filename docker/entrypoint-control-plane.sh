#!/bin/sh
# The control-plane image's entrypoint: `gpulayer serve` on $GPULAYER_HOST:$GPULAYER_PORT with
# its state in $GPULAYER_HOME (a volume). Off loopback gpulayer serve requires TLS: mount a
# certificate and key and name them in GPULAYER_TLS_CERT / GPULAYER_TLS_KEY. Extra arguments go
# to `gpulayer serve` (e.g. --heartbeat-timeout 60).
set -eu
home=${GPULAYER_HOME:-/var/lib/gpulayer}
if ! mkdir -p "$home" 2>/dev/null || [ ! -w "$home" ]; then
  echo "gpulayer-control-plane: error: the state directory $home is not writable by uid $(id -u)" >&2
  echo "gpulayer-control-plane: hint: mount a volume there owned by that uid (chown $(id -u) on the host, or a named volume)" >&2
  exit 2
fi
if [ -n "${GPULAYER_TLS_CERT:-}${GPULAYER_TLS_KEY:-}" ]; then
  set -- --tls-cert "${GPULAYER_TLS_CERT:-}" --tls-key "${GPULAYER_TLS_KEY:-}" "$@"
fi
exec gpulayer serve --home "$home" --host "${GPULAYER_HOST:-0.0.0.0}" --port "${GPULAYER_PORT:-8470}" "$@"
