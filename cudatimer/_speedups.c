/*
 * cudatimer._speedups: the recorder's hot path in C (event records and reads through the CUDA
 * runtime torch loaded, Region enter/exit, the per-thread stack and the harvest).
 *
 * Why: in a launch-bound loop (48 x Linear(256)+GELU, batch 32, H200) the Python around two
 * event records cost more than the records themselves: 13.3 us per region against 5.7 us for
 * two bare torch.Event.record(stream) calls. torch.Event.record spends most of its ~1.6 us in
 * argument parsing, a device guard and dispatch before cudaEventRecord. Here a pooled event is
 * popped and recorded in one C call, through the CUDA runtime that torch already loaded
 * (never a second copy), so the call is visible to torch.profiler/CUPTI like torch's own.
 *
 * Nothing here synchronises: cudaEventRecord only enqueues; cudaEventElapsedTime is called on
 * events whose completion the harvest has already seen with a non-blocking query (and returns
 * cudaErrorNotReady, never waits, when they are not complete).
 *
 * Every function falls back to the pure Python path (a method of the Python object) whenever
 * the runtime is absent, an event has no CUDA handle yet, or the runtime returns an error, so
 * errors surface with torch's own messages and nothing is recorded twice or lost.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h> /* first, as Python asks; its pyconfig.h defines _GNU_SOURCE on Linux */

#include <stdint.h>
#include <string.h>
#include <math.h>
#include <structmember.h>
#include <time.h>

#if defined(__linux__)
#include <dlfcn.h>
#include <link.h>
#define CUDATIMER_HAVE_DL 1
#endif

/* cudaError_t is an int-sized enum; events and streams are opaque pointers. */
typedef int (*event_record_fn)(void *event, void *stream);
typedef int (*event_query_fn)(void *event);
typedef int (*event_elapsed_fn)(float *ms, void *start, void *end);
typedef int (*get_last_error_fn)(void);

/* c10::cuda::getCurrentCUDAStream(DeviceIndex) returns a CUDAStream by value: a c10::Stream,
 * {DeviceType (int8), DeviceIndex (int8), StreamId (int64)}, 16 trivially copyable bytes that
 * the x86-64 and AArch64 C++ ABIs return in two registers, as for this C struct. */
typedef struct {
    int8_t type;
    int8_t index;
    int64_t id;
} c10_stream;
typedef c10_stream (*current_stream_fn)(int8_t device);

#define CUDA_SUCCESS_CODE 0
#define CUDA_NOT_READY_CODE 600 /* cudaErrorNotReady */

static event_record_fn rt_record = NULL;
static event_query_fn rt_query = NULL;
static event_elapsed_fn rt_elapsed = NULL;
static get_last_error_fn rt_get_last_error = NULL;
static current_stream_fn c10_current = NULL;
static char rt_path[4096];
static char c10_path[4096];

static PyObject *str_pool;
static PyObject *str_raw;
static PyObject *str_event_id;
static PyObject *str_take_recorded;
static PyObject *str_elapsed_time;
static PyObject *str_record, *str_query, *str_stack, *str_timer, *str_enter, *str_exit,
    *str_child, *str_gen, *str_get_stream, *str_batch, *str_ref, *str_ref_ns, *str_stream,
    *str_clock, *str_device;

#ifdef CUDATIMER_HAVE_DL
static void
keep_path(char *dest, size_t size, const char *name, const char *pattern)
{
    if (dest[0] == '\0' && strstr(name, pattern) != NULL && strlen(name) < size) {
        memcpy(dest, name, strlen(name) + 1);
    }
}

static int
find_libraries(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    const char *name = info->dlpi_name;
    if (name != NULL) {
        keep_path(rt_path, sizeof(rt_path), name, "/libcudart.so");
        keep_path(c10_path, sizeof(c10_path), name, "/libc10_cuda.so");
    }
    return 0;
}
#endif

PyDoc_STRVAR(load_doc,
"load() -> bool\n\n"
"Bind to the CUDA runtime library already loaded in this process (torch's). True when the\n"
"compiled path can be used; False on a CPU build, a static runtime, or another platform.\n"
"Never loads a library that is not loaded yet, and never initialises CUDA.");

