#!/bin/sh
# The worker image's entrypoint: `gpulayer worker`, joining $GPULAYER_URL with a join token from
# $GPULAYER_JOIN_TOKEN or, better, a file named by $GPULAYER_JOIN_TOKEN_FILE (a Docker or
# Kubernetes secret, so the token is in no image layer and no `docker inspect`). Extra arguments
# go to `gpulayer worker` (e.g. --labels zone=a --ca-cert /tls/ca.pem).
set -eu
if [ -z "${GPULAYER_URL:-}" ]; then
  echo "gpulayer-worker: error: GPULAYER_URL is not set" >&2
  echo "gpulayer-worker: hint: docker run -e GPULAYER_URL=https://head:8470 ... (what 'gpulayer serve' printed)" >&2
  exit 2
fi
if [ -n "${GPULAYER_JOIN_TOKEN_FILE:-}" ]; then
  if [ ! -r "$GPULAYER_JOIN_TOKEN_FILE" ]; then
    echo "gpulayer-worker: error: GPULAYER_JOIN_TOKEN_FILE=$GPULAYER_JOIN_TOKEN_FILE cannot be read" >&2
    echo "gpulayer-worker: hint: mount the secret there (readable by uid $(id -u))" >&2
    exit 2
  fi
  GPULAYER_JOIN_TOKEN=$(tr -d ' \r\n' <"$GPULAYER_JOIN_TOKEN_FILE")
  export GPULAYER_JOIN_TOKEN
fi
if [ -z "${GPULAYER_JOIN_TOKEN:-}" ]; then
  echo "gpulayer-worker: error: no join token (GPULAYER_JOIN_TOKEN_FILE or GPULAYER_JOIN_TOKEN)" >&2
  echo "gpulayer-worker: hint: on the server: gpulayer token create --kind join; mount it as a secret file" >&2
  exit 2
fi
exec gpulayer worker --name "${GPULAYER_WORKER_NAME:-$(hostname)}" "$@"
