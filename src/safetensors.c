/* safetensors: an 8-byte little-endian header length, a JSON header (parsed
 * with cJSON), then the raw data. The reader validates the whole header once
 * at open and keeps only the descriptor: a load reads the tensor's bytes with
 * pread, in chunks, into the destination tensor. Nothing is mapped, so a file
 * that shrinks under a reader (truncated, or rewritten in place by cp) is a
 * "truncated while reading" error instead of a SIGBUS.
 *
 * Every file ebb writes carries a CRC-32 (zlib's) of each tensor's bytes in
 * its metadata, "crc32:NAME": "8 hex digits", which other readers ignore;
 * a load checks it as it reads, so a flipped bit is an error naming the
 * tensor rather than a wrong weight. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <zlib.h>

#include "ebb/safetensors.h"
#include "fileio.h"

/* The reference implementation's limit: a header this large is an attack. */
#define MAX_HEADER_BYTES 100000000ull
/* Integers in the JSON header are doubles to cJSON: exact up to 2^53. */
#define MAX_JSON_INT 9007199254740992.0
/* Bytes read per pread: large enough that the per-chunk cost (a syscall, a
 * view of the destination) is lost in the copy, small enough to stay in the
 * cache between the read and the copy into the tensor. */
#define READ_CHUNK ((size_t)1 << 20)

/* ---- dtypes ------------------------------------------------------------------ */

typedef struct st_dtype {
    const char *name;
    size_t size;
    int ebb; /* the ebb_dtype, or -1 when ebb has none */
} st_dtype;

static const st_dtype st_dtypes[] = {
    {"F32", 4, EBB_FLOAT32}, {"F16", 2, EBB_FLOAT16},  {"BF16", 2, EBB_BFLOAT16},
    {"F64", 8, EBB_FLOAT64}, {"I64", 8, EBB_INT64},    {"I32", 4, EBB_INT32},
    {"U8", 1, EBB_UINT8},    {"BOOL", 1, EBB_BOOL},    {"I8", 1, -1},
    {"I16", 2, -1},          {"U16", 2, -1},           {"U32", 4, -1},
    {"U64", 8, -1},          {"F8_E4M3", 1, -1},       {"F8_E5M2", 1, -1},
    {"F8_E8M0", 1, -1},      {"C64", 8, -1},
};
#define N_ST_DTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))

static const st_dtype *st_dtype_by_name(const char *name) {
    for (int i = 0; i < N_ST_DTYPES; i++)
        if (strcmp(st_dtypes[i].name, name) == 0)
            return &st_dtypes[i];
    return NULL;
}

static const char *st_dtype_name(ebb_dtype d) {
    for (int i = 0; i < N_ST_DTYPES; i++)
        if (st_dtypes[i].ebb == (int)d)
            return st_dtypes[i].name;
    return "?";
}

