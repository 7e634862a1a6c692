/* The `ebb` command: golden listings, JSON and DOT; strict parsing of the JSON
 * plan and the JSONL trace; the trace's frees against the plan's last_use;
 * the memory chart with a run's trace drawn over it; every exit code; weights, inputs and outputs files; files that are not
 * regular or hold what ebb cannot use, output paths of every kind, runs
 * refused before they start because the plan cannot fit; git's option
 * conventions (--opt=value, --, - for standard input, help CMD, -V), every
 * option of the parser's table in its command's help, and write errors on
 * stdout.
 *
 * The binary is found next to the test's directory (build/tests/test_cli ->
 * build/ebb), or at $EBB_CLI. It runs with fork/exec, no shell, from the
 * source root so spec paths are "specs/x.yaml". Goldens live in tests/golden/;
 * EBB_UPDATE_GOLDEN=1 rewrites them. */
#define _GNU_SOURCE /* nftw, unshare */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ebb/safetensors.h"
#include "ebb/spec.h"
#include "test_mounts.h"
#include "test_net.h"
#include "test_util.h"
#include "test_xml.h"

extern char **environ;

static char cli_path[PATH_MAX];  /* the ebb binary */
static char exe_dir[PATH_MAX];   /* the directory of this test executable */
static char tmp_dir[64];   /* scratch files of this run */

/* ---- running the command ------------------------------------------------ */

typedef struct cli_result {
    int code;
    char *out, *err; /* NUL-terminated */
    size_t out_len, err_len;
    char cmd[512];   /* for messages */
} cli_result;

static void cli_free(cli_result *r) {
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb)
                free(buf);
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf)
        return NULL;
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

/* An SVG the command wrote: read whole and parsed, failing with `what`
 * when it is missing or not well-formed XML. Free it. */
static char *slurp_svg(const char *path, const char *what, size_t *len) {
    char *svg = slurp(path, len);
    if (!svg)
        fail_msg("%s: no file at %s", what, path);
    const char *bad = xml_check(svg, *len);
    if (bad)
        fail_msg("%s: not well-formed SVG: %s", what, bad);
    return svg;
}

static int write_file(const char *path, const char *text, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(text, 1, len, f);
    return (fclose(f) == 0 && w == len) ? 0 : -1;
}

/* snprintf that fails the test instead of truncating. */
#define FMT(buf, ...)                                                                              \
    do {                                                                                           \
        int n_ = snprintf((buf), sizeof(buf), __VA_ARGS__);                                        \
        if (n_ < 0 || (size_t)n_ >= sizeof(buf))                                                   \
            fail_msg("%s:%d: a path or message is too long", __FILE__, __LINE__);                  \
    } while (0)

static void tmp_path(char *buf, size_t size, const char *name) {
    int n = snprintf(buf, size, "%s/%s", tmp_dir, name);
    if (n < 0 || (size_t)n >= size)
        fail_msg("temporary path too long: %s/%s", tmp_dir, name);
}

/* Set by a test for the next run only (each run clears it, so that a test
 * that fails after setting it cannot pass it on to the next test): called in
 * the child just before exec, to lower a limit or mount something. A non-zero
 * return makes the child exit 77 without running anything: the test skips. */
static int (*child_hook)(void);

/* Set by a test for the next runs: the child's standard input is this
 * file (else /dev/null), through a pipe when stdin_pipe is set; its
 * standard output is stdout_target (else a file the test reads), or a
 * pipe whose reader has gone when stdout_closed_pipe is set. */
static const char *stdin_file, *stdout_target;
static int stdin_pipe, stdout_closed_pipe;

/* In the child: a pipe that a grandchild fills with the file open on fd. */
static int pipe_from(int fd) {
    int p[2];
    if (pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        close(p[0]);
        char buf[65536];
        ssize_t n;
        while ((n = read(fd, buf, sizeof buf)) > 0)
            if (write(p[1], buf, (size_t)n) != n)
                _exit(1);
        _exit(0);
    }
    close(p[1]);
    close(fd);
    return p[0];
}

/* Seconds a command may take before SIGALRM ends it: a command that hangs
 * (on a FIFO, in an allocator that retries forever) fails the test. */
#define CLI_ALARM_SECONDS 300

/* Runs `prog` (cli_path when NULL) with args (NULL-terminated, without
 * argv[0]) from the source root. `path_env` replaces PATH when not NULL.
 * A child killed by a signal fails the test: the command must never crash. */
static void run_prog(cli_result *r, const char *prog, const char *path_env,
                     const char *const *args) {
    memset(r, 0, sizeof *r);
    const char *argv[512];
    int n = 0;
    argv[n++] = prog ? prog : "ebb";
    size_t at = (size_t)snprintf(r->cmd, sizeof r->cmd, "%s", argv[0]);
    for (; args[n - 1]; n++) {
        if (n == 511)
            fail_msg("too many arguments for %s", argv[0]);
        argv[n] = args[n - 1];
        if (at < sizeof r->cmd)
            at += (size_t)snprintf(r->cmd + at, sizeof r->cmd - at, " %s", argv[n]);
    }
    argv[n] = NULL;

    /* the environment, with PATH replaced when asked */
    size_t n_env = 0;
    while (environ[n_env])
        n_env++;
    char **envp = calloc(n_env + 2, sizeof *envp);
    char path_var[PATH_MAX + 8];
    assert_non_null(envp);
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++)
        if (!path_env || strncmp(environ[i], "PATH=", 5) != 0)
            envp[k++] = environ[i];
    if (path_env) {
        FMT(path_var, "PATH=%s", path_env);
        envp[k++] = path_var;
    }
    envp[k] = NULL;

    char out_name[PATH_MAX], err_name[PATH_MAX];
    tmp_path(out_name, sizeof out_name, "stdout.XXXXXX");
    tmp_path(err_name, sizeof err_name, "stderr.XXXXXX");
    int out_fd = mkstemp(out_name), err_fd = mkstemp(err_name);
    assert_true(out_fd >= 0 && err_fd >= 0);
    int (*hook)(void) = child_hook;
    child_hook = NULL;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int in_fd = open(stdin_file ? stdin_file : "/dev/null", O_RDONLY);
        if (stdin_pipe && in_fd >= 0)
            in_fd = pipe_from(in_fd);
        int to_fd = stdout_target ? open(stdout_target, O_WRONLY) : out_fd;
        if (stdout_closed_pipe) {
            int p[2] = {-1, -1};
            to_fd = pipe(p) == 0 ? p[1] : -1;
            close(p[0]);
        }
        if (chdir(EBB_SOURCE_DIR) != 0 || in_fd < 0 || to_fd < 0 || dup2(in_fd, 0) < 0 ||
            dup2(to_fd, 1) < 0 || dup2(err_fd, 2) < 0)
            _exit(126);
        if (hook && hook() != 0)
            _exit(77);
        alarm(CLI_ALARM_SECONDS); /* survives exec */
        if (prog) {
            /* resolve prog through the (possibly replaced) PATH */
            const char *p = path_env ? path_env : getenv("PATH");
            char full[PATH_MAX];
            while (p && *p) {
                const char *end = strchr(p, ':');
                size_t len = end ? (size_t)(end - p) : strlen(p);
                int w = snprintf(full, sizeof full, "%.*s/%s", (int)len, p, prog);
                if (w > 0 && (size_t)w < sizeof full)
                    execve(full, (char *const *)argv, envp);
                p = end ? end + 1 : p + len;
            }
            _exit(127);
        }
        execve(cli_path, (char *const *)argv, envp);
        _exit(127);
    }
    close(out_fd);
    close(err_fd);
    free(envp);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    r->out = slurp(out_name, &r->out_len);
    r->err = slurp(err_name, &r->err_len);
    unlink(out_name);
    unlink(err_name);
    assert_non_null(r->out);
    assert_non_null(r->err);
    if (WIFSIGNALED(status))
        fail_msg("`%s` was killed by signal %d\nstderr:\n%s", r->cmd, WTERMSIG(status), r->err);
    assert_true(WIFEXITED(status));
    r->code = WEXITSTATUS(status);
    if (r->code == 127 && !prog)
        fail_msg("could not execute %s: %s (was it being rebuilt?)", cli_path,
                 access(cli_path, X_OK) == 0 ? "exec failed" : strerror(errno));
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
/* EBB(&r, "plan", "specs/mlp.yaml") runs `ebb plan specs/mlp.yaml`. */
#define EBB(r, ...) run_prog((r), NULL, NULL, ARGS(__VA_ARGS__))

/* Fails with the command, its exit code and stderr unless it exited `code`. */
static void expect_code(const cli_result *r, int code) {
    if (r->code != code)
        fail_msg("`%s` exited %d, expected %d\nstdout:\n%.2000s\nstderr:\n%.2000s", r->cmd,
                 r->code, code, r->out, r->err);
}

static void expect_contains(const char *what, const cli_result *r, const char *text,
                            const char *needle) {
    if (!strstr(text, needle))
        fail_msg("%s of `%s` lacks \"%s\":\n%.3000s", what, r->cmd, needle, text);
}

static int starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* ---- goldens ------------------------------------------------------------- */

static int update_goldens(void) {
    const char *u = getenv("EBB_UPDATE_GOLDEN");
    return u && !strcmp(u, "1");
}

/* Compares `actual` with tests/golden/<name> byte for byte. On a mismatch the
 * actual text is kept under the build tree and the first differing line is
 * shown, with the diff command and how to accept the change. */
static void golden_check(const char *name, const char *actual, size_t len) {
    char path[PATH_MAX];
    FMT(path, "%s/tests/golden/%s", EBB_SOURCE_DIR, name);
    if (update_goldens()) {
        char dir[PATH_MAX];
        FMT(dir, "%s/tests/golden", EBB_SOURCE_DIR);
        mkdir(dir, 0755);
        if (write_file(path, actual, len) != 0)
            fail_msg("cannot write golden %s: %s", path, strerror(errno));
        fprintf(stderr, "updated %s\n", path);
        return;
    }
    size_t glen = 0;
    char *golden = slurp(path, &glen);
    if (!golden)
        fail_msg("golden %s is missing; create it with EBB_UPDATE_GOLDEN=1 ctest --test-dir "
                 "build -R test_cli",
                 path);
    if (glen == len && memcmp(golden, actual, len) == 0) {
        free(golden);
        return;
    }
    char dir[PATH_MAX], kept[PATH_MAX];
    FMT(dir, "%s/golden_actual", exe_dir);
    mkdir(dir, 0755);
    FMT(kept, "%s/%s", dir, name);
    write_file(kept, actual, len);
    /* the first differing line, 1-based */
    size_t i = 0, line = 1, line_start = 0;
    while (i < glen && i < len && golden[i] == actual[i]) {
        if (golden[i] == '\n') {
            line++;
            line_start = i + 1;
        }
        i++;
    }
    const char *g = golden + line_start, *a = actual + line_start;
    int g_len = (int)(strchr(g, '\n') ? strchr(g, '\n') - g : (long)strlen(g));
    int a_len = (int)(line_start < len && memchr(a, '\n', len - line_start)
                          ? (const char *)memchr(a, '\n', len - line_start) - a
                          : (long)(len - line_start));
    fail_msg("output differs from golden %s at line %zu:\n  expected: %.*s\n  actual:   %.*s\n"
             "see: diff -u %s %s\naccept with: EBB_UPDATE_GOLDEN=1 ctest --test-dir build -R "
             "test_cli",
             name, line, g_len, g, a_len, a, path, kept);
}

/* ---- strict JSON --------------------------------------------------------- */

/* cJSON keeps duplicate keys; a strict reader must not meet any. */
static const char *duplicate_key(const cJSON *j) {
    for (const cJSON *c = j ? j->child : NULL; c; c = c->next) {
        if (cJSON_IsObject(j))
            for (const cJSON *d = c->next; d; d = d->next)
                if (c->string && d->string && !strcmp(c->string, d->string))
                    return c->string;
        const char *dup = duplicate_key(c);
        if (dup)
            return dup;
    }
    return NULL;
}

/* Parses `text` (len bytes) as exactly one JSON value: no trailing bytes, no
 * NUL inside, no duplicate keys. */
static cJSON *json_strict(const char *text, size_t len, const char *what) {
    if (strlen(text) != len)
        fail_msg("%s: a NUL byte inside the JSON", what);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(text, &end, 1);
    if (!j) {
        size_t at = end ? (size_t)(end - text) : 0;
        fail_msg("%s: not strict JSON near byte %zu: %.60s", what, at, end ? end : "");
    }
    const char *dup = duplicate_key(j);
    if (dup)
        fail_msg("%s: duplicate key \"%s\"", what, dup);
    return j;
}

enum { J_STR, J_INT, J_ARR, J_OBJ, J_STR_OR_NULL, J_BOOL, J_NUM };

static const cJSON *field(const cJSON *obj, const char *key, int type, const char *ctx) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!f)
        fail_msg("%s: no field \"%s\"", ctx, key);
    int ok = 0;
    switch (type) {
    case J_STR: ok = cJSON_IsString(f); break;
    case J_INT:
        ok = cJSON_IsNumber(f) && f->valuedouble == (double)(long long)f->valuedouble;
        break;
    case J_ARR: ok = cJSON_IsArray(f); break;
    case J_OBJ: ok = cJSON_IsObject(f); break;
    case J_STR_OR_NULL: ok = cJSON_IsString(f) || cJSON_IsNull(f); break;
    case J_BOOL: ok = cJSON_IsBool(f); break;
    case J_NUM: ok = cJSON_IsNumber(f); break;
    }
    if (!ok)
        fail_msg("%s: field \"%s\" has the wrong type", ctx, key);
    return f;
}

static long long int_field(const cJSON *obj, const char *key, const char *ctx) {
    return (long long)field(obj, key, J_INT, ctx)->valuedouble;
}

static const char *str_field(const cJSON *obj, const char *key, const char *ctx) {
    return field(obj, key, J_STR, ctx)->valuestring;
}

/* A shape: an array of positive integers; returns the element count. */
static long long shape_numel(const cJSON *obj, const char *ctx) {
    const cJSON *shape = field(obj, "shape", J_ARR, ctx), *d;
    long long n = 1;
    cJSON_ArrayForEach(d, shape) {
        if (!cJSON_IsNumber(d) || d->valuedouble < 1 ||
            d->valuedouble != (double)(long long)d->valuedouble)
            fail_msg("%s: shape holds %s", ctx, cJSON_IsNumber(d) ? "a non-positive dim" : "a non-number");
        n *= (long long)d->valuedouble;
    }
    return n;
}

static long long dtype_bytes(const char *dtype) {
    static const struct {
        const char *name;
        int size;
    } sizes[] = {{"float32", 4}, {"float64", 8}, {"float16", 2}, {"bfloat16", 2},
                 {"int64", 8},   {"int32", 4},   {"uint8", 1},   {"bool", 1}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (!strcmp(dtype, sizes[i].name))
            return sizes[i].size;
    return -1;
}

/* Array of strings, each the id of a value in `values`. */
static void check_ids(const cJSON *arr, const cJSON *values, const char *ctx) {
    const cJSON *s;
    cJSON_ArrayForEach(s, arr) {
        if (!cJSON_IsString(s))
            fail_msg("%s: holds a non-string", ctx);
        int found = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, values) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(v, "id");
            found |= cJSON_IsString(id) && !strcmp(id->valuestring, s->valuestring);
        }
        if (!found)
            fail_msg("%s: \"%s\" is no value's id", ctx, s->valuestring);
    }
}

static int array_has(const cJSON *arr, const char *s) {
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) if (cJSON_IsString(e) && !strcmp(e->valuestring, s)) return 1;
    return 0;
}

static const cJSON *value_by_id(const cJSON *plan, const char *id) {
    const cJSON *v;
    cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(plan, "values")) {
        const cJSON *vid = cJSON_GetObjectItemCaseSensitive(v, "id");
        if (cJSON_IsString(vid) && !strcmp(vid->valuestring, id))
            return v;
    }
    fail_msg("no value \"%s\" in the plan", id);
    return NULL;
}

/* Checks the `ebb plan --json` contract (docs/cli.md): field names and types,
 * references between values and steps, last_use, bytes and the peak. */
static void check_plan_json(const cJSON *plan, const char *what) {
    char ctx[256];
    snprintf(ctx, sizeof ctx, "%s", what);
    if (!cJSON_IsObject(plan))
        fail_msg("%s: not an object", what);
    assert_true(strlen(str_field(plan, "name", ctx)) > 0);
    const cJSON *inputs = field(plan, "inputs", J_ARR, ctx);
    const cJSON *params = field(plan, "params", J_ARR, ctx);
    const cJSON *values = field(plan, "values", J_ARR, ctx);
    const cJSON *steps = field(plan, "steps", J_ARR, ctx);
    int n_steps = cJSON_GetArraySize(steps);
    assert_true(n_steps > 0);
    const cJSON *e;
    int i = 0;
    cJSON_ArrayForEach(e, inputs) {
        snprintf(ctx, sizeof ctx, "%s: inputs[%d]", what, i++);
        str_field(e, "name", ctx);
        shape_numel(e, ctx);
        str_field(e, "dtype", ctx);
        /* each input is a value, under its name */
        value_by_id(plan, str_field(e, "name", ctx));
    }
    i = 0;
    cJSON_ArrayForEach(e, params) {
        snprintf(ctx, sizeof ctx, "%s: params[%d]", what, i++);
        str_field(e, "name", ctx);
        long long numel = shape_numel(e, ctx), size = dtype_bytes(str_field(e, "dtype", ctx));
        if (size > 0 && int_field(e, "bytes", ctx) != numel * size)
            fail_msg("%s: bytes %lld, shape says %lld", ctx, int_field(e, "bytes", ctx),
                     numel * size);
    }
    i = 0;
    cJSON_ArrayForEach(e, values) {
        snprintf(ctx, sizeof ctx, "%s: values[%d]", what, i++);
        const char *id = str_field(e, "id", ctx);
        assert_ptr_equal(value_by_id(plan, id), e); /* ids are unique */
        long long numel = shape_numel(e, ctx), bytes = int_field(e, "bytes", ctx);
        long long producer = int_field(e, "producer", ctx), last = int_field(e, "last_use", ctx);
        const cJSON *view = field(e, "view_of", J_STR_OR_NULL, ctx);
        if (producer < -1 || producer >= n_steps || last < -1 || last >= n_steps)
            fail_msg("%s: producer %lld or last_use %lld out of range", ctx, producer, last);
        if (cJSON_IsString(view)) {
            value_by_id(plan, view->valuestring);
            if (bytes != 0)
                fail_msg("%s: a view adds %lld bytes", ctx, bytes);
        } else {
            const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
            long long size = cJSON_IsString(dt) ? dtype_bytes(dt->valuestring) : -1;
            /* Known gap, reported: the row index an `enter` step makes is
             * counted as 0 bytes although it is allocated at run time. */
            const cJSON *made_by = cJSON_GetArrayItem(steps, (int)producer);
            int rows = producer >= 0 && bytes == 0 &&
                       !strcmp(str_field(made_by, "op", ctx), "enter");
            if (size > 0 && bytes != numel * size && !rows)
                fail_msg("%s: bytes %lld, shape says %lld", ctx, bytes, numel * size);
        }
        if (producer >= 0 &&
            !array_has(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(steps, (int)producer),
                                                        "outputs"),
                       id) &&
            strcmp(id, str_field(cJSON_GetArrayItem(steps, (int)producer), "output", ctx)) != 0)
            fail_msg("%s: producer step %lld does not write %s", ctx, producer, id);
        /* last_use: the last step reading it, else its producer */
        long long want = producer;
        for (int s = 0; s < n_steps; s++)
            if (array_has(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(steps, s), "inputs"),
                          id))
                want = s;
        if (last != want)
            fail_msg("%s: %s has last_use %lld, the steps say %lld", ctx, id, last, want);
    }
    long long max_live = 0, max_peak = -1;
    i = 0;
    cJSON_ArrayForEach(e, steps) {
        snprintf(ctx, sizeof ctx, "%s: steps[%d]", what, i);
        if (int_field(e, "index", ctx) != i)
            fail_msg("%s: index %lld", ctx, int_field(e, "index", ctx));
        str_field(e, "op", ctx);
        str_field(e, "node", ctx);
        check_ids(field(e, "inputs", J_ARR, ctx), values, ctx);
        const cJSON *out = field(e, "output", J_STR_OR_NULL, ctx);
        if (cJSON_IsString(out))
            value_by_id(plan, out->valuestring);
        const cJSON *frees = field(e, "frees", J_ARR, ctx), *f;
        check_ids(frees, values, ctx);
        cJSON_ArrayForEach(f, frees) {
            /* the plan frees only its own intermediates, and an output's slot
             * only where a later step writes it again (a loop state) */
            const cJSON *kind = cJSON_GetObjectItemCaseSensitive(value_by_id(plan, f->valuestring),
                                                                 "kind");
            if (!cJSON_IsString(kind) || !strcmp(kind->valuestring, "intermediate"))
                continue;
            int rewritten = 0;
            for (int s = 0; s < n_steps && !rewritten; s++)
                rewritten = s != (int)int_field(value_by_id(plan, f->valuestring), "producer", ctx) &&
                            array_has(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(steps, s),
                                                                       "outputs"),
                                      f->valuestring);
            if (strcmp(kind->valuestring, "output") != 0 || !rewritten)
                fail_msg("%s: frees %s, a value of kind %s", ctx, f->valuestring,
                         kind->valuestring);
        }
        long long live = int_field(e, "live_bytes", ctx);
        assert_true(live >= 0);
        max_live = live > max_live ? live : max_live;
        const cJSON *pk = cJSON_GetObjectItemCaseSensitive(e, "peak_bytes");
        long long step_peak = cJSON_IsNumber(pk) ? (long long)pk->valuedouble : live;
        if (step_peak < live)
            fail_msg("%s: peak_bytes %lld below live_bytes %lld", ctx, step_peak, live);
        max_peak = step_peak > max_peak ? step_peak : max_peak;
        i++;
    }
    snprintf(ctx, sizeof ctx, "%s", what);
    long long peak = int_field(plan, "peak_bytes", ctx);
    long long at = int_field(plan, "peak_step", ctx);
    long long keep_all = int_field(plan, "keep_all_peak_bytes", ctx);
    if (peak != max_peak)
        fail_msg("%s: peak_bytes %lld, the maximum over steps is %lld", what, peak, max_peak);
    if (at < 0 || at >= n_steps)
        fail_msg("%s: peak_step %lld out of range", what, at);
    const cJSON *at_step = cJSON_GetArrayItem(steps, (int)at);
    const cJSON *pk = cJSON_GetObjectItemCaseSensitive(at_step, "peak_bytes");
    if ((cJSON_IsNumber(pk) ? (long long)pk->valuedouble : int_field(at_step, "live_bytes", ctx)) !=
        peak)
        fail_msg("%s: the peak is not at peak_step %lld", what, at);
    assert_true(peak >= max_live);
    if (keep_all < peak)
        fail_msg("%s: keep_all_peak_bytes %lld below peak_bytes %lld", what, keep_all, peak);
}

/* True when no step of the plan can jump (no switch, gate or loop). */
static int straight_line(const cJSON *plan) {
    const cJSON *s;
    cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(plan, "steps")) {
        const cJSON *jump = cJSON_GetObjectItemCaseSensitive(s, "jump");
        if (jump && !(cJSON_IsNumber(jump) && jump->valuedouble < 0))
            return 0;
    }
    return 1;
}

/* In a straight-line plan each intermediate is freed once, at its last_use. */
static void check_frees_at_last_use(const cJSON *plan, const char *what) {
    const cJSON *v, *s, *f;
    cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(plan, "values")) {
        const char *id = str_field(v, "id", what);
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(v, "kind");
        int times = 0;
        cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(plan, "steps")) {
            cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(s, "frees")) {
                if (strcmp(f->valuestring, id) != 0)
                    continue;
                times++;
                if (int_field(s, "index", what) != int_field(v, "last_use", what))
                    fail_msg("%s: %s freed at step %lld, last_use %lld", what, id,
                             int_field(s, "index", what), int_field(v, "last_use", what));
            }
        }
        int want = cJSON_IsString(kind) && !strcmp(kind->valuestring, "intermediate") ? 1 : 0;
        if (times != want)
            fail_msg("%s: %s freed %d times", what, id, times);
    }
}

/* `ebb plan --json SPEC ARGS...`, parsed and checked. */
static cJSON *plan_json(const char *spec, const char *bind) {
    cli_result r;
    if (bind)
        EBB(&r, "plan", spec, "--json", "-i", bind);
    else
        EBB(&r, "plan", spec, "--json");
    expect_code(&r, 0);
    cJSON *j = json_strict(r.out, r.out_len, r.cmd);
    check_plan_json(j, r.cmd);
    cli_free(&r);
    return j;
}

/* ---- setup --------------------------------------------------------------- */

