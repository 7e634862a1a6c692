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
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ebb/ebb.h"
#include "../fileio.h"
#include "train.h"

enum { EXIT_RUNTIME = 3 };

/* ---- data parallel --------------------------------------------------------- */

/* --nproc N: this command again in N processes, ranks 0 .. N-1 of a group
 * meeting on a free loopback port, as torchrun would start them. Waits for
 * every rank; a rank that fails makes the others fail too (their next
 * collective, or their timeout). The exit code is the first rank's that
 * failed of its own accord (1, a spec or data error; 2, a usage error), else
 * the first failure: a rank that refuses its options may close its
 * connections before it exits, and the others' lost connection (3) is then
 * only the consequence. Returns -1 when every rank succeeded. */
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
    char port[16], world[16], rank[16];
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
    /* the ranks share the threads this process has (its --threads,
     * EBB_NUM_THREADS or the default), as torchrun's OMP_NUM_THREADS does */
    char threads[16], *had = getenv("EBB_NUM_THREADS");
    char *outer = had ? strdup(had) : NULL;
    int per_rank = ebb_tensor_num_threads() / n;
    snprintf(threads, sizeof threads, "%d", per_rank > 1 ? per_rank : 1);
    setenv("EBB_NUM_THREADS", threads, 1);
    int rc = -1, own = -1, started = 0;
    for (int r = 0; r < n; r++) {
        snprintf(rank, sizeof rank, "%d", r);
        setenv("RANK", rank, 1);
        setenv("LOCAL_RANK", rank, 1);
        int e = posix_spawn(&pids[r], "/proc/self/exe", NULL, NULL, args, environ);
        if (e != 0) {
            fprintf(stderr, "ebb: --nproc: cannot start rank %d: %s\n", r, strerror(e));
            rc = EXIT_RUNTIME;
            break;
        }
        started++;
    }
    for (int left = started; left > 0; left--) {
        int status = 0;
        pid_t p = waitpid(-1, &status, 0);
        if (p < 0) break;
        int r = 0;
        while (r < started && pids[r] != p) r++;
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : EXIT_RUNTIME;
        if (code != 0) {
            if (WIFSIGNALED(status))
                fprintf(stderr, "ebb: rank %d of %d was killed by signal %d\n", r, n,
                        WTERMSIG(status));
            else
                fprintf(stderr, "ebb: rank %d of %d exited with status %d\n", r, n, code);
            if (rc < 0) rc = code;
            if (own < 0 && (code == 1 || code == 2)) own = code;
        }
    }
    if (own > 0) rc = own;
    /* a launch that could not start every rank ends the ones it started */
    if (started < n)
        for (int r = 0; r < started; r++) kill(pids[r], SIGTERM);
    unsetenv("RANK");
    unsetenv("LOCAL_RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    if (outer)
        setenv("EBB_NUM_THREADS", outer, 1);
    else
        unsetenv("EBB_NUM_THREADS");
    free(outer);
    free(args);
    return rc;
}

/* ---- signals ------------------------------------------------------------------ */

/* The signal that asked training to stop (0: none). The loop looks at it
 * between steps only, so that a step and a checkpoint are never cut short. */
static volatile sig_atomic_t stop_signal;
static atomic_int stop_count; /* signals received: two may arrive at once, on two threads */
static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};
#define N_STOP_SIGNALS 3
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
