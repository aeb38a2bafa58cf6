/* Connecting to the allocation's socket, for a client's session
 * (client.c) and for each bridged call (bridge.c). */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* vc_agent_connect connects to the allocation's socket (o's, else
 * $RDMAVISOR_SOCKET): the descriptor, or -errno with vconn_errmsg set. */
int vc_agent_connect(const struct vconn_options *o)
{
	const char *path = o && o->socket ? o->socket : getenv("RDMAVISOR_SOCKET");
	if (!path || !*path) {
		vc_seterr("RDMAVISOR_SOCKET is not set: is the pod allocated an RDMAvisor vconn resource?");
		return -ENOENT;
	}
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof sa.sun_path) {
		vc_seterr("socket path %s is too long", path);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		int e = errno;
		vc_seterr("socket: %s", strerror(e));
		return -e;
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		int e = errno;
		if (e == EACCES || e == EPERM)
			vc_seterr("cannot connect to the agent: permission denied on %s: a pod that does not run as root "
				  "needs the RDMAService's spec.socketGroup among its securityContext.supplementalGroups", path);
		else if (e == ENOENT)
			vc_seterr("cannot connect to the agent: no agent socket at %s: does the pod request an RDMAvisor "
				  "vconn resource (rdmavisor.io/vconn or a ResourceClaim)?", path);
		else
			vc_seterr("cannot connect to the agent at %s: %s", path, strerror(e));
		close(fd);
		return -ENOTCONN;
	}
	return fd;
}
