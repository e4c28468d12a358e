#!/usr/bin/env bash
# Runs every cargo-fuzz target (or the ones named) for N seconds each, one after another.
#
#   tools/fuzz.sh [SECONDS] [TARGET...]        default: 60 seconds, every target
#
# With a nightly toolchain the targets run under AddressSanitizer; without one, on stable
# with `--sanitizer none` (cargo-fuzz still sets `--cfg fuzzing` and libFuzzer's coverage).
# Environment:
#   FUZZ_SANITIZER   address | none        (default: address when nightly exists, else none)
#   FUZZ_JOBS        parallel libFuzzer jobs per target (default 1; more than 1 makes
#                    libFuzzer write each job's log to fuzz/fuzz-N.log instead)
#   FUZZ_INSTALL=1   `cargo install cargo-fuzz --locked` first if it is missing
#   FUZZ_TARGET_DIR  cargo's target directory (default fuzz/target), e.g. to keep a stable
#                    and a nightly build side by side (ops_vs_model builds in its
#                    no-trace-compares/ subdirectory)
#   FUZZ_ONE_BUILD=1 build ops_vs_model like the others (with compare tracing, in the same
#                    target directory): one build of the workspace instead of two
#   TMPDIR           where temporary files go (default /dev/shm when it exists)
#
# New corpus entries go to fuzz/work/<target>/ (not committed); the committed seeds in
# fuzz/corpus/<target>/ and fuzz/regressions/<target>/ are read, never written. Crashes go to
# fuzz/artifacts/<target>/, logs to fuzz/logs/<target>.log. Exits 1 if any target failed.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(decode_record intent_json ops_vs_model open_file)
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    if [ "${FUZZ_INSTALL:-0}" = 1 ]; then
        cargo install cargo-fuzz --locked
    else
        echo "cargo-fuzz is missing: run \`cargo install cargo-fuzz --locked\` (or set FUZZ_INSTALL=1)" >&2
        exit 2
    fi
fi

toolchain=()
sanitizer=${FUZZ_SANITIZER:-}
if [ -z "$sanitizer" ]; then
    if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then sanitizer=address; else sanitizer=none; fi
fi
if [ "$sanitizer" != none ]; then toolchain=(+nightly); fi
target_dir=${FUZZ_TARGET_DIR:-target}

# Per-target build options. ops_vs_model is built without libFuzzer's compare tracing: its
# input is decoded by `Arbitrary` into small choices taken modulo their range, so no
# comparison in the journal or redb is against input bytes and compare-guided mutation has
# nothing to solve, while tracing every comparison in redb's page bitmaps cost about half of
# each execution. Built in a directory of its own, so the two builds do not rebuild each
# other.
set_build_for() {
    build=(--sanitizer "$sanitizer")
    case "$1" in
        ops_vs_model)
            if [ "${FUZZ_ONE_BUILD:-0}" = 1 ]; then
                # One build for every target (CI's short runs: a second build of the
                # workspace costs more than compare tracing does in 60 seconds).
                if [ -n "${FUZZ_TARGET_DIR:-}" ]; then build+=(--target-dir "$FUZZ_TARGET_DIR"); fi
            else
                build+=(--no-trace-compares --target-dir "$target_dir/no-trace-compares")
            fi
            ;;
        *) if [ -n "${FUZZ_TARGET_DIR:-}" ]; then build+=(--target-dir "$FUZZ_TARGET_DIR"); fi ;;
    esac
}

# Per-target libFuzzer options: input size, a per-input timeout (catches hangs), memory.
# ops_vs_model touches tens of thousands of coverage features per execution, and the
# entropic power schedule's bookkeeping of rare features took a large share of each
# execution once the execution itself was cheap: it runs with the classic schedule
# (-entropic=0), which reached more coverage in the same time (docs/fuzzing.md). For
# open_file, runs with and without it varied more between runs than between settings:
# it keeps the default.
opts_for() {
    case "$1" in
        decode_record) echo "-max_len=65536 -timeout=10 -rss_limit_mb=2048" ;;
        intent_json) echo "-max_len=8192 -timeout=10 -rss_limit_mb=2048" ;;
        ops_vs_model) echo "-max_len=2048 -len_control=0 -entropic=0 -timeout=30 -rss_limit_mb=2048" ;;
        open_file) echo "-max_len=262144 -timeout=30 -rss_limit_mb=4096" ;;
        *) echo "-timeout=30" ;;
    esac
}

# The targets write journals and let the library make its temporary copies (verify's page
# check, repair's dry run): in memory where there is a tmpfs, so no execution waits for a
# disk.
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi

mkdir -p logs
failed=0
printf '%-14s %10s %8s %8s %8s %7s  %s\n' target execs exec/s cov ft corpus result
for t in "${targets[@]}"; do
    mkdir -p "work/$t" "artifacts/$t"
    seeds=()
    for d in "corpus/$t" "regressions/$t"; do
        [ -d "$d" ] && seeds+=("$d")
    done
    extra=()
    [ -f "dict/$t.dict" ] && extra+=("-dict=dict/$t.dict")
    if [ "${FUZZ_JOBS:-1}" -gt 1 ]; then extra+=("-jobs=$FUZZ_JOBS" "-workers=$FUZZ_JOBS"); fi
    set_build_for "$t"
    # shellcheck disable=SC2046
    if cargo "${toolchain[@]}" fuzz run "${build[@]}" "$t" "work/$t" "${seeds[@]}" -- \
        -max_total_time="$secs" -artifact_prefix="artifacts/$t/" -print_final_stats=1 \
        "${extra[@]}" $(opts_for "$t") \
        >"logs/$t.log" 2>&1; then
        result=ok
    else
        result="FAILED (see fuzz/logs/$t.log, fuzz/artifacts/$t/)"
        failed=1
    fi
    # libFuzzer's last status line: "#N DONE cov: C ft: F corp: K/..." (or the last pulse).
    last=$(grep -E '^#[0-9]+' "logs/$t.log" | tail -1 || true)
    execs=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "logs/$t.log" | tail -1 | grep -oE '[0-9]+$' || true)
    rate=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "logs/$t.log" | tail -1 | grep -oE '[0-9]+$' || true)
    cov=$(grep -oE 'cov: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)
    ft=$(grep -oE 'ft: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)
    corp=$(grep -oE 'corp: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)
    printf '%-14s %10s %8s %8s %8s %7s  %s\n' "$t" "${execs:--}" "${rate:--}" "${cov:--}" "${ft:--}" "${corp:--}" "$result"
done
exit $failed
