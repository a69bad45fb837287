# syntax=docker/dockerfile:1
# The probe image: iwprobe, standard library only. Build from the repository root:
#
#   docker build -f docker/probe.Dockerfile -t ghcr.io/iwscope/probe:0.1.0 .
#
# Probe:  docker run -v iwprobe:/var/lib/iwprobe ghcr.io/iwscope/probe:0.1.0 \
#           enroll --collector https://iwscope.example.com --token ... --name p1 --region eu
#         docker run -d -v iwprobe:/var/lib/iwprobe ghcr.io/iwscope/probe:0.1.0 run
# Origin: needs the host network and CAP_NET_ADMIN for its per-IW routes
#         (--network host --cap-add NET_ADMIN ... origin serve --setup-routes); iproute2 is
#         in the image for that. VMs usually run iwprobe without a container (Ansible role).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# The version of iwprobe (probe/pyproject.toml); installed exactly, by name (pip freeze then
# says iwprobe==VERSION, as the lock check of tests/deploy/test_images_built.py reads it).
ARG IWPROBE_VERSION=0.1.0

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY probe/ probe/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels ./probe

FROM ${PYTHON_IMAGE} AS runtime
ARG IWPROBE_VERSION
LABEL org.opencontainers.image.title="iwscope probe" \
      org.opencontainers.image.description="iwprobe: the iwscope probe and instrumented origin (stdlib only)" \
      org.opencontainers.image.source="https://github.com/iwscope/iwscope" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    IWPROBE_STATE_DIR=/var/lib/iwprobe
# (iproute2 unpinned on purpose: Debian removes superseded versions from its mirrors.)
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends iproute2 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 iwprobe \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/iwprobe \
      --shell /usr/sbin/nologin iwprobe \
 && install -d -o 10001 -g 10001 -m 0700 /var/lib/iwprobe
# No dependencies to resolve: --no-deps proves the wheel needs nothing but the stdlib.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels --no-deps "iwprobe==${IWPROBE_VERSION}" \
 && iwprobe version
VOLUME ["/var/lib/iwprobe"]
USER 10001:10001
ENTRYPOINT ["iwprobe"]
CMD ["run"]
