/*
 * ebb/dist.h - processes that train together: a process group over
 * libtorch's c10d (a TCPStore rendezvous, Gloo's collectives on the CPU,
 * NCCL's on CUDA devices).
 *
 *     ebb_dist_options o = {0};
 *     if (ebb_dist_options_from_env(&o) != EBB_OK) ...     // torchrun's RANK, WORLD_SIZE, ...
 *     ebb_dist *d = NULL;
 *     if (ebb_dist_open(&d, &o) != EBB_OK) ... ebb_errmsg() ...
 *     ebb_dist_broadcast_(d, params, n, 0);                // every rank starts from rank 0's weights
 *     for (...) {
 *         ... gradients of this rank's share of the batch ...
 *         ebb_dist_allreduce_mean_(d, grads, n);            // every rank now holds the mean
 *         ... the same update on every rank ...
 *     }
 *     ebb_dist_free(d);
 *
 * Rank 0 serves the rendezvous at master_addr:master_port; the others
 * connect to it. Each collective blocks until every rank has joined it, so
 * every rank must call the same collectives in the same order, with tensors
 * of the same shapes and dtype, contiguous, on the group's device: the CPU,
 * or with ebb_dist_options.device a CUDA device per rank (NCCL: one rank a
 * GPU, as NCCL refuses two ranks on one device).
 *
 * Failures are EBB_ERR_DIST and say which rank this is and what happened:
 * a rank that exits or is killed makes the others' next collective fail at
 * once (its connections close); one that hangs makes it fail after
 * timeout_ms; a rendezvous that not every rank reaches fails after
 * timeout_ms too. After such a failure the group is unusable: free it. A
 * group is for one thread at a time.
 */
#ifndef EBB_DIST_H
#define EBB_DIST_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ebb_dist ebb_dist;

/* The most ranks a group takes (a full mesh of sockets: each rank also
 * needs about 2 descriptors per rank, which ebb_dist_new() checks against
 * RLIMIT_NOFILE). */
#define EBB_DIST_MAX_WORLD 4096

typedef struct ebb_dist_options {
    int rank;                /* this process, 0 .. world_size - 1 */
    int world_size;          /* processes in the group, 1 .. EBB_DIST_MAX_WORLD */
    const char *master_addr; /* rank 0's address (IPv4 or a host name); NULL: 127.0.0.1 */
    int master_port;         /* rank 0's rendezvous port, 1 .. 65535 */
    int timeout_ms;          /* rendezvous and every collective; 0: 30000 */
    ebb_device device;       /* the collectives' tensors: the CPU (zero, Gloo) or this
                                rank's CUDA device (NCCL; in a CUDA build with NCCL) */
    const char *job_id;      /* the job this rank belongs to; every rank must give the same
                                (NULL: ""). A rank of another job is refused at the
                                rendezvous, so two jobs on one port never cross-join */
} ebb_dist_options;

/* Fills *o from the environment torchrun sets: RANK, WORLD_SIZE,
 * MASTER_ADDR (default 127.0.0.1) and MASTER_PORT; timeout_ms from
 * EBB_DIST_TIMEOUT_MS when set; job_id from EBB_JOB_ID (which `ebb train
 * --nproc` sets), else torchrun's TORCHELASTIC_RUN_ID, else NULL (the
 * pointer is into the environment); o->device is left as it is (torchrun's
 * LOCAL_RANK is the GPU a rank usually takes). EBB_ERR_ARG naming the
 * variable that is missing or not a number in range; *o is then unchanged. */
EBB_API ebb_status ebb_dist_options_from_env(ebb_dist_options *o);

/* Joins the group: the rendezvous, then Gloo's connections to every other
 * rank, which reach this one at its address on the route to master_addr
 * (or, when GLOO_SOCKET_IFNAME names an interface, as PyTorch takes it, at
 * that interface's); on a CUDA device, NCCL's communicator instead, made
 * before the call returns. Before any connection is made, every rank
 * checks in at the rendezvous: its job_id must be rank 0's, its rank not
 * already taken, and all world_size ranks must come. Blocks until every
 * rank has joined, or timeout_ms. On success *out is a new group (free it
 * with ebb_dist_free). EBB_ERR_ARG for options out of range or a CUDA
 * device this machine does not have; EBB_ERR_DIST when the rendezvous fails
 * (the message names the address and port, and the rank, and says how many
 * ranks came, or which job or rank was the stranger's); EBB_ERR_UNSUPPORTED in a build of
 * libtorch without Gloo, or for a CUDA device in a build without NCCL. */
EBB_API ebb_status ebb_dist_open(ebb_dist **out, const ebb_dist_options *o);
/* Leaves the group (NULL is allowed): NCCL's communicator is shut down, or
 * aborted when a collective of the group failed. */
EBB_API void ebb_dist_free(ebb_dist *d);

/* This process's rank in the group; -1 for NULL. */
EBB_API int ebb_dist_rank(const ebb_dist *d);
/* The number of ranks in the group; 0 for NULL. */
EBB_API int ebb_dist_world_size(const ebb_dist *d);
/* Where the group's collectives take their tensors (ebb_dist_options.device);
 * the CPU for NULL. */
EBB_API ebb_device ebb_dist_device(const ebb_dist *d);

/* Every rank's ts[i] becomes the mean over ranks of ts[i], in place: Gloo's
 * sum, then a division by the world size (the gradients of a data-parallel
 * step, as DDP averages them). ts[0..n) must be floating, contiguous and on
 * the group's device; NULL entries are skipped (every rank must skip the same ones),
 * and so are tensors with no element and those an earlier entry holds (one
 * tensor for two gradients is averaged once).
 * The tensors of one dtype travel together in one collective, laid end to
 * end in a buffer the size of them all (DDP's bucket), held for the call. 
 * EBB_ERR_DIST when a rank was lost or the collective timed out. */
