#!/usr/bin/env bash
# One batch on the GPU machine: build l2ctl there, run the whole test suite (GPU tests included), the
# CUDA behaviour probe and the benchmarks; results go to $OUT (or ./.out when run by hand).
# Usage: bash scripts/gpu_run.sh [full|quick|check|sanitize|workloads|gallery|suite|bench|main|probe|nvrtc|wheel|wheel-jobs]
#   full = suite + bench in one call (over 10 minutes: split it where a call is limited);
#   suite: the test suite (notebooks executed, the Nsight Compute comparison included), nothing else;
#   wheel: the suite from the one wheel, built by CI's recipe (needs the CUDA 12 header packages in .whl/);
#   wheel-jobs: the README's main job and the app-lifetime example from that wheel;
#   bench: every benchmark, sweep, the tuner targets and the framework gallery, no tests;
#   main: the main benchmarks only (overhead, reset-data, the gallery, the tax sweep);
#   quick: fewer LUT sizes, no sweeps; check: the test suite, the overhead benchmark and compute-sanitizer;
#   sanitize: build, then compute-sanitizer over the kernels and GPU tests only;
#   nvrtc: the kernels' run-time compilation: first use against a cached start (scripts/bench_nvrtc.py), then
#     tests/kernels and the kernel GPU tests;
#   workloads: the test suite (Nsight comparison left out), overhead, the gallery and the tax sweep;
#   gallery: only the GPU workload tests, the gallery and the tax sweep;
#   probe: what each CUDA call and each piece of a scope costs on the host, and the overhead benchmark;
#   recipes: the GPU tests of torch, graphs and the README, the torch recipes (scripts/torch_recipes.py)
#     and the gallery GALLERY_RUNS times (default 3), each run a record of its own under workloads/;
#   gallery-runs: only those gallery runs;
#   planner: the overhead benchmark first (a quiet process), then the test suite (Nsight comparison left out);
#   multigpu: the two-GPU runs under torchrun (examples/ddp_step.py, bench collectives, the two-GPU test),
#     then the recipes' gallery runs on GPU 0;
#   lean: issue 44's before against after (scripts/compare_lean_overhead.py): each .out/lean/src-<commit>.tar.gz
#     (`git archive` of a baseline, carried) built into a folder of its own beside this tree, then all compared;
#     LEAN_THEN=suite runs the test suite after it on the same machine.
# PYTEST_K adds a -k filter to the test run. The build links the CUDA 12 runtime (the published wheel's) when the
# CUDA 12 headers' pip packages (nvidia-cuda-runtime-cu12, -cupti-cu12, -nvcc-cu12) are among the .whl/ wheels;
# without them, beside the machine's CUDA 13 toolkit only, it links CUDA 13's and says so (build_support/).
set -uo pipefail
FINAL=${OUT:-$PWD/.out}
OUT=$(mktemp -d)  # everything lands here, then travels back as one archive (8 files at most come back)
mkdir -p "$FINAL"
trap 'tar czf "$FINAL/results.tgz" -C "$OUT" . ; true' EXIT
trap 'exit 143' TERM  # a `timeout` around this script still packs what it has
export PYTHONUNBUFFERED=1
mode=${1:-full}
step() { echo; echo "=== $* ($(date +%T))"; }
status=0

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"
python3 --version; nvcc --version | tail -1

if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi

if [ "$mode" = wheel ] || [ "$mode" = wheel-jobs ]; then
  # CI's recipe for the one wheel (`pip wheel`, the CUDA 12 headers from the .whl/ packages, as an isolated build
  # installs them), then that wheel installed; the build packages leave the path, so NVRTC and CUPTI come from
  # what the machine has (torch's CUDA 13 wheels), as [cu13] would bring them.
  step "the one wheel: pip wheel (CUDA 12 headers from pip), installed"
  python3 -m pip wheel --no-build-isolation --no-deps -v -w /tmp/dist . > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
  grep "l2ctl: building against" "$OUT/build.log"
  python3 -m pip install -q --no-deps --force-reinstall /tmp/dist/l2ctl-*.whl && ls /tmp/dist | tee "$OUT/wheel.txt"
  unset PYTHONPATH
  SKIP_BUILD=1
fi

