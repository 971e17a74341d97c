/* decoder._scan: the walks of decoder.extract over decoded fields, compiled.

Why compiled. On the bench's chatty capture (81,435 exchanges, CPython 3.11, 2-core VM), with the
bodies decoded by decoder._layoutvm, decoder.extract.exchange_values took 8.1 us per exchange of
the 9.9 that kwire.rows spends on a row, most of it in the two recursive walks (_RequestScan.scan,
_ResponseScan.scan): a dict look-up per role per struct, in bytecode. Issue 22 needs about 14 us
per exchange for everything.

The walks work on roles (the keys the protocol table gives fields), never on a particular API's
layout, exactly as the Python ones they mirror; decoder.extract keeps those as the reference
(KWIRE_PURE_PYTHON=1 runs them) and does everything else itself: what the walks find becomes row
values there, in one place. tests/test_layoutvm.py checks both give the same values on every body
of the real captures and on mutated ones.

request(fields, RecordsSummary) -> (topics, topic_ids, groups, batches, records, codecs,
                                    has_records, adds)
response(fields, api_key, RecordsSummary) -> (results, brokers, meta_partitions, fetch_partitions,
                                              coordinators, api_versions, fetched_records,
                                              has_records, adds)
adds: (entries, topic, topic_id, partition) per records field with batch entries, in walk order,
for decoder.extract._Batches.add.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>

enum {
    K_TOPIC, K_TOPIC_ID, K_GROUP_ID, K_RECORDS, K_PARTITION, K_ERROR_CODE, K_RESOURCE, K_TRANSACTIONAL_ID,
    K_COORDINATOR_KEY, K_MEMBER_ID, K_BASE_OFFSET, K_LOG_START_OFFSET, K_HOST, K_PORT, K_NODE_ID, K_RACK, K_KEY,
    K_LEADER, K_LEADER_EPOCH, K_REPLICAS, K_ISR, K_HIGH_WATERMARK, K_RECORD_BATCHES, K_API_KEY, K_MIN_VERSION,
    K_MAX_VERSION, K_ENTRIES, NKEYS
};
static const char *KEY_NAMES[NKEYS] = {
    "topic", "topic_id", "group_id", "records", "partition", "error_code", "resource", "transactional_id",
    "coordinator_key", "member_id", "base_offset", "log_start_offset", "host", "port", "node_id", "rack", "key",
    "leader", "leader_epoch", "replicas", "isr", "high_watermark", "record_batches", "api_key", "min_version",
    "max_version", "entries",
};
static PyObject *K[NKEYS];
static const int RESOURCE_ROLES[] = {K_RESOURCE, K_GROUP_ID, K_TRANSACTIONAL_ID, K_COORDINATOR_KEY, K_MEMBER_ID};

enum { FETCH = 1, METADATA = 3, FIND_COORDINATOR = 10, API_VERSIONS = 18 };

/* node.get(key): a borrowed reference, Py_None when absent; NULL on error */
static inline PyObject *get(PyObject *node, int key) {
    PyObject *value = PyDict_GetItemWithError(node, K[key]);
    if (!value && !PyErr_Occurred()) value = Py_None;
    return value;
}

static inline int has(PyObject *node, int key) { return PyDict_Contains(node, K[key]); }

/* decoder.extract._add_strings */
static int add_strings(PyObject *found, PyObject *value) {
    if (PyUnicode_CheckExact(value)) {
        int in = PySequence_Contains(found, value);
        if (in < 0) return -1;
        return in ? 0 : PyList_Append(found, value);
    }
    if (PyList_CheckExact(value)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); i++) {
            PyObject *item = PyList_GET_ITEM(value, i);
            if (!PyUnicode_CheckExact(item)) continue;
            int in = PySequence_Contains(found, item);
            if (in < 0) return -1;
            if (!in && PyList_Append(found, item) < 0) return -1;
        }
    }
    return 0;
}

