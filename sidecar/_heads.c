/* The compiled twins of `sidecar/head_rules.py`, the head rules on the path to each stream's
 * first token:
 *
 * - `response_head`: the HTTP/1.1 response head the traffic listener writes, by uvicorn's
 *   rules;
 * - `request_rules`: what the proxy asks of a client request's headers (its size, a framing
 *   problem, its Content-Length, chunked or not, and the headers to send upstream), and
 *   `response_headers` (the upstream's response headers to send downstream);
 * - `read_headers`: a request's headers as uvicorn reads them (names lower-cased, values
 *   right-stripped).
 *
 * Read each beside its Python twin, where the rules are written out. Each takes the usual
 * headers: a list or tuple of (bytes, bytes) tuples. Anything else — a name or value not
 * exactly bytes, an item not a 2-tuple, and for the response head a bad byte or a status
 * not exactly an int — is handed to the Python twin whole, which does what it always did
 * (writes it as uvicorn does, or raises what uvicorn raises where uvicorn raises it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static PyObject *STATUS_LINES = NULL; /* the Python module's, status -> status line */
static PyObject *PYTHON_TWIN = NULL;  /* its `response_head` */
static PyObject *ZERO = NULL;
/* sidecar.head_rules: `request_rules`, `HOP_BY_HOP`, `DROPPED` */
static PyObject *RULES_TWIN = NULL, *HOP_BY_HOP = NULL, *DROPPED = NULL;
static PyObject *RESPONSE_TWIN = NULL; /* sidecar.head_rules.response_headers */
static PyObject *READ_TWIN = NULL; /* sidecar.head_rules.read_headers */
static PyObject *STR_JOIN = NULL; /* "join" */
static PyObject *HOST, *ACCEPT_ENCODING, *IDENTITY, *X_FORWARDED_FOR, *X_FORWARDED_PROTO,
    *X_FORWARDED_HOST, *COMMA_SPACE, *VERSIONS[3];

static unsigned char BAD_NAME[256];  /* `_BAD_NAME`: controls, DEL, delimiters but / and ? */
static unsigned char BAD_VALUE[256]; /* `_BAD_VALUE`: controls but tab, DEL */

static const char CLOSE[] = "connection: close\r\n";
static const char CHUNKED[] = "transfer-encoding: chunked\r\n";

