/* `ebb train` and `ebb eval`: thin clients of the library's trainer
 * (include/ebb/trainer.h), which trains a spec on a dataset, checkpoints,
 * resumes and evaluates. Here: the flags, what a resumed run may take from
 * the command line, the files' aliases, the JSON lines, the learning
 * curves, the trace file and the signals.
 *
 * Training never loses work: a step whose loss is not finite stops the run
 * before anything is written (or, with --skip-nonfinite, is undone and
 * counted); no checkpoint or weights file is written with NaN or Inf in it;
 * a resumed run takes nothing from the command line that contradicts its
 * checkpoint; and SIGINT, SIGTERM or SIGHUP end it with a checkpoint.
 *
 * Exit codes as the rest of the command: 0 ok, 1 spec or data error (a loss
 * or a state that is not finite included), 2 usage error, 3 runtime error;
 * 128 + the signal when SIGINT (130), SIGTERM (143) or SIGHUP (129) stopped
 * training, after the step under way finished and a checkpoint was written. */
#define _GNU_SOURCE /* getopt_long, posix_spawn */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ebb/ebb.h"
#include "ebb/data.h"
#include "ebb/safetensors.h"
#include "ebb/spec.h"
#include "ebb/trainer.h"
#include "../fileio.h"
#include "curve.h"
#include "flags.h"
#include "train.h"

enum { EXIT_SPEC = 1, EXIT_USAGE = 2, EXIT_RUNTIME = 3, EXIT_SIGNAL_BASE = 128 };

#define MAX_FIELDS 64
#define DEFAULT_CHECKPOINT "checkpoint.safetensors"

const char ebb_cli_usage_train[] =
    "usage: ebb train SPEC --data D [--eval-data D] [--epochs N | --steps N] [--batch B]\n"
    "                 [--block N] [--precision P] [--weight-copies HOW]\n"
    "                 [--optimizer KIND] [--lr X] [--lr-schedule S] [--momentum X]\n"
    "                 [--betas B1,B2] [--eps X]\n"
    "                 [--weight-decay X] [--loss NAME] [--clip-grad-norm X]\n"
    "                 [--clip-grad-value X] [--freeze PATTERN]... [--log-csv FILE]\n"
    "                 [--accumulate N] [--no-decay PATTERN]... [--lr-scale PATTERN=F]...\n"
    "                 [--seed N] [--no-shuffle] [--drop-last] [--normalize MEAN,STD]\n"
    "                 [--weights W] [--save-weights W] [--ema DECAY] [--checkpoint FILE]\n"
    "                 [--checkpoint-every N] [--keep-best METRIC] [--resume CKPT]\n"
    "                 [--log-every N] [--curve FILE.svg]\n"
    "                 [--trace T.jsonl [--trace-step N]]\n"
    "                 [--memory-budget SIZE] [--skip-nonfinite] [--allow-nonfinite]\n"
    "                 [--early-stop N[:DELTA]] [--top-k K]\n"
    "                 [--override] [--non-strict] [--strict-memory] [--cuda-graph]\n"
    "                 [--device DEV] [--json] [-p NAME=VALUE]...\n"
    "\n"
    "Trains the spec on a dataset with its training plan: forward, the spec's loss\n"
    "against its targets, backward and optimizer update, one static plan per step.\n"
    "A dataset D is fashion-mnist (fashion-mnist:test for its test split), a\n"
    "directory of MNIST-style IDX files (DIR or DIR:test), two IDX files\n"
    "IMAGES,LABELS, a safetensors file holding one tensor per input and target\n"
    "of the spec, samples first, or text:FILE, a text's bytes as tokens in windows\n"
    "of --block bytes, the next byte the target (its first 90%; text:FILE:test the\n"
    "last 10%, text:FILE:all every byte).\n"
    "\n";

const char ebb_cli_usage_eval[] =
    "usage: ebb eval SPEC --weights W --data D [--batch B] [--block N] [--device DEV]\n"
    "                [--precision P] [--json] [--metrics] [--top-k K] [--normalize MEAN,STD]\n"
    "                [--allow-nonfinite] [-p NAME=VALUE]...\n"
    "\n"
    "Runs the spec's inference plan over a dataset (as `ebb train --data`) and prints\n"
    "'accuracy 0.8912 top-5 0.9981 loss 0.3123 on 10000 samples' for a cross_entropy\n"
    "or nll spec, else 'loss X on N samples' (the loss op with its default options);\n"
    "a per-token loss ([B, T, V] scores, a language model) adds its perplexity.\n"
    "\n";

typedef struct norm_opt {
    double mean, std;
} norm_opt;

typedef struct early_stop_opt {
    int64_t epochs; /* 0: none */
    double min_delta;
} early_stop_opt;

typedef struct topts {
    /* the library's options, which most rows set straight (the start is
     * ebb_trainer_defaults()); the fields below are the command's own, or
     * ones it works out before the trainer sees them */
    ebb_trainer_options to;
    const char *spec, *data, *optimizer, *save_weights, *checkpoint;
    const char *trace, *device, *curve;
    cli_list params; /* -p */
    double lr, momentum, weight_decay;
    double betas[2]; /* --betas B1,B2 */
    double eps;      /* --eps: the optimizer's */
    int betas_set, eps_set;
    norm_opt norm;   /* --normalize MEAN,STD */
    int64_t nproc;   /* --nproc: ranks to start (0: one process) */
    int lr_set, momentum_set, wd_set, seed_set, batch_set, normalize, no_shuffle, json;
    int override, strict_memory;
    int sched_set; /* --lr-schedule, parsed into sched */
    ebb_lr_schedule sched;
    int metrics;                  /* --metrics */
    early_stop_opt early_stop;    /* --early-stop N[:DELTA] */
    int clip_norm_set, clip_value_set;
    cli_list freeze;              /* --freeze */
    cli_list no_decay;            /* --no-decay, or the checkpoint's */
    cli_list lr_scale;            /* --lr-scale PATTERN=FACTOR */
    char no_decay_text[1024];     /* the checkpoint's, split in place */
    const char *log_csv;
    int64_t accumulate; /* --accumulate (0: not given) */
} topts;

/* ---- the flags ---------------------------------------------------------------- */

/* --early-stop EPOCHS[:MIN_DELTA] */
static int set_early_stop(const cli_flag *f, const char *v, void *field, const char *usage) {
    (void)f;
    char *end = NULL;
    errno = 0;
    long long p = strtoll(v, &end, 10);
    double delta = 0;
    if (*end == ':') {
        char *dend = NULL;
        delta = strtod(end + 1, &dend);
        end = end[1] && !*dend && isfinite(delta) && delta >= 0 ? dend : end;
    }
    if (end == v || *end || errno || p < 1 || p > 1000000)
        return ebb_cli_usage_error(usage,
                                   "--early-stop %s: expected EPOCHS[:MIN_DELTA], EPOCHS at least 1",
                                   v);
    early_stop_opt *e = field;
    e->epochs = p;
    e->min_delta = delta;
    return 0;
}

static int set_top_k(const cli_flag *f, const char *v, void *field, const char *usage) {
    (void)f;
    int64_t n = 0;
    if (cli_parse_int(v, 0, 1000000, &n) != 0)
        return ebb_cli_usage_error(usage, "%s", "--top-k needs a count, 0 or more");
    *(int *)field = (int)n;
    return 0;
}

static int set_schedule(const cli_flag *f, const char *v, void *field, const char *usage) {
    (void)f;
    if (ebb_lr_schedule_parse(field, v) != EBB_OK)
        return ebb_cli_usage_error(usage, "--lr-schedule: %s", ebb_errmsg());
    return 0;
}

/* --betas B1,B2: Adam's averaging factors, each in [0, 1) */
static int set_betas(const cli_flag *f, const char *v, void *field, const char *usage) {
    (void)f;
    double *b = field;
    char *end = NULL, *end2 = NULL;
    b[0] = strtod(v, &end);
    int ok = end != v && *end == ',';
    if (ok) b[1] = strtod(end + 1, &end2);
    ok = ok && end2 != end + 1 && !*end2;
    for (int i = 0; ok && i < 2; i++) ok = b[i] >= 0 && b[i] < 1;
    if (!ok)
        return ebb_cli_usage_error(usage, "--betas %s: expected B1,B2, each from 0 to below 1 "
                                          "(torch.optim's 0.9,0.999)", v);
    return 0;
}

static int set_nproc(const cli_flag *f, const char *v, void *field, const char *usage) {
    (void)f;
    if (cli_parse_int(v, 1, 64, field) != 0)
        return ebb_cli_usage_error(usage, "--nproc %s: expected 1 to 64 processes", v);
    return 0;
}

/* --ema DECAY, between 0 and 1 */
static int set_ema(const cli_flag *f, const char *v, void *field, const char *usage) {
    double d = 0;
    if (cli_set_rate(f, v, &d, usage) != 0 || !(d > 0 && d < 1))
        return ebb_cli_usage_error(usage, "--ema %s: expected a decay between 0 and 1, like 0.999",
                                   v);
    *(double *)field = d;
    return 0;
}