/* A dict of (key, value) pairs, values borrowed; n pairs. */
static PyObject *make_dict(int n, const int *keys, PyObject *const *values) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    for (int i = 0; i < n; i++) {
        if (!values[i] || PyDict_SetItem(d, K[keys[i]], values[i]) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

static int append_dict(PyObject *list, int n, const int *keys, PyObject *const *values) {
    PyObject *d = make_dict(n, keys, values);
    if (!d) return -1;
    int rc = PyList_Append(list, d);
    Py_DECREF(d);
    return rc;
}

/* (entries, topic, topic_id, partition) for decoder.extract._Batches.add */
static int add_entries(PyObject *adds, PyObject *summary, PyObject *topic, PyObject *topic_id, PyObject *node) {
    PyObject *entries = PyObject_GetAttr(summary, K[K_ENTRIES]);
    if (!entries) return -1;
    int truth = PyObject_IsTrue(entries);
    if (truth <= 0) {
        Py_DECREF(entries);
        return truth;
    }
    PyObject *partition = get(node, K_PARTITION);
    if (!partition) {
        Py_DECREF(entries);
        return -1;
    }
    PyObject *add = PyTuple_Pack(4, entries, topic, topic_id, partition);
    Py_DECREF(entries);
    if (!add) return -1;
    int rc = PyList_Append(adds, add);
    Py_DECREF(add);
    return rc;
}

/* A node's records field: *has_records set when it has one, *summary the RecordsSummary there
   (borrowed) or NULL. */
static int records_of(PyObject *node, PyObject *summary_type, int *has_records, PyObject **summary) {
    *summary = NULL;
    int in = has(node, K_RECORDS);
    if (in <= 0) return in;
    *has_records = 1;
    PyObject *value = get(node, K_RECORDS);
    if (!value) return -1;
    if ((PyObject *)Py_TYPE(value) == summary_type) *summary = value;
    return 0;
}

/* Recurse into a node's dict values and lists of dicts, in order. */
typedef int (*walker)(void *state, PyObject *node, PyObject *topic, PyObject *topic_id);

static int children(void *state, walker walk, PyObject *node, PyObject *topic, PyObject *topic_id) {
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(node, &pos, &key, &value)) {
        if (PyDict_CheckExact(value)) {
            Py_INCREF(value);
            int rc = walk(state, value, topic, topic_id);
            Py_DECREF(value);
            if (rc < 0) return -1;
        } else if (PyList_CheckExact(value) && PyList_GET_SIZE(value) && PyDict_CheckExact(PyList_GET_ITEM(value, 0))) {
            Py_INCREF(value);
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); i++) {
                PyObject *child = PyList_GET_ITEM(value, i);
                if (!PyDict_Check(child)) {
                    PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute 'get'", Py_TYPE(child)->tp_name);
                    Py_DECREF(value);
                    return -1;
                }
                Py_INCREF(child);
                int rc = walk(state, child, topic, topic_id);
                Py_DECREF(child);
                if (rc < 0) {
                    Py_DECREF(value);
                    return -1;
                }
            }
            Py_DECREF(value);
        }
    }
    return 0;
}

/* ---- requests: decoder.extract._RequestScan.scan --------------------------------------- */

typedef struct {
    PyObject *topics, *topic_ids, *groups, *batches, *records, *codecs, *adds, *summary_type;
    int has_records;
} RequestScan;

static int accumulate(PyObject **total, PyObject *item, int or) {
    PyObject *sum = or ? PyNumber_Or(*total, item) : PyNumber_Add(*total, item);
    if (!sum) return -1;
    Py_SETREF(*total, sum);
    return 0;
}

static int request_walk(void *state, PyObject *node, PyObject *topic, PyObject *topic_id) {
    RequestScan *s = state;
    PyObject *value = get(node, K_TOPIC);
    if (!value) return -1;
    if (value != Py_None) {
        if (add_strings(s->topics, value) < 0) return -1;
        if (PyUnicode_CheckExact(value)) topic = value;
    }
    value = get(node, K_TOPIC_ID);
    if (!value) return -1;
    if (value != Py_None) {
        if (add_strings(s->topic_ids, value) < 0) return -1;
        if (PyUnicode_CheckExact(value)) topic_id = value;
    }
    value = get(node, K_GROUP_ID);
    if (!value) return -1;
    if (value != Py_None && add_strings(s->groups, value) < 0) return -1;
    PyObject *summary;
    if (records_of(node, s->summary_type, &s->has_records, &summary) < 0) return -1;
    if (summary) {
        if (PyTuple_GET_SIZE(summary) < 3) {
            PyErr_SetString(PyExc_IndexError, "tuple index out of range");
            return -1;
        }
        if (accumulate(&s->batches, PyTuple_GET_ITEM(summary, 0), 0) < 0 ||
            accumulate(&s->records, PyTuple_GET_ITEM(summary, 1), 0) < 0 ||
            accumulate(&s->codecs, PyTuple_GET_ITEM(summary, 2), 1) < 0)
            return -1;
        if (add_entries(s->adds, summary, topic, topic_id, node) < 0) return -1;
    }
    return children(state, request_walk, node, topic, topic_id);
}

