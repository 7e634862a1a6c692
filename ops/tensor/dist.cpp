// A process group over libtorch's c10d (include/ebb/dist.h): a TCPStore
// rendezvous served by rank 0, then Gloo's connections between every pair of
// ranks, or, for tensors on a CUDA device, NCCL's communicator. The same
// source builds against libtorch 1.13, where ProcessGroupGloo is a
// ProcessGroup, and 2.x, where it and ProcessGroupNCCL are Backends: the
// calls used here are the same in all of them.
#include <chrono>
#include <cmath>
#include <memory>
#include <cstdlib>
#include <thread>
#include <string>
#include <vector>

#include <netdb.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ebb/dist.h"
#include "internal.h"
#include "shim.hpp"

#ifdef USE_C10D_GLOO
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
// NCCL where libtorch has it (its CUDA build defines USE_C10D_NCCL) and
// CMake found NCCL's header (EBB_NCCL_HEADER)
#if defined(EBB_WITH_CUDA) && defined(USE_C10D_NCCL) && defined(EBB_NCCL_HEADER)
#define EBB_HAS_NCCL 1
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#if TORCH_VERSION_MAJOR >= 2
using backend_t = c10d::Backend;
#else
using backend_t = c10d::ProcessGroup;
#endif
#endif

struct ebb_dist {
    int rank, world;
    ebb_device device; // where the collectives' tensors are: the CPU (Gloo) or a GPU (NCCL)
    std::chrono::milliseconds timeout;
    std::string where; // "rank R of W": every message says which process it is
    bool failed = false; // a collective failed: NCCL's communicator is aborted, not shut down
#ifdef USE_C10D_GLOO
    c10::intrusive_ptr<c10d::Store> store;
    c10::intrusive_ptr<backend_t> pg;
#endif
};

