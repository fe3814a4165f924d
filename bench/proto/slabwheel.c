/*
 * Prototype: the timer core as a hand-written C extension (issue 12, W3).
 *
 * Not part of the library. `python -m bench proto-timer` compiles it into
 * build/proto/ and measures it with W3's own drivers beside purgatory_aio.Timer
 * (compiled with mypyc) and loop.call_later, to decide whether the wheel should
 * move to C before committing to it.
 *
 * What differs from the mypyc Timer, and what each difference is meant to buy:
 *
 * - Entries live in one slab (a growable array of 40-byte slots), not as one
 *   Python object each. A bucket is an intrusive doubly linked list of slab
 *   indexes, not a dict: removing an entry touches its slot and its two
 *   neighbours, where a dict delete touches the hash index, the entry array
 *   and the key object, each a cache miss once a million entries are pending.
 * - A freed slot is reused by the next add (LIFO free list), so the slot an
 *   add writes is usually still in cache from the cancel just before it.
 * - The handle returned to Python is a 32-byte object that is not tracked by
 *   the garbage collector: freeing it does not unlink it from the GC's list
 *   (two more misses per cancel in the mypyc build, where the handle is a GC
 *   object). It refers to the core only through a shared, untracked token, so
 *   a callback that keeps its own handle cannot form a cycle the GC cannot see:
 *   the core (GC-tracked) owns the callbacks and traverses them.
 *
 * The wheel follows purgatory_aio.Timer: ticks are ceil(deadline / tick),
 * level k slots are wheel_size**k ticks wide, higher levels are created on
 * demand, buckets enter a binary heap of due ticks once per rotation, a bucket
 * is due from the earliest deadline placed in it, entries fire in deadline
 * order (insertion order at equal deadlines), never before their deadline,
 * and an entry added already due by a callback waits for the next pass.
 * Left out (a prototype): chunked cascades, ManualClock integration, close()
 * from a callback, KeyboardInterrupt handling (callback errors are reported
 * as unraisable and counted).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __linux__
#include <sys/mman.h>
#endif

#define NIL UINT32_MAX
#define FREE_SLOT (-1)
#define DETACHED (-2) /* taken out of its bucket by a pass that is firing it */
#define MAX_LEVELS 16
#define MAX_TICKS 9007199254740992.0 /* 2**53 */

typedef struct {
    double deadline;
    uint32_t prev, next;
    int32_t bucket; /* bucket id, FREE_SLOT or DETACHED */
    uint32_t gen;   /* bumped when the slot is freed: stale handles see it */
    PyObject *callback;
    PyObject *args; /* a tuple, or NULL for no arguments */
} Slot;

typedef struct {
    uint32_t head, tail;
    int64_t expiration; /* due tick while queued, else -1 */
    double first;       /* earliest deadline placed this rotation */
    int32_t level;
    uint32_t count;
} Bucket;

typedef struct {
    int64_t expiration;
    int32_t level;
    uint32_t bucket;
} HeapItem;

typedef struct CoreObject CoreObject;

/* Shared by a core and its handles; untracked, so handles need no GC. */
typedef struct {
    PyObject_HEAD
    CoreObject *core; /* borrowed; NULL once the core is gone */
} TokenObject;

struct CoreObject {
    PyObject_HEAD
    double tick, per_tick, horizon;
    uint32_t size;
    int nlevels;
    int64_t current[MAX_LEVELS];
    int64_t ltick[MAX_LEVELS];
    Bucket *buckets; /* MAX_LEVELS * size */
    Slot *slots;
    uint32_t nslots, cap, free_head;
    HeapItem *heap;
    size_t hlen, hcap;
    Py_ssize_t count;
    PyObject *clock;     /* callable() -> float */
    PyObject *on_sooner; /* callable(when): something is due before armed_when */
    double armed_when;
    int firing;
    Py_ssize_t errors, fired;
    TokenObject *token;
    uint32_t *batch;
    size_t batch_cap;
    uint8_t *fired_now; /* level-0 buckets fired in the current pass */
};

typedef struct {
    PyObject_HEAD
    TokenObject *token;
    uint32_t idx, gen;
} HandleObject;

static PyTypeObject TokenType, CoreType, HandleType;
static HandleObject *handle_alloc(void);

