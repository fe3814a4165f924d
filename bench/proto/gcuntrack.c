/*
 * gcuntrack: the prototype behind `python -m bench proto-gc` (issue 12).
 *
 * CPython's cyclic collector visits every tracked container it holds. A pending
 * operation lives long enough to reach the oldest generation, so each one is
 * traversed again by every full collection while it waits, and so is its
 * instance dict (a separate object for subclasses of the compiled core). These
 * two functions let the benchmark take a pending operation and its dict out of
 * the collector's lists and put them back when the operation settles, to
 * measure what that would save before the library commits to it. Nothing in
 * purgatory_aio uses them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *
gc_untrack(PyObject *module, PyObject *obj)
{
    if (PyObject_IS_GC(obj) && PyObject_GC_IsTracked(obj)) {
        PyObject_GC_UnTrack(obj);
    }
    Py_RETURN_NONE;
}

static PyObject *
gc_track(PyObject *module, PyObject *obj)
{
    /* Tracking an object twice aborts the interpreter: only if it is not tracked. */
    if (PyObject_IS_GC(obj) && !PyObject_GC_IsTracked(obj)) {
        PyObject_GC_Track(obj);
    }
    Py_RETURN_NONE;
}

static PyMethodDef gcuntrack_methods[] = {
    {"untrack", gc_untrack, METH_O, "Take obj out of the cyclic collector's lists."},
    {"track", gc_track, METH_O, "Put obj back into the cyclic collector's lists."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef gcuntrack_module = {
    PyModuleDef_HEAD_INIT, "gcuntrack", "GC untracking for the proto-gc benchmark.", -1,
    gcuntrack_methods,
};

PyMODINIT_FUNC
PyInit_gcuntrack(void)
{
    return PyModule_Create(&gcuntrack_module);
}
