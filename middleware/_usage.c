/* middleware/_usage.c: forced usage's two JSON questions (middleware/usage.py), answered
 * without building the JSON's objects.
 *
 * usage.py asks them of every streaming request and of a stream's last chunk, and answers
 * them with the json module: the request body parsed whole into Python objects (a long chat
 * history's every string and number, before the upstream hears of the request) and the
 * usage chunk parsed to see that it is one. Here one pass over the bytes checks them
 * against JSON's grammar and looks at the top level's keys:
 *
 * - `request(body)`: where to insert `stream_options` (the offset of the closing brace),
 *   UNCHANGED when usage.rewrite would forward the body as it is, or ASK.
 * - `hide(body)`: what usage_hide.HideUsage makes of a chunk of whole one-line `data:` events
 *   at an event boundary, LF only: the usage-only events dropped, a top-level
 *   `"usage": null` member cut out; or None: ASK.
 *
 * ASK means "usage.py decides": the grammar here is a strict part of what the json module
 * reads the same way, and whatever lies outside it is left to usage.py, so an answer given
 * here is the one usage.py would give. Outside it: an escaped key (`"str\u0065am"` is
 * `stream`, and two keys may differ only in their escapes), NaN and Infinity, nesting
 * deeper than MAX_DEPTH, an object with more than MAX_KEYS keys (duplicates are checked
 * pairwise), an integer of more than MAX_DIGITS digits (Python's int() refuses beyond
 * 4300), and anything not UTF-8 (the json module may read another encoding).
 * Inside it: UTF-8 as Python's strict decoder takes it (no overlong form, no surrogate, at
 * most U+10FFFF), RFC 8259 (whitespace is space, tab, LF, CR; a string holds no control
 * character; a number has no leading zero), which is what json's C scanner reads.
 * The test suite runs usage.py's tests with and without this module, and
 * tests/unit/test_usage_twins.py checks that every answer given here is usage.py's (and
 * usage_hide.py's).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

enum { MAX_DEPTH = 64, MAX_KEYS = 64, MAX_DIGITS = 4000 };
enum { ASK = -1, UNCHANGED = -2 };

/* What a top-level key's last value was, for the keys asked about */
enum { NONE = 0, TRUE_, EMPTY_ARRAY, OBJECT, NULL_, OTHER };

typedef struct {
    const unsigned char *p, *end;
    int depth;
    int duplicate; /* some object holds one key twice */
    /* the top-level object's keys asked about: their last value (a dict keeps the last) */
    int stream, stream_options, choices, usage;
    /* what takes the top-level usage member out: [cut, resume), its comma included */
    const unsigned char *cut, *resume;
} Scan;

/* The first `needle` (`m` bytes) in `s` (`n` bytes), or NULL. `memchr` skips to each place
 * the needle's byte `k` is, one that is rare in a chunk (in `"usage"` its `g`: quotes are a
 * sixth of a JSON chunk's bytes); glibc's `memmem` sets up tables first, which cost more
 * than the search in a chunk of a few hundred bytes. */
static const char *find(const char *s, Py_ssize_t n, const char *needle, Py_ssize_t m,
                        Py_ssize_t k) {
    if (n < m) return NULL;
    const char *at = s + k, *end = s + n - (m - k - 1); /* where needle[k] may be */
    while (at < end && (at = memchr(at, needle[k], (size_t)(end - at))) != NULL) {
        if (memcmp(at - k, needle, m) == 0) return at - k;
        at++;
    }
    return NULL;
}

#define USAGE "\"usage\"", 7, 4 /* `"usage"`, found by its `g` */

static void blanks(Scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static int is_hex(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int is_cont(const unsigned char *p, const unsigned char *end, int n) {
    for (int i = 0; i < n; i++)
        if (p + i >= end || (p[i] & 0xC0) != 0x80) return 0;
    return 1;
}

/* The length of the UTF-8 sequence at `p` as Python's strict decoder takes it, 0 if none */
static int utf8(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    if (c >= 0xC2 && c <= 0xDF) return is_cont(p + 1, end, 1) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (p + 1 >= end) return 0;
        unsigned char d = p[1];
        if ((c == 0xE0 && d < 0xA0) || (c == 0xED && d > 0x9F)) return 0; /* overlong, surrogate */
        return is_cont(p + 1, end, 2) ? 3 : 0;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (p + 1 >= end) return 0;
        unsigned char d = p[1];
        if ((c == 0xF0 && d < 0x90) || (c == 0xF4 && d > 0x8F)) return 0; /* overlong, > U+10FFFF */
        return is_cont(p + 1, end, 3) ? 4 : 0;
    }
    return 0;
}

/* The bytes a string holds as they are: ASCII but the quote, the backslash and controls */
static unsigned char PLAIN[256];

/* A string at `s->p` (its opening quote); `*escaped` when it holds an escape. 0, or -1 */
static int string(Scan *s, int *escaped) {
    const unsigned char *p = s->p + 1, *end = s->end;
    *escaped = 0;
    while (p < end) {
        while (p < end && PLAIN[*p]) p++; /* the usual run: nothing to check but its end */
        if (p >= end) break;
        unsigned char c = *p;
        if (c == '"') {
            s->p = p + 1;
            return 0;
        }
        if (c < 0x20) return -1;
        if (c == '\\') {
            *escaped = 1;
            if (p + 1 >= end) return -1;
            c = p[1];
            if (c == 'u') {
                if (end - p < 6 || !is_hex(p[2]) || !is_hex(p[3]) || !is_hex(p[4]) || !is_hex(p[5]))
                    return -1;
                p += 6;
            } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                       c == 'r' || c == 't') {
                p += 2;
            } else {
                return -1;
            }
        } else { /* past the run, neither quote nor backslash nor control: not ASCII */
            int n = utf8(p, end);
            if (n == 0) return -1;
            p += n;
        }
    }
    return -1;
}

