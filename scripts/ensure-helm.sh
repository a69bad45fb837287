#!/usr/bin/env bash
# Prints the path of a helm v3.16.4 binary, building it once with `go install` into a cache
# directory that survives between CI runs on the same machine (first run ~2 minutes).
# Override the location with IWSCOPE_CACHE_DIR; all progress output goes to stderr so that
# stdout is only the path (usable as `helm="$(scripts/ensure-helm.sh)"`).
set -euo pipefail
cd "$(dirname "$0")/.."

helm_version="v3.16.4"
cache_dir="${IWSCOPE_CACHE_DIR:-/var/cache/iwscope}"
bin_dir="${cache_dir}/bin"
helm_bin="${bin_dir}/helm"
# The flags helm's own Makefile sets: the version string, and the Kubernetes version that
# `helm template` / `helm lint` assume without a cluster (1.31 = helm 3.16's client-go;
# without these, go install builds report v1.20 and charts needing >= 1.25 fail to render).
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${helm_version}"
for pkg in pkg/lint/rules pkg/chartutil; do
  ldflags+=" -X helm.sh/helm/v3/${pkg}.k8sVersionMajor=1 -X helm.sh/helm/v3/${pkg}.k8sVersionMinor=31"
done
# A binary is reused only if it was built with exactly these flags.
stamp="${helm_bin}.ldflags"

installed_version() {
  "$helm_bin" version --template '{{.Version}}' 2>/dev/null || true
}

usable() {
  [ -x "$helm_bin" ] && [ "$(installed_version)" = "$helm_version" ] &&
    [ "$(cat "$stamp" 2>/dev/null)" = "$ldflags" ]
}

if usable; then
  echo "$helm_bin"
  exit 0
fi

mkdir -p "$bin_dir"
# Serialise concurrent first runs (two CI jobs on one machine) on a lock file.
exec 9>"${cache_dir}/.helm.lock"
flock 9
if usable; then
  echo "$helm_bin"
  exit 0
fi

go_bin="$(scripts/ensure-go.sh)"
echo "ensure-helm: building helm ${helm_version} with ${go_bin} (about 2 minutes, once)" >&2
build_dir="$(mktemp -d "${bin_dir}/.build.XXXXXX")"
trap 'rm -rf "$build_dir"' EXIT
# Module and build caches live in the temporary build directory (about 1.2 GB, removed at
# the end; -modcacherw lets rm delete them): only the 57 MB binary is kept. CGO off gives a
# static binary.
CGO_ENABLED=0 GOFLAGS=-modcacherw GOBIN="$build_dir" GOMODCACHE="${build_dir}/gomod" \
  GOCACHE="${build_dir}/gocache" GOTOOLCHAIN=local "$go_bin" install -ldflags "$ldflags" \
  "helm.sh/helm/v3/cmd/helm@${helm_version}" >&2
mv -f "${build_dir}/helm" "$helm_bin"
printf '%s' "$ldflags" > "$stamp"
got="$(installed_version)"
if [ "$got" != "$helm_version" ]; then
  echo "ensure-helm: built helm reports version '${got}', expected ${helm_version}" >&2
  exit 1
fi
echo "$helm_bin"
