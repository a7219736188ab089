/* The daemon's per-record and per-step inner loops in C: an optional accelerator.
 *
 * telemetry/daemon/hotpath.py imports this module when it was built (setup.py, `optional=True`:
 * an install without a C compiler still works) and falls back to the pure-Python loops
 * otherwise, or when TELEMETRY_PURE_PYTHON=1. Both produce the same results; the tests run
 * both (tests/test_hotpath.py). They handle the usual case; for anything else they say so (or
 * raise TypeError) and the caller does that batch in Python:
 *
 *   read_frames(next_frame, empty, max_frames) -> list[bytes]
 *       calls next_frame() until it raises `empty` or max_frames were read.
 *   tally(recs, metrics_type, bye_type, good_names) -> (key_orders, all_metrics, num_byes,
 *                                                        per_src, unknown)
 *       the receiver's accounting of a batch of decoded records: per metrics record its
 *       canonical key order, good_names[tuple(values)] (None for other kinds); per src (src,
 *       rank, count, min_seq, dropped_at_min, max_seq, max_dropped) over the batch, in order of
 *       first appearance; the indexes of key orders not in good_names yet (their names are
 *       unchecked: the caller redoes such a batch in Python).
 *   add_many(agg, recs, key_orders, start, force_first, now, done, late, acc_type, metrics_type)
 *       Aggregator.add_many's loop from recs[start], appending to `done` and `late`; stops
 *       before a record of a rank not in agg._steady (unless it is recs[start] and force_first)
 *       and returns its index (len(recs): all added): the caller notes the rank and calls again.
 *   reduce_group(group, keys, ops, n, view) -> list[dict]
 *       Aggregator._reduce_group: steps whose n ranks logged the same keys in the same order,
 *       reduced a metric at a time with the straggler view; sets acc.cols. ops[j] is 0 mean,
 *       1 sum, 2 max, 3 min, or a callable taking the n-tuple. view: the indexes in keys of
 *       perf/step_time, perf/tokens, perf/attn_doc_len_sq (-1: not logged).
 *
 * Reductions give what Python's builtins give: sum() of floats is left to right from 0 (as
 * CPython < 3.12 does; later versions compensate, so there the builtin is called), max() and
 * min() return the first extreme item itself, a mean is the sum divided by n.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

static PyObject *s_values, *s_src, *s_rank, *s_seq, *s_dropped, *s_by_rank, *s_cols;
static PyObject *s_st_max, *s_st_min, *s_slowest;
static PyObject *s_step, *s_t_ns, *s_keys, *s_uniform, *s_pending, *s_closed, *s_step_heap, *s_by_age,
                *s_steady, *s_expected, *s_num_expected, *s_append, *s_close_through;
static PyObject *builtin_sum, *builtin_max, *builtin_min, *heappush;


/* ---- read_frames ------------------------------------------------------------------------ */

