/* decoder._rowvalues: the walks of decoder/extract.py (decoded fields -> an exchange row's values) in C.

Why compiled. Measured on the bench's chatty capture (81,435 exchanges, CPython 3.11, 2-core VM,
2026-11-28): extract.exchange_values took 8-9.5 us per exchange, a fifth of `kwire decode`'s CPU
(bench/decode_profile.py: 40.9 us per exchange in all). The walks are already written for speed
in Python (exact type checks, one recursive function per direction), and compiling that very
source with Cython gained nothing measurable; what costs is the interpreter's per-node work
(attribute and method look-ups, calls, dict look-ups by generic method).

It holds no protocol knowledge beyond decoder/extract.py's: the same roles, walked the same way.
decoder/extract.py stays the reference, and this module is handed its functions: on anything the
C walk does not expect (a list of structs holding something else than a struct, fields that are
not a dict, an error raised anywhere, including in a helper it calls), it drops what it built and
returns the reference function's result (or lets its exception out), so the two can only differ
where the reference succeeds; tests/test_rowvalues.py checks they agree on every exchange of the
bundled and lab captures and on mutated field trees. A record batch's identity dict is made here
(records.batch_identity's layout); a legacy message's by records.batch_identity itself.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define METADATA 3
#define FIND_COORDINATOR 10
#define API_VERSIONS 18
#define DESCRIBE_CLUSTER 60
#define FETCH 1

static PyObject *RecordsSummary, *BatchIdentity, *CodecOf, *CodecNames, *RefRequest, *RefResponse;
static Py_ssize_t MaxBatches, MaxCrcs;

/* interned keys */
static PyObject *k_topic, *k_topic_id, *k_group_id, *k_records, *k_partition, *k_entries,
    *k_error_code, *k_resource, *k_transactional_id, *k_coordinator_key, *k_member_id, *k_base_offset,
    *k_log_start_offset, *k_host, *k_port, *k_leader, *k_leader_epoch, *k_replicas, *k_isr, *k_high_watermark,
    *k_record_batches, *k_api_key, *k_min_version, *k_max_version, *k_node_id, *k_rack, *k_key, *k_topics,
    *k_acks, *k_timeout_ms, *k_generation_id, *k_client_software_name, *k_client_software_version,
    *k_sasl_mechanism, *k_compression, *k_coordinator_key_type, *k_throttle_time_ms, *k_partition_errors,
    *k_batches, *k_metadata_brokers, *k_controller_id, *k_metadata_controller_id, *k_metadata_partitions,
    *k_fetch_partitions, *k_api_versions, *k_coordinators, *k_coordinator_node, *k_last_offset_delta, *k_partition_leader_epoch, *k_magic, *k_crc,
    *k_transactional, *k_control, *k_producer_id, *k_producer_epoch, *k_base_sequence, *k_record_count,
    *k_first_timestamp_ms, *k_max_timestamp_ms, *k_message_crcs, *comma;

/* fields.get(key), borrowed; Py_None when absent; NULL on error */
static PyObject *get(PyObject *d, PyObject *key) {
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (v == NULL)
        return PyErr_Occurred() ? NULL : Py_None;
    return v;
}

