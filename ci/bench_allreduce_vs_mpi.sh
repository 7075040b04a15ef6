#!/usr/bin/env bash
# Dev-time comparison (not part of CI): 4-rank 64 MiB f32 all-reduce busbw of the CPU mock's
# collectives (ranks as threads, and as processes) against Open MPI's MPI_Allreduce with 4
# processes on the same machine, measured in the same run. Needs the distribution's Open MPI:
#   apt-get install -y openmpi-bin libopenmpi-dev
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${RANKS:-4}
BYTES=${BYTES:-$((64 << 20))}
ITERS=${ITERS:-5}
cargo build --release -q
mpicc -O2 -o target/release/mpi_allreduce_bench ci/mpi_allreduce_bench.c
mpi_out=$(mpirun --allow-run-as-root --oversubscribe -np "$RANKS" target/release/mpi_allreduce_bench "$BYTES" "$ITERS")
thr_out=$(target/release/dropcompute bench allreduce --ranks "$RANKS" --launch threads --min-bytes "$BYTES" --max-bytes "$BYTES" --iters "$ITERS")
proc_out=$(target/release/dropcompute bench allreduce --ranks "$RANKS" --launch processes --min-bytes "$BYTES" --max-bytes "$BYTES" --iters "$ITERS")
echo "$mpi_out"; echo "$thr_out"; echo "$proc_out"
busbw() { awk -v b="$BYTES" '$1 == b { print $6 }'; }
mpi=$(echo "$mpi_out" | busbw); thr=$(echo "$thr_out" | busbw); proc=$(echo "$proc_out" | busbw)
awk -v m="$mpi" -v t="$thr" -v p="$proc" -v b="$BYTES" 'BEGIN {
  printf "busbw at %s bytes: MPI %.3f GB/s, mock threads %.3f GB/s (ratio %.2f, target >= 1.0), mock processes %.3f GB/s (ratio %.2f, target >= 0.5)\n", b, m, t, t / m, p, p / m }'
