// Memory accounting and devices.
//
// The CPU side puts a counting allocator in front of libtorch's: every tensor
// storage allocation carries a 64-byte header holding its size, so a free is
// counted exactly without a lookup table. CUDA figures come from the caching
// allocator's own statistics.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include <c10/core/CPUAllocator.h>
#include <torch/version.h>
#ifdef EBB_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include "ebb/memory.h"
#include "shim.hpp"

namespace {

std::atomic<int64_t> live_handles{0};

struct CpuCounters {
    std::atomic<int64_t> current{0};
    std::atomic<int64_t> peak{0};
    std::atomic<int64_t> allocations{0};
    std::atomic<int64_t> frees{0};
} cpu;

// 64 bytes keeps the data pointer at c10's 64-byte alignment.
constexpr size_t kHeader = 64;

// ---- fault injection (ebb_memory_fail_nth, a testing aid) ----------------
// fail_countdown counts the allocations still to go before the one that
// fails; 0: disarmed. Only a positive value is decremented, so an allocation
// on another thread never takes it below zero.
std::atomic<int64_t> fail_countdown{0};
std::atomic<int> fail_fired{0};

bool inject_failure() {
    int64_t left = fail_countdown.load(std::memory_order_relaxed);
    while (left > 0 &&
           !fail_countdown.compare_exchange_weak(left, left - 1, std::memory_order_relaxed)) {
    }
    if (left != 1)
        return false;
    fail_fired.store(1, std::memory_order_relaxed);
    return true;
}

void raise_peak(int64_t now) {
    int64_t seen = cpu.peak.load(std::memory_order_relaxed);
    while (now > seen && !cpu.peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
}

// The context is the data pointer itself (libtorch's raw_allocate path
// requires that); the size lives in the header just before it.
void counting_free(void *data) {
    if (!data)
        return;
    void *base = static_cast<char *>(data) - kHeader;
    size_t n;
    std::memcpy(&n, base, sizeof n);
    cpu.current.fetch_sub(static_cast<int64_t>(n), std::memory_order_relaxed);
    cpu.frees.fetch_add(1, std::memory_order_relaxed);
    std::free(base);
}

// libtorch 2.3 made Allocator::allocate non-const and copy_data pure virtual.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define EBB_ALLOCATE_CONST
#else
#define EBB_ALLOCATE_CONST const
#endif

struct CountingCpuAllocator final : public c10::Allocator {
    c10::DataPtr allocate(size_t n) EBB_ALLOCATE_CONST override {
        const c10::Device cpu_device(c10::DeviceType::CPU);
        if (n == 0)
            return {nullptr, nullptr, &counting_free, cpu_device};
        // what a real out-of-memory does: libtorch's own allocator throws too
        if (inject_failure())
            throw std::bad_alloc();
        void *base = nullptr;
        if (posix_memalign(&base, kHeader, kHeader + n) != 0 || !base)
            throw std::bad_alloc();
        std::memcpy(base, &n, sizeof n);
        int64_t now = cpu.current.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed) +
                      static_cast<int64_t>(n);
        cpu.allocations.fetch_add(1, std::memory_order_relaxed);
        raise_peak(now);
        void *data = static_cast<char *>(base) + kHeader;
        return {data, data, &counting_free, cpu_device};
    }
    c10::DeleterFnPtr raw_deleter() const override { return &counting_free; }
    // Declared without `override`: only libtorch >= 2.3 has it as a virtual.
    void copy_data(void *dest, const void *src, std::size_t count) const {
        std::memcpy(dest, src, count);
    }
};

CountingCpuAllocator counting_allocator;

} // namespace

namespace ebb {
void count_handle(int delta) { live_handles.fetch_add(delta, std::memory_order_relaxed); }
} // namespace ebb

#ifdef EBB_WITH_CUDA
namespace {

// The caching allocator knows no device before libtorch's lazy CUDA start,
// which the first CUDA tensor triggers: its statistics of a device asked
// for earlier are an "invalid device" error. A one-element tensor starts it
// (and is freed at once).
void cuda_start(int index) {
    static std::once_flag started;
    std::call_once(started, [index] {
        (void)at::empty({1}, at::TensorOptions().device(at::kCUDA, static_cast<c10::DeviceIndex>(index)));
    });
}

} // namespace
#endif

