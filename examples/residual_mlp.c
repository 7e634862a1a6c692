/* A small residual MLP with a split/merge, a gate and a loop: built with the
 * fluent builder, compiled to a plan, printed like SQLite's EXPLAIN, run, and
 * checked: the allocator's measured peak next to the plan's prediction. */
#include <stdio.h>
#include <stdlib.h>

#include "ebb/ebb.h"

static int die(const char *what) {
    fprintf(stderr, "%s: %s\n", what, ebb_errmsg());
    return 1;
}

int main(int argc, char **argv) {
    int64_t batch = argc > 1 ? atoll(argv[1]) : 32, width = argc > 2 ? atoll(argv[2]) : 256;
    if (ebb_init() != EBB_OK)
        return die("ebb_init");

    /* Declare. Errors are sticky: nothing to check until ebb_build. */
    ebb_builder *b = ebb_builder_new("residual_mlp");
    ebb_input(b, "x");
    ebb_from(b, ebb_node_op(b, "linear", "out=256, name=stem"));
    ebb_tag(b, "h");
    for (int i = 0; i < 2; i++) /* two residual blocks */
        ebb_also(b, ebb_node_seq(b, ebb_node_op(b, "linear", "out=256"), ebb_node_op(b, "gelu", NULL),
                                 ebb_node_op(b, "layer_norm", NULL), NULL));
    ebb_split(b, ebb_node_op(b, "linear", "out=128, name=left"),
              ebb_node_seq(b, ebb_node_op(b, "linear", "out=128, name=right"),
                           ebb_node_op(b, "relu", NULL), NULL),
              NULL);
    ebb_merge(b, EBB_MERGE_CAT, 1);
    ebb_gate(b,
             ebb_node_seq(b, ebb_node_op(b, "linear", "out=4, name=router"),
                          ebb_node_op(b, "softmax", "dim=-1"), NULL),
             2, ebb_node_op(b, "linear", "out=256, name=expert0"),
             ebb_node_op(b, "linear", "out=256, name=expert1"),
             ebb_node_op(b, "linear", "out=256, name=expert2"),
             ebb_node_op(b, "linear", "out=256, name=expert3"), NULL);
    ebb_builder *refine = ebb_subflow_begin(b); /* state := tanh(cell(state)) + h */
    ebb_through(refine, ebb_node_op(refine, "linear", "out=256, name=cell"));
    ebb_through(refine, ebb_node_op(refine, "tanh", NULL));
    ebb_using(refine, "h", NULL);
    ebb_through(refine, ebb_node_op(refine, "add", NULL));
    ebb_loop_for(b, ebb_subflow_end(refine), 3);
    ebb_through(b, ebb_node_op(b, "linear", "out=10, name=head"));
    ebb_graph *g = ebb_build(b);
    ebb_builder_free(b);
    if (!g)
        return die("ebb_build");

    /* Compile for concrete input shapes, then read the plan. */
    ebb_shape xs = EBB_SHAPE(batch, width);
    ebb_compile_options opts = {.input_shapes = &xs, .n_input_shapes = 1};
    ebb_plan *plan = NULL;
    if (ebb_compile(&plan, g, &opts) != EBB_OK)
        return die("ebb_compile");
    ebb_plan_print(plan, stdout);

    /* Run on the default device (CUDA when available). */
    ebb_device dev = ebb_device_default();
    ebb_model *model = NULL;
    ebb_tensor *x = NULL, *y = NULL;
    ebb_run_stats st;
    if (ebb_model_new(&model, plan, dev, 42) != EBB_OK)
        return die("ebb_model_new");
    if (ebb_tensor_randn(&x, &xs, EBB_FLOAT32, dev, 7) != EBB_OK)
        return die("ebb_tensor_randn");
    if (ebb_run(plan, model, &x, &y, &st) != EBB_OK)
        return die("ebb_run");

    char dn[32], sb[64];
    ebb_shape ys = ebb_tensor_shape(y);
    printf("\nran on %s: output %s in %.3f ms, %lld steps executed\n",
           ebb_device_str(dev, dn, sizeof dn), ebb_shape_str(&ys, sb, sizeof sb),
           st.seconds * 1e3, (long long)st.steps_executed);
    printf("peak intermediate bytes: measured %lld, planned %lld (keep_all would hold %lld)\n",
           (long long)st.measured_peak_bytes, (long long)st.planned_peak_bytes,
           (long long)ebb_plan_keep_all_peak_bytes(plan));
    printf("(the gate routes rows to their top-2 experts, so the measured figure depends on "
           "the routing; the plan assumes every expert sees every row)\n");

    ebb_tensor_free(x);
    ebb_tensor_free(y);
    ebb_model_free(model);
    ebb_plan_free(plan);
    ebb_graph_free(g);
    printf("live tensor handles at exit: %lld\n", (long long)ebb_tensor_live_count());
    return 0;
}
