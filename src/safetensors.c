/* safetensors: an 8-byte little-endian header length, a JSON header (parsed
 * with cJSON), then the raw data. The reader maps the file and validates the
 * whole header once at open, so a lookup or a load is a table search and one
 * copy from the mapping into the destination tensor. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ebb/safetensors.h"

/* The reference implementation's limit: a header this large is an attack. */
#define MAX_HEADER_BYTES 100000000ull
/* Integers in the JSON header are doubles to cJSON: exact up to 2^53. */
#define MAX_JSON_INT 9007199254740992.0

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

/* Builds the JSON header for items in data order; NULL when out of memory. */
static char *build_header(const char *const *names, ebb_tensor *const *tensors,
                          const write_item *items, int n) {
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    cJSON *meta = ok ? cJSON_AddObjectToObject(root, "__metadata__") : NULL;
    ok = ok && meta && cJSON_AddStringToObject(meta, "format", "pt");
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

static ebb_status write_all(FILE *f, const void *data, size_t n, const char *tmp) {
    if (n && fwrite(data, 1, n, f) != n)
        return ebb_error_set(EBB_ERR_IO, "ebb_safetensors_write: writing '%s': %s", tmp,
                             strerror(errno));
    return EBB_OK;
}

/* Writes header and data to the open temporary file. */
static ebb_status write_body(FILE *f, const char *tmp, const char *const *names,
                             ebb_tensor *const *tensors, const write_item *items, int n) {
    char *header = build_header(names, tensors, items, n);
    if (!header)
        return ebb_error_set(EBB_ERR_NOMEM,
                             "ebb_safetensors_write: out of memory building the header");
    size_t hlen = strlen(header), padded = hlen;
    while ((8 + padded) % 8) /* data starts 8-byte aligned */
        padded++;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((unsigned long long)padded >> (8 * i));
    ebb_status st = write_all(f, len8, 8, tmp);
    if (st == EBB_OK)
        st = write_all(f, header, hlen, tmp);
    for (size_t i = hlen; st == EBB_OK && i < padded; i++)
        st = write_all(f, " ", 1, tmp);
    free(header);

    void *buf = NULL;
    size_t cap = 0;
    for (int i = 0; st == EBB_OK && i < n; i++) {
        size_t nb = items[i].nbytes;
        if (nb == 0)
            continue;
        if (nb > cap) {
            void *grown = realloc(buf, nb);
            if (!grown) {
                st = ebb_error_set(EBB_ERR_NOMEM,
                                   "ebb_safetensors_write: out of memory (%zu bytes for '%s')", nb,
                                   names[items[i].index]);
                break;
            }
            buf = grown;
            cap = nb;
        }
        st = ebb_tensor_to_host(tensors[items[i].index], buf, nb);
        if (st != EBB_OK)
            ebb_error_prefix("ebb_safetensors_write: tensor '%s'", names[items[i].index]);
        else
            st = write_all(f, buf, nb, tmp);
    }
    free(buf);
    return st;
}

ebb_status ebb_safetensors_write(const char *path, const char *const *names,
                                 ebb_tensor *const *tensors, int n) {
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

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) {
        free(items);
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_safetensors_write: out of memory");
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp.XXXXXX", 12);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        st = ebb_error_set(EBB_ERR_IO,
                           "ebb_safetensors_write: cannot create a file next to '%s': %s", path,
                           strerror(errno));
        free(tmp);
        free(items);
        return st;
    }
    (void)fchmod(fd, 0644); /* mkstemp's 0600 would make the file private */
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        st = ebb_error_set(EBB_ERR_IO, "ebb_safetensors_write: '%s': %s", tmp, strerror(errno));
        close(fd);
    } else {
        st = write_body(f, tmp, names, tensors, items, n);
        if (st == EBB_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0))
            st = ebb_error_set(EBB_ERR_IO, "ebb_safetensors_write: writing '%s': %s", tmp,
                               strerror(errno));
        if (fclose(f) != 0 && st == EBB_OK)
            st = ebb_error_set(EBB_ERR_IO, "ebb_safetensors_write: closing '%s': %s", tmp,
                               strerror(errno));
    }
    if (st == EBB_OK && rename(tmp, path) != 0)
        st = ebb_error_set(EBB_ERR_IO, "ebb_safetensors_write: cannot rename '%s' to '%s': %s", tmp,
                           path, strerror(errno));
    if (st != EBB_OK)
        unlink(tmp);
    free(tmp);
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
    unsigned char *map;
    size_t size;
    const unsigned char *data; /* map + 8 + header length */
    uint64_t data_size;
    st_entry *entries; /* sorted by name */
    int n;
    st_meta *meta;
    int n_meta;
};

