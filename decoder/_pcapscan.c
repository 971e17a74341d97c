/* decoder._pcapscan: the common case of decoder.pcap's record loop, compiled.

Why hand-written: on the chatty benchmark capture (163,627 packets, 45 MB) decoder.pcap's loop took
0.22 s of CPU above the 0.01 s the file read itself costs, about 1.35 us per packet of Python (one
struct unpack, the checks, the TcpSegment). This loop does the same for the one case that fills real
Kafka captures (classic pcap, Ethernet, untagged IPv4 without options, TCP) and hands everything else
back to the Python reader, which stays the reference: KWIRE_PURE_PYTHON=1 reads with it alone, and
tests/test_pcapscan.py checks both give the same segments and counters on every capture.

scan(buf, pos, rec_len, big_endian, frac_ns, limit, max_records[, weights, unit, max_pairs[, skip]])
    -> (segments, pos, records, snapped[, last_skipped_ns])
walks the records of `buf` from `pos` while each one is complete, not longer than `limit`, and is an
Ethernet + IPv4 (IHL 5) + TCP packet that decoder.pcap._ethernet would take in its one-unpack fast
path; it stops before the first record that is not (or after `max_records`), so the Python loop
decides about that one exactly as before. The TcpSegment slots are filled directly (the class is
given once with set_segment_class): a frozen dataclass only forbids __setattr__, and its slots are
plain member descriptors. Never reads outside buf, never raises on capture bytes.

Given a weights dict, scan makes no segments: it adds each record's connection to the weights as
kwire.shards.ConnectionWeights.add does (the first pass of a decode split among processes,
kwire.decode_command.plan_shards, which took 0.09 s of CPU before any worker started on the chatty
benchmark capture: 162,523 segments made only to be weighed). Given a skip set of port pairs (the
connections a plan gives to the other workers of a split decode), it makes no segment for their
records and returns the latest time among them (-1 for none): each worker of `kwire decode -j 2`
made and looked at every segment of the capture, half of them only to drop them. max_records
counts the records handed out (or weighed), not the ones skipped.
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "_slots.h"

enum { F_TS, F_SRC_IP, F_SRC_PORT, F_DST_IP, F_DST_PORT, F_SEQ, F_ACK, F_FLAGS, F_PAYLOAD, NFIELDS };
static const char *field_names[NFIELDS] = {"ts_ns", "src_ip", "src_port", "dst_ip", "dst_port",
                                           "seq", "ack", "flags", "payload"};

static PyTypeObject *segment_type = NULL;
static Py_ssize_t offsets[NFIELDS];

/* The dotted text of the last few addresses seen (a capture holds few hosts). */
#define IPCACHE 8
static uint32_t ip_addr[IPCACHE];
static PyObject *ip_text[IPCACHE];
static int ip_next = 0;

static PyObject *ip4_text(uint32_t addr) {
    for (int i = 0; i < IPCACHE; i++) {
        if (ip_text[i] != NULL && ip_addr[i] == addr) {
            Py_INCREF(ip_text[i]);
            return ip_text[i];
        }
    }
    char text[16];
    snprintf(text, sizeof text, "%u.%u.%u.%u", addr >> 24, (addr >> 16) & 255, (addr >> 8) & 255,
             addr & 255);
    PyObject *s = PyUnicode_FromString(text);
    if (s == NULL) return NULL;
    Py_XDECREF(ip_text[ip_next]);
    Py_INCREF(s);
    ip_text[ip_next] = s;
    ip_addr[ip_next] = addr;
    ip_next = (ip_next + 1) % IPCACHE;
    return s;
}

static inline uint32_t be16(const unsigned char *p) { return ((uint32_t)p[0] << 8) | p[1]; }
static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint32_t le32(const unsigned char *p) {
    return ((uint32_t)p[3] << 24) | ((uint32_t)p[2] << 16) | ((uint32_t)p[1] << 8) | p[0];
}

