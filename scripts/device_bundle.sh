#!/bin/bash
# Packs a built Kiln for a GPU machine that has the NVIDIA driver and CUDA libraries but none of
# Kiln's build dependencies and no network, so that the CUDA checks run there as they would here:
#   scripts/device_bundle.sh [BUILD_DIR] [OUT_DIR]
# BUILD_DIR defaults to build, OUT_DIR to build-bundle. OUT_DIR receives:
#   kiln.tar.xz     Kiln installed under a prefix (bin/kiln, bin/kiln_onnx_runner, the driver
#                   tests, whose CUDA tests run there, libkiln,
#                   the runtime headers generated code includes) with this checkout's check
#                   scripts and case lists under share/kiln/check
#   syslibs.tar.xz  with their absolute paths: the shared libraries the binaries need (ldd) that
#                   are not part of the C/C++ base system, the libraries generated code links
#                   (OpenBLAS, oneDNN, SLEEF, with their link-time symlinks) and the headers it includes
#                   beyond the compiler's and the C library's (g++ -M on every runtime header)
#   onnx-data.tar.xz  the ONNX 1.12 backend suite's data (unpacked where the tests look for it)
#   onnx-node-suite.tar.xz  the ONNX 1.23 node suite from ../shared/onnx-node-suite, when it is
#                   there: the node/ cases of every case list, as `make test` runs them
#   run.sh          unpacks all that (syslibs into /, so: a scratch machine only) and runs
#                   the stages of STAGES (default "tests sanitize suite"): the driver's CUDA
#                   tests, compute-sanitizer on a few cases, scripts/device_cuda_check.sh; and
#                   "bench": scripts/device_bench_cuda.sh (make bench-cuda)
#   nvrtc.tar.xz    the toolkit's NVRTC, used only when the machine has none (run.sh looks for a
#                   libnvrtc.so.<major> there first, PyTorch's wheels included); NVRTC=no
#                   leaves it out
# The total stays below 60 MiB. The CUDA driver is the machine's.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$here/build}" && pwd)
out=${2:-$here/build-bundle}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1. Kiln, installed under a prefix, plus the runner and the check scripts.
prefix=$work/kiln
cmake --install "$build" --prefix "$prefix" >/dev/null
cp "$build/bin/kiln_onnx_runner" "$prefix/bin/"
# The driver tests, when built (the "tests" stage of run.sh needs them).
[ -f "$build/bin/kiln_driver_tests" ] && cp "$build/bin/kiln_driver_tests" "$prefix/bin/"
[ -f "$build/bin/kiln_cuda_pointwise_bench" ] && cp "$build/bin/kiln_cuda_pointwise_bench" "$prefix/bin/"
[ -f "$build/bin/kiln_cuda_gemm_bench" ] && cp "$build/bin/kiln_cuda_gemm_bench" "$prefix/bin/"
[ -f "$build/bin/kiln_cuda_library_check" ] && cp "$build/bin/kiln_cuda_library_check" "$prefix/bin/"
mkdir -p "$prefix/share/kiln/check"
cp "$here/scripts/device_cuda_check.sh" "$here/scripts/device_bench_cuda.sh" \
  "$here/scripts/device_cudalib_check.sh" \
  "$here/bench/ort/make_models.py" "$here/bench/cuda/torch_bench.py" \
  "$here/tests/onnx/core_cases.txt" "$here/tests/onnx/exclusions.txt" \
  "$here/tests/onnx/cuda_refusals.txt" "$here/tests/onnx/sanitize_cases.txt" \
  "$prefix/share/kiln/check/"
