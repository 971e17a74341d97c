/* kwire._exchangerows: ExchangeRows._row (kwire/rows.py) compiled, for an exchange with its request.

Why hand-written: after the compiled framing (decoder/_framecore.c) and row values
(decoder/_rowvalues.c), making the row dict was the largest Python step left per exchange. On the
bench's chatty capture (81,070 exchanges) ExchangeRows.row took 4.7-4.9 us an exchange, 2.6 of them
in the row values: the rest is the dict of about 25 keys built through _base, _us, utc_date,
api_name, error_name and exchange_values' merge, each a Python call. Cython on rows.py and the
modules around it gained nothing (2026-12-06: 1.90 s against 1.90 s for that capture's decode).
Measured with valgrind (instructions of a whole `kwire decode -j 1` of the capture's first 20 MB,
36k exchanges, 2026-12-06): the row here saves 350M of 7.43G (4.7%; about 9,700 per exchange),
the drain another 155M (2.2%); ExchangeRows.row went from 4.7-4.9 to 3.5-3.7 us an exchange, and
the proxy's recorder (bench/recorder_replay.py, decoding and rows) from 8.7-10.6 to 7.5-9.5 us.
Later the same day: the row dict made at its size and the request's and response's values merged
straight into it, with the layout VM's struct dicts made at their size (decoder/_layoutvm.c), took
another 106M off (6.925G -> 6.819G, PYTHONHASHSEED=0; the counts move by tens of millions with it).

It holds no knowledge of its own: the same keys in the same order as ExchangeRows._row, and the
functions it cannot do without are rows.py's own (_day_name, protocol.api_name and error_name,
extract's row-value walks), handed over by configure. api_name and error_name are cached per value
(both are fixed tables of the protocol); the day of the last row is kept. kwire/rows.py stays the
reference: KWIRE_PURE_PYTHON=1 uses it alone, and tests/test_rowvalues.py checks both make the
same rows, key order included, on every bundled and lab capture.

configure(ExchangeRows, ConnectionInfo, Request, Response, RequestReceived, ResponseReceived, day_name,
          api_name, error_name, request_values, response_values)
exchange_row(rows, request, response_or_None, status, decode_error) -> dict
    ExchangeRows._row(request, response, status, decode_error) with request not None.
drain(rows, events, summary, on_exchange)
    kwire.pipeline.StreamDecoder._drain: each event's row (RequestReceived noted and
    ResponseReceived made here, any other event by rows.row), counted into the DecodeSummary and
    handed to on_exchange, in order. The Python method stays the reference.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>

#include "../decoder/_slots.h"

enum { X_INFO, X_SW_NAME, X_SW_VERSION, X_CLIENT_ID, X_N };
static const char *rows_names[X_N] = {"info", "client_software_name", "client_software_version", "client_id"};
enum { I_SOURCE, I_CONNECTION_ID, I_CLIENT_IP, I_CLIENT_PORT, I_BROKER_IP, I_BROKER_PORT, I_N };
static const char *info_names[I_N] = {"source",    "connection_id", "client_ip",
                                      "client_port", "broker_ip",   "broker_port"};
enum { RQ_API_KEY, RQ_API_VERSION, RQ_HEADER_VERSION, RQ_CORRELATION_ID, RQ_CLIENT_ID, RQ_SIZE, RQ_START_NS,
       RQ_FIELDS, RQ_STATUS, RQ_DECODE_ERROR, RQ_N };
static const char *request_names[RQ_N] = {"api_key",   "api_version", "header_version", "correlation_id",
                                          "client_id", "size",        "start_ns",       "fields",
                                          "status",    "decode_error"};
enum { RS_CORRELATION_ID, RS_SIZE, RS_END_NS, RS_FIELDS, RS_STATUS, RS_DECODE_ERROR, RS_N };
static const char *response_names[RS_N] = {"correlation_id", "size", "end_ns", "fields", "status", "decode_error"};
enum { E_REQUEST, E_RESPONSE, E_N };
static const char *event_names[E_N] = {"request", "response"};

static Py_ssize_t received_off[1], answered_off[E_N];
static PyTypeObject *received_type, *answered_type; /* RequestReceived, ResponseReceived */

