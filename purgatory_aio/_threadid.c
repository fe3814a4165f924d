/*
 * _threadid: threading.get_ident() for the compiled core's hot path, without a new int
 * object per call.
 *
 * Every admission and every completion asks whether it runs on its purgatory's loop
 * thread. threading.get_ident() answers with a fresh int each time: a thread's ident is
 * a pthread_t, an address too large for the interpreter's small ints, so each call
 * allocates an int and the comparison frees it. get_ident() here returns the same value
 * as the same int object for as long as the calling thread is the one last seen: the
 * allocation and the free are gone (W1-cost, compiled, asyncio: see docs/benchmarks.md).
 * A thread that asks after another gets a new object of its own value; an ident that
 * a later thread reuses is the same value, so the answer stays threading.get_ident()'s.
 *
 * Compiled into the compiled build only, beside the mypyc modules (hatch_build.py); the
 * pure build calls threading.get_ident itself.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "pythread.h"

#include "_native_slots.h"

/* The last thread that asked, and its ident as an int (a strong reference). */
typedef struct {
    unsigned long ident;
    PyObject *as_int;
} threadid_state;

static PyObject *
get_ident(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    threadid_state *st = (threadid_state *)PyModule_GetState(module);
    unsigned long ident = PyThread_get_thread_ident();
    if (st->as_int == NULL || st->ident != ident) {
        PyObject *as_int = PyLong_FromUnsignedLong(ident);
        if (as_int == NULL) {
            return NULL;
        }
        Py_XSETREF(st->as_int, as_int);
        st->ident = ident;
    }
    return Py_NewRef(st->as_int);
}

static PyMethodDef methods[] = {
    {"get_ident", get_ident, METH_NOARGS,
     PyDoc_STR("get_ident()\n--\n\n"
               "threading.get_ident(): the calling thread's identifier, as the same int "
               "object while the same thread asks again.")},
    {NULL, NULL, 0, NULL},
};

static int
clear_module(PyObject *module)
{
    threadid_state *st = (threadid_state *)PyModule_GetState(module);
    if (st != NULL) {
        Py_CLEAR(st->as_int);
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
    .m_name = "purgatory_aio._threadid",
    .m_doc = "threading.get_ident() without a new int per call (compiled build).",
    .m_size = sizeof(threadid_state),
    .m_methods = methods,
    .m_slots = slots,
    .m_clear = clear_module,
    .m_free = free_module,
};

PyMODINIT_FUNC
PyInit__threadid(void)
{
    return PyModuleDef_Init(&module_def);
}
