/* uvloop's read callbacks, in fewer steps: `sidecar/servers/uvloop_internals.py` says why
 * they hold and which releases they were checked against; this file only does it.
 *
 * uvloop runs libuv with the GIL released, and every libuv callback it gives takes the GIL
 * and drops it again (`with gil`). For each read libuv makes two: the buffer callback
 * (`__loop_alloc_buffer`) and the read callback (`__uv_stream_on_read`).
 * - The first does no Python at all: it hands out the loop's one receive buffer and marks
 *   it in use. `quiet(transport, loop, protocol)` puts this file's `quiet_alloc`, which
 *   does the same without the GIL, in that stream's buffer slot.
 * - The second enters the transport's context, slices the buffer into bytes and calls the
 *   protocol's bound `data_received` through Cython's generic call. When the protocol's
 *   `data_received` is a C function of one argument (`H1Core`'s), `quiet` also puts
 *   `quiet_read` in the read slot: it calls that function directly, and
 *   leaves everything else (no bytes, another protocol) to uvloop's own callback.
 *
 * Every layout it reads is checked before a slot is written, or nothing is written:
 * - libuv 1.x's public head of `uv_handle_t` and `uv_stream_t` (below; ABI-stable in 1.x):
 *   the handle's `data` must be the transport itself and its type TCP;
 * - uvloop's `UVHandle` (`handles/handle.pxd`): after the object head and Cython's vtable
 *   pointer come `_handle` and `_loop`; `_loop` must be the loop passed in;
 * - uvloop's `Loop` (`loop.pxd`): `_recv_buffer`, then `_recv_buffer_in_use`. Learned by
 *   calling uvloop's own buffer callback once per loop (GIL held): the flag it sets must be
 *   the int right after the buffer it gives, and the buffer must lie inside the loop object;
 * - uvloop's `UVBaseTransport._protocol`: learned as the one pointer-sized place in the
 *   transport past `_loop` that holds the protocol, and checked at each swap.
 * uvloop puts its own callbacks back whenever it starts reading again (`resume_reading`),
 * so `quiet` is asked again then; a stream left with uvloop's callbacks only runs slower.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>

typedef struct { char *base; size_t len; } uv_buf;
typedef struct uv_stream_head uv_stream_head;
typedef void (*alloc_fn)(uv_stream_head *, size_t, uv_buf *);
typedef void (*read_fn)(uv_stream_head *, Py_ssize_t, const uv_buf *);

struct uv_stream_head { /* UV_HANDLE_FIELDS (Unix), then UV_STREAM_FIELDS */
    void *data;
    void *loop;
    int type;
    void *close_cb;
    void *handle_queue[2];
    union { int fd; void *reserved[4]; } u;
    void *next_closing;
    unsigned int flags;
    size_t write_queue_size;
    alloc_fn alloc_cb;
    read_fn read_cb;
};

enum { UV_TCP = 12, UV_ECONNABORTED = -103 /* Linux's ECONNABORTED, negated, as libuv */ };

typedef struct { /* uvloop's UVHandle, as far as read here */
    PyObject_HEAD
    void *vtab;
    uv_stream_head *handle;
    PyObject *loop;
} uv_handle_obj;

static alloc_fn uvloop_alloc;           /* uvloop's own, as first seen */
static Py_ssize_t recv_offset = -1;     /* of `_recv_buffer` in the Loop object */
static size_t recv_len;
static PyObject *learned_loop;          /* borrowed, compared only: the loop last checked */

static inline int *in_use(char *loop) { return (int *)(loop + recv_offset + recv_len); }

static void quiet_alloc(uv_stream_head *stream, size_t suggested, uv_buf *buf) {
    (void)suggested;
    char *loop = (char *)((uv_handle_obj *)stream->data)->loop;
    if (*in_use(loop)) { /* as uvloop's: no buffer, and libuv reports ENOBUFS to the read */
        buf->base = NULL;
        buf->len = 0;
        return;
    }
    *in_use(loop) = 1;
    buf->base = loop + recv_offset;
    buf->len = recv_len;
}

/* -- the read callback ---------------------------------------------------------------- */

static read_fn uvloop_read;            /* uvloop's own (`__uv_stream_on_read`), as first seen */
static Py_ssize_t protocol_offset = -1; /* of `_protocol` in uvloop's transport object */
static PyTypeObject *fast_type;        /* the protocol type whose `data_received` is... */
static PyCFunction fast_data_received; /* ...this C function of one argument (H1Core's) */
static PyObject *str_data_received, *str_call_exception_handler;

