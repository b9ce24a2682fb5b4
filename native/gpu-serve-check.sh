#!/usr/bin/env bash
# A Node worker serving on the GPU machine: that machine (one H200) has nvcc,
# a C++ compiler and PyTorch but no Node, and takes at most 64 MiB of files
# from the repository. So this machine packs what it needs into
# native/build/gpu-serve/ (ignored; the device run carries it), and there the
# script builds the addon, generates the model and runs `bench gpu`, which
# drives `continuum serve` on the CUDA engine over HTTP, times the engine's
# step by part, checks exactness through the store path and runs the same
# weights through PyTorch, and prints one table (bench/gpu.ts).
#
#   native/gpu-serve-check.sh --build-only   here / in CI: pack, check the 64 MiB bound,
#                                            build the addon as the device does, and run the
#                                            bundled `bench gpu --quick` on the CPU engine
#   native/gpu-serve-check.sh [--with-harness] [--with-7b]
#                                            the device, with native/build/gpu-serve carried;
#                                            --with-harness runs native/gpu-check.sh first
#
# The pack: the project bundled into one file (esbuild, from tsx's
# dependencies; cli/standalone.ts is the entry), this machine's Node
# (process.execPath) compressed with xz, bench/_torch_llama.py, and the
# headers the addon compiles against (Node-API's and node-addon-api's). The
# addon itself is built on the device from the working tree's native/ with
# that machine's nvcc (sm_90 + compute_90 PTX, the flags of native/build.mjs)
# and the static CUDA runtime, so it matches the device's driver.
#
# On the device: ~1 min addon build (beside the model's generation), ~4 min
# bench; log, JSON and the table go to $OUT when set. Exit 1 when a check of
# exactness fails or anything breaks. --with-7b then writes a Mistral-7B-shaped
# model with random bf16 weights (bench/_torch_llama.py --write-random) and
# runs the bench on it too (~14.5 GB of weights; several more minutes).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_ONLY=0
WITH_7B=0
WITH_HARNESS=0
for a in "$@"; do
  case "$a" in
    --build-only) BUILD_ONLY=1 ;;
    --with-7b) WITH_7B=1 ;;
    --with-harness) WITH_HARNESS=1 ;;
    *) echo "gpu-serve-check: unknown argument $a" >&2; exit 2 ;;
  esac
done

PKG=native/build/gpu-serve
RUN=$PKG/run
LIMIT=$((64 << 20))
OUT_DIR="${OUT:-}"
say() { echo "gpu-serve-check: $*"; }
jobs_n=$(nproc 2>/dev/null || echo 2)

# The CUDA flags of native/build.mjs (CHECK_FLAGS, then -O3 -fPIC; keep them in step) less
# -Werror: the device's nvcc may warn where this one did not, and CI checks the warnings.
# CK_NO_CUBLAS: the engine never calls cuBLAS, and the addon links no cuBLAS library.
CUDA_FLAGS=(-std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
  -Inative/src -O3 -Xcompiler -fPIC -DCK_NO_CUBLAS)
# binding.gyp's flags for the CPU sources and the binding (node-gyp's defaults included).
CXX_FLAGS=(-std=c++17 -O3 -ffp-contract=off -fno-math-errno -fPIC -pthread -fno-rtti -m64
  -DNAPI_VERSION=8 -DNAPI_CPP_EXCEPTIONS -DBUILDING_NODE_EXTENSION -DNODE_GYP_MODULE_NAME=continuum_native
  -I"$PKG/include/node" -I"$PKG/include/napi")

# ---- packing (this machine) ---------------------------------------------------------
pack() {
  mkdir -p "$PKG/include/node" "$PKG/include/napi"
  say "bundling cli/standalone.ts"
  node_modules/esbuild/bin/esbuild cli/standalone.ts --bundle --platform=node --format=esm --target=node20 \
    --outfile="$PKG/continuum.mjs" --log-level=warning \
    --banner:js="import { createRequire as __ckRequire } from 'node:module'; const require = __ckRequire(import.meta.url);"
  cp bench/_torch_llama.py "$PKG/"
  # The web view's files, read beside the bundle (./assets) and from node_modules (uPlot).
  rm -rf "$PKG/assets" "$PKG/node_modules"
  cp -r controller/ui/assets "$PKG/assets"
  mkdir -p "$PKG/node_modules/uplot/dist"
  cp node_modules/uplot/package.json "$PKG/node_modules/uplot/"
  cp node_modules/uplot/dist/uPlot.iife.min.js node_modules/uplot/dist/uPlot.min.css "$PKG/node_modules/uplot/dist/"
  local node_bin
  node_bin="$(node -p process.execPath)"
  if [ ! -f "$PKG/node.xz" ] || [ "$node_bin" -nt "$PKG/node.xz" ]; then
    say "packing $node_bin ($(node --version)) with xz"
    xz -T0 -1 -c "$node_bin" > "$PKG/node.xz.tmp" && mv "$PKG/node.xz.tmp" "$PKG/node.xz"
  fi
  node -p process.version > "$PKG/node.version"
  # Node-API headers: where node-gyp takes them from (this Node's prefix), then node-addon-api's.
  local prefix
  prefix="$(dirname "$(dirname "$node_bin")")"
  for h in node_api.h node_api_types.h js_native_api.h js_native_api_types.h; do
    cp "$prefix/include/node/$h" "$PKG/include/node/"
  done
  cp node_modules/node-addon-api/napi.h node_modules/node-addon-api/napi-inl.h \
    node_modules/node-addon-api/napi-inl.deprecated.h "$PKG/include/napi/"
}

