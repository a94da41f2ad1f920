#!/usr/bin/env bash
# Runs each fuzz target with libFuzzer (cargo-fuzz, release build) for the given number of
# seconds (default 60), one after the other, and prints the executions each did.
#
#   fuzz/run.sh [seconds]
#
# Environment: SANITIZER (none | address; default none: the crate forbids unsafe code, and
# without ASan the targets run 5-7x faster), TARGETS (default "request_path commands combine").
#
# Works on the stable toolchain: without a sanitizer cargo-fuzz passes only stable flags;
# with ASan it passes -Zsanitizer=address, which RUSTC_BOOTSTRAP=1 lets stable rustc accept.
# Seeds are read from corpus/<target>/ (never written); what libFuzzer finds goes to
# work/<target>/ (git-ignored), crashes to artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")"

seconds=${1:-60}
sanitizer=${SANITIZER:-none}
targets=${TARGETS:-request_path commands combine}
if [ "$sanitizer" != none ]; then export RUSTC_BOOTSTRAP=1; fi
export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1}

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz"
  cargo install cargo-fuzz --locked -j "$CARGO_BUILD_JOBS"
fi

cargo fuzz build -O -s "$sanitizer"

total=0
for target in $targets; do
  mkdir -p "work/$target"
  log="work/$target.log"
  start=$(date +%s)
  status=0
  cargo fuzz run -O -s "$sanitizer" "$target" "work/$target" "corpus/$target" -- \
    -max_total_time="$seconds" -timeout=30 -print_final_stats=1 >"$log" 2>&1 || status=$?
  elapsed=$(($(date +%s) - start))
  execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
  if [ "$status" -ne 0 ]; then
    echo "$target: FAILED (exit $status) after ${elapsed}s; the panic and the input:"
    grep -E -A4 "panicked at|ERROR: (AddressSanitizer|libFuzzer)" "$log" | head -40
    grep -E "Test unit written to" "$log" || true
    echo "full log: fuzz/$log"
    exit "$status"
  fi
  corpus=$(find "work/$target" -type f | wc -l)
  echo "$target: ${execs:-0} executions in ${elapsed}s (sanitizer $sanitizer, work corpus $corpus inputs)"
  total=$((total + ${execs:-0}))
done
echo "total: $total executions"