static int host_is_little_endian(void) {
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 1;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* ---- writing ------------------------------------------------------------------ */

typedef struct write_item {
    int index; /* into the caller's arrays */
    size_t elsize;
    size_t nbytes;
} write_item;

/* Larger elements first keeps every tensor aligned to its element size; ties
 * keep the caller's order. */
static int by_elsize_desc(const void *a, const void *b) {
    const write_item *x = a, *y = b;
    if (x->elsize != y->elsize)
        return x->elsize > y->elsize ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* qsort has no context argument in C11; the names travel in this pointer,
 * set only for the duration of one sort in check_names(). */
static _Thread_local const char *const *sort_names;
static int by_name_cmp(const void *a, const void *b) {
    return strcmp(sort_names[*(const int *)a], sort_names[*(const int *)b]);
}

static ebb_status check_names(const char *const *names, int n) {
    for (int i = 0; i < n; i++) {
        if (!names[i] || !names[i][0])
            return ebb_error_set(EBB_ERR_ARG, "ebb_safetensors_write: name %d is empty", i);
        if (strcmp(names[i], "__metadata__") == 0)
            return ebb_error_set(EBB_ERR_ARG,
                                 "ebb_safetensors_write: \"__metadata__\" is reserved and cannot "
                                 "name a tensor");
    }
    int *order = malloc(sizeof *order * (size_t)(n ? n : 1));
    if (!order)
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_safetensors_write: out of memory");
    for (int i = 0; i < n; i++)
        order[i] = i;
    sort_names = names;
    qsort(order, (size_t)n, sizeof *order, by_name_cmp);
    sort_names = NULL;
    ebb_status st = EBB_OK;
    for (int i = 1; i < n && st == EBB_OK; i++)
        if (strcmp(names[order[i - 1]], names[order[i]]) == 0)
            st = ebb_error_set(EBB_ERR_ARG, "ebb_safetensors_write: name '%s' is given twice",
                               names[order[i]]);
    free(order);
    return st;
}

/* Adds a raw JSON integer: cJSON would print an int64 through a double. */
static int add_int(cJSON *array, unsigned long long v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%llu", v);
    cJSON *num = cJSON_CreateRaw(buf);
    return num && cJSON_AddItemToArray(array, num);
}

#define CRC_PREFIX "crc32:"

/* Builds the JSON header for items in data order, with each tensor's
 * CRC-32 (crcs[], by item); NULL when out of memory. */
static char *build_header(const char *const *names, ebb_tensor *const *tensors,
                          const write_item *items, const uint32_t *crcs, int n,
                          const char *const *kv, int n_kv) {
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    cJSON *meta = ok ? cJSON_AddObjectToObject(root, "__metadata__") : NULL;
    ok = ok && meta && cJSON_AddStringToObject(meta, "format", "pt");
    for (int i = 0; ok && i < n_kv; i++)
        ok = cJSON_AddStringToObject(meta, kv[2 * i], kv[2 * i + 1]) != NULL;
    for (int i = 0; ok && i < n; i++) {
        const char *name = names[items[i].index];
        size_t len = strlen(CRC_PREFIX) + strlen(name) + 1;
        char *key = malloc(len), hex[16];
        ok = key != NULL;
        if (ok) {
            snprintf(key, len, "%s%s", CRC_PREFIX, name);
            snprintf(hex, sizeof hex, "%08x", (unsigned)crcs[i]);
            ok = cJSON_AddStringToObject(meta, key, hex) != NULL;
        }
        free(key);
    }
    unsigned long long offset = 0;
    for (int i = 0; ok && i < n; i++) {
        const ebb_tensor *t = tensors[items[i].index];
        cJSON *entry = cJSON_CreateObject();
        ok = entry && cJSON_AddItemToObject(root, names[items[i].index], entry);
        if (!ok) {
            cJSON_Delete(entry);
            break;
        }
        ok = cJSON_AddStringToObject(entry, "dtype", st_dtype_name(ebb_tensor_dtype(t))) != NULL;
        cJSON *shape = ok ? cJSON_AddArrayToObject(entry, "shape") : NULL;
        ebb_shape s = ebb_tensor_shape(t);
        ok = shape != NULL;
        for (int d = 0; ok && d < s.ndim; d++)
            ok = add_int(shape, (unsigned long long)s.dim[d]);
        cJSON *offsets = ok ? cJSON_AddArrayToObject(entry, "data_offsets") : NULL;
        ok = offsets && add_int(offsets, offset) && add_int(offsets, offset + items[i].nbytes);
        offset += items[i].nbytes;
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return text;
}

static ebb_status write_all(FILE *f, const void *data, size_t n, const char *path) {
    if (n && fwrite(data, 1, n, f) != n)
        return ebb_error_set(EBB_ERR_IO, "ebb_safetensors_write: cannot write '%s': %s", path,
                             strerror(errno));
    return EBB_OK;
}

/* Item i's bytes on the host, into *buf (grown to *cap as needed). */
static ebb_status item_bytes(const char *const *names, ebb_tensor *const *tensors,
                             const write_item *item, void **buf, size_t *cap) {
    size_t nb = item->nbytes;
    if (nb > *cap) {
        void *grown = realloc(*buf, nb);
        if (!grown)
            return ebb_error_set(EBB_ERR_NOMEM,
                                 "ebb_safetensors_write: out of memory (%zu bytes for '%s')", nb,
                                 names[item->index]);
        *buf = grown;
        *cap = nb;
    }
    ebb_status st = ebb_tensor_to_host(tensors[item->index], *buf, nb);
    if (st != EBB_OK)
        ebb_error_prefix("ebb_safetensors_write: tensor '%s'", names[item->index]);
    return st;
}

/* Writes header and data into the writer's stream. The tensors are read
 * twice: once for their checksums, which the header holds, then for the
 * data. */
static ebb_status write_body(FILE *f, const char *path, const char *const *names,
                             ebb_tensor *const *tensors, const write_item *items, int n,
                             const char *const *kv, int n_kv) {
    void *buf = NULL;
    size_t cap = 0;
    uint32_t *crcs = calloc((size_t)n + 1, sizeof *crcs);
    ebb_status st = crcs ? EBB_OK
                         : ebb_error_set(EBB_ERR_NOMEM, "ebb_safetensors_write: out of memory");
    for (int i = 0; st == EBB_OK && i < n; i++) {
        crcs[i] = (uint32_t)crc32(0L, Z_NULL, 0);
        if (items[i].nbytes && (st = item_bytes(names, tensors, &items[i], &buf, &cap)) == EBB_OK)
            crcs[i] = (uint32_t)crc32_z(crcs[i], buf, items[i].nbytes);
    }
    char *header = st == EBB_OK ? build_header(names, tensors, items, crcs, n, kv, n_kv) : NULL;
    free(crcs);
    if (st != EBB_OK || !header) {
        free(buf);
        return st != EBB_OK ? st
                            : ebb_error_set(EBB_ERR_NOMEM,
                                            "ebb_safetensors_write: out of memory building the "
                                            "header");
    }
    size_t hlen = strlen(header), padded = hlen;
    while ((8 + padded) % 8) /* data starts 8-byte aligned */
        padded++;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((unsigned long long)padded >> (8 * i));
    st = write_all(f, len8, 8, path);
    if (st == EBB_OK)
        st = write_all(f, header, hlen, path);
    for (size_t i = hlen; st == EBB_OK && i < padded; i++)
        st = write_all(f, " ", 1, path);
    free(header);
    for (int i = 0; st == EBB_OK && i < n; i++)
        if (items[i].nbytes && (st = item_bytes(names, tensors, &items[i], &buf, &cap)) == EBB_OK)
            st = write_all(f, buf, items[i].nbytes, path);
    free(buf);
    return st;
}

ebb_status ebb_safetensors_write(const char *path, const char *const *names,
                                 ebb_tensor *const *tensors, int n) {
    return ebb_safetensors_write_meta(path, names, tensors, n, NULL, 0);
}

ebb_status ebb_safetensors_write_meta(const char *path, const char *const *names,
                                      ebb_tensor *const *tensors, int n,
                                      const char *const *metadata, int n_metadata) {
    if (n_metadata < 0 || (n_metadata > 0 && !metadata))
        return ebb_error_set(EBB_ERR_ARG, "ebb_safetensors_write: %d metadata pairs and no array",
                             n_metadata);
    for (int i = 0; i < n_metadata; i++)
        if (!metadata[2 * i] || !metadata[2 * i + 1] || !metadata[2 * i][0] ||
            !strcmp(metadata[2 * i], "format") ||
            !strncmp(metadata[2 * i], CRC_PREFIX, strlen(CRC_PREFIX)))
            return ebb_error_set(EBB_ERR_ARG,
                                 "ebb_safetensors_write: metadata key %d is NULL, empty, "
                                 "\"format\" or \"" CRC_PREFIX "...\" (reserved), or its value "
                                 "is NULL",
                                 i);
    if (!path || !path[0] || n < 0 || (n > 0 && (!names || !tensors)))
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_safetensors_write: needs a path and %d names and tensors", n);
    if (!host_is_little_endian())
        return ebb_error_set(EBB_ERR_UNSUPPORTED,
                             "ebb_safetensors_write: big-endian hosts are not supported");
    ebb_status st = check_names(names, n);
    if (st != EBB_OK)
        return st;
    write_item *items = malloc(sizeof *items * (size_t)(n ? n : 1));
    if (!items)
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_safetensors_write: out of memory");
    for (int i = 0; i < n; i++) {
        if (!tensors[i]) {
            free(items);
            return ebb_error_set(EBB_ERR_ARG, "ebb_safetensors_write: tensor '%s' is NULL",
                                 names[i]);
        }
        if (ebb_tensor_device(tensors[i]).type == EBB_DEVICE_META) {
            free(items);
            return ebb_error_set(
                EBB_ERR_ARG, "ebb_safetensors_write: tensor '%s' is on the meta device (no data)",
                names[i]);
        }
        items[i] = (write_item){i, ebb_dtype_size(ebb_tensor_dtype(tensors[i])),
                                ebb_tensor_nbytes(tensors[i])};
    }
    qsort(items, (size_t)n, sizeof *items, by_elsize_desc);
    ebb_file_out *w = NULL;
    st = ebb_file_begin(&w, path, "ebb_safetensors_write");
    if (st == EBB_OK) {
        st = write_body(ebb_file_stream(w), path, names, tensors, items, n, metadata,
                        n_metadata);
        if (st == EBB_OK)
            st = ebb_file_commit(w);
        else
            ebb_file_abort(w);
    }
    free(items);
    return st;
}

/* ---- reading ------------------------------------------------------------------ */

typedef struct st_entry {
    char *name;
    const st_dtype *dtype;
    ebb_shape shape;
    uint64_t begin, end; /* relative to the data section */
} st_entry;

typedef struct st_meta {
    char *key, *value;
} st_meta;

struct ebb_safetensors {
    char *path;
    int fd;           /* kept open: a file renamed over the path keeps its old contents */
    uint64_t data_at; /* 8 + header length: where the data section starts */
    uint64_t data_size;
    st_entry *entries; /* sorted by name */
    int n;
    st_meta *meta;
    int n_meta;
};

void ebb_safetensors_close(ebb_safetensors *st) {
    if (!st)
        return;
    if (st->fd >= 0)
        close(st->fd);
    for (int i = 0; i < st->n; i++)
        free(st->entries[i].name);
    for (int i = 0; i < st->n_meta; i++) {
        free(st->meta[i].key);
        free(st->meta[i].value);
    }
    free(st->entries);
    free(st->meta);
    free(st->path);
    free(st);
}

/* A non-negative integer from a JSON number, or -1. */
static int json_uint(const cJSON *item, uint64_t *out) {
    if (!cJSON_IsNumber(item))
        return -1;
    double v = item->valuedouble;
    if (!(v >= 0.0) || v > MAX_JSON_INT || v != (double)(uint64_t)v)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static int by_entry_name(const void *a, const void *b) {
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

static int by_entry_offset(const void *a, const void *b) {
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

#define BAD(...) ebb_error_set(EBB_ERR_IO, __VA_ARGS__)

static ebb_status parse_metadata(ebb_safetensors *st, const cJSON *obj) {
    if (!cJSON_IsObject(obj))
        return BAD("ebb_safetensors_open: '%s': __metadata__ is not an object", st->path);
    int n = cJSON_GetArraySize(obj);
    st->meta = calloc((size_t)(n ? n : 1), sizeof *st->meta);
    if (!st->meta)
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_safetensors_open: out of memory");
    for (const cJSON *m = obj->child; m; m = m->next) {
        if (!cJSON_IsString(m) || !m->string)
            return BAD("ebb_safetensors_open: '%s': __metadata__ value '%s' is not a string",
                       st->path, m->string ? m->string : "?");
        st_meta *slot = &st->meta[st->n_meta++];
        slot->key = dup_str(m->string);
        slot->value = dup_str(m->valuestring);
        if (!slot->key || !slot->value)
            return ebb_error_set(EBB_ERR_NOMEM, "ebb_safetensors_open: out of memory");
    }
    return EBB_OK;
}

/* Fills e from one header entry, checking everything that concerns it alone. */
static ebb_status parse_entry(ebb_safetensors *st, const cJSON *item, st_entry *e) {
    const char *name = item->string;
    if (!cJSON_IsObject(item))
        return BAD("ebb_safetensors_open: '%s': entry '%s' is not an object", st->path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs))
        return BAD("ebb_safetensors_open: '%s': tensor '%s' needs a string dtype, a shape array "
                   "and a data_offsets array",
                   st->path, name);
    e->dtype = st_dtype_by_name(dt->valuestring);
    if (!e->dtype)
        return BAD("ebb_safetensors_open: '%s': tensor '%s' has unknown dtype '%s'", st->path, name,
                   dt->valuestring);
    int nd = cJSON_GetArraySize(shape);
    if (nd > EBB_MAX_DIMS)
        return BAD("ebb_safetensors_open: '%s': tensor '%s' has %d dims; ebb supports up to %d",
                   st->path, name, nd, EBB_MAX_DIMS);
    uint64_t numel = 1;
    int overflow = 0;
    e->shape.ndim = nd;
    int d = 0;
    for (const cJSON *s = shape->child; s; s = s->next, d++) {
        uint64_t v = 0;
        if (json_uint(s, &v) != 0)
            return BAD("ebb_safetensors_open: '%s': tensor '%s': shape entry %d is not a "
                       "non-negative integer",
                       st->path, name, d);
        e->shape.dim[d] = (int64_t)v;
        if (v && numel > UINT64_MAX / v)
            overflow = 1;
        numel *= v;
    }
    uint64_t nbytes = numel * e->dtype->size;
    if (overflow || (e->dtype->size && nbytes / e->dtype->size != numel))
        return BAD("ebb_safetensors_open: '%s': tensor '%s' is too large", st->path, name);
    if (cJSON_GetArraySize(offs) != 2 || json_uint(offs->child, &e->begin) != 0 ||
        json_uint(offs->child->next, &e->end) != 0 || e->begin > e->end)
        return BAD("ebb_safetensors_open: '%s': tensor '%s': data_offsets must be [begin, end] "
                   "with 0 <= begin <= end",
                   st->path, name);
    if (e->end - e->begin != nbytes) {
        char buf[128];
        return BAD("ebb_safetensors_open: '%s': tensor '%s': data_offsets [%llu, %llu] hold %llu "
                   "bytes but %s %s needs %llu",
                   st->path, name, (unsigned long long)e->begin, (unsigned long long)e->end,
                   (unsigned long long)(e->end - e->begin), e->dtype->name,
                   ebb_shape_str(&e->shape, buf, sizeof buf), (unsigned long long)nbytes);
    }
    if (e->end > st->data_size)
        return BAD("ebb_safetensors_open: '%s': tensor '%s': data_offsets [%llu, %llu] run past "
                   "the end of the data (%llu bytes; the file is truncated or corrupt)",
                   st->path, name, (unsigned long long)e->begin, (unsigned long long)e->end,
                   (unsigned long long)st->data_size);
    e->name = dup_str(name);
    if (!e->name)
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_safetensors_open: out of memory");
    return EBB_OK;
}

/* The tensors must tile the data section: no overlap, no gap, nothing after. */
static ebb_status check_layout(ebb_safetensors *st) {
    st_entry **by_off = malloc(sizeof *by_off * (size_t)(st->n ? st->n : 1));
    if (!by_off)
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_safetensors_open: out of memory");
    for (int i = 0; i < st->n; i++)
        by_off[i] = &st->entries[i];
    qsort(by_off, (size_t)st->n, sizeof *by_off, by_entry_offset);
    ebb_status s = EBB_OK;
    uint64_t at = 0;
    const st_entry *prev = NULL;
    for (int i = 0; i < st->n && s == EBB_OK; i++) {
        const st_entry *e = by_off[i];
        if (e->begin < at)
            s = BAD("ebb_safetensors_open: '%s': tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) "
                    "overlap",
                    st->path, prev->name, (unsigned long long)prev->begin,
                    (unsigned long long)prev->end, e->name, (unsigned long long)e->begin,
                    (unsigned long long)e->end);
        else if (e->begin > at)
            s = BAD("ebb_safetensors_open: '%s': data bytes [%llu, %llu) belong to no tensor",
                    st->path, (unsigned long long)at, (unsigned long long)e->begin);
        at = e->end;
        prev = e;
    }
    if (s == EBB_OK && at != st->data_size)
        s = BAD("ebb_safetensors_open: '%s': data bytes [%llu, %llu) belong to no tensor", st->path,
                (unsigned long long)at, (unsigned long long)st->data_size);
    free(by_off);
    return s;
}

/* JSON (RFC 8259) is UTF-8 text in which bytes below 0x20 appear only as the
 * whitespace between tokens; inside strings they must be escaped. cJSON is
 * more lenient (it stops at a NUL, for one), so the bytes are checked first. */
static ebb_status check_json_bytes(const ebb_safetensors *st, const unsigned char *t, size_t len) {
    int in_string = 0, escaped = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned c = t[i];
        if (c == 0)
            return BAD("ebb_safetensors_open: '%s': the header has a NUL byte at byte %zu of %zu",
                       st->path, i, len);
        if (c < 0x20 && (in_string || (c != ' ' && c != '\t' && c != '\n' && c != '\r')))
            return BAD("ebb_safetensors_open: '%s': the header has control byte 0x%02x at byte "
                       "%zu%s, which JSON does not allow",
                       st->path, c, i, in_string ? " inside a string" : "");
        if (c >= 0x80) {
            /* one UTF-8 sequence: no overlong forms, no surrogates, <= U+10FFFF */
            size_t n = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
            uint32_t cp = c & (0x3fu >> n);
            int ok = n > 0 && c < 0xf5 && i + n < len;
            for (size_t k = 1; ok && k <= n; k++) {
                ok = (t[i + k] & 0xc0) == 0x80;
                cp = (cp << 6) | (t[i + k] & 0x3fu);
            }
            static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};
            if (!ok || cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
                return BAD("ebb_safetensors_open: '%s': the header is not valid UTF-8 at byte %zu",
                           st->path, i);
            i += n;
            escaped = 0;
            continue;
        }
        if (escaped)
            escaped = 0;
        else if (in_string && c == '\\')
            escaped = 1;
        else if (c == '"')
            in_string = !in_string;
    }
    return EBB_OK;
}

static ebb_status parse_header(ebb_safetensors *st, const char *text, size_t len) {
    if (len < 2 || text[0] != '{')
        return BAD("ebb_safetensors_open: '%s': the header does not start with a JSON object",
                   st->path);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        long at = end ? (long)(end - text) : -1;
        return BAD(
            "ebb_safetensors_open: '%s': the header is not valid JSON (near byte %ld of %zu)",
            st->path, at, len);
    }
    ebb_status s = EBB_OK;
    for (const char *p = end; p && p < text + len && s == EBB_OK; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            s = BAD("ebb_safetensors_open: '%s': the header has data after its JSON object",
                    st->path);
    if (s == EBB_OK && !cJSON_IsObject(root))
        s = BAD("ebb_safetensors_open: '%s': the header is not a JSON object", st->path);
    int n = s == EBB_OK ? cJSON_GetArraySize(root) : 0;
    if (s == EBB_OK) {
        st->entries = calloc((size_t)(n ? n : 1), sizeof *st->entries);
        if (!st->entries)
            s = ebb_error_set(EBB_ERR_NOMEM, "ebb_safetensors_open: out of memory");
    }
    for (const cJSON *item = s == EBB_OK ? root->child : NULL; item && s == EBB_OK;
         item = item->next) {
        if (!item->string)
            s = BAD("ebb_safetensors_open: '%s': a header entry has no name", st->path);
        else if (strcmp(item->string, "__metadata__") == 0)
            s = st->meta ? BAD("ebb_safetensors_open: '%s': __metadata__ appears twice", st->path)
                         : parse_metadata(st, item);
        else if ((s = parse_entry(st, item, &st->entries[st->n])) == EBB_OK)
            st->n++;
    }
    cJSON_Delete(root);
    if (s != EBB_OK || !st->entries)
        return s;
    qsort(st->entries, (size_t)st->n, sizeof *st->entries, by_entry_name);
    for (int i = 1; i < st->n; i++)
        if (strcmp(st->entries[i - 1].name, st->entries[i].name) == 0)
            return BAD("ebb_safetensors_open: '%s': tensor '%s' appears twice", st->path,
                       st->entries[i].name);
    return check_layout(st);
}

/* Reads n bytes at `offset`; 0, or -1 with errno set (0 for an end of file
 * before n bytes: the file is shorter than when it was opened). */
static int read_at(int fd, void *buf, size_t n, uint64_t offset) {
    size_t done = 0;
    while (done < n) {
        ssize_t got = pread(fd, (char *)buf + done, n - done, (off_t)(offset + done));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            if (got == 0)
                errno = 0;
            return -1;
        }
        done += (size_t)got;
    }
    return 0;
}

/* The message for a failed read_at: a read error, or the file shrank. */
static ebb_status read_failed(const ebb_safetensors *st, const char *fn, const char *what,
                              uint64_t end) {
    if (errno)
        return ebb_error_set(EBB_ERR_IO, "%s: '%s': reading %s: %s", fn, st->path, what,
                             strerror(errno));
    struct stat sb;
    long long now = fstat(st->fd, &sb) == 0 ? (long long)sb.st_size : -1;
    return ebb_error_set(EBB_ERR_IO,
                         "%s: '%s' was truncated while reading %s: it is now %lld bytes, the data "
                         "ends at byte %llu",
                         fn, st->path, what, now, (unsigned long long)end);
}

ebb_status ebb_safetensors_open(ebb_safetensors **out, const char *path) {
    static const char fn[] = "ebb_safetensors_open";
    if (!out)
        return ebb_error_set(EBB_ERR_ARG, "%s: out is NULL", fn);
    *out = NULL;
    if (!path)
        return ebb_error_set(EBB_ERR_ARG, "%s: path is NULL", fn);
    if (!host_is_little_endian())
        return ebb_error_set(EBB_ERR_UNSUPPORTED, "%s: big-endian hosts are not supported", fn);
    ebb_safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->path = dup_str(path))) {
        free(st);
        return ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", fn);
    }
    int64_t size = 0;
    ebb_status s = ebb_file_open_read(&st->fd, &size, path, fn);
    if (s == EBB_OK && size < 8)
        s = BAD("%s: '%s' is %lld bytes, too short for the 8-byte header length", fn, path,
                (long long)size);
    unsigned char len8[8];
    if (s == EBB_OK && read_at(st->fd, len8, 8, 0) != 0)
        s = read_failed(st, fn, "the header length", 8);
    char *header = NULL;
    uint64_t hlen = 0;
    if (s == EBB_OK) {
        for (int i = 0; i < 8; i++)
            hlen |= (uint64_t)len8[i] << (8 * i);
        if (hlen > MAX_HEADER_BYTES)
            s = BAD("%s: '%s': header length %llu exceeds the %llu-byte limit", fn, path,
                    (unsigned long long)hlen, MAX_HEADER_BYTES);
        else if (hlen > (uint64_t)size - 8)
            s = BAD("%s: '%s': header length %llu runs past the end of the file (%lld bytes; "
                    "truncated?)",
                    fn, path, (unsigned long long)hlen, (long long)size);
        else if (!(header = malloc((size_t)hlen + 1)))
            s = ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory (a %llu-byte header)", fn,
                              (unsigned long long)hlen);
        else if (read_at(st->fd, header, (size_t)hlen, 8) != 0)
            s = read_failed(st, fn, "the header", 8 + hlen);
    }
    if (s == EBB_OK) {
        header[hlen] = '\0';
        st->data_at = 8 + hlen;
        st->data_size = (uint64_t)size - 8 - hlen;
        s = check_json_bytes(st, (const unsigned char *)header, (size_t)hlen);
        if (s == EBB_OK)
            s = parse_header(st, header, (size_t)hlen);
    }
    free(header);
    if (s != EBB_OK) {
        ebb_safetensors_close(st);
        return s;
    }
    *out = st;
    return EBB_OK;
}

