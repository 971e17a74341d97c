/* decoder._layoutvm: the compiled body decoder, a table-driven interpreter of protocol layouts.

Why compiled, and why this shape. Measured on the bench's chatty capture (81,435 exchanges,
bench/decode_profile.py, CPython 3.11, 2-core VM): the layouts that decoder.codegen turns into
straight-line Python took 7.2 us per exchange of the 60 us that `kwire decode` spent in all, and
no further Python rewrite of them was left to try (they are already one struct call per run of
fixed fields). Issue 22 asks for 3x-5x tshark, about 14 us per exchange in all, which only a
compiled path can reach. This module is its first piece.

It holds no protocol knowledge. decoder.codegen.program() turns a layout from the protocol table
(decoder/kafka_protocol.json, made from Kafka's JSON definitions) into a program of nested tuples;
this file converts that program into C structs once and interprets it for every frame. Adding an
API or version touches the JSON only.

Semantics. The Python functions that decoder.codegen generates are the reference. A decoder made
here holds its reference function: on any frame the C loop cannot decode exactly as the reference
would (a read past the buffer, a length past the frame, an over-long varint, a buffer that is not
bytes or bytearray, an exception raised by a helper), it gives up and calls the reference, whose
result or exception is returned as is. So malformed frames read exactly as they always did, and
the C loop only has to be right where the reference succeeds; tests/test_layoutvm.py checks both
on real captures and on mutated frames.

Program format (see decoder.codegen.program):
  struct program: (ops, tagged, flexible, keep)
    ops:    tuple of op
    tagged: tuple of (tag, op) for the tagged fields kept (flexible only)
  op: (OP_RUN, size, check, items)               items: ((offset, code, key), ...)
      (OP_STR, compact, wide, kind, key)         kind 0: text, 1: records summary; key None: skip
      (OP_STRUCT, nullable, key, program)
      (OP_ASTRUCT, compact, key, program)
      (OP_AFIXED, compact, code, size, key)
      (OP_ASTR, compact, wide, kind, key)
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { OP_RUN = 0, OP_STR = 1, OP_STRUCT = 2, OP_ASTRUCT = 3, OP_AFIXED = 4, OP_ASTR = 5 };
enum { F_BOOL = 0, F_I8 = 1, F_I16 = 2, F_U16 = 3, F_I32 = 4, F_I64 = 5, F_F64 = 6, F_UUID = 7 };

typedef struct Prog Prog;

typedef struct {
    Py_ssize_t offset;
    int code;
    PyObject *key;
} Item;

typedef struct {
    int kind;
    int compact, wide, sub;  /* sub: string kind (OP_STR/OP_ASTR), nullable (OP_STRUCT), code (OP_AFIXED) */
    Py_ssize_t size;         /* OP_RUN: bytes; OP_AFIXED: element size */
    int check;               /* OP_RUN: the whole run is read at once (bounds-checked as one) */
    Py_ssize_t nitems;
    Item *items;
    PyObject *key;           /* NULL: skipped */
    Prog *child;
    long tag;
} Op;

struct Prog {
    Py_ssize_t nops, ntagged;
    Py_ssize_t nkeys; /* the keys its dict gets when every field is there: it is made that size */
    Op *ops;
    Op *tagged;
    int flexible, keep;
};

/* Bail out: the reference decides. */
#define BAIL (-1)

typedef struct {
    const uint8_t *b;
    Py_ssize_t len;
    PyObject *buf;       /* the buffer object, for the records helper */
    PyObject *records;   /* decoder.records.summarize_records, for legacy message sets */
    PyObject *summary;   /* decoder.records.RecordsSummary */
    Py_ssize_t max_kept; /* decoder.records.MAX_BATCHES_KEPT */
} Ctx;

static void prog_free(Prog *p);

static void op_clear(Op *op) {
    Py_XDECREF(op->key);
    for (Py_ssize_t i = 0; i < op->nitems; i++) Py_XDECREF(op->items[i].key);
    PyMem_Free(op->items);
    if (op->child) prog_free(op->child);
}

static void prog_free(Prog *p) {
    if (!p) return;
    for (Py_ssize_t i = 0; i < p->nops; i++) op_clear(&p->ops[i]);
    for (Py_ssize_t i = 0; i < p->ntagged; i++) op_clear(&p->tagged[i]);
    PyMem_Free(p->ops);
    PyMem_Free(p->tagged);
    PyMem_Free(p);
}

