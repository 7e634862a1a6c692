/* Loopback ports for the tests that start ranks (test_cli, test_dist,
 * test_trainer). */
#ifndef EBB_TEST_NET_H
#define EBB_TEST_NET_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "test_util.h"

/* A port nobody listens on now: the kernel's choice for a socket bound to 0. */
static inline int ebb_test_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        fail_msg("no free port: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

#endif
