#!/bin/sh
# Real syscall faults under strace (issue 5): for each run, six scenarios, each a child
# process running the seeded journal workload under `strace -e inject=`:
#   fdatasync EIO once, fdatasync EIO from the Nth call on,
#   pwrite64 ENOSPC once, pwrite64 ENOSPC from the Nth call on,
#   SIGKILL at the Nth fdatasync, SIGKILL at the Nth pwrite64.
# A child that sees an error must find its handle poisoned, reopen, and match the model;
# one that is killed or cannot reopen is checked by the parent (see docs/durability.md).
#
# usage: tools/strace-faults.sh [RUNS] [extra killer arguments]
# needs: strace (Debian: apt-get install -y strace)
set -eu
runs="${1:-20}"
[ $# -gt 0 ] && shift
cd "$(dirname "$0")/.."
exec cargo run --release -q -p opjournal-tools --bin killer -- --strace --runs "$runs" --quiet "$@"
