/* The client's metrics frame, byte for byte what msgpack writes: the encoder that protocol/_pack.c
 * (pack_ints_map) and telemetry/client/_fastlog.c (log()'s common case) share; its contract is
 * _pack.c's docstring. Static functions only: each extension that includes it has its own copy.
 */
#ifndef TELEMETRY_PACK_FRAME_H
#define TELEMETRY_PACK_FRAME_H
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

/* The dict `values` into b as msgpack's map: 0; 1 when it is not one this encodes (the caller
 * leaves it to msgpack); -1 with an exception set (no memory). */
/* A str of `len` UTF-8 bytes, msgpack's smallest form for it (room reserved by the caller). */
static inline void put_str(buf_t *b, const char *s, Py_ssize_t len)
{
    if (len < 32) put1(b, (unsigned char)(0xa0 | len));
    else if (len < 256) { put1(b, 0xd9); put_be(b, (uint64_t)len, 1); }
    else if (len < 65536) { put1(b, 0xda); put_be(b, (uint64_t)len, 2); }
    else { put1(b, 0xdb); put_be(b, (uint64_t)len, 4); }
    memcpy(b->p + b->n, s, (size_t)len);
    b->n += len;
}

/* A float64, as msgpack packs a Python float (room reserved by the caller). */
static inline void put_double(buf_t *b, double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    put1(b, 0xcb);
    put_be(b, u, 8);
}

/* The map of `values` and `extra` more entries the caller writes after it. */
static int pack_map(buf_t *b, PyObject *values, Py_ssize_t extra)
{
    Py_ssize_t count = PyDict_GET_SIZE(values) + extra;
    if (count < 16) put1(b, (unsigned char)(0x80 | count));
    else if (count < 65536) { put1(b, 0xde); put_be(b, (uint64_t)count, 2); }
    else return 1;
    Py_ssize_t pos = 0;
    PyObject *key, *v;
    while (PyDict_Next(values, &pos, &key, &v)) {
        if (!PyUnicode_Check(key))
            return 1;
        Py_ssize_t chars = PyUnicode_GET_LENGTH(key);
        if (chars < 1 || chars > MAX_NAME_CHARS)
            return 1;
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(key, &len);
        if (s == NULL) { PyErr_Clear(); return 1; }     /* a lone surrogate: msgpack's error */
        if (len > 0xffffffffLL)
            return 1;                                     /* beyond str32: msgpack's error */
        if (reserve(b, len + ENTRY_EXTRA))
            return -1;
        put_str(b, s, len);
        /* msgpack's order: None, True, False by identity, then int, then float (subclasses too). */
        if (v == Py_None) put1(b, 0xc0);
        else if (v == Py_True) put1(b, 0xc3);
        else if (v == Py_False) put1(b, 0xc2);
        else if (PyLong_Check(v)) { if (put_int(b, v)) return 1; }
        else if (PyFloat_Check(v)) put_double(b, PyFloat_AS_DOUBLE(v));
        else return 1;
    }
    return 0;
}

#endif