/* --lr-scale PATTERN=FACTOR */
static int set_lr_scale(const cli_flag *f, const char *v, void *field, const char *usage) {
    const char *eq = strrchr(v, '=');
    char *end = NULL;
    double factor = eq ? strtod(eq + 1, &end) : NAN;
    if (!eq || eq == v || end == eq + 1 || (end && *end) || !isfinite(factor) || factor < 0)
        return ebb_cli_usage_error(usage,
                                   "--lr-scale %s: expected PATTERN=FACTOR, a factor >= 0 "
                                   "('*.bias=0.25')",
                                   v);
    return cli_set_list(f, v, field, usage);
}

/* --normalize MEAN,STD */
static int set_normalize(const cli_flag *f, const char *v, void *field, const char *usage) {
    (void)f;
    norm_opt *n = field;
    char *end = NULL;
    n->mean = strtod(v, &end);
    if (end == v || *end != ',')
        return ebb_cli_usage_error(usage, "--normalize %s: expected MEAN,STD", v);
    const char *s2 = end + 1;
    n->std = strtod(s2, &end);
    if (end == s2 || *end || !isfinite(n->mean) || !(n->std > 0) || !isfinite(n->std))
        return ebb_cli_usage_error(usage, "--normalize %s: expected MEAN,STD with STD > 0", v);
    return 0;
}

/* -p, --device, --precision, --json and every command's: train's and
 * eval's last rows */
#define TRAIN_EVAL_FLAGS                                                                           \
    {'p', NULL, "NAME=VALUE", cli_set_list, offsetof(topts, params), 0,                            \
     "set a spec parameter (params:)", "NAME=VALUE"},                                              \
        FLAG_PATH("device", "DEV", topts, device,                                                  \
                  "cpu or cuda[:N]; default cuda when available, else cpu"),                       \
        PRECISION_FLAG(topts, to.precision),                                                       \
        FLAG_SWITCH("json", topts, json, "one JSON object per line instead of text"), COMMON_FLAGS

const cli_flag ebb_cli_train_flags[] = {
    FLAG_PATH("data", "D", topts, data,
              "the training data (required)"),
    FLAG_PATH("eval-data", "D", topts, to.eval_data,
              "evaluated after every epoch: loss and accuracy"),
    FLAG_ROW(0, "early-stop", "N[:DELTA]", set_early_stop, topts, early_stop,
             "stop when --eval-data's loss has not fallen by more than\n"
             "DELTA (default 0) for N epochs"),
    FLAG_ROW(0, "top-k", "K", set_top_k, topts, to.top_k,
             "also count top-K accuracy in evaluations (default 5; 0: none)"),
    FLAG_COUNT("epochs", "N", topts, to.epochs,
               "passes over the data (default 1)"),
    FLAG_COUNT("steps", "N", topts, to.steps,
               "stop after N steps instead"),
    FLAG_GIVEN("batch", "B", cli_set_count, topts, to.batch, batch_set,
               "samples per step (default 64)"),
    FLAG_COUNT("block", "N", topts, to.block,
               "the sequence length: the spec's input's second dimension when\n"
               "it is a symbol ([batch, seq]), the window of text data"),
    FLAG_ROW(0, "optimizer", "KIND", cli_set_optimizer, topts, optimizer,
             "sgd, adam, adamw, rmsprop, adagrad or adadelta (default adamw),\n"
             "with torch.optim's defaults"),
    FLAG_GIVEN("lr", "X", cli_set_rate, topts, lr, lr_set,
               "learning rate (default 1e-3; sgd needs one)"),
    FLAG_GIVEN("lr-schedule", "S", set_schedule, topts, sched, sched_set,
               "change the rate after every step as torch.optim.lr_scheduler\n"
               "does: step:SIZE[:GAMMA], multistep:M1,M2[:GAMMA],\n"
               "exponential:GAMMA, cosine:T_MAX[:ETA_MIN],\n"
               "linear:ITERS[:START[:END]], warmup-cosine:WARMUP:TOTAL,\n"
               "onecycle:MAX_LR:TOTAL[:PCT] (steps, not epochs); kept in\n"
               "checkpoints and resumed where it was"),
    FLAG_GIVEN("momentum", "X", cli_set_rate, topts, momentum, momentum_set,
               "sgd's momentum (default 0)"),
    FLAG_GIVEN("betas", "B1,B2", set_betas, topts, betas, betas_set,
               "adam's and adamw's averaging factors (default 0.9,0.999;\n"
               "nanoGPT trains with 0.9,0.95)"),
    FLAG_GIVEN("eps", "X", cli_set_positive, topts, eps, eps_set,
               "the optimizer's eps, added to its denominator (default\n"
               "torch.optim's: 1e-8, adagrad 1e-10, adadelta 1e-6)"),
    FLAG_PATH("loss", "NAME", topts, to.loss,
              "this loss op instead of the spec's `loss:` (as for plan and grad)"),
    FLAG_GIVEN("clip-grad-norm", "X", cli_set_positive, topts, to.clip_grad_norm, clip_norm_set,
               "scale the gradients to a global L2 norm of at most X before\n"
               "the updates, as torch.nn.utils.clip_grad_norm_ (the updates\n"
               "then wait for the whole backward: the start line says what\n"
               "that costs)"),
    FLAG_GIVEN("clip-grad-value", "X", cli_set_positive, topts, to.clip_grad_value, clip_value_set,
               "clamp each gradient to [-X, X] before its update, as\n"
               "torch.nn.utils.clip_grad_value_"),
    FLAG_ROW(0, "nproc", "N", set_nproc, topts, nproc,
             "train data-parallel in N processes on this machine (ranks on\n"
             "loopback, gradients averaged by Gloo; --batch is the global\n"
             "batch); a process started by torchrun (RANK, WORLD_SIZE,\n"
             "MASTER_ADDR, MASTER_PORT set) joins its job without it"),
    FLAG_SWITCH("overlap", topts, to.parallel.overlap,
                "with --nproc: each bucket's all-reduce travels while the\n"
                "backward goes on, waited for when the next bucket is full"),
    FLAG_SWITCH("zero", topts, to.parallel.zero,
                "with --nproc: shard the optimizer's state over the ranks\n"
                "(ZeRO-1): each updates its share of the parameters and\n"
                "sends them to the others; checkpoints hold the whole state"),
    FLAG_ROW(0, "bucket-size", "SIZE", cli_set_bytes, topts, to.parallel.bucket_bytes,
             "with --nproc: gradients averaged in buckets of SIZE (default\n"
             "25MiB, as DDP's), each bucket's updates right after it"),
    FLAG_ROW(0, "loss-scale", "S", cli_set_loss_scale, topts, to.loss_scale,
             "dynamic loss scaling from scale S, as torch.amp.GradScaler: a\n"
             "step whose gradients overflow updates nothing and halves the\n"
             "scale, 2000 good steps double it; `none` turns it off\n"
             "(default: from 65536 with --precision fp16, else none)"),
    FLAG_ROW(0, "weight-copies", "HOW", cli_set_weight_copies, topts, to.low_weight_copies,
             "with a low --precision: where each backward gets the low\n"
             "copies of the weights its forward cast: auto (kept where\n"
             "that does not raise the peak), keep, or recast"),
    FLAG_COUNT("accumulate", "N", topts, accumulate,
               "each step sums the gradients of N micro-batches of --batch\n"
               "samples before one update (--batch 16 --accumulate 4: the\n"
               "update of batch 64, the activations of batch 16)"),
    FLAG_ROW(0, "no-decay", "PATTERN", cli_set_pattern, topts, no_decay,
             "no weight decay for the parameters whose full name matches\n"
             "('*.bias'; repeatable), as a torch.optim param group with\n"
             "weight_decay 0"),
    FLAG_ROW(0, "lr-scale", "PATTERN=FACTOR", set_lr_scale, topts, lr_scale,
             "the parameters whose full name matches train at FACTOR times\n"
             "the rate ('*.bias=0.25'; repeatable), as a torch.optim param\n"
             "group with its own lr; schedules move it in proportion"),
    FLAG_ROW(0, "freeze", "PATTERN", cli_set_list, topts, freeze,
             "train no parameter whose full name matches the shell pattern\n"
             "('fc1.*', '*.bias'; repeatable): no gradient, update or state"),
    FLAG_PATH("log-csv", "FILE", topts, log_csv,
              "a CSV row per log point (every --log-every steps, and every\n"
              "epoch with its evaluation), written as training goes"),
    FLAG_GIVEN("weight-decay", "X", cli_set_rate, topts, weight_decay, wd_set,
               "(default: torch.optim's, 0.01 for adamw, else 0)"),
    {0, "seed", "N", cli_set_u64, offsetof(topts, to.seed), offsetof(topts, seed_set) + 1,
     "initial weights, shuffling and dropout (default 0)",
     "a non-negative integer"},
    FLAG_SWITCH("no-shuffle", topts, no_shuffle,
                "the samples in file order"),
    FLAG_SWITCH("drop-last", topts, to.drop_last,
                "drop the last partial batch of each epoch"),
    FLAG_GIVEN("normalize", "MEAN,STD", set_normalize, topts, norm, normalize,
               "inputs become (x - MEAN) / STD (after images scale to [0, 1])"),
    FLAG_PATH("weights", "W", topts, to.weights,
              "start from these weights (safetensors)"),
    FLAG_PATH("save-weights", "W", topts, save_weights,
              "write the trained weights there at the end"),
    FLAG_ROW(0, "ema", "DECAY", set_ema, topts, to.ema_decay,
             "also keep an exponential moving average of the weights, as\n"
             "torch's AveragedModel with get_ema_multi_avg_fn(DECAY)\n"
             "(0.999, say): evaluations, --keep-best and --save-weights\n"
             "use the average; checkpoints hold it too"),
    FLAG_PATH("checkpoint", "FILE", topts, checkpoint,
              "where checkpoints go (default checkpoint.safetensors): given\n"
              "(or with --checkpoint-every or --keep-best), one after every\n"
              "epoch and at the end; else one on a signal only"),
    FLAG_COUNT("checkpoint-every", "N", topts, to.checkpoint_every,
               "write a checkpoint every N steps and at the end instead"),
    FLAG_PATH("keep-best", "METRIC", topts, to.keep_best,
              "also keep the checkpoint of the best epoch by METRIC, beside\n"
              "--checkpoint (ck.safetensors: ck.best.safetensors): eval_loss,\n"
              "eval_accuracy, eval_top_k_accuracy, eval_perplexity (of\n"
              "--eval-data), loss or perplexity (the epoch's training\n"
              "mean); accuracies best highest, the others lowest"),
    FLAG_PATH("resume", "CKPT", topts, to.resume,
              "continue from a checkpoint: weights, optimizer state, step;\n"
              "--checkpoint may name the same file"),
    FLAG_SWITCH("override", topts, override,
                "with --resume: --optimizer, --lr, --momentum, --betas, --eps,\n"
                "--weight-decay, --seed, --batch, --no-shuffle, --drop-last,\n"
                "--lr-schedule and --clip-grad-* that contradict the checkpoint\n"
                "win (else that is an error)"),
    FLAG_SWITCH("non-strict", topts, to.non_strict,
                "with --resume: a trained parameter the checkpoint holds no\n"
                "optimizer state for starts without, and a tensor that does\n"
                "not match its checksum is read as it is (else errors)"),
    FLAG_COUNT("log-every", "N", topts, to.log_every,
               "a line every N steps (default: one per epoch)"),
    FLAG_PATH("curve", "FILE.svg", topts, curve,
              "draw the training loss (a point per --log-every N steps, else\n"
              "about 200 over the run) and, with --eval-data, the test loss\n"
              "and accuracy per epoch; rewritten after every epoch"),
    FLAG_PATH("trace", "T", topts, trace,
              "one training step's trace in `ebb run --trace`'s format, one\n"
              "JSON line per plan step: `ebb chart SPEC --train -i batch=B\n"
              "--trace T` draws it over the training plan"),
    FLAG_COUNT("trace-step", "N", topts, to.trace_step,
               "the step --trace traces (default: the run's first)"),
    FLAG_ROW(0, "memory-budget", "SIZE", cli_set_budget, topts, to.memory_budget,
             "plan the step to fit SIZE (64MiB, 1.5GB, or `least`) by\n"
             "recomputing activations in the backward; same updates"),
    FLAG_SWITCH("skip-nonfinite", topts, to.skip_nonfinite,
                "undo and count a step whose loss (or updated state) is NaN or\n"
                "infinite, as torch's GradScaler skips one; else such a step\n"
                "stops training (exit 1) with nothing written"),
    FLAG_SWITCH("allow-nonfinite", topts, to.allow_nonfinite,
                "NaN or Inf in --weights or --resume is a warning, not an error"),
    FLAG_SWITCH("strict-memory", topts, strict_memory,
                "a step that measures more than its plan promised stops training\n"
                "(exit 3, nothing written), rather than a warning"),
    FLAG_SWITCH("cuda-graph", topts, to.cuda_graph,
                "on a CUDA device, capture the training step (forward, loss,\n"
                "backward, updates) into a CUDA graph at the first full batch\n"
                "and replay it for every full batch after; the same updates,\n"
                "much less launch time for small models (a last partial batch\n"
                "and a traced step run eagerly)"),
    TRAIN_EVAL_FLAGS,
    FLAG_END,
};

