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
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* A metric name's most characters (protocol/constants.py MAX_NAME_CHARS). */
#define MAX_NAME_CHARS 256
/* A frame is built on the stack up to this long, on the heap beyond. */
#define STACK_BYTES 4096
/* The most a key's header and a value take besides the key's own bytes. */
#define ENTRY_EXTRA 14

typedef struct {
    unsigned char *p;
    Py_ssize_t n, cap;
    unsigned char *heap;      /* p, once the frame outgrew the stack; NULL before */
} buf_t;

/* Room for `more` bytes after b->n; -1 (MemoryError set) when there is no memory. */
static int reserve(buf_t *b, Py_ssize_t more)
{
    if (more <= b->cap - b->n)
        return 0;
    if (more > PY_SSIZE_T_MAX / 2 - b->n) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t cap = 2 * (b->n + more);
    unsigned char *p = PyMem_Realloc(b->heap, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (b->heap == NULL)
        memcpy(p, b->p, (size_t)b->n);
    b->p = b->heap = p;
    b->cap = cap;
    return 0;
}

static inline void put1(buf_t *b, unsigned char c) { b->p[b->n++] = c; }

static inline void put_be(buf_t *b, uint64_t v, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--)
        b->p[b->n++] = (unsigned char)(v >> (8 * i));
}

/* msgpack's smallest form of a non-negative integer (msgpack-c's pack_template.h). */
static inline void put_uint(buf_t *b, uint64_t u)
{
    if (u < 128) put1(b, (unsigned char)u);
    else if (u < 256) { put1(b, 0xcc); put_be(b, u, 1); }
    else if (u < 65536) { put1(b, 0xcd); put_be(b, u, 2); }
    else if (u < 4294967296ULL) { put1(b, 0xce); put_be(b, u, 4); }
    else { put1(b, 0xcf); put_be(b, u, 8); }
}

static inline void put_neg(buf_t *b, int64_t d)
{
    if (d >= -32) put1(b, (unsigned char)(int8_t)d);
    else if (d >= -128) { put1(b, 0xd0); put_be(b, (uint8_t)(int8_t)d, 1); }
    else if (d >= -32768) { put1(b, 0xd1); put_be(b, (uint16_t)(int16_t)d, 2); }
    else if (d >= -2147483648LL) { put1(b, 0xd2); put_be(b, (uint32_t)(int32_t)d, 4); }
    else { put1(b, 0xd3); put_be(b, (uint64_t)d, 8); }
}

/* An int (or int subclass, as msgpack takes it) in [-2**63, 2**64); 0, or -1: not one here. */
static int put_int(buf_t *b, PyObject *o)
{
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow == 0) {
        if (v == -1 && PyErr_Occurred()) { PyErr_Clear(); return -1; }
        if (v >= 0) put_uint(b, (uint64_t)v);
        else put_neg(b, v);
        return 0;
    }
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(o);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); return -1; }
        put_uint(b, u);
        return 0;
    }
    return -1;
}

static PyObject *pack(buf_t *b, PyObject *const *args, Py_ssize_t nargs);

static PyObject *pack_ints_map(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned char stack[STACK_BYTES];
    buf_t b = {stack, 0, STACK_BYTES, NULL};
    (void)self;
    PyObject *out = pack(&b, args, nargs);
    PyMem_Free(b.heap);
    return out;
}

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
    Py_ssize_t count = PyDict_GET_SIZE(values);
    if (count < 16) put1(b, (unsigned char)(0x80 | count));
    else if (count < 65536) { put1(b, 0xde); put_be(b, (uint64_t)count, 2); }
    else Py_RETURN_NONE;
    Py_ssize_t pos = 0;
    PyObject *key, *v;
    while (PyDict_Next(values, &pos, &key, &v)) {
        if (!PyUnicode_Check(key))
            Py_RETURN_NONE;
        Py_ssize_t chars = PyUnicode_GET_LENGTH(key);
        if (chars < 1 || chars > MAX_NAME_CHARS)
            Py_RETURN_NONE;
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(key, &len);
        if (s == NULL) { PyErr_Clear(); Py_RETURN_NONE; }     /* a lone surrogate: msgpack's error */
        if (len > 0xffffffffLL)
            Py_RETURN_NONE;                                     /* beyond str32: msgpack's error */
        if (reserve(b, len + ENTRY_EXTRA))
            return NULL;
        if (len < 32) put1(b, (unsigned char)(0xa0 | len));
        else if (len < 256) { put1(b, 0xd9); put_be(b, (uint64_t)len, 1); }
        else if (len < 65536) { put1(b, 0xda); put_be(b, (uint64_t)len, 2); }
        else { put1(b, 0xdb); put_be(b, (uint64_t)len, 4); }
        memcpy(b->p + b->n, s, (size_t)len);
        b->n += len;
        /* msgpack's order: None, True, False by identity, then int, then float (subclasses too). */
        if (v == Py_None) put1(b, 0xc0);
        else if (v == Py_True) put1(b, 0xc3);
        else if (v == Py_False) put1(b, 0xc2);
        else if (PyLong_Check(v)) { if (put_int(b, v)) Py_RETURN_NONE; }
        else if (PyFloat_Check(v)) {
            double d = PyFloat_AS_DOUBLE(v);
            uint64_t u;
            memcpy(&u, &d, sizeof u);
            put1(b, 0xcb);
            put_be(b, u, 8);
        }
        else Py_RETURN_NONE;
    }
    return PyBytes_FromStringAndSize((const char *)b->p, b->n);
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
