/* Trains a spec on Fashion-MNIST with the library's trainer: steps of two
 * micro-batches of 32, gradients clipped to norm 1, a cosine schedule; then
 * per-class accuracy and the confusion matrix of the test split.
 *     train_fashion [SPEC [STEPS]]   (default specs/fashion_mlp.yaml, one epoch) */
#include <stdio.h>
#include <stdlib.h>

#include <ebb/ebb.h>

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "specs/fashion_mlp.yaml";
    ebb_trainer_options o = ebb_trainer_defaults();
    o.data = "fashion-mnist";
    o.eval_data = "fashion-mnist:test";
    o.steps = argc > 2 ? atoll(argv[2]) : 0; /* 0: o.epochs, one */
    o.batch = 32;
    o.accumulate = 2;
    o.clip_grad_norm = 1.0;
    o.optimizer = ebb_optimizer_defaults(EBB_ADAMW, 2e-3);
    /* cosine over the run: 938 steps are one epoch of 60000 samples */
    ebb_lr_schedule cosine = {.kind = EBB_LR_COSINE, .t_max = o.steps ? o.steps : 938};
    o.schedule = &cosine;
    o.progress = stdout; /* the progress line and one line per epoch */

    ebb_spec *spec = NULL;
    ebb_trainer *t = NULL;
    ebb_metrics m = {0};
    int ok = ebb_init() == EBB_OK && ebb_spec_load(&spec, path) == EBB_OK &&
             ebb_trainer_open(&t, spec, &o) == EBB_OK && ebb_trainer_run(t) == EBB_OK &&
             ebb_trainer_evaluate(t, &m) == EBB_OK;
    if (ok)
        ebb_metrics_print(&m, stdout);
    else
        fprintf(stderr, "train_fashion: %s\n", ebb_errmsg());
    ebb_metrics_free(&m);
    ebb_trainer_free(t);
    ebb_spec_free(spec);
    return ok ? 0 : 1;
}
