// The CPU's kernels and threads (include/ebb/cpu.h): what ATen, oneDNN and
// the BLAS run here after the environment's caps, and the intra-op thread
// count ebb_init chooses.
#include <dlfcn.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <unistd.h>

#include "ebb/cpu.h"
#include "internal.h"
#include "shim.hpp"

namespace {

// oneDNN's instruction sets, lowest first, each with what it needs of the
// CPU (GCC's __builtin_cpu_supports names) and the name its cap takes.
struct isa_level {
    const char *name;     // as oneDNN's verbose mode and ONEDNN_MAX_CPU_ISA spell it (lower case)
    bool (*present)(void);
};

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
bool has_sse41() { return __builtin_cpu_supports("sse4.1"); }
bool has_avx() { return __builtin_cpu_supports("avx"); }
bool has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
bool has_avx512_core() {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
bool has_avx512_vnni() { return has_avx512_core() && __builtin_cpu_supports("avx512vnni"); }
bool has_avx512_bf16() { return has_avx512_vnni() && __builtin_cpu_supports("avx512bf16"); }
// CPUID leaf 7's EDX: bit 23 AVX512_FP16, bit 22 AMX_BF16 (clang 14's
// __builtin_cpu_supports knows neither name)
bool leaf7_edx(int bit) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> bit & 1u);
}
bool has_avx512_fp16() { return has_avx512_bf16() && leaf7_edx(23); }
bool has_amx() { return has_avx512_fp16() && leaf7_edx(22); }
#define EBB_X86 1
#else
#define EBB_X86 0
#endif

#if EBB_X86
const isa_level levels[] = {
    {"sse41", has_sse41},
    {"avx", has_avx},
    {"avx2", has_avx2},
    {"avx512_core", has_avx512_core},
    {"avx512_core_vnni", has_avx512_vnni},
    {"avx512_core_bf16", has_avx512_bf16},
    {"avx512_core_fp16", has_avx512_fp16},
    {"avx512_core_amx", has_amx},
};
const int n_levels = sizeof levels / sizeof levels[0];

int level_of(const char *name) {
    for (int i = 0; i < n_levels; i++)
        if (!std::strcmp(levels[i].name, name))
            return i;
    return n_levels;
}

// The level ONEDNN_MAX_CPU_ISA (DNNL_MAX_CPU_ISA before oneDNN 3.0) caps
// oneDNN at: the highest level whose name the cap starts with, or every
// level for none, ALL or DEFAULT. AVX10_1_512 is oneDNN's name for the
// AVX512_CORE_FP16 level, AVX10_1_512_AMX... for AMX's; other names this
// table lacks (AVX2_VNNI, ...) cap at the table's level below them.
int onednn_cap() {
    const char *cap = std::getenv("ONEDNN_MAX_CPU_ISA");
    if (!cap || !*cap)
        cap = std::getenv("DNNL_MAX_CPU_ISA");
    if (!cap || !*cap)
        return n_levels - 1;
    std::string c(cap);
    for (char &ch : c)
        ch = (char)std::tolower((unsigned char)ch);
    if (c == "all" || c == "default")
        return n_levels - 1;
    if (c.rfind("avx10_1_512_amx", 0) == 0)
        return level_of("avx512_core_amx");
    if (c.rfind("avx10", 0) == 0)
        return level_of("avx512_core_fp16");
    int best = -1;
    for (int i = 0; i < n_levels; i++)
        if (c.rfind(levels[i].name, 0) == 0)
            best = i;
    return best < 0 ? n_levels - 1 : best;
}

// oneDNN's effective level: the CPU's highest, no higher than the cap.
int onednn_level() {
    int top = -1;
    for (int i = 0; i < n_levels && levels[i].present(); i++)
        top = i;
    int cap = onednn_cap();
    return top < cap ? top : cap;
}

#endif

// "AVX2" from the build's own summary line "CPU capability usage: AVX2",
// which reports ATEN_CPU_CAPABILITY's effect in 1.13 and 2.x alike.
void aten_capability(char *buf, size_t size) {
    std::snprintf(buf, size, "unknown");
    try {
        std::string cfg = at::show_config();
        const char *key = "CPU capability usage: ";
        size_t at = cfg.find(key);
        if (at == std::string::npos)
            return;
        at += std::strlen(key);
        size_t end = cfg.find('\n', at);
        std::snprintf(buf, size, "%s", cfg.substr(at, end - at).c_str());
    } catch (...) {
    }
}

// OpenBLAS names the kernels it chose (OPENBLAS_CORETYPE lowers them);
// pip's torch links MKL in, which MKL_ENABLE_INSTRUCTIONS caps.
void blas_kernels(char *buf, size_t size) {
    using corename_fn = char *(*)(void);
    auto corename = reinterpret_cast<corename_fn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
    if (corename && corename()) {
        std::snprintf(buf, size, "OpenBLAS %s", corename());
        return;
    }
    if (dlsym(RTLD_DEFAULT, "MKL_Get_Version_String")) {
        const char *cap = std::getenv("MKL_ENABLE_INSTRUCTIONS");
        std::snprintf(buf, size, "MKL %s", cap && *cap ? cap : "(the CPU's best)");
        return;
    }
    std::snprintf(buf, size, "unknown");
}

} // namespace