/* ---- memory ------------------------------------------------------------- */

#define HUGE_PAGE ((size_t)2 << 20)

/* Memory in 2 MiB transparent huge pages where the kernel allows them (Linux,
 * THP in "madvise" mode as on these machines): a random access to a million
 * entries then costs a cache miss, not a cache miss plus a page walk. */
static void *
huge_alloc(size_t bytes)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE) && !defined(PROTO_NO_HUGE)
    bytes = (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    char *raw = mmap(NULL, bytes + HUGE_PAGE, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    char *start = (char *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (start > raw)
        munmap(raw, (size_t)(start - raw));
    size_t tail = (size_t)(raw + bytes + HUGE_PAGE - (start + bytes));
    if (tail)
        munmap(start + bytes, tail);
    madvise(start, bytes, MADV_HUGEPAGE);
    return start;
#else
    return PyMem_Malloc(bytes);
#endif
}

static void
huge_free(void *p, size_t bytes)
{
    if (p == NULL)
        return;
#if defined(__linux__) && defined(MADV_HUGEPAGE) && !defined(PROTO_NO_HUGE)
    munmap(p, (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
#else
    (void)bytes;
    PyMem_Free(p);
#endif
}

/* ---- slab ---------------------------------------------------------------- */

static int
slab_alloc(CoreObject *c, uint32_t *out)
{
    if (c->free_head != NIL) {
        *out = c->free_head;
        c->free_head = c->slots[*out].next;
        return 0;
    }
    if (c->nslots == c->cap) {
        uint32_t cap = c->cap ? c->cap * 2 : (uint32_t)(HUGE_PAGE / sizeof(Slot));
        Slot *grown = huge_alloc((size_t)cap * sizeof(Slot));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        if (c->slots != NULL)
            memcpy(grown, c->slots, (size_t)c->nslots * sizeof(Slot));
        huge_free(c->slots, (size_t)c->cap * sizeof(Slot));
        c->slots = grown;
        c->cap = cap;
    }
    *out = c->nslots++;
    c->slots[*out].gen = 0;
    return 0;
}

/* Free a slot; the caller has unlinked it. Drops its references last. */
static void
slab_free(CoreObject *c, uint32_t idx)
{
    Slot *s = &c->slots[idx];
    PyObject *cb = s->callback, *args = s->args;
    s->callback = NULL;
    s->args = NULL;
    s->bucket = FREE_SLOT;
    s->gen++;
    s->next = c->free_head;
    c->free_head = idx;
    Py_XDECREF(cb);
    Py_XDECREF(args);
}

/* ---- the heap of due buckets ------------------------------------------- */

static inline int
heap_less(const HeapItem *a, const HeapItem *b)
{
    /* Earlier tick first; at equal ticks higher levels first (they cascade into
     * level 0 before it is flushed). */
    if (a->expiration != b->expiration)
        return a->expiration < b->expiration;
    return a->level > b->level;
}

static int
heap_push(CoreObject *c, HeapItem item)
{
    if (c->hlen == c->hcap) {
        size_t cap = c->hcap ? c->hcap * 2 : 64;
        HeapItem *grown = PyMem_Realloc(c->heap, cap * sizeof(HeapItem));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        c->heap = grown;
        c->hcap = cap;
    }
    size_t i = c->hlen++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_less(&item, &c->heap[parent]))
            break;
        c->heap[i] = c->heap[parent];
        i = parent;
    }
    c->heap[i] = item;
    return 0;
}

static void
heap_pop(CoreObject *c)
{
    HeapItem last = c->heap[--c->hlen];
    size_t n = c->hlen, i = 0;
    if (n == 0)
        return;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n)
            break;
        if (child + 1 < n && heap_less(&c->heap[child + 1], &c->heap[child]))
            child++;
        if (!heap_less(&c->heap[child], &last))
            break;
        c->heap[i] = c->heap[child];
        i = child;
    }
    c->heap[i] = last;
}

/* ---- placing --------------------------------------------------------- */

