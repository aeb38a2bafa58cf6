/* libvconn's allocations, counted at the link: a test that includes this
 * (one translation unit per test program) is linked with
 * -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc (clib_test.go's
 * linkFlags), so each call the library's objects make goes through these
 * wrappers. That counts libvconn's own calls only, the same with every
 * sanitizer or none (mallinfo2 knows nothing of ASan's allocator, and the
 * sanitizer runtimes and libc allocate on their own); a test checks that
 * the wrappers count before it trusts a count of 0. */
#ifndef VCONN_TEST_ALLOCS_H
#define VCONN_TEST_ALLOCS_H

#include <stdatomic.h>
#include <stddef.h>

static atomic_long allocs;
void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t k, size_t n);
void *__wrap_realloc(void *p, size_t n);

void *__wrap_malloc(size_t n)
{
	atomic_fetch_add(&allocs, 1);
	return __real_malloc(n);
}

void *__wrap_calloc(size_t k, size_t n)
{
	atomic_fetch_add(&allocs, 1);
	return __real_calloc(k, n);
}

void *__wrap_realloc(void *p, size_t n)
{
	atomic_fetch_add(&allocs, 1);
	return __real_realloc(p, n);
}

#endif
