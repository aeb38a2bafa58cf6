/* The client (vconn_client_open, _close): a session on the allocation's
 * socket (session.c) and what it holds, vconns and listeners. The
 * session hands up here (struct vc_session_hooks) the frames that answer
 * no request, which this file routes to their vconn or listener, and its
 * failure, which fails them all. */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_TIMEOUT_MS 30000

/* on_bridged_accept queues a bridged listener's vconn, as a socket. */
static void on_bridged_accept(vconn_client *c, const struct vconn_frame *f, int *fds, int nfds)
{
	vconn_listener *l = vc_find_listener(c, f->handle);
	struct sockq *q = l && l->bridged && !l->closed ? malloc(sizeof *q) : NULL;
	for (int i = q ? 1 : 0; i < nfds; i++)
		close(fds[i]);
	if (!q)
		return; /* closing the socket ends the bridged vconn */
	q->fd = fds[0];
	q->next = NULL;
	if (l->stail)
		l->stail->next = q;
	else
		l->shead = q;
	l->stail = q;
	vc_l_ready(l);
}

/* on_data queues a message for its vconn's reads. */
static void on_data(vconn_client *c, const struct vconn_frame *f)
{
	vconn *v;
	if (!(v = vc_find_vconn(c, f->handle)))
		return;
	struct msg *m = malloc(sizeof *m + f->len);
	if (!m) {
		vc_fail(c, -ENOMEM, "out of memory for a message");
		return;
	}
	m->next = NULL;
	m->len = f->len;
	m->imm = f->arg;
	m->has_imm = f->flags & VC_FLAG_IMM;
	if (f->len)
		memcpy(m->data, f->payload, f->len);
	if (v->qtail)
		v->qtail->next = m;
	else
		v->qhead = m;
	v->qtail = m;
	vc_v_ready(v);
}

static void on_eof(vconn_client *c, const struct vconn_frame *f)
{
	vconn *v;
	if ((v = vc_find_vconn(c, f->handle))) {
		v->eof = 1;
		vc_v_ready(v);
	}
}

/* on_error fails a vconn, or, on handle 0, the session. */
static void on_error(vconn_client *c, const struct vconn_frame *f)
{
	vconn *v;
	if (f->handle == 0) {
		/* req 0, handle 0: the agent's last frame (docs/protocol.md
		 * §3, §8); the session ends here, with the agent's reason,
		 * whether or not its close has come yet. */
		char why[200];
		snprintf(why, sizeof why, "the agent ended the session: %.*s", (int)(f->len < 160 ? f->len : 160),
			 (const char *)f->payload);
		vc_fail(c, vconn_code_errno(f->arg), why);
		return;
	}
	if ((v = vc_find_vconn(c, f->handle)) && !v->err) {
		v->err = vconn_code_errno(f->arg);
		snprintf(v->errmsg, sizeof v->errmsg, "%.*s", (int)f->len, (const char *)f->payload);
		vc_v_ready(v);
	}
}

/* on_accept queues a listener's new vconn for vconn_accept. */
static void on_accept(vconn_client *c, const struct vconn_frame *f)
{
	vconn *v;
	vconn_listener *l = vc_find_listener(c, f->handle);
	if (l && l->bridged) {
		vc_fail(c, -EPROTO, "the agent accepted on a bridged listener without a socket");
		return;
	}
	if (!l || l->closed || !(v = vc_new_vconn(c, f->arg, f->arg2, f->payload, f->len))) {
		/* Nobody takes it: give its quota slot back. */
		vc_close_later(c, f->arg);
		return;
	}
	if (l->qtail)
		l->qtail->qnext = v;
	else
		l->qhead = v;
	l->qtail = v;
	vc_l_ready(l);
}

/* on_frame takes a frame that answers no request (mu held); fds are its
 * descriptors, which it takes. */
