/* decoder._framecore: the common case of KafkaConnection's per-frame work, compiled.

Why hand-written: on the chatty benchmark capture (81,089 exchanges) the per-frame Python around the
compiled body decoder (the header unpack, the plan look-up, the client id, the header's tagged
fields, the frozen dataclass built through its mutable twin, the pending-request bookkeeping and
the events) was the largest share left of `kwire decode`'s CPU. Measured with and without this
module in the same build (`farm-bench -n 7 --vs`, `kwire decode -j 1` on chatty): the two parsers
0.90x the CPU, run_frames another 0.96x. The body is still decoded by the compiled layout
(decoder/_layoutvm.c through decoder.codegen), called as Python calls it.

The compiled path takes only frames that decode cleanly and need nothing of the connection's
Python. On anything else (an api key or version with no definition, a client id or tagged fields
that do not fit the frame, a body decoder that raises or runs past the frame, an ApiVersions answer
that only its v0 layout reads, SASL, acks=0, a reused correlation id, an answer out of order... any
doubt) it hands the frame back and decoder/connection.py takes it in Python as before, which stays
the reference: KWIRE_PURE_PYTHON=1 uses it alone; tests/test_framecore.py checks both give the same
frames, events and rows on every real capture, on mutated frames and on real streams cut anywhere,
and tests/test_connection.py runs its hand-made cases on both. It never reads outside the buffer.

configure(Request, Response, RequestReceived, ResponseReceived, protocol)
    The slotted classes to fill (decoder/_slots.h), and decoder.protocol, whose plan caches
    (_request_plans, _response_plans: plan_key(api_key, api_version) -> (header version, body decoder
    or None)) are read by name at every call, so that a test replacing them (with decoders that
    record, or with the Python reference decoders) replaces them here too; a key they lack is filled
    in by protocol.request_plan / response_plan.
parse_request(buf, pos, end, start_ns, end_ns) -> Request | None
parse_response(request, buf, pos, end, start_ns, end_ns) -> Response | None
    KafkaConnection._parse_request / _parse_response for a clean frame; None: the Python path's.
run_frames(conn, state, direction, data, pos, ts_ns) -> pos
    KafkaConnection._frame_chunk's loop over the plain frames from pos (see the function).
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_slots.h"

enum { RQ_API_KEY, RQ_API_VERSION, RQ_HEADER_VERSION, RQ_CORRELATION_ID, RQ_CLIENT_ID, RQ_SIZE,
       RQ_START_NS, RQ_END_NS, RQ_STATUS, RQ_FIELDS, RQ_DECODE_ERROR, RQ_N };
static const char *request_names[RQ_N] = {"api_key", "api_version", "header_version", "correlation_id",
                                          "client_id", "size", "start_ns", "end_ns", "status", "fields",
                                          "decode_error"};
enum { RS_CORRELATION_ID, RS_HEADER_VERSION, RS_SIZE, RS_START_NS, RS_END_NS, RS_STATUS, RS_FIELDS,
       RS_DECODE_ERROR, RS_API_VERSION, RS_N };
static const char *response_names[RS_N] = {"correlation_id", "header_version", "size", "start_ns", "end_ns",
                                           "status", "fields", "decode_error", "api_version"};

static PyTypeObject *request_type = NULL, *response_type = NULL, *request_received = NULL,
                    *response_received = NULL;
static Py_ssize_t request_offsets[RQ_N], response_offsets[RS_N], received_offsets[2], answered_offsets[2];
static const char *received_names[1] = {"request"};
static const char *answered_names[2] = {"request", "response"};
static PyObject *a_events, *a_pending, *a_seq, *a_max_pending, *a_frame_limit, *a_watch_client, *a_minimum, *a_raw,
    *a_frames, *a_append, *a_acks; /* attribute and key names */
