/* middleware/_frame.c: `Frame` and `first_token` of middleware/frame.py, compiled.
 *
 * The same class, line for line: the same fields (as C members), `__init__` and `matches`,
 * each Python line as a comment above its C; and the same function. Read it beside
 * frame.py; a change to one is a change to the other (the test suite runs once with each:
 * SIDESTREAM_NO_EXTENSIONS=1 picks the Python one, and tests/unit/test_core_twins.py runs
 * both on the same bodies).
 *
 * Python's slices clamp and wrap their indices where C's would not: `slice` below does what
 * `body[i:j]` does, so that the two agree on any frame and any body, odd ones included.
 * A frame holds only bytes, so it takes no part in reference cycles (no GC header).
 */
#define _GNU_SOURCE /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    PyObject *prefix;
    PyObject *marker;
    PyObject *suffix;
    Py_ssize_t start;
    Py_ssize_t shortest;
    Py_ssize_t tail_len;
    char varies;
} Frame;

/* `body[i:j]` of a body `n` bytes long, as Python takes it: `*at` and the length */
static Py_ssize_t slice(Py_ssize_t n, Py_ssize_t i, Py_ssize_t j, Py_ssize_t *at) {
    if (i < 0) i = i + n < 0 ? 0 : i + n;
    else if (i > n) i = n;
    if (j < 0) j = j + n < 0 ? 0 : j + n;
    else if (j > n) j = n;
    *at = i;
    return j > i ? j - i : 0;
}

/* `body[i:j] == bytes` */
static int slice_is(const char *b, Py_ssize_t n, Py_ssize_t i, Py_ssize_t j, PyObject *bytes) {
    Py_ssize_t at, len = slice(n, i, j, &at);
    return len == PyBytes_GET_SIZE(bytes) && memcmp(b + at, PyBytes_AS_STRING(bytes), len) == 0;
}

/* `s.count(needle)`: occurrences that do not overlap, as bytes.count counts them. `memchr`
 * skips to each place the needle's first byte is: no other place can start it. */
static Py_ssize_t count(const char *s, Py_ssize_t n, const char *needle, Py_ssize_t m) {
    Py_ssize_t found = 0;
    const char *at = s, *end = s + n;
    while (end - at >= m && (at = memchr(at, needle[0], (size_t)(end - at - m + 1))) != NULL) {
        if (memcmp(at, needle, m) == 0) {
            found++;
            at += m;
        } else {
            at++;
        }
    }
    return found;
}

/* The bytes `bytes.rstrip()` takes: ASCII whitespace */
static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\x0b' || c == '\x0c';
}

/* def __init__(self, prefix, marker, suffix) */
static PyObject *Frame_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"prefix", "marker", "suffix", NULL};
    PyObject *prefix, *marker, *suffix;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "SSS:Frame", names, &prefix, &marker,
                                     &suffix))
        return NULL;
    Frame *self = (Frame *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    /* self.prefix = prefix */
    self->prefix = Py_NewRef(prefix);
    /* self.start = len(prefix) */
    self->start = PyBytes_GET_SIZE(prefix);
    /* self.marker = marker */
    self->marker = Py_NewRef(marker);
    /* self.suffix = suffix */
    self->suffix = Py_NewRef(suffix);
    /* self.tail_len = len(suffix) - len(marker) */
    self->tail_len = PyBytes_GET_SIZE(suffix) - PyBytes_GET_SIZE(marker);
    /* self.shortest = self.start + 1 + len(marker) + 2 */
    self->shortest = self->start + 1 + PyBytes_GET_SIZE(marker) + 2;
    /* self.varies = False */
    self->varies = 0;
    return (PyObject *)self;
}