// Whether libtorch multiplies float16 matrices on the CPU: asked once, of
// libtorch itself (1.13 has no CPU addmm for Half; 2.x has).
static int fp16_matmul_works() {
    static const int works = [] {
        try {
            c10::InferenceMode guard;
            at::Tensor a = at::ones({2, 2}, at::kHalf);
            at::addmm(a, a, a);
            return 1;
        } catch (...) {
            return 0;
        }
    }();
    return works;
}

extern "C" ebb_status ebb_cpu_info_get(ebb_cpu_info *out) {
    if (!out)
        return ebb_error_set(EBB_ERR_ARG, "ebb_cpu_info_get: out is NULL");
    std::memset(out, 0, sizeof *out);
    out->threads = ebb_tensor_num_threads();
    aten_capability(out->aten, sizeof out->aten);
    blas_kernels(out->blas, sizeof out->blas);
    out->bf16_usable = 1;
    out->fp16_usable = fp16_matmul_works();
#if EBB_X86
    int level = onednn_level();
    std::snprintf(out->onednn, sizeof out->onednn, "%s", level >= 0 ? levels[level].name : "none");
    out->bf16_native = level >= level_of("avx512_core_bf16");
    out->fp16_native = level >= level_of("avx512_core_fp16");
#if TORCH_VERSION_MAJOR < 2
    // 1.13 asks cpuinfo, not oneDNN, whether oneDNN takes bfloat16
    // (mkldnn_bf16_device_check), so a cap below AVX-512 makes oneDNN refuse
    // what ATen hands it: a real AVX2 CPU runs ATen's own kernels instead.
    out->bf16_usable = !(has_avx512_core() && level < level_of("avx512_core"));
#endif
#else
    std::snprintf(out->onednn, sizeof out->onednn, "unknown");
#endif
    return EBB_OK;
}

extern "C" const char *ebb_cpu_info_str(const ebb_cpu_info *ci, char *buf, size_t size) {
    if (!buf || !size)
        return buf;
    if (!ci) {
        std::snprintf(buf, size, "unknown");
        return buf;
    }
    const char *low = ci->bf16_native && ci->fp16_native ? "native bfloat16 and float16"
                      : ci->bf16_native                  ? "native bfloat16, no native float16"
                                                         : "no native bfloat16 or float16";
    std::snprintf(buf, size, "%d thread%s; kernels ATen %s, oneDNN %s, %s; %s", ci->threads,
                  ci->threads == 1 ? "" : "s", ci->aten, ci->onednn, ci->blas, low);
    return buf;
}

extern "C" ebb_status ebb_set_num_threads(int n) {
    if (n < 1 || n > 1024)
        return ebb_error_set(EBB_ERR_ARG, "ebb_set_num_threads: %d threads; give 1 to 1024", n);
    try {
        at::set_num_threads(n);
    } catch (...) {
        return ebb::fail_from_exception("ebb_set_num_threads");
    }
    return EBB_OK;
}

// libtorch's own count, as ebb_init found it (ebb_set_num_threads changes
// the current one).
static int torch_default_threads = 0;

extern "C" int ebb_default_num_threads(void) {
    int torch_default = torch_default_threads ? torch_default_threads : ebb_tensor_num_threads();
    if (std::getenv("OMP_NUM_THREADS") || torch_default <= 1)
        return torch_default < 1 ? 1 : torch_default;
    // Every intra-op region waits for its slowest thread, so a thread that
    // shares its core with another process holds up the rest: on a 2-core
    // machine at a load of 4, an MLP epoch took 178 s on 2 threads and 8.6 s
    // on 1. Take the cores the load leaves idle.
    double load = 0;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (getloadavg(&load, 1) != 1 || online < 1)
        return torch_default;
    long idle = online - (long)(load + 0.5);
    if (idle < 1)
        idle = 1;
    return idle < torch_default ? (int)idle : torch_default;
}

// ebb_init: EBB_NUM_THREADS, else the default above.
extern "C" ebb_status ebb_tensor_threads_init(void) {
    torch_default_threads = ebb_tensor_num_threads();
    const char *env = std::getenv("EBB_NUM_THREADS");
    if (env && *env) {
        char *end = nullptr;
        long n = std::strtol(env, &end, 10);
        if (*end || n < 1 || n > 1024)
            return ebb_error_set(EBB_ERR_ARG, "EBB_NUM_THREADS=%s: give a thread count from 1 to 1024",
                                 env);
        return ebb_set_num_threads((int)n);
    }
    int n = ebb_default_num_threads();
    return n == ebb_tensor_num_threads() ? EBB_OK : ebb_set_num_threads(n);
}