/* The Python twin's module, at the first head */
static int load_twin(void) {
    if (PYTHON_TWIN != NULL) return 0;
    PyObject *module = PyImport_ImportModule("sidecar.head_rules");
    if (module == NULL) return -1;
    STATUS_LINES = PyObject_GetAttrString(module, "STATUS_LINES");
    PYTHON_TWIN = STATUS_LINES ? PyObject_GetAttrString(module, "response_head") : NULL;
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

/* `token` among the comma-separated tokens, stripped and lower-cased (`_says_close`'s
 * `close`; `request_problem`'s framing names in Connection) */
static int lists(const char *value, Py_ssize_t n, const char *token) {
    Py_ssize_t start = 0;
    while (start <= n) {
        Py_ssize_t end = start;
        while (end < n && value[end] != ',') end++;
        Py_ssize_t a = start, b = end;
        while (a < b && is_space((unsigned char)value[a])) a++;
        while (b > a && is_space((unsigned char)value[b - 1])) b--;
        if (lower_equals(value + a, b - a, token)) return 1;
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
    } else if (lower_equals(n, nn, "connection") && lists(v, vn, "close")) {
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

/* ---- request_rules ------------------------------------------------------------------- */

/* The names of the two constant sets (`HOP_BY_HOP`, `DROPPED`), as C strings: `name in
 * set` for a name read from a request (a new bytes object, its hash not yet computed) is a
 * few length checks and compares, not a hash of it. `count` -1: not listed (a set member
 * not bytes, or too many), and the set is asked. */
#define MAX_LISTED 32
typedef struct {
    Py_ssize_t count;
    Py_ssize_t size[MAX_LISTED];
    const char *text[MAX_LISTED]; /* the set's own bytes: the set is held for good */
} Listed;
static Listed HOP_LISTED, DROPPED_LISTED;

static int list_names(PyObject *set, Listed *listed) {
    listed->count = 0;
    PyObject *iter = PyObject_GetIter(set), *name;
    if (iter == NULL) return -1;
    while ((name = PyIter_Next(iter)) != NULL) {
        if (!PyBytes_CheckExact(name) || listed->count == MAX_LISTED) listed->count = -1;
        if (listed->count >= 0) {
            listed->size[listed->count] = PyBytes_GET_SIZE(name);
            listed->text[listed->count++] = PyBytes_AS_STRING(name);
        }
        Py_DECREF(name);
    }
    Py_DECREF(iter);
    return PyErr_Occurred() ? -1 : 0;
}

/* `name in set`: 1, 0, or -1 on error. Either constant set by its list; any other (one a
 * Connection header added names to) asked itself. */
static int set_has(PyObject *set, PyObject *name) {
    Listed *listed = set == DROPPED ? &DROPPED_LISTED : set == HOP_BY_HOP ? &HOP_LISTED : NULL;
    if (listed == NULL || listed->count < 0) return PySet_Contains(set, name);
    Py_ssize_t size = PyBytes_GET_SIZE(name);
    const char *text = PyBytes_AS_STRING(name);
    for (Py_ssize_t i = 0; i < listed->count; i++)
        if (listed->size[i] == size && memcmp(listed->text[i], text, size) == 0) return 1;
    return 0;
}

/* sidecar.head_rules, at the first request */
static int load_rules(void) {
    if (RULES_TWIN != NULL) return 0;
    PyObject *module = PyImport_ImportModule("sidecar.head_rules");
    if (module == NULL) return -1;
    HOP_BY_HOP = PyObject_GetAttrString(module, "HOP_BY_HOP");
    DROPPED = HOP_BY_HOP ? PyObject_GetAttrString(module, "DROPPED") : NULL;
    RULES_TWIN = DROPPED ? PyObject_GetAttrString(module, "request_rules") : NULL;
    RESPONSE_TWIN = RULES_TWIN ? PyObject_GetAttrString(module, "response_headers") : NULL;
    Py_DECREF(module);
    if (RESPONSE_TWIN == NULL || list_names(HOP_BY_HOP, &HOP_LISTED) < 0 ||
        list_names(DROPPED, &DROPPED_LISTED) < 0) {
        Py_CLEAR(HOP_BY_HOP);
        Py_CLEAR(DROPPED);
        Py_CLEAR(RULES_TWIN);
        Py_CLEAR(RESPONSE_TWIN);
        return -1;
    }
    return 0;
}

static int bytes_equal(PyObject *b, const char *text) {
    return (size_t)PyBytes_GET_SIZE(b) == strlen(text) &&
           memcmp(PyBytes_AS_STRING(b), text, PyBytes_GET_SIZE(b)) == 0;
}

/* `name.lower()`, the same object when it has no capital */
static PyObject *lowered(PyObject *name) {
    const char *n = PyBytes_AS_STRING(name);
    Py_ssize_t size = PyBytes_GET_SIZE(name), i = 0;
    while (i < size && !Py_ISUPPER((unsigned char)n[i])) i++;
    if (i == size) return Py_NewRef(name);
    /* a fresh object, written here: given the bytes, CPython hands back its shared
     * one-byte object, which lower-casing in place would change for the whole process */
    PyObject *lower = PyBytes_FromStringAndSize(NULL, size);
    if (lower == NULL) return NULL;
    char *out = PyBytes_AS_STRING(lower);
    memcpy(out, n, i);
    for (; i < size; i++) out[i] = (char)Py_TOLOWER((unsigned char)n[i]);
    return lower;
}

/* The bounds of `value`'s last comma-separated part, stripped: `_codings(...)[-1]` */
static int last_coding_is_chunked(PyObject *value) {
    const char *v = PyBytes_AS_STRING(value);
    Py_ssize_t end = PyBytes_GET_SIZE(value), start = end;
    while (start > 0 && v[start - 1] != ',') start--;
    while (start < end && is_space((unsigned char)v[start])) start++;
    while (end > start && is_space((unsigned char)v[end - 1])) end--;
    return lower_equals(v + start, end - start, "chunked");
}

/* `declared_length`: ASCII digits around ASCII whitespace, at most 19 of them after
 * leading zeros, into *length; 0 when the value is anything else */
static int declared_length(PyObject *value, unsigned long long *length) {
    const char *v = PyBytes_AS_STRING(value);
    Py_ssize_t end = PyBytes_GET_SIZE(value), start = 0, significant = 0;
    while (start < end && is_space((unsigned char)v[start])) start++;
    while (end > start && is_space((unsigned char)v[end - 1])) end--;
    *length = 0;
    for (Py_ssize_t i = start; i < end; i++) {
        if (v[i] < '0' || v[i] > '9' || (significant += *length || v[i] != '0') > 19) return 0;
        *length = *length * 10 + (unsigned long long)(v[i] - '0');
    }
    return start < end;
}

/* `connection_tokens`: every comma-separated token of every Connection header, stripped,
 * lower-cased, into `tokens` */
static int add_tokens(PyObject *tokens, PyObject *value) {
    const char *v = PyBytes_AS_STRING(value);
    Py_ssize_t size = PyBytes_GET_SIZE(value), start = 0;
    while (start <= size) {
        Py_ssize_t end = start;
        while (end < size && v[end] != ',') end++;
        Py_ssize_t a = start, b = end;
        while (a < b && is_space((unsigned char)v[a])) a++;
        while (b > a && is_space((unsigned char)v[b - 1])) b--;
        if (b > a) {
            PyObject *token = PyBytes_FromStringAndSize(NULL, b - a); /* fresh: see lowered */
            if (token == NULL) return -1;
            char *t = PyBytes_AS_STRING(token);
            for (Py_ssize_t i = 0; i < b - a; i++) t[i] = (char)Py_TOLOWER((unsigned char)v[a + i]);
            int added = PySet_Add(tokens, token);
            Py_DECREF(token);
            if (added < 0) return -1;
        }
        start = end + 1;
    }
    return 0;
}

/* The usual headers: a list or tuple of (bytes, bytes) tuples. Anything else goes to the
 * Python twin. */
static int usual_pairs(PyObject *headers) {
    if (!(PyList_CheckExact(headers) || PyTuple_CheckExact(headers))) return 0;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(headers);
    PyObject **items = PySequence_Fast_ITEMS(headers);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = items[i];
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2 ||
            !PyBytes_CheckExact(PyTuple_GET_ITEM(item, 0)) ||
            !PyBytes_CheckExact(PyTuple_GET_ITEM(item, 1)))
            return 0;
    }
    return 1;
}

/* `_hop_by_hop`: the nine, and the names every Connection header lists (a new reference) */
static PyObject *hop_by_hop(PyObject **items, PyObject *names, Py_ssize_t count, int connection) {
    if (!connection) return Py_NewRef(HOP_BY_HOP);
    PyObject *hop = PySet_New(HOP_BY_HOP);
    for (Py_ssize_t i = 0; hop != NULL && i < count; i++)
        if (bytes_equal(PyList_GET_ITEM(names, i), "connection") &&
            add_tokens(hop, PyTuple_GET_ITEM(items[i], 1)) < 0)
            Py_CLEAR(hop);
    return hop;
}

static int append_pair(PyObject *list, PyObject *name, PyObject *value) {
    PyObject *pair = PyTuple_Pack(2, name, value);
    if (pair == NULL) return -1;
    int appended = PyList_Append(list, pair);
    Py_DECREF(pair);
    return appended;
}

/* `forwarded_for`: the client's values (stripped, empty ones left out), then the peer */
static PyObject *forwarded_for(PyObject *prior, PyObject *client) {
    PyObject *parts = PyList_New(0);
    if (parts == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(prior); i++) {
        PyObject *part = PyObject_CallMethod(PyList_GET_ITEM(prior, i), "strip", NULL);
        if (part == NULL || (PyBytes_GET_SIZE(part) && PyList_Append(parts, part) < 0)) {
            Py_XDECREF(part);
            Py_DECREF(parts);
            return NULL;
        }
        Py_DECREF(part);
    }
    int peer = PyObject_IsTrue(client);
    if (peer < 0) goto fail;
    if (peer) {
        PyObject *encoded = PyUnicode_AsLatin1String(client);
        if (encoded == NULL) goto fail;
        int appended = PyList_Append(parts, encoded);
        Py_DECREF(encoded);
        if (appended < 0) goto fail;
    }
    if (PyList_GET_SIZE(parts) == 0) {
        Py_DECREF(parts);
        Py_RETURN_NONE;
    }
    /* b", ".join(parts): one part (the peer alone, the usual) is what join gives for it */
    PyObject *joined = PyList_GET_SIZE(parts) == 1
                           ? Py_NewRef(PyList_GET_ITEM(parts, 0))
                           : PyObject_CallMethodOneArg(COMMA_SPACE, STR_JOIN, parts);
    Py_DECREF(parts);
    return joined;
fail:
    Py_DECREF(parts);
    return NULL;
}

/* What the request's header lines hold, in one pass */
typedef struct {
    Py_ssize_t size, lengths, first_length, encodings, last_encoding, hosts, first_host;
    int bad_byte, connection, forwarded, framing_named;
} Seen;

static PyObject *problem_of(Seen *seen, PyObject **items, PyObject *version) {
    int known = 0;
    unsigned long long length;
    for (int i = 0; i < 3; i++) {
        int equal = PyUnicode_Compare(version, VERSIONS[i]);
        if (equal == -1 && PyErr_Occurred()) return NULL;
        known |= equal == 0;
    }
    const char *problem = NULL;
    if (!known) return PyUnicode_FromFormat("HTTP version %R is not served", version);
    if (seen->bad_byte)
        problem = "a header contains a control character";
    else if (seen->framing_named)
        problem = "Connection names Content-Length, Transfer-Encoding or Host";
    else if (seen->lengths && seen->encodings)
        problem = "both Content-Length and Transfer-Encoding";
    else if (seen->lengths > 1)
        problem = "more than one Content-Length";
    else if (seen->lengths &&
             !declared_length(PyTuple_GET_ITEM(items[seen->first_length], 1), &length))
        problem = "Content-Length is not a number of at most 19 digits";
    else if (seen->encodings &&
             !last_coding_is_chunked(PyTuple_GET_ITEM(items[seen->last_encoding], 1)))
        problem = "Transfer-Encoding does not end in chunked";
    else if (seen->hosts > 1 ||
             (seen->hosts == 0 && PyUnicode_CompareWithASCIIString(version, "1.1") == 0))
        problem = "an HTTP/1.1 request needs exactly one Host";
    if (problem == NULL) Py_RETURN_NONE;
    return PyUnicode_FromString(problem);
}

/* The headers to send upstream: `request_headers` */
static PyObject *upstream_headers(Seen *seen, PyObject **items, PyObject *names, Py_ssize_t count,
                                  PyObject *authority, PyObject *client, PyObject *scheme) {
    PyObject *hop = hop_by_hop(items, names, count, seen->connection), *out = NULL;
    PyObject *drop = NULL, *prior = NULL, *xff = NULL, *proto = NULL;
    if (hop == NULL) return NULL;
    /* with the headers the proxy sets itself: `_DROPPED` when Connection lists nothing */
    drop = seen->connection ? PyNumber_Or(hop, DROPPED) : Py_NewRef(DROPPED);
    if (drop == NULL) goto done;
    out = PyList_New(0);
    if (out == NULL || append_pair(out, HOST, authority) < 0) goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyList_GET_ITEM(names, i);
        int dropped = set_has(drop, name);
        if (dropped < 0 || (!dropped && append_pair(out, name, PyTuple_GET_ITEM(items[i], 1)) < 0))
            goto fail;
    }
    if (append_pair(out, ACCEPT_ENCODING, IDENTITY) < 0) goto fail;
    prior = PyList_New(0);
    if (prior == NULL) goto fail;
    int hop_xff = seen->forwarded ? PySet_Contains(hop, X_FORWARDED_FOR) : 1;
    if (hop_xff < 0) goto fail;
    for (Py_ssize_t i = 0; !hop_xff && i < count; i++)
        if (bytes_equal(PyList_GET_ITEM(names, i), "x-forwarded-for") &&
            PyList_Append(prior, PyTuple_GET_ITEM(items[i], 1)) < 0)
            goto fail;
    xff = forwarded_for(prior, client);
    if (xff == NULL || (xff != Py_None && append_pair(out, X_FORWARDED_FOR, xff) < 0)) goto fail;
    proto = PyUnicode_AsLatin1String(scheme);
    if (proto == NULL || append_pair(out, X_FORWARDED_PROTO, proto) < 0) goto fail;
    int hop_host = seen->hosts ? PySet_Contains(hop, HOST) : 1;
    if (hop_host < 0) goto fail;
    if (!hop_host &&
        append_pair(out, X_FORWARDED_HOST, PyTuple_GET_ITEM(items[seen->first_host], 1)) < 0)
        goto fail;
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_XDECREF(hop);
    Py_XDECREF(drop);
    Py_XDECREF(prior);
    Py_XDECREF(xff);
    Py_XDECREF(proto);
    return out;
}