namespace {

// What a c10d or Gloo failure becomes: EBB_ERR_DIST naming the call, the
// rank and, when given, the stage it failed at. gloo::IoException (a lost
// peer) is a std::exception, not a c10::Error.
ebb_status dist_failure(const char *fn, ebb_dist *d, const std::string &stage = "") {
    d->failed = true;
    std::string what;
    ebb_status st = EBB_ERR_DIST;
    try {
        throw;
    } catch (const std::bad_alloc &) {
        st = EBB_ERR_NOMEM;
        what = "out of memory";
    } catch (const c10::Error &e) {
        what = e.what_without_backtrace();
    } catch (const std::exception &e) {
        what = e.what();
    } catch (...) {
        what = "unknown C++ exception";
    }
    return ebb_error_set(st, "%s (%s): %s%s%s", fn, d->where.c_str(), stage.c_str(),
                         stage.empty() ? "" : ": ", what.c_str());
}

#ifdef USE_C10D_GLOO
// Waits for a collective, then for Gloo's worker thread to let go of it: the
// work holds its tensors, and the worker drops its reference a moment after
// wait() returns. Until then a tensor the plan frees would stay allocated,
// and the bytes would show in a later step's measure. Bounded: after
// 200,000 yields the work is left to the worker. NCCL's watchdog holds its
// works until its next poll (100 ms apart): not waited for.
template <class Work> void finish(Work &&work, const ebb_dist *d) {
    work->wait(d->timeout);
    for (int spin = 0; d->device.type == EBB_DEVICE_CPU && spin < 200000 && work.use_count() > 1;
         spin++)
        std::this_thread::yield();
    work.reset();
}
#endif

// This machine's address on its route to the master: what Gloo binds to and
// tells the other ranks, who reach it there. The master's own address would
// do only on the master's machine (a rank elsewhere cannot bind to it). A
// UDP socket "connected" to the master sends nothing; the kernel picks the
// route and so the local address. The master's address itself when that
// fails (no route yet: the rendezvous then names the problem).
std::string local_address_towards(const char *master, int port) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    std::string out = master;
    if (getaddrinfo(master, std::to_string(port).c_str(), &hints, &res) != 0) return out;
    for (addrinfo *r = res; r; r = r->ai_next) {
        int fd = socket(r->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        sockaddr_storage me{};
        socklen_t len = sizeof me;
        char host[NI_MAXHOST];
        bool found = connect(fd, r->ai_addr, r->ai_addrlen) == 0 &&
                     getsockname(fd, reinterpret_cast<sockaddr *>(&me), &len) == 0 &&
                     getnameinfo(reinterpret_cast<sockaddr *>(&me), len, host, sizeof host,
                                 nullptr, 0, NI_NUMERICHOST) == 0;
        close(fd);
        if (found) {
            out = host;
            break;
        }
    }
    freeaddrinfo(res);
    return out;
}

#ifdef USE_C10D_GLOO
std::vector<uint8_t> bytes_of(const std::string &s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// Every rank checks in at the store before Gloo or NCCL connects, within
// what is left of the timeout (Gloo's own connect does not keep to it):
// - the job: rank 0 writes its job id, and every other rank compares its
//   own, so a rank of another job on the same port is refused by name;
// - the rank: each rank number is claimed once, so two processes given the
//   same RANK (or two hand-started jobs on one port) cannot both join;
// - the world: the last rank to arrive lets every rank on; a rank that
//   waits past the deadline says how many came.
// Throws std::runtime_error with the reason.
void check_in(ebb_dist *d, const std::string &job, std::chrono::steady_clock::time_point end) {
    using namespace std::chrono;
    c10d::Store &store = *d->store;
    auto left = [end]() {
        auto ms = duration_cast<milliseconds>(end - steady_clock::now());
        return ms.count() > 1 ? ms : milliseconds(1);
    };
    if (d->rank == 0) {
        store.set("ebb/job", bytes_of(job));
    } else {
        store.wait({"ebb/job"}, left());
        std::vector<uint8_t> got = store.get("ebb/job");
        std::string theirs(got.begin(), got.end());
        if (theirs != job)
            throw std::runtime_error(
                "its rank 0 runs job '" + theirs + "', and this rank belongs to job '" + job +
                "' (two jobs on one port? each job needs a MASTER_PORT of its own; the job is "
                "EBB_JOB_ID, or torchrun's run id)");
    }
    if (store.add("ebb/rank/" + std::to_string(d->rank), 1) != 1)
        throw std::runtime_error("another process has already joined as rank " +
                                 std::to_string(d->rank) + " (two processes given the same RANK, "
                                 "or two jobs on one port)");
    if (store.add("ebb/arrived", 1) == d->world)
        store.set("ebb/all", bytes_of("1"));
    try {
        store.wait({"ebb/all"}, left());
    } catch (const std::exception &) {
        // how many came, unless rank 0 gave up first and took the store
        std::string came = "not all " + std::to_string(d->world);
        try {
            came = std::to_string(store.add("ebb/arrived", 0)) + " of " +
                   std::to_string(d->world);
        } catch (const std::exception &) {
        }
        throw std::runtime_error(came + " ranks came within " +
                                 std::to_string(d->timeout.count()) + " ms");
    }
}
#endif

bool parse_int(const char *s, long lo, long hi, long *out) {
    if (!s || !*s) return false;
    char *end = nullptr;
    long v = std::strtol(s, &end, 10);
    if (*end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

} // namespace

ebb_status ebb_dist_options_from_env(ebb_dist_options *o) {
    const char *fn = "ebb_dist_options_from_env";
    EBB_NEED(fn, o);
    struct {
        const char *name;
        long lo, hi;
        bool required;
    } vars[] = {{"WORLD_SIZE", 1, EBB_DIST_MAX_WORLD, true},
                {"RANK", 0, EBB_DIST_MAX_WORLD - 1, true},
                {"MASTER_PORT", 1, 65535, true},
                {"EBB_DIST_TIMEOUT_MS", 1, 24L * 3600 * 1000, false}};
    long v[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; i++) {
        const char *s = std::getenv(vars[i].name);
        if (!s && !vars[i].required) continue;
        if (!s)
            return ebb_error_set(EBB_ERR_ARG, "%s: %s is not set (torchrun sets RANK, WORLD_SIZE, "
                                 "MASTER_ADDR and MASTER_PORT)", fn, vars[i].name);
        if (!parse_int(s, vars[i].lo, vars[i].hi, &v[i]))
            return ebb_error_set(EBB_ERR_ARG, "%s: %s is '%.64s'; expected a whole number from "
                                 "%ld to %ld", fn, vars[i].name, s, vars[i].lo, vars[i].hi);
    }
    if (v[1] >= v[0])
        return ebb_error_set(EBB_ERR_ARG, "%s: RANK %ld is not below WORLD_SIZE %ld", fn, v[1],
                             v[0]);
    const char *addr = std::getenv("MASTER_ADDR");
    const char *job = std::getenv("EBB_JOB_ID");
    if (!job || !*job)
        job = std::getenv("TORCHELASTIC_RUN_ID");
    ebb_device device = o->device;
    *o = ebb_dist_options{};
    o->rank = (int)v[1];
    o->world_size = (int)v[0];
    o->master_addr = addr && *addr ? addr : nullptr;
    o->master_port = (int)v[2];
    o->timeout_ms = (int)v[3];
    o->device = device;
    o->job_id = job && *job ? job : nullptr;
    return EBB_OK;
}

ebb_status ebb_dist_open(ebb_dist **out, const ebb_dist_options *o) {
    const char *fn = "ebb_dist_open";
    EBB_OUT(fn, out);
    EBB_NEED(fn, o);
    if (o->world_size < 1 || o->rank < 0 || o->rank >= o->world_size)
        return ebb_error_set(EBB_ERR_ARG, "%s: rank %d of world_size %d; a rank is 0 to "
                             "world_size - 1", fn, o->rank, o->world_size);
    if (o->world_size > EBB_DIST_MAX_WORLD)
        return ebb_error_set(EBB_ERR_ARG, "%s: world_size %d; a group has at most %d ranks", fn,
                             o->world_size, EBB_DIST_MAX_WORLD);
    /* Gloo meets every other rank over a socket of its own (and the store
     * holds one per rank on rank 0): a group the descriptors cannot hold
     * would fail deep inside its connect, long after the timeout */
    struct rlimit nofile;
    long need = 2L * o->world_size + 64;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY &&
        (long)nofile.rlim_cur < need)
        return ebb_error_set(EBB_ERR_ARG, "%s: world_size %d needs about %ld file descriptors, "
                             "and this process may open %ld (ulimit -n)", fn, o->world_size,
                             need, (long)nofile.rlim_cur);
    if (o->master_port < 1 || o->master_port > 65535)
        return ebb_error_set(EBB_ERR_ARG, "%s: master_port %d is not a port (1 to 65535)", fn,
                             o->master_port);
    if (o->timeout_ms < 0)
        return ebb_error_set(EBB_ERR_ARG, "%s: timeout_ms %d is negative", fn, o->timeout_ms);
    bool cuda = o->device.type == EBB_DEVICE_CUDA;
    if (o->device.type != EBB_DEVICE_CPU && !cuda)
        return ebb_error_set(EBB_ERR_ARG, "%s: device type %d is neither the CPU nor CUDA", fn,
                             (int)o->device.type);
    if (cuda) {
#ifndef EBB_HAS_NCCL
        return ebb_error_set(EBB_ERR_UNSUPPORTED,
                             "%s: a group on cuda:%d needs NCCL, and this build has none (%s); "
                             "train on the CPU with Gloo",
                             fn, o->device.index,
                             ebb_cuda_available() ? "its libtorch has NCCL but CMake found no "
                                                    "nccl.h"
                                                  : "a libtorch without CUDA");
#else
        if (o->device.index < 0 || o->device.index >= ebb_cuda_device_count())
            return ebb_error_set(EBB_ERR_ARG, "%s: rank %d's device cuda:%d is not one of this "
                                 "machine's %d CUDA devices", fn, o->rank, o->device.index,
                                 ebb_cuda_device_count());
#endif
    }
#ifndef USE_C10D_GLOO
    return ebb_error_set(EBB_ERR_UNSUPPORTED, "%s: this libtorch was built without Gloo", fn);
#else
    const char *addr = o->master_addr ? o->master_addr : "127.0.0.1";
    ebb_dist *d = new (std::nothrow) ebb_dist;
    if (!d) return ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", fn);
    d->rank = o->rank;
    d->world = o->world_size;
    d->device = o->device;
    d->timeout = std::chrono::milliseconds(o->timeout_ms ? o->timeout_ms : 30000);
    d->where = "rank " + std::to_string(o->rank) + " of " + std::to_string(o->world_size);
    std::string step = "the rendezvous at " + std::string(addr) + ":" +
                       std::to_string(o->master_port);
    auto end = std::chrono::steady_clock::now() + d->timeout;
    try {
        c10d::TCPStoreOptions so;
        so.port = (uint16_t)o->master_port;
        so.isServer = o->rank == 0;
        so.numWorkers = (size_t)o->world_size;
        so.waitWorkers = false; // check_in counts the ranks, within the timeout
        so.timeout = d->timeout;
        d->store = c10::make_intrusive<c10d::TCPStore>(addr, so);
        check_in(d, o->job_id ? o->job_id : "", end);
        auto prefixed = c10::make_intrusive<c10d::PrefixStore>("ebb/0", d->store);
#ifdef EBB_HAS_NCCL
        if (cuda) {
            // NCCL's communicator, made now (not at the first collective)
            // so that a rank that never comes fails the open
            step = "NCCL's communicator on cuda:" + std::to_string(o->device.index);
            at::Device dev(at::kCUDA, (c10::DeviceIndex)o->device.index);
            c10::cuda::CUDAGuard guard(dev);
            auto no = c10d::ProcessGroupNCCL::Options::create();
            no->timeout = d->timeout;
            auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, o->rank,
                                                                    o->world_size, no);
            nccl->setBoundDeviceId(dev);
            nccl->eagerConnectSingleDevice(dev);
            d->pg = nccl;
            *out = d;
            return EBB_OK;
        }
#endif
        step = "connecting to the other ranks";
        auto po = c10d::ProcessGroupGloo::Options::create(d->timeout);
        // an interface named as PyTorch takes it, else the route to the master
        const char *ifname = std::getenv("GLOO_SOCKET_IFNAME");
        po->devices.push_back(
            ifname && *ifname
                ? c10d::ProcessGroupGloo::createDeviceForInterface(ifname)
                : c10d::ProcessGroupGloo::createDeviceForHostname(
                      local_address_towards(addr, o->master_port)));
        po->threads = 2;
        d->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, o->rank, o->world_size, po);
    } catch (...) {
        ebb_status st = dist_failure(fn, d, step);
        ebb_dist_free(d); // NCCL's half-made communicator aborted
        return st;
    }
    *out = d;
    return EBB_OK;
#endif
}

