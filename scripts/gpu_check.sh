#!/usr/bin/env bash
# One command for the GPU machine (docs/GPU_MACHINE.md): unpack Highway, build with CUDA for sm_90a, run the
# C++ tests, `strata atk` on the GPU, then the Python package (install, pytest, and the side-by-side benches
# bench/{torch,fused,gdn}_peers.py), and print a short summary table last. Full logs go to $OUT when it is set (the folder
# that comes back from the GPU machine), else to build/gpu-logs.
#
#   scripts/fetch_gpu_deps.sh     # on the development machine, once: Highway .debs into .deps/debs
#   scripts/gpu_check.sh          # on the GPU machine, with .deps brought along (it is git-ignored)
#   scripts/gpu_check.sh --dry    # anywhere: CPU-only build, the tests, a quick CPU atk, no GPU steps
#
# Options: --dry (also chosen by itself when nvidia-smi finds no GPU), --no-python, --jobs N.
# Environment: GPU_CHECK_TARGETS (ninja targets to build; default all), GPU_CHECK_SKIP (steps to leave out, space-separated: build (reuse the binaries of a previous call on a warm machine) ctest atk sweep python pytest peers; e.g. a first call
# that only builds while the machine stays warm), GPU_CHECK_CTEST_S / GPU_CHECK_ATK_S (caps of those steps,
# default 240 s each), GPU_CHECK_ATK_OP_S (cap of one op's atk, default 90 s), GPU_CHECK_ATK_ARGS (extra
# `strata atk` arguments), GPU_CHECK_ATK_OPS (ops to run, space-separated; default every op), OUT (log
# folder), PYTHON (default python3), GPU_CHECK_PYTEST_ARGS (e.g. "-m cuda"), GPU_CHECK_PEERS (side-by-side benches to run), GPU_CHECK_BUDGET_S (default 540: steps that would start after this many
# seconds are skipped, so the summary always prints within the machine's limit), GPU_CHECK_PIP (1: build the Python
# package with `pip install .`, a second full compile of the library; default: when nanobind imports, the
# binding strata._C is built in the same CMake build and installed with its component into build/gpu/pyroot,
# which PYTHONPATH then points at: the same files `pip install .` installs, without compiling everything twice).
# Exit status: 0 when every step passed; 1 otherwise. A configure or build failure stops the run at once.
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo" || exit 2

dry=auto
python_steps=1
jobs="$(nproc)"
while (($#)); do
  case "$1" in
    --dry) dry=1 ;;
    --no-python) python_steps=0 ;;
    --jobs) jobs="$2"; shift ;;
    -h|--help) sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

gpu_name=""
if [[ $dry == auto ]]; then
  dry=1
  if command -v nvidia-smi >/dev/null 2>&1 && gpu_name="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)" && [[ -n $gpu_name ]]; then
    dry=0
  fi
fi

logs="${OUT:-$repo/build/gpu-logs}"
mkdir -p "$logs"
PYTHON="${PYTHON:-python3}"
budget_s="${GPU_CHECK_BUDGET_S:-540}"
skip=" ${GPU_CHECK_SKIP:-} "
skipped() { [[ $skip == *" $1 "* ]]; }
if ((dry)); then
  build="$repo/build/gpu-dry"
  cuda_flags=(-DSTRATA_ENABLE_CUDA=OFF)
  atk_args=(--device cpu --quick)
  atk_out="${OUT:+$OUT/atk}"
  atk_out="${atk_out:-$repo/build/atk-dry}"
  mode="dry run (no GPU): CPU-only build and checks"