/* request_rules(headers, http_version, authority, client, scheme)
 *   -> (size, problem, content_length, chunked, upstream_headers) */
static PyObject *request_rules(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "request_rules takes 5 arguments");
        return NULL;
    }
    if (load_rules() < 0) return NULL;
    PyObject *headers = args[0], *version = args[1], *scheme = args[4];
    if (!usual_pairs(headers) || !PyUnicode_CheckExact(version) ||
        !PyUnicode_CheckExact(scheme) || !(args[3] == Py_None || PyUnicode_CheckExact(args[3])))
        return PyObject_Vectorcall(RULES_TWIN, args, nargs, NULL);
    Py_ssize_t count = PySequence_Fast_GET_SIZE(headers);
    PyObject **items = PySequence_Fast_ITEMS(headers);
    PyObject *names = PyList_New(count), *problem = NULL, *declared = NULL, *upstream = NULL;
    if (names == NULL) return NULL;
    Seen seen = {0};
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(items[i], 0), *value = PyTuple_GET_ITEM(items[i], 1);
        PyObject *lower = lowered(name);
        if (lower == NULL) goto fail;
        PyList_SET_ITEM(names, i, lower);
        seen.size += PyBytes_GET_SIZE(name) + PyBytes_GET_SIZE(value) + 4;
        const char *v = PyBytes_AS_STRING(value);
        Py_ssize_t vn = PyBytes_GET_SIZE(value);
        seen.bad_byte |= any_bad(BAD_NAME, PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name)) ||
                         any_bad(BAD_VALUE, v, vn);
        if (bytes_equal(lower, "content-length")) {
            if (!seen.lengths++) seen.first_length = i;
        } else if (bytes_equal(lower, "transfer-encoding")) {
            seen.encodings++;
            seen.last_encoding = i;
        } else if (bytes_equal(lower, "host")) {
            if (!seen.hosts++) seen.first_host = i;
        } else if (bytes_equal(lower, "connection")) {
            seen.connection = 1;
            seen.framing_named |= lists(v, vn, "content-length") ||
                                  lists(v, vn, "transfer-encoding") || lists(v, vn, "host");
        } else if (bytes_equal(lower, "x-forwarded-for")) {
            seen.forwarded = 1;
        }
    }
    problem = problem_of(&seen, items, version);
    if (problem == NULL) goto fail;
    unsigned long long length; /* the first's number, None when it is not one */
    declared = seen.lengths && declared_length(PyTuple_GET_ITEM(items[seen.first_length], 1),
                                               &length)
                   ? PyLong_FromUnsignedLongLong(length)
                   : Py_NewRef(Py_None);
    if (declared == NULL) goto fail;
    int chunked =
        seen.encodings && last_coding_is_chunked(PyTuple_GET_ITEM(items[seen.last_encoding], 1));
    upstream = upstream_headers(&seen, items, names, count, args[2], args[3], scheme);
    if (upstream == NULL) goto fail;
    PyObject *size = PyLong_FromSsize_t(seen.size);
    if (size == NULL) goto fail;
    PyObject *result =
        PyTuple_Pack(5, size, problem, declared, chunked ? Py_True : Py_False, upstream);
    Py_DECREF(size);
    Py_DECREF(names);
    Py_DECREF(problem);
    Py_DECREF(declared);
    Py_DECREF(upstream);
    return result;
