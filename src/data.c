/* Datasets (include/ebb/data.h): IDX files through zlib, safetensors files
 * through the reader, both held in host memory as each field's stored
 * dtype; batches are gathered and converted on the host, then copied to the
 * device in one piece. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "edit_distance.h"
#include "ebb/data.h"
#include "ebb/safetensors.h"
#include "fileio.h"

/* An IDX file whose data would take more than this in memory (int8 and
 * int16 held as int32) is refused from its header. */
#define IDX_MAX_BYTES ((uint64_t)EBB_DATASET_MAX_BYTES)
#define IDX_CHUNK ((size_t)1 << 24)
/* deflate's best: 258 bytes from one length code and one distance code */
#define DEFLATE_MAX_RATIO 1032

typedef struct field {
    char *name;
    char *file;
    ebb_dtype dtype;
    ebb_shape shape; /* samples first */
    int64_t sample_numel;
    /* Sample i is the sample_numel elements from i * stride + offset: for
     * stored tensors stride is sample_numel and offset 0; a text file's
     * windows overlap (stride 1) and its targets start one byte on. */
    int64_t stride, offset;
    void *data;
    int borrowed; /* data belongs to another field: a text target reads the input's bytes */
    int text;     /* tokens of a text or token file: batched as integers only */
    int token_bytes; /* text: 1 (bytes); token files: 2 or 4, each a little-endian token */
    int64_t file_at; /* text: the token index in the file of data[0] */
    int normalize;
    double mean, std;
} field;

struct ebb_dataset {
    int64_t n;
    int n_fields;
    field *fields;
};

/* ---- IDX ------------------------------------------------------------------ */

typedef struct idx_data {
    ebb_dtype dtype;
    ebb_shape shape;
    void *data;
    size_t nbytes;
} idx_data;

/* An IDX file whose header has been read, its data not yet. */
typedef struct idx_file {
    const char *path;
    gzFile gz;
    int64_t file_size;
    int type;            /* the magic number's type code */
    const char *stored;  /* the type code's name */
    ebb_dtype dtype;     /* what the data is held as */
    size_t esz, out_esz; /* bytes per element in the file, in memory */
    size_t header;       /* bytes of the header */
    ebb_shape shape;
    uint64_t numel;
    uint64_t file_bytes, bytes; /* the data's bytes in the file, in memory */
} idx_file;

static uint32_t be32(const unsigned char *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}

/* zlib's message without the name it gives a descriptor ("<fd:5>: "): the
 * caller names the file. */
static const char *gz_message(gzFile gz, int *err) {
    const char *msg = gzerror(gz, err);
    if (msg && !strncmp(msg, "<fd:", 4)) {
        const char *rest = strstr(msg, ">: ");
        if (rest)
            msg = rest + 3;
    }
    return msg && *msg ? msg : "unknown zlib error";
}

/* Reads up to `len` bytes; returns how many, or -1 with *msg set. */
static int64_t gz_read_all(gzFile gz, void *buf, size_t len, const char **msg) {
    size_t at = 0;
    while (at < len) {
        size_t want = len - at > IDX_CHUNK ? IDX_CHUNK : len - at;
        int got = gzread(gz, (char *)buf + at, (unsigned)want);
        if (got < 0) {
            int err = 0;
            *msg = gz_message(gz, &err);
            if (err == Z_BUF_ERROR) /* a gzip stream cut short */
                *msg = "truncated: the gzip stream ends early";
            return -1;
        }
        if (got == 0)
            break;
        at += (size_t)got;
    }
    return (int64_t)at;
}

static void idx_close(idx_file *f) {
    if (f->gz)
        gzclose(f->gz);
    f->gz = NULL;
}

/* Opens an IDX file and reads its header: the element type, the shape, and
 * what its data will take, refused over IDX_MAX_BYTES. Nothing else is read
 * or allocated; on failure nothing stays open. */
static ebb_status idx_open(idx_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->path = path;
    int fd = -1;
    ebb_status st = ebb_file_open_read(&fd, &f->file_size, path, path);
    if (st != EBB_OK)
        return st;
    f->gz = gzdopen(fd, "rb");
    if (!f->gz) {
        close(fd);
        return ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory opening the file", path);
    }
    gzbuffer(f->gz, 1 << 17);
    unsigned char head[4 + 4 * 255];
    const char *zmsg = NULL;
    int64_t got = gz_read_all(f->gz, head, 4, &zmsg);
    if (got < 0) {
        st = ebb_error_set(EBB_ERR_IO, "%s: cannot read: %s", path, zmsg);
        goto fail;
    }
    if (got < 4) {
        st = ebb_error_set(EBB_ERR_IO, "%s: truncated: %lld bytes, shorter than an IDX header",
                           path, (long long)got);
        goto fail;
    }
    f->type = head[2];
    switch (head[2]) {
    case 0x08: f->dtype = EBB_UINT8, f->esz = 1, f->out_esz = 1, f->stored = "uint8"; break;
    case 0x09: f->dtype = EBB_INT32, f->esz = 1, f->out_esz = 4, f->stored = "int8"; break;
    case 0x0B: f->dtype = EBB_INT32, f->esz = 2, f->out_esz = 4, f->stored = "int16"; break;
    case 0x0C: f->dtype = EBB_INT32, f->esz = 4, f->out_esz = 4, f->stored = "int32"; break;
    case 0x0D: f->dtype = EBB_FLOAT32, f->esz = 4, f->out_esz = 4, f->stored = "float32"; break;
    case 0x0E: f->dtype = EBB_FLOAT64, f->esz = 8, f->out_esz = 8, f->stored = "float64"; break;
    default: f->esz = 0; break;
    }
    if (head[0] != 0 || head[1] != 0 || f->esz == 0 || head[3] == 0) {
        st = ebb_error_set(EBB_ERR_IO,
                           "%s: bad magic number 0x%02x%02x%02x%02x: not an IDX file (expected "
                           "00 00, a type code 08, 09, 0b, 0c, 0d or 0e, and a dimension count)",
                           path, head[0], head[1], head[2], head[3]);
        goto fail;
    }
    int ndim = head[3];
    if (ndim > EBB_MAX_DIMS) {
        st = ebb_error_set(EBB_ERR_IO, "%s: %d dimensions (ebb's limit is %d)", path, ndim,
                           EBB_MAX_DIMS);
        goto fail;
    }
    got = gz_read_all(f->gz, head + 4, 4 * (size_t)ndim, &zmsg);
    if (got < 0) {
        st = ebb_error_set(EBB_ERR_IO, "%s: cannot read: %s", path, zmsg);
        goto fail;
    }
    if (got < 4 * ndim) {
        st = ebb_error_set(EBB_ERR_IO, "%s: truncated in its header (%d dimensions declared)",
                           path, ndim);
        goto fail;
    }
    f->header = 4 + 4 * (size_t)ndim;
    f->shape.ndim = ndim;
    for (int d = 0; d < ndim; d++)
        f->shape.dim[d] = be32(head + 4 + 4 * d);
    f->numel = 1;
    for (int d = 0; d < ndim; d++) {
        f->numel *= (uint64_t)f->shape.dim[d];
        if (f->numel > IDX_MAX_BYTES) { /* before the product can overflow */
            char sb[128];
            st = ebb_error_set(EBB_ERR_IO,
                               "%s: declares %s %s, more than %llu elements: more than ebb reads",
                               path, f->stored, ebb_shape_str(&f->shape, sb, sizeof sb),
                               (unsigned long long)IDX_MAX_BYTES);
            goto fail;
        }
    }
    f->file_bytes = f->numel * f->esz;
    f->bytes = f->numel * f->out_esz;
    if (f->bytes > IDX_MAX_BYTES) {
        char sb[128];
        st = ebb_error_set(EBB_ERR_IO,
                           "%s: declares %s %s: %llu bytes of data%s%llu bytes, more than ebb "
                           "reads (%llu bytes)",
                           path, f->stored, ebb_shape_str(&f->shape, sb, sizeof sb),
                           (unsigned long long)f->file_bytes,
                           f->esz != f->out_esz ? ", held as int32 in " : ", ",
                           (unsigned long long)f->bytes, (unsigned long long)IDX_MAX_BYTES);
        goto fail;
    }
    return EBB_OK;
fail:
    idx_close(f);
    return st;
}