/* `data_received` raised. uvloop's callback would report the exception to the loop's
 * handler and close the transport with it (`_fatal_error`), so that the protocol's
 * `connection_lost` gets an error, not None. The first is done here; for the second,
 * uvloop's own callback is told of a read error, which it closes the transport with. */
static void data_received_failed(uv_stream_head *stream, const uv_buf *buf,
                                 uv_handle_obj *transport, PyObject *protocol) {
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (tb != NULL) PyException_SetTraceback(exc, tb);
    if (!PyErr_GivenExceptionMatches(exc, PyExc_OSError)) {
        PyObject *context = Py_BuildValue(
            "{s:s,s:O,s:O,s:O}", "message", "Fatal error on transport TCPTransport",
            "exception", exc, "transport", (PyObject *)transport, "protocol", protocol);
        PyObject *r = context == NULL ? NULL
                                      : PyObject_CallMethodOneArg(
                                            transport->loop, str_call_exception_handler, context);
        if (r == NULL) PyErr_WriteUnraisable((PyObject *)transport);
        Py_XDECREF(r);
        Py_XDECREF(context);
    }
    Py_XDECREF(type);
    Py_XDECREF(exc);
    Py_XDECREF(tb);
    uvloop_read(stream, UV_ECONNABORTED, buf);
}

/* uvloop's read callback for a protocol of `fast_type`, in fewer steps: the bytes to its
 * `data_received`, called as the C function it is. Not run in the transport's context as
 * uvloop runs it (`run_in_context1`): what H1Core's `data_received` runs reads no context
 * variable. Anything else (no bytes: EAGAIN, EOF, an error; another protocol set) is
 * uvloop's own callback's. */
