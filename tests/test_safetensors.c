/* safetensors: round trips in every supported dtype, the exact bytes written,
 * atomic replacement, and malformed files refused with clear errors (never a
 * crash), including every truncation of a valid file and mutated headers;
 * files that are not regular, files that shrink under a reader, headers
 * with bytes JSON forbids, NaN counts, and every kind of write target (a
 * link, a 0600 file, /dev/full, a FIFO, a full or read-only filesystem).
 * The datasets read from IDX and safetensors files, and a model learning
 * Fashion-MNIST from them. */
#define _GNU_SOURCE /* unshare, CLONE_NEWNS */

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zlib.h>

#include "ebb/data.h"
#include "ebb/safetensors.h"
#include "ebb/spec.h"
#include "test_mounts.h"
#include "test_util.h"
#include "test_dir.h"

static const ebb_device CPU = {EBB_DEVICE_CPU, 0};

static char dir[256];

static int make_dir(void **state) {
    (void)state;
    return ebb_test_dir_make(dir, sizeof dir, "st");
}

static int remove_dir(void **state) {
    (void)state;
    return ebb_test_dir_remove(dir);
}

static const char *path_of(const char *name) {
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

/* Files in the test directory whose name contains `part`. */
static int count_files(const char *part) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, part))
            n++;
    closedir(d);
    return n;
}

/* Writes a file by hand: 8-byte little-endian length, header, data. */
static void write_raw(const char *path, uint64_t hlen, const char *header, const void *data,
                      size_t ndata) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)(hlen >> (8 * i));
    assert_int_equal(fwrite(len8, 1, 8, f), 8);
    if (header)
        assert_int_equal(fwrite(header, 1, strlen(header), f), strlen(header));
    if (ndata)
        assert_int_equal(fwrite(data, 1, ndata, f), ndata);
    fclose(f);
}

static void write_json(const char *path, const char *header, const void *data, size_t ndata) {
    write_raw(path, strlen(header), header, data, ndata);
}

/* Asserts that opening fails with EBB_ERR_IO and a message naming the file
 * and containing `needle`. */
static void assert_refused(const char *path, const char *needle) {
    ebb_safetensors *st = (ebb_safetensors *)&st;
    ebb_status s = ebb_safetensors_open(&st, path);
    if (s == EBB_OK) {
        ebb_safetensors_close(st);
        fail_msg("'%s' opened, expected an error containing \"%s\"", path, needle);
    }
    assert_null(st);
    assert_int_equal(s, EBB_ERR_IO);
    assert_errmsg_contains(path);
    assert_errmsg_contains(needle);
}

/* ---- round trips ------------------------------------------------------------------- */

static void test_roundtrip_all_dtypes(void **state) {
    (void)state;
    const ebb_dtype dts[] = {EBB_FLOAT32, EBB_FLOAT16, EBB_BFLOAT16, EBB_FLOAT64,
                             EBB_INT64,   EBB_INT32,   EBB_UINT8,    EBB_BOOL};
    const char *names[] = {"f32", "f16", "bf16", "f64",    "i64",
                           "i32", "u8",  "bool", "scalar", "empty"};
    ebb_shape shapes[] = {EBB_SHAPE(3, 5), EBB_SHAPE(7),    EBB_SHAPE(2, 3, 1), EBB_SHAPE(3),
                          EBB_SHAPE(2, 2), EBB_SHAPE(5, 1), EBB_SHAPE(9),       EBB_SHAPE(3, 3),
                          {0, {0}},        EBB_SHAPE(0, 4)};
    ebb_tensor *ts[10];
    for (int i = 0; i < 10; i++) {
        ebb_tensor *r = NULL;
        ebb_dtype dt = i < 8 ? dts[i] : EBB_FLOAT32;
        assert_ok(ebb_tensor_uniform(&r, &shapes[i], -50, 50, EBB_FLOAT32, CPU, (uint64_t)i));
        if (dt == EBB_BOOL) {
            assert_ok(ebb_tensor_compare(&ts[i], EBB_GT, r, 0.0));
        } else if (dt == EBB_UINT8) {
            ebb_tensor *a = NULL;
            assert_ok(ebb_tensor_affine(&a, r, 1.0, 60.0));
            assert_ok(ebb_tensor_cast(&ts[i], a, dt));
            ebb_tensor_free(a);
        } else {
            assert_ok(ebb_tensor_cast(&ts[i], r, dt));
        }
        ebb_tensor_free(r);
    }
    const char *path = path_of("all.safetensors");
    assert_ok(ebb_safetensors_write(path, names, ts, 10));
    assert_int_equal(count_files(".tmp."), 0);

    ebb_safetensors *st = NULL;
    assert_ok(ebb_safetensors_open(&st, path));
    assert_string_equal(ebb_safetensors_path(st), path);
    assert_int_equal(ebb_safetensors_count(st), 10);
    /* names come back in strcmp order */
    for (int i = 1; i < 10; i++)
        assert_true(strcmp(ebb_safetensors_name_at(st, i - 1), ebb_safetensors_name_at(st, i)) < 0);
    assert_null(ebb_safetensors_name_at(st, 10));
    assert_null(ebb_safetensors_name_at(st, -1));
    assert_string_equal(ebb_safetensors_metadata(st, "format"), "pt");
    assert_null(ebb_safetensors_metadata(st, "nope"));

    for (int i = 0; i < 10; i++) {
        ebb_dtype dt;
        ebb_shape sh;
        assert_ok(ebb_safetensors_find(st, names[i], &dt, &sh));
        assert_int_equal(dt, ebb_tensor_dtype(ts[i]));
        assert_true(ebb_shape_equal(&sh, &shapes[i]));
        /* into an existing tensor, and as a new one: bit-exact both ways */
        ebb_tensor *dst = NULL, *fresh = NULL;
        assert_ok(ebb_tensor_zeros(&dst, &shapes[i], dt, CPU));
        assert_ok(ebb_safetensors_load_into(st, names[i], dst));
        assert_ok(ebb_safetensors_load(&fresh, st, names[i], CPU));
        size_t nb = ebb_tensor_nbytes(ts[i]);
        unsigned char *a = malloc(nb + 1), *b = malloc(nb + 1), *c = malloc(nb + 1);
        assert_ok(ebb_tensor_to_host(ts[i], a, nb));
        assert_ok(ebb_tensor_to_host(dst, b, nb));
        assert_ok(ebb_tensor_to_host(fresh, c, nb));
        assert_memory_equal(a, b, nb);
        assert_memory_equal(a, c, nb);
        free(a);
        free(b);
        free(c);
        ebb_tensor_free(dst);
        ebb_tensor_free(fresh);
    }
    ebb_safetensors_close(st);
    for (int i = 0; i < 10; i++)
        ebb_tensor_free(ts[i]);
}

/* The header's length: the file's first 8 bytes, little-endian. */
static uint64_t header_length(const unsigned char *buf) {
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)buf[i] << (8 * i);
    return hlen;
}

/* A bit flipped anywhere in a tensor's bytes (200 flips, one at a time)
 * is caught when that tensor loads: an error naming it and the file, and
 * the other tensors still load. */
static void test_flipped_bits_are_caught(void **state) {
    (void)state;
    ebb_shape ws = EBB_SHAPE(16, 8), bs = EBB_SHAPE(8);
    ebb_tensor *ts[2] = {NULL, NULL};
    assert_ok(ebb_tensor_randn(&ts[0], &ws, EBB_FLOAT32, CPU, 1));
    assert_ok(ebb_tensor_randn(&ts[1], &bs, EBB_FLOAT64, CPU, 2));
    const char *names[] = {"fc.weight", "fc.bias"};
    const char *path = path_of("flips.safetensors");
    assert_ok(ebb_safetensors_write(path, names, ts, 2));
    size_t n = 0;
    unsigned char *buf = ebb_test_read_file(path, &n);
    uint64_t hlen = header_length(buf);
    size_t data = 8 + (size_t)hlen, bytes = n - data; /* bias (F64) first, then weight */
    uint64_t rng = 12345;
    for (int k = 0; k < 200; k++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t at = data + (size_t)(rng >> 33) % bytes;
        unsigned char bit = (unsigned char)(1u << ((rng >> 20) % 8));
        buf[at] ^= bit;
        FILE *f = fopen(path, "wb");
        assert_int_equal(fwrite(buf, 1, n, f), n);
        fclose(f);
        buf[at] ^= bit;
        const char *hit = at - data < 64 ? "fc.bias" : "fc.weight";
        ebb_safetensors *st = NULL;
        assert_ok(ebb_safetensors_open(&st, path));
        for (int i = 0; i < 2; i++) {
            ebb_tensor *t = NULL;
            ebb_status s = ebb_safetensors_load(&t, st, names[i], CPU);
            if (!strcmp(names[i], hit)) {
                assert_int_equal(s, EBB_ERR_CORRUPT);
                char want[700];
                snprintf(want, sizeof want, "tensor '%s' in '%s' is damaged", hit, path);
                assert_errmsg_contains(want);
            } else {
                assert_ok(s);
            }
            ebb_tensor_free(t);
        }
        ebb_safetensors_close(st);
    }
    free(buf);
    ebb_tensor_free(ts[0]);
    ebb_tensor_free(ts[1]);
}

/* The bytes are those of the format: PyTorch reads them. Data starts 8-byte
 * aligned, larger elements first; the metadata holds each tensor's CRC-32
 * (zlib's, as Python's zlib.crc32 gives it). */