const cli_flag ebb_cli_eval_flags[] = {
    FLAG_PATH("weights", "W", topts, to.weights,
              "the trained weights (required)"),
    FLAG_PATH("data", "D", topts, data,
              "the data (required)"),
    FLAG_GIVEN("batch", "B", cli_set_count, topts, to.batch, batch_set,
               "samples per run (default 256)"),
    FLAG_COUNT("block", "N", topts, to.block,
               "the sequence length, as for ebb train"),
    FLAG_SWITCH("metrics", topts, metrics,
                "per-class accuracy and the confusion matrix too"),
    FLAG_ROW(0, "top-k", "K", set_top_k, topts, to.top_k,
             "count top-K accuracy (default 5; 0: none)"),
    FLAG_GIVEN("normalize", "MEAN,STD", set_normalize, topts, norm, normalize,
               "as for ebb train"),
    FLAG_SWITCH("allow-nonfinite", topts, to.allow_nonfinite,
                "NaN or Inf in --weights is a warning, not an error"),
    TRAIN_EVAL_FLAGS,
    FLAG_END,
};

const char ebb_cli_usage_train_tail[] =
    "\n"
    "SIGINT (Ctrl-C), SIGTERM and SIGHUP finish the step under way, write a checkpoint\n"
    "and exit 128 + the signal (130, 143, 129); a second signal stops at once.\n";
const char ebb_cli_usage_eval_tail[] = "";

static int add_spec(const command *c, void *opts, const char *arg) {
    topts *o = opts;
    if (o->spec) return ebb_cli_usage_error(c->usage, "unexpected argument %s", arg);
    o->spec = arg;
    return 0;
}

/* Returns 0, -1 when help was printed, or an exit code. */
static int parse(const command *c, int argc, char **argv, int train, topts *o) {
    const char *usage = c->usage;
    memset(o, 0, sizeof *o);
    o->to = ebb_trainer_defaults();
    o->to.batch = train ? o->to.batch : 256;
    int rc = cli_flags_parse(c, argc, argv, o, add_spec);
    if (rc) return rc;
    if (!o->spec)
        return ebb_cli_usage_error(usage, "%s", "missing SPEC");
    if (!o->data)
        return ebb_cli_usage_error(usage, "%s", "--data is required");
    if (!train && !o->to.weights)
        return ebb_cli_usage_error(usage, "%s", "--weights is required (the trained weights)");
    if (train && o->to.weights && o->to.resume)
        return ebb_cli_usage_error(usage, "%s", "--weights and --resume both give the weights: pick one");
    if (train && o->momentum_set && o->optimizer && strcmp(o->optimizer, "sgd") &&
        strcmp(o->optimizer, "rmsprop"))
        return ebb_cli_usage_error(usage, "%s", "--momentum applies to --optimizer sgd and rmsprop");
    if (train && o->momentum_set && !o->optimizer && !o->to.resume)
        return ebb_cli_usage_error(usage, "%s",
                                   "--momentum applies to --optimizer sgd and rmsprop (default "
                                   "adamw)");
    if (train && o->optimizer && !strcmp(o->optimizer, "sgd") && !o->lr_set && !o->to.resume)
        return ebb_cli_usage_error(usage, "%s", "--optimizer sgd needs --lr");
    if (train && (o->override || o->to.non_strict) && !o->to.resume)
        return ebb_cli_usage_error(usage, "%s",
                                   o->override
                                       ? "--override applies to --resume, which is not given"
                                       : "--non-strict applies to --resume, which is not given");
    if (train && o->to.cuda_graph && o->accumulate > 1)
        return ebb_cli_usage_error(usage, "%s",
                                   "--cuda-graph and --accumulate cannot be combined: the "
                                   "captured step is a whole one");
    if (train && o->to.cuda_graph && o->to.skip_nonfinite)
        return ebb_cli_usage_error(usage, "%s",
                                   "--cuda-graph and --skip-nonfinite cannot be combined: a "
                                   "replayed step cannot be undone (its updates are in the graph)");
    if (train && o->early_stop.epochs && !o->to.eval_data)
        return ebb_cli_usage_error(usage, "%s",
                                   "--early-stop watches --eval-data's loss, which is not given");
    if (train && o->to.trace_step && !o->trace)
        return ebb_cli_usage_error(usage, "%s", "--trace-step needs --trace T.jsonl, the file it writes");
    /* the picture is SVG whatever the name says; a name that says otherwise
     * is a mistake (as for `ebb chart -o`) */
    const char *base = o->curve ? strrchr(o->curve, '/') : NULL;
    const char *ext = o->curve ? strrchr(base ? base : o->curve, '.') : NULL;
    if (ext && strcmp(ext, ".svg"))
        return ebb_cli_usage_error(usage,
                           "--curve %s: the curves are SVG; name it .svg (rsvg-convert makes a "
                           "PNG of it)",
                           o->curve);
    return 0;
}