/* Whether the file can hold what its header declares, from its size alone:
 * exactly, for an uncompressed file; within deflate's best ratio for a
 * gzip one. */
static ebb_status idx_check_size(const idx_file *f) {
    uint64_t size = f->file_size > 0 ? (uint64_t)f->file_size : 0;
    if (gzdirect(f->gz)) {
        uint64_t have = size > f->header ? size - f->header : 0;
        if (have < f->file_bytes)
            return ebb_error_set(EBB_ERR_IO,
                                 "%s: truncated: %llu bytes of data where its header declares %llu",
                                 f->path, (unsigned long long)have,
                                 (unsigned long long)f->file_bytes);
        if (have > f->file_bytes)
            return ebb_error_set(EBB_ERR_IO,
                                 "%s: more bytes than its header declares (%llu): not an IDX "
                                 "file of that shape",
                                 f->path, (unsigned long long)f->file_bytes);
        return EBB_OK;
    }
    if (size <= (UINT64_MAX - 1) / DEFLATE_MAX_RATIO &&
        f->header + f->file_bytes > size * DEFLATE_MAX_RATIO)
        return ebb_error_set(EBB_ERR_IO,
                             "%s: declares %llu bytes of data, but a gzip file of %llu bytes "
                             "holds at most %llu (deflate compresses %d:1 at best): truncated or "
                             "not an IDX file of that shape",
                             f->path, (unsigned long long)f->file_bytes, (unsigned long long)size,
                             (unsigned long long)(size * DEFLATE_MAX_RATIO), DEFLATE_MAX_RATIO);
    return EBB_OK;
}

/* Reads the data of an opened IDX file and closes it. The buffer grows as
 * bytes arrive, so a file shorter than its header says costs what it holds. */
static ebb_status idx_read_data(idx_file *f, idx_data *out) {
    memset(out, 0, sizeof *out);
    const char *path = f->path, *zmsg = NULL;
    void *data = NULL;
    ebb_status st = idx_check_size(f);
    if (st != EBB_OK)
        goto fail;
    uint64_t want = f->file_bytes;
    size_t esz = f->esz, widen = f->out_esz / f->esz;
    size_t cap = want < IDX_CHUNK ? (size_t)want : IDX_CHUNK, have = 0;
    data = malloc(cap ? cap * widen : 1);
    int64_t got = 0;
    while (data && have < want) {
        if (have == cap) {
            size_t ncap = cap * 2 > want ? (size_t)want : cap * 2;
            void *more = realloc(data, ncap * widen);
            if (!more)
                break;
            data = more;
            cap = ncap;
        }
        got = gz_read_all(f->gz, (char *)data + have, cap - have, &zmsg);
        if (got < 0) {
            st = ebb_error_set(EBB_ERR_IO, "%s: cannot read: %s", path, zmsg);
            goto fail;
        }
        have += (size_t)got;
        if (have < cap)
            break;
    }
    if (!data || (have == cap && have < want)) { /* a malloc or realloc failed */
        char human[32];
        st = ebb_error_set(EBB_ERR_NOMEM,
                           "%s: out of memory reading %llu bytes (%s: %llu %s values%s)", path,
                           (unsigned long long)f->bytes,
                           ebb_bytes_str((int64_t)f->bytes, human, sizeof human),
                           (unsigned long long)f->numel, f->stored,
                           widen > 1 ? " held as int32" : "");
        goto fail;
    }
    if (have < want) {
        st = ebb_error_set(EBB_ERR_IO,
                           "%s: truncated: %llu bytes of data where its header declares %llu",
                           path, (unsigned long long)have, (unsigned long long)want);
        goto fail;
    }
    unsigned char extra;
    got = gz_read_all(f->gz, &extra, 1, &zmsg);
    if (got != 0) {
        st = got < 0 ? ebb_error_set(EBB_ERR_IO, "%s: cannot read: %s", path, zmsg)
                     : ebb_error_set(EBB_ERR_IO,
                                     "%s: more bytes than its header declares (%llu): not an IDX "
                                     "file of that shape",
                                     path, (unsigned long long)want);
        goto fail;
    }
    int zr = gzclose(f->gz);
    f->gz = NULL;
    if (zr == Z_BUF_ERROR) { /* the data is all there, the gzip trailer is not */
        st = ebb_error_set(EBB_ERR_IO, "%s: truncated: the gzip stream ends early", path);
        goto fail;
    }
    /* big-endian elements to host values, widened where ebb has no dtype;
     * backwards so that a widening conversion is done in place */
    unsigned char *b = data;
    uint64_t numel = f->numel;
    for (uint64_t k = numel; k-- > 0 && esz > 1;) {
        const unsigned char *e = b + k * esz;
        if (esz == 2) {
            int32_t v = (int16_t)(uint16_t)((unsigned)e[0] << 8 | e[1]);
            memcpy(b + k * 4, &v, 4);
        } else if (esz == 4) {
            uint32_t u = be32(e);
            memcpy(b + k * 4, &u, 4);
        } else {
            uint64_t u = (uint64_t)be32(e) << 32 | be32(e + 4);
            memcpy(b + k * 8, &u, 8);
        }
    }
    if (f->type == 0x09)
        for (uint64_t k = numel; k-- > 0;) {
            int32_t v = (int8_t)b[k];
            memcpy(b + k * 4, &v, 4);
        }
    out->dtype = f->dtype;
    out->shape = f->shape;
    out->data = data;
    out->nbytes = (size_t)f->bytes;
    return EBB_OK;
fail:
    free(data);
    idx_close(f);
    return st;
}