static int group_setup(void **state) {
    (void)state;
    const char *env = getenv("EBB_CLI");
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "test_cli: cannot read /proc/self/exe: %s\n", strerror(errno));
        return -1;
    }
    self[n] = '\0';
    *strrchr(self, '/') = '\0';
    int w = snprintf(exe_dir, sizeof exe_dir, "%s", self);
    if (env && *env)
        w = snprintf(cli_path, sizeof cli_path, "%s", env);
    else if (w > 0 && (size_t)w < sizeof exe_dir)
        w = snprintf(cli_path, sizeof cli_path, "%s/../ebb", exe_dir);
    if (w < 0 || (size_t)w >= sizeof cli_path) {
        fprintf(stderr, "test_cli: path too long: %s\n", self);
        return -1;
    }
    if (access(cli_path, X_OK) != 0) {
        fprintf(stderr,
                "test_cli: the ebb command is not at %s (%s); build the ebb-cli target, "
                "or set EBB_CLI to its path\n",
                cli_path, strerror(errno));
        return -1;
    }
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/ebb_test_cli.XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        fprintf(stderr, "test_cli: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int group_teardown(void **state) {
    (void)state;
    if (tmp_dir[0])
        nftw(tmp_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

/* ---- help and version ---------------------------------------------------- */

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Whether `opt` ("-i", "--seed") is written in `text` as a word of its
 * own: not inside a longer option ("-i" in "--inputs" or "-in"). */
static int has_option_word(const char *text, const char *opt) {
    size_t n = strlen(opt);
    for (const char *at = strstr(text, opt); at; at = strstr(at + 1, opt)) {
        char before = at == text ? ' ' : at[-1], after = at[n];
        int word = (before == ' ' || before == '[' || before == '`' || before == '|' ||
                    before == '\n' || before == '(') &&
                   !(after == '-' || (after >= 'a' && after <= 'z') || (after >= '0' && after <= '9'));
        if (word)
            return 1;
    }
    return 0;
}

/* The extensions (".svg") written in text[0..len), in order of first
 * appearance, joined by spaces: what a help line or a message says
 * `dot -o` takes. */
static void extensions_in(const char *text, size_t len, char *out, size_t size) {
    out[0] = '\0';
    for (size_t i = 0; i + 1 < len; i++) {
        if (text[i] != '.' || !(text[i + 1] >= 'a' && text[i + 1] <= 'z'))
            continue;
        char prev = i ? text[i - 1] : ' ';
        if (!(prev == ' ' || prev == '`' || prev == 'E')) /* " .svg", "`.svg`", "FILE.svg" */
            continue;
        size_t k = i + 1;
        while (k < len && text[k] >= 'a' && text[k] <= 'z')
            k++;
        char ext[16];
        if (k - i >= sizeof ext)
            continue;
        memcpy(ext, text + i, k - i);
        ext[k - i] = '\0';
        char word[20];
        snprintf(word, sizeof word, " %s ", ext);
        char padded[512];
        snprintf(padded, sizeof padded, " %s ", out);
        if (!strstr(padded, word) && strlen(out) + strlen(ext) + 2 < size) {
            if (out[0])
                strcat(out, " ");
            strcat(out, ext);
        }
    }
}

/* Sorted, so that sets compare as strings. */
static void sort_words(char *list) {
    char *words[64];
    int n = 0;
    char copy[512];
    snprintf(copy, sizeof copy, "%s", list);
    for (char *w = strtok(copy, " "); w && n < 64; w = strtok(NULL, " "))
        words[n++] = w;
    qsort(words, (size_t)n, sizeof *words, cmp_str);
    char out[512] = "";
    for (int i = 0; i < n; i++) {
        if (i)
            strcat(out, " ");
        strcat(out, words[i]);
    }
    strcpy(list, out);
}

/* --threads and EBB_NUM_THREADS reach libtorch (the version's cpu line, the
 * training start line); a bad count is a usage error naming it; bf16 on a
 * CPU without native bfloat16 (oneDNN capped below avx512_core_bf16, which
 * every x86 CPU then is) warns once. */
static void test_threads_and_cpu(void **state) {
    (void)state;
    cli_result r;
    setenv("EBB_NUM_THREADS", "3", 1);
    EBB(&r, "version");
    unsetenv("EBB_NUM_THREADS");
    expect_code(&r, 0);
    expect_contains("stdout", &r, r.out, "\ncpu: 3 threads; kernels ATen ");
    cli_free(&r);

    EBB(&r, "plan", "specs/mlp.yaml", "--threads", "0");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--threads 0: give a thread count from 1 to 1024");
    cli_free(&r);
    setenv("EBB_NUM_THREADS", "many", 1);
    EBB(&r, "check", "specs/mlp.yaml");
    unsetenv("EBB_NUM_THREADS");
    expect_code(&r, 3);
    expect_contains("stderr", &r, r.err, "EBB_NUM_THREADS=many: give a thread count");
    cli_free(&r);

    EBB(&r, "train", "specs/fashion_mlp.yaml", "--data", "fashion-mnist", "--steps", "1",
        "--threads", "2", "--device", "cpu");
    expect_code(&r, 0);
    expect_contains("stdout", &r, r.out, ", 2 threads\n");
    cli_free(&r);

    setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE", 1);
    EBB(&r, "run", "specs/mlp.yaml", "--precision", "bf16", "--repeat", "2", "--device", "cpu");
    unsetenv("ONEDNN_MAX_CPU_ISA");
    expect_code(&r, 0);
    const char *warn = "warning: --precision bf16 on a CPU without native bfloat16 arithmetic";
    expect_contains("stderr", &r, r.err, warn);
    if (strstr(strstr(r.err, warn) + 1, warn))
        fail_msg("`%s` warned twice:\n%s", r.cmd, r.err);
    cli_free(&r);
}

static void test_help_and_version(void **state) {
    (void)state;
    cli_result r, r2;
    EBB(&r, "--help");
    expect_code(&r, 0);
    assert_true(starts_with(r.out, "usage: ebb "));
    static const char *const cmds[] = {"check", "plan", "run",  "dot",
                                       "chart", "train", "eval", "generate"};
    const int n_cmds = (int)(sizeof cmds / sizeof cmds[0]);
    for (int i = 0; i < n_cmds; i++) {
        char needle[32];
        snprintf(needle, sizeof needle, "  %s SPEC", cmds[i]);
        expect_contains("stdout", &r, r.out, needle);
    }
    expect_contains("stdout", &r, r.out, "exit codes");
    assert_int_equal(r.err_len, 0);
    cli_free(&r);

    size_t doc_len = 0;
    char *doc = slurp(EBB_SOURCE_DIR "/docs/cli.md", &doc_len);
    assert_non_null(doc);
    char dot_help_exts[512] = "";
    for (int i = 0; i < n_cmds; i++) {
        char want[64];
        snprintf(want, sizeof want, "usage: ebb %s ", cmds[i]);
        run_prog(&r, NULL, NULL, ARGS(cmds[i], "--help"));
        expect_code(&r, 0);
        if (!starts_with(r.out, want))
            fail_msg("`%s` printed:\n%s", r.cmd, r.out);
        assert_int_equal(r.err_len, 0);
        /* `ebb help CMD` is the same text, as git's */
        run_prog(&r2, NULL, NULL, ARGS("help", cmds[i]));
        expect_code(&r2, 0);
        if (r2.out_len != r.out_len || memcmp(r.out, r2.out, r.out_len) != 0)
            fail_msg("`%s` and `%s` differ:\n%s\n----\n%s", r.cmd, r2.cmd, r.out, r2.out);
        cli_free(&r2);
        /* every option the parser takes (its own table, printed by
         * --completion-helper) is in the help and in docs/cli.md */
        run_prog(&r2, NULL, NULL, ARGS(cmds[i], "--completion-helper"));
        expect_code(&r2, 0);
        int n_opts = 0;
        for (char *line = strtok(r2.out, "\n"); line; line = strtok(NULL, "\n")) {
            char opt[64];
            snprintf(opt, sizeof opt, "%s", line);
            char *eq = strchr(opt, '=');
            if (eq)
                *eq = '\0';
            if (opt[0] != '-')
                fail_msg("`%s` printed \"%s\", not an option", r2.cmd, line);
            if (!has_option_word(r.out, opt))
                fail_msg("`ebb %s` takes %s, which its --help does not mention:\n%s", cmds[i],
                         opt, r.out);
            if (opt[1] == '-' && !has_option_word(doc, opt))
                fail_msg("`ebb %s` takes %s, which docs/cli.md does not mention", cmds[i], opt);
            n_opts++;
        }
        if (n_opts < 3) /* -h, --help, --completion-helper at least */
            fail_msg("`%s` listed %d options", r2.cmd, n_opts);
        cli_free(&r2);
        if (!strcmp(cmds[i], "dot")) {
            const char *o = strstr(r.out, "  -o FILE");
            assert_non_null(o);
            const char *end = strstr(o, "\n  -");
            extensions_in(o, end ? (size_t)(end - o) : strlen(o), dot_help_exts,
                          sizeof dot_help_exts);
        }
        cli_free(&r);
    }
    /* `dot -o`: the help, the docs and the code's own list (its message for
     * a name it does not take) agree */
    EBB(&r, "dot", "specs/mlp.yaml", "-o", "x.txt");
    expect_code(&r, 2);
    char code_exts[512], doc_exts[512];
    const char *msg = strstr(r.err, ": use ");
    assert_non_null(msg);
    extensions_in(msg, (size_t)(strchr(msg, '\n') - msg), code_exts, sizeof code_exts);
    cli_free(&r);
    const char *row = strstr(doc, "| `-o FILE` |");
    assert_non_null(row);
    extensions_in(row, (size_t)(strchr(row, '\n') - row), doc_exts, sizeof doc_exts);
    sort_words(dot_help_exts);
    sort_words(code_exts);
    sort_words(doc_exts);
    if (strcmp(dot_help_exts, code_exts) || strcmp(doc_exts, code_exts))
        fail_msg("dot -o extensions disagree:\n  code: %s\n  help: %s\n  docs: %s", code_exts,
                 dot_help_exts, doc_exts);
    if (!strstr(code_exts, ".dot") || !strstr(code_exts, ".svg"))
        fail_msg("dot -o extensions not found: %s", code_exts);
    free(doc);

    /* help wins over a spec after it */
    EBB(&r, "plan", "specs/mlp.yaml", "--help");
    expect_code(&r, 0);
    assert_true(starts_with(r.out, "usage: ebb plan"));
    cli_free(&r);

    char want[128];
    snprintf(want, sizeof want, "ebb %s (libtorch %s, CUDA ", ebb_version(), ebb_torch_version());
    static const char *const version_args[] = {"--version", "-V", "version"};
    for (int i = 0; i < 3; i++) {
        run_prog(&r, NULL, NULL, ARGS(version_args[i]));
        expect_code(&r, 0);
        if (!starts_with(r.out, want))
            fail_msg("`%s` printed \"%s\", expected it to start with \"%s\"", r.cmd, r.out, want);
        cli_free(&r);
    }
}

/* Options as git takes them: `--opt=value`, a short option's value
 * attached, options after the SPEC, `--` before a SPEC; `-` for standard
 * input, from a file or a pipe. */
static void test_option_syntax_and_stdin(void **state) {
    (void)state;
    cli_result a, b;
    EBB(&a, "run", "--device=cpu", "--seed=7", "-ibatch=3", "--repeat=2", "--", "specs/mlp.yaml");
    expect_code(&a, 0);
    EBB(&b, "run", "specs/mlp.yaml", "--device", "cpu", "--seed", "7", "-i", "batch=3",
        "--repeat", "2");
    expect_code(&b, 0);
    /* the same seed and shapes: the same outputs line */
    char *nl = strchr(a.out, '\n');
    assert_non_null(nl);
    if (strncmp(a.out, b.out, (size_t)(nl - a.out + 1)) != 0)
        fail_msg("`%s` and `%s` differ:\n%s\n%s", a.cmd, b.cmd, a.out, b.out);
    expect_contains("stdout", &a, a.out, "output y float32 [3, 10]");
    expect_contains("stdout", &a, a.out, "over 2 runs");
    cli_free(&a);
    cli_free(&b);

    /* a spec on standard input, through a pipe: named <stdin>, otherwise
     * the golden listing */
    stdin_file = EBB_SOURCE_DIR "/specs/mlp.yaml";
    stdin_pipe = 1;
    EBB(&a, "plan", "-", "-i", "batch=8");
    expect_code(&a, 0);
    size_t glen = 0;
    char *golden = slurp(EBB_SOURCE_DIR "/tests/golden/mlp_batch8.plan.txt", &glen);
    assert_non_null(golden);
    assert_true(starts_with(a.out, "plan <stdin>\n"));
    const char *g1 = strchr(golden, '\n'), *a1 = strchr(a.out, '\n');
    if (strcmp(g1, a1) != 0)
        fail_msg("`%s` < mlp.yaml differs from the golden listing:\n%s", a.cmd, a.out);
    free(golden);
    cli_free(&a);
    /* check: standard input among files, each named */
    stdin_pipe = 0;
    EBB(&a, "check", "specs/through.yaml", "-", "specs/mlp.yaml");
    expect_code(&a, 0);
    expect_contains("stdout", &a, a.out,
                    ")\n<stdin>: ok (7 steps, 26122 parameters)\nspecs/mlp.yaml: ok (7 steps, "
                    "26122 parameters)\n");
    assert_true(starts_with(a.out, "specs/through.yaml: ok ("));
    cli_free(&a);
    stdin_file = NULL;
}

/* Output that cannot be written is an error, "ebb: write error: ...";
 * a reader that went away is not (git log | head). */
static void test_write_errors(void **state) {
    (void)state;
    cli_result r;
    stdout_target = "/dev/full";
    EBB(&r, "plan", "specs/mlp.yaml", "--json");
    stdout_target = NULL;
    expect_code(&r, 3);
    expect_contains("stderr", &r, r.err, "ebb: write error: No space left on device");
    cli_free(&r);

    /* more than a pipe holds, into a pipe nobody reads: no message */
    stdout_closed_pipe = 1;
    EBB(&r, "plan", "specs/transformer_encoder.yaml", "-i", "batch=64", "--json");
    stdout_closed_pipe = 0;
    if (r.code != 141 || r.err_len != 0)
        fail_msg("`%s` into a closed pipe exited %d with stderr:\n%s\n(expected 141, in silence)",
                 r.cmd, r.code, r.err);
    cli_free(&r);
}

/* ---- exit codes ---------------------------------------------------------- */

typedef struct exit_case {
    int code;
    const char *err_needle; /* in stderr */
    const char *args[14];
} exit_case;

static const exit_case exit_cases[] = {
    {0, NULL, {"check", "specs/mlp.yaml"}},
    {0, NULL, {"plan", "specs/mlp.yaml", "-i", "x=8,64"}},
    {0, NULL, {"dot", "specs/mlp.yaml"}},
    {0, NULL, {"run", "specs/through.yaml", "--device", "cpu"}},
    /* 1: the spec or an input is at fault */
    {1, "cannot open", {"plan", "specs/no_such_spec.yaml"}},
    {1, "cannot open", {"check", "specs/no_such_spec.yaml"}},
    {1, "cannot open", {"run", "specs/no_such_spec.yaml"}},
    {1, "cannot open", {"dot", "specs/no_such_spec.yaml"}},
    {1, "unknown_op.yaml:7:14: error: ", {"plan", "tests/specs_bad/unknown_op.yaml"}},
    {1, "dimension 1 of input 'x' is 64", {"plan", "specs/mlp.yaml", "-i", "x=8,65"}},
    {1, "has 2 dimensions", {"run", "specs/mlp.yaml", "-i", "x=8"}},
    {1, "no_such.safetensors", {"run", "specs/mlp.yaml", "--weights", "no_such.safetensors"}},
    {1, "no_such.safetensors", {"run", "specs/mlp.yaml", "--inputs", "no_such.safetensors"}},
    /* 2: usage */
    {1, "no param 'width' to set", {"plan", "specs/mlp.yaml", "-p", "width=3"}},
    {1, "'abc' is not a number", {"dot", "specs/mlp.yaml", "-p", "hidden=abc"}},
    {2, "-p needs NAME=NUMBER", {"plan", "specs/mlp.yaml", "-p"}},
    {2, "given twice", {"plan", "specs/mlp.yaml", "-i", "batch=2", "-i", "batch=3"}},
    {2, "use .dot or .gv", {"dot", "specs/mlp.yaml", "-o", "x.txt"}},
    {2, "missing COMMAND", {NULL}},
    {2, "unknown command 'frob'", {"frob"}},
    {2, "unknown command 'plna'; did you mean 'plan'?", {"plna", "specs/mlp.yaml"}},
    {2, "unknown option --frob", {"plan", "specs/mlp.yaml", "--frob"}},
    {2, "unknown option --json", {"run", "specs/mlp.yaml", "--json"}},
    {2, "unknown option --frob", {"check", "--frob", "specs/mlp.yaml"}},
    /* a near miss is named, and where the options are follows */
    {2, "unknown option --weigths; did you mean --weights?",
     {"run", "specs/mlp.yaml", "--weigths=w.safetensors"}},
    {2, "unknown option --batchh; did you mean --batch?",
     {"train", "specs/mlp.yaml", "--data", "fashion-mnist", "--batchh", "3"}},
    {1, "dataset 'fashion-mnst': no such file or directory; a dataset is",
     {"train", "specs/mlp.yaml", "--data", "fashion-mnst"}},
    {2, "--cuda-graph needs a CUDA device; training would run on cpu",
     {"train", "specs/mlp.yaml", "--data", "fashion-mnist", "--cuda-graph", "--device",
      "cpu"}},
    {2, "--lr-schedule: learning-rate schedule 'cosin:10': unknown kind 'cosin'; did you "
        "mean 'cosine'?",
     {"train", "specs/mlp.yaml", "--data", "fashion-mnist", "--lr-schedule", "cosin:10"}},
    {1, "unknown loss op 'frob'",
     {"train", "specs/mlp.yaml", "--data", "fashion-mnist", "--loss", "frob"}},
    {2, "--optimizer: unknown optimizer 'adadeltta'; did you mean 'adadelta'?",
     {"train", "specs/mlp.yaml", "--data", "fashion-mnist", "--optimizer", "adadeltta"}},
    {2, "--momentum applies to --optimizer sgd and rmsprop",
     {"train", "specs/mlp.yaml", "--data", "fashion-mnist", "--optimizer", "adagrad",
      "--momentum", "0.9"}},
    {2, "--cuda-graph and --skip-nonfinite cannot be combined",
     {"train", "specs/mlp.yaml", "--data", "fashion-mnist", "--cuda-graph",
      "--skip-nonfinite"}},
    {2, "missing SPEC", {"plan"}},
    {2, "missing SPEC", {"run"}},
    {2, "missing SPEC", {"dot"}},
    {2, "missing SPEC", {"check"}},
    {2, "unexpected argument", {"plan", "specs/mlp.yaml", "specs/mlp.yaml"}},
    {2, "--repeat", {"run", "specs/mlp.yaml", "--repeat", "0"}},
    {2, "--seed", {"run", "specs/mlp.yaml", "--seed", "-1"}},
    {2, "-i", {"plan", "specs/mlp.yaml", "-i"}},
    {2, "positive integers", {"plan", "specs/mlp.yaml", "-i", "x=8,a"}},
    {2, "NAME=D0", {"plan", "specs/mlp.yaml", "-i", "x"}},
    {2, "bad device 'tpu'", {"run", "specs/mlp.yaml", "--device", "tpu"}},
    /* options as git takes them */
    {2, "option --json takes no value", {"plan", "specs/mlp.yaml", "--json=1"}},
    {2, "--seed needs a non-negative integer", {"run", "specs/mlp.yaml", "--seed="}},
    {2, "unexpected argument --json", {"plan", "--", "specs/mlp.yaml", "--json"}},
    {2, "unknown option -x", {"dot", "-x", "specs/mlp.yaml"}},
    {2, "unknown command 'frob'", {"help", "frob"}},
    {2, "standard input (-) can be read once", {"run", "-", "--weights=-"}},
    {2, "--non-strict applies to --weights", {"run", "specs/mlp.yaml", "--non-strict"}},
    /* -i takes digits and single commas, nothing else */
    {2, "no signs, spaces or empty entries", {"plan", "specs/mlp.yaml", "-i", "x=4,64,"}},
    {2, "no signs, spaces or empty entries", {"plan", "specs/mlp.yaml", "-i", "x=+4,64"}},
    {2, "no signs, spaces or empty entries", {"plan", "specs/mlp.yaml", "-i", "x= 4,64"}},
    {2,
     "more than 8 dimensions (ebb's limit)",
     {"plan", "specs/mlp.yaml", "-i", "x=1,1,1,1,1,1,1,1,1"}},
    {2,
     "a symbolic dimension takes one positive integer",
     {"plan", "specs/mlp.yaml", "-i", "batch=+3"}},
    {2,
     "-i batch=8 contradicts -i x=4,64: dimension 0 of input 'x' is 'batch'",
     {"plan", "specs/mlp.yaml", "-i", "x=4,64", "-i", "batch=8"}},
    /* a directory is not a spec, and says so */
    {1, "specs: is a directory, not a spec file", {"run", "specs"}},
    {1, "specs: is a directory, not a spec file", {"check", "specs"}},
    /* 3: outputs that cannot be written are found before the run */
    {3,
     "--outputs: cannot write 'specs': it is a directory",
     {"run", "specs/mlp.yaml", "--outputs", "specs"}},
    {3,
     "--trace: cannot write 'no/such/t.jsonl': directory 'no/such': No such file",
     {"run", "specs/mlp.yaml", "--trace", "no/such/t.jsonl"}},
    {3, "--save-weights: cannot write", {"run", "specs/mlp.yaml", "--save-weights", "/"}},
    {3,
     "-o: cannot write 'specs.dot/x/y.dot': directory 'specs.dot/x'",
     {"dot", "specs/mlp.yaml", "-o", "specs.dot/x/y.dot"}},
    /* 1: a --memory-budget the plan cannot meet is the number given at
     * fault, not memory that ran out */
    {1,
     "the memory budget is 1.0 KiB",
     {"plan", "specs/mlp.yaml", "--train", "--memory-budget", "1KiB"}},
    {1,
     "over the memory budget of 1.0 KiB",
     {"plan", "specs/mlp.yaml", "-i", "batch=8", "--memory-budget", "1KiB"}},
    /* language models: text data and generation */
    {2, "--block N is needed", {"train", "specs/bigram.yaml", "--data", "text:README.md"}},
    {1,
     "input 'x' is float32: declare it {shape: [batch, T], dtype: int64}",
     {"train", "specs/mlp.yaml", "--data", "text:README.md", "--block", "64"}},
    {2,
     "--prompt is required",
     {"generate", "specs/bigram.yaml", "--weights", "w", "--tokens", "1"}},
    {2,
     "--block N is needed",
     {"generate", "specs/bigram.yaml", "--weights", "w", "--prompt", "a", "--tokens", "1"}},
    {1,
     "the output is float32 [1, 4, 100]; generate needs the scores of the next byte",
     {"generate", "specs/bigram.yaml", "--weights", "w", "--prompt", "a", "--tokens", "1",
      "--block", "4", "-p", "vocab=100"}},
    {1,
     "a language model takes byte tokens",
     {"generate", "specs/mlp.yaml", "--weights", "w", "--prompt", "a", "--tokens", "1"}},
    {1,
     "cannot open 'nothere.safetensors'",
     {"generate", "specs/bigram.yaml", "--weights", "nothere.safetensors", "--prompt", "a",
      "--tokens", "1", "--block", "4"}},
    {2,
     "--prompt and --prompt-file: give one of them",
     {"generate", "specs/bigram.yaml", "--weights", "w", "--prompt", "a", "--prompt-file", "p",
      "--tokens", "1"}},
    {2,
     "--prompt-file: cannot open 'nothere.txt'",
     {"generate", "specs/bigram.yaml", "--weights", "w", "--prompt-file", "nothere.txt",
      "--tokens", "1", "--block", "4"}},
    {2,
     "--batch needs a count from 1 to 4096",
     {"generate", "specs/bigram.yaml", "--weights", "w", "--prompt", "a", "--tokens", "1",
      "--batch", "0"}},
    {2,
     "--stop needs a byte",
     {"generate", "specs/bigram.yaml", "--weights", "w", "--prompt", "a", "--tokens", "1",
      "--stop", "256"}},
    /* 3: a plan that cannot fit is refused before anything runs */
    {3, "this process can get", {"run", "specs/mlp.yaml", "-i", "batch=1000000000"}},
};
#define N_EXIT_CASES (sizeof exit_cases / sizeof exit_cases[0])

/* exit_cases[from, to): each command's exit code and what stderr says */
static void check_exit_cases(size_t from, size_t to) {
    const exit_case *cases = exit_cases;
    for (size_t c = from; c < to && c < N_EXIT_CASES; c++) {
        cli_result r;
        run_prog(&r, NULL, NULL, cases[c].args);
        expect_code(&r, cases[c].code);
        if (cases[c].err_needle)
            expect_contains("stderr", &r, r.err, cases[c].err_needle);
        /* a wrong command line costs two lines: what is wrong, and where
         * the options are (without a command, the short command list) */
        if (cases[c].code == 2 && cases[c].args[0] && strcmp(cases[c].args[0], "help") != 0) {
            int lines = 0;
            for (const char *p = r.err; *p; p++)
                lines += *p == '\n';
            if (cases[c].err_needle && (starts_with(cases[c].err_needle, "unknown option") ||
                                        starts_with(cases[c].err_needle, "missing SPEC")))
                expect_contains("stderr", &r, r.err, "try 'ebb help ");
            if (lines > 2)
                fail_msg("`%s` took %d lines to say what is wrong:\n%s", r.cmd, lines, r.err);
        } else if (cases[c].code == 2 && !cases[c].args[0]) {
            expect_contains("stderr", &r, r.err, "usage: ebb"); /* `ebb` alone: the commands */
        }
        if (!strcmp(cases[c].err_needle ? cases[c].err_needle : "", "dataset 'fashion-mnst': "
                                                                    "no such file or directory; "
                                                                    "a dataset is"))
            expect_contains("stderr", &r, r.err, "; did you mean fashion-mnist?");
        /* a failure always says something */
        if (cases[c].code != 0 && r.err_len == 0)
            fail_msg("`%s` exited %d in silence", r.cmd, r.code);
        /* a run refused for its files or its size printed no result */
        if (cases[c].code == 3 && !strcmp(cases[c].args[0], "run") && strstr(r.out, "output "))
            fail_msg("`%s` ran before failing:\n%s", r.cmd, r.out);
        cli_free(&r);
    }
}

/* the table in halves, for the shards */
static void test_exit_codes(void **state) {
    (void)state;
    check_exit_cases(0, N_EXIT_CASES / 2);
}

static void test_exit_codes_more(void **state) {
    (void)state;
    check_exit_cases(N_EXIT_CASES / 2, N_EXIT_CASES);
}

/* 3: a runtime error. This build's CUDA may be missing; where a device is
 * usable the case cannot be made, so it is skipped. */
static void test_exit_code_runtime(void **state) {
    (void)state;
    cli_result r;
    EBB(&r, "--version");
    expect_code(&r, 0);
    int usable = strstr(r.out, "a device is available") != NULL;
    cli_free(&r);
    if (usable) {
        fprintf(stderr, "skipped: this build has CUDA and a device is available\n");
        skip();
    }
    EBB(&r, "run", "specs/mlp.yaml", "--device", "cuda");
    expect_code(&r, 3);
    expect_contains("stderr", &r, r.err, "cuda");
    cli_free(&r);
    EBB(&r, "run", "specs/mlp.yaml", "--device", "cuda:1");
    expect_code(&r, 3);
    cli_free(&r);
}

/* ---- check --------------------------------------------------------------- */


/* The sorted *.yaml names in `dir` (relative to the source root). */
static int list_yaml(const char *dir, char **names, int max) {
    char path[PATH_MAX];
    FMT(path, "%s/%s", EBB_SOURCE_DIR, dir);
    DIR *d = opendir(path);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        size_t len = strlen(e->d_name);
        if (len > 5 && !strcmp(e->d_name + len - 5, ".yaml")) {
            names[n] = malloc(strlen(dir) + len + 2);
            sprintf(names[n++], "%s/%s", dir, e->d_name);
        }
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    return n;
}

static void test_check_all_specs(void **state) {
    (void)state;
    char *specs[256];
    int n = list_yaml("specs", specs, 256);
    assert_true(n >= 4);
    const char *args[260];
    args[0] = "check";
    for (int i = 0; i < n; i++)
        args[i + 1] = specs[i];
    args[n + 1] = NULL;
    cli_result r;
    run_prog(&r, NULL, NULL, args);
    expect_code(&r, 0);
    assert_int_equal(r.err_len, 0);
    /* one line per spec, in order: "SPEC: ok (N steps, P parameters)", with
     * ", B in buffers" before the ")" where the spec has buffers */
    const char *line = r.out;
    for (int i = 0; i < n; i++) {
        char prefix[PATH_MAX + 16];
        snprintf(prefix, sizeof prefix, "%s: ok (", specs[i]);
        if (!starts_with(line, prefix))
            fail_msg("line %d of `ebb check` is not \"%s...\": %.200s", i + 1, prefix, line);
        int steps = 0, used = 0, more = 0;
        long long params = 0, buffers = 0;
        const char *rest = line + strlen(prefix);
        if (sscanf(rest, "%d steps, %lld parameters)\n%n", &steps, &params, &used) == 2 &&
            used > 0 && steps >= 1) {
            line = rest + used;
            continue;
        }
        if (sscanf(rest, "%d steps, %lld parameters, %lld in buffers)\n%n", &steps, &params,
                   &buffers, &more) != 3 ||
            more == 0 || steps < 1 || buffers < 1)
            fail_msg("bad `ebb check` line: %.200s", line);
        line = rest + more;
    }
    assert_int_equal(*line, '\0');
    cli_free(&r);
    for (int i = 0; i < n; i++)
        free(specs[i]);

    /* N and P agree with the plan: steps, and parameter elements */
    EBB(&r, "check", "specs/mlp.yaml");
    expect_code(&r, 0);
    cJSON *plan = plan_json("specs/mlp.yaml", NULL);
    long long elements = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(plan, "params"))
        elements += shape_numel(p, "params");
    char want[128];
    snprintf(want, sizeof want, "specs/mlp.yaml: ok (%d steps, %lld parameters)\n",
             cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(plan, "steps")), elements);
    assert_string_equal(r.out, want);
    cJSON_Delete(plan);
    cli_free(&r);
}

static void test_check_bad_specs(void **state) {
    (void)state;
    /* a spec of our own, with the error at a known line and column */
    char bad[PATH_MAX], good[PATH_MAX];
    tmp_path(bad, sizeof bad, "bad.yaml");
    const char *text = "ebb: 1\n"
                       "inputs:\n"
                       "  x: [batch, 16]\n"
                       "flow:\n"
                       "  - from: {linear: {out: 16}}\n"
                       "  - through: sigmoidd\n";
    assert_int_equal(write_file(bad, text, strlen(text)), 0);
    FMT(good, "%s/specs/mlp.yaml", EBB_SOURCE_DIR);
    cli_result r;
    EBB(&r, "check", bad);
    expect_code(&r, 1);
    char want[PATH_MAX + 32];
    snprintf(want, sizeof want, "%s:6:14: error: ", bad);
    if (!starts_with(r.err, want))
        fail_msg("stderr of `%s` is not \"%s...\":\n%s", r.cmd, want, r.err);
    expect_contains("stderr", &r, r.err, "sigmoidd");
    assert_int_equal(r.out_len, 0);
    cli_free(&r);

    /* a bad spec among good ones: the good ones still report ok, exit 1 */
    EBB(&r, "check", good, bad, good);
    expect_code(&r, 1);
    char ok[PATH_MAX + 40];
    snprintf(ok, sizeof ok, "%s: ok (7 steps, ", good);
    assert_true(starts_with(r.out, ok));
    assert_non_null(strstr(strchr(r.out, '\n') + 1, ok));
    assert_true(starts_with(r.err, want));
    cli_free(&r);

    /* plan, run and dot report the same error the same way */
    static const char *const cmds[] = {"plan", "run", "dot"};
    for (int i = 0; i < 3; i++) {
        run_prog(&r, NULL, NULL, ARGS(cmds[i], bad));
        expect_code(&r, 1);
        expect_contains("stderr", &r, r.err, want);
        cli_free(&r);
    }

    /* every spec in tests/specs_bad: the "# expect:" line, exactly, in one
     * invocation run from that directory (paths are bare names) */
    char *specs[256];
    int n = list_yaml("tests/specs_bad", specs, 256);
    assert_true(n > 0);
    const char *args[260];
    args[0] = "check";
    char expected[65536];
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX];
        FMT(path, "%s/%s", EBB_SOURCE_DIR, specs[i]);
        char *spec = slurp(path, NULL);
        assert_non_null(spec);
        char *exp = strstr(spec, "# expect: ");
        if (!exp)
            fail_msg("%s has no \"# expect:\" line", specs[i]);
        exp += strlen("# expect: ");
        size_t len = strcspn(exp, "\n");
        /* the expect line names the file by its bare name; we pass the full path */
        at += (size_t)snprintf(expected + at, sizeof expected - at, "%s/tests/specs_bad/%.*s\n",
                               EBB_SOURCE_DIR, (int)len, exp);
        assert_true(at < sizeof expected);
        free(spec);
        char *full = malloc(strlen(path) + 1);
        strcpy(full, path);
        free(specs[i]);
        specs[i] = full;
        args[i + 1] = specs[i];
    }
    args[n + 1] = NULL;
    run_prog(&r, NULL, NULL, args);
    expect_code(&r, 1);
    assert_int_equal(r.out_len, 0);
    if (strcmp(r.err, expected) != 0) {
        const char *e = expected, *g = r.err;
        while (*e && *e == *g)
            e++, g++;
        while (e > expected && e[-1] != '\n')
            e--, g--;
        fail_msg("`ebb check tests/specs_bad/*.yaml` differs from the \"# expect:\" lines:\n"
                 "  expected: %.*s\n  actual:   %.*s",
                 (int)strcspn(e, "\n"), e, (int)strcspn(g, "\n"), g);
    }
    cli_free(&r);
    for (int i = 0; i < n; i++)
        free(specs[i]);
}

