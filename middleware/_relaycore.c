/* middleware/_relaycore.c: `Tally` and `RelayCore` of middleware/relaycore.py, compiled.
 *
 * The same classes, line for line: the same fields (as C members), `Tally.add` (a C function
 * only: only `_account` calls it), `send_nowait`, `_account` and `_relayed`, each Python line
 * as a comment above its C. Read it beside relaycore.py; a change to one is a change to the
 * other (SIDESTREAM_NO_EXTENSIONS=1 picks the Python one). `advance` is sse.advance.
 *
 * RelayCore is subclassed by relay.Relay (Python), which uses these fields like slots; its
 * `_relayed` may be overridden (telemetry's ObservedCycle's is called, else the compiled one
 * directly). A token chunk of the tally's `frame` goes to the tally, a C struct (C integers:
 * no int made per token): no Python call unless the frame is Python's or a fold is due.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

/* Set once at import: Phase.BODY and the five LineState members, in value order. */
static PyObject *BODY = NULL, *STATES[5] = {NULL};
enum { EVENT, LINE, MID, CR_LINE, CR_EVENT };
static const int AFTER_LF[5] = {EVENT, EVENT, LINE, LINE, EVENT};
static const int AFTER_CR[5] = {CR_EVENT, CR_EVENT, CR_LINE, CR_EVENT, CR_EVENT};

static PyObject *str_ends, *str_undo, *str_scan, *str_relayed, *str_matches;
static PyObject *relayed_descr = NULL; /* RelayCore._relayed, to spot an override */
static PyTypeObject *TallyType = NULL;

typedef struct {
    PyObject_HEAD
    Py_ssize_t body_bytes, chunks, kept;
    PyObject *fold, *frame, *times;
} Tally;

typedef struct {
    PyObject_HEAD
    PyObject *edit, *first_token_at, *inflater, *keepalive, *line_state, *phase, *reason;
    PyObject *scanner, *sending_since, *server_nowait, *tally;
    /* edit.ends, read once when the edit is set (an edit's `ends` is fixed): whether it is
     * None (every chunk is the edit's), else its bytes as a 256-bit set */
    char edit_every;
    unsigned char edit_ends[32];
    double last_chunk, last_write;
    Py_ssize_t slice_bytes;
} RelayCore;

#define FIELDS_BUT_EDIT(X) \
    X(first_token_at) X(inflater) X(keepalive) X(line_state) X(phase) X(reason) X(scanner) \
    X(sending_since) X(server_nowait) X(tally)
#define FIELDS(X) X(edit) FIELDS_BUT_EDIT(X)
#define TALLY_FIELDS(X) X(fold) X(frame) X(times)

/* `del tally.frame` leaves a field NULL: where a field is read, that is AttributeError, as
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
    Py_SETREF(self->line_state, Py_NewRef(STATES[next]));
    return 0;
}

/* RelayCore_relayed and RelayCore_account: `_relayed` and `_account` as methods */
#define BODY_NOW_METHOD(fn)                                                                     \
    static PyObject *RelayCore_##fn(RelayCore *self, PyObject *const *args, Py_ssize_t nargs) { \
        int fits = nargs == 2 && PyBytes_Check(args[0]);                                        \
        double now = fits ? PyFloat_AsDouble(args[1]) : -1.0;                                   \
        if (!fits) PyErr_SetString(PyExc_TypeError, "_" #fn "(body: bytes, now: float)");       \
        if ((now == -1.0 && PyErr_Occurred()) || fn(self, args[0], now) < 0) return NULL;       \
        Py_RETURN_NONE;                                                                         \
    }
BODY_NOW_METHOD(relayed)

/* Tally: def add(self, body, now) */
static int add(Tally *self, PyObject *body, double now) {
    /* self.chunks += 1 */
    self->chunks += 1;
    /* self.body_bytes += len(body) */
    self->body_bytes += PyBytes_GET_SIZE(body);
    /* times = self.times */
    PyObject *times = self->times;
    if (unset(times, "times") || !PyList_Check(times)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "times is a list");
        return -1;
    }
    /* times.append(now) */
    PyObject *at = PyFloat_FromDouble(now);
    int appended = at == NULL ? -1 : PyList_Append(times, at);
    Py_XDECREF(at);
    if (appended < 0) return -1;
    /* if len(times) >= self.kept: self.fold() */
    if (PyList_GET_SIZE(times) < self->kept) return 0;
    if (unset(self->fold, "fold")) return -1;
    PyObject *fold = Py_NewRef(self->fold), *r = PyObject_CallNoArgs(fold);
    Py_DECREF(fold);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
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
    /* tally = self.tally
     * if tally is not None and tally.frame is not None and tally.frame.matches(body):
     *     self.last_chunk = now; tally.add(body, now) */
    if (unset(self->tally, "tally")) return -1;
    Tally *tally = (Tally *)self->tally;
    if ((PyObject *)tally != Py_None) {
        if (!Py_IS_TYPE(tally, TallyType) || unset(tally->frame, "frame")) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "tally is a Tally");
            return -1;
        }
        Py_INCREF(tally); /* `matches` and `fold` may replace self.tally */
        int ok = tally->frame == Py_None ? 0 : matches(tally->frame, body);
        if (ok > 0) {
            self->last_chunk = now;
            ok = add(tally, body, now) < 0 ? -1 : 1;
        }
        Py_DECREF(tally);
        if (ok) return ok < 0 ? -1 : 0;
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
BODY_NOW_METHOD(account)

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