static int
sooner(CoreObject *c, double when)
{
    if (c->firing || !(when < c->armed_when))
        return 0;
    PyObject *w = PyFloat_FromDouble(when);
    if (w == NULL)
        return -1;
    PyObject *r = PyObject_CallOneArg(c->on_sooner, w);
    Py_DECREF(w);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static int
into(CoreObject *c, uint32_t b, uint32_t idx, int64_t expiration)
{
    Bucket *bk = &c->buckets[b];
    Slot *s = &c->slots[idx];
    double deadline = s->deadline;
    s->bucket = (int32_t)b;
    s->next = NIL;
    s->prev = bk->tail;
    if (bk->tail == NIL)
        bk->head = idx;
    else
        c->slots[bk->tail].next = idx;
    bk->tail = idx;
    bk->count++;
    if (bk->expiration != expiration) {
        bk->expiration = expiration;
        bk->first = deadline;
        HeapItem item = {expiration, bk->level, b};
        if (heap_push(c, item) < 0)
            return -1;
        double due = (double)expiration * c->tick;
        return sooner(c, deadline < due ? deadline : due);
    }
    if (deadline < bk->first) {
        bk->first = deadline;
        return sooner(c, deadline);
    }
    return 0;
}

static int
place(CoreObject *c, uint32_t idx, int64_t not_before)
{
    double scaled = c->slots[idx].deadline * c->per_tick;
    int64_t t = (int64_t)scaled;
    if ((double)t < scaled)
        t++;
    if (t < not_before)
        t = not_before;
    uint32_t size = c->size;
    if (t < c->current[0] + (int64_t)size) {
        if (t < c->current[0])
            t = c->current[0];
        return into(c, (uint32_t)(t % size), idx, t);
    }
    for (int k = 1;; k++) {
        if (k == c->nlevels) {
            if (k == MAX_LEVELS) {
                PyErr_SetString(PyExc_OverflowError, "deadline beyond the wheel");
                return -1;
            }
            c->ltick[k] = c->ltick[k - 1] * size;
            c->current[k] = c->current[k - 1] - c->current[k - 1] % c->ltick[k];
            c->nlevels++;
        }
        int64_t width = c->ltick[k];
        if (t < c->current[k] + width * (int64_t)size) {
            int64_t slot = t / width;
            return into(c, (uint32_t)(k * size + slot % size), idx, slot * width);
        }
    }
}

static void
unlink_slot(CoreObject *c, uint32_t idx)
{
    Slot *s = &c->slots[idx];
    Bucket *bk = &c->buckets[s->bucket];
    if (s->prev == NIL)
        bk->head = s->next;
    else
        c->slots[s->prev].next = s->next;
    if (s->next == NIL)
        bk->tail = s->prev;
    else
        c->slots[s->next].prev = s->prev;
    bk->count--;
}

static void
advance_levels(CoreObject *c, int64_t to)
{
    for (int k = 0; k < c->nlevels; k++) {
        int64_t width = c->ltick[k];
        if (to >= c->current[k] + width)
            c->current[k] = to - to % width;
    }
}

/* ---- the core object ------------------------------------------------- */

static PyObject *
Core_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"clock", "on_sooner", "tick", "wheel_size", NULL};
    PyObject *clock, *on_sooner;
    double tick = 0.001;
    unsigned int size = 20;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|dI", kwlist, &clock, &on_sooner, &tick,
                                     &size))
        return NULL;
    if (!(tick >= 1e-9) || !isfinite(tick) || size < 2 || size > 4096) {
        PyErr_SetString(PyExc_ValueError, "tick must be >= 1e-9 s and wheel_size in 2..4096");
        return NULL;
    }
    PyObject *now_obj = PyObject_CallNoArgs(clock);
    if (now_obj == NULL)
        return NULL;
    double now = PyFloat_AsDouble(now_obj);
    Py_DECREF(now_obj);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    CoreObject *c = (CoreObject *)type->tp_alloc(type, 0);
    if (c == NULL)
        return NULL;
    c->tick = tick;
    c->per_tick = 1.0 / tick;
    c->horizon = MAX_TICKS * tick;
    c->size = size;
    c->nlevels = 1;
    c->ltick[0] = 1;
    c->current[0] = (int64_t)floor(now / tick);
    c->free_head = NIL;
    c->armed_when = INFINITY;
    c->buckets = PyMem_Calloc((size_t)MAX_LEVELS * size, sizeof(Bucket));
    c->fired_now = PyMem_Calloc(size, 1);
    c->token = PyObject_New(TokenObject, &TokenType);
    if (c->buckets == NULL || c->fired_now == NULL || c->token == NULL) {
        Py_DECREF(c);
        return PyErr_NoMemory();
    }
    c->token->core = c;
    for (uint32_t i = 0; i < MAX_LEVELS * size; i++) {
        c->buckets[i].head = c->buckets[i].tail = NIL;
        c->buckets[i].expiration = -1;
        c->buckets[i].first = INFINITY;
        c->buckets[i].level = (int32_t)(i / size);
    }
    Py_INCREF(clock);
    c->clock = clock;
    Py_INCREF(on_sooner);
    c->on_sooner = on_sooner;
    return (PyObject *)c;
}