/* ---- the spec and the trainer's options ------------------------------------ */
/* ---- the spec and the trainer's options ------------------------------------ */

/* --device's device, else cuda where there is one; 0 or an exit code. */
static int parse_device(const topts *o, ebb_device *dev) {
    *dev = ebb_device_default();
    ebb_status st;
    if (o->device && (st = ebb_device_parse(dev, o->device)) != EBB_OK) {
        fprintf(stderr, "ebb: %s\n", ebb_errmsg());
        return st == EBB_ERR_UNSUPPORTED ? EXIT_RUNTIME : EXIT_USAGE;
    }
    return 0;
}

static int load_spec(const topts *o, ebb_device *dev, ebb_spec **spec) {
    int rc = parse_device(o, dev);
    if (rc) return rc;
    ebb_status st;
    ebb_spec_options so = {.params = o->params.v, .n_params = o->params.n};
    if ((st = ebb_spec_load_ex(spec, o->spec, &so)) != EBB_OK) return ebb_cli_fail_status(st);
    return 0;
}

/* One `ebb train`: the flags, the trainer, and what its callbacks write. */
typedef struct cli_run {
    topts o;
    ebb_spec *spec;
    ebb_device dev;
    ebb_checkpoint_info ci; /* --resume's */
    ebb_trainer_options to;
    ebb_trainer *t;
    const char *ckpt_path, *kind; /* kind: the optimizer's name */
    ebb_file_out *tw;             /* --trace, until its step is written */
    ebb_cli_trace trace;
    ebb_cli_curve *curve;
    int64_t window;                /* --curve: steps per training-loss point */
    double curve_loss, json_loss;  /* losses summed since the last point and JSON line */
    int64_t curve_n, json_n;
    FILE *csv;     /* --log-csv */
    double csv_loss; /* losses summed since its last step row */
    int64_t csv_n;
    int rc;  /* the exit code a callback decided on (0: none) */
    int tty; /* text on a terminal: the library redraws its progress line */
    ebb_dist *dist; /* a rank of a data-parallel run (--nproc, or torchrun's environment) */
} cli_run;

/* The --lr of the run a checkpoint holds, to compare with the command
 * line's: a schedule's base, which --lr set (the optimizer's rate is where
 * the schedule has moved it since), or without a schedule the optimizer's.
 * NAN for a one-cycle schedule, which takes its rates from MAX_LR whatever
 * --lr says. */
static double checkpoint_lr(const ebb_checkpoint_info *ci) {
    if (!ci->has_schedule) return ci->optimizer.lr;
    return ci->schedule.kind == EBB_LR_ONE_CYCLE ? NAN : ci->schedule_base;
}

/* Each option given with --resume that contradicts the checkpoint, into
 * why; returns how many. */
static int resume_conflicts(const topts *o, const ebb_checkpoint_info *ci, char *why, size_t size) {
    const ebb_optimizer_options *c = &ci->optimizer;
    double lr = checkpoint_lr(ci);
    size_t at = 0;
    int n = 0;
    why[0] = '\0';
#define CONFLICT(cond, ...)                                                                        \
    if ((cond) && at < size) {                                                                     \
        at += (size_t)snprintf(why + at, size - at, n++ ? "; " : "");                              \
        if (at < size) at += (size_t)snprintf(why + at, size - at, __VA_ARGS__);                   \
    }
    CONFLICT(o->optimizer && strcmp(o->optimizer, ebb_optimizer_kind_name(c->kind)),
             "--optimizer %s, the checkpoint's is %s", o->optimizer,
             ebb_optimizer_kind_name(c->kind));
    CONFLICT(o->lr_set && !isnan(lr) && o->lr != lr, "--lr %g, the checkpoint's is %g", o->lr, lr);
    CONFLICT(o->momentum_set && o->momentum != c->momentum, "--momentum %g, the checkpoint's is %g",
             o->momentum, c->momentum);
    CONFLICT(o->wd_set && o->weight_decay != c->weight_decay,
             "--weight-decay %g, the checkpoint's is %g", o->weight_decay, c->weight_decay);
    CONFLICT(o->betas_set && (o->betas[0] != c->beta1 || o->betas[1] != c->beta2),
             "--betas %g,%g, the checkpoint's are %g,%g", o->betas[0], o->betas[1], c->beta1,
             c->beta2);
    CONFLICT(o->eps_set && o->eps != c->eps, "--eps %g, the checkpoint's is %g", o->eps, c->eps);
    CONFLICT(o->seed_set && o->to.seed != ci->seed, "--seed %llu, the checkpoint's is %llu",
             (unsigned long long)o->to.seed, (unsigned long long)ci->seed);
    CONFLICT(o->batch_set && o->to.batch != ci->batch, "--batch %lld, the checkpoint's is %lld",
             (long long)o->to.batch, (long long)ci->batch);
    CONFLICT(o->no_shuffle && ci->shuffle, "--no-shuffle, the checkpoint shuffles");
    CONFLICT(o->to.drop_last && !ci->drop_last,
             "--drop-last, the checkpoint keeps the last partial batch");
    char nd[1024] = "";
    for (int k = 0, at = 0; k < o->no_decay.n && at < (int)sizeof nd; k++)
        at += snprintf(nd + at, sizeof nd - (size_t)at, "%s%s", k ? "," : "", o->no_decay.v[k]);
    CONFLICT(o->no_decay.n && strcmp(nd, ci->no_decay ? ci->no_decay : ""),
             "--no-decay %s, the checkpoint's is %s", nd, ci->no_decay ? ci->no_decay : "none");
    CONFLICT(o->accumulate && o->accumulate != ci->accumulate,
             "--accumulate %lld, the checkpoint's is %lld", (long long)o->accumulate,
             (long long)ci->accumulate);
    CONFLICT(o->clip_norm_set && o->to.clip_grad_norm != ci->clip_grad_norm,
             "--clip-grad-norm %g, the checkpoint's is %g%s", o->to.clip_grad_norm, ci->clip_grad_norm,
             ci->clip_grad_norm > 0 ? "" : " (none)");
    CONFLICT(o->clip_value_set && o->to.clip_grad_value != ci->clip_grad_value,
             "--clip-grad-value %g, the checkpoint's is %g%s", o->to.clip_grad_value,
             ci->clip_grad_value, ci->clip_grad_value > 0 ? "" : " (none)");
    char have[256], had[256];
    CONFLICT(o->sched_set &&
                 (!ci->has_schedule || memcmp(&o->sched, &ci->schedule, sizeof o->sched)),
             "--lr-schedule %s, the checkpoint's is %s",
             ebb_lr_schedule_str(&o->sched, have, sizeof have),
             ci->has_schedule ? ebb_lr_schedule_str(&ci->schedule, had, sizeof had) : "none");
    CONFLICT(o->to.ema_decay && ci->ema_decay > 0 && o->to.ema_decay != ci->ema_decay,
             "--ema %g, the checkpoint's average decays by %g", o->to.ema_decay, ci->ema_decay);
#undef CONFLICT
    return n;
}

/* The optimizer, the data order and the schedule: the command line's, or
 * with --resume the checkpoint's, which an option that contradicts it may
 * not change unless --override says so. */