static void quiet_read(uv_stream_head *stream, Py_ssize_t nread, const uv_buf *buf) {
    uv_handle_obj *transport = (uv_handle_obj *)stream->data;
    if (nread <= 0 || transport == NULL) {
        uvloop_read(stream, nread, buf);
        return;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *protocol = *(PyObject **)((char *)transport + protocol_offset);
    if (protocol == NULL || Py_TYPE(protocol) != fast_type) {
        uvloop_read(stream, nread, buf);
        PyGILState_Release(gil);
        return;
    }
    *in_use((char *)transport->loop) = 0; /* __loop_free_buffer */
    Py_INCREF(transport);
    Py_INCREF(protocol);
    PyObject *data = PyBytes_FromStringAndSize(buf->base, nread);
    PyObject *r = data == NULL ? NULL : fast_data_received(protocol, data);
    Py_XDECREF(data);
    if (r != NULL) Py_DECREF(r);
    else data_received_failed(stream, buf, transport, protocol);
    Py_DECREF(protocol);
    Py_DECREF(transport);
    PyGILState_Release(gil);
}

/* Is `protocol`'s `data_received` a C function of one argument, its type's for certain (no
 * instance dict to shadow it)? Then its type is `fast_type` from now on. */
static int fast_protocol(PyObject *protocol) {
    PyTypeObject *type = Py_TYPE(protocol);
    if (type == fast_type) return 1;
    if (type->tp_dictoffset != 0) return 0;
    PyObject *found = _PyType_Lookup(type, str_data_received); /* borrowed */
    if (found == NULL || !Py_IS_TYPE(found, &PyMethodDescr_Type)) return 0;
    PyMethodDef *def = ((PyMethodDescrObject *)found)->d_method;
    if (def->ml_flags != METH_O) return 0;
    Py_XSETREF(fast_type, (PyTypeObject *)Py_NewRef(type));
    fast_data_received = def->ml_meth;
    return 1;
}

/* Is `protocol` in the transport's `_protocol` field? Where that is is learned once: the one
 * pointer-sized place past the handle's head that holds it. */
static int protocol_in(uv_handle_obj *transport, PyObject *protocol) {
    char *at = (char *)transport;
    if (protocol_offset >= 0) return *(PyObject **)(at + protocol_offset) == protocol;
    Py_ssize_t end = Py_TYPE(transport)->tp_basicsize - (Py_ssize_t)sizeof(PyObject *);
    Py_ssize_t found = -1;
    for (Py_ssize_t off = sizeof(uv_handle_obj); off <= end; off += sizeof(PyObject *)) {
        if (*(PyObject **)(at + off) != protocol) continue;
        if (found >= 0) return 0; /* twice: not the one field looked for */
        found = off;
    }
    if (found < 0) return 0;
    protocol_offset = found;
    return 1;
}

static void quiet_reading(uv_stream_head *stream, uv_handle_obj *transport, PyObject *protocol) {
    if (stream->read_cb == quiet_read) return;
    if (uvloop_read == NULL) uvloop_read = stream->read_cb;
    if (stream->read_cb != uvloop_read || !fast_protocol(protocol)) return;
    if (protocol_in(transport, protocol)) stream->read_cb = quiet_read;
}

/* -- the swap -------------------------------------------------------------------------- */

/* Is `object` uvloop's TCPTransport, the one type whose layout the above reads? Its static
 * type's name, which no Python class (a heap type) can take on */
static int uvloop_tcp(PyObject *object) {
    PyTypeObject *type = Py_TYPE(object);
    return !(type->tp_flags & Py_TPFLAGS_HEAPTYPE) &&
           strcmp(type->tp_name, "uvloop.loop.TCPTransport") == 0 &&
           type->tp_basicsize >= (Py_ssize_t)sizeof(uv_handle_obj);
}

/* Learn where `loop`'s receive buffer is with uvloop's own callback; 0 when the layout is
 * not the one described above. */
static int learn(uv_stream_head *stream, PyObject *loop) {
    uv_buf buf = {NULL, 0};
    stream->alloc_cb(stream, 65536, &buf);
    char *base = (char *)loop;
    Py_ssize_t size = (Py_ssize_t)_PyObject_SIZE(Py_TYPE(loop));
    if (buf.base == NULL || buf.base < base || buf.len == 0 ||
        buf.base + buf.len + sizeof(int) > base + size || *(int *)(buf.base + buf.len) != 1) {
        /* Not the layout described: the flag is not where it was looked for, so uvloop's
         * own read callback gives the buffer back (a read of 0 bytes, EAGAIN, frees it and
         * does nothing else); left in use, every later read on this loop would fail */
        stream->read_cb(stream, 0, &buf);
        return 0;
    }
    int *flag = (int *)(buf.base + buf.len);
    *flag = 0;
    Py_ssize_t offset = buf.base - base;
    if (recv_offset >= 0 && (offset != recv_offset || buf.len != recv_len)) return 0;
    recv_offset = offset;
    recv_len = buf.len;
    learned_loop = loop;
    return 1;
}

static PyObject *quiet(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "quiet(transport, loop, protocol)");
        return NULL;
    }
    if (!uvloop_tcp(args[0])) Py_RETURN_FALSE;
    uv_handle_obj *transport = (uv_handle_obj *)args[0];
    PyObject *loop = args[1];
    uv_stream_head *stream = transport->handle;
    if (stream == NULL || stream->data != (void *)transport || stream->type != UV_TCP ||
        transport->loop != loop || stream->read_cb == NULL) {
        Py_RETURN_FALSE;
    }
    if (stream->alloc_cb != quiet_alloc) {
        if (uvloop_alloc == NULL) uvloop_alloc = stream->alloc_cb;
        if (stream->alloc_cb != uvloop_alloc) Py_RETURN_FALSE;
        if (loop != learned_loop && !learn(stream, loop)) Py_RETURN_FALSE;
        stream->alloc_cb = quiet_alloc;
    }
    /* The read callback only behind the buffer callback: it frees the buffer as that
     * callback hands it out (`in_use`), both learned. */
    quiet_reading(stream, transport, args[2]);
    Py_RETURN_TRUE;
}

/* Is `transport`'s stream reading with `quiet_alloc`? (the tests' view of the slot) */
static PyObject *quieted(PyObject *module, PyObject *transport) {
    (void)module;
    uv_stream_head *stream = uvloop_tcp(transport) ? ((uv_handle_obj *)transport)->handle : NULL;
    int ours = stream != NULL && stream->data == (void *)transport && stream->type == UV_TCP;
    return Py_BuildValue("(OO)", ours && stream->alloc_cb == quiet_alloc ? Py_True : Py_False,
                         ours && stream->read_cb == quiet_read ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"quiet", (PyCFunction)(void (*)(void))quiet, METH_FASTCALL,
     "quiet(transport, loop, protocol) -> bool: this stream's reads take the GIL once, not "
     "twice (and go to a C data_received directly)."},
    {"quieted", quieted, METH_O,
     "quieted(transport) -> (bool, bool): are its buffer and read callbacks this module's?"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_uvread", NULL, 0, methods};

PyMODINIT_FUNC PyInit__uvread(void) {
    str_data_received = PyUnicode_InternFromString("data_received");
    str_call_exception_handler = PyUnicode_InternFromString("call_exception_handler");
    if (str_data_received == NULL || str_call_exception_handler == NULL) return NULL;
    return PyModule_Create(&module);
}