/* A new dict from n (key, borrowed value) pairs, in order. */
static PyObject *dict_of(int n, PyObject **keys, PyObject **values) {
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    for (int i = 0; i < n; i++) {
        if (values[i] == NULL || PyDict_SetItem(d, keys[i], values[i]) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

static int append_new(PyObject *list, PyObject *item) {
    if (item == NULL)
        return -1;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

/* values[key] = value, a new reference taken over (NULL: an error already set). */
static int set_new(PyObject *values, PyObject *key, PyObject *value) {
    if (value == NULL)
        return -1;
    int rc = PyDict_SetItem(values, key, value);
    Py_DECREF(value);
    return rc;
}

/* extract._add_strings */
static int add_strings(PyObject *found, PyObject *value) {
    if (PyUnicode_CheckExact(value)) {
        int has = PySequence_Contains(found, value);
        if (has < 0)
            return -1;
        return has ? 0 : PyList_Append(found, value);
    }
    if (PyList_CheckExact(value)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); i++) {
            PyObject *item = PyList_GET_ITEM(value, i);
            if (!PyUnicode_CheckExact(item))
                continue;
            int has = PySequence_Contains(found, item);
            if (has < 0)
                return -1;
            if (!has && PyList_Append(found, item) < 0)
                return -1;
        }
    }
    return 0;
}

/* extract._root_str: a new reference, or NULL with no error set for None */
static PyObject *root_str(PyObject *value, int *failed) {
    *failed = 0;
    if (PyList_CheckExact(value)) {
        PyObject *strs = PyList_New(0);
        if (strs == NULL)
            goto fail;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); i++) {
            PyObject *item = PyList_GET_ITEM(value, i);
            if (PyUnicode_CheckExact(item) && PyList_Append(strs, item) < 0) {
                Py_DECREF(strs);
                goto fail;
            }
        }
        PyObject *joined = PyUnicode_Join(comma, strs);
        Py_DECREF(strs);
        if (joined == NULL)
            goto fail;
        if (PyUnicode_GET_LENGTH(joined) == 0) {
            Py_DECREF(joined);
            return NULL;
        }
        return joined;
    }
    if (PyUnicode_CheckExact(value)) {
        Py_INCREF(value);
        return value;
    }
    return NULL;
fail:
    *failed = 1;
    return NULL;
}

/* Set values[key] = root_str(fields.get(key)) when not None (-1 on error). */
static int set_root_str(PyObject *values, PyObject *fields, PyObject *key) {
    PyObject *v = get(fields, key);
    if (v == NULL)
        return -1;
    if (v == Py_None)
        return 0;
    int failed;
    PyObject *s = root_str(v, &failed);
    if (failed)
        return -1;
    return s == NULL ? 0 : set_new(values, key, s);
}

/* Set out[out_key] = fields[key] when it is exactly an int (-1 on error). */
static int set_int(PyObject *values, PyObject *out_key, PyObject *fields, PyObject *key) {
    PyObject *v = get(fields, key);
    if (v == NULL)
        return -1;
    return PyLong_CheckExact(v) ? PyDict_SetItem(values, out_key, v) : 0;
}

/* A list of structs (exactly a non-empty list whose first item is exactly a dict): 1, else 0. */
static int is_struct_list(PyObject *value) {
    return PyList_CheckExact(value) && PyList_GET_SIZE(value) > 0 && PyDict_CheckExact(PyList_GET_ITEM(value, 0));
}

typedef int (*Visit)(void *scan, PyObject *child, PyObject *topic, PyObject *topic_id, int depth);

/* visit(child) for each struct directly below ``node`` (values that are dicts or lists of dicts),
   in order: the walks' descent. */
static int each_child(PyObject *node, Visit visit, void *scan, PyObject *topic, PyObject *topic_id, int depth) {
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(node, &pos, &key, &value)) {
        if (PyDict_CheckExact(value)) {
            if (visit(scan, value, topic, topic_id, depth) < 0)
                return -1;
        } else if (is_struct_list(value)) {
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); i++)
                if (visit(scan, PyList_GET_ITEM(value, i), topic, topic_id, depth) < 0)
                    return -1;
        }
    }
    return 0;
}

/* The batch identities a row keeps (extract._Batches). */
typedef struct {
    PyObject *kept; /* NULL until the first batch */
    Py_ssize_t crcs;
} Batches;

/* records.batch_identity of a record batch header (an exact 13-tuple, as unpacked). */
static PyObject *v2_identity(PyObject *entry, PyObject *topic, PyObject *topic_id, PyObject *partition, int in_request) {
    PyObject **f = &PyTuple_GET_ITEM(entry, 0);
    /* base, length, epoch, magic, crc, attrs, delta, first_ts, max_ts, pid, pepoch, seq, count */
    if (!PyLong_CheckExact(f[5]))
        return NULL;
    long attrs = PyLong_AsLong(f[5]);
    if (attrs == -1 && PyErr_Occurred())
        return NULL;
    PyObject *magic = PyLong_FromLong(2);
    PyObject *keys[] = {k_topic, k_topic_id, k_partition, k_base_offset, k_last_offset_delta, k_partition_leader_epoch,
                        k_magic, k_crc, k_compression, k_transactional, k_control, k_producer_id, k_producer_epoch,
                        k_base_sequence, k_record_count, k_first_timestamp_ms, k_max_timestamp_ms, k_message_crcs};
    PyObject *vals[] = {topic,  topic_id, partition, in_request ? Py_None : f[0],
                        f[6],   f[2],     magic,     f[4],
                        PyTuple_GET_ITEM(CodecOf, attrs & 7),
                        (attrs & 16) ? Py_True : Py_False,
                        (attrs & 32) ? Py_True : Py_False,
                        f[9],   f[10],    f[11],     f[12],
                        f[7],   f[8],     Py_None};
    PyObject *d = dict_of(18, keys, vals);
    Py_XDECREF(magic);
    return d;
}

