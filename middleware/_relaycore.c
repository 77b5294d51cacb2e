/* middleware/_relaycore.c: `RelayCore` of middleware/relaycore.py, compiled.
 *
 * The same class, line for line: the same fields (as C members), `send_nowait`, `_account`,
 * `_tally` and `_relayed`, each Python line as a comment above its C (`_tally` is a C
 * function only: nothing but `_account` calls it). Read it beside relaycore.py; a
 * change to one is a change to the other (the test suite runs once with each:
 * SIDESTREAM_NO_EXTENSIONS=1 picks the Python one). `advance` is sse.advance.
 *
 * Subclassed by relay.Relay (Python), which reads and writes these fields like slots.
 * `_relayed` may be overridden (telemetry's ObservedCycle): `_account` calls the
 * override through the type; the compiled `_relayed` directly when there is none. A token
 * chunk of the stream's `frame` goes to the compiled `_tally` instead, which calls no
 * Python unless the frame is Python's (`frame.matches`) or the times are due a `_fold`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

/* Set once at import: Phase.BODY and the five LineState members, in value order. */
static PyObject *BODY = NULL;
static PyObject *STATES[5] = {NULL};
enum { EVENT, LINE, MID, CR_LINE, CR_EVENT };
static const int AFTER_LF[5] = {EVENT, EVENT, LINE, LINE, EVENT};
static const int AFTER_CR[5] = {CR_EVENT, CR_EVENT, CR_LINE, CR_EVENT, CR_EVENT};

static PyObject *str_ends, *str_undo, *str_scan, *str_relayed, *str_matches, *str_times_kept,
    *str_fold;
static PyObject *relayed_descr = NULL; /* RelayCore._relayed, to spot an override */

typedef struct {
    PyObject_HEAD
    Py_ssize_t body_bytes;
    Py_ssize_t chunks;
    PyObject *edit;
    /* edit.ends, read once when the edit is set (an edit's `ends` is fixed): whether it is
     * None (every chunk is the edit's), else its bytes as a 256-bit set */
    char edit_every;
    unsigned char edit_ends[32];
    PyObject *first_token_at;
    PyObject *frame;
    PyObject *inflater;
    PyObject *keepalive;
    double last_chunk;
    double last_write;
    PyObject *line_state;
    PyObject *phase;
    PyObject *reason;
    PyObject *scanner;
    PyObject *sending_since;
    PyObject *server_nowait;
    Py_ssize_t slice_bytes;
    PyObject *times;
} RelayCore;

#define FIELDS_BUT_EDIT(X) \
    X(first_token_at) X(frame) X(inflater) X(keepalive) X(line_state) X(phase) X(reason) \
    X(scanner) X(sending_since) X(server_nowait) X(times)
#define FIELDS(X) X(edit) FIELDS_BUT_EDIT(X)

/* `del core.frame` leaves a field NULL: where a field is read, that is AttributeError, as
 * the twin's empty slot raises when read (1 then, else 0) */
static int unset(PyObject *field, const char *name) {
    if (field != NULL) return 0;
    PyErr_SetString(PyExc_AttributeError, name);
    return 1;
}

/* time.monotonic(): the same clock (CLOCK_MONOTONIC), as a float of seconds */
static double monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* sse.advance(state, chunk): the line state after `chunk`, from its last 3 bytes */
static int advance(int state, const unsigned char *chunk, Py_ssize_t n) {
    if (n >= 2 && chunk[n - 1] == '\n' && chunk[n - 2] == '\n') return EVENT;
    if (n == 0) return state;
    if (chunk[n - 1] != '\n' && chunk[n - 1] != '\r') return MID;
    Py_ssize_t i = 0;
    if (n >= 3) {
        state = MID;
        i = n - 3;
    }
    for (; i < n; i++) {
        if (chunk[i] == '\n') state = AFTER_LF[state];
        else if (chunk[i] == '\r') state = AFTER_CR[state];
        else state = MID;
    }
    return state;
}

static int set_field(PyObject **field, PyObject *value) {
    Py_INCREF(value);
    Py_XSETREF(*field, value);
    return 0;
}