static ebb_status idx_read_host(idx_data *out, const char *path) {
    idx_file f;
    ebb_status st = idx_open(&f, path);
    return st == EBB_OK ? idx_read_data(&f, out) : st;
}

ebb_status ebb_idx_read(ebb_tensor **out, const char *path) {
    if (!out || !path)
        return ebb_error_set(EBB_ERR_ARG, "ebb_idx_read: NULL argument");
    *out = NULL;
    idx_data d;
    ebb_status st = idx_read_host(&d, path);
    if (st != EBB_OK)
        return st;
    st = ebb_tensor_from_host(out, d.data, d.nbytes, &d.shape, d.dtype, ebb_device_cpu());
    free(d.data);
    return st;
}

/* ---- datasets ------------------------------------------------------------- */

void ebb_dataset_free(ebb_dataset *d) {
    if (!d)
        return;
    for (int i = 0; i < d->n_fields; i++) {
        free(d->fields[i].name);
        free(d->fields[i].file);
        if (!d->fields[i].borrowed)
            free(d->fields[i].data);
    }
    free(d->fields);
    free(d);
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *c = malloc(n);
    if (c)
        memcpy(c, s, n);
    return c;
}

static ebb_status new_dataset(ebb_dataset **out, int n_fields) {
    ebb_dataset *d = calloc(1, sizeof *d);
    field *f = calloc((size_t)n_fields, sizeof *f);
    if (!d || !f) {
        free(d);
        free(f);
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    }
    d->fields = f;
    d->n_fields = n_fields;
    *out = d;
    return EBB_OK;
}

/* Fills field i; takes `data` (freed on failure too). */
static ebb_status set_field(ebb_dataset *d, int i, const char *name, const char *file,
                            ebb_dtype dtype, const ebb_shape *shape, void *data) {
    field *f = &d->fields[i];
    f->name = dup_str(name);
    f->file = dup_str(file);
    f->data = data;
    f->dtype = dtype;
    f->shape = *shape;
    f->sample_numel = 1;
    for (int k = 1; k < shape->ndim; k++)
        f->sample_numel *= shape->dim[k];
    f->stride = f->sample_numel;
    f->offset = 0;
    if (!f->name || !f->file)
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    return EBB_OK;
}

/* Field i's stored shape (samples first) against the shape a caller expects
 * its batches in (expect->shapes[i], ndim 0: anything): the elements of a
 * sample must agree, as ebb_dataset_batch() requires. */
static ebb_status check_expected(const ebb_dataset_expect *expect, int i, const char *file,
                                 const char *name, const ebb_shape *stored) {
    if (!expect || !expect->shapes || expect->shapes[i].ndim == 0)
        return EBB_OK;
    const ebb_shape *want = &expect->shapes[i];
    int64_t per = 1, have = 1;
    for (int k = 1; k < want->ndim; k++)
        per *= want->dim[k];
    for (int k = 1; k < stored->ndim; k++)
        have *= stored->dim[k];
    if (per == have && want->ndim >= 1)
        return EBB_OK;
    char a[128], b[128];
    return ebb_error_set(EBB_ERR_SHAPE,
                         "%s: '%s' is %s, samples of %lld elements, which do not fit the "
                         "expected %s (%lld elements a sample); nothing was read",
                         file, name, ebb_shape_str(stored, a, sizeof a), (long long)have,
                         ebb_shape_str(want, b, sizeof b), (long long)per);
}

static ebb_status check_expect_args(const ebb_dataset_expect *expect, int n, const char *fn) {
    if (!expect)
        return EBB_OK;
    if (expect->shapes && expect->n_shapes != n)
        return ebb_error_set(EBB_ERR_ARG, "%s: %d expected shapes for %d fields", fn,
                             expect->n_shapes, n);
    if (expect->max_bytes < 0)
        return ebb_error_set(EBB_ERR_ARG, "%s: max_bytes is %lld", fn,
                             (long long)expect->max_bytes);
    return EBB_OK;
}

/* The fields' bytes in memory, counted from the headers, against
 * expect->max_bytes. */
static ebb_status check_total(const ebb_dataset_expect *expect, const char *desc, uint64_t total,
                              const char *const *names, const uint64_t *bytes, int n) {
    if (!expect || expect->max_bytes == 0 || total <= (uint64_t)expect->max_bytes)
        return EBB_OK;
    char parts[512] = "", h[32], m[32];
    size_t at = 0;
    for (int i = 0; i < n && at < sizeof parts; i++) {
        int w = snprintf(parts + at, sizeof parts - at, "%s'%s' %llu", i ? ", " : "", names[i],
                         (unsigned long long)bytes[i]);
        if (w < 0)
            break;
        at += (size_t)w;
    }
    return ebb_error_set(EBB_ERR_NOMEM,
                         "dataset '%s': its fields take %llu bytes in memory (%s; %s), more than "
                         "the %lld bytes (%s) it may take; nothing was read",
                         desc, (unsigned long long)total, ebb_bytes_str((int64_t)total, h, sizeof h),
                         parts, (long long)expect->max_bytes,
                         ebb_bytes_str(expect->max_bytes, m, sizeof m));
}

