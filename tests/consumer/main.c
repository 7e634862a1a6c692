/* A program outside ebb's tree, built against an installed ebb (CMake's
 * find_package or pkg-config) by tests/consumer/run.sh. It builds, plans and
 * runs a small graph and checks what a user would: the output's shape, the
 * measured peak against the plan, and no tensor handle left alive. */
#include <stdio.h>

#include <ebb/ebb.h>

static int fail(const char *what) {
    fprintf(stderr, "consumer: %s: %s\n", what, ebb_errmsg());
    return 1;
}

int main(void) {
    ebb_builder *b = ebb_builder_new("consumer");
    ebb_input(b, "x");
    ebb_from(b, ebb_node_op(b, "linear", "out=16, name=fc1"));
    ebb_through(b, ebb_node_op(b, "relu", NULL));
    ebb_through(b, ebb_node_op(b, "linear", "out=4, name=head"));
    ebb_graph *g = ebb_build(b);
    ebb_builder_free(b);
    if (!g)
        return fail("ebb_build");

    ebb_shape xs = EBB_SHAPE(8, 32);
    ebb_compile_options o = {.input_shapes = &xs, .n_input_shapes = 1};
    ebb_plan *plan = NULL;
    if (ebb_compile(&plan, g, &o) != EBB_OK)
        return fail("ebb_compile");
    ebb_graph_free(g);

    ebb_model *m = NULL;
    ebb_tensor *x = NULL, *y = NULL;
    ebb_run_stats st;
    if (ebb_model_new(&m, plan, ebb_device_cpu(), 42) != EBB_OK)
        return fail("ebb_model_new");
    if (ebb_tensor_randn(&x, &xs, EBB_FLOAT32, ebb_device_cpu(), 1) != EBB_OK)
        return fail("ebb_tensor_randn");
    if (ebb_run(plan, m, &x, &y, &st) != EBB_OK)
        return fail("ebb_run");
    ebb_shape ys = ebb_tensor_shape(y);
    char buf[64];
    printf("ebb %s: y %s, measured %lld, planned %lld\n", ebb_version(),
           ebb_shape_str(&ys, buf, sizeof buf), (long long)st.measured_peak_bytes,
           (long long)st.planned_peak_bytes);
    int ok = ys.ndim == 2 && ys.dim[0] == 8 && ys.dim[1] == 4 &&
             st.measured_peak_bytes == st.planned_peak_bytes;
    ebb_tensor_free(x);
    ebb_tensor_free(y);
    ebb_model_free(m);
    ebb_plan_free(plan);
    if (ebb_tensor_live_count() != 0) {
        fprintf(stderr, "consumer: %lld tensor handles left\n", (long long)ebb_tensor_live_count());
        return 1;
    }
    return ok ? 0 : 1;
}
