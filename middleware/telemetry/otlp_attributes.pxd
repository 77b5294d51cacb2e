# The C types of otlp_attributes.py, compiled as middleware.telemetry._otlp (setup.py, CYTHON).
import cython

cdef list BYTE
cdef object double

cpdef bytes varint(unsigned long long n)

@cython.locals(parts=list, payload=bytes)
cpdef bytes attributes(object items, dict strings, dict doubles, dict ints, object miss,
                       object other, object tagged, bytes tag)