static Py_ssize_t rows_off[X_N], info_off[I_N], request_off[RQ_N], response_off[RS_N];
static PyTypeObject *rows_type, *info_type, *request_type, *response_type;
static PyObject *day_name, *api_name, *error_name, *request_values, *response_values;
static PyObject *api_names, *error_names; /* caches: api key -> name, error code -> name */
static PyObject *one; /* 1 */
static long long last_day = LLONG_MIN;
static PyObject *last_date; /* the date of last_day */

#define DAY_NS 86400000000000LL
#define MAX_CACHED 4096
/* keys a row is made for at once (a Produce or Fetch row has 25-30) */
#define ROW_KEYS 32

/* the row's keys, in ExchangeRows._row's order */
static PyObject *k_source, *k_connection_id, *k_client_ip, *k_client_port, *k_broker_ip, *k_broker_port,
    *k_client_software_name, *k_client_software_version, *k_date, *k_request_time, *k_response_time,
    *k_latency_us, *k_status, *k_decode_error, *k_response_size, *k_correlation_id, *k_api_key, *k_api_name,
    *k_api_version, *k_request_header_version, *k_client_id, *k_request_size, *k_error_code, *k_error_name,
    *k_member_id, *k_generation_id, *k_records, *k_partition_errors, *k_ok, *k_row, *k_exchanges, *k_statuses,
    *k_apis, *k_errors, *k_client_software_name_field, *k_client_software_version_field;

/* value // divisor as Python computes it (floor), for any int */
static PyObject *floor_div(PyObject *value, long long divisor) {
    if (PyLong_CheckExact(value)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (!overflow && !(x == -1 && PyErr_Occurred())) {
            long long q = x / divisor;
            if ((x % divisor != 0) && ((x < 0) != (divisor < 0)))
                q -= 1;
            return PyLong_FromLongLong(q);
        }
        PyErr_Clear();
    }
    PyObject *d = PyLong_FromLongLong(divisor);
    if (d == NULL)
        return NULL;
    PyObject *q = PyNumber_FloorDivide(value, d);
    Py_DECREF(d);
    return q;
}

/* utc_date(ts): the day's name, through rows._day_name; the last day's kept */
static PyObject *date_of(PyObject *ts) {
    PyObject *day = ts == Py_None ? PyLong_FromLong(0) : floor_div(ts, DAY_NS);
    if (day == NULL)
        return NULL;
    if (!PyLong_Check(day)) { /* not an int: as rows.utc_date would, uncached */
        PyObject *date = PyObject_CallOneArg(day_name, day);
        Py_DECREF(day);
        return date;
    }
    int overflow;
    long long d = PyLong_AsLongLongAndOverflow(day, &overflow);
    if (d == -1 && PyErr_Occurred()) {
        Py_DECREF(day);
        return NULL;
    }
    if (!overflow && d == last_day && last_date != NULL) {
        Py_DECREF(day);
        Py_INCREF(last_date);
        return last_date;
    }
    PyObject *date = PyObject_CallOneArg(day_name, day);
    Py_DECREF(day);
    if (date != NULL && !overflow) {
        Py_INCREF(date);
        Py_XSETREF(last_date, date);
        last_day = d;
    }
    return date;
}

/* fn(key) through cache (kept only for exact ints, up to MAX_CACHED entries): a new reference */
static PyObject *cached(PyObject *cache, PyObject *fn, PyObject *key) {
    int exact = PyLong_CheckExact(key);
    if (exact) {
        PyObject *hit = PyDict_GetItemWithError(cache, key);
        if (hit != NULL) {
            Py_INCREF(hit);
            return hit;
        }
        if (PyErr_Occurred())
            return NULL;
    }
    PyObject *name = PyObject_CallOneArg(fn, key);
    if (name != NULL && exact && PyDict_GET_SIZE(cache) < MAX_CACHED && PyDict_SetItem(cache, key, name) < 0)
        Py_CLEAR(name);
    return name;
}

/* row[key] = value, stealing value; -1 on error (value may be NULL: an error already set) */
static int put(PyObject *row, PyObject *key, PyObject *value) {
    if (value == NULL)
        return -1;
    int failed = PyDict_SetItem(row, key, value);
    Py_DECREF(value);
    return failed;
}

