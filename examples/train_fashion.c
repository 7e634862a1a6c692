/* Trains a model on Fashion-MNIST with the library's trainer: steps of two
 * micro-batches of 32, gradients clipped to norm 1, a cosine schedule; then
 * per-class accuracy and the confusion matrix of the test split.
 *     train_fashion [SPEC | builder] [STEPS]
 * The model is a YAML spec (default specs/fashion_mlp.yaml), or with
 * `builder` the same MLP declared here with the builder calls: the trainer
 * takes either, and trains them alike (same seed, same weights). STEPS
 * defaults to one epoch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ebb/ebb.h>

/* specs/fashion_mlp.yaml in C: 784-256-128-100-10 with ReLUs, and its loss. */
static ebb_graph *fashion_mlp(void) {
    ebb_builder *b = ebb_builder_new("fashion_mlp");
    ebb_input(b, "x");
    ebb_from(b, ebb_node_op(b, "linear", "in=784, out=256, name=fc1"));
    ebb_through(b, ebb_node_op(b, "relu", NULL));
    ebb_through(b, ebb_node_op(b, "linear", "out=128, name=fc2"));
    ebb_through(b, ebb_node_op(b, "relu", NULL));
    ebb_through(b, ebb_node_op(b, "linear", "out=100, name=fc3"));
    ebb_through(b, ebb_node_op(b, "relu", NULL));
    ebb_through(b, ebb_node_op(b, "linear", "out=10, name=out"));
    ebb_target(b, "y");
    ebb_loss(b, "cross_entropy", NULL);
    ebb_graph *g = ebb_build(b); /* NULL, with the builder's error, on a mistake */
    ebb_builder_free(b);
    return g;
}

int main(int argc, char **argv) {
    const char *model = argc > 1 ? argv[1] : "specs/fashion_mlp.yaml";
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
    ebb_graph *g = NULL;
    ebb_trainer *t = NULL;
    ebb_metrics m = {0};
    int ok = ebb_init() == EBB_OK;
    if (ok && strcmp(model, "builder") == 0) {
        /* what a spec's inputs: and targets: say, for the graph's x and y */
        const ebb_spec_field fields[] = {{"x", "batch, 784", NULL}, {"y", "batch", "int64"}};
        ok = (g = fashion_mlp()) != NULL && ebb_trainer_open_graph(&t, g, fields, 2, &o) == EBB_OK;
    } else if (ok) {
        ok = ebb_spec_load(&spec, model) == EBB_OK && ebb_trainer_open(&t, spec, &o) == EBB_OK;
    }
    ok = ok && ebb_trainer_run(t) == EBB_OK && ebb_trainer_evaluate(t, &m) == EBB_OK;
    if (ok)
        ebb_metrics_print(&m, stdout);
    else
        fprintf(stderr, "train_fashion: %s\n", ebb_errmsg());
    ebb_metrics_free(&m);
    ebb_trainer_free(t);
    ebb_graph_free(g);
    ebb_spec_free(spec);
    return ok ? 0 : 1;
}
