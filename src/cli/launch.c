/* The processes of `ebb train`: --nproc's ranks launched on this machine,
 * and the signals (SIGINT, SIGTERM, SIGHUP) that stop training between
 * steps, with a checkpoint. */
#define _GNU_SOURCE /* posix_spawn, environ */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ebb/ebb.h"
#include "../fileio.h"
#include "train.h"

enum { EXIT_RUNTIME = 3 };

/* The signals that stop training between steps, with a checkpoint. */
static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};
#define N_STOP_SIGNALS 3

/* ---- data parallel --------------------------------------------------------- */

/* The launcher is an agent, as torchrun's: it takes SIGINT, SIGTERM and
 * SIGHUP itself before the first rank starts and passes each to every
 * rank (which stops between steps, with a checkpoint); the ranks die with
 * it (a parent-death signal, ebb_cli_follow_launcher); and once a rank
 * fails the others get SIGTERM, then SIGKILL after LAUNCH_GRACE_S, so that
 * a rank that stopped answering (SIGSTOP, a hang) cannot hold the job. */
#define LAUNCH_GRACE_S 10
static volatile sig_atomic_t launch_signal;
static void on_launch_signal(int sig) { launch_signal = sig; }

/* The launcher's handlers, before any rank starts; a signal ignored when
 * the command started stays ignored (for the ranks too). */
static void launch_signals(struct sigaction *old, int *installed) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_launch_signal;
    sigemptyset(&sa.sa_mask);
    launch_signal = 0;
    for (int i = 0; i < N_STOP_SIGNALS; i++) {
        struct sigaction cur;
        installed[i] = sigaction(stop_signals[i], NULL, &cur) == 0 && cur.sa_handler != SIG_IGN &&
                       sigaction(stop_signals[i], &sa, &old[i]) == 0;
    }
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sends sig to every rank still running (pids[r] > 0); a stopped one is
 * continued, so that it takes the signal. */
static void signal_ranks(const pid_t *pids, int n, int sig) {
    for (int r = 0; r < n; r++)
        if (pids[r] > 0) {
            kill(pids[r], sig);
            if (sig != SIGKILL) kill(pids[r], SIGCONT);
        }
}

/* Starts rank 0 .. n-1 of `args` (the environment set by the caller), with
 * the default signal mask and the stop signals at their default action
 * (unless ignored); returns how many started. */
static int spawn_ranks(pid_t *pids, int n, char **args, const int *installed) {
    posix_spawnattr_t at;
    sigset_t none, dfl;
    sigemptyset(&none);
    sigemptyset(&dfl);
    for (int i = 0; i < N_STOP_SIGNALS; i++)
        if (installed[i]) sigaddset(&dfl, stop_signals[i]);
    posix_spawnattr_init(&at);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &dfl);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    char rank[16], self[24];
    snprintf(self, sizeof self, "%ld", (long)getpid());
    setenv("EBB_LAUNCHER_PID", self, 1);
    int started = 0;
    for (int r = 0; r < n; r++) {
        snprintf(rank, sizeof rank, "%d", r);
        setenv("RANK", rank, 1);
        setenv("LOCAL_RANK", rank, 1);
        int e = posix_spawn(&pids[r], "/proc/self/exe", NULL, &at, args, environ);
        if (e != 0) {
            fprintf(stderr, "ebb: --nproc: cannot start rank %d: %s\n", r, strerror(e));
            pids[r] = 0;
            break;
        }
        started++;
    }
    posix_spawnattr_destroy(&at);
    unsetenv("EBB_LAUNCHER_PID");
    return started;
}

/* What a rank's end says: its exit status, or the runtime failure for a
 * signal; named on stderr unless it succeeded. */
static int rank_ended(int r, int n, int status) {
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : EXIT_RUNTIME;
    if (WIFSIGNALED(status))
        fprintf(stderr, "ebb: rank %d of %d was killed by signal %d (%s)\n", r, n,
                WTERMSIG(status), strsignal(WTERMSIG(status)));
    else if (code != 0)
        fprintf(stderr, "ebb: rank %d of %d exited with status %d\n", r, n, code);
    return code;
}