/* row[key] = value (borrowed) */
static int put_borrowed(PyObject *row, PyObject *key, PyObject *value) { return PyDict_SetItem(row, key, value); }

static int is_request_own(PyObject *key) {
    /* exchange_values: the request's member_id, generation_id and records win over the response's */
    return PyUnicode_CheckExact(key) &&
           (PyUnicode_Compare(key, k_member_id) == 0 || PyUnicode_Compare(key, k_generation_id) == 0 ||
            PyUnicode_Compare(key, k_records) == 0);
}

/* row.update(extract.exchange_values(api_key, request fields, response fields)), without the
   intermediate dict: the request's values, then the response's (but for the request's own keys
   that the request has); keys keep the positions that update would give them */
static int add_exchange_values(PyObject *row, PyObject *api_key, PyObject *request_fields, PyObject *response_fields) {
    PyObject *args[2] = {api_key, request_fields};
    PyObject *values = PyObject_Vectorcall(request_values, args, 2, NULL);
    if (values == NULL)
        return -1;
    if (!PyDict_Check(values)) {
        PyErr_SetString(PyExc_TypeError, "row values are not dicts");
        Py_DECREF(values);
        return -1;
    }
    if (PyDict_Update(row, values) < 0) {
        Py_DECREF(values);
        return -1;
    }
    int some = PyObject_IsTrue(response_fields);
    if (some <= 0) {
        Py_DECREF(values);
        return some;
    }
    args[1] = response_fields;
    PyObject *answer = PyObject_Vectorcall(response_values, args, 2, NULL);
    if (answer == NULL || !PyDict_Check(answer)) {
        if (answer != NULL)
            PyErr_SetString(PyExc_TypeError, "row values are not dicts");
        Py_XDECREF(answer);
        Py_DECREF(values);
        return -1;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    int failed = 0;
    while (!failed && PyDict_Next(answer, &pos, &key, &value)) {
        int present = is_request_own(key) ? PyDict_Contains(values, key) : 0;
        failed = present < 0 || (!present && PyDict_SetItem(row, key, value) < 0);
    }
    Py_DECREF(answer);
    Py_DECREF(values);
    return failed ? -1 : 0;
}

static PyObject *exchange_row(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "exchange_row(rows, request, response, status, decode_error)");
        return NULL;
    }
    if (rows_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "kwire._exchangerows is not configured");
        return NULL;
    }
    PyObject *rows = args[0], *request = args[1], *response = args[2], *status = args[3], *decode_error = args[4];
    if (!Py_IS_TYPE(rows, rows_type) || !Py_IS_TYPE(request, request_type) ||
        (response != Py_None && !Py_IS_TYPE(response, response_type))) {
        PyErr_SetString(PyExc_TypeError, "exchange_row: an ExchangeRows, a Request and a Response or None");
        return NULL;
    }
    PyObject *info = SLOT(rows, rows_off, X_INFO);
    if (info == NULL || !Py_IS_TYPE(info, info_type)) {
        PyErr_SetString(PyExc_TypeError, "exchange_row: rows.info is not a ConnectionInfo");
        return NULL;
    }
    for (int i = 0; i < RQ_N; i++)
        if (SLOT(request, request_off, i) == NULL) {
            PyErr_SetString(PyExc_AttributeError, request_names[i]);
            return NULL;
        }
    for (int i = 0; response != Py_None && i < RS_N; i++)
        if (SLOT(response, response_off, i) == NULL) {
            PyErr_SetString(PyExc_AttributeError, response_names[i]);
            return NULL;
        }
    PyObject *start_ns = SLOT(request, request_off, RQ_START_NS);
    PyObject *end_ns = response == Py_None ? Py_None : SLOT(response, response_off, RS_END_NS);
    PyObject *api_key = SLOT(request, request_off, RQ_API_KEY);
    /* sized for a row's usual keys at once: grown from empty, it was resized 8 times a row */
    PyObject *row = _PyDict_NewPresized(ROW_KEYS);
    if (row == NULL)
        return NULL;
    PyObject *info_keys[I_N] = {k_source, k_connection_id, k_client_ip, k_client_port, k_broker_ip, k_broker_port};
    for (int i = 0; i < I_N; i++) {
        PyObject *v = SLOT(info, info_off, i);
        if (put_borrowed(row, info_keys[i], v ? v : Py_None) < 0)
            goto fail;
    }
    PyObject *sw_name = SLOT(rows, rows_off, X_SW_NAME), *sw_version = SLOT(rows, rows_off, X_SW_VERSION);
    if (put_borrowed(row, k_client_software_name, sw_name ? sw_name : Py_None) < 0 ||
        put_borrowed(row, k_client_software_version, sw_version ? sw_version : Py_None) < 0 ||
        put(row, k_date, date_of(start_ns != Py_None ? start_ns : end_ns)) < 0 ||
        put(row, k_request_time, start_ns == Py_None ? Py_NewRef(Py_None) : floor_div(start_ns, 1000)) < 0 ||
        put(row, k_response_time, end_ns == Py_None ? Py_NewRef(Py_None) : floor_div(end_ns, 1000)) < 0)
        goto fail;
    if (start_ns != Py_None && end_ns != Py_None) {
        PyObject *span = PyNumber_Subtract(end_ns, start_ns);
        PyObject *latency = span == NULL ? NULL : floor_div(span, 1000);
        Py_XDECREF(span);
        if (put(row, k_latency_us, latency) < 0)
            goto fail;
    }
    if (put_borrowed(row, k_status, status) < 0 || put_borrowed(row, k_decode_error, decode_error) < 0)
        goto fail;
    if (response != Py_None &&
        (put_borrowed(row, k_response_size, SLOT(response, response_off, RS_SIZE)) < 0 ||
         put_borrowed(row, k_correlation_id, SLOT(response, response_off, RS_CORRELATION_ID)) < 0))
        goto fail;
    if (put_borrowed(row, k_api_key, api_key) < 0 || put(row, k_api_name, cached(api_names, api_name, api_key)) < 0 ||
        put_borrowed(row, k_api_version, SLOT(request, request_off, RQ_API_VERSION)) < 0 ||
        put_borrowed(row, k_request_header_version, SLOT(request, request_off, RQ_HEADER_VERSION)) < 0 ||
        put_borrowed(row, k_correlation_id, SLOT(request, request_off, RQ_CORRELATION_ID)) < 0 ||
        put_borrowed(row, k_client_id, SLOT(request, request_off, RQ_CLIENT_ID)) < 0 ||
        put_borrowed(row, k_request_size, SLOT(request, request_off, RQ_SIZE)) < 0)
        goto fail;
    if (add_exchange_values(row, api_key, SLOT(request, request_off, RQ_FIELDS),
                            response == Py_None ? Py_None : SLOT(response, response_off, RS_FIELDS)) < 0)
        goto fail;
    PyObject *code = PyDict_GetItemWithError(row, k_error_code);
    if (code == NULL && PyErr_Occurred())
        goto fail;
    if (code != NULL && put(row, k_error_name, cached(error_names, error_name, code)) < 0)
        goto fail;
    return row;
