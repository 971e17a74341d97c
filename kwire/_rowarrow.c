/* kwire._rowarrow: row dicts -> Arrow buffers, column by column, for kwire/rowarrow.py.

Why compiled. pyarrow converts the row dicts as one struct array (kwire/dataset.py), and that was
18% of `kwire decode`'s CPU on the bench's chatty capture (0.38 of 2.09 s, 4-8 us a row,
bench/decode_profile.py, 2026-11-29), most of it in the nested columns (batches, partition
errors, topics). Converting column by column with pa.array was no faster (3.5 us a row for the
columns' pa.array calls alone). Here each row's value is appended straight to the column's
buffers, which Python then hands to pa.Array.from_buffers without a copy of the values: chatty's
rows in 1.4-1.8 us a row against pyarrow's 3.7-4.3 (warm, same run). Two things measured there
(callgrind, instructions per row): a dict's keys are read in the dict's own order and matched to
fields by identity against the previous dict's order (20.9k -> 17.2k; looking each field up by
name cost ~120 instructions a look-up, and most columns of a row are absent), and the bitmap and
buffer checks inlined (17.2k -> 14.0k).

It knows no schema of its own: kwire/rowarrow.py passes a plan made from the Arrow type (a kind,
the key to read a value under, the children), and only these kinds: bool, int8/16/32/64 (also a
timestamp's microseconds), string, list, struct. A value is what pyarrow's own conversion takes
as the same thing: a missing key or None is null, a struct is a dict (keys not in the plan are
ignored), a list is a list, a string a str, an integer an int in range, a bool a bool. Anything
else (a float, a bytes, a tuple, a bool where an int goes, an int out of range, a string that is
not valid UTF-8) makes convert() return None, and the caller converts those rows with pyarrow,
which is the reference: so the two can only differ where pyarrow succeeds, and
tests/test_rowarrow.py checks they agree on every row of the bundled and lab captures and on
mutated rows.

A converted node is (length, null_count, validity, offsets, data, children): validity a bitmap
(None without nulls), offsets int32 (strings, lists), data the values (bool: a bitmap).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { K_BOOL, K_INT8, K_INT16, K_INT32, K_INT64, K_STRING, K_LIST, K_STRUCT, K_KINDS };

/* the outcome of an append: done, not a value this module takes (fall back), or a Python error */
enum { OK = 0, UNSUPPORTED = 1, FAILED = -1 };

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

typedef struct Node {
    int kind;
    PyObject *key; /* borrowed from the plan, which outlives the call; NULL for a list's items */
    int nchildren;
    struct Node *children;
    Py_ssize_t length, nulls;
    Buf valid, offsets, data;
    /* a struct: the keys of the last dict read, in its order, and the field each one went to
       (-1: not a field). Rows of one kind share one key order, so most keys are matched by
       identity here instead of looked up (held references: an address is not reused meanwhile) */
    PyObject **order_keys;
    int *order_fields;
    Py_ssize_t order_len, order_cap;
    unsigned filled; /* a struct's dict count; a field read from that dict is marked with it */
    unsigned stamp;
} Node;

static const int WIDTH[K_KINDS] = {0, 1, 2, 4, 8, 0, 0, 0};
static const long long LOWEST[K_KINDS] = {0, INT8_MIN, INT16_MIN, INT32_MIN, INT64_MIN, 0, 0, 0};
static const long long HIGHEST[K_KINDS] = {0, INT8_MAX, INT16_MAX, INT32_MAX, INT64_MAX, 0, 0, 0};

static int buf_grow_slow(Buf *b, Py_ssize_t need) {
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + need)
        cap *= 2;
    char *p = PyMem_Realloc(b->p, cap);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    memset(p + b->cap, 0, cap - b->cap); /* bitmaps rely on zeroed bytes */
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int buf_grow(Buf *b, Py_ssize_t need) {
    return b->len + need <= b->cap ? 0 : buf_grow_slow(b, need);
}

/* bit ``i`` of a bitmap (set when ``on``); its bytes are grown and zeroed as needed */
static inline int bit_put(Buf *b, Py_ssize_t i, int on) {
    Py_ssize_t byte = i >> 3;
    if (byte >= b->len) {
        if (buf_grow(b, byte + 1 - b->len) < 0)
            return -1;
        b->len = byte + 1;
    }
    if (on)
        b->p[byte] |= (char)(1 << (i & 7));
    return 0;
}