void ebb_dist_free(ebb_dist *d) {
    if (!d) return;
#ifdef EBB_HAS_NCCL
    // NCCL's communicator goes as torch.distributed.destroy_process_group
    // ends it; aborted after a failure, whose collectives may never finish
    if (d->pg && d->device.type == EBB_DEVICE_CUDA) {
        try {
            if (d->failed)
                d->pg->abort();
            else
                d->pg->shutdown();
        } catch (...) {
        }
    }
#endif
    delete d;
}

int ebb_dist_rank(const ebb_dist *d) { return d ? d->rank : -1; }
int ebb_dist_world_size(const ebb_dist *d) { return d ? d->world : 0; }
ebb_device ebb_dist_device(const ebb_dist *d) { return d ? d->device : ebb_device_cpu(); }

namespace {

// Whether `t` holds what an earlier tensor of `list` holds: one tensor for
// two gradients (lstm_cell's biases), which an average in place must take
// once.
bool repeated(const std::vector<at::Tensor> &list, const at::Tensor &t) {
    for (auto &u : list)
        if (u.data_ptr() == t.data_ptr() && u.numel() == t.numel() &&
            u.scalar_type() == t.scalar_type())
            return true;
    return false;
}

// The tensors a collective takes: non-NULL, contiguous, on the group's
// device; floating when `floating`. `once` (the averages in place): a
// tensor that holds nothing, or what an earlier one holds, is left out.
// `kept` (may be null) receives the indices of those taken.
ebb_status gather(const char *fn, const ebb_dist *d, ebb_tensor *const *ts, int n,
                  bool floating, std::vector<at::Tensor> &out, bool once = false,
                  std::vector<int> *kept = nullptr) {
    if (n < 0 || (n > 0 && !ts))
        return ebb_error_set(EBB_ERR_ARG, "%s: %d tensors at %p", fn, n, (const void *)ts);
    for (int i = 0; i < n; i++) {
        if (!ts[i]) continue;
        const at::Tensor &t = ts[i]->t;
        bool here = d->device.type == EBB_DEVICE_CUDA
                        ? t.is_cuda() && t.get_device() == d->device.index
                        : t.is_cpu();
        if (!here || !t.is_contiguous() || (floating && !at::isFloatingType(t.scalar_type()))) {
            char dev[32];
            return ebb_error_set(EBB_ERR_ARG, "%s: tensor %d is %s; the group's collectives "
                                 "take %scontiguous tensors on %s", fn, i,
                                 ebb::describe(t).c_str(), floating ? "floating, " : "",
                                 ebb_device_str(d->device, dev, sizeof dev));
        }
        if (once && (t.numel() == 0 || repeated(out, t))) continue;
        out.push_back(t);
        if (kept) kept->push_back(i);
    }
    return EBB_OK;
}

// A group of one has nothing to exchange, but NCCL's runs its collectives
// still (NCCL has a path of its own for one rank), so that a machine with
// one GPU runs the code that many do.
bool alone(const ebb_dist *d) { return d->world == 1 && d->device.type != EBB_DEVICE_CUDA; }

#ifdef USE_C10D_GLOO
// Runs `op` once per dtype on the tensors of that dtype laid end to end in
// one buffer (a DDP bucket holding them all): a collective per tensor costs
// a round trip each, which small layers cannot hide. A lone tensor of its
// dtype travels as it is. `op` returns whether the buffer changed, so that
// it is copied back.
// The indices of `list` grouped by dtype, each group in list order, the
// groups in the order their dtypes first appear (the same on every rank).
std::vector<std::vector<size_t>> dtype_groups(const std::vector<at::Tensor> &list) {
    std::vector<std::vector<size_t>> groups;
    std::vector<bool> done(list.size(), false);
    for (size_t i = 0; i < list.size(); i++) {
        if (done[i]) continue;
        groups.emplace_back();
        for (size_t j = i; j < list.size(); j++)
            if (!done[j] && list[j].scalar_type() == list[i].scalar_type()) {
                groups.back().push_back(j);
                done[j] = true;
            }
    }
    return groups;
}

template <class Op> void per_dtype(std::vector<at::Tensor> &list, Op op) {
    for (const auto &group : dtype_groups(list)) {
        std::vector<at::Tensor> same;
        for (size_t j : group) same.push_back(list[j].reshape({-1}));
        std::vector<at::Tensor> flat{same.size() == 1 ? same[0] : at::cat(same)};
        if (!op(flat) || same.size() == 1) continue;
        int64_t at = 0;
        for (auto &t : same) {
            t.copy_(flat[0].narrow(0, at, t.numel()));
            at += t.numel();
        }
    }
}
#endif

} // namespace