static PyObject *protocol = NULL; /* decoder.protocol */
static PyObject *status_ok = NULL;
static PyObject *s_request_plans, *s_response_plans, *s_request_plan, *s_response_plan; /* names */
#define API_VERSIONS 18

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *rq, *rs, *rq_received, *rs_received, *module;
    if (!PyArg_ParseTuple(args, "OOOOO", &rq, &rs, &rq_received, &rs_received, &module)) return NULL;
    if (slot_offsets(rq, request_names, RQ_N, request_offsets) < 0 ||
        slot_offsets(rs, response_names, RS_N, response_offsets) < 0 ||
        slot_offsets(rq_received, received_names, 1, received_offsets) < 0 ||
        slot_offsets(rs_received, answered_names, 2, answered_offsets) < 0)
        return NULL;
    if (status_ok == NULL) {
        status_ok = PyUnicode_InternFromString("ok");
        s_request_plans = PyUnicode_InternFromString("_request_plans");
        s_response_plans = PyUnicode_InternFromString("_response_plans");
        s_request_plan = PyUnicode_InternFromString("request_plan");
        s_response_plan = PyUnicode_InternFromString("response_plan");
        if (!status_ok || !s_request_plans || !s_response_plans || !s_request_plan || !s_response_plan)
            return NULL;
        const char *names[] = {"_events", "_pending", "_seq", "max_pending", "frame_limit", "_watch_client",
                               "minimum", "raw", "frames", "append", "acks"};
        PyObject **slots[] = {&a_events, &a_pending, &a_seq, &a_max_pending, &a_frame_limit, &a_watch_client,
                              &a_minimum, &a_raw, &a_frames, &a_append, &a_acks};
        for (int i = 0; i < 11; i++)
            if ((*slots[i] = PyUnicode_InternFromString(names[i])) == NULL) return NULL;
    }
    Py_INCREF(rq_received);
    Py_XSETREF(request_received, (PyTypeObject *)rq_received);
    Py_INCREF(rs_received);
    Py_XSETREF(response_received, (PyTypeObject *)rs_received);
    Py_INCREF(rq);
    Py_XSETREF(request_type, (PyTypeObject *)rq);
    Py_INCREF(rs);
    Py_XSETREF(response_type, (PyTypeObject *)rs);
    Py_INCREF(module);
    Py_XSETREF(protocol, module);
    Py_RETURN_NONE;
}

/* (header version, decoder or None) of (key, version) from protocol's cache `cache_name`, or from
   its look-up `lookup_name` on a miss: a new reference, or NULL with an exception set. */
static PyObject *plan_of(PyObject *cache_name, PyObject *lookup_name, long api_key, long api_version) {
    PyObject *cache = PyObject_GetAttr(protocol, cache_name);
    if (cache == NULL) return NULL;
    PyObject *plan = NULL;
    PyObject *key = PyLong_FromLong(((api_key & 0xFFFF) << 16) | (api_version & 0xFFFF));
    if (key != NULL && PyDict_Check(cache)) {
        plan = PyDict_GetItemWithError(cache, key);
        Py_XINCREF(plan);
    }
    if (plan == NULL && !PyErr_Occurred()) {
        PyObject *lookup = PyObject_GetAttr(protocol, lookup_name);
        if (lookup != NULL) plan = PyObject_CallFunction(lookup, "ll", api_key, api_version);
        Py_XDECREF(lookup);
    }
    Py_XDECREF(key);
    Py_DECREF(cache);
    if (plan != NULL && (!PyTuple_Check(plan) || PyTuple_GET_SIZE(plan) != 2)) {
        PyErr_SetString(PyExc_TypeError, "a plan is (header version, decoder)");
        Py_CLEAR(plan);
    }
    return plan;
}

static inline int be16s(const unsigned char *p) { return (int16_t)((p[0] << 8) | p[1]); }
static inline int32_t be32s(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}

/* The position after the tagged fields at buf[pos], or -1 when they do not fit before end (the
   Python reader raises, or reads past end: either way the Python path decides). */
static Py_ssize_t skip_tags(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end) {
    uint32_t values[2];
    uint32_t count = 0;
    for (int shift = 0;; shift += 7) {
        if (pos >= end || shift > 28) return -1;
        unsigned char b = buf[pos++];
        count |= (uint32_t)(b & 0x7F) << shift;
        if (b < 0x80) break;
    }
    if (count > (uint32_t)(end - pos)) return -1;
    for (uint32_t i = 0; i < count; i++) {
        for (int k = 0; k < 2; k++) { /* tag, then size */
            uint32_t v = 0;
            for (int shift = 0;; shift += 7) {
                if (pos >= end || shift > 28) return -1;
                unsigned char b = buf[pos++];
                v |= (uint32_t)(b & 0x7F) << shift;
                if (b < 0x80) break;
            }
            values[k] = v;
        }
        if (values[1] > (uint32_t)(end - pos)) return -1;
        pos += values[1];
    }
    return pos;
}

