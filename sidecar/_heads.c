/* The compiled twin of `sidecar/servers/response_head.py`'s `_response_head`: the HTTP/1.1
 * response head the traffic listener writes, by uvicorn's rules. Read it beside the Python
 * twin; the rules are listed in that module's docstring.
 *
 * It takes the usual head: a list or tuple of (bytes, bytes) tuples, an int status, no bad
 * byte. Any other head — a bad byte, a name or value not exactly bytes, an item not a
 * 2-tuple, a status not exactly an int — is handed to the Python twin whole, which writes
 * it as uvicorn does or raises what uvicorn raises, at the header where uvicorn raises it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static PyObject *STATUS_LINES = NULL; /* the Python module's, status -> status line */
static PyObject *PYTHON_TWIN = NULL;  /* its `_response_head` */
static PyObject *ZERO = NULL;

static unsigned char BAD_NAME[256];  /* `_BAD_NAME`: controls, DEL, delimiters but / and ? */
static unsigned char BAD_VALUE[256]; /* `_BAD_VALUE`: controls but tab, DEL */

static const char CLOSE[] = "connection: close\r\n";
static const char CHUNKED[] = "transfer-encoding: chunked\r\n";

/* The Python module, at the first head (it imports this one while it loads) */
static int load_twin(void) {
    if (PYTHON_TWIN != NULL) return 0;
    PyObject *module = PyImport_ImportModule("sidecar.servers.response_head");
    if (module == NULL) return -1;
    STATUS_LINES = PyObject_GetAttrString(module, "STATUS_LINES");
    PYTHON_TWIN = STATUS_LINES ? PyObject_GetAttrString(module, "_response_head") : NULL;
    Py_DECREF(module);
    if (PYTHON_TWIN == NULL) {
        Py_CLEAR(STATUS_LINES);
        return -1;
    }
    return 0;
}

static int any_bad(const unsigned char *table, const char *bytes, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (table[(unsigned char)bytes[i]]) return 1;
    return 0;
}

/* `a == b.lower()` for an a already lower-case: bytes.lower maps A-Z only */
static int lower_equals(const char *b, Py_ssize_t n, const char *a) {
    if ((size_t)n != strlen(a)) return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (Py_TOLOWER((unsigned char)b[i]) != (unsigned char)a[i]) return 0;
    return 1;
}

static int is_space(unsigned char c) { /* bytes.strip()'s: ASCII whitespace */
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\x0b' || c == '\x0c';
}

/* `_says_close`: `close` among the comma-separated tokens, stripped and lower-cased */
static int says_close(const char *value, Py_ssize_t n) {
    Py_ssize_t start = 0;
    while (start <= n) {
        Py_ssize_t end = start;
        while (end < n && value[end] != ',') end++;
        Py_ssize_t a = start, b = end;
        while (a < b && is_space((unsigned char)value[a])) a++;
        while (b > a && is_space((unsigned char)value[b - 1])) b--;
        if (lower_equals(value + a, b - a, "close")) return 1;
        start = end + 1;
    }
    return 0;
}

/* `_framing` for one header, `name` not yet lower-cased; *length is a new reference */
static int framing(PyObject *name, PyObject *value, int *chunked, PyObject **length, int *close) {
    const char *n = PyBytes_AS_STRING(name), *v = PyBytes_AS_STRING(value);
    Py_ssize_t nn = PyBytes_GET_SIZE(name), vn = PyBytes_GET_SIZE(value);
    if (*chunked < 0 && lower_equals(n, nn, "content-length")) {
        PyObject *text = PyUnicode_DecodeUTF8(v, vn, NULL); /* value.decode() */
        if (text == NULL) return -1;
        PyObject *parsed = PyLong_FromUnicodeObject(text, 10); /* int(...) */
        Py_DECREF(text);
        if (parsed == NULL) return -1;
        Py_SETREF(*length, parsed);
        *chunked = 0;
    } else if (lower_equals(n, nn, "transfer-encoding") && lower_equals(v, vn, "chunked")) {
        Py_SETREF(*length, Py_NewRef(ZERO));
        *chunked = 1;
    } else if (lower_equals(n, nn, "connection") && says_close(v, vn)) {
        *close = 1;
    }
    return 0;
}