static int resolve_options(cli_run *c) {
    topts *o = &c->o;
    ebb_precision pr = o->to.precision ? o->to.precision : ebb_spec_precision(c->spec);
    if (o->to.low_weight_copies != EBB_LOW_COPIES_AUTO && pr != EBB_PRECISION_BF16 &&
        pr != EBB_PRECISION_FP16)
        return ebb_cli_usage_error(ebb_cli_usage_train, "%s",
                                   "--weight-copies keep or recast applies to a low precision "
                                   "(--precision bf16 or fp16, or the spec's precision:)");
    ebb_optimizer_kind k = EBB_ADAMW;
    if (o->optimizer) ebb_optimizer_kind_parse(&k, o->optimizer); /* checked by parse() */
    ebb_optimizer_options oo = ebb_optimizer_defaults(k, o->lr_set ? o->lr : ebb_optimizer_default_lr(k));
    if (o->to.resume) {
        ebb_status st = ebb_checkpoint_read_info(o->to.resume, &c->ci);
        if (st != EBB_OK) return ebb_cli_fail_status(st);
        char why[2048];
        if (resume_conflicts(o, &c->ci, why, sizeof why) && !o->override) {
            fprintf(stderr, "ebb: --resume %s: %s (--override makes the command line win)\n",
                    o->to.resume, why);
            return EXIT_USAGE;
        }
        o->to.seed = o->seed_set ? o->to.seed : c->ci.seed;
        o->to.batch = o->batch_set ? o->to.batch : c->ci.batch;
        o->no_shuffle |= !c->ci.shuffle;
        o->to.drop_last |= c->ci.drop_last;
        o->to.clip_grad_norm = o->clip_norm_set ? o->to.clip_grad_norm : c->ci.clip_grad_norm;
        o->accumulate = o->accumulate ? o->accumulate : c->ci.accumulate;
        o->to.ema_decay = o->to.ema_decay ? o->to.ema_decay : c->ci.ema_decay; /* its average goes on */
        if (!o->no_decay.n && c->ci.no_decay) {
            /* the checkpoint's groups, split at their commas */
            snprintf(o->no_decay_text, sizeof o->no_decay_text, "%s", c->ci.no_decay);
            for (char *tok = strtok(o->no_decay_text, ","); tok && o->no_decay.n < CLI_LIST_MAX;
                 tok = strtok(NULL, ","))
                o->no_decay.v[o->no_decay.n++] = tok;
        }
        o->to.clip_grad_value = o->clip_value_set ? o->to.clip_grad_value : c->ci.clip_grad_value;
        /* the rate the next step takes: the checkpoint's, where its
         * schedule left it, unless --override sets another */
        if (!o->optimizer || k == c->ci.optimizer.kind)
            oo = c->ci.optimizer;
        else
            oo.lr = c->ci.optimizer.lr;
        if (o->lr_set && o->override) oo.lr = o->lr;
    }
    if (o->momentum_set && oo.kind != EBB_SGD && oo.kind != EBB_RMSPROP) {
        fprintf(stderr, "ebb: --momentum applies to --optimizer sgd and rmsprop; %s trains with %s\n",
                o->to.resume ? o->to.resume : "the run", ebb_optimizer_kind_name(oo.kind));
        return EXIT_USAGE;
    }
    if (o->betas_set && oo.kind != EBB_ADAM && oo.kind != EBB_ADAMW) {
        fprintf(stderr, "ebb: --betas applies to --optimizer adam and adamw; %s trains with %s\n",
                o->to.resume ? o->to.resume : "the run", ebb_optimizer_kind_name(oo.kind));
        return EXIT_USAGE;
    }
    if (o->eps_set && oo.kind == EBB_SGD) {
        fprintf(stderr, "ebb: --eps applies to every --optimizer but sgd; %s trains with sgd\n",
                o->to.resume ? o->to.resume : "the run");
        return EXIT_USAGE;
    }
    if (o->momentum_set) oo.momentum = o->momentum;
    if (o->wd_set) oo.weight_decay = o->weight_decay;
    if (o->betas_set) {
        oo.beta1 = o->betas[0];
        oo.beta2 = o->betas[1];
    }
    if (o->eps_set) oo.eps = o->eps;
    c->kind = ebb_optimizer_kind_name(oo.kind);
    c->to.optimizer = oo;
    /* --lr-schedule's, or the checkpoint's, continued where it stopped */
    c->to.schedule = o->sched_set ? &o->sched : c->ci.has_schedule ? &c->ci.schedule : NULL;
    return 0;
}

static void add_file(const char **list, int *n, const char *role, const char *what,
                     const char *path) {
    list[(*n)++] = role;
    list[(*n)++] = what;
    list[(*n)++] = path;
}

/* Once before anything is read, once more with the data's files. */
static int check_files(const cli_run *c) {
    const topts *o = &c->o;
    const ebb_dataset *train = ebb_trainer_data(c->t), *test = ebb_trainer_eval_data(c->t);
    const char *list[3 * (16 + 2 * MAX_FIELDS) + 1];
    int n = 0;
    add_file(list, &n, "in", "SPEC", o->spec);
    add_file(list, &n, "in", "--weights", o->to.weights);
    add_file(list, &n, "in", "--resume", o->to.resume);
    for (int i = 0; i < ebb_dataset_field_count(train) && i < MAX_FIELDS; i++)
        add_file(list, &n, "in", "--data", ebb_dataset_field_file(train, i));
    for (int i = 0; i < ebb_dataset_field_count(test) && i < MAX_FIELDS; i++)
        add_file(list, &n, "in", "--eval-data", ebb_dataset_field_file(test, i));
    /* the checkpoint resumed is read whole before the first is written */
    add_file(list, &n, "out=--resume", "--checkpoint", c->ckpt_path);
    add_file(list, &n, "out=--resume", "--keep-best", ebb_trainer_get_stats(c->t).best_checkpoint);
    add_file(list, &n, "out", "--save-weights", o->save_weights);
    add_file(list, &n, "out", "--trace", o->trace);
    add_file(list, &n, "out", "--curve", o->curve);
    add_file(list, &n, "out", "--log-csv", o->log_csv);
    list[n] = NULL;
    return ebb_cli_check_aliases(list);
}

static void print_warning(const char *message, void *user) {
    (void)user;
    fprintf(stderr, "ebb: warning: %s\n", message);
}

/* The exit code for a trainer's failure, with the hints that belong to the
 * command line. `running`: the failure came after the trainer opened. */
static int trainer_fail(const cli_run *c, ebb_status st, int running) {
    ebb_trainer_stats s = ebb_trainer_get_stats(c->t);
    const char *msg = ebb_errmsg();
    if (c->tty && running) printf("\n");
    fflush(stdout);
    if (st == EBB_ERR_ARG && strstr(msg, "NaN or infinite") &&
        (strstr(msg, c->o.to.weights ? c->o.to.weights : "\x01") ||
         strstr(msg, c->o.to.resume ? c->o.to.resume : "\x01")) && !running) {
        fprintf(stderr, "ebb: %s; --allow-nonfinite loads it anyway\n", msg);
        return EXIT_SPEC;
    }
    if (s.nonfinite) {
        fprintf(stderr, "ebb: %s\n", msg);
        return EXIT_SPEC;
    }
    /* refused at open: a flag's value the run cannot use with this data or
     * checkpoint (the trainer's message starts with the flag) */
    if (!running && st == EBB_ERR_ARG && !strncmp(msg, "--", 2)) {
        fprintf(stderr, "ebb: %s\n", msg);
        return EXIT_USAGE;
    }
    if (running && st == EBB_ERR_IO) { /* a checkpoint that could not be written */
        fprintf(stderr, "ebb: %s\n", msg);
        return EXIT_RUNTIME;
    }
    int rc = ebb_cli_fail_status(st);
    if (!s.failed_step) return rc;
    /* updates run inside the backward, so a step that fails there may
     * leave some parameters updated: the model is not saved */
    if (c->o.checkpoint)
        fprintf(stderr, "ebb: step %lld failed and nothing was saved; %s is as the last "
                        "checkpoint left it: continue with --resume %s\n",
                (long long)s.failed_step, c->o.checkpoint, c->o.checkpoint);
    else
        fprintf(stderr, "ebb: step %lld failed and nothing was saved\n", (long long)s.failed_step);
    return rc;
}

/* A mean loss as a JSON line prints it: "0.123456789", or null when every
 * step it covers was skipped or the value is not finite. */
static const char *json_loss(double sum, int64_t n, char *buf, size_t size) {
    double v = n ? sum / (double)n : NAN;
    snprintf(buf, size, isfinite(v) ? "%.9g" : "null", v);
    return buf;
}

/* exp of a mean per-token loss, the perplexity, as a JSON line prints it */
static const char *json_ppl(double sum, int64_t n, char *buf, size_t size) {
    double v = n ? exp(sum / (double)n) : NAN;
    snprintf(buf, size, isfinite(v) ? "%.9g" : "null", v);
    return buf;
}

/* ---- the callbacks ---- */

/* A number for the CSV log: empty when absent or not finite. */
static void csv_num(FILE *f, double v, const char *fmt) {
    fputc(',', f);
    if (isfinite(v)) fprintf(f, fmt, v);
}

/* One --log-csv row; a write that fails stops training (exit 3). */
static int csv_row(cli_run *c, const char *kind, const ebb_train_event *e, double loss) {
    FILE *f = c->csv;
    const ebb_metrics *m = e->eval;
    fprintf(f, "%s,%lld,%lld,%lld", kind, (long long)e->epoch, (long long)e->step,
            (long long)e->samples);
    csv_num(f, loss, "%.9g");
    csv_num(f, e->kind == EBB_TRAIN_STEP ? e->lr : NAN, "%.9g");
    csv_num(f, e->samples_per_s, "%.1f");
    csv_num(f, m ? m->loss : NAN, "%.9g");
    csv_num(f, m && m->classes ? m->accuracy : NAN, "%.9g");
    csv_num(f, m && m->top_k ? m->top_k_accuracy : NAN, "%.9g");
    /* a per-token loss's perplexity, exp(loss): the row's, then the evaluation's */
    int per_token = ebb_trainer_get_stats(c->t).per_token;
    csv_num(f, per_token ? exp(loss) : NAN, "%.9g");
    csv_num(f, per_token && m ? m->perplexity : NAN, "%.9g");
    fputc('\n', f);
    if (fflush(f) != 0 || ferror(f)) {
        fprintf(stderr, "ebb: --log-csv %s: %s\n", c->o.log_csv, strerror(errno));
        c->rc = EXIT_RUNTIME;
        return 1;
    }
    return 0;
}