fail:
    Py_DECREF(names);
    Py_XDECREF(problem);
    Py_XDECREF(declared);
    Py_XDECREF(upstream);
    return NULL;
}

/* ---- response_headers ---------------------------------------------------------------- */

/* response_headers(headers): the upstream's response headers to send downstream, as
 * `strip_hop_by_hop` makes them: names lower-cased, hop-by-hop ones and those named in
 * Connection dropped */
static PyObject *response_headers(PyObject *module, PyObject *headers) {
    if (load_rules() < 0) return NULL;
    if (!usual_pairs(headers)) return PyObject_CallOneArg(RESPONSE_TWIN, headers);
    Py_ssize_t count = PySequence_Fast_GET_SIZE(headers);
    PyObject **items = PySequence_Fast_ITEMS(headers);
    PyObject *names = PyList_New(count), *hop = NULL, *out = NULL;
    if (names == NULL) goto done;
    int connection = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *lower = lowered(PyTuple_GET_ITEM(items[i], 0));
        if (lower == NULL) goto done;
        PyList_SET_ITEM(names, i, lower);
        connection |= bytes_equal(lower, "connection");
    }
    hop = hop_by_hop(items, names, count, connection);
    if (hop == NULL) goto done;
    out = PyList_New(0);
    if (out == NULL) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyList_GET_ITEM(names, i), *item = items[i];
        int dropped = set_has(hop, name);
        if (dropped < 0) goto fail;
        if (dropped) continue;
        int appended = name == PyTuple_GET_ITEM(item, 0) /* lower-case already: the pair */
                           ? PyList_Append(out, item)
                           : append_pair(out, name, PyTuple_GET_ITEM(item, 1));
        if (appended < 0) goto fail;
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_XDECREF(names);
    Py_XDECREF(hop);
    return out;
}

