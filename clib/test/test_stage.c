/* One-sided operations through staging memory (docs/protocol.md R3.30,
 * R3.31): vconn_write_remote and vconn_read_remote of 1 B, 4 KiB, 64 KiB
 * and more than a slot, at odd offsets, then from several threads at
 * once, each read back and compared. Against the agents (VCONN_SOCK_A,
 * _B, _NODE_B, _PORT: b exports the region, and a maps one staging
 * memfd), or against stage_test.go's fake agent (VCONN_SOCK: its region
 * 1, which the Go side watches: which frames carried the bytes, and that
 * no slot is used twice at once). VCONN_ABANDON (fake agent only):
 * operations the agent answers late, after their caller gave up. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "check.h"

#define REGION (1u << 20)
#define THREADS 6
#define ROUNDS 8
#define AREA (REGION / THREADS)
#define SLOW_OFF 777 /* the fake agent answers a Write here late */

/* pattern fills b with bytes that differ with seed and with position. */
static void pattern(uint8_t *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)(seed * 131u + i * 7u + (i >> 8));
}

/* stage_maps counts this process's mappings of staging memfds, which the
 * agent names "rdmavisor-<allocation>-<vconn>-stage". */
static int stage_maps(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	CHECK(f != NULL, "open /proc/self/maps");
	char line[512];
	int n = 0;
	while (fgets(line, sizeof line, f))
		if (strstr(line, "memfd:rdmavisor-") && strstr(line, "-stage"))
			n++;
	fclose(f);
	return n;
}

/* The peer side, where the agents are real: b exported the region. */
static vconn *peer;
static uint32_t peer_id;

/* roundtrip writes n bytes of seed's pattern at off, reads them back,
 * and (against the agents) reads them in the peer's own region. */
static void roundtrip(vconn *a, uint32_t rid, uint64_t off, size_t n, unsigned seed)
{
	uint8_t *buf = malloc(n), *got = malloc(n);
	CHECK(buf && got, "%zu bytes", n);
	pattern(buf, n, seed);
	OK(vconn_write_remote(a, rid, off, buf, n));
	if (peer) {
		memset(got, 0, n);
		OK(vconn_region_read(peer, peer_id, off, got, n));
		CHECK(memcmp(got, buf, n) == 0, "%zu bytes at %llu: the peer's region differs", n, (unsigned long long)off);
	}
	memset(got, 0, n);
	OK(vconn_read_remote(a, rid, off, got, n));
	for (size_t i = 0; i < n; i++)
		CHECK(got[i] == buf[i], "%zu bytes at %llu: byte %zu is %u, want %u", n, (unsigned long long)off, i, got[i], buf[i]);
	free(buf);
	free(got);
}

static void test_sizes(vconn *a, uint32_t rid)
{
	const size_t sizes[] = {1, 4096, 65536, 200u << 10};
	const uint64_t offs[] = {3, 4097, 70001, 300001};
	for (int i = 0; i < 4; i++)
		roundtrip(a, rid, offs[i], sizes[i], (unsigned)i + 1);
	/* Out of the region's bounds: the agent's error, staged or not. */
	uint8_t b[16] = {0};
	CHECK(vconn_write_remote(a, rid, REGION - 8, b, sizeof b) == -EACCES, "a write past the region");
	CHECK(vconn_read_remote(a, rid, REGION - 8, b, sizeof b) == -EACCES, "a read past the region");
	printf("sizes: ok\n");
}

struct worker {
	vconn *a;
	uint32_t rid;
	int t;
};

/* work writes and reads its own area of the region, in sizes up to two
 * slots, beside the other threads on the same vconn. */
static void *work(void *arg)
{
	struct worker *w = arg;
	for (unsigned r = 0; r < ROUNDS; r++) {
		size_t n = 1 + (r * 37117u + (unsigned)w->t * 5003u) % (AREA - 64);
		roundtrip(w->a, w->rid, (uint64_t)w->t * AREA + 5 + r % 7, n, (unsigned)w->t * 100 + r);
	}
	return NULL;
}

