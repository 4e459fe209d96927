/* tcp_matrix.h — a compact correctness matrix that any rank program can run, whatever
 * started it (the local launcher in test_tcp.c, a network namespace in net_rank.c). */
#ifndef COLL_TEST_TCP_MATRIX_H
#define COLL_TEST_TCP_MATRIX_H
#include <stdbool.h>
#include "coll.h"

/* Runs every collective (all-reduce, reduce-scatter, all-gather, broadcast, reduce,
 * sendrecv, all-to-all, all-to-allv, gather, scatter, grouped send/recv to both ring
 * neighbours) × dtype × op × in-place/out-of-place × counts {0, 1, N-1, odd, just over a
 * FIFO slot} × roots {0, N-1} on `comm`, and with `big` also ~1 MiB counts.
 * Checks every output element against an independently computed value; prints the first
 * failures to stderr and returns their count (0: all correct). */
int tm_run(coll_comm_t comm, int rank, int n, bool big);

/* One call of the matrix, checked the same way: kind 0..TM_KINDS-1 is all_reduce,
 * reduce_scatter, all_gather, broadcast, reduce, sendrecv (to rank+1, from rank-1).
 * `a` and `b` must hold count*n elements of `d`.  Returns 0 when it was right. */
#define TM_KINDS 6
int tm_call(coll_comm_t comm, int rank, int n, int kind, coll_dtype d, coll_op op, bool in_place,
            size_t count, int root, uint64_t seed, uint8_t *a, uint8_t *b);
#endif
