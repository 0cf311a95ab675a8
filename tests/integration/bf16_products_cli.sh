#!/usr/bin/env bash
# bf16_products_cli.sh REFIT: `refit --version` names how this CPU computes bf16 products;
# by default per product shape, its decisions kept in a file (REFIT_BF16_PRODUCTS_CACHE: its folder,
# or off); REFIT_BF16_PRODUCTS forces either path, and a wrong value is an error naming the variable.
set -u
refit="$1"
expect="$(dirname "$0")/expect.sh"
status=0
"$expect" 0 'CPU bf16 products: per product shape, the faster of the native bf16 kernel and the fp32 route, timed on first use \(bf16/fp32 matmul time [0-9.]+x, auto; ATen [A-Z0-9_]+\); decisions kept in .*/bf16-products-[0-9a-f]+\.json' \
  -- "$refit" --version || status=1
REFIT_BF16_PRODUCTS_CACHE=off "$expect" 0 'CPU bf16 products: per product shape, .* ATen [A-Z0-9_]+\)$' \
  -- "$refit" --version || status=1
REFIT_BF16_PRODUCTS=fp32 "$expect" 0 'CPU bf16 products: fp32 kernels, results rounded to bf16 \(REFIT_BF16_PRODUCTS=fp32' \
  -- "$refit" --version || status=1
REFIT_BF16_PRODUCTS=native "$expect" 0 'CPU bf16 products: native bf16 kernels \(REFIT_BF16_PRODUCTS=native' \
  -- "$refit" --version || status=1
REFIT_BF16_PRODUCTS=fast "$expect" 1 'REFIT_BF16_PRODUCTS=fast: expected auto, native or fp32' \
  -- "$refit" --version || status=1
exit $status
