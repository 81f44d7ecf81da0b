/*
 * The common case of ``harness.get(name)(a, b)`` for a C kernel, checked and run in one compiled
 * call: the CPython extension ``_matmul_fast_call``.
 *
 * Why: at 64^3 the kernel takes about 2.5 us, and the same checks and calls made from Python
 * (is each input a plain, C-contiguous, aligned, writeable 2-D array of one dtype; three
 * ffi.from_buffer; np.empty for C) cost 1.4 us more, where NumPy's whole call costs 0.7 us
 * over its kernel. Here the checks are a few loads of the arrays' fields, C is allocated by
 * NumPy's C API, and the kernel is called through its address (taken from the cffi glue by
 * harness/backends/c/__init__.py): about 0.1 us in all.
 *
 * A FastCall is made once per bound implementation, with everything that does not change
 * from call to call: the kernel's address per dtype, its options (the int64_t parameters after
 * K), and the limits past which the Python path must take over. Called with (a, b), it returns
 * the product, or None when the inputs are not the common case (a subclass, a view, read-only,
 * another dtype or byte order, a dimension 0, a mismatched K, too big for the memory check to
 * be skipped, an output big enough to be allocated aligned, or a call long enough to be made
 * interruptible): harness.model.core.Matmul then validates and runs them the usual way, so
 * every error message stays the Python path's. A nonzero status from the kernel is passed to
 * the ``on_status`` callable given at construction, which raises.
 *
 * The GIL is released for the kernel, as cffi releases it: several Python threads may run
 * kernels at once (none keeps static state).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <stddef.h>
#include <stdint.h>

#define MAX_OPTIONS 3 /* the most int64_t parameters after K among the library's kernels */

/* The library's kernels: (A, B, C, M, N, K, options...), returning a status or nothing. */
typedef int (*kernel_0)(const void *, const void *, void *, int64_t, int64_t, int64_t);
typedef int (*kernel_1)(const void *, const void *, void *, int64_t, int64_t, int64_t, int64_t);
typedef int (*kernel_2)(const void *, const void *, void *, int64_t, int64_t, int64_t, int64_t, int64_t);
typedef int (*kernel_3)(const void *, const void *, void *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
typedef void (*void_kernel_0)(const void *, const void *, void *, int64_t, int64_t, int64_t);

typedef struct {
    PyObject ob_base; /* PyObject_HEAD */
    vectorcallfunc vectorcall;
    void *kernel_f32, *kernel_f64; /* NULL: the implementation does not take that dtype */
    int returns_status;            /* 0: a void kernel */
    int option_count;
    int64_t options[MAX_OPTIONS];
    int64_t max_elements;     /* M*K + K*N + M*N at most: below it the memory check cannot fail */
    int64_t max_output_bytes; /* from this size on, C is allocated aligned by the Python path */
    double long_call_mnk;     /* from this M*N*K on, the Python path runs the call interruptibly */
    PyObject *on_status;      /* called with a nonzero status; raises */
} FastCall;

static int run_kernel(const FastCall *self, void *kernel, const void *a, const void *b, void *c, int64_t m, int64_t n,
                      int64_t k) {
    const int64_t *o = self->options;
    if (!self->returns_status) { /* the library's only void kernels take no options */
        ((void_kernel_0)kernel)(a, b, c, m, n, k);
        return 0;
    }
    switch (self->option_count) {
    case 0: return ((kernel_0)kernel)(a, b, c, m, n, k);
    case 1: return ((kernel_1)kernel)(a, b, c, m, n, k, o[0]);
    case 2: return ((kernel_2)kernel)(a, b, c, m, n, k, o[0], o[1]);
    default: return ((kernel_3)kernel)(a, b, c, m, n, k, o[0], o[1], o[2]);
    }
}

/* The kernel for a plain input of the common case, or NULL. */
static void *kernel_for(const FastCall *self, PyObject *input) {
    if (!PyArray_CheckExact(input)) return NULL;
    PyArrayObject *array = (PyArrayObject *)input;
    /* C-contiguous, aligned, writeable and in native byte order: NumPy's "carray" */
    if (PyArray_NDIM(array) != 2 || !PyArray_ISCARRAY(array)) return NULL;
    switch (PyArray_TYPE(array)) {
    case NPY_FLOAT32: return self->kernel_f32;
    case NPY_FLOAT64: return self->kernel_f64;
    default: return NULL;
    }
}

static PyObject *fast_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    FastCall *self = (FastCall *)callable;
    if (PyVectorcall_NARGS(nargsf) != 2 || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "a FastCall takes exactly two arrays, a and b");
        return NULL;
    }
    void *kernel = kernel_for(self, args[0]);
    if (!kernel || kernel_for(self, args[1]) != kernel) Py_RETURN_NONE;
    PyArrayObject *a = (PyArrayObject *)args[0], *b = (PyArrayObject *)args[1];
    const npy_intp m = PyArray_DIM(a, 0), k = PyArray_DIM(a, 1), n = PyArray_DIM(b, 1);
    if (PyArray_DIM(b, 0) != k || m == 0 || n == 0 || k == 0) Py_RETURN_NONE;
    /* each of m, n, k is below max_elements here, so no product overflows a double */
    if ((double)m * k + (double)k * n + (double)m * n > (double)self->max_elements ||
        (double)m * n * PyArray_ITEMSIZE(a) >= (double)self->max_output_bytes ||
        (double)m * n * k >= self->long_call_mnk)
        Py_RETURN_NONE;
    npy_intp dims[2] = {m, n};
    PyObject *c = PyArray_SimpleNew(2, dims, PyArray_TYPE(a)); /* uninitialised: the kernel writes all of it */
    if (!c) return NULL;
    PyThreadState *released = PyEval_SaveThread();
    const int status =
        run_kernel(self, kernel, PyArray_DATA(a), PyArray_DATA(b), PyArray_DATA((PyArrayObject *)c), m, n, k);
    PyEval_RestoreThread(released);
    if (status) {
        PyObject *raised = PyObject_CallFunction(self->on_status, "i", status);
        if (!raised) {
            Py_DECREF(c);
            return NULL;
        }
        Py_DECREF(raised);
    }
    return c;
}

