/* TelemetryClient.log()'s common case in C: one call from log(), no Python frame of its own.
 *
 * LogState holds what that case reads and writes: the counters the client, its sender thread
 * (telemetry/client/deferred.py) and its span recorder share (Python reads and writes them as
 * attributes of this object, under the GIL), and, once bound, the client's seq cell (its shared
 * page), its header fields, the sender thread's deque and bell, and the socket's send.
 *
 * log(step, values, parts) -> None | bytes | False
 *   None   done: the record was encoded, took its seq, and was queued for the sender thread
 *          (the deque's append; the bell rung if the thread is parked) or sent on the socket
 *          here (a loop slower than direct_after_ns with nothing queued), or counted dropped
 *          (the socket refused it: a ZMQError);
 *   bytes  the frame, its seq taken: the queue is not open to this path (the thread not
 *          started yet, or full, or closing); the client hands it to DeferredSender.submit();
 *   False  nothing done, nothing taken: the client's Python path decides (a `parts` other than
 *          1, a forked process, spans to send, the state unbound (closed), the client's own
 *          time due in a record with no room for it or a value of its name, a step or value
 *          the encoder does not take, a row wider than a record).
 * The client's own time (own_ns so far, in seconds, named own_key) rides in the first record
 * every own_every_ns, as the Python path adds it: a training loop's once-a-second record pays
 * no Python either.
 * Every call that returns None or bytes adds its own time to own_ns (two CLOCK_MONOTONIC reads);
 * the Python path times itself.
 *
 * The Python twin is telemetry/client/fastlog.py (PyLogState); tests/test_fastlog_twin.py holds
 * the two to the same frames and counters. The frame is protocol/_pack_frame.h's encoder: a
 * header of nine ints and the values, msgpack's bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../protocol/_pack_frame.h"

typedef struct {
    PyObject_HEAD
    /* Bound (bind()); `seqs.obj` is NULL while unbound. */
    Py_buffer seqs;                         /* one uint64: the next seq (the client's page) */
    unsigned long long kind, version, src, rank;
    PyObject *append, *ring, *send, *zmq_error, *noblock;
    PyObject *wall_clock;                   /* NULL: CLOCK_REALTIME; else a replaced time.time_ns */
    PyObject *own_key;                      /* the client's own time's name (a str), or NULL */
    long long max_frame, max_values, roomy, direct_after, own_every;
    /* Shared with Python (members). */
    long long sent, dropped, dropped_bg, submitted, done, room, last_ns, own_ns, own_sent_at;
    char forked, spans, parked;
} LogState;

static long long now_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int LogState_traverse(LogState *s, visitproc visit, void *arg)
{
    Py_VISIT(s->append);
    Py_VISIT(s->ring);
    Py_VISIT(s->send);
    Py_VISIT(s->zmq_error);
    Py_VISIT(s->noblock);
    Py_VISIT(s->wall_clock);
    Py_VISIT(s->own_key);
    return 0;
}

static int LogState_clear(LogState *s)
{
    if (s->seqs.obj != NULL)
        PyBuffer_Release(&s->seqs);
    Py_CLEAR(s->append);
    Py_CLEAR(s->ring);
    Py_CLEAR(s->send);
    Py_CLEAR(s->zmq_error);
    Py_CLEAR(s->noblock);
    Py_CLEAR(s->wall_clock);
    Py_CLEAR(s->own_key);
    return 0;
}

