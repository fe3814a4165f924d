/*
 * Prototype: the timer core as a hand-written C extension, measured by W3.
 *
 * Not part of the library. `python -m bench proto-timer` compiles it into
 * build/proto/ and measures it with W3's own drivers beside purgatory_aio.Timer
 * (compiled with mypyc) and loop.call_later, to decide whether the wheel should
 * move to C before committing to it.
 *
 * What differs from the mypyc Timer, and what each difference bought, in net ns
 * per add+cancel at 1M pending (W3's driver, 400k pairs, compiled Timer beside it,
 * 2-core Xeon VM, 2026-11-24; the whole prototype: 315-320 ns on both loops,
 * against the mypyc Timer's 819-827 in the same runs):
 *
 * - The handle returned to Python is the list node itself: a bucket is an
 *   intrusive doubly linked list of handles, not a dict. Cancelling touches the
 *   handle (which the caller touches anyway) and stores into its two
 *   neighbours; a dict delete also loads the hash index and the entry array,
 *   each a cache miss once a million entries are pending. An earlier version
 *   kept entries in a slab of 40-byte slots with a separate handle object, one
 *   more dependent miss per cancel: 414-552 ns where this design gives 295.
 * - Handles are not tracked by the garbage collector: freeing one does not
 *   unlink it from the GC's list (two more misses in the mypyc build). While a
 *   handle is pending the core owns it and its traverse visits what the handle
 *   holds, so cycles through a pending callback are still found; a fired or
 *   cancelled handle holds no references at all.
 * - A handle is 64 bytes, one cache line (the callback and its arguments share
 *   one field): 72-byte handles straddled lines, 342-346 ns against 295.
 * - Handles come from a pool of 2 MiB transparent huge pages, reused LIFO: a
 *   random access costs a cache miss without a page walk, and an add after a
 *   cancel reuses memory still in cache. Built with -DPROTO_NO_POOL
 *   -DPROTO_NO_HUGE (pymalloc, 4 KiB pages): 342-346 ns against 294-295.
 *
 * What is left at 1M is memory latency: a random load here costs 65-75 ns at
 * 64 MB and 155-175 ns at 256 MB (pointer chase), and a cancel needs the handle
 * plus its two neighbours.
 *
 * The wheel follows purgatory_aio.Timer: ticks are ceil(deadline / tick),
 * level k slots are wheel_size**k ticks wide, higher levels are created on
 * demand, buckets enter a binary heap of due ticks once per rotation, a bucket
 * is due from the earliest deadline placed in it, entries fire in deadline
 * order (insertion order at equal deadlines), never before their deadline,
 * and a level-0 bucket fires at most once per pass (an entry a callback adds
 * already due waits for a later pass). Left out (a prototype): chunked
 * cascades, ManualClock integration, rescheduling, close() from a callback,
 * KeyboardInterrupt handling (a callback's error is reported as unraisable and
 * counted).
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

#define IN_NO_BUCKET (-1) /* fired, cancelled or dropped */
#define DETACHED (-2)     /* taken out of its bucket by the pass firing it */
#define MAX_LEVELS 16
#define MAX_TICKS 9007199254740992.0 /* 2**53 */

typedef struct CoreObject CoreObject;

typedef struct HandleObject {
    PyObject_HEAD
    struct HandleObject *prev, *next;
    CoreObject *core; /* borrowed; set while pending, the core owning a reference */
    double deadline;
    PyObject *call;  /* the callback, or (callback, *args); NULL once not pending */
    int32_t bucket;  /* bucket id, IN_NO_BUCKET or DETACHED */
    int32_t packed;  /* call is a tuple (callback, *args) */
} HandleObject; /* 64 bytes: one cache line per handle in the pool */

