// ebb_bench: runs one bench workload at a time for the driver (run.py),
// timing ebb and its hand-written libtorch twin interleaved, A B A B, in this
// one process. The driver runs PyTorch eager itself and alternates rounds
// with this process, so all three are measured side by side in one run.
//
// `ebb_bench --device cuda[:N]` runs the training steps (ebb's and the C++
// twin's: model, optimizer state, input and target) on that device, each
// timed step between two device synchronisations, and reads the peaks from
// that device's allocator; the default is the CPU. The forward commands
// (setup, measure, round) run on the CPU only and refuse another device.
//
// Protocol: one command per line on stdin, one JSON object per line on
// stdout ("-" stands for an empty argument):
//   setup WORKLOAD SPEC EXPORT_PREFIX PARAMS_CSV BIND_CSV FILLS_CSV
//   measure            peak bytes: ebb measured/planned/keep_all, C++ twin
//   round N            N forwards of each, alternating; times in ms, wall
//                      clock and this thread's CPU time
//   has_op NAME        whether ebb has the op (the driver skips workloads without)
//   train_setup WORKLOAD SPEC EXPORT_PREFIX PARAMS_CSV BIND_CSV FILLS_CSV LOSS
//                      a training step instead (ebb_train_step and the C++
//                      autograd twin), checked by running two steps of each;
//                      {"skipped": why} when ebb cannot train the workload
//   train_measure      peak bytes of one step: ebb measured/planned, C++ twin
//   train_round N      N training steps of each, alternating; times in ms (wall
//                      and thread CPU) and each step's minor page faults; on
//                      CUDA each timed region ends with a device synchronisation
//   teardown
//   quit
// `ebb_bench explain SPEC PARAMS_CSV BIND_CSV` prints the plan instead, and
// `ebb_bench profile WORKLOAD SPEC PARAMS_CSV BIND_CSV FILLS_CSV N ebb|cxx`
// runs N forwards of one side only, for a profiler:
//   valgrind --tool=callgrind --toggle-collect='*bench_forward_*' ebb_bench profile ...
// `ebb_bench profile-train WORKLOAD SPEC PARAMS_CSV BIND_CSV FILLS_CSV LOSS N ebb|cxx`
// does the same for training steps (collect '*bench_train_*'), on --device's.
// `ebb_bench precision` speaks another protocol: one workload's training step
// at several precisions (fp32, bf16), for tests/bench/precision.py; see
// bench_precision.c.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <time.h>

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include "bench_ebb.h"
#include "bench_precision.h"
#include "bench_twins.hpp"

namespace {

std::string arg(const std::string &s) { return s == "-" ? std::string() : s; }

std::string json_escape(const std::string &s) {
    std::string o;
    for (char c : s) {
        if (c == '"' || c == '\\')
            o += '\\';
        if (c == '\n') {
            o += "\\n";
            continue;
        }
        o += c;
    }
    return o;
}

void reply_error(const std::string &msg) {
    std::printf("{\"error\": \"%s\"}\n", json_escape(msg).c_str());
    std::fflush(stdout);
}

at::Tensor from_host(const std::vector<float> &v, const ebb_shape &s) {
    std::vector<int64_t> dims(s.dim, s.dim + s.ndim);
    return at::from_blob(const_cast<float *>(v.data()), dims, at::kFloat).clone();
}

// ebb's input from its float32 host copy: int64 again where it holds token ids.
at::Tensor input_from_host(const bench_ebb *ebb, const std::vector<float> &v, const ebb_shape &s) {
    at::Tensor x = from_host(v, s);
    return bench_ebb_input_is_index(ebb) ? x.to(at::kLong) : x;
}

bool on_cpu(ebb_device d) { return d.type == EBB_DEVICE_CPU; }

// The ATen device of an ebb device.
at::Device aten_device(ebb_device d) {
    return on_cpu(d) ? at::Device(at::kCPU)
                     : at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(d.index));
}

