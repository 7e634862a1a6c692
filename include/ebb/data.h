/*
 * ebb/data.h - datasets for training and evaluation: IDX files (MNIST's
 * format, gzip-compressed or not) and safetensors files whose first
 * dimension is the sample axis, read into host memory and handed out in
 * batches shaped as a plan's inputs and targets.
 *
 *     ebb_dataset *d = NULL;
 *     const char *names[] = {"x", "y"};               // the spec's input, then target
 *     if (ebb_dataset_open(&d, "fashion-mnist", names, 2) != EBB_OK) ... ebb_errmsg() ...
 *     int64_t n = ebb_dataset_size(d), *order = malloc(n * sizeof *order);
 *     ebb_dataset_order(order, n, seed, 1);           // a seeded shuffle
 *     for (int64_t at = 0; at + 32 <= n; at += 32) {  // drop the last partial batch
 *         ebb_tensor *x = NULL, *y = NULL;
 *         ebb_dataset_batch(&x, d, 0, order + at, 32, &(ebb_shape){2, {32, 784}},
 *                           EBB_FLOAT32, ebb_device_cpu());
 *         ebb_dataset_batch(&y, d, 1, order + at, 32, &(ebb_shape){1, {32}},
 *                           EBB_INT64, ebb_device_cpu());
 *         ...
 *     }
 *     ebb_dataset_free(d);
 *
 * A dataset is a set of fields (tensors) of the same number of samples, each
 * named: an IDX pair's images take the first name and its labels the second;
 * a safetensors dataset's fields are the file's tensors of those names.
 * Each field keeps its stored dtype; a batch converts to the dtype asked
 * for. uint8 values asked for as a floating dtype are images: they scale to
 * [0, 1], then, when ebb_dataset_set_normalize() was called for the field,
 * become (v - mean) / std. A batch's shape is any shape with the batch's
 * sample count first and a sample's element count after it: [32, 784] and
 * [32, 1, 28, 28] both take 28x28 images.
 *
 * Errors name the file and what is wrong with it (a bad magic number, a file
 * shorter than its header says, label and image counts that differ, a label
 * out of range) and leave nothing allocated.
 *
 * Text for a language model: "text:FILE" reads a file's bytes as tokens
 * (token id = byte value, a vocabulary of 256) and serves windows of T
 * bytes: sample i is x = bytes[i .. i+T) and y = bytes[i+1 .. i+T+1), the
 * next byte at every position, two fields of [B, T] batched as int64 (or
 * int32; a floating dtype is refused, so a text is never scaled as an
 * image). The first 90% of the file is the training split ("text:FILE" or
 * "text:FILE:train"), the last 10% the test split ("text:FILE:test"), as
 * nanoGPT holds out its last tenth, and "text:FILE:all" is every byte.
 * Training splits have a window at every byte (len - T of them, so an epoch
 * sees every context); the test split's windows follow one another (stride
 * T, (len - 1) / T of them), so evaluation predicts each held-out byte,
 * after the first, once. T is the input's second dimension:
 * ebb_dataset_open_ex() takes it from its expected input shape [B, T] (the
 * spec's input), and ebb_dataset_open_text() as an argument; plain
 * ebb_dataset_open() knows no T and refuses text. Only the split's bytes are
 * read, once; the target's field shares them.
 *
 *     ebb_shape want[2] = {EBB_SHAPE(64, 128), EBB_SHAPE(64, 128)};   // windows of 128 bytes
 *     ebb_dataset_expect ex = {.shapes = want, .n_shapes = 2};
 *     ebb_dataset_open_ex(&d, "text:/usr/share/games/fortunes/fortunes", names, 2, &ex);
 *
 * Reading is bounded: every header is read and checked before any data, so
 * a file that declares more than it holds, or more than the caller can take,
 * costs a few bytes of reading, not gigabytes of memory. A caller that knows
 * its shapes (a spec's input and target) says so with
 * ebb_dataset_open_ex(), and a file of the wrong shape is refused before
 * its data is read:
 *
 *     ebb_shape want[2] = {EBB_SHAPE(64, 784), EBB_SHAPE(64)};  // the batch is not compared
 *     ebb_dataset_expect ex = {.shapes = want, .n_shapes = 2, .max_bytes = 1ll << 30};
 *     ebb_dataset_open_ex(&d, "fashion-mnist", names, 2, &ex);
 */
#ifndef EBB_DATA_H
#define EBB_DATA_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ebb_dataset ebb_dataset;

