/* middleware/telemetry/_gaps.c: `sorted_gaps` of middleware/telemetry/gaps.py, compiled.
 *
 * One function, the one line of `Gaps` that costs per token: a stream's chunk times turned into
 * the gaps between them, sorted. In Python, `sorted(map(sub, ...))` makes a float object per
 * gap for the subtraction and compares objects while it sorts; here the gaps are C doubles
 * until the sorted list is built. Read it beside gaps.py's `_sorted_gaps`; the test suite runs
 * once with each (SIDESTREAM_NO_EXTENSIONS=1 picks the Python one), and
 * tests/unit/test_core_twins.py runs both on the same times.
 *
 * The times are the monotonic clock's floats: numbers, never NaN (a NaN has no place in a
 * sorted list, and the two twins would each put it somewhere else).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* A time as a double: the clock's floats directly, any other number by `__float__` */
static double number(PyObject *time) {
    return PyFloat_CheckExact(time) ? PyFloat_AS_DOUBLE(time) : PyFloat_AsDouble(time);
}

/* `a[0:n]` sorted ascending (stable), by a bottom-up merge sort through `spare` (as long as
 * `a`): returns whichever of the two holds the result. Not libc's qsort, whose compare goes
 * through a function pointer: slower than Python's own sort of floats (timed beside it). */
static double *merge_sort(double *a, double *spare, Py_ssize_t n) {
    for (Py_ssize_t width = 1; width < n; width *= 2) {
        for (Py_ssize_t lo = 0; lo < n; lo += 2 * width) {
            Py_ssize_t mid = lo + width < n ? lo + width : n;
            Py_ssize_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            Py_ssize_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) spare[k++] = a[j] < a[i] ? a[j++] : a[i++];
            while (i < mid) spare[k++] = a[i++];
            while (j < hi) spare[k++] = a[j++];
        }
        double *sorted = spare;
        spare = a;
        a = sorted;
    }
    return a;
}

/* def sorted_gaps(times, last): */
static PyObject *sorted_gaps(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "sorted_gaps(times: list[float], last: float | None)");
        return NULL;
    }
    PyObject *times = args[0], *last = args[1];
    Py_ssize_t n = PyList_GET_SIZE(times);
    /* if last is None: gaps = map(sub, times[1:], times) */
    /* else:            gaps = map(sub, times, chain((last,), times)) */
    Py_ssize_t from = last == Py_None ? 1 : 0;
    Py_ssize_t count = n > from ? n - from : 0;
    double *gaps = PyMem_Malloc((count ? 2 * count : 1) * sizeof(double));
    if (gaps == NULL) return PyErr_NoMemory();
    double before = 0.0;
    if (last != Py_None) {
        before = number(last);
    } else if (n > 0) {
        before = number(PyList_GET_ITEM(times, 0));
    }
    for (Py_ssize_t i = from; i < n && !PyErr_Occurred(); i++) {
        double now = number(PyList_GET_ITEM(times, i));
        gaps[i - from] = now - before;
        before = now;
    }
    if (PyErr_Occurred()) {
        PyMem_Free(gaps);
        return NULL;
    }
    /* return sorted(gaps) */
    double *sorted = merge_sort(gaps, gaps + count, count);
    PyObject *out = PyList_New(count);
    for (Py_ssize_t i = 0; out != NULL && i < count; i++) {
        PyObject *gap = PyFloat_FromDouble(sorted[i]);
        if (gap == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, i, gap);
    }
    PyMem_Free(gaps);
    return out;
}

static PyMethodDef methods[] = {
    {"sorted_gaps", (PyCFunction)(void (*)(void))sorted_gaps, METH_FASTCALL,
     "The gaps between consecutive `times` (after `last`, unless None), sorted."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "middleware.telemetry._gaps", NULL, -1, methods,
};

PyMODINIT_FUNC PyInit__gaps(void) { return PyModule_Create(&module_def); }