// A host copy moved to the device (the same tensor on the CPU).
at::Tensor on_device(const at::Tensor &t, ebb_device d) {
    return on_cpu(d) ? t : t.to(aten_device(d));
}

std::string device_name(ebb_device d) {
    char buf[32];
    return ebb_device_str(d, buf, sizeof buf);
}

std::map<std::string, long> parse_cfg(const std::string &csv) {
    std::map<std::string, long> m;
    std::stringstream ss(csv);
    std::string item;
    while (std::getline(ss, item, ',')) {
        auto eq = item.find('=');
        if (eq != std::string::npos)
            m[item.substr(0, eq)] = std::atol(item.c_str() + eq + 1);
    }
    return m;
}

// Minor page faults of this process so far: a step whose tensors land in
// fresh pages (glibc handing out newly mapped memory) pays for each one.
long minor_faults() {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_minflt : 0;
}

// This thread's CPU time: with one intra-op thread every ATen call of a step
// runs on it, so on a machine shared with other work this is the step's cost
// without the time it spent preempted.
double cpu_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// ebb's parameter values, copied through the host to `dev`, in plan order.
bool copy_params(bench_ebb *ebb, bench::NamedParams &named, std::vector<bool> &trained,
                 ebb_device dev) {
    for (int i = 0; i < bench_ebb_param_count(ebb); i++) {
        ebb_shape s = bench_ebb_param_shape(ebb, i);
        std::vector<float> host(static_cast<size_t>(ebb_shape_numel(&s)));
        if (bench_ebb_param_host(ebb, i, host.data(), host.size()) != EBB_OK)
            return false;
        named.emplace_back(bench_ebb_param_name(ebb, i), on_device(from_host(host, s), dev));
        trained.push_back(bench_ebb_param_trained(ebb, i) != 0);
    }
    return true;
}

std::string json_list(const std::vector<double> &v) {
    std::string s = "[";
    char buf[40];
    for (size_t i = 0; i < v.size(); i++) {
        std::snprintf(buf, sizeof buf, i ? ", %.9g" : "%.9g", v[i]);
        s += buf;
    }
    return s + "]";
}

struct Session {
    ebb_device dev = ebb_device_cpu(); // --device: where the training steps run
    bench_ebb *ebb = nullptr;
    bench::Forward twin;
    std::unique_ptr<bench::TrainTwin> train_twin;
    bool capture_tried = false; // the training step's CUDA graph (train_round)
    std::string capture_why;    // why there is none, or empty
    at::Tensor x;
    std::string workload;

    void clear() {
        twin = nullptr;
        train_twin.reset();
        x = at::Tensor();
        bench_ebb_free(ebb);
        ebb = nullptr;
        capture_tried = false;
        capture_why.clear();
    }

    // Loss checks: two steps of each from the same parameters. The second
    // step's loss shows the first update was the same.
    static constexpr int kCheckSteps = 2;