ebb_status ebb_dist_allreduce_mean_(ebb_dist *d, ebb_tensor *const *ts, int n) {
    const char *fn = "ebb_dist_allreduce_mean_";
    EBB_NEED(fn, d);
    std::vector<at::Tensor> list;
    ebb_status st = gather(fn, d, ts, n, true, list, true);
    if (st != EBB_OK || list.empty() || alone(d)) return st;
#ifdef USE_C10D_GLOO
    try {
        c10::InferenceMode guard;
        per_dtype(list, [d](std::vector<at::Tensor> &flat) {
            finish(d->pg->allreduce(flat), d);
            flat[0].div_(d->world);
            return true;
        });
    } catch (...) {
        return dist_failure(fn, d);
    }
#endif
    return EBB_OK;
}

#ifdef USE_C10D_GLOO
using gloo_work = decltype(std::declval<backend_t &>().allreduce(
    std::declval<std::vector<at::Tensor> &>()));

namespace {

// ZeRO's reduce-scatter of one dtype's tensors (flat views) and their
// owning ranks, in world - 1 rounds of pairwise exchange: in round k this
// rank sends rank me + k the tensors it owns, laid end to end (a lone
// tensor as it is), receives its own from rank me - k into `recv`, one
// buffer the size of them, and adds them in. Each round is an all-to-all
// whose counts are zero but for one peer each way (Gloo still sends the
// others an empty message). The buffer
// holds one rank's share at a time, where a single all-to-all would hold
// world - 1 of them.
struct scatter {
    ebb_dist *d;
    std::vector<at::Tensor> list, mine;
    std::vector<int> owner;
    at::Tensor recv;
    int64_t own = 0;