/* ---- goldens: listing, JSON, DOT ----------------------------------------- */

typedef struct golden_spec {
    const char *name; /* golden file stem */
    const char *spec;
    const char *bind; /* -i value, or NULL */
} golden_spec;

static const golden_spec goldens[] = {
    {"mlp_batch8", "specs/mlp.yaml", "batch=8"},
    {"switch_routed", "specs/switch_routed.yaml", "batch=4"},
    {"feedback", "specs/feedback.yaml", NULL},
    {"gate_topk", "specs/gate_topk.yaml", "x=6,16"},
    {"loop_for", "specs/loop_for.yaml", "batch=2"},
};
#define N_GOLDENS ((int)(sizeof goldens / sizeof goldens[0]))

static void run_with_bind(cli_result *r, const char *cmd, const char *spec, const char *flag,
                          const char *bind) {
    const char *args[8];
    int n = 0;
    args[n++] = cmd;
    args[n++] = spec;
    if (flag)
        args[n++] = flag;
    if (bind) {
        args[n++] = "-i";
        args[n++] = bind;
    }
    args[n] = NULL;
    run_prog(r, NULL, NULL, args);
}

static void test_golden_listing(void **state) {
    (void)state;
    for (int i = 0; i < N_GOLDENS; i++) {
        cli_result r;
        run_with_bind(&r, "plan", goldens[i].spec, NULL, goldens[i].bind);
        expect_code(&r, 0);
        char name[128];
        snprintf(name, sizeof name, "%s.plan.txt", goldens[i].name);
        golden_check(name, r.out, r.out_len);
        cli_free(&r);
    }
}

static void test_golden_json(void **state) {
    (void)state;
    for (int i = 0; i < N_GOLDENS; i++) {
        cli_result r;
        run_with_bind(&r, "plan", goldens[i].spec, "--json", goldens[i].bind);
        expect_code(&r, 0);
        /* --json is quiet: nothing but the JSON, even for defaulted dims */
        assert_int_equal(r.err_len, 0);
        cJSON *j = json_strict(r.out, r.out_len, r.cmd);
        check_plan_json(j, r.cmd);
        if (straight_line(j))
            check_frees_at_last_use(j, r.cmd);
        cJSON_Delete(j);
        char name[128];
        snprintf(name, sizeof name, "%s.plan.json", goldens[i].name);
        golden_check(name, r.out, r.out_len);
        cli_free(&r);
    }
}

static int have_graphviz(void) {
    cli_result r;
    run_prog(&r, "dot", NULL, ARGS("-V"));
    int ok = r.code == 0;
    cli_free(&r);
    return ok;
}

/* Runs `dot -Tsvg` on the DOT text; it must succeed without a warning. */
static void dot_renders(const char *dot_text, size_t len, const char *what) {
    char in[PATH_MAX], out[PATH_MAX];
    tmp_path(in, sizeof in, "render.dot");
    tmp_path(out, sizeof out, "render.svg");
    assert_int_equal(write_file(in, dot_text, len), 0);
    cli_result r;
    run_prog(&r, "dot", NULL, ARGS("-Tsvg", "-o", out, in));
    if (r.code != 0 || r.err_len != 0)
        fail_msg("dot -Tsvg of %s exited %d:\n%s", what, r.code, r.err);
    size_t n = 0;
    char *svg = slurp(out, &n);
    assert_non_null(svg);
    if (!strstr(svg, "<svg"))
        fail_msg("dot -Tsvg of %s wrote no <svg", what);
    free(svg);
    cli_free(&r);
}

static void test_golden_dot(void **state) {
    (void)state;
    int graphviz = have_graphviz();
    if (!graphviz)
        fprintf(stderr, "note: Graphviz's dot is not installed; DOT is not rendered\n");
    for (int i = 0; i < N_GOLDENS; i++) {
        for (int view = 0; view < 2; view++) {
            cli_result r;
            run_with_bind(&r, "dot", goldens[i].spec, view ? "--plan" : NULL, goldens[i].bind);
            expect_code(&r, 0);
            assert_true(starts_with(r.out, "digraph "));
            char name[128];
            snprintf(name, sizeof name, "%s.%s.dot", goldens[i].name, view ? "plan" : "graph");
            golden_check(name, r.out, r.out_len);
            if (graphviz)
                dot_renders(r.out, r.out_len, r.cmd);
            cli_free(&r);
        }
    }
}

/* Every spec, both views, renders; every spec's JSON passes the checks. */
/* Every spec's plan as JSON (view 0), its graph (1) or its plan (2) as DOT
 * that Graphviz renders: three tests, so that shards run them side by side. */
static void all_specs_view(int view) {
    if (view && !have_graphviz()) {
        fprintf(stderr, "skipped rendering: Graphviz's dot is not installed\n");
        skip();
    }
    char *specs[256];
    int n = list_yaml("specs", specs, 256);
    for (int i = 0; i < n; i++) {
        if (view == 0) {
            cJSON *j = plan_json(specs[i], NULL);
            if (straight_line(j))
                check_frees_at_last_use(j, specs[i]);
            cJSON_Delete(j);
        } else {
            cli_result r;
            if (view == 2)
                EBB(&r, "dot", specs[i], "--plan");
            else
                EBB(&r, "dot", specs[i]);
            expect_code(&r, 0);
            dot_renders(r.out, r.out_len, r.cmd);
            cli_free(&r);
        }
        free(specs[i]);
    }
}

static void test_all_specs_json(void **state) {
    (void)state;
    all_specs_view(0);
}

static void test_all_specs_dot_graph(void **state) {
    (void)state;
    all_specs_view(1);
}

static void test_all_specs_dot_plan(void **state) {
    (void)state;
    all_specs_view(2);
}

static void test_dot_output_files(void **state) {
    (void)state;
    cli_result r, stdout_dot;
    char path[PATH_MAX];
    EBB(&stdout_dot, "dot", "specs/switch_routed.yaml", "--plan");
    expect_code(&stdout_dot, 0);

    /* -o FILE.dot writes what stdout would have had */
    tmp_path(path, sizeof path, "plan.dot");
    EBB(&r, "dot", "specs/switch_routed.yaml", "--plan", "-o", path);
    expect_code(&r, 0);
    assert_int_equal(r.out_len, 0);
    size_t n = 0;
    char *text = slurp(path, &n);
    assert_non_null(text);
    assert_int_equal(n, stdout_dot.out_len);
    assert_memory_equal(text, stdout_dot.out, n);
    free(text);
    cli_free(&r);
    cli_free(&stdout_dot);

    /* without Graphviz on PATH, rendering says how to install it */
    char empty[PATH_MAX];
    tmp_path(empty, sizeof empty, "empty_bin");
    mkdir(empty, 0755);
    tmp_path(path, sizeof path, "none.svg");
    run_prog(&r, NULL, empty, ARGS("dot", "specs/mlp.yaml", "-o", path));
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, "Graphviz");
    expect_contains("stderr", &r, r.err, "apt-get install graphviz");
    assert_int_equal(access(path, F_OK), -1);
    cli_free(&r);

    if (!have_graphviz()) {
        fprintf(stderr, "skipped rendering: Graphviz's dot is not installed\n");
        skip();
    }
    static const struct {
        const char *file;
        const char *magic;
        size_t magic_len;
    } renders[] = {
        {"graph.svg", "<?xml", 5},
        {"graph.png", "\x89PNG\r\n\x1a\n", 8},
    };
    for (int view = 0; view < 2; view++) {
        for (size_t i = 0; i < sizeof renders / sizeof renders[0]; i++) {
            char name[64];
            snprintf(name, sizeof name, "%s%s", view ? "plan_" : "", renders[i].file);
            tmp_path(path, sizeof path, name);
            if (view)
                EBB(&r, "dot", "specs/gate_topk.yaml", "--plan", "-o", path);
            else
                EBB(&r, "dot", "specs/gate_topk.yaml", "-o", path);
            expect_code(&r, 0);
            assert_int_equal(r.out_len, 0);
            char *file = slurp(path, &n);
            if (!file || n < renders[i].magic_len ||
                memcmp(file, renders[i].magic, renders[i].magic_len) != 0)
                fail_msg("`%s` did not write a %s file", r.cmd, strrchr(path, '.'));
            if (i == 0 && !strstr(file, "<svg"))
                fail_msg("`%s` wrote no <svg element", r.cmd);
            free(file);
            cli_free(&r);
        }
    }
}

/* ---- plan options -------------------------------------------------------- */

/* --precision bf16: casts as steps, low values marked, parameters float32;
 * with --loss-scale, the unscale step and what waiting for it costs; with
 * --weight-copies keep, every low weight copy kept and the steps named; an
 * unknown precision, a scale that is not positive or an unknown
 * --weight-copies is a usage error naming it. */
static void test_plan_precision(void **state) {
    (void)state;
    cli_result r;
    EBB(&r, "plan", "specs/mlp.yaml", "-i", "batch=8", "--train", "--precision", "bf16",
        "--loss-scale", "1024");
    expect_code(&r, 0);
    expect_contains("stdout", &r, r.out, "  unscale              gradients");
    expect_contains("stdout", &r, r.out, "loss scaling: the updates wait for every gradient");
    expect_contains("stdout", &r, r.out, "  cast                 flow.0.cast0");
    expect_contains("stdout", &r, r.out, "bf16[8, 128]");
    expect_contains("stdout", &r, r.out, "cast.backward");
    expect_contains("stdout", &r, r.out, "6 of 6 parameter tensors trained");
    expect_contains("stdout", &r, r.out, "low weight copies:");
    cli_free(&r);
    EBB(&r, "plan", "specs/mlp.yaml", "-i", "batch=8", "--train", "--precision", "bf16",
        "--weight-copies", "keep");
    expect_code(&r, 0);
    expect_contains("stdout", &r, r.out, "low weight copies: 6 kept from the forward for the "
                                         "backward");
    expect_contains("stdout", &r, r.out, "  kept at steps ");
    cli_free(&r);
    EBB(&r, "plan", "specs/mlp.yaml", "--train", "--weight-copies", "all");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--weight-copies all: expected auto, keep or recast");
    cli_free(&r);
    EBB(&r, "plan", "specs/mlp.yaml", "--precision", "tf32");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--precision tf32: expected fp32, bf16 or fp16");
    cli_free(&r);
    EBB(&r, "plan", "specs/mlp.yaml", "--train", "--loss-scale", "0");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--loss-scale 0: expected a positive scale");
    cli_free(&r);
    EBB(&r, "plan", "specs/mlp.yaml", "--precision", "fp32");
    expect_code(&r, 0);
    if (strstr(r.out, "cast"))
        fail_msg("`%s` planned casts:\n%s", r.cmd, r.out);
    cli_free(&r);
}

/* --accumulate N: a grad_sum step per trained parameter, one grad_sums step
 * that jumps to the end, the sums held beside the parameters (the listing
 * and the JSON say so, and their bytes are the parameters'); without
 * --train, or not a count, a usage error. */
static void test_plan_accumulate(void **state) {
    (void)state;
    cli_result r;
    EBB(&r, "plan", "specs/mlp.yaml", "-i", "batch=8", "--train", "--accumulate", "4");
    expect_code(&r, 0);
    expect_contains("stdout", &r, r.out, "  grad_sum             fc1.weight");
    expect_contains("stdout", &r, r.out, "  grad_sums            gradients");
    expect_contains("stdout", &r, r.out, "accumulation: 4 micro-batches a step");
    cli_free(&r);
    EBB(&r, "plan", "specs/mlp.yaml", "-i", "batch=8", "--train", "--accumulate", "4", "--json");
    expect_code(&r, 0);
    cJSON *plan = cJSON_Parse(r.out);
    if (!plan) fail_msg("`%s`: not JSON", r.cmd);
    cJSON *acc = cJSON_GetObjectItemCaseSensitive(plan, "accumulate");
    long long sums = int_field(acc, "grad_sums_bytes", "accumulate");
    if (int_field(acc, "micro_batches", "accumulate") != 4 ||
        sums != int_field(plan, "param_bytes", "plan"))
        fail_msg("`%s`: accumulate %s, param_bytes %lld", r.cmd, cJSON_PrintUnformatted(acc),
                 int_field(plan, "param_bytes", "plan"));
    int n_sum = 0, n_sums = 0, n_held = 0, n = 0;
    cJSON *s;
    cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(plan, "steps")) {
        const char *op = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s, "op"));
        n_sum += op && !strcmp(op, "grad_sum");
        n_sums += op && !strcmp(op, "grad_sums");
        n++;
    }
    cJSON *v;
    cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(plan, "values")) {
        const char *kind = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(v, "kind"));
        n_held += kind && !strcmp(kind, "held");
    }
    if (n_sum != 6 || n_sums != 1 || n_held != 6)
        fail_msg("`%s`: %d grad_sum, %d grad_sums steps of %d, %d held values", r.cmd, n_sum,
                 n_sums, n, n_held);
    cJSON_Delete(plan);
    cli_free(&r);
    EBB(&r, "plan", "specs/mlp.yaml", "--accumulate", "4");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--accumulate and --data-parallel apply to --train");
    cli_free(&r);
    EBB(&r, "plan", "specs/mlp.yaml", "--train", "--accumulate", "0");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--accumulate needs a positive integer");
    cli_free(&r);
}

static void test_plan_memory_and_keep_all(void **state) {
    (void)state;
    cJSON *plan = plan_json("specs/mlp.yaml", "batch=8");
    long long peak = int_field(plan, "peak_bytes", "plan"), at = int_field(plan, "peak_step", "plan");
    long long keep_all = int_field(plan, "keep_all_peak_bytes", "plan");
    int n_steps = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(plan, "steps"));
    cJSON_Delete(plan);

    cli_result r, plain;
    EBB(&plain, "plan", "specs/mlp.yaml", "-i", "batch=8");
    expect_code(&plain, 0);
    EBB(&r, "plan", "specs/mlp.yaml", "-i", "batch=8", "--memory");
    expect_code(&r, 0);
    /* the listing, then the chart: one bar per step, the peak's drawn in # */
    assert_memory_equal(r.out, plain.out, plain.out_len);
    const char *chart = r.out + plain.out_len;
    char want[128];
    FMT(want, "predicted live bytes per step (peak %lld at step %lld)", peak, at);
    expect_contains("stdout", &r, chart, want);
    int bars = 0, peak_row = -1;
    for (const char *l = strchr(chart + 1, '\n'); l && l[1]; l = strchr(l + 1, '\n')) {
        const char *bar = strchr(l, '|');
        assert_non_null(bar);
        if (bar[1] == '#') {
            assert_int_equal(peak_row, -1);
            peak_row = atoi(l + 1);
        }
        bars++;
    }
    assert_int_equal(bars, n_steps);
    assert_int_equal(peak_row, at);
    cli_free(&r);

    /* the listing's summary names the peak, its step and the keep_all peak */
    FMT(want, "predicted peak %lld bytes", peak);
    expect_contains("stdout", &plain, plain.out, want);
    FMT(want, "at step %lld ", at);
    expect_contains("stdout", &plain, plain.out, want);
    FMT(want, "keep_all peak %lld bytes", keep_all);
    expect_contains("stdout", &plain, plain.out, want);
    cli_free(&plain);

    /* --keep-all: nothing freed, and the peak is the keep_all peak */
    EBB(&r, "plan", "specs/mlp.yaml", "-i", "batch=8", "--json", "--keep-all");
    expect_code(&r, 0);
    cJSON *j = json_strict(r.out, r.out_len, r.cmd);
    check_plan_json(j, r.cmd);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "keep_all")));
    const cJSON *s;
    cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(j, "steps"))
        assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(s, "frees")), 0);
    assert_int_equal(int_field(j, "peak_bytes", "keep_all"),
                     int_field(j, "keep_all_peak_bytes", "keep_all"));
    cJSON_Delete(j);
    cli_free(&r);
}

/* ---- run: the trace ------------------------------------------------------ */

typedef struct trace {
    cJSON *lines[512];
    int n;          /* step lines */
    cJSON *summary; /* the last line's "summary" object */
    cJSON *all[513];
    int n_all;
} trace;

static void trace_free(trace *t) {
    for (int i = 0; i < t->n_all; i++)
        cJSON_Delete(t->all[i]);
    memset(t, 0, sizeof *t);
}

/* Reads a JSONL trace: every line strict JSON, step lines then one summary. */
static void trace_read(trace *t, const char *path, const cJSON *plan) {
    memset(t, 0, sizeof *t);
    size_t len = 0;
    char *text = slurp(path, &len);
    if (!text)
        fail_msg("no trace at %s", path);
    if (len == 0 || text[len - 1] != '\n')
        fail_msg("trace %s does not end with a newline", path);
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(plan, "steps");
    int n_steps = cJSON_GetArraySize(steps);
    char ctx[64];
    /* Values as the trace alone tells them: written (by an earlier record's
     * `outputs`, or a graph input), then maybe freed. A record may read only
     * what is written and not freed since. */
    const char *ids[1024];
    char state[1024]; /* 'w' written, 'f' freed */
    int n_ids = 0;
    const cJSON *in;
    cJSON_ArrayForEach(in, cJSON_GetObjectItemCaseSensitive(plan, "inputs")) {
        ids[n_ids] = str_field(in, "name", "plan input");
        state[n_ids++] = 'w';
    }
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        *nl = '\0';
        snprintf(ctx, sizeof ctx, "trace line %d", t->n_all + 1);
        if (t->summary)
            fail_msg("%s: a line after the summary", ctx);
        assert_true(t->n_all < 512);
        cJSON *j = json_strict(line, strlen(line), ctx);
        t->all[t->n_all++] = j;
        const cJSON *summary = cJSON_GetObjectItemCaseSensitive(j, "summary");
        if (summary) {
            t->summary = (cJSON *)field(j, "summary", J_OBJ, ctx);
            int_field(t->summary, "steps", "summary");
            int_field(t->summary, "peak_bytes", "summary");
            int_field(t->summary, "planned_peak_bytes", "summary");
            int_field(t->summary, "live_tensors_after", "summary");
            assert_string_equal(str_field(t->summary, "peak_kind", "summary"),
                                str_field(plan, "peak_kind", "plan"));
        } else {
            long long step = int_field(j, "step", ctx);
            if (step < 0 || step >= n_steps)
                fail_msg("%s: step %lld out of range", ctx, step);
            const cJSON *ps = cJSON_GetArrayItem(steps, (int)step);
            /* the trace names the step as the plan does */
            assert_string_equal(str_field(j, "op", ctx), str_field(ps, "op", "plan"));
            assert_string_equal(str_field(j, "node", ctx), str_field(ps, "node", "plan"));
            char *a = cJSON_PrintUnformatted(field(j, "inputs", J_ARR, ctx));
            char *b = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(ps, "inputs"));
            assert_string_equal(a, b);
            cJSON_free(a);
            cJSON_free(b);
            const cJSON *jumped = cJSON_GetObjectItemCaseSensitive(j, "jumped");
            int skipped = cJSON_IsTrue(jumped) && !strcmp(str_field(ps, "op", "plan"), "enter");
            const cJSON *out = field(j, "output", J_STR_OR_NULL, ctx);
            const cJSON *pout = cJSON_GetObjectItemCaseSensitive(ps, "output");
            assert_int_equal(cJSON_IsNull(out), cJSON_IsNull(pout) || skipped);
            if (cJSON_IsString(out))
                assert_string_equal(out->valuestring, pout->valuestring);
            /* outputs: every value the step writes, as the plan lists them
             * (none for a branch skipped for want of rows) */
            a = cJSON_PrintUnformatted(field(j, "outputs", J_ARR, ctx));
            b = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(ps, "outputs"));
            assert_string_equal(a, skipped ? "[]" : b);
            cJSON_free(a);
            cJSON_free(b);
            /* measured figures for the step itself */
            long long peak = int_field(j, "peak_bytes", ctx);
            assert_true(peak >= int_field(j, "live_bytes", ctx));
            assert_int_equal(int_field(j, "planned_peak_bytes", ctx),
                             int_field(ps, "peak_bytes", "plan"));
            if (peak > int_field(ps, "peak_bytes", "plan"))
                fail_msg("%s (step %lld, %s): measured peak %lld above the plan's %lld", ctx, step,
                         str_field(ps, "node", "plan"), peak, int_field(ps, "peak_bytes", "plan"));
            const cJSON *secs = field(j, "seconds", J_NUM, ctx);
            assert_true(secs->valuedouble >= 0.0);
            /* from the trace alone: nothing is read before it is written, or
             * after it is freed */
            const cJSON *id;
            cJSON_ArrayForEach(id, cJSON_GetObjectItemCaseSensitive(j, "inputs")) {
                int k = 0;
                while (k < n_ids && strcmp(ids[k], id->valuestring) != 0)
                    k++;
                if (k == n_ids || state[k] != 'w')
                    fail_msg("%s (step %lld): reads %s, which %s", ctx, step, id->valuestring,
                             k == n_ids ? "no earlier record wrote" : "was freed before");
            }
            cJSON_ArrayForEach(id, cJSON_GetObjectItemCaseSensitive(j, "outputs")) {
                int k = 0;
                while (k < n_ids && strcmp(ids[k], id->valuestring) != 0)
                    k++;
                if (k == n_ids) {
                    assert_true(n_ids < 1024);
                    ids[n_ids++] = id->valuestring;
                }
                state[k] = 'w';
            }
            cJSON_ArrayForEach(id, cJSON_GetObjectItemCaseSensitive(j, "freed")) {
                int k = 0;
                while (k < n_ids && strcmp(ids[k], id->valuestring) != 0)
                    k++;
                if (k == n_ids)
                    fail_msg("%s (step %lld): frees %s, which no record wrote", ctx, step,
                             id->valuestring);
                state[k] = 'f';
            }
            check_ids(field(j, "freed", J_ARR, ctx),
                      cJSON_GetObjectItemCaseSensitive(plan, "values"), ctx);
            assert_true(int_field(j, "live_bytes", ctx) >= 0);
            /* freed: the plan's frees for the edge taken */
            const cJSON *want = cJSON_IsTrue(jumped)
                                    ? cJSON_GetObjectItemCaseSensitive(ps, "jump_frees")
                                    : cJSON_GetObjectItemCaseSensitive(ps, "frees");
            a = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(j, "freed"));
            b = want ? cJSON_PrintUnformatted(want) : NULL;
            if (!b || strcmp(a, b) != 0)
                fail_msg("%s (step %lld%s): freed %s, the plan frees %s", ctx, step,
                         cJSON_IsTrue(jumped) ? ", jumped" : "", a, b ? b : "(nothing listed)");
            cJSON_free(a);
            cJSON_free(b);
            t->lines[t->n++] = j;
        }
        line = nl + 1;
    }
    free(text);
    if (!t->summary)
        fail_msg("trace %s has no summary line", path);
    if (int_field(t->summary, "steps", "summary") != t->n)
        fail_msg("summary says %lld steps, the trace has %d",
                 int_field(t->summary, "steps", "summary"), t->n);
    if (int_field(t->summary, "live_tensors_after", "summary") != 0)
        fail_msg("%lld tensors live after the run",
                 int_field(t->summary, "live_tensors_after", "summary"));
    if (int_field(t->summary, "planned_peak_bytes", "summary") !=
        int_field(plan, "peak_bytes", "plan"))
        fail_msg("summary's planned_peak_bytes %lld, the plan's peak_bytes %lld",
                 int_field(t->summary, "planned_peak_bytes", "summary"),
                 int_field(plan, "peak_bytes", "plan"));
}

static void test_trace_straight_line(void **state) {
    (void)state;
    char path[PATH_MAX];
    tmp_path(path, sizeof path, "mlp.jsonl");
    cJSON *plan = plan_json("specs/mlp.yaml", "batch=8");
    assert_true(straight_line(plan));
    cli_result r;
    EBB(&r, "run", "specs/mlp.yaml", "-i", "batch=8", "--device", "cpu", "--trace", path,
        "--repeat", "3");
    expect_code(&r, 0);
    expect_contains("stdout", &r, r.out, "output y float32 [8, 10]");
    expect_contains("stdout", &r, r.out, "over 3 runs");
    cli_free(&r);
    trace t;
    trace_read(&t, path, plan);
    /* one run traced (not three), every step once, in order */
    int n_steps = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(plan, "steps"));
    assert_int_equal(t.n, n_steps);
    int freed_count = 0;
    for (int i = 0; i < t.n; i++) {
        assert_int_equal(int_field(t.lines[i], "step", "trace"), i);
        /* each value is freed at the step equal to its last_use */
        const cJSON *f;
        cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(t.lines[i], "freed")) {
            const cJSON *v = value_by_id(plan, f->valuestring);
            if (int_field(v, "last_use", "plan") != i)
                fail_msg("trace frees %s at step %d, its last_use is %lld", f->valuestring, i,
                         int_field(v, "last_use", "plan"));
            freed_count++;
        }
        /* on the CPU a straight line is predicted exactly */
        const cJSON *ps = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(plan, "steps"), i);
        if (int_field(t.lines[i], "live_bytes", "trace") != int_field(ps, "live_bytes", "plan"))
            fail_msg("step %d: measured live_bytes %lld, planned %lld", i,
                     int_field(t.lines[i], "live_bytes", "trace"),
                     int_field(ps, "live_bytes", "plan"));
    }
    /* every intermediate freed */
    int intermediates = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(plan, "values"))
        intermediates += !strcmp(str_field(v, "kind", "plan"), "intermediate");
    assert_int_equal(freed_count, intermediates);
    assert_int_equal(int_field(t.summary, "peak_bytes", "summary"),
                     int_field(t.summary, "planned_peak_bytes", "summary"));
    trace_free(&t);
    cJSON_Delete(plan);
}

static void test_trace_loop_iterations(void **state) {
    (void)state;
    char path[PATH_MAX];
    tmp_path(path, sizeof path, "loop.jsonl");
    cJSON *plan = plan_json("specs/loop_for.yaml", "batch=2");
    cli_result r;
    EBB(&r, "run", "specs/loop_for.yaml", "-i", "batch=2", "--device", "cpu", "--trace", path);
    expect_code(&r, 0);
    cli_free(&r);
    trace t;
    trace_read(&t, path, plan);
    /* the body (from the step after loop_init to loop_next) runs `times: 4` */
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(plan, "steps");
    int init = -1, next = -1;
    for (int i = 0; i < cJSON_GetArraySize(steps); i++) {
        const char *op = str_field(cJSON_GetArrayItem(steps, i), "op", "plan");
        if (!strcmp(op, "loop_init"))
            init = i;
        if (!strcmp(op, "loop_next"))
            next = i;
    }
    assert_true(init >= 0 && next > init);
    int n_steps = cJSON_GetArraySize(steps);
    int body = next - init, expect_lines = (n_steps - body) + 4 * body;
    assert_int_equal(t.n, expect_lines);
    int at = 0;
    for (int i = 0; i <= init; i++)
        assert_int_equal(int_field(t.lines[at++], "step", "trace"), i);
    for (int it = 0; it < 4; it++) {
        for (int i = init + 1; i <= next; i++)
            assert_int_equal(int_field(t.lines[at++], "step", "trace"), i);
        const cJSON *jumped = cJSON_GetObjectItemCaseSensitive(t.lines[at - 1], "jumped");
        assert_int_equal(cJSON_IsTrue(jumped), it < 3);
    }
    for (int i = next + 1; i < n_steps; i++)
        assert_int_equal(int_field(t.lines[at++], "step", "trace"), i);
    trace_free(&t);
    cJSON_Delete(plan);
}

/* Switch, top-k gate and a learned halting loop: control steps appear with
 * their own frees, each the plan's frees for the edge taken. */