EBB_API ebb_status ebb_dist_allreduce_mean_(ebb_dist *d, ebb_tensor *const *ts, int n);
/* ZeRO's reduce-scatter: each ts[i] has an owner, rank owner[i] (every rank
 * passes the same tensors' sizes and owners), and only the owner's ts[i]
 * becomes the mean over the ranks, in place; the other ranks' ts[i] are
 * left as they were. Per dtype, world - 1 rounds: in round k each rank
 * sends rank + k the tensors that rank owns, laid end to end (a lone tensor
 * as it is), and receives its own from rank - k into a buffer the size of
 * them, adding them in; then it divides. Each round is one all-to-all
 * (Gloo sends every other rank a message in it, empty but for the one
 * peer). Each rank sends (world - 1) / world of the bytes on average,
 * where an all-reduce sends twice that. Takes what
 * ebb_dist_allreduce_mean_() takes and fails as it does; EBB_ERR_ARG names
 * a tensor whose owner is not a rank. As for the mean, a tensor listed
 * twice (one tensor for two gradients; give both one owner) or holding no
 * element travels once or not at all. */
EBB_API ebb_status ebb_dist_reduce_scatter_mean_(ebb_dist *d, ebb_tensor *const *ts,
                                                 const int *owner, int n);
/* Every rank's values[0..n) (on the host) become their sum over the ranks,
 * in float64: flags and partial sums the ranks must agree on. They travel
 * as one float64 tensor of n elements on the group's device, held for the
 * call. */
EBB_API ebb_status ebb_dist_sum(ebb_dist *d, double *values, int n);
/* ebb_tensor_clip_grad_norm_() for gradients sharded over the ranks (ZeRO):
 * each rank passes the gradients it holds, grads[0..n) (NULL entries
 * skipped; none at all is allowed, the rank still takes part), and scales
 * them in place by the factor of the L2 norm of every rank's together: the
 * square root of the sum over the ranks of each rank's squared norm
 * (computed as ebb_tensor_clip_grad_norm_() computes it). *total_norm (may
 * be NULL) receives that norm on every rank. Every rank must call it.
 * Scratch: ebb_tensor_clip_grad_norm_()'s norms, then ebb_dist_sum()'s
 * one element, then the factor. */
EBB_API ebb_status ebb_dist_clip_grad_norm_(ebb_dist *d, ebb_tensor *const *grads, int n,
                                            double max_norm, double *total_norm);
/* An all-reduce or a reduce-scatter under way
 * (ebb_dist_allreduce_mean_start, ebb_dist_reduce_scatter_mean_start). */
typedef struct ebb_dist_work ebb_dist_work;
/* ebb_dist_allreduce_mean_() in two halves, so that the caller can go on
 * computing while the ranks exchange: this one starts it and returns. The
 * tensors must share one dtype, and must not be read or written until
 * ebb_dist_work_finish(). *flat receives a new handle on the buffer they
 * travel in, laid end to end (NULL when a lone tensor travels as it is),
 * for the caller to free after the finish; *out the work. On failure
 * nothing is under way and both are NULL. */
EBB_API ebb_status ebb_dist_allreduce_mean_start(ebb_dist *d, ebb_tensor *const *ts, int n,
                                                 ebb_tensor **flat, ebb_dist_work **out);
/* ebb_dist_reduce_scatter_mean_() in two halves, as
 * ebb_dist_allreduce_mean_start() halves the all-reduce: this one starts its
 * first round and returns; ebb_dist_work_finish() waits for it and runs the
 * others (with 2 ranks there are no others; a group of one has nothing to
 * do). The tensors must share one dtype, and must not be read or written
 * until then. *sent receives a new
 * handle on the buffer the first round sends, when it laid more than one
 * tensor end to end (else NULL), *recv one on the buffer this rank's own
 * arrive in (NULL when it owns none), for the caller to free after the
 * finish; *out the work. On failure nothing is under way and all three are
 * NULL. */
EBB_API ebb_status ebb_dist_reduce_scatter_mean_start(ebb_dist *d, ebb_tensor *const *ts,
                                                      const int *owner, int n, ebb_tensor **sent,
                                                      ebb_tensor **recv, ebb_dist_work **out);
/* Waits for the work, then each of its tensors holds the mean over the
 * ranks (a reduce-scatter's: the owner's); frees w (NULL: nothing to do).
 * EBB_ERR_DIST when a rank was lost or it timed out (w is freed then
 * too). */
EBB_API ebb_status ebb_dist_work_finish(ebb_dist_work *w);

/* Every rank's ts[i] becomes rank `root`'s, in place. As for the mean, the
 * tensors of one dtype travel together in one buffer the size of them all
 * (ZeRO-1's broadcast steps count it). */
EBB_API ebb_status ebb_dist_broadcast_(ebb_dist *d, ebb_tensor *const *ts, int n, int root);
/* Point to point: sends ts[0..n) to rank `dst`, which takes them with
 * ebb_dist_recv_() into tensors of the same dtypes and sizes, in order
 * (laid end to end per dtype, as the collectives do). Returns when the
 * tensors were sent; fails as a collective does. */
EBB_API ebb_status ebb_dist_send(ebb_dist *d, ebb_tensor *const *ts, int n, int dst);
/* ts[0..n) become, in place, what rank `src` sent with ebb_dist_send(). */
EBB_API ebb_status ebb_dist_recv_(ebb_dist *d, ebb_tensor *const *ts, int n, int src);
/* Returns when every rank has called it (or fails as a collective does). */
EBB_API ebb_status ebb_dist_barrier(ebb_dist *d);

#ifdef __cplusplus
}
#endif
#endif /* EBB_DIST_H */