/* decoder(buf, body, end) -> (fields, stop): a new reference to fields and *stop, or NULL when it
   raised, gave something else, or ran past end: with no exception set then, unless what it raised
   is no Exception (KeyboardInterrupt), which goes on up. */
static PyObject *decode_body(PyObject *decoder, PyObject *buf, Py_ssize_t body, Py_ssize_t end,
                             Py_ssize_t *stop) {
    PyObject *at = PyLong_FromSsize_t(body), *until = PyLong_FromSsize_t(end);
    PyObject *out = NULL;
    if (at != NULL && until != NULL) {
        PyObject *argv[3] = {buf, at, until};
        out = PyObject_Vectorcall(decoder, argv, 3, NULL);
    }
    Py_XDECREF(at);
    Py_XDECREF(until);
    if (out == NULL) {
        if (PyErr_ExceptionMatches(PyExc_Exception))
            PyErr_Clear(); /* the Python path decodes it again and reports the error */
        return NULL;
    }
    PyObject *fields = NULL;
    if (PyTuple_Check(out) && PyTuple_GET_SIZE(out) == 2 && PyLong_Check(PyTuple_GET_ITEM(out, 1))) {
        Py_ssize_t s = PyLong_AsSsize_t(PyTuple_GET_ITEM(out, 1));
        if (s == -1 && PyErr_Occurred()) {
            PyErr_Clear();
        } else if (s <= end) {
            *stop = s;
            fields = PyTuple_GET_ITEM(out, 0);
            Py_INCREF(fields);
        }
    }
    Py_DECREF(out);
    return fields;
}

static PyObject *trailing_note(Py_ssize_t stop, Py_ssize_t end) {
    if (stop >= end) Py_RETURN_NONE;
    return PyUnicode_FromFormat("%zd trailing bytes after the body", end - stop);
}

/* A new instance of a slotted class with its n slots set to v (references stolen, all of them,
   also on failure). */
static PyObject *filled(PyTypeObject *type, const Py_ssize_t *offsets, PyObject **v, int n) {
    int ok = 1;
    for (int i = 0; i < n; i++) ok &= v[i] != NULL;
    PyObject *obj = ok ? type->tp_alloc(type, 0) : NULL;
    if (obj == NULL) {
        for (int i = 0; i < n; i++) Py_XDECREF(v[i]);
        return NULL;
    }
    for (int i = 0; i < n; i++) SLOT(obj, offsets, i) = v[i];
    return obj;
}

/* The Request of the frame buf[pos:end] (bufobj's bytes, n of them), a new reference; Py_None
   (new) when the Python path is to parse it; NULL with an exception set. */
static PyObject *request_of(PyObject *bufobj, const unsigned char *buf, Py_ssize_t n, Py_ssize_t pos,
                            Py_ssize_t end, PyObject *start_ns, PyObject *end_ns) {
    if (pos < 0 || end > n || end - pos < 12) return Py_NewRef(Py_None);
    long api_key = be16s(buf + pos + 4), api_version = be16s(buf + pos + 6);
    int32_t corr = be32s(buf + pos + 8);
    PyObject *plan = plan_of(s_request_plans, s_request_plan, api_key, api_version);
    if (plan == NULL) return NULL; /* the look-up raised: so would Python's */
    PyObject *result = NULL, *client_id = Py_NewRef(Py_None), *fields = NULL;
    long header_version = PyLong_AsLong(PyTuple_GET_ITEM(plan, 0));
    PyObject *decoder = PyTuple_GET_ITEM(plan, 1);
    Py_ssize_t body = pos + 12, stop = 0;
    if (header_version == -1 && PyErr_Occurred()) goto failed;
    if (decoder == Py_None) goto fallback; /* unknown_api: the Python path says so */
    if (header_version >= 1) {
        if (end - body < 2) goto fallback;
        int length = be16s(buf + body);
        body += 2;
        if (length >= 0) {
            if (length > end - body) goto fallback;
            Py_SETREF(client_id, PyUnicode_DecodeUTF8((const char *)buf + body, length, "replace"));
            if (client_id == NULL) goto failed;
            body += length;
        }
    }
    if (header_version >= 2 && (body = skip_tags(buf, body, end)) < 0) goto fallback;
    fields = decode_body(decoder, bufobj, body, end, &stop);
    if (fields == NULL) {
        if (PyErr_Occurred()) goto failed;
        goto fallback;
    }
    PyObject *v[RQ_N] = {
        PyLong_FromLong(api_key),       PyLong_FromLong(api_version), PyLong_FromLong(header_version),
        PyLong_FromLong(corr),          client_id,                    PyLong_FromSsize_t(end - pos),
        Py_NewRef(start_ns),            Py_NewRef(end_ns),            Py_NewRef(status_ok),
        fields,                         trailing_note(stop, end),
    };
    Py_DECREF(plan);
    return filled(request_type, request_offsets, v, RQ_N); /* takes client_id and fields */
fallback:
    result = Py_NewRef(Py_None);
failed: /* result NULL: an exception is set */
    Py_DECREF(plan);
    Py_XDECREF(client_id);
    return result;
}

