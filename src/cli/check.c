/* `ebb check SPEC...`: load and compile each spec, say ok or why not. */
#define _GNU_SOURCE /* getopt_long, memfd_create */
#include "cli.h"

const char ebb_cli_usage_check[] = "usage: ebb check [--] SPEC...\n"
                                 "\n"
                                 "Loads and compiles each spec (symbolic dimensions set to 1).\n"
                                 "Prints 'SPEC: ok (N steps, P parameters)' or\n"
                                 "'SPEC:LINE:COL: error: ...' on stderr. Exit 1 on any error.\n"
                                 "A SPEC of - is read from standard input.\n"
                                 "\n" USAGE_COMMON;

const struct option ebb_cli_check_options[] = {COMMON_OPTIONS, {NULL, 0, NULL, 0}};

int ebb_cli_check(int argc, char **argv) {
    options o;
    int rc = parse_options(argc, argv, ebb_cli_find_command("check"), &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    int failed = 0;
    for (int i = 0; i < o.n_specs; i++) {
        const char *path = o.specs[i];
        ebb_spec *s = NULL;
        ebb_plan *p = NULL;
        ebb_status st = load_spec_path(path, &o, &s);
        if (st == EBB_OK)
            st = ebb_spec_compile(&p, s, NULL);
        if (st != EBB_OK) {
            fprintf(stderr, "%s\n", ebb_errmsg());
            failed = 1;
        } else {
            printf("%s: ok (%d steps, %lld parameters)\n", ebb_spec_file(s),
                   ebb_plan_step_count(p), (long long)param_elements(p));
        }
        ebb_plan_free(p);
        ebb_spec_free(s);
    }
    return failed ? EXIT_SPEC : 0;
}