/* extract._Batches.add: keep a records field's batches, with their topic and partition. */
static int add_batches(Batches *b, PyObject *summary, PyObject *topic, PyObject *topic_id, PyObject *partition,
                       int in_request) {
    PyObject *entries = PyObject_GetAttr(summary, k_entries);
    if (entries == NULL)
        return -1;
    int truth = PyObject_IsTrue(entries);
    if (truth <= 0) {
        Py_DECREF(entries);
        return truth;
    }
    PyObject *seq = PySequence_Fast(entries, "entries");
    Py_DECREF(entries);
    if (seq == NULL)
        return -1;
    int rc = -1;
    if (b->kept == NULL && (b->kept = PyList_New(0)) == NULL)
        goto done;
    Py_ssize_t room = MaxBatches - PyList_GET_SIZE(b->kept);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (room <= 0) {
        rc = 0;
        goto done;
    }
    if (n > room)
        n = room;
    if (!PyLong_CheckExact(partition))
        partition = Py_None;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *entry = PySequence_Fast_GET_ITEM(seq, i), *batch;
        if (PyTuple_CheckExact(entry)) {
            if (PyTuple_GET_SIZE(entry) != 13)
                goto done;
            batch = v2_identity(entry, topic, topic_id, partition, in_request);
        } else {
            batch = PyObject_CallFunctionObjArgs(BatchIdentity, entry, topic, topic_id, partition,
                                                 in_request ? Py_True : Py_False, NULL);
        }
        if (batch == NULL)
            goto done;
        PyObject *crcs = PyObject_GetItem(batch, k_message_crcs);
        int any = crcs ? PyObject_IsTrue(crcs) : -1;
        if (any > 0) {
            Py_ssize_t left = MaxCrcs - b->crcs, len = PyObject_Size(crcs);
            if (len < 0)
                any = -1;
            else if (len > left) {
                PyObject *cut = PySequence_GetSlice(crcs, 0, left > 0 ? left : 0);
                if (cut == NULL || PyObject_SetItem(batch, k_message_crcs, cut) < 0)
                    any = -1;
                else
                    len = PyObject_Size(cut);
                Py_XDECREF(cut);
            }
            if (len < 0)
                any = -1;
            if (any > 0)
                b->crcs += len;
        }
        Py_XDECREF(crcs);
        if (any < 0) {
            Py_DECREF(batch);
            goto done;
        }
        if (append_new(b->kept, batch) < 0)
            goto done;
    }
    rc = 0;
done:
    Py_DECREF(seq);
    return rc;
}

/* The kept batch identities (a new reference; a new empty list if none were kept). */
static PyObject *kept_batches(Batches *b) {
    if (b->kept == NULL)
        return PyList_New(0);
    Py_INCREF(b->kept);
    return b->kept;
}

/* node["records"] if it is a RecordsSummary (borrowed), else NULL; sets *has_records when the
   node has a records field at all, and *failed on an error. */
static PyObject *summary_of(PyObject *node, int *has_records, int *failed) {
    PyObject *summary = PyDict_GetItemWithError(node, k_records);
    *failed = summary == NULL && PyErr_Occurred();
    if (summary == NULL)
        return NULL;
    *has_records = 1;
    return Py_TYPE(summary) == (PyTypeObject *)RecordsSummary ? summary : NULL;
}

/* ---- requests (extract._RequestScan) ---------------------------------------------------- */

typedef struct {
    PyObject *topics, *topic_ids, *groups, *batches, *records, *codecs;
    Batches kept;
    int has_records;
} ReqScan;