static int
Core_traverse(CoreObject *c, visitproc visit, void *arg)
{
    Py_VISIT(c->clock);
    Py_VISIT(c->on_sooner);
    for (uint32_t i = 0; i < c->nslots; i++) {
        Py_VISIT(c->slots[i].callback);
        Py_VISIT(c->slots[i].args);
    }
    return 0;
}

static int
Core_clear(CoreObject *c)
{
    Py_CLEAR(c->clock);
    Py_CLEAR(c->on_sooner);
    for (uint32_t i = 0; i < c->nslots; i++) {
        Py_CLEAR(c->slots[i].callback);
        Py_CLEAR(c->slots[i].args);
    }
    return 0;
}

static void
Core_dealloc(CoreObject *c)
{
    PyObject_GC_UnTrack(c);
    Core_clear(c);
    if (c->token != NULL) {
        c->token->core = NULL; /* outstanding handles now cancel nothing */
        Py_DECREF(c->token);
    }
    huge_free(c->slots, (size_t)c->cap * sizeof(Slot));
    PyMem_Free(c->buckets);
    PyMem_Free(c->heap);
    PyMem_Free(c->batch);
    PyMem_Free(c->fired_now);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static int
check_delay(PyObject *obj, double *out)
{
    double d = PyFloat_AsDouble(obj);
    if (d == -1.0 && PyErr_Occurred())
        return -1;
    if (!(d >= 0.0) || !isfinite(d)) {
        PyErr_Format(PyExc_ValueError, "delay must be a finite number >= 0, got %R", obj);
        return -1;
    }
    *out = d;
    return 0;
}

/* call_later(delay, callback, *args) -> Handle */
static PyObject *
Core_call_later(CoreObject *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2) {
        PyErr_SetString(PyExc_TypeError, "call_later(delay, callback, *args)");
        return NULL;
    }
    double delay;
    if (check_delay(args[0], &delay) < 0)
        return NULL;
    if (!PyCallable_Check(args[1])) {
        PyErr_Format(PyExc_TypeError, "callback must be callable, got %R", args[1]);
        return NULL;
    }
    PyObject *now_obj = PyObject_CallNoArgs(c->clock);
    if (now_obj == NULL)
        return NULL;
    double now = PyFloat_AsDouble(now_obj);
    Py_DECREF(now_obj);
    double deadline = now + delay;
    if (deadline >= c->horizon) {
        PyErr_Format(PyExc_ValueError, "delay %R is beyond what this timer can place", args[0]);
        return NULL;
    }
    PyObject *cargs = NULL;
    if (nargs > 2) {
        if ((cargs = PyTuple_New(nargs - 2)) == NULL)
            return NULL;
        for (Py_ssize_t i = 2; i < nargs; i++) {
            Py_INCREF(args[i]);
            PyTuple_SET_ITEM(cargs, i - 2, args[i]);
        }
    }
    HandleObject *h = handle_alloc();
    if (h == NULL) {
        Py_XDECREF(cargs);
        return NULL;
    }
    uint32_t idx;
    if (slab_alloc(c, &idx) < 0) {
        Py_XDECREF(cargs);
        h->token = NULL;
        Py_DECREF(h);
        return NULL;
    }
    Slot *s = &c->slots[idx];
    s->deadline = deadline;
    Py_INCREF(args[1]);
    s->callback = args[1];
    s->args = cargs;
    c->count++;
    if (place(c, idx, INT64_MIN) < 0) {
        /* Only on_sooner raising gets here; the entry is placed and stays. */
        PyErr_WriteUnraisable(c->on_sooner);
    }
    Py_INCREF(c->token);
    h->token = c->token;
    h->idx = idx;
    h->gen = c->slots[idx].gen;
    return (PyObject *)h;
}