static int offset_put(Node *n, Py_ssize_t value) {
    if (value > INT32_MAX)
        return UNSUPPORTED; /* past 32-bit offsets: pyarrow decides (large types, chunks) */
    if (buf_grow(&n->offsets, 4) < 0)
        return FAILED;
    int32_t v = (int32_t)value;
    memcpy(n->offsets.p + n->offsets.len, &v, 4);
    n->offsets.len += 4;
    return OK;
}

static void node_free(Node *n) {
    for (int i = 0; i < n->nchildren; i++)
        node_free(&n->children[i]);
    for (Py_ssize_t i = 0; i < n->order_len; i++)
        Py_DECREF(n->order_keys[i]);
    PyMem_Free(n->order_keys);
    PyMem_Free(n->order_fields);
    PyMem_Free(n->children);
    PyMem_Free(n->valid.p);
    PyMem_Free(n->offsets.p);
    PyMem_Free(n->data.p);
    memset(n, 0, sizeof(*n));
}

/* a node from a plan (kind, key or None, (child plans)) */
static int node_init(Node *n, PyObject *plan) {
    memset(n, 0, sizeof(*n));
    if (!PyTuple_Check(plan) || PyTuple_GET_SIZE(plan) != 3) {
        PyErr_SetString(PyExc_TypeError, "a plan is (kind, key, children)");
        return -1;
    }
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(plan, 0));
    if (kind < 0 || kind >= K_KINDS) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "unknown kind in plan");
        return -1;
    }
    n->kind = (int)kind;
    PyObject *key = PyTuple_GET_ITEM(plan, 1);
    n->key = key == Py_None ? NULL : key;
    PyObject *children = PyTuple_GET_ITEM(plan, 2);
    if (!PyTuple_Check(children)) {
        PyErr_SetString(PyExc_TypeError, "a plan's children are a tuple");
        return -1;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(children);
    if ((n->kind == K_LIST && count != 1) || (n->kind != K_LIST && n->kind != K_STRUCT && count)) {
        PyErr_SetString(PyExc_ValueError, "a list has one child, a struct its fields, others none");
        return -1;
    }
    if (count) {
        n->children = PyMem_Calloc(count, sizeof(Node));
        if (!n->children) {
            PyErr_NoMemory();
            return -1;
        }
        n->nchildren = (int)count;
        for (Py_ssize_t i = 0; i < count; i++)
            if (node_init(&n->children[i], PyTuple_GET_ITEM(children, i)) < 0)
                return -1;
    }
    if ((n->kind == K_STRING || n->kind == K_LIST) && offset_put(n, 0) != OK)
        return -1;
    return 0;
}

static int append(Node *n, PyObject *v);

static int append_null(Node *n) {
    if (bit_put(&n->valid, n->length, 0) < 0)
        return FAILED;
    switch (n->kind) {
    case K_BOOL:
        if (bit_put(&n->data, n->length, 0) < 0)
            return FAILED;
        break;
    case K_STRING:
        if (offset_put(n, n->data.len) != OK)
            return FAILED;
        break;
    case K_LIST:
        if (offset_put(n, n->children[0].length) != OK)
            return FAILED;
        break;
    case K_STRUCT:
        for (int i = 0; i < n->nchildren; i++)
            if (append_null(&n->children[i]) != OK)
                return FAILED;
        break;
    default:
        if (buf_grow(&n->data, WIDTH[n->kind]) < 0)
            return FAILED;
        n->data.len += WIDTH[n->kind];
    }
    n->length++;
    n->nulls++;
    return OK;
}

static int append_int(Node *n, PyObject *v) {
    if (!PyLong_CheckExact(v))
        return UNSUPPORTED;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred())
        return FAILED;
    if (overflow)
        return UNSUPPORTED;
    if (x < LOWEST[n->kind] || x > HIGHEST[n->kind])
        return UNSUPPORTED;
    int width = WIDTH[n->kind];
    if (buf_grow(&n->data, width) < 0)
        return FAILED;
    char *at = n->data.p + n->data.len;
#define PUT(T)                        \
    do {                              \
        T y = (T)x;                   \
        memcpy(at, &y, sizeof(y));    \
    } while (0)
    switch (n->kind) {
    case K_INT8:
        PUT(int8_t);
        break;
    case K_INT16:
        PUT(int16_t);
        break;
    case K_INT32:
        PUT(int32_t);
        break;
    default:
        PUT(int64_t);
    }
#undef PUT
    n->data.len += width;
    return OK;
}

