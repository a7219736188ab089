/* The daemon's inner loops in C: an optional accelerator, twin of telemetry/daemon/loops.py.
 *
 * telemetry/daemon/hotpath.py picks this module when it was built (setup.py, `optional=True`:
 * an install without a C compiler still works) and loops.py otherwise, or when
 * TELEMETRY_PURE_PYTHON=1. Each function here is a leaf with a Python twin of the same name and
 * signature in loops.py, which is its definition (see the docstrings there); tests/test_hotpath.py
 * keeps the two equal on random input. They keep no state, read no attribute of any class but
 * the records' fields (by their slots when the record type has them), and know no metric name:
 *
 *   read_frames_upto(next_frame, empty, max_frames, max_bytes) -> (list[bytes], their bytes)
 *   read_ring(ring, r, out, max_frames, max_bytes, max_frame) -> (read position, frames, bytes)
 *   decode_frames(frames, decode, metrics_type, limits, cache) -> list of records
 *   tally(recs, metrics_type, bye_type, good_names) -> (all_metrics, num_byes, per_src, unknown)
 *   gather(groups) -> (ranks, t_ns, names, columns)
 *   reduce_column(column, op) -> values      (its twin is reductions.reduce_column)
 *   rate_sums(counts, times) -> rates
 *   phase_straggler(columns, step_times, ranks, values, floor_fraction, keys) -> None
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>

static PyObject *s_values, *s_rank, *s_t_ns, *s_src, *s_seq, *s_dropped;


/* ---- read_frames_upto ------------------------------------------------------------------- */

/* Frames from next_frame() until it raises `empty`, max_frames were read, or their lengths reach
 * max_bytes (the frame that reaches it is kept); their total length in *total. */
static PyObject *
read_frames_impl(PyObject *next_frame, PyObject *empty, Py_ssize_t max_frames, Py_ssize_t max_bytes,
                 Py_ssize_t *total)
{
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    *total = 0;
    for (Py_ssize_t i = 0; i < max_frames && *total < max_bytes; i++) {
        PyObject *frame = PyObject_CallNoArgs(next_frame);
        if (frame == NULL) {
            if (PyErr_ExceptionMatches(empty)) {
                PyErr_Clear();
                break;
            }
            Py_DECREF(out);
            return NULL;
        }
        Py_ssize_t size = PyBytes_Check(frame) ? PyBytes_GET_SIZE(frame) : PyObject_Length(frame);
        if (size < 0 || PyList_Append(out, frame) < 0) {
            Py_DECREF(frame);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(frame);
        *total += size;
    }
    return out;
}

static PyObject *
read_frames_upto(PyObject *self, PyObject *args)
{
    PyObject *next_frame, *empty;
    Py_ssize_t max_frames, max_bytes, total;
    if (!PyArg_ParseTuple(args, "OOnn", &next_frame, &empty, &max_frames, &max_bytes))
        return NULL;
    PyObject *out = read_frames_impl(next_frame, empty, max_frames, max_bytes, &total);
    if (out == NULL)
        return NULL;
    return Py_BuildValue("(Nn)", out, total);
}

/* ---- record fields ------------------------------------------------------------------------ */

/* Where a record type keeps a field: msgspec Structs hold their fields in __slots__, whose
 * member descriptors carry the offset. -1 when the type says otherwise (then: getattr). */
static Py_ssize_t
slot_offset(PyObject *type, PyObject *name)
{
    PyObject *descr = PyObject_GetAttr(type, name);
    Py_ssize_t offset = -1;
    if (descr == NULL) {
        PyErr_Clear();
        return -1;
    }
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyMemberDef *def = ((PyMemberDescrObject *)descr)->d_member;
        if (def->type == T_OBJECT_EX)
            offset = def->offset;
    }
    Py_DECREF(descr);
    return offset;
}

/* A field of a record: borrowed when read from its slot, else a new reference (*owned = 1). */
static PyObject *
field(PyObject *rec, Py_ssize_t offset, PyObject *name, int *owned)
{
    if (offset >= 0) {
        PyObject *v = *(PyObject **)((char *)rec + offset);
        if (v != NULL) {
            *owned = 0;
            return v;
        }
    }
    *owned = 1;
    return PyObject_GetAttr(rec, name);
}

/* ---- decode_frames ------------------------------------------------------------------------ */

/* A metrics frame read by hand, for the shape every client writes: a fixarray of 9 or 10 (parts),
 * the header's ints as msgpack's unsigned ints, a map of str keys to floats, ints, bools and
 * nils. Anything else, or anything out of bounds, is left to the caller's decoder (msgspec), which
 * gives the same record or raises; so what this reads it must read exactly as msgspec does:
 * a float32 as its double, an int as an int, keys decoded as strict UTF-8, a repeated key's
 * later value kept at the first one's place. A key whose bytes are those of the template's key at
 * the same place (the names of the last record read with as many names and the same first one)
 * is that str object: no decode, no hash. */

typedef struct {
    const unsigned char *p, *end;
} Reader;

static inline int
rd_need(Reader *r, Py_ssize_t n)
{
    return r->end - r->p >= n;
}

