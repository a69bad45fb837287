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
# The archive's own __main__ passes main()'s return value to the exit status (zipapp's --main
# discards it: every command of the archive would exit 0, a failed fetch or census included).
printf 'import sys\n\nimport iwprobe.__main__\n\nsys.exit(iwprobe.__main__.main())\n' > "$staging/__main__.py"
"$python" -m zipapp "$staging" --python "/usr/bin/env python3" --output "$output"
chmod 0755 "$output"
echo "$output"