else
  build="$repo/build/gpu"
  cuda_flags=(-DSTRATA_ENABLE_CUDA=ON -DSTRATA_CUDA_ARCHS=90a)
  atk_args=(--device cuda)
  # GPU_CHECK_ATK_ARGS: extra `strata atk` arguments (e.g. "--no-precision --iters 10 --ops a,b").
  read -r -a extra_atk <<<"${GPU_CHECK_ATK_ARGS:-}"
  atk_args+=("${extra_atk[@]}")
  atk_out="${OUT:+$OUT/atk}"
  atk_out="${atk_out:-$repo/build/atk}"
  mode="GPU: $gpu_name"
  # nvcc lives in the toolkit's bin, which a non-login shell may not have on PATH.
  if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
fi

# ---- the summary table: one row per step ----
summary=()
failed=0
record() {  # record STEP RESULT SECONDS DETAIL
  summary+=("$(printf '%-22s %-7s %5ss  %s' "$1" "$2" "$3" "$4")")
  [[ $2 == FAIL ]] && failed=1
  return 0
}
print_summary() {
  {
    echo
    echo "== gpu_check summary: $mode; logs in $logs =="
    printf '%-22s %-7s %6s  %s\n' step result time detail
    printf '%-22s %-7s %6s  %s\n' ---------------------- ------- ------ ------
    printf '%s\n' "${summary[@]}"
    echo "overall: $([[ $failed == 0 ]] && echo PASS || echo FAIL)"
  } | tee "$logs/summary.txt"
}
die() {  # die STEP LOG: a step the rest depends on failed
  echo "gpu_check: $1 FAILED; last lines of $2:" >&2
  tail -n 60 "$2" >&2
  record "$1" FAIL "$((SECONDS - t0))" "see $2"
  print_summary
  exit 1
}
# Seconds left for a step capped at $1, or 0 when the run's budget is spent.
time_left() {
  local left=$((budget_s - SECONDS))
  ((left < 30)) && { echo 0; return; }
  ((left < $1)) && echo "$left" || echo "$1"
}
banner() { echo; echo "== $* =="; }

echo "gpu_check: $mode; $jobs jobs; logs in $logs"

