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

/* The class attribute that keeps a class's operations tracked when False. */
static PyObject *opt_out_name;

/* The instance dict of obj, if its type keeps one in a slot and it exists (never
 * materialises one). Types with an inline ("managed") dict have none until it is
 * asked for; one asked for stays tracked, which is safe, only not optimal. */
static PyObject *
instance_dict(PyObject *obj)
{
    Py_ssize_t offset = Py_TYPE(obj)->tp_dictoffset;
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
    /* A borrowed reference from the type's method cache, no error set when absent. */
    PyObject *flag = _PyType_Lookup(Py_TYPE(op), opt_out_name);
    if (flag == Py_False) {
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
    track_one(op);
    if (PyObject_IS_GC(op)) {
        track_one(instance_dict(op));
    }
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

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "purgatory_aio._untrack",
    "Pending operations out of the cyclic garbage collector (compiled build).", -1, methods,
};

PyMODINIT_FUNC
PyInit__untrack(void)
{
    opt_out_name = PyUnicode_InternFromString("untrack_while_pending");
    if (opt_out_name == NULL) {
        return NULL;
    }
    return PyModule_Create(&module_def);
}