/* Both headers are read and checked before either file's data. */
static ebb_status open_idx(ebb_dataset **out, const char *images, const char *labels,
                           const char *const names[2], const char *desc,
                           const ebb_dataset_expect *expect) {
    idx_file fi, fl;
    idx_data im = {0}, lb = {0};
    ebb_status st = idx_open(&fi, images);
    if (st != EBB_OK)
        return st;
    if ((st = check_expected(expect, 0, images, names[0], &fi.shape)) != EBB_OK ||
        (st = idx_open(&fl, labels)) != EBB_OK) {
        idx_close(&fi);
        return st;
    }
    if (fl.shape.ndim != 1)
        st = ebb_error_set(EBB_ERR_ARG, "%s: labels have %d dimensions; expected one value per "
                           "sample (1 dimension)", labels, fl.shape.ndim);
    else if (fl.shape.dim[0] != fi.shape.dim[0])
        st = ebb_error_set(EBB_ERR_ARG, "%s: %lld labels, but %s has %lld images", labels,
                           (long long)fl.shape.dim[0], images, (long long)fi.shape.dim[0]);
    if (st == EBB_OK)
        st = check_expected(expect, 1, labels, names[1], &fl.shape);
    if (st == EBB_OK) {
        uint64_t bytes[2] = {fi.bytes, fl.bytes};
        st = check_total(expect, desc, fi.bytes + fl.bytes, names, bytes, 2);
    }
    if (st == EBB_OK && (st = idx_read_data(&fi, &im)) == EBB_OK)
        st = idx_read_data(&fl, &lb);
    idx_close(&fi);
    idx_close(&fl);
    ebb_dataset *d = NULL;
    if (st == EBB_OK && (st = new_dataset(&d, 2)) == EBB_OK) {
        d->n = im.shape.dim[0];
        st = set_field(d, 0, names[0], images, im.dtype, &im.shape, im.data);
        ebb_status st2 = set_field(d, 1, names[1], labels, lb.dtype, &lb.shape, lb.data);
        im.data = lb.data = NULL; /* the dataset's now */
        if (st == EBB_OK)
            st = st2;
    }
    free(im.data);
    free(lb.data);
    if (st != EBB_OK) {
        ebb_dataset_free(d);
        return st;
    }
    *out = d;
    return EBB_OK;
}

ebb_status ebb_dataset_open_idx(ebb_dataset **out, const char *images, const char *labels,
                                const char *const names[2]) {
    if (!out || !images || !labels || !names || !names[0] || !names[1])
        return ebb_error_set(EBB_ERR_ARG, "ebb_dataset_open_idx: NULL argument");
    *out = NULL;
    return open_idx(out, images, labels, names, images, NULL);
}

/* Every field's header is checked before any tensor is read. */
static ebb_status open_safetensors(ebb_dataset **out, const char *path, const char *const *names,
                                   int n, const ebb_dataset_expect *expect) {
    ebb_safetensors *sf = NULL;
    ebb_status st = ebb_safetensors_open(&sf, path);
    if (st != EBB_OK)
        return st;
    uint64_t *bytes = calloc((size_t)n, sizeof *bytes), total = 0;
    if (!bytes) {
        ebb_safetensors_close(sf);
        return ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", path);
    }
    int64_t samples = 0;
    for (int i = 0; i < n && st == EBB_OK; i++) {
        ebb_dtype dt;
        ebb_shape sh;
        const char *dstr = ebb_safetensors_dtype_str(sf, names[i]);
        if (!dstr) {
            st = ebb_error_set(EBB_ERR_ARG, "%s: no tensor named '%s' (the dataset's %s)", path,
                               names[i], i == 0 ? "first field" : "fields");
            break;
        }
        if (ebb_safetensors_find(sf, names[i], &dt, &sh) != EBB_OK || dt == EBB_BOOL) {
            st = ebb_error_set(EBB_ERR_ARG, "%s: tensor '%s' has dtype %s, which a dataset does "
                               "not take", path, names[i], dstr);
            break;
        }
        if (sh.ndim < 1) {
            st = ebb_error_set(EBB_ERR_ARG, "%s: tensor '%s' is a scalar; a dataset's tensors "
                               "have the samples as their first dimension", path, names[i]);
            break;
        }
        if (i > 0 && sh.dim[0] != samples) {
            st = ebb_error_set(EBB_ERR_ARG, "%s: tensor '%s' has %lld samples, but '%s' has %lld",
                               path, names[i], (long long)sh.dim[0], names[0], (long long)samples);
            break;
        }
        samples = sh.dim[0];
        st = check_expected(expect, i, path, names[i], &sh);
        /* float16 and bfloat16 are held as float32 */
        size_t esz = dt == EBB_FLOAT16 || dt == EBB_BFLOAT16 ? 4 : ebb_dtype_size(dt);
        bytes[i] = (uint64_t)ebb_shape_numel(&sh) * esz;
        total += bytes[i];
    }
    if (st == EBB_OK)
        st = check_total(expect, path, total, names, bytes, n);
    free(bytes);
    ebb_dataset *d = NULL;
    if (st == EBB_OK && (st = new_dataset(&d, n)) == EBB_OK)
        d->n = samples;
    for (int i = 0; i < n && st == EBB_OK; i++) {
        ebb_dtype dt;
        ebb_shape sh;
        ebb_safetensors_find(sf, names[i], &dt, &sh);
        ebb_tensor *t = NULL, *c = NULL;
        if ((st = ebb_safetensors_load(&t, sf, names[i], ebb_device_cpu())) != EBB_OK)
            break;
        if (dt == EBB_FLOAT16 || dt == EBB_BFLOAT16) {
            st = ebb_tensor_cast(&c, t, EBB_FLOAT32);
            ebb_tensor_free(t);
            t = c;
            dt = EBB_FLOAT32;
            if (st != EBB_OK)
                break;
        }
        size_t nb = ebb_tensor_nbytes(t);
        void *buf = malloc(nb ? nb : 1);
        if (!buf)
            st = ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory for '%s' (%zu bytes)", path,
                               names[i], nb);
        else
            st = ebb_tensor_to_host(t, buf, nb);
        ebb_tensor_free(t);
        if (st != EBB_OK) {
            free(buf);
            break;
        }
        st = set_field(d, i, names[i], path, dt, &sh, buf);
    }
    ebb_safetensors_close(sf);
    if (st != EBB_OK) {
        ebb_dataset_free(d);
        return st;
    }
    *out = d;
    return EBB_OK;
}

ebb_status ebb_dataset_open_safetensors(ebb_dataset **out, const char *path,
                                        const char *const *names, int n) {
    if (!out || !path || (!names && n > 0) || n < 1)
        return ebb_error_set(EBB_ERR_ARG, "ebb_dataset_open_safetensors: NULL argument or no "
                                          "names");
    *out = NULL;
    return open_safetensors(out, path, names, n, NULL);
}

/* ---- text ------------------------------------------------------------------ */

static const char *split_name(ebb_text_split split) {
    return split == EBB_TEXT_TEST ? "the test split (its last 10%)"
           : split == EBB_TEXT_ALL ? "the whole file"
                                   : "the training split (its first 90%)";
}