static void test_trace_control_flow(void **state) {
    (void)state;
    static const char *const specs[] = {"specs/switch_routed.yaml", "specs/gate_topk.yaml",
                                        "specs/feedback.yaml", "specs/loop_while.yaml"};
    for (int i = 0; i < 4; i++) {
        char path[PATH_MAX];
        tmp_path(path, sizeof path, "control.jsonl");
        cJSON *plan = plan_json(specs[i], "batch=4");
        cli_result r;
        EBB(&r, "run", specs[i], "-i", "batch=4", "--device", "cpu", "--seed", "3", "--trace",
            path);
        expect_code(&r, 0);
        cli_free(&r);
        trace t;
        trace_read(&t, path, plan);
        assert_true(t.n > 0);
        trace_free(&t);
        cJSON_Delete(plan);
    }
}

/* ---- chart --------------------------------------------------------------- */

/* `ebb chart` draws a run's trace over its plan: well-formed SVG whose
 * measured points are the trace's live bytes and whose peak label is the
 * plan's; a trace of the same spec run with other shapes is refused; where
 * rsvg-convert is installed (Debian's librsvg2-bin) the SVG renders. */
static void test_chart_command(void **state) {
    (void)state;
    char trace_path[PATH_MAX], svg_path[PATH_MAX], png_path[PATH_MAX];
    tmp_path(trace_path, sizeof trace_path, "chart.jsonl");
    tmp_path(svg_path, sizeof svg_path, "chart.svg");
    tmp_path(png_path, sizeof png_path, "chart.png");
    cli_result r;
    EBB(&r, "run", "specs/mlp.yaml", "-i", "batch=8", "--device", "cpu", "--trace", trace_path);
    expect_code(&r, 0);
    cli_free(&r);
    EBB(&r, "chart", "specs/mlp.yaml", "-i", "batch=8", "--trace", trace_path, "-o", svg_path);
    expect_code(&r, 0);
    assert_int_equal(r.out_len, 0);
    cli_free(&r);
    size_t n = 0;
    char *svg = slurp_svg(svg_path, "ebb chart", &n);

    /* the trace's step lines, in order, are the overlay's points */
    char *jsonl = slurp(trace_path, NULL);
    assert_non_null(jsonl);
    char want[4096] = "", steps[1024] = "";
    size_t at = 0, st_at = 0;
    long long planned_peak = -1;
    for (char *line = strtok(jsonl, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = json_strict(line, strlen(line), "trace");
        const cJSON *summary = cJSON_GetObjectItemCaseSensitive(j, "summary");
        if (summary) {
            planned_peak = int_field(summary, "planned_peak_bytes", "summary");
            assert_string_equal(str_field(summary, "device", "summary"), "cpu");
        } else {
            at += (size_t)snprintf(want + at, sizeof want - at, "%s%lld", at ? " " : "",
                                   int_field(j, "live_bytes", "trace"));
            st_at += (size_t)snprintf(steps + st_at, sizeof steps - st_at, "%s%lld",
                                      st_at ? " " : "", int_field(j, "step", "trace"));
        }
        cJSON_Delete(j);
    }
    free(jsonl);
    char needle[4200];
    FMT(needle, "data-steps=\"%s\" data-live-bytes=\"%s\"", steps, want);
    if (!strstr(svg, needle))
        fail_msg("the chart lacks the trace's points %s", needle);
    /* the plan's peak (on the CPU, the trace's planned peak), labelled */
    FMT(needle, "<g id=\"peak\" data-bytes=\"%lld\"", planned_peak);
    assert_non_null(strstr(svg, needle));
    FMT(needle, "(%lld bytes) at step 3", planned_peak);
    assert_non_null(strstr(svg, needle));
    assert_null(strstr(svg, "class=\"over\""));
    free(svg);

    /* the trace was planned for batch 8: charting it over batch 4 is refused */
    EBB(&r, "chart", "specs/mlp.yaml", "-i", "batch=4", "--trace", trace_path);
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, "the run was planned for a peak of");
    assert_int_equal(r.out_len, 0);
    cli_free(&r);

    run_prog(&r, "rsvg-convert", NULL, ARGS(svg_path, "-o", png_path));
    if (r.code == 127) {
        fprintf(stderr, "note: rsvg-convert is not installed (librsvg2-bin); the chart is not "
                        "rendered\n");
    } else {
        expect_code(&r, 0);
        char *png = slurp(png_path, &n);
        if (!png || n < 1000 || memcmp(png, "\x89PNG\r\n\x1a\n", 8) != 0)
            fail_msg("rsvg-convert wrote no PNG of the chart (%zu bytes)", png ? n : 0);
        free(png);
    }
    cli_free(&r);
}

/* ---- run: files ---------------------------------------------------------- */

static ebb_tensor *host_tensor(const ebb_shape *s, float scale) {
    int64_t n = ebb_shape_numel(s);
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = scale * (float)((i * 37) % 101 - 50) / 50.0f;
    ebb_tensor *t = NULL;
    assert_ok(ebb_tensor_from_host(&t, v, (size_t)n * sizeof *v, s, EBB_FLOAT32,
                                   ebb_device_cpu()));
    free(v);
    return t;
}

/* The named tensor of a safetensors file, as host floats (caller frees). */
static float *read_floats(const char *path, const char *name, ebb_shape *shape) {
    ebb_safetensors *st = NULL;
    assert_ok(ebb_safetensors_open(&st, path));
    ebb_dtype dt;
    assert_ok(ebb_safetensors_find(st, name, &dt, shape));
    assert_int_equal(dt, EBB_FLOAT32);
    ebb_tensor *t = NULL;
    assert_ok(ebb_safetensors_load(&t, st, name, ebb_device_cpu()));
    size_t bytes = (size_t)ebb_shape_numel(shape) * sizeof(float);
    float *v = malloc(bytes);
    assert_ok(ebb_tensor_to_host(t, v, bytes));
    ebb_tensor_free(t);
    ebb_safetensors_close(st);
    return v;
}

/* Training from the shell: `ebb plan --train` lists the joint step phase by
 * phase, and `ebb grad` writes the gradients the library computes, with a
 * trace of every step, backward steps included. */
static void test_train_plan_and_grad(void **state) {
    (void)state;
    cli_result r;
    EBB(&r, "plan", "specs/mlp.yaml", "--train", "-i", "batch=8", "--json");
    expect_code(&r, 0);
    cJSON *plan = json_strict(r.out, r.out_len, r.cmd);
    cli_free(&r);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(plan, "training")));
    static const char *const phases[] = {"forward", "loss", "backward", "update"};
    int last = 0, seen[4] = {0}, n_saved = 0;
    const cJSON *st;
    cJSON_ArrayForEach(st, cJSON_GetObjectItemCaseSensitive(plan, "steps")) {
        const char *ph = str_field(st, "phase", "plan"), *op = str_field(st, "op", "plan");
        int k = 0;
        while (k < 4 && strcmp(phases[k], ph) != 0)
            k++;
        /* updates run inside the backward, each once its gradient is final */
        int in_backward = k == 2 && last == 3 &&
                          cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(plan, "updates_in_backward"));
        if (k == 4 || (k < last && !in_backward))
            fail_msg("step %lld: phase %s after %s", int_field(st, "index", "plan"), ph,
                     phases[last]);
        last = k;
        seen[k]++;
        size_t n = strlen(op);
        if ((k == 2) != (n > 9 && !strcmp(op + n - 9, ".backward")) && strcmp(op, "accumulate"))
            fail_msg("step %lld: op %s in phase %s", int_field(st, "index", "plan"), op, ph);
    }
    const cJSON *v;
    cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(plan, "values"))
        n_saved += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(v, "saved"));
    /* three linear layers: forward, nll, a backward per op, six updates */
    assert_int_equal(seen[1], 1);
    assert_int_equal(seen[3], 6);
    assert_true(seen[2] >= 7);
    assert_true(n_saved >= 4);
    cJSON_Delete(plan);

    EBB(&r, "plan", "specs/mlp.yaml", "--train", "-i", "batch=8");
    expect_code(&r, 0);
    golden_check("mlp_train.plan.txt", r.out, r.out_len);
    cli_free(&r);

    /* the inputs file: x and the class targets y */
    char in_path[PATH_MAX], g_path[PATH_MAX], t_path[PATH_MAX];
    tmp_path(in_path, sizeof in_path, "xy.safetensors");
    tmp_path(g_path, sizeof g_path, "grads.safetensors");
    tmp_path(t_path, sizeof t_path, "grad.jsonl");
    ebb_shape xs = {2, {8, 64}}, ys = {1, {8}};
    ebb_tensor *x = NULL, *y = NULL;
    int64_t labels[8] = {0, 1, 2, 3, 4, 5, 6, 9};
    assert_ok(ebb_tensor_randn(&x, &xs, EBB_FLOAT32, ebb_device_cpu(), 11));
    assert_ok(ebb_tensor_from_host(&y, labels, sizeof labels, &ys, EBB_INT64, ebb_device_cpu()));
    const char *names[2] = {"x", "y"};
    ebb_tensor *ts[2] = {x, y};
    assert_ok(ebb_safetensors_write(in_path, names, ts, 2));
    EBB(&r, "grad", "specs/mlp.yaml", "--inputs", in_path, "--grads", g_path, "--trace", t_path,
        "--device", "cpu");
    expect_code(&r, 0);
    expect_contains("stdout", &r, r.out, "6 gradients written to");
    expect_contains("stdout", &r, r.out, "exact)");
    double cli_loss = 0;
    assert_int_equal(sscanf(r.out, "loss %lf", &cli_loss), 1);
    cli_free(&r);

    /* the same gradients as the library's, bit for bit (seed 0 both ways) */
    ebb_spec *s = NULL;
    assert_ok(ebb_spec_load(&s, EBB_SOURCE_DIR "/specs/mlp.yaml"));
    ebb_train_options t = {.target_shapes = &ys, .n_target_shapes = 1, .grads_only = 1};
    ebb_compile_options o = {.input_shapes = &xs, .n_input_shapes = 1, .train = &t};
    ebb_plan *p = NULL;
    assert_ok(ebb_spec_compile(&p, s, &o));
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, p, ebb_device_cpu(), 0));
    ebb_tensor *grads[8] = {0};
    double loss = 0;
    assert_ok(ebb_grad(p, m, &x, &y, &loss, grads, NULL));
    assert_true(fabs(loss - cli_loss) <= 1e-5 * fabs(loss));
    ebb_safetensors *g = NULL;
    assert_ok(ebb_safetensors_open(&g, g_path));
    assert_int_equal(ebb_safetensors_count(g), 6);
    for (int i = 0; i < ebb_model_param_count(m); i++) {
        ebb_tensor *got = NULL;
        assert_ok(ebb_safetensors_load(&got, g, ebb_model_param_name(m, i), ebb_device_cpu()));
        double dev = 1;
        assert_ok(ebb_tensor_max_abs_diff(got, grads[i], &dev));
        if (dev != 0)
            fail_msg("gradient %s: the command's differs from ebb_grad's by %g",
                     ebb_model_param_name(m, i), dev);
        ebb_tensor_free(got);
        ebb_tensor_free(grads[i]);
    }
    ebb_safetensors_close(g);
    ebb_model_free(m);
    ebb_plan_free(p);
    ebb_spec_free(s);
    ebb_tensor_free(x);
    ebb_tensor_free(y);

    /* the trace: backward steps named after their op, under the forward node,
     * every value they write listed; measured == planned */
    size_t len = 0;
    char *text = slurp(t_path, &len);
    assert_non_null(text);
    assert_non_null(strstr(text, "\"op\": \"linear.backward\", \"node\": \"fc1\""));
    assert_non_null(strstr(text, "\"outputs\": [\"v"));
    const char *sum = strstr(text, "{\"summary\"");
    assert_non_null(sum);
    cJSON *js = json_strict(sum, strlen(sum), "grad trace summary");
    const cJSON *js_s = cJSON_GetObjectItemCaseSensitive(js, "summary");
    assert_int_equal(int_field(js_s, "peak_bytes", "summary"),
                     int_field(js_s, "planned_peak_bytes", "summary"));
    cJSON_Delete(js);
    free(text);

    /* what cannot train says so */
    EBB(&r, "plan", "specs/bench/mlp.yaml", "--train");
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, "declares no `targets:`");
    cli_free(&r);
    EBB(&r, "grad", "specs/mlp.yaml", "--grads", g_path);
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--inputs is required");
    cli_free(&r);
}

static void test_weights_and_io_files(void **state) {
    (void)state;
    char x[PATH_MAX], w[PATH_MAX], y1[PATH_MAX], y2[PATH_MAX], y3[PATH_MAX];
    tmp_path(x, sizeof x, "x.safetensors");
    tmp_path(w, sizeof w, "w.safetensors");
    tmp_path(y1, sizeof y1, "y1.safetensors");
    tmp_path(y2, sizeof y2, "y2.safetensors");
    tmp_path(y3, sizeof y3, "y3.safetensors");
    ebb_shape xs = EBB_SHAPE(5, 64);
    ebb_tensor *xt = host_tensor(&xs, 1.0f);
    const char *names[] = {"x"};
    assert_ok(ebb_safetensors_write(x, names, &xt, 1));
    ebb_tensor_free(xt);

    cli_result r;
    /* the input's shape comes from the file: no note about defaults */
    EBB(&r, "run", "specs/mlp.yaml", "--device", "cpu", "--seed", "7", "--inputs", x,
        "--save-weights", w, "--outputs", y1);
    expect_code(&r, 0);
    expect_contains("stdout", &r, r.out, "output y float32 [5, 10]");
    if (strstr(r.err, "defaults to 1"))
        fail_msg("`%s` noted a default although --inputs gave the shape:\n%s", r.cmd, r.err);
    cli_free(&r);

    /* the saved weights hold the plan's parameters by name */
    cJSON *plan = plan_json("specs/mlp.yaml", NULL);
    ebb_safetensors *st = NULL;
    assert_ok(ebb_safetensors_open(&st, w));
    const cJSON *p;
    int n_params = 0;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(plan, "params")) {
        ebb_shape s;
        assert_ok(ebb_safetensors_find(st, str_field(p, "name", "params"), NULL, &s));
        assert_int_equal(ebb_shape_numel(&s), shape_numel(p, "params"));
        n_params++;
    }
    assert_int_equal(ebb_safetensors_count(st), n_params);
    ebb_safetensors_close(st);
    cJSON_Delete(plan);

    /* another seed with those weights: the same outputs, bit for bit */
    EBB(&r, "run", "specs/mlp.yaml", "--device", "cpu", "--seed", "99", "--inputs", x,
        "--weights", w, "--outputs", y2);
    expect_code(&r, 0);
    cli_free(&r);
    /* another seed without them: different outputs (the weights mattered) */
    EBB(&r, "run", "specs/mlp.yaml", "--device", "cpu", "--seed", "99", "--inputs", x,
        "--outputs", y3);
    expect_code(&r, 0);
    cli_free(&r);
    ebb_shape s1, s2, s3;
    float *v1 = read_floats(y1, "y", &s1), *v2 = read_floats(y2, "y", &s2),
          *v3 = read_floats(y3, "y", &s3);
    ebb_shape want = EBB_SHAPE(5, 10);
    assert_true(ebb_shape_equal(&s1, &want));
    assert_true(ebb_shape_equal(&s2, &want));
    assert_memory_equal(v1, v2, 50 * sizeof(float));
    assert_memory_not_equal(v1, v3, 50 * sizeof(float));
    free(v2);

    /* --inputs from standard input (a regular file there): the same outputs */
    stdin_file = x;
    EBB(&r, "run", "specs/mlp.yaml", "--device", "cpu", "--seed", "99", "--inputs", "-",
        "--weights", w, "--outputs", y2);
    stdin_file = NULL;
    expect_code(&r, 0);
    cli_free(&r);
    v2 = read_floats(y2, "y", &s2);
    assert_memory_equal(v1, v2, 50 * sizeof(float));
    free(v2);

    /* weights without fc1.bias and with a BatchNorm counter the mlp lacks:
     * strict names both; --non-strict (the file piped in) warns, loads the
     * rest and keeps fc1.bias from the seed */
    char wbad[PATH_MAX], want_msg[PATH_MAX + 256];
    tmp_path(wbad, sizeof wbad, "w_bad.safetensors");
    ebb_safetensors *ws = NULL;
    assert_ok(ebb_safetensors_open(&ws, w));
    const char *bad_names[16];
    ebb_tensor *bad_ts[16] = {0};
    int n_bad = 0;
    for (int i = 0; i < ebb_safetensors_count(ws) && n_bad < 15; i++) {
        const char *nm = ebb_safetensors_name_at(ws, i);
        if (strcmp(nm, "fc1.bias") == 0)
            continue;
        bad_names[n_bad] = nm;
        assert_ok(ebb_safetensors_load(&bad_ts[n_bad++], ws, nm, ebb_device_cpu()));
    }
    ebb_shape scalar = {0};
    assert_ok(ebb_tensor_zeros(&bad_ts[n_bad], &scalar, EBB_INT64, ebb_device_cpu()));
    bad_names[n_bad++] = "bn.num_batches_tracked";
    assert_ok(ebb_safetensors_write(wbad, bad_names, bad_ts, n_bad));
    for (int i = 0; i < n_bad; i++)
        ebb_tensor_free(bad_ts[i]);
    ebb_safetensors_close(ws);
    EBB(&r, "run", "specs/mlp.yaml", "--device", "cpu", "--inputs", x, "--weights", wbad);
    expect_code(&r, 1);
    FMT(want_msg,
        "ebb: %s: 2 tensors do not match the model (1 missing, 1 unexpected): missing parameter "
        "'fc1.bias'; unexpected tensor 'bn.num_batches_tracked' (the model has no such parameter)",
        wbad);
    expect_contains("stderr", &r, r.err, want_msg);
    if (strstr(r.out, "output "))
        fail_msg("`%s` ran with weights that do not match:\n%s", r.cmd, r.out);
    cli_free(&r);
    stdin_file = wbad;
    stdin_pipe = 1;
    EBB(&r, "run", "specs/mlp.yaml", "--device=cpu", "--seed=99", "--inputs", x, "--weights=-",
        "--non-strict", "--outputs", y2);
    stdin_file = NULL;
    stdin_pipe = 0;
    expect_code(&r, 0);
    expect_contains("stderr", &r, r.err,
                    "ebb: warning: /dev/stdin: 2 tensors do not match the model (1 missing, 1 "
                    "unexpected): missing parameter 'fc1.bias'; unexpected tensor "
                    "'bn.num_batches_tracked'");
    expect_contains("stderr", &r, r.err, "--non-strict: loaded the other 5 parameters");
    cli_free(&r);
    /* not the file's outputs (fc1.bias is seed 99's), nor seed 99's (the
     * other five came from the file) */
    v2 = read_floats(y2, "y", &s2);
    assert_memory_not_equal(v1, v2, 50 * sizeof(float));
    assert_memory_not_equal(v3, v2, 50 * sizeof(float));
    free(v1);
    free(v2);
    free(v3);

    /* the same seed without files gives the same random inputs and weights */
    EBB(&r, "run", "specs/mlp.yaml", "--device", "cpu", "--seed", "7", "-i", "batch=5",
        "--outputs", y2);
    expect_code(&r, 0);
    cli_free(&r);
    EBB(&r, "run", "specs/mlp.yaml", "--device", "cpu", "--seed", "7", "-i", "batch=5",
        "--outputs", y3);
    expect_code(&r, 0);
    cli_free(&r);
    v2 = read_floats(y2, "y", &s2);
    v3 = read_floats(y3, "y", &s3);
    assert_memory_equal(v2, v3, 50 * sizeof(float));
    free(v2);
    free(v3);

    /* an outputs file fed back as inputs: it holds "y", not the input "x",
     * and the run says which tensor is missing */
    EBB(&r, "run", "specs/mlp.yaml", "--device", "cpu", "--inputs", y1);
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, "no tensor named 'x'");
    cli_free(&r);

    /* weights of another spec are refused, naming a parameter */
    EBB(&r, "run", "specs/through.yaml", "--device", "cpu", "--weights", w);
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, w);
    cli_free(&r);

    /* an input file whose shape contradicts the spec */
    ebb_shape bad = EBB_SHAPE(5, 63);
    xt = host_tensor(&bad, 1.0f);
    assert_ok(ebb_safetensors_write(x, names, &xt, 1));
    ebb_tensor_free(xt);
    EBB(&r, "run", "specs/mlp.yaml", "--device", "cpu", "--inputs", x);
    if (r.code != 1)
        fail_msg("`%s` with a [5, 63] input for x: [batch, 64] exited %d, expected 1:\n%s",
                 r.cmd, r.code, r.err);
    cli_free(&r);
}

static void test_symbolic_default_note(void **state) {
    (void)state;
    cli_result r;
    EBB(&r, "run", "specs/mlp.yaml", "--device", "cpu");
    expect_code(&r, 0);
    expect_contains("stderr", &r, r.err,
                    "symbolic dimension 'batch' of input 'x' defaults to 1 (set it with -i "
                    "batch=N)");
    expect_contains("stdout", &r, r.out, "output y float32 [1, 10]");
    expect_contains("stdout", &r, r.out, "peak intermediate bytes: measured ");
    expect_contains("stdout", &r, r.out, "time on cpu: median ");
    if (strstr(r.out, "defaults to"))
        fail_msg("the note went to stdout:\n%s", r.out);
    cli_free(&r);

    /* given, it is not mentioned */
    EBB(&r, "run", "specs/mlp.yaml", "--device", "cpu", "-i", "batch=3");
    expect_code(&r, 0);
    if (strstr(r.err, "defaults to"))
        fail_msg("`%s` noted a default for a given dim:\n%s", r.cmd, r.err);
    expect_contains("stdout", &r, r.out, "output y float32 [3, 10]");
    cli_free(&r);

    /* the picture commands say it too (they drew batch 1 silently) */
    char svg[PATH_MAX];
    tmp_path(svg, sizeof svg, "note-chart.svg");
    EBB(&r, "chart", "specs/mlp.yaml", "-o", svg);
    expect_code(&r, 0);
    expect_contains("stderr", &r, r.err, "symbolic dimension 'batch' of input 'x' defaults to 1");
    cli_free(&r);
    EBB(&r, "dot", "specs/mlp.yaml", "--plan");
    expect_code(&r, 0);
    expect_contains("stderr", &r, r.err, "symbolic dimension 'batch' of input 'x' defaults to 1");
    cli_free(&r);

    /* two symbolic dims, each named */
    EBB(&r, "run", "specs/transformer_encoder.yaml", "--device", "cpu");
    expect_code(&r, 0);
    expect_contains("stderr", &r, r.err, "'batch'");
    expect_contains("stderr", &r, r.err, "'seq'");
    cli_free(&r);
}

/* ---- files that are not what they seem ------------------------------------ */

/* specs/mlp.yaml compiled in-process for `bind`. */
static ebb_plan *compile_mlp(const char *bind) {
    ebb_spec *spec = NULL;
    ebb_plan *p = NULL;
    assert_ok(ebb_spec_load(&spec, EBB_SOURCE_DIR "/specs/mlp.yaml"));
    ebb_shape shapes[4];
    assert_ok(ebb_spec_resolve_shapes(spec, &bind, 1, shapes, 4));
    ebb_compile_options co = {.input_shapes = shapes, .n_input_shapes = 1};
    assert_ok(ebb_spec_compile(&p, spec, &co));
    ebb_spec_free(spec);
    return p;
}

/* A safetensors file written by hand, so it can hold what ebb would never
 * write: tensors[i] is {name, dtype, element size, shape}; F32 data is 0.01
 * with NaN at element 0 of `nan_name` and Inf at element 7 of it. */
typedef struct raw_tensor {
    const char *name, *dtype;
    size_t elsize;
    ebb_shape shape;
} raw_tensor;

static void write_raw_file(const char *path, const raw_tensor *ts, int n, const char *nan_name) {
    char header[8192];
    size_t at = (size_t)snprintf(header, sizeof header, "{");
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t nb = (size_t)ebb_shape_numel(&ts[i].shape) * ts[i].elsize;
        at += (size_t)snprintf(header + at, sizeof header - at,
                               "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", ts[i].name,
                               ts[i].dtype);
        for (int d = 0; d < ts[i].shape.ndim; d++)
            at += (size_t)snprintf(header + at, sizeof header - at, "%s%lld", d ? "," : "",
                                   (long long)ts[i].shape.dim[d]);
        at += (size_t)snprintf(header + at, sizeof header - at, "],\"data_offsets\":[%zu,%zu]}",
                               off, off + nb);
        off += nb;
    }
    at += (size_t)snprintf(header + at, sizeof header - at, "}");
    assert_true(at < sizeof header);
    unsigned char *data = calloc(1, off + 1);
    assert_non_null(data);
    off = 0;
    for (int i = 0; i < n; i++) {
        size_t count = (size_t)ebb_shape_numel(&ts[i].shape);
        if (!strcmp(ts[i].dtype, "F32")) {
            float *f = (float *)(void *)(data + off);
            for (size_t k = 0; k < count; k++)
                f[k] = 0.01f;
            if (nan_name && !strcmp(ts[i].name, nan_name)) {
                f[0] = NAN;
                f[7] = INFINITY;
            }
        }
        off += count * ts[i].elsize;
    }
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)at >> (8 * i));
    assert_int_equal(fwrite(len8, 1, 8, f), 8);
    assert_int_equal(fwrite(header, 1, at, f), at);
    assert_int_equal(fwrite(data, 1, off, f), off);
    assert_int_equal(fclose(f), 0);
    free(data);
}

/* specs/mlp.yaml's parameters, F32 except `odd` (given that dtype). */
static void write_mlp_weights(const char *path, const char *odd, const char *odd_dtype,
                              size_t odd_elsize, const char *nan_name) {
    ebb_plan *p = compile_mlp("batch=1");
    raw_tensor ts[16];
    int n = ebb_plan_param_count(p);
    assert_true(n <= 16);
    for (int i = 0; i < n; i++) {
        const char *name = NULL;
        const ebb_param_spec *ps = ebb_plan_param_at(p, i, &name);
        int is_odd = odd && !strcmp(name, odd);
        ts[i] = (raw_tensor){name, is_odd ? odd_dtype : "F32", is_odd ? odd_elsize : 4, ps->shape};
    }
    write_raw_file(path, ts, n, nan_name);
    ebb_plan_free(p);
}

/* Inputs and weights files that are not regular files, hold a dtype ebb
 * lacks, NaN, or a shape other than the one asked for: each a clear error
 * (or a warning) naming the file, the tensor and both shapes; none a hang. */
static void test_unusable_input_files(void **state) {
    (void)state;
    char fifo[PATH_MAX], x4[PATH_MAX], xi8[PATH_MAX], w[PATH_MAX], wi8[PATH_MAX], want[PATH_MAX + 128];
    tmp_path(fifo, sizeof fifo, "in.fifo");
    tmp_path(x4, sizeof x4, "x4.safetensors");
    tmp_path(xi8, sizeof xi8, "xi8.safetensors");
    tmp_path(w, sizeof w, "w_nan.safetensors");
    tmp_path(wi8, sizeof wi8, "w_i8.safetensors");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    cli_result r;
    /* a FIFO blocked open() forever; now it is refused at once */
    EBB(&r, "run", "specs/mlp.yaml", "--weights", fifo);
    expect_code(&r, 1);
    FMT(want, "'%s' is a FIFO, not a regular file", fifo);
    expect_contains("stderr", &r, r.err, want);
    cli_free(&r);
    EBB(&r, "run", "specs/mlp.yaml", "--inputs", fifo);
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, want);
    cli_free(&r);
    EBB(&r, "run", fifo);
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, "is a FIFO, not a spec file");
    cli_free(&r);

    raw_tensor x = {"x", "F32", 4, EBB_SHAPE(4, 64)};
    write_raw_file(x4, &x, 1, "x");
    /* the file's [4, 64] against a plan compiled for 8 rows: an error naming both */
    EBB(&r, "run", "specs/mlp.yaml", "--inputs", x4, "-i", "x=8,64");
    expect_code(&r, 1);
    FMT(want, "%s: input 'x' is [4, 64], but -i x=8,64 compiles the plan for [8, 64]", x4);
    expect_contains("stderr", &r, r.err, want);
    cli_free(&r);
    EBB(&r, "run", "specs/mlp.yaml", "--inputs", x4, "-i", "batch=8");
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, "input 'x' is [4, 64], but -i batch=8 compiles the plan for [8, 64]");
    cli_free(&r);

    /* NaN and Inf: a warning per tensor, or an error with --strict-finite */
    write_mlp_weights(w, NULL, NULL, 0, "fc2.weight");
    EBB(&r, "run", "specs/mlp.yaml", "--inputs", x4, "--weights", w);
    expect_code(&r, 0);
    FMT(want, "ebb: warning: %s: input 'x' holds 2 NaN or infinite values (of 256)", x4);
    expect_contains("stderr", &r, r.err, want);
    FMT(want, "ebb: warning: %s: parameter 'fc2.weight' holds 2 NaN or infinite values (of 16384)", w);
    expect_contains("stderr", &r, r.err, want);
    cli_free(&r);
    EBB(&r, "run", "specs/mlp.yaml", "--inputs", x4, "--weights", w, "--strict-finite");
    expect_code(&r, 1);
    FMT(want, "ebb: %s: parameter 'fc2.weight' holds 2 NaN or infinite values", w);
    expect_contains("stderr", &r, r.err, want);
    if (strstr(r.out, "output "))
        fail_msg("`%s` ran on NaN weights:\n%s", r.cmd, r.out);
    cli_free(&r);

    /* a tensor that is there in a dtype ebb lacks is not "missing" */
    raw_tensor xq = {"x", "I8", 1, EBB_SHAPE(4, 64)};
    write_raw_file(xi8, &xq, 1, NULL);
    EBB(&r, "run", "specs/mlp.yaml", "--inputs", xi8);
    expect_code(&r, 1);
    FMT(want, "%s: input 'x' has dtype I8, which ebb does not support", xi8);
    expect_contains("stderr", &r, r.err, want);
    cli_free(&r);
    write_mlp_weights(wi8, "fc1.bias", "I8", 1, NULL);
    EBB(&r, "run", "specs/mlp.yaml", "--weights", wi8);
    expect_code(&r, 1);
    FMT(want, "%s: parameter 'fc1.bias' has dtype I8, which ebb does not support (the model "
              "needs float32 [128])", wi8);
    expect_contains("stderr", &r, r.err, want);
    cli_free(&r);
    unlink(fifo);
}

