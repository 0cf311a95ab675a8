#!/usr/bin/env bash
# expect.sh EXIT_CODE REGEX... -- COMMAND...
# Runs COMMAND, checks its exit code and that every REGEX (extended) matches its combined output.
set -u
want="$1"; shift
patterns=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do patterns+=("$1"); shift; done
shift
out=$("$@" 2>&1); got=$?
echo "$out"
status=0
if [ "$got" != "$want" ]; then echo "FAIL: exit code $got, expected $want"; status=1; fi
for p in "${patterns[@]}"; do
  if ! grep -Eq -- "$p" <<<"$out"; then echo "FAIL: output does not match: $p"; status=1; fi
done
exit $status