extern "C" {

// Called once from ebb_init(). The highest priority keeps libtorch from
// replacing it later.
ebb_status ebb_tensor_layer_init(void) {
    try {
        c10::SetCPUAllocator(&counting_allocator, /*priority=*/255);
    } catch (...) {
        return ebb::fail_from_exception("ebb_init");
    }
    return EBB_OK;
}

void ebb_memory_fail_nth(int64_t n) {
    fail_fired.store(0, std::memory_order_relaxed);
    fail_countdown.store(n > 0 ? n : 0, std::memory_order_relaxed);
}

int ebb_memory_fail_fired(void) { return fail_fired.load(std::memory_order_relaxed); }

int64_t ebb_tensor_live_count(void) { return live_handles.load(std::memory_order_relaxed); }

ebb_status ebb_memory_stats_get(ebb_device device, ebb_memory_stats *out) {
    if (!out)
        return ebb_error_set(EBB_ERR_ARG, "ebb_memory_stats_get: out is NULL");
    std::memset(out, 0, sizeof *out);
    if (device.type == EBB_DEVICE_CPU) {
        out->current_bytes = cpu.current.load();
        out->reserved_bytes = out->current_bytes;
        out->peak_bytes = cpu.peak.load();
        out->allocations = cpu.allocations.load();
        out->frees = cpu.frees.load();
        return EBB_OK;
    }
#ifdef EBB_WITH_CUDA
    if (device.type == EBB_DEVICE_CUDA) {
        try {
            cuda_start(device.index);
            auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
                static_cast<c10::DeviceIndex>(device.index));
            // index 0 is the aggregate over small and large pools; the enum
            // naming it moved between libtorch versions
            const auto &all = stats.allocated_bytes[0];
            out->reserved_bytes = stats.reserved_bytes[0].current;
            out->current_bytes = all.current;
            out->peak_bytes = all.peak;
            out->allocations = all.allocated;
            out->frees = all.freed;
            return EBB_OK;
        } catch (...) {
            return ebb::fail_from_exception("ebb_memory_stats_get");
        }
    }
#endif
    char buf[32];
    return ebb_error_set(EBB_ERR_UNSUPPORTED, "ebb_memory_stats_get: no accounting for device %s",
                         ebb_device_str(device, buf, sizeof buf));
}

ebb_status ebb_device_memory_available(ebb_device device, int64_t *available, int64_t *total) {
    static const char fn[] = "ebb_device_memory_available";
    if (!available)
        return ebb_error_set(EBB_ERR_ARG, "%s: available is NULL", fn);
    *available = -1;
    if (total)
        *total = -1;
#ifdef EBB_WITH_CUDA
    if (device.type == EBB_DEVICE_CUDA) {
        try {
            c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device.index));
            cuda_start(device.index);
            size_t free_b = 0, total_b = 0;
            C10_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
            auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
                static_cast<c10::DeviceIndex>(device.index));
            int64_t cached = stats.reserved_bytes[0].current - stats.allocated_bytes[0].current;
            *available = static_cast<int64_t>(free_b) + (cached > 0 ? cached : 0);
            if (total)
                *total = static_cast<int64_t>(total_b);
            return EBB_OK;
        } catch (...) {
            return ebb::fail_from_exception(fn);
        }
    }
#endif
    char buf[32];
    return ebb_error_set(EBB_ERR_UNSUPPORTED, "%s: no free-memory figure for device %s%s", fn,
                         ebb_device_str(device, buf, sizeof buf),
                         device.type == EBB_DEVICE_CUDA ? " (this build has no CUDA)" : "");
}

