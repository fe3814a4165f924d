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

/* Move the entries of watch_list that have not ended to its front, in order; how many
 * there are (the ended ones follow them), or -1 with an exception set. An ended one
 * moves back in the swap, so the list holds the same objects throughout (a permutation)
 * and nothing is released: no Python code runs and no object is freed here. */
static Py_ssize_t
partition(compact_state *st, PyObject *watch_list)
{
    /* Borrowed while the loop runs: every class compared is held by an entry. */
    PyTypeObject *last = st->last;
    Py_ssize_t size = PyList_GET_SIZE(watch_list);
    Py_ssize_t kept = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *op = PyList_GET_ITEM(watch_list, i);
        PyTypeObject *type = Py_TYPE(op);
        if (type != last) {
            if (!PyType_IsSubtype(type, st->base)) {
                PyErr_Format(PyExc_TypeError,
                             "a watch list holds %R, which is not a DelayedOperation", op);
                kept = -1;
                break;
            }
            last = type;
        }
        int ended = has_ended(st, op);
        if (ended < 0) {
            kept = -1;
            break;
        }
        if (!ended) {
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
    return kept;
}

/* Drop the ended operations of watch_list; how many, or -1 with an exception set.
 * Releasing them can run Python code (a finaliser, a weakref callback), which may change
 * this list or others: the list is whole and consistent by then. */
static Py_ssize_t
drop(compact_state *st, PyObject *watch_list)
{
    Py_ssize_t size = PyList_GET_SIZE(watch_list);
    Py_ssize_t kept = partition(st, watch_list);
    if (kept < 0) {
        return -1;
    }
    if (kept < size && PyList_SetSlice(watch_list, kept, size, NULL) < 0) {
        return -1;
    }
    return size - kept;
}

/* The module's state, bound at the first call, for a function called with arg, whose
 * type is right when `right` holds; NULL with an exception set otherwise. */
static compact_state *
ready(PyObject *module, PyObject *arg, int right, const char *wanted)
{
    if (!right) {
        PyErr_Format(PyExc_TypeError, "%s, not %.100s", wanted, Py_TYPE(arg)->tp_name);
        return NULL;
    }
    compact_state *st = state_of(module);
    if (st->base == NULL && bind(st) < 0) {
        return NULL;
    }
    return st;
}

static PyObject *
drop_ended(PyObject *module, PyObject *watch_list)
{
    compact_state *st = ready(module, watch_list, PyList_CheckExact(watch_list),
                              "drop_ended() takes a list");
    if (st == NULL) {
        return NULL;
    }
    Py_ssize_t dropped = drop(st, watch_list);
    return dropped < 0 ? NULL : PyLong_FromSsize_t(dropped);
}

/* Add (key, held) to *out, made on first use; 0, or -1 with an exception set. */
static int
note(PyObject **out, PyObject *key, PyObject *held)
{
    if (*out == NULL && (*out = PyList_New(0)) == NULL) {
        return -1;
    }
    PyObject *pair = PyTuple_Pack(2, key, held);
    if (pair == NULL) {
        return -1;
    }
    int failed = PyList_Append(*out, pair);
    Py_DECREF(pair);
    return failed;
}

/* The sweep's pass over a watch store's lists (see _stale.sweep_lists_in_python, which
 * says the same in Python and is what the pure build runs). Each key's value is
 * visited where it stands: a list compacted, a lone operation tested. The dict is
 * walked with PyDict_Next, which stays safe if a release runs code that changes it; the
 * key and the value are held while either is used. */
static PyObject *
sweep_lists(PyObject *module, PyObject *lists)
{
    compact_state *st = ready(module, lists, PyDict_CheckExact(lists),
                              "sweep_lists() takes a dict");
    if (st == NULL) {
        return NULL;
    }
    Py_ssize_t pos = 0, dropped = 0;
    PyObject *key, *held, *changed = NULL, *dicts = NULL;
    while (PyDict_Next(lists, &pos, &key, &held)) {
        int failed = 0;
        Py_INCREF(key);
        Py_INCREF(held);
        if (PyList_CheckExact(held)) {
            Py_ssize_t gone = drop(st, held);
            if (gone < 0) {
                failed = 1;
            }
            else if (gone) {
                dropped += gone;
                failed = PyList_GET_SIZE(held) < 2 && note(&changed, key, held) < 0;
            }
        }
        else if (PyDict_CheckExact(held)) {
            failed = note(&dicts, key, held) < 0;
        }
        else if (PyType_IsSubtype(Py_TYPE(held), st->base)) {
            int ended = has_ended(st, held);
            if (ended < 0) {
                failed = 1;
            }
            else if (ended) {  /* counted by the caller, which drops it */
                failed = note(&changed, key, held) < 0;
            }
        }
        else {
            PyErr_Format(PyExc_TypeError, "a watch store holds %R under %R", held, key);
            failed = 1;
        }
        Py_DECREF(held);
        Py_DECREF(key);
        if (failed) {
            Py_XDECREF(changed);
            Py_XDECREF(dicts);
            return NULL;
        }
    }
    PyObject *result = Py_BuildValue("(nOO)", dropped, changed ? changed : Py_None,
                                     dicts ? dicts : Py_None);
    Py_XDECREF(changed);
    Py_XDECREF(dicts);
    return result;
}

static PyMethodDef methods[] = {
    {"drop_ended", drop_ended, METH_O,
     PyDoc_STR("drop_ended(watch_list)\n--\n\n"
               "Drop the operations that have ended from watch_list, in place and keeping "
               "the order of the others; how many were dropped.")},
    {"sweep_lists", sweep_lists, METH_O,
     PyDoc_STR("sweep_lists(lists)\n--\n\n"
               "Drop the ended operations from every watch list of a store's lists; "
               "(dropped, changed, dicts): how many entries went, the (key, value) pairs "
               "of lists left with fewer than two operations and of lone operations that "
               "ended (not counted: the caller drops them), and the long lists held as "
               "dicts, for the caller (None for none).")},
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