static Prog *prog_build(PyObject *spec);

static long as_long(PyObject *t, Py_ssize_t i) { return PyLong_AsLong(PyTuple_GET_ITEM(t, i)); }

static PyObject *as_key(PyObject *t, Py_ssize_t i) {
    PyObject *key = PyTuple_GET_ITEM(t, i);
    if (key == Py_None) return NULL;
    Py_INCREF(key);
    return key;
}

static int op_build(Op *op, PyObject *t) {
    memset(op, 0, sizeof *op);
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 1) {
        PyErr_SetString(PyExc_ValueError, "layout program: an op is a tuple");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    op->kind = (int)as_long(t, 0);
    switch (op->kind) {
    case OP_RUN: {
        if (n != 4) goto bad;
        op->size = as_long(t, 1);
        op->check = (int)as_long(t, 2);
        PyObject *items = PyTuple_GET_ITEM(t, 3);
        if (!PyTuple_Check(items)) goto bad;
        op->nitems = PyTuple_GET_SIZE(items);
        op->items = PyMem_Calloc(op->nitems ? op->nitems : 1, sizeof(Item));
        if (!op->items) { PyErr_NoMemory(); return -1; }
        for (Py_ssize_t i = 0; i < op->nitems; i++) {
            PyObject *it = PyTuple_GET_ITEM(items, i);
            if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 3) goto bad;
            op->items[i].offset = as_long(it, 0);
            op->items[i].code = (int)as_long(it, 1);
            op->items[i].key = as_key(it, 2);
        }
        break;
    }
    case OP_STR:
    case OP_ASTR:
        if (n != 5) goto bad;
        op->compact = (int)as_long(t, 1);
        op->wide = (int)as_long(t, 2);
        op->sub = (int)as_long(t, 3);
        op->key = as_key(t, 4);
        break;
    case OP_STRUCT:
    case OP_ASTRUCT:
        if (n != 4) goto bad;
        if (op->kind == OP_STRUCT) op->sub = (int)as_long(t, 1);
        else op->compact = (int)as_long(t, 1);
        op->key = as_key(t, 2);
        op->child = prog_build(PyTuple_GET_ITEM(t, 3));
        if (!op->child) return -1;
        break;
    case OP_AFIXED:
        if (n != 5) goto bad;
        op->compact = (int)as_long(t, 1);
        op->sub = (int)as_long(t, 2);
        op->size = as_long(t, 3);
        op->key = as_key(t, 4);
        break;
    default:
        goto bad;
    }
    return PyErr_Occurred() ? -1 : 0;
bad:
    PyErr_Format(PyExc_ValueError, "layout program: bad op %R", t);
    return -1;
}

static Prog *prog_build(PyObject *spec) {
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 4) {
        PyErr_SetString(PyExc_ValueError, "layout program: (ops, tagged, flexible, keep)");
        return NULL;
    }
    PyObject *ops = PyTuple_GET_ITEM(spec, 0), *tagged = PyTuple_GET_ITEM(spec, 1);
    if (!PyTuple_Check(ops) || !PyTuple_Check(tagged)) {
        PyErr_SetString(PyExc_ValueError, "layout program: ops and tagged are tuples");
        return NULL;
    }
    Prog *p = PyMem_Calloc(1, sizeof(Prog));
    if (!p) return (Prog *)PyErr_NoMemory();
    p->flexible = PyObject_IsTrue(PyTuple_GET_ITEM(spec, 2));
    p->keep = PyObject_IsTrue(PyTuple_GET_ITEM(spec, 3));
    p->ops = PyMem_Calloc(PyTuple_GET_SIZE(ops) + 1, sizeof(Op));
    p->tagged = PyMem_Calloc(PyTuple_GET_SIZE(tagged) + 1, sizeof(Op));
    if (!p->ops || !p->tagged) { prog_free(p); return (Prog *)PyErr_NoMemory(); }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ops); i++) {
        if (op_build(&p->ops[i], PyTuple_GET_ITEM(ops, i)) < 0) { p->nops = i + 1; prog_free(p); return NULL; }
        p->nops = i + 1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tagged); i++) {
        PyObject *pair = PyTuple_GET_ITEM(tagged, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_ValueError, "layout program: tagged entries are (tag, op)");
            prog_free(p);
            return NULL;
        }
        if (op_build(&p->tagged[i], PyTuple_GET_ITEM(pair, 1)) < 0) { p->ntagged = i + 1; prog_free(p); return NULL; }
        p->tagged[i].tag = as_long(pair, 0);
        p->ntagged = i + 1;
    }
    for (Py_ssize_t i = 0; i < p->nops; i++) {
        p->nkeys += p->ops[i].key != NULL;
        for (Py_ssize_t k = 0; p->ops[i].kind == OP_RUN && k < p->ops[i].nitems; k++)
            p->nkeys += p->ops[i].items[k].key != NULL;
    }
    return p;
}