static int
ensure_batch(CoreObject *c, size_t n)
{
    if (n <= c->batch_cap)
        return 0;
    size_t cap = c->batch_cap ? c->batch_cap : 256;
    while (cap < n)
        cap *= 2;
    uint32_t *grown = PyMem_Realloc(c->batch, cap * 2 * sizeof(uint32_t));
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    c->batch = grown;
    c->batch_cap = cap;
    return 0;
}

/* Stable merge sort of (idx, gen) pairs by deadline. */
static void
sort_batch(CoreObject *c, uint32_t *pairs, uint32_t *tmp, size_t n)
{
    if (n < 2)
        return;
    size_t mid = n / 2;
    sort_batch(c, pairs, tmp, mid);
    sort_batch(c, pairs + 2 * mid, tmp, n - mid);
    size_t i = 0, j = mid, k = 0;
    while (i < mid && j < n) {
        if (c->slots[pairs[2 * j]].deadline < c->slots[pairs[2 * i]].deadline) {
            tmp[2 * k] = pairs[2 * j];
            tmp[2 * k + 1] = pairs[2 * j + 1];
            j++;
        } else {
            tmp[2 * k] = pairs[2 * i];
            tmp[2 * k + 1] = pairs[2 * i + 1];
            i++;
        }
        k++;
    }
    while (i < mid) {
        tmp[2 * k] = pairs[2 * i];
        tmp[2 * k + 1] = pairs[2 * i + 1];
        i++, k++;
    }
    while (j < n) {
        tmp[2 * k] = pairs[2 * j];
        tmp[2 * k + 1] = pairs[2 * j + 1];
        j++, k++;
    }
    memcpy(pairs, tmp, n * 2 * sizeof(uint32_t));
}

/* Detach a bucket's list: its length, with its (idx, gen) pairs in c->batch. */
static Py_ssize_t
detach(CoreObject *c, uint32_t b)
{
    Bucket *bk = &c->buckets[b];
    size_t n = bk->count;
    if (ensure_batch(c, n) < 0)
        return -1;
    size_t i = 0;
    for (uint32_t idx = bk->head; idx != NIL; idx = c->slots[idx].next, i++) {
        c->slots[idx].bucket = DETACHED;
        c->batch[2 * i] = idx;
        c->batch[2 * i + 1] = c->slots[idx].gen;
    }
    bk->head = bk->tail = NIL;
    bk->count = 0;
    return (Py_ssize_t)n;
}

static int
fire_bucket(CoreObject *c, uint32_t b, int64_t expiration, double now)
{
    Py_ssize_t n = detach(c, b);
    if (n < 0)
        return -1;
    /* Own copy: callbacks may add entries that grow c->batch in a later pass. */
    uint32_t *pairs = PyMem_Malloc((size_t)n * 4 * sizeof(uint32_t) + 1);
    if (pairs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(pairs, c->batch, (size_t)n * 2 * sizeof(uint32_t));
    sort_batch(c, pairs, pairs + 2 * n, (size_t)n);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t idx = pairs[2 * i], gen = pairs[2 * i + 1];
        Slot *s = &c->slots[idx];
        if (s->gen != gen || s->bucket != DETACHED)
            continue; /* cancelled by an earlier callback of this batch */
        if (s->deadline <= now) {
            PyObject *cb = s->callback, *args = s->args;
            s->callback = s->args = NULL;
            slab_free(c, idx);
            c->count--;
            c->fired++;
            PyObject *r = args == NULL ? PyObject_CallNoArgs(cb) : PyObject_Call(cb, args, NULL);
            if (r == NULL) {
                c->errors++;
                PyErr_WriteUnraisable(cb);
            } else {
                Py_DECREF(r);
            }
            Py_DECREF(cb);
            Py_XDECREF(args);
        } else if ((double)expiration * c->tick > now) {
            if (place(c, idx, expiration) < 0)
                goto fail;
        } else if (place(c, idx, expiration + 1) < 0) {
            goto fail;
        }
    }
    PyMem_Free(pairs);
    return 0;
fail:
    PyMem_Free(pairs);
    return -1;
}

