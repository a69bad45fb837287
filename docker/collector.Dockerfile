# syntax=docker/dockerfile:1
# The collector image: the API, the Celery worker and beat, the dashboard and the migration
# Job all run from it (the Helm chart picks the command). Build from the repository root:
#
#   docker build -f docker/collector.Dockerfile -t ghcr.io/iwscope/collector:0.1.0 .
#
# Stage 1 builds wheels of the three distributions and all their dependencies; stage 2
# installs them from those wheels only (no compiler, no pip cache, no sources) and runs as
# the unprivileged user 10001 that the chart's securityContext expects.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# The version of the three distributions (their pyproject.toml); installed exactly.
ARG IWSCOPE_VERSION=0.1.0

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# A compiler only for a dependency without a manylinux wheel; it stays in this stage.
# (Unpinned on purpose: Debian removes superseded package versions from its mirrors.)
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY probe/ probe/
COPY collector/ collector/
COPY dashboard/ dashboard/
RUN pip wheel --no-cache-dir --wheel-dir /wheels ./probe ./collector ./dashboard

FROM ${PYTHON_IMAGE} AS runtime
ARG IWSCOPE_VERSION
LABEL org.opencontainers.image.title="iwscope collector" \
      org.opencontainers.image.description="iwscope ingest API, Celery worker/beat, dashboard and migrations" \
      org.opencontainers.image.source="https://github.com/iwscope/iwscope" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # The root filesystem is read-only under the chart; /tmp is an emptyDir.
    HOME=/tmp \
    IWSCOPE_MIGRATIONS_DIR=/app/migrations \
    IWSCOPE_ENV=production
RUN groupadd --system --gid 10001 iwscope \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
      --shell /usr/sbin/nologin iwscope
# Install from the builder's wheels without copying them into a layer of this image.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels "iwprobe==${IWSCOPE_VERSION}" \
      "iwscope-collector==${IWSCOPE_VERSION}" "iwscope-dashboard==${IWSCOPE_VERSION}" \
 && iwscope --help >/dev/null \
 && iwscope dashboard --help >/dev/null
WORKDIR /app
COPY --chown=root:root migrations/ /app/migrations/
USER 10001:10001
EXPOSE 8000 8050
# The chart overrides the command per component; alone, the image serves the API.
CMD ["iwscope", "api", "--host", "0.0.0.0", "--port", "8000"]