static void LogState_dealloc(LogState *s)
{
    PyObject_GC_UnTrack(s);
    LogState_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *LogState_bind(LogState *s, PyObject *args)
{
    PyObject *seqs, *append, *ring, *send, *zmq_error, *noblock, *wall_clock = Py_None, *own_key = Py_None;
    unsigned long long kind, version, src, rank;
    long long max_frame, max_values, roomy, direct_after, own_every;
    if (!PyArg_ParseTuple(args, "OKKKKOOOOOLLLLL|OO:bind", &seqs, &kind, &version, &src, &rank, &append, &ring,
                          &send, &zmq_error, &noblock, &max_frame, &max_values, &roomy, &direct_after, &own_every,
                          &wall_clock, &own_key))
        return NULL;
    if (own_key != Py_None && (!PyUnicode_Check(own_key) || PyUnicode_GET_LENGTH(own_key) < 1
                               || PyUnicode_GET_LENGTH(own_key) > MAX_NAME_CHARS)) {
        PyErr_SetString(PyExc_ValueError, "bind: own_key must be a metric name (a str) or None");
        return NULL;
    }
    if (kind >= (1ULL << 63) || version >= (1ULL << 63) || src >= (1ULL << 63) || rank >= (1ULL << 63)) {
        PyErr_SetString(PyExc_ValueError, "bind: a header field outside 0..2**63-1");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(seqs, &view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (view.len != 8 || view.format == NULL || strcmp(view.format, "Q") != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "bind: seqs must be one writable uint64 ('Q')");
        return NULL;
    }
    LogState_clear(s);
    s->seqs = view;
    s->kind = kind; s->version = version; s->src = src; s->rank = rank;
    Py_INCREF(append); s->append = append;
    Py_INCREF(ring); s->ring = ring;
    Py_INCREF(send); s->send = send;
    Py_INCREF(zmq_error); s->zmq_error = zmq_error;
    Py_INCREF(noblock); s->noblock = noblock;
    s->max_frame = max_frame; s->max_values = max_values; s->roomy = roomy;
    s->direct_after = direct_after; s->own_every = own_every;
    if (wall_clock != Py_None) {
        Py_INCREF(wall_clock);
        s->wall_clock = wall_clock;
    }
    if (own_key != Py_None) {
        Py_INCREF(own_key);
        s->own_key = own_key;
    }
    Py_RETURN_NONE;
}

static PyObject *LogState_unbind(LogState *s, PyObject *unused)
{
    (void)unused;
    LogState_clear(s);
    Py_RETURN_NONE;
}

/* A step the protocol takes: an int (not a bool) in [0, 2**63); -1 otherwise. */
static long long header_int(PyObject *o)
{
    if (!PyLong_Check(o) || o == Py_True || o == Py_False)
        return -1;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow != 0 || v < 0) {
        PyErr_Clear();
        return -1;
    }
    return v;
}

static PyObject *LogState_log(LogState *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "log(step, values, parts)");
        return NULL;
    }
    PyObject *values = args[1], *parts = args[2];
    int overflow;
    if (s->seqs.obj == NULL || s->forked || s->spans || !PyLong_CheckExact(parts)
            || PyLong_AsLongAndOverflow(parts, &overflow) != 1 || !PyDict_CheckExact(values))
        Py_RETURN_FALSE;
    long long t0 = now_ns(CLOCK_MONOTONIC);
    /* The client's own time, due every own_every: one more value of this record, as the Python
     * path adds it (last, its value the time so far), unless the record has no room for it or
     * a value of that name (the Python path's to decide). */
    const char *own_name = NULL;
    Py_ssize_t own_len = 0;
    if (t0 - s->own_sent_at >= s->own_every) {
        if (s->own_key == NULL || PyDict_GET_SIZE(values) >= s->max_values)
            Py_RETURN_FALSE;
        PyObject *have = PyDict_GetItemWithError(values, s->own_key);
        if (have != NULL || PyErr_Occurred()) {
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
        own_name = PyUnicode_AsUTF8AndSize(s->own_key, &own_len);
        if (own_name == NULL || own_len > 0xffff) {
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
    }
    long long step = header_int(args[0]);
    if (step < 0)
        Py_RETURN_FALSE;
    long long t;
    if (s->wall_clock == NULL)
        t = now_ns(CLOCK_REALTIME);
    else {
        /* time.time_ns replaced in this process (a test's shifted clock): the record's time is
         * what the Python path would have read. */
        PyObject *now = PyObject_CallNoArgs(s->wall_clock);
        if (now == NULL)
            return NULL;
        t = PyLong_AsLongLong(now);
        Py_DECREF(now);
        if (t == -1 && PyErr_Occurred())
            return NULL;
        if (s->seqs.obj == NULL)                      /* unbound by that Python code meanwhile */
            Py_RETURN_FALSE;
    }
    uint64_t *cell = (uint64_t *)s->seqs.buf;
    uint64_t seq = *cell;
    long long dropped = s->dropped + s->dropped_bg;
    if (seq >= (1ULL << 63) || dropped < 0 || t < 0)
        Py_RETURN_FALSE;

    unsigned char stack[STACK_BYTES];
    buf_t b = {stack, 0, STACK_BYTES, NULL};
    put1(&b, 0x99);                                   /* fixarray of 9: 8 ints and the map */
    put_uint(&b, s->kind);
    put_uint(&b, s->version);
    put_uint(&b, s->src);
    put_uint(&b, s->rank);
    put_uint(&b, seq);
    put_uint(&b, (uint64_t)dropped);
    put_uint(&b, (uint64_t)t);
    put_uint(&b, (uint64_t)step);
    int r = pack_map(&b, values, own_name != NULL);
    if (r == 0 && own_name != NULL) {
        if (reserve(&b, own_len + ENTRY_EXTRA))
            r = -1;
        else {
            put_str(&b, own_name, own_len);
            put_double(&b, (double)s->own_ns / 1e9);
        }
    }
    if (r != 0) {
        PyMem_Free(b.heap);
        if (r < 0)
            return NULL;
        Py_RETURN_FALSE;
    }
    /* One comparison for both bounds: a record of more than max_values values is at least
     * `roomy` bytes long. */
    if (b.n > s->roomy && (b.n > s->max_frame || PyDict_GET_SIZE(values) > s->max_values)) {
        PyMem_Free(b.heap);
        Py_RETURN_FALSE;
    }
    PyObject *frame = PyBytes_FromStringAndSize((const char *)b.p, b.n);
    PyMem_Free(b.heap);
    if (frame == NULL)
        return NULL;
    *cell = seq + 1;
    if (own_name != NULL)
        s->own_sent_at = t0;

    /* The calls below run Python code (the bell, the socket's send), where another thread may
     * unbind this state (a close): what they use is held here, and nothing bound is read after. */
    long long pending = s->submitted - s->done;
    if (pending || t - s->last_ns < s->direct_after) {
        s->last_ns = t;
        if (pending >= s->room) {                      /* submit()'s to decide */
            s->own_ns += now_ns(CLOCK_MONOTONIC) - t0;
            return frame;
        }
        s->submitted++;
        PyObject *ring = s->ring;
        Py_INCREF(ring);
        PyObject *ok = PyObject_CallOneArg(s->append, frame);     /* deque.append: no Python code */
        Py_DECREF(frame);
        if (ok == NULL) {
            Py_DECREF(ring);
            return NULL;
        }
        Py_DECREF(ok);
        if (s->parked) {                               /* read after the append: see DeferredSender._park */
            ok = PyObject_CallNoArgs(ring);
            Py_DECREF(ring);
            if (ok == NULL)
                return NULL;
            Py_DECREF(ok);
        }
        else
            Py_DECREF(ring);
    }
    else {
        /* A step this long after the previous one, nothing queued: the sender thread has parked,
         * and waking it would cost more CPU than the send, so the send is done here. */
        s->last_ns = t;
        PyObject *send = s->send, *noblock = s->noblock, *zmq_error = s->zmq_error;
        Py_INCREF(send);
        Py_INCREF(noblock);
        Py_INCREF(zmq_error);
        PyObject *send_args[2] = {frame, noblock};
        PyObject *ok = PyObject_Vectorcall(send, send_args, 2, NULL);
        Py_DECREF(frame);
        Py_DECREF(send);
        Py_DECREF(noblock);
        if (ok != NULL) {
            Py_DECREF(ok);
            s->sent++;
        }
        else if (PyErr_ExceptionMatches(zmq_error)) {      /* Again: queue full or no daemon */
            PyErr_Clear();
            s->dropped++;
        }
        else {
            Py_DECREF(zmq_error);
            return NULL;
        }
        Py_DECREF(zmq_error);
    }
    s->own_ns += now_ns(CLOCK_MONOTONIC) - t0;
    Py_RETURN_NONE;
}

static PyMethodDef LogState_methods[] = {
    {"log", (PyCFunction)(void (*)(void))LogState_log, METH_FASTCALL,
     "log(step, values, parts) -> None | bytes | False: log()'s common case (see _fastlog.c)."},
    {"bind", (PyCFunction)LogState_bind, METH_VARARGS,
     "bind(seqs, kind, version, src, rank, append, ring, send, zmq_error, noblock, max_frame_bytes, "
     "max_values, roomy_frame_bytes, direct_after_ns, own_every_ns, wall_clock=None, own_key=None): wall_clock, a "
     "replaced time.time_ns to read the record's time with (None: CLOCK_REALTIME); own_key, the name of the "
     "client's own time, added to a record every own_every_ns (None: such a record is the Python path's)"},
    {"unbind", (PyCFunction)LogState_unbind, METH_NOARGS, "Let go of what bind() took; log() answers False."},
    {NULL, NULL, 0, NULL},
};

#define MEMBER(name, type) {#name, type, offsetof(LogState, name), 0, NULL}
static PyMemberDef LogState_members[] = {
    MEMBER(sent, T_LONGLONG), MEMBER(dropped, T_LONGLONG), MEMBER(dropped_bg, T_LONGLONG),
    MEMBER(submitted, T_LONGLONG), MEMBER(done, T_LONGLONG), MEMBER(room, T_LONGLONG),
    MEMBER(last_ns, T_LONGLONG), MEMBER(own_ns, T_LONGLONG), MEMBER(own_sent_at, T_LONGLONG),
    MEMBER(forked, T_BOOL), MEMBER(spans, T_BOOL), MEMBER(parked, T_BOOL),
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject LogStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "telemetry.client._fastlog.LogState",
    .tp_doc = "What TelemetryClient.log()'s common case reads and writes (see _fastlog.c).",
    .tp_basicsize = sizeof(LogState),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)LogState_traverse,
    .tp_clear = (inquiry)LogState_clear,
    .tp_dealloc = (destructor)LogState_dealloc,
    .tp_methods = LogState_methods,
    .tp_members = LogState_members,
};

