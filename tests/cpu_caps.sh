#!/usr/bin/env bash
# Checks that the environment's caps on the CPU kernels took effect in each
# library, as each library itself reports it, before `make test-cpu` runs the
# numeric suites under them:
#
#   bash tests/cpu_caps.sh BUILD CPU      CPU: avx2 or default
#
# with the caps of the Makefile's CPU_CAPS_<CPU> in the environment.
#   ATen     `ebb version`'s kernels line, read from libtorch's own build
#            summary ("CPU capability usage: AVX2");
#   oneDNN   its verbose mode's "isa:" line, from a convolution ebb runs;
#   BLAS     OpenBLAS's openblas_get_corename() (ebb version), or MKL's
#            verbose line from a matrix product ebb runs (pip's torch).
set -euo pipefail
build=$1 cpu=$2
ebb="$build/ebb"
root="$(cd "$(dirname "$0")/.." && pwd)"
case "$cpu" in
avx2)    aten="AVX2";   onednn="isa:Intel AVX2";    openblas="OpenBLAS Haswell"; mkl="(Intel(R) AVX2)" ;;
default) aten="NO AVX"; onednn="isa:Intel SSE4.1";  openblas="OpenBLAS Prescott"; mkl="(Intel(R) SSE4.2)" ;;
*) echo "cpu_caps.sh: CPU is avx2 or default, not '$cpu'" >&2; exit 2 ;;
esac
fail=0
check() { # WHAT WANT TEXT
  if grep -qF -- "$2" <<<"$3"; then
    echo "cpu_caps: $1: $2"
  else
    echo "cpu_caps: FAIL: $1 should say '$2'; it said:" >&2
    grep -v '^$' <<<"$3" | head -5 >&2
    fail=1
  fi
}

version=$("$ebb" version)
check "ATen" "kernels ATen $aten," "$version"
if grep -q "OpenBLAS" <<<"$version"; then
  check "OpenBLAS" "$openblas" "$version"
else
  mkl_out=$(cd "$root" && MKL_VERBOSE=1 "$ebb" run specs/mlp.yaml -i batch=64 --device cpu 2>&1)
  check "MKL" "$mkl" "$(grep -m1 MKL_VERBOSE <<<"$mkl_out" || true)"
fi
dnn_out=$(cd "$root" && ONEDNN_VERBOSE=1 DNNL_VERBOSE=1 "$ebb" run specs/fashion_cnn.yaml -i batch=16 \
            --device cpu 2>&1)
check "oneDNN" "$onednn" "$(grep -m1 'isa:' <<<"$dnn_out" || echo "(no verbose line: oneDNN ran nothing)")"
exit $fail