/* The traced step's summary line; the file is written now, not at the end:
 * a long run's trace is there to look at while it trains. */
static int trace_done(cli_run *c, const ebb_train_event *e) {
    const topts *o = &c->o;
    const ebb_plan *plan = ebb_trainer_train_plan(c->t);
    char dn[32], lb[32];
    fprintf(c->trace.f,
            "{\"summary\": {\"steps\": %lld, \"peak_bytes\": %lld, "
            "\"planned_peak_bytes\": %lld, \"peak_kind\": \"%s\", \"training_step\": %lld, "
            "\"epoch\": %lld, \"loss\": %s, \"device\": \"%s\"}}\n",
            (long long)c->trace.steps, (long long)e->stats->measured_peak_bytes,
            (long long)e->stats->planned_peak_bytes,
            ebb_plan_peak_is_bound_on(plan, c->dev) ? "bound" : "exact", (long long)e->step,
            (long long)e->epoch, json_loss(e->loss, 1, lb, sizeof lb),
            ebb_device_str(c->dev, dn, sizeof dn));
    ebb_status st = ebb_file_commit(c->tw);
    c->tw = NULL;
    if (st != EBB_OK) {
        fprintf(stderr, "ebb: %s\n", ebb_errmsg());
        return EXIT_RUNTIME;
    }
    if (o->json) return 0;
    const char *sym = NULL;
    if (c->tty) printf("\n");
    ebb_spec_input_dim(c->spec, 0, 0, &sym);
    printf("trace of step %lld written to %s; draw it with: ebb chart %s --train -i %s=%lld",
           (long long)e->step, o->trace, ebb_spec_file(c->spec), sym ? sym : "batch",
           (long long)o->to.batch);
    const char *seq = NULL;
    if (o->to.block && ebb_spec_input_dim(c->spec, 0, 1, &seq) < 0 && seq)
        printf(" -i %s=%lld", seq, (long long)o->to.block);
    for (int i = 0; i < o->params.n; i++)
        printf(" -p %s", o->params.v[i]);
    if (strcmp(c->kind, "adamw")) printf(" --optimizer %s", c->kind);
    if (o->accumulate > 1) printf(" --grads-only"); /* a micro-batch's gradient plan */
    if (o->to.memory_budget == EBB_MEMORY_BUDGET_LEAST)
        printf(" --memory-budget least");
    else if (o->to.memory_budget)
        printf(" --memory-budget %lld", (long long)o->to.memory_budget);
    if (o->to.precision == EBB_PRECISION_BF16 || o->to.precision == EBB_PRECISION_FP16)
        printf(" --precision %s", ebb_precision_name(o->to.precision));
    printf(" --trace %s -o chart.svg\n", o->trace);
    fflush(stdout);
    return 0;
}

/* After every step: a step over its plan, the trace, the curve's point, the
 * JSON line, and a signal's stop. Returns non-zero to stop training. */
static int on_step(ebb_trainer *t, const ebb_train_event *e, void *user) {
    cli_run *c = user;
    const topts *o = &c->o;
    ebb_trainer_stats s = ebb_trainer_get_stats(t);
    if (e->over_plan && (s.over_plan == 1 || o->strict_memory)) {
        /* the first such step is named; a summary at the end counts them */
        char when[64];
        snprintf(when, sizeof when, "at training step %lld", (long long)e->step);
        if ((c->rc = ebb_cli_check_over(ebb_trainer_train_plan(t), e->stats,
                                        e->stats->measured_peak_bytes, o->strict_memory, when))) {
            fprintf(stderr, "ebb: training stopped at step %lld and nothing was saved%s%s\n",
                    (long long)e->step, o->checkpoint ? "; the last checkpoint is in " : "",
                    o->checkpoint ? o->checkpoint : "");
            return 1;
        }
    }
    if (e->traced && (c->rc = trace_done(c, e))) return 1;
    int counted = !e->skipped;
    c->curve_loss += counted ? e->loss : 0;
    c->curve_n += counted;
    c->json_loss += counted ? e->loss : 0;
    c->json_n += counted;
    c->csv_loss += counted ? e->loss : 0;
    c->csv_n += counted;
    if (c->csv && o->to.log_every && e->step % o->to.log_every == 0) {
        int stop = csv_row(c, "step", e, c->csv_n ? c->csv_loss / (double)c->csv_n : NAN);
        c->csv_loss = 0;
        c->csv_n = 0;
        if (stop) return 1;
    }
    if (c->curve && (e->step % c->window == 0 || e->step == e->total_steps || ebb_cli_stop_signal())) {
        ebb_status st = ebb_cli_curve_step(c->curve, e->step, e->samples,
                                           c->curve_n ? c->curve_loss / (double)c->curve_n : NAN);
        c->curve_loss = 0;
        c->curve_n = 0;
        if (st != EBB_OK) return (c->rc = ebb_cli_fail_status(st));
    }
    if (o->json && o->to.log_every && e->step % o->to.log_every == 0) {
        char lb[32];
        printf("{\"type\": \"step\", \"epoch\": %lld, \"step\": %lld, \"steps\": %lld, "
               "\"loss\": %s",
               (long long)e->epoch, (long long)e->step, (long long)e->total_steps,
               json_loss(c->json_loss, c->json_n, lb, sizeof lb));
        if (s.per_token)
            printf(", \"perplexity\": %s", json_ppl(c->json_loss, c->json_n, lb, sizeof lb));
        printf(", \"lr\": %.9g, \"samples_per_s\": %.1f}\n", e->lr, e->samples_per_s);
        c->json_loss = 0;
        c->json_n = 0;
        fflush(stdout);
    }
    return ebb_cli_stop_signal(); /* the trainer's stopped_by, on every rank */
}

/* After every epoch: the JSON line and the learning curves, redrawn (a run
 * stopped later still has them). */
static int on_epoch(ebb_trainer *t, const ebb_train_event *e, void *user) {
    cli_run *c = user;
    int per_token = ebb_trainer_get_stats(t).per_token;
    const ebb_metrics *m = e->eval;
    if (c->csv && csv_row(c, "epoch", e, e->loss)) return 1;
    if (c->o.json) {
        char lb[32];
        ebb_trainer_stats ts = ebb_trainer_get_stats(t);
        printf("{\"type\": \"epoch\", \"epoch\": %lld, \"step\": %lld, \"loss\": %s, "
               "\"seconds\": %.3f, \"peak_bytes\": %lld, \"planned_peak_bytes\": %lld",
               (long long)e->epoch, (long long)e->step, json_loss(e->loss, 1, lb, sizeof lb),
               e->seconds, (long long)ts.measured_peak_bytes, (long long)ts.planned_peak_bytes);
        if (per_token) printf(", \"perplexity\": %s", json_ppl(e->loss, 1, lb, sizeof lb));
        if (c->o.to.skip_nonfinite) printf(", \"skipped\": %lld", (long long)e->epoch_skipped);
        if (m)
            printf(", \"eval_loss\": %s, \"eval_samples\": %lld", json_loss(m->loss, 1, lb, sizeof lb),
                   (long long)m->samples);
        if (m && per_token)
            printf(", \"eval_perplexity\": %s", json_ppl(m->loss, 1, lb, sizeof lb));
        if (m && m->classes) printf(", \"eval_accuracy\": %.9g", m->accuracy);
        if (m && m->top_k) printf(", \"eval_top_k\": %d, \"eval_top_k_accuracy\": %.9g", m->top_k,
                                  m->top_k_accuracy);
        printf("}\n");
        fflush(stdout);
    }
    if (c->curve &&
        (ebb_cli_curve_epoch(c->curve, e->epoch, e->samples, e->loss, m ? m->loss : NAN,
                             m && m->classes ? m->accuracy : NAN) != EBB_OK ||
         ebb_cli_curve_save(c->curve, c->o.curve, "--curve") != EBB_OK)) {
        fprintf(stderr, "ebb: %s\n", ebb_errmsg());
        c->rc = EXIT_RUNTIME;
        return 1;
    }
    return 0;
}

/* ---- train: open, run, finish ---- */

