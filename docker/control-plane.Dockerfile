# syntax=docker/dockerfile:1
# The GPUlayer control plane: `gpulayer serve` as a non-root user, its state on a volume, a
# healthcheck on the unauthenticated GET /api/v1/health (ADR 0017, docs/deploy-containers.md).
#
#   python -m build --wheel                      # dist/gpulayer-X-py3-none-any.whl (RELEASING.md)
#   docker build -f docker/control-plane.Dockerfile -t gpulayer-control-plane .
#   docker run -d -p 8470:8470 -v gpulayer-state:/var/lib/gpulayer -v "$PWD/tls:/tls:ro" \
#     -e GPULAYER_TLS_CERT=/tls/cert.pem -e GPULAYER_TLS_KEY=/tls/key.pem gpulayer-control-plane
#
# The first start prints an admin client token once (`docker logs`). No secret is ever in a
# layer: certificates and keys are mounted at run time, tokens live in the state volume.

# Pinned: a release bumps it on purpose (RELEASING.md), never by a moving tag.
ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# Every dependency as a wheel, resolved once here; the runtime stage installs them offline.
COPY dist/ /dist/
RUN python -m pip wheel --no-cache-dir --wheel-dir /wheels /dist/*.whl

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="GPUlayer control plane" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/gpulayer/gpulayer"
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --find-links /wheels /wheels/gpulayer-*.whl \
    && groupadd --system --gid 10001 gpulayer \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/gpulayer --create-home gpulayer
COPY --chmod=0755 docker/entrypoint-control-plane.sh /usr/local/bin/gpulayer-control-plane
COPY --chmod=0755 docker/healthcheck.py /usr/local/bin/gpulayer-healthcheck
ENV GPULAYER_HOME=/var/lib/gpulayer \
    GPULAYER_HOST=0.0.0.0 \
    GPULAYER_PORT=8470 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /var/lib/gpulayer
VOLUME ["/var/lib/gpulayer"]
EXPOSE 8470
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["gpulayer-healthcheck"]
ENTRYPOINT ["gpulayer-control-plane"]
