/* Thread-local last error, in the style of sqlite3_errmsg()/git_error_last(). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ebb/common.h"

#define EBB_ERRMSG_MAX 2048

static _Thread_local char errmsg[EBB_ERRMSG_MAX];
static _Thread_local ebb_status errcode;

const char *ebb_errmsg(void) { return errmsg; }

ebb_status ebb_errcode(void) { return errcode; }

void ebb_error_clear(void) {
    errmsg[0] = '\0';
    errcode = EBB_OK;
}

ebb_status ebb_error_set(ebb_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    va_end(ap);
    errcode = status;
    return status;
}

ebb_status ebb_error_prefix(const char *fmt, ...) {
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    if (n < 0)
        return errcode;
    size_t plen = strlen(prefix);
    size_t mlen = strlen(errmsg);
    if (plen + 2 + mlen >= sizeof errmsg)
        mlen = sizeof errmsg - plen - 3;
    memmove(errmsg + plen + 2, errmsg, mlen);
    memcpy(errmsg, prefix, plen);
    errmsg[plen] = ':';
    errmsg[plen + 1] = ' ';
    errmsg[plen + 2 + mlen] = '\0';
    return errcode;
}

const char *ebb_status_name(ebb_status status) {
    switch (status) {
    case EBB_OK: return "EBB_OK";
    case EBB_ERR_ARG: return "EBB_ERR_ARG";
    case EBB_ERR_SHAPE: return "EBB_ERR_SHAPE";
    case EBB_ERR_NOMEM: return "EBB_ERR_NOMEM";
    case EBB_ERR_TORCH: return "EBB_ERR_TORCH";
    case EBB_ERR_BUILD: return "EBB_ERR_BUILD";
    case EBB_ERR_SPEC: return "EBB_ERR_SPEC";
    case EBB_ERR_IO: return "EBB_ERR_IO";
    case EBB_ERR_RUNTIME: return "EBB_ERR_RUNTIME";
    case EBB_ERR_UNSUPPORTED: return "EBB_ERR_UNSUPPORTED";
    case EBB_ERR_BUDGET: return "EBB_ERR_BUDGET";
    case EBB_ERR_DIST: return "EBB_ERR_DIST";
    case EBB_ERR_CORRUPT: return "EBB_ERR_CORRUPT";
    }
    return "EBB_ERR_UNKNOWN";
}
