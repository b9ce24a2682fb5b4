#!/usr/bin/env bash
# Builds the CUDA kernels and engine, the CPU kernels and engine (native/src)
# and the C++ harness with nvcc (no Node, no CMake needed), then runs the
# harness: every CUDA kernel against the CPU kernel on fresh random data, GPU
# determinism (batch and chunking invariance, also through the CUDA engine's
# step), page transfers, the CUDA engine's step() logits against the CPU
# engine's on a small random model, and timings against the device copy
# bandwidth and cuBLAS measured in the same run.
#
#   native/gpu-check.sh [--build-only] [--quick] [seed]
#
# On the device tool: `native/gpu-check.sh` (log and binary go to $OUT when
# set). --build-only compiles and links (works on a machine without a GPU).
# CUDA_ARCH overrides the target (default 90: sm_90 code + compute_90 PTX).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_ONLY=0
ARGS=()
for a in "$@"; do
  case "$a" in
    --build-only) BUILD_ONLY=1 ;;
    *) ARGS+=("$a") ;;
  esac
done

command -v nvcc >/dev/null || { echo "gpu-check: nvcc not found on PATH" >&2; exit 2; }
ARCH="${CUDA_ARCH:-90}"
BUILD="${BUILD_DIR:-$(mktemp -d /tmp/ck-gpu-check.XXXXXX)}"
mkdir -p "$BUILD"
# A temporary build of a build-only run (CI) is not left behind.
if [ "$BUILD_ONLY" = 1 ] && [ -z "${BUILD_DIR:-}" ]; then trap 'rm -rf "$BUILD"' EXIT; fi

# cuBLAS: linked when its header is reachable (the GPU image has it; this
# project's CI machine does not).
CUBLAS=()
NO_CUBLAS=()
if echo '#include <cublas_v2.h>' | nvcc -x cu -E - -o /dev/null 2>/dev/null; then
  if echo 'int main(){}' | nvcc -x cu - -lcublas -o /dev/null 2>/dev/null; then
    CUBLAS=(-lcublas)
    echo "gpu-check: cuBLAS found: the cuBLAS path is built"
  else
    NO_CUBLAS=(-DCK_NO_CUBLAS)
    echo "gpu-check: cuBLAS headers but no library: building without the cuBLAS path"
  fi
else
  echo "gpu-check: no cuBLAS headers: building without the cuBLAS path"
fi

NVFLAGS=(-std=c++17 -O3 -lineinfo
  -gencode "arch=compute_${ARCH},code=sm_${ARCH}" -gencode "arch=compute_${ARCH},code=compute_${ARCH}"
  -Xcompiler -Wall,-Wextra,-pthread -Xptxas -warn-spills -Inative/src -DCK_WITH_CUDA=1 "${NO_CUBLAS[@]}")

echo "gpu-check: compiling into $BUILD"
t0=$(date +%s)
objs=()
pids=()
# The harness links the CUDA engine and the CPU engine (backend.cc, engine.cc)
# directly, to compare their step() logits without Node. The CPU sources are the
# addon's own list in binding.gyp, so a new kernel file is never left out here,
# less the N-API glue: each source that includes napi.h, itself or through its
# own header.
cpu_srcs=""
for src in $(grep -o '"src/[a-z0-9_]*\.cc"' native/binding.gyp | tr -d '"'); do
  src="native/$src"
  grep -qs 'napi\.h' "$src" "${src%.cc}.h" || cpu_srcs="$cpu_srcs $src"
done
for src in native/cuda/*.cu native/cuda/harness/*.cu $cpu_srcs; do
  obj="$BUILD/$(basename "${src%.*}").o"
  objs+=("$obj")
  nvcc "${NVFLAGS[@]}" -c "$src" -o "$obj" &
  pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
[ "$fail" = 0 ] || { echo "gpu-check: compile FAILED" >&2; exit 1; }
nvcc "${NVFLAGS[@]}" "${objs[@]}" "${CUBLAS[@]}" -o "$BUILD/gpu_check"
echo "gpu-check: built $BUILD/gpu_check in $(( $(date +%s) - t0 )) s"

if [ "$BUILD_ONLY" = 1 ]; then exit 0; fi

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader || true
fi
LOG=/dev/null
if [ -n "${OUT:-}" ]; then
  cp "$BUILD/gpu_check" "$OUT/" || true
  LOG="$OUT/gpu-check.log"
fi
set +e
"$BUILD/gpu_check" "${ARGS[@]}" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
exit "$rc"