const char *ebb_safetensors_path(const ebb_safetensors *st) { return st ? st->path : NULL; }

int ebb_safetensors_count(const ebb_safetensors *st) { return st ? st->n : 0; }

const char *ebb_safetensors_name_at(const ebb_safetensors *st, int i) {
    return st && i >= 0 && i < st->n ? st->entries[i].name : NULL;
}

const char *ebb_safetensors_metadata(const ebb_safetensors *st, const char *key) {
    if (!st || !key)
        return NULL;
    for (int i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta[i].key, key) == 0)
            return st->meta[i].value;
    return NULL;
}

const char *ebb_safetensors_dtype_str(const ebb_safetensors *st, const char *name) {
    if (!st || !name)
        return NULL;
    st_entry key = {.name = (char *)name};
    const st_entry *e = bsearch(&key, st->entries, (size_t)st->n, sizeof *st->entries,
                                by_entry_name);
    return e ? e->dtype->name : NULL;
}

/* The entry for `name`, with a usable dtype, or NULL and an error. */
static const st_entry *lookup(const ebb_safetensors *st, const char *name, const char *fn) {
    if (!st || !name) {
        ebb_error_set(EBB_ERR_ARG, "%s: %s is NULL", fn, st ? "name" : "reader");
        return NULL;
    }
    st_entry key = {.name = (char *)name};
    const st_entry *e = bsearch(&key, st->entries, (size_t)st->n, sizeof *st->entries,
                                by_entry_name);
    if (!e) {
        ebb_error_set(EBB_ERR_ARG, "%s: no tensor named '%s' in '%s' (%d tensors)", fn, name,
                      st->path, st->n);
        return NULL;
    }
    if (e->dtype->ebb < 0) {
        ebb_error_set(EBB_ERR_UNSUPPORTED,
                      "%s: tensor '%s' in '%s' has dtype %s, which ebb does not support", fn, name,
                      st->path, e->dtype->name);
        return NULL;
    }
    return e;
}