/* Reads bytes [at, at + len) of an open file into a new buffer. */
static ebb_status read_range(int fd, const char *path, int64_t at, int64_t len, uint8_t **out) {
    uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
    if (!buf) {
        char h[32];
        return ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory reading %lld bytes (%s)", path,
                             (long long)len, ebb_bytes_str(len, h, sizeof h));
    }
    int64_t have = 0;
    while (have < len) {
        size_t want = len - have > (int64_t)IDX_CHUNK ? IDX_CHUNK : (size_t)(len - have);
        ssize_t got = pread(fd, buf + have, want, (off_t)(at + have));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            ebb_status st =
                got < 0 ? ebb_error_set(EBB_ERR_IO, "%s: cannot read: %s", path, strerror(errno))
                        : ebb_error_set(EBB_ERR_IO,
                                        "%s: truncated while reading: %lld bytes where its size "
                                        "said %lld",
                                        path, (long long)(at + have), (long long)(at + len));
            free(buf);
            return st;
        }
        have += got;
    }
    *out = buf;
    return EBB_OK;
}

static ebb_status widen_tokens(uint8_t **buf, int64_t n, int width, const char *path, int64_t at);

/* A file's tokens as two fields of [windows, block] tokens: the input and
 * the same shifted by one token, the target. `width` is the bytes of a
 * token: 1, a text file's bytes; 2 or 4, little-endian unsigned integers
 * (nanoGPT's prepare.py writes uint16), held as int32. Only the split's
 * tokens are read, and only after their size is checked against max_bytes
 * and against one window. A text file (width 1) whose first 4 KiB hold a
 * NUL byte is refused: that is no text, and a token file read as text
 * would train on the bytes of its numbers. */
static ebb_status open_tokens(ebb_dataset **out, const char *path, const char *const *names,
                              int n, int64_t block, ebb_text_split split, const char *desc,
                              int64_t max_bytes, int width) {
    if (n != 2)
        return ebb_error_set(EBB_ERR_ARG,
                             "dataset '%s': text data has two fields (the tokens, and the same "
                             "shifted by one byte: an input and a target), but %d are wanted",
                             desc, n);
    if (block < 1 || block > EBB_DATASET_MAX_BYTES)
        return ebb_error_set(EBB_ERR_ARG,
                             "dataset '%s': a window of %lld bytes; it takes 1 or more", desc,
                             (long long)block);
    int fd = -1;
    int64_t file_size = 0;
    ebb_status st = ebb_file_open_read(&fd, &file_size, path, desc);
    if (st != EBB_OK)
        return st;
    if (file_size % width) {
        close(fd);
        return ebb_error_set(EBB_ERR_ARG,
                             "dataset '%s': %s is %lld bytes, not a whole number of %d-byte "
                             "tokens (uint%d)",
                             desc, path, (long long)file_size, width, 8 * width);
    }
    if (width == 1) {
        uint8_t head[4096];
        ssize_t got = pread(fd, head, sizeof head, 0);
        const uint8_t *nul = got > 0 ? memchr(head, 0, (size_t)got) : NULL;
        if (nul) {
            close(fd);
            return ebb_error_set(EBB_ERR_ARG,
                                 "dataset '%s': %s holds a NUL byte at offset %lld, so it is not "
                                 "text; a file of tokens (nanoGPT's prepare.py writes uint16) is "
                                 "read by tokens:%s",
                                 desc, path, (long long)(nul - head), path);
        }
    }
    int64_t size = file_size / width;
    int64_t test = size / 10, at = split == EBB_TEXT_TEST ? size - test : 0;
    int64_t len = split == EBB_TEXT_TEST ? test : split == EBB_TEXT_TRAIN ? size - test : size;
    int64_t limit = max_bytes > 0 && max_bytes < EBB_DATASET_MAX_BYTES ? max_bytes
                                                                       : EBB_DATASET_MAX_BYTES;
    char h[32], l[32];
    const char *unit = width == 1 ? "bytes" : "tokens", *one = width == 1 ? "byte" : "token";
    int64_t held = len * (width == 1 ? 1 : 4); /* as held: bytes, or int32 tokens */
    if (held > limit)
        st = ebb_error_set(EBB_ERR_NOMEM,
                           "dataset '%s': %s is %lld %s (%s held), more than the %lld bytes (%s) "
                           "it may take; nothing was read",
                           desc, split_name(split), (long long)len, unit,
                           ebb_bytes_str(held, h, sizeof h), (long long)limit,
                           ebb_bytes_str(limit, l, sizeof l));
    else if (len < block + 1)
        st = ebb_error_set(EBB_ERR_ARG,
                           "dataset '%s': %s is %lld %s (of %lld), shorter than one window of "
                           "%lld %s and the %s after it",
                           desc, split_name(split), (long long)len, unit, (long long)size,
                           (long long)block, unit, one);
    uint8_t *bytes = NULL;
    if (st == EBB_OK)
        st = read_range(fd, path, at * width, len * width, &bytes);
    close(fd);
    if (st == EBB_OK && width > 1)
        st = widen_tokens(&bytes, len, width, path, at);
    if (st != EBB_OK)
        return st;
    /* training windows start at every byte; the test split's follow each
     * other, so that evaluation predicts each held-out byte once */
    int64_t stride = split == EBB_TEXT_TEST ? block : 1;
    int64_t windows = split == EBB_TEXT_TEST ? (len - 1) / block : len - block;
    ebb_dataset *d = NULL;
    if ((st = new_dataset(&d, 2)) != EBB_OK) {
        free(bytes);
        return st;
    }
    d->n = windows;
    ebb_shape sh = {2, {windows, block}};
    d->fields[1].borrowed = 1; /* the target reads the input's bytes */
    ebb_dtype held_as = width == 1 ? EBB_UINT8 : EBB_INT32;
    st = set_field(d, 0, names[0], path, held_as, &sh, bytes);
    if (st == EBB_OK)
        st = set_field(d, 1, names[1], path, held_as, &sh, bytes);
    for (int i = 0; i < 2; i++) {
        d->fields[i].stride = stride;
        d->fields[i].offset = i;
        d->fields[i].text = 1;
        d->fields[i].token_bytes = width;
        d->fields[i].file_at = at;
    }
    if (st != EBB_OK) {
        ebb_dataset_free(d);
        return st;
    }
    *out = d;
    return EBB_OK;
}

/* Little-endian uint16 or uint32 tokens, n of them, into int32 in place of
 * the buffer (a uint32 token must fit: 2^31 - 1 at most). */
