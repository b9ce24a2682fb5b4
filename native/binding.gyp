{
  # The CPU backend always builds, for the baseline ISA (no -march=native):
  # AVX2/FMA/F16C code carries per-function target attributes and is chosen
  # at run time from cpuid (src/cpu.h). -ffp-contract=off keeps the compiler
  # from fusing a*b+c differently in different places, so each reduction has
  # exactly the order the source gives it (the determinism contract).
  #
  # The CUDA backend is a static library that build.mjs compiles with nvcc
  # first (native/build/cuda/libck_cuda.a) and names in CK_CUDA_LIB; it is
  # linked with the static CUDA runtime, which loads libcuda.so only when the
  # first CUDA call runs, so the addon loads on machines without a driver.
  "variables": {
    "ck_cuda_lib%": "<!(node -p \"process.env.CK_CUDA_LIB || ''\")",
    "ck_cuda_libdir%": "<!(node -p \"process.env.CK_CUDA_LIBDIR || ''\")",
    "ck_cublas%": "<!(node -p \"process.env.CK_CUBLAS === '1' ? 1 : 0\")"
  },
  "targets": [
    {
      "target_name": "continuum_native",
      "sources": [
        "src/thread_pool.cc",
        "src/kernels_cpu.cc",
        "src/kernels_avx2.cc",
        "src/gemm_avx512.cc",
        "src/dense_avx2.cc",
        "src/attention_cpu.cc",
        "src/logprobs.cc",
        "src/attention_simd.cc",
        "src/quant_cpu.cc",
        "src/quant_avx2.cc",
        "src/quant_dot_cpu.cc",
        "src/quant_dot_avx2.cc",
        "src/fma_peak.cc",
        "src/backend.cc",
        "src/engine.cc",
        "src/async_queue.cc",
        "src/file_lock.cc",
        "src/binding_args.cc",
        "src/binding_engine.cc",
        "src/binding_kernels.cc",
        "src/binding_yardsticks.cc",
        "src/binding.cc"
      ],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "dependencies": ["<!(node -p \"require('node-addon-api').targets\"):node_addon_api_except"],
      "defines": ["NAPI_VERSION=8"],
      "cflags_cc!": ["-fno-exceptions", "-std=gnu++17", "-std=gnu++20"],
      "cflags_cc": ["-std=c++17", "-O3", "-ffp-contract=off", "-fno-math-errno"],
      "xcode_settings": {
        "GCC_ENABLE_CPP_EXCEPTIONS": "YES",
        "CLANG_CXX_LANGUAGE_STANDARD": "c++17",
        "OTHER_CPLUSPLUSFLAGS": ["-O3", "-ffp-contract=off", "-fno-math-errno"]
      },
      "conditions": [
        ["ck_cuda_lib!=''", {
          "defines": ["CK_WITH_CUDA=1"],
          "libraries": ["<(ck_cuda_lib)", "-L<(ck_cuda_libdir)", "-lcudart_static", "-ldl", "-lrt", "-lpthread"]
        }],
        ["ck_cublas==1", {
          "libraries": ["-lcublas", "-Wl,-rpath,<(ck_cuda_libdir)"]
        }]
      ]
    }
  ]
}
