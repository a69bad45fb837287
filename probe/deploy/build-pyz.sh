#!/bin/sh
# Build iwprobe.pyz: one file that runs on any Linux VM with Python >= 3.9 and nothing else.
#   probe/deploy/build-pyz.sh [OUTPUT]      (default: probe/dist/iwprobe.pyz)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
source_dir="$here/../src/iwprobe"
output=${1:-"$here/../dist/iwprobe.pyz"}
python=${PYTHON:-python3}
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT INT TERM
mkdir -p "$staging/iwprobe" "$(dirname "$output")"
# Only the package's sources and the wire schema; no caches, no egg-info.
for file in "$source_dir"/*.py "$source_dir"/*.json; do
    cp "$file" "$staging/iwprobe/"
done
"$python" -m zipapp "$staging" --main "iwprobe.__main__:main" --python "/usr/bin/env python3" --output "$output"
chmod 0755 "$output"
echo "$output"
