/*
 * _initsig: give a compiled class's __init__ the signature help() shows.
 *
 * A class whose instances a C function initialises (mypyc's tp_init) has, as its
 * __init__, the interpreter's slot wrapper of that function, documented by the
 * interpreter for every class alike: help(DelayedOperation.__init__) and
 * inspect.signature read "(self, /, *args, **kwargs)". This module puts in its place a
 * slot wrapper of the same C function whose documentation is the real text signature
 * ("__init__($self, timeout)\n--\n\n" and the source's docstring). It stays a slot
 * wrapper of that function on purpose: CPython then keeps calling the C function
 * directly, for the class and for every subclass that inherits its __init__. A method
 * in its place (what mypyc lists, hidden behind the slot wrapper) would make each such
 * subclass look __init__ up and call it on every construction: a subclass without an
 * __init__ of its own took 591 and 451 ns to construct that way against 186 and 316
 * (bench/opshape.py's UserNoInit shape, timeit, compiled, CPython 3.11, two alternated
 * runs on a busy 2-core machine); with this module it keeps the C function itself.
 *
 * Compiled into the compiled build only (hatch_build.py); _native.restore_docs calls it
 * at import. The copy of the interpreter's slot description and the text live as long
 * as the process: a class, once given them, holds them until it ends.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "_native_slots.h"

static PyObject *
show_init_signature(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !PyType_Check(args[0]) || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "show_init_signature(cls, doc): cls a class, doc a str");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)args[0];
    if (!PyType_HasFeature(type, Py_TPFLAGS_HEAPTYPE)) {
        PyErr_Format(PyExc_TypeError, "%s is a static type: its __init__ stays as it is",
                     type->tp_name);
        return NULL;
    }
    Py_ssize_t size;
    const char *doc = PyUnicode_AsUTF8AndSize(args[1], &size);
    if (doc == NULL) {
        return NULL;
    }
    if ((size_t)size != strlen(doc) || strncmp(doc, "__init__(", 9) != 0) {
        PyErr_SetString(PyExc_ValueError,
                        "doc must start with the text signature \"__init__(...)\" and hold "
                        "no NUL character");
        return NULL;
    }
    PyObject *name = PyUnicode_InternFromString("__init__");
    if (name == NULL) {
        return NULL;
    }
    PyObject *current = PyDict_GetItemWithError(type->tp_dict, name); /* borrowed */
    if (current == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_TypeError, "%s has no __init__ of its own", type->tp_name);
        }
        goto fail;
    }
    if (!Py_IS_TYPE(current, &PyWrapperDescr_Type) || PyDescr_TYPE(current) != type) {
        PyErr_Format(PyExc_TypeError, "%s.__init__ is not the slot wrapper of its tp_init",
                     type->tp_name);
        goto fail;
    }
    PyWrapperDescrObject *slot = (PyWrapperDescrObject *)current;
    if (slot->d_base->doc != NULL && strcmp(slot->d_base->doc, doc) == 0) {
        Py_DECREF(name); /* given already: nothing changes */
        Py_RETURN_NONE;
    }
    /* Raw allocations: process-wide, whatever interpreter imports the module. */
    struct wrapperbase *base = PyMem_RawMalloc(sizeof(*base));
    char *text = PyMem_RawMalloc((size_t)size + 1);
    if (base == NULL || text == NULL) {
        PyMem_RawFree(base);
        PyMem_RawFree(text);
        PyErr_NoMemory();
        goto fail;
    }
    memcpy(text, doc, (size_t)size + 1);
    *base = *slot->d_base; /* the same slot, name and wrapper: only the doc differs */
    base->doc = text;
    PyObject *descr = PyDescr_NewWrapper(type, base, slot->d_wrapped);
    if (descr == NULL) {
        PyMem_RawFree(base);
        PyMem_RawFree(text);
        goto fail;
    }
    int failed = PyDict_SetItem(type->tp_dict, name, descr);
    Py_DECREF(descr);
    if (failed) {
        goto fail; /* the dict never took descr: base and text are no one's, and leak */
    }
    PyType_Modified(type);
    Py_DECREF(name);
    Py_RETURN_NONE;

fail:
    Py_DECREF(name);
    return NULL;
}

static PyMethodDef methods[] = {
    {"show_init_signature", (PyCFunction)(void (*)(void))show_init_signature, METH_FASTCALL,
     "show_init_signature(cls, doc): make cls.__init__, the slot wrapper of cls's C "
     "initialiser, document itself with doc (\"__init__($self, ...)\\n--\\n\\n\" and "
     "a docstring), still calling the same function."},
    {NULL, NULL, 0, NULL},
};

/* Multi-phase initialisation; no subinterpreters, the GIL needed (_native_slots.h). */
static PyModuleDef_Slot slots[] = {
    PURGATORY_AIO_NATIVE_SLOTS,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "purgatory_aio._initsig",
    .m_doc = "The signature of a compiled class's __init__, for help() (compiled build).",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC
PyInit__initsig(void)
{
    return PyModuleDef_Init(&module_def);
}