static void on_frame(vconn_client *c, const struct vconn_frame *f, int *fds, int nfds)
{
	if (f->op == VC_OP_ACCEPT && nfds > 0) {
		on_bridged_accept(c, f, fds, nfds);
		return;
	}
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	switch (f->op) {
	case VC_OP_DATA:
		on_data(c, f);
		return;
	case VC_OP_EOF:
		on_eof(c, f);
		return;
	case VC_OP_ERROR:
		on_error(c, f);
		return;
	case VC_OP_ACCEPT:
		on_accept(c, f);
		return;
	case VC_OP_OK:
		return; /* a reply to a request sent with req 0: none are */
	}
	char why[64];
	snprintf(why, sizeof why, "the agent sent a %s frame", vconn_op_name(f->op));
	vc_fail(c, -EPROTO, why);
}

/* on_broken fails every vconn and listener of a broken session (mu held). */
static void on_broken(vconn_client *c, int err, const char *msg)
{
	for (vconn *v = c->vconns; v; v = v->next) {
		if (!v->err) {
			v->err = err;
			snprintf(v->errmsg, sizeof v->errmsg, "%s", msg);
		}
		vc_v_ready(v);
	}
	for (vconn_listener *l = c->lns; l; l = l->next) {
		if (!l->err)
			l->err = err;
		vc_l_ready(l);
	}
}

/* on_settled frees the send window's slot of v's answered send, and keeps
 * its error for the vconn's next send. */
static void on_settled(vconn *v, int err, const struct vconn_frame *f)
{
	v->outstanding--;
	if (err && !v->send_err) {
		v->send_err = err;
		snprintf(v->errmsg, sizeof v->errmsg, "%.*s", (int)f->len, (const char *)f->payload);
	}
}

static const struct vc_session_hooks hooks = {.frame = on_frame, .broken = on_broken, .settled = on_settled};

void vconn_client_close(vconn_client *c)
{
	if (!c)
		return;
	vc_session_end(c);
	for (vconn *v = c->vconns, *n; v; v = n) {
		n = v->next;
		vc_destroy_vconn(v);
	}
	for (vconn_listener *l = c->lns, *n; l; l = n) {
		n = l->next;
		vc_listener_destroy(l);
	}
	vc_session_free(c);
}

/* hello opens the session (docs/protocol.md §3): the agent's version,
 * its limits and what it offers. */
static int hello(vconn_client *c)
{
	struct vconn_frame f = {.op = VC_OP_HELLO, .arg = VC_VERSION};
	struct vc_reply r = {0};
	int err = vc_call(c, &f, c->timeout_ms, &r);
	if (!err && r.f.arg != VC_VERSION) {
		vc_seterr("hello: the agent speaks version %u, this library %d", r.f.arg, VC_VERSION);
		err = -EPROTONOSUPPORT;
	}
	if (!err && vconn_hello_decode(r.payload, r.f.len, &c->info) != 0) {
		vc_seterr("hello: the agent's hello info is %u bytes, want 12..265", r.f.len);
		err = -EPROTO;
	}
	if (!err)
		c->features = r.f.arg2;
	vc_reply_free(&r);
	return err;
}

int vconn_client_open(vconn_client **out, const struct vconn_options *o)
{
	struct vconn_options def = {0};
	if (!o)
		o = &def;
	*out = NULL;
	int fd = vc_agent_connect(o);
	if (fd < 0)
		return fd;
	vconn_client *c = calloc(1, sizeof *c);
	if (!c) {
		close(fd);
		return -ENOMEM;
	}
	c->want_shm = o->shared_memory;
	c->timeout_ms = o->timeout_ms == 0 ? DEFAULT_TIMEOUT_MS : o->timeout_ms;
	int err = vc_session_init(c, fd, &hooks);
	if (err) {
		vconn_client_close(c);
		return err;
	}
	if ((err = hello(c)) != 0) {
		char keep[VC_ERRMSG_LEN];
		snprintf(keep, sizeof keep, "%s", vconn_errmsg());
		vconn_client_close(c);
		vc_seterr("%s", keep);
		return err;
	}
	*out = c;
	return 0;
}

int vconn_client_quota(vconn_client *c) { return (int)c->info.quota; }
int vconn_client_send_window(vconn_client *c) { return (int)c->info.send_window; }
int vconn_client_max_message(vconn_client *c) { return (int)c->info.max_message; }
const char *vconn_client_node(vconn_client *c) { return c->info.node; }
