#!/usr/bin/env bash
# compute-sanitizer over l2ctl's kernels and GPU tests: memcheck over the GPU suites (graphs included),
# racecheck and initcheck over every kernel's correctness tests. Passes only with 0 errors from each.
# Run from a directory where `import l2ctl` finds the installed package; pass the tests directory.
set -uo pipefail
tests=${1:-tests}
out=${2:-.}
status=0
kernels="reset_data or stride or ceiling or cache_streaming or timer or round_trip or persist"
run() {
  local tool=$1; shift
  echo "--- compute-sanitizer --tool $tool $*"
  compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
    python3 -m pytest -q -p no:cacheprovider -x "$@" > "$out/sanitize_$tool.txt" 2>&1
  local rc=$?
  grep -E "ERROR SUMMARY|passed|failed" "$out/sanitize_$tool.txt" | tail -3
  [ $rc -eq 0 ] || { echo "$tool: exit $rc"; tail -30 "$out/sanitize_$tool.txt"; status=1; }
}
# test_cuda_rejects_what_l2ctl_refuses_first provokes cudaErrorInvalidValue on purpose (it proves CUDA refuses
# a float32 hit ratio of 1.0000001), which memcheck reports as an API error; it is left out here.
run memcheck "$tests/test_gpu.py" "$tests/test_gpu_graph.py" "$tests/test_gpu_registry.py" \
  -k "not torch and not cupy and not small_benchmarks and not cuda_rejects"
run racecheck "$tests/test_gpu.py" -k "$kernels"
run initcheck "$tests/test_gpu.py" -k "$kernels"
run synccheck "$tests/test_gpu.py" -k "$kernels"
exit $status
