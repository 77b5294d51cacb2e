/* sidecar/_core.c: the sidecar's per-read path, compiled. Two twins of Python code, each
 * line for line (the Python lines as comments above their C); read each beside its twin,
 * and change both together (the test suite runs once with each: SIDESTREAM_NO_EXTENSIONS=1
 * picks the Python ones):
 *
 * - `H1Core`: sidecar/upstream/h1core.py's class, the upstream connection's `data_received`
 *   (with `whole_chunks`, the read of whole chunks taken without httptools, and the two
 *   chunk callbacks that tell where httptools stands), and its `on_header`.
 * - `ChunkWriter`: sidecar/servers/http1/nowait.py's `send_nowait` closure, the
 *   `sidestream.send_nowait` write into uvicorn's response. It reads uvicorn's private
 *   `RequestResponseCycle` fields as the closure does, so it is used only where that
 *   package's version gate (`checked()`) allows the closure; and it writes to the socket
 *   past uvloop's transport only with the descriptor `uvloop_internals.direct_fd` gives.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <errno.h>
#include <sys/uio.h>

static PyObject *PARSE_ERRORS = NULL; /* h1core.PARSE_ERRORS */
static PyObject *EMPTY, *str_join, *str_abort, *str_feed_failed, *str_after_feed, *str_feed_data,
    *str_refuse_head;
static PyObject *str_flow, *str_write_paused, *str_disconnected, *str_response_complete,
    *str_chunked_encoding, *str_transport, *str_write, *str_is_closing, *str_held;

/* -- H1Core ------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *parser; /* `_parser` */
    PyObject *chunks;
    char complete;
    char received;
    char at_boundary;
    char chunk_end;
    PyObject *sink;
    /* When `sink` is a C function's bound method taking one argument (the relay's
     * `send_nowait`, compiled): its object and function, called directly (see `set_sink`) */
    PyObject *sink_self; /* borrowed: `sink` holds it */
    PyCFunction sink_function;
    PyObject *headers;
    Py_ssize_t head_bytes; /* `_head_bytes` */
} H1Core;