    scatter(ebb_dist *dist, std::vector<at::Tensor> tensors, std::vector<int> owners)
        : d(dist), list(std::move(tensors)), owner(std::move(owners)) {
        for (size_t i = 0; i < list.size(); i++)
            if (owner[i] == d->rank) {
                mine.push_back(list[i]);
                own += list[i].numel();
            }
        recv = at::empty({own}, list[0].options());
    }
    // what round k sends: *laid when the tensors were laid end to end
    at::Tensor outgoing(int k, bool *laid = nullptr) const {
        const int to = (d->rank + k) % d->world;
        std::vector<at::Tensor> parts;
        for (size_t i = 0; i < list.size(); i++)
            if (owner[i] == to) parts.push_back(list[i]);
        if (laid) *laid = parts.size() > 1;
        return parts.empty() ? at::empty({0}, list[0].options())
               : parts.size() == 1 ? parts[0]
                                   : at::cat(parts);
    }
    gloo_work start(int k, at::Tensor &send) {
        std::vector<int64_t> send_counts(d->world, 0), recv_counts(d->world, 0);
        send_counts[(d->rank + k) % d->world] = send.numel();
        recv_counts[(d->rank - k + d->world) % d->world] = own;
        return d->pg->alltoall_base(recv, send, recv_counts, send_counts);
    }
    void add() {
        int64_t at = 0;
        for (auto &t : mine) {
            t.add_(recv.narrow(0, at, t.numel()));
            at += t.numel();
        }
    }
    // rounds first .. world - 1, each waited for, then the mean
    void finish_from(int first) {
        for (int k = first; k < d->world; k++) {
            at::Tensor send = outgoing(k);
            finish(start(k, send), d);
            add();
        }
        for (auto &t : mine) t.div_(d->world);
    }
};

} // namespace
#endif