/* --trace's writer and --curve's picture, once the trainer knows the run. */
static int open_outputs(cli_run *c) {
    const topts *o = &c->o;
    ebb_trainer_stats s = ebb_trainer_get_stats(c->t);
    if (o->trace) {
        if (ebb_file_begin(&c->tw, o->trace, "--trace") != EBB_OK) {
            fprintf(stderr, "ebb: %s\n", ebb_errmsg());
            return EXIT_RUNTIME;
        }
        c->trace = (ebb_cli_trace){.f = ebb_file_stream(c->tw), .plan = ebb_trainer_train_plan(c->t)};
    }
    /* --curve: a training-loss point per logged window, else about 200
     * points over the run, which a picture 700 px wide still shows apart */
    if (o->log_csv) {
        if (!(c->csv = fopen(o->log_csv, "we"))) {
            fprintf(stderr, "ebb: --log-csv %s: %s\n", o->log_csv, strerror(errno));
            return EXIT_RUNTIME;
        }
        fputs("kind,epoch,step,samples,loss,lr,samples_per_s,eval_loss,eval_accuracy,"
              "eval_top_k_accuracy,perplexity,eval_perplexity\n",
              c->csv);
    }
    int64_t left = s.total_steps - s.step;
    c->window = o->to.log_every ? o->to.log_every : left / 200 + (left % 200 != 0);
    if (c->window < 1) c->window = 1;
    if (!o->curve) return 0;
    char context[1024];
    /* the base rate: a schedule's first one may be 0 (a warmup) */
    ebb_lr_scheduler *sched = ebb_trainer_scheduler(c->t);
    snprintf(context, sizeof context, "%s on %s, batch %lld, %s lr %g", ebb_spec_file(c->spec),
             o->data, (long long)o->to.batch, c->kind,
             sched ? ebb_lr_scheduler_base_lr(sched)
                   : ebb_optimizer_get_options(ebb_trainer_optimizer(c->t)).lr);
    const char *name = ebb_spec_name(c->spec);
    const char *loss = o->to.loss ? o->to.loss : ebb_graph_loss(ebb_spec_graph(c->spec));
    const ebb_op *loss_op = loss ? ebb_op_find(loss) : NULL;
    int classify = loss_op && loss_op->indices == EBB_INDICES_CLASSES;
    ebb_cli_curve_info info = {
        .name = name && *name ? name : ebb_spec_file(c->spec),
        .context = context,
        .samples_per_epoch = s.epoch_samples,
        .first_samples = s.samples_seen,
        .last_samples = s.samples_total,
        .window = c->window,
        .eval = o->to.eval_data != NULL,
        .accuracy = o->to.eval_data && classify,
    };
    ebb_status st = ebb_cli_curve_new(&c->curve, &info);
    return st == EBB_OK ? 0 : ebb_cli_fail_status(st);
}

/* ---- data parallel --------------------------------------------------------- */

/* A rank of a data-parallel run: joins the group from the environment;
 * every rank but 0 keeps quiet and writes no file (the trainer writes rank
 * 0's checkpoints and weights alone). */
static int join_ranks(cli_run *c) {
    ebb_dist_options d = {0};
    /* a GPU without an index is the rank's own, cuda:LOCAL_RANK, and the
     * group NCCL's */
    ebb_device dev;
    int rc = parse_device(&c->o, &dev);
    if (rc) return rc;
    ebb_status st = ebb_dist_options_from_env(&d);
    const char *local = getenv("LOCAL_RANK");
    if (st == EBB_OK && dev.type == EBB_DEVICE_CUDA && !(c->o.device && strchr(c->o.device, ':')))
        dev.index = local && *local ? atoi(local) : d.rank;
    d.device = dev;
    if (st == EBB_OK) st = ebb_dist_open(&c->dist, &d);
    if (st != EBB_OK) return ebb_cli_fail_status(st);
    if (d.rank != 0) {
        c->o.curve = c->o.log_csv = c->o.trace = NULL;
        if (!freopen("/dev/null", "w", stdout)) return EXIT_RUNTIME;
    }
    return 0;
}

/* The data-parallel flags against each other and the environment, before
 * any rank starts. 0, or the usage exit code. */
static int check_parallel_flags(const topts *o) {
    if ((o->to.parallel.zero || o->to.parallel.overlap) && o->nproc <= 1 && !getenv("WORLD_SIZE"))
        return ebb_cli_usage_error(ebb_cli_usage_train, "%s",
                                   o->to.parallel.zero ? "--zero shards the optimizer over the ranks of "
                                             "data-parallel training (--nproc N, or torchrun's "
                                             "environment)"
                                           : "--overlap applies to data-parallel training "
                                             "(--nproc N, or torchrun's environment)");
    /* NCCL takes one GPU per rank: with --nproc every rank gets these
     * options, and an index would give them all that one (a torchrun job
     * may name each process's own) */
    if (o->device && strncmp(o->device, "cuda:", 5) == 0 && o->nproc > 1 && !getenv("WORLD_SIZE"))
        return ebb_cli_usage_error(ebb_cli_usage_train,
                                   "--device %s would put every rank on one GPU, which NCCL "
                                   "refuses: --device cuda gives each rank its own "
                                   "(cuda:LOCAL_RANK)",
                                   o->device);
    if (o->to.parallel.bucket_bytes && o->nproc <= 1 && !getenv("WORLD_SIZE"))
        return ebb_cli_usage_error(ebb_cli_usage_train, "%s",
                                   "--bucket-size applies to data-parallel training (--nproc N, "
                                   "or a torchrun job)");
    /* told before any rank starts: a rank that refuses it alone can take
     * the others down with a lost connection first */
    if (o->nproc > 1 && o->batch_set && o->to.batch % o->nproc != 0) {
        fprintf(stderr, "ebb: --batch %lld is the global batch of %lld ranks: it must be a "
                        "multiple of %lld\n",
                (long long)o->to.batch, (long long)o->nproc, (long long)o->nproc);
        return EXIT_USAGE;
    }
    /* a rank of a job that torchrun (or a hand) started is not a launcher;
     * the ranks --nproc starts say who launched them */
    if (o->nproc > 1 && getenv("WORLD_SIZE") && !getenv("EBB_LAUNCHER_PID")) {
        char set[64];
        snprintf(set, sizeof set, "%.32s", getenv("WORLD_SIZE"));
        return ebb_cli_usage_error(ebb_cli_usage_train,
                                   "--nproc: this process is already a rank of a job "
                                   "(WORLD_SIZE=%s is set, as torchrun sets it); drop --nproc, "
                                   "or unset WORLD_SIZE to launch the ranks here",
                                   set);
    }
    return 0;
}

/* Returns 0, -1 when help was printed, or an exit code. */
static int train_open(cli_run *c, const command *self, int argc, char **argv) {
    topts *o = &c->o;
    int rc = parse(self, argc, argv, 1, o);
    if (rc) return rc;
    if ((rc = check_parallel_flags(o))) return rc;
    if (o->nproc > 1 && !getenv("WORLD_SIZE")) return ebb_cli_launch_ranks((int)o->nproc, argc, argv);
    if (getenv("WORLD_SIZE") && ((rc = ebb_cli_follow_launcher()) || (rc = join_ranks(c))))
        return rc;
    c->ckpt_path = o->checkpoint ? o->checkpoint : DEFAULT_CHECKPOINT;
    if ((o->save_weights && ebb_file_check_writable(o->save_weights, "--save-weights") != EBB_OK) ||
        (o->trace && ebb_file_check_writable(o->trace, "--trace") != EBB_OK) ||
        (o->curve && ebb_file_check_writable(o->curve, "--curve") != EBB_OK) ||
        (o->log_csv && ebb_file_check_writable(o->log_csv, "--log-csv") != EBB_OK) ||
        (o->checkpoint && ebb_file_check_writable(o->checkpoint, "--checkpoint") != EBB_OK)) {
        fprintf(stderr, "ebb: %s\n", ebb_errmsg());
        return EXIT_RUNTIME;
    }
    if ((rc = check_files(c)) || (rc = load_spec(o, &c->dev, &c->spec)))
        return rc;
    if (c->dist)
        c->dev = ebb_dist_device(c->dist); /* the rank's own GPU (join_ranks) */
    if ((rc = resolve_options(c)))
        return rc;
    ebb_trainer_options *to = &c->to;
    ebb_optimizer_options oo = to->optimizer;
    const ebb_lr_schedule *sched = to->schedule;
    /* the rows set most of the library's options (o->to); these are the
     * ones the command works out */
    *to = o->to;
    to->data = o->data;
    to->normalize = o->normalize;
    to->norm_mean = o->norm.mean;
    to->norm_std = o->norm.std;
    to->shuffle = !o->no_shuffle;
    to->optimizer = oo;
    to->schedule = sched;
    to->accumulate = (int)o->accumulate;
    to->no_decay = o->no_decay.v;
    to->n_no_decay = o->no_decay.n;
    to->lr_scale = o->lr_scale.v;
    to->n_lr_scale = o->lr_scale.n;
    to->freeze = o->freeze.v;
    to->n_freeze = o->freeze.n;
    to->device = c->dev;
    to->dist = c->dist;
    to->trace = o->trace ? ebb_cli_trace_step : NULL;
    to->trace_user = &c->trace;
    /* the default path is for a signal's checkpoint; asked for, the trainer
     * writes one every epoch (or every N steps) and at the end */
    to->checkpoint = o->checkpoint || o->to.checkpoint_every || o->to.keep_best ? c->ckpt_path
                                                                                 : NULL;
    to->early_stop_patience = (int)o->early_stop.epochs;
    to->early_stop_min_delta = o->early_stop.min_delta;
    to->on_step = on_step;
    to->on_epoch = on_epoch;
    to->user = c;
    to->progress = o->json ? NULL : stdout;
    to->warning = print_warning;
    c->tty = !o->json && isatty(1);
    ebb_status st = ebb_trainer_open(&c->t, c->spec, to);
    if (st != EBB_OK) return trainer_fail(c, st, 0);
    ebb_cli_warn_precision(to->precision ? to->precision : ebb_spec_precision(c->spec), to->device);
    const char *best = ebb_trainer_get_stats(c->t).best_checkpoint;
    if (best && ebb_file_check_writable(best, "--keep-best") != EBB_OK) {
        fprintf(stderr, "ebb: %s\n", ebb_errmsg());
        return EXIT_RUNTIME;
    }
    if ((rc = check_files(c)) || (rc = open_outputs(c))) return rc;
    return 0;
}

