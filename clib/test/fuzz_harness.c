/* The parsers' harness, driven by clib_test.go (FuzzCDecode and the
 * document's examples): each input on stdin is a little-endian u32 length
 * and that many bytes; for each it prints one line saying what the
 * library's parsers made of it, for the Go side to compare with package
 * frame's. Built with the sanitizers: any out-of-bounds access ends it. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/internal.h"

static int read_full(uint8_t *b, size_t n)
{
	return fread(b, 1, n, stdin) == n;
}

/* ring treats the input as ring RX's area of a small layout, as a hostile
 * agent could write it, and takes what the consumer accepts. */
static void ring(const uint8_t *in, size_t n)
{
	struct vconn_shm_layout l = {.entries = 4, .slab = 256, .max_message = 128};
	size_t area = VC_RING_HEADER + l.entries * VC_DESC_LEN + l.slab;
	uint8_t *mem = aligned_alloc(64, (area + 63) & ~(size_t)63);
	memset(mem, 0, area);
	memcpy(mem, in, n < area ? n : area);
	struct vc_consumer c = {0};
	c.r.tail = (_Atomic uint32_t *)(void *)mem;
	c.r.head = (_Atomic uint32_t *)(void *)(mem + 64);
	c.r.cons_wait = (_Atomic uint32_t *)(void *)(mem + 128);
	c.r.prod_wait = (_Atomic uint32_t *)(void *)(mem + 192);
	c.r.descs = mem + VC_RING_HEADER;
	c.r.slab = c.r.descs + l.entries * VC_DESC_LEN;
	c.r.n = l.entries;
	c.r.mask = l.entries - 1;
	c.r.slab_len = l.slab;
	c.r.max_msg = l.max_message;
	c.r.bell = -1;
	atomic_store(c.r.prod_wait, 0); /* no bell to ring */
	printf(" | ring");
	for (int i = 0; i < 6; i++) {
		struct vc_desc d;
		const uint8_t *p;
		int r = vc_shm_peek(&c, &d, &p);
		if (r < 0) {
			printf(" corrupt");
			break;
		}
		if (r == 0)
			break;
		unsigned sum = 0;
		for (uint32_t k = 0; k < d.len; k++)
			sum += p[k];
		printf(" %u/%u/%u", d.len, d.flags, sum);
		vc_shm_release(&c);
	}
	free(mem);
}

int main(void)
{
	static uint8_t buf[VCONN_MAX_FRAME + 16];
	uint8_t lenb[4];
	while (read_full(lenb, 4)) {
		uint32_t n = (uint32_t)lenb[0] | (uint32_t)lenb[1] << 8 | (uint32_t)lenb[2] << 16 | (uint32_t)lenb[3] << 24;
		if (n > sizeof buf)
			return 2;
		/* An exact-size copy, so that ASan sees any read past the input. */
		uint8_t *in = malloc(n ? n : 1);
		if (!read_full(in, n))
			return 2;
		struct vconn_frame f;
		const char *why = NULL;
		if (vconn_frame_decode(in, n, &f, &why) == 0) {
			printf("frame ok op=%u flags=%u req=%u handle=%u arg=%u arg2=%llu len=%u", f.op, f.flags, f.req,
			       f.handle, f.arg, (unsigned long long)f.arg2, f.len);
			uint8_t out[VCONN_MAX_FRAME];
			ssize_t k = vconn_frame_encode(&f, out, sizeof out);
			if (k != (ssize_t)n || memcmp(out, in, n) != 0)
				printf(" reencode-differs");
		} else {
			printf("frame err %s", why);
		}
		struct vconn_hello_info h;
		if (vconn_hello_decode(in, n, &h) == 0) {
			printf(" | hello ok %u %u %u ", h.quota, h.send_window, h.max_message);
			for (size_t i = 0; i < n - 12; i++)
				printf("%02x", (unsigned char)h.node[i]);
		} else {
			printf(" | hello err");
		}
		struct vconn_shm_layout l;
		if (vconn_shm_layout_decode(in, n, &l) == 0)
			printf(" | layout ok %u %u %u %zu", l.entries, l.slab, l.max_message, vconn_shm_layout_size(&l));
		else
			printf(" | layout err");
		ring(in, n);
		printf("\n");
		fflush(stdout);
		free(in);
	}
	return 0;
}