/* the field of struct ``n`` that key ``k`` names: its index, -1 for none, -2 for a key that is
   a str subclass (it may have its own hash and equality: pyarrow's look-up is to judge) */
static int field_of(Node *n, PyObject *k) {
    if (!PyUnicode_Check(k))
        return -1; /* pyarrow looks fields up by their names: other keys are never read */
    if (!PyUnicode_CheckExact(k))
        return -2;
    for (int i = 0; i < n->nchildren; i++)
        if (n->children[i].key == k)
            return i;
    for (int i = 0; i < n->nchildren; i++)
        if (PyUnicode_Compare(n->children[i].key, k) == 0)
            return i;
    return -1;
}

static int order_put(Node *n, Py_ssize_t j, PyObject *k, int field) {
    if (j >= n->order_cap) {
        Py_ssize_t cap = n->order_cap ? n->order_cap * 2 : 32;
        PyObject **keys = PyMem_Realloc(n->order_keys, cap * sizeof(PyObject *));
        if (!keys) {
            PyErr_NoMemory();
            return FAILED;
        }
        n->order_keys = keys;
        int *fields = PyMem_Realloc(n->order_fields, cap * sizeof(int));
        if (!fields) {
            PyErr_NoMemory();
            return FAILED;
        }
        n->order_fields = fields;
        n->order_cap = cap;
    }
    if (j < n->order_len)
        Py_SETREF(n->order_keys[j], Py_NewRef(k));
    else {
        n->order_keys[j] = Py_NewRef(k);
        n->order_len = j + 1;
    }
    n->order_fields[j] = field;
    return OK;
}

/* one dict's values to the fields of struct ``n`` (a missing field: null) */
static int fill_struct(Node *n, PyObject *d) {
    if (!PyDict_CheckExact(d))
        return UNSUPPORTED;
    unsigned mark = ++n->filled;
    Py_ssize_t pos = 0, j = 0;
    PyObject *k, *value;
    int rc;
    while (PyDict_Next(d, &pos, &k, &value)) {
        int field;
        if (j < n->order_len && n->order_keys[j] == k)
            field = n->order_fields[j];
        else {
            field = field_of(n, k);
            if (field == -2 || PyErr_Occurred()) {
                PyErr_Clear();
                return UNSUPPORTED;
            }
            if ((rc = order_put(n, j, k, field)) != OK)
                return rc;
        }
        j++;
        if (field >= 0) {
            Node *child = &n->children[field];
            if ((rc = append(child, value)) != OK)
                return rc;
            child->stamp = mark;
        }
    }
    for (int i = 0; i < n->nchildren; i++)
        if (n->children[i].stamp != mark && append_null(&n->children[i]) != OK)
            return FAILED;
    return OK;
}

static int append(Node *n, PyObject *v) {
    if (v == NULL || v == Py_None)
        return append_null(n);
    int rc;
    switch (n->kind) {
    case K_BOOL:
        if (v != Py_True && v != Py_False)
            return UNSUPPORTED;
        if (bit_put(&n->data, n->length, v == Py_True) < 0)
            return FAILED;
        break;
    case K_STRING: {
        if (!PyUnicode_CheckExact(v))
            return UNSUPPORTED;
        Py_ssize_t size;
        const char *utf8 = PyUnicode_AsUTF8AndSize(v, &size);
        if (!utf8) {
            PyErr_Clear(); /* e.g. a lone surrogate: pyarrow's to judge */
            return UNSUPPORTED;
        }
        if (buf_grow(&n->data, size) < 0)
            return FAILED;
        memcpy(n->data.p + n->data.len, utf8, size);
        n->data.len += size;
        if ((rc = offset_put(n, n->data.len)) != OK)
            return rc;
        break;
    }
    case K_LIST: {
        if (!PyList_CheckExact(v))
            return UNSUPPORTED;
        Node *item = &n->children[0];
        Py_ssize_t count = PyList_GET_SIZE(v);
        for (Py_ssize_t i = 0; i < count; i++)
            if ((rc = append(item, PyList_GET_ITEM(v, i))) != OK)
                return rc;
        if ((rc = offset_put(n, item->length)) != OK)
            return rc;
        break;
    }
    case K_STRUCT:
        if ((rc = fill_struct(n, v)) != OK)
            return rc;
        break;
    default:
        if ((rc = append_int(n, v)) != OK)
            return rc;
    }
    if (bit_put(&n->valid, n->length, 1) < 0)
        return FAILED;
    n->length++;
    return OK;
}

