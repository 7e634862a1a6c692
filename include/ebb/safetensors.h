/*
 * ebb/safetensors.h - reading and writing tensors in the safetensors format.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of
 * JSON naming each tensor's dtype, shape and byte range, then the raw
 * little-endian data. It is what PyTorch's `safetensors.torch.save_file`
 * writes, so parameters move between ebb and PyTorch by name:
 *
 *     // write
 *     const char *names[] = {"stem.weight", "stem.bias"};
 *     ebb_tensor *ts[] = {w, b};
 *     if (ebb_safetensors_write("model.safetensors", names, ts, 2) != EBB_OK) ...
 *
 *     // read: the header is checked at open; each load reads the tensor's bytes
 *     ebb_safetensors *st = NULL;
 *     if (ebb_safetensors_open(&st, "model.safetensors") != EBB_OK) ... ebb_errmsg() ...
 *     for (int i = 0; i < ebb_safetensors_count(st); i++)
 *         printf("%s\n", ebb_safetensors_name_at(st, i));
 *     if (ebb_safetensors_load_into(st, "stem.weight", w) != EBB_OK) ...
 *     ebb_safetensors_close(st);
 *
 * Supported dtypes: F32, F16, BF16, F64, I64, I32, U8, BOOL. A file may hold
 * tensors of other safetensors dtypes (I8, U16, F8_E4M3, ...): it opens, and
 * only looking those up fails, with EBB_ERR_UNSUPPORTED and a message naming
 * the tensor and its dtype. Malformed files are refused at open with
 * EBB_ERR_IO and a message naming the file and the problem (not a regular
 * file, truncated, header length past the end, a NUL or other byte JSON does
 * not allow, bad JSON, unknown dtype, offsets out of range, overlapping or
 * leaving gaps, duplicate names).
 *
 * Nothing is memory-mapped: a reader holds the open file and reads each
 * tensor with pread(2) in 1 MiB chunks straight into the destination. A file
 * truncated while a reader has it open is an EBB_ERR_IO "truncated while
 * reading" error at the load that misses its bytes, never a crash; a file
 * replaced by rename (as ebb_safetensors_write does) leaves the reader on the
 * old contents.
 */
#ifndef EBB_SAFETENSORS_H
#define EBB_SAFETENSORS_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes n tensors under the given names (unique, non-empty, not
 * "__metadata__") to `path`. The header carries {"format": "pt"} as
 * metadata; data is laid out by descending element size so every tensor is
 * aligned in a mapped file. Tensors may be on any device (they are copied to
 * the host) but not on the meta device.
 *
 * A regular file (or a new name) is written to a temporary file in the same
 * directory, synced and renamed over `path`: a failure (a full disk, say)
 * leaves no partial file and the old file intact, and the new file keeps the
 * old one's permissions. A symbolic link is followed and the file it points
 * to replaced. A character device (/dev/stdout) or a pipe is written into
 * directly; a directory or any other kind of file is refused (EBB_ERR_IO). */
EBB_API ebb_status ebb_safetensors_write(const char *path, const char *const *names,
                                 ebb_tensor *const *tensors, int n);
/* ebb_safetensors_write() with string metadata besides {"format": "pt"}:
 * metadata holds n_metadata key/value pairs, key then value (2 * n_metadata
 * strings), read back with ebb_safetensors_metadata(). A NULL or empty key,
 * a NULL value, or the key "format" is EBB_ERR_ARG. Keys are unique. */
EBB_API ebb_status ebb_safetensors_write_meta(const char *path, const char *const *names,
                                              ebb_tensor *const *tensors, int n,
                                              const char *const *metadata, int n_metadata);

typedef struct ebb_safetensors ebb_safetensors;

/* Opens `path` and validates its header. On success *out is a new reader
 * (close with ebb_safetensors_close) holding the file open. Anything but a
 * regular file (a directory, a FIFO, a device) is refused without blocking.
 * A reader is immutable: several threads may load from it. */
EBB_API ebb_status ebb_safetensors_open(ebb_safetensors **out, const char *path);
/* Closes the file and frees the reader (NULL is allowed). */
EBB_API void ebb_safetensors_close(ebb_safetensors *st);

/* The path the reader was opened with, owned by it. NULL st: NULL. */
EBB_API const char *ebb_safetensors_path(const ebb_safetensors *st);
/* Number of tensors in the file. NULL st: 0. */
EBB_API int ebb_safetensors_count(const ebb_safetensors *st);
/* The i-th tensor name in byte order of the names (strcmp), or NULL when i is
 * out of range. Valid until the reader is closed. */
EBB_API const char *ebb_safetensors_name_at(const ebb_safetensors *st, int i);
/* Looks a tensor up; dtype and shape (either may be NULL) receive its dtype
 * and shape. EBB_ERR_ARG when the file has no such tensor, and
 * EBB_ERR_UNSUPPORTED when its dtype has no ebb equivalent. */
EBB_API ebb_status ebb_safetensors_find(const ebb_safetensors *st, const char *name, ebb_dtype *dtype,
                                ebb_shape *shape);
/* The tensor's dtype as the file names it ("F32", "I8", ...), supported by
 * ebb or not; NULL when the file has no such tensor. For messages that must
 * tell "missing" from "there, in a dtype ebb cannot use". */
EBB_API const char *ebb_safetensors_dtype_str(const ebb_safetensors *st, const char *name);
/* A "__metadata__" value, or NULL. Valid until the reader is closed. */
EBB_API const char *ebb_safetensors_metadata(const ebb_safetensors *st, const char *key);

/* Reads the named tensor from the file into dst, which must have the same
 * dtype and shape (EBB_ERR_SHAPE otherwise, naming the tensor, both dtypes
 * and shapes and the file). dst may be on any device except meta; views of
 * dst see the new values. If the file turns out shorter than its header said
 * (it was truncated after open), EBB_ERR_IO says so; dst then holds part of
 * the new values. A tensor whose bytes do not match the CRC-32 that ebb
 * wrote beside it in the metadata ("crc32:NAME") is EBB_ERR_CORRUPT, naming
 * the tensor and the file; dst then holds the bytes as the file has them. */
EBB_API ebb_status ebb_safetensors_load_into(const ebb_safetensors *st, const char *name,
                                     ebb_tensor *dst);
/* The named tensor as a new tensor on `device` (the caller frees it). */
EBB_API ebb_status ebb_safetensors_load(ebb_tensor **out, const ebb_safetensors *st, const char *name,
                                ebb_device device);
/* ebb_safetensors_load_into(), also counting the NaN and infinite elements
 * met on the way into *nonfinite (0 for integer and bool dtypes; NULL to skip
 * counting). The count costs a pass over bytes already in the cache, not a
 * second read. NULL st, name or dst: EBB_ERR_ARG. */
EBB_API ebb_status ebb_safetensors_load_into_ex(const ebb_safetensors *st, const char *name,
                                        ebb_tensor *dst, int64_t *nonfinite);
/* ebb_safetensors_load(), counting non-finite elements into *nonfinite (NULL
 * to skip). NULL out, st or name: EBB_ERR_ARG, *out NULL. */
EBB_API ebb_status ebb_safetensors_load_ex(ebb_tensor **out, const ebb_safetensors *st, const char *name,
                                   ebb_device device, int64_t *nonfinite);

#ifdef __cplusplus
}
#endif
#endif /* EBB_SAFETENSORS_H */