    void train_setup(std::istringstream &in) {
        std::string spec, prefix, params, bind, fills, loss;
        in >> workload >> spec >> prefix >> params >> bind >> fills >> loss;
        clear();
        ebb_status st = bench_ebb_setup_train(&ebb, spec.c_str(), arg(params).c_str(),
                                              arg(bind).c_str(), arg(fills).c_str(),
                                              loss.c_str(), 42, dev);
        if (st == EBB_ERR_UNSUPPORTED) {
            std::printf("{\"skipped\": \"%s\"}\n", json_escape(ebb_errmsg()).c_str());
            std::fflush(stdout);
            return;
        }
        if (st != EBB_OK)
            return reply_error(ebb_errmsg());
        bench::NamedParams named;
        std::vector<bool> trained;
        if (!copy_params(ebb, named, trained, dev))
            return reply_error(ebb_errmsg());
        ebb_shape xs = bench_ebb_input_shape(ebb), ys = bench_ebb_target_shape(ebb);
        std::vector<float> xh(static_cast<size_t>(ebb_shape_numel(&xs)));
        std::vector<float> yh(static_cast<size_t>(ebb_shape_numel(&ys)));
        if (bench_ebb_input_host(ebb, xh.data(), xh.size()) != EBB_OK ||
            bench_ebb_target_host(ebb, yh.data(), yh.size()) != EBB_OK)
            return reply_error(ebb_errmsg());
        if (!prefix.empty() && prefix != "-" && bench_ebb_export(ebb, prefix.c_str()) != EBB_OK)
            return reply_error(ebb_errmsg());
        std::vector<double> le, lc;
        try {
            x = on_device(input_from_host(ebb, xh, xs), dev);
            train_twin.reset(new bench::TrainTwin(workload, named, trained, parse_cfg(arg(params)),
                                                  x, on_device(from_host(yh, ys), dev), loss));
            for (int i = 0; i < kCheckSteps; i++)
                lc.push_back(train_twin->step(true));
        } catch (const std::exception &e) {
            return reply_error(workload + ": C++ training twin: " + e.what());
        }
        for (int i = 0; i < kCheckSteps; i++) {
            double l = 0;
            if (bench_ebb_train_step(ebb, &l, nullptr) != EBB_OK)
                return reply_error(ebb_errmsg());
            le.push_back(l);
        }
        int phases[4];
        bench_ebb_phase_counts(ebb, phases);
        int n_trained = 0;
        for (bool t : trained)
            n_trained += t;
        std::printf("{\"ok\": 1, \"params\": %d, \"trained\": %d, \"ebb_loss\": %s, "
                    "\"cxx_loss\": %s, \"phases\": [%d, %d, %d, %d]}\n",
                    bench_ebb_param_count(ebb), n_trained, json_list(le).c_str(),
                    json_list(lc).c_str(), phases[0], phases[1], phases[2], phases[3]);
        std::fflush(stdout);
    }

    void train_measure() {
        if (!ebb || !train_twin)
            return reply_error("train_measure: no training workload set up");
        ebb_run_stats rs;
        if (bench_ebb_train_step(ebb, nullptr, &rs) != EBB_OK)
            return reply_error(ebb_errmsg());
        // The twin's peak through the same counting allocator (on CUDA the
        // caching allocator's statistics, as ebb's), above the same baseline:
        // parameters, optimizer state, input and target, with the last step's
        // gradients dropped (ebb's die inside its step).
        train_twin->drop_grads();
        int64_t base = ebb_memory_current(dev);
        ebb_memory_reset_peak(dev);
        try {
            train_twin->step(false);
        } catch (const std::exception &e) {
            return reply_error(workload + ": C++ training twin: " + e.what());
        }
        ebb_memory_stats ms;
        if (ebb_memory_stats_get(dev, &ms) != EBB_OK)
            return reply_error(ebb_errmsg());
        static const char *const phase[] = {"forward", "loss", "backward", "update"};
        const ebb_plan_step *at = bench_ebb_peak_step(ebb);
        std::printf("{\"ebb_measured\": %lld, \"ebb_planned\": %lld, \"cxx_peak\": %lld, "
                    "\"ebb_peak_at\": \"%s %s (%s)\"}\n",
                    (long long)rs.measured_peak_bytes, (long long)rs.planned_peak_bytes,
                    (long long)(ms.peak_bytes - base),
                    at && (int)at->phase >= 0 && (int)at->phase < 4 ? phase[at->phase] : "?",
                    at && at->op ? at->op : "?",
                    at && at->node ? json_escape(at->node).c_str() : "?");
        std::fflush(stdout);
    }

