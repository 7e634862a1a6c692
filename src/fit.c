/* Will the run fit? The plan knows its peak before anything runs; this file
 * asks the operating system what the process can still get, so that a run
 * that cannot fit is refused with both figures instead of failing half-way,
 * or worse, landing in an allocator that retries forever when mmap fails
 * (OpenBLAS's buffer allocator does, under an address-space limit). */
#define _GNU_SOURCE /* sched_getaffinity */

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "ebb/memory.h"
#include "ebb/run.h"
#include "model_internal.h"
#include "plan_internal.h"

#define MIB ((int64_t)1 << 20)

/* What the process maps besides tensor storage once ops run, measured on
 * libtorch 1.13 with Debian's OpenBLAS: about 128 MiB of BLAS buffers
 * whatever the thread count, and one stack per intra-op thread. It counts
 * fully against RLIMIT_AS and RLIMIT_DATA (address space) and bounds what
 * it adds to resident memory. */
#define RESERVE_FIXED (128 * MIB)

/* The threads libtorch runs ops on: as ebb_init, --threads or
 * ebb_set_num_threads set them, else what OMP_NUM_THREADS or the CPUs give. */
static int64_t intra_op_threads(void) {
    long n = ebb_tensor_num_threads();
    if (n > 0)
        return n;
    const char *env = getenv("OMP_NUM_THREADS");
    n = env ? strtol(env, NULL, 10) : 0;
    if (n > 0)
        return n;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

static int64_t thread_stack_bytes(void) {
    struct rlimit rl;
    /* glibc gives new threads RLIMIT_STACK, or 8 MiB when it is unlimited */
    if (getrlimit(RLIMIT_STACK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return 8 * MIB;
    int64_t s = (int64_t)rl.rlim_cur;
    return s < 64 * MIB ? s : 64 * MIB;
}

/* A "Key:   N kB" line of a /proc file, in bytes; -1 if absent. */
static int64_t proc_kb(const char *file, const char *key) {
    FILE *f = fopen(file, "re");
    if (!f)
        return -1;
    char line[256];
    size_t klen = strlen(key);
    int64_t v = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, klen) && line[klen] == ':') {
            v = strtoll(line + klen + 1, NULL, 10) * 1024;
            break;
        }
    fclose(f);
    return v;
}

/* One number from a cgroup file; -1 for "max", a missing file or a limit so
 * large it means none (cgroup v1 writes 2^63 rounded down to a page). */
static int64_t cgroup_number(const char *dir, const char *file) {
    char path[4352];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    char buf[64] = {0};
    int ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok || !strncmp(buf, "max", 3))
        return -1;
    long long v = strtoll(buf, NULL, 10);
    return v < 0 || v >= (1LL << 62) ? -1 : (int64_t)v;
}

/* A "key N" line of a cgroup memory.stat, or 0. */
static int64_t cgroup_stat(const char *dir, const char *key) {
    char path[4352];
    snprintf(path, sizeof path, "%s/memory.stat", dir);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    char line[256];
    size_t klen = strlen(key);
    int64_t v = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, klen) && line[klen] == ' ') {
            v = strtoll(line + klen + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* The memory cgroup's directory: the mount of the cgroup2 hierarchy (or the
 * v1 "memory" controller) joined with this process's path in it, minus the
 * part the mount's root already covers. 0 on success. */
static int cgroup_dir(char *dir, size_t size, int *v2, char *mount, size_t msize) {
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return -1;
    char line[4096], root[1024] = "", mnt[1024] = "";
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        /* id parent major:minor root mountpoint options... - fstype source superoptions */
        char r[1024], m[1024], fstype[64], super[1024];
        const char *dash = strstr(line, " - ");
        if (!dash || sscanf(line, "%*s %*s %*s %1023s %1023s", r, m) != 2 ||
            sscanf(dash + 3, "%63s %*s %1023s", fstype, super) != 2)
            continue;
        if (!strcmp(fstype, "cgroup2")) {
            *v2 = 1;
            found = 1;
        } else if (!strcmp(fstype, "cgroup")) {
            for (char *tok = strtok(super, ","); tok; tok = strtok(NULL, ","))
                if (!strcmp(tok, "memory"))
                    found = 1;
            *v2 = 0;
        }
        if (found) {
            snprintf(root, sizeof root, "%s", r);
            snprintf(mnt, sizeof mnt, "%s", m);
        }
    }
    fclose(f);
    if (!found)
        return -1;
    f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return -1;
    char path[2048] = "";
    while (fgets(line, sizeof line, f)) {
        /* v2: "0::/path"; v1: "N:memory,...:/path" */
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = '\0';
        const char *ctrl = c1 + 1, *p = c2 + 1;
        int match = *v2 ? !strncmp(line, "0:", 2) && !*ctrl : strstr(ctrl, "memory") != NULL;
        if (match) {
            snprintf(path, sizeof path, "%s", p);
            path[strcspn(path, "\n")] = '\0';
            break;
        }
    }
    fclose(f);
    const char *rel = path;
    size_t rlen = strlen(root);
    if (strcmp(root, "/") != 0 && !strncmp(path, root, rlen))
        rel += rlen;
    snprintf(dir, size, "%s%s", mnt, !strcmp(rel, "/") ? "" : rel);
    snprintf(mount, msize, "%s", mnt);
    return 0;
}

/* What the memory cgroup (and every ancestor up to the mount) still lets
 * the process get: limit minus usage, with the reclaimable page cache
 * counted as free; -1 if no limit applies. */