/* ---- reading ------------------------------------------------------------------------- */

static inline uint16_t be16(const uint8_t *s) { return (uint16_t)((s[0] << 8) | s[1]); }
static inline uint32_t be32(const uint8_t *s) {
    return ((uint32_t)s[0] << 24) | ((uint32_t)s[1] << 16) | ((uint32_t)s[2] << 8) | s[3];
}
static inline uint64_t be64(const uint8_t *s) { return ((uint64_t)be32(s) << 32) | be32(s + 4); }

/* decoder.primitives.read_uvarint: at most 5 bytes */
static inline int uvarint(const Ctx *c, Py_ssize_t *p, int64_t *out) {
    int64_t value = 0;
    int shift = 0;
    Py_ssize_t q = *p;
    for (int i = 0; i < 5; i++) {
        if (q >= c->len) return BAIL;
        uint8_t byte = c->b[q++];
        value |= (int64_t)(byte & 0x7F) << shift;
        if (byte < 0x80) {
            *p = q;
            *out = value;
            return 0;
        }
        shift += 7;
    }
    return BAIL;
}

/* A length or count: compact (uvarint - 1), int32 (wide) or int16. */
static inline int length(const Ctx *c, Py_ssize_t *p, int compact, int wide, int64_t *n) {
    if (compact) {
        if (uvarint(c, p, n) < 0) return BAIL;
        *n -= 1;
    } else if (wide) {
        if (*p + 4 > c->len) return BAIL;
        *n = (int32_t)be32(c->b + *p);
        *p += 4;
    } else {
        if (*p + 2 > c->len) return BAIL;
        *n = (int16_t)be16(c->b + *p);
        *p += 2;
    }
    return 0;
}

