/* Learning curves of `ebb train --curve FILE.svg` (src/cli/curve.c): the
 * running training loss per logged window of steps and, per epoch, the
 * test loss and test accuracy, drawn as one SVG written by hand in the
 * style of `ebb chart` (graph/chart.c).
 *
 *     ebb_cli_curve *c = NULL;
 *     ebb_cli_curve_new(&c, &(ebb_cli_curve_info){.name = "fashion_mlp", ...});
 *     ebb_cli_curve_step(c, step, samples_seen, mean_loss);      // per window
 *     ebb_cli_curve_epoch(c, epoch, samples_seen, loss, test_loss, test_accuracy);
 *     ebb_cli_curve_save(c, "curve.svg");                        // atomic, any time
 *     ebb_cli_curve_free(c);
 *
 * The x axis spans the whole run from its start, so a picture saved
 * mid-run shows how far it got. */
#ifndef EBB_CLI_CURVE_H
#define EBB_CLI_CURVE_H

#include <stdint.h>
#include <stdio.h>

#include "ebb/common.h"

typedef struct ebb_cli_curve ebb_cli_curve;

typedef struct ebb_cli_curve_info {
    const char *name;          /* the spec's name, for the title */
    const char *context;       /* a line under the title: spec file, data, optimizer */
    int64_t samples_per_epoch; /* samples one epoch trains on (> 0) */
    int64_t first_samples;     /* samples seen when this run started (a resumed run's) */
    int64_t last_samples;      /* samples seen when it will end */
    int64_t window;            /* training steps each training-loss point averages */
    int eval;                  /* test loss per epoch is drawn */
    int accuracy;              /* test accuracy per epoch is drawn, on a right axis 0..1 */
} ebb_cli_curve_info;

/* A new, empty curve (the strings are copied). EBB_ERR_ARG for a
 * samples_per_epoch or window below 1, EBB_ERR_NOMEM. */
ebb_status ebb_cli_curve_new(ebb_cli_curve **out, const ebb_cli_curve_info *info);
/* One training-loss point: the mean loss of the window of steps ending at
 * `step`, after `samples` samples seen. */
ebb_status ebb_cli_curve_step(ebb_cli_curve *c, int64_t step, int64_t samples, double loss);
/* One epoch's point: its mean training loss, and the test loss and
 * accuracy (NAN where not measured). */
ebb_status ebb_cli_curve_epoch(ebb_cli_curve *c, int64_t epoch, int64_t samples, double loss,
                               double test_loss, double test_accuracy);
/* The SVG into f. EBB_ERR_IO when f reports an error. */
ebb_status ebb_cli_curve_write(const ebb_cli_curve *c, FILE *f);
/* The SVG to `path`, atomically (a temporary file renamed into place): an
 * interrupted write leaves the previous picture. `who` names the option in
 * errors ("--curve"). */
ebb_status ebb_cli_curve_save(const ebb_cli_curve *c, const char *path, const char *who);
/* NULL is allowed. */
void ebb_cli_curve_free(ebb_cli_curve *c);

#endif /* EBB_CLI_CURVE_H */