ebb_status ebb_safetensors_find(const ebb_safetensors *st, const char *name, ebb_dtype *dtype,
                                ebb_shape *shape) {
    const st_entry *e = lookup(st, name, "ebb_safetensors_find");
    if (!e)
        return ebb_errcode();
    if (dtype)
        *dtype = (ebb_dtype)e->dtype->ebb;
    if (shape)
        *shape = e->shape;
    return EBB_OK;
}

/* NaN and infinities among the elements of a floating dtype: the exponent
 * bits all set. Counted in fixed blocks with a narrow counter, a form the
 * compiler vectorizes at -O2 (the plain loop runs 8x slower). */
#define COUNT_EXP_ALL_SET(type, v, n, exp, out)                                                    \
    do {                                                                                           \
        size_t i_ = 0;                                                                             \
        for (; i_ + 64 <= (n); i_ += 64) {                                                         \
            uint32_t c_ = 0;                                                                       \
            for (int k_ = 0; k_ < 64; k_++)                                                        \
                c_ += (type)((v)[i_ + k_] & (exp)) == (type)(exp);                                 \
            (out) += c_;                                                                           \
        }                                                                                          \
        for (; i_ < (n); i_++)                                                                     \
            (out) += (type)((v)[i_] & (exp)) == (type)(exp);                                       \
    } while (0)