/* The Response of the frame buf[pos:end] as the answer to request: as request_of. */
static PyObject *response_of(PyObject *request, PyObject *bufobj, const unsigned char *buf, Py_ssize_t n,
                             Py_ssize_t pos, Py_ssize_t end, PyObject *start_ns, PyObject *end_ns) {
    if (Py_TYPE(request) != request_type || pos < 0 || end > n || end - pos < 8) return Py_NewRef(Py_None);
    PyObject *key_obj = SLOT(request, request_offsets, RQ_API_KEY);
    PyObject *version_obj = SLOT(request, request_offsets, RQ_API_VERSION);
    PyObject *corr_obj = SLOT(request, request_offsets, RQ_CORRELATION_ID);
    if (key_obj == NULL || version_obj == NULL || corr_obj == NULL) return Py_NewRef(Py_None);
    long api_key = PyLong_AsLong(key_obj), api_version = PyLong_AsLong(version_obj);
    if ((api_key == -1 || api_version == -1) && PyErr_Occurred()) return NULL;
    /* an unsupported ApiVersions version is answered in the v0 layout */
    long versions[2] = {api_version, 0};
    int tries = (api_key == API_VERSIONS && api_version != 0) ? 2 : 1;
    for (int t = 0; t < tries; t++) {
        PyObject *plan = plan_of(s_response_plans, s_response_plan, api_key, versions[t]);
        if (plan == NULL) return NULL;
        long header_version = PyLong_AsLong(PyTuple_GET_ITEM(plan, 0));
        PyObject *decoder = PyTuple_GET_ITEM(plan, 1);
        Py_ssize_t body = pos + 8, stop = 0;
        PyObject *fields = NULL;
        if (header_version == -1 && PyErr_Occurred()) {
            Py_DECREF(plan);
            return NULL;
        }
        if (decoder != Py_None && header_version >= 1) body = skip_tags(buf, body, end);
        if (decoder != Py_None && body >= 0) fields = decode_body(decoder, bufobj, body, end, &stop);
        Py_DECREF(plan);
        if (fields == NULL && PyErr_Occurred()) return NULL;
        if (body < 0) break; /* the header's tagged fields: the Python path decides */
        if (fields == NULL) continue;
        PyObject *v[RS_N] = {
            Py_NewRef(corr_obj),  PyLong_FromLong(header_version), PyLong_FromSsize_t(end - pos),
            Py_NewRef(start_ns),  Py_NewRef(end_ns),               Py_NewRef(status_ok),
            fields,               trailing_note(stop, end),        PyLong_FromLong(versions[t]),
        };
        return filled(response_type, response_offsets, v, RS_N);
    }
    return Py_NewRef(Py_None);
}

static int configured(void) {
    if (request_type != NULL) return 1;
    PyErr_SetString(PyExc_RuntimeError, "configure first");
    return 0;
}

static PyObject *parse_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "parse_request(buf, pos, end, start_ns, end_ns)");
        return NULL;
    }
    if (!configured()) return NULL;
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    if ((pos == -1 || end == -1) && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = request_of(args[0], view.buf, view.len, pos, end, args[3], args[4]);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *parse_response(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "parse_response(request, buf, pos, end, start_ns, end_ns)");
        return NULL;
    }
    if (!configured()) return NULL;
    Py_ssize_t pos = PyLong_AsSsize_t(args[2]), end = PyLong_AsSsize_t(args[3]);
    if ((pos == -1 || end == -1) && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = response_of(args[0], args[1], view.buf, view.len, pos, end, args[4], args[5]);
    PyBuffer_Release(&view);
    return result;
}