# What the device run takes: the working tree (tracked and untracked, not ignored) plus the pack.
size_check() {
  local tree pack_bytes total
  tree=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
  pack_bytes=$(du -cb "$PKG/continuum.mjs" "$PKG/node.xz" "$PKG/node.version" "$PKG/_torch_llama.py" "$PKG/include" | tail -1 | cut -f1)
  total=$((tree + pack_bytes))
  say "$((tree >> 10)) KiB of working tree + $((pack_bytes >> 10)) KiB of pack = $((total >> 20)) MiB (limit 64 MiB)"
  [ "$total" -le "$LIMIT" ] || { say "FAILED: over the 64 MiB the device run takes" >&2; exit 1; }
}

# ---- the addon (device, and the build-only rehearsal) ------------------------------------
# The toolkit's libraries: nvcc's own directory as nvcc reports it (the nvcc on PATH may be a
# wrapper), as native/build.mjs finds it.
cuda_libdir() {
  local here home
  here="$(nvcc --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/.*_HERE_=\([^ ]*\).*/\1/p' | head -1)"
  [ -n "$here" ] || here="$(dirname "$(readlink -f "$(command -v nvcc)")")"
  home="$(dirname "$here")"
  for d in "$home/lib64" "$home/targets/x86_64-linux/lib" "$home/lib"; do
    [ -f "$d/libcudart_static.a" ] && { echo "$d"; return; }
  done
  return 1
}

