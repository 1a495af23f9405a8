/* recserve embedding engine: the shared arena that lets worker processes read one copy of
 * the tables (DESIGN §9).
 *
 * The leader reserves one large MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE range before it
 * forks anything, so the range sits at the same address in every process forked from it.
 * From then on every table-owned allocation of the engine (the table, its indexes, row
 * storage, writer lists) comes from that range: a table handle, and every pointer inside
 * the table, means the same thing in the workers, which only read. Nothing is translated.
 *
 * Only the leader allocates and frees (one writer per table already; the leader's loader
 * threads build tables side by side, hence the mutex). The free list is the leader's
 * private memory. A worker calls rs_arena_detach() right after the fork: from then on its
 * own allocations use the process heap and it never frees arena memory.
 *
 * Allocation is by whole pages, first fit over a sorted list of free extents that merge
 * with their neighbours. A 64-byte header in front of each block holds its extent size. A
 * freed extent is given back to the kernel at once with MADV_REMOVE (for shared memory,
 * MADV_DONTNEED would only unmap it here and keep the pages); the address range is reused.
 * Without a reserved arena every call here is the heap's posix_memalign/free.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "embedding_internal.h"

#define HEADER 64

typedef struct {
    uintptr_t start;
    size_t size;
} extent;

static struct {
    char* base;
    size_t size;
    size_t page;
    pthread_mutex_t lock;
    extent* free;      /* sorted by start, never adjacent (merged) */
    size_t n_free, cap_free;
    size_t allocated;  /* bytes in extents handed out */
    size_t peak;
} arena = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* 1: this process allocates from the arena (the leader); 0: heap (no arena, or a worker). */
static _Atomic int allocating;

static bool in_arena(const void* p) {
    return arena.base && (const char*)p >= arena.base && (const char*)p < arena.base + arena.size;
}

void* rs_arena_reserve(int64_t bytes) {
    if (arena.base || bytes <= 0) return NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t size = ((size_t)bytes + page - 1) / page * page;
    void* base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return NULL;
    extent* list = malloc(64 * sizeof(extent));
    if (!list) {
        munmap(base, size);
        return NULL;
    }
    list[0] = (extent){(uintptr_t)base, size};
    arena.base = base;
    arena.size = size;
    arena.page = page;
    arena.free = list;
    arena.n_free = 1;
    arena.cap_free = 64;
    atomic_store(&allocating, 1);
    return base;
}

void rs_arena_detach(void) { atomic_store(&allocating, 0); }

int rs_arena_contains(const void* p) { return in_arena(p); }

void rs_arena_stats(int64_t* out) {
    pthread_mutex_lock(&arena.lock);
    out[0] = (int64_t)arena.size;
    out[1] = (int64_t)arena.allocated;
    out[2] = (int64_t)arena.peak;
    out[3] = (int64_t)arena.n_free;
    pthread_mutex_unlock(&arena.lock);
}

static void* arena_alloc(size_t bytes) {
    size_t size = (bytes + HEADER + arena.page - 1) / arena.page * arena.page;
    void* out = NULL;
    pthread_mutex_lock(&arena.lock);
    for (size_t i = 0; i < arena.n_free; i++) {
        extent* e = &arena.free[i];
        if (e->size < size) continue;
        char* start = (char*)e->start;
        e->start += size;
        e->size -= size;
        if (e->size == 0) {
            memmove(e, e + 1, (arena.n_free - i - 1) * sizeof(extent));
            arena.n_free--;
        }
        *(size_t*)(void*)start = size;
        arena.allocated += size;
        if (arena.allocated > arena.peak) arena.peak = arena.allocated;
        out = start + HEADER;
        break;
    }
    pthread_mutex_unlock(&arena.lock);
    return out;
}

/* Returns the extent to the list, merged with its neighbours; 0, or -1 when the list could
 * not grow (the extent is then lost to reuse, its pages still released). */
static int arena_release(uintptr_t start, size_t size) {
    size_t lo = 0, hi = arena.n_free;
    while (lo < hi) { /* first extent after start */
        size_t mid = (lo + hi) / 2;
        if (arena.free[mid].start < start) lo = mid + 1; else hi = mid;
    }
    bool joins_prev = lo > 0 && arena.free[lo - 1].start + arena.free[lo - 1].size == start;
    bool joins_next = lo < arena.n_free && start + size == arena.free[lo].start;
    if (joins_prev && joins_next) {
        arena.free[lo - 1].size += size + arena.free[lo].size;
        memmove(&arena.free[lo], &arena.free[lo + 1], (arena.n_free - lo - 1) * sizeof(extent));
        arena.n_free--;
    } else if (joins_prev) {
        arena.free[lo - 1].size += size;
    } else if (joins_next) {
        arena.free[lo].start = start;
        arena.free[lo].size += size;
    } else {
        if (arena.n_free == arena.cap_free) {
            extent* grown = realloc(arena.free, 2 * arena.cap_free * sizeof(extent));
            if (!grown) return -1;
            arena.free = grown;
            arena.cap_free *= 2;
        }
        memmove(&arena.free[lo + 1], &arena.free[lo], (arena.n_free - lo) * sizeof(extent));
        arena.free[lo] = (extent){start, size};
        arena.n_free++;
    }
    return 0;
}

static void arena_free(void* p) {
    char* start = (char*)p - HEADER;
    size_t size = *(size_t*)(void*)start;
    /* Before the extent can be handed out again: its pages go back to the kernel now. */
    madvise(start, size, MADV_REMOVE);
    pthread_mutex_lock(&arena.lock);
    arena.allocated -= size;
    arena_release((uintptr_t)start, size);
    pthread_mutex_unlock(&arena.lock);
}

void* rs_mem_alloc(size_t bytes, size_t alignment) {
    if (atomic_load_explicit(&allocating, memory_order_relaxed)) {
        /* Blocks start 64 bytes into a page: every alignment the engine asks for up to a
         * cache line holds; the huge-page alignment of big indexes does not matter here
         * (shared memory gets no transparent huge pages by default). */
        return arena_alloc(bytes ? bytes : 1);
    }
    void* p = NULL;
    return posix_memalign(&p, alignment < sizeof(void*) ? sizeof(void*) : alignment, bytes ? bytes : 1) == 0 ? p : NULL;
}

void rs_mem_free(void* p) {
    if (!p) return;
    if (in_arena(p)) {
        /* A worker never frees what the leader allocated: the leader frees it, after every
         * worker has let go of the table (DESIGN §9). */
        if (atomic_load_explicit(&allocating, memory_order_relaxed)) arena_free(p);
        return;
    }
    free(p);
}

void* rs_mem_grow(void* p, size_t old_bytes, size_t new_bytes) {
    if (!p || !in_arena(p)) {
        if (!atomic_load_explicit(&allocating, memory_order_relaxed)) return realloc(p, new_bytes);
    }
    void* q = rs_mem_alloc(new_bytes, 64);
    if (!q) return NULL;
    if (p) {
        memcpy(q, p, old_bytes < new_bytes ? old_bytes : new_bytes);
        rs_mem_free(p);
    }
    return q;
}

/* For Python (recserve.embedding.shared_memory): row buffers tables adopt. */
void* rs_arena_alloc(int64_t bytes) { return bytes < 0 ? NULL : rs_mem_alloc((size_t)bytes, 64); }
void rs_arena_free(void* p) { rs_mem_free(p); }