/* getattr(obj, name) as a C long long; *bad set (and the error cleared) when it is not an int. */
static long long long_attr(PyObject *obj, PyObject *name, int *bad) {
    PyObject *v = PyObject_GetAttr(obj, name);
    long long x = 0;
    if (v != NULL && PyLong_Check(v)) x = PyLong_AsLongLong(v);
    if (v == NULL || !PyLong_Check(v) || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        *bad = 1;
    }
    Py_XDECREF(v);
    return x;
}

static int truthy_attr(PyObject *obj, PyObject *name) { /* -1: error */
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* Does this request expect no answer (Produce with acks=0: Request.expects_response)? -1: error. */
static int acks0(PyObject *request) {
    if (PyLong_AsLong(SLOT(request, request_offsets, RQ_API_KEY)) != 0) return 0;
    PyObject *fields = SLOT(request, request_offsets, RQ_FIELDS);
    if (!PyDict_Check(fields)) return 1; /* not for this path: the Python path decides */
    PyObject *acks = PyDict_GetItemWithError(fields, a_acks);
    if (acks == NULL) return PyErr_Occurred() ? -1 : 0;
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) return -1;
    int eq = PyObject_RichCompareBool(acks, zero, Py_EQ);
    Py_DECREF(zero);
    return eq;
}

/* run_frames(conn, state, direction, data, pos, ts_ns) -> pos: KafkaConnection._frame_chunk's loop for
   the plain frames of a chunk, from pos while each frame is whole in data and nothing about it needs
   the connection's Python: a request that parses cleanly here, is no SaslHandshake, expects an answer
   and reuses no pending correlation id (the pending table not full); a response that answers the
   oldest pending request, no SaslHandshake, and parses cleanly here. Each is noted as
   _request_frame/_add_request and _response_frame note it (pending table, sequence number, event,
   frame count). It stops before the first other frame, for the Python loop to take that one. */
