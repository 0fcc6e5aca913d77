#!/usr/bin/env bash
# Runs the C++ tests under sanitizers, with the system's gcc (the compiler of
# the main build; its libasan, libubsan and libtsan come with it), -g1 (line
# tables: reports name file and line), -O0 for ASan (its build takes about 40% less
# time than at -O1, and the tests spend their time in LibTorch, which is not
# instrumented either way), -O1 for TSan, and -DCONVEYOR_CUDA=OFF, building
# only the plugin (LibTorch's headers precompiled) and the test binaries:
#   build-asan/  AddressSanitizer + UndefinedBehaviorSanitizer, leak checking
#                on: every gtest binary (test_distributed's forked ranks too);
#   build-tsan/  ThreadSanitizer: test_conveyor, the in-process runtime's tests
#                (stages on threads, mailboxes, aborts, timeouts).
# LibTorch (the torch wheel) is not instrumented: what that costs, and the
# options and suppressions it needs, are in tests/sanitizers/. Every report,
# of any process, is collected under <build>/sanitizer-logs/ and fails the run.
#   bash scripts/sanitize.sh          both
#   bash scripts/sanitize.sh asan     one of them (asan or tsan)
# scripts/test.sh runs it unless CONVEYOR_SANITIZE=0.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kinds=(asan tsan)
if [ $# -ge 1 ]; then kinds=("$1"); fi
bash "$root/scripts/setup.sh"
export PATH="$root/.venv/bin:$PATH"
py="$root/.venv/bin/python"
torch_prefix="$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
supp="$root/tests/sanitizers"
jobs="$(nproc)"

# configure DIR -OLEVEL "FLAGS" [CMAKE_ARG...]: a Debug build at -OLEVEL -g1
# with the sanitizer flags, no examples or benchmarks; tests are listed when
# ctest runs, not at build time.
configure() {
  local dir="$1" level="$2" flags="$3"
  shift 3
  if [ -f "$dir/build.ninja" ]; then return 0; fi
  mkdir -p "$dir"
  cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="$level -g1" \
    -DCMAKE_CXX_FLAGS="$flags -fno-omit-frame-pointer" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
    -DCMAKE_SHARED_LINKER_FLAGS="$flags" "$@" -DCONVEYOR_CUDA=OFF -DCONVEYOR_BUILD_EXAMPLES=OFF \
    -DCONVEYOR_BUILD_BENCHMARKS=OFF -DCONVEYOR_PRECOMPILE_HEADERS=ON -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DCONVEYOR_PYTHON="$py" -DCONVEYOR_PYTHON_MODULE=OFF \
    -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST >"$dir/sanitize-configure.log" 2>&1 ||
    { tail -n 30 "$dir/sanitize-configure.log" >&2; echo "sanitize: configuring $dir failed" >&2; return 1; }
}

# build DIR TARGET...
build() {
  local dir="$1" t0
  shift
  t0=$(date +%s)
  if ! cmake --build "$dir" --parallel "$jobs" --target "$@" >"$dir/sanitize-build.log" 2>&1; then
    grep -m 20 -B 2 -A 10 "error" "$dir/sanitize-build.log" >&2 || tail -n 40 "$dir/sanitize-build.log" >&2
    echo "sanitize: building $dir failed (log: $dir/sanitize-build.log)" >&2
    return 1
  fi
  echo "sanitize: built $(basename "$dir") in $(( $(date +%s) - t0 )) s"
}

# run_tests DIR "BINARY[:SHARDS]"...: runs the gtest binaries, $jobs at a
# time (a binary with SHARDS runs as that many gtest shards), each to its log
# and each within 30 minutes (a hang, not a slow machine: the longest,
# test_wire_faults, takes under 3 minutes on 2 busy cores); fails on a
# failed or hung test or on any sanitizer report in DIR/sanitizer-logs/.
run_tests() {
  local dir="$1" t0 status=0 spec bin shards i name running=0
  shift
  t0=$(date +%s)
  rm -rf "$dir/sanitizer-logs" "$dir/test-logs"
  mkdir -p "$dir/sanitizer-logs" "$dir/test-logs"
  local -a names=()
  for spec in "$@"; do
    bin="${spec%%:*}"
    shards=1
    [ "$spec" = "$bin" ] || shards="${spec#*:}"
    for ((i = 0; i < shards; ++i)); do
      name="$bin.$i"
      (
        cd "$dir/tests"
        rc=0
        GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout --kill-after=30 1800 ./"$bin" --gtest_brief=1 \
          >"$dir/test-logs/$name.log" 2>&1 || rc=$?
        [ "$rc" != 124 ] || echo "sanitize: $name still running after 30 minutes: stopped" >>"$dir/test-logs/$name.log"
        echo "$rc" >"$dir/test-logs/$name.rc"
      ) &
      names+=("$name")
      running=$((running + 1))
      if [ "$running" -ge "$jobs" ]; then
        wait -n || true
        running=$((running - 1))
      fi
    done
  done
  wait
  for name in "${names[@]}"; do
    if [ "$(cat "$dir/test-logs/$name.rc")" != 0 ]; then
      tail -n 40 "$dir/test-logs/$name.log" >&2
      echo "sanitize: $name FAILED (log: $dir/test-logs/$name.log)" >&2
      status=1
    fi
  done
  local reports
  reports=$(find "$dir/sanitizer-logs" -type f | sort)
  if [ -n "$reports" ]; then
    for r in $reports; do
      head -n 60 "$r" >&2
    done
    echo "sanitize: $(echo "$reports" | wc -l) sanitizer report(s) in $dir/sanitizer-logs/" >&2
    status=1
  fi
  echo "sanitize: ran $(basename "$dir") tests in $(( $(date +%s) - t0 )) s"
  return $status
}

start=$(date +%s)
status=0
for kind in "${kinds[@]}"; do
  case "$kind" in
    asan)
      dir="$root/build-asan"
      # vptr: UBSan's check needs the typeinfo of LibTorch classes the wheel does
      # not export (c10::DynamicType): libconveyor.so would not link.
      configure "$dir" -O0 "-fsanitize=address,undefined -fno-sanitize=vptr"
      build "$dir" test_schedules test_conveyor test_schedules_runtime test_faults test_planner test_script \
        test_distributed test_wire_faults test_shared_memory test_fused_lstm test_fused_attention
      "$py" "$root/tests/python/make_fixtures.py" "$dir/fixtures" >"$dir/fixtures.log" 2>&1
      # The options and why: tests/sanitizers/README.md.
      export ASAN_OPTIONS="detect_leaks=1:log_path=$dir/sanitizer-logs/asan"
      export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
      export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$dir/sanitizer-logs/ubsan"
      CONVEYOR_FIXTURES="$dir/fixtures" run_tests "$dir" test_schedules test_conveyor:2 test_schedules_runtime \
        test_faults test_planner test_script test_fused_lstm test_fused_attention test_distributed test_wire_faults \
        test_shared_memory ||
        status=1
      unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
      ;;
    tsan)
      dir="$root/build-tsan"
      # test_conveyor needs neither the TorchScript front end nor the fused ops
      # (compute kernels without threads of their own): 25 files fewer to build.
      configure "$dir" -O1 -fsanitize=thread -DCONVEYOR_TORCHSCRIPT=OFF -DCONVEYOR_FUSED_OPS=
      build "$dir" test_conveyor test_schedules_runtime test_faults
      export TSAN_OPTIONS="suppressions=$supp/tsan.supp:halt_on_error=0:second_deadlock_stack=1"
      TSAN_OPTIONS+=":log_path=$dir/sanitizer-logs/tsan"
      # One intra-op thread: LibTorch's OpenMP pool synchronises in code TSan cannot see.
      OMP_NUM_THREADS=1 run_tests "$dir" test_conveyor:2 test_schedules_runtime test_faults || status=1
      unset TSAN_OPTIONS
      ;;
    *)
      echo "sanitize: unknown kind '$kind' (asan or tsan)" >&2
      exit 2
      ;;
  esac
done
echo "sanitize: done in $(( $(date +%s) - start )) s"
exit $status
