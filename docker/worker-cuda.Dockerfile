# syntax=docker/dockerfile:1
# A GPUlayer worker on an NVIDIA CUDA runtime base, with the torch build for that CUDA, as a
# non-root user; `gpulayer worker` is the entrypoint (ADR 0017, docs/deploy-containers.md).
#
#   python -m build --wheel                      # dist/gpulayer-X-py3-none-any.whl (RELEASING.md)
#   docker build -f docker/worker-cuda.Dockerfile -t gpulayer-worker-cuda .
#   docker run -d --gpus all -e GPULAYER_URL=https://head:8470 \
#     -e GPULAYER_JOIN_TOKEN_FILE=/run/secrets/join --mount type=bind,src=join.txt,dst=/run/secrets/join,ro \
#     gpulayer-worker-cuda
#
# The join token reaches the container at run time (a variable, or a file: a Docker/Kubernetes
# secret), never a build argument, so no layer holds it.

# Pinned together: the CUDA runtime of the base and the torch build made for it (cu128).
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG TORCH_VERSION=2.13.0

FROM ${CUDA_IMAGE} AS build
ARG TORCH_INDEX
ARG TORCH_VERSION
# The pinned base image fixes the OS release; its apt packages follow its security updates.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-venv \
    && rm -rf /var/lib/apt/lists/*
COPY dist/ /dist/
# One venv, moved whole into the runtime stage (same path, same interpreter there).
RUN python3.12 -m venv /opt/gpulayer \
    && /opt/gpulayer/bin/pip install --no-cache-dir "torch==${TORCH_VERSION}" numpy==2.2.6 \
       --index-url "${TORCH_INDEX}" --extra-index-url https://pypi.org/simple \
    && /opt/gpulayer/bin/pip install --no-cache-dir /dist/*.whl

FROM ${CUDA_IMAGE}
LABEL org.opencontainers.image.title="GPUlayer worker (CUDA 12.8)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/gpulayer/gpulayer"
# The pinned base image fixes the OS release; its apt packages follow its security updates.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 gpulayer \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/gpulayer --create-home gpulayer
COPY --from=build /opt/gpulayer /opt/gpulayer
COPY --chmod=0755 docker/entrypoint-worker.sh /usr/local/bin/gpulayer-worker
ENV PATH=/opt/gpulayer/bin:$PATH \
    GPULAYER_HOME=/var/lib/gpulayer \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /var/lib/gpulayer
VOLUME ["/var/lib/gpulayer"]
ENTRYPOINT ["gpulayer-worker"]