ebb_status ebb_device_prepare(ebb_device device, int64_t *bytes) {
    static const char fn[] = "ebb_device_prepare";
    if (bytes)
        *bytes = 0;
    if (device.type != EBB_DEVICE_CUDA)
        return EBB_OK;
#ifdef EBB_WITH_CUDA
    // one entry per (device, stream) this thread has prepared: cuBLAS keeps a
    // handle per thread and a workspace per handle and stream
    struct prepared {
        int index;
        cudaStream_t stream;
        int64_t bytes;
    };
    thread_local std::vector<prepared> done;
    try {
        auto idx = static_cast<c10::DeviceIndex>(device.index);
        c10::cuda::CUDAGuard guard(idx);
        cuda_start(device.index);
        cudaStream_t stream = at::cuda::getCurrentCUDAStream(idx).stream();
        for (const prepared &p : done) {
            if (p.index == device.index && p.stream == stream) {
                if (bytes)
                    *bytes = p.bytes;
                return EBB_OK;
            }
        }
        cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
        C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
        if (capturing != cudaStreamCaptureStatusNone)
            return EBB_OK;
        int64_t before = c10::cuda::CUDACachingAllocator::getDeviceStats(idx).allocated_bytes[0].current;
        {
            // a linear with a bias (cuBLASLt's epilogue path) and plain
            // products, the calls a plan's linear, matmul and backward make
            auto o = at::TensorOptions().device(at::kCUDA, idx).dtype(at::kFloat);
            at::Tensor x = at::ones({4, 8}, o), w = at::ones({4, 8}, o), b = at::ones({4}, o);
            at::Tensor y = at::linear(x, w, b);
            at::Tensor g = at::mm(y.t(), x);
            at::Tensor h = at::bmm(x.unsqueeze(0), w.t().unsqueeze(0));
        }
        int64_t after = c10::cuda::CUDACachingAllocator::getDeviceStats(idx).allocated_bytes[0].current;
        done.push_back({device.index, stream, after - before});
        if (bytes)
            *bytes = after - before;
        return EBB_OK;
    } catch (...) {
        return ebb::fail_from_exception(fn);
    }
#else
    (void)fn;
    return EBB_OK;
#endif
}

int64_t ebb_memory_current(ebb_device device) {
    if (device.type == EBB_DEVICE_CPU)
        return cpu.current.load(std::memory_order_relaxed);
    ebb_memory_stats s;
    return ebb_memory_stats_get(device, &s) == EBB_OK ? s.current_bytes : 0;
}

void ebb_memory_reset_peak(ebb_device device) {
    if (device.type == EBB_DEVICE_CPU) {
        cpu.peak.store(cpu.current.load());
        return;
    }
#ifdef EBB_WITH_CUDA
    if (device.type == EBB_DEVICE_CUDA) {
        try {
            cuda_start(device.index);
            c10::cuda::CUDACachingAllocator::resetPeakStats(
                static_cast<c10::DeviceIndex>(device.index));
        } catch (...) {
            ebb::fail_from_exception("ebb_memory_reset_peak");
        }
    }
#endif
}

int ebb_cuda_available(void) {
#ifdef EBB_WITH_CUDA
    try {
        return at::cuda::is_available() ? 1 : 0;
    } catch (...) {
        return 0;
    }
#else
    return 0;
#endif
}

int ebb_cuda_device_count(void) {
#ifdef EBB_WITH_CUDA
    try {
        return static_cast<int>(c10::cuda::device_count());
    } catch (...) {
        return 0;
    }
#else
    return 0;
#endif
}

ebb_status ebb_device_synchronize(ebb_device device) {
#ifdef EBB_WITH_CUDA
    if (device.type == EBB_DEVICE_CUDA) {
        try {
            c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device.index));
            c10::cuda::device_synchronize();
        } catch (...) {
            return ebb::fail_from_exception("ebb_device_synchronize");
        }
    }
#else
    (void)device;
#endif
    return EBB_OK;
}

ebb_status ebb_cuda_set_tf32(int enabled) {
#ifdef EBB_WITH_CUDA
    try {
        at::globalContext().setAllowTF32CuBLAS(enabled != 0);
        at::globalContext().setAllowTF32CuDNN(enabled != 0);
    } catch (...) {
        return ebb::fail_from_exception("ebb_cuda_set_tf32");
    }
#else
    (void)enabled;
#endif
    return EBB_OK;
}

const char *ebb_torch_version(void) { return TORCH_VERSION; }

} // extern "C"