static PyObject *run_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "run_frames(conn, state, direction, data, pos, ts_ns)");
        return NULL;
    }
    if (!configured()) return NULL;
    PyObject *conn = args[0], *state = args[1], *data = args[3], *ts = args[5];
    long direction = PyLong_AsLong(args[2]);
    Py_ssize_t p = PyLong_AsSsize_t(args[4]);
    if ((direction == -1 || p == -1) && PyErr_Occurred()) return NULL;
    Py_ssize_t start = p;
    int bad = 0;
    long long minimum = long_attr(state, a_minimum, &bad), frames = long_attr(state, a_frames, &bad);
    long long limit = long_attr(conn, a_frame_limit, &bad), seq = long_attr(conn, a_seq, &bad);
    long long max_pending = long_attr(conn, a_max_pending, &bad);
    int held = truthy_attr(direction == 0 ? conn : state, direction == 0 ? a_watch_client : a_raw);
    if (held < 0) return NULL;
    if (bad || held) return PyLong_FromSsize_t(p);
    PyObject *pending = PyObject_GetAttr(conn, a_pending), *events = PyObject_GetAttr(conn, a_events);
    PyObject *append = events ? PyObject_GetAttr(events, a_append) : NULL;
    Py_buffer view;
    int have_view = 0, failed = 0;
    if (pending == NULL || append == NULL || !PyODict_Check(pending)) goto finish;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) goto finish;
    have_view = 1;
    const unsigned char *buf = view.buf;
    Py_ssize_t n = view.len;
    while (n - p >= 4) {
        int32_t size = be32s(buf + p);
        if (size < minimum || size > limit) break;
        Py_ssize_t end = p + 4 + (Py_ssize_t)size;
        if (end > n) break;
        PyObject *event = NULL;
        if (direction == 0) {
            PyObject *request = request_of(data, buf, n, p, end, ts, ts);
            if (request == NULL) goto finish;
            if (request == Py_None || PyLong_AsLong(SLOT(request, request_offsets, RQ_API_KEY)) == 17) {
                Py_DECREF(request);
                break;
            }
            PyObject *corr = SLOT(request, request_offsets, RQ_CORRELATION_ID);
            int no_answer = acks0(request);
            int reused = no_answer ? 0 : PyDict_Contains(pending, corr);
            if (no_answer || reused || PyDict_GET_SIZE(pending) >= max_pending) {
                Py_DECREF(request);
                if (no_answer < 0 || reused < 0) goto finish;
                break;
            }
            PyObject *entry = Py_BuildValue("(LO)", seq + 1, request);
            int stored = entry ? PyODict_SetItem(pending, corr, entry) : -1;
            Py_XDECREF(entry);
            if (stored < 0) {
                Py_DECREF(request);
                goto finish;
            }
            seq++;
            PyObject *v[1] = {request};
            event = filled(request_received, received_offsets, v, 1);
        } else {
            PyObject *corr = PyLong_FromLong(be32s(buf + p + 4));
            if (corr == NULL) goto finish;
            PyObject *entry = PyDict_GetItemWithError(pending, corr); /* borrowed */
            PyObject *oldest = NULL, *it = NULL;
            int first = 0;
            if (entry != NULL && PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) == 2 &&
                Py_TYPE(PyTuple_GET_ITEM(entry, 1)) == request_type &&
                PyLong_AsLong(SLOT(PyTuple_GET_ITEM(entry, 1), request_offsets, RQ_API_KEY)) != 17) {
                it = PyObject_GetIter(pending);
                oldest = it ? PyIter_Next(it) : NULL;
                first = oldest ? PyObject_RichCompareBool(oldest, corr, Py_EQ) : 0;
            }
            Py_XDECREF(it);
            Py_XDECREF(oldest);
            if (first != 1) {
                Py_DECREF(corr);
                if (PyErr_Occurred()) goto finish;
                break; /* no pending request, not the oldest, or a SaslHandshake: Python's */
            }
            PyObject *request = Py_NewRef(PyTuple_GET_ITEM(entry, 1));
            PyObject *response = response_of(request, data, buf, n, p, end, ts, ts);
            if (response == NULL || response == Py_None) {
                Py_XDECREF(response);
                Py_DECREF(request);
                Py_DECREF(corr);
                if (PyErr_Occurred()) goto finish;
                break;
            }
            int removed = PyODict_DelItem(pending, corr);
            Py_DECREF(corr);
            if (removed < 0) {
                Py_DECREF(request);
                Py_DECREF(response);
                goto finish;
            }
            PyObject *v[2] = {request, response};
            event = filled(response_received, answered_offsets, v, 2);
        }
        if (event == NULL) goto finish;
        PyObject *out = PyObject_CallOneArg(append, event);
        Py_DECREF(event);
        if (out == NULL) goto finish;
        Py_DECREF(out);
        frames++;
        p = end;
    }
    goto done;
finish:
    failed = PyErr_Occurred() != NULL;
done:
    if (have_view) PyBuffer_Release(&view);
    Py_XDECREF(pending);
    Py_XDECREF(events);
    Py_XDECREF(append);
    if (p != start) { /* write back what the frames noted, also when one of them failed */
        PyObject *type = NULL, *value = NULL, *trace = NULL;
        if (failed) PyErr_Fetch(&type, &value, &trace);
        PyObject *f = PyLong_FromLongLong(frames), *q = PyLong_FromLongLong(seq);
        int ok = f && q && PyObject_SetAttr(state, a_frames, f) == 0 && PyObject_SetAttr(conn, a_seq, q) == 0;
        Py_XDECREF(f);
        Py_XDECREF(q);
        if (failed) {
            PyErr_Restore(type, value, trace);
        } else if (!ok) {
            failed = 1;
        }
    }
    return failed ? NULL : PyLong_FromSsize_t(p);
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(Request, Response, RequestReceived, ResponseReceived, decoder.protocol)"},
    {"run_frames", (PyCFunction)(void (*)(void))run_frames, METH_FASTCALL,
     "run_frames(conn, state, direction, data, pos, ts_ns) -> pos after the plain frames noted"},
    {"parse_request", (PyCFunction)(void (*)(void))parse_request, METH_FASTCALL,
     "parse_request(buf, pos, end, start_ns, end_ns) -> Request, or None: the Python path decides."},
    {"parse_response", (PyCFunction)(void (*)(void))parse_response, METH_FASTCALL,
     "parse_response(request, buf, pos, end, start_ns, end_ns) -> Response, or None: the Python path decides."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "decoder._framecore",
                                    "Compiled common case of a Kafka frame's header and body decode.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__framecore(void) { return PyModule_Create(&module); }
