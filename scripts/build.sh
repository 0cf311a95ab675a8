#!/usr/bin/env bash
# Configures (once) and builds refit in build/. Incremental after the first run.
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/env.sh"
cd "$_refit_root"
[ -f build/CMakeCache.txt ] || cmake --preset default >/dev/null
cmake --build --preset default "$@"