// A reduce-scatter's arguments: what gather() takes, and each tensor's
// owner a rank of the group; `owners` receives those of the non-NULL ones.
static ebb_status scatter_args(const char *fn, const ebb_dist *d, ebb_tensor *const *ts,
                               const int *owner, int n, std::vector<at::Tensor> &list,
                               std::vector<int> &owners) {
    if (n > 0 && !owner)
        return ebb_error_set(EBB_ERR_ARG, "%s: %d tensors and no owners", fn, n);
    for (int i = 0; i < n; i++)
        if (ts && ts[i] && (owner[i] < 0 || owner[i] >= d->world))
            return ebb_error_set(EBB_ERR_ARG, "%s (%s): tensor %d's owner is rank %d, not one "
                                 "of the group's %d", fn, d->where.c_str(), i, owner[i], d->world);
    std::vector<int> kept;
    ebb_status st = gather(fn, d, ts, n, true, list, true, &kept);
    for (int i : kept) owners.push_back(owner[i]);
    return st;
}

ebb_status ebb_dist_reduce_scatter_mean_(ebb_dist *d, ebb_tensor *const *ts, const int *owner,
                                         int n) {
    const char *fn = "ebb_dist_reduce_scatter_mean_";
    EBB_NEED(fn, d);
    std::vector<at::Tensor> list;
    std::vector<int> owners;
    ebb_status st = scatter_args(fn, d, ts, owner, n, list, owners);
    if (st != EBB_OK || list.empty() || alone(d)) return st;
#ifdef USE_C10D_GLOO
    try {
        c10::InferenceMode guard;
        for (const auto &group : dtype_groups(list)) {
            std::vector<at::Tensor> same;
            std::vector<int> same_owner;
            for (size_t j : group) {
                same.push_back(list[j].view({-1}));
                same_owner.push_back(owners[j]);
            }
            scatter(d, std::move(same), std::move(same_owner)).finish_from(1);
        }
    } catch (...) {
        return dist_failure(fn, d);
    }
#endif
    return EBB_OK;
}

ebb_status ebb_dist_sum(ebb_dist *d, double *values, int n) {
    const char *fn = "ebb_dist_sum";
    EBB_NEED(fn, d);
    if (n < 0 || (n > 0 && !values))
        return ebb_error_set(EBB_ERR_ARG, "%s: %d values at %p", fn, n, (const void *)values);
    if (n == 0 || alone(d)) return EBB_OK;
#ifdef USE_C10D_GLOO
    try {
        c10::InferenceMode guard;
        at::Tensor host = at::from_blob(values, {n}, at::kDouble);
        std::vector<at::Tensor> t{at::empty({n}, host.options().device(ebb::to_aten(d->device)))};
        t[0].copy_(host);
        finish(d->pg->allreduce(t), d);
        if (t[0].is_cpu())
            host.copy_(t[0]);
        else
            host.copy_(t[0].cpu());
    } catch (...) {
        return dist_failure(fn, d);
    }
#endif
    return EBB_OK;
}