/* A request node's strings under ``key`` added to ``found``; one string also becomes what the
   node's children inherit (``*inherited``, when given). */
static int note_strings(PyObject *node, PyObject *key, PyObject *found, PyObject **inherited) {
    PyObject *v = get(node, key);
    if (v == NULL)
        return -1;
    if (v == Py_None)
        return 0;
    if (add_strings(found, v) < 0)
        return -1;
    if (inherited != NULL && PyUnicode_CheckExact(v))
        *inherited = v;
    return 0;
}

static int scan_request(void *scan, PyObject *node, PyObject *topic, PyObject *topic_id, int depth) {
    ReqScan *s = scan;
    if (!PyDict_CheckExact(node) || depth > 200)
        return -1;
    if (note_strings(node, k_topic, s->topics, &topic) < 0 || note_strings(node, k_topic_id, s->topic_ids, &topic_id) < 0 ||
        note_strings(node, k_group_id, s->groups, NULL) < 0)
        return -1;
    int failed;
    PyObject *summary = summary_of(node, &s->has_records, &failed);
    if (failed)
        return -1;
    if (summary != NULL) {
        if (PyTuple_GET_SIZE(summary) < 3)
            return -1;
        PyObject **sums[3] = {&s->batches, &s->records, &s->codecs};
        for (int i = 0; i < 3; i++) {
            PyObject *item = PyTuple_GET_ITEM(summary, i);
            PyObject *r = i < 2 ? PyNumber_Add(*sums[i], item) : PyNumber_Or(*sums[i], item);
            if (r == NULL)
                return -1;
            Py_SETREF(*sums[i], r);
        }
        PyObject *partition = get(node, k_partition);
        if (partition == NULL || add_batches(&s->kept, summary, topic, topic_id, partition, 1) < 0)
            return -1;
    }
    return each_child(node, scan_request, s, topic, topic_id, depth + 1);
}

static PyObject *request_values_c(long api_key, PyObject *fields) {
    ReqScan s = {PyList_New(0), PyList_New(0), PyList_New(0), PyLong_FromLong(0), PyLong_FromLong(0),
                 PyLong_FromLong(0), {NULL, 0}, 0};
    PyObject *values = NULL;
    if (!s.topics || !s.topic_ids || !s.groups || !s.batches || !s.records || !s.codecs)
        goto fail;
    if (scan_request(&s, fields, Py_None, Py_None, 0) < 0)
        goto fail;
    if ((values = PyDict_New()) == NULL)
        goto fail;
    PyObject *topics = PyList_GET_SIZE(s.topics) ? s.topics : s.topic_ids;
    if (PyList_GET_SIZE(topics) && PyDict_SetItem(values, k_topics, topics) < 0)
        goto fail;
    if (set_int(values, k_acks, fields, k_acks) < 0 || set_int(values, k_timeout_ms, fields, k_timeout_ms) < 0 ||
        set_int(values, k_generation_id, fields, k_generation_id) < 0)
        goto fail;
    PyObject *strs[] = {k_transactional_id, k_member_id, k_client_software_name, k_client_software_version,
                        k_sasl_mechanism};
    for (int i = 0; i < 5; i++)
        if (set_root_str(values, fields, strs[i]) < 0)
            goto fail;
    if (PyList_GET_SIZE(s.groups)) {
        if (set_new(values, k_group_id, PyUnicode_Join(comma, s.groups)) < 0)
            goto fail;
    }
    if (s.has_records) {
        if (PyDict_SetItem(values, k_record_batches, s.batches) < 0 || PyDict_SetItem(values, k_records, s.records) < 0)
            goto fail;
        if (set_new(values, k_batches, kept_batches(&s.kept)) < 0)
            goto fail;
        int any = PyObject_IsTrue(s.codecs);
        if (any < 0)
            goto fail;
        if (any && set_new(values, k_compression, PyObject_GetItem(CodecNames, s.codecs)) < 0)
            goto fail;
    }
    if (api_key == FIND_COORDINATOR) {
        if (set_root_str(values, fields, k_coordinator_key) < 0 ||
            set_int(values, k_coordinator_key_type, fields, k_coordinator_key_type) < 0)
            goto fail;
    }
    goto done;
fail:
    Py_CLEAR(values);
done:
    Py_XDECREF(s.topics);
    Py_XDECREF(s.topic_ids);
    Py_XDECREF(s.groups);
    Py_XDECREF(s.batches);
    Py_XDECREF(s.records);
    Py_XDECREF(s.codecs);
    Py_XDECREF(s.kept.kept);
    return values;
}