static ebb_status widen_tokens(uint8_t **buf, int64_t n, int width, const char *path, int64_t at) {
    int32_t *t = malloc(n > 0 ? (size_t)n * sizeof *t : 1);
    if (!t) {
        free(*buf);
        *buf = NULL;
        return ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory for %lld tokens", path,
                             (long long)n);
    }
    const uint8_t *b = *buf;
    for (int64_t k = 0; k < n; k++) {
        const uint8_t *p = b + k * width;
        uint32_t v = width == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8
                                : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                                      (uint32_t)p[3] << 24;
        if (v > INT32_MAX) {
            free(t);
            free(*buf);
            *buf = NULL;
            return ebb_error_set(EBB_ERR_ARG, "%s: token %lld is %u, past the 2^31 - 1 a token "
                                 "id may be", path, (long long)(at + k), v);
        }
        t[k] = (int32_t)v;
    }
    free(*buf);
    *buf = (uint8_t *)t;
    return EBB_OK;
}

static ebb_status open_text(ebb_dataset **out, const char *path, const char *const *names, int n,
                            int64_t block, ebb_text_split split, const char *desc,
                            int64_t max_bytes) {
    return open_tokens(out, path, names, n, block, split, desc, max_bytes, 1);
}

ebb_status ebb_dataset_open_text(ebb_dataset **out, const char *path, const char *const names[2],
                                 int64_t block, ebb_text_split split) {
    if (!out || !path || !names || !names[0] || !names[1])
        return ebb_error_set(EBB_ERR_ARG, "ebb_dataset_open_text: NULL argument");
    *out = NULL;
    if (split != EBB_TEXT_TRAIN && split != EBB_TEXT_TEST && split != EBB_TEXT_ALL)
        return ebb_error_set(EBB_ERR_ARG, "ebb_dataset_open_text: split %d is not one of "
                                          "EBB_TEXT_TRAIN, EBB_TEXT_TEST, EBB_TEXT_ALL",
                             (int)split);
    return open_text(out, path, names, 2, block, split, path, 0);
}

/* Whether `s`, of length *len, ends with `suffix`: then *len drops it. */
static int cut_suffix(const char *s, size_t *len, const char *suffix) {
    size_t k = strlen(suffix);
    if (*len < k || memcmp(s + *len - k, suffix, k)) return 0;
    *len -= k;
    return 1;
}

/* "text:FILE[:train|:test|:all]" and "tokens:FILE[:u16|:u32][:train|:test|
 * :all]": the window length from the expected input shape [B, T], which
 * the target's, when given, must share. */
static ebb_status open_text_desc(ebb_dataset **out, const char *desc, const char *const *names,
                                 int n, const ebb_dataset_expect *expect) {
    int tokens = !strncmp(desc, "tokens:", 7), width = tokens ? 2 : 1;
    const char *file = desc + (tokens ? 7 : 5);
    ebb_text_split split = EBB_TEXT_TRAIN;
    size_t len = strlen(file);
    if (cut_suffix(file, &len, ":test"))
        split = EBB_TEXT_TEST;
    else if (cut_suffix(file, &len, ":all"))
        split = EBB_TEXT_ALL;
    else
        cut_suffix(file, &len, ":train");
    if (tokens && cut_suffix(file, &len, ":u32"))
        width = 4;
    else if (tokens)
        cut_suffix(file, &len, ":u16");
    char path[4096];
    if (len == 0 || len >= sizeof path)
        return ebb_error_set(EBB_ERR_ARG, "dataset '%s': %s", desc,
                             len ? "name too long"
                             : tokens ? "no file after tokens:" : "no file after text:");
    memcpy(path, file, len);
    path[len] = '\0';
    if (n != 2)
        return open_tokens(out, path, names, n, 1, split, desc, 0, width);
    const ebb_shape *x = expect && expect->shapes ? &expect->shapes[0] : NULL;
    const ebb_shape *y = expect && expect->shapes ? &expect->shapes[1] : NULL;
    char a[128], b[128];
    if (!x || x->ndim == 0)
        return ebb_error_set(EBB_ERR_ARG,
                             "dataset '%s': text data is cut into windows as long as the "
                             "input's second dimension, which is not known here: give "
                             "ebb_dataset_open_ex() the expected input shape [B, T], or call "
                             "ebb_dataset_open_text()",
                             desc);
    if (x->ndim != 2)
        return ebb_error_set(EBB_ERR_SHAPE,
                             "dataset '%s': text data gives windows of byte tokens, [B, T], but "
                             "'%s' is expected as %s; nothing was read",
                             desc, names[0], ebb_shape_str(x, a, sizeof a));
    if (y->ndim != 0 && (y->ndim != 2 || y->dim[1] != x->dim[1]))
        return ebb_error_set(EBB_ERR_SHAPE,
                             "dataset '%s': text data gives the target the input's window one "
                             "byte on, [B, %lld] as '%s' is %s, but '%s' is expected as %s; "
                             "nothing was read",
                             desc, (long long)x->dim[1], names[0], ebb_shape_str(x, a, sizeof a),
                             names[1], ebb_shape_str(y, b, sizeof b));
    return open_tokens(out, path, names, n, x->dim[1], split, desc, expect->max_bytes, width);
}

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* DIR/PREFIX-KIND-idxN-ubyte, gzipped or not: the first that exists. */
static void idx_name(char *buf, size_t size, const char *dir, const char *split, const char *kind,
                     int ndim) {
    snprintf(buf, size, "%s/%s-%s-idx%d-ubyte.gz", dir, split, kind, ndim);
    if (access(buf, F_OK) == 0)
        return;
    snprintf(buf, size, "%s/%s-%s-idx%d-ubyte", dir, split, kind, ndim);
    if (access(buf, F_OK) != 0) /* neither: name the compressed one in the error */
        snprintf(buf, size, "%s/%s-%s-idx%d-ubyte.gz", dir, split, kind, ndim);
}

