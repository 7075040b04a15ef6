/* Dev-time baseline for `dropcompute bench allreduce`: MPI_Allreduce (sum, float) bus bandwidth
 * with the same definitions (algbw = bytes / time, busbw = algbw * 2(n-1)/n, mean of ITERS
 * timed iterations after one warm-up, barrier before timing). Not a dependency of the crate;
 * built and run by ci/bench_allreduce_vs_mpi.sh with the distribution's Open MPI. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t max_bytes = argc > 1 ? strtoull(argv[1], NULL, 10) : (size_t)64 << 20;
    int iters = argc > 2 ? atoi(argv[2]) : 5;
    size_t max_count = max_bytes / sizeof(float);
    float *send = malloc(max_count * sizeof(float)), *recv = malloc(max_count * sizeof(float));
    for (size_t i = 0; i < max_count; i++) send[i] = (float)(i % 1000) * 0.5f;
    if (rank == 0) printf("# MPI_Allreduce sum, %d ranks\n%12s %12s %6s %12s %10s %10s\n", n, "size(B)", "count", "type", "time(us)", "algbw", "busbw");
    for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
        int count = (int)(bytes / sizeof(float));
        MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int it = 0; it < iters; it++) MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t = (MPI_Wtime() - t0) / iters, tmax;
        MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            double algbw = (double)bytes / tmax / 1e9;
            printf("%12zu %12d %6s %12.1f %10.3f %10.3f\n", bytes, count, "f32", tmax * 1e6, algbw, algbw * 2.0 * (n - 1) / n);
        }
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