/* ---- responses (extract._ResponseScan) -------------------------------------------------- */

typedef struct {
    long api_key;
    PyObject *results, *brokers, *meta_partitions, *fetch_partitions, *coordinators, *api_versions;
    PyObject *fetched_records;
    Batches kept;
    int has_records;
} RespScan;

static int endpoint(RespScan *s, PyObject *node) {
    if (s->api_key == FIND_COORDINATOR) {
        PyObject *keys[] = {k_key, k_node_id, k_host, k_port, k_error_code};
        PyObject *vals[] = {get(node, k_coordinator_key), get(node, k_node_id), get(node, k_host), get(node, k_port),
                            get(node, k_error_code)};
        return append_new(s->coordinators, dict_of(5, keys, vals));
    }
    PyObject *keys[] = {k_node_id, k_host, k_port, k_rack};
    PyObject *vals[] = {get(node, k_node_id), get(node, k_host), get(node, k_port), get(node, k_rack)};
    return append_new(s->brokers, dict_of(4, keys, vals));
}

static int has(PyObject *node, PyObject *key) { return PyDict_Contains(node, key); }

static int scan_response(void *scan, PyObject *node, PyObject *topic, PyObject *topic_id, int depth) {
    RespScan *s = scan;
    if (!PyDict_CheckExact(node) || depth > 200)
        return -1;
    PyObject *v = get(node, k_topic);
    if (v == NULL)
        return -1;
    if (PyUnicode_CheckExact(v))
        topic = v;
    if ((v = get(node, k_topic_id)) == NULL)
        return -1;
    if (PyUnicode_CheckExact(v))
        topic_id = v;
    PyObject *code = get(node, k_error_code);
    if (code == NULL)
        return -1;
    if (PyLong_CheckExact(code)) {
        PyObject *resource = Py_None;
        PyObject *roles[] = {k_resource, k_group_id, k_transactional_id, k_coordinator_key, k_member_id};
        for (int i = 0; i < 5; i++) {
            PyObject *r = get(node, roles[i]);
            if (r == NULL)
                return -1;
            if (PyUnicode_CheckExact(r)) {
                resource = r;
                break;
            }
        }
        PyObject *keys[] = {k_topic, k_topic_id, k_partition, k_resource, k_error_code, k_base_offset,
                            k_log_start_offset};
        PyObject *vals[] = {topic, topic_id, get(node, k_partition), resource, code, get(node, k_base_offset),
                            get(node, k_log_start_offset)};
        if (append_new(s->results, dict_of(7, keys, vals)) < 0)
            return -1;
    }
    int a = has(node, k_host), b;
    if (a < 0)
        return -1;
    if (a) {
        if ((b = has(node, k_port)) < 0)
            return -1;
        if (b && endpoint(s, node) < 0)
            return -1;
    }
    int failed;
    PyObject *summary = summary_of(node, &s->has_records, &failed);
    if (failed)
        return -1;
    if (summary != NULL) {
        PyObject *partition = get(node, k_partition);
        if (partition == NULL || add_batches(&s->kept, summary, topic, topic_id, partition, 0) < 0)
            return -1;
    }
    if (s->api_key == METADATA) {
        if ((a = has(node, k_leader)) < 0)
            return -1;
        if (a) {
            PyObject *keys[] = {k_topic, k_topic_id, k_partition, k_error_code, k_leader, k_leader_epoch,
                                k_replicas, k_isr};
            PyObject *vals[] = {topic, topic_id, get(node, k_partition), code, get(node, k_leader),
                                get(node, k_leader_epoch), get(node, k_replicas), get(node, k_isr)};
            if (append_new(s->meta_partitions, dict_of(8, keys, vals)) < 0)
                return -1;
        }
    } else if (s->api_key == FETCH) {
        if ((a = has(node, k_high_watermark)) < 0)
            return -1;
        if (a) {
            PyObject *zero = PyLong_FromLong(0), *batches = zero, *count = zero;
            if (zero == NULL)
                return -1;
            PyObject *rec = get(node, k_records);
            if (rec != NULL && Py_TYPE(rec) == (PyTypeObject *)RecordsSummary) {
                if (PyTuple_GET_SIZE(rec) < 2)
                    rec = NULL; /* the reference fails on it: so does this walk */
                else {
                    batches = PyTuple_GET_ITEM(rec, 0);
                    count = PyTuple_GET_ITEM(rec, 1);
                }
            }
            PyObject *total = rec ? PyNumber_Add(s->fetched_records, count) : NULL;
            int rc = -1;
            if (total != NULL) {
                Py_SETREF(s->fetched_records, total);
                PyObject *keys[] = {k_topic, k_topic_id, k_partition, k_high_watermark, k_record_batches, k_records};
                PyObject *vals[] = {topic, topic_id, get(node, k_partition), get(node, k_high_watermark), batches, count};
                rc = append_new(s->fetch_partitions, dict_of(6, keys, vals));
            }
            Py_DECREF(zero);
            if (rc < 0)
                return -1;
        }
    } else if (s->api_key == API_VERSIONS) {
        if ((a = has(node, k_api_key)) < 0)
            return -1;
        if (a) {
            PyObject *keys[] = {k_api_key, k_min_version, k_max_version};
            PyObject *vals[] = {get(node, k_api_key), get(node, k_min_version), get(node, k_max_version)};
            if (append_new(s->api_versions, dict_of(3, keys, vals)) < 0)
                return -1;
        }
    }
    return each_child(node, scan_response, s, topic, topic_id, depth + 1);
}