static inline unsigned long long
rd_be(const unsigned char *p, int n)
{
    unsigned long long v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* An unsigned int (positive fixint, uint 8..64) up to `max`: 0 and *out, or -1 (not one). */
static int
rd_uint(Reader *r, unsigned long long max, unsigned long long *out)
{
    if (!rd_need(r, 1))
        return -1;
    unsigned char t = *r->p;
    int n;
    if (t <= 0x7f) {
        *out = t;
        r->p++;
        return t <= max ? 0 : -1;
    }
    switch (t) {
    case 0xcc: n = 1; break;
    case 0xcd: n = 2; break;
    case 0xce: n = 4; break;
    case 0xcf: n = 8; break;
    default: return -1;
    }
    if (!rd_need(r, 1 + n))
        return -1;
    *out = rd_be(r->p + 1, n);
    r->p += 1 + n;
    return *out <= max ? 0 : -1;
}

/* A str's bytes: 0 and *s, *n, or -1 (not a str). */
static int
rd_str(Reader *r, const char **s, Py_ssize_t *n)
{
    if (!rd_need(r, 1))
        return -1;
    unsigned char t = *r->p;
    int h;
    unsigned long long len;
    if (t >= 0xa0 && t <= 0xbf) {
        h = 1;
        len = t & 0x1f;
    } else if (t == 0xd9 || t == 0xda || t == 0xdb) {
        h = t == 0xd9 ? 2 : t == 0xda ? 3 : 5;
        if (!rd_need(r, h))
            return -1;
        len = rd_be(r->p + 1, h - 1);
    } else {
        return -1;
    }
    if (!rd_need(r, h) || (unsigned long long)(r->end - r->p - h) < len)
        return -1;
    *s = (const char *)r->p + h;
    *n = (Py_ssize_t)len;
    r->p += h + len;
    return 0;
}

/* A value: a new reference, NULL with no error set (not one this reads), or NULL with an error. */
static PyObject *
rd_value(Reader *r)
{
    if (!rd_need(r, 1))
        return NULL;
    unsigned char t = *r->p;
    if (t <= 0x7f) {
        r->p++;
        return PyLong_FromLong(t);
    }
    if (t >= 0xe0) {
        r->p++;
        return PyLong_FromLong((signed char)t);
    }
    int n;
    switch (t) {
    case 0xc0: r->p++; Py_RETURN_NONE;
    case 0xc2: r->p++; Py_RETURN_FALSE;
    case 0xc3: r->p++; Py_RETURN_TRUE;
    case 0xca: case 0xcb: {
        n = t == 0xca ? 4 : 8;
        if (!rd_need(r, 1 + n))
            return NULL;
        unsigned long long bits = rd_be(r->p + 1, n);
        r->p += 1 + n;
        double d;
        if (n == 4) {
            uint32_t b32 = (uint32_t)bits;
            float f;
            memcpy(&f, &b32, 4);
            d = f;
        } else {
            memcpy(&d, &bits, 8);
        }
        return PyFloat_FromDouble(d);
    }
    case 0xcc: case 0xcd: case 0xce: case 0xcf:            /* uint 8..64 */
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {          /* int 8..64 */
        int is_signed = t >= 0xd0;
        n = 1 << (t - (is_signed ? 0xd0 : 0xcc));
        if (!rd_need(r, 1 + n))
            return NULL;
        unsigned long long v = rd_be(r->p + 1, n);
        r->p += 1 + n;
        if (!is_signed)
            return PyLong_FromUnsignedLongLong(v);
        long long s = n == 1 ? (signed char)v : n == 2 ? (int16_t)v : n == 4 ? (int32_t)v : (long long)v;
        return PyLong_FromLongLong(s);
    }
    default:
        return NULL;
    }
}

/* The record of one frame read by hand: a new reference, or NULL with no error set (the caller's
 * decoder decides), or NULL with an error (out of memory). */
static PyObject *
fast_metrics(PyObject *frame, PyObject *metrics_type, unsigned long long max_rank, Py_ssize_t max_values,
             unsigned long long max_parts, PyObject *templates, PyObject **new_names)
{
    const unsigned long long u63 = (1ULL << 63) - 1;
    Reader r = {(const unsigned char *)PyBytes_AS_STRING(frame),
                (const unsigned char *)PyBytes_AS_STRING(frame) + PyBytes_GET_SIZE(frame)};
    if (!rd_need(&r, 3) || (r.p[0] != 0x99 && r.p[0] != 0x9a) || r.p[1] != 0x02 || r.p[2] != 0x01)
        return NULL;
    int with_parts = r.p[0] == 0x9a;
    r.p += 3;
    unsigned long long src, rank, seq, dropped, t_ns, step, parts = 1;
    if (rd_uint(&r, u63, &src) < 0 || rd_uint(&r, max_rank, &rank) < 0 || rd_uint(&r, u63, &seq) < 0
            || rd_uint(&r, u63, &dropped) < 0 || rd_uint(&r, u63, &t_ns) < 0 || rd_uint(&r, u63, &step) < 0)
        return NULL;
    if (!rd_need(&r, 1))
        return NULL;
    Py_ssize_t count;
    unsigned char t = *r.p;
    if (t >= 0x80 && t <= 0x8f) {
        count = t & 0x0f;
        r.p++;
    } else if (t == 0xde || t == 0xdf) {
        int h = t == 0xde ? 3 : 5;
        if (!rd_need(&r, h))
            return NULL;
        unsigned long long c = rd_be(r.p + 1, h - 1);
        if (c > (unsigned long long)max_values)
            return NULL;
        count = (Py_ssize_t)c;
        r.p += h;
    } else {
        return NULL;
    }
    if (count > max_values)
        return NULL;
    /* The template: the first of `templates` with as many names whose first is this record's. */
    PyObject *tmpl = NULL;                       /* borrowed: a tuple of str, or NULL */
    if (count > 0) {
        Reader peek = r;
        const char *s0;
        Py_ssize_t n0;
        if (rd_str(&peek, &s0, &n0) == 0) {
            for (Py_ssize_t k = 0; k < PyList_GET_SIZE(templates); k++) {
                PyObject *t = PyList_GET_ITEM(templates, k);
                if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != count)
                    continue;
                PyObject *k0 = PyTuple_GET_ITEM(t, 0);
                if (PyUnicode_CheckExact(k0) && PyUnicode_IS_COMPACT_ASCII(k0) && PyUnicode_GET_LENGTH(k0) == n0
                        && memcmp(PyUnicode_DATA(k0), s0, n0) == 0) {
                    tmpl = t;
                    break;
                }
            }
        }
    }
    Py_ssize_t tmpl_len = tmpl != NULL ? PyTuple_GET_SIZE(tmpl) : 0;
    int same_names = tmpl != NULL && tmpl_len == count;
    PyObject *values = _PyDict_NewPresized(count), *names = NULL;
    if (values == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *s;
        Py_ssize_t n;
        if (rd_str(&r, &s, &n) < 0)
            goto decline;
        PyObject *key = NULL;
        if (i < tmpl_len) {
            PyObject *k = PyTuple_GET_ITEM(tmpl, i);
            if (PyUnicode_CheckExact(k) && PyUnicode_IS_COMPACT_ASCII(k) && PyUnicode_GET_LENGTH(k) == n
                    && memcmp(PyUnicode_DATA(k), s, n) == 0) {
                key = k;
                Py_INCREF(key);
            }
        }
        if (key == NULL) {
            same_names = 0;
            key = PyUnicode_DecodeUTF8(s, n, NULL);
            if (key == NULL) {
                if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                    PyErr_Clear();               /* the caller's decoder says how it is bad */
                goto decline;
            }
        }
        PyObject *value = rd_value(&r);
        if (value == NULL) {
            Py_DECREF(key);
            goto decline;
        }
        int bad = PyDict_SetItem(values, key, value) < 0;
        Py_DECREF(value);
        if (!same_names && !bad) {               /* this record's names: a new template */
            if (names == NULL) {
                names = PyTuple_New(count);
                if (names == NULL) {
                    Py_DECREF(key);
                    goto decline;
                }
                for (Py_ssize_t j = 0; j < i; j++) {
                    PyObject *k = PyTuple_GET_ITEM(tmpl, j);
                    Py_INCREF(k);
                    PyTuple_SET_ITEM(names, j, k);
                }
            }
            Py_INCREF(key);
            PyTuple_SET_ITEM(names, i, key);
        }
        Py_DECREF(key);
        if (bad)
            goto decline;
    }
    if (with_parts && (rd_uint(&r, max_parts, &parts) < 0 || parts < 1))
        goto decline;
    if (r.p != r.end)
        goto decline;
    PyObject *args[9];
    args[0] = PyLong_FromLong(1);
    args[1] = PyLong_FromUnsignedLongLong(src);
    args[2] = PyLong_FromUnsignedLongLong(rank);
    args[3] = PyLong_FromUnsignedLongLong(seq);
    args[4] = PyLong_FromUnsignedLongLong(dropped);
    args[5] = PyLong_FromUnsignedLongLong(t_ns);
    args[6] = PyLong_FromUnsignedLongLong(step);
    args[7] = values;
    args[8] = PyLong_FromUnsignedLongLong(parts);
    PyObject *rec = NULL;
    int ok = 1;
    for (int k = 0; k < 9; k++)
        ok &= args[k] != NULL;
    if (ok)
        rec = PyObject_Vectorcall(metrics_type, args, 9, NULL);
    for (int k = 0; k < 9; k++)
        Py_XDECREF(args[k]);
    if (rec != NULL && names != NULL)
        *new_names = names;                      /* the caller's */
    else
        Py_XDECREF(names);
    return rec;

decline:
    Py_DECREF(values);
    Py_XDECREF(names);
    return NULL;
}

/* How many key sets decode_frames keeps as templates (the last ones met, the latest first). */
#define NUM_TEMPLATES 16

static PyObject *
decode_frames(PyObject *self, PyObject *args)
{
    PyObject *frames, *decode, *metrics_type, *cache;
    unsigned long long max_rank, max_parts;
    Py_ssize_t max_values;
    if (!PyArg_ParseTuple(args, "O!OO(KnK)O!", &PyList_Type, &frames, &decode, &metrics_type,
                          &max_rank, &max_values, &max_parts, &PyList_Type, &cache))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(frames);
    PyObject *out = PyList_New(n);
    /* The templates: the names of the last records of other key sets read here, kept in `cache`
     * between calls (worked on in a copy: a list only this function holds). */
    PyObject *templates = PyList_GetSlice(cache, 0, NUM_TEMPLATES);
    if (out == NULL || templates == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *frame = PyList_GET_ITEM(frames, i), *names = NULL;
        PyObject *rec = PyBytes_CheckExact(frame)
            ? fast_metrics(frame, metrics_type, max_rank, max_values, max_parts, templates, &names) : NULL;
        if (rec == NULL && (PyErr_Occurred() || (rec = PyObject_CallOneArg(decode, frame)) == NULL))
            goto fail;
        PyList_SET_ITEM(out, i, rec);
        if (names != NULL) {                     /* new names: the first template, the last one goes */
            int bad = PyList_Insert(templates, 0, names) < 0;
            Py_DECREF(names);
            if (bad || (PyList_GET_SIZE(templates) > NUM_TEMPLATES
                        && PyList_SetSlice(templates, NUM_TEMPLATES, PY_SSIZE_T_MAX, NULL) < 0))
                goto fail;
        }
    }
    if (PyList_SetSlice(cache, 0, PY_SSIZE_T_MAX, templates) < 0)
        goto fail;
    Py_DECREF(templates);
    return out;

fail:
    Py_XDECREF(out);                             /* its slots not filled yet are NULL */
    Py_XDECREF(templates);
    return NULL;
}