static int digits(Scan *s) {
    const unsigned char *start = s->p;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') s->p++;
    return s->p > start ? 0 : -1;
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)? */
static int number(Scan *s) {
    const unsigned char *start = s->p;
    if (*s->p == '-') s->p++;
    if (s->p >= s->end) return -1;
    if (*s->p == '0') s->p++;
    else if (digits(s) < 0) return -1;
    if (s->p - start > MAX_DIGITS) return -1;
    if (s->p < s->end && *s->p == '.') {
        s->p++;
        if (digits(s) < 0) return -1;
    }
    if (s->p < s->end && (*s->p == 'e' || *s->p == 'E')) {
        s->p++;
        if (s->p < s->end && (*s->p == '+' || *s->p == '-')) s->p++;
        if (digits(s) < 0) return -1;
    }
    return 0;
}

static int literal(Scan *s, const char *word, size_t n) {
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0) return -1;
    s->p += n;
    return 0;
}

static int value(Scan *s, int *kind);

/* After a member or an element: the closing `close` (1), or a comma and the blanks after it
 * (0: another one follows), or -1 */
static int after(Scan *s, unsigned char close) {
    blanks(s);
    if (s->p >= s->end) return -1;
    if (*s->p == close) {
        s->p++;
        return 1;
    }
    if (*s->p != ',') return -1;
    s->p++;
    blanks(s);
    return 0;
}

static int key_is(const unsigned char *key, Py_ssize_t n, const char *name) {
    return (size_t)n == strlen(name) && memcmp(key, name, n) == 0;
}

/* An object at `s->p` (its `{`) */
static int object(Scan *s) {
    const unsigned char *keys[MAX_KEYS], *last = NULL; /* the end of the last value */
    Py_ssize_t lens[MAX_KEYS];
    int count = 0, top = s->depth == 1, kind, escaped;
    s->p++;
    blanks(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return 0;
    }
    while (1) {
        if (s->p >= s->end || *s->p != '"' || count == MAX_KEYS) return -1;
        const unsigned char *key = s->p + 1;
        if (string(s, &escaped) < 0 || escaped) return -1;
        Py_ssize_t n = s->p - 1 - key;
        for (int i = 0; i < count; i++)
            if (lens[i] == n && memcmp(keys[i], key, n) == 0) s->duplicate = 1;
        keys[count] = key;
        lens[count++] = n;
        blanks(s);
        if (s->p >= s->end || *s->p != ':') return -1;
        s->p++;
        blanks(s);
        if (value(s, &kind) < 0) return -1;
        const unsigned char *ended = s->p;
        int r = after(s, '}');
        if (top) {
            if (key_is(key, n, "stream")) s->stream = kind;
            else if (key_is(key, n, "stream_options")) s->stream_options = kind;
            else if (key_is(key, n, "choices")) s->choices = kind;
            else if (key_is(key, n, "usage")) { /* up to the next key, else from the last value */
                s->usage = kind;
                s->cut = r == 0 || last == NULL ? key - 1 : last;
                s->resume = r == 0 ? s->p : ended;
            }
        }
        last = ended;
        if (r != 0) return r < 0 ? -1 : 0;
    }
}

/* An array at `s->p` (its `[`); `*empty` when it holds nothing */
static int array(Scan *s, int *empty) {
    int kind;
    s->p++;
    blanks(s);
    *empty = s->p < s->end && *s->p == ']';
    if (*empty) {
        s->p++;
        return 0;
    }
    while (1) {
        if (value(s, &kind) < 0) return -1;
        int r = after(s, ']');
        if (r != 0) return r < 0 ? -1 : 0;
    }
}

