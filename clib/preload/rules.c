/*
 * rules.c: RDMAVISOR_PRELOAD_CONNECT and _LISTEN, what the library takes
 * over (preload.c says what they mean).
 */
#define _GNU_SOURCE
#include "rules.h"

#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_RULES 64

struct rule {
	int any_host, any_port;
	int family; /* AF_INET or AF_INET6 */
	struct in6_addr ip; /* v4 as v4-mapped */
	uint16_t port;
};

static struct rule connect_rules[MAX_RULES];
static int n_connect;
static uint16_t listen_ports[MAX_RULES];
static int n_listen, listen_any;

void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("rdmavisor-preload: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	_exit(2);
}

static int parse_port(const char *s, size_t n, uint16_t *out)
{
	if (n == 0 || n > 5)
		return -1;
	unsigned v = 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (unsigned)(s[i] - '0');
	}
	if (v == 0 || v > 65535)
		return -1;
	*out = (uint16_t)v;
	return 0;
}

/* parse_connect parses one "host:port" rule; host is an IP (IPv6 in
 * brackets) or "*", port a number or "*". */
static int parse_connect(const char *s, size_t n, struct rule *r)
{
	memset(r, 0, sizeof *r);
	const char *colon = NULL;
	for (size_t i = n; i > 0; i--)
		if (s[i - 1] == ':') {
			colon = s + i - 1;
			break;
		}
	if (colon == NULL)
		return -1;
	size_t hl = (size_t)(colon - s), pl = n - hl - 1;
	const char *host = s, *port = colon + 1;
	if (pl == 1 && port[0] == '*')
		r->any_port = 1;
	else if (parse_port(port, pl, &r->port) != 0)
		return -1;
	if (hl == 1 && host[0] == '*') {
		r->any_host = 1;
		return r->any_port ? -1 : 0; /* "*:*" would take every connection */
	}
	if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']')
		host++, hl -= 2;
	char buf[INET6_ADDRSTRLEN];
	if (hl == 0 || hl >= sizeof buf)
		return -1;
	memcpy(buf, host, hl);
	buf[hl] = 0;
	struct in_addr a4;
	if (inet_pton(AF_INET, buf, &a4) == 1) {
		r->family = AF_INET;
		r->ip.s6_addr[10] = r->ip.s6_addr[11] = 0xff;
		memcpy(&r->ip.s6_addr[12], &a4, 4);
		return 0;
	}
	if (inet_pton(AF_INET6, buf, &r->ip) == 1) {
		r->family = AF_INET6;
		return 0;
	}
	return -1;
}

/* each calls fn on every comma-separated entry of v; fn's failure names
 * the variable and the entry. */
static void each(const char *name, const char *v, int (*fn)(const char *, size_t), const char *want)
{
	const char *p = v;
	for (;;) {
		const char *e = strchr(p, ',');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		while (n > 0 && (*p == ' ' || *p == '\t'))
			p++, n--;
		while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t'))
			n--;
		if (n == 0 || fn(p, n) != 0)
			die("%s=\"%s\": bad entry \"%.*s\": want %s", name, v, (int)n, p, want);
		if (e == NULL)
			return;
		p = e + 1;
	}
}

static int add_connect(const char *s, size_t n)
{
	if (n_connect == MAX_RULES)
		return -1;
	return parse_connect(s, n, &connect_rules[n_connect++]);
}

static int add_listen(const char *s, size_t n)
{
	if (n == 1 && s[0] == '*') {
		listen_any = 1;
		return 0;
	}
	if (n_listen == MAX_RULES)
		return -1;
	return parse_port(s, n, &listen_ports[n_listen++]);
}

/* rules_load reads the variables; a malformed one stops the program. */
void rules_load(void)
{
	const char *c = getenv("RDMAVISOR_PRELOAD_CONNECT"), *l = getenv("RDMAVISOR_PRELOAD_LISTEN");
	if (c != NULL && *c != 0)
		each("RDMAVISOR_PRELOAD_CONNECT", c, add_connect,
		     "ip:port, ip:* or *:port (IPv6 in brackets), at most 64 entries");
	if (l != NULL && *l != 0)
		each("RDMAVISOR_PRELOAD_LISTEN", l, add_listen, "a port 1..65535 or *, at most 64 entries");
	if ((n_connect > 0 || n_listen > 0 || listen_any)) {
		const char *s = getenv("RDMAVISOR_SOCKET");
		if (s == NULL || *s == 0)
			die("RDMAVISOR_PRELOAD_CONNECT or _LISTEN is set but RDMAVISOR_SOCKET (the allocation's socket) is not");
	}
}

int rules_connect(void) { return n_connect > 0; }

int rules_listen(void) { return n_listen > 0 || listen_any; }

void addr_of(const struct sockaddr *a, struct in6_addr *ip, uint16_t *port, int *family)
{
	memset(ip, 0, sizeof *ip);
	if (a->sa_family == AF_INET) {
		const struct sockaddr_in *s = (const struct sockaddr_in *)a;
		ip->s6_addr[10] = ip->s6_addr[11] = 0xff;
		memcpy(&ip->s6_addr[12], &s->sin_addr, 4);
		*port = ntohs(s->sin_port);
		*family = AF_INET;
	} else {
		const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)a;
		*ip = s->sin6_addr;
		*port = ntohs(s->sin6_port);
		*family = IN6_IS_ADDR_V4MAPPED(ip) ? AF_INET : AF_INET6;
	}
}

int wants_connect(const struct sockaddr *a)
{
	struct in6_addr ip;
	uint16_t port;
	int fam;
	addr_of(a, &ip, &port, &fam);
	for (int i = 0; i < n_connect; i++) {
		const struct rule *r = &connect_rules[i];
		if ((r->any_port || r->port == port) && (r->any_host || memcmp(&r->ip, &ip, sizeof ip) == 0))
			return 1;
	}
	return 0;
}

int wants_listen(uint16_t port)
{
	if (listen_any)
		return 1;
	for (int i = 0; i < n_listen; i++)
		if (listen_ports[i] == port)
			return 1;
	return 0;
}
