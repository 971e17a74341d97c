/* kwire._exchangerows: ExchangeRows._row (kwire/rows.py) compiled, for an exchange with its request.

Why hand-written: after the compiled framing (decoder/_framecore.c) and row values
(decoder/_rowvalues.c), making the row dict was the largest Python step left per exchange. On the
bench's chatty capture (81,070 exchanges) ExchangeRows.row took 4.7-4.9 us an exchange, 2.6 of them
in the row values: the rest is the dict of about 25 keys built through _base, _us, utc_date,
api_name, error_name and exchange_values' merge, each a Python call. Cython on rows.py and the
modules around it gained nothing (2026-12-06: 1.90 s against 1.90 s for that capture's decode).

It holds no knowledge of its own: the same keys in the same order as ExchangeRows._row, and the
functions it cannot do without are rows.py's own (_day_name, protocol.api_name and error_name,
extract's row-value walks), handed over by configure. api_name and error_name are cached per value
(both are fixed tables of the protocol); the day of the last row is kept. kwire/rows.py stays the
reference: KWIRE_PURE_PYTHON=1 uses it alone, and tests/test_rowvalues.py checks both make the
same rows, key order included, on every bundled and lab capture.

configure(ExchangeRows, ConnectionInfo, Request, Response, day_name, api_name, error_name,
          request_values, response_values)
exchange_row(rows, request, response_or_None, status, decode_error) -> dict
    ExchangeRows._row(request, response, status, decode_error) with request not None.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>

#include "../decoder/_slots.h"

enum { X_INFO, X_SW_NAME, X_SW_VERSION, X_N };
static const char *rows_names[X_N] = {"info", "client_software_name", "client_software_version"};
enum { I_SOURCE, I_CONNECTION_ID, I_CLIENT_IP, I_CLIENT_PORT, I_BROKER_IP, I_BROKER_PORT, I_N };
static const char *info_names[I_N] = {"source",    "connection_id", "client_ip",
                                      "client_port", "broker_ip",   "broker_port"};
enum { RQ_API_KEY, RQ_API_VERSION, RQ_HEADER_VERSION, RQ_CORRELATION_ID, RQ_CLIENT_ID, RQ_SIZE, RQ_START_NS,
       RQ_FIELDS, RQ_N };
static const char *request_names[RQ_N] = {"api_key", "api_version", "header_version", "correlation_id",
                                          "client_id", "size",       "start_ns",       "fields"};
enum { RS_CORRELATION_ID, RS_SIZE, RS_END_NS, RS_FIELDS, RS_N };
static const char *response_names[RS_N] = {"correlation_id", "size", "end_ns", "fields"};

static Py_ssize_t rows_off[X_N], info_off[I_N], request_off[RQ_N], response_off[RS_N];
static PyTypeObject *rows_type, *info_type, *request_type, *response_type;
static PyObject *day_name, *api_name, *error_name, *request_values, *response_values;
static PyObject *api_names, *error_names; /* caches: api key -> name, error code -> name */
static long long last_day = LLONG_MIN;
static PyObject *last_date; /* the date of last_day */

#define DAY_NS 86400000000000LL
#define MAX_CACHED 4096

/* the row's keys, in ExchangeRows._row's order */
static PyObject *k_source, *k_connection_id, *k_client_ip, *k_client_port, *k_broker_ip, *k_broker_port,
    *k_client_software_name, *k_client_software_version, *k_date, *k_request_time, *k_response_time,
    *k_latency_us, *k_status, *k_decode_error, *k_response_size, *k_correlation_id, *k_api_key, *k_api_name,
    *k_api_version, *k_request_header_version, *k_client_id, *k_request_size, *k_error_code, *k_error_name,
    *k_member_id, *k_generation_id, *k_records;

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

/* extract.exchange_values(api_key, request fields, response fields) */
static PyObject *exchange_values(PyObject *api_key, PyObject *request_fields, PyObject *response_fields) {
    PyObject *args[2] = {api_key, request_fields};
    PyObject *values = PyObject_Vectorcall(request_values, args, 2, NULL);
    if (values == NULL)
        return NULL;
    int some = PyObject_IsTrue(response_fields);
    if (some <= 0)
        return some < 0 ? (Py_DECREF(values), NULL) : values;
    args[1] = response_fields;
    PyObject *answer = PyObject_Vectorcall(response_values, args, 2, NULL);
    if (answer == NULL || !PyDict_Check(answer) || !PyDict_Check(values)) {
        if (answer != NULL)
            PyErr_SetString(PyExc_TypeError, "row values are not dicts");
        Py_XDECREF(answer);
        Py_DECREF(values);
        return NULL;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(answer, &pos, &key, &value)) {
        int present = PyDict_Contains(values, key);
        if (present < 0 || (!(present && is_request_own(key)) && PyDict_SetItem(values, key, value) < 0)) {
            Py_DECREF(answer);
            Py_DECREF(values);
            return NULL;
        }
    }
    Py_DECREF(answer);
    return values;
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
    PyObject *row = PyDict_New();
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
    PyObject *values = exchange_values(api_key, SLOT(request, request_off, RQ_FIELDS),
                                       response == Py_None ? Py_None : SLOT(response, response_off, RS_FIELDS));
    if (values == NULL)
        goto fail;
    int failed = PyDict_Update(row, values);
    Py_DECREF(values);
    if (failed < 0)
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

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *types[4], *functions[5];
    if (!PyArg_ParseTuple(args, "O!O!O!O!OOOOO:configure", &PyType_Type, &types[0], &PyType_Type, &types[1],
                          &PyType_Type, &types[2], &PyType_Type, &types[3], &functions[0], &functions[1],
                          &functions[2], &functions[3], &functions[4]))
        return NULL;
    if (slot_offsets(types[0], rows_names, X_N, rows_off) < 0 || slot_offsets(types[1], info_names, I_N, info_off) < 0 ||
        slot_offsets(types[2], request_names, RQ_N, request_off) < 0 ||
        slot_offsets(types[3], response_names, RS_N, response_off) < 0)
        return NULL;
    PyTypeObject **type_slots[] = {&rows_type, &info_type, &request_type, &response_type};
    for (int i = 0; i < 4; i++) {
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
     "configure(ExchangeRows, ConnectionInfo, Request, Response, day_name, api_name, error_name, "
     "request_values, response_values)"},
    {"exchange_row", (PyCFunction)(void (*)(void))exchange_row, METH_FASTCALL,
     "exchange_row(rows, request, response, status, decode_error): ExchangeRows._row, compiled"},
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
    if ((api_names = PyDict_New()) == NULL || (error_names = PyDict_New()) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
