/* The tensor layer on its own: allocate, compute, and watch the allocator. */
#include <stdio.h>

#include "ebb/ebb.h"

int main(void) {
    if (ebb_init() != EBB_OK) {
        fprintf(stderr, "ebb_init: %s\n", ebb_errmsg());
        return 1;
    }
    ebb_device dev = ebb_device_default();
    char name[32];
    printf("ebb %s on libtorch %s, device %s\n", ebb_version(), ebb_torch_version(),
           ebb_device_str(dev, name, sizeof name));

    ebb_shape sx = EBB_SHAPE(256, 1024), sw = EBB_SHAPE(1024, 1024);
    ebb_tensor *x = NULL, *w = NULL, *y = NULL;
    int64_t base = ebb_memory_current(dev);
    if (ebb_tensor_randn(&x, &sx, EBB_FLOAT32, dev, 1) || ebb_tensor_randn(&w, &sw, EBB_FLOAT32, dev, 2) ||
        ebb_tensor_matmul(&y, x, w)) {
        fprintf(stderr, "%s\n", ebb_errmsg());
        return 1;
    }
    printf("x, w, y allocated: %lld bytes (x 1 MiB + w 4 MiB + y 1 MiB)\n",
           (long long)(ebb_memory_current(dev) - base));
    ebb_tensor_free(x);
    ebb_tensor_free(w);
    ebb_tensor_free(y);

    ebb_tensor *bad = NULL;
    ebb_shape s2 = EBB_SHAPE(2, 3), s3 = EBB_SHAPE(4, 5);
    ebb_tensor_ones(&x, &s2, EBB_FLOAT32, dev);
    ebb_tensor_ones(&w, &s3, EBB_FLOAT32, dev);
    if (ebb_tensor_matmul(&bad, x, w) != EBB_OK)
        printf("a shape error is a status: %s\n", ebb_errmsg());
    ebb_tensor_free(x);
    ebb_tensor_free(w);
    printf("after freeing: %lld bytes, %lld live handles\n",
           (long long)(ebb_memory_current(dev) - base), (long long)ebb_tensor_live_count());
    return 0;
}