/* ---- tally -------------------------------------------------------------------------------- */

/* A header field of a record: the object, and its value when it is an int that fits a long long
 * (compared as numbers then; any other object is compared as Python compares it). */
typedef struct {
    PyObject *obj;              /* borrowed: the record (or tally's `keep` list) holds it */
    long long v;
    int fits;
} Num;

static int
num_of(Num *n, PyObject *obj)
{
    n->obj = obj;
    n->fits = 0;
    if (PyLong_CheckExact(obj)) {
        int overflow;
        n->v = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (n->v == -1 && PyErr_Occurred())
            return -1;
        n->fits = !overflow;
    }
    return 0;
}

/* a < b as Python says it (-1: an error). */
static int
num_lt(const Num *a, const Num *b)
{
    if (a->fits && b->fits)
        return a->v < b->v;
    return PyObject_RichCompareBool(a->obj, b->obj, Py_LT);
}

typedef struct {
    PyObject *src, *rank;       /* borrowed, of the source's first record in the batch */
    Py_ssize_t count;
    Num min_seq, dropped_at_min, max_seq, max_dropped;
} SrcRow;

/* A field of `rec` (its slot when `rec` is of the type the offset was found on), kept alive by
 * the record or, when getattr made it, by `keep`; borrowed. */
static PyObject *
field_kept(PyObject *rec, Py_ssize_t offset, PyObject *name, PyObject *keep)
{
    int owned;
    PyObject *v = field(rec, offset, name, &owned);
    if (v != NULL && owned) {
        int bad = PyList_Append(keep, v) < 0;
        Py_DECREF(v);
        if (bad)
            return NULL;
    }
    return v;
}

/* Whether the keys of `values` (a dict), in order, equal the items of tuple `keys` (1), not (0),
 * or an error (-1). A key that is the very object is equal without a compare (msgspec hands
 * out one str object per distinct name, mostly: its cache of them may miss a few). */
static int
same_keys(PyObject *values, PyObject *keys)
{
    if (PyDict_GET_SIZE(values) != PyTuple_GET_SIZE(keys))
        return 0;
    Py_ssize_t pos = 0, j = 0;
    PyObject *k, *v;
    while (PyDict_Next(values, &pos, &k, &v)) {
        PyObject *want = PyTuple_GET_ITEM(keys, j++);
        if (k == want)
            continue;
        if (PyUnicode_CheckExact(k) && PyUnicode_CheckExact(want) && PyUnicode_IS_READY(k)
                && PyUnicode_IS_READY(want)) {
            /* as str.__eq__: the same length, kind and code points */
            Py_ssize_t len = PyUnicode_GET_LENGTH(k);
            if (len != PyUnicode_GET_LENGTH(want) || PyUnicode_KIND(k) != PyUnicode_KIND(want)
                    || memcmp(PyUnicode_DATA(k), PyUnicode_DATA(want), len * PyUnicode_KIND(k)) != 0)
                return 0;
            continue;
        }
        int eq = PyObject_RichCompareBool(k, want, Py_EQ);
        if (eq <= 0)
            return eq;
    }
    return 1;
}

static PyObject *
tally(PyObject *self, PyObject *args)
{
    PyObject *recs, *metrics_type, *bye_type, *good_names;
    if (!PyArg_ParseTuple(args, "O!OOO!", &PyList_Type, &recs, &metrics_type, &bye_type,
                          &PyDict_Type, &good_names))
        return NULL;
    Py_ssize_t at_values = -1, at_src = -1, at_rank = -1, at_seq = -1, at_dropped = -1;
    if (PyType_Check(metrics_type)) {
        at_values = slot_offset(metrics_type, s_values);
        at_src = slot_offset(metrics_type, s_src);
        at_rank = slot_offset(metrics_type, s_rank);
        at_seq = slot_offset(metrics_type, s_seq);
        at_dropped = slot_offset(metrics_type, s_dropped);
    }
    Py_ssize_t n = PyList_GET_SIZE(recs), num_src = 0, cap = 0;
    long long num_byes = 0;
    int all_metrics = 1;
    SrcRow *rows = NULL;
    PyObject *unknown = PyList_New(0);       /* indexes of records whose key set is not known good */
    PyObject *index = PyDict_New();          /* src -> its row */
    PyObject *keep = PyList_New(0);          /* fields getattr made (not slots): alive till the end */
    PyObject *known = NULL;                  /* owned: the last key tuple found in good_names */
    PyObject *result = NULL;
    if (unknown == NULL || index == NULL || keep == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rec = PyList_GET_ITEM(recs, i);
        int is_metrics = (PyObject *)Py_TYPE(rec) == metrics_type;
        if (is_metrics) {
            /* tuple(rec.values) in good_names; the last key tuple found there is compared with
             * first (a batch's records mostly have the same names): no tuple made, no hash. */
            PyObject *values = field_kept(rec, at_values, s_values, keep);
            if (values == NULL)
                goto done;
            int in = 0;
            if (known != NULL && PyDict_CheckExact(values)) {
                in = same_keys(values, known);
                if (in < 0)
                    goto done;
            }
            if (!in) {
                PyObject *keys = PySequence_Tuple(values);
                if (keys == NULL)
                    goto done;
                in = PyDict_Contains(good_names, keys);
                if (in > 0) {
                    Py_XSETREF(known, keys);
                } else {
                    Py_DECREF(keys);
                    if (in < 0)
                        goto done;
                    PyObject *at = PyLong_FromSsize_t(i);
                    int bad = at == NULL || PyList_Append(unknown, at) < 0;
                    Py_XDECREF(at);
                    if (bad)
                        goto done;
                }
            }
        } else {
            all_metrics = 0;
            if ((PyObject *)Py_TYPE(rec) == bye_type)
                num_byes++;
        }
        Py_ssize_t o_src = is_metrics ? at_src : -1, o_rank = is_metrics ? at_rank : -1,
                   o_seq = is_metrics ? at_seq : -1, o_dropped = is_metrics ? at_dropped : -1;
        PyObject *src = field_kept(rec, o_src, s_src, keep);
        if (src == NULL)
            goto done;
        PyObject *found = PyDict_GetItemWithError(index, src);       /* borrowed */
        Num seq, dropped;
        PyObject *seq_obj, *dropped_obj;
        if (found == NULL) {
            if (PyErr_Occurred())
                goto done;
            PyObject *rank = field_kept(rec, o_rank, s_rank, keep);
            if (rank == NULL || (seq_obj = field_kept(rec, o_seq, s_seq, keep)) == NULL
                    || (dropped_obj = field_kept(rec, o_dropped, s_dropped, keep)) == NULL)
                goto done;
            if (num_of(&seq, seq_obj) < 0 || num_of(&dropped, dropped_obj) < 0)
                goto done;
            if (num_src == cap) {
                cap = cap ? cap * 2 : 64;
                SrcRow *grown = PyMem_Realloc(rows, cap * sizeof(SrcRow));
                if (grown == NULL) {
                    PyErr_NoMemory();
                    goto done;
                }
                rows = grown;
            }
            PyObject *at = PyLong_FromSsize_t(num_src);
            int bad = at == NULL || PyDict_SetItem(index, src, at) < 0;
            Py_XDECREF(at);
            if (bad)
                goto done;
            SrcRow *row = &rows[num_src++];
            row->src = src;
            row->rank = rank;
            row->count = 1;
            row->min_seq = row->max_seq = seq;
            row->dropped_at_min = row->max_dropped = dropped;
            continue;
        }
        SrcRow *row = &rows[PyLong_AsSsize_t(found)];
        if ((seq_obj = field_kept(rec, o_seq, s_seq, keep)) == NULL
                || (dropped_obj = field_kept(rec, o_dropped, s_dropped, keep)) == NULL)
            goto done;
        if (num_of(&seq, seq_obj) < 0 || num_of(&dropped, dropped_obj) < 0)
            goto done;
        row->count++;
        int lt = num_lt(&seq, &row->min_seq);
        if (lt < 0)
            goto done;
        if (lt) {
            row->min_seq = seq;
            row->dropped_at_min = dropped;
        }
        int gt = num_lt(&row->max_seq, &seq);
        if (gt < 0)
            goto done;
        if (gt)
            row->max_seq = seq;
        gt = num_lt(&row->max_dropped, &dropped);
        if (gt < 0)
            goto done;
        if (gt)
            row->max_dropped = dropped;
    }
    PyObject *per_src = PyList_New(num_src);
    if (per_src == NULL)
        goto done;
    for (Py_ssize_t j = 0; j < num_src; j++) {
        SrcRow *row = &rows[j];
        PyObject *t = PyTuple_New(7), *count = PyLong_FromSsize_t(row->count);
        if (t == NULL || count == NULL) {
            Py_XDECREF(t);
            Py_XDECREF(count);
            Py_DECREF(per_src);
            goto done;
        }
        PyObject *items[7] = {row->src, row->rank, count, row->min_seq.obj, row->dropped_at_min.obj,
                              row->max_seq.obj, row->max_dropped.obj};
        for (int k = 0; k < 7; k++) {
            if (k != 2)
                Py_INCREF(items[k]);
            PyTuple_SET_ITEM(t, k, items[k]);
        }
        PyList_SET_ITEM(per_src, j, t);
    }
    result = Py_BuildValue("(OLNO)", all_metrics ? Py_True : Py_False, num_byes, per_src, unknown);

done:
    PyMem_Free(rows);
    Py_XDECREF(unknown);
    Py_XDECREF(index);
    Py_XDECREF(keep);
    Py_XDECREF(known);
    return result;
}

