#!/usr/bin/env bash
# Mutation testing of the test suite (CONTRIBUTING.md, "Mutation testing"): applies each planted
# bug of scripts/mutants/mutants.tsv in turn, rebuilds what its ctest selection needs in build/,
# runs the selection, and reverts the patch (always: on failures and signals too).
#   scripts/mutants/run.sh [--report FILE] [--list] [--no-baseline] [-j N] [ID|NAME ...]
# Not part of ctest: the whole list took 18 minutes on 2 cores with a warm ccache, with unity
# batches of 8 (a mutant recompiles its batch: with the default 36, configure build/ with
# -DREFIT_UNITY_BATCH_SIZE=8 -DREFIT_TEST_UNITY_BATCH_SIZE=8 first for that time).
set -euo pipefail
exec python3 "$(cd "$(dirname "$0")" && pwd)/driver.py" "$@"