/* def matches(self, body) -> bool */
static PyObject *Frame_matches(Frame *self, PyObject *body) {
    if (!PyBytes_Check(body)) {
        PyErr_SetString(PyExc_TypeError, "matches(body: bytes)");
        return NULL;
    }
    const char *b = PyBytes_AS_STRING(body);
    Py_ssize_t n = PyBytes_GET_SIZE(body);
    const char *prefix = PyBytes_AS_STRING(self->prefix);
    Py_ssize_t start = self->start;
    /* if not self.varies: */
    if (!self->varies) {
        /* rest = body.removeprefix(self.prefix)
         * content = rest.removesuffix(self.suffix)
         * if rest is not body and content is not rest and content and content[0] != 34:
         *     return LF not in content
         * (`rest is not body`: the prefix was there and not empty; `content is not rest`:
         * the suffix too; `content`: some bytes between them) */
        Py_ssize_t tail = PyBytes_GET_SIZE(self->suffix);
        Py_ssize_t size = n - start - tail;
        if (start > 0 && tail > 0 && size > 0 && memcmp(b, prefix, start) == 0 &&
            memcmp(b + n - tail, PyBytes_AS_STRING(self->suffix), tail) == 0 &&
            b[start] != '"')
            return PyBool_FromLong(memchr(b + start, '\n', size) == NULL);
    }
    /* if not (
     *     len(body) >= self.shortest
     *     and body.startswith(self.prefix)
     *     and LF not in body.rstrip()
     *     and body[self.start] != 34
     *     and body[-2:] == b"\n\n"
     * ):
     *     return False */
    if (n < self->shortest || memcmp(b, prefix, start) != 0) Py_RETURN_FALSE;
    Py_ssize_t stripped = n;
    while (stripped > 0 && is_space(b[stripped - 1])) stripped--;
    if (memchr(b, '\n', stripped) != NULL || b[start] == '"' || b[n - 2] != '\n' ||
        b[n - 1] != '\n')
        Py_RETURN_FALSE;
    /* marker = self.marker */
    PyObject *marker = self->marker;
    Py_ssize_t m = PyBytes_GET_SIZE(marker);
    /* close = len(body) - self.tail_len */
    Py_ssize_t close = n - self->tail_len;
    /* if body[close - len(marker) : close] != marker: */
    if (!slice_is(b, n, close - m, close, marker)) {
        /* close = body.rfind(b"}]") + 2 */
        Py_ssize_t found = n - 2;
        while (found >= 0 && !(b[found] == '}' && b[found + 1] == ']')) found--;
        close = found + 2;
        /* if close <= self.start or body[close - len(marker) : close] != marker: return False */
        if (close <= start || !slice_is(b, n, close - m, close, marker)) Py_RETURN_FALSE;
    }
    /* tail = body[close:] */
    Py_ssize_t at, size = slice(n, close, n, &at);
    /* usage = tail.count(b'"usage"')
     * if usage and usage != tail.count(b'"usage":null'): return False */
    Py_ssize_t usage = count(b + at, size, "\"usage\"", 7);
    if (usage && usage != count(b + at, size, "\"usage\":null", 12)) Py_RETURN_FALSE;
    /* self.varies = True */
    self->varies = 1;
    Py_RETURN_TRUE;
}