/* ---- gather ------------------------------------------------------------------------------- */

/* Field offsets of one record type, found once per type met (see slot_offset). */
typedef struct {
    PyTypeObject *type;
    Py_ssize_t rank, t_ns, values;
} Offsets;

static void
offsets_for(Offsets *o, PyObject *rec)
{
    if (Py_TYPE(rec) == o->type)
        return;
    PyObject *type = (PyObject *)Py_TYPE(rec);
    o->type = Py_TYPE(rec);
    o->rank = slot_offset(type, s_rank);
    o->t_ns = slot_offset(type, s_t_ns);
    o->values = slot_offset(type, s_values);
}

/* A new tuple of n Nones. */
static PyObject *
nones(Py_ssize_t n)
{
    PyObject *t = PyTuple_New(n);
    if (t == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF(Py_None);
        PyTuple_SET_ITEM(t, i, Py_None);
    }
    return t;
}

static PyObject *list_of_nones(Py_ssize_t n);

/* Put `value` at slot r of a tuple this module just made and has not handed out yet. */
static void
cell_set(PyObject *cell, Py_ssize_t r, PyObject *value)
{
    PyObject *old = PyTuple_GET_ITEM(cell, r);
    Py_INCREF(value);
    PyTuple_SET_ITEM(cell, r, value);
    Py_DECREF(old);
}

/* Working arrays of gather, reused from step to step (grown as needed). */
typedef struct {
    PyObject **rank_objs;        /* borrowed: each rank's first record's rank object */
    long long *rank_vals;        /* the same ranks as numbers */
    Py_ssize_t *rank_of;         /* per record: the index of its rank */
    PyObject **keys;             /* borrowed from the records: the step's names, first seen first */
    PyObject **cells;            /* their cells, owned until they go into their columns */
    Py_ssize_t *slots;           /* open addressing: rank value -> its index (-1: empty) */
    Py_ssize_t cap_ranks, cap_recs, cap_keys, cap_slots;
} Scratch;

static int
grow(void **buf, Py_ssize_t *cap, Py_ssize_t need, size_t item)
{
    if (need <= *cap)
        return 0;
    Py_ssize_t cap2 = *cap ? *cap : 16;
    while (cap2 < need)
        cap2 *= 2;
    void *p = PyMem_Realloc(*buf, cap2 * item);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *buf = p;
    *cap = cap2;
    return 0;
}