ebb_status ebb_dist_clip_grad_norm_(ebb_dist *d, ebb_tensor *const *grads, int n,
                                    double max_norm, double *total_norm) {
    const char *fn = "ebb_dist_clip_grad_norm_";
    EBB_NEED(fn, d);
    if (total_norm) *total_norm = 0;
    const at::Tensor *first = nullptr;
    ebb_status st = ebb::clip_grad_norm_check(fn, grads, n, max_norm, &first);
    // this rank's squared norm, read back (the one-element total freed
    // first), then summed over the ranks. A rank that failed here still
    // takes part, with a NaN, so that the others are not left waiting.
    double sq = 0;
    try {
        c10::InferenceMode guard;
        if (st == EBB_OK && first) {
            double v = ebb::grad_norm(grads, n).item<double>();
            sq = v * v;
        }
    } catch (...) {
        st = ebb::fail_from_exception(fn);
    }
    if (st != EBB_OK) {
        std::string why = ebb_errmsg();
        sq = NAN;
        ebb_dist_sum(d, &sq, 1);
        return ebb_error_set(st, "%s", why.c_str());
    }
    st = ebb_dist_sum(d, &sq, 1);
    if (st != EBB_OK) return ebb_error_prefix("%s", fn);
    double total = std::sqrt(sq);
    if (total_norm) *total_norm = total;
    if (!first) return EBB_OK;
    try {
        c10::InferenceMode guard;
        at::Tensor factor = at::full({}, ebb::clip_factor(total, first->scalar_type(), max_norm),
                                     first->options());
        for (int i = 0; i < n; i++)
            if (grads[i] && !ebb::repeated_grad(grads, i)) grads[i]->t.mul_(factor);
    } catch (...) {
        return ebb::fail_from_exception(fn);
    }
    return EBB_OK;
}

struct ebb_dist_work {
    ebb_dist *d;
    std::vector<at::Tensor> parts; // the tensors, flattened (views of the caller's)
    std::vector<at::Tensor> flat;  // what travels: the buffer, or the lone tensor
#ifdef USE_C10D_GLOO
    gloo_work work;
    std::unique_ptr<scatter> sc; // a reduce-scatter's, its first round under way
    at::Tensor sent;             // what that round sends
#endif
};

ebb_status ebb_dist_allreduce_mean_start(ebb_dist *d, ebb_tensor *const *ts, int n,
                                         ebb_tensor **flat, ebb_dist_work **out) {
    const char *fn = "ebb_dist_allreduce_mean_start";
    EBB_OUT(fn, flat);
    EBB_OUT(fn, out);
    EBB_NEED(fn, d);
    std::vector<at::Tensor> list;
    ebb_status st = gather(fn, d, ts, n, true, list, true);
    if (st != EBB_OK) return st;
    for (auto &t : list)
        if (t.scalar_type() != list[0].scalar_type())
            return ebb_error_set(EBB_ERR_ARG, "%s: tensors of %s and %s; a started all-reduce "
                                 "takes one dtype", fn, ebb::describe(list[0]).c_str(),
                                 ebb::describe(t).c_str());
    ebb_dist_work *w = new (std::nothrow) ebb_dist_work;
    if (!w) return ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", fn);
    w->d = d;
    try {
        c10::InferenceMode guard;
        for (auto &t : list) w->parts.push_back(t.reshape({-1}));
        if (!w->parts.empty())
            w->flat.push_back(w->parts.size() == 1 ? w->parts[0] : at::cat(w->parts));
#ifdef USE_C10D_GLOO
        if (!w->flat.empty() && !alone(d)) w->work = d->pg->allreduce(w->flat);
#endif
        if (w->parts.size() > 1) *flat = ebb::wrap(w->flat[0]);
    } catch (...) {
        delete w;
        return dist_failure(fn, d);
    }
    *out = w;
    return EBB_OK;
}

ebb_status ebb_dist_reduce_scatter_mean_start(ebb_dist *d, ebb_tensor *const *ts,
                                              const int *owner, int n, ebb_tensor **sent,
                                              ebb_tensor **recv, ebb_dist_work **out) {
    const char *fn = "ebb_dist_reduce_scatter_mean_start";
    EBB_OUT(fn, sent);
    EBB_OUT(fn, recv);
    EBB_OUT(fn, out);
    EBB_NEED(fn, d);
    std::vector<at::Tensor> list;
    std::vector<int> owners;
    ebb_status st = scatter_args(fn, d, ts, owner, n, list, owners);
    if (st != EBB_OK) return st;
    for (auto &t : list)
        if (t.scalar_type() != list[0].scalar_type())
            return ebb_error_set(EBB_ERR_ARG, "%s: tensors of %s and %s; a started "
                                 "reduce-scatter takes one dtype", fn,
                                 ebb::describe(list[0]).c_str(), ebb::describe(t).c_str());
    ebb_dist_work *w = new (std::nothrow) ebb_dist_work;
    if (!w) return ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", fn);
    w->d = d;
#ifdef USE_C10D_GLOO
    if (!list.empty() && d->world > 1) { // a group of one holds the means already
        try {
            c10::InferenceMode guard;
            for (auto &t : list) t = t.view({-1});
            w->sc.reset(new scatter(d, std::move(list), std::move(owners)));
            bool laid = false;
            w->sent = w->sc->outgoing(1, &laid);
            if (laid) *sent = ebb::wrap(w->sent);
            if (!w->sc->mine.empty()) *recv = ebb::wrap(w->sc->recv);
            w->work = w->sc->start(1, w->sent); // last: nothing under way if anything threw
        } catch (...) {
            ebb_tensor_free(*sent);
            ebb_tensor_free(*recv);
            *sent = *recv = nullptr;
            delete w;
            return dist_failure(fn, d);
        }
    }
#endif
    *out = w;
    return EBB_OK;
}