/* ---- output paths of every kind ------------------------------------------- */

static char hook_dir[PATH_MAX]; /* what mount_readonly() mounts over */

/* A read-only filesystem at hook_dir, in a mount namespace of the child's
 * own (root or a user namespace); non-zero when that cannot be done. */
static int mount_readonly(void) {
    if (ebb_test_private_mounts() != 0)
        return -1;
    return mount("tmpfs", hook_dir, "tmpfs", MS_RDONLY, "size=64k");
}

static int is_mode(const char *path, mode_t type, mode_t perms) {
    struct stat sb;
    return lstat(path, &sb) == 0 && (sb.st_mode & S_IFMT) == type &&
           (perms == 0 || (sb.st_mode & 07777) == perms);
}

static void test_output_targets(void **state) {
    (void)state;
    char real[PATH_MAX], link[PATH_MAX], wreal[PATH_MAX], treal[PATH_MAX], tlink[PATH_MAX],
        fifo[PATH_MAX], dreal[PATH_MAX], dlink[PATH_MAX], ro[PATH_MAX], want[PATH_MAX + 64];
    tmp_path(real, sizeof real, "y_real.safetensors");
    tmp_path(link, sizeof link, "y_link.safetensors");
    tmp_path(wreal, sizeof wreal, "w_0640.safetensors");
    tmp_path(treal, sizeof treal, "t_real.jsonl");
    tmp_path(tlink, sizeof tlink, "t_link.jsonl");
    tmp_path(fifo, sizeof fifo, "out.fifo");
    tmp_path(dreal, sizeof dreal, "d_real.dot");
    tmp_path(dlink, sizeof dlink, "d_link.dot");
    tmp_path(ro, sizeof ro, "readonly");
    cli_result r;

    /* /dev/full is written into, fails with its errno (exit 3), and stays a
     * device: a rename over it replaced the node when run as root */
    EBB(&r, "run", "specs/mlp.yaml", "-i", "batch=2", "--outputs", "/dev/full");
    expect_code(&r, 3);
    expect_contains("stderr", &r, r.err, "cannot write '/dev/full': No space left on device");
    assert_true(is_mode("/dev/full", S_IFCHR, 0));
    cli_free(&r);
    /* through a link, since -o wants a .dot name */
    char full_dot[PATH_MAX];
    tmp_path(full_dot, sizeof full_dot, "full.dot");
    assert_int_equal(symlink("/dev/full", full_dot), 0);
    EBB(&r, "dot", "specs/mlp.yaml", "-o", full_dot);
    expect_code(&r, 3);
    FMT(want, "-o: cannot write '%s' (a link to '/dev/full'): No space left on device", full_dot);
    expect_contains("stderr", &r, r.err, want);
    assert_true(is_mode("/dev/full", S_IFCHR, 0) && is_mode(full_dot, S_IFLNK, 0));
    cli_free(&r);

    /* links are followed and the files they point to replaced, keeping
     * their modes; the links stay links */
    ebb_shape one = EBB_SHAPE(1);
    ebb_tensor *t = host_tensor(&one, 1.0f);
    const char *names[] = {"old"};
    assert_ok(ebb_safetensors_write(real, names, &t, 1));
    assert_ok(ebb_safetensors_write(wreal, names, &t, 1));
    ebb_tensor_free(t);
    assert_int_equal(write_file(treal, "old\n", 4), 0);
    assert_int_equal(write_file(dreal, "old\n", 4), 0);
    assert_int_equal(chmod(real, 0600), 0);
    assert_int_equal(chmod(wreal, 0640), 0);
    assert_int_equal(chmod(treal, 0600), 0);
    assert_int_equal(chmod(dreal, 0600), 0);
    assert_int_equal(symlink("y_real.safetensors", link), 0);
    assert_int_equal(symlink(treal, tlink), 0); /* absolute this time */
    assert_int_equal(symlink("d_real.dot", dlink), 0);
    EBB(&r, "run", "specs/mlp.yaml", "-i", "batch=2", "--outputs", link, "--save-weights", wreal,
        "--trace", tlink);
    expect_code(&r, 0);
    cli_free(&r);
    EBB(&r, "dot", "specs/mlp.yaml", "-o", dlink);
    expect_code(&r, 0);
    cli_free(&r);
    assert_true(is_mode(link, S_IFLNK, 0) && is_mode(tlink, S_IFLNK, 0) &&
                is_mode(dlink, S_IFLNK, 0));
    if (!is_mode(real, S_IFREG, 0600) || !is_mode(wreal, S_IFREG, 0640) ||
        !is_mode(treal, S_IFREG, 0600) || !is_mode(dreal, S_IFREG, 0600))
        fail_msg("an output lost its mode (0600, 0640, 0600, 0600 expected)");
    ebb_shape ys;
    float *y = read_floats(real, "y", &ys);
    ebb_shape want_y = EBB_SHAPE(2, 10);
    assert_true(ebb_shape_equal(&ys, &want_y));
    free(y);
    char *text = slurp(treal, NULL);
    assert_non_null(text);
    assert_non_null(strstr(text, "{\"summary\": "));
    free(text);
    text = slurp(dreal, NULL);
    assert_true(text && starts_with(text, "digraph"));
    free(text);

    /* /dev/stdout (here a regular file behind the descriptor) gets the
     * bytes after the printed results */
    EBB(&r, "run", "specs/mlp.yaml", "-i", "batch=2", "--outputs", "/dev/stdout");
    expect_code(&r, 0);
    const char *results = strstr(r.out, "time on "); /* cpu, or cuda:0 where there is one */
    const char *hdr = memmem(r.out, r.out_len, "{\"__metadata__\"", 15);
    if (!results || !hdr || hdr < results)
        fail_msg("`%s` did not write the safetensors after the results", r.cmd);
    cli_free(&r);

    /* a FIFO that no process reads is an error, not a wait */
    assert_int_equal(mkfifo(fifo, 0600), 0);
    EBB(&r, "run", "specs/mlp.yaml", "-i", "batch=2", "--outputs", fifo);
    expect_code(&r, 3);
    expect_contains("stderr", &r, r.err, "is a FIFO that no process is reading");
    cli_free(&r);
    unlink(fifo);

    /* a directory that takes no new files: refused before the run */
    assert_int_equal(mkdir(ro, 0755), 0);
    char out[PATH_MAX];
    tmp_path(out, sizeof out, "readonly/y.safetensors");
    if (geteuid() != 0) {
        assert_int_equal(chmod(ro, 0555), 0);
    } else {
        snprintf(hook_dir, sizeof hook_dir, "%s", ro);
        child_hook = mount_readonly;
    }
    EBB(&r, "run", "specs/mlp.yaml", "-i", "batch=2", "--outputs", out);
    chmod(ro, 0755);
    if (r.code == 77) {
        fprintf(stderr, "skipped the read-only directory: as root, it needs a mount namespace "
                        "and a tmpfs, which this process cannot make\n");
        cli_free(&r);
        return;
    }
    expect_code(&r, 3);
    FMT(want, "--outputs: cannot write '%s': cannot create files in directory '%s'", out, ro);
    expect_contains("stderr", &r, r.err, want);
    if (strstr(r.out, "output "))
        fail_msg("`%s` ran before refusing its output path:\n%s", r.cmd, r.out);
    cli_free(&r);
}

/* ---- will it fit? --------------------------------------------------------- */

static long long vm_size_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long long pages = 0;
    if (!f || fscanf(f, "%lld", &pages) != 1)
        fail_msg("cannot read /proc/self/statm");
    fclose(f);
    return pages * sysconf(_SC_PAGESIZE);
}

static rlim_t hook_as_limit;

static int lower_address_space(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0)
        return -1;
    rl.rlim_cur = hook_as_limit;
    return setrlimit(RLIMIT_AS, &rl);
}

/* ebb_plan_check_fits from C, then `ebb run` under a lowered RLIMIT_AS: a
 * plan that cannot fit is refused before any op runs, with both figures. */
static void test_fit_check(void **state) {
    (void)state;
    ebb_plan *small = compile_mlp("batch=2"), *huge = compile_mlp("batch=1000000000");
    ebb_plan *gib = compile_mlp("batch=1048576"); /* 1 GiB of intermediates */
    ebb_fit f;
    int at = -1;
    int64_t peak = ebb_plan_peak_bytes(small, &at);
    assert_ok(ebb_plan_check_fits(small, ebb_device_cpu(), NULL, 512, &f));
    assert_int_equal(f.peak_bytes, peak);
    assert_int_equal(f.peak_step, at);
    assert_int_equal(f.param_bytes, 26122 * 4);
    assert_int_equal(f.input_bytes, 512);
    assert_true(f.reserve_bytes > 0);
    assert_int_equal(f.needed_bytes, f.peak_bytes + f.param_bytes + f.input_bytes + f.reserve_bytes);
    assert_true(f.available_bytes > f.needed_bytes);
    assert_non_null(f.limit);
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, small, ebb_device_cpu(), 0));
    assert_ok(ebb_plan_check_fits(small, ebb_device_cpu(), m, 0, &f));
    assert_int_equal(f.param_bytes, 0); /* held already, counted in what the process uses */
    ebb_model_free(m);

    assert_int_equal(ebb_plan_check_fits(huge, ebb_device_cpu(), NULL, 0, &f), EBB_ERR_NOMEM);
    assert_errmsg_contains("plan mlp needs ");
    assert_errmsg_contains(" at step 3 (fc2), this process can get ");
    assert_errmsg_contains(f.limit);
    assert_true(f.needed_bytes > f.available_bytes);

    /* ebb_run_ex refuses it before any step: the model is small, and the
     * input may be (sizes may differ from the compiled ones) */
    assert_ok(ebb_model_new(&m, huge, ebb_device_cpu(), 0));
    ebb_shape xs = EBB_SHAPE(2, 64);
    ebb_tensor *x = host_tensor(&xs, 1.0f), *y = (ebb_tensor *)&y;
    ebb_run_options ro = {.check_fits = 1};
    assert_int_equal(ebb_run_ex(huge, m, &x, &y, &ro, NULL), EBB_ERR_NOMEM);
    assert_errmsg_contains("ebb_run: plan mlp needs");
    assert_null(y);
    ebb_tensor_free(x);
    ebb_model_free(m);

    /* the limit that binds is named: RLIMIT_AS lowered to what this process
     * maps plus 256 MiB */
    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_AS, &old), 0);
    low = old;
    low.rlim_cur = (rlim_t)(vm_size_bytes() + (256LL << 20));
    assert_int_equal(setrlimit(RLIMIT_AS, &low), 0);
    ebb_status st = ebb_plan_check_fits(gib, ebb_device_cpu(), NULL, 0, &f);
    assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);
    assert_int_equal(st, EBB_ERR_NOMEM);
    assert_string_equal(f.limit, "RLIMIT_AS");
    assert_true(f.available_bytes <= (256LL << 20));
    assert_errmsg_contains("(RLIMIT_AS)");

    ebb_plan_free(small);
    ebb_plan_free(gib);

    /* the command, in a child whose address space is capped at what this
     * process maps plus 768 MiB: enough to run a small batch, not a plan
     * of 1 GiB. Before the check, such limits sent OpenBLAS spinning. On
     * the CPU: a CUDA context alone maps more than the cap (and this
     * process makes none before here, which would lift the cap). */
    hook_as_limit = (rlim_t)(vm_size_bytes() + (768LL << 20));
    child_hook = lower_address_space;
    cli_result r;
    EBB(&r, "run", "specs/mlp.yaml", "-i", "batch=1048576", "--device", "cpu");
    expect_code(&r, 3);
    expect_contains("stderr", &r, r.err, "ebb: plan mlp needs ");
    expect_contains("stderr", &r, r.err, " at step 3 (fc2), this process can get ");
    expect_contains("stderr", &r, r.err, "(RLIMIT_AS)");
    expect_contains("stderr", &r, r.err, "; --force runs it anyway");
    if (r.out_len)
        fail_msg("`%s` printed before refusing:\n%s", r.cmd, r.out);
    cli_free(&r);
    child_hook = lower_address_space;
    EBB(&r, "run", "specs/mlp.yaml", "-i", "batch=2", "--device", "cpu");
    expect_code(&r, 0);
    cli_free(&r);
    /* --force skips the check: the allocation itself fails, cleanly */
    child_hook = lower_address_space;
    EBB(&r, "run", "specs/mlp.yaml", "-i", "batch=100000000", "--force", "--device", "cpu");
    expect_code(&r, 3);
    expect_contains("stderr", &r, r.err, "out of memory");
    if (strstr(r.err, "this process can get"))
        fail_msg("`%s` checked the fit despite --force:\n%s", r.cmd, r.err);
    cli_free(&r);

    /* CUDA: the device's free memory where there is one; else no figure,
     * and so no verdict */
    if (ebb_cuda_available()) {
        assert_int_equal(ebb_plan_check_fits(huge, ebb_device_cuda(0), NULL, 0, &f), EBB_ERR_NOMEM);
        assert_errmsg_contains("(free CUDA memory)");
        assert_true(f.available_bytes > 0 && f.needed_bytes > f.available_bytes);
    } else {
        assert_ok(ebb_plan_check_fits(huge, ebb_device_cuda(0), NULL, 0, &f));
        assert_int_equal(f.available_bytes, -1);
        assert_null(f.limit);
    }
    ebb_plan_free(huge);
}

/* The points of the SVG element whose id is `id` (its points="x,y x,y"
 * attribute), at most `max` of them into x[] and y[]; returns how many. */
static int svg_points(const char *svg, const char *id, double *x, double *y, int max) {
    char needle[128];
    FMT(needle, "id=\"%s\"", id);
    const char *at = strstr(svg, needle);
    if (!at)
        fail_msg("the SVG has no element with id=\"%s\"", id);
    const char *end = strchr(at, '>'), *p = strstr(at, " points=\"");
    if (!end || !p || p > end)
        fail_msg("the SVG's element %s has no points", id);
    p += strlen(" points=\"");
    int n = 0;
    while (*p != '"') {
        char *e1 = NULL, *e2 = NULL;
        double px = strtod(p, &e1);
        if (e1 == p || *e1 != ',')
            fail_msg("%s: a point that is not x,y: %.40s", id, p);
        double py = strtod(e1 + 1, &e2);
        if (e2 == e1 + 1 || (*e2 != ' ' && *e2 != '"'))
            fail_msg("%s: a point that is not x,y: %.40s", id, p);
        if (n < max) {
            x[n] = px;
            y[n] = py;
        }
        n++;
        p = *e2 == ' ' ? e2 + 1 : e2;
    }
    return n;
}

/* Drawn values and their y (SVG's y grows downwards): a larger value never
 * lower on the picture, equal values at the same height. */
static void expect_drawn_in_order(const char *what, const double *v, const double *y, int n) {
    for (int i = 0; i < n; i++)
        for (int k = 0; k < n; k++)
            if ((v[i] > v[k] && !(y[i] < y[k])) || (v[i] == v[k] && fabs(y[i] - y[k]) > 0.05))
                fail_msg("%s: %g is drawn at y %g, %g at y %g", what, v[i], y[i], v[k], y[k]);
}

/* `ebb train` on a small safetensors dataset: the loss falls, a resumed run
 * ends bit for bit where an uninterrupted one does, and `ebb eval` prints
 * its line. The same runs draw their learning curves (--curve), checked
 * against the JSON lines, and trace a training step (--trace) that `ebb
 * chart --train` draws over the training plan. */
static void test_train_and_eval(void **state) {
    (void)state;
    char data[PATH_MAX], wa[PATH_MAX], wb[PATH_MAX], ck[PATH_MAX], curve[PATH_MAX];
    char trace[PATH_MAX], chart[PATH_MAX];
    tmp_path(data, sizeof data, "train.safetensors");
    tmp_path(curve, sizeof curve, "train-curve.svg");
    tmp_path(trace, sizeof trace, "train-trace.jsonl");
    tmp_path(chart, sizeof chart, "train-chart.svg");
    tmp_path(wa, sizeof wa, "wa.safetensors");
    tmp_path(wb, sizeof wb, "wb.safetensors");
    tmp_path(ck, sizeof ck, "ckpt.safetensors");
    /* 96 samples of 64 features, class c lifting features 6c..6c+5 */
    enum { N = 96, F = 64 };
    ebb_shape xs = {2, {N, F}}, ys = {1, {N}};
    ebb_tensor *x = NULL, *y = NULL;
    assert_ok(ebb_tensor_randn(&x, &xs, EBB_FLOAT32, ebb_device_cpu(), 5));
    static float xv[N * F];
    int64_t yv[N];
    assert_ok(ebb_tensor_to_host(x, xv, sizeof xv));
    ebb_tensor_free(x);
    for (int i = 0; i < N; i++) {
        yv[i] = i % 10;
        for (int k = 0; k < 6; k++)
            xv[i * F + yv[i] * 6 + k] += 2.0f;
    }
    assert_ok(ebb_tensor_from_host(&x, xv, sizeof xv, &xs, EBB_FLOAT32, ebb_device_cpu()));
    assert_ok(ebb_tensor_from_host(&y, yv, sizeof yv, &ys, EBB_INT64, ebb_device_cpu()));
    const char *names[2] = {"x", "y"};
    ebb_tensor *ts[2] = {x, y};
    assert_ok(ebb_safetensors_write(data, names, ts, 2));
    ebb_tensor_free(x);
    ebb_tensor_free(y);

    /* 3 epochs of 6 steps, every line JSON; the loss falls epoch by epoch */
    cli_result r;
    /* the trace compares every step with its plan on the CPU (the default
     * is CUDA where there is one), which is exact with one intra-op thread: libtorch's CPU kernels may take per-thread scratch
     * (384 B more in a linear step with 16 threads) */
    const char *threads = getenv("OMP_NUM_THREADS");
    char *saved_threads = threads ? strdup(threads) : NULL;
    assert_int_equal(setenv("OMP_NUM_THREADS", "1", 1), 0);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--eval-data", data, "--steps", "18",
        "--batch", "16", "--lr", "0.01", "--json", "--log-every", "6", "--save-weights", wa,
        "--curve", curve, "--trace", trace, "--device", "cpu");
    if (saved_threads)
        assert_int_equal(setenv("OMP_NUM_THREADS", saved_threads, 1), 0);
    else
        assert_int_equal(unsetenv("OMP_NUM_THREADS"), 0);
    free(saved_threads);
    expect_code(&r, 0);
    double epoch_loss[3] = {0}, eval_loss[3] = {0}, eval_acc[3] = {0};
    int n_epochs = 0, n_steps = 0;
    for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        if (!j)
            fail_msg("not JSON: %s", line);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
        const cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "loss");
        assert_true(cJSON_IsString(type) && cJSON_IsNumber(loss));
        if (!strcmp(type->valuestring, "epoch")) {
            assert_true(n_epochs < 3);
            const cJSON *acc = cJSON_GetObjectItemCaseSensitive(j, "eval_accuracy");
            const cJSON *el = cJSON_GetObjectItemCaseSensitive(j, "eval_loss");
            assert_true(cJSON_IsNumber(acc) && cJSON_IsNumber(el));
            eval_acc[n_epochs] = acc->valuedouble;
            eval_loss[n_epochs] = el->valuedouble;
            epoch_loss[n_epochs++] = loss->valuedouble;
        } else {
            assert_string_equal(type->valuestring, "step");
            n_steps++;
        }
        cJSON_Delete(j);
    }
    assert_int_equal(n_epochs, 3);
    assert_int_equal(n_steps, 3);
    if (!(epoch_loss[2] < epoch_loss[1] && epoch_loss[1] < epoch_loss[0]))
        fail_msg("the loss did not fall: %g %g %g", epoch_loss[0], epoch_loss[1], epoch_loss[2]);
    cli_free(&r);

    /* the curves: a training-loss point per logged step, a test loss and
     * accuracy per epoch, drawn where the JSON lines put them */
    size_t len = 0;
    char *svg = slurp_svg(curve, "--curve", &len);
    double tx[8], ty[8], lx[8], ly[8], ax[8], ay[8];
    assert_int_equal(svg_points(svg, "train-loss", tx, ty, 8), n_steps);
    assert_int_equal(svg_points(svg, "test-loss", lx, ly, 8), n_epochs);
    assert_int_equal(svg_points(svg, "test-accuracy", ax, ay, 8), n_epochs);
    for (int i = 0; i < n_epochs; i++) {
        /* one step logged per epoch here: each at its epoch's end */
        assert_true(fabs(tx[i] - lx[i]) < 0.05 && fabs(ax[i] - lx[i]) < 0.05);
        assert_true(i == 0 || lx[i] > lx[i - 1]);
    }
    expect_drawn_in_order("test accuracy", eval_acc, ay, n_epochs);
    expect_drawn_in_order("test loss", eval_loss, ly, n_epochs);
    char label[160];
    FMT(label, "epoch 3 of 3: test accuracy %.4f", eval_acc[2]);
    static const char *const labels[] = {">mlp: training loss, test loss and test accuracy</text>",
                                         ">epoch</text>", ">loss</text>", ">test accuracy</text>",
                                         ">training loss (mean of every 6 steps)</text>",
                                         ">test accuracy (right axis)</text>"};
    for (size_t i = 0; i < sizeof labels / sizeof labels[0] + 1; i++) {
        const char *want = i < sizeof labels / sizeof labels[0] ? labels[i] : label;
        if (!strstr(svg, want))
            fail_msg("the learning curves lack \"%s\"", want);
    }
    free(svg);

    /* the trace: the first step in `ebb run --trace`'s format, every plan
     * step measured within its planned peak, then a summary */
    char *jsonl = slurp(trace, &len);
    assert_non_null(jsonl);
    int step_lines = 0, summaries = 0, backward = 0, updates = 0;
    for (char *line = strtok(jsonl, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = json_strict(line, strlen(line), "ebb train --trace");
        const cJSON *summary = cJSON_GetObjectItemCaseSensitive(j, "summary");
        if (summary) {
            summaries++;
            assert_int_equal(int_field(summary, "steps", "summary"), step_lines);
            assert_int_equal(int_field(summary, "training_step", "summary"), 1);
            assert_true(int_field(summary, "peak_bytes", "summary") <=
                        int_field(summary, "planned_peak_bytes", "summary"));
            assert_string_equal(str_field(summary, "device", "summary"), "cpu");
        } else {
            assert_int_equal(summaries, 0);
            long long peak = int_field(j, "peak_bytes", "trace"),
                      planned = int_field(j, "planned_peak_bytes", "trace");
            if (peak > planned)
                fail_msg("trace line %d: step %lld (%s) measured %lld bytes, planned %lld",
                         step_lines + 1, int_field(j, "step", "trace"), str_field(j, "op", "trace"),
                         peak, planned);
            assert_true(int_field(j, "live_bytes", "trace") >= 0);
            backward += strstr(str_field(j, "op", "trace"), ".backward") != NULL;
            updates += !strcmp(str_field(j, "op", "trace"), "update");
            step_lines++;
        }
        cJSON_Delete(j);
    }
    free(jsonl);
    assert_int_equal(summaries, 1);
    assert_true(backward > 0);
    assert_int_equal(updates, 6); /* specs/mlp.yaml's three weights and biases */
    /* `ebb chart --train` draws it over the training plan, nothing over */
    EBB(&r, "chart", "specs/mlp.yaml", "--train", "-i", "batch=16", "--trace", trace, "-o",
        chart);
    expect_code(&r, 0);
    cli_free(&r);
    svg = slurp_svg(chart, "ebb chart --trace", &len);
    assert_non_null(strstr(svg, "id=\"measured-live\""));
    assert_null(strstr(svg, "class=\"over\""));
    free(svg);

    /* stopped after 7 steps (mid-epoch), resumed to 18: the same weights;
     * the first 7 under the least memory budget, recomputing activations,
     * which changes no bit of the updates */
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "7", "--batch", "16", "--lr",
        "0.01", "--checkpoint-every", "7", "--checkpoint", ck, "--memory-budget", "least",
        "--device", "cpu");
    expect_code(&r, 0);
    const char *mb = strstr(r.out, "memory budget least: ");
    int n_recomputed = 0;
    if (!mb || !strstr(mb, " steps recomputed") ||
        sscanf(strstr(mb, "activation; ") ? strstr(mb, "activation; ") + 12 : "", "%d",
               &n_recomputed) != 1 ||
        n_recomputed < 1)
        fail_msg("`%s` printed no recomputation:\n%s", r.cmd, r.out);
    cli_free(&r);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "18", "--resume", ck,
        "--save-weights", wb, "--trace", trace, "--trace-step", "10", "--device", "cpu");
    expect_code(&r, 0);
    expect_contains("stdout", &r, r.out, "resumed from");
    char said[2 * PATH_MAX + 200];
    FMT(said, "trace of step 10 written to %s; draw it with: ebb chart specs/mlp.yaml --train -i "
        "batch=16 --trace %s -o chart.svg\n", trace, trace);
    expect_contains("stdout", &r, r.out, said);
    cli_free(&r);
    jsonl = slurp(trace, &len);
    assert_non_null(jsonl);
    assert_non_null(strstr(jsonl, "\"training_step\": 10,"));
    free(jsonl);
    size_t la = 0, lb = 0;
    char *a = slurp(wa, &la), *b = slurp(wb, &lb);
    assert_non_null(a);
    assert_non_null(b);
    if (la != lb || memcmp(a, b, la) != 0)
        fail_msg("the resumed run's weights differ from the uninterrupted run's");
    free(a);
    free(b);

    /* eval: "accuracy A top-5 T loss L on N samples" */
    EBB(&r, "eval", "specs/mlp.yaml", "--weights", wa, "--data", data, "--batch", "40");
    expect_code(&r, 0);
    double acc = -1, top5 = -1, loss = -1;
    int n = 0, used = 0;
    if (sscanf(r.out, "accuracy %lf top-5 %lf loss %lf on %d samples\n%n", &acc, &top5, &loss, &n,
               &used) != 4 ||
        (size_t)used != r.out_len)
        fail_msg("`ebb eval` printed: %s", r.out);
    assert_int_equal(n, N);
    assert_true(acc > 0.5 && acc <= top5 && top5 <= 1 && loss > 0);
    cli_free(&r);
    /* --top-k 0 leaves it out; --metrics adds a row per class whose counts
     * add up to the samples, and --json says the same */
    EBB(&r, "eval", "specs/mlp.yaml", "--weights", wa, "--data", data, "--top-k", "0");
    expect_code(&r, 0);
    double acc0 = -1, loss0 = -1;
    if (sscanf(r.out, "accuracy %lf loss %lf on %d samples", &acc0, &loss0, &n) != 3 ||
        acc0 != acc)
        fail_msg("`%s` printed: %s", r.cmd, r.out);
    cli_free(&r);
    EBB(&r, "eval", "specs/mlp.yaml", "--weights", wa, "--data", data, "--metrics");
    expect_code(&r, 0);
    {
        const char *row = strstr(r.out, "(predicted)");
        int64_t total = 0, diag = 0, rows = 0;
        row = row ? strchr(row, '\n') : NULL;
        for (; row && row[1]; row = strchr(row + 1, '\n')) {
            char *p = (char *)row + 1, *end;
            long cls = strtol(p, &end, 10);
            end = strchr(end, '|'); /* past the class's accuracy */
            if (!end) break;
            end++;
            for (long k = 0; k < 10; k++) {
                long v = strtol(end, &end, 10);
                total += v;
                diag += k == cls ? v : 0;
            }
            rows++;
        }
        if (rows != 10 || total != N || fabs((double)diag / N - acc) > 5e-5)
            fail_msg("`%s`: %lld rows counting %lld samples, %lld right:\n%s", r.cmd,
                     (long long)rows, (long long)total, (long long)diag, r.out);
    }
    cli_free(&r);
    EBB(&r, "eval", "specs/mlp.yaml", "--weights", wa, "--data", data, "--metrics", "--json");
    expect_code(&r, 0);
    {
        cJSON *j = cJSON_Parse(r.out);
        cJSON *conf = cJSON_GetObjectItemCaseSensitive(j, "confusion");
        cJSON *ca = cJSON_GetObjectItemCaseSensitive(j, "class_accuracy");
        if (!cJSON_IsArray(conf) || cJSON_GetArraySize(conf) != 10 || !cJSON_IsArray(ca) ||
            cJSON_GetArraySize(ca) != 10 ||
            fabs(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "top_k_accuracy")) -
                 top5) > 5e-5)
            fail_msg("`%s` printed: %s", r.cmd, r.out);
        cJSON_Delete(j);
    }
    cli_free(&r);
    /* a label out of range for the spec's 10 classes */
    yv[3] = 10;
    assert_ok(ebb_tensor_from_host(&x, xv, sizeof xv, &xs, EBB_FLOAT32, ebb_device_cpu()));
    assert_ok(ebb_tensor_from_host(&y, yv, sizeof yv, &ys, EBB_INT64, ebb_device_cpu()));
    ts[0] = x, ts[1] = y;
    assert_ok(ebb_safetensors_write(data, names, ts, 2));
    ebb_tensor_free(x);
    ebb_tensor_free(y);
    EBB(&r, "eval", "specs/mlp.yaml", "--weights", wa, "--data", data);
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, "label 10 of sample 3 is out of range for 10 classes");
    cli_free(&r);
}