/* One step s: fills ranks_out[s], t_out[s], names_out[s] and column[s] of each of its names. */
static int
gather_step(PyObject *records, Py_ssize_t s, Py_ssize_t num_steps, Scratch *sc, Offsets *o,
            PyObject *ranks_out, PyObject *t_out, PyObject *names_out, PyObject *columns,
            PyObject **prev_names)
{
    Py_ssize_t n = PyList_GET_SIZE(records), m = 0;
    PyObject *best_t = NULL;                     /* borrowed */
    int owned;
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "gather: a step without records");
        return -1;
    }
    if (grow((void **)&sc->rank_of, &sc->cap_recs, n, sizeof(Py_ssize_t)) < 0)
        return -1;
    /* The ranks seen so far, found by value in a table of at least twice as many slots as the
     * step has records (a head's step has a record of each of thousands of nodes: a search
     * through the ranks seen would cost their number squared). */
    int bits = 4;
    while (((Py_ssize_t)1 << bits) < 2 * n)
        bits++;
    size_t mask = ((size_t)1 << bits) - 1;
    if (grow((void **)&sc->slots, &sc->cap_slots, (Py_ssize_t)mask + 1, sizeof(Py_ssize_t)) < 0)
        return -1;
    memset(sc->slots, 0xff, (mask + 1) * sizeof(Py_ssize_t));      /* every slot -1 */
    /* Pass 1: the distinct ranks in order of first report, and the latest t_ns. */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rec = PyList_GET_ITEM(records, i);
        offsets_for(o, rec);
        PyObject *rank = field(rec, o->rank, s_rank, &owned);
        if (rank == NULL)
            return -1;
        if (owned)
            Py_DECREF(rank);                     /* the record holds it */
        long long r = PyLong_AsLongLong(rank);
        if (r == -1 && PyErr_Occurred())
            return -1;
        size_t h = (size_t)(((unsigned long long)r * 0x9E3779B97F4A7C15ULL) >> (64 - bits));
        Py_ssize_t j;
        while ((j = sc->slots[h]) >= 0 && sc->rank_vals[j] != r)
            h = (h + 1) & mask;
        if (j < 0) {
            j = m;
            sc->slots[h] = m;
            Py_ssize_t cap = sc->cap_ranks;
            if (grow((void **)&sc->rank_objs, &sc->cap_ranks, m + 1, sizeof(PyObject *)) < 0
                    || grow((void **)&sc->rank_vals, &cap, m + 1, sizeof(long long)) < 0)
                return -1;
            sc->rank_objs[m] = rank;
            sc->rank_vals[m] = r;
            m++;
        }
        sc->rank_of[i] = j;
        PyObject *t = field(rec, o->t_ns, s_t_ns, &owned);
        if (t == NULL)
            return -1;
        if (owned)
            Py_DECREF(t);
        if (best_t == NULL) {
            best_t = t;
        } else {
            int later = PyObject_RichCompareBool(t, best_t, Py_GT);
            if (later < 0)
                return -1;
            if (later)
                best_t = t;
        }
    }
    PyObject *ranks = PyTuple_New(m);
    if (ranks == NULL)
        return -1;
    for (Py_ssize_t j = 0; j < m; j++) {
        Py_INCREF(sc->rank_objs[j]);
        PyTuple_SET_ITEM(ranks, j, sc->rank_objs[j]);
    }
    PyList_SET_ITEM(ranks_out, s, ranks);        /* replaces the None the list was made with */
    Py_DECREF(Py_None);
    Py_INCREF(best_t);
    PyList_SET_ITEM(t_out, s, best_t);
    Py_DECREF(Py_None);

    /* Pass 2: each value into its name's cell. The step's names and their cells are kept in
     * order of first appearance in sc->keys / sc->cells (the cells owned there until they go
     * into their columns). A record with the first record's key objects in the same order
     * (the usual case) fills the cells by position; any other looks its names up in `index`
     * (name -> position), made the first time one is needed. */
    PyObject *index = NULL;
    Py_ssize_t num_names = 0, first_count = -1;
    int rc = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rec = PyList_GET_ITEM(records, i);
        offsets_for(o, rec);
        PyObject *values = field(rec, o->values, s_values, &owned);
        if (values == NULL)
            goto done;
        if (owned)
            Py_DECREF(values);                   /* the record holds it */
        if (!PyDict_Check(values)) {
            PyErr_SetString(PyExc_TypeError, "values is not a dict");
            goto done;
        }
        Py_ssize_t r = sc->rank_of[i], pos = 0, j = 0;
        PyObject *key, *value;
        /* Cells by position while the keys are the first record's; at the first other key
         * the lookups below take over (setting again what was set here: the same values). */
        int by_position = first_count == PyDict_GET_SIZE(values);
        while (by_position && PyDict_Next(values, &pos, &key, &value)) {
            if (key == sc->keys[j])
                cell_set(sc->cells[j++], r, value);
            else
                by_position = 0;
        }
        if (by_position)
            continue;
        if (first_count < 0)
            first_count = PyDict_GET_SIZE(values);
        else if (index == NULL) {
            index = PyDict_New();
            for (Py_ssize_t k = 0; index != NULL && k < num_names; k++) {
                PyObject *at = PyLong_FromSsize_t(k);
                if (at == NULL || PyDict_SetItem(index, sc->keys[k], at) < 0)
                    Py_CLEAR(index);
                Py_XDECREF(at);
            }
            if (index == NULL)
                goto done;
        }
        pos = 0;
        while (PyDict_Next(values, &pos, &key, &value)) {
            Py_ssize_t at = -1;
            if (index != NULL) {
                PyObject *found = PyDict_GetItemWithError(index, key);   /* borrowed */
                if (found != NULL)
                    at = PyLong_AsSsize_t(found);
                else if (PyErr_Occurred())
                    goto done;
            }
            if (at < 0) {                        /* a name new to this step */
                Py_ssize_t cap = sc->cap_keys;
                if (grow((void **)&sc->keys, &sc->cap_keys, num_names + 1, sizeof(PyObject *)) < 0
                        || grow((void **)&sc->cells, &cap, num_names + 1, sizeof(PyObject *)) < 0)
                    goto done;
                PyObject *cell = nones(m);
                if (cell == NULL)
                    goto done;
                at = num_names++;
                sc->keys[at] = key;              /* borrowed: the record holds it */
                sc->cells[at] = cell;            /* owned until it goes into its column */
                if (index != NULL) {
                    PyObject *at_obj = PyLong_FromSsize_t(at);
                    int bad = at_obj == NULL || PyDict_SetItem(index, key, at_obj) < 0;
                    Py_XDECREF(at_obj);
                    if (bad)
                        goto done;
                }
            }
            cell_set(sc->cells[at], r, value);
        }
    }
    /* The step's names (the previous step's tuple again when they are the same), and its cells
     * into their columns. */
    PyObject *names = NULL;
    if (*prev_names != NULL && PyTuple_GET_SIZE(*prev_names) == num_names) {
        names = *prev_names;
        for (Py_ssize_t k = 0; names != NULL && k < num_names; k++)
            if (PyTuple_GET_ITEM(names, k) != sc->keys[k])
                names = NULL;
    }
    if (names != NULL) {
        Py_INCREF(names);
    } else {
        names = PyTuple_New(num_names);
        if (names == NULL)
            goto done;
        for (Py_ssize_t k = 0; k < num_names; k++) {
            Py_INCREF(sc->keys[k]);
            PyTuple_SET_ITEM(names, k, sc->keys[k]);
        }
    }
    *prev_names = names;                         /* borrowed: names_out holds it */
    PyList_SET_ITEM(names_out, s, names);
    Py_DECREF(Py_None);
    for (Py_ssize_t k = 0; k < num_names; k++) {
        PyObject *name = sc->keys[k];
        PyObject *column = PyDict_GetItemWithError(columns, name);   /* borrowed */
        if (column == NULL) {
            if (PyErr_Occurred())
                goto done;
            column = list_of_nones(num_steps);
            if (column == NULL)
                goto done;
            int bad = PyDict_SetItem(columns, name, column) < 0;
            Py_DECREF(column);
            if (bad)
                goto done;
        }
        PyObject *cell = sc->cells[k];
        sc->cells[k] = NULL;
        PyList_SetItem(column, s, cell);         /* steals the cell, releases the None */
    }
    rc = 0;

done:
    for (Py_ssize_t k = 0; k < num_names; k++)
        Py_XDECREF(sc->cells[k]);                /* the cells not handed to a column (an error) */
    Py_XDECREF(index);
    return rc;
}

static PyObject *
list_of_nones(Py_ssize_t n)
{
    PyObject *list = PyList_New(n);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF(Py_None);
        PyList_SET_ITEM(list, i, Py_None);
    }
    return list;
}

static PyObject *
gather(PyObject *self, PyObject *args)
{
    PyObject *groups;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &groups))
        return NULL;
    Py_ssize_t num_steps = PyList_GET_SIZE(groups);
    PyObject *ranks_out = list_of_nones(num_steps), *t_out = list_of_nones(num_steps),
             *names_out = list_of_nones(num_steps), *columns = PyDict_New();
    Scratch sc = {0};
    Offsets o = {0};
    PyObject *prev_names = NULL;                 /* borrowed: the last step's names */
    if (ranks_out == NULL || t_out == NULL || names_out == NULL || columns == NULL)
        goto fail;
    for (Py_ssize_t s = 0; s < num_steps; s++) {
        PyObject *records = PyList_GET_ITEM(groups, s);
        if (!PyList_Check(records)) {
            PyErr_SetString(PyExc_TypeError, "gather: a step's records are not a list");
            goto fail;
        }
        if (gather_step(records, s, num_steps, &sc, &o, ranks_out, t_out, names_out, columns, &prev_names) < 0)
            goto fail;
    }
    PyMem_Free(sc.rank_objs);
    PyMem_Free(sc.rank_vals);
    PyMem_Free(sc.rank_of);
    PyMem_Free(sc.keys);
    PyMem_Free(sc.cells);
    PyMem_Free(sc.slots);
    return Py_BuildValue("(NNNN)", ranks_out, t_out, names_out, columns);

fail:
    PyMem_Free(sc.rank_objs);
    PyMem_Free(sc.rank_vals);
    PyMem_Free(sc.rank_of);
    PyMem_Free(sc.keys);
    PyMem_Free(sc.cells);
    PyMem_Free(sc.slots);
    Py_XDECREF(ranks_out);
    Py_XDECREF(t_out);
    Py_XDECREF(names_out);
    Py_XDECREF(columns);
    return NULL;
}

/* ---- reduce_column ----------------------------------------------------------------------- */

/* The codes of reductions.py (MEAN, SUM, MAX, MIN, LAST); test_hotpath checks they agree. */
enum { OP_MEAN, OP_SUM, OP_MAX, OP_MIN, OP_LAST, NUM_OPS };

/* builtins.sum, max and min: a cell the fast paths below do not take is reduced by them, as in
 * Python, so both give the same value and type (and raise the same errors) by construction. */
static PyObject *builtin_sum, *builtin_max, *builtin_min;

/* |sum| up to 2**53: an int that a double holds exactly, so sum / n in doubles is the correctly
 * rounded quotient, which is what int / int gives in Python. */
#define EXACT_INT_LIMIT 9007199254740992LL

/* One cell through the builtins: sum / count (mean), sum, max or min of the present values. */
static PyObject *
reduce_generic(PyObject **items, Py_ssize_t n, Py_ssize_t count, int op)
{
    PyObject *present = PyList_New(count);
    if (present == NULL)
        return NULL;
    for (Py_ssize_t i = 0, j = 0; i < n; i++) {
        if (items[i] != Py_None) {
            Py_INCREF(items[i]);
            PyList_SET_ITEM(present, j++, items[i]);
        }
    }
    PyObject *func = op == OP_MAX ? builtin_max : op == OP_MIN ? builtin_min : builtin_sum;
    PyObject *result = PyObject_CallOneArg(func, present);
    Py_DECREF(present);
    if (result != NULL && op == OP_MEAN) {
        PyObject *num = PyLong_FromSsize_t(count);
        PyObject *quotient = num == NULL ? NULL : PyNumber_TrueDivide(result, num);
        Py_XDECREF(num);
        Py_DECREF(result);
        result = quotient;
    }
    return result;
}