    // A B A B: one ebb step, one C++ step, n times. The loss is not read back
    // by either (nor by PyTorch's round). Off the CPU the device is idle when
    // each step's clock starts, and the step's clock stops once the device
    // has done its work (a synchronisation before and after); on the CPU
    // nothing is added to the timed regions.
    void train_round(int n) {
        if (!ebb || !train_twin)
            return reply_error("train_round: no training workload set up");
        const bool sync = !on_cpu(dev);
        // On a GPU the step is also captured into a CUDA graph, once, and
        // each round times a replay of it after the eager step and the twin's.
        if (sync && !capture_tried) {
            capture_tried = true;
            if (bench_ebb_capture_train(ebb) != EBB_OK)
                capture_why = ebb_errmsg();
        }
        const bool graph = sync && capture_why.empty();
        std::vector<double> te, tc, ce, cc, fe, fc, tg;
        try {
            for (int i = 0; i < n; i++) {
                if (sync && ebb_device_synchronize(dev) != EBB_OK)
                    return reply_error(ebb_errmsg());
                long f0 = minor_faults();
                double c0 = cpu_ms(), t0 = now_ms();
                if (bench_ebb_train_step(ebb, nullptr, nullptr) != EBB_OK ||
                    (sync && ebb_device_synchronize(dev) != EBB_OK))
                    return reply_error(ebb_errmsg());
                double t1 = now_ms(), c1 = cpu_ms();
                long f1 = minor_faults();
                double c2 = cpu_ms(), t2 = now_ms();
                train_twin->step(false);
                if (sync && ebb_device_synchronize(dev) != EBB_OK)
                    return reply_error(ebb_errmsg());
                double t3 = now_ms(), c3 = cpu_ms();
                long f2 = minor_faults();
                if (graph) {
                    double g0 = now_ms();
                    if (bench_ebb_captured_step(ebb, nullptr) != EBB_OK ||
                        ebb_device_synchronize(dev) != EBB_OK)
                        return reply_error(ebb_errmsg());
                    tg.push_back(now_ms() - g0);
                }
                te.push_back(t1 - t0);
                tc.push_back(t3 - t2);
                ce.push_back(c1 - c0);
                cc.push_back(c3 - c2);
                fe.push_back(static_cast<double>(f1 - f0));
                fc.push_back(static_cast<double>(f2 - f1));
            }
        } catch (const std::exception &e) {
            return reply_error(workload + ": C++ training twin: " + e.what());
        }
        std::printf("{\"ebb\": %s, \"cxx\": %s, \"ebb_cpu\": %s, \"cxx_cpu\": %s, "
                    "\"ebb_faults\": %s, \"cxx_faults\": %s, \"ebb_graph\": %s, "
                    "\"ebb_graph_why\": \"%s\"}\n",
                    json_list(te).c_str(), json_list(tc).c_str(), json_list(ce).c_str(),
                    json_list(cc).c_str(), json_list(fe).c_str(), json_list(fc).c_str(),
                    json_list(tg).c_str(),
                    json_escape(sync ? capture_why : "a CUDA graph needs a GPU").c_str());
        std::fflush(stdout);
    }

