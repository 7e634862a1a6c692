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

#include "ebb/data.h"
#include "ebb/safetensors.h"
#include "fileio.h"

/* An IDX file larger than this is refused before it is allocated. */
#define IDX_MAX_BYTES ((uint64_t)1 << 34)
#define IDX_CHUNK ((size_t)1 << 24)

typedef struct field {
    char *name;
    char *file;
    ebb_dtype dtype;
    ebb_shape shape; /* samples first */
    int64_t sample_numel;
    void *data;
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

static uint32_t be32(const unsigned char *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}

/* Reads up to `len` bytes; returns how many, or -1 with *msg set. */
static int64_t gz_read_all(gzFile gz, void *buf, size_t len, const char **msg) {
    size_t at = 0;
    while (at < len) {
        size_t want = len - at > IDX_CHUNK ? IDX_CHUNK : len - at;
        int got = gzread(gz, (char *)buf + at, (unsigned)want);
        if (got < 0) {
            int err = 0;
            *msg = gzerror(gz, &err);
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

static ebb_status idx_read_host(idx_data *out, const char *path) {
    memset(out, 0, sizeof *out);
    int fd = -1;
    int64_t file_size = 0;
    ebb_status st = ebb_file_open_read(&fd, &file_size, path, path);
    if (st != EBB_OK)
        return st;
    gzFile gz = gzdopen(fd, "rb");
    if (!gz) {
        close(fd);
        return ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory opening the file", path);
    }
    gzbuffer(gz, 1 << 17);
    unsigned char head[4 + 4 * 255];
    const char *zmsg = NULL;
    void *data = NULL;
    int64_t got = gz_read_all(gz, head, 4, &zmsg);
    if (got < 0) {
        st = ebb_error_set(EBB_ERR_IO, "%s: cannot read: %s", path, zmsg);
        goto fail;
    }
    if (got < 4) {
        st = ebb_error_set(EBB_ERR_IO, "%s: truncated: %lld bytes, shorter than an IDX header",
                           path, (long long)got);
        goto fail;
    }
    ebb_dtype dtype;
    size_t esz, out_esz;
    switch (head[2]) {
    case 0x08: dtype = EBB_UINT8, esz = 1, out_esz = 1; break;
    case 0x09: dtype = EBB_INT32, esz = 1, out_esz = 4; break;
    case 0x0B: dtype = EBB_INT32, esz = 2, out_esz = 4; break;
    case 0x0C: dtype = EBB_INT32, esz = 4, out_esz = 4; break;
    case 0x0D: dtype = EBB_FLOAT32, esz = 4, out_esz = 4; break;
    case 0x0E: dtype = EBB_FLOAT64, esz = 8, out_esz = 8; break;
    default: dtype = EBB_UINT8, esz = 0, out_esz = 0; break;
    }
    if (head[0] != 0 || head[1] != 0 || esz == 0 || head[3] == 0) {
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
    got = gz_read_all(gz, head + 4, 4 * (size_t)ndim, &zmsg);
    if (got < 0) {
        st = ebb_error_set(EBB_ERR_IO, "%s: cannot read: %s", path, zmsg);
        goto fail;
    }
    if (got < 4 * ndim) {
        st = ebb_error_set(EBB_ERR_IO, "%s: truncated in its header (%d dimensions declared)",
                           path, ndim);
        goto fail;
    }
    ebb_shape shape = {.ndim = ndim};
    uint64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        shape.dim[d] = be32(head + 4 + 4 * d);
        numel *= (uint64_t)shape.dim[d];
        if (numel > IDX_MAX_BYTES) {
            st = ebb_error_set(EBB_ERR_IO, "%s: declares more than %llu elements", path,
                               (unsigned long long)IDX_MAX_BYTES);
            goto fail;
        }
    }
    uint64_t want = numel * esz;
    if (want > IDX_MAX_BYTES) {
        st = ebb_error_set(EBB_ERR_IO, "%s: declares %llu bytes of data, more than ebb reads",
                           path, (unsigned long long)want);
        goto fail;
    }
    /* grown as bytes arrive: a small file declaring a huge size costs little */
    size_t cap = want < IDX_CHUNK ? (size_t)want : IDX_CHUNK, have = 0;
    data = malloc(cap ? cap * (out_esz / esz) : 1);
    if (!data) {
        st = ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    while (have < want) {
        if (have == cap) {
            size_t ncap = cap * 2 > want ? (size_t)want : cap * 2;
            void *more = realloc(data, ncap * (out_esz / esz));
            if (!more) {
                st = ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory (%llu bytes)", path,
                                   (unsigned long long)want);
                goto fail;
            }
            data = more;
            cap = ncap;
        }
        got = gz_read_all(gz, (char *)data + have, cap - have, &zmsg);
        if (got < 0) {
            st = ebb_error_set(EBB_ERR_IO, "%s: cannot read: %s", path, zmsg);
            goto fail;
        }
        have += (size_t)got;
        if (have < cap)
            break;
    }
    if (have < want) {
        st = ebb_error_set(EBB_ERR_IO,
                           "%s: truncated: %llu bytes of data where its header declares %llu",
                           path, (unsigned long long)have, (unsigned long long)want);
        goto fail;
    }
    unsigned char extra;
    got = gz_read_all(gz, &extra, 1, &zmsg);
    if (got != 0) {
        st = got < 0 ? ebb_error_set(EBB_ERR_IO, "%s: cannot read: %s", path, zmsg)
                     : ebb_error_set(EBB_ERR_IO,
                                     "%s: more bytes than its header declares (%llu): not an IDX "
                                     "file of that shape",
                                     path, (unsigned long long)want);
        goto fail;
    }
    int zr = gzclose(gz);
    gz = NULL;
    if (zr == Z_BUF_ERROR) { /* the data is all there, the gzip trailer is not */
        st = ebb_error_set(EBB_ERR_IO, "%s: truncated: the gzip stream ends early", path);
        goto fail;
    }
    /* big-endian elements to host values, widened where ebb has no dtype;
     * backwards so that a widening conversion is done in place */
    unsigned char *b = data;
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
    if (head[2] == 0x09)
        for (uint64_t k = numel; k-- > 0;) {
            int32_t v = (int8_t)b[k];
            memcpy(b + k * 4, &v, 4);
        }
    out->dtype = dtype;
    out->shape = shape;
    out->data = data;
    out->nbytes = (size_t)numel * out_esz;
    return EBB_OK;
fail:
    free(data);
    if (gz)
        gzclose(gz);
    return st;
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
    if (!f->name || !f->file)
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    return EBB_OK;
}

ebb_status ebb_dataset_open_idx(ebb_dataset **out, const char *images, const char *labels,
                                const char *const names[2]) {
    if (!out || !images || !labels || !names || !names[0] || !names[1])
        return ebb_error_set(EBB_ERR_ARG, "ebb_dataset_open_idx: NULL argument");
    *out = NULL;
    idx_data im, lb;
    ebb_status st = idx_read_host(&im, images);
    if (st != EBB_OK)
        return st;
    if ((st = idx_read_host(&lb, labels)) != EBB_OK) {
        free(im.data);
        return st;
    }
    if (lb.shape.ndim != 1) {
        st = ebb_error_set(EBB_ERR_ARG, "%s: labels have %d dimensions; expected one value per "
                           "sample (1 dimension)", labels, lb.shape.ndim);
    } else if (lb.shape.dim[0] != im.shape.dim[0]) {
        st = ebb_error_set(EBB_ERR_ARG, "%s: %lld labels, but %s has %lld images", labels,
                           (long long)lb.shape.dim[0], images, (long long)im.shape.dim[0]);
    }
    if (st != EBB_OK) {
        free(im.data);
        free(lb.data);
        return st;
    }
    ebb_dataset *d = NULL;
    if ((st = new_dataset(&d, 2)) != EBB_OK) {
        free(im.data);
        free(lb.data);
        return st;
    }
    d->n = im.shape.dim[0];
    st = set_field(d, 0, names[0], images, im.dtype, &im.shape, im.data);
    ebb_status st2 = set_field(d, 1, names[1], labels, lb.dtype, &lb.shape, lb.data);
    if (st == EBB_OK && st2 != EBB_OK)
        st = st2;
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
    ebb_safetensors *sf = NULL;
    ebb_status st = ebb_safetensors_open(&sf, path);
    if (st != EBB_OK)
        return st;
    ebb_dataset *d = NULL;
    if ((st = new_dataset(&d, n)) != EBB_OK) {
        ebb_safetensors_close(sf);
        return st;
    }
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
        if (i > 0 && sh.dim[0] != d->n) {
            st = ebb_error_set(EBB_ERR_ARG, "%s: tensor '%s' has %lld samples, but '%s' has %lld",
                               path, names[i], (long long)sh.dim[0], names[0], (long long)d->n);
            break;
        }
        d->n = sh.dim[0];
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
            st = ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory for '%s'", path, names[i]);
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

ebb_status ebb_dataset_open(ebb_dataset **out, const char *desc, const char *const *names, int n) {
    if (!out || !desc || !names || n < 1)
        return ebb_error_set(EBB_ERR_ARG, "ebb_dataset_open: NULL argument or no names");
    *out = NULL;
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
        return ebb_dataset_open_safetensors(out, desc, names, n);
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
    return ebb_dataset_open_idx(out, images, labels, names);
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
    int64_t total = d->n * f->sample_numel;
    for (int64_t k = 0; k < total; k++) {
        double v = get_f(f, k);
        int bad = is_int_dtype(f->dtype) ? (get_i(f, k) < 0 || get_i(f, k) >= classes)
                                         : !(v >= 0 && v < (double)classes && v == floor(v));
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
    if (dtype != EBB_FLOAT32 && dtype != EBB_FLOAT64 && dtype != EBB_INT64 && dtype != EBB_INT32)
        return ebb_error_set(EBB_ERR_ARG, "%s: field '%s' cannot be batched as %s", f->file,
                             f->name, ebb_dtype_name(dtype));
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
        int64_t src = index[r] * per;
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
    ebb_status st = ebb_tensor_from_host(out, buf, total * esz, shape, dtype, device);
    free(buf);
    return st;
}