static PyObject *
load(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (rt_record != NULL) {
        Py_RETURN_TRUE;
    }
#ifdef CUDATIMER_HAVE_DL
    rt_path[0] = '\0';
    c10_path[0] = '\0';
    dl_iterate_phdr(find_libraries, NULL);
    if (rt_path[0] == '\0') {
        Py_RETURN_FALSE;
    }
    void *lib = dlopen(rt_path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) {
        Py_RETURN_FALSE;
    }
    void *rec = dlsym(lib, "cudaEventRecord");
    void *ela = dlsym(lib, "cudaEventElapsedTime");
    void *err = dlsym(lib, "cudaGetLastError");
    void *qry = dlsym(lib, "cudaEventQuery");
    if (rec == NULL || ela == NULL || err == NULL || qry == NULL) {
        Py_RETURN_FALSE;
    }
    /* torch's current stream, read without a Python call. Optional: when the symbol is absent
     * (another torch, another DeviceIndex type) the recorder asks torch._C instead. Python
     * checks it against torch once (check_current_stream) before trusting it. */
    void *c10 = c10_path[0] ? dlopen(c10_path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (c10 != NULL) {
        c10_current = (current_stream_fn)dlsym(c10, "_ZN3c104cuda20getCurrentCUDAStreamEa");
    }
    rt_query = (event_query_fn)qry;
    /* The handle is kept for the life of the process (torch keeps the library loaded). */
    rt_elapsed = (event_elapsed_fn)ela;
    rt_get_last_error = (get_last_error_fn)err;
    rt_record = (event_record_fn)rec;
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

PyDoc_STRVAR(runtime_path_doc,
"runtime_path() -> str | None\n\nThe CUDA runtime library bound by load(), or None.");

static PyObject *
runtime_path(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (rt_record == NULL) {
        Py_RETURN_NONE;
    }
    return PyUnicode_DecodeFSDefault(rt_path);
}

/* 0 when a METH_FASTCALL function got `want` arguments; else a TypeError showing its usage. */
static int
bad_nargs(Py_ssize_t nargs, Py_ssize_t want, const char *usage)
{
    if (nargs == want) {
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", usage, want, nargs);
    return 1;
}

/* The cudaEvent_t of a torch.Event (its `event_id`), or NULL when it has none yet (torch
 * creates the CUDA event at the first record) or is another kind of object. No error set. */
static void *
event_handle(PyObject *event)
{
    PyObject *id = PyObject_GetAttr(event, str_event_id);
    if (id == NULL) {
        PyErr_Clear();
        return NULL;
    }
    void *handle = PyLong_Check(id) ? PyLong_AsVoidPtr(id) : NULL;
    Py_DECREF(id);
    if (handle == NULL && PyErr_Occurred()) {
        PyErr_Clear();
    }
    return handle;
}

PyDoc_STRVAR(take_record_doc,
"take_record(entry) -> event\n\n"
"Pop the newest event of entry.pool and record it on the stream whose cudaStream_t is\n"
"entry.raw; return it. Falls back to entry.take_recorded() (torch's record) when the pool\n"
"is empty, entry.raw is None, the event has no CUDA handle yet, or the runtime refuses.");

static PyObject *
take_record(PyObject *module, PyObject *entry)
{
    (void)module;
    PyObject *pool = PyObject_GetAttr(entry, str_pool);
    if (pool == NULL) {
        return NULL;
    }
    PyObject *raw = PyObject_GetAttr(entry, str_raw);
    if (raw == NULL) {
        Py_DECREF(pool);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n;
    if (rt_record != NULL && raw != Py_None && PyLong_Check(raw) && PyList_CheckExact(pool)
        && (n = PyList_GET_SIZE(pool)) > 0) {
        PyObject *event = PyList_GET_ITEM(pool, n - 1); /* borrowed */
        void *handle = event_handle(event);
        void *stream = PyLong_AsVoidPtr(raw);
        if (stream == NULL && PyErr_Occurred()) {
            PyErr_Clear();
            handle = NULL;
        }
        if (handle != NULL) {
            if (rt_record(handle, stream) == CUDA_SUCCESS_CODE) {
                Py_INCREF(event);
                if (PyList_SetSlice(pool, n - 1, n, NULL) < 0) {
                    Py_DECREF(event);
                    goto done;
                }
                result = event;
                goto done;
            }
            /* Clear the runtime's last error, or torch's next launch check would raise it. */
            rt_get_last_error();
        }
    }
    result = PyObject_CallMethodNoArgs(entry, str_take_recorded);
done:
    Py_DECREF(pool);
    Py_DECREF(raw);
    return result;
}

PyDoc_STRVAR(elapsed_ms_doc,
"elapsed_ms(start, end) -> float\n\n"
"Milliseconds from start to end, like start.elapsed_time(end). Raises RuntimeError when\n"
"either is not complete yet (never waits); other cases go through torch's elapsed_time.");

static PyObject *
elapsed_ms(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (bad_nargs(nargs, 2, "elapsed_ms(start, end)")) {
        return NULL;
    }
    if (rt_elapsed != NULL) {
        void *start = event_handle(args[0]);
        void *end = start != NULL ? event_handle(args[1]) : NULL;
        if (end != NULL) {
            float ms = 0.0f;
            int rc = rt_elapsed(&ms, start, end);
            if (rc == CUDA_SUCCESS_CODE) {
                return PyFloat_FromDouble((double)ms);
            }
            rt_get_last_error();
            if (rc == CUDA_NOT_READY_CODE) {
                PyErr_SetString(PyExc_RuntimeError,
                                "cudatimer: event not complete yet (cudaErrorNotReady)");
                return NULL;
            }
        }
    }
    return PyObject_CallMethodOneArg(args[0], str_elapsed_time, args[1]);
}

/* ======================================================================================
 * The recorder's common case in C: Region.__enter__/__exit__ (RegionBase), the per-thread
 * stack of open regions (Stack), per-Timer statistics (Core) and, per device, the default
 * stream's event pool and pending samples (DevRec).
 *
 * Why: inside a launch-bound loop (48 x Linear(256)+GELU, H200) every Python-level step
 * around the two event records costs several times its idle figure. A probe of this design
 * (C context manager, stream read from c10, C stack, host clock, pending ring, harvest in
 * place every 256 exits) added 1.02x what two bare torch.Event records add; the Python hot
 * path added 2.2x. Resolving on a background thread was slower (1.30x): it contends with
 * the launching thread in the driver, so the harvest runs here, in batches.
 *
 * Everything runs under the GIL. Fast frames and samples hold C values; a Python caller
 * sees the same frames as tuples (Stack materialises them), so the general Python paths
 * (side streams, switches, every=N, host clock, graph capture) take over any frame.
 * Events are torch.Event objects from a pool, recorded through the runtime when bound, or
 * through their Python methods (the fake GPU of the CPU tests): one code path either way.
 * ====================================================================================== */

#define MAX_DEVICES 64

typedef struct {
    PyObject *ev; /* torch.Event (strong) */
    void *h;      /* its cudaEvent_t, or NULL: record/query/read through Python methods */
} EvRef;

typedef struct {
    int64_t count, zeros;
    double total, min, max;
    int32_t lo, n; /* buckets b[0..n) hold indices lo..lo+n-1 */
    int64_t *b;
} CHist;

typedef struct DevStats {
    struct DevStats *next;
    int dev;
    int64_t calls;
    CHist gpu, cpu;
} DevStats;

typedef struct {
    PyObject *node; /* the Python _Node (strong) */
    int64_t gen;    /* node.gen: samples of a node older than the Timer's gen are dropped */
    DevStats *stats;
} Slot;

typedef struct {
    int32_t slot, dev;
    int64_t step;
    double gpu_ms, cpu_ms;
} SeriesItem;

typedef struct {
    int32_t slot;
    PyObject *entry; /* StreamEntry (strong): the stream and clock of gpu_at_ns */
    double gpu_at_ns; /* GPU start on the host clock (NAN: unreadable, host span only) */
    double gpu_ms;
    int64_t t0, step;
    double cpu_ms;
    unsigned long tid;
} TraceItem;

typedef struct {
    PyObject_HEAD
    int enabled;
    int64_t gen, step, serial;
    Py_ssize_t keep_steps, trace_samples;
    PyObject *local;      /* the Timer's threading.local (its .stack is this thread's Stack) */
    PyObject *node_slots; /* {node: slot index} */
    Slot *slots;
    Py_ssize_t nslots, slots_cap;
    SeriesItem *series;
    Py_ssize_t nseries, series_cap, series_limit;
    int64_t max_step;
    Py_ssize_t step_cap; /* _steps.STEP_SAMPLE_CAP: raw samples one step may keep */
    int64_t count_step;  /* the newest step seen and its samples so far */
    Py_ssize_t count;
    int64_t *over;       /* steps past step_cap since the last collect (Python drops them) */
    Py_ssize_t nover, over_cap;
    TraceItem *trace; /* ring of trace_samples */
    Py_ssize_t trace_first, ntrace;
} CoreObj;

typedef struct {
    CoreObj *core; /* strong */
    int32_t slot, dev;
    EvRef s, e;
    int64_t t0, t1, step;
    unsigned long tid;
} PendItem;

typedef struct {
    PyObject *entry;  /* StreamEntry (strong) */
    PyObject *stream; /* entry.stream */
    PyObject *clock;  /* entry.clock, "cuda:N" */
    void *raw;
    int use_raw;
    EvRef *pool;
    Py_ssize_t npool, pool_cap;
    PendItem *pend;
    Py_ssize_t pfirst, pn, pcap; /* pending items pend[pfirst .. pfirst+pn) */
    Py_ssize_t check_at;
    int harvesting;
    /* Trace placement: GPU starts are read against an anchor event whose position (anchor_ms
     * after entry.ref, recorded at host time ref_ns) is known; see place(). */
    EvRef anchor;
    int anchor_is_ref; /* the anchor is entry.ref itself, never pooled */
    double anchor_ms;
    int64_t ref_ns;
} DevRec;

static DevRec *devs[MAX_DEVICES];
static int g_usable = 0;
static PyObject *cuda_dict = NULL;      /* cudatimer._cuda's namespace (fakeable getters) */
static PyObject *torch_get_stream = NULL; /* torch._C._cuda_getCurrentStream, unpatched */
static int c10_checked = 0;               /* c10_current agreed with torch */
static double inv_log_gamma = 0.0;
static int64_t next_serial = 1;
static PyObject *minus_one = NULL;

typedef struct {
    PyObject *py;     /* a Python frame (tuple) pushed by the general path, or NULL */
    PyObject *region; /* fast frame: the Region (strong) */
    PyObject *node;   /* borrowed: the core's slot keeps it */
    PyObject *entry;  /* strong */
    int32_t slot, dev;
    EvRef start;
    int64_t t0;
} Frame;

typedef struct {
    PyObject_HEAD
    Frame *f;
    Py_ssize_t n, cap;
    unsigned long tid;
} StackObj;

typedef struct {
    PyObject_HEAD
    CoreObj *core;
    int fast;
    PyObject *name, *push, *attrs, *pop;
    int32_t c_parent, c_slot;
    int64_t c_gen;
} RegionObj;

static PyTypeObject CoreType, StackType, RegionBaseType;

static inline int64_t
mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

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

/* -- histograms (the same buckets as _hist.HistBuilder: ceil(log(x) / log(GAMMA))) ------- */
static void
hist_init(CHist *h)
{
    memset(h, 0, sizeof(*h));
    h->min = Py_HUGE_VAL;
    h->max = -Py_HUGE_VAL;
}

static int
hist_add(CHist *h, double x)
{
    h->count++;
    h->total += x;
    if (x < h->min) {
        h->min = x;
    }
    if (x > h->max) {
        h->max = x;
    }
    if (!(x > 0.0)) {
        h->zeros++;
        return 0;
    }
    int32_t i = (int32_t)ceil(inv_log_gamma * log(x));
    if (h->n == 0 || i < h->lo || i >= h->lo + h->n) {
        int32_t lo = h->n ? (i < h->lo ? i : h->lo) : i;
        int32_t hi = h->n ? (i >= h->lo + h->n ? i + 1 : h->lo + h->n) : i + 1;
        int64_t *b = PyMem_Calloc((size_t)(hi - lo), sizeof(int64_t));
        if (b == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        if (h->n) {
            memcpy(b + (h->lo - lo), h->b, (size_t)h->n * sizeof(int64_t));
        }
        PyMem_Free(h->b);
        h->b = b;
        h->lo = lo;
        h->n = hi - lo;
    }
    h->b[i - h->lo]++;
    return 0;
}

/* (count, total, min, max, zeros, ((index, n), ...)) */
static PyObject *
hist_tuple(const CHist *h)
{
    PyObject *buckets = PyList_New(0);
    if (buckets == NULL) {
        return NULL;
    }
    for (int32_t k = 0; k < h->n; k++) {
        if (h->b[k]) {
            PyObject *pair = Py_BuildValue("(iL)", h->lo + k, (long long)h->b[k]);
            if (pair == NULL || PyList_Append(buckets, pair) < 0) {
                Py_XDECREF(pair);
                Py_DECREF(buckets);
                return NULL;
            }
            Py_DECREF(pair);
        }
    }
    return Py_BuildValue("(LdddLN)", (long long)h->count, h->total, h->min, h->max,
                         (long long)h->zeros, buckets);
}

/* -- events --------------------------------------------------------------------------- */
static void
pool_put(DevRec *d, EvRef ev)
{
    if (d != NULL && grow((void **)&d->pool, &d->pool_cap, d->npool + 1, sizeof(EvRef)) == 0) {
        d->pool[d->npool++] = ev;
        return;
    }
    PyErr_Clear();
    Py_DECREF(ev.ev);
}

static void
ev_release(int dev, EvRef ev)
{
    if (ev.ev != NULL) {
        pool_put(dev >= 0 && dev < MAX_DEVICES ? devs[dev] : NULL, ev);
    }
}

/* A pooled event of d recorded on d's stream now (a new one from entry.take_recorded() when
 * the pool is empty). -1 with an exception (torch's own, when the record fails). */
static int
take_event(DevRec *d, EvRef *out)
{
    if (d->npool > 0) {
        EvRef ev = d->pool[--d->npool];
        if (ev.h != NULL) {
            if (rt_record(ev.h, d->raw) == CUDA_SUCCESS_CODE) {
                *out = ev;
                return 0;
            }
            rt_get_last_error(); /* torch's next launch check must not see it */
        }
        /* torch's record: raises torch's error if the runtime refused */
        PyObject *r = PyObject_CallMethodOneArg(ev.ev, str_record, d->stream);
        if (r == NULL) {
            pool_put(d, ev);
            return -1;
        }
        Py_DECREF(r);
        if (ev.h == NULL && d->use_raw) {
            ev.h = event_handle(ev.ev); /* created by this first record: raw from now on */
        }
        *out = ev;
        return 0;
    }
    /* Empty: refill from the entry's Python pool first (events that left through the trace
     * window or the general paths come back there), then record one as above. */
    PyObject *py_pool = PyObject_GetAttr(d->entry, str_pool);
    if (py_pool == NULL) {
        return -1;
    }
    if (PyList_CheckExact(py_pool) && PyList_GET_SIZE(py_pool) > 0) {
        Py_ssize_t n = PyList_GET_SIZE(py_pool);
        if (grow((void **)&d->pool, &d->pool_cap, n, sizeof(EvRef)) == 0) {
            for (Py_ssize_t i = 0; i < n; i++) {
                PyObject *item = PyList_GET_ITEM(py_pool, i);
                Py_INCREF(item);
                d->pool[d->npool].ev = item;
                d->pool[d->npool++].h = d->use_raw ? event_handle(item) : NULL;
            }
            int rc = PyList_SetSlice(py_pool, 0, n, NULL);
            Py_DECREF(py_pool);
            if (rc < 0) {
                return -1;
            }
            return take_event(d, out);
        }
        PyErr_Clear();
    }
    Py_DECREF(py_pool);
    PyObject *ev = PyObject_CallMethodNoArgs(d->entry, str_take_recorded);
    if (ev == NULL) {
        return -1;
    }
    out->ev = ev;
    out->h = d->use_raw ? event_handle(ev) : NULL;
    return 0;
}

/* 1 done, 0 not yet (or unreadable: it stays pending, as in the Python harvest). */
static int
ev_done(EvRef ev)
{
    if (ev.h != NULL) {
        int rc = rt_query(ev.h);
        if (rc == CUDA_SUCCESS_CODE) {
            return 1;
        }
        rt_get_last_error();
        return 0;
    }
    PyObject *r = PyObject_CallMethodNoArgs(ev.ev, str_query);
    if (r == NULL) {
        PyErr_Clear();
        return 0;
    }
    int done = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (done < 0) {
        PyErr_Clear();
        return 0;
    }
    return done;
}

static int
ev_elapsed(EvRef s, EvRef e, double *ms)
{
    if (s.h != NULL && e.h != NULL) {
        float f = 0.0f;
        if (rt_elapsed(&f, s.h, e.h) == CUDA_SUCCESS_CODE) {
            *ms = (double)f;
            return 0;
        }
        rt_get_last_error();
        return -1;
    }
    PyObject *r = PyObject_CallMethodOneArg(s.ev, str_elapsed_time, e.ev);
    if (r == NULL) {
        PyErr_Clear();
        return -1;
    }
    *ms = PyFloat_AsDouble(r);
    Py_DECREF(r);
    if (*ms == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

/* -- the current stream --------------------------------------------------------------- */
/* 1 and *dev when the current stream is the default stream of a CUDA device we have a DevRec
 * for (the fast case); 0 for anything else; -1 on error. */
static int
current_default(int *dev)
{
    PyObject *getter = cuda_dict ? PyDict_GetItemWithError(cuda_dict, str_get_stream) : NULL;
    if (getter == NULL || getter == Py_None) {
        return PyErr_Occurred() ? -1 : 0;
    }
    int index;
    if (getter == torch_get_stream && c10_current != NULL && c10_checked) {
        c10_stream s = c10_current(-1);
        if (s.type != 1 || s.id != 0) {
            return 0;
        }
        index = s.index;
    }
    else {
        PyObject *key = PyObject_CallOneArg(getter, minus_one);
        if (key == NULL) {
            return -1;
        }
        if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 3) {
            Py_DECREF(key);
            return 0;
        }
        long sid = PyLong_AsLong(PyTuple_GET_ITEM(key, 0));
        long d = PyLong_AsLong(PyTuple_GET_ITEM(key, 1));
        long type = PyLong_AsLong(PyTuple_GET_ITEM(key, 2));
        Py_DECREF(key);
        if (PyErr_Occurred()) {
            return -1;
        }
        if (sid != 0 || type != 1 || d < 0 || d >= MAX_DEVICES) {
            return 0;
        }
        index = (int)d;
    }
    if (index < 0 || index >= MAX_DEVICES || devs[index] == NULL) {
        return 0;
    }
    *dev = index;
    return 1;
}

/* -- per-Timer core: slots (one per region path) and their statistics ------------------- */
static DevStats *
slot_stats(Slot *s, int dev)
{
    for (DevStats *p = s->stats; p != NULL; p = p->next) {
        if (p->dev == dev) {
            return p;
        }
    }
    DevStats *p = PyMem_Calloc(1, sizeof(DevStats));
    if (p == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    p->dev = dev;
    hist_init(&p->gpu);
    hist_init(&p->cpu);
    p->next = s->stats;
    s->stats = p;
    return p;
}

static void
free_stats(Slot *s)
{
    DevStats *p = s->stats;
    while (p != NULL) {
        DevStats *next = p->next;
        PyMem_Free(p->gpu.b);
        PyMem_Free(p->cpu.b);
        PyMem_Free(p);
        p = next;
    }
    s->stats = NULL;
}

/* The slot of a _Node (made on first sight); -1 with an exception. */
static int32_t
slot_of(CoreObj *c, PyObject *node)
{
    PyObject *v = PyDict_GetItemWithError(c->node_slots, node);
    if (v != NULL) {
        return (int32_t)PyLong_AsLong(v);
    }
    if (PyErr_Occurred()) {
        return -1;
    }
    PyObject *gen = PyObject_GetAttr(node, str_gen);
    if (gen == NULL) {
        return -1;
    }
    int64_t g = PyLong_AsLongLong(gen);
    Py_DECREF(gen);
    if (g == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (grow((void **)&c->slots, &c->slots_cap, c->nslots + 1, sizeof(Slot)) < 0) {
        return -1;
    }
    int32_t i = (int32_t)c->nslots;
    PyObject *index = PyLong_FromLong(i);
    if (index == NULL || PyDict_SetItem(c->node_slots, node, index) < 0) {
        Py_XDECREF(index);
        return -1;
    }
    Py_DECREF(index);
    Py_INCREF(node);
    c->slots[i].node = node;
    c->slots[i].gen = g;
    c->slots[i].stats = NULL;
    c->nslots++;
    return i;
}

static void
trace_clear(CoreObj *c)
{
    for (Py_ssize_t k = 0; k < c->ntrace; k++) {
        Py_CLEAR(c->trace[(c->trace_first + k) % c->trace_samples].entry);
    }
    c->ntrace = 0;
    c->trace_first = 0;
}

/* Step `step` passed step_cap: forget its raw samples here at once (memory stays bounded
 * until the next collect) and tell the Python side, which drops its own. */
static void
step_over(CoreObj *c, int64_t step)
{
    Py_ssize_t k = 0;
    for (Py_ssize_t j = 0; j < c->nseries; j++) {
        if (c->series[j].step != step) {
            c->series[k++] = c->series[j];
        }
    }
    c->nseries = k;
    if (grow((void **)&c->over, &c->over_cap, c->nover + 1, sizeof(int64_t)) == 0) {
        c->over[c->nover++] = step;
    }
    else {
        PyErr_Clear();
    }
}

/* Fold one finished sample in (its events are back in the pool by now); gpu_at_ns places
 * its GPU start for the trace ring. */
static void
core_record(CoreObj *c, PendItem *it, double gpu_ms, double gpu_at_ns, PyObject *entry)
{
    Slot *s = &c->slots[it->slot];
    if (s->gen != c->gen) { /* recorded before reset(): discarded */
        return;
    }
    double cpu_ms = (double)(it->t1 - it->t0) * 1e-6;
    DevStats *st = slot_stats(s, it->dev);
    if (st == NULL || hist_add(&st->gpu, gpu_ms) < 0 || hist_add(&st->cpu, cpu_ms) < 0) {
        PyErr_Clear(); /* out of memory: the sample is lost, the run goes on */
    }
    else {
        st->calls++;
    }
    if (c->keep_steps > 0) {
        if (it->step > c->max_step) {
            c->max_step = it->step;
        }
        if (it->step > c->count_step) {
            c->count_step = it->step;
            c->count = 0;
        }
        /* Samples of older steps (late harvests) are not counted here; the Python side's
         * count, which sees them all when it takes them in, still caps them. */
        if (it->step == c->count_step && ++c->count > c->step_cap) {
            if (c->count == c->step_cap + 1) {
                step_over(c, it->step);
            }
            goto trace; /* the step's raw samples are dropped: keep no more of them */
        }
        if (c->nseries >= c->series_limit) {
            /* Steps older than the window are dropped by the Python side anyway. */
            Py_ssize_t k = 0;
            for (Py_ssize_t j = 0; j < c->nseries; j++) {
                if (c->series[j].step > c->max_step - c->keep_steps) {
                    c->series[k++] = c->series[j];
                }
            }
            c->nseries = k;
            if (k > c->series_limit / 2) {
                c->series_limit *= 2;
            }
        }
        if (grow((void **)&c->series, &c->series_cap, c->nseries + 1, sizeof(SeriesItem)) == 0) {
            SeriesItem *si = &c->series[c->nseries++];
            si->slot = it->slot;
            si->dev = it->dev;
            si->step = it->step;
            si->gpu_ms = gpu_ms;
            si->cpu_ms = cpu_ms;
        }
        else {
            PyErr_Clear();
        }
    }
trace:
    if (c->trace_samples <= 0 || c->trace == NULL) {
        return;
    }
    if (c->ntrace == c->trace_samples) {
        Py_CLEAR(c->trace[c->trace_first].entry);
        c->trace_first = (c->trace_first + 1) % c->trace_samples;
        c->ntrace--;
    }
    TraceItem *t = &c->trace[(c->trace_first + c->ntrace) % c->trace_samples];
    c->ntrace++;
    t->slot = it->slot;
    t->entry = Py_NewRef(entry);
    t->gpu_at_ns = gpu_at_ns;
    t->gpu_ms = gpu_ms;
    t->t0 = it->t0;
    t->step = it->step;
    t->cpu_ms = cpu_ms;
    t->tid = it->tid;
}

static int
core_init(CoreObj *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"local", "keep_steps", "trace_samples", "step_cap", NULL};
    PyObject *local;
    Py_ssize_t keep, trace, step_cap;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Onnn:Core", kw, &local, &keep, &trace,
                                     &step_cap)) {
        return -1;
    }
    if (self->node_slots != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Core is initialised once");
        return -1;
    }
    if (keep < 0 || trace < 0 || step_cap < 1) {
        PyErr_SetString(PyExc_ValueError,
                        "keep_steps and trace_samples must be >= 0, step_cap >= 1");
        return -1;
    }
    self->node_slots = PyDict_New();
    if (self->node_slots == NULL) {
        return -1;
    }
    if (trace > 0) {
        self->trace = PyMem_Calloc((size_t)trace, sizeof(TraceItem));
        if (self->trace == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    Py_INCREF(local);
    self->local = local;
    self->enabled = 1;
    self->keep_steps = keep;
    self->trace_samples = trace;
    self->step_cap = step_cap;
    self->series_limit = 1 << 16;
    self->serial = next_serial++;
    return 0;
}

static int
core_traverse(CoreObj *self, visitproc visit, void *arg)
{
    Py_VISIT(self->local);
    Py_VISIT(self->node_slots);
    for (Py_ssize_t i = 0; i < self->nslots; i++) {
        Py_VISIT(self->slots[i].node);
    }
    for (Py_ssize_t k = 0; k < self->ntrace; k++) {
        Py_VISIT(self->trace[(self->trace_first + k) % self->trace_samples].entry);
    }
    return 0;
}

static void
core_forget_slots(CoreObj *self)
{
    Py_ssize_t n = self->nslots;
    Slot *slots = self->slots;
    self->nslots = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        free_stats(&slots[i]);
        Py_CLEAR(slots[i].node);
    }
}

static int
core_clear(CoreObj *self)
{
    Py_CLEAR(self->local);
    Py_CLEAR(self->node_slots);
    if (self->trace != NULL) {
        trace_clear(self);
    }
    core_forget_slots(self);
    return 0;
}

static void
core_dealloc(CoreObj *self)
{
    PyObject_GC_UnTrack(self);
    if (self->trace != NULL) {
        trace_clear(self);
    }
    core_clear(self);
    PyMem_Free(self->slots);
    PyMem_Free(self->series);
    PyMem_Free(self->trace);
    PyMem_Free(self->over);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(core_collect_doc,
"collect() -> (stats, series, trace, over)\n\n"
"Hand over what the compiled harvest recorded since the last call, and forget it here:\n"
"stats: [(node, device, calls, gpu, cpu)] with histograms as (count, total, min, max, zeros,\n"
"[(bucket, n)]); series: [(node, device, step, gpu_ms, cpu_ms)]; trace: [(node, entry,\n"
"gpu_at_ns, gpu_ms, t0_ns, cpu_ms, step, tid)], gpu_at_ns None when it could not be read;\n"
"over: [step] whose samples passed step_cap (their series are dropped).");

static PyObject *
core_collect(CoreObj *self, PyObject *unused)
{
    (void)unused;
    PyObject *stats = PyList_New(0), *series = PyList_New(0), *trace = PyList_New(0);
    PyObject *over = PyList_New(0);
    if (stats == NULL || series == NULL || trace == NULL || over == NULL) {
        goto fail;
    }
    for (Py_ssize_t k = 0; k < self->nover; k++) {
        PyObject *v = PyLong_FromLongLong(self->over[k]);
        if (v == NULL || PyList_Append(over, v) < 0) {
            Py_XDECREF(v);
            goto fail;
        }
        Py_DECREF(v);
    }
    self->nover = 0;
    for (Py_ssize_t i = 0; i < self->nslots; i++) {
        Slot *s = &self->slots[i];
        for (DevStats *p = s->stats; p != NULL; p = p->next) {
            if (p->calls == 0) {
                continue;
            }
            PyObject *g = hist_tuple(&p->gpu), *h = g ? hist_tuple(&p->cpu) : NULL;
            PyObject *row = h ? Py_BuildValue("(OiLNN)", s->node, p->dev, (long long)p->calls,
                                              g, h)
                              : NULL;
            if (row == NULL) {
                Py_XDECREF(g);
                Py_XDECREF(h);
                goto fail;
            }
            int rc = PyList_Append(stats, row);
            Py_DECREF(row);
            if (rc < 0) {
                goto fail;
            }
        }
        free_stats(s);
    }
    for (Py_ssize_t j = 0; j < self->nseries; j++) {
        SeriesItem *si = &self->series[j];
        PyObject *row = Py_BuildValue("(OiLdd)", self->slots[si->slot].node, si->dev,
                                      (long long)si->step, si->gpu_ms, si->cpu_ms);
        if (row == NULL || PyList_Append(series, row) < 0) {
            Py_XDECREF(row);
            goto fail;
        }
        Py_DECREF(row);
    }
    self->nseries = 0;
    while (self->ntrace > 0) {
        TraceItem *t = &self->trace[self->trace_first];
        PyObject *at = isnan(t->gpu_at_ns) ? Py_NewRef(Py_None) : PyFloat_FromDouble(t->gpu_at_ns);
        PyObject *row = at ? Py_BuildValue("(OONdLdLk)", self->slots[t->slot].node, t->entry,
                                           at, t->gpu_ms, (long long)t->t0, t->cpu_ms,
                                           (long long)t->step, t->tid)
                           : NULL;
        if (row == NULL || PyList_Append(trace, row) < 0) {
            Py_XDECREF(row);
            goto fail;
        }
        Py_DECREF(row);
        Py_CLEAR(t->entry);
        self->trace_first = (self->trace_first + 1) % self->trace_samples;
        self->ntrace--;
    }
    self->trace_first = 0;
    return Py_BuildValue("(NNNN)", stats, series, trace, over);
fail:
    Py_XDECREF(stats);
    Py_XDECREF(series);
    Py_XDECREF(trace);
    Py_XDECREF(over);
    return NULL;
}

PyDoc_STRVAR(core_reset_doc,
"reset(gen)\n\nForget statistics, series and trace (Timer.reset); samples still pending are\n"
"dropped when they finish, since their nodes are older than gen.");

static PyObject *
core_reset(CoreObj *self, PyObject *arg)
{
    int64_t gen = PyLong_AsLongLong(arg);
    if (gen == -1 && PyErr_Occurred()) {
        return NULL;
    }
    self->gen = gen;
    for (Py_ssize_t i = 0; i < self->nslots; i++) {
        free_stats(&self->slots[i]);
    }
    self->nseries = 0;
    self->max_step = 0;
    self->count_step = 0;
    self->count = 0;
    self->nover = 0;
    if (self->trace != NULL) {
        trace_clear(self);
    }
    /* Slots stay (open frames point at them); the node map starts afresh for new nodes. */
    PyDict_Clear(self->node_slots);
    Py_RETURN_NONE;
}

static PyObject *
core_pending(CoreObj *self, PyObject *unused)
{
    (void)unused;
    Py_ssize_t n = 0;
    for (int i = 0; i < MAX_DEVICES; i++) {
        DevRec *d = devs[i];
        for (Py_ssize_t k = 0; d != NULL && k < d->pn; k++) {
            n += d->pend[d->pfirst + k].core == self;
        }
    }
    return PyLong_FromSsize_t(n);
}

static PyMethodDef core_methods[] = {
    {"collect", (PyCFunction)core_collect, METH_NOARGS, core_collect_doc},
    {"pending", (PyCFunction)core_pending, METH_NOARGS, "This Timer's samples still pending."},
    {"reset", (PyCFunction)core_reset, METH_O, core_reset_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef core_members[] = {
    {"enabled", T_INT, offsetof(CoreObj, enabled), 0, "Timer on (regions recorded)."},
    {"step", T_LONGLONG, offsetof(CoreObj, step), 0, "The Timer's step number."},
    {"gen", T_LONGLONG, offsetof(CoreObj, gen), READONLY, "The Timer's reset generation."},
    {"slots", T_PYSSIZET, offsetof(CoreObj, nslots), READONLY, "Region paths seen."},
    {"series", T_PYSSIZET, offsetof(CoreObj, nseries), READONLY,
     "Per-step samples held until the next collect()."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudatimer._speedups.Core",
    .tp_doc = PyDoc_STR("Core(local, keep_steps, trace_samples, step_cap): a Timer's compiled "
                        "state."),
    .tp_basicsize = sizeof(CoreObj),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)core_init,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_traverse = (traverseproc)core_traverse,
    .tp_clear = (inquiry)core_clear,
    .tp_methods = core_methods,
    .tp_members = core_members,
};

/* -- per-device default-stream records ------------------------------------------------ */
static void
devrec_free(DevRec *d, PyObject *bury)
{
    /* bury: a list that takes every Python object instead of releasing it (a forked child
     * must never destroy its parent's CUDA events). */
#define DROP(o)                                  \
    do {                                         \
        if (bury != NULL) {                      \
            if (PyList_Append(bury, (o)) < 0) {  \
                PyErr_Clear();                   \
            }                                    \
        }                                        \
        Py_DECREF(o);                            \
    } while (0)
    for (Py_ssize_t i = 0; i < d->npool; i++) {
        DROP(d->pool[i].ev);
    }
    for (Py_ssize_t i = 0; i < d->pn; i++) {
        PendItem *it = &d->pend[d->pfirst + i];
        DROP(it->s.ev);
        DROP(it->e.ev);
        Py_DECREF(it->core);
    }
    if (d->anchor.ev != NULL) {
        DROP(d->anchor.ev);
    }
    DROP(d->entry);
#undef DROP
    Py_DECREF(d->stream);
    Py_DECREF(d->clock);
    PyMem_Free(d->pool);
    PyMem_Free(d->pend);
    PyMem_Free(d);
}

/* Where the finished event *s started, on the host clock (ns; NAN if unreadable), for the
 * trace: one elapsed read against the anchor, so the sample's events go straight back to the
 * pool. Keeping them until a report instead (the trace ring's 2 x 4096 events) made every
 * record cycle through thousands of distinct CUDA events; in the launch-bound loop (H200),
 * 512 distinct events already cost 1.19-1.20x what re-recording the same two does.
 * cudaEventElapsedTime is float32 ms, good to ~4 ns within 100 ms: past ANCHOR_HOP_MS the
 * anchor moves to *s and its position adds up in double, so placement stays to the
 * microsecond over hours. *s then stays as the anchor
 * and the old anchor takes its place (NULL for entry.ref, which is never pooled). */
#define ANCHOR_HOP_MS 100.0

static double
place(DevRec *d, EvRef *s)
{
    double off;
    if (d->anchor.ev == NULL || ev_elapsed(d->anchor, *s, &off) < 0) {
        return NAN;
    }
    double at_ms = d->anchor_ms + off;
    if (off > ANCHOR_HOP_MS) {
        EvRef old = d->anchor;
        d->anchor = *s;
        d->anchor_ms = at_ms;
        if (d->anchor_is_ref) {
            Py_DECREF(old.ev);
            old.ev = NULL;
            d->anchor_is_ref = 0;
        }
        *s = old;
    }
    return (double)d->ref_ns + at_ms * 1e6;
}

static Py_ssize_t
harvest_batch(void)
{
    PyObject *v = cuda_dict ? PyDict_GetItemWithError(cuda_dict, str_batch) : NULL;
    Py_ssize_t n = v ? PyLong_AsSsize_t(v) : 256;
    if (n < 1) {
        PyErr_Clear();
        n = 256;
    }
    return n;
}

/* Resolve the finished samples of d without blocking. Events of one stream complete in
 * record order, so one query of the newest clears a whole batch when the GPU keeps up, and
 * a binary search finds the first unfinished one when it lags. */
static void
harvest(DevRec *d)
{
    if (d->harvesting) {
        return; /* re-entered from a Python event method (fake GPU): the outer call goes on */
    }
    d->harvesting = 1;
    Py_ssize_t ready = d->pn;
    if (ready > 0 && !ev_done(d->pend[d->pfirst + ready - 1].e)) {
        Py_ssize_t lo = 0, hi = ready - 1;
        while (lo < hi && lo < d->pn) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (mid < d->pn && ev_done(d->pend[d->pfirst + mid].e)) {
                lo = mid + 1;
            }
            else {
                hi = mid;
            }
        }
        ready = lo;
    }
    for (Py_ssize_t k = 0; k < ready && d->pn > 0; k++) {
        PendItem it = d->pend[d->pfirst];
        double ms;
        if (ev_elapsed(it.s, it.e, &ms) < 0) {
            break; /* not readable yet: it stays first in line */
        }
        d->pfirst++;
        d->pn--;
        CoreObj *c = it.core;
        double at_ns = NAN;
        if (c->trace_samples > 0 && c->slots[it.slot].gen == c->gen) {
            at_ns = place(d, &it.s);
        }
        ev_release(it.dev, it.s);
        ev_release(it.dev, it.e);
        core_record(c, &it, ms, at_ns, d->entry);
        Py_DECREF(c);
    }
    if (d->pn == 0) {
        d->pfirst = 0;
    }
    else if (d->pfirst > d->pcap / 2) {
        memmove(d->pend, d->pend + d->pfirst, (size_t)d->pn * sizeof(PendItem));
        d->pfirst = 0;
    }
    d->check_at = d->pn + harvest_batch();
    d->harvesting = 0;
}

static int
pend_push(DevRec *d, PendItem *it)
{
    if (d->pfirst + d->pn >= d->pcap && d->pfirst > 0) {
        memmove(d->pend, d->pend + d->pfirst, (size_t)d->pn * sizeof(PendItem));
        d->pfirst = 0;
    }
    if (grow((void **)&d->pend, &d->pcap, d->pfirst + d->pn + 1, sizeof(PendItem)) < 0) {
        return -1;
    }
    d->pend[d->pfirst + d->pn++] = *it;
    return 0;
}

/* -- the per-thread stack of open regions ---------------------------------------------- */
static void
frame_clear(Frame *f)
{
    if (f->py != NULL) {
        Py_CLEAR(f->py);
        return;
    }
    Py_CLEAR(f->region);
    Py_CLEAR(f->entry);
    Py_CLEAR(f->start.ev);
}

/* The frame as the Python paths see it: (region, node, entry, start event, t0_ns). */
static PyObject *
frame_tuple(Frame *f)
{
    if (f->py != NULL) {
        Py_INCREF(f->py);
        return f->py;
    }
    return Py_BuildValue("(OOOOL)", f->region, f->node, f->entry, f->start.ev,
                         (long long)f->t0);
}

static int
stack_index(StackObj *st, Py_ssize_t *i)
{
    if (*i < 0) {
        *i += st->n;
    }
    if (*i < 0 || *i >= st->n) {
        PyErr_SetString(PyExc_IndexError, "stack index out of range");
        return -1;
    }
    return 0;
}

static int
stack_push_py(StackObj *st, PyObject *frame)
{
    if (grow((void **)&st->f, &st->cap, st->n + 1, sizeof(Frame)) < 0) {
        return -1;
    }
    Frame *f = &st->f[st->n++];
    memset(f, 0, sizeof(*f));
    Py_INCREF(frame);
    f->py = frame;
    return 0;
}

static Py_ssize_t
stack_len(StackObj *st)
{
    return st->n;
}

static PyObject *
stack_item(StackObj *st, Py_ssize_t i)
{
    if (i < 0 || i >= st->n) {
        PyErr_SetString(PyExc_IndexError, "stack index out of range");
        return NULL;
    }
    return frame_tuple(&st->f[i]);
}

static int
stack_ass_item(StackObj *st, Py_ssize_t i, PyObject *value)
{
    if (i < 0 || i >= st->n) {
        PyErr_SetString(PyExc_IndexError, "stack index out of range");
        return -1;
    }
    Frame old = st->f[i];
    if (value == NULL) {
        memmove(&st->f[i], &st->f[i + 1], (size_t)(st->n - i - 1) * sizeof(Frame));
        st->n--;
    }
    else {
        if (!PyTuple_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "stack frames are tuples");
            return -1;
        }
        memset(&st->f[i], 0, sizeof(Frame));
        Py_INCREF(value);
        st->f[i].py = value;
    }
    frame_clear(&old);
    return 0;
}

static PyObject *
stack_append(StackObj *st, PyObject *frame)
{
    if (!PyTuple_Check(frame)) {
        PyErr_SetString(PyExc_TypeError, "stack frames are tuples");
        return NULL;
    }
    if (stack_push_py(st, frame) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
stack_pop(StackObj *st, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i = -1;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "pop() takes at most 1 argument");
        return NULL;
    }
    if (nargs == 1 && (i = PyLong_AsSsize_t(args[0])) == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (st->n == 0) {
        PyErr_SetString(PyExc_IndexError, "pop from empty stack");
        return NULL;
    }
    if (stack_index(st, &i) < 0) {
        return NULL;
    }
    PyObject *t = frame_tuple(&st->f[i]);
    if (t == NULL || stack_ass_item(st, i, NULL) < 0) {
        Py_XDECREF(t);
        return NULL;
    }
    return t;
}

static PyObject *
stack_list(StackObj *st)
{
    PyObject *out = PyList_New(st->n);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < st->n; i++) {
        PyObject *t = frame_tuple(&st->f[i]);
        if (t == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, t);
    }
    return out;
}

static PyObject *
stack_richcompare(StackObj *st, PyObject *other, int op)
{
    if (op != Py_EQ && op != Py_NE) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *mine = stack_list(st);
    if (mine == NULL) {
        return NULL;
    }
    PyObject *theirs = Py_TYPE(other) == &StackType ? stack_list((StackObj *)other) : other;
    if (theirs != other && theirs == NULL) {
        Py_DECREF(mine);
        return NULL;
    }
    if (theirs == other) {
        Py_INCREF(theirs);
    }
    PyObject *r = PyObject_RichCompare(mine, theirs, op);
    Py_DECREF(mine);
    Py_DECREF(theirs);
    return r;
}

static PyObject *
stack_repr(StackObj *st)
{
    PyObject *l = stack_list(st);
    if (l == NULL) {
        return NULL;
    }
    PyObject *r = PyUnicode_FromFormat("Stack(%R)", l);
    Py_DECREF(l);
    return r;
}

static int
stack_init(StackObj *st, PyObject *args, PyObject *kwds)
{
    if (!PyArg_ParseTuple(args, ":Stack") || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "Stack() takes no arguments");
        }
        return -1;
    }
    st->tid = PyThread_get_thread_ident();
    return 0;
}

static int
stack_traverse(StackObj *st, visitproc visit, void *arg)
{
    for (Py_ssize_t i = 0; i < st->n; i++) {
        Py_VISIT(st->f[i].py);
        Py_VISIT(st->f[i].region);
        Py_VISIT(st->f[i].entry);
    }
    return 0;
}

static int
stack_clear(StackObj *st)
{
    while (st->n > 0) {
        Frame f = st->f[--st->n];
        frame_clear(&f);
    }
    return 0;
}

static void
stack_dealloc(StackObj *st)
{
    PyObject_GC_UnTrack(st);
    stack_clear(st);
    PyMem_Free(st->f);
    Py_TYPE(st)->tp_free((PyObject *)st);
}

static PyObject *
stack_get_tid(StackObj *st, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLong(st->tid);
}

static PySequenceMethods stack_as_sequence = {
    .sq_length = (lenfunc)stack_len,
    .sq_item = (ssizeargfunc)stack_item,
    .sq_ass_item = (ssizeobjargproc)stack_ass_item,
};

static PyObject *
stack_clear_method(StackObj *st, PyObject *unused)
{
    (void)unused;
    stack_clear(st);
    Py_RETURN_NONE;
}

static PyMethodDef stack_methods[] = {
    {"append", (PyCFunction)stack_append, METH_O, "Push a frame tuple."},
    {"clear", (PyCFunction)stack_clear_method, METH_NOARGS, "Drop every frame."},
    {"pop", (PyCFunction)(void (*)(void))stack_pop, METH_FASTCALL,
     "Remove and return the frame at an index (default last)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef stack_getset[] = {
    {"tid", (getter)stack_get_tid, NULL, "threading.get_ident() of the owning thread.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject StackType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudatimer._speedups.Stack",
    .tp_doc = PyDoc_STR("A thread's open regions: frames of the compiled path and tuples of "
                        "the Python path in one stack; reads like a list of tuples."),
    .tp_basicsize = sizeof(StackObj),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)stack_init,
    .tp_dealloc = (destructor)stack_dealloc,
    .tp_traverse = (traverseproc)stack_traverse,
    .tp_clear = (inquiry)stack_clear,
    .tp_as_sequence = &stack_as_sequence,
    .tp_richcompare = (richcmpfunc)stack_richcompare,
    .tp_repr = (reprfunc)stack_repr,
    .tp_methods = stack_methods,
    .tp_getset = stack_getset,
};

/* This thread's Stack of core's Timer: a 4-entry thread-local cache in front of the
 * threading.local lookup (~0.1 us). A cached Stack is held (one per thread and Timer, kept
 * after the thread ends). NULL without error: not a Stack (pure Python stack), take the
 * general path. */
#define TLS_WAYS 4
static _Thread_local struct {
    int64_t serial;
    StackObj *st;
} tls_stacks[TLS_WAYS];
static _Thread_local unsigned tls_next;

static StackObj *
tls_stack(CoreObj *c)
{
    for (int i = 0; i < TLS_WAYS; i++) {
        if (tls_stacks[i].serial == c->serial) {
            return tls_stacks[i].st;
        }
    }
    PyObject *st = PyObject_GetAttr(c->local, str_stack);
    if (st == NULL) {
        return NULL;
    }
    if (Py_TYPE(st) != &StackType) {
        Py_DECREF(st);
        return NULL;
    }
    unsigned w = tls_next++ % TLS_WAYS;
    StackObj *old = tls_stacks[w].st;
    tls_stacks[w].serial = c->serial;
    tls_stacks[w].st = (StackObj *)st;
    Py_XDECREF(old);
    return (StackObj *)st;
}

/* -- Region.__enter__ / __exit__ ---------------------------------------------------------- */
static int
nvtx_call(PyObject *fn, PyObject *arg)
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

static PyObject *
slow_call(PyObject *self, PyObject *method, PyObject *arg)
{
    PyObject *timer = PyObject_GetAttr(self, str_timer);
    if (timer == NULL) {
        return NULL;
    }
    PyObject *args[3] = {timer, self, arg};
    PyObject *r = PyObject_VectorcallMethod(method, args, arg ? 3 : 2, NULL);
    Py_DECREF(timer);
    return r;
}

/* The slot of this region under the frame on top of st (the region's one-entry cache, else
 * parent.child(name) and the node map). -1 with an exception. */
static int32_t
child_slot(RegionObj *r, CoreObj *c, StackObj *st)
{
    int32_t parent;
    PyObject *pnode;
    if (st->n == 0) {
        parent = -1;
        pnode = NULL;
    }
    else {
        Frame *top = &st->f[st->n - 1];
        if (top->py != NULL) {
            if (!PyTuple_Check(top->py) || PyTuple_GET_SIZE(top->py) < 2) {
                PyErr_SetString(PyExc_RuntimeError, "cudatimer: malformed frame");
                return -1;
            }
            pnode = PyTuple_GET_ITEM(top->py, 1);
            Py_INCREF(pnode);
            parent = slot_of(c, pnode);
            Py_DECREF(pnode);
            if (parent < 0) {
                return -1;
            }
        }
        else {
            parent = top->slot;
        }
        pnode = c->slots[parent].node;
    }
    if (r->c_gen == c->gen && r->c_parent == parent && r->c_slot >= 0) {
        return r->c_slot;
    }
    PyObject *node;
    if (pnode == NULL) { /* the Timer's root: timer._root.child(name) */
        PyObject *timer = PyObject_GetAttr((PyObject *)r, str_timer);
        if (timer == NULL) {
            return -1;
        }
        PyObject *root = PyObject_GetAttrString(timer, "_root");
        Py_DECREF(timer);
        if (root == NULL) {
            return -1;
        }
        node = PyObject_CallMethodOneArg(root, str_child, r->name);
        Py_DECREF(root);
    }
    else {
        Py_INCREF(pnode);
        node = PyObject_CallMethodOneArg(pnode, str_child, r->name);
        Py_DECREF(pnode);
    }
    if (node == NULL) {
        return -1;
    }
    int32_t slot = slot_of(c, node);
    Py_DECREF(node);
    if (slot < 0) {
        return -1;
    }
    r->c_gen = c->gen;
    r->c_parent = parent;
    r->c_slot = slot;
    return slot;
}

static PyObject *
region_enter(RegionObj *r, PyObject *unused)
{
    (void)unused;
    CoreObj *c = r->core;
    if (!r->fast || c == NULL || !c->enabled || !g_usable) {
        goto slow;
    }
    StackObj *st = tls_stack(c);
    if (st == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        goto slow;
    }
    int dev;
    int k = current_default(&dev);
    if (k <= 0) {
        if (k < 0) {
            return NULL;
        }
        goto slow;
    }
    int32_t slot = child_slot(r, c, st);
    if (slot < 0) {
        return NULL;
    }
    DevRec *d = devs[dev];
    if (d == NULL) { /* gone during a Python call above */
        goto slow;
    }
    if (nvtx_call(r->push, r->attrs) < 0) {
        return NULL;
    }
    EvRef ev;
    if (take_event(d, &ev) < 0) {
        PyObject *et, *evv, *tb;
        PyErr_Fetch(&et, &evv, &tb);
        if (nvtx_call(r->pop, NULL) < 0) {
            PyErr_Clear();
        }
        PyErr_Restore(et, evv, tb);
        return NULL;
    }
    if (grow((void **)&st->f, &st->cap, st->n + 1, sizeof(Frame)) < 0) {
        pool_put(d, ev);
        return NULL;
    }
    Frame *f = &st->f[st->n++];
    f->py = NULL;
    Py_INCREF(r);
    f->region = (PyObject *)r;
    f->node = c->slots[slot].node;
    Py_INCREF(d->entry);
    f->entry = d->entry;
    f->slot = slot;
    f->dev = dev;
    f->start = ev;
    f->t0 = mono_ns();
    Py_INCREF(r);
    return (PyObject *)r;
slow:;
    PyObject *res = slow_call((PyObject *)r, str_enter, NULL);
    if (res == NULL) {
        return NULL;
    }
    Py_DECREF(res);
    Py_INCREF(r);
    return (PyObject *)r;
}

static PyObject *
region_exit(RegionObj *r, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t t1 = mono_ns();
    if (bad_nargs(nargs, 3, "__exit__(exc_type, exc, tb)")) {
        return NULL;
    }
    CoreObj *c = r->core;
    if (!r->fast || c == NULL) {
        goto slow;
    }
    StackObj *st = tls_stack(c);
    if (st == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        goto slow;
    }
    if (st->n == 0) {
        goto slow;
    }
    Frame *top = &st->f[st->n - 1];
    if (top->py != NULL || top->region != (PyObject *)r) {
        goto slow;
    }
    int dev;
    int k = current_default(&dev);
    if (k < 0) {
        return NULL;
    }
    if (k == 0 || dev != top->dev || devs[dev] == NULL
        || devs[dev]->entry != top->entry) {
        goto slow; /* a stream or device switch inside the region: the general path */
    }
    DevRec *d = devs[dev];
    Frame f = st->f[--st->n];
    EvRef end;
    int failed = take_event(d, &end) < 0;
    if (!failed) {
        PendItem it = {c, f.slot, f.dev, f.start, end, f.t0, t1, c->step, st->tid};
        if (pend_push(d, &it) < 0) {
            pool_put(d, end);
            failed = 1;
        }
        else {
            Py_INCREF(c);
            f.start.ev = NULL; /* the pending sample holds it now */
        }
    }
    if (f.start.ev != NULL) {
        pool_put(d, f.start);
        f.start.ev = NULL;
    }
    frame_clear(&f);
    if (!failed && d->pn >= d->check_at) {
        harvest(d);
    }
    PyObject *et = NULL, *ev = NULL, *tb = NULL;
    if (failed) {
        PyErr_Fetch(&et, &ev, &tb);
    }
    if (nvtx_call(r->pop, NULL) < 0) {
        if (failed) {
            PyErr_Clear();
        }
        else {
            return NULL;
        }
    }
    if (failed) {
        PyErr_Restore(et, ev, tb);
        return NULL;
    }
    Py_RETURN_NONE;
slow:;
    PyObject *res = slow_call((PyObject *)r, str_exit, args[0] == Py_None ? Py_True : Py_False);
    if (res == NULL) {
        return NULL;
    }
    Py_DECREF(res);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(region_bind_doc,
"_bind(core, fast, name, push, attrs, pop)\n\n"
"Set what the compiled hooks read (Region.__init__ calls it once): the Timer's Core, whether\n"
"this region may take the common case, its name and its NVTX push/pop (None when off).");

static PyObject *
region_bind(RegionObj *r, PyObject *args)
{
    PyObject *core, *name, *push, *attrs, *pop;
    int fast;
    if (!PyArg_ParseTuple(args, "OpUOOO:_bind", &core, &fast, &name, &push, &attrs, &pop)) {
        return NULL;
    }
    if (core != Py_None && Py_TYPE(core) != &CoreType) {
        PyErr_SetString(PyExc_TypeError, "_bind: core must be a Core or None");
        return NULL;
    }
    Py_XSETREF(r->core, core == Py_None ? NULL : (CoreObj *)Py_NewRef(core));
    Py_XSETREF(r->name, Py_NewRef(name));
    Py_XSETREF(r->push, push == Py_None ? NULL : Py_NewRef(push));
    Py_XSETREF(r->attrs, attrs == Py_None ? NULL : Py_NewRef(attrs));
    Py_XSETREF(r->pop, pop == Py_None ? NULL : Py_NewRef(pop));
    r->fast = fast && r->core != NULL;
    r->c_slot = -1;
    r->c_gen = -1;
    Py_RETURN_NONE;
}

static int
region_traverse(RegionObj *r, visitproc visit, void *arg)
{
    /* The type is visited by the Python subclass's traverse (subtype_traverse). */
    Py_VISIT(r->core);
    Py_VISIT(r->push);
    Py_VISIT(r->attrs);
    Py_VISIT(r->pop);
    return 0;
}

static int
region_clear(RegionObj *r)
{
    Py_CLEAR(r->core);
    Py_CLEAR(r->name);
    Py_CLEAR(r->push);
    Py_CLEAR(r->attrs);
    Py_CLEAR(r->pop);
    return 0;
}

static void
region_dealloc(RegionObj *r)
{
    PyTypeObject *tp = Py_TYPE(r);
    PyObject_GC_UnTrack(r);
    region_clear(r);
    /* A Python subclass's dealloc (subtype_dealloc) releases the type after this. */
    tp->tp_free((PyObject *)r);
}

static PyMethodDef region_methods[] = {
    {"__enter__", (PyCFunction)region_enter, METH_NOARGS, "Open the region."},
    {"__exit__", (PyCFunction)(void (*)(void))region_exit, METH_FASTCALL, "Close the region."},
    {"_bind", (PyCFunction)region_bind, METH_VARARGS, region_bind_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RegionBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudatimer._speedups.RegionBase",
    .tp_doc = PyDoc_STR("Base of cudatimer.Region: the compiled __enter__/__exit__."),
    .tp_basicsize = sizeof(RegionObj),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)region_dealloc,
    .tp_traverse = (traverseproc)region_traverse,
    .tp_clear = (inquiry)region_clear,
    .tp_methods = region_methods,
};

/* -- module functions of the recorder ------------------------------------------------------ */
PyDoc_STRVAR(configure_doc,
"configure(namespace, get_stream, inv_log_gamma)\n\n"
"namespace: cudatimer._cuda's globals (its _get_stream and HARVEST_BATCH are read from there,\n"
"so tests can replace them); get_stream: torch's _cuda_getCurrentStream (while it is the one\n"
"in namespace, the stream is read from c10 directly); inv_log_gamma: 1/log(GAMMA) of _hist.");

static PyObject *
configure(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *ns, *getter;
    double inv;
    if (!PyArg_ParseTuple(args, "O!Od:configure", &PyDict_Type, &ns, &getter, &inv)) {
        return NULL;
    }
    Py_XSETREF(cuda_dict, Py_NewRef(ns));
    Py_XSETREF(torch_get_stream, Py_NewRef(getter));
    inv_log_gamma = inv;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(current_stream_doc,
"current_stream() -> (stream id, device, device type) | None\n\n"
"The current stream as c10 reports it to the compiled path (None when that symbol is not\n"
"bound). Compare with torch._C._cuda_getCurrentStream(-1), then call trust_current_stream.");

static PyObject *
current_stream(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (c10_current == NULL) {
        Py_RETURN_NONE;
    }
    c10_stream s = c10_current(-1);
    return Py_BuildValue("(Lii)", (long long)s.id, (int)s.index, (int)s.type);
}

static PyObject *
trust_current_stream(PyObject *module, PyObject *arg)
{
    (void)module;
    int on = PyObject_IsTrue(arg);
    if (on < 0) {
        return NULL;
    }
    c10_checked = on && c10_current != NULL;
    return PyBool_FromLong(c10_checked);
}

static PyObject *
set_usable(PyObject *module, PyObject *arg)
{
    (void)module;
    int on = PyObject_IsTrue(arg);
    if (on < 0) {
        return NULL;
    }
    g_usable = on;
    Py_RETURN_NONE;
}

/* -- the region of CUDATIMER_DISABLE ---------------------------------------------------- */
/* `with cuda_region("x"):` under CUDATIMER_DISABLE: C no-ops, so the with statement costs what
 * it costs around any C context manager (the Python _NullRegion's two calls added ~50 ns). */
static PyObject *
null_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    return Py_NewRef(self);
}

static PyObject *
null_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    (void)args;
    (void)nargs;
    Py_RETURN_NONE;
}

static PyObject *
null_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    if (PyTuple_GET_SIZE(args) != 1 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0)) {
        PyErr_SetString(PyExc_TypeError, "a disabled region decorates one function: @region");
        return NULL;
    }
    return Py_NewRef(PyTuple_GET_ITEM(args, 0)); /* the function, undecorated */
}

static PyObject *
null_name(PyObject *self, void *closure)
{
    (void)self;
    (void)closure;
    return PyUnicode_FromString("");
}

static PyGetSetDef null_getset[] = {
    {"name", null_name, NULL, "\"\": a disabled region has no name.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef null_methods[] = {
    {"__enter__", (PyCFunction)null_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))null_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject NullRegionType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudatimer._speedups.NullRegion",
    .tp_doc = PyDoc_STR("What regions become under CUDATIMER_DISABLE: nothing on enter, exit "
                        "or call (a decorated function comes back unchanged)."),
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_call = null_call,
    .tp_methods = null_methods,
    .tp_getset = null_getset,
};

PyDoc_STRVAR(add_stream_doc,
"add_stream(entry)\n\nGive the compiled path the StreamEntry of a device's default stream\n"
"(replacing an older one of that device, whose pending samples are dropped).");

static PyObject *
add_stream(PyObject *module, PyObject *entry)
{
    (void)module;
    PyObject *dev_o = PyObject_GetAttr(entry, str_device);
    if (dev_o == NULL) {
        return NULL;
    }
    long dev = PyLong_AsLong(dev_o);
    Py_DECREF(dev_o);
    if (dev == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (dev < 0 || dev >= MAX_DEVICES) {
        Py_RETURN_FALSE;
    }
    PyObject *stream = PyObject_GetAttr(entry, str_stream);
    PyObject *clock = stream ? PyObject_GetAttr(entry, str_clock) : NULL;
    PyObject *raw = clock ? PyObject_GetAttr(entry, str_raw) : NULL;
    PyObject *ref = raw ? PyObject_GetAttr(entry, str_ref) : NULL;
    PyObject *ref_ns_o = ref ? PyObject_GetAttr(entry, str_ref_ns) : NULL;
    long long ref_ns = ref_ns_o ? PyLong_AsLongLong(ref_ns_o) : -1;
    Py_XDECREF(ref_ns_o);
    if (ref_ns_o == NULL || (ref_ns == -1 && PyErr_Occurred())) {
        Py_XDECREF(stream);
        Py_XDECREF(clock);
        Py_XDECREF(raw);
        Py_XDECREF(ref);
        return NULL;
    }
    void *raw_p = NULL;
    int use_raw = 0;
    if (raw != Py_None && rt_record != NULL) {
        raw_p = PyLong_AsVoidPtr(raw);
        if (raw_p == NULL && PyErr_Occurred()) {
            PyErr_Clear();
        }
        else {
            use_raw = 1;
        }
    }
    Py_DECREF(raw);
    DevRec *d = PyMem_Calloc(1, sizeof(DevRec));
    if (d == NULL) {
        Py_DECREF(stream);
        Py_DECREF(clock);
        Py_DECREF(ref);
        return PyErr_NoMemory();
    }
    d->anchor.ev = ref; /* the reference: 0 ms */
    d->anchor.h = use_raw ? event_handle(ref) : NULL;
    d->anchor_is_ref = 1;
    d->ref_ns = ref_ns;
    Py_INCREF(entry);
    d->entry = entry;
    d->stream = stream;
    d->clock = clock;
    d->raw = raw_p;
    d->use_raw = use_raw;
    d->check_at = harvest_batch();
    DevRec *old = devs[dev];
    devs[dev] = d;
    if (old != NULL) {
        devrec_free(old, NULL);
    }
    Py_RETURN_TRUE;
}

static PyObject *
pooled(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pooled(entry, give_back=False) takes 1 or 2 arguments");
        return NULL;
    }
    int give_back = nargs == 2 ? PyObject_IsTrue(args[1]) : 0;
    if (give_back < 0) {
        return NULL;
    }
    for (int i = 0; i < MAX_DEVICES; i++) {
        DevRec *d = devs[i];
        if (d == NULL || d->entry != args[0]) {
            continue;
        }
        Py_ssize_t n = d->npool;
        if (give_back) {
            PyObject *py_pool = PyObject_GetAttr(d->entry, str_pool);
            if (py_pool == NULL) {
                return NULL;
            }
            while (d->npool > 0) {
                EvRef ev = d->pool[--d->npool];
                int rc = PyList_Append(py_pool, ev.ev);
                Py_DECREF(ev.ev);
                if (rc < 0) {
                    Py_DECREF(py_pool);
                    return NULL;
                }
            }
            Py_DECREF(py_pool);
        }
        return PyLong_FromSsize_t(n);
    }
    return PyLong_FromLong(0);
}

static PyObject *
has_stream(PyObject *module, PyObject *entry)
{
    (void)module;
    for (int i = 0; i < MAX_DEVICES; i++) {
        if (devs[i] != NULL && devs[i]->entry == entry) {
            Py_RETURN_TRUE;
        }
    }
    Py_RETURN_FALSE;
}

PyDoc_STRVAR(forget_streams_doc,
"forget_streams(bury=False) -> list | None\n\n"
"Drop every device record, pending samples included. bury=True (a forked child) returns the\n"
"Python objects instead of releasing them, so no CUDA event of the parent is destroyed.");

static PyObject *
forget_streams(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    int bury = nargs > 0 ? PyObject_IsTrue(args[0]) : 0;
    if (bury < 0) {
        return NULL;
    }
    PyObject *grave = bury ? PyList_New(0) : NULL;
    if (bury && grave == NULL) {
        return NULL;
    }
    for (int i = 0; i < MAX_DEVICES; i++) {
        DevRec *d = devs[i];
        if (d != NULL) {
            devs[i] = NULL;
            if (grave != NULL) { /* every object gains the grave's reference: never freed */
                for (Py_ssize_t k = 0; k < d->npool; k++) {
                    Py_INCREF(d->pool[k].ev);
                }
                for (Py_ssize_t k = 0; k < d->pn; k++) {
                    Py_INCREF(d->pend[d->pfirst + k].s.ev);
                    Py_INCREF(d->pend[d->pfirst + k].e.ev);
                }
                Py_INCREF(d->entry);
                Py_XINCREF(d->anchor.ev);
            }
            devrec_free(d, grave);
        }
    }
    if (grave == NULL) {
        Py_RETURN_NONE;
    }
    return grave;
}

static Py_ssize_t
pending_total(void)
{
    Py_ssize_t n = 0;
    for (int i = 0; i < MAX_DEVICES; i++) {
        if (devs[i] != NULL) {
            n += devs[i]->pn;
        }
    }
    return n;
}

static PyObject *
pending(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromSsize_t(pending_total());
}

PyDoc_STRVAR(drain_doc,
"drain(timeout_s) -> int\n\n"
"Wait (polling with a growing pause, the GIL released while sleeping; never a blocking CUDA\n"
"call) until the newest pending sample of each device is done or timeout_s passed, then\n"
"resolve every finished sample. Returns how many are still pending.");

static PyObject *
drain(PyObject *module, PyObject *arg)
{
    (void)module;
    double timeout = PyFloat_AsDouble(arg);
    if (timeout == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    int64_t deadline = mono_ns() + (int64_t)(timeout * 1e9);
    for (int i = 0; i < MAX_DEVICES; i++) {
        long pause_us = 50;
        for (;;) {
            DevRec *d = devs[i];
            if (d == NULL || d->pn == 0 || ev_done(d->pend[d->pfirst + d->pn - 1].e)
                || mono_ns() >= deadline) {
                break;
            }
            struct timespec ts = {0, pause_us * 1000};
            Py_BEGIN_ALLOW_THREADS
            nanosleep(&ts, NULL);
            Py_END_ALLOW_THREADS
            pause_us = pause_us * 2 > 2000 ? 2000 : pause_us * 2;
        }
        if (devs[i] != NULL) {
            harvest(devs[i]);
        }
    }
    return PyLong_FromSsize_t(pending_total());
}

static PyObject *
clear_pending(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    for (int i = 0; i < MAX_DEVICES; i++) {
        DevRec *d = devs[i];
        while (d != NULL && d->pn > 0) {
            PendItem it = d->pend[d->pfirst++];
            d->pn--;
            Py_DECREF(it.s.ev);
            Py_DECREF(it.e.ev);
            Py_DECREF(it.core);
        }
        if (d != NULL) {
            d->pfirst = 0;
        }
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"load", load, METH_NOARGS, load_doc},
    {"runtime_path", runtime_path, METH_NOARGS, runtime_path_doc},
    {"take_record", take_record, METH_O, take_record_doc},
    {"elapsed_ms", (PyCFunction)(void (*)(void))elapsed_ms, METH_FASTCALL, elapsed_ms_doc},
    {"configure", configure, METH_VARARGS, configure_doc},
    {"current_stream", current_stream, METH_NOARGS, current_stream_doc},
    {"trust_current_stream", trust_current_stream, METH_O,
     "Use (True) or not the c10 stream read; returns whether it is used."},
    {"set_usable", set_usable, METH_O, "Whether CUDA is usable (Backend.state == USABLE)."},
    {"add_stream", add_stream, METH_O, add_stream_doc},
    {"has_stream", has_stream, METH_O, "True when entry is a device record's StreamEntry."},
    {"pooled", (PyCFunction)(void (*)(void))pooled, METH_FASTCALL,
     "pooled(entry, give_back=False): events in the compiled pool of entry's device (0 if\n"
     "none); give_back moves them to entry.pool."},
    {"forget_streams", (PyCFunction)(void (*)(void))forget_streams, METH_FASTCALL,
     forget_streams_doc},
    {"pending", pending, METH_NOARGS, "Samples of the compiled path not resolved yet."},
    {"drain", drain, METH_O, drain_doc},
    {"clear_pending", clear_pending, METH_NOARGS,
     "Drop every pending sample without waiting (interpreter exit)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "cudatimer._speedups",
    "Compiled hot path of cudatimer: Region enter/exit, the per-thread stack and the harvest\n"
    "in C, with event records and reads through the CUDA runtime torch loaded. Optional:\n"
    "without it cudatimer runs the same logic in Python.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&str_pool, "pool"},           {&str_raw, "raw"},
        {&str_event_id, "event_id"},   {&str_take_recorded, "take_recorded"},
        {&str_elapsed_time, "elapsed_time"}, {&str_record, "record"},
        {&str_query, "query"},         {&str_stack, "stack"},
        {&str_timer, "timer"},         {&str_enter, "_enter"},
        {&str_exit, "_exit"},          {&str_child, "child"},
        {&str_gen, "gen"},             {&str_get_stream, "_get_stream"},
        {&str_batch, "HARVEST_BATCH"}, {&str_ref, "ref"}, {&str_ref_ns, "ref_ns"},
        {&str_stream, "stream"},
        {&str_clock, "clock"},         {&str_device, "device"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL) {
            return NULL;
        }
    }
    if ((minus_one = PyLong_FromLong(-1)) == NULL) {
        return NULL;
    }
    if (PyType_Ready(&CoreType) < 0 || PyType_Ready(&StackType) < 0
        || PyType_Ready(&RegionBaseType) < 0 || PyType_Ready(&NullRegionType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    PyObject *types[] = {(PyObject *)&CoreType, (PyObject *)&StackType,
                         (PyObject *)&RegionBaseType, (PyObject *)&NullRegionType};
    const char *type_names[] = {"Core", "Stack", "RegionBase", "NullRegion"};
    for (int i = 0; i < 4; i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, type_names[i], types[i]) < 0) {
            Py_DECREF(types[i]);
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