/* def _relayed(self, body, now) */
static int relayed(RelayCore *self, PyObject *body, double now) {
    if (unset(self->scanner, "scanner") || unset(self->first_token_at, "first_token_at"))
        return -1;
    /* self.last_chunk = now */
    self->last_chunk = now;
    if (self->scanner != Py_None) {
        /* self._scan(body, now) */
        PyObject *at = PyFloat_FromDouble(now);
        if (at == NULL) return -1;
        PyObject *args[3] = {(PyObject *)self, body, at};
        PyObject *r = PyObject_VectorcallMethod(
            str_scan, args, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(at);
        if (r == NULL) return -1;
        Py_DECREF(r);
    } else if (self->first_token_at == Py_None) {
        /* self.first_token_at = now */
        PyObject *at = PyFloat_FromDouble(now);
        if (at == NULL) return -1;
        Py_SETREF(self->first_token_at, at);
    }
    /* self.line_state = advance(self.line_state, body) */
    if (unset(self->line_state, "line_state")) return -1; /* _scan may have deleted it */
    long state = PyLong_AsLong(self->line_state);
    if (state < 0 || state > 4) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "line_state out of range");
        return -1;
    }
    int next = advance((int)state, (const unsigned char *)PyBytes_AS_STRING(body),
                       PyBytes_GET_SIZE(body));
    return set_field(&self->line_state, STATES[next]);
}

static PyObject *RelayCore_relayed(RelayCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "_relayed(body: bytes, now: float)");
        return NULL;
    }
    double now = PyFloat_AsDouble(args[1]);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    if (relayed(self, args[0], now) < 0) return NULL;
    Py_RETURN_NONE;
}