static PyObject *call_method0(PyObject *self, PyObject *name) {
    return PyObject_VectorcallMethod(name, &self, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

#define MAX_SIZE_DIGITS 8
#define MAX_HEAD_BYTES 65536

static int hex_digit(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* def whole_chunks(data) -> list[bytes] | None: appends the payloads to `chunks` and
 * returns 1, or returns 0 with `chunks` as it was (the parser's to read), or -1 on error.
 * Two passes: the first checks the whole read, so nothing is appended unless all is taken.
 * With `single`, a read of one chunk (a token, usually) puts its payload there instead of
 * in `chunks`: see `after_read`. */
static int whole_chunks(PyObject *data, PyObject *chunks, PyObject **single) {
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t end = PyBytes_GET_SIZE(data), count = 0;
    for (int pass = 0; pass < 2; pass++) {
        Py_ssize_t at = 0;
        while (at < end) {
            /* line = data.find(b"\r\n", at, at + MAX_SIZE_DIGITS + 2); the size in hex */
            Py_ssize_t size = 0, line = at;
            int digit;
            while (line < end && line - at < MAX_SIZE_DIGITS && (digit = hex_digit(b[line])) >= 0) {
                size = size * 16 + digit;
                line++;
            }
            if (line == at || line + 1 >= end || b[line] != '\r' || b[line + 1] != '\n')
                return 0;
            Py_ssize_t start = line + 2, stop = start + size;
            /* if size == 0 or data[stop : stop + 2] != b"\r\n": return None */
            if (size == 0 || stop + 2 > end || b[stop] != '\r' || b[stop + 1] != '\n') return 0;
            if (pass == 0 && at == 0 && stop + 2 == end && single != NULL) {
                /* the read is one whole chunk (a token, usually): checked, and taken, at once */
                *single = PyBytes_FromStringAndSize((const char *)b + start, size);
                return *single == NULL ? -1 : 1;
            }
            if (pass == 0) count++;
            else {
                /* pieces.append(data[start:stop]) */
                PyObject *piece = PyBytes_FromStringAndSize((const char *)b + start, size);
                if (piece == NULL) return -1;
                if (single != NULL && count == 1) {
                    *single = piece;
                    return 1;
                }
                int appended = PyList_Append(chunks, piece);
                Py_DECREF(piece);
                if (appended < 0) return -1;
            }
            at = stop + 2;
        }
    }
    return 1;
}

/* def on_header(self, name: bytes, value: bytes) -> None */
static PyObject *H1Core_on_header(H1Core *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "on_header(name, value)");
        return NULL;
    }
    Py_ssize_t name = PyObject_Size(args[0]), value = PyObject_Size(args[1]);
    if (name < 0 || value < 0) return NULL;
    /* self._head_bytes += len(name) + len(value) + 4
     * if self._head_bytes > MAX_HEAD_BYTES: self._refuse_head() */
    self->head_bytes += name + value + 4;
    if (self->head_bytes > MAX_HEAD_BYTES) {
        PyObject *r = call_method0((PyObject *)self, str_refuse_head);
        if (r == NULL) return NULL;
        Py_DECREF(r);
    }
    /* self.headers.append((name, value)) */
    if (self->headers == NULL || !PyList_Check(self->headers)) {
        PyErr_SetString(PyExc_TypeError, "headers: a list");
        return NULL;
    }
    PyObject *pair = PyTuple_Pack(2, args[0], args[1]);
    if (pair == NULL) return NULL;
    int appended = PyList_Append(self->headers, pair);
    Py_DECREF(pair);
    if (appended < 0) return NULL;
    Py_RETURN_NONE;
}

/* def on_chunk_header(self): self.chunk_end = False */
static PyObject *H1Core_on_chunk_header(H1Core *self, PyObject *unused) {
    self->chunk_end = 0;
    Py_RETURN_NONE;
}

/* def on_chunk_complete(self): self.chunk_end = True */
static PyObject *H1Core_on_chunk_complete(H1Core *self, PyObject *unused) {
    self->chunk_end = 1;
    Py_RETURN_NONE;
}

/* else: try: parser.feed_data(data) ...; self.at_boundary = self.chunk_end and
 * data.endswith(b"\r\n"). Py_True when fed, None when a parse error was reported, NULL on
 * an error. */
static PyObject *feed(H1Core *self, PyObject *parser, PyObject *data) {
    /* try: parser.feed_data(data) */
    Py_INCREF(parser); /* a callback may replace self._parser */
    PyObject *args[2] = {parser, data};
    PyObject *r = PyObject_VectorcallMethod(
        str_feed_data, args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(parser);
    if (r == NULL) {
        /* except PARSE_ERRORS as exc: self._feed_failed(exc); return */
        if (!PyErr_ExceptionMatches(PARSE_ERRORS)) return NULL;
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        if (tb != NULL) PyException_SetTraceback(exc, tb);
        Py_XDECREF(type);
        Py_XDECREF(tb);
        PyObject *fargs[2] = {(PyObject *)self, exc};
        r = PyObject_VectorcallMethod(
            str_feed_failed, fargs, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(exc);
        if (r == NULL) return NULL;
        Py_DECREF(r);
        Py_RETURN_NONE;
    }
    Py_DECREF(r);
    /* self.at_boundary = self.chunk_end and data.endswith(b"\r\n") */
    Py_ssize_t n = PyBytes_Check(data) ? PyBytes_GET_SIZE(data) : 0;
    const char *b = n ? PyBytes_AS_STRING(data) : "";
    self->at_boundary = self->chunk_end && n >= 2 && b[n - 2] == '\r' && b[n - 1] == '\n';
    Py_RETURN_TRUE;
}

/* The rest of data_received, once a read's pieces are in `chunks`; or, with `single` (a
 * reference this takes), once its one piece is, `chunks` having been empty: the piece
 * stands for `chunks == [single]`, and goes into the list only when the sink does not take
 * it (clearing a list frees its item array: a list per token would be an allocation, a
 * free and two objects more touched per token). */
static PyObject *after_read(H1Core *self, PyObject *single) {
    PyObject *r;
    int yes = 0;
    /* chunks = self.chunks */
    PyObject *chunks = Py_XNewRef(self->chunks);
    /* if chunks and self.sink is not None and self.sink(b"".join(chunks)): */
    int any = single != NULL ||
              (chunks != NULL && PyList_CheckExact(chunks) && PyList_GET_SIZE(chunks) > 0);
    if (any && self->sink != NULL && self->sink != Py_None) {
        /* What is called stays alive while called (the call may set another sink): the
         * sink, or, when its function is called directly, the function's object alone, so
         * that the bound method is not touched per token (cold by then: `set_sink`) */
        PyCFunction function = self->sink_function;
        PyObject *callee = function != NULL ? self->sink_self : self->sink;
        Py_XINCREF(callee);
        PyObject *first = single != NULL ? single : PyList_GET_ITEM(chunks, 0);
        int one = single != NULL || (PyList_GET_SIZE(chunks) == 1 && PyBytes_CheckExact(first));
        PyObject *body = one ? Py_NewRef(first) /* what join returns for one piece */
            : PyObject_CallMethodOneArg(EMPTY, str_join, chunks);
        PyObject *took = body == NULL ? NULL
                         : function != NULL ? function(callee, body)
                                            : PyObject_CallOneArg(callee, body);
        Py_XDECREF(body);
        Py_XDECREF(callee);
        yes = took == NULL ? -1 : PyObject_IsTrue(took);
        Py_XDECREF(took);
        if (yes > 0 && single == NULL) {
            /* chunks.clear() */
            yes = PyList_SetSlice(chunks, 0, PyList_GET_SIZE(chunks), NULL) < 0 ? -1 : 1;
        }
    }
    if (single != NULL) {
        /* not taken (or an error, kept aside meanwhile): it stays in `chunks` */
        if (yes <= 0) {
            PyObject *type, *exc, *tb;
            PyErr_Fetch(&type, &exc, &tb);
            if (PyList_Append(chunks, single) < 0) {
                Py_XDECREF(type);
                Py_XDECREF(exc);
                Py_XDECREF(tb);
                yes = -1;
            } else if (type != NULL) {
                PyErr_Restore(type, exc, tb);
            }
        }
        Py_DECREF(single);
    }
    Py_XDECREF(chunks);
    if (yes < 0) return NULL;
    /* if not self.complete: return */
    if (yes && !self->complete) Py_RETURN_NONE;
    /* self._after_feed() */
    r = call_method0((PyObject *)self, str_after_feed);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

/* def data_received(self, data) */
static PyObject *H1Core_data_received(H1Core *self, PyObject *data) {
    /* parser = self._parser */
    PyObject *parser = self->parser;
    /* if parser is None or self.complete: self.abort(); return */
    if (parser == NULL || parser == Py_None || self->complete) {
        PyObject *r = call_method0((PyObject *)self, str_abort);
        if (r == NULL) return NULL;
        Py_DECREF(r);
        Py_RETURN_NONE;
    }
    /* self.received = True */
    self->received = 1;
    /* pieces = whole_chunks(data) if self.at_boundary else None
     * if pieces is not None: self.chunks.extend(pieces) */
    int taken = 0;
    PyObject *single = NULL;
    if (self->at_boundary && PyBytes_CheckExact(data) && self->chunks != NULL &&
        PyList_CheckExact(self->chunks)) {
        int empty = PyList_GET_SIZE(self->chunks) == 0;
        taken = whole_chunks(data, self->chunks, empty ? &single : NULL);
        if (taken < 0) return NULL;
    }
    if (!taken) {
        PyObject *r = feed(self, parser, data);
        if (r != Py_True) return r; /* failed (reported) or an error */
        Py_DECREF(r);
    }
    return after_read(self, single);
}

static PyObject *H1Core_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    H1Core *self = (H1Core *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    /* The connection's __init__ sets them (the same as the Python twin, which has no fields
     * until then): None here, nothing made only to be replaced. */
    self->parser = Py_NewRef(Py_None);
    self->chunks = Py_NewRef(Py_None);
    self->headers = Py_NewRef(Py_None);
    self->sink = Py_NewRef(Py_None);
    return (PyObject *)self;
}

static int H1Core_traverse(H1Core *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->parser);
    Py_VISIT(self->chunks);
    Py_VISIT(self->sink);
    Py_VISIT(self->headers);
    return 0;
}

static int H1Core_clear(H1Core *self) {
    Py_CLEAR(self->parser);
    Py_CLEAR(self->chunks);
    Py_CLEAR(self->headers);
    self->sink_self = NULL;
    self->sink_function = NULL;
    Py_CLEAR(self->sink);
    return 0;
}

static void H1Core_dealloc(H1Core *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    H1Core_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyMemberDef H1Core_members[] = {
    {"_parser", T_OBJECT_EX, offsetof(H1Core, parser), 0, NULL},
    {"chunks", T_OBJECT_EX, offsetof(H1Core, chunks), 0, NULL},
    {"complete", T_BOOL, offsetof(H1Core, complete), 0, NULL},
    {"received", T_BOOL, offsetof(H1Core, received), 0, NULL},
    {"at_boundary", T_BOOL, offsetof(H1Core, at_boundary), 0, NULL},
    {"chunk_end", T_BOOL, offsetof(H1Core, chunk_end), 0, NULL},
    {"headers", T_OBJECT_EX, offsetof(H1Core, headers), 0, NULL},
    {"_head_bytes", T_PYSSIZET, offsetof(H1Core, head_bytes), 0, NULL},
    {NULL},
};

/* `sink`: a field, as the Python twin's slot, which also keeps the function and object of a
 * C method that takes one argument (METH_O, as the compiled relay's `send_nowait`), to call
 * them per read without the bound method object in between: one object fewer touched per
 * token, cold by then (20 ms and many other streams later). */
static PyObject *get_sink(H1Core *self, void *closure) {
    if (self->sink == NULL) {
        PyErr_SetString(PyExc_AttributeError, "sink");
        return NULL;
    }
    return Py_NewRef(self->sink);
}

static int set_sink(H1Core *self, PyObject *value, void *closure) {
    int direct = value != NULL && PyCFunction_CheckExact(value) &&
                 PyCFunction_GET_FLAGS(value) == METH_O;
    self->sink_self = direct ? PyCFunction_GET_SELF(value) : NULL;
    self->sink_function = direct ? PyCFunction_GET_FUNCTION(value) : NULL;
    Py_XSETREF(self->sink, Py_XNewRef(value)); /* del conn.sink: NULL, as a slot deleted */
    return 0;
}

static PyGetSetDef H1Core_getset[] = {
    {"sink", (getter)get_sink, (setter)set_sink, NULL, NULL},
    {NULL},
};

static PyMethodDef H1Core_methods[] = {
    {"data_received", (PyCFunction)H1Core_data_received, METH_O, NULL},
    {"on_header", (PyCFunction)(void (*)(void))H1Core_on_header, METH_FASTCALL, NULL},
    {"on_chunk_header", (PyCFunction)H1Core_on_chunk_header, METH_NOARGS, NULL},
    {"on_chunk_complete", (PyCFunction)H1Core_on_chunk_complete, METH_NOARGS, NULL},
    {NULL},
};

static PyType_Slot H1Core_slots[] = {
    {Py_tp_doc, "An upstream connection's per-read core (sidecar/upstream/h1core.py, compiled)."},
    {Py_tp_new, H1Core_new},
    {Py_tp_dealloc, H1Core_dealloc},
    {Py_tp_traverse, H1Core_traverse},
    {Py_tp_clear, H1Core_clear},
    {Py_tp_members, H1Core_members},
    {Py_tp_getset, H1Core_getset},
    {Py_tp_methods, H1Core_methods},
    {0, NULL},
};

static PyType_Spec H1Core_spec = {
    .name = "sidecar._core.H1Core",
    .basicsize = sizeof(H1Core),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = H1Core_slots,
};

/* -- ChunkWriter ------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *cycle;
    PyObject *flow;  /* cycle.flow: the connection's, for the cycle's life */
    PyObject *write; /* cycle.transport.write: likewise */
    PyObject *transport; /* cycle.transport, with fd only: its is_closing and
                          * get_write_buffer_size are called by name, as the closure calls
                          * them (no bound method objects held: two fewer objects a chunk
                          * touches, which costs more than the method lookups) */
    int fd; /* the socket, to write past the transport (uvloop_internals.direct_fd), or -1 */
    PyObject *fd_of; /* what gives `fd` (`direct_fd`), until the first write asks it; or NULL */
    vectorcallfunc vectorcall;
    /* Where the four fields read per chunk sit in `flow` and `cycle` (see `slot_of`) */
    Py_ssize_t write_paused, disconnected, response_complete, chunked_encoding;
} ChunkWriter;

/* 1 when `getattr(obj, name)` is true, 0 when false, -1 on error */
static int attr_true(PyObject *obj, PyObject *name) {
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) return -1;
    int yes = PyObject_IsTrue(value);
    Py_DECREF(value);
    return yes;
}

/* Where `obj`'s field `name` sits in it, when its class makes it a slot (`__slots__`: a
 * member descriptor of an object field), else -1. The sidecar's cycle and flow make the
 * fields read per chunk slots (http1's `RequestCycle` and `Flow`): read in
 * place, each is a load, where `getattr` looks in the type and then in the instance dict
 * (the four lookups were a large share of a token's relay: see bench.lab.instructions).
 * Found once, when the writer is made: a class's slots are fixed when it is made. */
static Py_ssize_t slot_of(PyObject *obj, PyObject *name) {
    PyObject *descr = _PyType_Lookup(Py_TYPE(obj), name);
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) return -1;
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    return member->type == T_OBJECT_EX && !(member->flags & READONLY) ? member->offset : -1;
}

/* `attr_true`, read in place where `slot` says the field is (an empty slot raises the
 * AttributeError that getattr raises) */
static int field_true(PyObject *obj, Py_ssize_t slot, PyObject *name) {
    PyObject *value = slot < 0 ? NULL : *(PyObject **)((char *)obj + slot);
    if (value == NULL) return attr_true(obj, name);
    if (value == Py_False || value == Py_None) return 0;
    return value == Py_True ? 1 : PyObject_IsTrue(value);
}

/* `b"%x\r\n" % n` into `out` (room for 24 bytes); returns its length */
static int hex_line(char *out, size_t n) {
    static const char digits[] = "0123456789abcdef";
    int len = 1; /* digits: written from the last, in place */
    for (size_t rest = n >> 4; rest; rest >>= 4) len++;
    for (int i = len - 1; i >= 0; i--, n >>= 4) out[i] = digits[n & 15];
    out[len] = '\r';
    out[len + 1] = '\n';
    return len + 2;
}

/* The transport type of writers with fd (uvloop's TCPTransport: the gate of
 * `uvloop_internals.direct_fd`) and its two methods called per chunk, looked up once a
 * process rather than by name per chunk (the lookups were some 160 of a token's 3,160
 * instructions: bench.lab.instructions). Only for a type whose instances have no
 * `__dict__` (as a Cython class's): there `transport.is_closing()` is always the class's,
 * so calling that is the same call. */
static PyTypeObject *fd_type;
static PyObject *fd_is_closing, *fd_held;

/* 1 when `transport`'s type is now the one remembered, 0 when it cannot be (an instance
 * dict), -1 on error */
static int remember_fd_type(PyObject *transport) {
    PyTypeObject *type = Py_TYPE(transport);
    if (type == fd_type) return 1;
    if (type->tp_dictoffset != 0) return 0;
    PyObject *is_closing = PyObject_GetAttr((PyObject *)type, str_is_closing);
    PyObject *held = is_closing == NULL ? NULL : PyObject_GetAttr((PyObject *)type, str_held);
    if (held == NULL) {
        Py_XDECREF(is_closing);
        return -1;
    }
    Py_XSETREF(fd_is_closing, is_closing);
    Py_XSETREF(fd_held, held);
    Py_XSETREF(fd_type, (PyTypeObject *)Py_NewRef(type));
    return 1;
}

/* 1 when `transport.<name>()` is false, 0 when true, -1 on error; `fn` is the type's
 * method for `name` when `by_type` (see `fd_type`) */
static int called_false(PyObject *transport, int by_type, PyObject *fn, PyObject *name) {
    PyObject *r = by_type ? PyObject_Vectorcall(fn, &transport, 1, NULL)
                          : call_method0(transport, name);
    if (r == NULL) return -1;
    int yes = r == Py_False || r == Py_None ? 0 : r == Py_True ? 1 : PyObject_IsTrue(r);
    Py_DECREF(r);
    return yes < 0 ? -1 : !yes;
}

/* `(head + body + b"\r\n")[skip:]` as new bytes */
static PyObject *framed_rest(const char *head, int head_len, PyObject *body, Py_ssize_t skip) {
    Py_ssize_t n = PyBytes_GET_SIZE(body), size = head_len + n + 2 - skip;
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) return NULL;
    char *p = PyBytes_AS_STRING(out);
    const char *parts[3] = {head, PyBytes_AS_STRING(body), "\r\n"};
    Py_ssize_t sizes[3] = {head_len, n, 2};
    for (int i = 0; i < 3; i++) {
        Py_ssize_t from = skip < sizes[i] ? skip : sizes[i];
        memcpy(p, parts[i] + from, sizes[i] - from);
        p += sizes[i] - from;
        skip -= from;
    }
    return out;
}

/* The descriptor from `fd_of(transport)`, asked once, at the first write: -1 for None (the
 * transport's own `write` then, and the transport is not held any more). 0, or -1 on error. */
static int resolve_fd(ChunkWriter *self) {
    PyObject *r = PyObject_CallOneArg(self->fd_of, self->transport);
    if (r == NULL) return -1; /* asked again next time, as the closure would */
    Py_CLEAR(self->fd_of);
    long fd = r == Py_None ? -1 : PyLong_AsLong(r);
    Py_DECREF(r);
    if (fd == -1 && PyErr_Occurred()) return -1;
    if (fd < 0 || fd > INT_MAX) {
        self->fd = -1;
        Py_CLEAR(self->transport); /* only the fast path calls it */
        return 0;
    }
    if (remember_fd_type(self->transport) < 0) return -1; /* 0: called by name, as the closure */
    self->fd = (int)fd;
    return 0;
}

/* def send_nowait(body: bytes) -> bool */
static PyObject *ChunkWriter_call(ChunkWriter *self, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 1 || kwnames != NULL || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "send_nowait(body: bytes)");
        return NULL;
    }
    PyObject *body = args[0], *cycle = self->cycle;
    /* if (cycle.flow.write_paused or cycle.disconnected or cycle.response_complete
     *     or not cycle.chunked_encoding): return False */
    int no = field_true(self->flow, self->write_paused, str_write_paused);
    if (no == 0) no = field_true(cycle, self->disconnected, str_disconnected);
    if (no == 0) no = field_true(cycle, self->response_complete, str_response_complete);
    if (no == 0) {
        int chunked = field_true(cycle, self->chunked_encoding, str_chunked_encoding);
        no = chunked < 0 ? -1 : !chunked;
    }
    if (no < 0) return NULL;
    if (no) Py_RETURN_FALSE;
    /* framed = b"%x\r\n%b\r\n" % (len(body), body): written from its three parts */
    Py_ssize_t n = PyBytes_GET_SIZE(body), sent = 0;
    char head[24];
    int head_len = hex_line(head, (size_t)n);
    /* if fd_of is not None: fd, fd_of = fd_of(transport), None */
    if (self->fd_of != NULL && resolve_fd(self) < 0) return NULL;
    /* if (fd is not None and not transport.is_closing()
     *         and not transport.get_write_buffer_size()): */
    if (self->fd >= 0) {
        PyObject *transport = self->transport;
        int by_type = Py_TYPE(transport) == fd_type;
        int past = called_false(transport, by_type, fd_is_closing, str_is_closing);
        if (past > 0) past = called_false(transport, by_type, fd_held, str_held);
        if (past < 0) return NULL;
        if (past) {
            /* try: sent = os.write(fd, framed)
             * except OSError: sent = 0 */
            struct iovec parts[3] = {
                {head, (size_t)head_len}, {PyBytes_AS_STRING(body), (size_t)n}, {"\r\n", 2}};
            do sent = writev(self->fd, parts, 3);
            while (sent < 0 && errno == EINTR);
            if (sent < 0) sent = 0;
            /* if sent == len(framed): return True */
            if (sent == head_len + n + 2) Py_RETURN_TRUE;
            /* framed = framed[sent:] */
        }
    }
    /* write(framed) */
    PyObject *out = framed_rest(head, head_len, body, sent);
    if (out == NULL) return NULL;
    PyObject *r = PyObject_CallOneArg(self->write, out);
    Py_DECREF(out);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    /* return True */
    Py_RETURN_TRUE;
}

