/* uvloop's read-buffer callback without the GIL: `sidecar/servers/uvloop_internals.py` says
 * why it holds and which releases it was checked against; this file only does it.
 *
 * uvloop runs libuv with the GIL released, and every libuv callback it gives takes the GIL
 * and drops it again (`with gil`). For each read libuv makes two: the buffer callback
 * (`__loop_alloc_buffer`) and the read callback. The first does no Python at all: it hands
 * out the loop's one receive buffer and marks it in use. `quiet(transport, loop)` puts this
 * file's `quiet_alloc`, which does the same without the GIL, in that stream's buffer slot.
 *
 * Every layout it reads is checked before the slot is written, or nothing is written:
 * - libuv 1.x's public head of `uv_handle_t` and `uv_stream_t` (below; ABI-stable in 1.x):
 *   the handle's `data` must be the transport itself and its type TCP;
 * - uvloop's `UVHandle` (`handles/handle.pxd`): after the object head and Cython's vtable
 *   pointer come `_handle` and `_loop`; `_loop` must be the loop passed in;
 * - uvloop's `Loop` (`loop.pxd`): `_recv_buffer`, then `_recv_buffer_in_use`. Learned by
 *   calling uvloop's own buffer callback once per loop (GIL held): the flag it sets must be
 *   the int right after the buffer it gives, and the buffer must lie inside the loop object.
 * uvloop puts its own callback back whenever it starts reading again (`resume_reading`), so
 * `quiet` is asked again then; a stream left with uvloop's callback only runs slower.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

typedef struct { char *base; size_t len; } uv_buf;
typedef struct uv_stream_head uv_stream_head;
typedef void (*alloc_fn)(uv_stream_head *, size_t, uv_buf *);

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
    void *read_cb;
};

enum { UV_TCP = 12 };

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

/* Learn where `loop`'s receive buffer is with uvloop's own callback; 0 when the layout is
 * not the one described above. */
static int learn(uv_stream_head *stream, PyObject *loop) {
    uv_buf buf = {NULL, 0};
    stream->alloc_cb(stream, 65536, &buf);
    char *base = (char *)loop;
    Py_ssize_t size = (Py_ssize_t)_PyObject_SIZE(Py_TYPE(loop));
    if (buf.base == NULL || buf.base < base || buf.len == 0 ||
        buf.base + buf.len + sizeof(int) > base + size) {
        return 0;
    }
    int *flag = (int *)(buf.base + buf.len);
    if (*flag != 1) return 0;
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
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "quiet(transport, loop)");
        return NULL;
    }
    if (Py_TYPE(args[0])->tp_basicsize < (Py_ssize_t)sizeof(uv_handle_obj)) Py_RETURN_FALSE;
    uv_handle_obj *transport = (uv_handle_obj *)args[0];
    PyObject *loop = args[1];
    uv_stream_head *stream = transport->handle;
    if (stream == NULL || stream->data != (void *)transport || stream->type != UV_TCP ||
        transport->loop != loop || stream->read_cb == NULL) {
        Py_RETURN_FALSE;
    }
    if (stream->alloc_cb == quiet_alloc) Py_RETURN_TRUE;
    if (uvloop_alloc == NULL) uvloop_alloc = stream->alloc_cb;
    if (stream->alloc_cb != uvloop_alloc) Py_RETURN_FALSE;
    if (loop != learned_loop && !learn(stream, loop)) Py_RETURN_FALSE;
    stream->alloc_cb = quiet_alloc;
    Py_RETURN_TRUE;
}

/* Is `transport`'s stream reading with `quiet_alloc`? (the tests' view of the slot) */
static PyObject *quieted(PyObject *module, PyObject *transport) {
    (void)module;
    uv_stream_head *stream = Py_TYPE(transport)->tp_basicsize < (Py_ssize_t)sizeof(uv_handle_obj)
                                 ? NULL
                                 : ((uv_handle_obj *)transport)->handle;
    int yes = stream != NULL && stream->data == (void *)transport && stream->type == UV_TCP &&
              stream->alloc_cb == quiet_alloc;
    return PyBool_FromLong(yes);
}

static PyMethodDef methods[] = {
    {"quiet", (PyCFunction)(void (*)(void))quiet, METH_FASTCALL,
     "quiet(transport, loop) -> bool: this stream's reads take the GIL once, not twice."},
    {"quieted", quieted, METH_O, "quieted(transport) -> bool: do they now?"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_uvread", NULL, 0, methods};

PyMODINIT_FUNC PyInit__uvread(void) { return PyModule_Create(&module); }