void ebb_safetensors_close(ebb_safetensors *st) {
    if (!st)
        return;
    if (st->map)
        munmap(st->map, st->size);
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

ebb_status ebb_safetensors_open(ebb_safetensors **out, const char *path) {
    if (!out)
        return ebb_error_set(EBB_ERR_ARG, "ebb_safetensors_open: out is NULL");
    *out = NULL;
    if (!path)
        return ebb_error_set(EBB_ERR_ARG, "ebb_safetensors_open: path is NULL");
    if (!host_is_little_endian())
        return ebb_error_set(EBB_ERR_UNSUPPORTED,
                             "ebb_safetensors_open: big-endian hosts are not supported");
    ebb_safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->path = dup_str(path))) {
        free(st);
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_safetensors_open: out of memory");
    }
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        ebb_status s = ebb_error_set(EBB_ERR_IO, "ebb_safetensors_open: cannot open '%s': %s", path,
                                     strerror(errno));
        ebb_safetensors_close(st);
        return s;
    }
    struct stat sb;
    ebb_status s = EBB_OK;
    if (fstat(fd, &sb) != 0)
        s = ebb_error_set(EBB_ERR_IO, "ebb_safetensors_open: cannot stat '%s': %s", path,
                          strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        s = BAD("ebb_safetensors_open: '%s' is not a regular file", path);
    else if (sb.st_size < 8)
        s = BAD("ebb_safetensors_open: '%s' is %lld bytes, too short for the 8-byte header length",
                path, (long long)sb.st_size);
    if (s == EBB_OK) {
        st->size = (size_t)sb.st_size;
        void *m = mmap(NULL, st->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED)
            s = ebb_error_set(EBB_ERR_IO, "ebb_safetensors_open: cannot map '%s': %s", path,
                              strerror(errno));
        else
            st->map = m;
    }
    close(fd);
    if (s == EBB_OK && st->map) {
        uint64_t hlen = 0;
        for (int i = 0; i < 8; i++)
            hlen |= (uint64_t)st->map[i] << (8 * i);
        if (hlen > MAX_HEADER_BYTES)
            s = BAD("ebb_safetensors_open: '%s': header length %llu exceeds the %llu-byte limit",
                    path, (unsigned long long)hlen, MAX_HEADER_BYTES);
        else if (hlen > st->size - 8)
            s = BAD("ebb_safetensors_open: '%s': header length %llu runs past the end of the file "
                    "(%zu bytes; truncated?)",
                    path, (unsigned long long)hlen, st->size);
        else {
            st->data = st->map + 8 + hlen;
            st->data_size = st->size - 8 - hlen;
            s = parse_header(st, (const char *)st->map + 8, (size_t)hlen);
        }
    }
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

ebb_status ebb_safetensors_load_into(const ebb_safetensors *st, const char *name,
                                     ebb_tensor *dst) {
    static const char fn[] = "ebb_safetensors_load_into";
    const st_entry *e = lookup(st, name, fn);
    if (!e)
        return ebb_errcode();
    if (!dst)
        return ebb_error_set(EBB_ERR_ARG, "%s: dst is NULL", fn);
    ebb_dtype want = (ebb_dtype)e->dtype->ebb, have = ebb_tensor_dtype(dst);
    ebb_shape ds = ebb_tensor_shape(dst);
    if (want != have || !ebb_shape_equal(&ds, &e->shape)) {
        char a[128], b[128];
        return ebb_error_set(EBB_ERR_SHAPE,
                             "%s: tensor '%s' in '%s' is %s %s but the destination is %s %s", fn,
                             name, st->path, ebb_dtype_name(want),
                             ebb_shape_str(&e->shape, a, sizeof a), ebb_dtype_name(have),
                             ebb_shape_str(&ds, b, sizeof b));
    }
    ebb_status s = ebb_tensor_copy_from_host(dst, st->data + e->begin, (size_t)(e->end - e->begin));
    if (s != EBB_OK)
        ebb_error_prefix("%s: tensor '%s' from '%s'", fn, name, st->path);
    return s;
}

ebb_status ebb_safetensors_load(ebb_tensor **out, const ebb_safetensors *st, const char *name,
                                ebb_device device) {
    static const char fn[] = "ebb_safetensors_load";
    if (!out)
        return ebb_error_set(EBB_ERR_ARG, "%s: out is NULL", fn);
    *out = NULL;
    const st_entry *e = lookup(st, name, fn);
    if (!e)
        return ebb_errcode();
    ebb_status s = ebb_tensor_from_host(out, st->data + e->begin, (size_t)(e->end - e->begin),
                                        &e->shape, (ebb_dtype)e->dtype->ebb, device);
    if (s != EBB_OK)
        ebb_error_prefix("%s: tensor '%s' from '%s'", fn, name, st->path);
    return s;
}