static int64_t count_nonfinite(const void *buf, size_t nbytes, ebb_dtype dt) {
    int64_t bad = 0;
    switch (dt) {
    case EBB_FLOAT32: COUNT_EXP_ALL_SET(uint32_t, (const uint32_t *)buf, nbytes / 4, 0x7f800000u, bad); break;
    case EBB_FLOAT64:
        COUNT_EXP_ALL_SET(uint64_t, (const uint64_t *)buf, nbytes / 8, 0x7ff0000000000000ull, bad);
        break;
    case EBB_FLOAT16: COUNT_EXP_ALL_SET(uint16_t, (const uint16_t *)buf, nbytes / 2, 0x7c00u, bad); break;
    case EBB_BFLOAT16: COUNT_EXP_ALL_SET(uint16_t, (const uint16_t *)buf, nbytes / 2, 0x7f80u, bad); break;
    default: break;
    }
    return bad;
}

/* Reads e's bytes into dst (same dtype and shape, checked by the caller).
 * A contiguous dst is filled chunk by chunk through views of it; any other
 * takes one buffer of the whole tensor. */
static ebb_status read_into(const ebb_safetensors *st, const st_entry *e, ebb_tensor *dst,
                            int64_t *nonfinite, const char *fn) {
    size_t nbytes = (size_t)(e->end - e->begin), elsize = e->dtype->size;
    ebb_dtype dt = (ebb_dtype)e->dtype->ebb;
    if (nonfinite)
        *nonfinite = 0;
    if (ebb_tensor_device(dst).type == EBB_DEVICE_META)
        return ebb_error_set(EBB_ERR_ARG, "%s: tensor '%s' from '%s': the destination is on the "
                                          "meta device (it has no storage)",
                             fn, e->name, st->path);
    if (nbytes == 0)
        return EBB_OK;
    ebb_tensor *flat = NULL;
    ebb_status s = EBB_OK;
    if (nbytes > READ_CHUNK) {
        ebb_shape fs = {1, {(int64_t)(nbytes / elsize)}};
        s = ebb_tensor_reshape(&flat, dst, &fs);
        if (s == EBB_OK && !ebb_tensor_same_storage(flat, dst)) {
            ebb_tensor_free(flat); /* reshape had to copy: dst is strided */
            flat = NULL;
        }
    }
    size_t chunk = flat ? READ_CHUNK : nbytes;
    /* the checksum ebb wrote, when the file has one */
    char key[600];
    snprintf(key, sizeof key, "%s%s", CRC_PREFIX, e->name);
    const char *want = ebb_safetensors_metadata(st, key);
    uLong crc = crc32(0L, Z_NULL, 0);
    void *buf = s == EBB_OK ? malloc(chunk) : NULL;
    if (s == EBB_OK && !buf)
        s = ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory (%zu bytes for '%s')", fn, chunk,
                          e->name);
    for (size_t at = 0; s == EBB_OK && at < nbytes; at += chunk) {
        size_t n = nbytes - at < chunk ? nbytes - at : chunk;
        uint64_t off = st->data_at + e->begin + at;
        if (read_at(st->fd, buf, n, off) != 0) {
            char what[600];
            snprintf(what, sizeof what, "tensor '%s'", e->name);
            s = read_failed(st, fn, what, st->data_at + e->end);
            break;
        }
        if (nonfinite)
            *nonfinite += count_nonfinite(buf, n, dt);
        if (want)
            crc = crc32_z(crc, buf, n);
        if (!flat) {
            s = ebb_tensor_copy_from_host(dst, buf, n);
        } else {
            ebb_tensor *part = NULL;
            s = ebb_tensor_narrow(&part, flat, 0, (int64_t)(at / elsize), (int64_t)(n / elsize));
            if (s == EBB_OK)
                s = ebb_tensor_copy_from_host(part, buf, n);
            ebb_tensor_free(part);
        }
        if (s != EBB_OK && ebb_errcode() != EBB_ERR_IO)
            ebb_error_prefix("%s: tensor '%s' from '%s'", fn, e->name, st->path);
    }
    free(buf);
    ebb_tensor_free(flat);
    char have[16];
    snprintf(have, sizeof have, "%08lx", crc & 0xffffffffUL);
    if (s == EBB_OK && want && strcmp(have, want) != 0)
        s = ebb_error_set(EBB_ERR_CORRUPT,
                          "%s: tensor '%s' in '%s' is damaged: its bytes' CRC-32 is %s, and the "
                          "file says %s",
                          fn, e->name, st->path, have, want);
    return s;
}