/* def _tally(self, body, now) */
static int tally(RelayCore *self, PyObject *body, double now) {
    if (unset(self->times, "times")) return -1;
    /* self.chunks += 1 */
    self->chunks += 1;
    /* self.body_bytes += len(body) */
    self->body_bytes += PyBytes_GET_SIZE(body);
    /* self.last_chunk = now */
    self->last_chunk = now;
    /* times = self.times */
    PyObject *times = self->times;
    if (!PyList_Check(times)) {
        PyErr_SetString(PyExc_TypeError, "times is a list");
        return -1;
    }
    /* times.append(now) */
    PyObject *at = PyFloat_FromDouble(now);
    if (at == NULL) return -1;
    int appended = PyList_Append(times, at);
    Py_DECREF(at);
    if (appended < 0) return -1;
    /* if len(times) >= self.times_kept: (a class attribute) */
    PyObject *kept = _PyType_Lookup(Py_TYPE(self), str_times_kept);
    if (kept == NULL) {
        PyErr_SetString(PyExc_AttributeError, "times_kept");
        return -1;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(kept);
    if (limit == -1 && PyErr_Occurred()) return -1;
    if (PyList_GET_SIZE(times) >= limit) {
        /* self._fold() */
        PyObject *r = PyObject_CallMethodNoArgs((PyObject *)self, str_fold);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* `frame.matches(body)`: 1, 0, or -1 with an error. A `matches` written in C taking one
 * argument (the compiled Frame's) is called through its function: no bound-method lookup
 * and call per token. Anything else (the Python Frame, an override) is called as Python. */
static int matches(PyObject *frame, PyObject *body) {
    PyObject *r, *method = _PyType_Lookup(Py_TYPE(frame), str_matches);
    Py_INCREF(frame); /* the call may replace self.frame */
    if (method != NULL && Py_IS_TYPE(method, &PyMethodDescr_Type) &&
        ((PyMethodDescrObject *)method)->d_method->ml_flags == METH_O &&
        PyObject_TypeCheck(frame, PyDescr_TYPE(method))) {
        r = ((PyMethodDescrObject *)method)->d_method->ml_meth(frame, body);
    } else {
        PyObject *args[2] = {frame, body};
        r = PyObject_VectorcallMethod(str_matches, args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    Py_DECREF(frame);
    if (r == NULL) return -1;
    int ok = r == Py_True ? 1 : r == Py_False ? 0 : PyObject_IsTrue(r);
    Py_DECREF(r);
    return ok;
}

/* The server's write: `self.server_nowait(body)`, True when written */
static int server_write(RelayCore *self, PyObject *body) {
    PyObject *r = PyObject_CallOneArg(self->server_nowait, body);
    if (r == NULL) return -1;
    int ok = PyObject_IsTrue(r);
    Py_DECREF(r);
    return ok;
}

/* `(ends := edit.ends) is not None and len(body) > 3 and body[-1] == 10
 *  and body[-4] not in ends`: the edit leaves this chunk as it is (no call) */
static int passes_edit(RelayCore *self, PyObject *body) {
    Py_ssize_t n = PyBytes_GET_SIZE(body);
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(body);
    if (self->edit_every || n <= 3 || b[n - 1] != 10) return 0;
    return !(self->edit_ends[b[n - 4] >> 3] & (1 << (b[n - 4] & 7)));
}

/* def _account(self, body, now) */
static int account(RelayCore *self, PyObject *body, double now) {
    if (unset(self->frame, "frame")) return -1;
    /* frame = self.frame
     * if frame is not None and frame.matches(body): self._tally(body, now) */
    PyObject *frame = self->frame;
    if (frame != Py_None) {
        int ok = matches(frame, body);
        if (ok < 0) return -1;
        if (ok) return tally(self, body, now);
    }
    /* else: self._relayed(body, now): the compiled one unless a subclass overrides it */
    PyObject *method = _PyType_Lookup(Py_TYPE(self), str_relayed);
    if (method == relayed_descr) return relayed(self, body, now);
    PyObject *at = PyFloat_FromDouble(now);
    if (at == NULL) return -1;
    PyObject *args[3] = {(PyObject *)self, body, at};
    PyObject *r = PyObject_VectorcallMethod(
        str_relayed, args, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(at);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *RelayCore_account(RelayCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "_account(body: bytes, now: float)");
        return NULL;
    }
    double now = PyFloat_AsDouble(args[1]);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    if (account(self, args[0], now) < 0) return NULL;
    Py_RETURN_NONE;
}

/* def send_nowait(self, body) -> bool */
static PyObject *RelayCore_send_nowait(RelayCore *self, PyObject *body) {
    if (unset(self->phase, "phase") || unset(self->reason, "reason") ||
        unset(self->sending_since, "sending_since") || unset(self->keepalive, "keepalive") ||
        unset(self->inflater, "inflater") || unset(self->server_nowait, "server_nowait"))
        return NULL;
    if (!PyBytes_Check(body)) {
        PyErr_SetString(PyExc_TypeError, "send_nowait(body: bytes)");
        return NULL;
    }
    if (self->phase != BODY || self->reason != Py_None || self->sending_since != Py_None ||
        self->keepalive != Py_None || self->inflater != Py_None ||
        self->server_nowait == Py_None ||
        (0 < self->slice_bytes && self->slice_bytes < PyBytes_GET_SIZE(body)))
        Py_RETURN_FALSE;
    /* edit = self.edit */
    PyObject *edit = self->edit;
    if (edit == Py_None || passes_edit(self, body)) {
        /* if not self.server_nowait(body): return False */
        int ok = server_write(self, body);
        if (ok < 0) return NULL;
        if (!ok) Py_RETURN_FALSE;
    } else {
        /* out = edit(body) */
        Py_INCREF(edit); /* the call may replace self.edit */
        PyObject *out = PyObject_CallOneArg(edit, body);
        if (out == NULL) {
            Py_DECREF(edit);
            return NULL;
        }
        /* if out and not self.server_nowait(out): edit.undo(); return False */
        int truth = PyObject_IsTrue(out); /* raising, it writes nothing */
        int ok = truth < 0 ? -1 : truth ? server_write(self, out) : 1;
        Py_DECREF(out);
        if (ok == 0) {
            PyObject *r = PyObject_CallMethodNoArgs(edit, str_undo);
            Py_XDECREF(r);
            Py_DECREF(edit);
            if (r == NULL) return NULL;
            Py_RETURN_FALSE;
        }
        Py_DECREF(edit);
        if (ok < 0) return NULL;
    }
    /* self.last_write = now = monotonic() */
    double now = self->last_write = monotonic();
    /* self._account(body, now) */
    if (account(self, body, now) < 0) return NULL;
    Py_RETURN_TRUE;
}

/* -- the type: fields, GC, construction ------------------------------------------------ */


static PyObject *RelayCore_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    RelayCore *self = (RelayCore *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
#define INIT(name) self->name = Py_NewRef(Py_None);
    FIELDS(INIT)
#undef INIT
    Py_SETREF(self->line_state, Py_NewRef(STATES[EVENT]));
    return (PyObject *)self;
}

static int RelayCore_traverse(RelayCore *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
#define VISIT(name) Py_VISIT(self->name);
    FIELDS(VISIT)
#undef VISIT
    return 0;
}

static int RelayCore_clear(RelayCore *self) {
#define CLEAR(name) Py_CLEAR(self->name);
    FIELDS(CLEAR)
#undef CLEAR
    return 0;
}

static void RelayCore_dealloc(RelayCore *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    RelayCore_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyObject *RelayCore_get_edit(RelayCore *self, void *closure) {
    return Py_NewRef(self->edit ? self->edit : Py_None);
}

/* self.edit = value: also reads value.ends into edit_every / edit_ends */
static int RelayCore_set_edit(RelayCore *self, PyObject *value, void *closure) {
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "edit cannot be deleted");
        return -1;
    }
    unsigned char ends_map[32] = {0};
    char every = 1;
    if (value != Py_None) {
        PyObject *ends = PyObject_GetAttr(value, str_ends);
        if (ends == NULL) return -1;
        if (ends != Py_None) {
            every = 0;
            PyObject *it = PyObject_GetIter(ends), *item;
            if (it == NULL) {
                Py_DECREF(ends);
                return -1;
            }
            while ((item = PyIter_Next(it)) != NULL) {
                long byte = PyLong_AsLong(item);
                Py_DECREF(item);
                if (byte < 0 || byte > 255) {
                    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "ends holds bytes");
                    break;
                }
                ends_map[byte >> 3] |= (unsigned char)(1 << (byte & 7));
            }
            Py_DECREF(it);
        }
        Py_DECREF(ends);
        if (PyErr_Occurred()) return -1;
    }
    self->edit_every = every;
    memcpy(self->edit_ends, ends_map, sizeof ends_map);
    Py_XSETREF(self->edit, Py_NewRef(value));
    return 0;
}

static PyGetSetDef RelayCore_getset[] = {
    {"edit", (getter)RelayCore_get_edit, (setter)RelayCore_set_edit, NULL, NULL},
    {NULL},
};

static PyMemberDef RelayCore_members[] = {
#define MEMBER(name) {#name, T_OBJECT_EX, offsetof(RelayCore, name), 0, NULL},
    FIELDS_BUT_EDIT(MEMBER)
#undef MEMBER
    {"body_bytes", T_PYSSIZET, offsetof(RelayCore, body_bytes), 0, NULL},
    {"chunks", T_PYSSIZET, offsetof(RelayCore, chunks), 0, NULL},
    {"last_chunk", T_DOUBLE, offsetof(RelayCore, last_chunk), 0, NULL},
    {"last_write", T_DOUBLE, offsetof(RelayCore, last_write), 0, NULL},
    {"slice_bytes", T_PYSSIZET, offsetof(RelayCore, slice_bytes), 0, NULL},
    {NULL},
};

static PyMethodDef RelayCore_methods[] = {
    {"send_nowait", (PyCFunction)RelayCore_send_nowait, METH_O, NULL},
    {"_account", (PyCFunction)(void (*)(void))RelayCore_account, METH_FASTCALL, NULL},
    {"_relayed", (PyCFunction)(void (*)(void))RelayCore_relayed, METH_FASTCALL, NULL},
    {NULL},
};

static PyType_Slot RelayCore_slots[] = {
    {Py_tp_doc, "A stream's per-chunk state and methods (middleware/relaycore.py, compiled)."},
    {Py_tp_new, RelayCore_new},
    {Py_tp_dealloc, RelayCore_dealloc},
    {Py_tp_traverse, RelayCore_traverse},
    {Py_tp_clear, RelayCore_clear},
    {Py_tp_members, RelayCore_members},
    {Py_tp_getset, RelayCore_getset},
    {Py_tp_methods, RelayCore_methods},
    {0, NULL},
};

static PyType_Spec RelayCore_spec = {
    .name = "middleware._relaycore.RelayCore",
    .basicsize = sizeof(RelayCore),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = RelayCore_slots,
};

/* Phase.BODY and the five LineState members, from their modules, once */
static int load_constants(void) {
    PyObject *phases = PyImport_ImportModule("middleware.phases");
    PyObject *phase = phases == NULL ? NULL : PyObject_GetAttrString(phases, "Phase");
    Py_XDECREF(phases);
    BODY = phase == NULL ? NULL : PyObject_GetAttrString(phase, "BODY");
    Py_XDECREF(phase);
    if (BODY == NULL) return -1;
    PyObject *sse = PyImport_ImportModule("middleware.sse");
    PyObject *states = sse == NULL ? NULL : PyObject_GetAttrString(sse, "LineState");
    Py_XDECREF(sse);
    if (states == NULL) return -1;
    for (int i = 0; i < 5; i++) {
        STATES[i] = PyObject_CallFunction(states, "i", i); /* LineState(i) */
        if (STATES[i] == NULL) {
            Py_DECREF(states);
            return -1;
        }
    }
    Py_DECREF(states);
    return 0;
}

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "middleware._relaycore", NULL, -1, NULL,
};

PyMODINIT_FUNC PyInit__relaycore(void) {
    str_ends = PyUnicode_InternFromString("ends");
    str_undo = PyUnicode_InternFromString("undo");
    str_scan = PyUnicode_InternFromString("_scan");
    str_relayed = PyUnicode_InternFromString("_relayed");
    str_matches = PyUnicode_InternFromString("matches");
    str_times_kept = PyUnicode_InternFromString("times_kept");
    str_fold = PyUnicode_InternFromString("_fold");
    if (!str_ends || !str_undo || !str_scan || !str_relayed || !str_matches || !str_times_kept ||
        !str_fold)
        return NULL;
    if (load_constants() < 0) return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    PyObject *type = PyType_FromSpec(&RelayCore_spec);
    if (type == NULL || PyModule_AddObject(module, "RelayCore", type) < 0) {
        Py_XDECREF(type);
        Py_DECREF(module);
        return NULL;
    }
    relayed_descr = _PyType_Lookup((PyTypeObject *)type, str_relayed);
    Py_XINCREF(relayed_descr);
    return module;
}
