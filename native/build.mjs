#!/usr/bin/env node
// Builds the native addon (native/build/Release/continuum_native.node) with
// node-gyp. Run by `npm install`, and before `npm test` with --if-missing
// (which builds only when the addon is absent). When this Node
// installation ships its own headers (e.g. /usr/include/node from a distro
// package), they are used, so the build needs no download.
//
// The CUDA backend: CONTINUUM_CUDA=auto (default) builds it when nvcc and the
// static CUDA runtime are found, on = must build it (fails saying what is
// missing), off = CPU only. It is compiled first, every native/cuda/*.cu into
// native/build/cuda/ with the flags of native/cuda-compile-check.sh (plus
// -O3 -fPIC), archived as libck_cuda.a and linked into the addon with
// cudart_static. native/build/cuda/objects.txt lists what was compiled with
// which flags, so the compile check skips those sources instead of compiling
// them twice. cuBLAS is linked only when both its header and library exist.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, realpathSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { availableParallelism } from "node:os";
import { delimiter, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const addon = join(here, "build", "Release", "continuum_native.node");
if (process.argv.includes("--if-missing") && existsSync(addon)) process.exit(0);
const require = createRequire(import.meta.url);
const gyp = join(dirname(require.resolve("node-gyp/package.json")), "bin", "node-gyp.js");

// The flags native/cuda-compile-check.sh uses (keep the two in step): sm_90
// machine code plus compute_90 PTX, every warning an error.
const CHECK_FLAGS = [
  "-std=c++17",
  "-gencode",
  "arch=compute_90,code=sm_90",
  "-gencode",
  "arch=compute_90,code=compute_90",
  "-Werror",
  "all-warnings",
  "-Xcompiler",
  "-Wall,-Wextra,-Werror",
  "-Inative/src",
];

function fail(message) {
  console.error(`build.mjs: ${message}`);
  process.exit(1);
}

function findNvcc() {
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    if (dir && existsSync(join(dir, "nvcc"))) return join(dir, "nvcc");
  }
  for (const home of [process.env.CUDA_HOME, process.env.CUDA_PATH, "/usr/local/cuda"]) {
    if (home && existsSync(join(home, "bin", "nvcc"))) return join(home, "bin", "nvcc");
  }
  return null;
}

/**
 * The toolkit root: nvcc's own directory as nvcc reports it (`_HERE_` of a
 * dry run; the nvcc on PATH may be a wrapper script), else its real path.
 */
function toolkitHome(nvcc) {
  const r = spawnSync(nvcc, ["--dryrun", "-c", "-x", "cu", "/dev/null", "-o", "/dev/null"], {
    encoding: "utf8",
  });
  const here = /_HERE_=(\S+)/.exec(`${r.stdout ?? ""}${r.stderr ?? ""}`)?.[1];
  return dirname(here ?? dirname(realpathSync(nvcc)));
}

/** Where the CUDA libraries are, and whether cuBLAS can be linked. */
function cudaToolkit(nvcc) {
  const home = toolkitHome(nvcc);
  const libdir = [join(home, "lib64"), join(home, "targets", "x86_64-linux", "lib"), join(home, "lib")].find(
    (d) => existsSync(join(d, "libcudart_static.a")),
  );
  const include = [join(home, "include"), join(home, "targets", "x86_64-linux", "include")];
  const cublasHeader = include.some((d) => existsSync(join(d, "cublas_v2.h")));
  const cublasLib = libdir !== undefined && existsSync(join(libdir, "libcublas.so"));
  return { home, libdir, cublasHeader, cublasLib };
}

function run(cmd, args, opts = {}) {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"], ...opts });
    let out = "";
    child.stdout.on("data", (d) => (out += d));
    child.stderr.on("data", (d) => (out += d));
    child.on("close", (code) => resolve({ code, out }));
  });
}