/* A value at `s->p` (no blank before it); `*kind` says which, of the kinds asked about */
static int value(Scan *s, int *kind) {
    if (s->p >= s->end) return -1;
    int escaped, empty, r;
    *kind = OTHER;
    switch (*s->p) {
    case '{':
    case '[':
        if (++s->depth > MAX_DEPTH) return -1;
        if (*s->p == '{') {
            r = object(s);
            *kind = OBJECT;
        } else {
            r = array(s, &empty);
            if (empty) *kind = EMPTY_ARRAY;
        }
        s->depth--;
        return r;
    case '"':
        return string(s, &escaped);
    case 't':
        *kind = TRUE_;
        return literal(s, "true", 4);
    case 'f':
        return literal(s, "false", 5);
    case 'n':
        *kind = NULL_;
        return literal(s, "null", 4);
    default:
        return *s->p == '-' || (*s->p >= '0' && *s->p <= '9') ? number(s) : -1;
    }
}

/* One JSON value with blanks around it, and nothing else, in [p, end): its kind, or -1 */
static int document(Scan *s, const unsigned char *p, Py_ssize_t n) {
    int kind;
    memset(s, 0, sizeof *s);
    s->p = p;
    s->end = p + n;
    blanks(s);
    if (value(s, &kind) < 0) return -1;
    blanks(s);
    return s->p == s->end ? kind : -1;
}

/* def request(body: bytes) -> int: usage.rewrite's decision, for a body it may rewrite
 * (no larger than BODY_LIMIT: usage.py checks that first) */
static PyObject *request(PyObject *module, PyObject *body) {
    (void)module;
    if (!PyBytes_Check(body)) {
        PyErr_SetString(PyExc_TypeError, "request(body: bytes)");
        return NULL;
    }
    Scan s;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(body);
    int kind = document(&s, p, PyBytes_GET_SIZE(body));
    long answer = ASK;
    if (kind < 0) answer = ASK;                             /* outside the grammar here */
    else if (kind != OBJECT || s.duplicate) answer = UNCHANGED; /* not a dict, or refused */
    else if (s.stream != TRUE_) answer = UNCHANGED;           /* not `"stream": true` */
    else if (s.stream_options != NONE) answer = ASK;          /* amended, or the client's own */
    else { /* the object's closing brace: the last byte that is not a blank */
        const unsigned char *last = s.end - 1;
        while (*last != '}') last--;
        answer = (long)(last - p);
    }
    return PyLong_FromLong(answer);
}

/* def hide(body: bytes) -> bytes | None: usage_hide.HideUsage's edit of `body` at an event
 * boundary, for a body of whole events of one `data:` line each, LF only; None (ASK) for any
 * other body, and for an event whose usage is not dropped or cut here */
static PyObject *hide(PyObject *module, PyObject *body) {
    (void)module;
    if (!PyBytes_Check(body)) {
        PyErr_SetString(PyExc_TypeError, "hide(body: bytes)");
        return NULL;
    }
    const char *b = PyBytes_AS_STRING(body), *end = b + PyBytes_GET_SIZE(body);
    Py_ssize_t n = end - b;
    if (n < 2 || end[-1] != '\n' || end[-2] != '\n' || memchr(b, '\r', n) != NULL)
        Py_RETURN_NONE;
    if (find(b, n, USAGE) == NULL) return Py_NewRef(body);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (out == NULL) return NULL;
    char *o = PyBytes_AS_STRING(out);
    for (const char *e = b; e < end;) { /* an event: `data:`, its value, LF, LF */
        const char *nl = memchr(e, '\n', end - e);
        if (nl - e < 5 || memcmp(e, "data:", 5) != 0 || nl[1] != '\n') goto ask;
        const char *d = e + 5 + (e[5] == ' '), *cut = nl, *resume = nl, *next = nl + 2;
        if (find(d, nl - d, USAGE) != NULL) {
            Scan s;
            if (document(&s, (const unsigned char *)d, nl - d) != OBJECT || s.duplicate) goto ask;
            if (s.usage == OBJECT && (s.choices == NONE || s.choices == EMPTY_ARRAY)) {
                e = next; /* the usage chunk: dropped whole */
                continue;
            }
            if (s.usage == NULL_) {
                cut = (const char *)s.cut;
                resume = (const char *)s.resume;
            } else if (s.usage != NONE) {
                goto ask;
            }
        }
        memcpy(o, e, cut - e);
        o += cut - e;
        memcpy(o, resume, next - resume);
        o += next - resume;
        e = next;
    }
    if (o - PyBytes_AS_STRING(out) == n) { /* nothing taken out: the same object */
        Py_DECREF(out);
        return Py_NewRef(body);
    }
    _PyBytes_Resize(&out, o - PyBytes_AS_STRING(out));
    return out;
ask:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"request", request, METH_O, "usage.rewrite's decision: an offset, UNCHANGED or ASK"},
    {"hide", hide, METH_O, "usage_hide.HideUsage's edit of whole events, or None to ask"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "middleware._usage", NULL, -1, methods,
};

PyMODINIT_FUNC PyInit__usage(void) {
    for (int c = 0x20; c < 0x80; c++) PLAIN[c] = c != '"' && c != '\\';
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    if (PyModule_AddIntConstant(module, "ASK", ASK) < 0 ||
        PyModule_AddIntConstant(module, "UNCHANGED", UNCHANGED) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
