/* The calling thread's last error message (vconn_errmsg): every failing
 * call of the library says why here. */
#define _GNU_SOURCE
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char errbuf[VC_ERRMSG_LEN];

void vc_seterr(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(errbuf, sizeof errbuf, fmt, ap);
	va_end(ap);
}

const char *vconn_errmsg(void) { return errbuf; }
