/*
 * A small OSU-style MPI latency program, the reference netgap's
 * mpi-latency is checked against in BENCHMARKS.md: two ranks, a blocking
 * send and receive ping-pong per message size, warm-up iterations not
 * timed, one-way latency = half the mean round trip. Prints one line per
 * size: "SIZE_BYTES LATENCY_US".
 *
 * Build: mpicc -O2 -o latency latency.c
 * Run:   mpirun -np 2 ./latency [ITERATIONS [SIZE...]]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const long default_sizes[] = {1, 1024, 65536, 1048576};

int main(int argc, char **argv)
{
    int rank, ranks;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (ranks != 2) {
        if (rank == 0)
            fprintf(stderr, "latency: needs exactly 2 ranks, got %d\n", ranks);
        MPI_Finalize();
        return 1;
    }
    long iterations = argc > 1 ? atol(argv[1]) : 10000;
    if (iterations < 1)
        iterations = 1;
    int nsizes = argc > 2 ? argc - 2 : (int)(sizeof default_sizes / sizeof *default_sizes);
    long max_size = 1;
    for (int i = 0; i < nsizes; i++) {
        long s = argc > 2 ? atol(argv[2 + i]) : default_sizes[i];
        if (s > max_size)
            max_size = s;
    }
    char *sbuf = malloc((size_t)max_size);
    char *rbuf = malloc((size_t)max_size);
    if (!sbuf || !rbuf) {
        fprintf(stderr, "latency: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(sbuf, 'c', (size_t)max_size);
    int peer = 1 - rank;
    for (int i = 0; i < nsizes; i++) {
        long size = argc > 2 ? atol(argv[2 + i]) : default_sizes[i];
        if (size < 1)
            continue;
        /* As osu_latency: fewer warm-up and timed iterations for large messages. */
        long warmup = size > 8192 ? 10 : 100;
        long timed = size > 8192 ? (iterations / 10 > 0 ? iterations / 10 : 1) : iterations;
        double start = 0.0;
        MPI_Barrier(MPI_COMM_WORLD);
        for (long it = 0; it < warmup + timed; it++) {
            if (it == warmup)
                start = MPI_Wtime();
            if (rank == 0) {
                MPI_Send(sbuf, (int)size, MPI_CHAR, peer, 1, MPI_COMM_WORLD);
                MPI_Recv(rbuf, (int)size, MPI_CHAR, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(rbuf, (int)size, MPI_CHAR, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(sbuf, (int)size, MPI_CHAR, peer, 1, MPI_COMM_WORLD);
            }
        }
        double elapsed = MPI_Wtime() - start;
        if (rank == 0) {
            printf("%ld %.3f\n", size, elapsed * 1e6 / (2.0 * (double)timed));
            fflush(stdout);
        }
    }
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return 0;
}
