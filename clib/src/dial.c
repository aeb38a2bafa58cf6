/* Dialling (docs/protocol.md §3, Dial): vconn_dial and vconn_dial_socket,
 * by node name or, where the agent knows no such node, by the name's
 * addresses; and "host:port", which listeners parse too. */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* dial_once dials addr as given: a vconn into *out, or, with sock, a
 * bridged vconn's socket into *sock. */
static int dial_once(vconn_client *c, const char *addr, vconn **out, int *sock)
{
	size_t n = strlen(addr);
	if (n > VCONN_MAX_PAYLOAD)
		return -EINVAL;
	struct vconn_frame f = {.op = VC_OP_DIAL, .payload = (const uint8_t *)addr, .len = (uint32_t)n};
	if (sock)
		f.flags = VC_FLAG_BRIDGE;
	struct vc_reply r = {0};
	int err = vc_call(c, &f, c->timeout_ms, &r);
	if (err)
		return err;
	if (sock) {
		if (r.nfds != 1) {
			vc_seterr("dial %s: the agent's bridged reply carried %d descriptors, want 1", addr, r.nfds);
			vc_reply_free(&r);
			return -EPROTO;
		}
		*sock = r.fds[0];
		r.nfds = 0;
		vc_reply_free(&r);
		return 0;
	}
	pthread_mutex_lock(&c->mu);
	vconn *v = c->err ? NULL : vc_new_vconn(c, r.f.handle, r.f.arg2, (const uint8_t *)addr, (uint32_t)n);
	err = v ? 0 : c->err ? c->err : -ENOMEM;
	pthread_mutex_unlock(&c->mu);
	vc_reply_free(&r);
	if (err)
		return err;
	return vc_hand_over(v, out);
}

/* vc_split_addr parses "host:port" (IPv6 in brackets) into host and port. */
int vc_split_addr(const char *addr, char *host, size_t hcap, unsigned *port)
{
	const char *colon = strrchr(addr, ':');
	if (!colon)
		return -EINVAL;
	const char *h = addr, *he = colon;
	if (*h == '[') {
		if (he == h || he[-1] != ']')
			return -EINVAL;
		h++;
		he--;
	}
	if ((size_t)(he - h) >= hcap)
		return -EINVAL;
	memcpy(host, h, (size_t)(he - h));
	host[he - h] = 0;
	char *end;
	unsigned long p = strtoul(colon + 1, &end, 10);
	if (!colon[1] || *end || p == 0 || p > 65535)
		return -EINVAL;
	*port = (unsigned)p;
	return 0;
}

static int dial(vconn_client *c, const char *addr, vconn **out, int *sock)
{
	char host[256];
	unsigned port;
	if (vc_split_addr(addr, host, sizeof host, &port) != 0 || !host[0]) {
		vc_seterr("dial %s: want host:port with a port of 1..65535", addr);
		return -EINVAL;
	}
	int err = dial_once(c, addr, out, sock);
	if (err != -ENXIO)
		return err;
	/* A name the agent does not know: resolve it and dial its IPs. */
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
	if (getaddrinfo(host, NULL, &hints, &res) != 0) {
		vc_seterr("dial %s: no node of that name, and it does not resolve", addr);
		return -ENXIO;
	}
	for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
		char ip[INET6_ADDRSTRLEN + 2], a[300];
		if (getnameinfo(ai->ai_addr, ai->ai_addrlen, ip, sizeof ip, NULL, 0, NI_NUMERICHOST) != 0)
			continue;
		snprintf(a, sizeof a, ai->ai_family == AF_INET6 ? "[%s]:%u" : "%s:%u", ip, port);
		if ((err = dial_once(c, a, out, sock)) == 0)
			break;
	}
	freeaddrinfo(res);
	return err;
}

int vconn_dial(vconn_client *c, const char *addr, vconn **out)
{
	*out = NULL;
	return dial(c, addr, out, NULL);
}

int vconn_dial_socket(vconn_client *c, const char *addr, int *fd)
{
	*fd = -1;
	return dial(c, addr, NULL, fd);
}