# ---- (i) dependencies: Highway from Debian packages (the GPU machine has none) ----
banner "dependencies"
t0=$SECONDS
: >"$logs/deps.log"
deps_flags=()
shopt -s nullglob
debs=("$repo"/.deps/debs/*.deb)
shopt -u nullglob
if ((${#debs[@]})); then
  # Unpacked afresh every time: the tree that travelled may have lost its symlinks (libhwy.so -> .so.1).
  rm -rf "$repo/.deps/root"
  mkdir -p "$repo/.deps/root"
  for d in "${debs[@]}"; do
    dpkg -x "$d" "$repo/.deps/root" >>"$logs/deps.log" 2>&1 || die dependencies "$logs/deps.log"
  done
  hwy_lib="$repo/.deps/root/usr/lib/x86_64-linux-gnu"
  if [[ ! -f $repo/.deps/root/usr/include/hwy/highway.h || ! -e $hwy_lib/libhwy.so ]]; then
    echo "the .debs in .deps/debs hold no hwy/highway.h or libhwy.so" >>"$logs/deps.log"
    die dependencies "$logs/deps.log"
  fi
  # CMAKE_DISABLE_FIND_PACKAGE_hwy makes a machine that has Highway installed take the unpacked one too, so
  # the dry run checks the path the GPU machine takes (STRATA_DEPS_PREFIX, top-level CMakeLists.txt).
  deps_flags=(-DSTRATA_DEPS_PREFIX="$repo/.deps/root" -DCMAKE_DISABLE_FIND_PACKAGE_hwy=ON)
  export LD_LIBRARY_PATH="$hwy_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  record dependencies ok "$((SECONDS - t0))" "Highway from ${#debs[@]} .debs in .deps/root"
elif ((dry)); then
  record dependencies ok "$((SECONDS - t0))" "no .deps/debs: the system Highway"
else
  echo "no .debs in .deps/debs: run scripts/fetch_gpu_deps.sh on the development machine and bring the .deps" \
       "folder along (it is git-ignored)" >"$logs/deps.log"
  die dependencies "$logs/deps.log"
fi

# ---- (ii) configure and build ----
banner "configure and build ($build)"
t0=$SECONDS
# The Python binding in the same build (see GPU_CHECK_PIP above).
py_flags=()
py_from_build=0
if ((!dry && python_steps)) && ! skipped python && [[ ${GPU_CHECK_PIP:-0} != 1 ]] &&
   "$PYTHON" -c "import nanobind, torch" >/dev/null 2>&1; then
  py_from_build=1
  py_flags=(-DSTRATA_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v "$PYTHON")")
fi
if skipped build && [[ -x $build/tools/strata/strata ]]; then
  # A second call on a machine that is still warm: the copied tree has new mtimes, so ninja would rebuild
  # everything; GPU_CHECK_SKIP=build reuses the binaries the previous call built instead.
  record "configure + build" skipped 0 "GPU_CHECK_SKIP: reusing $build"
else
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_flags[@]}" "${deps_flags[@]}" "${py_flags[@]}" \
    >"$logs/configure.log" 2>&1 || die configure "$logs/configure.log"
  grep -E "^-- Strata" "$logs/configure.log"
  # GPU_CHECK_TARGETS: build only these ninja targets (e.g. "strata_cli _C" when the C++ tests are skipped).
  read -r -a build_targets <<<"${GPU_CHECK_TARGETS:-}"
  timeout "$(time_left 420)" ninja -C "$build" -j "$jobs" "${build_targets[@]}" >"$logs/build.log" 2>&1 || die build "$logs/build.log"
  tail -n 1 "$logs/build.log"
  # Seconds per compiled file, longest first: what the critical path of the GPU build is made of.
  awk 'NR > 1 { printf "%8.1f %s\n", ($2 - $1) / 1000, $4 }' "$build/.ninja_log" | sort -rn | head -n 25 >"$logs/build_times.txt"
  record "configure + build" ok "$((SECONDS - t0))" "$(basename "$build"), ${cuda_flags[*]}"
fi
strata_bin="$build/tools/strata/strata"

# ---- (iii) C++ tests ----
banner "C++ tests"
t0=$SECONDS
limit="$(time_left "${GPU_CHECK_CTEST_S:-240}")"
if skipped ctest; then
  record "C++ tests" skipped 0 "GPU_CHECK_SKIP"
elif ((limit == 0)); then
  record "C++ tests" skipped 0 "out of time"
else
  # The CPU implementations' conformance runs in CI (scripts/test.sh); here only the CUDA ones, unless
  # STRATA_CONFORMANCE_DEVICES is set otherwise.
  STRATA_CONFORMANCE_DEVICES="${STRATA_CONFORMANCE_DEVICES-cuda}" \
  timeout "$limit" ctest --test-dir "$build" -j "$jobs" --output-on-failure --timeout 300 >"$logs/ctest.log" 2>&1
  rc=$?
  # The failing tests and the totals; the full output is in the log.
  grep -E '\*\*\*Failed|\*\*\*Timeout|\*\*\*Exception|Not Run|tests passed' "$logs/ctest.log" | tail -n 25
  result="$(grep -E 'tests passed' "$logs/ctest.log" | tail -n 1)"
  record "C++ tests" "$([[ $rc == 0 ]] && echo ok || echo FAIL)" "$((SECONDS - t0))" "${result:-rc $rc, see ctest.log}"
fi

# ---- (iv) strata info and strata atk ----
banner "strata info"
"$strata_bin" info | tee "$logs/info.txt"
"$strata_bin" info --json >"$logs/info.json"
banner "strata atk ${atk_args[*]}"
t0=$SECONDS
limit="$(time_left "${GPU_CHECK_ATK_S:-240}")"
if skipped atk; then
  record "strata atk" skipped 0 "GPU_CHECK_SKIP"
elif ((limit == 0)); then
  record "strata atk" skipped 0 "out of time"
else
  # One `strata atk` per op (op list from `strata info --json`), each capped at GPU_CHECK_ATK_OP_S (default
  # 90 s) within the step's cap: an op that runs long loses its own table, not everyone's. Each op's output
  # goes to its folder under the atk report folder; the tables of all of them are gathered in atk.md and the
  # bench lines in atk.log at the top of the log folder (the device tool returns at most 8 files).
  mapfile -t atk_ops < <("$strata_bin" info --json | "$PYTHON" -c \
    'import json, sys; print("\n".join(o["op"] for o in json.load(sys.stdin)["ops"]))' 2>/dev/null)
  ((${#atk_ops[@]})) || atk_ops=(all)
  [[ -n ${GPU_CHECK_ATK_OPS:-} ]] && read -r -a atk_ops <<<"$GPU_CHECK_ATK_OPS"
  rc=0
  : >"$logs/atk.log"
  : >"$logs/atk.md"
  for op in "${atk_ops[@]}"; do
    op_limit="$(time_left "${GPU_CHECK_ATK_OP_S:-90}")"
    step_left=$((${GPU_CHECK_ATK_S:-240} - (SECONDS - t0)))
    ((step_left < op_limit)) && op_limit=$step_left
    if ((op_limit <= 0)); then
      echo "atk $op: skipped (out of time)" | tee -a "$logs/atk.log"
      rc=1
      continue
    fi
    op_args=(--ops "$op")
    [[ $op == all ]] && op_args=()
    mkdir -p "$atk_out/$op"
    timeout "$op_limit" "$strata_bin" atk "${atk_args[@]}" "${op_args[@]}" --out "$atk_out/$op" >"$atk_out/$op/atk.log" 2>&1 ||
      { rc=1; echo "atk $op: FAIL or timeout after ${op_limit}s ($atk_out/$op/atk.log)" | tee -a "$logs/atk.log"; }
    grep -E "bench|precision failures|FAIL" "$atk_out/$op/atk.log" | tee -a "$logs/atk.log"
    [[ -f $atk_out/$op/atk.md ]] && cat "$atk_out/$op/atk.md" >>"$logs/atk.md"
  done
  record "strata atk" "$([[ $rc == 0 ]] && echo ok || echo FAIL)" "$((SECONDS - t0))" \
    "${#atk_ops[@]} ops; atk.md, atk.log"
fi

# ---- (iv b) launch-configuration sweep of the CUDA row norms (bench/row_norm_cuda_sweep.cpp) ----
if ((!dry)) && ! skipped sweep && [[ -x $build/bench/row_norm_cuda_sweep ]]; then
  banner "row-norm CUDA configuration sweep"
  t0=$SECONDS
  limit="$(time_left 60)"
  if ((limit == 0)); then
    record "row-norm sweep" skipped 0 "out of time"
  else
    timeout "$limit" "$build/bench/row_norm_cuda_sweep" >"$logs/row_norm_sweep.log" 2>&1
    rc=$?
    grep -E "^==|best:|default" "$logs/row_norm_sweep.log"
    record "row-norm sweep" "$([[ $rc == 0 ]] && echo ok || echo FAIL)" "$((SECONDS - t0))" "row_norm_sweep.log"
  fi
fi

# ---- (v) the Python package ----
if ((!python_steps)) || skipped python; then
  record python skipped 0 "--no-python"
elif [[ ! -f $repo/pyproject.toml || ! -d $repo/tests/python ]]; then
  record python skipped 0 "no Python package in this tree"
elif ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
  record python skipped 0 "$PYTHON cannot import torch"
else
  banner "Python package"
  t0=$SECONDS
  if ((dry)); then
    # The dry run leaves the installed package alone: installing would rebuild it in the shared build/py-*.
    record "pip install" skipped 0 "--dry: tests run against what $PYTHON has installed"
  elif ((py_from_build)); then
    # strata._C and libstrata (built above) through their install component, the Python files beside them.
    pyroot="$build/pyroot"
    rm -rf "$pyroot"
    if cmake --install "$build" --component strata_python --prefix "$pyroot" >"$logs/pip.log" 2>&1 &&
       cp "$repo"/python/strata/*.py "$pyroot/strata/" >>"$logs/pip.log" 2>&1; then
      export PYTHONPATH="$pyroot${PYTHONPATH:+:$PYTHONPATH}"
      record "python package" ok "$((SECONDS - t0))" "from the CMake build into $pyroot (GPU_CHECK_PIP=1: pip)"
    else
      record "python package" FAIL "$((SECONDS - t0))" "cmake --install failed, see pip.log"
    fi
  else
    limit="$(time_left 300)"
    if ((limit == 0)); then
      record "pip install" skipped 0 "out of time"
    else
      # No network on the GPU machine: build requirements come from the environment, nothing is downloaded.
      CMAKE_ARGS="${deps_flags[*]} ${cuda_flags[*]}" CMAKE_BUILD_PARALLEL_LEVEL="$jobs" \
        timeout "$limit" "$PYTHON" -m pip install --no-build-isolation --no-deps --no-index -v "$repo" \
        >"$logs/pip.log" 2>&1
      rc=$?
      tail -n 2 "$logs/pip.log"
      record "pip install" "$([[ $rc == 0 ]] && echo ok || echo FAIL)" "$((SECONDS - t0))" "$(tail -n 1 "$logs/pip.log")"
    fi
  fi

  t0=$SECONDS
  limit="$(time_left 180)"
  if skipped pytest; then
    record pytest skipped 0 "GPU_CHECK_SKIP"
  elif ((limit == 0)); then
    record pytest skipped 0 "out of time"
  else
    read -r -a pytest_args <<<"${GPU_CHECK_PYTEST_ARGS:-}"
    timeout "$limit" "$PYTHON" -m pytest "$repo/tests/python" -q -rs "${pytest_args[@]}" >"$logs/pytest.log" 2>&1
    rc=$?
    tail -n 8 "$logs/pytest.log"
    # pytest's exit 5 means nothing was collected, which is a failure here too.
    record pytest "$([[ $rc == 0 ]] && echo ok || echo FAIL)" "$((SECONDS - t0))" "$(tail -n 1 "$logs/pytest.log")"
  fi

  # The side-by-side benches (Strata beside torch eager, and fla / Liger-Kernel / cut-cross-entropy when the
  # git-ignored peers/ folder holds them): bench/torch_peers.py (issue 2's ops), fused_peers.py (issue 4's),
  # gdn_peers.py (issue 3's). GPU_CHECK_PEERS names which (default all three); one log each.
  read -r -a peer_benches <<<"${GPU_CHECK_PEERS:-torch_peers fused_peers gdn_peers}"
  for bench in "${peer_benches[@]}"; do
    banner "side by side (bench/$bench.py)"
    t0=$SECONDS
    limit="$(time_left 150)"
    if skipped peers; then
      record "$bench" skipped 0 "GPU_CHECK_SKIP"
    elif ((limit == 0)); then
      record "$bench" skipped 0 "out of time"
    else
      if ((dry)); then peer_args=(--device cpu --quick); else peer_args=(--device cuda); fi
      PYTHONUNBUFFERED=1 timeout "$limit" "$PYTHON" "$repo/bench/$bench.py" "${peer_args[@]}" --json "$logs/$bench.json" \
        2>&1 | tee "$logs/$bench.log"
      rc=$?
      record "$bench" "$([[ $rc == 0 ]] && echo ok || echo FAIL)" "$((SECONDS - t0))" "$(tail -n 1 "$logs/$bench.log")"
    fi
  done
fi

# ---- (vi) summary ----
print_summary
exit "$failed"