/* One cell (None, or a non-empty tuple or list of values, None where a rank has none): the
 * reduction of its present values; one present value as it is; None if none is. Cells of
 * floats only, or of ints only (not bools), are reduced here, comparing and adding doubles or
 * 64-bit ints the way Python's own sum, max and min do for those types; any other cell (bools,
 * mixed types, big ints) goes through the builtins. */
static PyObject *
reduce_cell(PyObject *cell, int op)
{
    if (cell == Py_None)
        Py_RETURN_NONE;
    PyObject *seq = PySequence_Fast(cell, "reduce_column: a cell is not a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *result = NULL, *first = NULL;
    Py_ssize_t count = 0;
    int all_float = 1, all_int = 1;
    if (op == OP_LAST) {
        for (Py_ssize_t i = n - 1; i >= 0 && first == NULL; i--)
            if (items[i] != Py_None)
                first = items[i];
        result = first != NULL ? first : Py_None;
        Py_INCREF(result);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = items[i];
        if (x == Py_None)
            continue;
        if (first == NULL)
            first = x;
        count++;
        all_float &= PyFloat_CheckExact(x);
        all_int &= PyLong_CheckExact(x);
    }
    if (count <= 1) {                 /* one value is kept as it is; none gives None */
        result = first != NULL ? first : Py_None;
        Py_INCREF(result);
        goto done;
    }
    if (all_float) {
        if (op == OP_MAX || op == OP_MIN) {
            /* max/min: the first value that no later one is > (<) than, as the builtins */
            PyObject *best = first;
            double b = PyFloat_AS_DOUBLE(first);
            for (Py_ssize_t i = 0; i < n; i++) {
                PyObject *x = items[i];
                if (x == Py_None || x == first)
                    continue;
                double v = PyFloat_AS_DOUBLE(x);
                if (op == OP_MAX ? v > b : v < b) {
                    best = x;
                    b = v;
                }
            }
            Py_INCREF(best);
            result = best;
            goto done;
        }
#if PY_VERSION_HEX < 0x030C0000
        /* sum() of floats up to 3.11: 0 + x0 + x1 + ... in doubles (3.12 compensates: builtins) */
        double acc = 0.0;
        for (Py_ssize_t i = 0; i < n; i++)
            if (items[i] != Py_None)
                acc += PyFloat_AS_DOUBLE(items[i]);
        result = PyFloat_FromDouble(op == OP_MEAN ? acc / (double)count : acc);
        goto done;
#endif
    }
    if (all_int) {
        long long acc = 0, best_v = 0;
        PyObject *best = NULL;
        int overflow = 0;
        for (Py_ssize_t i = 0; i < n && !overflow; i++) {
            PyObject *x = items[i];
            if (x == Py_None)
                continue;
            long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
            if (overflow)
                break;
            if (op == OP_MAX || op == OP_MIN) {
                if (best == NULL || (op == OP_MAX ? v > best_v : v < best_v)) {
                    best = x;
                    best_v = v;
                }
            }
            else if (__builtin_add_overflow(acc, v, &acc))
                overflow = 1;
        }
        if (!overflow) {
            if (op == OP_MAX || op == OP_MIN) {
                Py_INCREF(best);
                result = best;
                goto done;
            }
            if (op == OP_SUM) {
                result = PyLong_FromLongLong(acc);
                goto done;
            }
            if (-EXACT_INT_LIMIT <= acc && acc <= EXACT_INT_LIMIT) {
                result = PyFloat_FromDouble((double)acc / (double)count);
                goto done;
            }
        }
    }
    result = reduce_generic(items, n, count, op);
done:
    Py_DECREF(seq);
    return result;
}

static PyObject *
reduce_column(PyObject *self, PyObject *args)
{
    PyObject *column;
    int op;
    if (!PyArg_ParseTuple(args, "Oi", &column, &op))
        return NULL;
    if (op < 0 || op >= NUM_OPS)
        return PyErr_Format(PyExc_ValueError, "reduce_column: no reduction has the code %d", op);
    PyObject *cells = PySequence_Fast(column, "reduce_column: the column is not a sequence");
    if (cells == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(cells);
    PyObject **items = PySequence_Fast_ITEMS(cells);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = reduce_cell(items[i], op);
        if (value == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, value);
    }
    Py_DECREF(cells);
    return out;
fail:
    Py_DECREF(cells);
    Py_XDECREF(out);
    return NULL;
}

/* ---- rate_sums ----------------------------------------------------------------------------- */

/* A positive finite float, or a positive int up to 2**53 (a double holds it exactly, so n / t in
 * doubles is Python's correctly rounded n / t), into *out; 0 for anything else. */
static int
positive_finite(PyObject *x, double *out)
{
    if (PyFloat_CheckExact(x)) {
        double v = PyFloat_AS_DOUBLE(x);
        *out = v;
        return v > 0.0 && v < Py_HUGE_VAL;     /* NaN fails both */
    }
    if (PyLong_CheckExact(x)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
        *out = (double)v;
        return !overflow && v > 0 && v <= EXACT_INT_LIMIT;
    }
    return 0;
}

/* sum(n_i / t_i) over one pair of cells, or None where a cell is None, empty or not all
 * positive finite numbers (see loops.rate_sums). */
static PyObject *
rate_sum(PyObject *ns, PyObject *ts)
{
    if (ns == Py_None || ts == Py_None)
        Py_RETURN_NONE;
    PyObject *nseq = PySequence_Fast(ns, "rate_sums: a cell is not a sequence");
    if (nseq == NULL)
        return NULL;
    PyObject *tseq = PySequence_Fast(ts, "rate_sums: a cell is not a sequence");
    if (tseq == NULL) {
        Py_DECREF(nseq);
        return NULL;
    }
    Py_ssize_t nn = PySequence_Fast_GET_SIZE(nseq), nt = PySequence_Fast_GET_SIZE(tseq);
    Py_ssize_t n = nt < nn ? nt : nn;            /* pairs as zip() makes them */
    PyObject **nitems = PySequence_Fast_ITEMS(nseq), **titems = PySequence_Fast_ITEMS(tseq);
    PyObject *result = NULL;
    int ok = n > 0;
    double v = 0.0;
    for (Py_ssize_t i = 0; i < nn && ok; i++)    /* every value of both cells, as loops.py */
        ok = positive_finite(nitems[i], &v);
    for (Py_ssize_t i = 0; i < nt && ok; i++)
        ok = positive_finite(titems[i], &v);
    if (!ok) {
        result = Py_NewRef(Py_None);
        goto done;
    }
#if PY_VERSION_HEX < 0x030C0000
    /* sum() of floats up to 3.11: 0 + q0 + q1 + ... in doubles */
    double acc = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        double a = 0.0, b = 1.0;
        positive_finite(nitems[i], &a);
        positive_finite(titems[i], &b);
        acc += a / b;
    }
    result = PyFloat_FromDouble(acc);
#else
    /* 3.12 on, sum() of floats compensates: the quotients through builtins.sum */
    PyObject *quotients = PyList_New(n);
    if (quotients == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        double a = 0.0, b = 1.0;
        positive_finite(nitems[i], &a);
        positive_finite(titems[i], &b);
        PyObject *q = PyFloat_FromDouble(a / b);
        if (q == NULL) {
            Py_DECREF(quotients);
            goto done;
        }
        PyList_SET_ITEM(quotients, i, q);
    }
    result = PyObject_CallOneArg(builtin_sum, quotients);
    Py_DECREF(quotients);
#endif
done:
    Py_DECREF(nseq);
    Py_DECREF(tseq);
    return result;
}