static PyObject *
read_frames(PyObject *self, PyObject *args)
{
    PyObject *next_frame, *empty;
    Py_ssize_t max_frames;
    if (!PyArg_ParseTuple(args, "OOn", &next_frame, &empty, &max_frames))
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < max_frames; i++) {
        PyObject *frame = PyObject_CallNoArgs(next_frame);
        if (frame == NULL) {
            if (PyErr_ExceptionMatches(empty)) {
                PyErr_Clear();
                break;
            }
            Py_DECREF(out);
            return NULL;
        }
        int rc = PyList_Append(out, frame);
        Py_DECREF(frame);
        if (rc < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* ---- tally -------------------------------------------------------------------------------- */

typedef struct {
    PyObject *src;              /* borrowed from a record, which the caller's list keeps alive */
    long long src_id, rank, count, min_seq, dropped_at_min, max_seq, max_dropped;
} SrcTally;

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

static int
field_ll(PyObject *rec, Py_ssize_t offset, PyObject *name, long long *out)
{
    int owned;
    PyObject *v = field(rec, offset, name, &owned);
    if (v == NULL)
        return -1;
    *out = PyLong_AsLongLong(v);
    if (owned)
        Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* Whether dict `values` has exactly the keys of tuple `keys`, the same objects in the same order
 * (msgspec hands out one str object per distinct key, so a run's records usually do). */
static int
same_key_objects(PyObject *values, PyObject *keys)
{
    if (PyDict_GET_SIZE(values) != PyTuple_GET_SIZE(keys))
        return 0;
    Py_ssize_t pos = 0, j = 0;
    PyObject *k, *v;
    while (PyDict_Next(values, &pos, &k, &v))
        if (k != PyTuple_GET_ITEM(keys, j++))
            return 0;
    return 1;
}

/* Up to this many srcs in a batch are found by a linear search, beyond it through a dict. */
#define LINEAR_SRCS 32

static PyObject *
tally(PyObject *self, PyObject *args)
{
    PyObject *recs, *metrics_type, *bye_type, *good_names;
    if (!PyArg_ParseTuple(args, "O!OOO!", &PyList_Type, &recs, &metrics_type, &bye_type,
                          &PyDict_Type, &good_names))
        return NULL;
    /* The header fields are the same slots in every record type (they come from one base). */
    Py_ssize_t at_values = slot_offset(metrics_type, s_values), at_src = slot_offset(metrics_type, s_src),
               at_rank = slot_offset(metrics_type, s_rank), at_seq = slot_offset(metrics_type, s_seq),
               at_dropped = slot_offset(metrics_type, s_dropped);
    Py_ssize_t n = PyList_GET_SIZE(recs);
    PyObject *keys_list = PyList_New(n);
    PyObject *unknown = PyList_New(0);       /* indexes of key orders not in good_names */
    PyObject *index = NULL;                  /* src -> its slot in `tallies`, past LINEAR_SRCS */
    PyObject *prev_keys = NULL;              /* borrowed: the last canonical key order seen */
    SrcTally *tallies = NULL;
    Py_ssize_t num_src = 0, cap = 0;
    long long num_byes = 0;
    int all_metrics = 1, owned;
    if (keys_list == NULL || unknown == NULL)
        goto fail;

    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rec = PyList_GET_ITEM(recs, i);
        int is_metrics = (PyObject *)Py_TYPE(rec) == metrics_type;
        Py_ssize_t o_src = is_metrics ? at_src : -1, o_rank = is_metrics ? at_rank : -1,
                   o_seq = is_metrics ? at_seq : -1, o_dropped = is_metrics ? at_dropped : -1;
        if (is_metrics) {
            PyObject *values = field(rec, at_values, s_values, &owned);
            if (values == NULL)
                goto fail;
            if (!PyDict_CheckExact(values)) {
                if (owned)
                    Py_DECREF(values);
                PyErr_SetString(PyExc_TypeError, "values is not a dict");
                goto fail;
            }
            PyObject *canonical = NULL;
            if (prev_keys != NULL && same_key_objects(values, prev_keys)) {
                canonical = prev_keys;
            } else {
                PyObject *keys = PyTuple_New(PyDict_GET_SIZE(values));
                if (keys == NULL) {
                    if (owned)
                        Py_DECREF(values);
                    goto fail;
                }
                Py_ssize_t pos = 0, j = 0;
                PyObject *k, *v;
                while (PyDict_Next(values, &pos, &k, &v)) {
                    Py_INCREF(k);
                    PyTuple_SET_ITEM(keys, j++, k);
                }
                canonical = PyDict_GetItemWithError(good_names, keys);   /* borrowed */
                if (canonical == NULL) {
                    if (!PyErr_Occurred()) {     /* not checked yet: the caller does */
                        PyObject *at = PyLong_FromSsize_t(i);
                        if (at != NULL && PyList_Append(unknown, at) == 0) {
                            PyList_SET_ITEM(keys_list, i, keys);
                            keys = NULL;
                        }
                        Py_XDECREF(at);
                    }
                    if (keys != NULL) {
                        Py_DECREF(keys);
                        if (owned)
                            Py_DECREF(values);
                        goto fail;
                    }
                } else {
                    Py_DECREF(keys);
                    prev_keys = canonical;
                }
            }
            if (canonical != NULL) {
                Py_INCREF(canonical);
                PyList_SET_ITEM(keys_list, i, canonical);
            }
            if (owned)
                Py_DECREF(values);
        } else {
            all_metrics = 0;
            if ((PyObject *)Py_TYPE(rec) == bye_type)
                num_byes++;
            Py_INCREF(Py_None);
            PyList_SET_ITEM(keys_list, i, Py_None);
        }

        long long src_id, seq, dropped;
        PyObject *src = field(rec, o_src, s_src, &owned);
        if (src == NULL)
            goto fail;
        if (owned)
            Py_DECREF(src);                  /* the record holds it */
        src_id = PyLong_AsLongLong(src);
        if (src_id == -1 && PyErr_Occurred())
            goto fail;
        Py_ssize_t slot = -1;
        if (index == NULL) {
            for (Py_ssize_t j = 0; j < num_src; j++) {
                if (tallies[j].src_id == src_id) {
                    slot = j;
                    break;
                }
            }
        } else {
            PyObject *found = PyDict_GetItemWithError(index, src);
            if (found != NULL)
                slot = PyLong_AsSsize_t(found);
            else if (PyErr_Occurred())
                goto fail;
        }
        if (slot < 0) {
            if (num_src == cap) {
                cap = cap ? cap * 2 : 16;
                SrcTally *grown = PyMem_Realloc(tallies, cap * sizeof(SrcTally));
                if (grown == NULL) {
                    PyErr_NoMemory();
                    goto fail;
                }
                tallies = grown;
            }
            slot = num_src++;
            if (num_src == LINEAR_SRCS + 1 && index == NULL) {
                index = PyDict_New();
                for (Py_ssize_t j = 0; index != NULL && j < num_src - 1; j++) {
                    PyObject *slot_obj = PyLong_FromSsize_t(j);
                    if (slot_obj == NULL || PyDict_SetItem(index, tallies[j].src, slot_obj) < 0)
                        Py_CLEAR(index);
                    Py_XDECREF(slot_obj);
                }
                if (index == NULL)
                    goto fail;
            }
            if (index != NULL) {
                PyObject *slot_obj = PyLong_FromSsize_t(slot);
                int rc = slot_obj == NULL ? -1 : PyDict_SetItem(index, src, slot_obj);
                Py_XDECREF(slot_obj);
                if (rc < 0)
                    goto fail;
            }
            SrcTally *t = &tallies[slot];
            if (field_ll(rec, o_rank, s_rank, &t->rank) < 0)
                goto fail;
            t->src = src;
            t->src_id = src_id;
            t->count = 0;
            t->min_seq = t->dropped_at_min = t->max_dropped = 0;
            t->max_seq = -1;
        }
        if (field_ll(rec, o_seq, s_seq, &seq) < 0 || field_ll(rec, o_dropped, s_dropped, &dropped) < 0)
            goto fail;
        SrcTally *t = &tallies[slot];
        /* As Receiver.take does record by record: min_seq and its dropped come from the first
         * record with the lowest seq. */
        if (t->count == 0 || seq < t->min_seq) {
            t->min_seq = seq;
            t->dropped_at_min = dropped;
        }
        if (seq > t->max_seq)
            t->max_seq = seq;
        if (dropped > t->max_dropped)
            t->max_dropped = dropped;
        t->count++;
    }

    PyObject *per_src = PyList_New(num_src);
    if (per_src == NULL)
        goto fail;
    for (Py_ssize_t j = 0; j < num_src; j++) {
        SrcTally *t = &tallies[j];
        PyObject *row = Py_BuildValue("(OLLLLLL)", t->src, t->rank, t->count, t->min_seq,
                                      t->dropped_at_min, t->max_seq, t->max_dropped);
        if (row == NULL) {
            Py_DECREF(per_src);
            goto fail;
        }
        PyList_SET_ITEM(per_src, j, row);
    }
    PyMem_Free(tallies);
    Py_XDECREF(index);
    return Py_BuildValue("(NOLNN)", keys_list, all_metrics ? Py_True : Py_False, num_byes,
                         per_src, unknown);

fail:
    PyMem_Free(tallies);
    Py_XDECREF(index);
    Py_XDECREF(keys_list);
    Py_XDECREF(unknown);
    return NULL;
}

/* ---- add_many ----------------------------------------------------------------------------- */

/* expected.issubset(by_rank): every expected rank has reported. */
static int
all_reported(PyObject *expected, PyObject *by_rank)
{
    PyObject *it = PyObject_GetIter(expected), *rank;
    if (it == NULL)
        return -1;
    int all = 1;
    while (all == 1 && (rank = PyIter_Next(it)) != NULL) {
        all = PyDict_Contains(by_rank, rank);
        Py_DECREF(rank);
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : all;
}

static PyObject *
add_many(PyObject *self, PyObject *args)
{
    PyObject *agg, *recs, *key_orders, *now, *done, *late, *acc_type, *metrics_type;
    Py_ssize_t start;
    int force_first;
    if (!PyArg_ParseTuple(args, "OO!O!npOO!O!OO", &agg, &PyList_Type, &recs, &PyList_Type, &key_orders,
                          &start, &force_first, &now, &PyList_Type, &done, &PyList_Type, &late,
                          &acc_type, &metrics_type))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(recs);
    if (PyList_GET_SIZE(key_orders) != n) {
        PyErr_SetString(PyExc_ValueError, "add_many: one key order per record");
        return NULL;
    }
    PyObject *pending = PyObject_GetAttr(agg, s_pending);
    PyObject *closed = PyObject_GetAttr(agg, s_closed);
    PyObject *heap = PyObject_GetAttr(agg, s_step_heap);
    PyObject *by_age = PyObject_GetAttr(agg, s_by_age);
    PyObject *steady = PyObject_GetAttr(agg, s_steady);
    PyObject *expected = PyObject_GetAttr(agg, s_expected);
    PyObject *num_expected_obj = PyObject_GetAttr(agg, s_num_expected);
    Py_ssize_t num_expected = num_expected_obj ? PyLong_AsSsize_t(num_expected_obj) : -1;
    Py_ssize_t at_step = slot_offset(metrics_type, s_step), at_rank = slot_offset(metrics_type, s_rank),
               at_values = slot_offset(metrics_type, s_values), at_t_ns = slot_offset(metrics_type, s_t_ns);
    Py_ssize_t at_acc_keys = slot_offset(acc_type, s_keys), at_acc_by_rank = slot_offset(acc_type, s_by_rank),
               at_acc_t_ns = slot_offset(acc_type, s_t_ns);
    Py_ssize_t i = start;
    if (pending == NULL || closed == NULL || heap == NULL || by_age == NULL || steady == NULL
            || expected == NULL || (num_expected == -1 && PyErr_Occurred()))
        goto fail;
    if (!PyDict_Check(pending) || !PyDict_Check(closed) || !PyList_Check(heap)
            || !PyAnySet_Check(steady) || !PyAnySet_Check(expected)) {
        PyErr_SetString(PyExc_TypeError, "add_many: not an Aggregator");
        goto fail;
    }

    for (; i < n; i++) {
        PyObject *rec = PyList_GET_ITEM(recs, i), *keys = PyList_GET_ITEM(key_orders, i);
        int typed = (PyObject *)Py_TYPE(rec) == metrics_type, o1 = 0, o2 = 0, o3 = 0, o4 = 0;
        PyObject *step = NULL, *rank = NULL, *values = NULL, *t_ns = NULL, *acc = NULL, *by_rank = NULL;
        int ok = 0;
        if ((step = field(rec, typed ? at_step : -1, s_step, &o1)) == NULL
                || (rank = field(rec, typed ? at_rank : -1, s_rank, &o2)) == NULL
                || (values = field(rec, typed ? at_values : -1, s_values, &o3)) == NULL
                || (t_ns = field(rec, typed ? at_t_ns : -1, s_t_ns, &o4)) == NULL)
            goto next;
        acc = PyDict_GetItemWithError(pending, step);     /* borrowed */
        if (acc == NULL && PyErr_Occurred())
            goto next;
        if (acc == NULL) {
            /* closed is an OrderedDict, a dict underneath: looked up as one (no KeyError). */
            PyObject *ranks_then = PyDict_GetItemWithError(closed, step);   /* borrowed */
            if (ranks_then == NULL) {
                if (PyErr_Occurred())
                    goto next;
            } else {
                int had = PySequence_Contains(ranks_then, rank);
                if (had < 0)
                    goto next;
                if (!had) {                  /* its step went out without it: late */
                    ok = PyList_Append(late, rec) == 0 ? 2 : 0;
                    goto next;
                }
            }
        }
        if (!(force_first && i == start)) {
            int is_steady = PySet_Contains(steady, rank);
            if (is_steady < 0)
                goto next;
            if (!is_steady) {                /* the caller notes the rank, then calls again */
                ok = 3;
                goto next;
            }
        }
        /* Its slots are read at their offsets only in an accumulator of the type given. */
        int acc_typed = acc != NULL && (PyObject *)Py_TYPE(acc) == acc_type;
        if (acc == NULL) {
            acc = PyObject_CallFunctionObjArgs(acc_type, step, now, keys, NULL);
            if (acc == NULL)
                goto next;
            int rc = PyDict_SetItem(pending, step, acc);
            Py_DECREF(acc);                  /* pending holds it */
            if (rc < 0)
                goto next;
            PyObject *pushed = PyObject_CallFunctionObjArgs(heappush, heap, step, NULL);
            if (pushed == NULL)
                goto next;
            Py_DECREF(pushed);
            PyObject *appended = PyObject_CallMethodOneArg(by_age, s_append, acc);
            if (appended == NULL)
                goto next;
            Py_DECREF(appended);
            acc_typed = (PyObject *)Py_TYPE(acc) == acc_type;
        } else {
            int o5;
            PyObject *acc_keys = field(acc, acc_typed ? at_acc_keys : -1, s_keys, &o5);
            if (acc_keys == NULL)
                goto next;
            if (o5)
                Py_DECREF(acc_keys);
            if (acc_keys != keys && PyObject_SetAttr(acc, s_uniform, Py_False) < 0)
                goto next;
        }
        int o6;
        by_rank = field(acc, acc_typed ? at_acc_by_rank : -1, s_by_rank, &o6);
        if (by_rank == NULL)
            goto next;
        if (!o6)
            Py_INCREF(by_rank);
        if (!PyDict_Check(by_rank)) {
            PyErr_SetString(PyExc_TypeError, "by_rank is not a dict");
            goto next;
        }
        PyObject *prev = PyDict_SetDefault(by_rank, rank, values);     /* borrowed */
        if (prev == NULL)
            goto next;
        if (prev != values) {                /* this rank logged this step twice: merge */
            PyObject *merged = PyDict_Copy(prev);
            if (merged == NULL || PyDict_Update(merged, values) < 0
                    || PyDict_SetItem(by_rank, rank, merged) < 0) {
                Py_XDECREF(merged);
                goto next;
            }
            Py_DECREF(merged);
            if (PyObject_SetAttr(acc, s_uniform, Py_False) < 0)
                goto next;
        }
        int o7;
        PyObject *acc_t = field(acc, acc_typed ? at_acc_t_ns : -1, s_t_ns, &o7);
        if (acc_t == NULL)
            goto next;
        int later = PyObject_RichCompareBool(t_ns, acc_t, Py_GT);
        if (o7)
            Py_DECREF(acc_t);
        if (later < 0 || (later && PyObject_SetAttr(acc, s_t_ns, t_ns) < 0))
            goto next;
        if (PyDict_GET_SIZE(by_rank) >= num_expected) {
            int all = all_reported(expected, by_rank);
            if (all < 0)
                goto next;
            if (all) {
                PyObject *closing = PyObject_CallMethodOneArg(agg, s_close_through, step);
                if (closing == NULL)
                    goto next;
                int rc = PyList_Check(closing) ? 0 : -1;
                for (Py_ssize_t j = 0; rc == 0 && j < PyList_GET_SIZE(closing); j++)
                    rc = PyList_Append(done, PyList_GET_ITEM(closing, j));
                Py_DECREF(closing);
                if (rc < 0) {
                    if (!PyErr_Occurred())
                        PyErr_SetString(PyExc_TypeError, "_close_through did not return a list");
                    goto next;
                }
            }
        }
        ok = 1;
    next:
        Py_XDECREF(by_rank);
        if (o1) Py_XDECREF(step);
        if (o2) Py_XDECREF(rank);
        if (o3) Py_XDECREF(values);
        if (o4) Py_XDECREF(t_ns);
        if (ok == 0)
            goto fail;
        if (ok == 3)
            break;
    }
    Py_DECREF(pending);
    Py_DECREF(closed);
    Py_DECREF(heap);
    Py_DECREF(by_age);
    Py_DECREF(steady);
    Py_DECREF(expected);
    Py_DECREF(num_expected_obj);
    return PyLong_FromSsize_t(i);

fail:
    Py_XDECREF(pending);
    Py_XDECREF(closed);
    Py_XDECREF(heap);
    Py_XDECREF(by_age);
    Py_XDECREF(steady);
    Py_XDECREF(expected);
    Py_XDECREF(num_expected_obj);
    return NULL;
}

/* ---- reduce_group ------------------------------------------------------------------------- */

/* sum(col) as the builtin computes it. */
static PyObject *
col_sum(PyObject **col, Py_ssize_t n, PyObject *tuple)
{
#if PY_VERSION_HEX < 0x030C0000
    double acc = 0.0;
    Py_ssize_t i;
    for (i = 0; i < n && PyFloat_CheckExact(col[i]); i++)
        acc += PyFloat_AS_DOUBLE(col[i]);
    if (i == n)
        return PyFloat_FromDouble(acc);
#endif
    return PyObject_CallOneArg(builtin_sum, tuple);
}

/* max(col) / min(col): the first extreme item itself. */
static PyObject *
col_extreme(PyObject **col, Py_ssize_t n, int op)
{
    PyObject *best = col[0];
    for (Py_ssize_t i = 1; i < n; i++) {
        PyObject *item = col[i];
        int better;
        if (PyFloat_CheckExact(item) && PyFloat_CheckExact(best)) {
            double a = PyFloat_AS_DOUBLE(item), b = PyFloat_AS_DOUBLE(best);
            better = op == Py_GT ? a > b : a < b;
        } else {
            better = PyObject_RichCompareBool(item, best, op);
            if (better < 0)
                return NULL;
        }
        if (better)
            best = item;
    }
    Py_INCREF(best);
    return best;
}

static PyObject *
reduce_one(PyObject *op, PyObject **col, Py_ssize_t n, PyObject *tuple, PyObject *n_obj)
{
    if (PyLong_CheckExact(op)) {
        long code = PyLong_AsLong(op);
        if (code == 0) {
            PyObject *total = col_sum(col, n, tuple);
            if (total == NULL)
                return NULL;
            PyObject *mean;
            if (PyFloat_CheckExact(total))
                mean = PyFloat_FromDouble(PyFloat_AS_DOUBLE(total) / (double)n);
            else
                mean = PyNumber_TrueDivide(total, n_obj);
            Py_DECREF(total);
            return mean;
        }
        if (code == 1)
            return col_sum(col, n, tuple);
        if (code == 2)
            return col_extreme(col, n, Py_GT);
        if (code == 3)
            return col_extreme(col, n, Py_LT);
        PyErr_SetString(PyExc_ValueError, "unknown reduction code");
        return NULL;
    }
    return PyObject_CallOneArg(op, tuple);
}

static PyObject *
reduce_group(PyObject *self, PyObject *args)
{
    PyObject *group, *keys, *ops, *view;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "O!O!O!nO!", &PyList_Type, &group, &PyTuple_Type, &keys,
                          &PyTuple_Type, &ops, &n, &PyTuple_Type, &view))
        return NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(keys);
    if (PyTuple_GET_SIZE(ops) != k || PyTuple_GET_SIZE(view) != 3 || n < 1 || k < 1) {
        PyErr_SetString(PyExc_ValueError, "reduce_group: bad arguments");
        return NULL;
    }
    Py_ssize_t at[3];
    for (int v = 0; v < 3; v++) {
        at[v] = PyLong_AsSsize_t(PyTuple_GET_ITEM(view, v));
        if (at[v] == -1 && PyErr_Occurred())
            return NULL;
        if (at[v] >= k) {
            PyErr_SetString(PyExc_ValueError, "reduce_group: view index out of range");
            return NULL;
        }
    }
    Py_ssize_t num_steps = PyList_GET_SIZE(group);
    PyObject **vals = PyMem_Malloc(sizeof(PyObject *) * (n * k + n));   /* [rank][metric], ranks */
    PyObject **col = PyMem_Malloc(sizeof(PyObject *) * n);
    PyObject *out = PyList_New(num_steps);
    PyObject *n_obj = PyLong_FromSsize_t(n);
    if (vals == NULL || col == NULL || out == NULL || n_obj == NULL) {
        if (vals == NULL || col == NULL)
            PyErr_NoMemory();
        goto fail;
    }
    PyObject **ranks = vals + n * k;

    for (Py_ssize_t s = 0; s < num_steps; s++) {
        PyObject *acc = PyList_GET_ITEM(group, s);
        PyObject *by_rank = PyObject_GetAttr(acc, s_by_rank);
        if (by_rank == NULL)
            goto fail;
        if (!PyDict_CheckExact(by_rank) || PyDict_GET_SIZE(by_rank) != n) {
            Py_DECREF(by_rank);
            PyErr_SetString(PyExc_TypeError, "a step's ranks are not the group's");
            goto fail;
        }
        /* Borrowed references: by_rank holds the rows, the rows hold the values. by_rank is
         * released at the end of this step's turn. */
        Py_ssize_t pos = 0, r = 0;
        PyObject *rank, *row;
        while (PyDict_Next(by_rank, &pos, &rank, &row)) {
            if (!PyDict_CheckExact(row) || PyDict_GET_SIZE(row) != k) {
                Py_DECREF(by_rank);
                PyErr_SetString(PyExc_TypeError, "a rank's keys are not the group's");
                goto fail;
            }
            ranks[r] = rank;
            Py_ssize_t rpos = 0, j = 0;
            PyObject *key, *value;
            while (PyDict_Next(row, &rpos, &key, &value))
                vals[r * k + j++] = value;
            r++;
        }

        PyObject *rec = PyDict_New();
        if (rec == NULL) {
            Py_DECREF(by_rank);
            goto fail;
        }
        PyList_SET_ITEM(out, s, rec);
        PyObject *view_tuples[3] = {NULL, NULL, NULL};
        int ok = 1;
        for (Py_ssize_t j = 0; j < k && ok; j++) {
            PyObject *tuple = PyTuple_New(n);
            if (tuple == NULL) {
                ok = 0;
                break;
            }
            for (Py_ssize_t i = 0; i < n; i++) {
                col[i] = vals[i * k + j];
                Py_INCREF(col[i]);
                PyTuple_SET_ITEM(tuple, i, col[i]);
            }
            PyObject *reduced = reduce_one(PyTuple_GET_ITEM(ops, j), col, n, tuple, n_obj);
            if (reduced == NULL || PyDict_SetItem(rec, PyTuple_GET_ITEM(keys, j), reduced) < 0)
                ok = 0;
            Py_XDECREF(reduced);
            for (int v = 0; v < 3; v++) {
                if (at[v] == j) {
                    Py_INCREF(tuple);
                    view_tuples[v] = tuple;
                }
            }
            Py_DECREF(tuple);
        }
        PyObject *times = view_tuples[0];
        if (ok && times != NULL) {
            /* The straggler view, as Aggregator._reduce_group computes it. */
            PyObject **t = &PyTuple_GET_ITEM(times, 0);
            PyObject *st_max = col_extreme(t, n, Py_GT);
            PyObject *st_min = st_max ? col_extreme(t, n, Py_LT) : NULL;
            Py_ssize_t slowest = -1;
            for (Py_ssize_t i = 0; st_min != NULL && ok && i < n && slowest < 0; i++) {
                int eq = PyObject_RichCompareBool(t[i], st_max, Py_EQ);
                if (eq < 0)
                    ok = 0;
                else if (eq)
                    slowest = i;
            }
            if (st_min == NULL || slowest < 0
                    || PyDict_SetItem(rec, s_st_max, st_max) < 0
                    || PyDict_SetItem(rec, s_st_min, st_min) < 0
                    || PyDict_SetItem(rec, s_slowest, ranks[slowest]) < 0)
                ok = 0;
            Py_XDECREF(st_max);
            Py_XDECREF(st_min);
            if (ok) {
                PyObject *cols = PyTuple_Pack(3, view_tuples[1] ? view_tuples[1] : Py_None,
                                              view_tuples[2] ? view_tuples[2] : Py_None, times);
                if (cols == NULL || PyObject_SetAttr(acc, s_cols, cols) < 0)
                    ok = 0;
                Py_XDECREF(cols);
            }
        }
        for (int v = 0; v < 3; v++)
            Py_XDECREF(view_tuples[v]);
        Py_DECREF(by_rank);
        if (!ok) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "no maximum step time");
            goto fail;
        }
    }
    PyMem_Free(vals);
    PyMem_Free(col);
    Py_DECREF(n_obj);
    return out;

fail:
    PyMem_Free(vals);
    PyMem_Free(col);
    Py_XDECREF(n_obj);
    Py_XDECREF(out);
    return NULL;
}