/* -- the types: fields, GC, construction ----------------------------------------------- */

/* tp_traverse, tp_clear and tp_dealloc of `Type`, whose object fields `FIELDS` lists */
#define VISIT(name) Py_VISIT(self->name);
#define CLEAR(name) Py_CLEAR(self->name);
#define GC_SLOTS(Type, FIELDS)                                                                   \
    static int Type##_traverse(Type *self, visitproc visit, void *arg) {                         \
        Py_VISIT(Py_TYPE(self));                                                                 \
        FIELDS(VISIT) return 0;                                                                  \
    }                                                                                            \
    static int Type##_clear(Type *self) { FIELDS(CLEAR) return 0; }                              \
    static void Type##_dealloc(Type *self) {                                                     \
        PyTypeObject *type = Py_TYPE(self);                                                      \
        PyObject_GC_UnTrack(self);                                                               \
        Type##_clear(self);                                                                      \
        type->tp_free((PyObject *)self);                                                         \
        Py_DECREF(type);                                                                         \
    }
GC_SLOTS(Tally, TALLY_FIELDS)
GC_SLOTS(RelayCore, FIELDS)

static PyObject *Tally_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"times", "kept", "fold", NULL};
    PyObject *times, *fold;
    Py_ssize_t kept;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OnO:Tally", names, &times, &kept, &fold))
        return NULL;
    Tally *self = (Tally *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->times = Py_NewRef(times);
    self->kept = kept;
    self->fold = Py_NewRef(fold);
    self->frame = Py_NewRef(Py_None);
    return (PyObject *)self;
}

static PyObject *RelayCore_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    RelayCore *self = (RelayCore *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
#define INIT(name) self->name = Py_NewRef(Py_None);
    FIELDS(INIT)
#undef INIT
    Py_SETREF(self->line_state, Py_NewRef(STATES[EVENT]));
    return (PyObject *)self;
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

#define MEMBER(Type, name) {#name, T_OBJECT_EX, offsetof(Type, name), 0, NULL},
#define CORE_MEMBER(name) MEMBER(RelayCore, name)
static PyMemberDef Tally_members[] = {
    MEMBER(Tally, fold) MEMBER(Tally, frame) MEMBER(Tally, times)
    {"body_bytes", T_PYSSIZET, offsetof(Tally, body_bytes), 0, NULL},
    {"chunks", T_PYSSIZET, offsetof(Tally, chunks), 0, NULL},
    {"kept", T_PYSSIZET, offsetof(Tally, kept), 0, NULL},
    {NULL},
};

static PyMemberDef RelayCore_members[] = {
    FIELDS_BUT_EDIT(CORE_MEMBER)
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

static PyType_Slot Tally_slots[] = {
    {Py_tp_doc, "What the token path counts of one stream (middleware/relaycore.py, compiled)."},
    {Py_tp_new, Tally_new},
    {Py_tp_dealloc, Tally_dealloc},
    {Py_tp_traverse, Tally_traverse},
    {Py_tp_clear, Tally_clear},
    {Py_tp_members, Tally_members},
    {0, NULL},
};

static PyType_Spec Tally_spec = {
    .name = "middleware._relaycore.Tally",
    .basicsize = sizeof(Tally),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = Tally_slots,
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

/* `from module import name`, or NULL with an error */
static PyObject *imported(const char *module, const char *name) {
    PyObject *found = PyImport_ImportModule(module);
    Py_XSETREF(found, found == NULL ? NULL : PyObject_GetAttrString(found, name));
    return found;
}

/* Phase.BODY and the five LineState members, from their modules, once */
static int load_constants(void) {
    PyObject *phase = imported("middleware.phases", "Phase");
    BODY = phase == NULL ? NULL : PyObject_GetAttrString(phase, "BODY");
    Py_XDECREF(phase);
    PyObject *states = BODY == NULL ? NULL : imported("middleware.sse", "LineState");
    for (int i = 0; i < 5 && states != NULL; i++) /* LineState(i) */
        if ((STATES[i] = PyObject_CallFunction(states, "i", i)) == NULL) Py_CLEAR(states);
    int loaded = states != NULL;
    Py_XDECREF(states);
    return loaded ? 0 : -1;
}

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "middleware._relaycore", NULL, -1, NULL,
};

PyMODINIT_FUNC PyInit__relaycore(void) {
    PyObject **strs[] = {&str_ends, &str_undo, &str_scan, &str_relayed, &str_matches};
    const char *texts[] = {"ends", "undo", "_scan", "_relayed", "matches"};
    for (int i = 0; i < 5; i++)
        if ((*strs[i] = PyUnicode_InternFromString(texts[i])) == NULL) return NULL;
    if (load_constants() < 0) return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    TallyType = (PyTypeObject *)PyType_FromSpec(&Tally_spec); /* kept: `_account` checks it */
    PyTypeObject *type = (PyTypeObject *)PyType_FromSpec(&RelayCore_spec);
    if (TallyType == NULL || type == NULL || PyModule_AddType(module, TallyType) < 0 ||
        PyModule_AddType(module, type) < 0) {
        Py_XDECREF(type);
        Py_DECREF(module);
        return NULL;
    }
    relayed_descr = Py_XNewRef(_PyType_Lookup(type, str_relayed));
    Py_DECREF(type); /* the module holds it */
    return module;
}
