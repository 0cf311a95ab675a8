#!/usr/bin/env bash
# no_gloo_code.sh OBJECT
# refit compiles ProcessGroupGloo.hpp against Debian's (older) Gloo headers; that is sound only
# while no Gloo code from those headers is compiled into refit (docs/distributed.md). Fails when
# the object defines any gloo:: symbol (a LibTorch upgrade or a new call that instantiates one).
set -euo pipefail
[ -f "$1" ] || { echo "FAIL: $1 was not built (compiled inside a unity batch?): nothing to check"; exit 1; }
defined=$(nm -C --defined-only "$1" | grep -E ' [TtWwVvuB] .*gloo::' || true)
[ -z "$defined" ] || { echo "FAIL: $1 defines Gloo code:"; echo "$defined" | head; exit 1; }
echo "OK: no gloo:: symbol defined in $(basename "$1")"
