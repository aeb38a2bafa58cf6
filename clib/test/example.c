/* Built by clib_test.go against the installed library (pkg-config vconn),
 * shared and static: proves the header, the libraries and vconn.pc. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <vconn.h>

int main(void)
{
	struct vconn_options o = {.socket = "/nonexistent/vconn.sock"};
	vconn_client *c;
	int err = vconn_client_open(&c, &o);
	printf("open: %s\n", vconn_strerror(err));
	return err == -ENOTCONN && strcmp(vconn_strerror(-ECONNREFUSED), "connection refused: nothing listens there") == 0 ? 0 : 1;
}