/* Ring: a client's record ring (telemetry/shared/ring.py has the layout and why), its writer.
 * send(frame, flags=0) has a ZeroMQ socket's NOBLOCK contract: the frame is in the ring when it
 * returns, or `error` is raised (no room; the client counts a drop). The record, then the write
 * position with release order: the daemon's reader loads the position with acquire order. One
 * thread writes at a time (the client's hand-over between its caller and its sender thread),
 * under the GIL. redirect(send): every later frame goes to `send` instead (the client's socket,
 * once the daemon that read the ring is gone), with the same arguments. watch(marker, ino, proc,
 * every_ns, on_change): at most every every_ns, a send first looks whether the file `marker`
 * still has inode `ino` and `proc` (the reading daemon's /proc entry) is there (two system calls);
 * if not, it calls on_change() (Python: the full look, which may watch() anew or redirect())
 * before it writes. While the reader's beat in the header (its CLOCK_MONOTONIC time, stored as
 * it looks at its rings) is younger than every_ns, it reads: the look is a load, no system call
 * (a cold one costs a call after a step's work tens of µs). watch(None, 0, None, 0, None): no
 * more looks. */
#define RING_HEADER 256
#define RING_CAPACITY_AT 8
#define RING_WPOS_AT 64
#define RING_RPOS_AT 128
#define RING_WCOUNT_AT 72
#define RING_RCOUNT_AT 136
#define RING_BEAT_AT 144
#define RING_SKIP 0xFFFFFFFFu