/** Compiles native/cuda/*.cu into native/build/cuda and archives them; returns the archive path. */
async function buildCuda(nvcc, tk) {
  const t0 = Date.now();
  const root = dirname(here);
  const outDir = join(here, "build", "cuda");
  mkdirSync(outDir, { recursive: true });
  const sources = readdirSync(join(here, "cuda"))
    .filter((f) => f.endsWith(".cu"))
    .sort()
    .map((f) => join("native", "cuda", f));
  // The check's flags plus any define that changes what is compiled: the
  // compile check reuses an object only when these match its own flags.
  const checked = [...CHECK_FLAGS, ...(tk.cublasHeader && !tk.cublasLib ? ["-DCK_NO_CUBLAS"] : [])];
  const flags = [...checked, "-O3", "-Xcompiler", "-fPIC"];
  const jobs = Math.max(1, Number(process.env.JOBS) || Math.min(availableParallelism(), 4));
  console.log(
    `build.mjs: CUDA backend: ${sources.length} sources with ${nvcc}, ${jobs} at a time` +
      (tk.cublasHeader && tk.cublasLib
        ? " (with cuBLAS)"
        : " (deterministic matmul only, no cuBLAS library)"),
  );
  const objects = [];
  const queue = [...sources];
  let failed = false;
  const worker = async () => {
    for (let src = queue.shift(); src !== undefined && !failed; src = queue.shift()) {
      const obj = join(outDir, `${src.split("/").pop().replace(/\.cu$/, "")}.o`);
      const r = await run(nvcc, [...flags, "-c", src, "-o", obj], { cwd: root });
      if (r.code !== 0) {
        failed = true;
        console.error(`  FAIL ${src}\n${r.out}`);
        return;
      }
      console.log(`  ok   ${src}`);
      objects.push({ src, obj });
    }
  };
  await Promise.all(Array.from({ length: jobs }, worker));
  if (failed)
    fail("the CUDA backend did not compile (set CONTINUUM_CUDA=off to build the CPU backend alone)");
  const lib = join(outDir, "libck_cuda.a");
  const ar = spawnSync("ar", ["rcs", lib, ...objects.map((o) => o.obj)], { stdio: "inherit" });
  if (ar.status !== 0) fail("ar failed to archive the CUDA objects");
  // One line per source: the flags it was compiled with, then the source path.
  writeFileSync(join(outDir, "objects.txt"), objects.map((o) => `${checked.join(" ")}\t${o.src}\n`).join(""));
  console.log(`build.mjs: CUDA backend compiled in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  return lib;
}

const mode = process.env.CONTINUUM_CUDA ?? "auto";
if (!["auto", "on", "off"].includes(mode)) fail(`CONTINUUM_CUDA must be auto, on or off, got "${mode}"`);

const env = { ...process.env };
delete env.CK_CUDA_LIB;
let withCuda = false;
let toolkit = null;
let nvcc = null;
if (mode !== "off") {
  nvcc = findNvcc();
  if (nvcc === null) {
    if (mode === "on")
      fail("CONTINUUM_CUDA=on but nvcc was not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)");
    console.log("build.mjs: nvcc not found: building the CPU backend only");
  } else {
    toolkit = cudaToolkit(nvcc);
    if (toolkit.libdir === undefined) {
      if (mode === "on") fail(`CONTINUUM_CUDA=on but libcudart_static.a is not under ${toolkit.home}`);
      console.log(`build.mjs: no libcudart_static.a under ${toolkit.home}: building the CPU backend only`);
    } else {
      withCuda = true;
    }
  }
} else {
  console.log("build.mjs: CONTINUUM_CUDA=off: building the CPU backend only");
}

const prefix = dirname(dirname(process.execPath));
const nodedir =
  existsSync(join(prefix, "include", "node", "node_api.h")) && !process.env.npm_config_nodedir
    ? [`--nodedir=${prefix}`]
    : [];
const gypRun = (...cmds) =>
  spawnSync(
    process.execPath,
    [gyp, ...cmds, "--directory", here, `--jobs=${process.env.JOBS ?? "max"}`, ...nodedir],
    { stdio: "inherit", env },
  ).status ?? 1;

const t0 = Date.now();
if (gypRun("clean") !== 0) fail("node-gyp clean failed");
if (withCuda) {
  env.CK_CUDA_LIB = await buildCuda(nvcc, toolkit);
  env.CK_CUDA_LIBDIR = toolkit.libdir;
  env.CK_CUBLAS = toolkit.cublasHeader && toolkit.cublasLib ? "1" : "0";
}
const status = gypRun("configure", "build");
if (status === 0) {
  console.log(
    `build.mjs: addon built (${withCuda ? "CPU + CUDA" : "CPU only"}) in ${((Date.now() - t0) / 1000).toFixed(1)} s`,
  );
}
process.exit(status);
