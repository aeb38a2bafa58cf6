/* Listeners (docs/protocol.md §3, Listen and Accept): vconn_listen and
 * vconn_accept, their bridged forms (_socket), shutdown and close. The
 * Accepts that fill a listener's queues come through client.c. */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

vconn_listener *vc_find_listener(vconn_client *c, uint32_t h)
{
	for (vconn_listener *l = c->lns; l; l = l->next)
		if (l->h == h)
			return l;
	return NULL;
}

void vc_l_ready(vconn_listener *l) { vc_efd_set(l->efd, &l->efd_set, l->qhead || l->shead || l->err || l->closed); }

static void free_sockq(struct sockq *q)
{
	while (q) {
		struct sockq *n = q->next;
		close(q->fd);
		free(q);
		q = n;
	}
}

void vc_listener_destroy(vconn_listener *l)
{
	free_sockq(l->shead);
	close(l->efd);
	free(l);
}

static int listen_as(vconn_client *c, const char *addr, vconn_listener **out, int bridged)
{
	char host[256];
	unsigned port;
	*out = NULL;
	if (vc_split_addr(addr, host, sizeof host, &port) != 0) {
		vc_seterr("listen %s: want :port with a port of 1..65535", addr);
		return -EINVAL;
	}
	vconn_listener *l = calloc(1, sizeof *l);
	if (!l)
		return -ENOMEM;
	l->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (l->efd < 0) {
		free(l);
		return -EMFILE;
	}
	l->c = c;
	l->timeout = -1;
	l->bridged = bridged;
	struct vconn_frame f = {.op = VC_OP_LISTEN, .arg = port, .flags = bridged ? VC_FLAG_BRIDGE : 0};
	struct vc_reply r = {0};
	int err = vc_call(c, &f, c->timeout_ms, &r);
	if (err) {
		close(l->efd);
		free(l);
		return err;
	}
	l->h = r.f.handle;
	if (r.f.len)
		snprintf(l->addr, sizeof l->addr, "%.*s", (int)r.f.len, (const char *)r.payload);
	else
		snprintf(l->addr, sizeof l->addr, "%s:%u", c->info.node, port);
	vc_reply_free(&r);
	pthread_mutex_lock(&c->mu);
	l->next = c->lns;
	c->lns = l;
	pthread_mutex_unlock(&c->mu);
	/* A host, if given, must be the one the listener got. */
	char bound[256];
	unsigned bp;
	if (host[0] && strcmp(host, "0.0.0.0") && strcmp(host, "::") &&
	    (vc_split_addr(l->addr, bound, sizeof bound, &bp) != 0 || strcmp(bound, host))) {
		char keep[300];
		snprintf(keep, sizeof keep, "listen %s: this allocation listens at %s", addr, l->addr);
		vconn_listener_close(l);
		vc_seterr("%s", keep);
		return -EADDRNOTAVAIL;
	}
	*out = l;
	return 0;
}

int vconn_listen(vconn_client *c, const char *addr, vconn_listener **out) { return listen_as(c, addr, out, 0); }
int vconn_listen_socket(vconn_client *c, const char *addr, vconn_listener **out) { return listen_as(c, addr, out, 1); }

/* accept_next waits, until l's timeout, for l's next Accept and takes it
 * from its queue: a bridged listener's socket into *fd, another's vconn
 * into *v. 0, or why none came. */
static int accept_next(vconn_listener *l, int *fd, vconn **v)
{
	vconn_client *c = l->c;
	struct timespec ts;
	const struct timespec *dl = vc_deadline(l->timeout, &ts) ? &ts : NULL;
	pthread_mutex_lock(&c->mu);
	if (l->closed) {
		pthread_mutex_unlock(&c->mu);
		return -EBADF;
	}
	l->users++;
	int err;
	for (;;) {
		if (l->bridged && l->shead) {
			struct sockq *q = l->shead;
			l->shead = q->next;
			if (!l->shead)
				l->stail = NULL;
			*fd = q->fd;
			free(q);
			vc_l_ready(l);
			err = 0;
			break;
		}
		if (!l->bridged && l->qhead) {
			*v = l->qhead;
			l->qhead = (*v)->qnext;
			if (!l->qhead)
				l->qtail = NULL;
			(*v)->qnext = NULL;
			vc_l_ready(l);
			err = 0;
			break;
		}
		err = l->closed ? -EBADF : l->err;
		if (!err && l->nonblock)
			err = -EAGAIN;
		if (!err)
			err = vc_cv_wait(c, dl);
		if (err) {
			if (!l->bridged && err == l->err)
				vc_seterr("accept: %s", c->errmsg);
			break;
		}
	}
	if (--l->users == 0) /* close waits for the calls inside */
		vc_notify(c);
	pthread_mutex_unlock(&c->mu);
	return err;
}

int vconn_accept_socket(vconn_listener *l, int *fd)
{
	*fd = -1;
	if (!l->bridged) {
		vc_seterr("accept: the listener was not made with vconn_listen_socket");
		return -EINVAL;
	}
	return accept_next(l, fd, NULL);
}

int vconn_listener_fd(vconn_listener *l)
{
	pthread_mutex_lock(&l->c->mu);
	vc_set_async(l->c);
	pthread_mutex_unlock(&l->c->mu);
	return l->efd;
}
const char *vconn_listener_addr(vconn_listener *l) { return l->addr; }
int vconn_listener_set_nonblock(vconn_listener *l, int on)
{
	l->nonblock = on;
	if (on) {
		pthread_mutex_lock(&l->c->mu);
		vc_set_async(l->c);
		pthread_mutex_unlock(&l->c->mu);
	}
	return 0;
}
int vconn_listener_set_timeout(vconn_listener *l, int ms)
{
	l->timeout = ms;
	return 0;
}

int vconn_accept(vconn_listener *l, vconn **out)
{
	*out = NULL;
	if (l->bridged) {
		vc_seterr("accept: a listener made with vconn_listen_socket accepts with vconn_accept_socket");
		return -EINVAL;
	}
	vconn *v;
	int err = accept_next(l, NULL, &v);
	if (err)
		return err;
	return vc_hand_over(v, out);
}

int vconn_listener_shutdown(vconn_listener *l)
{
	vconn_client *c = l->c;
	pthread_mutex_lock(&c->mu);
	if (l->closed) {
		pthread_mutex_unlock(&c->mu);
		return 0;
	}
	l->closed = 1;
	vconn *q = l->qhead;
	l->qhead = l->qtail = NULL;
	struct sockq *sq = l->shead;
	l->shead = l->stail = NULL;
	vc_l_ready(l);
	vc_notify(c);
	while (l->users > 0) /* accepts inside return -EBADF */
		pthread_cond_wait(&c->cv, &c->mu);
	pthread_mutex_unlock(&c->mu);
	free_sockq(sq);
	while (q) {
		vconn *n = q->qnext;
		vc_drop_vconn(q);
		q = n;
	}
	struct vconn_frame f = {.op = VC_OP_CLOSE, .handle = l->h};
	int err = vc_call(c, &f, c->timeout_ms, NULL);
	return err == -ENOTCONN || err == -EBADF ? 0 : err;
}

int vconn_listener_close(vconn_listener *l)
{
	vconn_client *c = l->c;
	int err = vconn_listener_shutdown(l);
	pthread_mutex_lock(&c->mu);
	for (vconn_listener **pp = &c->lns; *pp; pp = &(*pp)->next)
		if (*pp == l) {
			*pp = l->next;
			break;
		}
	pthread_mutex_unlock(&c->mu);
	close(l->efd);
	free(l);
	return err;
}