static int
cascade(CoreObject *c, uint32_t b, int64_t expiration)
{
    Py_ssize_t n = detach(c, b);
    for (Py_ssize_t i = 0; i < n; i++)
        if (place(c, c->batch[2 * i], expiration) < 0)
            return -1;
    return n < 0 ? -1 : 0;
}

/* advance(now) -> number fired: one reaper pass. */
static PyObject *
Core_advance(CoreObject *c, PyObject *arg)
{
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    Py_ssize_t before = c->fired;
    c->firing = 1;
    memset(c->fired_now, 0, c->size);
    int status = 0;
    while (c->hlen) {
        HeapItem top = c->heap[0];
        Bucket *bk = &c->buckets[top.bucket];
        if ((double)top.expiration * c->tick > now && bk->first > now)
            break;
        if (top.level == 0 && c->fired_now[top.bucket] && bk->expiration == top.expiration)
            break; /* re-added already due by a callback: next pass */
        heap_pop(c);
        if (bk->expiration != top.expiration)
            continue;
        bk->expiration = -1;
        advance_levels(c, top.expiration);
        if (bk->count == 0)
            continue;
        if (top.level) {
            status = cascade(c, top.bucket, top.expiration);
        } else {
            c->fired_now[top.bucket] = 1;
            status = fire_bucket(c, top.bucket, top.expiration, now);
        }
        if (status < 0)
            break;
    }
    if (status == 0 && (c->hlen == 0 || c->heap[0].expiration > (int64_t)floor(now / c->tick)))
        advance_levels(c, (int64_t)floor(now / c->tick));
    c->firing = 0;
    if (status < 0)
        return NULL;
    return PyLong_FromSsize_t(c->fired - before);
}

/* next_due() -> the first deadline of the earliest non-empty bucket, or inf. */
static PyObject *
Core_next_due(CoreObject *c, PyObject *Py_UNUSED(ignored))
{
    while (c->hlen) {
        HeapItem top = c->heap[0];
        Bucket *bk = &c->buckets[top.bucket];
        if (bk->expiration == top.expiration && bk->count) {
            double when = (double)top.expiration * c->tick;
            return PyFloat_FromDouble(bk->first < when ? bk->first : when);
        }
        heap_pop(c);
        if (bk->expiration == top.expiration)
            bk->expiration = -1;
    }
    return PyFloat_FromDouble(INFINITY);
}

/* close(): drop every pending entry without running it. */
static PyObject *
Core_close(CoreObject *c, PyObject *Py_UNUSED(ignored))
{
    for (uint32_t b = 0; b < MAX_LEVELS * c->size; b++) {
        Bucket *bk = &c->buckets[b];
        uint32_t idx = bk->head;
        while (idx != NIL) {
            uint32_t next = c->slots[idx].next;
            slab_free(c, idx);
            idx = next;
        }
        bk->head = bk->tail = NIL;
        bk->count = 0;
        bk->expiration = -1;
    }
    c->hlen = 0;
    c->count = 0;
    Py_RETURN_NONE;
}

static Py_ssize_t
Core_len(CoreObject *c)
{
    return c->count;
}

static PyMethodDef Core_methods[] = {
    {"call_later", (PyCFunction)(void (*)(void))Core_call_later, METH_FASTCALL,
     "call_later(delay, callback, *args) -> Handle"},
    {"advance", (PyCFunction)Core_advance, METH_O, "advance(now) -> fired: one reaper pass"},
    {"next_due", (PyCFunction)Core_next_due, METH_NOARGS, "the next wake-up, or inf"},
    {"close", (PyCFunction)Core_close, METH_NOARGS, "drop every pending entry"},
    {NULL},
};

static PyMemberDef Core_members[] = {
    {"armed_when", T_DOUBLE, offsetof(CoreObject, armed_when), 0,
     "when the reaper is armed for (inf: not armed)"},
    {"errors", T_PYSSIZET, offsetof(CoreObject, errors), READONLY, "callbacks that raised"},
    {"fired", T_PYSSIZET, offsetof(CoreObject, fired), READONLY, "callbacks run"},
    {"levels", T_INT, offsetof(CoreObject, nlevels), READONLY, "wheel levels created"},
    {"slab_capacity", T_UINT, offsetof(CoreObject, cap), READONLY, "slots allocated"},
    {NULL},
};

