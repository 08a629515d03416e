#!/usr/bin/env bash
# Builds the fuzz targets of fuzz/ (libFuzzer through libfuzzer-sys, on the stable
# toolchain) and runs each for a bounded time; a crash, a hang or an out-of-memory fails the
# run, and the input that caused it is left in fuzz/artifacts/TARGET/. See docs/testing.md.
#
#   .ci/fuzz.sh                        every target, FUZZ_SECONDS (default 30) each
#   .ci/fuzz.sh wire fixture           only these targets
#   FUZZ_SECONDS=3600 .ci/fuzz.sh      a longer run
#   FUZZ_PARALLEL=2                    targets run at once (default 2)
#   FUZZ_OPT_LEVEL=1                   a quicker build of slower targets (default 3; CI uses 1)
#
# Each target starts from its committed seeds (fuzz/corpus/TARGET) and from what earlier runs
# on this machine found (fuzz/corpus-local/TARGET, which new inputs are added to).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

all=(json_parse canonical request_state fixture wire)
if [ "$#" -gt 0 ]; then targets=("$@"); else targets=("${all[@]}"); fi
seconds=${FUZZ_SECONDS:-30}
parallel=${FUZZ_PARALLEL:-2}

# Formatting, as the workspace's (the fuzz crate is outside it).
cargo fmt --check

# Coverage instrumentation as cargo-fuzz sets it, with stable flags only (no sanitizer: the
# code under test is safe Rust, and a panic aborts). An explicit --target keeps these flags
# off build scripts and proc macros.
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
export CARGO_PROFILE_RELEASE_OPT_LEVEL=${FUZZ_OPT_LEVEL:-3}
host=$(rustc -vV | sed -n 's/^host: //p')
build_start=$(date +%s)
# Not --locked: fuzz/Cargo.lock pins what it knows, and a dependency the workspace gained
# since it was written is resolved here instead of failing the run.
cargo build --release --target "$host" --bins
echo "fuzz build: $(( $(date +%s) - build_start )) s"
bin="target/$host/release"

dict_of() {
  case "$1" in
    wire) echo dict/wire.dict ;;
    fixture) echo dict/fixture.dict ;;
    request_state) echo "" ;;
    *) echo dict/json.dict ;;
  esac
}

run_one() {
  local t=$1 dict
  mkdir -p "corpus-local/$t" "artifacts/$t" target/logs
  dict=$(dict_of "$t")
  # -timeout: one input running this long is a hang; -rss_limit_mb: memory per process.
  "$bin/$t" "corpus-local/$t" "corpus/$t" \
    -max_total_time="$seconds" -timeout=60 -rss_limit_mb=2048 -max_len=8192 \
    ${dict:+-dict="$dict"} -artifact_prefix="artifacts/$t/" -print_final_stats=1 \
    >"target/logs/$t.log" 2>&1
}

failed=()
pids=()
names=()
flush() {
  local i
  for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then failed+=("${names[$i]}"); fi
  done
  pids=()
  names=()
}
for t in "${targets[@]}"; do
  [ -x "$bin/$t" ] || { echo "no fuzz target named $t (known: ${all[*]})" >&2; exit 2; }
  run_one "$t" &
  pids+=("$!")
  names+=("$t")
  if [ "${#pids[@]}" -ge "$parallel" ]; then flush; fi
done
flush

for t in "${targets[@]}"; do
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "target/logs/$t.log" | tail -n1)
  corpus=$(find "corpus-local/$t" -type f | wc -l)
  echo "fuzz $t: ${execs:-?} executions in ${seconds} s, ${corpus} inputs in corpus-local"
done
if [ "${#failed[@]}" -gt 0 ]; then
  for t in "${failed[@]}"; do
    echo "== fuzz $t FAILED; the end of its log (fuzz/target/logs/$t.log):" >&2
    tail -n 60 "target/logs/$t.log" >&2
    echo "inputs: $(ls "artifacts/$t" 2>/dev/null | tr '\n' ' ')" >&2
  done
  exit 1
fi
echo "fuzz: no crash in ${#targets[@]} targets"