/* ---- read_headers -------------------------------------------------------------------- */

/* read_headers(headers) -> expect 100-continue? The list is rewritten in place: each name
 * lower-cased, each value without the blanks (space, tab) llhttp leaves at its end. */
static PyObject *read_headers(PyObject *module, PyObject *headers) {
    if (READ_TWIN == NULL) {
        PyObject *twin = PyImport_ImportModule("sidecar.head_rules");
        if (twin == NULL) return NULL;
        READ_TWIN = PyObject_GetAttrString(twin, "read_headers");
        Py_DECREF(twin);
        if (READ_TWIN == NULL) return NULL;
    }
    if (!PyList_CheckExact(headers) || PyList_GET_SIZE(headers) == 0 || !usual_pairs(headers))
        return PyObject_CallOneArg(READ_TWIN, headers);
    Py_ssize_t count = PyList_GET_SIZE(headers);
    int expect = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(headers, i);
        PyObject *name = PyTuple_GET_ITEM(item, 0), *value = PyTuple_GET_ITEM(item, 1);
        const char *v = PyBytes_AS_STRING(value);
        Py_ssize_t size = PyBytes_GET_SIZE(value), end = size;
        while (end > 0 && (v[end - 1] == ' ' || v[end - 1] == '\t')) end--;
        PyObject *lower = lowered(name);
        if (lower == NULL) return NULL;
        int is_expect = bytes_equal(lower, "expect");
        expect |= is_expect && lower_equals(v, end, "100-continue");
        if (lower == name && end == size) { /* as read: the pair stays */
            Py_DECREF(lower);
            continue;
        }
        PyObject *stripped = end == size ? Py_NewRef(value) : PyBytes_FromStringAndSize(v, end);
        PyObject *pair = stripped ? PyTuple_Pack(2, lower, stripped) : NULL;
        Py_DECREF(lower);
        Py_XDECREF(stripped);
        if (pair == NULL) return NULL;
        PyList_SET_ITEM(headers, i, pair); /* the list's old pair let go */
        Py_DECREF(item);
    }
    return PyBool_FromLong(expect);
}