    void setup(std::istringstream &in) {
        std::string spec, prefix, params, bind, fills;
        in >> workload >> spec >> prefix >> params >> bind >> fills;
        clear();
        if (!on_cpu(dev))
            return reply_error("setup: the forward rows run on the CPU only, not on " +
                               device_name(dev) + " (--device applies to the training "
                               "steps: run.py --train-only; the GPU's forward times are "
                               "tests/gpu/run.sh's bench step)");
        if (bench_ebb_setup(&ebb, spec.c_str(), arg(params).c_str(), arg(bind).c_str(),
                            arg(fills).c_str(), 42, ebb_device_cpu()) != EBB_OK)
            return reply_error(ebb_errmsg());
        // The twin gets ebb's parameter values, copied through the host.
        bench::NamedParams named;
        std::vector<bool> trained;
        if (!copy_params(ebb, named, trained, ebb_device_cpu()))
            return reply_error(ebb_errmsg());
        ebb_shape xs = bench_ebb_input_shape(ebb);
        std::vector<float> xh(static_cast<size_t>(ebb_shape_numel(&xs)));
        if (bench_ebb_input_host(ebb, xh.data(), xh.size()) != EBB_OK)
            return reply_error(ebb_errmsg());
        x = input_from_host(ebb, xh, xs);
        try {
            twin = bench::make_twin(workload, named, parse_cfg(arg(params)));
        } catch (const std::exception &e) {
            return reply_error(workload + ": " + e.what());
        }
        // Both must compute the same thing before their times mean anything.
        ebb_shape ys;
        float *yh = nullptr;
        if (bench_ebb_output_host(ebb, &ys, &yh) != EBB_OK)
            return reply_error(ebb_errmsg());
        std::vector<float> yv(yh, yh + ebb_shape_numel(&ys));
        std::free(yh);
        double diff;
        try {
            c10::InferenceMode guard;
            at::Tensor yt = twin(x);
            at::Tensor ye = from_host(yv, ys);
            if (!yt.sizes().equals(ye.sizes()))
                return reply_error(workload + ": the C++ twin's output shape differs from ebb's");
            diff = (yt - ye).abs().max().item<double>();
        } catch (const std::exception &e) {
            return reply_error(workload + ": C++ twin: " + e.what());
        }
        if (!prefix.empty() && prefix != "-" && bench_ebb_export(ebb, prefix.c_str()) != EBB_OK)
            return reply_error(ebb_errmsg());
        std::printf("{\"ok\": 1, \"params\": %d, \"cxx_max_abs_diff\": %.3g}\n",
                    bench_ebb_param_count(ebb), diff);
        std::fflush(stdout);
    }

    void measure() {
        if (!ebb)
            return reply_error("measure: no workload set up");
        bench_ebb_memory m;
        if (bench_ebb_measure(ebb, &m) != EBB_OK)
            return reply_error(ebb_errmsg());
        // The twin's peak through the same counting allocator, same baseline.
        ebb_device cpu = ebb_device_cpu();
        int64_t base = ebb_memory_current(cpu);
        ebb_memory_reset_peak(cpu);
        {
            c10::InferenceMode guard;
            at::Tensor y = twin(x);
        }
        ebb_memory_stats ms;
        ebb_memory_stats_get(cpu, &ms);
        std::printf("{\"ebb_measured\": %lld, \"ebb_planned\": %lld, \"keep_all_measured\": %lld, "
                    "\"keep_all_planned\": %lld, \"cxx_peak\": %lld, \"steps\": %d, "
                    "\"steps_executed\": %lld}\n",
                    (long long)m.measured_peak, (long long)m.planned_peak,
                    (long long)m.keep_all_measured, (long long)m.keep_all_planned,
                    (long long)(ms.peak_bytes - base), m.n_steps, (long long)m.steps_executed);
        std::fflush(stdout);
    }

    // A B A B: one ebb forward, one C++ forward, n times. Each timed region
    // ends after the output is released, in both.
    void round(int n) {
        if (!ebb)
            return reply_error("round: no workload set up");
        std::vector<double> te, tc, ce, cc;
        for (int i = 0; i < n; i++) {
            double c0 = cpu_ms(), t0 = now_ms();
            if (bench_ebb_forward(ebb) != EBB_OK)
                return reply_error(ebb_errmsg());
            double t1 = now_ms(), c1 = cpu_ms();
            double c2 = cpu_ms(), t2 = now_ms();
            {
                c10::InferenceMode guard;
                at::Tensor y = twin(x);
            }
            double t3 = now_ms(), c3 = cpu_ms();
            te.push_back(t1 - t0);
            tc.push_back(t3 - t2);
            ce.push_back(c1 - c0);
            cc.push_back(c3 - c2);
        }
        std::printf("{\"ebb\": %s, \"cxx\": %s, \"ebb_cpu\": %s, \"cxx_cpu\": %s}\n",
                    json_list(te).c_str(), json_list(tc).c_str(), json_list(ce).c_str(),
                    json_list(cc).c_str());
        std::fflush(stdout);
    }
};

// Separate, non-inlined functions so a profiler can collect exactly these.
__attribute__((noinline)) void bench_forward_ebb(bench_ebb *b, int n) {
    for (int i = 0; i < n; i++)
        if (bench_ebb_forward(b) != EBB_OK)
            std::fprintf(stderr, "%s\n", ebb_errmsg());
}