ebb_status ebb_safetensors_load_into_ex(const ebb_safetensors *st, const char *name,
                                        ebb_tensor *dst, int64_t *nonfinite) {
    static const char fn[] = "ebb_safetensors_load_into";
    if (nonfinite)
        *nonfinite = 0;
    const st_entry *e = lookup(st, name, fn);
    if (!e)
        return ebb_errcode();
    if (!dst)
        return ebb_error_set(EBB_ERR_ARG, "%s: dst is NULL", fn);
    ebb_dtype want = (ebb_dtype)e->dtype->ebb, have = ebb_tensor_dtype(dst);
    ebb_shape ds = ebb_tensor_shape(dst);
    if (want != have || !ebb_shape_equal(&ds, &e->shape) ||
        ebb_tensor_ndim(dst) != e->shape.ndim) {
        char a[128], b[128];
        return ebb_error_set(EBB_ERR_SHAPE,
                             "%s: tensor '%s' in '%s' is %s %s but the destination is %s %s", fn,
                             name, st->path, ebb_dtype_name(want),
                             ebb_shape_str(&e->shape, a, sizeof a), ebb_dtype_name(have),
                             ebb_shape_str(&ds, b, sizeof b));
    }
    return read_into(st, e, dst, nonfinite, fn);
}

ebb_status ebb_safetensors_load_into(const ebb_safetensors *st, const char *name,
                                     ebb_tensor *dst) {
    return ebb_safetensors_load_into_ex(st, name, dst, NULL);
}