static void test_exact_bytes(void **state) {
    (void)state;
    float w[4] = {1, 2, 3, 4};
    double d[1] = {0.5};
    ebb_shape ws = EBB_SHAPE(2, 2), ds = EBB_SHAPE(1);
    ebb_tensor *ts[2] = {NULL, NULL};
    assert_ok(ebb_tensor_from_host(&ts[0], w, sizeof w, &ws, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_from_host(&ts[1], d, sizeof d, &ds, EBB_FLOAT64, CPU));
    const char *names[] = {"layer.weight", "scale \"q\""};
    const char *path = path_of("exact.safetensors");
    assert_ok(ebb_safetensors_write(path, names, ts, 2));
    size_t n = 0;
    unsigned char *buf = ebb_test_read_file(path, &n);
    uint64_t hlen = header_length(buf);
    assert_int_equal((8 + hlen) % 8, 0);
    assert_int_equal(n, 8 + hlen + 24);
    const char *want =
        "{\"__metadata__\":{\"format\":\"pt\",\"crc32:scale \\\"q\\\"\":\"8d3a01b8\","
        "\"crc32:layer.weight\":\"8ba71454\"},"
        "\"scale \\\"q\\\"\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]},"
        "\"layer.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[8,24]}}";
    size_t wl = strlen(want);
    assert_true(hlen >= wl && hlen < wl + 8);
    assert_memory_equal(buf + 8, want, wl);
    for (size_t i = wl; i < hlen; i++)
        assert_int_equal(buf[8 + i], ' ');
    assert_memory_equal(buf + 8 + hlen, d, 8);
    assert_memory_equal(buf + 8 + hlen + 8, w, 16);
    free(buf);

    ebb_safetensors *st = NULL;
    assert_ok(ebb_safetensors_open(&st, path));
    assert_ok(ebb_safetensors_find(st, "scale \"q\"", NULL, NULL));
    ebb_safetensors_close(st);
    ebb_tensor_free(ts[0]);
    ebb_tensor_free(ts[1]);
}

/* A file as another writer may lay it out: no metadata, no padding, an
 * unaligned F32 after a U8. */
static void test_foreign_layout(void **state) {
    (void)state;
    unsigned char data[1 + 8];
    float f[2] = {-1.5f, 2.25f};
    data[0] = 200;
    memcpy(data + 1, f, 8);
    const char *path = path_of("foreign.safetensors");
    write_json(path,
               "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[1,9]},"
               "\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}",
               data, sizeof data);
    ebb_safetensors *st = NULL;
    assert_ok(ebb_safetensors_open(&st, path));
    assert_string_equal(ebb_safetensors_name_at(st, 0), "a");
    assert_null(ebb_safetensors_metadata(st, "format"));
    ebb_shape s2 = EBB_SHAPE(2);
    ebb_tensor *t = NULL, *tt = NULL, *u = NULL;
    /* a strided destination takes the unaligned bytes too */
    ebb_shape s21 = EBB_SHAPE(1, 2);
    assert_ok(ebb_tensor_zeros(&t, &s21, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_reshape(&tt, t, &s2));
    assert_ok(ebb_safetensors_load_into(st, "b", tt));
    float got[2];
    assert_ok(ebb_tensor_to_host(t, got, sizeof got));
    assert_memory_equal(got, f, sizeof f);
    assert_ok(ebb_safetensors_load(&u, st, "a", CPU));
    double v = 0;
    assert_ok(ebb_tensor_item(u, &v));
    assert_true(v == 200.0);
    ebb_tensor_free(t);
    ebb_tensor_free(tt);
    ebb_tensor_free(u);
    ebb_safetensors_close(st);
}

/* ---- lookups and loads that do not fit ---------------------------------------------- */

static void test_load_mismatch(void **state) {
    (void)state;
    ebb_shape s = EBB_SHAPE(2, 3);
    ebb_tensor *t = NULL;
    assert_ok(ebb_tensor_ones(&t, &s, EBB_FLOAT32, CPU));
    const char *names[] = {"w"};
    const char *path = path_of("mismatch.safetensors");
    assert_ok(ebb_safetensors_write(path, names, &t, 1));
    ebb_safetensors *st = NULL;
    assert_ok(ebb_safetensors_open(&st, path));

    ebb_tensor *dst = NULL;
    ebb_shape other = EBB_SHAPE(3, 2);
    assert_ok(ebb_tensor_zeros(&dst, &other, EBB_FLOAT32, CPU));
    assert_int_equal(ebb_safetensors_load_into(st, "w", dst), EBB_ERR_SHAPE);
    assert_errmsg_contains("'w'");
    assert_errmsg_contains(path);
    assert_errmsg_contains("[2, 3]");
    assert_errmsg_contains("[3, 2]");
    ebb_tensor_free(dst);

    assert_ok(ebb_tensor_zeros(&dst, &s, EBB_FLOAT16, CPU));
    assert_int_equal(ebb_safetensors_load_into(st, "w", dst), EBB_ERR_SHAPE);
    assert_errmsg_contains("float32");
    assert_errmsg_contains("float16");
    ebb_tensor_free(dst);

    assert_int_equal(ebb_safetensors_find(st, "v", NULL, NULL), EBB_ERR_ARG);
    assert_errmsg_contains("'v'");
    assert_errmsg_contains(path);
    assert_int_equal(ebb_safetensors_load_into(st, "v", t), EBB_ERR_ARG);
    ebb_tensor *out = (ebb_tensor *)&out;
    assert_int_equal(ebb_safetensors_load(&out, st, "v", CPU), EBB_ERR_ARG);
    assert_null(out);

    /* meta destinations have no storage */
    assert_ok(ebb_tensor_empty(&dst, &s, EBB_FLOAT32, (ebb_device){EBB_DEVICE_META, 0}));
    assert_int_equal(ebb_safetensors_load_into(st, "w", dst), EBB_ERR_ARG);
    assert_errmsg_contains("meta");
    ebb_tensor_free(dst);
    ebb_safetensors_close(st);
    ebb_tensor_free(t);
}

/* A dtype ebb lacks does not spoil the rest of the file. */
static void test_unsupported_dtype(void **state) {
    (void)state;
    unsigned char data[4 + 3] = {1, 2, 3, 4, 250, 251, 252};
    const char *path = path_of("i8.safetensors");
    write_json(path,
               "{\"x\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
               "\"q\":{\"dtype\":\"I8\",\"shape\":[3],\"data_offsets\":[4,7]}}",
               data, sizeof data);
    ebb_safetensors *st = NULL;
    assert_ok(ebb_safetensors_open(&st, path));
    assert_int_equal(ebb_safetensors_count(st), 2);
    assert_int_equal(ebb_safetensors_find(st, "q", NULL, NULL), EBB_ERR_UNSUPPORTED);
    assert_errmsg_contains("I8");
    assert_errmsg_contains("'q'");
    /* present in a dtype ebb lacks is told apart from absent */
    assert_string_equal(ebb_safetensors_dtype_str(st, "q"), "I8");
    assert_string_equal(ebb_safetensors_dtype_str(st, "x"), "U8");
    assert_null(ebb_safetensors_dtype_str(st, "nope"));
    ebb_tensor *x = NULL;
    assert_ok(ebb_safetensors_load(&x, st, "x", CPU));
    unsigned char got[4];
    assert_ok(ebb_tensor_to_host(x, got, 4));
    assert_memory_equal(got, data, 4);
    ebb_tensor_free(x);
    ebb_safetensors_close(st);
}

/* ---- writing: arguments and atomicity ------------------------------------------------- */

static void test_write_errors_and_atomicity(void **state) {
    (void)state;
    ebb_shape s = EBB_SHAPE(4);
    ebb_tensor *a = NULL, *b = NULL, *m = NULL;
    assert_ok(ebb_tensor_full(&a, &s, 1.0, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_full(&b, &s, 2.0, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_empty(&m, &s, EBB_FLOAT32, (ebb_device){EBB_DEVICE_META, 0}));
    const char *path = path_of("model.safetensors");
    const char *one[] = {"a"};
    assert_ok(ebb_safetensors_write(path, one, &a, 1));

    /* failed writes leave the old file and no temporary behind */
    ebb_tensor *two[] = {a, b};
    const char *dup[] = {"x", "x"};
    assert_int_equal(ebb_safetensors_write(path, dup, two, 2), EBB_ERR_ARG);
    assert_errmsg_contains("'x' is given twice");
    const char *meta_name[] = {"__metadata__"};
    assert_int_equal(ebb_safetensors_write(path, meta_name, &b, 1), EBB_ERR_ARG);
    const char *empty[] = {""};
    assert_int_equal(ebb_safetensors_write(path, empty, &b, 1), EBB_ERR_ARG);
    const char *names2[] = {"a", "m"};
    ebb_tensor *with_meta[] = {b, m};
    assert_int_equal(ebb_safetensors_write(path, names2, with_meta, 2), EBB_ERR_ARG);
    assert_errmsg_contains("'m'");
    assert_int_equal(ebb_safetensors_write(NULL, one, &a, 1), EBB_ERR_ARG);
    assert_int_equal(count_files(".tmp."), 0);

    ebb_safetensors *st = NULL;
    ebb_tensor *got = NULL;
    double v = 0;
    assert_ok(ebb_safetensors_open(&st, path));
    assert_ok(ebb_safetensors_load(&got, st, "a", CPU));
    assert_ok(ebb_tensor_mean_value(got, &v));
    assert_true(v == 1.0);
    ebb_tensor_free(got);

    /* replacing the file while a reader has it mapped: the reader keeps the
     * old contents, a new reader sees the new ones */
    assert_ok(ebb_safetensors_write(path, one, &b, 1));
    assert_ok(ebb_safetensors_load(&got, st, "a", CPU));
    assert_ok(ebb_tensor_mean_value(got, &v));
    assert_true(v == 1.0);
    ebb_tensor_free(got);
    ebb_safetensors_close(st);
    assert_ok(ebb_safetensors_open(&st, path));
    assert_ok(ebb_safetensors_load(&got, st, "a", CPU));
    assert_ok(ebb_tensor_mean_value(got, &v));
    assert_true(v == 2.0);
    ebb_tensor_free(got);
    ebb_safetensors_close(st);

    /* a directory that does not exist */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.safetensors", dir);
    assert_int_equal(ebb_safetensors_write(bad, one, &a, 1), EBB_ERR_IO);
    assert_errmsg_contains(bad);

    /* a new file gets the mode any new file gets (0666 less the umask) */
    struct stat sb;
    mode_t mask = umask(022);
    umask(mask);
    assert_ok(ebb_safetensors_write(path_of("fresh.safetensors"), one, &a, 1));
    assert_int_equal(stat(path_of("fresh.safetensors"), &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0666 & ~mask);

    /* zero tensors is a valid file */
    assert_ok(ebb_safetensors_write(path, NULL, NULL, 0));
    assert_ok(ebb_safetensors_open(&st, path));
    assert_int_equal(ebb_safetensors_count(st), 0);
    ebb_safetensors_close(st);
    ebb_tensor_free(a);
    ebb_tensor_free(b);
    ebb_tensor_free(m);
}

/* ---- malformed files -------------------------------------------------------------------- */

static void test_malformed_files(void **state) {
    (void)state;
    const char *p = path_of("bad.safetensors");
    unsigned char data[64] = {0};
    char hdr[512];

    ebb_safetensors *st = (ebb_safetensors *)&st;
    assert_int_equal(ebb_safetensors_open(&st, path_of("missing.safetensors")), EBB_ERR_IO);
    assert_null(st);
    assert_errmsg_contains("missing.safetensors");
    assert_errmsg_contains("No such file");

    FILE *f = fopen(p, "wb");
    fwrite("\x02\0\0", 1, 3, f);
    fclose(f);
    assert_refused(p, "too short");

    write_raw(p, 1000, "{}", NULL, 0);
    assert_refused(p, "runs past the end of the file");
    write_raw(p, UINT64_MAX, "{}", NULL, 0);
    assert_refused(p, "exceeds");
    write_raw(p, 0, NULL, NULL, 0);
    assert_refused(p, "JSON object");

    write_json(p, "{\"a\": {\"dtype\": \"F32\",", NULL, 0);
    assert_refused(p, "not valid JSON");
    write_json(p, "[1, 2]", NULL, 0);
    assert_refused(p, "JSON object");
    write_json(p, "{} x", NULL, 0);
    assert_refused(p, "after its JSON object");
    write_json(p, "{\"a\": 3}", NULL, 0);
    assert_refused(p, "'a' is not an object");
    write_json(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2]}}", data, 8);
    assert_refused(p, "data_offsets");

    write_json(p, "{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", data, 8);
    assert_refused(p, "unknown dtype 'F33'");
    write_json(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", data, 8);
    assert_refused(p, "shape entry 0");
    write_json(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", data, 8);
    assert_refused(p, "shape entry 0");
    write_json(p,
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}",
               data, 8);
    assert_refused(p, "9 dims");
    write_json(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", data, 8);
    assert_refused(p, "needs 12");
    write_json(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", data, 8);
    assert_refused(p, "begin <= end");
    write_json(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", data, 8);
    assert_refused(p, "data_offsets");
    write_json(p, "{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],"
                  "\"data_offsets\":[0,8]}}",
               data, 8);
    assert_refused(p, "too large");

    /* offsets out of range, overlapping, leaving gaps */
    write_json(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[100],\"data_offsets\":[0,400]}}", data, 16);
    assert_refused(p, "run past the end of the data");
    write_json(p,
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               data, 12);
    assert_refused(p, "overlap");
    assert_errmsg_contains("'a'");
    assert_errmsg_contains("'b'");
    write_json(p,
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
               data, 20);
    assert_refused(p, "[8, 12) belong to no tensor");
    write_json(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", data, 10);
    assert_refused(p, "[8, 10) belong to no tensor");

    /* names and metadata */
    write_json(p,
               "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
               "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
               data, 2);
    assert_refused(p, "'a' appears twice");
    write_json(p, "{\"__metadata__\":{\"n\":3}}", NULL, 0);
    assert_refused(p, "not a string");
    write_json(p, "{\"__metadata__\":[]}", NULL, 0);
    assert_refused(p, "__metadata__");

    /* the smallest valid file, with padding */
    snprintf(hdr, sizeof hdr, "{}      ");
    write_json(p, hdr, NULL, 0);
    assert_ok(ebb_safetensors_open(&st, p));
    assert_int_equal(ebb_safetensors_count(st), 0);
    ebb_safetensors_close(st);
}

/* Every prefix of a valid file is refused cleanly. */
static void test_every_truncation(void **state) {
    (void)state;
    ebb_shape s1 = EBB_SHAPE(3, 2), s2 = EBB_SHAPE(5);
    ebb_tensor *ts[2] = {NULL, NULL};
    assert_ok(ebb_tensor_randn(&ts[0], &s1, EBB_FLOAT32, CPU, 1));
    assert_ok(ebb_tensor_randn(&ts[1], &s2, EBB_BFLOAT16, CPU, 2));
    const char *names[] = {"w", "b"};
    const char *full = path_of("full.safetensors"), *cut = path_of("cut.safetensors");
    assert_ok(ebb_safetensors_write(full, names, ts, 2));
    size_t n = 0;
    unsigned char *buf = ebb_test_read_file(full, &n);
    for (size_t len = 0; len < n; len++) {
        FILE *f = fopen(cut, "wb");
        if (len)
            assert_int_equal(fwrite(buf, 1, len, f), len);
        fclose(f);
        ebb_safetensors *st = NULL;
        if (ebb_safetensors_open(&st, cut) == EBB_OK) {
            ebb_safetensors_close(st);
            fail_msg("a %zu-byte prefix of a %zu-byte file opened", len, n);
        }
        assert_int_equal(ebb_errcode(), EBB_ERR_IO);
    }
    free(buf);
    ebb_tensor_free(ts[0]);
    ebb_tensor_free(ts[1]);
}

/* Mutated headers either open, and then every tensor loads, or are refused
 * with EBB_ERR_IO: never a crash or an out-of-bounds read. */
static void test_mutated_headers(void **state) {
    (void)state;
    ebb_shape s1 = EBB_SHAPE(4, 3), s2 = EBB_SHAPE(6);
    ebb_tensor *ts[3] = {NULL, NULL, NULL};
    assert_ok(ebb_tensor_randn(&ts[0], &s1, EBB_FLOAT32, CPU, 1));
    assert_ok(ebb_tensor_randn(&ts[1], &s2, EBB_FLOAT64, CPU, 2));
    assert_ok(ebb_tensor_randn(&ts[2], &s2, EBB_FLOAT16, CPU, 3));
    const char *names[] = {"layer1.weight", "layer1.bias", "x"};
    const char *full = path_of("full.safetensors"), *mut = path_of("mut.safetensors");
    assert_ok(ebb_safetensors_write(full, names, ts, 3));
    size_t n = 0;
    unsigned char *buf = ebb_test_read_file(full, &n);
    unsigned char *m = malloc(n);
    static const char alphabet[] = "0123456789[]{},:\" -.eE9FIUB";
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int opened = 0;
    for (int iter = 0; iter < 1500; iter++) {
        memcpy(m, buf, n);
        int edits = 1 + iter % 3;
        for (int e = 0; e < edits; e++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)(rng >> 33) % (n < 120 ? n : 120); /* mostly the header */
            unsigned char ch = (unsigned char)alphabet[(rng >> 20) % (sizeof alphabet - 1)];
            if (at < 8)
                ch = (unsigned char)(rng >> 40);
            m[at] = ch;
        }
        FILE *f = fopen(mut, "wb");
        assert_int_equal(fwrite(m, 1, n, f), n);
        fclose(f);
        ebb_safetensors *st = NULL;
        if (ebb_safetensors_open(&st, mut) != EBB_OK) {
            assert_int_equal(ebb_errcode(), EBB_ERR_IO);
            continue;
        }
        opened++;
        for (int i = 0; i < ebb_safetensors_count(st); i++) {
            ebb_tensor *t = NULL;
            ebb_status s = ebb_safetensors_load(&t, st, ebb_safetensors_name_at(st, i), CPU);
            /* an edit in a checksum: the tensor's bytes no longer match it */
            assert_true(s == EBB_OK || s == EBB_ERR_UNSUPPORTED ||
                        (s == EBB_ERR_CORRUPT && strstr(ebb_errmsg(), "is damaged")));
            ebb_tensor_free(t);
        }
        ebb_safetensors_close(st);
    }
    assert_true(opened > 0); /* some edits (in the data) leave a valid file */
    free(m);
    free(buf);
    for (int i = 0; i < 3; i++)
        ebb_tensor_free(ts[i]);
}

/* ---- files that are not regular, files that shrink ---------------------------------- */

/* The header as given, with its exact length (it may hold NUL bytes). */
static void write_bytes(const char *path, const char *header, size_t hlen, const void *data,
                        size_t ndata) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    assert_int_equal(fwrite(len8, 1, 8, f), 8);
    assert_int_equal(fwrite(header, 1, hlen, f), hlen);
    if (ndata)
        assert_int_equal(fwrite(data, 1, ndata, f), ndata);
    fclose(f);
}

/* A FIFO would block open() forever; it, a directory and a device are
 * refused before any read. SIGALRM ends the test if one blocks. */
static void test_not_regular_files(void **state) {
    (void)state;
    char fifo[512];
    snprintf(fifo, sizeof fifo, "%s", path_of("fifo.safetensors"));
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(20);
    assert_refused(fifo, "is a FIFO, not a regular file");
    assert_refused(dir, "is a directory, not a regular file");
    assert_refused("/dev/null", "is a character device, not a regular file");
    alarm(0);
    unlink(fifo);
}

typedef struct truncator {
    const char *path;
    off_t to;
} truncator;

static void *truncate_soon(void *arg) {
    const truncator *t = arg;
    usleep(2000);
    if (truncate(t->path, t->to) != 0)
        perror("truncate");
    return NULL;
}

/* A file that shrinks under an open reader (another process truncates it, or
 * cp rewrites it in place): a mapped file killed the reader with SIGBUS; the
 * pread reader names the tensor whose bytes went missing. */
static void test_truncated_while_open(void **state) {
    (void)state;
    ebb_shape bs = EBB_SHAPE(768, 1024), ss = EBB_SHAPE(4); /* 3 MiB: several read chunks */
    ebb_tensor *ts[2] = {NULL, NULL}, *dst = NULL, *t = (ebb_tensor *)&t;
    assert_ok(ebb_tensor_randn(&ts[0], &bs, EBB_FLOAT32, CPU, 1));
    assert_ok(ebb_tensor_randn(&ts[1], &ss, EBB_FLOAT64, CPU, 2));
    const char *names[] = {"big", "small"};
    char path[512];
    snprintf(path, sizeof path, "%s", path_of("shrinks.safetensors"));
    assert_ok(ebb_safetensors_write(path, names, ts, 2));
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_ok(ebb_tensor_zeros(&dst, &bs, EBB_FLOAT32, CPU));

    /* between the header and the payload: "small" (8-byte elements, first in
     * the data) still loads, "big" lost its second half */
    ebb_safetensors *st = NULL;
    assert_ok(ebb_safetensors_open(&st, path));
    assert_int_equal(truncate(path, sb.st_size - (off_t)(3 << 19)), 0);
    assert_int_equal(ebb_safetensors_load_into(st, "big", dst), EBB_ERR_IO);
    assert_errmsg_contains("truncated while reading tensor 'big'");
    assert_errmsg_contains(path);
    assert_int_equal(ebb_safetensors_load(&t, st, "big", CPU), EBB_ERR_IO);
    assert_null(t);
    assert_ok(ebb_safetensors_load(&t, st, "small", CPU));
    ebb_tensor_free(t);
    assert_int_equal(truncate(path, 0), 0);
    assert_int_equal(ebb_safetensors_load(&t, st, "small", CPU), EBB_ERR_IO);
    assert_errmsg_contains("it is now 0 bytes");
    ebb_safetensors_close(st);

    /* a thread truncates while loads run: each load succeeds or says so */
    assert_ok(ebb_safetensors_write(path, names, ts, 2));
    assert_ok(ebb_safetensors_open(&st, path));
    truncator tr = {path, 64};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, truncate_soon, &tr), 0);
    int failed = 0;
    for (int i = 0; i < 2000 && !failed; i++) {
        ebb_status s = ebb_safetensors_load_into(st, "big", dst);
        assert_true(s == EBB_OK || s == EBB_ERR_IO);
        failed = s != EBB_OK;
    }
    pthread_join(th, NULL);
    assert_int_equal(ebb_safetensors_load_into(st, "big", dst), EBB_ERR_IO);
    assert_errmsg_contains("truncated while reading");
    ebb_safetensors_close(st);
    ebb_tensor_free(dst);
    ebb_tensor_free(ts[0]);
    ebb_tensor_free(ts[1]);
}

/* JSON allows bytes below 0x20 only as whitespace between tokens, and must
 * be UTF-8; cJSON alone would take a NUL as the end of the text. */
static void test_header_bytes(void **state) {
    (void)state;
    static const struct {
        const char *hdr;
        size_t len;
        const char *needle;
    } bad[] = {
#define H(lit) lit, sizeof lit - 1
        {H("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}\0   "),
         "NUL byte at byte 53"},
        {H("{\"a\0b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}"), "NUL byte"},
        {H("{\"a\x01\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}"),
         "control byte 0x01 at byte 3 inside a string"},
        {H("{\"a\tb\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}"),
         "control byte 0x09"},
        {H("{\"a\":\x0b{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}"),
         "control byte 0x0b at byte 5,"},
        {H("{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}"),
         "not valid UTF-8 at byte 3"},
        {H("{\"a\xc0\x80\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}"),
         "not valid UTF-8"},
        {H("{\"a\xed\xa0\x80\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}"),
         "not valid UTF-8"},
        {H("{\"a\xe2\x82\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}"),
         "not valid UTF-8"},
    };
    unsigned char one = 7;
    char path[512];
    snprintf(path, sizeof path, "%s", path_of("bytes.safetensors"));
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_bytes(path, bad[i].hdr, bad[i].len, &one, 1);
        assert_refused(path, bad[i].needle);
    }
    /* UTF-8 names and whitespace between tokens are JSON */
    static const char good[] =
        "{\n\t\"caf\xc3\xa9 \xf0\x9f\x98\x80\\t\" : {\"dtype\":\"U8\",\r\n\"shape\":[1],"
        "\"data_offsets\":[0,1]}}  ";
    write_bytes(path, good, sizeof good - 1, &one, 1);
    ebb_safetensors *st = NULL;
    assert_ok(ebb_safetensors_open(&st, path));
    assert_string_equal(ebb_safetensors_name_at(st, 0), "caf\xc3\xa9 \xf0\x9f\x98\x80\t");
    ebb_safetensors_close(st);
#undef H
}

/* NaN and infinities are counted from the bytes as they are read, in every
 * floating dtype and across read chunks. */
static void test_nonfinite_counts(void **state) {
    (void)state;
    float f32[6] = {1.0f, NAN, INFINITY, -INFINITY, 0.0f, 3.0e38f};
    double f64[3] = {NAN, 1.0, 2.0};
    uint16_t f16[4] = {0x7c00, 0x7e00, 0x3c00, 0xfc00}; /* inf, nan, 1, -inf */
    uint16_t bf16[2] = {0x7fc0, 0x3f80};                /* nan, 1 */
    int32_t i32[2] = {-1, 0x7fffffff};
    ebb_shape s6 = EBB_SHAPE(6), s3 = EBB_SHAPE(3), s4 = EBB_SHAPE(4), s2 = EBB_SHAPE(2),
              sbig = EBB_SHAPE(600000);
    ebb_tensor *ts[6] = {NULL};
    assert_ok(ebb_tensor_from_host(&ts[0], f32, sizeof f32, &s6, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_from_host(&ts[1], f64, sizeof f64, &s3, EBB_FLOAT64, CPU));
    assert_ok(ebb_tensor_from_host(&ts[2], f16, sizeof f16, &s4, EBB_FLOAT16, CPU));
    assert_ok(ebb_tensor_from_host(&ts[3], bf16, sizeof bf16, &s2, EBB_BFLOAT16, CPU));
    assert_ok(ebb_tensor_from_host(&ts[4], i32, sizeof i32, &s2, EBB_INT32, CPU));
    float *big = calloc(600000, sizeof *big);
    assert_non_null(big);
    big[10] = INFINITY;
    big[500000] = NAN; /* in the third 1 MiB chunk */
    assert_ok(ebb_tensor_from_host(&ts[5], big, 600000 * sizeof *big, &sbig, EBB_FLOAT32, CPU));
    free(big);
    const char *names[] = {"f32", "f64", "f16", "bf16", "i32", "big"};
    const int64_t want[] = {3, 1, 3, 1, 0, 2};
    char path[512];
    snprintf(path, sizeof path, "%s", path_of("nonfinite.safetensors"));
    assert_ok(ebb_safetensors_write(path, names, ts, 6));
    ebb_safetensors *st = NULL;
    assert_ok(ebb_safetensors_open(&st, path));
    for (int i = 0; i < 6; i++) {
        ebb_tensor *t = NULL;
        int64_t n = -1;
        assert_ok(ebb_safetensors_load_ex(&t, st, names[i], CPU, &n));
        if (n != want[i])
            fail_msg("tensor '%s': %lld non-finite values counted, expected %lld", names[i],
                     (long long)n, (long long)want[i]);
        n = -1;
        assert_ok(ebb_safetensors_load_into_ex(st, names[i], t, &n));
        assert_int_equal(n, want[i]);
        ebb_tensor_free(t);
    }
    ebb_safetensors_close(st);
    for (int i = 0; i < 6; i++)
        ebb_tensor_free(ts[i]);
}

/* ---- loading a model ------------------------------------------------------------------ */

static ebb_plan *mlp_plan(void) {
    ebb_spec *spec = NULL;
    ebb_plan *p = NULL;
    assert_ok(ebb_spec_load(&spec, EBB_SOURCE_DIR "/specs/mlp.yaml"));
    const char *bind[] = {"batch=2"};
    ebb_shape shapes[4];
    assert_ok(ebb_spec_resolve_shapes(spec, bind, 1, shapes, 4));
    ebb_compile_options co = {.input_shapes = shapes, .n_input_shapes = 1};
    assert_ok(ebb_spec_compile(&p, spec, &co));
    ebb_spec_free(spec);
    return p;
}

typedef struct seen {
    char name[64];
    int64_t count, numel;
    int calls;
} seen;

static void note_nonfinite(const char *path, const char *name, int64_t count, int64_t numel,
                           void *user) {
    (void)path;
    seen *s = user;
    snprintf(s->name, sizeof s->name, "%s", name);
    s->count = count;
    s->numel = numel;
    s->calls++;
}

/* A parameter present in a dtype ebb lacks is named as such, not "missing";
 * NaN in a parameter is reported through the callback or refused. */
static void test_model_load_dtype_and_finite(void **state) {
    (void)state;
    ebb_plan *p = mlp_plan();
    ebb_model *m = NULL, *m2 = NULL;
    assert_ok(ebb_model_new(&m, p, CPU, 1));
    assert_ok(ebb_model_new(&m2, p, CPU, 2));
    int n = ebb_model_param_count(m);

    /* every parameter as F32, but fc1.bias as I8 */
    char header[4096], path[512];
    size_t at = (size_t)snprintf(header, sizeof header, "{");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const char *name = ebb_model_param_name(m, i);
        ebb_shape sh = ebb_tensor_shape(ebb_model_param(m, name));
        int i8 = !strcmp(name, "fc1.bias");
        uint64_t nb = (uint64_t)ebb_shape_numel(&sh) * (i8 ? 1 : 4);
        at += (size_t)snprintf(header + at, sizeof header - at,
                               "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", name,
                               i8 ? "I8" : "F32");
        for (int d = 0; d < sh.ndim; d++)
            at += (size_t)snprintf(header + at, sizeof header - at, "%s%lld", d ? "," : "",
                                   (long long)sh.dim[d]);
        at += (size_t)snprintf(header + at, sizeof header - at, "],\"data_offsets\":[%llu,%llu]}",
                               (unsigned long long)off, (unsigned long long)(off + nb));
        off += nb;
    }
    at += (size_t)snprintf(header + at, sizeof header - at, "}");
    assert_true(at < sizeof header);
    void *zeros = calloc(1, (size_t)off);
    snprintf(path, sizeof path, "%s", path_of("i8_bias.safetensors"));
    write_bytes(path, header, at, zeros, (size_t)off);
    free(zeros);
    assert_int_equal(ebb_model_load(m2, path), EBB_ERR_SHAPE);
    assert_errmsg_contains("parameter 'fc1.bias' has dtype I8, which ebb does not support");
    assert_errmsg_contains("float32 [128]");
    assert_errmsg_contains(path);
    if (strstr(ebb_errmsg(), "missing"))
        fail_msg("an I8 parameter was called missing: %s", ebb_errmsg());

    /* one NaN in fc2.weight */
    ebb_tensor *w = ebb_model_param(m, "fc2.weight");
    int64_t numel = ebb_tensor_numel(w);
    float *v = malloc((size_t)numel * sizeof *v);
    assert_ok(ebb_tensor_to_host(w, v, (size_t)numel * sizeof *v));
    v[5] = NAN;
    ebb_tensor *nan_w = NULL;
    ebb_shape ws = ebb_tensor_shape(w);
    assert_ok(ebb_tensor_from_host(&nan_w, v, (size_t)numel * sizeof *v, &ws, EBB_FLOAT32, CPU));
    free(v);
    assert_ok(ebb_model_set_param(m, "fc2.weight", nan_w));
    ebb_tensor_free(nan_w);
    snprintf(path, sizeof path, "%s", path_of("nan.safetensors"));
    assert_ok(ebb_model_save(m, path));
    seen s = {{0}, 0, 0, 0};
    ebb_model_load_options warn = {.nonfinite = note_nonfinite, .user = &s};
    assert_ok(ebb_model_load_ex(m2, path, &warn));
    assert_int_equal(s.calls, 1);
    assert_string_equal(s.name, "fc2.weight");
    assert_int_equal(s.count, 1);
    assert_int_equal(s.numel, numel);
    ebb_model_load_options strict = {.strict_finite = 1};
    assert_int_equal(ebb_model_load_ex(m2, path, &strict), EBB_ERR_ARG);
    assert_errmsg_contains("parameter 'fc2.weight' holds 1 NaN or infinite values");
    assert_ok(ebb_model_load(m2, path)); /* no options: loads, silently */
    ebb_model_free(m);
    ebb_model_free(m2);
    ebb_plan_free(p);
}

/* A parameter's values on the host (caller frees). */
static float *param_values(const ebb_model *m, const char *name, int64_t *numel) {
    const ebb_tensor *t = ebb_model_param(m, name);
    assert_non_null(t);
    *numel = ebb_tensor_numel(t);
    float *v = malloc((size_t)*numel * sizeof *v);
    assert_non_null(v);
    assert_ok(ebb_tensor_to_host(t, v, (size_t)*numel * sizeof *v));
    return v;
}

/* Whether parameter `name` of a holds the same bytes as that of b. */
static int same_param(const ebb_model *a, const ebb_model *b, const char *name) {
    int64_t na = 0, nb = 0;
    float *va = param_values(a, name, &na), *vb = param_values(b, name, &nb);
    int same = na == nb && memcmp(va, vb, (size_t)na * sizeof *va) == 0;
    free(va);
    free(vb);
    return same;
}

typedef struct report_seen {
    ebb_load_report r;
    char text[8192];
    int calls;
} report_seen;

static void note_mismatch(const ebb_load_report *r, void *user) {
    report_seen *s = user;
    s->r = *r;
    snprintf(s->text, sizeof s->text, "%s", r->text);
    s->r.text = s->text;
    s->calls++;
}

/* As PyTorch's load_state_dict: every missing, unexpected and mis-shaped
 * tensor named in one message, nothing changed; non-strict loads the
 * tensors that match and leaves every other parameter as it was. */
static void test_model_load_lists_every_problem(void **state) {
    (void)state;
    ebb_plan *p = mlp_plan();
    ebb_model *src = NULL, *m = NULL, *before = NULL;
    assert_ok(ebb_model_new(&src, p, CPU, 1));
    assert_ok(ebb_model_new(&m, p, CPU, 2));
    assert_ok(ebb_model_new(&before, p, CPU, 2));

    /* fc1.bias and fc2.bias missing, fc3.weight one column short, and a
     * BatchNorm counter the mlp has no parameter for */
    ebb_shape short_shape = EBB_SHAPE(10, 127), scalar = {0};
    ebb_tensor *short_w = NULL, *counter = NULL;
    assert_ok(ebb_tensor_zeros(&short_w, &short_shape, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_zeros(&counter, &scalar, EBB_INT64, CPU));
    const char *names[] = {"fc1.weight", "fc2.weight", "fc3.weight", "fc3.bias",
                           "bn.num_batches_tracked"};
    ebb_tensor *ts[] = {ebb_model_param(src, "fc1.weight"), ebb_model_param(src, "fc2.weight"),
                        short_w, ebb_model_param(src, "fc3.bias"), counter};
    char path[512];
    snprintf(path, sizeof path, "%s", path_of("four_problems.safetensors"));
    assert_ok(ebb_safetensors_write(path, names, ts, 5));
    ebb_tensor_free(short_w);
    ebb_tensor_free(counter);

    assert_int_equal(ebb_model_load(m, path), EBB_ERR_SHAPE);
    assert_errmsg_contains(path);
    assert_errmsg_contains("4 tensors do not match the model (2 missing, 1 unexpected, 1 of the "
                           "wrong dtype or shape)");
    assert_errmsg_contains("missing parameters 'fc1.bias', 'fc2.bias'");
    assert_errmsg_contains("unexpected tensor 'bn.num_batches_tracked'");
    assert_errmsg_contains(
        "parameter 'fc3.weight' is float32 [10, 127] in the file, the model needs float32 [10, 128]");
    for (int i = 0; i < ebb_model_param_count(m); i++)
        if (!same_param(m, before, ebb_model_param_name(m, i)))
            fail_msg("a failed strict load changed %s", ebb_model_param_name(m, i));

    /* the same error with options but no non_strict */
    ebb_model_load_options strict = {0};
    assert_int_equal(ebb_model_load_ex(m, path, &strict), EBB_ERR_SHAPE);

    report_seen seen = {.calls = 0};
    ebb_model_load_options lax = {.non_strict = 1, .mismatch = note_mismatch, .user = &seen};
    assert_ok(ebb_model_load_ex(m, path, &lax));
    assert_int_equal(seen.calls, 1);
    assert_int_equal(seen.r.n_missing, 2);
    assert_int_equal(seen.r.n_unexpected, 1);
    assert_int_equal(seen.r.n_mismatched, 1);
    assert_int_equal(seen.r.n_loaded, 3);
    assert_string_equal(seen.r.path, path);
    if (!strstr(seen.text, "'fc1.bias', 'fc2.bias'") || !strstr(seen.text, "bn.num_batches_tracked") ||
        !strstr(seen.text, "[10, 127]"))
        fail_msg("the non-strict report lacks a problem: %s", seen.text);
    static const char *const loaded[] = {"fc1.weight", "fc2.weight", "fc3.bias"};
    static const char *const kept[] = {"fc1.bias", "fc2.bias", "fc3.weight"};
    for (int i = 0; i < 3; i++) {
        if (!same_param(m, src, loaded[i]))
            fail_msg("non-strict did not load %s", loaded[i]);
        if (!same_param(m, before, kept[i]))
            fail_msg("non-strict changed %s, which did not match", kept[i]);
    }

    /* a file that matches: no report, and non-strict changes nothing else */
    snprintf(path, sizeof path, "%s", path_of("all_match.safetensors"));
    assert_ok(ebb_model_save(src, path));
    seen.calls = 0;
    assert_ok(ebb_model_load_ex(m, path, &lax));
    assert_int_equal(seen.calls, 0);
    for (int i = 0; i < ebb_model_param_count(m); i++)
        assert_true(same_param(m, src, ebb_model_param_name(m, i)));

    /* more names than the error holds: counted, not cut mid-name; the
     * non-strict report has them all */
    enum { N_EXTRA = 300 };
    const char *many_names[N_EXTRA + 6];
    char many_buf[N_EXTRA][32];
    ebb_tensor *many[N_EXTRA + 6];
    ebb_shape one = EBB_SHAPE(1);
    int n = 0;
    for (int i = 0; i < ebb_model_param_count(src); i++) {
        many_names[n] = ebb_model_param_name(src, i);
        many[n] = ebb_model_param(src, many_names[n]);
        n++;
    }
    ebb_tensor *tiny = NULL;
    assert_ok(ebb_tensor_zeros(&tiny, &one, EBB_FLOAT32, CPU));
    for (int i = 0; i < N_EXTRA; i++) {
        snprintf(many_buf[i], sizeof many_buf[i], "layers.%03d.extra", i);
        many_names[n] = many_buf[i];
        many[n++] = tiny;
    }
    snprintf(path, sizeof path, "%s", path_of("many_extra.safetensors"));
    assert_ok(ebb_safetensors_write(path, many_names, many, n));
    ebb_tensor_free(tiny);
    assert_int_equal(ebb_model_load(m, path), EBB_ERR_ARG);
    assert_errmsg_contains("300 tensors do not match the model (300 unexpected): unexpected "
                           "tensors 'layers.000.extra', 'layers.001.extra'");
    assert_errmsg_contains("more not listed");
    const char *msg = ebb_errmsg();
    const char *tail = strstr(msg, "; and ");
    assert_non_null(tail);
    if (tail[-1] != ')' && tail[-1] != '\'')
        fail_msg("the list was cut inside a name: %s", tail - 40);
    seen.calls = 0;
    assert_ok(ebb_model_load_ex(m, path, &lax));
    assert_int_equal(seen.calls, 1);
    assert_int_equal(seen.r.n_unexpected, N_EXTRA);
    assert_int_equal(seen.r.n_loaded, ebb_model_param_count(m));
    if (!strstr(seen.text, "'layers.299.extra'") || strstr(seen.text, "not listed"))
        fail_msg("the non-strict report does not list every name");

    ebb_model_free(src);
    ebb_model_free(m);
    ebb_model_free(before);
    ebb_plan_free(p);
}

/* ---- write targets ------------------------------------------------------------------ */

typedef struct drain {
    const char *path;
    size_t bytes;
} drain;

static void *drain_fifo(void *arg) {
    drain *d = arg;
    FILE *f = fopen(d->path, "rb");
    char buf[4096];
    size_t n;
    while (f && (n = fread(buf, 1, sizeof buf, f)) > 0)
        d->bytes += n;
    if (f)
        fclose(f);
    return NULL;
}

static double first_value(const char *path, const char *name) {
    ebb_safetensors *st = NULL;
    ebb_tensor *t = NULL;
    double v = -1;
    assert_ok(ebb_safetensors_open(&st, path));
    assert_ok(ebb_safetensors_load(&t, st, name, CPU));
    ebb_tensor *e = NULL;
    assert_ok(ebb_tensor_narrow(&e, t, 0, 0, 1));
    assert_ok(ebb_tensor_item(e, &v));
    ebb_tensor_free(e);
    ebb_tensor_free(t);
    ebb_safetensors_close(st);
    return v;
}

/* Where a write lands, for each kind of thing at the path. */
static void test_write_targets(void **state) {
    (void)state;
    ebb_shape s = EBB_SHAPE(4), sbig = EBB_SHAPE(16384);
    ebb_tensor *a = NULL, *b = NULL, *big = NULL;
    assert_ok(ebb_tensor_full(&a, &s, 1.0, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_full(&b, &s, 2.0, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_full(&big, &sbig, 3.0, EBB_FLOAT32, CPU));
    const char *names[] = {"t"};
    char real[512], link[512], made[512], dangling[512], sub[512], fifo[512];
    snprintf(real, sizeof real, "%s", path_of("real.safetensors"));
    snprintf(link, sizeof link, "%s", path_of("link.safetensors"));
    snprintf(made, sizeof made, "%s", path_of("made.safetensors"));
    snprintf(dangling, sizeof dangling, "%s", path_of("dangling.safetensors"));
    snprintf(sub, sizeof sub, "%s", path_of("sub"));
    snprintf(fifo, sizeof fifo, "%s", path_of("out.fifo"));
    struct stat sb;

    /* a link: the file it points to is replaced, keeping its 0600 mode; the
     * link stays a link */
    assert_ok(ebb_safetensors_write(real, names, &a, 1));
    assert_int_equal(chmod(real, 0600), 0);
    assert_int_equal(symlink("real.safetensors", link), 0);
    assert_ok(ebb_safetensors_write(link, names, &b, 1));
    assert_int_equal(lstat(link, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    assert_int_equal(stat(real, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0600);
    assert_true(first_value(real, "t") == 2.0);
    /* other modes survive too */
    assert_int_equal(chmod(real, 0640), 0);
    assert_ok(ebb_safetensors_write(real, names, &a, 1));
    assert_int_equal(stat(real, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0640);
    /* a dangling link: the file is made where it points */
    assert_int_equal(symlink("made.safetensors", dangling), 0);
    assert_ok(ebb_safetensors_write(dangling, names, &a, 1));
    assert_int_equal(lstat(made, &sb), 0);
    assert_true(S_ISREG(sb.st_mode));
    assert_int_equal(lstat(dangling, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));

    /* a directory is refused, and stays */
    assert_int_equal(mkdir(sub, 0755), 0);
    assert_int_equal(ebb_safetensors_write(sub, names, &a, 1), EBB_ERR_IO);
    assert_errmsg_contains("it is a directory");
    assert_errmsg_contains(sub);
    assert_int_equal(stat(sub, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));

    /* devices are written into: /dev/full fails with its errno and remains a
     * device (a rename would have replaced the node, as root) */
    assert_ok(ebb_safetensors_write("/dev/null", names, &a, 1));
    if (access("/dev/full", W_OK) == 0) {
        assert_int_equal(ebb_safetensors_write("/dev/full", names, &big, 1), EBB_ERR_IO);
        assert_errmsg_contains("'/dev/full'");
        assert_errmsg_contains("No space left on device");
        assert_int_equal(stat("/dev/full", &sb), 0);
        assert_true(S_ISCHR(sb.st_mode));
    } else {
        fprintf(stderr, "skipped /dev/full: not writable here\n");
    }

    /* a FIFO nobody reads is an error at once; one with a reader gets the
     * bytes a file would */
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(20);
    assert_int_equal(ebb_safetensors_write(fifo, names, &a, 1), EBB_ERR_IO);
    assert_errmsg_contains("FIFO that no process is reading");
    drain d = {fifo, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, drain_fifo, &d), 0);
    ebb_status ws = EBB_ERR_IO;
    for (int tries = 0; tries < 2000 && ws != EBB_OK; tries++) { /* until the reader opened it */
        ws = ebb_safetensors_write(fifo, names, &a, 1);
        if (ws != EBB_OK)
            usleep(1000);
    }
    assert_ok(ws);
    pthread_join(th, NULL);
    alarm(0);
    assert_int_equal(stat(real, &sb), 0);
    assert_int_equal(d.bytes, (size_t)sb.st_size);
    unlink(fifo);

    /* a write that fails part-way (a file-size limit, as a full disk would)
     * leaves the old file and no temporary file */
    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    low = old;
    low.rlim_cur = 4096;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &low), 0);
    ebb_status st = ebb_safetensors_write(real, names, &big, 1);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    assert_int_equal(st, EBB_ERR_IO);
    assert_errmsg_contains("File too large");
    assert_true(first_value(real, "t") == 1.0);
    assert_int_equal(count_files(".tmp."), 0);

    unlink(link);
    unlink(dangling);
    unlink(made);
    rmdir(sub);
    ebb_tensor_free(a);
    ebb_tensor_free(b);
    ebb_tensor_free(big);
}

/* A write(2) that fails with nothing written, at the start of a tensor
 * larger than stdio's buffer: here a file-size limit reached exactly where a
 * flush of the buffer ends (stdio's buffer is 8 KiB; a disk that fills
 * there, EIO or a quota do the same). The writer's cookie once returned -1
 * there, which glibc 2.36 takes for a byte count: it then copied from past
 * the end of the tensor's bytes (tests/test_faults.c crashes on it when the
 * next write succeeds). An error, and the old file stays. */
static void test_write_fails_at_a_tensor(void **state) {
    (void)state;
    ebb_shape sbig = EBB_SHAPE(1 << 18);
    ebb_tensor *old = NULL, *big = NULL;
    assert_ok(ebb_tensor_full(&old, &sbig, 1.0, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_full(&big, &sbig, 2.0, EBB_FLOAT32, CPU));
    const char *names[] = {"t"};
    char path[512];
    snprintf(path, sizeof path, "%s", path_of("at_tensor.safetensors"));
    assert_ok(ebb_safetensors_write(path, names, &old, 1));
    size_t n = 0;
    unsigned char *bytes = ebb_test_read_file(path, &n);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | bytes[i];
    free(bytes);
    const rlim_t limits[] = {8 + hlen, 4096, 8192, 16384, 65536};
    for (size_t k = 0; k < sizeof limits / sizeof limits[0]; k++) {
        struct rlimit prev, low;
        assert_int_equal(getrlimit(RLIMIT_FSIZE, &prev), 0);
        low = prev;
        low.rlim_cur = limits[k];
        void (*handler)(int) = signal(SIGXFSZ, SIG_IGN);
        assert_int_equal(setrlimit(RLIMIT_FSIZE, &low), 0);
        ebb_status st = ebb_safetensors_write(path, names, &big, 1);
        assert_int_equal(setrlimit(RLIMIT_FSIZE, &prev), 0);
        signal(SIGXFSZ, handler);
        if (st != EBB_ERR_IO || !strstr(ebb_errmsg(), path) ||
            !strstr(ebb_errmsg(), "File too large"))
            fail_msg("a file-size limit of %llu bytes: %s: %s", (unsigned long long)limits[k],
                     ebb_status_name(st), ebb_errmsg());
        assert_true(first_value(path, "t") == 1.0);
        assert_int_equal(count_files("at_tensor.safetensors.tmp."), 0);
    }
    unlink(path);
    ebb_tensor_free(old);
    ebb_tensor_free(big);
}

/* ---- temporary files left by killed writers (issue 28, item 7) --------------- */

/* A pid that no process has: a child's, once it has been reaped. */
static pid_t dead_pid(void) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(0);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return pid;
}

/* Creates `name` in the test directory with a few bytes, `age` seconds old. */
static void make_old_file(const char *name, int age) {
    FILE *f = fopen(path_of(name), "wb");
    assert_non_null(f);
    fputs("partial", f);
    fclose(f);
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= age;
    ts[1] = ts[0];
    assert_int_equal(utimensat(AT_FDCWD, path_of(name), ts, 0), 0);
}

static int file_exists(const char *name) { return access(path_of(name), F_OK) == 0; }

/* A writer killed in the middle of a write leaves its temporary file; the
 * next write of the same path removes it, and only temporaries of that path
 * whose writer is gone. */
static void test_stale_temporaries(void **state) {
    (void)state;
    ebb_shape s = EBB_SHAPE(4), sbig = EBB_SHAPE(1 << 18);
    ebb_tensor *a = NULL, *big = NULL;
    assert_ok(ebb_tensor_full(&a, &s, 1.0, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_full(&big, &sbig, 3.0, EBB_FLOAT32, CPU));
    const char *names[] = {"t"};
    char path[512];
    snprintf(path, sizeof path, "%s", path_of("ckpt.safetensors"));
    assert_ok(ebb_safetensors_write(path, names, &a, 1));

    /* a child killed by SIGXFSZ half-way through writing 1 MiB */
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit low = {65536, 65536}, core = {0, 0};
        setrlimit(RLIMIT_CORE, &core);
        signal(SIGXFSZ, SIG_DFL);
        setrlimit(RLIMIT_FSIZE, &low);
        ebb_safetensors_write(path, names, &big, 1);
        _exit(3); /* not reached: the signal kills it */
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGXFSZ);
    assert_int_equal(count_files("ckpt.safetensors.tmp."), 1);
    assert_true(first_value(path, "t") == 1.0);
    /* its temporary, made old enough to be stale */
    DIR *dd = opendir(dir);
    assert_non_null(dd);
    char killed[256] = "", killed_path[600];
    struct dirent *e;
    while ((e = readdir(dd)) != NULL)
        if (strstr(e->d_name, "ckpt.safetensors.tmp."))
            snprintf(killed, sizeof killed, "%s", e->d_name);
    closedir(dd);
    char want_prefix[64];
    snprintf(want_prefix, sizeof want_prefix, "ckpt.safetensors.tmp.%d.", (int)pid);
    if (strncmp(killed, want_prefix, strlen(want_prefix)) != 0)
        fail_msg("the temporary file '%s' does not carry its writer's pid (%d)", killed, (int)pid);
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= 60;
    ts[1] = ts[0];
    snprintf(killed_path, sizeof killed_path, "%s", path_of(killed));
    assert_int_equal(utimensat(AT_FDCWD, killed_path, ts, 0), 0);

    /* others that must stay: this process's own (a write in flight on
     * another thread), a live process's, one a live writer holds locked
     * (a writer in another pid namespace, whose pid means nothing here), a
     * fresh one, another target's, and names of another pattern */
    char own[128], live[128], locked[128], fresh[128], other[128];
    pid_t gone = dead_pid();
    snprintf(own, sizeof own, "ckpt.safetensors.tmp.%d.abc123", (int)getpid());
    snprintf(live, sizeof live, "ckpt.safetensors.tmp.%d.abc123", (int)getppid());
    snprintf(locked, sizeof locked, "ckpt.safetensors.tmp.%d.lock01", (int)gone);
    snprintf(fresh, sizeof fresh, "ckpt.safetensors.tmp.%d.new001", (int)gone);
    snprintf(other, sizeof other, "other.safetensors.tmp.%d.abc123", (int)gone);
    const char *keep[] = {own, live, locked, fresh, other, "ckpt.safetensors.tmp.abc123",
                          "ckpt.safetensors.tmp.123.x", "ckpt.safetensors.tmp.123.abcdefg",
                          "xckpt.safetensors.tmp.1.abc123"};
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        make_old_file(keep[i], i == 3 ? 0 : 60);
    int lock_fd = open(path_of(locked), O_RDONLY | O_CLOEXEC);
    assert_true(lock_fd >= 0);
    assert_int_equal(flock(lock_fd, LOCK_EX), 0);

    assert_ok(ebb_safetensors_write(path, names, &a, 1));
    if (file_exists(killed))
        fail_msg("the killed writer's temporary '%s' was not removed", killed);
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        if (!file_exists(keep[i]))
            fail_msg("'%s' was removed, but its writer may be alive or it is not a temporary "
                     "of this path",
                     keep[i]);
    close(lock_fd);
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        unlink(path_of(keep[i]));
    unlink(path);
    ebb_tensor_free(a);
    ebb_tensor_free(big);
}

/* In a child with a mount namespace of its own: a 64 KiB tmpfs that fills
 * up, and a read-only one. Exit codes: 0 passed, 77 cannot mount here,
 * anything else a failure (said on stderr). */
static int full_and_readonly_child(const char *small, const char *ro) {
    if (ebb_test_private_mounts() != 0)
        return 77;
    if (mount("tmpfs", small, "tmpfs", 0, "size=64k") != 0 ||
        mount("tmpfs", ro, "tmpfs", MS_RDONLY, "size=64k") != 0)
        return 77;
    ebb_shape s = EBB_SHAPE(4), sbig = EBB_SHAPE(65536);
    ebb_tensor *a = NULL, *big = NULL;
    if (ebb_tensor_full(&a, &s, 1.0, EBB_FLOAT32, CPU) != EBB_OK ||
        ebb_tensor_full(&big, &sbig, 3.0, EBB_FLOAT32, CPU) != EBB_OK)
        return 2;
    char path[600];
    snprintf(path, sizeof path, "%s/w.safetensors", small);
    const char *names[] = {"t"};
    if (ebb_safetensors_write(path, names, &a, 1) != EBB_OK) {
        fprintf(stderr, "small write failed: %s\n", ebb_errmsg());
        return 3;
    }
    if (ebb_safetensors_write(path, names, &big, 1) != EBB_ERR_IO ||
        !strstr(ebb_errmsg(), "No space left on device")) {
        fprintf(stderr, "a 256 KiB write to a 64 KiB tmpfs said: %s\n", ebb_errmsg());
        return 4;
    }
    ebb_safetensors *st = NULL;
    ebb_tensor *t = NULL;
    int64_t n = -1;
    if (ebb_safetensors_open(&st, path) != EBB_OK ||
        ebb_safetensors_load_ex(&t, st, "t", CPU, &n) != EBB_OK || ebb_tensor_numel(t) != 4) {
        fprintf(stderr, "the old file did not survive: %s\n", ebb_errmsg());
        return 5;
    }
    ebb_tensor_free(t);
    ebb_safetensors_close(st);
    DIR *dd = opendir(small);
    struct dirent *e;
    while (dd && (e = readdir(dd)) != NULL)
        if (strstr(e->d_name, ".tmp.")) {
            fprintf(stderr, "a temporary file was left: %s\n", e->d_name);
            return 6;
        }
    if (dd)
        closedir(dd);
    snprintf(path, sizeof path, "%s/w.safetensors", ro);
    if (ebb_safetensors_write(path, names, &a, 1) != EBB_ERR_IO ||
        !strstr(ebb_errmsg(), "Read-only file system")) {
        fprintf(stderr, "a write to a read-only tmpfs said: %s\n", ebb_errmsg());
        return 7;
    }
    ebb_tensor_free(a);
    ebb_tensor_free(big);
    return 0;
}

static void test_full_and_readonly_filesystems(void **state) {
    (void)state;
    char small[512], ro[512];
    snprintf(small, sizeof small, "%s", path_of("small_fs"));
    snprintf(ro, sizeof ro, "%s", path_of("ro_fs"));
    assert_int_equal(mkdir(small, 0755), 0);
    assert_int_equal(mkdir(ro, 0755), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(full_and_readonly_child(small, ro));
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    rmdir(small);
    rmdir(ro);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) {
        fprintf(stderr, "skipped: this process cannot mount a tmpfs in a mount namespace "
                        "(needs root or CAP_SYS_ADMIN)\n");
        skip();
    }
    if (WEXITSTATUS(status) != 0)
        fail_msg("the full/read-only filesystem child failed with %d (see stderr)",
                 WEXITSTATUS(status));
}

/* ---- datasets (ebb/data.h) ------------------------------------------------ */

/* An IDX file: magic 00 00 TYPE NDIM, big-endian dims, then `data`. gzip
 * when gz is set; `cut` bytes are dropped from the end of what is written. */
static void write_idx(const char *path, int type, int ndim, const uint32_t *dims,
                      const void *data, size_t nbytes, int gz, size_t cut) {
    unsigned char buf[4096];
    size_t n = 0;
    buf[n++] = 0, buf[n++] = 0, buf[n++] = (unsigned char)type, buf[n++] = (unsigned char)ndim;
    for (int d = 0; d < ndim; d++)
        for (int k = 3; k >= 0; k--)
            buf[n++] = (unsigned char)(dims[d] >> (8 * k));
    assert_true(n + nbytes <= sizeof buf);
    memcpy(buf + n, data, nbytes);
    n += nbytes;
    if (gz) {
        unsigned char z[8192];
        uLongf zn = sizeof z;
        z_stream s = {0};
        assert_int_equal(deflateInit2(&s, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
        s.next_in = buf, s.avail_in = (uInt)n, s.next_out = z, s.avail_out = (uInt)zn;
        assert_int_equal(deflate(&s, Z_FINISH), Z_STREAM_END);
        zn = s.total_out;
        deflateEnd(&s);
        assert_true(cut <= zn);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(z, 1, zn - cut, f), zn - cut);
        fclose(f);
        return;
    }
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n - cut, f), n - cut);
    fclose(f);
}

static void test_idx_datasets(void **state) {
    (void)state;
    /* 5 images of 2x3 (uint8, plain), 5 labels (uint8, gzip) */
    unsigned char img[30], lab[5] = {3, 0, 2, 1, 4};
    for (int i = 0; i < 30; i++)
        img[i] = (unsigned char)(i * 8);
    uint32_t idims[3] = {5, 2, 3}, ldims[1] = {5};
    char ip[512], lp[512], desc[1100];
    snprintf(ip, sizeof ip, "%s", path_of("img-idx3-ubyte"));
    snprintf(lp, sizeof lp, "%s", path_of("lab-idx1-ubyte.gz"));
    write_idx(ip, 0x08, 3, idims, img, sizeof img, 0, 0);
    write_idx(lp, 0x08, 1, ldims, lab, sizeof lab, 1, 0);

    ebb_tensor *t = NULL;
    assert_ok(ebb_idx_read(&t, lp));
    ebb_shape sh = ebb_tensor_shape(t);
    assert_int_equal(sh.ndim, 1);
    assert_int_equal(sh.dim[0], 5);
    assert_int_equal(ebb_tensor_dtype(t), EBB_UINT8);
    ebb_tensor_free(t);
    /* int32 big-endian elements become host values */
    int32_t be[2];
    unsigned char raw[8] = {0, 0, 1, 2, 0xff, 0xff, 0xff, 0xfe};
    memcpy(be, raw, sizeof raw);
    uint32_t d2[1] = {2};
    write_idx(path_of("i32.idx"), 0x0C, 1, d2, be, sizeof be, 1, 0);
    assert_ok(ebb_idx_read(&t, path_of("i32.idx")));
    int32_t got32[2];
    assert_ok(ebb_tensor_to_host(t, got32, sizeof got32));
    assert_int_equal(got32[0], 258);
    assert_int_equal(got32[1], -2);
    ebb_tensor_free(t);

    const char *names[2] = {"x", "y"};
    snprintf(desc, sizeof desc, "%s,%s", ip, lp);
    ebb_dataset *d = NULL;
    assert_ok(ebb_dataset_open(&d, desc, names, 2));
    assert_int_equal(ebb_dataset_size(d), 5);
    assert_int_equal(ebb_dataset_field_count(d), 2);
    assert_string_equal(ebb_dataset_field_name(d, 1), "y");
    assert_int_equal(ebb_dataset_field_shape(d, 0).dim[2], 3);
    int64_t idx[2] = {4, 1};
    ebb_tensor *x = NULL, *y = NULL;
    ebb_shape xs = {4, {2, 1, 2, 3}}, ys = {1, {2}};
    assert_ok(ebb_dataset_batch(&x, d, 0, idx, 2, &xs, EBB_FLOAT32, CPU));
    assert_ok(ebb_dataset_batch(&y, d, 1, idx, 2, &ys, EBB_INT64, CPU));
    float xv[12];
    int64_t yv[2];
    assert_ok(ebb_tensor_to_host(x, xv, sizeof xv));
    assert_ok(ebb_tensor_to_host(y, yv, sizeof yv));
    assert_true(xv[0] == (float)(24 * 8 / 255.0) && xv[11] == (float)(11 * 8 / 255.0));
    assert_int_equal(yv[0], 4);
    assert_int_equal(yv[1], 0);
    ebb_tensor_free(x);
    /* normalised, and a shape whose samples do not fit */
    assert_ok(ebb_dataset_set_normalize(d, 0, 0.5, 0.25));
    assert_ok(ebb_dataset_batch(&x, d, 0, idx, 2, &xs, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_to_host(x, xv, sizeof xv));
    assert_true(fabs(xv[0] - (24 * 8 / 255.0 - 0.5) / 0.25) < 1e-6);
    ebb_tensor_free(x);
    ebb_tensor_free(y);
    assert_int_equal(ebb_dataset_set_normalize(d, 0, 0, 0), EBB_ERR_ARG);
    ebb_shape bad = {2, {2, 5}};
    assert_int_equal(ebb_dataset_batch(&x, d, 0, idx, 2, &bad, EBB_FLOAT32, CPU), EBB_ERR_SHAPE);
    assert_null(x);
    assert_ok(ebb_dataset_check_classes(d, 1, 5));
    assert_int_equal(ebb_dataset_check_classes(d, 1, 4), EBB_ERR_ARG);
    assert_errmsg_contains("label 4 of sample 4 is out of range for 4 classes");
    assert_errmsg_contains(lp);
    ebb_dataset_free(d);

    /* every malformed file, each named in its error */
    static const struct {
        int type, ndim, gz;
        size_t cut;
        const char *needle;
    } bad_files[] = {
        {0x07, 3, 0, 0, "bad magic number"},
        {0x08, 0, 0, 0, "bad magic number"},
        {0x08, 3, 0, 1, "truncated: 29 bytes of data where its header declares 30"},
        {0x08, 3, 1, 9, "truncated"},
        {0x08, 3, 0, 30 + 12, "truncated in its header"},
        {0x08, 3, 0, 30 + 14, "shorter than an IDX header"},
    };
    for (size_t c = 0; c < sizeof bad_files / sizeof bad_files[0]; c++) {
        const char *p = path_of("bad.idx");
        write_idx(p, bad_files[c].type, bad_files[c].ndim, idims, img, sizeof img,
                  bad_files[c].gz, bad_files[c].cut);
        t = NULL;
        if (ebb_idx_read(&t, p) != EBB_ERR_IO)
            fail_msg("case %zu: %s", c, ebb_errmsg());
        assert_null(t);
        assert_errmsg_contains(bad_files[c].needle);
        assert_errmsg_contains(p);
    }
    /* more bytes than declared: a wrong element type, say */
    uint32_t fewer[3] = {4, 2, 3};
    write_idx(path_of("long.idx"), 0x08, 3, fewer, img, sizeof img, 0, 0);
    assert_int_equal(ebb_idx_read(&t, path_of("long.idx")), EBB_ERR_IO);
    assert_errmsg_contains("more bytes than its header declares");
    /* counts that differ */
    snprintf(desc, sizeof desc, "%s,%s", path_of("long.idx"), lp);
    write_idx(path_of("long.idx"), 0x08, 3, fewer, img, 24, 0, 0);
    assert_int_equal(ebb_dataset_open(&d, desc, names, 2), EBB_ERR_ARG);
    assert_null(d);
    assert_errmsg_contains("5 labels, but");
    assert_int_equal(ebb_dataset_open(&d, "/nonexistent-dir:test", names, 2), EBB_ERR_IO);
    assert_int_equal(ebb_dataset_open(&d, "/nonexistent.safetensors", names, 2), EBB_ERR_IO);

    /* a safetensors dataset: tensors named like the fields, samples first */
    float fx[6 * 4];
    int64_t fy[6] = {0, 1, 2, 0, 1, 2};
    for (int i = 0; i < 24; i++)
        fx[i] = (float)i;
    ebb_shape fxs = {2, {6, 4}}, fys = {1, {6}}, fy5 = {1, {5}};
    assert_ok(ebb_tensor_from_host(&x, fx, sizeof fx, &fxs, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_from_host(&y, fy, sizeof fy, &fys, EBB_INT64, CPU));
    ebb_tensor *ts[2] = {x, y};
    assert_ok(ebb_safetensors_write(path_of("ds.safetensors"), names, ts, 2));
    ebb_tensor_free(y);
    assert_ok(ebb_dataset_open(&d, path_of("ds.safetensors"), names, 2));
    assert_int_equal(ebb_dataset_size(d), 6);
    int64_t one = 5;
    ebb_shape bs = {1, {1}}, bx = {2, {1, 4}};
    assert_ok(ebb_dataset_batch(&y, d, 1, &one, 1, &bs, EBB_INT64, CPU));
    assert_ok(ebb_tensor_to_host(y, yv, sizeof yv[0]));
    assert_int_equal(yv[0], 2);
    ebb_tensor_free(y);
    assert_ok(ebb_dataset_batch(&y, d, 0, &one, 1, &bx, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_to_host(y, xv, 4 * sizeof xv[0]));
    assert_true(xv[0] == 20.0f && xv[3] == 23.0f); /* floats are not scaled */
    ebb_tensor_free(y);
    ebb_dataset_free(d);
    assert_ok(ebb_tensor_from_host(&y, fy, 5 * sizeof fy[0], &fy5, EBB_INT64, CPU));
    ts[1] = y;
    assert_ok(ebb_safetensors_write(path_of("ds5.safetensors"), names, ts, 2));
    assert_int_equal(ebb_dataset_open(&d, path_of("ds5.safetensors"), names, 2), EBB_ERR_ARG);
    assert_errmsg_contains("tensor 'y' has 5 samples, but 'x' has 6");
    const char *missing[2] = {"x", "labels"};
    assert_int_equal(ebb_dataset_open(&d, path_of("ds5.safetensors"), missing, 2), EBB_ERR_ARG);
    assert_errmsg_contains("no tensor named 'labels'");
    assert_null(d);
    ebb_tensor_free(x);
    ebb_tensor_free(y);

    /* seeded shuffles: a permutation, the same for the same seed */
    int64_t a[100], b[100], seen[100] = {0};
    ebb_dataset_order(a, 100, 7, 1);
    ebb_dataset_order(b, 100, 7, 1);
    assert_memory_equal(a, b, sizeof a);
    for (int i = 0; i < 100; i++)
        seen[a[i]]++;
    for (int i = 0; i < 100; i++)
        assert_int_equal(seen[i], 1);
    ebb_dataset_order(b, 100, 8, 1);
    assert_true(memcmp(a, b, sizeof a) != 0);
    ebb_dataset_order(b, 100, 7, 0);
    for (int i = 0; i < 100; i++)
        assert_int_equal(b[i], i);

    /* Fashion-MNIST's test split, where the Debian package is installed */
    if (access(EBB_FASHION_MNIST_DIR "/t10k-labels-idx1-ubyte.gz", R_OK) == 0) {
        assert_ok(ebb_dataset_open(&d, "fashion-mnist:test", names, 2));
        assert_int_equal(ebb_dataset_size(d), 10000);
        ebb_shape is = ebb_dataset_field_shape(d, 0);
        assert_int_equal(is.ndim, 3);
        assert_int_equal(is.dim[1] * is.dim[2], 784);
        assert_ok(ebb_dataset_check_classes(d, 1, 10));
        ebb_dataset_free(d);
    }
}

/* ---- bounded reading (issue 28, item 5) ------------------------------------ */

/* An IDX file of `nbytes` zero bytes of data after its header, gzip level 1,
 * written in pieces: a small file declaring a large, real payload. */
static void write_zero_idx_gz(const char *path, int type, int ndim, const uint32_t *dims,
                              size_t nbytes) {
    gzFile gz = gzopen(path, "wb1");
    assert_non_null(gz);
    unsigned char head[4 + 4 * 8] = {0, 0, (unsigned char)type, (unsigned char)ndim};
    for (int d = 0; d < ndim; d++)
        for (int k = 3; k >= 0; k--)
            head[4 + 4 * d + (3 - k)] = (unsigned char)(dims[d] >> (8 * k));
    assert_int_equal(gzwrite(gz, head, (unsigned)(4 + 4 * ndim)), 4 + 4 * ndim);
    static unsigned char zeros[1 << 20];
    for (size_t at = 0; at < nbytes; at += sizeof zeros) {
        unsigned n = (unsigned)(nbytes - at < sizeof zeros ? nbytes - at : sizeof zeros);
        assert_int_equal(gzwrite(gz, zeros, n), (int)n);
    }
    assert_int_equal(gzclose(gz), Z_OK);
}

/* In a child whose address space is limited to what it maps now plus 48 MiB:
 * reading an int16 IDX of 16 Mi values (32 MiB in the file, 64 MiB as int32)
 * runs out of memory, and the message gives the whole request. Exit codes:
 * 0 passed, 77 no limit could be set, anything else a failure. */
static int oom_child(const char *path) {
    FILE *f = fopen("/proc/self/statm", "r");
    long long pages = -1;
    if (!f || fscanf(f, "%lld", &pages) != 1)
        return 77;
    fclose(f);
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0)
        return 77;
    rl.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)48 << 20);
    if (setrlimit(RLIMIT_AS, &rl) != 0)
        return 77;
    ebb_tensor *t = NULL;
    ebb_status st = ebb_idx_read(&t, path);
    if (st != EBB_ERR_NOMEM) {
        fprintf(stderr, "reading 64 MiB under a 48 MiB limit: %s: %s\n", ebb_status_name(st),
                ebb_errmsg());
        return 2;
    }
    if (!strstr(ebb_errmsg(), "67108864") || !strstr(ebb_errmsg(), path)) {
        fprintf(stderr, "the message does not give the request (67108864 bytes) and the file: %s\n",
                ebb_errmsg());
        return 3;
    }
    return 0;
}

static void test_idx_bounded(void **state) {
    (void)state;
    const char *names[2] = {"x", "y"};
    char desc[1100], ip[512], lp[512];
    ebb_tensor *t = NULL;
    ebb_dataset *d = NULL;
    unsigned char none[1] = {0};

    /* a gzip header declaring 16 GiB of uint8 (the cap) and holding nothing:
     * refused from its header, before any data is read or allocated */
    uint32_t huge[3] = {16384, 1024, 1024};
    write_idx(path_of("huge.idx.gz"), 0x08, 3, huge, none, 0, 1, 0);
    assert_int_equal(ebb_idx_read(&t, path_of("huge.idx.gz")), EBB_ERR_IO);
    assert_null(t);
    assert_errmsg_contains(path_of("huge.idx.gz"));
    assert_errmsg_contains("17179869184 bytes");
    assert_errmsg_contains("at most");

    /* int16 data are held as int32: 12 GiB in the file is 24 GiB read, over
     * the 16 GiB cap, and the message says so */
    uint32_t wide[2] = {2147483648u, 3};
    write_idx(path_of("wide.idx.gz"), 0x0B, 2, wide, none, 0, 1, 0);
    assert_int_equal(ebb_idx_read(&t, path_of("wide.idx.gz")), EBB_ERR_IO);
    assert_errmsg_contains(path_of("wide.idx.gz"));
    assert_errmsg_contains("25769803776 bytes");
    assert_errmsg_contains("int16");
    /* and int8 as int32 too: 5 GiB of int8 is 20 GiB */
    uint32_t wide8[2] = {1310720, 4096};
    write_idx(path_of("wide8.idx"), 0x09, 2, wide8, none, 0, 0, 0);
    assert_int_equal(ebb_idx_read(&t, path_of("wide8.idx")), EBB_ERR_IO);
    assert_errmsg_contains("21474836480 bytes");

    /* an uncompressed file shorter than its header says is refused from its
     * size, before its data is read */
    uint32_t plain[2] = {1000000, 784};
    write_idx(path_of("short.idx"), 0x08, 2, plain, none, 0, 0, 0);
    assert_int_equal(ebb_idx_read(&t, path_of("short.idx")), EBB_ERR_IO);
    assert_errmsg_contains("truncated: 0 bytes of data where its header declares 784000000");

    /* The expected shapes are checked against the headers before any data
     * is read: these files are truncated, so reading their data would fail
     * with "truncated" instead. */
    unsigned char img[30] = {0}, lab[5] = {0, 1, 2, 3, 4};
    uint32_t idims[3] = {5, 2, 3}, ldims[1] = {5}, ldims4[1] = {4};
    snprintf(ip, sizeof ip, "%s", path_of("cut-images.idx"));
    snprintf(lp, sizeof lp, "%s", path_of("cut-labels.idx.gz"));
    write_idx(ip, 0x08, 3, idims, img, sizeof img, 0, 7);
    write_idx(lp, 0x08, 1, ldims, lab, sizeof lab, 1, 9);
    snprintf(desc, sizeof desc, "%s,%s", ip, lp);
    ebb_shape want[2] = {{2, {64, 7}}, {1, {64}}};
    ebb_dataset_expect ex = {.shapes = want, .n_shapes = 2};
    assert_int_equal(ebb_dataset_open_ex(&d, desc, names, 2, &ex), EBB_ERR_SHAPE);
    assert_null(d);
    assert_errmsg_contains(ip);
    assert_errmsg_contains("'x'");
    assert_errmsg_contains("[5, 2, 3]");
    assert_errmsg_contains("[64, 7]");
    if (strstr(ebb_errmsg(), "truncated"))
        fail_msg("the data was read before the shape was checked: %s", ebb_errmsg());
    /* [B, 1, 2, 3] takes them, and so does [B, 6]; a label per sample */
    want[0] = (ebb_shape){4, {64, 1, 2, 3}};
    want[1] = (ebb_shape){2, {64, 2}};
    assert_int_equal(ebb_dataset_open_ex(&d, desc, names, 2, &ex), EBB_ERR_SHAPE);
    assert_errmsg_contains(lp);
    assert_errmsg_contains("'y'");
    want[1] = (ebb_shape){1, {64}};
    assert_int_equal(ebb_dataset_open_ex(&d, desc, names, 2, &ex), EBB_ERR_IO);
    assert_errmsg_contains("truncated"); /* the shapes fit: now the data is read */
    /* counts that differ are found from the headers too */
    write_idx(lp, 0x08, 1, ldims4, lab, 4, 1, 9);
    assert_int_equal(ebb_dataset_open_ex(&d, desc, names, 2, &ex), EBB_ERR_ARG);
    assert_errmsg_contains("4 labels, but");

    /* a cap on the memory the whole dataset takes, counted before reading */
    write_idx(ip, 0x08, 3, idims, img, sizeof img, 0, 0);
    write_idx(lp, 0x08, 1, ldims, lab, sizeof lab, 1, 0);
    ex.max_bytes = 34;
    assert_int_equal(ebb_dataset_open_ex(&d, desc, names, 2, &ex), EBB_ERR_NOMEM);
    assert_errmsg_contains("35 bytes");
    assert_errmsg_contains("34");
    ex.max_bytes = 35;
    assert_ok(ebb_dataset_open_ex(&d, desc, names, 2, &ex));
    assert_int_equal(ebb_dataset_size(d), 5);
    ebb_dataset_free(d);
    d = NULL;
    /* int16 labels count as int32: 5 labels are 20 bytes */
    int16_t lab16[5] = {0, 0x100, 0x200, 0x300, 0x400}; /* big-endian 0..4 */
    write_idx(lp, 0x0B, 1, ldims, lab16, sizeof lab16, 1, 0);
    assert_int_equal(ebb_dataset_open_ex(&d, desc, names, 2, &ex), EBB_ERR_NOMEM);
    assert_errmsg_contains("50 bytes");
    ex.max_bytes = 50;
    assert_ok(ebb_dataset_open_ex(&d, desc, names, 2, &ex));
    ebb_dataset_free(d);
    d = NULL;

    /* a safetensors dataset: the header's shapes against the expected ones */
    float fx[6 * 4] = {0};
    int64_t fy[6] = {0};
    ebb_shape fxs = {2, {6, 4}}, fys = {1, {6}};
    ebb_tensor *x = NULL, *y = NULL;
    assert_ok(ebb_tensor_from_host(&x, fx, sizeof fx, &fxs, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_from_host(&y, fy, sizeof fy, &fys, EBB_INT64, CPU));
    ebb_tensor *ts[2] = {x, y};
    assert_ok(ebb_safetensors_write(path_of("bounded.safetensors"), names, ts, 2));
    ebb_tensor_free(x);
    ebb_tensor_free(y);
    ebb_shape want_st[2] = {{2, {8, 5}}, {1, {8}}};
    ebb_dataset_expect ex_st = {.shapes = want_st, .n_shapes = 2};
    assert_int_equal(ebb_dataset_open_ex(&d, path_of("bounded.safetensors"), names, 2, &ex_st),
                     EBB_ERR_SHAPE);
    assert_errmsg_contains("bounded.safetensors");
    assert_errmsg_contains("[6, 4]");
    want_st[0] = (ebb_shape){3, {8, 2, 2}};
    ex_st.max_bytes = 143;
    assert_int_equal(ebb_dataset_open_ex(&d, path_of("bounded.safetensors"), names, 2, &ex_st),
                     EBB_ERR_NOMEM);
    assert_errmsg_contains("144 bytes");
    ex_st.max_bytes = 0;
    assert_ok(ebb_dataset_open_ex(&d, path_of("bounded.safetensors"), names, 2, &ex_st));
    ebb_dataset_free(d);
    d = NULL;
    /* a wrong number of expected shapes is the caller's mistake */
    ex_st.n_shapes = 1;
    assert_int_equal(ebb_dataset_open_ex(&d, path_of("bounded.safetensors"), names, 2, &ex_st),
                     EBB_ERR_ARG);

    /* zlib's errors name the file, not the descriptor zlib was given */
    unsigned char many[2000];
    for (size_t i = 0; i < sizeof many; i++)
        many[i] = (unsigned char)(i * 7 + i / 13);
    uint32_t mdims[1] = {sizeof many};
    write_idx(path_of("bad-crc.idx.gz"), 0x08, 1, mdims, many, sizeof many, 1, 0);
    size_t zn = 0;
    unsigned char *z = ebb_test_read_file(path_of("bad-crc.idx.gz"), &zn);
    z[zn - 6] ^= 0xff; /* the CRC-32 in the trailer */
    FILE *f = fopen(path_of("bad-crc.idx.gz"), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(z, 1, zn, f), zn);
    fclose(f);
    free(z);
    assert_int_equal(ebb_idx_read(&t, path_of("bad-crc.idx.gz")), EBB_ERR_IO);
    assert_errmsg_contains(path_of("bad-crc.idx.gz"));
    if (strstr(ebb_errmsg(), "<fd:"))
        fail_msg("zlib's descriptor name is in the message: %s", ebb_errmsg());

    /* the out-of-memory message gives the whole request: 16 Mi int16 values
     * are 64 MiB as int32, not the 32 MiB in the file */
    uint32_t odims[1] = {16u << 20};
    write_zero_idx_gz(path_of("oom.idx.gz"), 0x0B, 1, odims, (size_t)32 << 20);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(oom_child(path_of("oom.idx.gz")));
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    unlink(path_of("oom.idx.gz"));
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) {
        fprintf(stderr, "skipped the out-of-memory case: no address-space limit could be set\n");
        return;
    }
    if (WEXITSTATUS(status) != 0)
        fail_msg("the out-of-memory child failed with %d (see stderr)", WEXITSTATUS(status));
}

/* A model learns Fashion-MNIST: 200 AdamW steps of specs/fashion_mlp.yaml
 * (the spec `make demo` trains) through its training plan, batches of 64
 * read by the IDX reader from 12,800 training images, each seen once. Each
 * batch's loss is taken before the model has trained on it, so the last
 * steps' losses say what the model learned, not what it memorised. The
 * first step's loss is chance's, ln(10) = 2.30; the threshold below sits
 * far under what an untrained or broken step stays at (a model that learns
 * nothing, or only the class frequencies, stays at 2.30), with margin over
 * what a working one reaches: 0.57 here (the test prints it), 0.55 to 0.61
 * for `ebb train --steps 200 --seed 0..4`. */
#define FASHION_STEPS 200
#define FASHION_BATCH 64
#define FASHION_LOSS_BELOW 0.80
static void test_fashion_mnist_learns(void **state) {
    (void)state;
    static const char *const files[] = {EBB_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz",
                                        EBB_FASHION_MNIST_DIR "/train-labels-idx1-ubyte.gz"};
    for (int i = 0; i < 2; i++)
        if (access(files[i], R_OK) != 0)
            fail_msg("%s: %s. Fashion-MNIST comes from the Debian package dataset-fashion-mnist, "
                     "which `make deps` (and so `make test`) installs",
                     files[i], strerror(errno));
    ebb_spec *spec = NULL;
    assert_ok(ebb_spec_load(&spec, EBB_SOURCE_DIR "/specs/fashion_mlp.yaml"));
    const char *names[2] = {"x", "y"};
    ebb_dataset *d = NULL;
    assert_ok(ebb_dataset_open(&d, "fashion-mnist", names, 2));
    assert_int_equal(ebb_dataset_size(d), 60000);
    ebb_shape xs = {2, {FASHION_BATCH, 784}}, ys = {1, {FASHION_BATCH}};
    ebb_optimizer_options oo = ebb_optimizer_defaults(EBB_ADAMW, 1e-3);
    ebb_train_options t = {.target_shapes = &ys, .n_target_shapes = 1, .optimizer = oo};
    ebb_compile_options co = {.input_shapes = &xs, .n_input_shapes = 1, .train = &t};
    ebb_plan *plan = NULL;
    assert_ok(ebb_spec_compile(&plan, spec, &co));
    ebb_model *m = NULL;
    ebb_optimizer *opt = NULL;
    assert_ok(ebb_model_new(&m, plan, CPU, 0));
    assert_ok(ebb_optimizer_new(&opt, m, &oo));
    /* the subset: the first 12,800 of a seeded shuffle of the 60,000 */
    static int64_t order[60000];
    ebb_dataset_order(order, 60000, 1, 1);
    double first = 0, last = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int k = 0; k < FASHION_STEPS; k++) {
        ebb_tensor *x = NULL, *y = NULL;
        const int64_t *idx = order + (int64_t)k * FASHION_BATCH;
        assert_ok(ebb_dataset_batch(&x, d, 0, idx, FASHION_BATCH, &xs, EBB_FLOAT32, CPU));
        assert_ok(ebb_dataset_batch(&y, d, 1, idx, FASHION_BATCH, &ys, EBB_INT64, CPU));
        double loss = 0;
        ebb_status st = ebb_train_step(plan, m, opt, &x, &y, &loss, NULL);
        ebb_tensor_free(x);
        ebb_tensor_free(y);
        if (st != EBB_OK)
            fail_msg("step %d: %s", k + 1, ebb_errmsg());
        if (!isfinite(loss))
            fail_msg("step %d: loss %g", k + 1, loss);
        if (k == 0)
            first = loss;
        if (k >= FASHION_STEPS - 20)
            last += loss / 20;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("Fashion-MNIST, %d steps of %d: loss %.4f at the first step, %.4f over the last 20 "
           "(%.2f s)\n",
           FASHION_STEPS, FASHION_BATCH, first, last,
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    /* it started from chance, so the fall is the training's */
    if (!(fabs(first - log(10.0)) < 0.15))
        fail_msg("the first step's loss is %g, not chance's ln(10) = 2.303", first);
    if (!(last < FASHION_LOSS_BELOW))
        fail_msg("after %d steps the loss is %.4f, not below %.2f", FASHION_STEPS, last,
                 FASHION_LOSS_BELOW);
    ebb_optimizer_free(opt);
    ebb_model_free(m);
    ebb_plan_free(plan);
    ebb_dataset_free(d);
    ebb_spec_free(spec);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        EBB_TEST(test_roundtrip_all_dtypes),
        EBB_TEST(test_exact_bytes),
        EBB_TEST(test_flipped_bits_are_caught),
        EBB_TEST(test_foreign_layout),
        EBB_TEST(test_load_mismatch),
        EBB_TEST(test_unsupported_dtype),
        EBB_TEST(test_write_errors_and_atomicity),
        EBB_TEST(test_malformed_files),
        EBB_TEST(test_every_truncation),
        EBB_TEST(test_mutated_headers),
        EBB_TEST(test_not_regular_files),
        EBB_TEST(test_truncated_while_open),
        EBB_TEST(test_header_bytes),
        EBB_TEST(test_nonfinite_counts),
        EBB_TEST(test_model_load_dtype_and_finite),
        EBB_TEST(test_model_load_lists_every_problem),
        EBB_TEST(test_write_targets),
        EBB_TEST(test_stale_temporaries),
        EBB_TEST(test_write_fails_at_a_tensor),
        EBB_TEST(test_full_and_readonly_filesystems),
        EBB_TEST(test_idx_datasets),
        EBB_TEST(test_idx_bounded),
        EBB_TEST(test_fashion_mnist_learns),
    };
    return cmocka_run_group_tests_name("safetensors", tests, make_dir, remove_dir);
}
