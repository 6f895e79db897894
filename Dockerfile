# syntax=docker/dockerfile:1
# The muongen image, for `docker run` / `podman run`. Two variants from one file:
#
#   docker build -t muongen:cuda .                         # GPU: pytorch/pytorch CUDA runtime base
#   docker build --build-arg VARIANT=cpu -t muongen:cpu .  # small CPU-only image, for a try
#
# Both run container/install.sh (shared with Apptainer.def): the exact versions pinned in
# container/requirements.lock, then muongen from this checkout. Nothing is fetched at run
# time. CUDA_IMAGE's torch must be the lock's torch (install.sh stops the build otherwise);
# torch 2.13's default CUDA is 13.0, which needs an NVIDIA driver >= 580: for older drivers
# pass e.g. --build-arg CUDA_IMAGE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime.
#
# Where the build's pip finds packages (build arguments; none of them stays in the image):
#   TORCH_FIND_LINKS=DIR   the CPU torch wheel from a folder of wheels instead of
#                          TORCH_INDEX_URL (podman: also --volume DIR:DIR:ro)
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_CERT   a PyPI mirror and its CA bundle
#   HTTPS_PROXY, HTTP_PROXY, NO_PROXY              predefined: a proxy (not kept either)
# On a machine without Docker Hub or with intercepted TLS, see the README's podman section.

ARG VARIANT=cuda
ARG CUDA_IMAGE=pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime
ARG CPU_IMAGE=python:3.11-slim

FROM ${CUDA_IMAGE} AS base-cuda
FROM ${CPU_IMAGE} AS base-cpu

# DL3006: base-${VARIANT} names one of the two stages above, both from tagged images.
# hadolint ignore=DL3006
FROM base-${VARIANT} AS final
ARG VARIANT
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_FIND_LINKS=
ARG PIP_INDEX_URL=
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_CERT=

# expandable_segments: the cure for the allocator fragmentation that ratcheted reserved
# CUDA memory up to an OOM in the original trainer (design section 3).
ENV PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    HOME=/home/muongen \
    MUONGEN_LOCK=/opt/muongen/container/requirements.lock

# 1. torch and the pinned dependencies, from the lock and the install script alone: this
# layer (most of the image) is reused until one of those two files changes.
# HOME and the work dir are world-writable (sticky) so `docker run --user "$(id -u):$(id -g)"`
# works with bind-mounted run folders; caches default to $HOME/.cache, temp files to /tmp.
COPY container/install.sh container/requirements.lock /opt/muongen/container/
RUN sh /opt/muongen/container/install.sh "${VARIANT}" /opt/muongen deps \
    && groupadd --gid 10001 muongen \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/muongen --shell /bin/sh muongen \
    && mkdir -p /workspace \
    && chmod 1777 /home/muongen /workspace

# 2. muongen from this checkout (.dockerignore lets only the package sources, jobs/,
# container/ and the build files in), the entrypoint, and the build-time self-check.
COPY . /opt/muongen/
RUN sh /opt/muongen/container/install.sh "${VARIANT}" /opt/muongen package

# Labels last: a new revision or date does not invalidate the layers above.
ARG MUONGEN_VERSION=0.1.0
ARG VCS_REF=unknown
ARG BUILD_DATE=unknown
LABEL org.opencontainers.image.title="muongen" \
      org.opencontainers.image.description="Conditional WGAN-GP generator of IceCube atmospheric muon bundles (${VARIANT})" \
      org.opencontainers.image.version="${MUONGEN_VERSION}" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.created="${BUILD_DATE}" \
      org.opencontainers.image.licenses="BSD-3-Clause" \
      org.opencontainers.image.vendor="muongen developers" \
      io.muongen.variant="${VARIANT}"

USER 10001:10001
WORKDIR /workspace

# Cheap and safe beside a running trainer: no CUDA context, no network (see muongen doctor).
HEALTHCHECK --interval=10m --timeout=2m --start-period=1m --retries=3 \
    CMD ["muongen", "doctor", "--quick"]

ENTRYPOINT ["/usr/local/bin/muongen-entrypoint"]
CMD ["--help"]