static void train_close(cli_run *c) {
    ebb_cli_signals_restore();
    ebb_file_abort(c->tw);
    ebb_cli_curve_free(c->curve);
    if (c->csv) fclose(c->csv);
    ebb_trainer_free(c->t);
    ebb_dist_free(c->dist);
    ebb_checkpoint_info_free(&c->ci);
    ebb_spec_free(c->spec);
}

static void report_skips(const ebb_trainer_stats *s) {
    if (s->loss_scale > 0)
        fprintf(stderr, "ebb: loss scaling: %lld of %lld steps overflowed and updated nothing; the "
                        "scale is now %g\n",
                (long long)s->overflowed, (long long)s->done_steps, s->loss_scale);
    if (s->skipped)
        fprintf(stderr,
                "ebb: --skip-nonfinite: skipped %lld of %lld steps (the first, step %lld: %s)\n",
                (long long)s->skipped, (long long)s->done_steps, (long long)s->first_skipped,
                s->first_skip_why);
}

/* A signal asked to stop (`sig`, on this rank or, with ranks, on any): the
 * checkpoint, and what else is said. Rank 0 writes it; the others say so. */
static int stopped(cli_run *c, int sig) {
    ebb_trainer_stats s = ebb_trainer_get_stats(c->t);
    if (c->tty) printf("\n");
    fflush(stdout);
    ebb_status st = ebb_trainer_checkpoint(c->t, c->ckpt_path);
    if (st != EBB_OK) return trainer_fail(c, st, 1);
    if (c->curve && ebb_cli_curve_save(c->curve, c->o.curve, "--curve") != EBB_OK)
        fprintf(stderr, "ebb: %s\n", ebb_errmsg());
    if (c->tw)
        fprintf(stderr, "ebb: --trace: step %lld was not reached; %s is left as it was\n",
                (long long)(c->o.to.trace_step ? c->o.to.trace_step : s.step + 1), c->o.trace);
    report_skips(&s);
    int rank = c->dist ? ebb_dist_rank(c->dist) : 0;
    if (rank == 0)
        fprintf(stderr,
                "ebb: interrupted by %s after step %lld; checkpoint written to %s (resume with "
                "--resume %s)\n",
                ebb_cli_signal_name(sig), (long long)s.step, c->ckpt_path, c->ckpt_path);
    else
        fprintf(stderr, "ebb: rank %d: interrupted by %s after step %lld, with every rank; rank 0 "
                        "wrote the checkpoint\n",
                rank, ebb_cli_signal_name(sig), (long long)s.step);
    return EXIT_SIGNAL_BASE + sig;
}

/* The run's end (the trainer wrote the last checkpoint): the weights and
 * what the run did. */
static int finish(cli_run *c) {
    const topts *o = &c->o;
    ebb_trainer_stats s = ebb_trainer_get_stats(c->t);
    const char *why = ebb_trainer_stop_reason(c->t);
    if (why && o->json) printf("{\"type\": \"stop\", \"step\": %lld, \"reason\": \"%s\"}\n",
                               (long long)s.step, why);
    if (o->save_weights) {
        ebb_status st = ebb_trainer_save_weights(c->t, o->save_weights);
        if (st != EBB_OK) return trainer_fail(c, st, 1);
        if (!o->json) printf("weights written to %s\n", o->save_weights);
    }
    if (c->curve && !o->json) printf("learning curves drawn in %s\n", o->curve);
    if (o->to.cuda_graph && !o->json)
        printf("%lld of %lld steps replayed from a CUDA graph\n", (long long)s.replayed,
               (long long)s.done_steps);
    report_skips(&s);
    if (s.over_plan > 1)
        fprintf(stderr, "ebb: warning: %lld of %lld training steps measured more than their "
                        "plan\n",
                (long long)s.over_plan, (long long)s.done_steps);
    return 0;
}

int ebb_cli_train(const command *self, int argc, char **argv) {
    cli_run c;
    memset(&c, 0, sizeof c);
    int rc = train_open(&c, self, argc, argv);
    if (!rc) {
        ebb_cli_signals_install();
        ebb_status st = ebb_trainer_run(c.t);
        if (c.rc)
            rc = c.rc;
        else if (st != EBB_OK)
            rc = trainer_fail(&c, st, 1);
        else if (ebb_trainer_get_stats(c.t).stopped_by)
            rc = stopped(&c, ebb_trainer_get_stats(c.t).stopped_by);
        else
            rc = finish(&c);
    }
    train_close(&c);
    return rc < 0 ? 0 : rc;
}

/* ---- eval ------------------------------------------------------------------ */

static void print_metrics_json(const ebb_metrics *m, int full) {
    char lb[32];
    printf("{\"samples\": %lld, \"loss\": %s", (long long)m->samples,
           json_loss(m->loss, 1, lb, sizeof lb));
    if (m->classes) printf(", \"accuracy\": %.9g", m->accuracy);
    if (m->top_k) printf(", \"top_k\": %d, \"top_k_accuracy\": %.9g", m->top_k, m->top_k_accuracy);
    if (!isnan(m->perplexity))
        printf(", \"perplexity\": %s, \"tokens\": %lld", json_loss(m->perplexity, 1, lb, sizeof lb),
               (long long)m->predictions);
    if (full && m->confusion) {
        printf(", \"class_accuracy\": [");
        for (int64_t k = 0; k < m->classes; k++) {
            double a = ebb_metrics_class_accuracy(m, k);
            printf(isnan(a) ? "%snull" : "%s%.9g", k ? ", " : "", a);
        }
        printf("], \"confusion\": [");
        for (int64_t r = 0; r < m->classes; r++) {
            printf("%s[", r ? ", " : "");
            for (int64_t k = 0; k < m->classes; k++)
                printf("%s%lld", k ? ", " : "", (long long)m->confusion[r * m->classes + k]);
            printf("]");
        }
        printf("]");
    }
    printf("}\n");
}

int ebb_cli_eval(const command *self, int argc, char **argv) {
    cli_run c;
    memset(&c, 0, sizeof c);
    topts *o = &c.o;
    int rc = parse(self, argc, argv, 0, o);
    if (rc) return rc < 0 ? 0 : rc;
    ebb_metrics m = {0};
    if ((rc = load_spec(o, &c.dev, &c.spec))) goto done;
    c.to = o->to;
    c.to.evaluate_only = 1;
    c.to.eval_data = o->data;
    c.to.normalize = o->normalize;
    c.to.norm_mean = o->norm.mean;
    c.to.norm_std = o->norm.std;
    c.to.device = c.dev;
    c.to.warning = print_warning;
    ebb_status st = ebb_trainer_open(&c.t, c.spec, &c.to);
    if (st == EBB_OK) {
        ebb_cli_warn_precision(o->to.precision ? o->to.precision : ebb_spec_precision(c.spec), c.dev);
        st = ebb_trainer_evaluate(c.t, &m);
    }
    if (st != EBB_OK) {
        rc = trainer_fail(&c, st, 0);
        goto done;
    }
    if (o->json) {
        print_metrics_json(&m, o->metrics);
    } else if (o->metrics) {
        ebb_metrics_print(&m, stdout);
    } else {
        /* the first line of the full print: accuracies, loss, perplexity */
        ebb_metrics line = m;
        line.confusion = NULL;
        ebb_metrics_print(&line, stdout);
    }
done:
    ebb_metrics_free(&m);
    ebb_trainer_free(c.t);
    ebb_spec_free(c.spec);
    return rc;
}