static PyObject *ChunkWriter_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *cycle, *fd_of = Py_None;
    if (!PyArg_ParseTuple(args, "O|O:ChunkWriter", &cycle, &fd_of)) return NULL;
    PyObject *flow = PyObject_GetAttr(cycle, str_flow);
    if (flow == NULL) return NULL;
    PyObject *transport = PyObject_GetAttr(cycle, str_transport);
    PyObject *write = transport == NULL ? NULL : PyObject_GetAttr(transport, str_write);
    ChunkWriter *self = write == NULL ? NULL : (ChunkWriter *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(flow);
        Py_XDECREF(transport);
        Py_XDECREF(write);
        return NULL;
    }
    if (fd_of == Py_None) Py_CLEAR(transport); /* only the fast path calls it */
    self->cycle = Py_NewRef(cycle);
    self->flow = flow;
    self->write = write;
    self->transport = transport;
    self->fd = -1;
    self->fd_of = fd_of == Py_None ? NULL : Py_NewRef(fd_of);
    self->vectorcall = (vectorcallfunc)ChunkWriter_call;
    self->write_paused = slot_of(flow, str_write_paused);
    self->disconnected = slot_of(cycle, str_disconnected);
    self->response_complete = slot_of(cycle, str_response_complete);
    self->chunked_encoding = slot_of(cycle, str_chunked_encoding);
    return (PyObject *)self;
}