static PyObject *set_segment_class(PyObject *self, PyObject *cls) {
    if (slot_offsets(cls, field_names, NFIELDS, offsets) < 0) return NULL;
    Py_XSETREF(segment_type, (PyTypeObject *)Py_NewRef(cls));
    Py_RETURN_NONE;
}

/* The TcpSegment of the packet at pkt (headers checked) with payload buf[p:end], or NULL with an
   exception set (memory only). */
static PyObject *segment(long long ts, const unsigned char *pkt, const unsigned char *buf, Py_ssize_t p,
                         Py_ssize_t end) {
    PyObject *v[NFIELDS];
    v[F_TS] = PyLong_FromLongLong(ts);
    v[F_SRC_IP] = ip4_text(be32(pkt + 26));
    v[F_SRC_PORT] = PyLong_FromLong(be16(pkt + 34));
    v[F_DST_IP] = ip4_text(be32(pkt + 30));
    v[F_DST_PORT] = PyLong_FromLong(be16(pkt + 36));
    v[F_SEQ] = PyLong_FromUnsignedLong(be32(pkt + 38));
    v[F_ACK] = PyLong_FromUnsignedLong(be32(pkt + 42));
    v[F_FLAGS] = PyLong_FromLong(pkt[47] | ((pkt[46] & 1) << 8));
    v[F_PAYLOAD] = PyBytes_FromStringAndSize((const char *)buf + p, end - p);
    PyObject *seg = NULL;
    int ok = 1;
    for (int i = 0; i < NFIELDS; i++) ok &= v[i] != NULL;
    if (ok) seg = segment_type->tp_alloc(segment_type, 0);
    if (seg == NULL) {
        for (int i = 0; i < NFIELDS; i++) Py_XDECREF(v[i]);
        return NULL;
    }
    for (int i = 0; i < NFIELDS; i++) SLOT(seg, offsets, i) = v[i];
    return seg;
}

/* The record's port pair, as kwire.shards has it: the lower port << 16 | the higher (a new int). */
static PyObject *pair_of(const unsigned char *pkt) {
    uint32_t a = be16(pkt + 34), b = be16(pkt + 36);
    return PyLong_FromUnsignedLong(a < b ? a << 16 | b : b << 16 | a);
}

/* weights[pair] += 1 + size // unit for a segment of `size` payload bytes (new pairs only while the
   dict holds fewer than max_pairs): kwire.shards.ConnectionWeights.add, whose pair is the lower
   port << 16 | the higher. 0, or -1 with an exception set. */
static int weigh(PyObject *weights, Py_ssize_t unit, Py_ssize_t max_pairs, const unsigned char *pkt,
                 Py_ssize_t size) {
    if (size <= 0) return 0;
    PyObject *key = pair_of(pkt);
    if (key == NULL) return -1;
    PyObject *had = PyDict_GetItemWithError(weights, key);
    long long weight = 1 + size / unit;
    int failed = 0;
    if (had != NULL) {
        long long before = PyLong_AsLongLong(had);
        failed = before == -1 && PyErr_Occurred();
        weight += before;
    } else if (PyErr_Occurred() || PyDict_GET_SIZE(weights) >= max_pairs) {
        failed = PyErr_Occurred() != NULL;
        Py_DECREF(key);
        return failed ? -1 : 0;
    }
    PyObject *value = failed ? NULL : PyLong_FromLongLong(weight);
    failed = value == NULL || PyDict_SetItem(weights, key, value) < 0;
    Py_XDECREF(value);
    Py_DECREF(key);
    return failed ? -1 : 0;
}