/* extract._api_versions_entry: exactly the keys api_key, min_version, max_version */
static int api_versions_entry(PyObject *node) {
    if (PyDict_GET_SIZE(node) != 3)
        return 0;
    PyObject *keys[] = {k_api_key, k_min_version, k_max_version};
    for (int i = 0; i < 3; i++) {
        int a = PyDict_Contains(node, keys[i]);
        if (a <= 0)
            return a;
    }
    return 1;
}

static int scan_child(void *scan, PyObject *child, PyObject *topic, PyObject *topic_id, int depth) {
    RespScan *s = scan;
    if (!PyDict_CheckExact(child))
        return -1;
    if (s->api_key == API_VERSIONS) {
        int entry = api_versions_entry(child);
        if (entry < 0)
            return -1;
        if (entry)
            return PyList_Append(s->api_versions, child);
    }
    return scan_response(s, child, topic, topic_id, depth);
}

static int scan_below(RespScan *s, PyObject *root) {
    PyObject *topic = get(root, k_topic), *topic_id = get(root, k_topic_id);
    if (topic == NULL || topic_id == NULL)
        return -1;
    if (!PyUnicode_CheckExact(topic))
        topic = Py_None;
    if (!PyUnicode_CheckExact(topic_id))
        topic_id = Py_None;
    return each_child(root, scan_child, s, topic, topic_id, 1);
}

