/* The client's hot encode in C: a metrics frame, byte for byte what msgpack writes.
 *
 * pack_ints_map(i0, ..., iN, values) -> bytes | None
 *
 * A MessagePack array of the N integers followed by the dict `values` (str -> float, int, bool
 * or None), the bytes of msgpack.Packer(use_bin_type=True).pack((i0, ..., iN, values)). It
 * returns None, and the caller packs with msgpack instead, for anything else: a value of
 * another type (a tensor, a numpy scalar, a string), a key that is not a str or has no UTF-8
 * form, a dict subclass, an int beyond 64 bits, a map of 65,536 entries or more; and for what
 * the protocol refuses, so that the caller's checks see it (the client leaves out and counts a
 * bad name, and a record with a bad step, instead of sending what the daemon refuses): a header
 * int outside [0, 2**63) (every header field is one), a key of no characters or more than
 * MAX_NAME_CHARS (protocol/constants.py; the module's MAX_NAME_CHARS, held equal by the test). So what a frame
 * carries, and every refusal and error, stay msgpack's; this only takes the common record, a
 * dict of plain numbers, off msgpack's general walk (its type dispatch per value is most of the
 * encode, and after a training step, on cold caches, most of log()'s time).
 *
 * It calls no Python code (no hook, no __index__, no __float__), so the dict cannot change while
 * it is read. Built by setup.py when a C compiler is found (optional); protocol/codec.py falls
 * back to msgpack without it. tests/test_pack_twin.py holds the two to the same bytes.
 */
#include "_pack_frame.h"

/* The frame into b: bytes, None (msgpack's to pack), or NULL with an exception set. */
static PyObject *pack(buf_t *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 15) {
        PyErr_SetString(PyExc_TypeError, "pack_ints_map takes 1 to 15 arguments: the ints, then the dict");
        return NULL;
    }
    PyObject *values = args[nargs - 1];
    if (!PyDict_CheckExact(values))
        Py_RETURN_NONE;
    put1(b, (unsigned char)(0x90 | nargs));                 /* fixarray */
    for (Py_ssize_t i = 0; i < nargs - 1; i++) {
        /* Each header int takes at most 9 bytes: 14 of them and a map header fit the stack. */
        if (!PyLong_Check(args[i]) || args[i] == Py_True || args[i] == Py_False)
            Py_RETURN_NONE;
        int overflow;
        long long h = PyLong_AsLongLongAndOverflow(args[i], &overflow);
        if (overflow != 0 || h < 0) {           /* beyond [0, 2**63): the protocol's to refuse */
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        put_uint(b, (uint64_t)h);
    }
    int r = pack_map(b, values, 0);
    if (r < 0)
        return NULL;
    if (r > 0)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)b->p, b->n);
}

static PyObject *pack_ints_map(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned char stack[STACK_BYTES];
    buf_t b = {stack, 0, STACK_BYTES, NULL};
    (void)self;
    PyObject *out = pack(&b, args, nargs);
    PyMem_Free(b.heap);
    return out;
}

static PyMethodDef methods[] = {
    {"pack_ints_map", (PyCFunction)(void (*)(void))pack_ints_map, METH_FASTCALL,
     "pack_ints_map(*ints, values) -> bytes | None: msgpack's bytes of (*ints, values) for a dict of "
     "plain numbers, None for anything else (pack it with msgpack)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "protocol._pack",
    "The client's metrics frame encoded in C, byte for byte msgpack's (see _pack.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__pack(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "MAX_NAME_CHARS", MAX_NAME_CHARS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