fail:
    Py_DECREF(row);
    return NULL;
}

/* counter[key] += 1, as a collections.Counter does it (a missing key counts 0) */
static int count(PyObject *counter, PyObject *key) {
    PyObject *had = PyDict_GetItemWithError(counter, key);
    if (had == NULL && PyErr_Occurred())
        return -1;
    PyObject *sum = had == NULL ? Py_NewRef(one) : PyNumber_Add(had, one);
    int failed = sum == NULL || PyObject_SetItem(counter, key, sum) < 0;
    Py_XDECREF(sum);
    return failed ? -1 : 0;
}

/* ExchangeRows._note_request; 1 when it is done, 0 when the Python method must do it */
static int note_request(PyObject *rows, PyObject *request) {
    PyObject *client_id = SLOT(request, request_off, RQ_CLIENT_ID), *api_key = SLOT(request, request_off, RQ_API_KEY),
             *fields = SLOT(request, request_off, RQ_FIELDS);
    if (client_id == NULL || api_key == NULL || fields == NULL || !PyLong_CheckExact(api_key) ||
        (fields != Py_None && !PyDict_CheckExact(fields)))
        return 0;
    PyObject *known = SLOT(rows, rows_off, X_CLIENT_ID);
    if ((known == NULL || known == Py_None) && client_id != Py_None) {
        int some = PyObject_IsTrue(client_id);
        if (some < 0)
            return -1;
        if (some)
            Py_XSETREF(SLOT(rows, rows_off, X_CLIENT_ID), Py_NewRef(client_id));
    }
    int overflow;
    long key = PyLong_AsLongAndOverflow(api_key, &overflow);
    if (key == -1 && PyErr_Occurred())
        return -1;
    if (overflow || key != 18 || fields == Py_None || PyDict_GET_SIZE(fields) == 0)
        return 1;
    PyObject *name = PyDict_GetItemWithError(fields, k_client_software_name_field);
    if (name == NULL)
        return PyErr_Occurred() ? -1 : 1;
    int some = PyObject_IsTrue(name);
    if (some <= 0)
        return some;
    PyObject *version = PyDict_GetItemWithError(fields, k_client_software_version_field);
    if (version == NULL && PyErr_Occurred())
        return -1;
    Py_XSETREF(SLOT(rows, rows_off, X_SW_NAME), Py_NewRef(name));
    Py_XSETREF(SLOT(rows, rows_off, X_SW_VERSION), Py_NewRef(version ? version : Py_None));
    return 1;
}