/* Whether the record's port pair is in skip (a set); -1 with an exception set */
static int skipped(PyObject *skip, const unsigned char *pkt) {
    PyObject *key = pair_of(pkt);
    if (key == NULL) return -1;
    int found = PySet_Contains(skip, key);
    Py_DECREF(key);
    return found;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, rec_len, limit, max_records, unit = 1, max_pairs = 0;
    int big_endian;
    long long frac_ns, last_skipped = -1;
    PyObject *weights = Py_None, *skip = Py_None;
    if (!PyArg_ParseTuple(args, "y*nnpLnn|OnnO", &view, &pos, &rec_len, &big_endian, &frac_ns, &limit,
                          &max_records, &weights, &unit, &max_pairs, &skip))
        return NULL;
    if ((weights != Py_None && (!PyDict_CheckExact(weights) || unit <= 0)) ||
        (skip != Py_None && !PyAnySet_CheckExact(skip))) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "weights: a dict, with a unit of 1 byte or more; skip: a set");
        return NULL;
    }
    if (segment_type == NULL) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "set_segment_class first");
        return NULL;
    }
    const unsigned char *buf = view.buf;
    Py_ssize_t n = view.len;
    PyObject *out = PyList_New(0);
    Py_ssize_t records = 0, snapped = 0, taken = 0; /* taken: records handed out or weighed */
    if (out == NULL) goto fail;
    if (pos < 0) pos = 0;
    while (taken < max_records && rec_len >= 16 && n - pos >= rec_len) {
        const unsigned char *h = buf + pos;
        uint32_t sec = big_endian ? be32(h) : le32(h);
        uint32_t frac = big_endian ? be32(h + 4) : le32(h + 4);
        uint32_t caplen = big_endian ? be32(h + 8) : le32(h + 8);
        uint32_t wirelen = big_endian ? be32(h + 12) : le32(h + 12);
        if ((Py_ssize_t)caplen > limit || (Py_ssize_t)caplen > n - pos - rec_len) break;
        Py_ssize_t off = pos + rec_len, end = off + caplen;
        if (caplen < 54) break;
        const unsigned char *pkt = buf + off; /* Ethernet + IPv4 + TCP, as decoder.pcap._ethernet */
        uint32_t total = be16(pkt + 16), doff = pkt[46];
        if (be16(pkt + 12) != 0x0800 || pkt[14] != 0x45 || pkt[23] != 6 || (be16(pkt + 20) & 0x1FFF) ||
            doff < 0x50)
            break;
        if (20 <= total && (Py_ssize_t)total < end - off - 14) end = off + 14 + total;
        Py_ssize_t p = off + 34 + ((doff >> 4) << 2);
        if (p > end || (total != 0 && total < 20)) break;
        int skip_it = skip == Py_None ? 0 : skipped(skip, pkt);
        if (skip_it < 0) goto fail;
        long long ts = (long long)sec * 1000000000LL + (long long)frac * frac_ns;
        if (skip_it) { /* another worker's connection: only its time is kept */
            if (ts > last_skipped) last_skipped = ts;
        } else if (weights != Py_None) { /* weighed, not handed out */
            if (weigh(weights, unit, max_pairs, pkt, end - p) < 0) goto fail;
            taken++;
        } else {
            PyObject *seg = segment(ts, pkt, buf, p, end);
            if (seg == NULL || PyList_Append(out, seg) < 0) {
                Py_XDECREF(seg);
                goto fail;
            }
            Py_DECREF(seg);
            taken++;
        }
        records++;
        if (caplen < wirelen) snapped++;
        pos = off + caplen;
    }
    PyBuffer_Release(&view);
    if (skip != Py_None)
        return Py_BuildValue("(NnnnL)", out, pos, records, snapped, last_skipped);
    return Py_BuildValue("(Nnnn)", out, pos, records, snapped);
fail:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "(segments, pos, records, snapped) of the common records from pos; given (weights, unit, max_pairs), "
     "their connections weighed into weights instead, and no segments; given skip (a set of pairs), none "
     "for those pairs' records, and the latest time among them last."},
    {"set_segment_class", set_segment_class, METH_O, "The slotted class scan fills (TcpSegment)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "decoder._pcapscan",
                                    "Compiled common case of decoder.pcap's record loop.", -1, methods};

PyMODINIT_FUNC PyInit__pcapscan(void) { return PyModule_Create(&module); }