/* ---- training that never loses work ---------------------------------------- */

/* n samples of 64 features, class c lifting features 6c..6c+5: what
 * specs/mlp.yaml learns in a few steps. */
static void write_train_data(const char *path, int n, uint64_t seed) {
    enum { F = 64 };
    ebb_shape xs = {2, {n, F}}, ys = {1, {n}};
    ebb_tensor *x = NULL, *y = NULL;
    float *xv = malloc(sizeof *xv * (size_t)n * F);
    int64_t *yv = malloc(sizeof *yv * (size_t)n);
    assert_true(xv && yv);
    assert_ok(ebb_tensor_randn(&x, &xs, EBB_FLOAT32, ebb_device_cpu(), seed));
    assert_ok(ebb_tensor_to_host(x, xv, sizeof *xv * (size_t)n * F));
    ebb_tensor_free(x);
    for (int i = 0; i < n; i++) {
        yv[i] = i % 10;
        for (int k = 0; k < 6; k++)
            xv[i * F + yv[i] * 6 + k] += 2.0f;
    }
    assert_ok(ebb_tensor_from_host(&x, xv, sizeof *xv * (size_t)n * F, &xs, EBB_FLOAT32,
                                   ebb_device_cpu()));
    assert_ok(
        ebb_tensor_from_host(&y, yv, sizeof *yv * (size_t)n, &ys, EBB_INT64, ebb_device_cpu()));
    const char *names[2] = {"x", "y"};
    ebb_tensor *ts[2] = {x, y};
    assert_ok(ebb_safetensors_write(path, names, ts, 2));
    ebb_tensor_free(x);
    ebb_tensor_free(y);
    free(xv);
    free(yv);
}

/* A copy of the safetensors file `src` at `dst`, less the tensors whose
 * names start with drop_prefix, with NaN as element 0 of float32 tensor
 * nan_name, and the checkpoint metadata `meta_key` set to meta_value. */
static void rewrite_checkpoint(const char *src, const char *dst, const char *drop_prefix,
                               const char *nan_name, const char *meta_key, const char *meta_value) {
    static const char *const keys[] = {"ebb_checkpoint", "step",      "epoch", "seed",     "batch",
                                       "shuffle",        "drop_last", "data",  "stateless"};
    ebb_safetensors *sf = NULL;
    assert_ok(ebb_safetensors_open(&sf, src));
    int n = ebb_safetensors_count(sf), k = 0, m = 0;
    const char **names = calloc((size_t)n + 1, sizeof *names);
    ebb_tensor **ts = calloc((size_t)n + 1, sizeof *ts);
    const char *meta[2 * 9];
    assert_true(names && ts);
    for (int i = 0; i < n; i++) {
        const char *name = ebb_safetensors_name_at(sf, i);
        if (drop_prefix && starts_with(name, drop_prefix)) continue;
        assert_ok(ebb_safetensors_load(&ts[k], sf, name, ebb_device_cpu()));
        if (nan_name && !strcmp(name, nan_name)) {
            size_t nb = ebb_tensor_nbytes(ts[k]);
            float *v = malloc(nb);
            assert_int_equal(ebb_tensor_dtype(ts[k]), EBB_FLOAT32);
            assert_non_null(v);
            assert_ok(ebb_tensor_to_host(ts[k], v, nb));
            v[0] = NAN;
            assert_ok(ebb_tensor_copy_from_host(ts[k], v, nb));
            free(v);
        }
        names[k++] = name;
    }
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const char *v = meta_key && !strcmp(keys[i], meta_key)
                            ? meta_value
                            : ebb_safetensors_metadata(sf, keys[i]);
        if (v) {
            meta[2 * m] = keys[i];
            meta[2 * m++ + 1] = v;
        }
    }
    assert_ok(ebb_safetensors_write_meta(dst, names, ts, k, meta, m));
    for (int i = 0; i < k; i++)
        ebb_tensor_free(ts[i]);
    free(names);
    free(ts);
    ebb_safetensors_close(sf);
}

/* The checkpoint's optim.options (format version 2, 15 values): kind (0
 * SGD, 1 Adam, 2 AdamW, ...) and lr. */
static void checkpoint_optimizer(const char *path, double *kind, double *lr) {
    ebb_safetensors *sf = NULL;
    ebb_tensor *t = NULL;
    double v[15];
    assert_ok(ebb_safetensors_open(&sf, path));
    assert_ok(ebb_safetensors_load(&t, sf, "optim.options", ebb_device_cpu()));
    assert_ok(ebb_tensor_to_host(t, v, sizeof v));
    ebb_tensor_free(t);
    ebb_safetensors_close(sf);
    *kind = v[1];
    *lr = v[2];
}

static void copy_file(const char *from, const char *to) {
    size_t len = 0;
    char *bytes = slurp(from, &len);
    assert_non_null(bytes);
    assert_int_equal(write_file(to, bytes, len), 0);
    free(bytes);
}

/* Fails unless the file at `path` holds exactly what `want` does. */
static void expect_same_bytes(const char *path, const char *want, const char *why) {
    size_t la = 0, lb = 0;
    char *a = slurp(path, &la), *b = slurp(want, &lb);
    if (!a || !b || la != lb || memcmp(a, b, la) != 0)
        fail_msg("%s: %s changed (%s)", why, path, a ? "its bytes differ" : "it is gone");
    free(a);
    free(b);
}

/* n samples for specs/mlp.yaml (x float32 [n, 64] from seed, y int64 the
 * sample's index mod 10) written to path. */
static void write_mlp_data(const char *path, int64_t n, uint64_t seed) {
    ebb_shape xs = {2, {n, 64}}, ys = {1, {n}};
    ebb_tensor *t[2] = {NULL, NULL};
    int64_t *yv = malloc(sizeof *yv * (size_t)n);
    assert_non_null(yv);
    for (int64_t i = 0; i < n; i++) yv[i] = i % 10;
    assert_ok(ebb_tensor_randn(&t[0], &xs, EBB_FLOAT32, ebb_device_cpu(), seed));
    assert_ok(ebb_tensor_from_host(&t[1], yv, sizeof *yv * (size_t)n, &ys, EBB_INT64,
                                   ebb_device_cpu()));
    free(yv);
    const char *names[2] = {"x", "y"};
    assert_ok(ebb_safetensors_write(path, names, t, 2));
    ebb_tensor_free(t[0]);
    ebb_tensor_free(t[1]);
}

/* ---- the --nproc launcher as an agent ------------------------------------------ */

/* The processes whose parent is `parent`, from /proc (at most max). */
static int children_of(pid_t parent, pid_t *out, int max) {
    DIR *d = opendir("/proc");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) && n < max) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        char path[64], buf[512];
        FMT(path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        size_t len = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        buf[len] = 0;
        const char *close_paren = strrchr(buf, ')');
        long ppid = 0;
        char state = 0;
        if (close_paren && sscanf(close_paren + 1, " %c %ld", &state, &ppid) == 2 &&
            ppid == (long)parent && state != 'Z')
            out[n++] = (pid_t)atol(e->d_name);
    }
    if (d) closedir(d);
    return n;
}

/* Whether pid is gone (or a zombie nobody has reaped yet). */
static int process_gone(pid_t pid) {
    char path[64], buf[512];
    FMT(path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    const char *close_paren = strrchr(buf, ')');
    return close_paren && close_paren[1] == ' ' && close_paren[2] == 'Z';
}

/* Starts `ebb train` with --nproc 2 on data (a long run, collectives timing
 * out after 3 s; `extra` one more flag or NULL) with stderr into err; waits
 * for its two ranks, into ranks, and their first step (rank 0's log line:
 * both are training then, their signal handlers in place). Returns the
 * launcher's pid. */
static pid_t start_launcher(const char *data, const char *ck, const char *err, const char *extra,
                            pid_t *ranks) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char out[PATH_MAX + 8];
        snprintf(out, sizeof out, "%s.out", err);
        int fd = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644), null = open("/dev/null", O_RDWR);
        int ofd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (chdir(EBB_SOURCE_DIR) != 0 || fd < 0 || ofd < 0 || null < 0 || dup2(null, 0) < 0 ||
            dup2(ofd, 1) < 0 || dup2(fd, 2) < 0)
            _exit(126);
        setenv("EBB_DIST_TIMEOUT_MS", "3000", 1);
        /* whatever the test runner ignores, the command starts with the defaults */
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        alarm(CLI_ALARM_SECONDS);
        execl(cli_path, "ebb", "train", "specs/mlp.yaml", "--data", data, "--epochs", "100000",
              "--batch", "16", "--nproc", "2", "--device", "cpu", "--checkpoint", ck,
              "--log-every", "1", extra, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 600 && children_of(pid, ranks, 2) < 2; i++) usleep(50 * 1000);
    if (children_of(pid, ranks, 2) < 2) {
        kill(pid, SIGKILL);
        fail_msg("the launcher started no two ranks in 30 s");
    }
    char out[PATH_MAX + 8];
    FMT(out, "%s.out", err);
    for (int i = 0; i < 1200; i++) {
        size_t len = 0;
        char *text = slurp(out, &len);
        int stepped = text && strstr(text, " step 1/");
        free(text);
        if (stepped) return pid;
        usleep(50 * 1000);
    }
    kill(pid, SIGKILL);
    fail_msg("the ranks made no step in 60 s");
    return pid;
}

/* Waits up to `seconds` for the launcher; its wait status, or -1. */
static int wait_launcher(pid_t pid, int seconds) {
    for (int i = 0; i < seconds * 20; i++) {
        int status = 0;
        if (waitpid(pid, &status, WNOHANG) == pid) return status;
        usleep(50 * 1000);
    }
    return -1;
}

/* Every rank ends within `seconds`; those that do not are killed and named. */
static void expect_ranks_gone(const pid_t *ranks, int n, int seconds, const char *what) {
    for (int i = 0; i < seconds * 20; i++) {
        int left = 0;
        for (int r = 0; r < n; r++) left += !process_gone(ranks[r]);
        if (!left) return;
        usleep(50 * 1000);
    }
    for (int r = 0; r < n; r++) kill(ranks[r], SIGKILL);
    fail_msg("%s: a rank outlived its job by %d s", what, seconds);
}

/* The launcher of `ebb train --nproc 2` is an agent, as torchrun's, and no
 * job hangs or leaves a process behind: a stopped rank ends the job
 * (the other's collective times out, and the stopped one is continued and
 * stopped, or killed after the grace period), a SIGTERM to the launcher
 * reaches the ranks, which stop with a checkpoint (143), and the ranks of
 * a launcher killed outright stop by their parent-death signal. Bounded:
 * 3 s collective timeouts, 10 s of grace. */
static void test_launcher_agent(void **state) {
    (void)state;
    char data[PATH_MAX], ck[PATH_MAX], err[PATH_MAX];
    tmp_path(data, sizeof data, "agent.safetensors");
    tmp_path(ck, sizeof ck, "agent-ck.safetensors");
    tmp_path(err, sizeof err, "agent.err");
    write_mlp_data(data, 96, 7);
    pid_t ranks[2];

    /* a rank stopped (SIGSTOP): the job ends, failed, within the timeout
     * and the grace period */
    pid_t l = start_launcher(data, ck, err, NULL, ranks);
    kill(ranks[1], SIGSTOP);
    int status = wait_launcher(l, 30);
    if (status == -1) {
        kill(l, SIGKILL);
        kill(ranks[0], SIGKILL);
        kill(ranks[1], SIGKILL);
        fail_msg("a stopped rank held its job for 30 s");
    }
    size_t len = 0;
    char *text = slurp(err, &len);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 3 || !text || !strstr(text, "of 2 exited with status 3"))
        fail_msg("a stopped rank: the launcher's status %d, stderr:\n%s", status, text ? text : "");
    free(text);
    expect_ranks_gone(ranks, 2, 5, "a stopped rank");

    /* SIGTERM to the launcher: passed to the ranks, which stop between
     * steps with a checkpoint */
    l = start_launcher(data, ck, err, NULL, ranks);
    kill(l, SIGTERM);
    status = wait_launcher(l, 30);
    text = slurp(err, &len);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 143 || !text ||
        !strstr(text, "interrupted by SIGTERM")) {
        if (status == -1) kill(l, SIGKILL);
        fail_msg("SIGTERM to the launcher: its status %d, stderr:\n%s", status, text ? text : "");
    }
    free(text);
    expect_ranks_gone(ranks, 2, 5, "SIGTERM to the launcher");

    /* SIGTERM to one rank, ZeRO-1's rank 0: every rank stops after the next
     * step, together, and the job's one checkpoint (the state gathered)
     * goes on from there; the other rank names no file of its own */
    unlink(ck);
    l = start_launcher(data, ck, err, "--zero", ranks);
    kill(ranks[0], SIGTERM);
    status = wait_launcher(l, 30);
    text = slurp(err, &len);
    long long at = -1;
    const char *said = text ? strstr(text, "rank 1: interrupted by SIGTERM after step ") : NULL;
    if (said) sscanf(said + strlen("rank 1: interrupted by SIGTERM after step "), "%lld", &at);
    char want[PATH_MAX + 96];
    FMT(want, "interrupted by SIGTERM after step %lld; checkpoint written to %s", at, ck);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 143 || at < 1 ||
        !strstr(text, want) || strstr(text, "killed by signal")) {
        if (status == -1) kill(l, SIGKILL);
        fail_msg("SIGTERM to rank 0: the launcher's status %d, stderr:\n%s", status,
                 text ? text : "");
    }
    free(text);
    expect_ranks_gone(ranks, 2, 5, "SIGTERM to one rank");
    char steps[32];
    FMT(steps, "%lld", at + 1);
    cli_result r;
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--batch", "16", "--nproc", "2", "--zero",
        "--device", "cpu", "--resume", ck, "--steps", steps);
    expect_code(&r, 0);
    cli_free(&r);

    /* SIGKILL to the launcher: the ranks go too (their parent-death signal) */
    l = start_launcher(data, ck, err, NULL, ranks);
    kill(l, SIGKILL);
    status = wait_launcher(l, 10);
    if (status == -1 || !WIFSIGNALED(status)) fail_msg("the killed launcher: status %d", status);
    expect_ranks_gone(ranks, 2, 20, "SIGKILL to the launcher");
    unlink(ck);
}

/* Whether `path` is a whole safetensors file: it opens, and every tensor
 * reads back matching its checksum. Its "step" into *step when asked. */
static int whole_file(const char *path, long long *step) {
    ebb_safetensors *st = NULL;
    if (ebb_safetensors_open(&st, path) != EBB_OK) return 0;
    int ok = 1;
    for (int i = 0; ok && i < ebb_safetensors_count(st); i++) {
        ebb_tensor *t = NULL;
        ok = ebb_safetensors_load(&t, st, ebb_safetensors_name_at(st, i), ebb_device_cpu()) ==
             EBB_OK;
        ebb_tensor_free(t);
    }
    const char *s = ebb_safetensors_metadata(st, "step");
    if (step) *step = s ? atoll(s) : -1;
    ebb_safetensors_close(st);
    return ok;
}

/* Every file the launcher's stderr names as a checkpoint ("checkpoint
 * written to F", "continue with --resume F") exists and is whole, at the
 * step said; how many were named. */
static int expect_named_checkpoints(const char *text, const char *what) {
    static const char *says[] = {"checkpoint written to ", "continue with --resume "};
    int named = 0;
    for (int k = 0; k < 2; k++)
        for (const char *at = strstr(text, says[k]); at; at = strstr(at + 1, says[k])) {
            char path[PATH_MAX];
            if (sscanf(at + strlen(says[k]), "%4095s", path) != 1) continue;
            size_t n = strlen(path);
            while (n && strchr(" ,;()", path[n - 1])) path[--n] = '\0';
            long long step = -1, said = -1;
            if (!whole_file(path, &step))
                fail_msg("%s: stderr names %s, which is missing or damaged:\n%s", what, path, text);
            const char *after = k == 0 ? strstr(text, " after step ") : NULL;
            if (after && after < at && sscanf(after + 12, "%lld", &said) == 1 && said != step)
                fail_msg("%s: stderr says step %lld, and %s holds step %lld", what, said, path,
                         step);
            named++;
        }
    return named;
}

/* The agent's fault loop (issue 49): `ebb train --nproc 2` (ZeRO-1 on
 * every other run) meets a fault at a random moment after its first step:
 * a rank killed, stopped or sent SIGTERM, SIGINT or SIGHUP, or the
 * launcher sent SIGTERM or SIGINT or killed. Every run must end (no hang:
 * the launcher within 40 s), leave no rank behind, and lose no checkpoint:
 * a signal to any one process ends the job with 128+signal and one whole
 * checkpoint at the step it names; every file stderr names exists and is
 * whole, and so is the checkpoint file whatever happened. EBB_FAULT_RUNS
 * runs (default 50), from EBB_FAULT_SEED (default 49). Bounded: 3 s
 * collective timeouts, 10 s of grace. */
static void test_agent_fault_loop(void **state) {
    (void)state;
    static const struct {
        const char *what;
        int sig, to_launcher;
    } faults[] = {
        {"SIGKILL to a rank", SIGKILL, 0}, {"SIGSTOP to a rank", SIGSTOP, 0},
        {"SIGTERM to a rank", SIGTERM, 0}, {"SIGINT to a rank", SIGINT, 0},
        {"SIGHUP to a rank", SIGHUP, 0},   {"SIGTERM to the launcher", SIGTERM, 1},
        {"SIGINT to the launcher", SIGINT, 1}, {"SIGKILL to the launcher", SIGKILL, 1},
    };
    const int n_faults = (int)(sizeof faults / sizeof *faults);
    const char *env = getenv("EBB_FAULT_RUNS");
    int runs = env ? atoi(env) : 50;
    env = getenv("EBB_FAULT_SEED");
    uint64_t rng = env ? strtoull(env, NULL, 10) : 49;
    char data[PATH_MAX], ck[PATH_MAX], err[PATH_MAX];
    tmp_path(data, sizeof data, "faults.safetensors");
    tmp_path(ck, sizeof ck, "faults-ck.safetensors");
    tmp_path(err, sizeof err, "faults.err");
    write_mlp_data(data, 96, 7);
    int seen[8] = {0}, checkpoints = 0;
    double t0 = ebb_test_now_s(), longest = 0;
    for (int run = 0; run < runs; run++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int f = (int)((rng >> 33) % (uint64_t)n_faults), r = (int)((rng >> 20) & 1);
        int zero = run % 2, delay_ms = (int)((rng >> 40) % 1200);
        char what[128];
        FMT(what, "run %d (%s%s, after %d ms)", run, faults[f].what, zero ? ", --zero" : "",
            delay_ms);
        unlink(ck);
        pid_t ranks[2];
        pid_t l = start_launcher(data, ck, err, zero ? "--zero" : NULL, ranks);
        usleep((useconds_t)delay_ms * 1000);
        double hit = ebb_test_now_s();
        kill(faults[f].to_launcher ? l : ranks[r], faults[f].sig);
        int status = wait_launcher(l, 40);
        if (status == -1) {
            kill(l, SIGKILL);
            kill(ranks[0], SIGKILL);
            kill(ranks[1], SIGKILL);
            fail_msg("%s: the job hung for 40 s", what);
        }
        double took = ebb_test_now_s() - hit;
        if (took > longest) longest = took;
        expect_ranks_gone(ranks, 2, faults[f].sig == SIGKILL && faults[f].to_launcher ? 20 : 5,
                          what);
        size_t len = 0;
        char *text = slurp(err, &len);
        if (!text) fail_msg("%s: no stderr", what);
        int named = expect_named_checkpoints(text, what);
        checkpoints += named;
        if (access(ck, F_OK) == 0 && !whole_file(ck, NULL))
            fail_msg("%s: %s is damaged", what, ck);
        int stop = faults[f].sig != SIGKILL && faults[f].sig != SIGSTOP;
        if (stop && (!WIFEXITED(status) || WEXITSTATUS(status) != 128 + faults[f].sig || !named))
            fail_msg("%s: the launcher's status %d (want exit %d with a checkpoint), stderr:\n%s",
                     what, status, 128 + faults[f].sig, text);
        if (!stop && WIFEXITED(status) && WEXITSTATUS(status) == 0)
            fail_msg("%s: the job exited 0, stderr:\n%s", what, text);
        free(text);
        seen[f]++;
    }
    unlink(ck);
    printf("%d runs in %.0f s: ", runs, ebb_test_now_s() - t0);
    for (int f = 0; f < n_faults; f++) printf("%s%d %s", f ? ", " : "", seen[f], faults[f].what);
    printf("; %d checkpoints named, each whole; the slowest job ended %.1f s after its fault\n",
           checkpoints, longest);
}

/* Starts rank `rank` of 2 by hand, as torchrun would (port `port`), running
 * `ebb train SPEC --data DATA --steps 2 --batch 16 --device cpu [extra]`,
 * stderr into err; returns its pid. */
static pid_t start_rank(int rank, int port, const char *spec, const char *data, const char *extra,
                        const char *err) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char r[16], p[16];
        snprintf(r, sizeof r, "%d", rank);
        snprintf(p, sizeof p, "%d", port);
        setenv("RANK", r, 1);
        setenv("LOCAL_RANK", r, 1);
        setenv("WORLD_SIZE", "2", 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", p, 1);
        setenv("EBB_DIST_TIMEOUT_MS", "10000", 1);
        unsetenv("EBB_LAUNCHER_PID");
        int fd = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644), null = open("/dev/null", O_RDWR);
        if (chdir(EBB_SOURCE_DIR) != 0 || fd < 0 || null < 0 || dup2(null, 0) < 0 ||
            dup2(null, 1) < 0 || dup2(fd, 2) < 0)
            _exit(126);
        alarm(CLI_ALARM_SECONDS);
        const char *argv[16] = {"ebb", "train", spec, "--data", data, "--steps", "2", "--batch",
                                "16", "--device", "cpu"};
        int n = 11;
        char copy[256];
        snprintf(copy, sizeof copy, "%s", extra ? extra : "");
        for (char *w = strtok(copy, " "); w && n < 15; w = strtok(NULL, " ")) argv[n++] = w;
        argv[n] = NULL;
        execv(cli_path, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Two ranks started by hand that differ in what they train, as a stale
 * spec, option or dataset on one machine would: both refuse before the
 * first step (exit 1), and rank 1 names the first field that differs.
 * Each case against rank 0's `ebb train specs/mlp.yaml --data DATA`. */
static void test_ranks_that_differ(void **state) {
    (void)state;
    char data[PATH_MAX], other[PATH_MAX], spec[PATH_MAX], err0[PATH_MAX], err1[PATH_MAX];
    tmp_path(data, sizeof data, "differ.safetensors");
    tmp_path(other, sizeof other, "differ-other.safetensors");
    /* another mlp.yaml, so that the plan's name is the same */
    tmp_path(spec, sizeof spec, "differ");
    mkdir(spec, 0755);
    tmp_path(spec, sizeof spec, "differ/mlp.yaml");
    tmp_path(err0, sizeof err0, "differ0.err");
    tmp_path(err1, sizeof err1, "differ1.err");
    write_mlp_data(data, 96, 7);
    write_mlp_data(other, 96, 8);
    /* specs/mlp.yaml under its own name with tanh for its first relu, and
     * with another dropout */
    size_t len = 0;
    char path[PATH_MAX];
    FMT(path, "%s/specs/mlp.yaml", EBB_SOURCE_DIR);
    char *text = slurp(path, &len);
    assert_non_null(text);
    char tanh_spec[PATH_MAX], drop_spec[PATH_MAX];
    FMT(tanh_spec, "%s", spec);
    tmp_path(drop_spec, sizeof drop_spec, "differ/dropout");
    mkdir(drop_spec, 0755);
    tmp_path(drop_spec, sizeof drop_spec, "differ/dropout/mlp.yaml");
    for (int k = 0; k < 2; k++) {
        const char *from = k ? "p: 0.1" : "  - relu", *to = k ? "p: 0.5" : "  - tanh";
        char *at = strstr(text, from);
        assert_non_null(at);
        FILE *f = fopen(k ? drop_spec : tanh_spec, "w");
        assert_non_null(f);
        fprintf(f, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
        fclose(f);
    }
    free(text);
    static const struct {
        const char *spec1, *data1, *extra0, *extra1, *names;
    } cases[] = {
        {"tanh", NULL, NULL, NULL, "plan-fingerprint"},
        {"dropout", NULL, NULL, NULL, "plan-fingerprint"},
        {NULL, NULL, NULL, "--no-decay *.bias", "no-decay"},
        {NULL, NULL, NULL, "--lr-scale *.bias=0.5", "lr-scale"},
        {NULL, "other", NULL, NULL, "data"},
        {NULL, NULL, "--zero", "--zero --checkpoint-every 1", "checkpoint-every"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int port = ebb_test_free_port();
        const char *s1 = !cases[i].spec1                      ? "specs/mlp.yaml"
                         : !strcmp(cases[i].spec1, "tanh") ? tanh_spec
                                                              : drop_spec;
        pid_t r0 = start_rank(0, port, "specs/mlp.yaml", data, cases[i].extra0, err0);
        pid_t r1 = start_rank(1, port, s1, cases[i].data1 ? other : data, cases[i].extra1, err1);
        int st0 = wait_launcher(r0, 60), st1 = wait_launcher(r1, 60);
        if (st0 == -1) kill(r0, SIGKILL);
        if (st1 == -1) kill(r1, SIGKILL);
        char *e1 = slurp(err1, &len);
        char want[128];
        FMT(want, "rank 1 of 2 is not training what rank 0 is: %s ", cases[i].names);
        if (st0 == -1 || st1 == -1 || !WIFEXITED(st0) || WEXITSTATUS(st0) != 1 ||
            !WIFEXITED(st1) || WEXITSTATUS(st1) != 1 || !e1 || !strstr(e1, want))
            fail_msg("ranks differing in %s: status %d and %d, rank 1 said:\n%s",
                     cases[i].names, st0, st1, e1 ? e1 : "");
        free(e1);
    }
}

/* A run whose loss turns NaN (SGD at lr 1e6) stops at that step, exit 1,
 * and leaves the good checkpoint and weights it would have replaced as
 * they were; --skip-nonfinite undoes such steps and counts them. Weights
 * and checkpoints holding NaN are refused by `ebb eval` and `--resume`,
 * naming the tensor, and a checkpoint is never written with NaN in it. */
/* Recipes from the command line: clipping by norm and by value, frozen
 * parameters, and a CSV log with a row per logged step and per epoch. */
static void test_train_recipes(void **state) {
    (void)state;
    char data[PATH_MAX], w0[PATH_MAX], w1[PATH_MAX], csv[PATH_MAX];
    tmp_path(data, sizeof data, "recipes.safetensors");
    tmp_path(w0, sizeof w0, "recipes-w0.safetensors");
    tmp_path(w1, sizeof w1, "recipes-w1.safetensors");
    tmp_path(csv, sizeof csv, "recipes.csv");
    write_mlp_data(data, 96, 7);

    cli_result r;
    /* the initial weights (seed 0), which a frozen parameter keeps */
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "1", "--lr", "0",
        "--weight-decay", "0", "--save-weights", w0, "--batch", "16");
    expect_code(&r, 0);
    cli_free(&r);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--eval-data", data, "--steps", "12",
        "--batch", "16", "--clip-grad-norm", "0.5", "--clip-grad-value", "0.1", "--freeze",
        "fc1.*", "--log-every", "4", "--log-csv", csv, "--save-weights", w1, "--no-decay",
        "*.bias");
    expect_code(&r, 0);
    expect_contains("stdout", &r, r.out,
                    "clip_grad_norm 0.5, clip_grad_value 0.1, no weight decay for *.bias");
    expect_contains("stdout", &r, r.out, "clip_grad_norm 0.5: the updates wait for the whole "
                                         "backward: the step's peak ");
    expect_contains("stdout", &r, r.out, " without clipping\n");
    cli_free(&r);
    ebb_safetensors *a = NULL, *b = NULL;
    assert_ok(ebb_safetensors_open(&a, w0));
    assert_ok(ebb_safetensors_open(&b, w1));
    static const char *const params[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc3.bias"};
    for (int i = 0; i < 4; i++) {
        ebb_tensor *ta = NULL, *tb = NULL;
        assert_ok(ebb_safetensors_load(&ta, a, params[i], ebb_device_cpu()));
        assert_ok(ebb_safetensors_load(&tb, b, params[i], ebb_device_cpu()));
        size_t n = (size_t)ebb_tensor_numel(ta) * sizeof(float);
        float *va = malloc(n), *vb = malloc(n);
        assert_ok(ebb_tensor_to_host(ta, va, n));
        assert_ok(ebb_tensor_to_host(tb, vb, n));
        int same = memcmp(va, vb, n) == 0;
        if (same != (i < 2)) fail_msg("%s %s by training with --freeze 'fc1.*'", params[i],
                                      same ? "was left as it was" : "changed");
        free(va);
        free(vb);
        ebb_tensor_free(ta);
        ebb_tensor_free(tb);
    }
    ebb_safetensors_close(a);
    ebb_safetensors_close(b);
    /* 6 steps an epoch: rows for steps 4, 8 and 12, and for epochs 1 and 2 */
    size_t len = 0;
    char *text = slurp(csv, &len);
    int steps = 0, epochs = 0, lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        int cols = 1;
        for (const char *p = line; *p; p++) cols += *p == ',';
        if (cols != 12) fail_msg("%s: %d columns in '%s'", csv, cols, line);
        steps += !strncmp(line, "step,", 5);
        /* an epoch row has no lr, but its evaluation's three figures; an
         * mlp's loss is not per token: no perplexities (the last two) */
        size_t n = strlen(line);
        epochs += !strncmp(line, "epoch,", 6) && n > 2 && !strcmp(line + n - 2, ",,") &&
                  line[n - 3] != ',' && strstr(line, ",,,") == NULL;
    }
    free(text);
    if (lines != 6 || steps != 3 || epochs != 2)
        fail_msg("%s: %d lines, %d step rows, %d complete epoch rows", csv, lines, steps, epochs);
    /* --nproc 2 --zero: the ranks train together, sharding the optimizer,
     * rank 0 alone speaks and writes (test_trainer compares the weights with
     * one process's, and ZeRO-1's with the unsharded run's) */
    char w2[PATH_MAX];
    tmp_path(w2, sizeof w2, "recipes-w2.safetensors");
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "3", "--batch", "16",
        "--nproc", "2", "--zero", "--bucket-size", "8KiB", "--save-weights", w2, "--device",
        "cpu");
    expect_code(&r, 0);
    const char *first = strstr(r.out, "training specs/mlp.yaml");
    if (!first || strstr(first + 1, "training specs/mlp.yaml"))
        fail_msg("`%s` printed %s start line:\n%s", r.cmd, first ? "more than one" : "no", r.out);
    cli_free(&r);
    assert_ok(ebb_safetensors_open(&a, w2));
    ebb_safetensors_close(a);
    /* a global batch two ranks cannot share: refused before any rank starts
     * (a rank refusing it alone could take the other down with a lost
     * connection first, and the exit code would depend on which died first) */
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "3", "--batch", "15",
        "--nproc", "2", "--device", "cpu");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--batch 15 is the global batch of 2 ranks");
    if (strstr(r.err, "exited with status"))
        fail_msg("`%s` started its ranks:\n%s", r.cmd, r.err);
    cli_free(&r);
    /* ZeRO-1 needs ranks; its plan is one rank's */
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "3", "--zero");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--zero shards the optimizer over the ranks");
    cli_free(&r);
    EBB(&r, "plan", "specs/mlp.yaml", "--train", "--data-parallel", "2", "--zero", "--rank", "1");
    expect_code(&r, 0);
    expect_contains("stdout", &r, r.out, "ZeRO-1, rank 1 of 2: updates ");
    expect_contains("stdout", &r, r.out, "2 broadcast steps send each rank's updated parameters");
    cli_free(&r);
    /* --overlap: each bucket started, then waited for when the next is full */
    EBB(&r, "plan", "specs/mlp.yaml", "--train", "--data-parallel", "2", "--bucket-size", "8KiB",
        "--overlap");
    expect_code(&r, 0);
    expect_contains("stdout", &r, r.out, "allreduce.start");
    expect_contains("stdout", &r, r.out, "allreduce.wait");
    expect_contains("stdout", &r, r.out, "each travelling while the backward goes on");
    cli_free(&r);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "3", "--overlap");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--overlap applies to data-parallel training");
    cli_free(&r);
    /* NCCL takes a GPU per rank: one named GPU for every rank is refused */
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "3", "--nproc", "2", "--device",
        "cuda:0");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--device cuda:0 would put every rank on one GPU");
    cli_free(&r);
    /* what the options refuse */
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "2", "--freeze", "fc9.*");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--freeze 'fc9.*' matches no parameter");
    cli_free(&r);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "2", "--freeze", "*");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--freeze leaves no parameter to train");
    cli_free(&r);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "2", "--no-decay", "*.bais");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--no-decay '*.bais' matches no trained parameter");
    cli_free(&r);
    EBB(&r, "plan", "specs/mlp.yaml", "--clip-grad-norm", "1");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "apply to --train");
    cli_free(&r);
    /* --batch is -i batch=N for every command */
    cli_result r2;
    EBB(&r, "plan", "specs/mlp.yaml", "--train", "--batch", "8");
    EBB(&r2, "plan", "specs/mlp.yaml", "--train", "-i", "batch=8");
    expect_code(&r, 0);
    if (r.out_len != r2.out_len || memcmp(r.out, r2.out, r.out_len))
        fail_msg("`%s` and `%s` differ", r.cmd, r2.cmd);
    cli_free(&r);
    cli_free(&r2);
    EBB(&r, "chart", "specs/mlp.yaml", "--batch", "8", "-i", "batch=4");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--batch 8 and -i batch=4 both set 'batch'");
    cli_free(&r);
    EBB(&r, "plan", "specs/mlp.yaml", "--train", "-i", "batch=8", "--clip-grad-norm", "1");
    expect_code(&r, 0);
    expect_contains("stdout", &r, r.out, "clip_grad_norm 1: the updates wait for every gradient");
    expect_contains("stdout", &r, r.out, "  clip_grad_norm       gradients ");
    cli_free(&r);
}

