/* safetensors: round trips in every supported dtype, the exact bytes written,
 * atomic replacement, and malformed files refused with clear errors (never a
 * crash), including every truncation of a valid file and mutated headers. */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ebb/safetensors.h"
#include "test_util.h"

static const ebb_device CPU = {EBB_DEVICE_CPU, 0};

static char dir[256];

static int make_dir(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/ebb_test_st_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int remove_dir(void **state) {
    (void)state;
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
    return 0;
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

static unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)len + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return buf;
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

/* The bytes are those of the format: PyTorch reads them. Data starts 8-byte
 * aligned, larger elements first. */
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
    unsigned char *buf = read_all(path, &n);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)buf[i] << (8 * i);
    assert_int_equal((8 + hlen) % 8, 0);
    assert_int_equal(n, 8 + hlen + 24);
    const char *want =
        "{\"__metadata__\":{\"format\":\"pt\"},"
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

    /* the written file is readable by others, as an ordinary file */
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0644, 0644);

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
    unsigned char *buf = read_all(full, &n);
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
    unsigned char *buf = read_all(full, &n);
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
            assert_true(s == EBB_OK || s == EBB_ERR_UNSUPPORTED);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        EBB_TEST(test_roundtrip_all_dtypes),
        EBB_TEST(test_exact_bytes),
        EBB_TEST(test_foreign_layout),
        EBB_TEST(test_load_mismatch),
        EBB_TEST(test_unsupported_dtype),
        EBB_TEST(test_write_errors_and_atomicity),
        EBB_TEST(test_malformed_files),
        EBB_TEST(test_every_truncation),
        EBB_TEST(test_mutated_headers),
    };
    return cmocka_run_group_tests_name("safetensors", tests, make_dir, remove_dir);
}
