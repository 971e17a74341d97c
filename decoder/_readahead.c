/* decoder._readahead: a regular file's next chunk read on a thread of its own while this one is decoded.

Why hand-written: reading a capture from the page cache is a kernel copy, 0.26 s of the bench's
bulk capture (1.27 GB, `bench/decode_profile.py`), done by the one thread that also decodes. A
Python thread reading ahead made it slower (1.81 s against 1.68 s, 2026-12-06): back from each
read it needs the GIL, which the decoding thread then gives up every switch interval. This thread
never takes the GIL: it reads (pread) into the next chunk's bytes object, made beforehand by the
caller while holding it, and the caller takes the chunk when it needs it.

ReadAhead(fd, offset, chunk) reads a copy of fd (dup) from offset, chunk bytes at a time.
next() -> bytes: the next chunk (shorter at the end of the file, b"" after it); raises OSError
    where the read failed. The chunk after it is then read on the thread.
close(): stops the thread and closes the copy of fd (also done when the object goes).
In a process forked from the one that made it (no thread there), and after the end of the file was
reached once, next() reads in the caller.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <unistd.h>

enum { IDLE, FILLING, FILLED, STOPPING };

typedef struct {
    PyObject_HEAD
    int fd;
    long long offset;    /* where the chunk being read (or the next one) starts */
    Py_ssize_t chunk;
    PyObject *buf;       /* the bytes object the thread fills, NULL once closed */
    Py_ssize_t got;      /* bytes read into buf */
    int err;             /* errno of a failed read, 0 if none */
    int state;
    int started;         /* the thread runs (joined by close) */
    int ended;           /* the end of the file was reached: from then on, next() reads itself */
    pid_t pid;           /* the process that started the thread */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} ReadAhead;

/* Read up to size bytes at offset into out: the count read (short only at the end of the file), or -1
   with *err set. */
static Py_ssize_t read_at(int fd, char *out, Py_ssize_t size, long long offset, int *err) {
    Py_ssize_t got = 0;
    while (got < size) {
        ssize_t n = pread(fd, out + got, (size_t)(size - got), (off_t)(offset + got));
        if (n < 0) {
            if (errno == EINTR) continue;
            *err = errno;
            return -1;
        }
        if (n == 0) break;
        got += n;
    }
    return got;
}

static void *reader(void *arg) {
    ReadAhead *self = arg;
    pthread_mutex_lock(&self->mu);
    for (;;) {
        while (self->state == IDLE || self->state == FILLED) pthread_cond_wait(&self->cv, &self->mu);
        if (self->state == STOPPING) break;
        char *out = PyBytes_AS_STRING(self->buf); /* FILLING: buf is ours until FILLED */
        Py_ssize_t size = self->chunk;
        long long offset = self->offset;
        pthread_mutex_unlock(&self->mu);
        int err = 0;
        Py_ssize_t got = read_at(self->fd, out, size, offset, &err);
        pthread_mutex_lock(&self->mu);
        self->got = got < 0 ? 0 : got;
        self->err = err;
        if (self->state == FILLING) self->state = FILLED;
        pthread_cond_broadcast(&self->cv);
    }
    pthread_mutex_unlock(&self->mu);
    return NULL;
}