static int ChunkWriter_traverse(ChunkWriter *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->cycle);
    Py_VISIT(self->flow);
    Py_VISIT(self->write);
    Py_VISIT(self->transport);
    Py_VISIT(self->fd_of);
    return 0;
}

static int ChunkWriter_clear(ChunkWriter *self) {
    Py_CLEAR(self->cycle);
    Py_CLEAR(self->flow);
    Py_CLEAR(self->write);
    Py_CLEAR(self->transport);
    Py_CLEAR(self->fd_of);
    return 0;
}

static void ChunkWriter_dealloc(ChunkWriter *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    ChunkWriter_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyMemberDef ChunkWriter_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(ChunkWriter, vectorcall), READONLY, NULL},
    {NULL},
};

static PyType_Slot ChunkWriter_slots[] = {
    {Py_tp_doc, "ChunkWriter(cycle, fd_of=None): the send_nowait write into a uvicorn response."},
    {Py_tp_new, ChunkWriter_new},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_dealloc, ChunkWriter_dealloc},
    {Py_tp_traverse, ChunkWriter_traverse},
    {Py_tp_clear, ChunkWriter_clear},
    {Py_tp_members, ChunkWriter_members},
    {0, NULL},
};

static PyType_Spec ChunkWriter_spec = {
    .name = "sidecar._core.ChunkWriter",
    .basicsize = sizeof(ChunkWriter),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = ChunkWriter_slots,
};

