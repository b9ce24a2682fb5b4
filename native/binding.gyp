{
  # The CPU backend always builds, for the baseline ISA (no -march=native):
  # AVX2/FMA/F16C code carries per-function target attributes and is chosen
  # at run time from cpuid (src/cpu.h). -ffp-contract=off keeps the compiler
  # from fusing a*b+c differently in different places, so each reduction has
  # exactly the order the source gives it (the determinism contract).
  "targets": [
    {
      "target_name": "continuum_native",
      "sources": [
        "src/thread_pool.cc",
        "src/kernels_cpu.cc",
        "src/kernels_avx2.cc",
        "src/engine.cc",
        "src/async_queue.cc",
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
      }
    }
  ]
}