__attribute__((noinline)) void bench_forward_cxx(const bench::Forward &f, const at::Tensor &x,
                                                 int n) {
    for (int i = 0; i < n; i++) {
        c10::InferenceMode guard;
        at::Tensor y = f(x);
    }
}

__attribute__((noinline)) void bench_train_ebb(bench_ebb *b, int n) {
    for (int i = 0; i < n; i++)
        if (bench_ebb_train_step(b, nullptr, nullptr) != EBB_OK)
            std::fprintf(stderr, "%s\n", ebb_errmsg());
}

__attribute__((noinline)) void bench_train_cxx(bench::TrainTwin &t, int n) {
    for (int i = 0; i < n; i++)
        t.step(false);
}

int profile_train(int argc, char **argv, ebb_device dev) {
    if (argc < 10) {
        std::fprintf(stderr, "usage: ebb_bench [--device DEV] profile-train WORKLOAD SPEC "
                             "PARAMS_CSV BIND_CSV FILLS_CSV LOSS N ebb|cxx\n");
        return 2;
    }
    Session s;
    s.dev = dev;
    std::istringstream in(std::string(argv[2]) + " " + argv[3] + " - " + argv[4] + " " + argv[5] +
                          " " + argv[6] + " " + argv[7]);
    s.train_setup(in);
    if (!s.ebb || !s.train_twin)
        return 1;
    int n = std::atoi(argv[8]);
    bool ebb = std::strcmp(argv[9], "ebb") == 0;
    for (int pass = 0; pass < 2; pass++) { // warm-up, then the profiled pass
        ebb_device_synchronize(dev);
        double t0 = now_ms();
        if (ebb)
            bench_train_ebb(s.ebb, pass ? n : 10);
        else
            bench_train_cxx(*s.train_twin, pass ? n : 10);
        ebb_device_synchronize(dev);
        if (pass)
            std::fprintf(stderr, "%s: %d training steps, %.4f ms each\n", argv[9], n,
                         (now_ms() - t0) / n);
    }
    s.clear();
    return 0;
}

int profile(int argc, char **argv) {
    if (argc < 9) {
        std::fprintf(stderr,
                     "usage: ebb_bench profile WORKLOAD SPEC PARAMS_CSV BIND_CSV FILLS_CSV N ebb|cxx\n");
        return 2;
    }
    Session s;
    std::istringstream in(std::string(argv[2]) + " " + argv[3] + " - " + argv[4] + " " + argv[5] +
                          " " + argv[6]);
    s.setup(in);
    if (!s.ebb)
        return 1;
    int n = std::atoi(argv[7]);
    bool ebb = std::strcmp(argv[8], "ebb") == 0;
    for (int pass = 0; pass < 2; pass++) { // warm-up, then the profiled pass
        double t0 = now_ms();
        if (ebb)
            bench_forward_ebb(s.ebb, pass ? n : 10);
        else
            bench_forward_cxx(s.twin, s.x, pass ? n : 10);
        if (pass)
            std::fprintf(stderr, "%s: %d forwards, %.4f ms each\n", argv[8], n,
                         (now_ms() - t0) / n);
    }
    s.clear();
    return 0;
}

int explain(int argc, char **argv) {
    if (argc < 5) {
        std::fprintf(stderr, "usage: ebb_bench explain SPEC PARAMS_CSV BIND_CSV\n");
        return 2;
    }
    bench_ebb *b = nullptr;
    if (bench_ebb_setup(&b, argv[2], arg(argv[3]).c_str(), arg(argv[4]).c_str(), "", 42,
                        ebb_device_cpu()) != EBB_OK) {
        std::fprintf(stderr, "%s\n", ebb_errmsg());
        return 1;
    }
    bench_ebb_explain(b, stdout);
    for (int i = 0; i < bench_ebb_param_count(b); i++) {
        ebb_shape s = bench_ebb_param_shape(b, i);
        char buf[96];
        std::printf("param %d %s %s\n", i, bench_ebb_param_name(b, i),
                    ebb_shape_str(&s, buf, sizeof buf));
    }
    bench_ebb_free(b);
    return 0;
}

} // namespace