/* -- the module --------------------------------------------------------------------------- */

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "sidecar._core", NULL, -1, NULL,
};

static int add_type(PyObject *module, PyType_Spec *spec, const char *name) {
    PyObject *type = PyType_FromSpec(spec);
    if (type == NULL) return -1;
    if (PyModule_AddObject(module, name, type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__core(void) {
    struct { PyObject **name; const char *text; } names[] = {
        {&str_abort, "abort"}, {&str_feed_failed, "_feed_failed"},
        {&str_refuse_head, "_refuse_head"},
        {&str_after_feed, "_after_feed"}, {&str_feed_data, "feed_data"},
        {&str_flow, "flow"}, {&str_write_paused, "write_paused"},
        {&str_disconnected, "disconnected"}, {&str_response_complete, "response_complete"},
        {&str_chunked_encoding, "chunked_encoding"}, {&str_transport, "transport"},
        {&str_write, "write"}, {&str_is_closing, "is_closing"},
        {&str_held, "get_write_buffer_size"}, {&str_join, "join"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].name = PyUnicode_InternFromString(names[i].text);
        if (*names[i].name == NULL) return NULL;
    }
    EMPTY = PyBytes_FromStringAndSize(NULL, 0);
    if (EMPTY == NULL) return NULL;
    /* h1core.PARSE_ERRORS: what httptools' parser raises for a bad response */
    PyObject *httptools = PyImport_ImportModule("httptools");
    if (httptools == NULL) return NULL;
    PyObject *error = PyObject_GetAttrString(httptools, "HttpParserError");
    PyObject *upgrade = PyObject_GetAttrString(httptools, "HttpParserUpgrade");
    Py_DECREF(httptools);
    PARSE_ERRORS = error && upgrade ? PyTuple_Pack(2, error, upgrade) : NULL;
    Py_XDECREF(error);
    Py_XDECREF(upgrade);
    if (PARSE_ERRORS == NULL) return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    if (add_type(module, &H1Core_spec, "H1Core") < 0 ||
        add_type(module, &ChunkWriter_spec, "ChunkWriter") < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
