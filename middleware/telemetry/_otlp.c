/* middleware/telemetry/_otlp.c: the loop of `Encoder.attributes` (otlp_encoder.py), compiled.
 *
 * A sidestream span has 30-odd attributes, and encoding them was the largest Python function
 * a stream runs with telemetry on. The loop is the same, line for line (the Python lines as
 * comments above their C): each attribute is a dictionary hit in the tag's caches and, for a
 * number, its bytes; what is not in them is left to the encoder's own methods, which encode
 * it (and keep it): `miss` for a cache miss, `other` for a value of a kind never cached.
 * The test suite runs with and without this module, and tests/unit/test_core_twins.py runs
 * both loops on the same attributes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    char *data;
    Py_ssize_t size, room;
} Buffer;

static int put(Buffer *b, const char *data, Py_ssize_t n) {
    if (n == 0) return 0; /* nothing to copy: memcpy is not asked to take a NULL buffer */
    if (b->size + n > b->room) {
        Py_ssize_t room = (b->size + n) * 2;
        char *grown = PyMem_Realloc(b->data, room);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->data = grown;
        b->room = room;
    }
    memcpy(b->data + b->size, data, n);
    b->size += n;
    return 0;
}

/* Append an encoded attribute, which must be bytes: a cache's value or an encoder method's
 * answer (read as bytes, a bytearray there would be read past its end) */
static int put_found(Buffer *b, PyObject *found) {
    if (PyBytes_Check(found)) return put(b, PyBytes_AS_STRING(found), PyBytes_GET_SIZE(found));
    PyErr_SetString(PyExc_TypeError, "an encoded attribute must be bytes");
    return -1;
}

/* Append `bytes` (a new reference, or NULL on error: then -1), and release it */
static int put_bytes(Buffer *b, PyObject *bytes) {
    int r = bytes == NULL ? -1 : put_found(b, bytes);
    Py_XDECREF(bytes);
    return r;
}

/* `cache[key]` as a borrowed reference; NULL without an error when it is missing */
static PyObject *hit(PyObject *cache, PyObject *a, PyObject *b) {
    PyObject *key = b == NULL ? Py_NewRef(a) : PyTuple_Pack(2, a, b);
    if (key == NULL) return NULL;
    PyObject *found = PyDict_GetItemWithError(cache, key);
    Py_DECREF(key);
    return found;
}

/* def attributes(items, strings, doubles, ints, miss, other, tagged, tag) -> bytes */
static PyObject *attributes(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 8 || !PyDict_Check(args[1]) || !PyDict_Check(args[2]) || !PyDict_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "attributes(items, strings, doubles, ints, miss, other, tagged, tag)");
        return NULL;
    }
    PyObject *strings = args[1], *doubles = args[2], *ints = args[3];
    PyObject *miss = args[4], *other = args[5], *tagged = args[6], *tag = args[7];
    Buffer out = {NULL, 0, 0};
    PyObject *iter = PyObject_GetIter(args[0]), *item = NULL, *pair = NULL;
    if (iter == NULL) return NULL;
    /* for key, value in self._read.items(attributes): */
    while ((item = PyIter_Next(iter)) != NULL) {
        pair = PySequence_Tuple(item);
        Py_DECREF(item);
        if (pair == NULL) goto fail;
        if (PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_ValueError, "an attribute item is not a (key, value) pair");
            goto fail;
        }
        PyObject *key = PyTuple_GET_ITEM(pair, 0), *value = PyTuple_GET_ITEM(pair, 1);
        /* kind = type(value) */
        PyTypeObject *kind = Py_TYPE(value);
        PyObject *found = NULL;
        int cached = 1; /* of a kind the caches hold */
        /* if kind is str: parts.append(strings[key, value]) */
        /* (and below, for a flag or a tuple of strings: the same) */
        if (kind == &PyUnicode_Type || kind == &PyBool_Type || kind == &PyTuple_Type) {
            found = hit(strings, key, value);
            if (found != NULL && put_found(&out, found) < 0)
                goto fail;
        /* if kind is float: parts.append(doubles[key] + _double(value)) */
        } else if (kind == &PyFloat_Type) {
            found = hit(doubles, key, NULL);
            if (found != NULL) {
                unsigned char payload[8];
                if (PyFloat_Pack8(PyFloat_AS_DOUBLE(value), (char *)payload, 1) < 0 ||
                    put_found(&out, found) < 0 ||
                    put(&out, (const char *)payload, 8) < 0)
                    goto fail;
            }
        /* if kind is int and 0 <= value < 1 << 63: */
        } else if (kind == &PyLong_Type) {
            int overflow;
            long long n = PyLong_AsLongLongAndOverflow(value, &overflow);
            if (n == -1 && PyErr_Occurred()) goto fail;
            if (overflow || n < 0) {
                cached = 0;
            } else {
                /* payload = _BYTE[value] if value < 0x80 else _varint(value) */
                unsigned char payload[10];
                int size = 0;
                unsigned long long u = (unsigned long long)n;
                do {
                    payload[size++] = (unsigned char)((u & 0x7F) | (u >= 0x80 ? 0x80 : 0));
                    u >>= 7;
                } while (u);
                /* parts.append(ints[key, len(payload)] + payload) */
                PyObject *length = PyLong_FromLong(size);
                if (length == NULL) goto fail;
                found = hit(ints, key, length);
                Py_DECREF(length);
                if (found != NULL &&
                    (put_found(&out, found) < 0 ||
                     put(&out, (const char *)payload, size) < 0))
                    goto fail;
            }
        } else {
            cached = 0;
        }
        if (found == NULL && PyErr_Occurred()) goto fail;
        if (cached && found == NULL) {
            /* except KeyError: parts.append(self._miss(tagged, tag, key, value)) */
            PyObject *call[4] = {tagged, tag, key, value};
            if (put_bytes(&out, PyObject_Vectorcall(miss, call, 4, NULL)) < 0) goto fail;
        } else if (!cached) {
            /* parts.append(self._other(tag, key, value)) */
            PyObject *call[3] = {tag, key, value};
            if (put_bytes(&out, PyObject_Vectorcall(other, call, 3, NULL)) < 0) goto fail;
        }
        Py_CLEAR(pair);
    }
    if (PyErr_Occurred()) goto fail;
    Py_DECREF(iter);
    /* return b"".join(parts) */
    PyObject *joined = PyBytes_FromStringAndSize(out.data, out.size);
    PyMem_Free(out.data);
    return joined;
fail:
    Py_XDECREF(pair);
    Py_DECREF(iter);
    PyMem_Free(out.data);
    return NULL;
}

static PyMethodDef methods[] = {
    {"attributes", (PyCFunction)(void (*)(void))attributes, METH_FASTCALL,
     "Encoder.attributes' loop: each attribute's KeyValue field, joined"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "middleware.telemetry._otlp", NULL, -1, methods,
};

PyMODINIT_FUNC PyInit__otlp(void) { return PyModule_Create(&module_def); }