static PyObject *scan_request(PyObject *module, PyObject *args) {
    PyObject *fields, *summary_type;
    if (!PyArg_ParseTuple(args, "O!O", &PyDict_Type, &fields, &summary_type)) return NULL;
    RequestScan s = {PyList_New(0), PyList_New(0), PyList_New(0), PyLong_FromLong(0), PyLong_FromLong(0),
                     PyLong_FromLong(0), PyList_New(0), summary_type, 0};
    PyObject *result = NULL;
    if (s.topics && s.topic_ids && s.groups && s.batches && s.records && s.codecs && s.adds &&
        request_walk(&s, fields, Py_None, Py_None) == 0)
        result = Py_BuildValue("(OOOOOOOO)", s.topics, s.topic_ids, s.groups, s.batches, s.records, s.codecs,
                               s.has_records ? Py_True : Py_False, s.adds);
    Py_XDECREF(s.topics);
    Py_XDECREF(s.topic_ids);
    Py_XDECREF(s.groups);
    Py_XDECREF(s.batches);
    Py_XDECREF(s.records);
    Py_XDECREF(s.codecs);
    Py_XDECREF(s.adds);
    return result;
}

/* ---- responses: decoder.extract._ResponseScan.scan ------------------------------------- */

typedef struct {
    long api_key;
    PyObject *results, *brokers, *meta_partitions, *fetch_partitions, *coordinators, *api_versions;
    PyObject *fetched_records, *adds, *summary_type, *zero;
    int has_records;
} ResponseScan;

static int endpoint(ResponseScan *s, PyObject *node) {
    if (s->api_key == FIND_COORDINATOR) {
        static const int keys[] = {K_KEY, K_NODE_ID, K_HOST, K_PORT, K_ERROR_CODE};
        PyObject *values[] = {get(node, K_COORDINATOR_KEY), get(node, K_NODE_ID), get(node, K_HOST),
                              get(node, K_PORT), get(node, K_ERROR_CODE)};
        return append_dict(s->coordinators, 5, keys, values);
    }
    static const int keys[] = {K_NODE_ID, K_HOST, K_PORT, K_RACK};
    PyObject *values[] = {get(node, K_NODE_ID), get(node, K_HOST), get(node, K_PORT), get(node, K_RACK)};
    return append_dict(s->brokers, 4, keys, values);
}

static int response_walk(void *state, PyObject *node, PyObject *topic, PyObject *topic_id) {
    ResponseScan *s = state;
    PyObject *own = get(node, K_TOPIC);
    if (!own) return -1;
    if (PyUnicode_CheckExact(own)) topic = own;
    own = get(node, K_TOPIC_ID);
    if (!own) return -1;
    if (PyUnicode_CheckExact(own)) topic_id = own;
    PyObject *code = get(node, K_ERROR_CODE);
    if (!code) return -1;
    if (PyLong_CheckExact(code)) {
        PyObject *resource = Py_None;
        for (size_t i = 0; i < sizeof RESOURCE_ROLES / sizeof RESOURCE_ROLES[0]; i++) {
            PyObject *value = get(node, RESOURCE_ROLES[i]);
            if (!value) return -1;
            if (PyUnicode_CheckExact(value)) {
                resource = value;
                break;
            }
        }
        static const int keys[] = {K_TOPIC, K_TOPIC_ID, K_PARTITION, K_RESOURCE, K_ERROR_CODE, K_BASE_OFFSET,
                                   K_LOG_START_OFFSET};
        PyObject *values[] = {topic, topic_id, get(node, K_PARTITION), resource, code, get(node, K_BASE_OFFSET),
                              get(node, K_LOG_START_OFFSET)};
        if (append_dict(s->results, 7, keys, values) < 0) return -1;
    }
    int host = has(node, K_HOST);
    if (host < 0) return -1;
    if (host) {
        int port = has(node, K_PORT);
        if (port < 0 || (port && endpoint(s, node) < 0)) return -1;
    }
    PyObject *summary;
    if (records_of(node, s->summary_type, &s->has_records, &summary) < 0) return -1;
    if (summary && add_entries(s->adds, summary, topic, topic_id, node) < 0) return -1;
    if (s->api_key == METADATA) {
        int leader = has(node, K_LEADER);
        if (leader < 0) return -1;
        if (leader) {
            static const int keys[] = {K_TOPIC, K_TOPIC_ID, K_PARTITION, K_ERROR_CODE, K_LEADER, K_LEADER_EPOCH,
                                       K_REPLICAS, K_ISR};
            PyObject *values[] = {topic, topic_id, get(node, K_PARTITION), code, get(node, K_LEADER),
                                  get(node, K_LEADER_EPOCH), get(node, K_REPLICAS), get(node, K_ISR)};
            if (append_dict(s->meta_partitions, 8, keys, values) < 0) return -1;
        }
    } else if (s->api_key == FETCH) {
        int hw = has(node, K_HIGH_WATERMARK);
        if (hw < 0) return -1;
        if (hw) {
            PyObject *summary = get(node, K_RECORDS);
            if (!summary) return -1;
            PyObject *batches = s->zero, *count = s->zero;
            if ((PyObject *)Py_TYPE(summary) == s->summary_type) {
                if (PyTuple_GET_SIZE(summary) < 2) {
                    PyErr_SetString(PyExc_IndexError, "tuple index out of range");
                    return -1;
                }
                batches = PyTuple_GET_ITEM(summary, 0);
                count = PyTuple_GET_ITEM(summary, 1);
            }
            if (accumulate(&s->fetched_records, count, 0) < 0) return -1;
            static const int keys[] = {K_TOPIC, K_TOPIC_ID, K_PARTITION, K_HIGH_WATERMARK, K_RECORD_BATCHES,
                                       K_RECORDS};
            PyObject *values[] = {topic, topic_id, get(node, K_PARTITION), get(node, K_HIGH_WATERMARK), batches,
                                  count};
            if (append_dict(s->fetch_partitions, 6, keys, values) < 0) return -1;
        }
    } else if (s->api_key == API_VERSIONS) {
        int api = has(node, K_API_KEY);
        if (api < 0) return -1;
        if (api) {
            static const int keys[] = {K_API_KEY, K_MIN_VERSION, K_MAX_VERSION};
            PyObject *values[] = {get(node, K_API_KEY), get(node, K_MIN_VERSION), get(node, K_MAX_VERSION)};
            if (append_dict(s->api_versions, 3, keys, values) < 0) return -1;
        }
    }
    return children(state, response_walk, node, topic, topic_id);
}

