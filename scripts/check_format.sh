#!/usr/bin/env bash
# Checks that every tracked .h/.cpp under framework/ include/ plugins/ tests/ bench/ is formatted
# as .clang-format says. Exits 77 (ctest: skipped) without clang-format 14: other major versions
# format some constructs differently, so only the version the tree was formatted with judges it.
#   scripts/check_format.sh [REPO_ROOT]        # scripts/check_format.sh --fix formats in place
set -euo pipefail
if [ "${1:-}" = "--fix" ]; then root="$(cd "$(dirname "$0")/.." && pwd)"; else root="$(cd "${1:-$(dirname "$0")/..}" && pwd)"; fi
tool=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$tool" ] || ! "$tool" --version | grep -q 'version 14\.'; then
  echo "SKIP: clang-format 14 is not installed (Debian 12: apt-get install clang-format)"; exit 77
fi
cd "$root"
if ! git rev-parse --is-inside-work-tree > /dev/null 2>&1; then echo "SKIP: not a git checkout"; exit 77; fi
mapfile -t files < <(git ls-files 'framework/*.h' 'framework/*.cpp' 'include/*.h' 'plugins/*.h' 'plugins/*.cpp' \
  'tests/*.h' 'tests/*.cpp' 'bench/*.h' 'bench/*.cpp')
if [ "${1:-}" = "--fix" ]; then "$tool" -i "${files[@]}"; exit 0; fi
if ! "$tool" --dry-run --Werror "${files[@]}" 2> /tmp/refit-format.$$; then
  grep -E '^[^ ].*: (error|warning)' /tmp/refit-format.$$ | sed 's/: error: code should be clang-formatted.*//' | sort -u |
    sed 's/^/not formatted: /' | head -40
  rm -f /tmp/refit-format.$$
  echo "FAIL: run scripts/check_format.sh --fix"; exit 1
fi
rm -f /tmp/refit-format.$$
echo "OK: ${#files[@]} files formatted as .clang-format says"