static const char B64URL[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* decoder.primitives.read_uuid: URL-safe base64 without padding (22 characters). */
static PyObject *uuid_text(const uint8_t *s) {
    char out[24];
    int o = 0;
    for (int i = 0; i < 15; i += 3) {
        uint32_t v = ((uint32_t)s[i] << 16) | ((uint32_t)s[i + 1] << 8) | s[i + 2];
        out[o++] = B64URL[(v >> 18) & 63];
        out[o++] = B64URL[(v >> 12) & 63];
        out[o++] = B64URL[(v >> 6) & 63];
        out[o++] = B64URL[v & 63];
    }
    out[o++] = B64URL[s[15] >> 2];
    out[o++] = B64URL[(s[15] & 3) << 4];
    return PyUnicode_FromStringAndSize(out, o);
}

static PyObject *fixed_value(const uint8_t *s, int code) {
    switch (code) {
    case F_BOOL: return PyBool_FromLong(s[0] != 0);
    case F_I8: return PyLong_FromLong((int8_t)s[0]);
    case F_I16: return PyLong_FromLong((int16_t)be16(s));
    case F_U16: return PyLong_FromLong(be16(s));
    case F_I32: return PyLong_FromLong((int32_t)be32(s));
    case F_I64: return PyLong_FromLongLong((int64_t)be64(s));
    case F_F64: {
        uint64_t bits = be64(s);
        double d;
        memcpy(&d, &bits, sizeof d);
        return PyFloat_FromDouble(d);
    }
    case F_UUID: return uuid_text(s);
    }
    PyErr_SetString(PyExc_ValueError, "layout program: bad fixed code");
    return NULL;
}

static int run_prog(const Ctx *c, const Prog *prog, Py_ssize_t *p, Py_ssize_t e, PyObject **out);

/* decoder.records.summarize_records for record batches (magic 2): the same RecordsSummary, its
   entries the headers as _V2_HEADER unpacks them. A legacy message set (magic 0/1) anywhere in
   the field is summarised by the Python function, as a whole. */
static PyObject *summarize(const Ctx *c, Py_ssize_t start, Py_ssize_t end) {
    if (end > c->len || start < 0) return PyObject_CallFunction(c->records, "Onn", c->buf, start, end);
    const uint8_t *b = c->b;
    long long batches = 0, records = 0;
    long codecs = 0;
    PyObject *kept = PyList_New(0);
    if (!kept) return NULL;
    Py_ssize_t pos = start;
    while (pos + 17 <= end) {
        uint8_t magic = b[pos + 16];
        if (magic == 0 || magic == 1) {
            Py_DECREF(kept);
            return PyObject_CallFunction(c->records, "Onn", c->buf, start, end);
        }
        if (magic != 2 || pos + 61 > end) break;
        const uint8_t *h = b + pos;
        int32_t length = (int32_t)be32(h + 8);
        if (length < 61 - 12 || pos + 12 + (Py_ssize_t)length > end) break;
        int16_t attrs = (int16_t)be16(h + 21);
        int32_t count = (int32_t)be32(h + 57);
        int codec = attrs & 7;
        records += count > 0 ? count : 0;
        if (batches < c->max_kept) {
            PyObject *header = Py_BuildValue(
                "(LiiiIhiLLLhii)", (long long)(int64_t)be64(h), length, (int)(int32_t)be32(h + 12), (int)(int8_t)h[16],
                (unsigned int)be32(h + 17), (short)attrs, (int)(int32_t)be32(h + 23), (long long)(int64_t)be64(h + 27),
                (long long)(int64_t)be64(h + 35), (long long)(int64_t)be64(h + 43), (short)(int16_t)be16(h + 51),
                (int)(int32_t)be32(h + 53), (int)count);
            if (!header || PyList_Append(kept, header) < 0) {
                Py_XDECREF(header);
                Py_DECREF(kept);
                return NULL;
            }
            Py_DECREF(header);
        }
        if (codec < 5) codecs |= 1L << codec;
        batches++;
        pos += 12 + (Py_ssize_t)length;
    }
    PyObject *entries = PyList_AsTuple(kept);
    Py_DECREF(kept);
    if (!entries) return NULL;
    PyObject *summary = PyObject_CallFunction(c->summary, "((LLl))", batches, records, codecs);
    if (!summary || PyObject_SetAttrString(summary, "entries", entries) < 0) {
        Py_XDECREF(summary);
        Py_DECREF(entries);
        return NULL;
    }
    Py_DECREF(entries);
    return summary;
}

/* Store a kept value in the struct's dict (steals value). */
static inline int put(PyObject *dict, PyObject *key, PyObject *value) {
    if (!value) return BAIL;
    int rc = PyDict_SetItem(dict, key, value);
    Py_DECREF(value);
    return rc < 0 ? BAIL : 0;
}

/* One string/bytes/records field: kept -> *value (text, records summary or None). */
static int string_field(const Ctx *c, Py_ssize_t *p, Py_ssize_t e, int compact, int wide, int kind, int kept,
                        PyObject **value) {
    int64_t n;
    if (length(c, p, compact, wide, &n) < 0) return BAIL;
    if (!kept) {
        if (n > 0) *p += (Py_ssize_t)n;
        return 0;
    }
    if (kind == 0 ? n >= 0 : n > 0) {
        int64_t q = *p + n;
        if (q > e) return BAIL;
        if (kind == 0) {
            /* bytes[p:q] clamps at the buffer's end */
            Py_ssize_t stop = q < c->len ? (Py_ssize_t)q : c->len;
            Py_ssize_t start = *p < stop ? *p : stop;
            *value = PyUnicode_DecodeUTF8((const char *)c->b + start, stop - start, "replace");
        } else {
            *value = summarize(c, *p, (Py_ssize_t)q);
        }
        if (!*value) return BAIL;
        *p = (Py_ssize_t)q;
    } else {
        Py_INCREF(Py_None);
        *value = Py_None;
    }
    return 0;
}

/* One field: a kept value is stored in the struct's dict under its key, a skipped one is stepped over. */
static int run_op(const Ctx *c, const Op *op, Py_ssize_t *p, Py_ssize_t e, PyObject *dict) {
    PyObject *value = NULL;
    if (!dict && (op->key || op->nitems)) return BAIL; /* a kept field in a skipping struct: a bad program */
    switch (op->kind) {
    case OP_RUN: {
        if (op->check && *p + op->size > c->len) return BAIL;
        for (Py_ssize_t i = 0; i < op->nitems; i++) {
            const Item *it = &op->items[i];
            Py_ssize_t at = *p + it->offset;
            Py_ssize_t width = it->code == F_UUID ? 16 : it->code <= F_I8 ? 1 : it->code <= F_U16 ? 2
                               : it->code == F_I32 ? 4 : 8;
            if (at + width > c->len) return BAIL;
            if (put(dict, it->key, fixed_value(c->b + at, it->code)) < 0) return BAIL;
        }
        *p += op->size;
        return 0;
    }
    case OP_STR:
        if (string_field(c, p, e, op->compact, op->wide, op->sub, op->key != NULL, &value) < 0) return BAIL;
        break;
    case OP_STRUCT:
        if (op->sub) { /* nullable: an int8 presence marker */
            if (*p >= c->len) return BAIL;
            int8_t marker = (int8_t)c->b[*p];
            *p += 1;
            if (marker < 0) {
                if (op->key) {
                    Py_INCREF(Py_None);
                    value = Py_None;
                }
                break;
            }
        }
        if (run_prog(c, op->child, p, e, op->key ? &value : NULL) < 0) return BAIL;
        break;
    case OP_ASTRUCT:
    case OP_AFIXED:
    case OP_ASTR: {
        int64_t n;
        if (length(c, p, op->compact, 1, &n) < 0) return BAIL;
        if (n > e - *p) return BAIL;
        if (op->key) {
            if (n < 0) {
                Py_INCREF(Py_None);
                value = Py_None;
                break;
            }
        } else if (n <= 0) {
            return 0;
        }
        if (op->kind == OP_AFIXED) {
            Py_ssize_t size = op->size;
            if (op->key) {
                if (*p + size * n > c->len) return BAIL;
                value = PyList_New((Py_ssize_t)n);
                if (!value) return BAIL;
                for (Py_ssize_t i = 0; i < n; i++) {
                    PyObject *x = fixed_value(c->b + *p + size * i, op->sub);
                    if (!x) { Py_DECREF(value); return BAIL; }
                    PyList_SET_ITEM(value, i, x);
                }
            }
            *p += size * (Py_ssize_t)n;
            break;
        }
        if (op->key) {
            value = PyList_New((Py_ssize_t)n);
            if (!value) return BAIL;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *x = NULL;
            int rc = op->kind == OP_ASTRUCT
                         ? run_prog(c, op->child, p, e, op->key ? &x : NULL)
                         : string_field(c, p, e, op->compact, op->wide, op->sub, op->key != NULL, &x);
            if (rc < 0) { Py_XDECREF(value); return BAIL; }
            if (op->key) PyList_SET_ITEM(value, i, x);
        }
        break;
    }
    default:
        return BAIL;
    }
    if (op->key) return put(dict, op->key, value);
    Py_XDECREF(value);
    return 0;
}

/* A struct: its fields in order, then (flexible) its tagged-field section. */
static int run_prog(const Ctx *c, const Prog *prog, Py_ssize_t *p, Py_ssize_t e, PyObject **out) {
    PyObject *dict = NULL;
    if (out) {
        /* sized at once: grown from empty, a Produce request's structs were resized on the way */
        dict = _PyDict_NewPresized(prog->nkeys);
        if (!dict) return BAIL;
    }
    for (Py_ssize_t i = 0; i < prog->nops; i++)
        if (run_op(c, &prog->ops[i], p, e, dict) < 0) goto fail;
    if (prog->flexible) {
        int64_t count;
        if (uvarint(c, p, &count) < 0) goto fail;
        if (count > e - *p) goto fail;
        for (int64_t k = 0; k < count; k++) {
            int64_t tag, size;
            if (uvarint(c, p, &tag) < 0 || uvarint(c, p, &size) < 0) goto fail;
            if (*p + size > e) goto fail;
            for (Py_ssize_t t = 0; t < prog->ntagged; t++) {
                if (prog->tagged[t].tag == tag) {
                    Py_ssize_t q = *p;
                    if (run_op(c, &prog->tagged[t], &q, (Py_ssize_t)(*p + size), dict) < 0) goto fail;
                    break;
                }
            }
            *p += (Py_ssize_t)size;
        }
    }
    if (out) *out = dict;
    return 0;
fail:
    Py_XDECREF(dict);
    return BAIL;
}

/* ---- the decoder type ------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    Prog *prog;
    PyObject *reference;  /* the Python function generated from the same layout */
    PyObject *records, *summary;
    Py_ssize_t max_kept;
    unsigned long long fallbacks;
} Decoder;