static void *address(PyObject *value) { return value == Py_None ? NULL : PyLong_AsVoidPtr(value); }

static PyObject *fast_call_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"kernel_f32",       "kernel_f64",    "returns_status", "options", "max_elements",
                               "max_output_bytes", "long_call_mnk", "on_status",      NULL};
    PyObject *f32, *f64, *options, *on_status;
    int returns_status;
    long long max_elements, max_output_bytes;
    double long_call_mnk;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOpO!LLdO:FastCall", keywords, &f32, &f64, &returns_status,
                                     &PyTuple_Type, &options, &max_elements, &max_output_bytes, &long_call_mnk,
                                     &on_status))
        return NULL;
    const Py_ssize_t count = PyTuple_GET_SIZE(options);
    if (count > MAX_OPTIONS || (!returns_status && count)) {
        PyErr_Format(PyExc_ValueError,
                     "FastCall: %zd options; kernels that return a status take at most %d, void "
                     "kernels none",
                     count, MAX_OPTIONS);
        return NULL;
    }
    if (!PyCallable_Check(on_status)) {
        PyErr_SetString(PyExc_TypeError, "FastCall: on_status must be callable");
        return NULL;
    }
    FastCall *self = (FastCall *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->vectorcall = fast_call;
    self->kernel_f32 = address(f32);
    self->kernel_f64 = address(f64);
    for (Py_ssize_t i = 0; i < count; i++) self->options[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(options, i));
    if (PyErr_Occurred()) {
        Py_DECREF(self);
        return NULL;
    }
    self->returns_status = returns_status;
    self->option_count = (int)count;
    self->max_elements = max_elements;
    self->max_output_bytes = max_output_bytes;
    self->long_call_mnk = long_call_mnk;
    Py_INCREF(on_status);
    self->on_status = on_status;
    return (PyObject *)self;
}

static void fast_call_dealloc(FastCall *self) {
    Py_XDECREF(self->on_status);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject FastCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_matmul_fast_call.FastCall",
    .tp_basicsize = sizeof(FastCall),
    .tp_dealloc = (destructor)fast_call_dealloc,
    .tp_vectorcall_offset = offsetof(FastCall, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "FastCall(kernel_f32, kernel_f64, returns_status, options, max_elements, max_output_bytes, "
              "long_call_mnk, on_status)(a, b): the product, or None when the inputs are not the common case",
    .tp_new = fast_call_new,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_matmul_fast_call",
    .m_doc = "The compiled common case of harness.get(name)(a, b) for the C kernels",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__matmul_fast_call(void) {
    import_array();
    if (PyType_Ready(&FastCallType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&FastCallType);
    if (PyModule_AddObject(m, "FastCall", (PyObject *)&FastCallType) < 0) {
        Py_DECREF(&FastCallType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
