/*
 * _untrack: take a pending operation out of CPython's cyclic garbage collector,
 * and put it back when it settles.
 *
 * The collector's full collections visit every tracked container. A purgatory's
 * pending operation lives long enough to reach the oldest generation, so each
 * one is visited again by every full collection while it waits: with 500,000
 * parked, each full collection stopped the loop for 0.35-0.7 s. A pending
 * operation is held by its purgatory's timer (a strong reference) until it
 * settles, so the collector has nothing to find there: an untracked container
 * is simply not traversed, and what it references counts as reachable. The
 * library untracks an operation (and its instance dict, a separate object for
 * subclasses of the compiled core) once it is pending in the timer, and tracks
 * them again when it settles, so a cycle through a settled operation is
 * collected as usual.
 *
 * Compiled into the compiled build only, beside the mypyc modules
 * (hatch_build.py); the pure build keeps every object tracked.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_native_slots.h"

/* Documented API only (one named exception on 3.12, below), and no look into the layout
 * of an object the interpreter manages (its instance dict in particular): the same
 * source serves 3.11, 3.12 and 3.13, whatever each does with instance dicts. */

/* The module's state: the interned name of the opt-out class attribute, and a
 * one-entry cache of its value for the last class seen (the hot path admits operations
 * of one class after another; tp_version_tag changes whenever the class or a base
 * changes, and is 0 when the interpreter keeps no valid tag). */
typedef struct {
    PyObject *opt_out_name;
    PyTypeObject *cached_type;
    unsigned int cached_tag;
    int cached_opted_out;
} untrack_state;

static untrack_state *
state_of(PyObject *module)
{
    return (untrack_state *)PyModule_GetState(module);
}

/* 1 if op's class sets untrack_while_pending = False, 0 if not, -1 on error. */
static int
opted_out(untrack_state *st, PyTypeObject *type)
{
    unsigned int tag = type->tp_version_tag;
    if (tag != 0 && type == st->cached_type && tag == st->cached_tag) {
        return st->cached_opted_out;
    }
    PyObject *flag = PyObject_GetAttr((PyObject *)type, st->opt_out_name);
    if (flag == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear();
    }
    int result = flag == Py_False;
    Py_XDECREF(flag);
    /* A borrowed pointer compared only, never dereferenced: a freed class whose address
     * is reused has another version tag. */
    st->cached_type = type;
    st->cached_tag = type->tp_version_tag;
    st->cached_opted_out = result;
    return result;
}

/* Visits the instance dict an interpreter manages itself (Py_TPFLAGS_MANAGED_DICT: 3.12
 * and later), without creating one: 3.13 documents PyObject_VisitManagedDict for this;
 * 3.12 exports the same function under its earlier name, which 3.13 made public
 * unchanged (3.12 has no free-threaded build, where the name would matter). */
#if PY_VERSION_HEX >= 0x030D0000
#define VISIT_MANAGED_DICT PyObject_VisitManagedDict
#elif PY_VERSION_HEX >= 0x030C0000
#define VISIT_MANAGED_DICT _PyObject_VisitManagedDict
#endif

#ifdef VISIT_MANAGED_DICT
typedef struct {
    PyObject *last;
    int count;
} dict_probe;

static int
probe_visit(PyObject *obj, void *arg)
{
    dict_probe *probe = (dict_probe *)arg;
    probe->last = obj;
    probe->count++;
    return 0;
}
#endif

/* The instance dict of obj (borrowed), or NULL when it has none. Never creates one.
 *
 * A class that keeps the dict at a fixed offset (3.11 for subclasses of compiled
 * classes) has it there. Where the interpreter manages the dict (3.12 and later), the
 * visit finds the dict if one exists; a class whose instances keep their attributes
 * inline (3.13's Py_TPFLAGS_INLINE_VALUES, never a subclass of a compiled class, which
 * has fields of its own) has no separate dict to tell apart from its values, and is
 * left alone: tracked, which is safe, only not optimal. */