static void Decoder_dealloc(Decoder *self) {
    prog_free(self->prog);
    Py_XDECREF(self->reference);
    Py_XDECREF(self->records);
    Py_XDECREF(self->summary);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *fallback(Decoder *self, PyObject *args) {
    self->fallbacks++;
    return PyObject_Call(self->reference, args, NULL);
}

static PyObject *Decoder_call(Decoder *self, PyObject *args, PyObject *kwargs) {
    PyObject *buf;
    Py_ssize_t pos, end;
    if (kwargs || !PyArg_ParseTuple(args, "Onn", &buf, &pos, &end)) {
        PyErr_Clear();
        return fallback(self, args);
    }
    if ((!PyBytes_CheckExact(buf) && !PyByteArray_CheckExact(buf)) || pos < 0 || end < pos)
        return fallback(self, args);
    /* A bytearray is exported for the duration, so that nothing (a finalizer, another thread
       while the legacy records helper runs Python) can resize it under the pointer read here. */
    Py_buffer view;
    if (PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return fallback(self, args);
    }
    Ctx c = {view.buf, view.len, buf, self->records, self->summary, self->max_kept};
    Py_ssize_t p = pos;
    PyObject *fields = NULL;
    int rc = run_prog(&c, self->prog, &p, end, &fields);
    PyBuffer_Release(&view);
    if (rc < 0) {
        PyErr_Clear();
        return fallback(self, args);
    }
    PyObject *pnum = PyLong_FromSsize_t(p);
    if (!pnum) { Py_DECREF(fields); return NULL; }
    PyObject *result = PyTuple_New(2);
    if (!result) { Py_DECREF(fields); Py_DECREF(pnum); return NULL; }
    PyTuple_SET_ITEM(result, 0, fields);
    PyTuple_SET_ITEM(result, 1, pnum);
    return result;
}

static PyObject *Decoder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"program", "reference", "records", "summary", "max_kept", NULL};
    PyObject *spec, *reference, *records, *summary;
    Py_ssize_t max_kept;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOn", kwlist, &spec, &reference, &records, &summary,
                                     &max_kept))
        return NULL;
    Prog *prog = prog_build(spec);
    if (!prog) return NULL;
    if (!prog->keep) {
        prog_free(prog);
        PyErr_SetString(PyExc_ValueError, "layout program: a message decoder keeps its fields");
        return NULL;
    }
    Decoder *self = (Decoder *)type->tp_alloc(type, 0);
    if (!self) { prog_free(prog); return NULL; }
    self->prog = prog;
    Py_INCREF(reference);
    self->reference = reference;
    Py_INCREF(records);
    self->records = records;
    Py_INCREF(summary);
    self->summary = summary;
    self->max_kept = max_kept;
    return (PyObject *)self;
}