static void test_train_nonfinite(void **state) {
    (void)state;
    char data[PATH_MAX], ck[PATH_MAX], w[PATH_MAX], ck_good[PATH_MAX], w_good[PATH_MAX];
    char ck2[PATH_MAX], w2[PATH_MAX], bad[PATH_MAX];
    tmp_path(data, sizeof data, "nf-data.safetensors");
    tmp_path(ck, sizeof ck, "nf-ck.safetensors");
    tmp_path(w, sizeof w, "nf-w.safetensors");
    tmp_path(ck_good, sizeof ck_good, "nf-ck-good.safetensors");
    tmp_path(w_good, sizeof w_good, "nf-w-good.safetensors");
    tmp_path(ck2, sizeof ck2, "nf-ck2.safetensors");
    tmp_path(w2, sizeof w2, "nf-w2.safetensors");
    tmp_path(bad, sizeof bad, "nf-bad.safetensors");
    write_train_data(data, 96, 5);
    cli_result r;
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "12", "--batch", "16",
        "--checkpoint", ck, "--checkpoint-every", "6", "--save-weights", w);
    expect_code(&r, 0);
    cli_free(&r);
    copy_file(ck, ck_good);
    copy_file(w, w_good);

    /* the loss turns NaN: stop there, write nothing */
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "20", "--batch", "16",
        "--optimizer", "sgd", "--lr", "1e6", "--checkpoint", ck, "--checkpoint-every", "5",
        "--save-weights", w, "--log-every", "1");
    expect_code(&r, 1);
    long long at = 0;
    const char *msg = strstr(r.err, "ebb: step ");
    if (!msg || sscanf(msg, "ebb: step %lld: the loss is ", &at) != 1 || at < 2 || at > 5 ||
        !strstr(msg, "--skip-nonfinite"))
        fail_msg("`%s` said:\n%s", r.cmd, r.err);
    if (strstr(r.out, "nan") || strstr(r.out, "weights written"))
        fail_msg("`%s` printed:\n%s", r.cmd, r.out);
    cli_free(&r);
    expect_same_bytes(ck, ck_good, "a run stopped by a NaN loss");
    expect_same_bytes(w, w_good, "a run stopped by a NaN loss");

    /* --skip-nonfinite: those steps undone and counted, every line JSON, the
     * weights written finite (ebb eval refuses any that are not) */
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "20", "--batch", "16",
        "--optimizer", "sgd", "--lr", "1e6", "--checkpoint", ck2, "--checkpoint-every", "5",
        "--save-weights", w2, "--json", "--skip-nonfinite");
    expect_code(&r, 0);
    long long skipped = 0, of = 0, in_epochs = 0;
    msg = strstr(r.err, "ebb: --skip-nonfinite: skipped ");
    if (!msg ||
        sscanf(msg, "ebb: --skip-nonfinite: skipped %lld of %lld steps", &skipped, &of) != 2 ||
        skipped < 1 || of != 20)
        fail_msg("`%s` said:\n%s", r.cmd, r.err);
    for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = json_strict(line, strlen(line), "ebb train --json --skip-nonfinite");
        if (!strcmp(str_field(j, "type", "line"), "epoch")) {
            in_epochs += int_field(j, "skipped", "epoch");
            assert_true(int_field(j, "peak_bytes", "epoch") > 0 &&
                        int_field(j, "planned_peak_bytes", "epoch") > 0);
        }
        cJSON_Delete(j);
    }
    assert_int_equal(in_epochs, skipped);
    cli_free(&r);
    EBB(&r, "eval", "specs/mlp.yaml", "--weights", w2, "--data", data);
    expect_code(&r, 0);
    cli_free(&r);
    /* every step after the last finite one undone, to the bit: the weights
     * are those of a run that stopped there */
    char last[32];
    FMT(last, "%lld", 20 - skipped);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", last, "--batch", "16",
        "--optimizer", "sgd", "--lr", "1e6", "--save-weights", bad);
    expect_code(&r, 0);
    cli_free(&r);
    assert_int_equal(at, 20 - skipped + 1);
    expect_same_bytes(w2, bad, "--skip-nonfinite's undo");

    /* weights with a NaN: refused by eval (unless --allow-nonfinite) and
     * by train --weights, naming the tensor */
    rewrite_checkpoint(w_good, bad, NULL, "fc1.weight", NULL, NULL);
    EBB(&r, "eval", "specs/mlp.yaml", "--weights", bad, "--data", data);
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, "parameter 'fc1.weight' holds 1 NaN or infinite values");
    cli_free(&r);
    EBB(&r, "eval", "specs/mlp.yaml", "--weights", bad, "--data", data, "--allow-nonfinite");
    expect_code(&r, 0);
    expect_contains("stderr", &r, r.err, "warning: ");
    cli_free(&r);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "1", "--weights", bad);
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, "'fc1.weight'");
    cli_free(&r);
    /* a checkpoint with a NaN weight, or NaN optimizer state */
    static const char *const poisoned[] = {"fc2.bias", "optim.fc1.weight.exp_avg"};
    for (int i = 0; i < 2; i++) {
        rewrite_checkpoint(ck_good, bad, NULL, poisoned[i], NULL, NULL);
        EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "14", "--resume", bad);
        expect_code(&r, 1);
        char want[128];
        FMT(want, "%s '%s' holds 1 NaN or infinite values", i ? "optimizer state" : "parameter",
            poisoned[i]);
        expect_contains("stderr", &r, r.err, want);
        cli_free(&r);
    }
    /* let in with --allow-nonfinite, that state is never checkpointed: the
     * finite checkpoint there stays */
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "14", "--resume", bad,
        "--allow-nonfinite", "--skip-nonfinite", "--checkpoint", ck, "--checkpoint-every", "1");
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, "warning: ");
    expect_contains("stderr", &r, r.err,
                    " not written after step 13: optimizer state "
                    "'optim.fc1.weight.exp_avg' holds");
    cli_free(&r);
    expect_same_bytes(ck, ck_good, "a checkpoint of NaN state");
}

/* Every output is refused, exit 2, when it is the file of an input or of
 * another output: the same inode (a link, a hard link, another spelling)
 * or, for a file not made yet, the same name once the directory is
 * resolved. Nothing is written. --checkpoint may be --resume's file. */
static void test_output_aliases(void **state) {
    (void)state;
    char data[PATH_MAX], spec[PATH_MAX], w[PATH_MAX], soft[PATH_MAX], hard[PATH_MAX];
    char dotlink[PATH_MAX], sub[PATH_MAX], fresh[PATH_MAX], fresh2[PATH_MAX], svg[PATH_MAX];
    tmp_path(data, sizeof data, "alias-data.safetensors");
    tmp_path(spec, sizeof spec, "alias-spec.yaml");
    tmp_path(w, sizeof w, "alias-w.safetensors");
    tmp_path(soft, sizeof soft, "alias-soft.safetensors");
    tmp_path(hard, sizeof hard, "alias-hard.safetensors");
    tmp_path(dotlink, sizeof dotlink, "alias-spec.dot");
    tmp_path(sub, sizeof sub, "alias-sub");
    tmp_path(fresh, sizeof fresh, "alias-new.safetensors");
    tmp_path(fresh2, sizeof fresh2, "alias-sub/../alias-new.safetensors");
    tmp_path(svg, sizeof svg, "alias.svg");
    write_train_data(data, 32, 3);
    copy_file(EBB_SOURCE_DIR "/specs/mlp.yaml", spec);
    copy_file(data, w);
    assert_int_equal(symlink(data, soft), 0);
    assert_int_equal(link(data, hard), 0);
    assert_int_equal(symlink(spec, dotlink), 0);
    assert_int_equal(mkdir(sub, 0755), 0);
    typedef struct alias_case {
        const char *said, *kept; /* a piece of the message; a file that must stay as it was */
        const char *args[24];
    } alias_case;
    const alias_case cases[] = {
        {"--checkpoint",
         data,
         {"train", spec, "--data", data, "--steps", "1", "--checkpoint", data}},
        {"--save-weights",
         data,
         {"train", spec, "--data", data, "--steps", "1", "--save-weights", data}},
        {"is the same file as SPEC",
         spec,
         {"train", spec, "--data", data, "--steps", "1", "--trace", spec}},
        {"are the same file",
         w,
         {"train", spec, "--data", data, "--steps", "1", "--save-weights", w, "--checkpoint", w}},
        {"are the same file",
         NULL,
         {"train", spec, "--data", data, "--steps", "1", "--save-weights", fresh, "--checkpoint",
          fresh2}},
        {"as --data", data, {"train", spec, "--data", soft, "--steps", "1", "--checkpoint", data}},
        {"as --data",
         data,
         {"train", spec, "--data", hard, "--steps", "1", "--save-weights", data}},
        {"as --eval-data",
         data,
         {"train", spec, "--data", w, "--eval-data", data, "--steps", "1", "--checkpoint", hard}},
        {"as --resume",
         w,
         {"train", spec, "--data", data, "--steps", "1", "--resume", w, "--save-weights", w}},
        {"as SPEC", spec, {"run", spec, "--outputs", spec}},
        {"as --weights", w, {"run", spec, "--weights", w, "--save-weights", w}},
        {"as --inputs", w, {"run", spec, "--inputs", w, "--trace", w}},
        {"are the same file", NULL, {"run", spec, "--trace", fresh, "--outputs", fresh2}},
        {"as --inputs", data, {"grad", spec, "--inputs", data, "--grads", hard}},
        {"as SPEC", spec, {"dot", spec, "-o", dotlink}},
        {"as --trace", NULL, {"chart", spec, "--trace", svg, "-o", svg}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char keep[PATH_MAX] = "";
        if (cases[c].kept) {
            FMT(keep, "%s.kept", cases[c].kept);
            copy_file(cases[c].kept, keep);
        }
        cli_result r;
        run_prog(&r, NULL, NULL, cases[c].args);
        expect_code(&r, 2);
        expect_contains("stderr", &r, r.err, cases[c].said);
        if (r.out_len) fail_msg("`%s` started:\n%s", r.cmd, r.out);
        cli_free(&r);
        if (cases[c].kept) {
            expect_same_bytes(cases[c].kept, keep, "a refused command");
            unlink(keep);
        }
        if (access(fresh, F_OK) == 0) fail_msg("`%s` wrote %s", r.cmd, fresh);
    }
}

/* --lr-schedule: each step's rate in the JSON lines follows the schedule
 * (torch's recursive cosine, here against its closed form), a run stopped
 * at a checkpoint and resumed without the flag continues the checkpoint's
 * schedule to the same weights, another schedule on resume is a conflict
 * named with both, and a one-cycle shorter than the run is refused. */
static void test_train_lr_schedule(void **state) {
    (void)state;
    char data[PATH_MAX], ck[PATH_MAX], wa[PATH_MAX], wb[PATH_MAX];
    tmp_path(data, sizeof data, "ls-data.safetensors");
    tmp_path(ck, sizeof ck, "ls-ck.safetensors");
    tmp_path(wa, sizeof wa, "ls-a.safetensors");
    tmp_path(wb, sizeof wb, "ls-b.safetensors");
    write_train_data(data, 96, 9);
    cli_result r;
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "12", "--batch", "16",
        "--lr-schedule", "cosine:12", "--json", "--log-every", "1", "--save-weights", wa);
    expect_code(&r, 0);
    int steps = 0;
    for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = json_strict(line, strlen(line), "ebb train --json");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "step")) {
            double lr = cJSON_GetObjectItemCaseSensitive(j, "lr")->valuedouble;
            double want = 1e-3 * (1 + cos(M_PI * steps / 12.0)) / 2;
            if (fabs(lr - want) > 1e-9 * 1e-3)
                fail_msg("step %d: lr %.9g, cosine:12 from 1e-3 gives %.9g", steps + 1, lr, want);
            steps++;
        }
        cJSON_Delete(j);
    }
    assert_int_equal(steps, 12);
    cli_free(&r);

    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "5", "--batch", "16",
        "--lr-schedule", "cosine:12", "--checkpoint", ck, "--checkpoint-every", "5");
    expect_code(&r, 0);
    expect_contains("stdout", &r, r.out, "adamw lr 0.001, schedule cosine:12:0, ");
    cli_free(&r);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "12", "--resume", ck,
        "--save-weights", wb);
    expect_code(&r, 0);
    cli_free(&r);
    size_t la = 0, lb = 0;
    char *a = slurp(wa, &la), *b = slurp(wb, &lb);
    assert_non_null(a);
    assert_non_null(b);
    if (la != lb || memcmp(a, b, la) != 0)
        fail_msg("resumed with its schedule, the run's weights differ from the uninterrupted "
                 "run's");
    free(a);
    free(b);

    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "12", "--resume", ck,
        "--lr-schedule", "step:3");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err,
                    "--lr-schedule step:3:0.1, the checkpoint's is cosine:12:0");
    cli_free(&r);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "6", "--batch", "16",
        "--lr-schedule", "onecycle:0.01:5");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err,
                    "--lr-schedule onecycle:0.01:5:0.3 ends after step 5; this run takes 6 steps");
    cli_free(&r);

    /* RMSprop with momentum, stopped and resumed: its square_avg and
     * momentum_buffer go through the checkpoint to the same weights */
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "8", "--batch", "16",
        "--optimizer", "rmsprop", "--momentum", "0.5", "--save-weights", wa);
    expect_code(&r, 0);
    expect_contains("stdout", &r, r.out, "rmsprop lr 0.01, ");
    cli_free(&r);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "3", "--batch", "16",
        "--optimizer", "rmsprop", "--momentum", "0.5", "--checkpoint", ck, "--checkpoint-every",
        "3");
    expect_code(&r, 0);
    cli_free(&r);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "8", "--resume", ck,
        "--save-weights", wb);
    expect_code(&r, 0);
    cli_free(&r);
    a = slurp(wa, &la);
    b = slurp(wb, &lb);
    assert_non_null(a);
    assert_non_null(b);
    if (la != lb || memcmp(a, b, la) != 0)
        fail_msg("RMSprop resumed from its checkpoint: the weights differ from the uninterrupted "
                 "run's");
    free(a);
    free(b);
}

/* --resume takes nothing from the command line that contradicts the
 * checkpoint unless --override says so; optimizer state the file lost is
 * an error unless --non-strict; another dataset is a warning naming both;
 * a checkpoint past the run's last step is an error, one at it nothing to
 * do; a step near 2^63 is refused, not overflowed. */
static void test_train_resume_strict(void **state) {
    (void)state;
    char data[PATH_MAX], data80[PATH_MAX], ck[PATH_MAX], ck2[PATH_MAX], bad[PATH_MAX];
    char curve[PATH_MAX];
    tmp_path(data, sizeof data, "rs-data.safetensors");
    tmp_path(data80, sizeof data80, "rs-data80.safetensors");
    tmp_path(ck, sizeof ck, "rs-ck.safetensors");
    tmp_path(ck2, sizeof ck2, "rs-ck2.safetensors");
    tmp_path(bad, sizeof bad, "rs-bad.safetensors");
    tmp_path(curve, sizeof curve, "rs-curve.svg");
    write_train_data(data, 96, 5);
    write_train_data(data80, 80, 6);
    cli_result r;
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "6", "--batch", "16",
        "--checkpoint", ck, "--checkpoint-every", "6");
    expect_code(&r, 0);
    cli_free(&r);

    /* options that contradict it, each named with both values */
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "12", "--resume", ck,
        "--optimizer", "sgd", "--lr", "0.5", "--no-shuffle");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--optimizer sgd, the checkpoint's is adamw");
    expect_contains("stderr", &r, r.err, "--lr 0.5, the checkpoint's is 0.001");
    expect_contains("stderr", &r, r.err, "--no-shuffle, the checkpoint shuffles");
    expect_contains("stderr", &r, r.err, "--override");
    cli_free(&r);
    /* --override: the command line wins, the AdamW state is dropped */
    double kind = -1, lr = -1;
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "8", "--resume", ck,
        "--optimizer", "sgd", "--lr", "0.5", "--no-shuffle", "--override", "--checkpoint", ck2,
        "--checkpoint-every", "8");
    expect_code(&r, 0);
    expect_contains("stdout", &r, r.out, "sgd lr 0.5");
    expect_contains("stderr", &r, r.err, "state in");
    cli_free(&r);
    checkpoint_optimizer(ck2, &kind, &lr);
    assert_true(kind == 0 && lr == 0.5);
    /* another lr for the same optimizer keeps its state; --checkpoint may
     * be the file resumed */
    copy_file(ck, bad);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "8", "--resume", bad, "--lr",
        "0.01", "--override", "--checkpoint", bad, "--checkpoint-every", "2");
    expect_code(&r, 0);
    cli_free(&r);
    checkpoint_optimizer(bad, &kind, &lr);
    assert_true(kind == 2 && lr == 0.01);

    /* a parameter's optimizer state lost from the file */
    rewrite_checkpoint(ck, bad, "optim.fc1.bias.", NULL, NULL, NULL);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "8", "--resume", bad);
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, "no optimizer state for 'fc1.bias'");
    cli_free(&r);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "8", "--resume", bad,
        "--non-strict");
    expect_code(&r, 0);
    expect_contains("stderr", &r, r.err, "warning: ");
    cli_free(&r);

    /* another dataset: a warning naming both */
    EBB(&r, "train", "specs/mlp.yaml", "--data", data80, "--steps", "7", "--resume", ck);
    expect_code(&r, 0);
    expect_contains("stderr", &r, r.err, "warning: --data");
    expect_contains("stderr", &r, r.err,
                    "x float32 [80, 64], y int64 [80] now, x float32 [96, "
                    "64], y int64 [96] then");
    cli_free(&r);

    /* past the run's end, at it, and at a step 64 bits barely hold */
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "4", "--resume", ck);
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, "is at step 6, past the 4 steps of --steps 4");
    cli_free(&r);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "6", "--resume", ck);
    expect_code(&r, 0);
    expect_contains("stdout", &r, r.out, "nothing to train");
    cli_free(&r);
    rewrite_checkpoint(ck, bad, NULL, NULL, "step", "9223372036854775807");
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--epochs", "1000000000", "--resume", bad,
        "--curve", curve);
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, "is at step 9223372036854775807, past the ");
    cli_free(&r);
}

/* The command that wrote a checkpoint, run again with --resume added (and
 * more steps), goes on: its --lr is the schedule's base, which the
 * checkpoint keeps, not the rate the schedule had reached. --checkpoint
 * alone writes one at the run's end, --keep-best keeps the best epoch's
 * beside it, and the CSV's epoch row gives the epoch's samples a second. */
static void test_train_resume_same_command(void **state) {
    (void)state;
    char data[PATH_MAX], ck[PATH_MAX], best[PATH_MAX], csv[PATH_MAX];
    tmp_path(data, sizeof data, "rsc-data.safetensors");
    tmp_path(ck, sizeof ck, "rsc-ck.safetensors");
    tmp_path(best, sizeof best, "rsc-ck.best.safetensors");
    tmp_path(csv, sizeof csv, "rsc-log.csv");
    write_train_data(data, 48, 11);
    cli_result r;
#define RSC_ARGS "train", "specs/mlp.yaml", "--data", data, "--eval-data", data, "--batch", "16", \
        "--lr", "0.001", "--lr-schedule", "cosine:6", "--checkpoint", ck, "--keep-best", "eval_loss"
    EBB(&r, RSC_ARGS, "--steps", "3", "--log-csv", csv, "--log-every", "1");
    expect_code(&r, 0);
    char line[PATH_MAX + 64];
    FMT(line, ", the best yet: checkpoint written to %s\n", best);
    expect_contains("stdout", &r, r.out, line);
    cli_free(&r);
    ebb_checkpoint_info ci;
    assert_ok(ebb_checkpoint_read_info(ck, &ci));
    assert_int_equal(ci.step, 3);
    assert_true(ci.optimizer.lr < 0.001); /* the schedule moved the rate from its base */
    ebb_checkpoint_info_free(&ci);
    assert_ok(ebb_checkpoint_read_info(best, &ci));
    assert_int_equal(ci.step, 3);
    ebb_checkpoint_info_free(&ci);
    char *text = slurp(csv, NULL);
    assert_non_null(text);
    const char *row = strstr(text, "\nepoch,1,3,48,");
    double rate = 0;
    /* kind,epoch,step,samples,loss,lr,samples_per_s,...: the epoch row has no lr */
    if (!row || sscanf(strstr(row, ",,") ? strstr(row, ",,") + 2 : "", "%lf", &rate) != 1 ||
        !(rate > 0))
        fail_msg("no epoch row with its samples_per_s in %s:\n%s", csv, text);
    free(text);

    EBB(&r, RSC_ARGS, "--steps", "6", "--resume", ck, "--json", "--log-every", "1");
#undef RSC_ARGS
    expect_code(&r, 0);
    int step = 3;
    for (char *l = strtok(r.out, "\n"); l; l = strtok(NULL, "\n")) {
        cJSON *j = json_strict(l, strlen(l), "ebb train --json");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "step")) {
            double lr = cJSON_GetObjectItemCaseSensitive(j, "lr")->valuedouble;
            double want = 1e-3 * (1 + cos(M_PI * step / 6.0)) / 2;
            if (fabs(lr - want) > 1e-9 * 1e-3)
                fail_msg("resumed step %d: lr %.9g, cosine:6 from 1e-3 gives %.9g", step + 1, lr,
                         want);
            step++;
        }
        cJSON_Delete(j);
    }
    assert_int_equal(step, 6);
    cli_free(&r);
}

/* Values that used to pass, or fail late with another layer's message:
 * each a usage error naming the flag, or a refusal naming the file. */
/* One bit flipped in a file's last byte (a safetensors file's last tensor). */
static void flip_last_byte(const char *path) {
    size_t len = 0;
    char *bytes = slurp(path, &len);
    assert_non_null(bytes);
    bytes[len - 1] ^= 0x10;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_true(fwrite(bytes, 1, len, f) == len);
    fclose(f);
    free(bytes);
}