static PyObject *
instance_dict(PyObject *obj)
{
    PyTypeObject *type = Py_TYPE(obj);
#ifdef VISIT_MANAGED_DICT
    if (type->tp_flags & Py_TPFLAGS_MANAGED_DICT) {
#ifdef Py_TPFLAGS_INLINE_VALUES
        if (type->tp_flags & Py_TPFLAGS_INLINE_VALUES) {
            return NULL;
        }
#endif
        dict_probe probe = {NULL, 0};
        (void)VISIT_MANAGED_DICT(obj, probe_visit, &probe);
        return probe.count == 1 && PyDict_CheckExact(probe.last) ? probe.last : NULL;
    }
#endif
    Py_ssize_t offset = type->tp_dictoffset;
    if (offset <= 0) {
        return NULL;
    }
    return *(PyObject **)((char *)obj + offset);
}

static PyObject *
untrack(PyObject *module, PyObject *op)
{
    if (!PyObject_IS_GC(op) || !PyObject_GC_IsTracked(op)) {
        Py_RETURN_FALSE;
    }
    int out = opted_out(state_of(module), Py_TYPE(op));
    if (out < 0) {
        return NULL;
    }
    if (out) {
        Py_RETURN_FALSE;
    }
    PyObject_GC_UnTrack(op);
    PyObject *dict = instance_dict(op);
    if (dict != NULL && PyObject_GC_IsTracked(dict)) {
        PyObject_GC_UnTrack(dict);
    }
    Py_RETURN_TRUE;
}

/* Tracking an object twice aborts the interpreter: each one only if untracked. */
static void
track_one(PyObject *obj)
{
    if (obj != NULL && PyObject_IS_GC(obj) && !PyObject_GC_IsTracked(obj)) {
        PyObject_GC_Track(obj);
    }
}

static PyObject *
track(PyObject *module, PyObject *op)
{
    if (!PyObject_IS_GC(op) || PyObject_GC_IsTracked(op)) {
        /* Never untracked (or tracked again already): its dict was left alone too,
         * and no dict is made for it here. */
        Py_RETURN_NONE;
    }
    PyObject_GC_Track(op);
    track_one(instance_dict(op));
    Py_RETURN_NONE;
}

static PyObject *
untrack_container(PyObject *module, PyObject *obj)
{
    if (PyObject_IS_GC(obj) && PyObject_GC_IsTracked(obj)) {
        PyObject_GC_UnTrack(obj);
    }
    Py_RETURN_NONE;
}

static PyObject *
track_container(PyObject *module, PyObject *obj)
{
    track_one(obj);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"untrack", untrack, METH_O,
     "untrack(op) -> bool: take op and its instance dict out of the cyclic GC, unless op's "
     "class sets untrack_while_pending = False or op is untracked already; True if it did."},
    {"track", track, METH_O, "track(op): put op and its instance dict back into the cyclic GC."},
    {"untrack_container", untrack_container, METH_O,
     "untrack_container(obj): take one container of the library's out of the cyclic GC."},
    {"track_container", track_container, METH_O,
     "track_container(obj): put one container back into the cyclic GC."},
    {NULL, NULL, 0, NULL},
};

static int
exec_module(PyObject *module)
{
    untrack_state *st = state_of(module);
    st->opt_out_name = PyUnicode_InternFromString("untrack_while_pending");
    st->cached_type = NULL;
    st->cached_tag = 0;
    st->cached_opted_out = 0;
    return st->opt_out_name == NULL ? -1 : 0;
}

static int
traverse_module(PyObject *module, visitproc visit, void *arg)
{
    untrack_state *st = state_of(module);
    if (st != NULL) {
        Py_VISIT(st->opt_out_name);
    }
    return 0;
}

static int
clear_module(PyObject *module)
{
    untrack_state *st = state_of(module);
    if (st != NULL) {
        Py_CLEAR(st->opt_out_name);
        st->cached_type = NULL;
    }
    return 0;
}

static void
free_module(void *module)
{
    clear_module((PyObject *)module);
}

/* Multi-phase initialisation; no subinterpreters, the GIL needed (_native_slots.h). */
static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    PURGATORY_AIO_NATIVE_SLOTS,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "purgatory_aio._untrack",
    .m_doc = "Pending operations out of the cyclic garbage collector (compiled build).",
    .m_size = sizeof(untrack_state),
    .m_methods = methods,
    .m_slots = slots,
    .m_traverse = traverse_module,
    .m_clear = clear_module,
    .m_free = free_module,
};

PyMODINIT_FUNC
PyInit__untrack(void)
{
    return PyModuleDef_Init(&module_def);
}