if [ "$mode" = lean ]; then  # the baselines build in the background, beside this tree's build
  for tarball in .out/lean/src-*.tar.gz; do
    commit=$(basename "$tarball" .tar.gz); commit=${commit#src-}
    ( mkdir -p "/tmp/src-$commit" && tar xzf "$tarball" -C "/tmp/src-$commit" \
      && cd "/tmp/src-$commit" && python3 -m pip install --no-build-isolation --no-deps -q --target "/tmp/build-$commit" . \
      > "$OUT/build-$commit.log" 2>&1 || echo "baseline $commit failed to build" ) &
  done
fi

step "build (pip install --no-build-isolation .)"
# SKIP_BUILD=1 keeps what an earlier call on the same (warm) machine installed.
if [ -z "${SKIP_BUILD:-}" ]; then
  if ! python3 -m pip install --no-build-isolation --no-deps -q . > "$OUT/build.log" 2>&1; then
    tail -50 "$OUT/build.log"; exit 1
  fi
  tail -3 "$OUT/build.log"
fi
python3 -c "import l2ctl; print('l2ctl', l2ctl.__version__, 'built with the CUDA runtime', l2ctl.versions()['runtime'])" | tee "$OUT/flavour.txt"
cd /tmp  # import the installed package, not the source tree
src=$OLDPWD

if [ "$mode" = lean ]; then
  wait
  step "the lean scope: baselines against this tree"
  head=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo "${L2CTL_COMMIT:-tree}")
  site=$(python3 -c "import l2ctl, os; print(os.path.dirname(os.path.dirname(l2ctl.__file__)))")
  builds=()
  for tarball in "$src"/.out/lean/src-*.tar.gz; do
    commit=$(basename "$tarball" .tar.gz); commit=${commit#src-}
    builds+=(--build "$commit=/tmp/build-$commit@$commit")
  done
  python3 "$src/scripts/compare_lean_overhead.py" "${builds[@]}" --build "after=$site@${L2CTL_COMMIT:-$head}" \
    --runs "${LEAN_RUNS:-8}" --json "$OUT/lean_overhead.json" 2>&1 | tee "$OUT/lean_overhead.txt" || status=1
  [ "${LEAN_THEN:-}" = suite ] || exit $status
  mode=suite
fi

if [ "$mode" = sanitize ]; then
  step "compute-sanitizer"
  bash "$src/scripts/sanitize.sh" "$src/tests" "$OUT" || status=1
  exit $status
fi

if [ "$mode" = nvrtc ]; then
  step "kernels compiled at run time: first use against a cached start, then their tests"
  python3 "$src/scripts/bench_nvrtc.py" --json "$OUT/nvrtc.json" | tee "$OUT/bench_nvrtc.txt" || status=1
  python3 -m pytest -q -p no:cacheprovider "$src/tests/kernels" "$src/tests/gpu/test_gpu.py" 2>&1 | tail -15 | tee "$OUT/pytest.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  exit $status
fi

overhead() {
  step "overhead"
  # OVERHEAD_ROUNDS: more rounds for a record (a shared host's busy spells then move the median less).
  python3 -m l2ctl bench overhead --rounds "${OVERHEAD_ROUNDS:-7}" --json "$OUT/overhead.json" --quiet \
    | tee "$OUT/bench_overhead.txt" || status=1
}

step "probe CUDA behaviour"
python3 "$src/scripts/probe_cuda.py" "$OUT/probe.json" > /dev/null || status=1
python3 -m l2ctl info --probe | tee "$OUT/info.txt" || status=1

gallery() {
  step "framework gallery"
  python3 -m l2ctl bench workloads --json "$OUT/workloads.json" 2>"$OUT/workloads_progress.txt" | tee "$OUT/bench_workloads.txt" || status=1
  step "tax sweep"
  mkdir -p "$OUT/plots"
  python3 -m l2ctl sweep tax --quiet --json "$OUT/tax.json" --plot "$OUT/plots/tax.png" | tee "$OUT/sweep_tax.txt" || status=1
  step "limit left as found"
  python3 -c "import l2ctl; print('limit now', l2ctl.get_set_aside())"
}

if [ "$mode" = probe ]; then
  step "CUDA call costs (C++), l2ctl's pieces, the overhead benchmark"
  nvcc -O2 -arch=native -o /tmp/probe_calls "$src/scripts/probe_calls.cu" && /tmp/probe_calls | tee "$OUT/probe_calls.txt" || status=1
  python3 "$src/scripts/probe_overhead.py" | tee "$OUT/probe_overhead.txt" || status=1
  python3 "$src/scripts/probe_overhead.py" --profile > "$OUT/probe_profile.txt" 2>&1 || status=1
  overhead
  exit $status
fi

gallery_runs() {  # the gallery $GALLERY_RUNS times, each a record named by the GPU's uuid and the run
  mkdir -p "$OUT/workloads"
  local uuid; uuid=$(python3 -c "import l2ctl; print(l2ctl.device_info().uuid.split('-')[1])")
  for i in $(seq 1 "${GALLERY_RUNS:-3}"); do
    step "framework gallery, run $i on GPU $uuid"
    python3 -m l2ctl bench workloads --quiet --json "$OUT/workloads/$uuid-$i.json" | tee "$OUT/bench_workloads_$uuid-$i.txt" || status=1
  done
  python3 -c "import l2ctl; print('limit now', l2ctl.get_set_aside())"
}

if [ "$mode" = gallery-runs ]; then  # the gallery runs alone (after a recipes call on the same machine)
  gallery_runs
  exit $status
fi

if [ "$mode" = recipes ] || [ "$mode" = multigpu ]; then
  if [ "$mode" = multigpu ]; then
    step "two GPUs: the DDP example and bench collectives under torchrun"
    torchrun --standalone --nproc-per-node 2 "$src/examples/ddp_step.py" --json "$OUT/ddp_step_2rank.json" 2>&1 | tee "$OUT/ddp_step_2rank.txt" || status=1
    torchrun --standalone --nproc-per-node 2 -m l2ctl bench collectives --json "$OUT/collectives_2rank.json" 2>&1 | tee "$OUT/collectives_2rank.txt" || status=1
    step "two-GPU tests"
    python3 -m pytest -q -p no:cacheprovider "$src/tests/gpu/test_gpu_ddp.py" "$src/tests/interop/test_multi_device.py" 2>&1 | tail -15 | tee "$OUT/pytest_2gpu.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  else
    step "GPU tests: torch graphs, workloads, the README, graphs, interop"
    python3 -m pytest -q -p no:cacheprovider -o log_cli=false "$src/tests/gpu" "$src/tests/package/test_readme.py" "$src/tests/graph" \
      -k "not ddp and not agrees_with_nsight_compute${PYTEST_K:+ and ($PYTEST_K)}" > "$OUT/pytest_full.txt" 2>&1
    [ $? -eq 0 ] || status=1
    tail -25 "$OUT/pytest_full.txt" | tee "$OUT/pytest.txt"
    step "torch recipes"
    python3 "$src/scripts/torch_recipes.py" --json "$OUT/torch_recipes.json" 2>&1 | tee "$OUT/torch_recipes.txt" || status=1
  fi
  [ "${GALLERY_RUNS:-3}" -gt 0 ] && gallery_runs
  exit $status
fi

if [ "$mode" = gallery ]; then
  step "GPU workload tests"
  python3 -m pytest -q -p no:cacheprovider "$src/tests/test_gpu_workloads.py" "$src/tests/test_gpu.py" -k "auto or persist" 2>&1 | tail -15 | tee "$OUT/pytest.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  gallery
  exit $status
fi

if [ "$mode" = planner ]; then
  overhead
  step "tests"
  L2CTL_NOTEBOOK_OUT="$OUT/notebooks" python3 -m pytest -q -p no:cacheprovider "$src/tests" \
    -k "not committed_with_gpu_outputs and not agrees_with_nsight_compute${PYTEST_K:+ and ($PYTEST_K)}" \
    --junitxml="$OUT/junit.xml" 2>&1 | tail -40 | tee "$OUT/pytest.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  step "limit left as found"
  python3 -c "import l2ctl; print('limit now', l2ctl.get_set_aside())"
  exit $status
fi

if [ "$mode" = wheel-jobs ]; then  # the README's main job and the app-lifetime example, from the one wheel
  if [ -n "${TESTS_FIRST:-}" ]; then  # test files (under tests/) run first, from the same wheel
    step "tests: $TESTS_FIRST"
    python3 -m pytest -q -p no:cacheprovider -o log_cli=false $(for t in $TESTS_FIRST; do echo "$src/$t"; done) 2>&1 \
      | grep -v DEBUG | tail -15 | tee "$OUT/pytest_first.txt"
  fi
  step "main job"
  python3 -m l2ctl bench --json "$OUT/reset_data_wheel.json" 2>"$OUT/bench_progress.txt" | tee "$OUT/bench_reset_data_wheel.txt" || status=1
  step "app-lifetime example"
  python3 "$src/examples/app_lifetime.py" --json "$OUT/app_lifetime_wheel.json" 2>&1 | tail -15 | tee "$OUT/app_lifetime_wheel.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  python3 -c "import l2ctl; print('limit now', l2ctl.get_set_aside())"
  exit $status
fi

if [ "$mode" = main ]; then
  overhead
  mkdir -p "$OUT/plots"
  python3 -m l2ctl bench --json "$OUT/reset_data.json" --csv "$OUT/reset_data.csv" --plot "$OUT/plots/reset_data.png" 2>"$OUT/bench_progress.txt" | tee "$OUT/bench_reset_data.txt" || status=1
  gallery
  exit $status
fi

if [ "$mode" != bench ]; then
step "tests"
# The committed notebooks get their outputs from this run (L2CTL_NOTEBOOK_OUT), so the check that the
# committed copies carry outputs is left to CI.
filter="not committed_with_gpu_outputs"
[ "$mode" = workloads ] && filter="$filter and not agrees_with_nsight_compute"
[ -n "${PYTEST_K:-}" ] && filter="$filter and ($PYTEST_K)"
L2CTL_NCU_JSON="$OUT/ncu_compare.json" L2CTL_NOTEBOOK_OUT="$OUT/notebooks" python3 -m pytest -q -p no:cacheprovider "$src/tests" \
  -k "$filter" --junitxml="$OUT/junit.xml" 2>&1 | tail -40 | tee "$OUT/pytest.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

if [ "$mode" = workloads ]; then
  overhead
  gallery
  exit $status
fi
[ "$mode" = suite ] || [ "$mode" = wheel ] && exit $status
fi  # not bench


if [ "$mode" = check ]; then
  overhead
  step "compute-sanitizer"
  bash "$src/scripts/sanitize.sh" "$src/tests" "$OUT" || status=1
  step "limit left as found"
  python3 -c "import l2ctl; print('limit now', l2ctl.get_set_aside())"
  exit $status
fi

step "benchmarks"
overhead
if [ "$mode" = quick ]; then lut="--lut-sizes 1M,4M,8M,16M,32M,48M"; else lut=""; fi
mkdir -p "$OUT/plots"
python3 -m l2ctl bench $lut --json "$OUT/reset_data.json" --csv "$OUT/reset_data.csv" --plot "$OUT/plots/reset_data.png" 2>"$OUT/bench_progress.txt" | tee "$OUT/bench_reset_data.txt" || status=1
python3 -m l2ctl bench reset-data --columns baseline,recipe_fit,right_sized,hints --counters --quiet --json "$OUT/reset_data_counters.json" | tee "$OUT/bench_reset_data_counters.txt" || status=1
python3 -m l2ctl bench stride --json "$OUT/stride.json" --quiet --plot "$OUT/plots/stride.png" | tee "$OUT/bench_stride.txt" || status=1
python3 -m l2ctl bench cache-streaming --json "$OUT/cache_streaming.json" --quiet --plot "$OUT/plots/cache_streaming.png" | tee "$OUT/bench_cs.txt" || status=1
python3 -m l2ctl bench graph --json "$OUT/graph.json" | tee "$OUT/bench_graph.txt" || status=1
python3 -m l2ctl bench concurrent --json "$OUT/concurrent.json" | tee "$OUT/bench_concurrent.txt" || status=1

step "sweeps and tuner"
if [ "$mode" != quick ]; then
  # LUTs of 16% and 64% of the L2 (8 and 32 MiB on an H100), whole MiB
  read -r small large < <(python3 -c "import l2ctl; l2 = l2ctl.device_info().l2_cache_size; print(int(0.16 * l2) >> 20, int(0.64 * l2) >> 20)")
  python3 -m l2ctl sweep surface --lut-bytes "${small}M" --quiet --json "$OUT/surface.json" --plot "$OUT/plots/surface_${small}MiB.png" > "$OUT/sweep_surface.txt" || status=1
  python3 -m l2ctl sweep hit-ratio --lut-bytes "${large}M" --quiet --plot "$OUT/plots/hit_ratio_${large}MiB.png" | tee "$OUT/sweep_hit_ratio.txt" || status=1
  python3 "$src/scripts/tuner_targets.py" --json "$OUT/tuner_plain.json" | tee "$OUT/tuner_plain.txt" || status=1
  python3 "$src/scripts/tuner_targets.py" --variant scalar --json "$OUT/tuner_scalar.json" | tee "$OUT/tuner_scalar.txt" || status=1
fi
gallery

step "limit left as found"
python3 -c "import l2ctl; print('limit now', l2ctl.get_set_aside())"
exit $status