static PyObject *response_values_c(long api_key, PyObject *fields) {
    RespScan s = {api_key, PyList_New(0), PyList_New(0), PyList_New(0), PyList_New(0), PyList_New(0), PyList_New(0),
                  PyLong_FromLong(0), {NULL, 0}, 0};
    PyObject *values = NULL;
    if (!s.results || !s.brokers || !s.meta_partitions || !s.fetch_partitions || !s.coordinators || !s.api_versions ||
        !s.fetched_records)
        goto fail;
    if (scan_below(&s, fields) < 0)
        goto fail;
    if ((values = PyDict_New()) == NULL)
        goto fail;
    if (set_int(values, k_error_code, fields, k_error_code) < 0 ||
        set_int(values, k_throttle_time_ms, fields, k_throttle_time_ms) < 0)
        goto fail;
    if (PyList_GET_SIZE(s.results) && PyDict_SetItem(values, k_partition_errors, s.results) < 0)
        goto fail;
    if (s.has_records) {
        if (set_new(values, k_batches, kept_batches(&s.kept)) < 0)
            goto fail;
    }
    if (set_root_str(values, fields, k_member_id) < 0 || set_int(values, k_generation_id, fields, k_generation_id) < 0)
        goto fail;
    if (api_key == METADATA || api_key == DESCRIBE_CLUSTER) {
        if (PyDict_SetItem(values, k_metadata_brokers, s.brokers) < 0 ||
            set_int(values, k_metadata_controller_id, fields, k_controller_id) < 0)
            goto fail;
        if (api_key == METADATA && PyDict_SetItem(values, k_metadata_partitions, s.meta_partitions) < 0)
            goto fail;
    } else if (api_key == FETCH) {
        if (PyDict_SetItem(values, k_fetch_partitions, s.fetch_partitions) < 0 ||
            PyDict_SetItem(values, k_records, s.fetched_records) < 0)
            goto fail;
    } else if (api_key == API_VERSIONS) {
        if (PyDict_SetItem(values, k_api_versions, s.api_versions) < 0)
            goto fail;
    } else if (api_key == FIND_COORDINATOR) {
        int a = has(fields, k_host);
        if (a < 0)
            goto fail;
        if (a) {
            PyObject *keys[] = {k_key, k_node_id, k_host, k_port, k_error_code};
            PyObject *vals[] = {Py_None, get(fields, k_node_id), get(fields, k_host), get(fields, k_port),
                                get(fields, k_error_code)};
            PyObject *top = dict_of(5, keys, vals);
            if (top == NULL)
                goto fail;
            int rc = PyList_Insert(s.coordinators, 0, top);
            Py_DECREF(top);
            if (rc < 0)
                goto fail;
        }
        if (PyDict_SetItem(values, k_coordinators, s.coordinators) < 0)
            goto fail;
        if (PyList_GET_SIZE(s.coordinators)) {
            PyObject *node = get(PyList_GET_ITEM(s.coordinators, 0), k_node_id);
            if (node == NULL || (node != Py_None && PyDict_SetItem(values, k_coordinator_node, node) < 0))
                goto fail;
        }
    }
    goto done;
fail:
    Py_CLEAR(values);
done:
    Py_XDECREF(s.results);
    Py_XDECREF(s.brokers);
    Py_XDECREF(s.meta_partitions);
    Py_XDECREF(s.fetch_partitions);
    Py_XDECREF(s.coordinators);
    Py_XDECREF(s.api_versions);
    Py_XDECREF(s.fetched_records);
    Py_XDECREF(s.kept.kept);
    return values;
}

/* ---- entry points ---------------------------------------------------------------------- */

typedef PyObject *(*Walk)(long, PyObject *);

/* The C walk, else (anything unexpected, any error) the reference's answer. */
static PyObject *run(PyObject *const *args, Py_ssize_t nargs, Walk walk, PyObject *reference) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "expected (api_key, fields)");
        return NULL;
    }
    if (reference == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "decoder._rowvalues is not configured");
        return NULL;
    }
    PyObject *api_key = args[0], *fields = args[1];
    if (fields == Py_None || (PyDict_CheckExact(fields) && PyDict_GET_SIZE(fields) == 0))
        return PyDict_New();
    if (PyLong_CheckExact(api_key) && PyDict_CheckExact(fields)) {
        int overflow;
        long key = PyLong_AsLongAndOverflow(api_key, &overflow);
        if (!overflow && !(key == -1 && PyErr_Occurred())) {
            PyObject *values = walk(key, fields);
            if (values != NULL)
                return values;
        }
        PyErr_Clear();
    }
    return PyObject_Vectorcall(reference, args, 2, NULL);
}

static PyObject *request_values(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return run(args, nargs, request_values_c, RefRequest);
}