static PyObject *
rate_sums(PyObject *self, PyObject *args)
{
    PyObject *counts, *times;
    if (!PyArg_ParseTuple(args, "OO", &counts, &times))
        return NULL;
    PyObject *cseq = PySequence_Fast(counts, "rate_sums: counts is not a sequence");
    if (cseq == NULL)
        return NULL;
    PyObject *tseq = PySequence_Fast(times, "rate_sums: times is not a sequence");
    if (tseq == NULL) {
        Py_DECREF(cseq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(cseq), nt = PySequence_Fast_GET_SIZE(tseq);
    if (nt < n)
        n = nt;
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *value = rate_sum(PySequence_Fast_GET_ITEM(cseq, i), PySequence_Fast_GET_ITEM(tseq, i));
        if (value == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, value);
    }
    Py_DECREF(cseq);
    Py_DECREF(tseq);
    return out;
}

/* ---- phase_straggler ------------------------------------------------------------------------- */

/* One counted value of a phase cell: as a double, and its place in the cell (its rank's place in
 * the step's ranks). */
typedef struct {
    double v;
    Py_ssize_t pos;
} Timed;

/* Up to this many counted values per cell sort in a buffer on the stack (by insertion: stable);
 * more go to the heap (qsort by value, then place: the same order). */
#define STACK_TIMED 64

static int
timed_cmp(const void *a, const void *b)
{
    const Timed *x = a, *y = b;
    if (x->v != y->v)
        return x->v < y->v ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Sorted by value, equal values (0.0 and -0.0) in their order in the cell: Python's sorted(). */
static void
sort_timed(Timed *t, Py_ssize_t n)
{
    if (n > STACK_TIMED) {
        qsort(t, (size_t)n, sizeof(Timed), timed_cmp);
        return;
    }
    for (Py_ssize_t i = 1; i < n; i++) {
        Timed x = t[i];
        Py_ssize_t j = i;
        while (j > 0 && x.v < t[j - 1].v) {
            t[j] = t[j - 1];
            j--;
        }
        t[j] = x;
    }
}

/* Whether x counts (loops.phase_straggler): an int or a float, not a bool, finite as a double,
 * into *out: 1 it does, 0 it does not, -1 an error. Runs no Python code. */
static int
counted(PyObject *x, double *out)
{
    if (PyFloat_Check(x)) {
        *out = PyFloat_AS_DOUBLE(x);
        return isfinite(*out);
    }
    if (PyLong_Check(x) && !PyBool_Check(x)) {
        double v = PyLong_AsDouble(x);
        if (v == -1.0 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return -1;
            PyErr_Clear();                       /* past the float range: not counted */
            return 0;
        }
        *out = v;
        return isfinite(v);
    }
    return 0;
}

/* Step i's cell of a column (a PySequence_Fast, or NULL for none), borrowed: None past its end;
 * NULL with TypeError for a cell that is neither a tuple nor None. */
static PyObject *
cell_at(PyObject *seq, Py_ssize_t i)
{
    if (seq == NULL || i >= PySequence_Fast_GET_SIZE(seq))
        return Py_None;
    PyObject *cell = PySequence_Fast_GET_ITEM(seq, i);
    if (cell != Py_None && !PyTuple_Check(cell)) {
        PyErr_SetString(PyExc_TypeError, "phase_straggler: a cell is neither a tuple nor None");
        return NULL;
    }
    return cell;
}

static int
set_value(PyObject *d, PyObject *key, PyObject *value)
{
    return PyDict_CheckExact(d) ? PyDict_SetItem(d, key, value) : PyObject_SetItem(d, key, value);
}

/* The pick of one step into its values (phase and rank are borrowed; held across the calls). */
static int
write_pick(PyObject *v, PyObject *const *keys, PyObject *phase, PyObject *rank, double median, double excess)
{
    int rc = -1;
    Py_INCREF(v);
    Py_INCREF(phase);
    Py_INCREF(rank);
    PyObject *m = PyFloat_FromDouble(median), *e = m == NULL ? NULL : PyFloat_FromDouble(excess);
    if (e != NULL && set_value(v, keys[0], phase) == 0 && set_value(v, keys[1], rank) == 0
            && set_value(v, keys[2], m) == 0 && set_value(v, keys[3], e) == 0)
        rc = 0;
    Py_XDECREF(m);
    Py_XDECREF(e);
    Py_DECREF(rank);
    Py_DECREF(phase);
    Py_DECREF(v);
    return rc;
}

static PyObject *
phase_straggler(PyObject *self, PyObject *args)
{
    PyObject *columns, *step_times, *ranks, *values, *keys[4];
    double floor_fraction;
    if (!PyArg_ParseTuple(args, "OOOOd(OOOO)", &columns, &step_times, &ranks, &values, &floor_fraction,
                          &keys[0], &keys[1], &keys[2], &keys[3]))
        return NULL;
    PyObject *cols = NULL, *times_seq = NULL, *ranks_seq = NULL, *values_seq = NULL, *result = NULL;
    PyObject **phases = NULL, **seqs = NULL;     /* per column, owned: its phase index and cells */
    Py_ssize_t num_cols = 0;
    Timed stack_buf[STACK_TIMED], *buf = stack_buf;
    Py_ssize_t cap = STACK_TIMED;

    cols = PySequence_Fast(columns, "phase_straggler: columns is not a sequence");
    if (cols == NULL)
        goto done;
    num_cols = PySequence_Fast_GET_SIZE(cols);
    phases = PyMem_Calloc(num_cols ? num_cols : 1, sizeof(PyObject *));
    seqs = PyMem_Calloc(num_cols ? num_cols : 1, sizeof(PyObject *));
    if (phases == NULL || seqs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t c = 0; c < num_cols; c++) {
        PyObject *item = PySequence_Fast_GET_ITEM(cols, c);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "phase_straggler: a column is not a (phase index, column) pair");
            goto done;
        }
        phases[c] = Py_NewRef(PyTuple_GET_ITEM(item, 0));
        PyObject *col = PyTuple_GET_ITEM(item, 1);
        if (col != Py_None && (seqs[c] = PySequence_Fast(col, "phase_straggler: a column is not a sequence")) == NULL)
            goto done;
    }
    if (step_times != Py_None
            && (times_seq = PySequence_Fast(step_times, "phase_straggler: step_times is not a sequence")) == NULL)
        goto done;
    if ((ranks_seq = PySequence_Fast(ranks, "phase_straggler: ranks is not a sequence")) == NULL
            || (values_seq = PySequence_Fast(values, "phase_straggler: values is not a sequence")) == NULL)
        goto done;

    /* The sizes are read again each step: a values item that is not a dict runs Python code. */
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(values_seq) && i < PySequence_Fast_GET_SIZE(ranks_seq); i++) {
        PyObject *step_ranks = PySequence_Fast_GET_ITEM(ranks_seq, i);
        if (!PyTuple_Check(step_ranks)) {
            PyErr_SetString(PyExc_TypeError, "phase_straggler: a step's ranks are not a tuple");
            goto done;
        }
        /* The step's ranks and each cell are held while in use: an int past the float range
         * raises (and clears) an OverflowError, whose allocation may run the cyclic GC, and so
         * finalizers. */
        Py_INCREF(step_ranks);
        PyObject *cell = cell_at(times_seq, i);
        if (cell == NULL)
            goto step_fail;
        double floor = 0.0, t;
        if (cell != Py_None) {
            int have = 0, rc = 0;
            double longest = 0.0;
            Py_INCREF(cell);
            for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(cell) && rc >= 0; j++) {
                rc = counted(PyTuple_GET_ITEM(cell, j), &t);
                if (rc > 0 && (!have || t > longest)) {
                    longest = t;
                    have = 1;
                }
            }
            Py_DECREF(cell);
            if (rc < 0)
                goto step_fail;
            if (have)
                floor = floor_fraction * longest;
        }
        Py_ssize_t pick = -1, pick_pos = 0;      /* the column picked, its slowest rank's place */
        double pick_median = 0.0, pick_excess = 0.0;
        for (Py_ssize_t c = 0; c < num_cols; c++) {
            if ((cell = cell_at(seqs[c], i)) == NULL)
                goto step_fail;
            if (cell == Py_None)
                continue;
            Py_INCREF(cell);
            Py_ssize_t m = PyTuple_GET_SIZE(cell), k = 0;
            if (PyTuple_GET_SIZE(step_ranks) < m)
                m = PyTuple_GET_SIZE(step_ranks);         /* pairs as zip() makes them */
            if (m > cap) {
                Timed *grown = PyMem_Malloc(m * sizeof(Timed));
                if (grown == NULL) {
                    Py_DECREF(cell);
                    PyErr_NoMemory();
                    goto step_fail;
                }
                if (buf != stack_buf)
                    PyMem_Free(buf);
                buf = grown;
                cap = m;
            }
            for (Py_ssize_t j = 0; j < m; j++) {
                int rc = counted(PyTuple_GET_ITEM(cell, j), &t);
                if (rc < 0) {
                    Py_DECREF(cell);
                    goto step_fail;
                }
                if (rc) {
                    buf[k].v = t;
                    buf[k++].pos = j;
                }
            }
            Py_DECREF(cell);
            if (k < 2)
                continue;
            sort_timed(buf, k);
            Py_ssize_t n = k - 1, mid = n / 2;   /* the others: all but the slowest */
            double t_slow = buf[n].v;
            double median = n % 2 ? buf[mid].v : (buf[mid - 1].v + buf[mid].v) / 2;
            double excess = t_slow - median;
            int significant = floor > 0 && excess >= floor;
            if (significant || pick < 0 || excess > pick_excess) {
                Py_ssize_t j = n;                /* the first in the cell of the values equal to t_slow */
                while (j > 0 && buf[j - 1].v == t_slow)
                    j--;
                pick = c;
                pick_pos = buf[j].pos;
                pick_median = median;
                pick_excess = excess;
            }
            if (significant)
                break;
        }
        if (pick >= 0 && write_pick(PySequence_Fast_GET_ITEM(values_seq, i), keys, phases[pick],
                                    PyTuple_GET_ITEM(step_ranks, pick_pos), pick_median, pick_excess) < 0)
            goto step_fail;
        Py_DECREF(step_ranks);
        continue;
