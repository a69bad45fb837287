#!/usr/bin/env bash
# Prints the path of a `go` binary of at least Go 1.22 (helm v3.16 needs it), for
# scripts/ensure-helm.sh. Uses the machine's go when it is new enough. Otherwise fetches the
# Go toolchain the way Go's own GOTOOLCHAIN mechanism does: from the Go module proxy, as the
# module golang.org/toolchain@v0.0.1-goVERSION.OS-ARCH, downloaded (and checked against the
# checksum database) by whatever older `go` Debian provides (bookworm's golang-go is 1.19,
# installed if missing). The toolchain is kept in the cache directory, so this runs once
# per machine. Progress goes to stderr; stdout is only the path.
set -euo pipefail

go_version="1.23.4"
cache_dir="${IWSCOPE_CACHE_DIR:-/var/cache/iwscope}"
toolchain_dir="${cache_dir}/go${go_version}"

recent_enough() {  # $1: a go binary; true if it is Go >= 1.22
  local v
  v="$("$1" env GOVERSION 2>/dev/null || true)"   # e.g. go1.19.8
  [[ "$v" =~ ^go1\.([0-9]+) ]] && (( BASH_REMATCH[1] >= 22 ))
}

if command -v go >/dev/null && GOTOOLCHAIN=local recent_enough "$(command -v go)"; then
  command -v go
  exit 0
fi
if [ -x "${toolchain_dir}/bin/go" ] && recent_enough "${toolchain_dir}/bin/go"; then
  echo "${toolchain_dir}/bin/go"
  exit 0
fi

if ! command -v go >/dev/null; then
  echo "ensure-go: installing Debian's golang-go (only to download Go ${go_version})" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends golang-go >/dev/null
fi
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) echo "ensure-go: no Go toolchain for $(uname -m)" >&2; exit 1 ;;
esac
module="golang.org/toolchain@v0.0.1-go${go_version}.linux-${arch}"
mkdir -p "$cache_dir"
work="$(mktemp -d "${cache_dir}/.go-download.XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "ensure-go: downloading ${module} from the Go module proxy (about 70 MB, once)" >&2
# A throwaway module, so that `go mod download` works with any go version.
(cd "$work" && printf 'module iwscope.local/toolchain\n\ngo 1.19\n' > go.mod &&
  GOFLAGS=-modcacherw GOMODCACHE="${work}/mod" GOCACHE="${work}/cache" GOTOOLCHAIN=local \
    go mod download "$module" >&2)
extracted="$(find "${work}/mod/golang.org" -maxdepth 1 -type d -name 'toolchain@*' | head -n 1)"
[ -n "$extracted" ] && [ -f "${extracted}/bin/go" ] || { echo "ensure-go: ${module} has no bin/go" >&2; exit 1; }
# Module zips carry no file modes: the go command's own toolchain switch marks these executable too.
chmod +x "${extracted}"/bin/* "${extracted}"/pkg/tool/*/*
rm -rf "$toolchain_dir"
mv "$extracted" "$toolchain_dir"
recent_enough "${toolchain_dir}/bin/go" || { echo "ensure-go: ${toolchain_dir}/bin/go does not run" >&2; exit 1; }
echo "ensure-go: $("${toolchain_dir}/bin/go" version)" >&2
echo "${toolchain_dir}/bin/go"