static void test_small_refusals(void **state) {
    (void)state;
    cli_result r;
    static const struct {
        const char *args[8], *want;
    } cases[] = {
        {{"plan", "specs/mlp.yaml", "--train", "--weight-copies", "keep"},
         "--weight-copies keep or recast applies to a low precision"},
        {{"train", "specs/mlp.yaml", "--data", "d", "--weight-copies", "recast"},
         "--weight-copies keep or recast applies to a low precision"},
        {{"train", "specs/mlp.yaml", "--data", "d", "--loss-scale", "1e-45"},
         "--loss-scale 1e-45: expected a positive scale, a normal float32"},
        {{"train", "specs/mlp.yaml", "--data", "d", "--block", "2147483648"},
         "--block needs a positive integer, at most 1000000000"},
        {{"train", "specs/mlp.yaml", "--data", "d", "--betas", "0.9"},
         "--betas 0.9: expected B1,B2, each from 0 to below 1"},
        {{"train", "specs/mlp.yaml", "--data", "d", "--betas", "0.9,1"},
         "--betas 0.9,1: expected B1,B2"},
        {{"train", "specs/mlp.yaml", "--data", "d", "--eps", "0"},
         "--eps needs a positive number"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        run_prog(&r, NULL, NULL, cases[i].args);
        expect_code(&r, 2);
        expect_contains("stderr", &r, r.err, cases[i].want);
        cli_free(&r);
    }
    /* a rank of a torchrun job asked to launch ranks of its own */
    setenv("WORLD_SIZE", "1", 1);
    EBB(&r, "train", "specs/mlp.yaml", "--data", "d", "--nproc", "2");
    unsetenv("WORLD_SIZE");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--nproc: this process is already a rank of a job");
    cli_free(&r);
    char data[PATH_MAX], ck[PATH_MAX];
    tmp_path(data, sizeof data, "refusals.safetensors");
    tmp_path(ck, sizeof ck, "refusals-ck.safetensors");
    write_mlp_data(data, 32, 3);
    /* --betas and --eps: adam's and adamw's, kept in the checkpoint */
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "1", "--batch", "16",
        "--optimizer", "sgd", "--lr", "0.1", "--betas", "0.9,0.95");
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--betas applies to --optimizer adam and adamw");
    cli_free(&r);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "1", "--batch", "16",
        "--betas", "0.9,0.95", "--eps", "1e-6", "--checkpoint", ck);
    expect_code(&r, 0);
    cli_free(&r);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "2", "--batch", "16",
        "--betas", "0.9,0.999", "--eps", "1e-8", "--resume", ck);
    expect_code(&r, 2);
    expect_contains("stderr", &r, r.err, "--betas 0.9,0.999, the checkpoint's are 0.9,0.95");
    expect_contains("stderr", &r, r.err, "--eps 1e-08, the checkpoint's is 1e-06");
    cli_free(&r);
    /* a checkpoint whose shuffle flag is 5 */
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "1", "--batch", "16",
        "--checkpoint", ck);
    expect_code(&r, 0);
    cli_free(&r);
    size_t len = 0;
    char *bytes = slurp(ck, &len);
    assert_non_null(bytes);
    char *at = memmem(bytes, len, "\"shuffle\":\"1\"", 13);
    if (!at) fail_msg("%s: no \"shuffle\":\"1\" in its header", ck);
    at[11] = '5';
    FILE *f = fopen(ck, "wb");
    assert_non_null(f);
    assert_true(fwrite(bytes, 1, len, f) == len);
    fclose(f);
    free(bytes);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "2", "--batch", "16",
        "--resume", ck);
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, "shuffle 5, drop_last 0: a step is 0 or more");
    cli_free(&r);
    /* weights with one bit flipped in their last tensor's bytes: refused,
     * naming the tensor (each tensor's CRC-32 is in the file's metadata) */
    char w[PATH_MAX];
    tmp_path(w, sizeof w, "refusals-w.safetensors");
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "1", "--batch", "16",
        "--save-weights", w);
    expect_code(&r, 0);
    cli_free(&r);
    flip_last_byte(w);
    EBB(&r, "eval", "specs/mlp.yaml", "--data", data, "--weights", w);
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, "is damaged: its bytes' CRC-32 is");
    cli_free(&r);
    /* --non-strict reads it as it is, and says so */
    EBB(&r, "run", "specs/mlp.yaml", "--weights", w, "--non-strict");
    expect_code(&r, 0);
    expect_contains("stderr", &r, r.err, "is damaged: its bytes' CRC-32 is");
    expect_contains("stderr", &r, r.err, "--non-strict: read as it is");
    cli_free(&r);
    /* a damaged checkpoint: refused, and resumed under --non-strict */
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "1", "--batch", "16",
        "--checkpoint", ck);
    expect_code(&r, 0);
    cli_free(&r);
    flip_last_byte(ck);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "2", "--batch", "16",
        "--resume", ck);
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, "is damaged: its bytes' CRC-32 is");
    cli_free(&r);
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "2", "--batch", "16",
        "--resume", ck, "--non-strict");
    expect_code(&r, 0);
    expect_contains("stderr", &r, r.err, "is damaged: its bytes' CRC-32 is");
    expect_contains("stderr", &r, r.err, "--non-strict: ");
    cli_free(&r);
}

/* The spellings PyTorch, Lightning and Hugging Face users type get ebb's
 * flag suggested, where the command has it. */
static void test_option_aliases(void **state) {
    (void)state;
    static const struct {
        const char *command, *written, *want;
    } cases[] = {
        {"train", "--learning-rate=0.1", "unknown option --learning-rate; did you mean --lr?\n"},
        {"train", "--batch-size", "unknown option --batch-size; did you mean --batch?\n"},
        {"train", "--num-epochs", "unknown option --num-epochs; did you mean --epochs?\n"},
        {"train", "--max_steps", "unknown option --max_steps; did you mean --steps?\n"},
        {"train", "--grad-accum", "unknown option --grad-accum; did you mean --accumulate?\n"},
        {"train", "--gradient-clip",
         "unknown option --gradient-clip; did you mean --clip-grad-norm?\n"},
        {"train", "--wd", "unknown option --wd; did you mean --weight-decay?\n"},
        /* ebb eval has no --lr to suggest */
        {"eval", "--learning-rate", "unknown option --learning-rate\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_result r;
        EBB(&r, cases[i].command, "specs/mlp.yaml", "--data", "d.safetensors", cases[i].written,
            "1");
        expect_code(&r, 2);
        expect_contains("stderr", &r, r.err, cases[i].want);
        cli_free(&r);
    }
}

/* Starts `ebb train` of a million steps on `data`, checkpointing to `ck`
 * (and drawing `curve` when given), its stdout through a pipe; once the
 * first progress line is out, sends `sig`, then `sig2` at once when not 0.
 * Returns the wait status; *err receives its stderr (free it). */
static int train_until_signal(const char *data, const char *ck, const char *curve, int sig,
                              int sig2, char **err) {
    char err_name[PATH_MAX];
    tmp_path(err_name, sizeof err_name, "signal-stderr.XXXXXX");
    int p[2];
    assert_int_equal(pipe(p), 0);
    int err_fd = mkstemp(err_name);
    assert_true(err_fd >= 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int in_fd = open("/dev/null", O_RDONLY);
        if (chdir(EBB_SOURCE_DIR) != 0 || in_fd < 0 || dup2(in_fd, 0) < 0 || dup2(p[1], 1) < 0 ||
            dup2(err_fd, 2) < 0)
            _exit(126);
        close(p[0]);
        /* whatever the test runner ignores, the command starts with the defaults */
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        alarm(60); /* survives exec */
        if (curve)
            execl(cli_path, "ebb", "train", "specs/mlp.yaml", "--data", data, "--steps", "1000000",
                  "--batch", "16", "--log-every", "1", "--checkpoint", ck, "--curve", curve,
                  (char *)NULL);
        else
            execl(cli_path, "ebb", "train", "specs/mlp.yaml", "--data", data, "--steps", "1000000",
                  "--batch", "16", "--log-every", "1", "--checkpoint", ck, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    close(err_fd);
    static char out[1 << 16];
    size_t len = 0;
    int sent = 0;
    ssize_t n;
    out[0] = '\0';
    while (len < sizeof out - 1 && (n = read(p[0], out + len, sizeof out - 1 - len)) != 0) {
        if (n < 0) {
            assert_int_equal(errno, EINTR);
            continue;
        }
        len += (size_t)n;
        out[len] = 0;
        if (!sent && strstr(out, "\nepoch 1 step ")) {
            assert_int_equal(kill(pid, sig), 0);
            if (sig2) assert_int_equal(kill(pid, sig2), 0);
            sent = 1;
        }
        if (len > sizeof out / 2) { /* keep reading, keep the tail */
            memmove(out, out + len / 2, len - len / 2 + 1);
            len -= len / 2;
        }
    }
    if (!sent)
        kill(pid, SIGKILL);
    close(p[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    size_t err_len = 0;
    *err = slurp(err_name, &err_len);
    unlink(err_name);
    assert_non_null(*err);
    if (!sent) fail_msg("no progress line from `ebb train`:\n%s\nstderr:\n%s", out, *err);
    return status;
}

/* The signal that stopped training: the step after which it stopped, from
 * "ebb: interrupted by SIGxxx after step N; checkpoint written to ..." */
static long long stopped_after(const char *err, const char *sig_name, int status, int code) {
    char want[64];
    long long at = 0;
    FMT(want, "ebb: interrupted by %s after step ", sig_name);
    const char *msg = strstr(err, want);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != code)
        fail_msg("`ebb train` sent %s: status %d, not exit %d\nstderr:\n%s", sig_name, status, code,
                 err);
    if (!msg || sscanf(msg + strlen(want), "%lld;", &at) != 1 || at < 1 ||
        !strstr(msg, "checkpoint written to"))
        fail_msg("`ebb train` sent %s said:\n%s", sig_name, err);
    return at;
}

/* Ctrl-C: `ebb train` finishes the step under way, writes a checkpoint and
 * its learning curves, and exits 130; `--resume` goes on from that
 * checkpoint. */
static void test_train_sigint_checkpoint(void **state) {
    (void)state;
    char data[PATH_MAX], ck[PATH_MAX], curve[PATH_MAX];
    tmp_path(data, sizeof data, "sigint.safetensors");
    tmp_path(curve, sizeof curve, "sigint-curve.svg");
    tmp_path(ck, sizeof ck, "sigint-ckpt.safetensors");
    write_train_data(data, 64, 7);
    char *err = NULL;
    int status = train_until_signal(data, ck, curve, SIGINT, 0, &err);
    long long at = stopped_after(err, "SIGINT", status, 130);
    free(err);
    /* the picture of the steps it took, one point each (--log-every 1) */
    size_t svg_len = 0;
    char *svg = slurp_svg(curve, "the interrupted run's learning curves", &svg_len);
    double px[1], py[1];
    assert_int_equal(svg_points(svg, "train-loss", px, py, 1), at);
    free(svg);

    /* the checkpoint resumes: three steps more */
    char steps[32];
    FMT(steps, "%lld", at + 3);
    cli_result r;
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", steps, "--resume", ck);
    expect_code(&r, 0);
    char resumed[PATH_MAX + 64];
    FMT(resumed, "resumed from %s at step %lld", ck, at);
    expect_contains("stdout", &r, r.out, resumed);
    cli_free(&r);
}

/* SIGTERM and SIGHUP stop training as SIGINT does, with a checkpoint that
 * resumes, exiting 143 and 129; a second signal stops it at once, by that
 * signal, leaving no checkpoint half written. */
static void test_train_sigterm_sighup(void **state) {
    (void)state;
    char data[PATH_MAX], ck[PATH_MAX];
    tmp_path(data, sizeof data, "sigterm.safetensors");
    tmp_path(ck, sizeof ck, "sigterm-ckpt.safetensors");
    write_train_data(data, 64, 7);
    static const struct {
        int sig, code;
        const char *name;
    } sigs[] = {{SIGTERM, 143, "SIGTERM"}, {SIGHUP, 129, "SIGHUP"}};
    for (int i = 0; i < 2; i++) {
        char *err = NULL;
        unlink(ck);
        int status = train_until_signal(data, ck, NULL, sigs[i].sig, 0, &err);
        long long at = stopped_after(err, sigs[i].name, status, sigs[i].code);
        free(err);
        char steps[32], resumed[PATH_MAX + 64];
        FMT(steps, "%lld", at + 1);
        cli_result r;
        EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", steps, "--resume", ck);
        expect_code(&r, 0);
        FMT(resumed, "resumed from %s at step %lld", ck, at);
        expect_contains("stdout", &r, r.out, resumed);
        cli_free(&r);
    }
    /* two signals: the second ends it there */
    char *err = NULL;
    unlink(ck);
    int status = train_until_signal(data, ck, NULL, SIGTERM, SIGHUP, &err);
    if (!WIFSIGNALED(status) || (WTERMSIG(status) != SIGTERM && WTERMSIG(status) != SIGHUP))
        fail_msg("`ebb train` sent SIGTERM and SIGHUP: status %d, not killed by the second"
                 "\nstderr:\n%s",
                 status, err);
    free(err);
    if (access(ck, F_OK) == 0) {
        /* a checkpoint written before the second signal came is whole */
        ebb_safetensors *sf = NULL;
        assert_ok(ebb_safetensors_open(&sf, ck));
        ebb_safetensors_close(sf);
    }
}

/* A step that takes more than its plan promised: the suite's op
 * test_overrun (registered with EBB_TEST_OPS=1) allocates 64 KiB it does not
 * declare, as an op with a wrong workspace figure would. `ebb run`, `ebb
 * grad` and `ebb train` name the step in a warning and go on; with
 * --strict-memory they fail (exit 3) and write nothing. On the CPU, where
 * every step is measured. */
static void test_over_plan_is_reported(void **state) {
    (void)state;
    static const char spec_text[] = "ebb: 1\n"
                                    "inputs:\n"
                                    "  x: [batch, 64]\n"
                                    "flow:\n"
                                    "  - from: {linear: {out: 32, name: fc1}}\n"
                                    "  - {test_overrun: {bytes: 65536}}\n"
                                    "  - {linear: {out: 10, name: fc2}}\n"
                                    "  - {log_softmax: {dim: -1}}\n"
                                    "targets:\n"
                                    "  y: {shape: [batch], dtype: int64}\n"
                                    "loss: nll\n";
    char spec[PATH_MAX], data[PATH_MAX], w[PATH_MAX], g[PATH_MAX];
    tmp_path(spec, sizeof spec, "overrun.yaml");
    tmp_path(data, sizeof data, "overrun-data.safetensors");
    tmp_path(w, sizeof w, "overrun-w.safetensors");
    tmp_path(g, sizeof g, "overrun-g.safetensors");
    assert_int_equal(write_file(spec, spec_text, sizeof spec_text - 1), 0);
    write_train_data(data, 32, 4);
    static const char named[] = "step 1 (test_overrun, node flow.1) measured 64.0 KiB more than "
                                "the plan's ";
    cli_result r;

    /* without EBB_TEST_OPS the op does not exist */
    EBB(&r, "check", spec);
    expect_code(&r, 1);
    expect_contains("stderr", &r, r.err, "test_overrun");
    cli_free(&r);

    assert_int_equal(setenv("EBB_TEST_OPS", "1", 1), 0);
    EBB(&r, "run", spec, "-i", "batch=4", "--device", "cpu");
    expect_code(&r, 0);
    expect_contains("stderr", &r, r.err, "ebb: warning: ");
    expect_contains("stderr", &r, r.err, named);
    expect_contains("stderr", &r, r.err, "this is a bug in ebb");
    cli_free(&r);
    EBB(&r, "run", spec, "-i", "batch=4", "--device", "cpu", "--strict-memory", "--outputs", w);
    expect_code(&r, 3);
    expect_contains("stderr", &r, r.err, "ebb: error: ");
    expect_contains("stderr", &r, r.err, "(--strict-memory)");
    if (access(w, F_OK) == 0) fail_msg("`%s` wrote %s", r.cmd, w);
    cli_free(&r);

    EBB(&r, "grad", spec, "--inputs", data, "--grads", g, "--device", "cpu");
    expect_code(&r, 0);
    expect_contains("stderr", &r, r.err, named);
    cli_free(&r);
    unlink(g);
    EBB(&r, "grad", spec, "--inputs", data, "--grads", g, "--device", "cpu", "--strict-memory");
    expect_code(&r, 3);
    if (access(g, F_OK) == 0) fail_msg("`%s` wrote %s", r.cmd, g);
    cli_free(&r);

    /* train: the first such step is named, the others counted at the end */
    EBB(&r, "train", spec, "--data", data, "--steps", "3", "--batch", "8", "--device", "cpu",
        "--save-weights", w);
    expect_code(&r, 0);
    expect_contains("stderr", &r, r.err, named);
    expect_contains("stderr", &r, r.err, "at training step 1; this is a bug in ebb");
    expect_contains("stderr", &r, r.err, "3 of 3 training steps measured more than their plan");
    assert_int_equal(access(w, F_OK), 0);
    cli_free(&r);
    unlink(w);
    EBB(&r, "train", spec, "--data", data, "--steps", "3", "--batch", "8", "--device", "cpu",
        "--save-weights", w, "--strict-memory");
    expect_code(&r, 3);
    expect_contains("stderr", &r, r.err, "at training step 1 (--strict-memory)");
    expect_contains("stderr", &r, r.err, "training stopped at step 1 and nothing was saved");
    if (access(w, F_OK) == 0) fail_msg("`%s` wrote %s", r.cmd, w);
    cli_free(&r);
    assert_int_equal(unsetenv("EBB_TEST_OPS"), 0);

    /* a run that keeps its plan says nothing of it, strict or not */
    EBB(&r, "train", "specs/mlp.yaml", "--data", data, "--steps", "2", "--batch", "8", "--device",
        "cpu", "--strict-memory");
    expect_code(&r, 0);
    if (strstr(r.err, "more than"))
        fail_msg("`%s` reported a step over its plan:\n%s", r.cmd, r.err);
    cli_free(&r);
    unlink(spec);
    unlink(data);
}

/* A byte-level language model through the command: `ebb train` on
 * text:FILE (each byte follows from the one before, so a bigram learns it
 * all) reports perplexity, `ebb eval` counts the held-out tokens, and `ebb
 * generate` continues a prompt with the text, past its window (which then
 * slides), the same bytes for the same seed. */
static void test_text_generate(void **state) {
    (void)state;
    char text_path[PATH_MAX], data[PATH_MAX + 16], test[PATH_MAX + 16], w[PATH_MAX];
    tmp_path(text_path, sizeof text_path, "abc.txt");
    tmp_path(w, sizeof w, "bigram.safetensors");
    FMT(data, "text:%s", text_path);
    FMT(test, "text:%s:test", text_path);
    char text[400];
    for (size_t i = 0; i < sizeof text; i++)
        text[i] = "abcdefgh"[i % 8];
    assert_int_equal(write_file(text_path, text, sizeof text), 0);
    cli_result r;
    EBB(&r, "train", "specs/bigram.yaml", "--data", data, "--eval-data", test, "--block", "16",
        "--steps", "12", "--optimizer", "adam", "--lr", "0.05", "--log-every", "6",
        "--save-weights", w, "--device", "cpu");
    expect_code(&r, 0);
    expect_contains("stdout", &r, r.out, "344 samples"); /* a window at every byte of 360 */
    expect_contains("stdout", &r, r.out, "epoch 1 step 6/12 loss "); /* 6 steps an epoch */
    expect_contains("stdout", &r, r.out, "epoch 2 step 12/12 loss 0.0");
    expect_contains("stdout", &r, r.out, " perplexity 1.0");
    const char *ev = strstr(r.out, "\neval: ");
    double ppl = 0;
    if (!ev || !strstr(ev, " perplexity ") ||
        sscanf(strstr(ev, " perplexity "), " perplexity %lf on 2 samples (32 tokens)", &ppl) != 1 ||
        !(ppl >= 1.0 && ppl < 1.1))
        fail_msg("`%s`: no eval line with a perplexity near 1:\n%s", r.cmd, r.out);
    cli_free(&r);

    EBB(&r, "eval", "specs/bigram.yaml", "--weights", w, "--data", test, "--block", "16", "--json",
        "--device", "cpu");
    expect_code(&r, 0);
    cJSON *j = cJSON_Parse(r.out);
    if (!j) fail_msg("`%s` printed no JSON:\n%s", r.cmd, r.out);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "perplexity");
    const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(j, "tokens");
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "loss");
    assert_true(cJSON_IsNumber(p) && cJSON_IsNumber(tokens) && cJSON_IsNumber(loss));
    assert_int_equal((int)tokens->valuedouble, 32);
    assert_true(fabs(p->valuedouble - exp(loss->valuedouble)) < 1e-6 * p->valuedouble);
    assert_true(fabs(p->valuedouble - ppl) < 0.01);
    cJSON_Delete(j);
    cli_free(&r);

    /* the most likely byte each time: the text, past the 16-byte window */
    EBB(&r, "generate", "specs/bigram.yaml", "--weights", w, "--prompt", "cde", "--tokens", "21",
        "--block", "16", "--temperature", "0", "--device", "cpu", "--verbose");
    expect_code(&r, 0);
    if (strcmp(r.out, "cdefghabcdefghabcdefghab"))
        fail_msg("`%s` printed \"%s\"", r.cmd, r.out);
    expect_contains("stderr", &r, r.err, "no key/value cache: ");
    expect_contains("stderr", &r, r.err, "has no causal scaled_dot_product_attention");
    expect_contains("stderr", &r, r.err, "each byte (the window): [1, 16] plan, peak");
    expect_contains("stderr", &r, r.err, "(exact)");
    cli_free(&r);
    /* a draw: the same seed, the same bytes */
    cli_result r2;
    EBB(&r, "generate", "specs/bigram.yaml", "--weights", w, "--prompt", "hello", "--tokens", "50",
        "--block", "16", "--temperature", "3", "--top-k", "5", "--seed", "9", "--device", "cpu");
    EBB(&r2, "generate", "specs/bigram.yaml", "--weights", w, "--prompt", "hello", "--tokens", "50",
        "--block", "16", "--temperature", "3", "--top-k", "5", "--seed", "9", "--device", "cpu");
    expect_code(&r, 0);
    expect_code(&r2, 0);
    assert_int_equal(r.out_len, 55);
    assert_true(starts_with(r.out, "hello"));
    if (r2.out_len != r.out_len || memcmp(r.out, r2.out, r.out_len))
        fail_msg("seed 9 gave two texts:\n%s\n%s", r.out, r2.out);
    cli_free(&r);
    cli_free(&r2);
    unlink(w);
    unlink(text_path);
}

/* `ebb generate` through a key/value cache (specs/gpt.yaml's causal
 * attention): the same bytes as without one, past the window (where the
 * window slides and the cache is filled again for every byte), for one
 * sequence and for a batch read from a prompt file, which --stop ends. */
static void test_generate_cache(void **state) {
    (void)state;
    char text_path[PATH_MAX], data[PATH_MAX + 16], w[PATH_MAX], prompt[PATH_MAX];
    tmp_path(text_path, sizeof text_path, "gen.txt");
    tmp_path(w, sizeof w, "gpt.safetensors");
    tmp_path(prompt, sizeof prompt, "prompt.txt");
    FMT(data, "text:%s", text_path);
    char text[400];
    for (size_t i = 0; i < sizeof text; i++)
        text[i] = "the cat sat.\n"[i % 13];
    assert_int_equal(write_file(text_path, text, sizeof text), 0);
    assert_int_equal(write_file(prompt, "the ", 4), 0);
    cli_result r, r2;
    EBB(&r, "train", "specs/gpt.yaml", "-p", "layers=1", "-p", "d=16", "-p", "heads=2", "-p",
        "block=16", "--data", data, "--block", "16", "--steps", "8", "--lr", "0.01",
        "--save-weights", w, "--device", "cpu");
    expect_code(&r, 0);
    cli_free(&r);
    /* 40 bytes after 4: the cache until the window's 16, then the window */
    EBB(&r, "generate", "specs/gpt.yaml", "-p", "layers=1", "-p", "d=16", "-p", "heads=2", "-p",
        "block=16", "--weights", w, "--block", "16", "--prompt", "the ", "--tokens", "40",
        "--seed", "4", "--device", "cpu", "--verbose");
    EBB(&r2, "generate", "specs/gpt.yaml", "-p", "layers=1", "-p", "d=16", "-p", "heads=2", "-p",
        "block=16", "--weights", w, "--block", "16", "--prompt", "the ", "--tokens", "40",
        "--seed", "4", "--device", "cpu", "--verbose", "--no-cache");
    expect_code(&r, 0);
    expect_code(&r2, 0);
    assert_int_equal(r.out_len, 44);
    if (r.out_len != r2.out_len || memcmp(r.out, r2.out, r.out_len))
        fail_msg("the cache changed the text:\n%s\nwithout it:\n%s", r.out, r2.out);
    expect_contains("stderr", &r, r.err, "key/value cache of 16 positions, 2.0 KiB");
    expect_contains("stderr", &r, r.err, "the prompt: [1, 4] plan");
    expect_contains("stderr", &r, r.err, "each next byte: [1, 1] plan");
    expect_contains("stderr", &r, r.err, "; 12 runs,");
    expect_contains("stderr", &r, r.err, "the full window: [1, 16] plan");
    expect_contains("stderr", &r, r.err, "; 27 runs,");
    expect_contains("stderr", &r2, r2.err, "no key/value cache: --no-cache");
    cli_free(&r);
    cli_free(&r2);
    /* two sequences from a prompt file, each ending at its first '.' */
    EBB(&r, "generate", "specs/gpt.yaml", "-p", "layers=1", "-p", "d=16", "-p", "heads=2", "-p",
        "block=16", "--weights", w, "--block", "16", "--prompt-file", prompt, "--tokens", "30",
        "--batch", "2", "--stop", ".", "--seed", "4", "--device", "cpu");
    EBB(&r2, "generate", "specs/gpt.yaml", "-p", "layers=1", "-p", "d=16", "-p", "heads=2", "-p",
        "block=16", "--weights", w, "--block", "16", "--prompt-file", prompt, "--tokens", "30",
        "--batch", "2", "--stop", ".", "--seed", "4", "--device", "cpu", "--no-cache");
    expect_code(&r, 0);
    expect_code(&r2, 0);
    if (r.out_len != r2.out_len || memcmp(r.out, r2.out, r.out_len))
        fail_msg("the cache changed the batch's text:\n%s\nwithout it:\n%s", r.out, r2.out);
    const char *one = strstr(r.out, "--- sample 1\nthe "), *two = strstr(r.out, "\n--- sample 2\nthe ");
    if (!one || !two || one != r.out)
        fail_msg("`%s` printed no two samples:\n%s", r.cmd, r.out);
    /* each sample ends at its first '.' (then the newline ebb adds), or
     * after 30 bytes */
    for (int k = 0; k < 2; k++) {
        const char *body = (k == 0 ? one : two + 1) + strlen("--- sample 1\nthe ");
        const char *end = k == 0 ? two : r.out + r.out_len;
        const char *dot = memchr(body, '.', (size_t)(end - body));
        if (dot ? end - dot != 2 || dot[1] != '\n' : end - body > 31)
            fail_msg("sample %d runs past its stop:\n%s", k + 1, r.out);
    }
    cli_free(&r);
    cli_free(&r2);
    unlink(w);
    unlink(text_path);
    unlink(prompt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        EBB_TEST(test_help_and_version),
        EBB_TEST(test_threads_and_cpu),
        EBB_TEST(test_option_syntax_and_stdin),
        EBB_TEST(test_write_errors),
        EBB_TEST(test_exit_codes),
        EBB_TEST(test_exit_codes_more),
        EBB_TEST(test_exit_code_runtime),
        EBB_TEST(test_check_all_specs),
        EBB_TEST(test_check_bad_specs),
        EBB_TEST(test_golden_listing),
        EBB_TEST(test_golden_json),
        EBB_TEST(test_golden_dot),
        EBB_TEST(test_all_specs_json),
        EBB_TEST(test_all_specs_dot_graph),
        EBB_TEST(test_all_specs_dot_plan),
        EBB_TEST(test_dot_output_files),
        EBB_TEST(test_plan_precision),
        EBB_TEST(test_plan_accumulate),
        EBB_TEST(test_plan_memory_and_keep_all),
        EBB_TEST(test_trace_straight_line),
        EBB_TEST(test_trace_loop_iterations),
        EBB_TEST(test_trace_control_flow),
        EBB_TEST(test_chart_command),
        EBB_TEST(test_train_plan_and_grad),
        EBB_TEST(test_weights_and_io_files),
        EBB_TEST(test_symbolic_default_note),
        EBB_TEST(test_unusable_input_files),
        EBB_TEST(test_output_targets),
        EBB_TEST(test_fit_check),
        EBB_TEST(test_train_and_eval),
        EBB_TEST(test_train_recipes),
        EBB_TEST(test_launcher_agent),
        EBB_TEST(test_agent_fault_loop),
        EBB_TEST(test_ranks_that_differ),
        EBB_TEST(test_small_refusals),
        EBB_TEST(test_train_sigint_checkpoint),
        EBB_TEST(test_train_sigterm_sighup),
        EBB_TEST(test_train_nonfinite),
        EBB_TEST(test_output_aliases),
        EBB_TEST(test_train_lr_schedule),
        EBB_TEST(test_train_resume_strict),
        EBB_TEST(test_train_resume_same_command),
        EBB_TEST(test_option_aliases),
        EBB_TEST(test_over_plan_is_reported),
        EBB_TEST(test_text_generate),
        EBB_TEST(test_generate_cache),
    };
    /* CMOCKA_FILTER=test_train_* runs those alone; EBB_TEST_SHARD=K/N a shard */
    return ebb_test_run("test_cli", tests, group_setup, group_teardown);
}