/* Waits for the started ranks, passing on the launcher's signals and
 * stopping the others once one fails (SIGTERM, then SIGKILL after the
 * grace period). Returns the exit code, as ebb_cli_launch_ranks says. */
static int watch_ranks(pid_t *pids, int n, int started) {
    int rc = -1, own = -1, left = started, passed = 0, failed = -1;
    double kill_at = 0;
    while (left > 0) {
        int status = 0;
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p > 0) {
            int r = 0;
            while (r < started && pids[r] != p) r++;
            if (r == started) continue; /* not a rank */
            pids[r] = 0;
            left--;
            int code = rank_ended(r, n, status);
            if (code == 0) continue;
            if (rc < 0) rc = code;
            if (own < 0 && (code == 1 || code == 2)) own = code;
            /* a rank a signal stopped (128 + SIGINT, SIGTERM, SIGHUP) stops
             * with the others, which its step told; after the launcher's
             * own signal they are all stopping. A second signal would stop
             * them at once, in the middle of their checkpoint. */
            int stopping = passed;
            for (int i = 0; i < N_STOP_SIGNALS; i++) stopping |= code == 128 + stop_signals[i];
            if (failed < 0 && left > 0 && !stopping) {
                failed = r;
                signal_ranks(pids, started, SIGTERM);
                kill_at = seconds_now() + LAUNCH_GRACE_S;
            }
            continue;
        }
        if (p < 0 && errno != EINTR) break;
        int sig = launch_signal;
        if (sig && sig != passed) { /* each new signal once to every rank */
            signal_ranks(pids, started, sig);
            passed = sig;
        }
        if (kill_at > 0 && seconds_now() >= kill_at) {
            for (int r = 0; r < started; r++)
                if (pids[r] > 0)
                    fprintf(stderr, "ebb: rank %d of %d did not stop within %d s of rank %d's "
                                    "failure: killed\n",
                            r, n, LAUNCH_GRACE_S, failed);
            signal_ranks(pids, started, SIGKILL);
            kill_at = 0;
        }
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
    if (own > 0) rc = own;
    return rc;
}

/* --nproc N: this command again in N processes, ranks 0 .. N-1 of a group
 * meeting on a free loopback port, as torchrun would start them, watched
 * as above. The exit code is the first rank's that failed of its own
 * accord (1, a spec or data error; 2, a usage error), else the first
 * failure: a rank that refuses its options may close its connections
 * before it exits, and the others' lost connection (3) is then only the
 * consequence. Returns -1 when every rank succeeded. */
int ebb_cli_launch_ranks(int n, int argc, char **argv) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        fprintf(stderr, "ebb: --nproc: no free loopback port: %s\n", strerror(errno));
        if (fd >= 0) close(fd);
        return EXIT_RUNTIME;
    }
    close(fd);
    char port[16], world[16];
    snprintf(port, sizeof port, "%d", ntohs(a.sin_port));
    snprintf(world, sizeof world, "%d", n);
    char **args = calloc((size_t)argc + 2, sizeof *args);
    pid_t pids[64] = {0};
    if (!args) {
        fprintf(stderr, "ebb: out of memory\n");
        return EXIT_RUNTIME;
    }
    args[0] = (char *)"ebb";
    /* --threads is the launcher's, which each rank gets an N-th of below */
    for (int i = 0, k = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) {
            while (i < argc) args[k++] = argv[i++];
            break;
        }
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            i++;
            continue;
        }
        if (strncmp(argv[i], "--threads=", 10) != 0) args[k++] = argv[i];
    }
    setenv("WORLD_SIZE", world, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port, 1);
    /* the job's name at the rendezvous: a rank of another job that finds
     * this port is refused there (one set by the caller is kept) */
    char job[64];
    int own_job = !getenv("EBB_JOB_ID");
    snprintf(job, sizeof job, "ebb-%ld-%s-%lld", (long)getpid(), port, (long long)time(NULL));
    if (own_job)
        setenv("EBB_JOB_ID", job, 1);
    /* the ranks share the threads this process has (its --threads,
     * EBB_NUM_THREADS or the default), as torchrun's OMP_NUM_THREADS does */
    char threads[16], *had = getenv("EBB_NUM_THREADS");
    char *outer = had ? strdup(had) : NULL;
    int per_rank = ebb_tensor_num_threads() / n;
    snprintf(threads, sizeof threads, "%d", per_rank > 1 ? per_rank : 1);
    setenv("EBB_NUM_THREADS", threads, 1);
    struct sigaction old[N_STOP_SIGNALS];
    int installed[N_STOP_SIGNALS];
    launch_signals(old, installed);
    int started = spawn_ranks(pids, n, args, installed);
    int rc = watch_ranks(pids, n, started);
    /* a launch that could not start every rank ends the ones it started */
    if (started < n) {
        for (int r = 0; r < started; r++) kill(pids[r], SIGTERM);
        rc = EXIT_RUNTIME;
    }
    for (int i = 0; i < N_STOP_SIGNALS; i++)
        if (installed[i]) sigaction(stop_signals[i], &old[i], NULL);
    unsetenv("RANK");
    unsetenv("LOCAL_RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    if (own_job)
        unsetenv("EBB_JOB_ID");
    if (outer)
        setenv("EBB_NUM_THREADS", outer, 1);
    else
        unsetenv("EBB_NUM_THREADS");
    free(outer);
    free(args);
    return rc;
}