/* ExchangeRows.row for a ResponseReceived: a new row, or NULL with an exception set */
static PyObject *answered_row(PyObject *rows, PyObject *event) {
    PyObject *request = SLOT(event, answered_off, E_REQUEST), *response = SLOT(event, answered_off, E_RESPONSE);
    if (request == NULL || response == NULL || !Py_IS_TYPE(request, request_type) ||
        !Py_IS_TYPE(response, response_type))
        return PyObject_CallMethodOneArg(rows, k_row, event);
    PyObject *rq_status = SLOT(request, request_off, RQ_STATUS), *rs_status = SLOT(response, response_off, RS_STATUS);
    PyObject *rq_error = SLOT(request, request_off, RQ_DECODE_ERROR),
             *rs_error = SLOT(response, response_off, RS_DECODE_ERROR);
    if (rq_status == NULL || rs_status == NULL || rq_error == NULL || rs_error == NULL)
        return PyObject_CallMethodOneArg(rows, k_row, event);
    int not_ok = PyObject_RichCompareBool(rq_status, k_ok, Py_NE);
    int rs_some = PyObject_IsTrue(rs_error);
    if (not_ok < 0 || rs_some < 0)
        return NULL;
    PyObject *args[5] = {rows, request, response, not_ok ? rq_status : rs_status, rs_some ? rs_error : rq_error};
    return exchange_row(NULL, args, 5);
}

/* StreamDecoder._drain's accounting of one row (kwire/pipeline.py) */
static int account(PyObject *row, PyObject *statuses, PyObject *apis, PyObject *errors) {
    PyObject *status = PyObject_GetItem(row, k_status);
    int failed = status == NULL || count(statuses, status) < 0;
    Py_XDECREF(status);
    if (failed)
        return -1;
    PyObject *name = PyDict_GetItemWithError(row, k_api_name);
    if (name == NULL && PyErr_Occurred())
        return -1;
    int some = name == NULL ? 0 : PyObject_IsTrue(name);
    if (some < 0 || (some && count(apis, name) < 0))
        return -1;
    PyObject *code = PyDict_GetItemWithError(row, k_error_code);
    if (code == NULL && PyErr_Occurred())
        return -1;
    some = code == NULL ? 0 : PyObject_IsTrue(code);
    if (some < 0)
        return -1;
    if (some) {
        PyObject *named = PyDict_GetItemWithError(row, k_error_name);
        if (named == NULL && PyErr_Occurred())
            return -1;
        int given = named == NULL ? 0 : PyObject_IsTrue(named);
        if (given < 0)
            return -1;
        PyObject *key = given ? Py_NewRef(named) : PyObject_Str(code);
        failed = key == NULL || count(errors, key) < 0;
        Py_XDECREF(key);
        if (failed)
            return -1;
    }
    PyObject *results = PyDict_GetItemWithError(row, k_partition_errors);
    if (results == NULL)
        return PyErr_Occurred() ? -1 : 0;
    some = PyObject_IsTrue(results);
    if (some <= 0)
        return some;
    PyObject *iterator = PyObject_GetIter(results), *result;
    if (iterator == NULL)
        return -1;
    while ((result = PyIter_Next(iterator)) != NULL) {
        PyObject *result_code = PyObject_GetItem(result, k_error_code);
        Py_DECREF(result);
        some = result_code == NULL ? -1 : PyObject_IsTrue(result_code);
        PyObject *key = some > 0 ? cached(error_names, error_name, result_code) : NULL;
        failed = some < 0 || (some > 0 && (key == NULL || count(errors, key) < 0));
        Py_XDECREF(key);
        Py_XDECREF(result_code);
        if (failed) {
            Py_DECREF(iterator);
            return -1;
        }
    }
    Py_DECREF(iterator);
    return PyErr_Occurred() ? -1 : 0;
}

