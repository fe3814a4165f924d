/*
 * _compact: drop the operations that have ended from a watch list, for the compiled
 * build's purge (purgatory_aio/_stale.py).
 *
 * Entries are removed lazily: a purge visits every entry of every watch list, about
 * five visits per operation in W1 (its three stale entries, and the live entries each
 * purge passes over again). Compiled by mypyc, one visit cost about 76 instructions: a
 * check that the entry is a DelayedOperation, which for a user's subclass walks the
 * class's MRO in PyType_IsSubtype; the state read as a tagged int; the kept entry
 * stored back through a checked list store; and the tail deleted through a slice
 * object. Here one visit is a class comparison, a read of the state word and a swap.
 * The state word is a machine int (mypy_extensions' i64) in the compiled class.
 *
 * The state is read where the compiled class keeps it: the layout mypyc declares in
 * the group header of the same build (hatch_build.py passes its name in
 * PURGATORY_AIO_MYPYC_HEADER and its directory on the include path), so the offset is
 * the compiler's own, never a number written here; a mypyc that renamed the struct or
 * the field fails this build rather than reading the wrong word. Every entry's class
 * is checked to be DelayedOperation or a subclass of it before its state is read (the
 * last class that passed is remembered, so a list of one class checks it once).
 *
 * Compiled into the compiled build only; the pure build runs _stale.drop_ended_in_python,
 * which tests/test_compact.py holds this to on the compiled build.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#ifndef PURGATORY_AIO_MYPYC_HEADER
#error "_compact.c is built by hatch_build.py, which names mypyc's group header"
#endif
#include PURGATORY_AIO_MYPYC_HEADER

#include "_native_slots.h"

typedef purgatory_aio____operation___DelayedOperationObject OperationObject;

/* The state word is declared i64 (_operation.py): a machine int here. A build where it
 * is anything else stops here rather than read it as one. */
_Static_assert(_Generic(((OperationObject *)0)->__state, int64_t: 1, default: 0),
               "DelayedOperation._state must be an i64 field in the compiled class");

/* DelayedOperation and the ENDED bits, looked up at the first call (the modules that
 * define them import this one's chooser, so not at import), and the last class
 * checked. Strong references: a class compared by address stays alive while it is
 * remembered, so no other class can take its address meanwhile. */
typedef struct {
    PyTypeObject *base;
    PyTypeObject *last;
    int64_t ended;
} compact_state;

static compact_state *
state_of(PyObject *module)
{
    return (compact_state *)PyModule_GetState(module);
}

static int
bind(compact_state *st)
{
    PyObject *module = PyImport_ImportModule("purgatory_aio._operation");
    if (module == NULL) {
        return -1;
    }
    PyObject *base = PyObject_GetAttrString(module, "DelayedOperation");
    Py_DECREF(module);
    if (base == NULL) {
        return -1;
    }
    if (!PyType_Check(base)
        || ((PyTypeObject *)base)->tp_basicsize < (Py_ssize_t)sizeof(OperationObject)) {
        PyErr_Format(PyExc_RuntimeError,
                     "purgatory_aio._compact was built for another layout of "
                     "DelayedOperation than %R has: reinstall purgatory-aio", base);
        Py_DECREF(base);
        return -1;
    }
    module = PyImport_ImportModule("purgatory_aio._states");
    if (module == NULL) {
        Py_DECREF(base);
        return -1;
    }
    PyObject *ended = PyObject_GetAttrString(module, "ENDED");
    Py_DECREF(module);
    Py_ssize_t bits = ended == NULL ? -1 : PyLong_AsSsize_t(ended);
    Py_XDECREF(ended);
    if (bits <= 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "purgatory_aio._states.ENDED is not a bit mask");
        }
        Py_DECREF(base);
        return -1;
    }
    st->ended = bits;
    st->base = (PyTypeObject *)base;
    return 0;
}

/* The value mypyc keeps in a machine-int field that was never set (its "undefined"
 * marker, with a bit of the object's bitmap clear): no state is negative. */