/* A rank the launcher started dies with it: SIGTERM when it goes (which
 * stops training between steps, as the launcher's own signal would). A
 * launcher gone before that was set is a failure. */
int ebb_cli_follow_launcher(void) {
    const char *v = getenv("EBB_LAUNCHER_PID");
    if (!v || !*v) return 0; /* torchrun's, or by hand */
    long launcher = strtol(v, NULL, 10);
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || (long)getppid() != launcher) {
        fprintf(stderr, "ebb: rank %s: its launcher (process %s) is gone\n",
                getenv("RANK") ? getenv("RANK") : "?", v);
        return EXIT_RUNTIME;
    }
    return 0;
}

/* ---- signals ------------------------------------------------------------------ */

/* The signal that asked training to stop (0: none). The loop looks at it
 * between steps only, so that a step and a checkpoint are never cut short. */
static volatile sig_atomic_t stop_signal;
static atomic_int stop_count; /* signals received: two may arrive at once, on two threads */
static volatile sig_atomic_t stop_installed[N_STOP_SIGNALS];
static struct sigaction stop_old[N_STOP_SIGNALS], stop_default;

static void on_stop_signal(int sig) {
    if (atomic_fetch_add(&stop_count, 1) > 0) {
        /* a second signal stops at once: its default action, once this
         * handler returns and unblocks it, leaving no checkpoint's
         * temporary file behind */
        ebb_file_remove_temporaries();
        sigaction(sig, &stop_default, NULL);
        raise(sig);
        return;
    }
    stop_signal = sig;
    for (int i = 0; i < N_STOP_SIGNALS; i++)
        if (stop_installed[i]) sigaction(stop_signals[i], &stop_default, NULL);
}

/* A signal ignored when the command started (nohup's SIGHUP, SIGINT in a
 * background job) stays ignored. */
void ebb_cli_signals_install(void) {
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART; /* what the signal interrupts (a write to a pipe) goes on */
    sigemptyset(&sa.sa_mask);
    stop_default = (struct sigaction){.sa_handler = SIG_DFL};
    sigemptyset(&stop_default.sa_mask);
    stop_signal = 0;
    atomic_store(&stop_count, 0);
    for (int i = 0; i < N_STOP_SIGNALS; i++)
        if (sigaction(stop_signals[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            stop_installed[i] = sigaction(stop_signals[i], &sa, &stop_old[i]) == 0;
}

void ebb_cli_signals_restore(void) {
    for (int i = 0; i < N_STOP_SIGNALS; i++)
        if (stop_installed[i]) {
            sigaction(stop_signals[i], &stop_old[i], NULL);
            stop_installed[i] = 0;
        }
}

const char *ebb_cli_signal_name(int sig) {
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "?";
}

int ebb_cli_stop_signal(void) { return stop_signal; }