static void test_threads(vconn *a, uint32_t rid)
{
	pthread_t th[THREADS];
	struct worker w[THREADS];
	for (int t = 0; t < THREADS; t++) {
		w[t] = (struct worker){a, rid, t};
		CHECK(pthread_create(&th[t], NULL, work, &w[t]) == 0, "thread %d", t);
	}
	for (int t = 0; t < THREADS; t++)
		pthread_join(th[t], NULL);
	printf("threads: ok\n");
}

/* test_abandon: a Write the fake agent answers after its caller gave up
 * (timeout) keeps its slot until the answer; the operations sent
 * meanwhile take other slots (the Go side checks), and every slot is
 * given back once the answers came. */
static void test_abandon(const char *sock)
{
	struct vconn_options o = {.socket = sock, .timeout_ms = 1000};
	vconn_client *c;
	vconn *a;
	OK(vconn_client_open(&c, &o));
	OK(vconn_dial(c, "node-b:80", &a));
	uint8_t b[100];
	pattern(b, sizeof b, 9);
	int err = vconn_write_remote(a, 1, SLOW_OFF, b, sizeof b);
	CHECK(err == -ETIMEDOUT, "the slow write: %d, want -ETIMEDOUT", err);
	for (int i = 0; i < 3; i++) {
		err = vconn_write_remote(a, 1, 10000 + 1000 * (uint64_t)i, b, sizeof b);
		CHECK(err == 0 || err == -ETIMEDOUT, "a write behind the slow one: %d", err);
	}
	struct timespec wait = {2, 0}; /* the fake agent's answers come */
	nanosleep(&wait, NULL);
	for (unsigned i = 0; i < 2 * 4; i++) /* more than the slots: each came back */
		roundtrip(a, 1, 20000 + 70000 * (uint64_t)i, 65536, 50 + i);
	/* And a vconn and client closed while the agent still holds a slot:
	 * the staging memory is unmapped at once, its slots freed at the
	 * session's end (the sanitizers watch). */
	CHECK(vconn_write_remote(a, 1, SLOW_OFF, b, sizeof b) == -ETIMEDOUT, "the slow write again");
	OK(vconn_close(a));
	vconn_client_close(c);
	printf("abandon: ok\n");
}

static void against_agents(void)
{
	struct nodes nd;
	open_nodes(&nd, NULL, NULL, 0);
	vconn_client *ca = nd.a, *cb = nd.b;
	const char *addr = nd.addr, *laddr = nd.laddr;
	vconn_listener *l;
	vconn *a;
	OK(vconn_listen(cb, laddr, &l));
	OK(vconn_dial(ca, addr, &a));
	OK(vconn_accept(l, &peer));
	OK(vconn_export(peer, REGION, VCONN_ACCESS_READ | VCONN_ACCESS_WRITE, &peer_id));
	/* The id travels behind the export, so a's side knows the region. */
	OK(vconn_send_imm(peer, NULL, 0, peer_id));
	uint32_t rid = 0;
	int has = 0;
	CHECK(vconn_recv(a, NULL, 0, &rid, &has) == 0 && has && rid == peer_id, "region id %u", rid);
	CHECK(stage_maps() == 0, "staging memory before any one-sided operation: %d", stage_maps());
	test_sizes(a, rid);
	/* The agent offers FeatureStage: a's vconn mapped its staging memory. */
	CHECK(stage_maps() == 1, "staging memfds mapped: %d, want 1", stage_maps());
	test_threads(a, rid);
	CHECK(stage_maps() == 1, "staging memfds mapped after the threads: %d, want 1", stage_maps());
	OK(vconn_close(a));
	CHECK(stage_maps() == 0, "staging memory unmapped at close: %d", stage_maps());
	OK(vconn_close(peer));
	OK(vconn_listener_close(l));
	vconn_client_close(ca);
	vconn_client_close(cb);
}

int main(void)
{
	const char *fake = getenv("VCONN_SOCK");
	if (!fake) {
		against_agents();
		printf("ok\n");
		return 0;
	}
	vconn_client *c;
	vconn *a;
	OK(vconn_client_open(&c, &(struct vconn_options){.socket = fake, .timeout_ms = 30000}));
	OK(vconn_dial(c, "node-b:80", &a));
	test_sizes(a, 1);
	test_threads(a, 1);
	OK(vconn_close(a));
	vconn_client_close(c);
	if (getenv("VCONN_ABANDON"))
		test_abandon(fake);
	printf("ok\n");
	return 0;
}