typedef struct {
    PyObject_HEAD
    Py_buffer map;                          /* the whole mapping; map.obj NULL once released */
    unsigned char *data;
    uint64_t *wpos, *rpos, *wcount, *rcount, *beat;
    uint64_t cap, max_frame, max_records;
    PyObject *error;
    PyObject *to;                           /* redirect()'s send, or NULL */
    PyObject *on_change;                    /* watch()'s, or NULL */
    char *marker, *proc;                    /* watch()'s paths (PyMem) */
    unsigned long long ino;
    long long every_ns, next_check;
} Ring;

static int Ring_traverse(Ring *r, visitproc visit, void *arg)
{
    Py_VISIT(r->error);
    Py_VISIT(r->to);
    Py_VISIT(r->on_change);
    return 0;
}

static void Ring_unwatch(Ring *r)
{
    Py_CLEAR(r->on_change);
    PyMem_Free(r->marker);
    PyMem_Free(r->proc);
    r->marker = r->proc = NULL;
}

static int Ring_clear(Ring *r)
{
    if (r->map.obj != NULL)
        PyBuffer_Release(&r->map);
    Py_CLEAR(r->error);
    Py_CLEAR(r->to);
    Ring_unwatch(r);
    return 0;
}

static void Ring_dealloc(Ring *r)
{
    PyObject_GC_UnTrack(r);
    Ring_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static int Ring_init(Ring *r, PyObject *args, PyObject *kwds)
{
    PyObject *mapping, *error;
    unsigned long long max_frame, max_records;
    if (!PyArg_ParseTuple(args, "OOKK:Ring", &mapping, &error, &max_frame, &max_records))
        return -1;
    Py_buffer view;
    if (PyObject_GetBuffer(mapping, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    uint64_t cap = 0;
    if (view.len > RING_HEADER)
        memcpy(&cap, (unsigned char *)view.buf + RING_CAPACITY_AT, 8);
    if (cap == 0 || cap % 8 != 0 || (uint64_t)view.len != RING_HEADER + cap || ((uintptr_t)view.buf) % 8 != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "Ring: not a ring's mapping (its capacity and size disagree)");
        return -1;
    }
    Ring_clear(r);
    r->map = view;
    r->data = (unsigned char *)view.buf + RING_HEADER;
    r->wpos = (uint64_t *)((unsigned char *)view.buf + RING_WPOS_AT);
    r->rpos = (uint64_t *)((unsigned char *)view.buf + RING_RPOS_AT);
    r->wcount = (uint64_t *)((unsigned char *)view.buf + RING_WCOUNT_AT);
    r->rcount = (uint64_t *)((unsigned char *)view.buf + RING_RCOUNT_AT);
    r->beat = (uint64_t *)((unsigned char *)view.buf + RING_BEAT_AT);
    r->cap = cap;
    r->max_frame = max_frame;
    r->max_records = max_records;
    Py_INCREF(error);
    r->error = error;
    return 0;
}

static PyObject *Ring_send(Ring *r, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 1 || nargs > 2 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) + nargs > 2)) {
        PyErr_SetString(PyExc_TypeError, "send(frame, flags=0)");
        return NULL;
    }
    if (r->on_change != NULL && r->to == NULL) {
        long long now = now_ns(CLOCK_MONOTONIC);
        if (now >= r->next_check) {
            r->next_check = now + r->every_ns;
            long long beat = (long long)__atomic_load_n(r->beat, __ATOMIC_RELAXED);
            struct stat st;
            /* A beat ahead of this clock by a period (another time namespace's) is no beat. */
            if ((beat == 0 || now - beat >= r->every_ns || beat - now >= r->every_ns)
                    && (lstat(r->marker, &st) != 0 || (unsigned long long)st.st_ino != r->ino
                        || access(r->proc, F_OK) != 0)) {
                PyObject *on_change = r->on_change;
                Py_INCREF(on_change);
                PyObject *res = PyObject_CallNoArgs(on_change);
                Py_DECREF(on_change);
                if (res == NULL)
                    PyErr_Clear();              /* never into the training loop: the ring as before */
                else
                    Py_DECREF(res);
            }
        }
    }
    if (r->to != NULL)
        return PyObject_Vectorcall(r->to, args, (size_t)nargs, kwnames);
    if (r->map.obj == NULL) {
        PyErr_SetNone(r->error ? r->error : PyExc_ValueError);
        return NULL;
    }
    Py_buffer f;
    if (PyObject_GetBuffer(args[0], &f, PyBUF_SIMPLE) < 0)
        return NULL;
    uint64_t n = (uint64_t)f.len;
    uint64_t rec = 8 + ((n + 7) & ~(uint64_t)7);
    uint64_t w = *r->wpos;                                      /* ours: no other writer */
    uint64_t rd = __atomic_load_n(r->rpos, __ATOMIC_ACQUIRE);
    uint64_t off = w % r->cap, tail = r->cap - off;
    uint64_t need = rec + (rec > tail ? tail : 0);
    uint64_t written = *r->wcount;
    uint64_t taken = __atomic_load_n(r->rcount, __ATOMIC_ACQUIRE);
    if (n > r->max_frame || rec > r->cap || w < rd || w - rd > r->cap || w - rd + need > r->cap
            || written - taken >= r->max_records) {
        PyBuffer_Release(&f);
        PyErr_SetNone(r->error);
        return NULL;
    }
    if (rec > tail) {
        uint32_t skip = RING_SKIP;
        memcpy(r->data + off, &skip, 4);
        w += tail;
        off = 0;
    }
    uint32_t head[2] = {(uint32_t)n, 0};
    memcpy(r->data + off, head, 8);
    memcpy(r->data + off + 8, f.buf, n);
    PyBuffer_Release(&f);
    *r->wcount = written + 1;
    __atomic_store_n(r->wpos, w + rec, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

static PyObject *Ring_release(Ring *r, PyObject *unused)
{
    (void)unused;
    if (r->map.obj != NULL)
        PyBuffer_Release(&r->map);
    Py_CLEAR(r->to);
    Ring_unwatch(r);
    Py_RETURN_NONE;
}

static PyObject *Ring_redirect(Ring *r, PyObject *send)
{
    if (!PyCallable_Check(send)) {
        PyErr_SetString(PyExc_TypeError, "redirect(send): send must be callable");
        return NULL;
    }
    if (r->map.obj == NULL) {                 /* released: nothing goes anywhere */
        Py_RETURN_NONE;
    }
    Py_INCREF(send);
    Py_XSETREF(r->to, send);
    Py_RETURN_NONE;
}

static char *copy_path(PyObject *o)
{
    char *s;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(o, &s, &n) < 0)
        return NULL;
    if ((Py_ssize_t)strlen(s) != n) {
        PyErr_SetString(PyExc_ValueError, "watch: a path with a NUL");
        return NULL;
    }
    char *c = PyMem_Malloc((size_t)n + 1);
    if (c == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(c, s, (size_t)n + 1);
    return c;
}

static PyObject *Ring_watch(Ring *r, PyObject *args)
{
    PyObject *marker, *proc, *on_change;
    unsigned long long ino;
    long long every_ns;
    if (!PyArg_ParseTuple(args, "OKOLO:watch", &marker, &ino, &proc, &every_ns, &on_change))
        return NULL;
    if (on_change == Py_None) {
        Ring_unwatch(r);
        Py_RETURN_NONE;
    }
    if (!PyCallable_Check(on_change)) {
        PyErr_SetString(PyExc_TypeError, "watch: on_change must be callable");
        return NULL;
    }
    char *m = copy_path(marker);
    if (m == NULL)
        return NULL;
    char *p = copy_path(proc);
    if (p == NULL) {
        PyMem_Free(m);
        return NULL;
    }
    Ring_unwatch(r);
    r->marker = m;
    r->proc = p;
    r->ino = ino;
    r->every_ns = every_ns;
    r->next_check = now_ns(CLOCK_MONOTONIC) + every_ns;
    Py_INCREF(on_change);
    r->on_change = on_change;
    Py_RETURN_NONE;
}

static PyMethodDef Ring_methods[] = {
    {"send", (PyCFunction)(void (*)(void))Ring_send, METH_FASTCALL | METH_KEYWORDS,
     "send(frame, flags=0): the frame into the ring, or the bound error raised (no room)."},
    {"release", (PyCFunction)Ring_release, METH_NOARGS, "Let go of the mapping; send() raises from here."},
    {"redirect", (PyCFunction)Ring_redirect, METH_O, "redirect(send): later frames go to send(frame, flags) instead."},
    {"watch", (PyCFunction)Ring_watch, METH_VARARGS,
     "watch(marker, ino, proc, every_ns, on_change): look at the reading daemon every every_ns (see _fastlog.c)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "telemetry.client._fastlog.Ring",
    .tp_doc = "Ring(mapping, error, max_frame_bytes, max_records): a client's record ring's writer (see _fastlog.c).",
    .tp_basicsize = sizeof(Ring),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Ring_init,
    .tp_traverse = (traverseproc)Ring_traverse,
    .tp_clear = (inquiry)Ring_clear,
    .tp_dealloc = (destructor)Ring_dealloc,
    .tp_methods = Ring_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "telemetry.client._fastlog",
    "TelemetryClient.log()'s common case in C (see _fastlog.c).", -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastlog(void)
{
    if (PyType_Ready(&LogStateType) < 0 || PyType_Ready(&RingType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&LogStateType);
    if (PyModule_AddObject(m, "LogState", (PyObject *)&LogStateType) < 0) {
        Py_DECREF(&LogStateType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&RingType);
    if (PyModule_AddObject(m, "Ring", (PyObject *)&RingType) < 0) {
        Py_DECREF(&RingType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