ebb_status ebb_dataset_open_ex(ebb_dataset **out, const char *desc, const char *const *names,
                               int n, const ebb_dataset_expect *expect) {
    if (!out || !desc || !names || n < 1)
        return ebb_error_set(EBB_ERR_ARG, "ebb_dataset_open: NULL argument or no names");
    *out = NULL;
    for (int i = 0; i < n; i++)
        if (!names[i])
            return ebb_error_set(EBB_ERR_ARG, "ebb_dataset_open: name %d is NULL", i);
    ebb_status st = check_expect_args(expect, n, "ebb_dataset_open");
    if (st != EBB_OK)
        return st;
    if (!strncmp(desc, "text:", 5) || !strncmp(desc, "tokens:", 7))
        return open_text_desc(out, desc, names, n, expect);
    size_t len = strlen(desc);
    char dir[4096];
    const char *split = NULL;
    const char *colon = strrchr(desc, ':');
    size_t dir_len = len;
    if (colon && (!strcmp(colon, ":test") || !strcmp(colon, ":train"))) {
        split = !strcmp(colon, ":test") ? "t10k" : "train";
        dir_len = (size_t)(colon - desc);
    }
    if (dir_len >= sizeof dir)
        return ebb_error_set(EBB_ERR_ARG, "dataset '%s': name too long", desc);
    memcpy(dir, desc, dir_len);
    dir[dir_len] = '\0';
    if (!strcmp(dir, "fashion-mnist") && !is_dir(dir))
        snprintf(dir, sizeof dir, "%s", EBB_FASHION_MNIST_DIR);
    int idx_dir = is_dir(dir);
    const char *comma = strchr(desc, ',');
    if (!idx_dir && !comma) {
        if (split)
            return ebb_error_set(EBB_ERR_IO, "dataset '%s': '%s' is not a directory%s", desc, dir,
                                 !strncmp(desc, "fashion-mnist", 13)
                                     ? " (install the Debian package dataset-fashion-mnist)"
                                     : "");
        /* nothing of that name: say what a dataset can be, and which name
         * was meant if one is near */
        if (access(desc, F_OK) != 0)
            return ebb_error_set(
                EBB_ERR_IO,
                "dataset '%s': no such file or directory; a dataset is a safetensors file, a "
                "directory of IDX files, IMAGES,LABELS (two IDX files), fashion-mnist "
                "(:train, :test), text:FILE or tokens:FILE (:train, :test, :all)%s",
                desc,
                ebb_edit_distance(dir, "fashion-mnist", 3) <= 3 ? "; did you mean fashion-mnist?"
                                                                : "");
        ebb_status st = open_safetensors(out, desc, names, n, expect);
        size_t dl = strlen(desc);
        if (st != EBB_OK && st != EBB_ERR_NOMEM && dl > 4 && !strcmp(desc + dl - 4, ".bin")) {
            char first[1024];
            snprintf(first, sizeof first, "%s", ebb_errmsg());
            ebb_error_set(st, "%s (a .bin file of nanoGPT's prepare.py holds uint16 tokens: "
                          "give tokens:%s)", first, desc);
        }
        return st;
    }
    if (n != 2)
        return ebb_error_set(EBB_ERR_ARG,
                             "dataset '%s': IDX data has two fields (images, labels), but %d "
                             "are wanted (the spec's inputs and targets)",
                             desc, n);
    char images[4200], labels[4200];
    if (idx_dir) {
        idx_name(images, sizeof images, dir, split ? split : "train", "images", 3);
        idx_name(labels, sizeof labels, dir, split ? split : "train", "labels", 1);
    } else {
        if ((size_t)(comma - desc) >= sizeof images || strlen(comma + 1) >= sizeof labels)
            return ebb_error_set(EBB_ERR_ARG, "dataset '%s': name too long", desc);
        snprintf(images, sizeof images, "%.*s", (int)(comma - desc), desc);
        snprintf(labels, sizeof labels, "%s", comma + 1);
    }
    return open_idx(out, images, labels, names, desc, expect);
}

ebb_status ebb_dataset_open(ebb_dataset **out, const char *desc, const char *const *names, int n) {
    return ebb_dataset_open_ex(out, desc, names, n, NULL);
}

int64_t ebb_dataset_size(const ebb_dataset *d) { return d ? d->n : 0; }
int ebb_dataset_field_count(const ebb_dataset *d) { return d ? d->n_fields : 0; }

static const field *field_at(const ebb_dataset *d, int i) {
    return d && i >= 0 && i < d->n_fields ? &d->fields[i] : NULL;
}

const char *ebb_dataset_field_name(const ebb_dataset *d, int i) {
    const field *f = field_at(d, i);
    return f ? f->name : NULL;
}

ebb_dtype ebb_dataset_field_dtype(const ebb_dataset *d, int i) {
    const field *f = field_at(d, i);
    return f ? f->dtype : EBB_FLOAT32;
}

ebb_shape ebb_dataset_field_shape(const ebb_dataset *d, int i) {
    const field *f = field_at(d, i);
    ebb_shape none = {0};
    return f ? f->shape : none;
}

const char *ebb_dataset_field_file(const ebb_dataset *d, int i) {
    const field *f = field_at(d, i);
    return f ? f->file : NULL;
}

ebb_status ebb_dataset_set_normalize(ebb_dataset *d, int i, double mean, double std) {
    if (!field_at(d, i))
        return ebb_error_set(EBB_ERR_ARG, "ebb_dataset_set_normalize: no field %d", i);
    if (!isfinite(mean) || !isfinite(std) || !(std > 0))
        return ebb_error_set(EBB_ERR_ARG, "normalize: mean %g, std %g: the std must be positive "
                             "and both finite", mean, std);
    d->fields[i].normalize = 1;
    d->fields[i].mean = mean;
    d->fields[i].std = std;
    return EBB_OK;
}

/* Element k of a field's data, as a double. */
static double get_f(const field *f, int64_t k) {
    switch (f->dtype) {
    case EBB_UINT8: return ((const uint8_t *)f->data)[k];
    case EBB_INT32: return ((const int32_t *)f->data)[k];
    case EBB_INT64: return (double)((const int64_t *)f->data)[k];
    case EBB_FLOAT64: return ((const double *)f->data)[k];
    default: return ((const float *)f->data)[k];
    }
}

static int is_int_dtype(ebb_dtype t) { return t == EBB_UINT8 || t == EBB_INT32 || t == EBB_INT64; }

static int64_t get_i(const field *f, int64_t k) {
    switch (f->dtype) {
    case EBB_UINT8: return ((const uint8_t *)f->data)[k];
    case EBB_INT32: return ((const int32_t *)f->data)[k];
    default: return ((const int64_t *)f->data)[k];
    }
}