strip --strip-unneeded "$prefix"/bin/* 2>/dev/null || true
# CUDA model libraries built here, without a GPU, for device_cudalib_check.sh: the cases of
# tests/onnx/cudalib_cases.txt (CASE.so, CASE.onnx, CASE.precision, CASE.inputs/NAME.npy).
# CUDALIB=no leaves them out.
if [ "${CUDALIB:-yes}" != no ]; then
  libs=$prefix/share/kiln/check/cudalib
  mkdir -p "$libs"
  sed 's/#.*//' "$here/tests/onnx/cudalib_cases.txt" | awk 'NF {print $1}' | while read -r case; do
    id=${case//\//__}
    dir=/usr/share/libonnx-testdata/data/$case
    if ! "$build/bin/kiln" compile "$dir/model.onnx" --device cuda --precision fp32 \
      -o "$libs/$id.so" --cache-dir "$work/cudalib-cache" >"$work/$id.log" 2>&1; then
      echo "kiln compile --device cuda $case failed:" >&2
      tail -5 "$work/$id.log" >&2
      continue
    fi
    cp "$dir/model.onnx" "$libs/$id.onnx"
    echo fp32 >"$libs/$id.precision"
    /usr/bin/python3 - "$dir" "$libs/$id.inputs" <<'PY'
import glob, os, sys
import onnx
from onnx import numpy_helper
import numpy as np
case, out = sys.argv[1:3]
os.makedirs(out, exist_ok=True)
model = onnx.load(os.path.join(case, "model.onnx"))
names = [i.name for i in model.graph.input
         if i.name not in {t.name for t in model.graph.initializer}]
for k, name in enumerate(names):
    t = onnx.TensorProto()
    with open(os.path.join(case, "test_data_set_0", f"input_{k}.pb"), "rb") as f:
        t.ParseFromString(f.read())
    np.save(os.path.join(out, name + ".npy"), numpy_helper.to_array(t))
PY
  done
  rm -rf "$work/cudalib-cache"
fi

# 2. System files, listed with absolute paths.
list=$work/syslibs.txt
: >"$list"
# Adds a file and, for a symbolic link, every link of its chain (Debian's alternatives).
add_path() {
  local p
  p=$(realpath -s "$1")
  while [ -L "$p" ]; do
    echo "$p" >>"$list"
    local target
    target=$(readlink "$p")
    case $target in /*) p=$target ;; *) p=$(realpath -s "$(dirname "$p")/$target") ;; esac
  done
  [ -e "$p" ] && echo "$p" >>"$list"
  return 0
}
# The C and C++ base system every Linux machine has, at versions at least these.
is_base() {
  case $(basename "$1") in
    libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux* | \
      libstdc++.so.* | libgcc_s.so.* | libgomp.so.* | libz.so.*) return 0 ;;
  esac
  return 1
}
for binary in "$prefix"/bin/* "$prefix"/lib/libkiln*.so*; do
  [ -f "$binary" ] || continue
  ldd "$binary" | awk '/=> \// {print $3}' | while read -r lib; do
    is_base "$lib" || add_path "$lib"
  done
done
# What generated code links (the link-time name, the run-time soname beside it, and what they
# need in turn) and includes.
for name in openblas dnnl sleef; do
  lib=$(g++ -print-file-name="lib$name.so")
  [ "$lib" = "lib$name.so" ] && continue
  add_path "$lib"
  soname=$(objdump -p "$(readlink -f "$lib")" | awk '/SONAME/ {print $2}')
  [ -n "$soname" ] && add_path "$(dirname "$lib")/$soname"
  ldd "$(readlink -f "$lib")" | awk '/=> \// {print $3}' | while read -r dep; do
    is_base "$dep" || add_path "$dep"
  done
done
probe=$work/probe.cpp
{
  echo '#define KILN_RT_WITH_DNNL 1'
  for h in "$here"/src/runtime/kiln_*.h; do
    case $(basename "$h") in kiln_rt_cuda.h) ;; *) echo "#include \"$(basename "$h")\"" ;; esac
  done
} >"$probe"
g++ -std=c++20 -fopenmp -mavx2 -mfma -M -I "$here/src/runtime" -I "$here/include" "$probe" | tr ' \\' '\n\n' | grep '^/' |
  grep -v -e "^$here/" -e '/c++/' -e '^/usr/lib/gcc/' | while read -r header; do
  owner=$(dpkg -S "$(readlink -f "$header")" 2>/dev/null | cut -d: -f1 || true)
  case $owner in libc6-dev | linux-libc-dev | "") ;; *) add_path "$header" ;; esac
done
# The headers' siblings a library's main header may include conditionally (oneDNN's).
for dir in /usr/include/oneapi/dnnl; do [ -d "$dir" ] && find "$dir" -name '*.h*' >>"$list"; done
sort -u "$list" -o "$list"
cp "$list" "$out/syslibs.txt"
tar -C / -cf - --no-recursion -T <(sed 's|^/||' "$list") | xz -T2 -4 >"$out/syslibs.tar.xz"
tar -C "$work" -cf - kiln | xz -T2 -4 >"$out/kiln.tar.xz"
tar -C /usr/share/libonnx-testdata -cf - data | xz -T2 -4 >"$out/onnx-data.tar.xz"
rm -f "$out/onnx-node-suite.tar.xz"
if [ -d "$here/../shared/onnx-node-suite/node" ]; then
  tar -C "$here/../shared" -cf - onnx-node-suite/node | xz -T2 -4 >"$out/onnx-node-suite.tar.xz"
fi
# NVRTC of the toolkit Kiln was built with, for a machine that lacks it.
nvrtc=$(ls /usr/local/cuda/lib64/libnvrtc.so.[0-9]* 2>/dev/null | head -1 || true)
[ "${NVRTC:-yes}" = no ] && nvrtc=
if [ -n "$nvrtc" ]; then
  mkdir -p "$work/nvrtc"
  cp "$nvrtc" /usr/local/cuda/lib64/libnvrtc-builtins.so.[0-9]* "$work/nvrtc/"
  tar -C "$work" -cf - nvrtc | xz -T2 -4 >"$out/nvrtc.tar.xz"
fi

# 3. The script that runs there.
cat >"$out/run.sh" <<'EOF'
#!/bin/bash
# Unpacks the bundle of scripts/device_bundle.sh (system files into /: a scratch machine only)
# and runs the stages of STAGES (default "tests sanitize suite"; any of those and "bench"):
#   tests     the driver tests' CUDA tests (GTEST_FILTER, default '*Cuda*'; about 8 s each, so a
#             call of 10 minutes runs a part: GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=K, 23-24 each)
#   cudalib   scripts/device_cudalib_check.sh: CUDA model libraries built without a GPU, and
#             bench/ort's models compiled with the GPU hidden, against `kiln run --device cuda`
#   sanitize  compute-sanitizer memcheck on the cases of SANITIZE_FILE (default a few)
#   suite     the ONNX suite with --device cuda on the cases of CASES_FILE (default the whole
#             suite; SHARD=K/N for a part of it), stopped after SUITE_SECONDS (default 420)
#   bench     scripts/device_bench_cuda.sh: make bench-cuda (logs under $OUT/bench-cuda)
#   run.sh [CASES_FILE] [SANITIZE_FILE]
set -uo pipefail
bundle=$(cd "$(dirname "$0")" && pwd)
tar -C / -xJf "$bundle/syslibs.tar.xz" && ldconfig
mkdir -p /opt/kiln-bundle && tar -C /opt/kiln-bundle -xJf "$bundle/kiln.tar.xz"
# Where the driver tests (kiln_driver_tests) look for the suite, as on a Debian build machine.
mkdir -p /usr/share/libonnx-testdata && tar -C /usr/share/libonnx-testdata -xJf "$bundle/onnx-data.tar.xz"
prefix=/opt/kiln-bundle/kiln
data=/usr/share/libonnx-testdata/data
# The ONNX 1.23 node suite, whose cases the lists' node/ names (without it, 1.12's node/).
node_suite=
if [ -f "$bundle/onnx-node-suite.tar.xz" ]; then
  tar -C /opt/kiln-bundle -xJf "$bundle/onnx-node-suite.tar.xz"
  node_suite=/opt/kiln-bundle/onnx-node-suite
fi
node_flags=()
[ -n "$node_suite" ] && node_flags=(--node-suite "$node_suite")
# NVRTC: the machine's (its toolkit's, else a Python wheel's), else the bundle's.
if ! ldconfig -p | grep -q 'libnvrtc\.so\.'; then
  nvrtc=$(find / -xdev -name 'libnvrtc.so.[0-9]*' -not -name '*alt*' 2>/dev/null | head -1)
  if [ -z "$nvrtc" ] && [ -f "$bundle/nvrtc.tar.xz" ]; then
    tar -C /opt/kiln-bundle -xJf "$bundle/nvrtc.tar.xz"
    nvrtc=$(ls /opt/kiln-bundle/nvrtc/libnvrtc.so.* | head -1)
  fi
  [ -n "$nvrtc" ] && export LD_LIBRARY_PATH=$(dirname "$nvrtc")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "NVRTC: ${nvrtc:-not found}"
fi
# cuBLASLt and cuDNN, which models load at their first matrix product and convolution: the
# machine's, else a Python wheel's (PyTorch's nvidia-cublas, nvidia-cudnn).
for pattern in 'libcublasLt.so.1[23]' 'libcudnn.so.9'; do
  ldconfig -p | grep -q "$pattern" && continue
  lib=$(find / -xdev -name "$pattern" 2>/dev/null | head -1)
  [ -n "$lib" ] && export LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "$pattern: ${lib:-not found}"
done
export KILN_CACHE_DIR=/tmp/kiln-cache
check=$prefix/share/kiln/check
stages=" ${STAGES:-tests sanitize suite} "
if [[ $stages == *" tests "* ]]; then
  echo "== the CUDA driver tests (tests/unit/driver/cuda_*_test.cpp)"
  [ -x "$prefix/bin/kiln_driver_tests" ] || echo "kiln_driver_tests: not in the bundle (not built)"
  # The whole output goes to $OUT as it is written (about 8 s a test, 186 tests: a call that runs
  # out of time still brings back how far it got); the summary lines to the terminal.
  [ -x "$prefix/bin/kiln_driver_tests" ] && (cd /tmp && "$prefix/bin/kiln_driver_tests" --gtest_filter="${GTEST_FILTER:-*Cuda*}" 2>&1 |
    tee "${OUT:-/tmp}/driver_tests.log" |
    grep -E '^\[  (FAILED|PASSED|SKIPPED) |^\[==========\] [0-9]+ tests|Failure|rror' | tail -40)
fi
sanitize=${2:-}
if [[ $stages == *" sanitize "* ]]; then
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -z "$sanitizer" ]; then
    echo "== compute-sanitizer: not found on this machine"
  else
    if [ -z "$sanitize" ]; then
      # Every fourth core case (about 130, every op family), with host fallbacks among them.
      sanitize=/tmp/sanitize_cases.txt
      sed 's/#.*//' "$check/core_cases.txt" | awk 'NF && (n++ % 4 == 0) {print $1}' >"$sanitize"
      printf 'node/%s\n' test_top_k test_nonzero_example test_gathernd_example_int32 >>"$sanitize"
    fi
    echo "== compute-sanitizer memcheck ($(wc -l <"$sanitize") cases)"
    "$sanitizer" --tool memcheck --error-exitcode 9 --print-limit 20 \
      "$prefix/bin/kiln_onnx_runner" "$data" /tmp/kiln-sanitize-cache --cases "$sanitize" \
      "${node_flags[@]}" --device cuda --jobs 8 2>&1 |
      grep -E "ERROR SUMMARY|========= (Invalid|Program hit)|passed|FAIL" | tail -15
    echo "compute-sanitizer exit status: ${PIPESTATUS[0]}"
  fi
fi
cases=${1:-}
if [[ $stages == *" suite "* ]]; then
  if [ -z "$cases" ]; then
    cases=/tmp/all_cases.txt
    (cd "${node_suite:-$data}" && ls -d node/*) >"$cases"
    (cd "$data" && ls -d pytorch-converted/* pytorch-operator/* simple/* >>"$cases")
  fi
  echo "== suite with --device cuda ($(wc -l <"$cases") cases)"
  timeout "${SUITE_SECONDS:-420}" "$check/device_cuda_check.sh" "$prefix" "$cases" "$data" \
    "$node_suite" >/tmp/suite.log 2>&1
  echo "suite exit status: $?"
  grep -v -E '^nodes |^ +[A-Za-z0-9_]+ +[0-9]+ +[0-9]+ +0 *$' /tmp/suite.log | tail -60
  [ -n "${OUT:-}" ] && cp /tmp/suite.log "$OUT/" || true
fi
if [[ $stages == *" cudalib "* ]]; then
  echo "== CUDA model libraries (scripts/device_cudalib_check.sh)"
  bash "$check/device_cudalib_check.sh" "$prefix"
  echo "cudalib exit status: $?"
fi
if [[ $stages == *" bench "* ]]; then
  echo "== make bench-cuda (scripts/device_bench_cuda.sh)"
  bash "$check/device_bench_cuda.sh" "$prefix/bin"
fi
EOF
chmod +x "$out/run.sh"
du -ch "$out"/*.tar.xz | tail -1
ls -la "$out"
