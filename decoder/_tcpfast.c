/* decoder._tcpfast: the common segment of decoder.tcp.TcpReassembler.feed, compiled.

Why hand-written: after the compiled pcap reader (decoder/_pcapscan.c), feed was the largest Python
step per packet on the benchmark captures: 0.13 s of chatty's 1.9 s of CPU (162,523 segments) and
0.08 s of bulk's, for the few lines of its in-order path. Here: 0.15 -> 0.08 s for chatty's
segments alone; a whole `kwire decode -j 1` of chatty's first 20 MB took 403M fewer instructions
of 7.33G (5.5%, valgrind, 2026-12-06).

feed(reassembler, segment) -> events
    Takes the segment itself when it is the common one: a known connection, no SYN, FIN or RST, no
    sweep of idle connections due, an acknowledgment that reveals no hole (the peer direction holds
    nothing out of order and saw no FIN), and payload, if any, exactly at the next expected byte
    with nothing held and no FIN seen. It then does what feed's Python does for it (capture time,
    packet count, the newest acknowledgment, the offsets, one StreamData) and changes nothing else.
    Any other segment, or a value past 64 bits, goes to reassembler.feed (the Python method, which
    stays the reference: KWIRE_PURE_PYTHON=1 uses it alone) before anything is changed.
    tests/test_tcpfast.py checks both give the same events and the same state on every capture.
configure(TcpSegment, _Conn, _Half, StreamData)
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>

#include "_slots.h"

#define FIN 0x01
#define SYN 0x02
#define RST 0x04
#define ACK 0x10
#define SEQ_MASK 0xFFFFFFFFLL
#define SEQ_HALF (1LL << 31)

enum { S_TS, S_SRC_IP, S_SRC_PORT, S_DST_IP, S_DST_PORT, S_SEQ, S_ACK, S_FLAGS, S_PAYLOAD, S_N };
static const char *segment_names[S_N] = {"ts_ns", "src_ip", "src_port", "dst_ip", "dst_port",
                                         "seq",   "ack",    "flags",    "payload"};
enum { C_ID, C_LAST_TS, C_N };
static const char *conn_names[C_N] = {"id", "last_ts"};
enum { H_ACKED, H_BASE, H_FIN_OFF, H_NEXT_SEQ, H_OFF, H_PACKETS, H_PENDING, H_N };
static const char *half_names[H_N] = {"acked", "base", "fin_off", "next_seq", "off", "packets", "pending"};
enum { D_CONN_ID, D_DIRECTION, D_TS, D_DATA, D_N };
static const char *data_names[D_N] = {"conn_id", "direction", "ts_ns", "data"};

static Py_ssize_t segment_off[S_N], conn_off[C_N], half_off[H_N], data_off[D_N];
static PyTypeObject *segment_type, *conn_type, *half_type, *data_type;
static PyObject *a_now, *a_next_sweep, *a_flows, *a_feed; /* attribute names */

/* v as a long long; 0 when it is not an int that fits (then the Python path takes the segment) */
static int as_ll(PyObject *v, long long *out) {
    if (v == NULL || !PyLong_CheckExact(v))
        return 0;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* slot = new int value; -1 on error */
static int set_ll(PyObject *obj, Py_ssize_t *offsets, int i, long long value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL)
        return -1;
    Py_XSETREF(SLOT(obj, offsets, i), v);
    return 0;
}

static PyObject *slow(PyObject *reassembler, PyObject *segment) {
    return PyObject_CallMethodOneArg(reassembler, a_feed, segment);
}