static PyObject *scan_response(PyObject *module, PyObject *args) {
    PyObject *fields, *summary_type;
    long api_key;
    if (!PyArg_ParseTuple(args, "O!lO", &PyDict_Type, &fields, &api_key, &summary_type)) return NULL;
    ResponseScan s = {api_key, PyList_New(0), PyList_New(0), PyList_New(0), PyList_New(0), PyList_New(0),
                      PyList_New(0), PyLong_FromLong(0), PyList_New(0), summary_type, PyLong_FromLong(0), 0};
    PyObject *result = NULL;
    if (!s.results || !s.brokers || !s.meta_partitions || !s.fetch_partitions || !s.coordinators ||
        !s.api_versions || !s.fetched_records || !s.adds || !s.zero)
        goto done;
    /* _ResponseScan.scan_below: the root's own topic, then the structs directly below it */
    PyObject *topic = get(fields, K_TOPIC), *topic_id = get(fields, K_TOPIC_ID);
    if (!topic || !topic_id) goto done;
    if (!PyUnicode_CheckExact(topic)) topic = Py_None;
    if (!PyUnicode_CheckExact(topic_id)) topic_id = Py_None;
    if (children(&s, response_walk, fields, topic, topic_id) < 0) goto done;
    result = Py_BuildValue("(OOOOOOOOO)", s.results, s.brokers, s.meta_partitions, s.fetch_partitions,
                           s.coordinators, s.api_versions, s.fetched_records, s.has_records ? Py_True : Py_False,
                           s.adds);
done:
    Py_XDECREF(s.results);
    Py_XDECREF(s.brokers);
    Py_XDECREF(s.meta_partitions);
    Py_XDECREF(s.fetch_partitions);
    Py_XDECREF(s.coordinators);
    Py_XDECREF(s.api_versions);
    Py_XDECREF(s.fetched_records);
    Py_XDECREF(s.adds);
    Py_XDECREF(s.zero);
    return result;
}

static PyMethodDef methods[] = {
    {"request", scan_request, METH_VARARGS, "decoder.extract._RequestScan.scan over a request's fields"},
    {"response", scan_response, METH_VARARGS, "decoder.extract._ResponseScan.scan_below over a response's fields"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "decoder._scan", "decoder.extract's walks, compiled (see decoder/_scan.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__scan(void) {
    for (int i = 0; i < NKEYS; i++) {
        K[i] = PyUnicode_InternFromString(KEY_NAMES[i]);
        if (!K[i]) return NULL;
    }
    return PyModule_Create(&module);
}