# build_addon OUT [reuse]: the addon as binding.gyp builds it. reuse: link the CUDA
# archive the addon build here made (same flags) instead of compiling native/cuda again.
build_addon() {
  local out="$1" reuse="${2:-}" obj="$RUN/obj" t0
  t0=$(date +%s)
  rm -rf "$obj" && mkdir -p "$obj" "$(dirname "$out")"
  local cuda=() defs=()
  if [ "$reuse" = reuse ] && [ -f native/build/cuda/libck_cuda.a ]; then
    cuda=(native/build/cuda/libck_cuda.a)
  elif command -v nvcc >/dev/null; then
    say "compiling native/cuda/*.cu with $(command -v nvcc) ($(nvcc --version | tail -1))"
    printf '%s\n' native/cuda/*.cu | xargs -P "$jobs_n" -I{} sh -c \
      'nvcc "$@" -c "$0" -o "'"$obj"'/$(basename "$0" .cu).cu.o" || exit 255' {} "${CUDA_FLAGS[@]}"
    ar rcs "$obj/libck_cuda.a" "$obj"/*.cu.o
    cuda=("$obj/libck_cuda.a")
  fi
  local libs=(-ldl -lrt -lpthread)
  if [ ${#cuda[@]} -gt 0 ]; then
    defs=(-DCK_WITH_CUDA=1)
    libs=("${cuda[@]}" -L"$(cuda_libdir)" -lcudart_static "${libs[@]}")
  else
    say "no CUDA archive and no nvcc: the addon is built without the CUDA backend"
  fi
  local srcs
  srcs=$(grep -o '"src/[a-z0-9_]*\.cc"' native/binding.gyp | tr -d '"')
  printf '%s\n' $srcs | xargs -P "$jobs_n" -I{} sh -c \
    'g++ "$@" -c "native/$0" -o "'"$obj"'/$(basename "$0" .cc).o" || exit 255' {} "${CXX_FLAGS[@]}" "${defs[@]}"
  g++ -shared -pthread -rdynamic -m64 -o "$out" "$obj"/*.o "${libs[@]}"
  say "built $out in $(( $(date +%s) - t0 )) s"
}

unpack_node() {
  mkdir -p "$RUN"
  if command -v xz >/dev/null; then
    xz -dc "$PKG/node.xz" > "$RUN/node"
  else  # Python's lzma reads xz too
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      "$PKG/node.xz" "$RUN/node"
  fi
  chmod +x "$RUN/node"
  cp "$PKG/continuum.mjs" "$PKG/_torch_llama.py" "$RUN/"
  rm -rf "$RUN/assets" "$RUN/node_modules"
  cp -r "$PKG/assets" "$PKG/node_modules" "$RUN/"
  say "node $("$RUN/node" --version) unpacked"
}

# check_json FILE: the bench's exactness checks all true, its throughput figures numbers.
check_json() {
  "$RUN/node" -e '
    const j = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").at(-1));
    const f = j.figures, bad = [];
    for (const k of ["exact_restore", "exact_batch16", "exact_chunking"]) if (f[k] !== true) bad.push(k + "=" + f[k]);
    for (const k of ["decode_b1_tok_per_s", "prefill_tok_per_s", "ttft_cold_ms"]) if (!(f[k] > 0)) bad.push(k + "=" + f[k]);
    if (bad.length) { console.error("gpu-serve-check: FAILED: " + bad.join(", ")); process.exit(1); }
    console.log("gpu-serve-check: exactness checks pass (" + f.backend + ", " + f.variant + ")");
  ' "$1"
}

if [ "$BUILD_ONLY" = 1 ]; then
  command -v node >/dev/null || { say "node not found" >&2; exit 2; }
  t0=$(date +%s)
  pack
  size_check
  rm -rf "$RUN"
  unpack_node
  build_addon "$RUN/build/Release/continuum_native.node" reuse
  "$RUN/node" -e 'const a = require(process.argv[1]); const c = a.cudaProbe(); console.log("gpu-serve-check: addon loads; cuda " + JSON.stringify(c))' \
    "$PWD/$RUN/build/Release/continuum_native.node"
  "$RUN/node" "$RUN/continuum.mjs" model init --preset tiny --out "$RUN/models/tiny" --force > /dev/null
  python3 -m py_compile "$RUN/_torch_llama.py"
  python3 "$RUN/_torch_llama.py" --model "$RUN/models/tiny" --check
  # The PyTorch side too where a python3 with torch is here (its CPU build; not in CI).
  PY=off
  python3 -c 'import torch' 2>/dev/null && PY=python3
  say "bundled bench gpu --quick on the CPU engine (PyTorch side: $PY)"
  CONTINUUM_WORKER_BACKEND=cpu CONTINUUM_BENCH_GPU_MODEL_DIR="$PWD/$RUN/models/tiny" CONTINUUM_BENCH_GPU_PYTHON="$PY" \
    CONTINUUM_DATA_DIR="$PWD/$RUN/data" "$RUN/node" "$RUN/continuum.mjs" bench gpu --quick --json \
    > "$RUN/bench-gpu.json" 2> "$RUN/bench-gpu.log" || { tail -40 "$RUN/bench-gpu.log" >&2; exit 1; }
  grep '^|' "$RUN/bench-gpu.log"
  check_json "$RUN/bench-gpu.json"
  # What stays is the pack alone: the device run carries the whole folder (the unpacked Node is ~100 MB).
  rm -rf "$RUN"
  say "build-only done in $(( $(date +%s) - t0 )) s; carry $PKG ($(du -sh "$PKG" | cut -f1)) to the device run"
  exit 0
fi

# ---- the device run ---------------------------------------------------------------------
[ -f "$PKG/continuum.mjs" ] && [ -f "$PKG/node.xz" ] ||
  { say "no pack in $PKG: run native/gpu-serve-check.sh --build-only here and carry $PKG" >&2; exit 2; }
command -v nvcc >/dev/null || { say "nvcc not found" >&2; exit 2; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
t0=$(date +%s)
rc=0
if [ "$WITH_HARNESS" = 1 ]; then
  say "native/gpu-check.sh (the kernels, the GEMM, the engine; its table)"
  native/gpu-check.sh || rc=1
fi
rm -rf "$RUN"
unpack_node
# The bench model (~0.9 B parameters, bf16) is written while the addon compiles.
"$RUN/node" "$RUN/continuum.mjs" model init --preset bench --out "$RUN/models/bench" > "$RUN/model-init.log" 2>&1 &
gen=$!
build_addon "$RUN/build/Release/continuum_native.node"
"$RUN/node" -e 'const c = require(process.argv[1]).cudaProbe(); console.log("gpu-serve-check: cuda " + JSON.stringify(c)); if (!(c.devices > 0)) process.exit(1)' \
  "$PWD/$RUN/build/Release/continuum_native.node"
wait "$gen" || { cat "$RUN/model-init.log" >&2; exit 1; }
say "model and addon ready after $(( $(date +%s) - t0 )) s"

run_bench() {  # run_bench NAME MODEL_DIR: its log (the table at its end) and JSON in $OUT (or $RUN)
  local dest="${OUT_DIR:-$RUN}"
  local log="$dest/$1.log" json="$dest/$1.json"
  : > "$log"
  CONTINUUM_WORKER_BACKEND=cuda CONTINUUM_BENCH_GPU_MODEL_DIR="$PWD/$2" CONTINUUM_BENCH_GPU_PYTHON=python3 \
    CONTINUUM_DATA_DIR="$PWD/$RUN/data" "$RUN/node" "$RUN/continuum.mjs" bench gpu --json > "$json" 2> "$log" &
  local pid=$!
  tail -f "$log" --pid "$pid" >&2 || true
  wait "$pid" || rc=1
  check_json "$json" || rc=1
}
run_bench bench-gpu "$RUN/models/bench"
if [ "$WITH_7B" = 1 ]; then
  python3 "$RUN/_torch_llama.py" --write-random mistral-7b --like "$RUN/models/bench" --model "$RUN/models/7b"
  run_bench bench-gpu-7b "$RUN/models/7b"
fi
say "done in $(( $(date +%s) - t0 )) s"
exit "$rc"