static PyObject *buf_bytes(Buf *b) {
    return PyBytes_FromStringAndSize(b->p ? b->p : "", b->len);
}

/* (length, null_count, validity or None, offsets or None, data or None, (children)) */
static PyObject *node_result(Node *n) {
    PyObject *children = PyTuple_New(n->nchildren);
    if (!children)
        return NULL;
    for (int i = 0; i < n->nchildren; i++) {
        PyObject *child = node_result(&n->children[i]);
        if (!child) {
            Py_DECREF(children);
            return NULL;
        }
        PyTuple_SET_ITEM(children, i, child);
    }
    PyObject *valid = n->nulls ? buf_bytes(&n->valid) : Py_NewRef(Py_None);
    int has_offsets = n->kind == K_STRING || n->kind == K_LIST;
    int has_data = n->kind != K_LIST && n->kind != K_STRUCT;
    PyObject *offsets = has_offsets ? buf_bytes(&n->offsets) : Py_NewRef(Py_None);
    PyObject *data = has_data ? buf_bytes(&n->data) : Py_NewRef(Py_None);
    PyMem_Free(n->valid.p); /* copied: let go now, not after every column (peak memory) */
    PyMem_Free(n->offsets.p);
    PyMem_Free(n->data.p);
    memset(&n->valid, 0, sizeof(Buf));
    memset(&n->offsets, 0, sizeof(Buf));
    memset(&n->data, 0, sizeof(Buf));
    if (!valid || !offsets || !data) {
        Py_XDECREF(valid);
        Py_XDECREF(offsets);
        Py_XDECREF(data);
        Py_DECREF(children);
        return NULL;
    }
    return Py_BuildValue("(nnNNNN)", n->length, n->nulls, valid, offsets, data, children);
}

PyDoc_STRVAR(convert_doc,
             "convert(rows, plans) -> tuple of converted columns, or None\n\n"
             "rows: a list of dicts; plans: one (kind, key, children) per column. None when a\n"
             "value is not one this module takes: convert those rows with pyarrow.");

static PyObject *convert(PyObject *self, PyObject *args) {
    PyObject *rows, *plans;
    if (!PyArg_ParseTuple(args, "O!O!:convert", &PyList_Type, &rows, &PyTuple_Type, &plans))
        return NULL;
    Py_ssize_t ncols = PyTuple_GET_SIZE(plans);
    Node root; /* the row: a struct whose fields are the columns (never null itself) */
    memset(&root, 0, sizeof(root));
    root.kind = K_STRUCT;
    root.children = PyMem_Calloc(ncols ? ncols : 1, sizeof(Node));
    if (!root.children)
        return PyErr_NoMemory();
    root.nchildren = (int)ncols;
    Node *cols = root.children;
    PyObject *result = NULL;
    int rc = OK;
    for (Py_ssize_t c = 0; c < ncols; c++) {
        if (node_init(&cols[c], PyTuple_GET_ITEM(plans, c)) < 0)
            goto done;
        if (!cols[c].key || !PyUnicode_CheckExact(cols[c].key)) {
            PyErr_SetString(PyExc_ValueError, "a column's plan needs its key, a str");
            goto done;
        }
    }
    Py_ssize_t nrows = PyList_GET_SIZE(rows);
    for (Py_ssize_t r = 0; r < nrows && rc == OK; r++)
        rc = fill_struct(&root, PyList_GET_ITEM(rows, r));
    if (rc == FAILED)
        goto done;
    if (rc == UNSUPPORTED) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = PyTuple_New(ncols);
    if (!result)
        goto done;
    for (Py_ssize_t c = 0; c < ncols; c++) {
        PyObject *column = node_result(&cols[c]);
        if (!column) {
            Py_CLEAR(result);
            goto done;
        }
        PyTuple_SET_ITEM(result, c, column);
    }
done:
    node_free(&root);
    return result;
}

static PyMethodDef methods[] = {
    {"convert", convert, METH_VARARGS, convert_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kwire._rowarrow", "Row dicts to Arrow buffers (see kwire/rowarrow.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__rowarrow(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    const char *names[K_KINDS] = {"BOOL", "INT8", "INT16", "INT32", "INT64", "STRING", "LIST", "STRUCT"};
    for (int i = 0; i < K_KINDS; i++)
        if (PyModule_AddIntConstant(m, names[i], i) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    return m;
}
