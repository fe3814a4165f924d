/*
 * What each hand-written extension of the compiled build says of itself at import
 * (multi-phase initialisation): no subinterpreters, and an explicit stance on the GIL.
 * The compiled core is built and tested for interpreters with the GIL only (a
 * free-threaded interpreter gets the pure build from `pip install`), so each module says
 * it needs the GIL; imported into a free-threaded interpreter anyway, it turns the GIL
 * on with the interpreter's own warning rather than run untested.
 */
#ifndef PURGATORY_AIO_NATIVE_SLOTS_H
#define PURGATORY_AIO_NATIVE_SLOTS_H

#ifdef Py_mod_multiple_interpreters
#define PURGATORY_AIO_SLOT_INTERPRETERS \
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#else
#define PURGATORY_AIO_SLOT_INTERPRETERS
#endif

#ifdef Py_mod_gil
#define PURGATORY_AIO_SLOT_GIL {Py_mod_gil, Py_MOD_GIL_USED},
#else
#define PURGATORY_AIO_SLOT_GIL
#endif

/* The last entries of a module's slots, the terminating one included. */
#define PURGATORY_AIO_NATIVE_SLOTS PURGATORY_AIO_SLOT_INTERPRETERS PURGATORY_AIO_SLOT_GIL {0, NULL}

#endif