static PyObject *response_values(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return run(args, nargs, response_values_c, RefResponse);
}

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *summary, *identity, *codec_of, *codecs, *req, *resp;
    Py_ssize_t max_batches, max_crcs;
    if (!PyArg_ParseTuple(args, "O!OO!OnnOO:configure", &PyType_Type, &summary, &identity, &PyTuple_Type, &codec_of,
                          &codecs, &max_batches, &max_crcs, &req, &resp))
        return NULL;
    if (PyTuple_GET_SIZE(codec_of) != 8) {
        PyErr_SetString(PyExc_ValueError, "codec_of: one name (or None) per value of attributes & 7");
        return NULL;
    }
    PyObject **slots[] = {&RecordsSummary, &BatchIdentity, &CodecOf, &CodecNames, &RefRequest, &RefResponse};
    PyObject *given[] = {summary, identity, codec_of, codecs, req, resp};
    for (int i = 0; i < 6; i++) {
        Py_INCREF(given[i]);
        Py_XSETREF(*slots[i], given[i]);
    }
    MaxBatches = max_batches;
    MaxCrcs = max_crcs;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(RecordsSummary, batch_identity, codec_of, codec_names, max_batches, max_crcs, request_reference, "
     "response_reference)"},
    {"request_values", (PyCFunction)(void (*)(void))request_values, METH_FASTCALL,
     "request_values(api_key, fields): extract.request_values, compiled"},
    {"response_values", (PyCFunction)(void (*)(void))response_values, METH_FASTCALL,
     "response_values(api_key, fields): extract.response_values, compiled"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "decoder._rowvalues", NULL, -1, methods};

#define INTERN(var, text)                                                                                              \
    if ((var = PyUnicode_InternFromString(text)) == NULL)                                                              \
        return NULL;

PyMODINIT_FUNC PyInit__rowvalues(void) {
    INTERN(k_topic, "topic");
    INTERN(k_topic_id, "topic_id");
    INTERN(k_group_id, "group_id");
    INTERN(k_records, "records");
    INTERN(k_partition, "partition");
    INTERN(k_entries, "entries");
    INTERN(k_error_code, "error_code");
    INTERN(k_resource, "resource");
    INTERN(k_transactional_id, "transactional_id");
    INTERN(k_coordinator_key, "coordinator_key");
    INTERN(k_member_id, "member_id");
    INTERN(k_base_offset, "base_offset");
    INTERN(k_log_start_offset, "log_start_offset");
    INTERN(k_host, "host");
    INTERN(k_port, "port");
    INTERN(k_leader, "leader");
    INTERN(k_leader_epoch, "leader_epoch");
    INTERN(k_replicas, "replicas");
    INTERN(k_isr, "isr");
    INTERN(k_high_watermark, "high_watermark");
    INTERN(k_record_batches, "record_batches");
    INTERN(k_api_key, "api_key");
    INTERN(k_min_version, "min_version");
    INTERN(k_max_version, "max_version");
    INTERN(k_node_id, "node_id");
    INTERN(k_rack, "rack");
    INTERN(k_key, "key");
    INTERN(k_topics, "topics");
    INTERN(k_acks, "acks");
    INTERN(k_timeout_ms, "timeout_ms");
    INTERN(k_generation_id, "generation_id");
    INTERN(k_client_software_name, "client_software_name");
    INTERN(k_client_software_version, "client_software_version");
    INTERN(k_sasl_mechanism, "sasl_mechanism");
    INTERN(k_compression, "compression");
    INTERN(k_coordinator_key_type, "coordinator_key_type");
    INTERN(k_throttle_time_ms, "throttle_time_ms");
    INTERN(k_partition_errors, "partition_errors");
    INTERN(k_batches, "batches");
    INTERN(k_metadata_brokers, "metadata_brokers");
    INTERN(k_controller_id, "controller_id");
    INTERN(k_metadata_controller_id, "metadata_controller_id");
    INTERN(k_metadata_partitions, "metadata_partitions");
    INTERN(k_fetch_partitions, "fetch_partitions");
    INTERN(k_api_versions, "api_versions");
    INTERN(k_coordinators, "coordinators");
    INTERN(k_coordinator_node, "coordinator_node");
    INTERN(k_last_offset_delta, "last_offset_delta");
    INTERN(k_partition_leader_epoch, "partition_leader_epoch");
    INTERN(k_magic, "magic");
    INTERN(k_crc, "crc");
    INTERN(k_transactional, "transactional");
    INTERN(k_control, "control");
    INTERN(k_producer_id, "producer_id");
    INTERN(k_producer_epoch, "producer_epoch");
    INTERN(k_base_sequence, "base_sequence");
    INTERN(k_record_count, "record_count");
    INTERN(k_first_timestamp_ms, "first_timestamp_ms");
    INTERN(k_max_timestamp_ms, "max_timestamp_ms");
    INTERN(k_message_crcs, "message_crcs");
    INTERN(comma, ",");
    return PyModule_Create(&module);
}