/* response_head(status, headers, keep_alive, head_request) -> (head, chunked, length, keep) */
static PyObject *response_head(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "response_head takes 4 arguments");
        return NULL;
    }
    if (load_twin() < 0) return NULL;
    PyObject *status = args[0], *headers = args[1];
    if (!PyLong_CheckExact(status) || !(PyList_CheckExact(headers) || PyTuple_CheckExact(headers)))
        return PyObject_Vectorcall(PYTHON_TWIN, args, nargs, NULL);
    int keep_alive = PyObject_IsTrue(args[2]), head_request = PyObject_IsTrue(args[3]);
    if (keep_alive < 0 || head_request < 0) return NULL;
    PyObject *status_line = PyObject_GetItem(STATUS_LINES, status); /* KeyError, as [] */
    if (status_line == NULL) return NULL;

    /* First pass: the shape, the bytes, the framing, the size */
    Py_ssize_t count = PySequence_Fast_GET_SIZE(headers);
    PyObject **items = PySequence_Fast_ITEMS(headers);
    Py_ssize_t size = PyBytes_GET_SIZE(status_line) + 2;
    int chunked = -1, close = 0; /* chunked: -1 not decided (None) */
    PyObject *length = Py_NewRef(ZERO);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = items[i];
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2) goto python;
        PyObject *name = PyTuple_GET_ITEM(item, 0), *value = PyTuple_GET_ITEM(item, 1);
        if (!PyBytes_CheckExact(name) || !PyBytes_CheckExact(value)) goto python;
        if (any_bad(BAD_NAME, PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name)) ||
            any_bad(BAD_VALUE, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value)))
            goto python; /* raises, at the first bad header */
        size += PyBytes_GET_SIZE(name) + PyBytes_GET_SIZE(value) + 4;
    }
    /* Framing in a pass of its own: as in the Python twin, a bad byte anywhere is
     * refused before a Content-Length that is not a number */
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = items[i];
        if (framing(PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1), &chunked, &length,
                    &close) < 0)
            goto fail;
    }
    int keep = keep_alive && !close;
    int add_close = !keep && !close;
    long code = PyLong_AsLong(status); /* in 100..599: it has a status line */
    int add_chunked = chunked < 0 && !head_request && code != 204 && code != 304;
    if (add_close) size += sizeof CLOSE - 1;
    if (add_chunked) {
        size += sizeof CHUNKED - 1;
        chunked = 1;
    }

    /* Second pass: the bytes */
    PyObject *head = PyBytes_FromStringAndSize(NULL, size);
    if (head == NULL) goto fail;
    char *out = PyBytes_AS_STRING(head);
    memcpy(out, PyBytes_AS_STRING(status_line), PyBytes_GET_SIZE(status_line));
    out += PyBytes_GET_SIZE(status_line);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(items[i], 0), *value = PyTuple_GET_ITEM(items[i], 1);
        const char *n = PyBytes_AS_STRING(name);
        for (Py_ssize_t j = 0; j < PyBytes_GET_SIZE(name); j++)
            *out++ = (char)Py_TOLOWER((unsigned char)n[j]);
        *out++ = ':';
        *out++ = ' ';
        memcpy(out, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value));
        out += PyBytes_GET_SIZE(value);
        *out++ = '\r';
        *out++ = '\n';
    }
    if (add_close) {
        memcpy(out, CLOSE, sizeof CLOSE - 1);
        out += sizeof CLOSE - 1;
    }
    if (add_chunked) {
        memcpy(out, CHUNKED, sizeof CHUNKED - 1);
        out += sizeof CHUNKED - 1;
    }
    *out++ = '\r';
    *out++ = '\n';
    Py_DECREF(status_line);
    PyObject *framed = chunked < 0 ? Py_None : chunked ? Py_True : Py_False;
    PyObject *result = PyTuple_Pack(4, head, framed, length, keep ? Py_True : Py_False);
    Py_DECREF(head);
    Py_DECREF(length);
    return result;

python:
    Py_DECREF(status_line);
    Py_DECREF(length);
    return PyObject_Vectorcall(PYTHON_TWIN, args, nargs, NULL);
fail:
    Py_DECREF(status_line);
    Py_DECREF(length);
    return NULL;
}

static PyMethodDef methods[] = {
    {"response_head", (PyCFunction)(void (*)(void))response_head, METH_FASTCALL,
     "response_head(status, headers, keep_alive, head_request): the compiled twin of "
     "sidecar.servers.response_head._response_head."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "sidecar._heads", "The compiled twin of response_head.", -1, methods,
};

PyMODINIT_FUNC PyInit__heads(void) {
    for (int c = 0; c < 256; c++) {
        BAD_NAME[c] = c < 0x20 || c == 0x7f || (c && strchr("()<>@,;:[]={} \t\\\"", c));
        BAD_VALUE[c] = (c < 0x20 && c != '\t') || c == 0x7f;
    }
    ZERO = PyLong_FromLong(0);
    if (ZERO == NULL) return NULL;
    return PyModule_Create(&module_def);
}