step_fail:
        Py_DECREF(step_ranks);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    if (buf != stack_buf)
        PyMem_Free(buf);
    for (Py_ssize_t c = 0; phases != NULL && c < num_cols; c++)
        Py_XDECREF(phases[c]);
    for (Py_ssize_t c = 0; seqs != NULL && c < num_cols; c++)
        Py_XDECREF(seqs[c]);
    PyMem_Free(phases);
    PyMem_Free(seqs);
    Py_XDECREF(cols);
    Py_XDECREF(times_seq);
    Py_XDECREF(ranks_seq);
    Py_XDECREF(values_seq);
    return result;
}

/* ---- read_ring ----------------------------------------------------------------------------- */

#define RING_HEADER 256
#define RING_CAPACITY_AT 8
#define RING_WPOS_AT 64
#define RING_RPOS_AT 128
#define RING_RCOUNT_AT 136
#define RING_SKIP 0xFFFFFFFFu

/* What a read took off a ring, told to its writer: the records read added to their count, then the
 * read position, each stored with release order (the frames are copied out by then). */
static void
ring_consumed(unsigned char *base, uint64_t r, uint64_t start, Py_ssize_t taken)
{
    if (taken) {
        uint64_t *count = (uint64_t *)(base + RING_RCOUNT_AT);
        __atomic_store_n(count, *count + (uint64_t)taken, __ATOMIC_RELEASE);
    }
    if (r != start)
        __atomic_store_n((uint64_t *)(base + RING_RPOS_AT), r, __ATOMIC_RELEASE);
}

/* A record ring's frames from read position r (see loops.read_ring): the write position loaded
 * with acquire order (the client's writer stores it with release order after the record), the
 * read position stored with release order after the frames are copied out. */
static PyObject *
read_ring(PyObject *self, PyObject *args)
{
    PyObject *ring, *out;
    unsigned long long r;
    Py_ssize_t max_frames, max_bytes;
    unsigned long long max_frame;
    if (!PyArg_ParseTuple(args, "OKO!nnK", &ring, &r, &PyList_Type, &out, &max_frames, &max_bytes, &max_frame))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(ring, &view, PyBUF_WRITABLE) < 0)
        return NULL;
    unsigned char *base = (unsigned char *)view.buf;
    uint64_t cap = 0, w = 0, start = r;
    Py_ssize_t taken = 0, size = 0;
    const char *broken = NULL;
    uint32_t n = 0;
    if (view.len > RING_HEADER && ((uintptr_t)base) % 8 == 0) {
        memcpy(&cap, base + RING_CAPACITY_AT, 8);
        w = __atomic_load_n((uint64_t *)(base + RING_WPOS_AT), __ATOMIC_ACQUIRE);
    }
    if (cap == 0 || (uint64_t)view.len != RING_HEADER + cap || w < r || w - r > cap)
        broken = "positions";
    while (broken == NULL && r < w && taken < max_frames && size < max_bytes) {
        uint64_t off = r % cap;
        memcpy(&n, base + RING_HEADER + off, 4);
        if (n == RING_SKIP) {
            r += cap - off;
            continue;
        }
        uint64_t rec = 8 + (((uint64_t)n + 7) & ~(uint64_t)7);
        if (n > max_frame || off + rec > cap || r + rec > w) {
            broken = "record";
            break;
        }
        PyObject *frame = PyBytes_FromStringAndSize((const char *)base + RING_HEADER + off + 8, n);
        if (frame == NULL || PyList_Append(out, frame) < 0) {
            Py_XDECREF(frame);
            ring_consumed(base, r, start, taken);
            PyBuffer_Release(&view);
            return NULL;
        }
        Py_DECREF(frame);
        r += rec;
        taken++;
        size += n;
    }
    ring_consumed(base, r, start, taken);
    PyBuffer_Release(&view);
    if (broken != NULL) {
        if (broken[0] == 'p')
            PyErr_Format(PyExc_ValueError, "write position %llu, read position %llu, capacity %llu",
                         (unsigned long long)w, (unsigned long long)r, (unsigned long long)cap);
        else
            PyErr_Format(PyExc_ValueError, "a record of %llu bytes at %llu (write position %llu)",
                         (unsigned long long)n, (unsigned long long)r, (unsigned long long)w);
        return NULL;
    }
    return Py_BuildValue("Knn", (unsigned long long)r, taken, size);
}

/* ---- module ------------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"read_frames_upto", read_frames_upto, METH_VARARGS,
     "Frames from next_frame() until `empty`, max_frames, or max_bytes reached; and their bytes."},
    {"read_ring", read_ring, METH_VARARGS,
     "A record ring's frames from read position r, into out; (new read position, frames, bytes)."},
    {"decode_frames", decode_frames, METH_VARARGS, "Each frame's record: metrics frames read here, any other by `decode`."},
    {"tally", tally, METH_VARARGS, "The receiver's accounting of a batch of decoded records."},
    {"gather", gather, METH_VARARGS, "Columns from the records of closed steps."},
    {"rate_sums", rate_sums, METH_VARARGS, "Per pair of cells sum(n_i / t_i), or None where not all positive finite."},
    {"phase_straggler", phase_straggler, METH_VARARGS, "Per step, the slow rank of the likeliest cause phase, into its values."},
    {"reduce_column", reduce_column, METH_VARARGS, "One reduced value per cell of a column (op: a reduction's code)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hotpath", "The daemon's inner loops in C (see telemetry/daemon/hotpath.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_values, "values");
    INTERN(s_rank, "rank");
    INTERN(s_t_ns, "t_ns");
    INTERN(s_src, "src");
    INTERN(s_seq, "seq");
    INTERN(s_dropped, "dropped");
#undef INTERN
    PyObject *builtins = PyEval_GetBuiltins();          /* borrowed */
    if (builtins == NULL)
        return NULL;
    builtin_sum = PyDict_GetItemString(builtins, "sum");
    builtin_max = PyDict_GetItemString(builtins, "max");
    builtin_min = PyDict_GetItemString(builtins, "min");
    if (builtin_sum == NULL || builtin_max == NULL || builtin_min == NULL) {
        PyErr_SetString(PyExc_ImportError, "_hotpath: builtins sum, max or min not found");
        return NULL;
    }
    Py_INCREF(builtin_sum);
    Py_INCREF(builtin_max);
    Py_INCREF(builtin_min);
    return PyModule_Create(&module);
}