/* drain(rows, events, summary, on_exchange): StreamDecoder._drain (kwire/pipeline.py) */
static PyObject *drain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "drain(rows, events, summary, on_exchange)");
        return NULL;
    }
    PyObject *rows = args[0], *events = args[1], *summary = args[2], *on_exchange = args[3];
    if (rows_type == NULL || !Py_IS_TYPE(rows, rows_type) || !PyList_CheckExact(events)) {
        PyErr_SetString(PyExc_TypeError, "drain: an ExchangeRows and a list of events");
        return NULL;
    }
    PyObject *statuses = PyObject_GetAttr(summary, k_statuses), *apis = PyObject_GetAttr(summary, k_apis),
             *errors = PyObject_GetAttr(summary, k_errors);
    PyObject *result = NULL;
    if (statuses == NULL || apis == NULL || errors == NULL)
        goto done;
    if (!PyDict_Check(statuses) || !PyDict_Check(apis) || !PyDict_Check(errors)) {
        PyErr_SetString(PyExc_TypeError, "drain: the summary's counters are not Counters");
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        /* held: the Python called below (rows.row, on_exchange) could change the list */
        PyObject *event = Py_NewRef(PyList_GET_ITEM(events, i)), *row = NULL;
        if (Py_IS_TYPE(event, received_type)) {
            PyObject *request = SLOT(event, received_off, 0);
            int done = request != NULL && Py_IS_TYPE(request, request_type) ? note_request(rows, request) : 0;
            if (done != 0) {
                Py_DECREF(event);
                if (done < 0)
                    goto done;
                continue;
            }
            row = PyObject_CallMethodOneArg(rows, k_row, event);
        } else if (Py_IS_TYPE(event, answered_type)) {
            row = answered_row(rows, event);
        } else {
            row = PyObject_CallMethodOneArg(rows, k_row, event);
        }
        Py_DECREF(event);
        if (row == NULL)
            goto done;
        if (row == Py_None) {
            Py_DECREF(row);
            continue;
        }
        /* summary.exchanges += 1, then the counters, then the row handed on, as in Python */
        PyObject *exchanges = PyObject_GetAttr(summary, k_exchanges);
        PyObject *more = exchanges == NULL ? NULL : PyNumber_Add(exchanges, one);
        Py_XDECREF(exchanges);
        int failed = more == NULL || PyObject_SetAttr(summary, k_exchanges, more) < 0;
        Py_XDECREF(more);
        if (failed || !PyDict_Check(row) || account(row, statuses, apis, errors) < 0) {
            if (!failed && !PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "drain: a row is not a dict");
            Py_DECREF(row);
            goto done;
        }
        PyObject *handed = PyObject_CallOneArg(on_exchange, row);
        Py_DECREF(row);
        if (handed == NULL)
            goto done;
        Py_DECREF(handed);
    }
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(statuses);
    Py_XDECREF(apis);
    Py_XDECREF(errors);
    return result;
}

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *types[6], *functions[5];
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!OOOOO:configure", &PyType_Type, &types[0], &PyType_Type, &types[1],
                          &PyType_Type, &types[2], &PyType_Type, &types[3], &PyType_Type, &types[4], &PyType_Type,
                          &types[5], &functions[0], &functions[1], &functions[2], &functions[3], &functions[4]))
        return NULL;
    if (slot_offsets(types[0], rows_names, X_N, rows_off) < 0 || slot_offsets(types[1], info_names, I_N, info_off) < 0 ||
        slot_offsets(types[2], request_names, RQ_N, request_off) < 0 ||
        slot_offsets(types[3], response_names, RS_N, response_off) < 0 ||
        slot_offsets(types[4], event_names, 1, received_off) < 0 ||
        slot_offsets(types[5], event_names, E_N, answered_off) < 0)
        return NULL;
    PyTypeObject **type_slots[] = {&rows_type, &info_type, &request_type, &response_type, &received_type, &answered_type};
    for (int i = 0; i < 6; i++) {
        Py_INCREF(types[i]);
        Py_XSETREF(*type_slots[i], (PyTypeObject *)types[i]);
    }
    PyObject **function_slots[] = {&day_name, &api_name, &error_name, &request_values, &response_values};
    for (int i = 0; i < 5; i++) {
        Py_INCREF(functions[i]);
        Py_XSETREF(*function_slots[i], functions[i]);
    }
    PyDict_Clear(api_names);
    PyDict_Clear(error_names);
    Py_CLEAR(last_date);
    last_day = LLONG_MIN;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(ExchangeRows, ConnectionInfo, Request, Response, RequestReceived, ResponseReceived, day_name, "
     "api_name, error_name, request_values, response_values)"},
    {"exchange_row", (PyCFunction)(void (*)(void))exchange_row, METH_FASTCALL,
     "exchange_row(rows, request, response, status, decode_error): ExchangeRows._row, compiled"},
    {"drain", (PyCFunction)(void (*)(void))drain, METH_FASTCALL,
     "drain(rows, events, summary, on_exchange): StreamDecoder._drain, compiled"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kwire._exchangerows", NULL, -1, methods};

#define INTERN(var, text)                                                                                              \
    if ((var = PyUnicode_InternFromString(text)) == NULL)                                                              \
        return NULL;

PyMODINIT_FUNC PyInit__exchangerows(void) {
    INTERN(k_source, "source");
    INTERN(k_connection_id, "connection_id");
    INTERN(k_client_ip, "client_ip");
    INTERN(k_client_port, "client_port");
    INTERN(k_broker_ip, "broker_ip");
    INTERN(k_broker_port, "broker_port");
    INTERN(k_client_software_name, "client_software_name");
    INTERN(k_client_software_version, "client_software_version");
    INTERN(k_date, "date");
    INTERN(k_request_time, "request_time");
    INTERN(k_response_time, "response_time");
    INTERN(k_latency_us, "latency_us");
    INTERN(k_status, "status");
    INTERN(k_decode_error, "decode_error");
    INTERN(k_response_size, "response_size");
    INTERN(k_correlation_id, "correlation_id");
    INTERN(k_api_key, "api_key");
    INTERN(k_api_name, "api_name");
    INTERN(k_api_version, "api_version");
    INTERN(k_request_header_version, "request_header_version");
    INTERN(k_client_id, "client_id");
    INTERN(k_request_size, "request_size");
    INTERN(k_error_code, "error_code");
    INTERN(k_error_name, "error_name");
    INTERN(k_member_id, "member_id");
    INTERN(k_generation_id, "generation_id");
    INTERN(k_records, "records");
    INTERN(k_partition_errors, "partition_errors");
    INTERN(k_ok, "ok");
    INTERN(k_row, "row");
    INTERN(k_exchanges, "exchanges");
    INTERN(k_statuses, "statuses");
    INTERN(k_apis, "apis");
    INTERN(k_errors, "errors");
    INTERN(k_client_software_name_field, "client_software_name");
    INTERN(k_client_software_version_field, "client_software_version");
    if ((api_names = PyDict_New()) == NULL || (error_names = PyDict_New()) == NULL || (one = PyLong_FromLong(1)) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