/* ---- module ------------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"read_frames", read_frames, METH_VARARGS, "Frames from next_frame() until `empty` or max_frames."},
    {"tally", tally, METH_VARARGS, "The receiver's accounting of a batch of decoded records."},
    {"add_many", add_many, METH_VARARGS, "Aggregator.add_many's loop, up to a rank not yet seen."},
    {"reduce_group", reduce_group, METH_VARARGS, "Reduce steps that share a key order and rank count."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hotpath", "The daemon's inner loops in C (see telemetry/daemon/hotpath.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    PyObject *builtins = PyEval_GetBuiltins();   /* borrowed */
    if (builtins == NULL)
        return NULL;
    builtin_sum = PyDict_GetItemString(builtins, "sum");
    builtin_max = PyDict_GetItemString(builtins, "max");
    builtin_min = PyDict_GetItemString(builtins, "min");
    if (builtin_sum == NULL || builtin_max == NULL || builtin_min == NULL) {
        PyErr_SetString(PyExc_ImportError, "builtins missing");
        return NULL;
    }
    Py_INCREF(builtin_sum);
    Py_INCREF(builtin_max);
    Py_INCREF(builtin_min);
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_values, "values");
    INTERN(s_src, "src");
    INTERN(s_rank, "rank");
    INTERN(s_seq, "seq");
    INTERN(s_dropped, "dropped");
    INTERN(s_by_rank, "by_rank");
    INTERN(s_cols, "cols");
    INTERN(s_st_max, "perf/step_time_max");
    INTERN(s_st_min, "perf/step_time_min");
    INTERN(s_slowest, "perf/slowest_rank");
    INTERN(s_step, "step");
    INTERN(s_t_ns, "t_ns");
    INTERN(s_keys, "keys");
    INTERN(s_uniform, "uniform");
    INTERN(s_pending, "pending");
    INTERN(s_closed, "_closed");
    INTERN(s_step_heap, "_step_heap");
    INTERN(s_by_age, "_by_age");
    INTERN(s_steady, "_steady");
    INTERN(s_expected, "_expected");
    INTERN(s_num_expected, "_num_expected");
    INTERN(s_append, "append");
    INTERN(s_close_through, "_close_through");
    PyObject *heapq = PyImport_ImportModule("heapq");
    if (heapq == NULL)
        return NULL;
    heappush = PyObject_GetAttrString(heapq, "heappush");
    Py_DECREF(heapq);
    if (heappush == NULL)
        return NULL;
#undef INTERN
    return PyModule_Create(&module);
}
