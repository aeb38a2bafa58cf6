/* The rules of docs/protocol.md that issue 35 clarified, as libvconn meets
 * them against real agents: bad arguments get the code of their fault and
 * leave the vconn and the client as they were (§8: an Export past
 * maxMessageBytes is -EMSGSIZE, of size 0 -EINVAL); on ud, a bridged Dial
 * or Listen is refused (-EINVAL) before any listener hears of it (R8.20),
 * and a vconn refuses to be a stream (-EPROTOTYPE). (Item 1, an Error with
 * req 0 and handle 0 ending the session: test_badinput.c against the
 * agent, clib_test.go's fake agent for the library.) */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static void echo_once(vconn *from, vconn *to, const char *what)
{
	char buf[64];
	size_t n = strlen(what);
	OK(vconn_send(from, what, n));
	CHECK(vconn_recv(to, buf, sizeof buf, NULL, NULL) == (ssize_t)n && memcmp(buf, what, n) == 0, "%s", what);
}

static void bad_arguments(void)
{
	struct nodes nd;
	open_nodes(&nd, NULL, NULL, 0);
	vconn_client *a = nd.a, *b = nd.b;
	const char *addr = nd.addr, *laddr = nd.laddr;
	vconn_listener *l;
	OK(vconn_listen(b, laddr, &l));
	vconn *va, *vb;
	OK(vconn_dial(a, addr, &va));
	OK(vconn_accept(l, &vb));
	uint32_t region;
	int rc = vconn_export(va, 0, VCONN_ACCESS_READ, &region);
	CHECK(rc == -EINVAL, "export of 0 bytes: %d (%s), want -EINVAL", rc, vconn_strerror(rc));
	printf("export of 0 bytes: %s: %s\n", vconn_strerror(rc), vconn_errmsg());
	echo_once(va, vb, "after size 0");
	rc = vconn_export(va, (1 << 20) + 1, VCONN_ACCESS_READ, &region);
	CHECK(rc == -EMSGSIZE, "export past maxMessageBytes: %d (%s), want -EMSGSIZE", rc, vconn_strerror(rc));
	printf("export past maxMessageBytes: %s: %s\n", vconn_strerror(rc), vconn_errmsg());
	echo_once(va, vb, "after too large");
	rc = vconn_export(va, 64, 0x103, &region);
	CHECK(rc == -EINVAL, "export with access 0x103: %d, want -EINVAL", rc);
	echo_once(va, vb, "after access");
	OK(vconn_export(va, 1 << 20, VCONN_ACCESS_READ | VCONN_ACCESS_WRITE, &region));
	static char big[3 << 16];
	OK(vconn_region_read(va, region, 0, big, sizeof big)); /* in pieces of 64 KiB */
	echo_once(vb, va, "the other way");
	OK(vconn_close(va));
	OK(vconn_close(vb));
	OK(vconn_listener_close(l));
	vconn_client_close(a);
	vconn_client_close(b);
}

static void bridge_on_ud(void)
{
	struct nodes nd;
	open_nodes(&nd, env("VCONN_UD_SOCK_A"), env("VCONN_UD_SOCK_B"), 0);
	vconn_client *a = nd.a, *b = nd.b;
	const char *addr = nd.addr, *laddr = nd.laddr;
	char laddr2[32];
	snprintf(laddr2, sizeof laddr2, ":%d", atoi(nd.port) + 1);
	vconn_listener *l, *bl = NULL;
	OK(vconn_listen(b, laddr, &l));
	OK(vconn_listener_set_timeout(l, 1000));
	int fd = -1;
	int rc = vconn_dial_socket(a, addr, &fd);
	CHECK(rc == -EINVAL && fd < 0, "a bridged dial on ud: %d (%s), want -EINVAL", rc, vconn_strerror(rc));
	printf("bridged dial on ud: %s: %s\n", vconn_strerror(rc), vconn_errmsg());
	rc = vconn_bridge_dial(&nd.oa, addr, 0);
	CHECK(rc == -EINVAL, "vconn_bridge_dial on ud: %d (%s), want -EINVAL", rc, vconn_strerror(rc));
	vconn *v;
	rc = vconn_accept(l, &v);
	CHECK(rc == -ETIMEDOUT, "the listener accepted from a refused bridged dial: %d (%s)", rc, vconn_strerror(rc));
	rc = vconn_listen_socket(b, laddr2, &bl);
	CHECK(rc == -EINVAL, "a bridged listen on ud: %d (%s), want -EINVAL", rc, vconn_strerror(rc));
	printf("bridged listen on ud: %s: %s\n", vconn_strerror(rc), vconn_errmsg());
	/* The client goes on: a plain vconn, messages only. */
	vconn *va, *vb;
	OK(vconn_dial(a, addr, &va));
	OK(vconn_listener_set_timeout(l, 10000));
	OK(vconn_accept(l, &vb));
	CHECK(!vconn_is_stream(va) && vconn_transport(va) == VCONN_TRANSPORT_UD, "a ud vconn");
	CHECK(vconn_write(va, "x", 1) == -EPROTOTYPE, "a stream on ud");
	OK(vconn_close(va));
	OK(vconn_close(vb));
	OK(vconn_listener_close(l));
	vconn_client_close(a);
	vconn_client_close(b);
}

int main(void)
{
	bad_arguments();
	bridge_on_ud();
	printf("ok\n");
	return 0;
}
