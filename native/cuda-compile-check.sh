#!/usr/bin/env bash
# Compiles every CUDA source (native/cuda/*.cu and the harness) with nvcc, as
# objects into a temporary folder, so the CUDA backend never rots on machines
# without a GPU (CI). sm_90 machine code plus compute_90 PTX (the driver can
# JIT the PTX for later GPUs); host and nvcc warnings are errors.
#
# The addon build (native/build.mjs) already compiles native/cuda/*.cu with
# these same flags (plus -O3 -fPIC) and lists them in
# native/build/cuda/objects.txt: a source listed there with these flags whose
# object is newer than it and than every header is not compiled again, so CI
# compiles each .cu once. CONTINUUM_CUDA_CHECK_ALL=1 compiles everything anyway.
#
# Without nvcc it says so and exits 0, unless CONTINUUM_REQUIRE_NVCC=1.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvcc >/dev/null; then
  echo "cuda-compile-check: SKIPPED, nvcc not found on PATH"
  [ "${CONTINUUM_REQUIRE_NVCC:-0}" = 1 ] && exit 1
  exit 0
fi

TMP="$(mktemp -d /tmp/ck-cuda-compile.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
# Keep in step with CHECK_FLAGS in native/build.mjs.
FLAGS=(-std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
  -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror -Inative/src)

if echo '#include <cublas_v2.h>' | nvcc -x cu -E - -o /dev/null 2>/dev/null; then
  echo "cuda-compile-check: cuBLAS headers found: gemm_cublas.cu compiled in full"
else
  echo "cuda-compile-check: no cuBLAS headers here: gemm_cublas.cu compiles without its cuBLAS body"
fi

MANIFEST=native/build/cuda/objects.txt
srcs=()
reused=()
for src in native/cuda/*.cu native/cuda/harness/*.cu; do
  obj="native/build/cuda/$(basename "$src" .cu).o"
  if [ "${CONTINUUM_CUDA_CHECK_ALL:-0}" != 1 ] && [ -f "$MANIFEST" ] && [ -f "$obj" ] &&
    grep -qxF -e "${FLAGS[*]}	$src" "$MANIFEST" &&
    [ -z "$(find native/cuda native/src \( -name '*.cuh' -o -name '*.h' -o -path "$src" \) -newer "$obj" -print -quit)" ]; then
    reused+=("$src")
  else
    srcs+=("$src")
  fi
done
for src in "${reused[@]}"; do echo "  ok   $src (compiled by the addon build, same flags)"; done

t0=$(date +%s)
# Two at a time (CI has 2 cores); each job's output is kept and printed whole.
printf '%s\n' "${srcs[@]}" | xargs -P 2 -I{} sh -c '
  dir="$1"; src="$2"; shift 2
  obj="$dir/$(basename "$src" .cu).o"
  if nvcc "$@" -c "$src" -o "$obj" >"$obj.log" 2>&1; then echo "  ok   $src"; else echo "  FAIL $src"; cat "$obj.log"; exit 1; fi
' _ "$TMP" {} "${FLAGS[@]}" 2>&1 || { echo "cuda-compile-check: FAILED" >&2; exit 1; }
echo "cuda-compile-check: $(( ${#srcs[@]} + ${#reused[@]} )) CUDA sources checked for sm_90 + PTX:" \
  "${#srcs[@]} compiled here in $(( $(date +%s) - t0 )) s, ${#reused[@]} by the addon build"