static int64_t cgroup_available(void) {
    char dir[4096], mount[1024];
    int v2 = 0;
    if (cgroup_dir(dir, sizeof dir, &v2, mount, sizeof mount) != 0)
        return -1;
    int64_t best = -1;
    for (;;) {
        int64_t limit = cgroup_number(dir, v2 ? "memory.max" : "memory.limit_in_bytes");
        int64_t usage = cgroup_number(dir, v2 ? "memory.current" : "memory.usage_in_bytes");
        if (limit >= 0 && usage >= 0) {
            int64_t cache = cgroup_stat(dir, v2 ? "inactive_file" : "total_inactive_file");
            int64_t avail = limit - (usage - (cache < usage ? cache : usage));
            if (avail < 0)
                avail = 0;
            if (best < 0 || avail < best)
                best = avail;
        }
        if (strlen(dir) <= strlen(mount))
            break;
        char *slash = strrchr(dir, '/');
        if (!slash)
            break;
        *slash = '\0';
    }
    return best;
}

/* Keeps the smaller of what the limits so far allow and what `name` allows. */
static void consider(ebb_fit *fit, int64_t avail, const char *name) {
    if (avail < 0)
        return;
    if (fit->available_bytes < 0 || avail < fit->available_bytes) {
        fit->available_bytes = avail;
        fit->limit = name;
    }
}

ebb_status ebb_plan_check_fits(const ebb_plan *plan, ebb_device device, const ebb_model *model,
                               int64_t input_bytes, ebb_fit *out) {
    ebb_fit fit = {.peak_step = -1, .available_bytes = -1};
    if (out)
        *out = fit;
    if (!plan)
        return ebb_error_set(EBB_ERR_ARG, "ebb_plan_check_fits: plan is NULL");
    if (model && (model->device.type != device.type || model->device.index != device.index))
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_plan_check_fits: the model is on another device than asked");
    ebb_plan_peak_bytes(plan, &fit.peak_step);
    fit.peak_bytes = ebb_plan_device_peak_bytes(plan, device);
    /* not allocated yet: the run will need them too, and a training step its
     * optimizer's state */
    if (!model)
        fit.param_bytes = ebb_plan_param_bytes(plan) + ebb_plan_optimizer_state_bytes(plan);
    fit.input_bytes = input_bytes > 0 ? input_bytes : 0;
    if (device.type == EBB_DEVICE_CPU) {
        fit.reserve_bytes = RESERVE_FIXED + intra_op_threads() * thread_stack_bytes();
        /* the process's own use is in its mappings; the limits cap their total */
        long page = sysconf(_SC_PAGESIZE);
        struct rlimit rl;
        FILE *f = fopen("/proc/self/statm", "re");
        long long pages = -1;
        if (f) {
            if (fscanf(f, "%lld", &pages) != 1)
                pages = -1;
            fclose(f);
        }
        if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && pages >= 0) {
            int64_t a = (int64_t)rl.rlim_cur - (int64_t)pages * page;
            consider(&fit, a > 0 ? a : 0, "RLIMIT_AS");
        }
        int64_t vmdata = proc_kb("/proc/self/status", "VmData");
        if (getrlimit(RLIMIT_DATA, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && vmdata >= 0) {
            int64_t a = (int64_t)rl.rlim_cur - vmdata;
            consider(&fit, a > 0 ? a : 0, "RLIMIT_DATA");
        }
        consider(&fit, cgroup_available(), "cgroup memory limit");
        consider(&fit, proc_kb("/proc/meminfo", "MemAvailable"), "MemAvailable");
    }
    if (device.type == EBB_DEVICE_CUDA) {
        /* the driver's free bytes and the caching allocator's unused blocks;
         * a build without CUDA has no figure, and the run itself will say so */
        int64_t avail = -1;
        if (ebb_device_memory_available(device, &avail, NULL) == EBB_OK)
            consider(&fit, avail, "free CUDA memory");
        else
            ebb_error_clear();
    }
    fit.needed_bytes = fit.peak_bytes + fit.param_bytes + fit.input_bytes + fit.reserve_bytes;
    if (out)
        *out = fit;
    if (fit.available_bytes < 0 || fit.needed_bytes <= fit.available_bytes)
        return EBB_OK;
    char need[32], have[32], peak[32], params[32], extra[32], reserve[32];
    ebb_bytes_str(fit.needed_bytes, need, sizeof need);
    ebb_bytes_str(fit.available_bytes, have, sizeof have);
    ebb_bytes_str(fit.peak_bytes, peak, sizeof peak);
    ebb_bytes_str(fit.param_bytes, params, sizeof params);
    ebb_bytes_str(fit.input_bytes, extra, sizeof extra);
    ebb_bytes_str(fit.reserve_bytes, reserve, sizeof reserve);
    const ebb_plan_step *s = fit.peak_step >= 0 ? ebb_plan_step_at(plan, fit.peak_step) : NULL;
    return ebb_error_set(EBB_ERR_NOMEM,
                         "plan %s needs %s at step %d (%s), this process can get %s (%s): "
                         "%s intermediates%s + %s parameters + %s inputs + %s for threads and "
                         "BLAS buffers",
                         plan->name, need, fit.peak_step, s ? s->node : "?", have, fit.limit, peak,
                         ebb_plan_peak_is_bound_on(plan, device) ? " (a bound)" : "", params, extra,
                         reserve);
}
