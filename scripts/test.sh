#!/usr/bin/env bash
# The README's test command: sets the machine up (once), builds, runs the whole ctest suite.
#   scripts/test.sh [extra ctest args]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/build.sh"
cd "$here/.."
ctest --preset default "$@"