static PyObject *Decoder_get_fallbacks(Decoder *self, void *closure) {
    return PyLong_FromUnsignedLongLong(self->fallbacks);
}

static PyObject *Decoder_get_reference(Decoder *self, void *closure) {
    Py_INCREF(self->reference);
    return self->reference;
}

static PyGetSetDef Decoder_getset[] = {
    {"fallbacks", (getter)Decoder_get_fallbacks, NULL, "frames handed to the reference function", NULL},
    {"reference", (getter)Decoder_get_reference, NULL, "the Python function from the same layout", NULL},
    {NULL},
};

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "decoder._layoutvm.Decoder",
    .tp_doc = "Decoder(program, reference, records, summary, max_kept)(buf, pos, end) -> (fields, pos)",
    .tp_basicsize = sizeof(Decoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Decoder_new,
    .tp_dealloc = (destructor)Decoder_dealloc,
    .tp_call = (ternaryfunc)Decoder_call,
    .tp_getset = Decoder_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "decoder._layoutvm",
    "Compiled, table-driven decoder of protocol layouts (see decoder/_layoutvm.c).", -1, NULL,
};

PyMODINIT_FUNC PyInit__layoutvm(void) {
    if (PyType_Ready(&DecoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&DecoderType);
    if (PyModule_AddObject(m, "Decoder", (PyObject *)&DecoderType) < 0) {
        Py_DECREF(&DecoderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
