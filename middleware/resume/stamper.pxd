# The C types of stamper.py, compiled as middleware.resume._stamper (setup.py, CYTHON).
import cython

cdef object LOST

cdef class Stamper:
    cdef public object log
    cdef public Py_ssize_t max_event
    cdef public bytes suffix, id_field, id_line, fmt
    cdef public Py_ssize_t n
    cdef public object before, first
    cdef public bint boundary, at_start, after_cr, dropping, fields, stamped, replaced, lost
    cdef public list parts
    cdef public Py_ssize_t held, appended
    cdef public object saved