/* The directory the Debian package dataset-fashion-mnist installs, which
 * `fashion-mnist` stands for in ebb_dataset_open(). */
#define EBB_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

/* The most memory one IDX file's data may take (16 GiB), counted as it is
 * held: int8 and int16 values as the int32 they become, 4 bytes each. */
#define EBB_DATASET_MAX_BYTES ((int64_t)1 << 34)

/* Reads one IDX file (gzip-compressed or not: zlib tells them apart) into a
 * new tensor on the CPU, in the file's element type (uint8, int8 as int32,
 * int16 as int32, int32, float32, float64), its dimensions the tensor's.
 * EBB_ERR_IO for a file that cannot be read, a bad magic number, more than
 * EBB_MAX_DIMS dimensions, data that would take more than
 * EBB_DATASET_MAX_BYTES, or a size that cannot hold what the header declares
 * (an uncompressed file of another size; a gzip file more than 1032 times
 * smaller, deflate's best), all found from the header and the file's size
 * before any data is read, or fewer bytes than the dimensions declare;
 * EBB_ERR_NOMEM when memory runs out, with the bytes the data takes. The
 * message names the file. */
EBB_API ebb_status ebb_idx_read(ebb_tensor **out, const char *path);

/* A dataset from an IDX pair: `images` (N samples of any shape) and
 * `labels` (N values, one dimension). The images become the field named
 * names[0], the labels names[1]. EBB_ERR_IO for an unreadable file,
 * EBB_ERR_ARG when the counts differ or labels has more than one dimension. */
EBB_API ebb_status ebb_dataset_open_idx(ebb_dataset **out, const char *images, const char *labels,
                                        const char *const names[2]);

/* A dataset from a safetensors file: one field per name, each the file's
 * tensor of that name, all with the same first dimension (the samples).
 * EBB_ERR_ARG naming the file and the tensor when one is missing, a scalar,
 * or of another sample count. */
EBB_API ebb_status ebb_dataset_open_safetensors(ebb_dataset **out, const char *path,
                                                const char *const *names, int n);

/* Which bytes of a text file a text dataset serves (see the top of this
 * file). */
typedef enum ebb_text_split {
    EBB_TEXT_TRAIN, /* the first 90%, a window at every byte */
    EBB_TEXT_TEST,  /* the last 10% (size / 10 bytes), windows one after another */
    EBB_TEXT_ALL,   /* the whole file, a window at every byte */
} ebb_text_split;

/* A dataset of a text file's byte tokens in windows of `block` bytes: the
 * field names[0] the window, names[1] the same one byte on. EBB_ERR_IO for
 * a file that cannot be read (missing, not a regular file, truncated while
 * read); EBB_ERR_ARG for a block below 1 or a split shorter than block + 1
 * bytes, naming the file, the split and both sizes; EBB_ERR_NOMEM, before
 * reading, for a split over EBB_DATASET_MAX_BYTES. */
EBB_API ebb_status ebb_dataset_open_text(ebb_dataset **out, const char *path,
                                         const char *const names[2], int64_t block,
                                         ebb_text_split split);

/* A dataset from a command line's description:
 *   fashion-mnist, fashion-mnist:train   the training split under EBB_FASHION_MNIST_DIR
 *   fashion-mnist:test                   its test split (t10k)
 *   DIR, DIR:train, DIR:test             the same file names in another directory
 *   IMAGES,LABELS                        two IDX files
 *   text:FILE, text:FILE:train           a text file's first 90% as byte tokens
 *   text:FILE:test, text:FILE:all        its last 10%, or all of it
 *   tokens:FILE[:u16|:u32][:train|:test|:all]
 *                                        a file of little-endian uint16 (or
 *                                        uint32) token ids, held as int32,
 *                                        split as text (nanoGPT's train.bin)
 *   FILE                                 a safetensors file
 * IDX datasets take two names (images, labels); a safetensors dataset one
 * field per name; a text or token dataset two (input, target), and its window length
 * from ebb_dataset_open_ex()'s expected input shape, so this call refuses
 * it. Errors as the calls above. */
EBB_API ebb_status ebb_dataset_open(ebb_dataset **out, const char *desc, const char *const *names,
                                    int n);

/* What a caller expects of a dataset, checked against the files' headers
 * before any data is read (ebb_dataset_open_ex()). */
