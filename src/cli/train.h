/* `ebb train` and `ebb eval` (src/cli/train.c): their help, their option
 * tables (main.c lists them for `ebb help` and --completion-helper) and the
 * commands, each parsing its own arguments (argv[0] is the command's name). */
#ifndef EBB_CLI_TRAIN_H
#define EBB_CLI_TRAIN_H

#include <getopt.h>

extern const char ebb_cli_usage_train[];
extern const char ebb_cli_usage_eval[];
extern const struct option ebb_cli_train_options[];
extern const struct option ebb_cli_eval_options[];
/* getopt's short options of both commands */
#define EBB_CLI_TRAIN_SHORTS "hp:"

int ebb_cli_train(int argc, char **argv);
int ebb_cli_eval(int argc, char **argv);

#endif /* EBB_CLI_TRAIN_H */
