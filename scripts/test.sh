#!/usr/bin/env bash
# The README's test command: sets the machine up (once), builds, runs the whole ctest suite.
#   scripts/test.sh [extra ctest args]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# The environment the tests and recipes read (REFIT_MINILM_DIR); setup adds the test-only packages.
export REFIT_SETUP_TESTS=1
source "$here/env.sh"
# What ctest runs (the CLI, the plugins, the test executables), without the benchmarks.
"$here/build.sh" --target refit_tests
cd "$here/.."
ctest --preset default "$@"