static PySequenceMethods Core_as_sequence = {.sq_length = (lenfunc)Core_len};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "slabwheel.Core",
    .tp_basicsize = sizeof(CoreObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Core_new,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_traverse = (traverseproc)Core_traverse,
    .tp_clear = (inquiry)Core_clear,
    .tp_methods = Core_methods,
    .tp_members = Core_members,
    .tp_as_sequence = &Core_as_sequence,
};

/* ---- tokens and handles --------------------------------------------------- */

/* Handles come from a pool of huge pages of their own (unless PROTO_NO_POOL):
 * a handle is touched at random when cancelled, and in pymalloc's 4 KiB pages
 * that is a page walk too. Freed handles are reused LIFO, so an add after a
 * cancel reuses memory still in cache. The pool only grows (a prototype). */
#ifndef PROTO_NO_POOL
static HandleObject *handle_free_list;
static char *handle_chunk, *handle_chunk_end;

static HandleObject *
handle_alloc(void)
{
    HandleObject *h = handle_free_list;
    if (h != NULL) {
        handle_free_list = *(HandleObject **)h;
    } else {
        if (handle_chunk == handle_chunk_end) {
            handle_chunk = huge_alloc(HUGE_PAGE);
            if (handle_chunk == NULL) {
                PyErr_NoMemory();
                return NULL;
            }
            handle_chunk_end = handle_chunk + HUGE_PAGE / sizeof(HandleObject) * sizeof(HandleObject);
        }
        h = (HandleObject *)handle_chunk;
        handle_chunk += sizeof(HandleObject);
    }
    PyObject_Init((PyObject *)h, &HandleType);
    return h;
}

static void
handle_release(HandleObject *h)
{
    *(HandleObject **)h = handle_free_list;
    handle_free_list = h;
}
#else
static HandleObject *
handle_alloc(void)
{
    return PyObject_New(HandleObject, &HandleType);
}

static void
handle_release(HandleObject *h)
{
    PyObject_Free(h);
}
#endif

static void
Token_dealloc(TokenObject *t)
{
    PyObject_Free(t);
}

static PyTypeObject TokenType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "slabwheel.Token",
    .tp_basicsize = sizeof(TokenObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)Token_dealloc,
};

static void
Handle_dealloc(HandleObject *h)
{
    Py_XDECREF(h->token);
    handle_release(h);
}

static PyObject *
Handle_cancel(HandleObject *h, PyObject *Py_UNUSED(ignored))
{
    CoreObject *c = h->token->core;
    if (c == NULL)
        Py_RETURN_FALSE;
    Slot *s = &c->slots[h->idx];
    if (s->gen != h->gen || s->bucket == FREE_SLOT)
        Py_RETURN_FALSE;
    if (s->bucket != DETACHED)
        unlink_slot(c, h->idx);
    c->count--;
    slab_free(c, h->idx);
    Py_RETURN_TRUE;
}

static PyObject *
Handle_pending(HandleObject *h, PyObject *Py_UNUSED(ignored))
{
    CoreObject *c = h->token->core;
    return PyBool_FromLong(c != NULL && c->slots[h->idx].gen == h->gen &&
                           c->slots[h->idx].bucket != FREE_SLOT);
}

static PyMethodDef Handle_methods[] = {
    {"cancel", (PyCFunction)Handle_cancel, METH_NOARGS, "withdraw; True if this stopped it"},
    {"pending", (PyCFunction)Handle_pending, METH_NOARGS, "still scheduled"},
    {NULL},
};

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "slabwheel.Handle",
    .tp_basicsize = sizeof(HandleObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)Handle_dealloc,
    .tp_methods = Handle_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "slabwheel",
    .m_doc = "Prototype C timer core (bench only).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit_slabwheel(void)
{
    if (PyType_Ready(&TokenType) < 0 || PyType_Ready(&CoreType) < 0 ||
        PyType_Ready(&HandleType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