ebb_status ebb_dist_work_finish(ebb_dist_work *w) {
    const char *fn = "ebb_dist_work_finish";
    if (!w) return EBB_OK;
    ebb_status st = EBB_OK;
    try {
        c10::InferenceMode guard;
#ifdef USE_C10D_GLOO
        if (w->work) finish(std::move(w->work), w->d);
        if (w->sc) { // a reduce-scatter: its first round in, then the others
            w->sent.reset();
            w->sc->add();
            w->sc->finish_from(2);
        }
#endif
        if (!w->flat.empty() && !alone(w->d)) {
            w->flat[0].div_(w->d->world);
            int64_t at = 0;
            for (size_t i = 0; w->parts.size() > 1 && i < w->parts.size(); i++) {
                w->parts[i].copy_(w->flat[0].narrow(0, at, w->parts[i].numel()));
                at += w->parts[i].numel();
            }
        }
    } catch (...) {
        st = dist_failure(fn, w->d);
    }
    delete w;
    return st;
}

ebb_status ebb_dist_broadcast_(ebb_dist *d, ebb_tensor *const *ts, int n, int root) {
    const char *fn = "ebb_dist_broadcast_";
    EBB_NEED(fn, d);
    if (root < 0 || root >= d->world)
        return ebb_error_set(EBB_ERR_ARG, "%s: root %d is not a rank of %d", fn, root, d->world);
    std::vector<at::Tensor> list;
    ebb_status st = gather(fn, d, ts, n, false, list);
    if (st != EBB_OK || list.empty() || alone(d)) return st;
#ifdef USE_C10D_GLOO
    try {
        c10::InferenceMode guard;
        per_dtype(list, [d, root](std::vector<at::Tensor> &flat) {
            c10d::BroadcastOptions bo;
            bo.rootRank = root;
            finish(d->pg->broadcast(flat, bo), d);
            return d->rank != root; // the root's own tensors hold what it sent
        });
    } catch (...) {
        return dist_failure(fn, d);
    }
#endif
    return EBB_OK;
}

// One side of a point-to-point transfer: send (to `peer`) or receive (from it).
static ebb_status p2p(const char *fn, ebb_dist *d, ebb_tensor *const *ts, int n, int peer,
                      bool sending) {
    EBB_NEED(fn, d);
    if (peer < 0 || peer >= d->world || peer == d->rank)
        return ebb_error_set(EBB_ERR_ARG, "%s (%s): rank %d is not another rank of %d", fn,
                             d->where.c_str(), peer, d->world);
    std::vector<at::Tensor> list;
    ebb_status st = gather(fn, d, ts, n, false, list);
    if (st != EBB_OK || list.empty()) return st;
#ifdef USE_C10D_GLOO
    try {
        c10::InferenceMode guard;
        per_dtype(list, [d, peer, sending](std::vector<at::Tensor> &flat) {
            if (sending)
                finish(d->pg->send(flat, peer, 0), d);
            else
                finish(d->pg->recv(flat, peer, 0), d);
            return !sending;
        });
    } catch (...) {
        return dist_failure(fn, d, sending ? "sending to rank " + std::to_string(peer)
                                                  : "receiving from rank " + std::to_string(peer));
    }
#endif
    return EBB_OK;
}

ebb_status ebb_dist_send(ebb_dist *d, ebb_tensor *const *ts, int n, int dst) {
    return p2p("ebb_dist_send", d, ts, n, dst, true);
}

ebb_status ebb_dist_recv_(ebb_dist *d, ebb_tensor *const *ts, int n, int src) {
    return p2p("ebb_dist_recv_", d, ts, n, src, false);
}

ebb_status ebb_dist_barrier(ebb_dist *d) {
    const char *fn = "ebb_dist_barrier";
    EBB_NEED(fn, d);
    if (alone(d)) return EBB_OK;
#ifdef USE_C10D_GLOO
    try {
        finish(d->pg->barrier(), d);
    } catch (...) {
        return dist_failure(fn, d);
    }
#endif
    return EBB_OK;
}
