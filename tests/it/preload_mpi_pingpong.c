#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/*
 * An MPI ping-pong for the preload library's test: every message checked,
 * 1 B to 1 MiB; first an exchange where both ranks send at once, so each
 * opens a connection to the other at the same time (Open MPI's tcp BTL
 * then keeps one). Prints "verified round trips: N bad: B" on rank 0 and
 * exits non-zero if any message differed. Across hosts, the two hosts'
 * relays then open their link from both sides at once.
 */
int main(int argc, char **argv) {
    int rank, n;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int peer = 1 - rank;
    long iters = argc > 1 ? atol(argv[1]) : 1000;
    static const long sizes[] = {1, 1024, 65536, 1048576};
    char *s = malloc(1048576), *r = malloc(1048576);
    long bad = 0, ok = 0;
    MPI_Request rq[2];
    int mine = rank + 100, theirs = -1;
    MPI_Irecv(&theirs, 1, MPI_INT, peer, 7, MPI_COMM_WORLD, &rq[0]);
    MPI_Isend(&mine, 1, MPI_INT, peer, 7, MPI_COMM_WORLD, &rq[1]);
    MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
    if (theirs != peer + 100) bad++;
    for (int k = 0; k < 4; k++) {
        long size = sizes[k];
        long it = size >= 65536 ? iters / 10 + 1 : iters;
        for (long i = 0; i < it; i++) {
            if (rank == 0) {
                for (long j = 0; j < size; j++) s[j] = (char)(j * 7 + i + k);
                MPI_Send(s, size, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
                MPI_Recv(r, size, MPI_CHAR, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                for (long j = 0; j < size; j++) if (r[j] != (char)(j * 7 + i + k + 1)) { bad++; break; }
                ok++;
            } else {
                MPI_Recv(r, size, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                for (long j = 0; j < size; j++) if (r[j] != (char)(j * 7 + i + k)) { bad++; break; }
                for (long j = 0; j < size; j++) s[j] = (char)(r[j] + 1);
                MPI_Send(s, size, MPI_CHAR, 0, 2, MPI_COMM_WORLD);
            }
        }
    }
    long all_bad = 0;
    MPI_Reduce(&bad, &all_bad, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("verified round trips: %ld bad: %ld\n", ok, all_bad);
    MPI_Finalize();
    return all_bad != 0;
}
