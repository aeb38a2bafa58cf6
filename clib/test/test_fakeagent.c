/* libvconn against a fake agent (clib_test.go's) that answers with
 * malformed or hostile frames: the library must return a clear error,
 * never crash. Prints what it got; the Go side compares. */
#include <string.h>

#include "check.h"

int main(void)
{
	struct vconn_options o = {.socket = env("VCONN_SOCK"), .timeout_ms = 5000,
				  .shared_memory = getenv("VCONN_SHM") && atoi(getenv("VCONN_SHM"))};
	vconn_client *c = NULL;
	int err = vconn_client_open(&c, &o);
	printf("open=%d (%s: %s)\n", err, vconn_strerror(err), vconn_errmsg());
	if (err)
		return 0;
	vconn *v = NULL;
	err = vconn_dial(c, "node-b:80", &v);
	printf("dial=%d (%s: %s)\n", err, vconn_strerror(err), vconn_errmsg());
	if (!err) {
		char buf[16];
		ssize_t n = vconn_recv(v, buf, sizeof buf, NULL, NULL);
		printf("recv=%zd (%s: %s)\n", n, vconn_strerror((int)n), vconn_errmsg());
		vconn_close(v);
	}
	vconn_client_close(c);
	return 0;
}
