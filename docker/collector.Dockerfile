# syntax=docker/dockerfile:1
# The collector image: the API, the Celery worker and beat, the dashboard and the migration
# Job all run from it (the Helm chart picks the command). Build from the repository root:
#
#   docker build -f docker/collector.Dockerfile -t ghcr.io/iwscope/collector:0.1.0 .
#
# Stage 1 builds the wheels of the three distributions and fetches, checked against the
# sha256 hashes of requirements.lock, exactly the third-party wheels the lock pins for them
# (docker/lock_subset.py: pip resolves with the lock as constraints, and a package the lock
# lacks or pins otherwise stops the build) -- the image holds what the test suite ran against.
# Stage 2 installs them with --require-hashes from those files only (no index, no compiler, no
# pip cache, no sources) and runs as the unprivileged user 10001 that the chart expects.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# The version of the three distributions (their pyproject.toml); installed exactly.
ARG IWSCOPE_VERSION=0.1.0

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY requirements.lock docker/lock_subset.py ./
COPY probe/ probe/
COPY collector/ collector/
COPY dashboard/ dashboard/
# Binary wheels only: a dependency without one for this platform is an error here, not a
# compiler in the image.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels ./probe ./collector ./dashboard \
 && python3 lock_subset.py constraints requirements.lock > /tmp/constraints.txt \
 && pip install --no-cache-dir --dry-run --ignore-installed --quiet --report /tmp/resolved.json \
      -c /tmp/constraints.txt /wheels/*.whl \
 && python3 lock_subset.py subset requirements.lock /tmp/resolved.json > /wheels/runtime.lock \
 && pip download --no-cache-dir --require-hashes --no-deps --only-binary=:all: --dest /wheels \
      -r /wheels/runtime.lock

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
# Install from the builder's files without copying them into a layer of this image: the
# lock's wheels hash-checked, then the three distributions (their dependencies are those).
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels --no-deps --require-hashes \
      -r /wheels/runtime.lock \
 && pip install --no-cache-dir --no-index --find-links=/wheels --no-deps "iwprobe==${IWSCOPE_VERSION}" \
      "iwscope-collector==${IWSCOPE_VERSION}" "iwscope-dashboard==${IWSCOPE_VERSION}" \
 && pip check \
 && iwscope --help >/dev/null \
 && iwscope dashboard --help >/dev/null
WORKDIR /app
COPY --chown=root:root migrations/ /app/migrations/
USER 10001:10001
EXPOSE 8000 8050
# The chart overrides the command per component; alone, the image serves the API.
CMD ["iwscope", "api", "--host", "0.0.0.0", "--port", "8000"]