static PyObject *feed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "feed(reassembler, segment)");
        return NULL;
    }
    PyObject *r = args[0], *seg = args[1];
    if (data_type == NULL || !Py_IS_TYPE(seg, segment_type))
        return slow(r, seg);
    for (int i = 0; i < S_N; i++)
        if (SLOT(seg, segment_off, i) == NULL)
            return slow(r, seg);
    long long ts, now, flags;
    if (!as_ll(SLOT(seg, segment_off, S_TS), &ts) || !as_ll(SLOT(seg, segment_off, S_FLAGS), &flags) ||
        flags & (SYN | FIN | RST))
        return slow(r, seg);
    PyObject *now_obj = PyObject_GetAttr(r, a_now);
    int now_ok = as_ll(now_obj, &now);
    Py_XDECREF(now_obj);
    if (!now_ok) {
        if (PyErr_Occurred())
            return NULL;
        return slow(r, seg);
    }
    if (ts > now) { /* the Python path sets the first sweep time, or sweeps */
        PyObject *due = PyObject_GetAttr(r, a_next_sweep);
        long long next;
        int due_ok = as_ll(due, &next);
        Py_XDECREF(due);
        if (!due_ok || ts >= next) {
            if (PyErr_Occurred())
                return NULL;
            return slow(r, seg);
        }
    }
    PyObject *flows = PyObject_GetAttr(r, a_flows);
    if (flows == NULL)
        return NULL;
    PyObject *key = PyTuple_Pack(4, SLOT(seg, segment_off, S_SRC_IP), SLOT(seg, segment_off, S_SRC_PORT),
                                 SLOT(seg, segment_off, S_DST_IP), SLOT(seg, segment_off, S_DST_PORT));
    PyObject *entry = key == NULL || !PyDict_CheckExact(flows) ? NULL : PyDict_GetItemWithError(flows, key);
    Py_XDECREF(key);
    Py_DECREF(flows);
    if (entry == NULL) {
        if (PyErr_Occurred())
            return NULL;
        return slow(r, seg); /* a new flow */
    }
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 4)
        return slow(r, seg);
    PyObject *conn = PyTuple_GET_ITEM(entry, 0), *dir = PyTuple_GET_ITEM(entry, 1), *h = PyTuple_GET_ITEM(entry, 2),
             *o = PyTuple_GET_ITEM(entry, 3);
    if (!Py_IS_TYPE(conn, conn_type) || !Py_IS_TYPE(h, half_type) || !Py_IS_TYPE(o, half_type) ||
        !PyLong_CheckExact(dir))
        return slow(r, seg);
    long long last_ts, packets, o_acked = 0, ack = 0, o_fin_off, seq = 0, next_seq = 0, h_fin_off = 0, off = 0,
                                 base = 0;
    PyObject *payload = SLOT(seg, segment_off, S_PAYLOAD);
    Py_ssize_t size = PyBytes_CheckExact(payload) ? PyBytes_GET_SIZE(payload) : -1;
    if (size < 0 || !as_ll(SLOT(conn, conn_off, C_LAST_TS), &last_ts) ||
        !as_ll(SLOT(h, half_off, H_PACKETS), &packets))
        return slow(r, seg);
    if (flags & ACK) { /* an acknowledgment that may reveal a hole goes to the Python path */
        PyObject *pending = SLOT(o, half_off, H_PENDING);
        if (pending == NULL || !PyList_CheckExact(pending) || PyList_GET_SIZE(pending) ||
            !as_ll(SLOT(o, half_off, H_FIN_OFF), &o_fin_off) || o_fin_off >= 0 ||
            !as_ll(SLOT(o, half_off, H_ACKED), &o_acked) || !as_ll(SLOT(seg, segment_off, S_ACK), &ack))
            return slow(r, seg);
    }
    if (size > 0) { /* payload only in order, with nothing held and no FIN */
        PyObject *pending = SLOT(h, half_off, H_PENDING);
        if (pending == NULL || !PyList_CheckExact(pending) || PyList_GET_SIZE(pending) ||
            !as_ll(SLOT(seg, segment_off, S_SEQ), &seq) || !as_ll(SLOT(h, half_off, H_NEXT_SEQ), &next_seq) ||
            seq != next_seq || !as_ll(SLOT(h, half_off, H_FIN_OFF), &h_fin_off) || h_fin_off >= 0 ||
            !as_ll(SLOT(h, half_off, H_OFF), &off) || !as_ll(SLOT(h, half_off, H_BASE), &base) ||
            off > LLONG_MAX - size || base > LLONG_MAX - off - size)
            return slow(r, seg);
    }
    PyObject *out = PyList_New(0), *event = NULL;
    if (out == NULL)
        return NULL;
    if (size > 0) { /* made first: a failure here leaves the state as it was */
        event = data_type->tp_alloc(data_type, 0);
        if (event == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *ts_obj = SLOT(seg, segment_off, S_TS);
        PyObject *id = SLOT(conn, conn_off, C_ID);
        if (id == NULL) {
            Py_DECREF(event);
            Py_DECREF(out);
            return slow(r, seg);
        }
        SLOT(event, data_off, D_CONN_ID) = Py_NewRef(id);
        SLOT(event, data_off, D_DIRECTION) = Py_NewRef(dir);
        SLOT(event, data_off, D_TS) = Py_NewRef(ts_obj);
        SLOT(event, data_off, D_DATA) = Py_NewRef(payload);
        if (PyList_Append(out, event) < 0) {
            Py_DECREF(event);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(event);
    }
    /* the state, as feed's Python changes it */
    if (ts > now && PyObject_SetAttr(r, a_now, SLOT(seg, segment_off, S_TS)) < 0)
        goto fail;
    if (ts > last_ts)
        Py_XSETREF(SLOT(conn, conn_off, C_LAST_TS), Py_NewRef(SLOT(seg, segment_off, S_TS)));
    if (set_ll(h, half_off, H_PACKETS, packets + 1) < 0)
        goto fail;
    if (flags & ACK && (o_acked < 0 || ((ack - o_acked) & SEQ_MASK) < SEQ_HALF))
        Py_XSETREF(SLOT(o, half_off, H_ACKED), Py_NewRef(SLOT(seg, segment_off, S_ACK)));
    if (size > 0 && (set_ll(h, half_off, H_OFF, off + size) < 0 ||
                     set_ll(h, half_off, H_NEXT_SEQ, (base + off + size) & SEQ_MASK) < 0))
        goto fail;
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *types[4];
    if (!PyArg_ParseTuple(args, "O!O!O!O!:configure", &PyType_Type, &types[0], &PyType_Type, &types[1],
                          &PyType_Type, &types[2], &PyType_Type, &types[3]))
        return NULL;
    if (slot_offsets(types[0], segment_names, S_N, segment_off) < 0 ||
        slot_offsets(types[1], conn_names, C_N, conn_off) < 0 || slot_offsets(types[2], half_names, H_N, half_off) < 0 ||
        slot_offsets(types[3], data_names, D_N, data_off) < 0)
        return NULL;
    PyTypeObject **slots[] = {&segment_type, &conn_type, &half_type, &data_type};
    for (int i = 0; i < 4; i++)
        Py_XSETREF(*slots[i], (PyTypeObject *)Py_NewRef(types[i]));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, "configure(TcpSegment, _Conn, _Half, StreamData)"},
    {"feed", (PyCFunction)(void (*)(void))feed, METH_FASTCALL,
     "feed(reassembler, segment): TcpReassembler.feed, its common segment compiled"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "decoder._tcpfast", NULL, -1, methods};

PyMODINIT_FUNC PyInit__tcpfast(void) {
    if ((a_now = PyUnicode_InternFromString("_now")) == NULL ||
        (a_next_sweep = PyUnicode_InternFromString("_next_sweep")) == NULL ||
        (a_flows = PyUnicode_InternFromString("_flows")) == NULL ||
        (a_feed = PyUnicode_InternFromString("feed")) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
