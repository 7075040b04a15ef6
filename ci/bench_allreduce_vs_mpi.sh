#!/usr/bin/env bash
# Dev-time comparison (not part of CI): 4-rank 64 MiB f32 all-reduce busbw of the CPU mock's
# collectives (ranks as threads, and as processes: same-host shared memory) against Open MPI's
# MPI_Allreduce with 4 processes on the same machine, measured in the same run, ROUNDS times.
# Targets: processes >= 1.0x MPI, threads >= 2.0x MPI. Needs the distribution's Open MPI
# (installed here when missing):
#   sudo apt-get install -y openmpi-bin libopenmpi-dev
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${RANKS:-4}
BYTES=${BYTES:-$((64 << 20))}
ITERS=${ITERS:-5}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-2}
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  SUDO=$(command -v sudo || true)
  $SUDO apt-get install -y openmpi-bin libopenmpi-dev
fi
cargo build --release -q
mpicc -O2 -o target/release/mpi_allreduce_bench ci/mpi_allreduce_bench.c
# Our table: size count type | time algbw busbw #wrong | ... (out-of-place busbw = field 7);
# the MPI table: size count type time algbw busbw (field 6).
ours() { awk -v b="$BYTES" '$1 == b { print $7 }'; }
theirs() { awk -v b="$BYTES" '$1 == b { print $6 }'; }
for round in $(seq "$ROUNDS"); do
  mpi_out=$(mpirun --allow-run-as-root --oversubscribe -np "$RANKS" target/release/mpi_allreduce_bench "$BYTES" "$ITERS")
  thr_out=$(target/release/dropcompute bench allreduce --ranks "$RANKS" --launch threads --min-bytes "$BYTES" \
    --max-bytes "$BYTES" --iters "$ITERS" --warmup "$WARMUP")
  proc_out=$(target/release/dropcompute bench allreduce --ranks "$RANKS" --launch processes --min-bytes "$BYTES" \
    --max-bytes "$BYTES" --iters "$ITERS" --warmup "$WARMUP")
  echo "$mpi_out"; echo "$thr_out"; echo "$proc_out"
  mpi=$(echo "$mpi_out" | theirs); thr=$(echo "$thr_out" | ours); proc=$(echo "$proc_out" | ours)
  awk -v r="$round" -v m="$mpi" -v t="$thr" -v p="$proc" -v b="$BYTES" 'BEGIN {
    printf "round %s, busbw at %s bytes: MPI %.3f GB/s, mock threads %.3f GB/s (ratio %.2f, target >= 2.0), mock processes %.3f GB/s (ratio %.2f, target >= 1.0)\n", r, b, m, t, t / m, p, p / m }'
done