#define UNSET_STATE ((int64_t)-113)

/* 1 if op has ended, 0 if not, -1 with an exception set. */
static int
has_ended(compact_state *st, PyObject *op)
{
    int64_t state = ((OperationObject *)op)->__state;
    if (state < 0) {
        PyErr_Format(PyExc_TypeError,
                     "%R in a watch list has no state%s", op,
                     state == UNSET_STATE
                         ? ": its __init__ did not call super().__init__(timeout)"
                         : "");
        return -1;
    }
    return (state & st->ended) != 0;
}

static PyObject *
drop_ended(PyObject *module, PyObject *watch_list)
{
    if (!PyList_CheckExact(watch_list)) {
        return PyErr_Format(PyExc_TypeError, "drop_ended() takes a list, not %.100s",
                            Py_TYPE(watch_list)->tp_name);
    }
    compact_state *st = state_of(module);
    if (st->base == NULL && bind(st) < 0) {
        return NULL;
    }
    /* Borrowed while the loop runs: every class compared is held by an entry of the
     * list, and nothing in the loop runs Python code or frees an object. */
    PyTypeObject *last = st->last;
    Py_ssize_t size = PyList_GET_SIZE(watch_list);
    Py_ssize_t kept = 0;
    int failed = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *op = PyList_GET_ITEM(watch_list, i);
        PyTypeObject *type = Py_TYPE(op);
        if (type != last) {
            if (!PyType_IsSubtype(type, st->base)) {
                PyErr_Format(PyExc_TypeError,
                             "a watch list holds %R, which is not a DelayedOperation", op);
                failed = 1;
                break;
            }
            last = type;
        }
        int ended = has_ended(st, op);
        if (ended < 0) {
            failed = 1;
            break;
        }
        if (!ended) {
            /* Kept entries move to the front in order; an ended one moves back in the
             * swap, so the list holds the same objects throughout (a permutation), and
             * the slice deletion below releases the ended ones. */
            if (kept != i) {
                PyList_SET_ITEM(watch_list, i, PyList_GET_ITEM(watch_list, kept));
                PyList_SET_ITEM(watch_list, kept, op);
            }
            kept++;
        }
    }
    if (last != st->last) {
        Py_INCREF(last);
        Py_XSETREF(st->last, last);
    }
    if (failed) {
        return NULL;
    }
    /* Releasing an ended operation can run Python code (a finaliser, a weakref
     * callback); the list is whole and consistent by then. */
    if (kept < size && PyList_SetSlice(watch_list, kept, size, NULL) < 0) {
        return NULL;
    }
    return PyLong_FromSsize_t(size - kept);
}

static PyMethodDef methods[] = {
    {"drop_ended", drop_ended, METH_O,
     PyDoc_STR("drop_ended(watch_list)\n--\n\n"
               "Drop the operations that have ended from watch_list, in place and keeping "
               "the order of the others; how many were dropped.")},
    {NULL, NULL, 0, NULL},
};

static int
traverse_module(PyObject *module, visitproc visit, void *arg)
{
    compact_state *st = state_of(module);
    if (st != NULL) {
        Py_VISIT(st->base);
        Py_VISIT(st->last);
    }
    return 0;
}

static int
clear_module(PyObject *module)
{
    compact_state *st = state_of(module);
    if (st != NULL) {
        Py_CLEAR(st->base);
        Py_CLEAR(st->last);
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
    PURGATORY_AIO_NATIVE_SLOTS,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "purgatory_aio._compact",
    .m_doc = "Ended operations out of a watch list, for the purge (compiled build).",
    .m_size = sizeof(compact_state),
    .m_methods = methods,
    .m_slots = slots,
    .m_traverse = traverse_module,
    .m_clear = clear_module,
    .m_free = free_module,
};

PyMODINIT_FUNC
PyInit__compact(void)
{
    return PyModuleDef_Init(&module_def);
}
