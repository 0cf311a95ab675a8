#!/usr/bin/env bash
# Mutation testing of the test suite (CONTRIBUTING.md, "Mutation testing"): applies each planted
# bug of scripts/mutants/mutants.tsv in turn, rebuilds what its ctest selection needs in build/,
# runs the selection, and reverts the patch (always: on failures and signals too).
#   scripts/mutants/run.sh [--report FILE] [--list] [--no-baseline] [-j N] [ID|NAME ...]
# Not part of ctest: the whole list (53) took 36 minutes on 2 cores with a warm ccache and the
# default unity batches (a mutant recompiles its batch; configuring build/ with
# -DREFIT_UNITY_BATCH_SIZE=8 -DREFIT_TEST_UNITY_BATCH_SIZE=8 first makes each rebuild smaller).
set -euo pipefail
exec python3 "$(cd "$(dirname "$0")" && pwd)/driver.py" "$@"