ebb_status ebb_dataset_check_classes(const ebb_dataset *d, int i, int64_t classes) {
    const field *f = field_at(d, i);
    if (!f)
        return ebb_error_set(EBB_ERR_ARG, "ebb_dataset_check_classes: no field %d", i);
    /* the elements the samples cover: all of them, once each (a text
     * field's windows overlap, and cover a range of its bytes) */
    int64_t first = f->offset;
    int64_t end = d->n ? (d->n - 1) * f->stride + f->offset + f->sample_numel : 0;
    for (int64_t k = first; k < end; k++) {
        double v = get_f(f, k);
        int bad = is_int_dtype(f->dtype) ? (get_i(f, k) < 0 || get_i(f, k) >= classes)
                                         : !(v >= 0 && v < (double)classes && v == floor(v));
        if (bad && f->text && f->token_bytes > 1)
            return ebb_error_set(EBB_ERR_ARG,
                                 "%s: token %lld (at byte %lld) is %g, not a token of the "
                                 "model's %lld-token vocabulary (0 to %lld)",
                                 f->file, (long long)(f->file_at + k),
                                 (long long)((f->file_at + k) * f->token_bytes), v,
                                 (long long)classes, (long long)classes - 1);
        if (bad && f->text)
            return ebb_error_set(EBB_ERR_ARG,
                                 "%s: the byte at offset %lld is %g, not a token of the "
                                 "model's %lld-token vocabulary (0 to %lld)",
                                 f->file, (long long)(f->file_at + k), v, (long long)classes,
                                 (long long)classes - 1);
        if (bad)
            return ebb_error_set(EBB_ERR_ARG,
                                 "%s: label %g of sample %lld is out of range for %lld classes "
                                 "(0 to %lld)",
                                 f->file, v, (long long)(k / f->sample_numel), (long long)classes,
                                 (long long)classes - 1);
    }
    return EBB_OK;
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void ebb_dataset_order(int64_t *order, int64_t n, uint64_t seed, int shuffle) {
    if (!order)
        return;
    for (int64_t k = 0; k < n; k++)
        order[k] = k;
    if (!shuffle)
        return;
    uint64_t s = seed;
    for (int64_t k = n - 1; k > 0; k--) {
        uint64_t bound = (uint64_t)k + 1, r, limit = UINT64_MAX - UINT64_MAX % bound;
        do
            r = splitmix64(&s);
        while (r >= limit);
        int64_t j = (int64_t)(r % bound), t = order[k];
        order[k] = order[j];
        order[j] = t;
    }
}

ebb_status ebb_dataset_batch(ebb_tensor **out, const ebb_dataset *d, int i, const int64_t *index,
                             int64_t count, const ebb_shape *shape, ebb_dtype dtype,
                             ebb_device device) {
    if (!out)
        return ebb_error_set(EBB_ERR_ARG, "ebb_dataset_batch: NULL out");
    *out = NULL;
    const field *f = field_at(d, i);
    if (!f || !index || !shape || count < 1)
        return ebb_error_set(EBB_ERR_ARG, "ebb_dataset_batch: no field %d, or no samples", i);
    if (dtype != EBB_FLOAT32 && dtype != EBB_FLOAT64 && dtype != EBB_INT64 &&
        dtype != EBB_INT32 && dtype != EBB_FLOAT16 && dtype != EBB_BFLOAT16)
        return ebb_error_set(EBB_ERR_ARG, "%s: field '%s' cannot be batched as %s", f->file,
                             f->name, ebb_dtype_name(dtype));
    /* float16 and bfloat16: made as float32, then rounded to the nearest
     * value of the dtype (as x.to(torch.bfloat16) rounds) */
    if (f->text && dtype != EBB_INT64 && dtype != EBB_INT32)
        return ebb_error_set(EBB_ERR_ARG,
                             "%s: field '%s' holds byte tokens of a text file, batched as int64 "
                             "or int32 token ids, not as %s (declare the spec's input and target "
                             "with dtype: int64)",
                             f->file, f->name, ebb_dtype_name(dtype));
    int half = dtype == EBB_FLOAT16 || dtype == EBB_BFLOAT16;
    ebb_dtype wanted = dtype;
    if (half)
        dtype = EBB_FLOAT32;
    int64_t per = 1;
    for (int k = 1; k < shape->ndim; k++)
        per *= shape->dim[k];
    char a[128], b[128];
    if (shape->ndim < 1 || shape->dim[0] != count || per != f->sample_numel) {
        ebb_shape sample = f->shape;
        sample.dim[0] = count;
        return ebb_error_set(EBB_ERR_SHAPE,
                             "%s: '%s' holds samples of %lld elements (%s for %lld samples), "
                             "which do not fit %s",
                             f->file, f->name, (long long)f->sample_numel,
                             ebb_shape_str(&sample, a, sizeof a), (long long)count,
                             ebb_shape_str(shape, b, sizeof b));
    }
    for (int64_t r = 0; r < count; r++)
        if (index[r] < 0 || index[r] >= d->n)
            return ebb_error_set(EBB_ERR_ARG, "ebb_dataset_batch: sample %lld out of range "
                                 "(%lld samples)", (long long)index[r], (long long)d->n);
    size_t esz = ebb_dtype_size(dtype), total = (size_t)(count * per);
    void *buf = malloc(total > 0 ? total * esz : 1);
    if (!buf)
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory for a batch of '%s'", f->name);
    double scale = f->dtype == EBB_UINT8 ? 1.0 / 255.0 : 1.0, mean = 0, inv_std = 1;
    if (f->normalize)
        mean = f->mean, inv_std = 1.0 / f->std;
    for (int64_t r = 0; r < count; r++) {
        int64_t src = index[r] * f->stride + f->offset;
        size_t dst = (size_t)(r * per);
        for (int64_t k = 0; k < per; k++) {
            switch (dtype) {
            case EBB_FLOAT32: {
                double v = get_f(f, src + k) * scale;
                ((float *)buf)[dst + (size_t)k] = (float)(f->normalize ? (v - mean) * inv_std : v);
                break;
            }
            case EBB_FLOAT64: {
                double v = get_f(f, src + k) * scale;
                ((double *)buf)[dst + (size_t)k] = f->normalize ? (v - mean) * inv_std : v;
                break;
            }
            case EBB_INT64:
                ((int64_t *)buf)[dst + (size_t)k] =
                    is_int_dtype(f->dtype) ? get_i(f, src + k) : (int64_t)get_f(f, src + k);
                break;
            default:
                ((int32_t *)buf)[dst + (size_t)k] =
                    (int32_t)(is_int_dtype(f->dtype) ? get_i(f, src + k) : get_f(f, src + k));
                break;
            }
        }
    }
    ebb_tensor *made = NULL;
    ebb_status st = ebb_tensor_from_host(half ? &made : out, buf, total * esz, shape, dtype,
                                         half ? ebb_device_cpu() : device);
    free(buf);
    if (st == EBB_OK && half) st = ebb_tensor_to(out, made, device, wanted);
    ebb_tensor_free(made);
    return st;
}