static void Frame_dealloc(Frame *self) {
    PyTypeObject *type = Py_TYPE(self);
    Py_XDECREF(self->prefix);
    Py_XDECREF(self->marker);
    Py_XDECREF(self->suffix);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyMemberDef Frame_members[] = {
    {"prefix", T_OBJECT_EX, offsetof(Frame, prefix), READONLY, NULL},
    {"marker", T_OBJECT_EX, offsetof(Frame, marker), READONLY, NULL},
    {"suffix", T_OBJECT_EX, offsetof(Frame, suffix), READONLY, NULL},
    {"start", T_PYSSIZET, offsetof(Frame, start), READONLY, NULL},
    {"shortest", T_PYSSIZET, offsetof(Frame, shortest), READONLY, NULL},
    {"tail_len", T_PYSSIZET, offsetof(Frame, tail_len), READONLY, NULL},
    {"varies", T_BOOL, offsetof(Frame, varies), 0, NULL},
    {NULL},
};

static PyMethodDef Frame_methods[] = {
    {"matches", (PyCFunction)Frame_matches, METH_O, NULL},
    {NULL},
};

static PyType_Slot Frame_slots[] = {
    {Py_tp_doc, "A stream's learned token chunk (middleware/frame.py, compiled)."},
    {Py_tp_new, Frame_new},
    {Py_tp_dealloc, Frame_dealloc},
    {Py_tp_members, Frame_members},
    {Py_tp_methods, Frame_methods},
    {0, NULL},
};

static PyType_Spec Frame_spec = {
    .name = "middleware._frame.Frame",
    .basicsize = sizeof(Frame),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = Frame_slots,
};

/* -- first_token ------------------------------------------------------------------------- */

/* `data.find(needle, start)` for bytes */
static Py_ssize_t find(PyObject *data, PyObject *needle, Py_ssize_t start) {
    Py_ssize_t n = PyBytes_GET_SIZE(data), m = PyBytes_GET_SIZE(needle);
    if (start > n) return -1;
    const char *at = memmem(PyBytes_AS_STRING(data) + start, (size_t)(n - start),
                            PyBytes_AS_STRING(needle), (size_t)m);
    return at == NULL ? -1 : at - PyBytes_AS_STRING(data);
}

/* def first_token(parts, literal, keys) -> bool | None */
static PyObject *first_token(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_Check(args[0]) || !PyBytes_Check(args[1]) ||
        !PyTuple_Check(args[2]) || PyTuple_GET_SIZE(args[2]) == 0) {
        PyErr_SetString(PyExc_TypeError, "first_token(parts: list, literal: bytes, keys: tuple)");
        return NULL;
    }
    PyObject *parts = args[0], *literal = args[1], *keys = args[2];
    Py_ssize_t nkeys = PyTuple_GET_SIZE(keys);
    for (Py_ssize_t k = 0; k < nkeys; k++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(keys, k))) {
            PyErr_SetString(PyExc_TypeError, "first_token: keys of bytes");
            return NULL;
        }
    }
    /* size = len(literal) */
    Py_ssize_t size = PyBytes_GET_SIZE(literal);
    /* for data in parts: */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(parts); i++) {
        PyObject *data = PyList_GET_ITEM(parts, i);
        if (!PyBytes_Check(data)) {
            PyErr_SetString(PyExc_TypeError, "first_token: parts of bytes");
            return NULL;
        }
        const char *b = PyBytes_AS_STRING(data);
        Py_ssize_t n = PyBytes_GET_SIZE(data);
        /* rest = keys */
        Py_ssize_t first_key = 0;
        /* at = data.find(literal) */
        Py_ssize_t at = find(data, literal, 0);
        /* if at >= 0: */
        if (at >= 0) {
            /* if data[at + size : at + size + 1] not in (b'"', b""): return True */
            if (at + size < n && b[at + size] != '"') Py_RETURN_TRUE;
            /* if data.find(keys[0]) == at and data.find(keys[0], at + 1) < 0:
             *     rest = keys[1:] */
            PyObject *key = PyTuple_GET_ITEM(keys, 0);
            if (find(data, key, 0) == at && find(data, key, at + 1) < 0) first_key = 1;
        }
        /* for key in rest: if data.find(key) >= 0: return None */
        for (Py_ssize_t k = first_key; k < nkeys; k++) {
            if (find(data, PyTuple_GET_ITEM(keys, k), 0) >= 0) Py_RETURN_NONE;
        }
    }
    /* return False */
    Py_RETURN_FALSE;
}

static PyMethodDef module_methods[] = {
    {"first_token", (PyCFunction)(void (*)(void))first_token, METH_FASTCALL,
     "first_token(parts, literal, keys): middleware.frame.first_token, compiled."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "middleware._frame", NULL, -1, module_methods,
};

PyMODINIT_FUNC PyInit__frame(void) {
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    PyObject *type = PyType_FromSpec(&Frame_spec);
    if (type == NULL || PyModule_AddObject(module, "Frame", type) < 0) {
        Py_XDECREF(type);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