typedef struct ebb_dataset_expect {
    /* NULL, or n_shapes entries, one per field in the order of the names:
     * the shape the field's batches will be asked for (ebb_dataset_batch()),
     * such as the spec's input or target shape. Its first dimension, the
     * batch, is not compared; the rest must hold as many elements as one
     * stored sample. An entry of ndim 0 is not checked. */
    const ebb_shape *shapes;
    int n_shapes; /* must be the number of fields when shapes is given */
    /* The most host memory all the fields may take together, counted from
     * the headers as they will be held (int8 and int16 as int32, float16 and
     * bfloat16 as float32); 0: no limit but EBB_DATASET_MAX_BYTES per IDX
     * file. A caller can pass what the process can still get (say
     * ebb_fit.available_bytes less what the run needs, run.h). */
    int64_t max_bytes;
} ebb_dataset_expect;

/* ebb_dataset_open(), checking what `expect` (NULL: nothing) says before
 * any data is read: EBB_ERR_SHAPE for a field whose samples do not fit its
 * expected shape, naming the file, the field and both shapes; EBB_ERR_NOMEM
 * for fields that would take more than expect->max_bytes, with the bytes;
 * EBB_ERR_ARG for an `expect` that does not match n. Text ("text:FILE")
 * takes its window length T from shapes[0], which must be [B, T] (and
 * shapes[1], when given, [B, T] too): EBB_ERR_SHAPE otherwise, EBB_ERR_ARG
 * without shapes. Errors as ebb_dataset_open() otherwise. */
EBB_API ebb_status ebb_dataset_open_ex(ebb_dataset **out, const char *desc,
                                       const char *const *names, int n,
                                       const ebb_dataset_expect *expect);

/* Frees the dataset (NULL is allowed). */
EBB_API void ebb_dataset_free(ebb_dataset *d);

/* Number of samples; 0 for NULL. */
EBB_API int64_t ebb_dataset_size(const ebb_dataset *d);
/* Number of fields; 0 for NULL. */
EBB_API int ebb_dataset_field_count(const ebb_dataset *d);
/* Field i's name, or NULL when i is out of range. */
EBB_API const char *ebb_dataset_field_name(const ebb_dataset *d, int i);
/* Field i's stored dtype (EBB_FLOAT32 when i is out of range). */
EBB_API ebb_dtype ebb_dataset_field_dtype(const ebb_dataset *d, int i);
/* Field i's shape as stored, samples first (ndim 0 when i is out of range);
 * a text field's is [windows, T]. */
EBB_API ebb_shape ebb_dataset_field_shape(const ebb_dataset *d, int i);
/* The file field i was read from, or NULL when i is out of range. */
EBB_API const char *ebb_dataset_field_file(const ebb_dataset *d, int i);

/* From now on, batches of field i in a floating dtype are (v - mean) / std,
 * after uint8's scaling to [0, 1]. EBB_ERR_ARG for a std that is not
 * positive and finite, a mean that is not finite, or i out of range. */
EBB_API ebb_status ebb_dataset_set_normalize(ebb_dataset *d, int i, double mean, double std);

/* Checks that every value of field i is a whole number in [0, classes): what
 * cross_entropy and nll take as class indices. EBB_ERR_ARG otherwise,
 * naming the file, the sample (a text's byte offset) and the value. */
EBB_API ebb_status ebb_dataset_check_classes(const ebb_dataset *d, int i, int64_t classes);

/* order[0..n) receives 0..n-1, shuffled (Fisher-Yates with a generator
 * seeded by `seed`, the same order for the same seed on every machine) when
 * `shuffle` is non-zero, else in order. */
EBB_API void ebb_dataset_order(int64_t *order, int64_t n, uint64_t seed, int shuffle);

/* A new tensor of `shape` and `dtype` on `device` holding field i of the
 * samples index[0..count): shape->dim[0] must be count, and the rest of the
 * shape must hold as many elements as one sample has. The values convert to
 * `dtype` (float32, float64, int64 or int32, or float16 and bfloat16, made
 * as float32 and rounded to the nearest, as x.to(torch.bfloat16) does; see
 * the top of this file for uint8 images; text fields take int64 and int32
 * only). EBB_ERR_SHAPE for a shape that does not fit, EBB_ERR_ARG for an
 * index out of range or an unsupported dtype. */
EBB_API ebb_status ebb_dataset_batch(ebb_tensor **out, const ebb_dataset *d, int i,
                                     const int64_t *index, int64_t count, const ebb_shape *shape,
                                     ebb_dtype dtype, ebb_device device);

#ifdef __cplusplus
}
#endif
#endif /* EBB_DATA_H */