ebb_status ebb_safetensors_load_ex(ebb_tensor **out, const ebb_safetensors *st, const char *name,
                                   ebb_device device, int64_t *nonfinite) {
    static const char fn[] = "ebb_safetensors_load";
    if (nonfinite)
        *nonfinite = 0;
    if (!out)
        return ebb_error_set(EBB_ERR_ARG, "%s: out is NULL", fn);
    *out = NULL;
    const st_entry *e = lookup(st, name, fn);
    if (!e)
        return ebb_errcode();
    if (device.type == EBB_DEVICE_META)
        return ebb_error_set(EBB_ERR_ARG, "%s: tensor '%s' from '%s': the meta device has no "
                                          "storage to load into",
                             fn, name, st->path);
    ebb_tensor *t = NULL;
    ebb_status s = ebb_tensor_empty(&t, &e->shape, (ebb_dtype)e->dtype->ebb, device);
    if (s != EBB_OK)
        return ebb_error_prefix("%s: tensor '%s' from '%s'", fn, name, st->path);
    s = read_into(st, e, t, nonfinite, fn);
    if (s != EBB_OK) {
        ebb_tensor_free(t);
        return s;
    }
    *out = t;
    return EBB_OK;
}

ebb_status ebb_safetensors_load(ebb_tensor **out, const ebb_safetensors *st, const char *name,
                                ebb_device device) {
    return ebb_safetensors_load_ex(out, st, name, device, NULL);
}
