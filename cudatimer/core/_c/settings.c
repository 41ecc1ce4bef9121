/* Part of cudatimer.core._speedups (settings given by configure() and small helpers (buffers, NVTX calls)). Not compiled on its own:
 * _speedups.c includes every part, in order, into one translation unit. */

/* ======================================================================================
 * Settings (configure, set_stream_getter, set_usable) and small helpers
 * ====================================================================================== */

enum { K_TIMED = 0, K_HOST = 1, K_SKIP = 2, K_OFF = 3, K_NVTX = 4, K_UNTIMED = 5, K_ORPHAN = 6,
       K_GRAPH = 7 };

#define MAX_DEVICES 64 /* default-stream records the hot path indexes by device */

/* Set by configure() from _device, the one place that defines them; these start values only
 * hold until then. */
static double g_inv_log_gamma = 0.0;
static Py_ssize_t g_harvest_batch = 1;
static double g_anchor_hop_ms = 0.0;
static Py_ssize_t g_prewarm = 0;

static PyObject *g_getter = NULL; /* getter(device) -> (stream id, device, device type) */
static int g_c10 = 0;             /* read c10's current stream instead of calling g_getter */
static int g_usable = 0;          /* CUDA in use: the hot path records events only then */

static inline int64_t
mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Grow *buf to hold `need` items of `item` bytes (doubling from 16). -1 with MemoryError. */
static int
grow(void **buf, Py_ssize_t *cap, Py_ssize_t need, size_t item)
{
    if (need <= *cap) {
        return 0;
    }
    Py_ssize_t n = *cap ? *cap : 16;
    while (n < need) {
        n *= 2;
    }
    void *p = PyMem_Realloc(*buf, (size_t)n * item);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *buf = p;
    *cap = n;
    return 0;
}

/* Call fn(arg) (fn() when arg is NULL) for NVTX push/pop; 0, or -1 with its exception. */
static int
call_hook(PyObject *fn, PyObject *arg)
{
    if (fn == NULL) {
        return 0;
    }
    PyObject *r = arg ? PyObject_CallOneArg(fn, arg) : PyObject_CallNoArgs(fn);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* NVTX pop after a failure: the first exception is the one raised (a failing pop's is
 * dropped). Returns -1 always. */
static int
pop_keeping_error(PyObject *pop)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    if (call_hook(pop, NULL) < 0) {
        PyErr_Clear();
    }
    PyErr_Restore(et, ev, tb);
    return -1;
}

/* grave.append(o) (a forked child keeps its parent's objects, never releases them). */
static int
grave_add(PyObject *grave, PyObject *o)
{
    if (PyList_Check(grave)) {
        return PyList_Append(grave, o);
    }
    PyObject *r = PyObject_CallMethodOneArg(grave, str_append, o);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static inline PyObject *
or_none(PyObject *o)
{
    return o != NULL ? o : Py_None;
}