int main(int argc, char **argv) {
    if (ebb_init() != EBB_OK) {
        std::fprintf(stderr, "ebb_init: %s\n", ebb_errmsg());
        return 1;
    }
    const char *threads = std::getenv("EBB_BENCH_THREADS");
    if (threads && std::atoi(threads) > 0)
        at::set_num_threads(std::atoi(threads));
    // --device DEV (or --device=DEV), first: where the training steps run
    ebb_device dev = ebb_device_cpu();
    if (argc > 1 && std::strncmp(argv[1], "--device", 8) == 0) {
        const char *text = argv[1][8] == '=' ? argv[1] + 9 : argc > 2 ? argv[2] : nullptr;
        int used = argv[1][8] == '=' ? 1 : 2;
        if (!text || (argv[1][8] != '=' && argv[1][8] != '\0')) {
            reply_error("usage: ebb_bench [--device cpu|cuda|cuda:N] [COMMAND ...]");
            return 2;
        }
        if (ebb_device_parse(&dev, text) != EBB_OK) {
            reply_error(std::string("--device ") + text + ": " + ebb_errmsg());
            return 2;
        }
        // a device this process cannot use fails here, not at the first step
        if (!on_cpu(dev) && dev.index >= ebb_cuda_device_count()) {
            reply_error("--device " + device_name(dev) + ": " +
                        (ebb_cuda_device_count() ? "no such CUDA device (" +
                                                       std::to_string(ebb_cuda_device_count()) +
                                                       " present)"
                                                 : std::string("libtorch sees no CUDA device")));
            return 2;
        }
        argc -= used;
        argv += used;
    }
    if (argc > 1 && std::strcmp(argv[1], "explain") == 0)
        return explain(argc, argv);
    if (argc > 1 && std::strcmp(argv[1], "profile") == 0)
        return profile(argc, argv);
    if (argc > 1 && std::strcmp(argv[1], "profile-train") == 0)
        return profile_train(argc, argv, dev);
    if (argc > 1 && std::strcmp(argv[1], "precision") == 0) {
        if (!on_cpu(dev)) {
            reply_error("precision: the mixed-precision rows run on the CPU only");
            return 2;
        }
        return bench_precision_main();
    }

    std::printf("{\"ready\": 1, \"libtorch\": \"%s\", \"ebb\": \"%s\", \"threads\": %d, "
                "\"device\": \"%s\"}\n",
                ebb_torch_version(), ebb_version(), at::get_num_threads(),
                device_name(dev).c_str());
    std::fflush(stdout);
    Session s;
    s.dev = dev;
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string cmd;
        in >> cmd;
        if (cmd == "setup") {
            s.setup(in);
        } else if (cmd == "measure") {
            s.measure();
        } else if (cmd == "round") {
            int n = 0;
            in >> n;
            s.round(n);
        } else if (cmd == "train_setup") {
            s.train_setup(in);
        } else if (cmd == "train_measure") {
            s.train_measure();
        } else if (cmd == "train_round") {
            int n = 0;
            in >> n;
            s.train_round(n);
        } else if (cmd == "has_op") {
            std::string op;
            in >> op;
            std::printf("{\"has\": %d}\n", ebb_op_find(op.c_str()) ? 1 : 0);
            std::fflush(stdout);
        } else if (cmd == "teardown") {
            s.clear();
            std::printf("{\"live_handles\": %lld}\n", (long long)ebb_tensor_live_count());
            std::fflush(stdout);
        } else if (cmd == "quit" || cmd.empty()) {
            break;
        } else {
            reply_error("unknown command " + cmd);
        }
    }
    s.clear();
    return 0;
}