static int ReadAhead_init(ReadAhead *self, PyObject *args, PyObject *kwds) {
    int fd;
    long long offset;
    Py_ssize_t chunk;
    if (!PyArg_ParseTuple(args, "iLn", &fd, &offset, &chunk)) return -1;
    if (self->buf != NULL || self->fd >= 0) {
        PyErr_SetString(PyExc_RuntimeError, "ReadAhead is made once");
        return -1;
    }
    if (chunk <= 0 || offset < 0) {
        PyErr_SetString(PyExc_ValueError, "ReadAhead: chunk > 0 and offset >= 0");
        return -1;
    }
    self->fd = dup(fd);
    if (self->fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->offset = offset;
    self->chunk = chunk;
    self->buf = PyBytes_FromStringAndSize(NULL, chunk);
    if (self->buf == NULL) return -1;
    self->pid = getpid();
    self->state = FILLING;
    if (pthread_create(&self->thread, NULL, reader, self) != 0) {
        self->state = IDLE; /* no thread: next() reads in the caller */
        return 0;
    }
    self->started = 1;
    return 0;
}

static PyObject *ReadAhead_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    ReadAhead *self = (ReadAhead *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->fd = -1;
    pthread_mutex_init(&self->mu, NULL);
    pthread_cond_init(&self->cv, NULL);
    return (PyObject *)self;
}

/* Hand buf (at offset) to the thread to fill: it waits, FILLED, until then. */
static void refill(ReadAhead *self) {
    pthread_mutex_lock(&self->mu);
    self->state = FILLING;
    pthread_cond_broadcast(&self->cv);
    pthread_mutex_unlock(&self->mu);
}

static PyObject *ReadAhead_next(ReadAhead *self, PyObject *unused) {
    if (self->buf == NULL) {
        PyErr_SetString(PyExc_ValueError, "ReadAhead is closed");
        return NULL;
    }
    int threaded = self->started && self->pid == getpid() && !self->ended;
    Py_ssize_t got;
    int err = 0;
    if (threaded) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&self->mu);
        while (self->state == FILLING) pthread_cond_wait(&self->cv, &self->mu);
        pthread_mutex_unlock(&self->mu);
        Py_END_ALLOW_THREADS
        got = self->got;
        err = self->err;
    } else { /* no thread in this process: read here */
        char *out = PyBytes_AS_STRING(self->buf);
        Py_BEGIN_ALLOW_THREADS
        got = read_at(self->fd, out, self->chunk, self->offset, &err);
        Py_END_ALLOW_THREADS
        if (got < 0) got = 0;
    }
    /* state is FILLED (or IDLE without a thread): buf is ours */
    if (err) {
        errno = err;
        if (threaded) refill(self); /* the next call reads the same place again */
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (got == 0) { /* the end: the thread rests; a later call reads itself (a file that grew) */
        if (threaded) {
            pthread_mutex_lock(&self->mu);
            self->state = IDLE;
            self->ended = 1;
            pthread_mutex_unlock(&self->mu);
        }
        return PyBytes_FromStringAndSize(NULL, 0);
    }
    PyObject *next = PyBytes_FromStringAndSize(NULL, self->chunk);
    if (next == NULL) return NULL;
    PyObject *out = self->buf;
    self->buf = next; /* (the thread waits while FILLED: the lock in refill orders these) */
    self->offset += got;
    if (threaded) refill(self);
    if (got < self->chunk && _PyBytes_Resize(&out, got) < 0) return NULL;
    return out;
}

static void stop(ReadAhead *self) {
    if (self->started) {
        if (self->pid == getpid()) {
            Py_BEGIN_ALLOW_THREADS
            pthread_mutex_lock(&self->mu);
            self->state = STOPPING;
            pthread_cond_broadcast(&self->cv);
            pthread_mutex_unlock(&self->mu);
            pthread_join(self->thread, NULL);
            Py_END_ALLOW_THREADS
        }
        self->started = 0;
    }
    if (self->fd >= 0) {
        close(self->fd);
        self->fd = -1;
    }
    Py_CLEAR(self->buf);
}

static PyObject *ReadAhead_close(ReadAhead *self, PyObject *unused) {
    stop(self);
    Py_RETURN_NONE;
}

static void ReadAhead_dealloc(ReadAhead *self) {
    stop(self);
    pthread_mutex_destroy(&self->mu);
    pthread_cond_destroy(&self->cv);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef ReadAhead_methods[] = {
    {"next", (PyCFunction)ReadAhead_next, METH_NOARGS, "the next chunk: bytes (b\"\" after the end)"},
    {"close", (PyCFunction)ReadAhead_close, METH_NOARGS, "stop the thread, close the copy of the file"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReadAheadType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "decoder._readahead.ReadAhead",
    .tp_basicsize = sizeof(ReadAhead),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ReadAhead(fd, offset, chunk): a file's chunks, the next one read on a thread",
    .tp_new = ReadAhead_new,
    .tp_init = (initproc)ReadAhead_init,
    .tp_dealloc = (destructor)ReadAhead_dealloc,
    .tp_methods = ReadAhead_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "decoder._readahead", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__readahead(void) {
    if (PyType_Ready(&ReadAheadType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&ReadAheadType);
    if (PyModule_AddObject(m, "ReadAhead", (PyObject *)&ReadAheadType) < 0) {
        Py_DECREF(&ReadAheadType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