typedef struct {
    HandleObject *head, *tail;
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

struct CoreObject {
    PyObject_HEAD
    double tick, per_tick, horizon;
    uint32_t size;
    int nlevels;
    int64_t current[MAX_LEVELS];
    int64_t ltick[MAX_LEVELS];
    Bucket *buckets; /* MAX_LEVELS * size */
    HeapItem *heap;
    size_t hlen, hcap;
    Py_ssize_t count;
    PyObject *clock;     /* callable() -> float */
    PyObject *on_sooner; /* callable(when): something is due before armed_when */
    double armed_when;
    int firing;
    Py_ssize_t errors, fired;
    uint8_t *fired_now; /* level-0 buckets fired in the current pass */
};

static PyTypeObject CoreType, HandleType;

/* ---- memory ------------------------------------------------------------- */

#define HUGE_PAGE ((size_t)2 << 20)

/* 2 MiB of memory in transparent huge pages where the kernel allows them
 * (Linux, THP in "madvise" mode as on these machines). */
static void *
huge_chunk(void)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE) && !defined(PROTO_NO_HUGE)
    char *raw = mmap(NULL, 2 * HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    char *start = (char *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (start > raw)
        munmap(raw, (size_t)(start - raw));
    if (raw + HUGE_PAGE > start)
        munmap(start + HUGE_PAGE, (size_t)(raw + HUGE_PAGE - start));
    madvise(start, HUGE_PAGE, MADV_HUGEPAGE);
    return start;
#else
    return PyMem_Malloc(HUGE_PAGE);
#endif
}

/* The handle pool: carved from huge chunks, freed handles reused LIFO. It only
 * grows (a prototype); unless PROTO_NO_POOL, when handles use pymalloc. */
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
            if ((handle_chunk = huge_chunk()) == NULL) {
                handle_chunk_end = NULL;
                PyErr_NoMemory();
                return NULL;
            }
            handle_chunk_end =
                handle_chunk + HUGE_PAGE / sizeof(HandleObject) * sizeof(HandleObject);
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

/* No longer pending: drop what it holds (last, as that may run arbitrary code). */
static void
handle_settle(HandleObject *h)
{
    PyObject *call = h->call;
    h->call = NULL;
    h->core = NULL;
    h->bucket = IN_NO_BUCKET;
    Py_XDECREF(call);
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
into(CoreObject *c, uint32_t b, HandleObject *h, int64_t expiration)
{
    Bucket *bk = &c->buckets[b];
    double deadline = h->deadline;
    h->bucket = (int32_t)b;
    h->next = NULL;
    h->prev = bk->tail;
    if (bk->tail == NULL)
        bk->head = h;
    else
        bk->tail->next = h;
    bk->tail = h;
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
place(CoreObject *c, HandleObject *h, int64_t not_before)
{
    double scaled = h->deadline * c->per_tick;
    int64_t t = (int64_t)scaled;
    if ((double)t < scaled)
        t++;
    if (t < not_before)
        t = not_before;
    uint32_t size = c->size;
    if (t < c->current[0] + (int64_t)size) {
        if (t < c->current[0])
            t = c->current[0];
        return into(c, (uint32_t)(t % size), h, t);
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
            return into(c, (uint32_t)(k * size + slot % size), h, slot * width);
        }
    }
}

static void
unlink_handle(CoreObject *c, HandleObject *h)
{
    Bucket *bk = &c->buckets[h->bucket];
    if (h->prev == NULL)
        bk->head = h->next;
    else
        h->prev->next = h->next;
    if (h->next == NULL)
        bk->tail = h->prev;
    else
        h->next->prev = h->prev;
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

/* Take a bucket's list out: a new array of its handles (owning the core's
 * references), in insertion order, each marked DETACHED. */
static HandleObject **
detach(CoreObject *c, uint32_t b, Py_ssize_t *n)
{
    Bucket *bk = &c->buckets[b];
    HandleObject **batch = PyMem_Malloc(((size_t)bk->count + 1) * sizeof(HandleObject *));
    if (batch == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    Py_ssize_t i = 0;
    for (HandleObject *h = bk->head; h != NULL; h = h->next) {
        h->bucket = DETACHED;
        batch[i++] = h;
    }
    bk->head = bk->tail = NULL;
    bk->count = 0;
    *n = i;
    return batch;
}

/* Stable merge sort by deadline. */
static void
sort_batch(HandleObject **batch, HandleObject **tmp, size_t n)
{
    if (n < 2)
        return;
    size_t mid = n / 2, i = 0, j = mid, k = 0;
    sort_batch(batch, tmp, mid);
    sort_batch(batch + mid, tmp, n - mid);
    while (i < mid && j < n)
        tmp[k++] = batch[j]->deadline < batch[i]->deadline ? batch[j++] : batch[i++];
    while (i < mid)
        tmp[k++] = batch[i++];
    while (j < n)
        tmp[k++] = batch[j++];
    memcpy(batch, tmp, n * sizeof(HandleObject *));
}

static int
fire_bucket(CoreObject *c, uint32_t b, int64_t expiration, double now)
{
    Py_ssize_t n;
    HandleObject **batch = detach(c, b, &n);
    if (batch == NULL)
        return -1;
    HandleObject **tmp = PyMem_Malloc(((size_t)n + 1) * sizeof(HandleObject *));
    if (tmp == NULL) {
        PyMem_Free(batch);
        PyErr_NoMemory();
        return -1;
    }
    sort_batch(batch, tmp, (size_t)n);
    PyMem_Free(tmp);
    for (Py_ssize_t i = 0; i < n; i++) {
        HandleObject *h = batch[i]; /* the core's reference, now the batch's */
        if (h->bucket != DETACHED) {
            /* cancelled by an earlier callback of this batch: nothing to do */
        } else if (h->deadline <= now) {
            PyObject *call = h->call;
            int packed = h->packed;
            h->call = NULL;
            handle_settle(h);
            c->count--;
            c->fired++;
            PyObject *r;
            if (packed) {
                PyObject **items = &PyTuple_GET_ITEM(call, 0);
                r = PyObject_Vectorcall(items[0], items + 1, PyTuple_GET_SIZE(call) - 1, NULL);
            } else {
                r = PyObject_CallNoArgs(call);
            }
            if (r == NULL) {
                c->errors++;
                PyErr_WriteUnraisable(packed ? PyTuple_GET_ITEM(call, 0) : call);
            } else {
                Py_DECREF(r);
            }
            Py_DECREF(call);
        } else {
            /* Later in this tick (or a hair early through float rounding): back in,
             * the batch's reference becoming the bucket's again. */
            int64_t at = (double)expiration * c->tick > now ? expiration : expiration + 1;
            if (place(c, h, at) == 0)
                continue;
            /* Out of memory: reported and counted; an entry left unplaced is dropped. */
            c->errors++;
            PyErr_WriteUnraisable(NULL);
            if (h->bucket != DETACHED)
                continue;
            c->count--;
            handle_settle(h);
        }
        Py_DECREF(h);
    }
    PyMem_Free(batch);
    return 0;
}

static int
cascade(CoreObject *c, uint32_t b, int64_t expiration)
{
    Py_ssize_t n;
    HandleObject **batch = detach(c, b, &n);
    if (batch == NULL)
        return -1;
    int status = 0;
    for (Py_ssize_t i = 0; i < n; i++) /* no Python code runs: firing is set */
        if (place(c, batch[i], expiration) < 0)
            status = -1;
    PyMem_Free(batch);
    return status;
}

/* Every pending handle leaves, without running (close, and the GC's clear). */
static void
drop_all(CoreObject *c)
{
    for (uint32_t b = 0; b < MAX_LEVELS * c->size; b++) {
        Bucket *bk = &c->buckets[b];
        HandleObject *h = bk->head;
        bk->head = bk->tail = NULL;
        bk->count = 0;
        bk->expiration = -1;
        while (h != NULL) {
            HandleObject *next = h->next;
            handle_settle(h);
            Py_DECREF(h);
            h = next;
        }
    }
    c->hlen = 0;
    c->count = 0;
}

/* ---- the core object ------------------------------------------------- */

/* The clock's reading in seconds, or -1 with an exception set. */
static int
read_clock(PyObject *clock, double *now)
{
    PyObject *reading = PyObject_CallNoArgs(clock);
    if (reading == NULL)
        return -1;
    *now = PyFloat_AsDouble(reading);
    Py_DECREF(reading);
    return *now == -1.0 && PyErr_Occurred() ? -1 : 0;
}

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
    double now;
    if (read_clock(clock, &now) < 0)
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
    c->armed_when = INFINITY;
    c->buckets = PyMem_Calloc((size_t)MAX_LEVELS * size, sizeof(Bucket));
    c->fired_now = PyMem_Calloc(size, 1);
    if (c->buckets == NULL || c->fired_now == NULL) {
        Py_DECREF(c);
        return PyErr_NoMemory();
    }
    for (uint32_t i = 0; i < MAX_LEVELS * size; i++) {
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
    if (c->buckets == NULL)
        return 0;
    /* The pending handles are the core's (untracked) parts: what they hold is
     * what the core holds. */
    for (uint32_t b = 0; b < MAX_LEVELS * c->size; b++) {
        for (HandleObject *h = c->buckets[b].head; h != NULL; h = h->next) {
            Py_VISIT(h->call);
        }
    }
    return 0;
}

static int
Core_clear(CoreObject *c)
{
    if (c->buckets != NULL)
        drop_all(c);
    Py_CLEAR(c->clock);
    Py_CLEAR(c->on_sooner);
    return 0;
}

static void
Core_dealloc(CoreObject *c)
{
    PyObject_GC_UnTrack(c);
    Core_clear(c);
    PyMem_Free(c->buckets);
    PyMem_Free(c->heap);
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
    double now;
    if (read_clock(c->clock, &now) < 0)
        return NULL;
    double deadline = now + delay;
    if (deadline >= c->horizon) {
        PyErr_Format(PyExc_ValueError, "delay %R is beyond what this timer can place", args[0]);
        return NULL;
    }
    PyObject *call;
    if (nargs > 2) {
        if ((call = PyTuple_New(nargs - 1)) == NULL)
            return NULL;
        for (Py_ssize_t i = 1; i < nargs; i++) {
            Py_INCREF(args[i]);
            PyTuple_SET_ITEM(call, i - 1, args[i]);
        }
    } else {
        call = Py_NewRef(args[1]);
    }
    HandleObject *h = handle_alloc();
    if (h == NULL) {
        Py_DECREF(call);
        return NULL;
    }
    h->core = c;
    h->deadline = deadline;
    h->call = call;
    h->packed = nargs > 2;
    Py_INCREF(h); /* the bucket's reference */
    c->count++;
    if (place(c, h, INT64_MIN) < 0) {
        /* Only on_sooner raising gets here; the entry is placed and stays. */
        PyErr_WriteUnraisable(c->on_sooner);
    }
    return (PyObject *)h;
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
            break; /* added already due by a callback of this pass: the next pass */
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
    int64_t now_tick = (int64_t)floor(now / c->tick);
    if (status == 0 && (c->hlen == 0 || c->heap[0].expiration > now_tick))
        advance_levels(c, now_tick);
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

static PyObject *
Core_close(CoreObject *c, PyObject *Py_UNUSED(ignored))
{
    drop_all(c);
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
    {NULL},
};

static PySequenceMethods Core_as_sequence = {.sq_length = (lenfunc)Core_len};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cwheel.Core",
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

/* ---- handles ------------------------------------------------------------- */

static void
Handle_dealloc(HandleObject *h)
{
    /* Never pending here: a pending handle is referenced by its core. */
    handle_release(h);
}

static PyObject *
Handle_cancel(HandleObject *h, PyObject *Py_UNUSED(ignored))
{
    CoreObject *c = h->core;
    if (c == NULL)
        Py_RETURN_FALSE;
    c->count--;
    if (h->bucket == DETACHED) {
        /* In a batch being fired: the batch holds the reference and skips it. */
        handle_settle(h);
        Py_RETURN_TRUE;
    }
    unlink_handle(c, h);
    handle_settle(h);
    Py_DECREF(h); /* the bucket's reference; the caller still holds one */
    Py_RETURN_TRUE;
}

static PyObject *
Handle_pending(HandleObject *h, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(h->core != NULL);
}

static PyObject *
Handle_when(HandleObject *h, PyObject *Py_UNUSED(ignored))
{
    return PyFloat_FromDouble(h->deadline);
}

static PyMethodDef Handle_methods[] = {
    {"cancel", (PyCFunction)Handle_cancel, METH_NOARGS, "withdraw; True if this stopped it"},
    {"pending", (PyCFunction)Handle_pending, METH_NOARGS, "still scheduled"},
    {"when", (PyCFunction)Handle_when, METH_NOARGS, "the deadline, on the core's clock"},
    {NULL},
};

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cwheel.Handle",
    .tp_basicsize = sizeof(HandleObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)Handle_dealloc,
    .tp_methods = Handle_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cwheel",
    .m_doc = "Prototype C timer core (bench only).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit_cwheel(void)
{
    if (PyType_Ready(&CoreType) < 0 || PyType_Ready(&HandleType) < 0)
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