static PyMethodDef methods[] = {
    {"response_head", (PyCFunction)(void (*)(void))response_head, METH_FASTCALL,
     "response_head(status, headers, keep_alive, head_request): the compiled twin of "
     "sidecar.head_rules.response_head."},
    {"request_rules", (PyCFunction)(void (*)(void))request_rules, METH_FASTCALL,
     "request_rules(headers, http_version, authority, client, scheme): the compiled twin of "
     "sidecar.head_rules.request_rules."},
    {"response_headers", (PyCFunction)response_headers, METH_O,
     "response_headers(headers): the compiled twin of sidecar.head_rules.response_headers."},
    {"read_headers", (PyCFunction)read_headers, METH_O,
     "read_headers(headers): the compiled twin of sidecar.head_rules.read_headers."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "sidecar._heads", "The compiled twins of the head rules.", -1, methods,
};

PyMODINIT_FUNC PyInit__heads(void) {
    for (int c = 0; c < 256; c++) {
        BAD_NAME[c] = c < 0x20 || c == 0x7f || (c && strchr("()<>@,;:[]={} \t\\\"", c));
        BAD_VALUE[c] = (c < 0x20 && c != '\t') || c == 0x7f;
    }
    ZERO = PyLong_FromLong(0);
    STR_JOIN = PyUnicode_InternFromString("join");
    if (ZERO == NULL || STR_JOIN == NULL) return NULL;
    struct { PyObject **name; const char *text; } constants[] = {
        {&HOST, "host"}, {&ACCEPT_ENCODING, "accept-encoding"}, {&IDENTITY, "identity"},
        {&X_FORWARDED_FOR, "x-forwarded-for"}, {&X_FORWARDED_PROTO, "x-forwarded-proto"},
        {&X_FORWARDED_HOST, "x-forwarded-host"}, {&COMMA_SPACE, ", "},
    };
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++) {
        *constants[i].name = PyBytes_FromString(constants[i].text);
        if (*constants[i].name == NULL) return NULL;
    }
    const char *versions[] = {"1.0", "1.1", "2"}; /* headers._VERSIONS */
    for (int i = 0; i < 3; i++) {
        VERSIONS[i] = PyUnicode_InternFromString(versions[i]);
        if (VERSIONS[i] == NULL) return NULL;
    }
    return PyModule_Create(&module_def);
}
