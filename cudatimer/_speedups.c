/*
 * cudatimer._speedups: the recorder core in C, the compiled implementation of the contract in
 * _core.pyi (the plain-Python reference is _core_py.py; the two give the same results and the
 * tests hold them to it). Event records and reads go through the CUDA runtime torch loaded.
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
 * Every event operation falls back to the event's Python method (record(stream), query(),
 * elapsed_time(other)) whenever the runtime is absent, an event has no CUDA handle yet, or the
 * runtime returns an error, so errors surface with torch's own messages and nothing is
 * recorded twice or lost. The fake GPU of the CPU tests runs through those methods.
 *
 * Every input comes as a typed argument (configure, set_stream_getter, Store, StreamRec,
 * RegionBase.bind); nothing here reads attributes of cudatimer's own Python objects.
 *
 * Everything runs under the GIL (no lock of its own). Python callbacks (make_event, a Store's
 * child, the stream getter, event methods of fake events, NVTX push/pop) may run any Python
 * code, so state is re-read after each of them and no pointer into an array that such code
 * could reallocate is held across one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h> /* first, as Python asks; its pyconfig.h defines _GNU_SOURCE on Linux */

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>
#include <time.h>

#if defined(__linux__)
#include <dlfcn.h>
#include <link.h>
#define CUDATIMER_HAVE_DL 1
#endif

/* ======================================================================================
 * Binding to the CUDA runtime torch loaded
 * ====================================================================================== */

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

static event_record_fn rt_record = NULL;
static event_query_fn rt_query = NULL;
static event_elapsed_fn rt_elapsed = NULL;
static get_last_error_fn rt_get_last_error = NULL;
static current_stream_fn c10_current = NULL;
static char rt_path[4096];
static char c10_path[4096];

/* Names of torch.Event's methods and attribute (and list.append for a grave that is not a
 * list): the only attributes read by name, all of objects that are not cudatimer's. */
static PyObject *str_event_id, *str_record, *str_query, *str_elapsed_time, *str_append;
static PyObject *minus_one;

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
"Bind to the CUDA runtime library already loaded in this process (torch's). True when events\n"
"can be recorded through it; False on a CPU build, a static runtime, or another platform.\n"
"Never loads a library that is not loaded yet, and never initialises CUDA. Called once at\n"
"import; again later (after torch loaded CUDA) it binds what is there by then.");

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
     * (another torch, another DeviceIndex type) the getter is called instead. Python checks it
     * against torch once (current_stream) before passing c10=True to set_stream_getter. */
    void *c10 = c10_path[0] ? dlopen(c10_path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (c10 != NULL) {
        c10_current = (current_stream_fn)dlsym(c10, "_ZN3c104cuda20getCurrentCUDAStreamEa");
    }
    /* The handles are kept for the life of the process (torch keeps the libraries loaded). */
    rt_query = (event_query_fn)qry;
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

/* The cudaEvent_t of a torch.Event (its `event_id`), or NULL when it has none yet (torch
 * creates the CUDA event at the first record) or is another kind of object. No error set.
 * Only called where records go through the runtime (rt bound, the stream's raw known). */
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

/* ======================================================================================
 * Histograms: the buckets of _hist.HistBuilder, ceil(inv_log_gamma * log(x)) for x > 0,
 * values <= 0 counted as zeros. Per-value updates here (~5 ns); the reference batches 256
 * values through math.fsum, so `total` may differ in its last bits, nothing else.
 * ====================================================================================== */
typedef struct {
    int64_t count, zeros;
    double total, min, max;
    int32_t lo, n; /* buckets b[0..n) hold indices lo..lo+n-1 */
    int64_t *b;
    /* The bucket of the last value and the least and largest values seen in it: the bucket
     * of x is monotonic in x, so any x in [seen_lo, seen_hi] is in it without a log (a
     * steady duration repeats its bucket: ~1/3 of a graph replay's fold on an EPYC host). */
    int32_t last;
    double seen_lo, seen_hi;
} CHist;

static void
hist_init(CHist *h)
{
    memset(h, 0, sizeof(*h));
    h->min = Py_HUGE_VAL;
    h->max = -Py_HUGE_VAL;
    h->seen_lo = Py_HUGE_VAL;
    h->seen_hi = -Py_HUGE_VAL;
}

/* k values of 0.0 at once (a graph replay's CPU time): what k hist_add(h, 0.0) would do. */
static void
hist_zeros(CHist *h, int64_t k)
{
    if (k > 0) {
        h->count += k;
        h->zeros += k;
        if (0.0 < h->min) {
            h->min = 0.0;
        }
        if (0.0 > h->max) {
            h->max = 0.0;
        }
    }
}

/* Count, total, min and max of one value (every value, zeros too). */
static inline void
hist_moments(CHist *h, double x)
{
    h->count++;
    h->total += x;
    if (x < h->min) {
        h->min = x;
    }
    if (x > h->max) {
        h->max = x;
    }
}

/* One more value in bucket i (grown to reach it). */
static int
hist_bucket(CHist *h, int32_t i)
{
    if (h->n == 0 || i < h->lo || i >= h->lo + h->n) {
        /* A steady duration touches a handful of buckets: grow to the exact span. */
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

/* The bucket of x > 0: the last bucket's when x lies in its seen range, else by the log. */
static inline int32_t
hist_index(CHist *h, double x)
{
    if (x >= h->seen_lo && x <= h->seen_hi) {
        return h->last;
    }
    int32_t i = (int32_t)ceil(g_inv_log_gamma * log(x));
    if (i == h->last && h->seen_lo <= h->seen_hi) {
        h->seen_lo = x < h->seen_lo ? x : h->seen_lo;
        h->seen_hi = x > h->seen_hi ? x : h->seen_hi;
    }
    else {
        h->last = i;
        h->seen_lo = h->seen_hi = x;
    }
    return i;
}

static int
hist_add(CHist *h, double x)
{
    hist_moments(h, x);
    if (!(x > 0.0)) {
        h->zeros++;
        return 0;
    }
    return hist_bucket(h, hist_index(h, x));
}

/* Buckets of whole nanoseconds. A graph replay's durations are integers of the GPU clock
 * (tb - ta ns, folded as (tb - ta) * 1e-6 ms), and a duration under NS_TABLE ns takes its
 * bucket from a table built with the very expression hist_add computes, so the bucket is the
 * same bit for bit: the log was ~15 of the ~27 ns a graph sample took to fold on an H200
 * host, with region times of a few us jittering across buckets 1% wide. Built at the first
 * fold after configure() (32768 logs, ~0.5 ms), 128 KiB. */
#define NS_TABLE 32768
static int32_t *g_ns_bucket = NULL;
static double g_ns_inv = 0.0; /* the inv_log_gamma the table was built with */

static int
ns_table_ready(void)
{
    if (g_ns_bucket != NULL && g_ns_inv == g_inv_log_gamma) {
        return 0;
    }
    if (g_ns_bucket == NULL && (g_ns_bucket = PyMem_Malloc(NS_TABLE * sizeof(int32_t))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    g_ns_bucket[0] = 0; /* never read: a zero duration is a zero */
    for (int64_t d = 1; d < NS_TABLE; d++) {
        g_ns_bucket[d] = (int32_t)ceil(g_inv_log_gamma * log((double)d * 1e-6));
    }
    g_ns_inv = g_inv_log_gamma;
    return 0;
}

/* hist_add(h, d * 1e-6) for a duration of d whole ns. */
static inline int
hist_add_ns(CHist *h, int64_t d)
{
    double x = (double)d * 1e-6;
    hist_moments(h, x);
    if (d <= 0) {
        h->zeros++;
        return 0;
    }
    return hist_bucket(h, d < NS_TABLE ? g_ns_bucket[d] : hist_index(h, x));
}

static void
hist_free(CHist *h)
{
    PyMem_Free(h->b);
    h->b = NULL;
    h->n = 0;
}

/* ======================================================================================
 * Objects
 * ====================================================================================== */

typedef struct {
    PyObject *ev; /* the event (strong) */
    void *h;      /* its cudaEvent_t, or NULL: record/query/read through its Python methods */
} EvRef;

/* One open region call. Inline in a Stack (the hot path pushes one without allocating a
 * Python object) or inside a Frame object (pushed by Python, or materialised for it). */
typedef struct {
    PyObject *region;   /* strong, or NULL */
    PyObject *rec;      /* strong or NULL (None): a StreamRec for TIMED frames */
    PyObject *start;    /* strong or NULL (None): the start event of a TIMED frame */
    PyObject *range_id; /* strong or NULL (None) */
    void *start_h;      /* inline frames: start's cudaEvent_t (NULL: unknown or none) */
    int64_t slot, gen, t0_ns;
    int kind, dev;
} CFrame;

typedef struct {
    PyObject_HEAD
    CFrame f; /* f.start_h unused: a Frame's start can be set from Python */
} FrameObj;

typedef struct {
    FrameObj *py; /* a Frame object (strong), or NULL: the frame is f, inline */
    CFrame f;
} Entry;

typedef struct {
    PyObject_HEAD
    Entry *e;
    Py_ssize_t n, cap;
    unsigned long tid;
    PyObject *weakrefs; /* its store keeps a weak reference, to find frames orphaned by it */
    int64_t base;       /* the slot regions nest under while it is empty (-1: the root) */
    PyObject *owner;    /* the asyncio task whose stack it is (strong), or NULL: a thread's */
} StackObj;

struct StoreObj;

/* A region call whose events the GPU may not have reached yet. */
typedef struct {
    struct StoreObj *store; /* strong */
    PyObject *extra;        /* a non-empty tuple of end events on other streams, or NULL */
    EvRef s, e;
    int64_t slot, gen, t0, t1, step, tid;
} Pend;

typedef struct {
    PyObject_HEAD
    PyObject *key, *stream, *make_event;
    int64_t sid;
    int dev, type;
    void *raw;   /* cudaStream_t */
    int use_raw; /* records through the runtime: it is bound and raw was given */
    EvRef *pool;
    Py_ssize_t npool, pool_cap;
    Pend *pend; /* pending samples pend[pfirst .. pfirst+pn), oldest first */
    Py_ssize_t pfirst, pn, pcap;
    Py_ssize_t check_at;
    int harvesting; /* a Python event method called back into the harvest: the outer goes on */
    /* Trace placement: GPU starts are read against an anchor event whose position (anchor_ms
     * after ref, recorded at host time ref_ns) is known; see place(). */
    EvRef ref, anchor; /* anchor.ev == ref.ev while the anchor is the reference */
    double anchor_ms;
    int64_t ref_ns;
} RecObj;

/* Statistics of one (slot, clock) of a store, and where its series went last. */
typedef struct {
    int64_t slot;
    int dev;
    Py_ssize_t order;
    int64_t calls, skipped;
    CHist gpu, cpu;
    uint64_t row_serial; /* the step record (by serial) of its cached series row, 0: none */
    uint64_t max_serial; /* newest step record it has a row in: no row in any newer one */
    Py_ssize_t row_idx;
} Acc;

/* The raw samples of one (slot, clock) in one step: 16 bytes a sample. */
typedef struct {
    int64_t slot;
    int dev;
    double *g, *c;
    Py_ssize_t n, cap;
} Row;

typedef struct {
    int64_t step, count;
    uint64_t serial;
    int dropped;
    Row *rows; /* in creation order */
    Py_ssize_t nrows, rcap;
} StepRec;

typedef struct {
    int64_t slot, stream, t0_ns, step, tid;
    int dev;
    double at_ns, gpu_ms, cpu_ms;
} TItem;

typedef struct StoreObj {
    PyObject_HEAD
    int enabled, inited;
    int64_t step, gen, serial;
    Py_ssize_t keep_steps, trace_samples, step_cap;
    PyObject *child;      /* child(parent_slot, name) -> slot */
    PyObject *serial_key; /* int: this store's key in each thread's dict (its Stack) */
    Acc **accs;           /* in creation order (`order`) */
    Py_ssize_t nacc, acc_cap;
    Py_ssize_t *htab; /* open addressing over accs: index + 1, 0 empty */
    size_t hsize;
    StepRec **steps; /* kept steps in creation order, oldest first */
    Py_ssize_t nsteps, steps_cap;
    uint64_t step_serial;
    TItem *trace; /* ring of the last trace_samples items */
    Py_ssize_t tfirst, ntrace, tcap;
    PyObject *stacks;   /* weak references to every thread's Stack of this store (orphan()) */
    PyObject *task_var; /* a ContextVar: each asyncio task's Stack, in the task's context */
} StoreObj;

/* A region shared by several parents (instrument() names a module by its attribute, so the
 * "attn" of each of GPT-2's 12 blocks is one region under 12 parents) took the store's child()
 * callback on every call with a one-entry cache: 0.37 us a call on the CPU machine. 32 ways,
 * direct-mapped, keep a dozen parents with few collisions; a collision only costs that call. */
#define SLOT_WAY_BITS 5
#define SLOT_WAYS (1 << SLOT_WAY_BITS)
typedef struct {
    int64_t parent; /* INT64_MIN: empty */
    int64_t slot;
} SlotWay;

typedef struct {
    PyObject_HEAD
    StoreObj *store;
    int fast;
    PyObject *name, *push, *attrs, *pop, *enter, *exit;
    PyObject *start, *end; /* NVTX start(attrs) -> range id and end(range id) of detached calls */
    int64_t c_gen; /* the generation of the store (reset) the slot cache was filled under */
    SlotWay c_ways[SLOT_WAYS]; /* the slot cache: parent slot -> this region's slot */
} RegionObj;

/* The way of the slot cache a parent slot falls in: the top bits of a Fibonacci hash (parent
 * slots are consecutive ints; a multiplicative hash spreads them over the ways). */
static inline int
slot_way(int64_t parent)
{
    return (int)(((uint64_t)parent * UINT64_C(0x9E3779B97F4A7C15)) >> (64 - SLOT_WAY_BITS));
}

static PyTypeObject FrameType, StackType, RecType, StoreType, RegionBaseType, NullRegionType;

/* The registry of streams (process-wide): {key: StreamRec}, and each device's default-stream
 * record, the hot path's (strong references, both). */
static PyObject *g_streams = NULL;
static RecObj *g_defaults[MAX_DEVICES];
static int64_t g_next_serial = 1;

/* -- snapshot types (PyStructSequence: tuples with named fields, as the NamedTuples of the
 * reference) ----------------------------------------------------------------------------- */
static PyTypeObject HistStateType, SlotStatsType, SeriesRowType, TraceItemType, SnapshotType;

static PyStructSequence_Field hist_fields[] = {
    {"n", "count"},  {"total", NULL}, {"min", NULL},     {"max", NULL},
    {"zeros", NULL}, {"buckets", "((index, n), ...) ascending, n > 0"}, {NULL, NULL},
};
static PyStructSequence_Field slot_fields[] = {
    {"slot", NULL},    {"dev", "-1: host clock"}, {"order", NULL}, {"calls", NULL},
    {"skipped", NULL}, {"gpu", NULL},             {"cpu", NULL},   {NULL, NULL},
};
static PyStructSequence_Field row_fields[] = {
    {"step", NULL},
    {"slot", NULL},
    {"dev", NULL},
    {"gpu_ms", "native float64 values"},
    {"cpu_ms", "native float64 values"},
    {NULL, NULL},
};
static PyStructSequence_Field item_fields[] = {
    {"slot", NULL},
    {"dev", NULL},
    {"stream", NULL},
    {"at_ns", "GPU start on the host clock; NaN: unknown"},
    {"gpu_ms", "NaN: host sample"},
    {"t0_ns", NULL},
    {"cpu_ms", NULL},
    {"step", NULL},
    {"tid", NULL},
    {NULL, NULL},
};
static PyStructSequence_Field snap_fields[] = {
    {"stats", "[SlotStats]"},
    {"kept", "kept steps, oldest first"},
    {"dropped", "kept steps whose raw samples passed the step cap"},
    {"series", "[SeriesRow] (snapshot(series=True))"},
    {"trace", "[TraceItem], oldest first (snapshot(trace=True))"},
    {NULL, NULL},
};
static PyStructSequence_Desc hist_desc = {
    "cudatimer._speedups.HistState",
    "A distribution as _hist.Histogram takes it (Histogram(*state)).", hist_fields, 6};
static PyStructSequence_Desc slot_desc = {
    "cudatimer._speedups.SlotStats",
    "Whole-run statistics of one region path (slot) on one clock (dev).", slot_fields, 7};
static PyStructSequence_Desc row_desc = {
    "cudatimer._speedups.SeriesRow",
    "Raw samples of one region path on one clock in one kept step.", row_fields, 5};
static PyStructSequence_Desc item_desc = {
    "cudatimer._speedups.TraceItem", "One of the last calls, for the trace.", item_fields, 9};
static PyStructSequence_Desc snap_desc = {
    "cudatimer._speedups.Snapshot", "What a store holds, copied out (Store.snapshot).",
    snap_fields, 5};

/* ======================================================================================
 * Events
 * ====================================================================================== */

/* A Python call on an event: the event is held during it (the method may drop every other
 * reference, e.g. by clearing the pending samples). */
static PyObject *
ev_call(PyObject *ev, PyObject *name, PyObject *arg)
{
    Py_INCREF(ev);
    PyObject *r = arg ? PyObject_CallMethodOneArg(ev, name, arg)
                      : PyObject_CallMethodNoArgs(ev, name);
    Py_DECREF(ev);
    return r;
}

/* 1 done, 0 not yet, -1 with the exception of the event's query(). */
static int
ev_done(EvRef ev)
{
    if (ev.h != NULL) {
        if (rt_query(ev.h) == CUDA_SUCCESS_CODE) {
            return 1;
        }
        rt_get_last_error(); /* torch's next launch check must not see it */
        return 0;
    }
    PyObject *r = ev_call(ev.ev, str_query, NULL);
    if (r == NULL) {
        return -1;
    }
    int done = PyObject_IsTrue(r);
    Py_DECREF(r);
    return done;
}

/* Milliseconds from s to e: 0 and *ms; 1 when they cannot be read yet (cudaErrorNotReady,
 * or elapsed_time raised RuntimeError or ValueError, cleared); -1 with any other exception. */
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
        return 1;
    }
    Py_INCREF(e.ev);
    PyObject *r = ev_call(s.ev, str_elapsed_time, e.ev);
    Py_DECREF(e.ev);
    if (r == NULL) {
        if (PyErr_ExceptionMatches(PyExc_RuntimeError)
            || PyErr_ExceptionMatches(PyExc_ValueError)) {
            PyErr_Clear();
            return 1;
        }
        return -1;
    }
    *ms = PyFloat_AsDouble(r);
    Py_DECREF(r);
    if (*ms == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    return 0;
}

/* An event of rec's stream as the runtime sees it (its handle only where records go through
 * the runtime). The reference is new. */
static EvRef
evref_of(RecObj *r, PyObject *ev)
{
    EvRef x = {Py_NewRef(ev), r->use_raw ? event_handle(ev) : NULL};
    return x;
}

static void
pool_put(RecObj *r, EvRef ev)
{
    if (grow((void **)&r->pool, &r->pool_cap, r->npool + 1, sizeof(EvRef)) == 0) {
        r->pool[r->npool++] = ev;
        return;
    }
    PyErr_Clear(); /* out of memory: the event goes, the run goes on */
    Py_DECREF(ev.ev);
}

/* A pooled event (a new one from make_event() when the pool is empty) recorded on r's stream
 * now: through the runtime when it has a handle, r's raw stream is known and !torch_record;
 * else by its Python record(stream), which also runs when the runtime refused (and raises
 * torch's error if it refuses again). -1 with an exception (the event is then dropped, as in
 * the reference). */
static int
rec_take(RecObj *r, int torch_record, EvRef *out)
{
    EvRef ev;
    if (r->npool > 0) {
        ev = r->pool[--r->npool];
    }
    else if (r->make_event == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "StreamRec is not initialised");
        return -1;
    }
    else {
        PyObject *make = Py_NewRef(r->make_event);
        ev.ev = PyObject_CallNoArgs(make);
        Py_DECREF(make);
        if (ev.ev == NULL) {
            return -1;
        }
        ev.h = NULL; /* torch creates the CUDA event at its first record */
    }
    if (ev.h != NULL && r->use_raw && !torch_record) {
        if (rt_record(ev.h, r->raw) == CUDA_SUCCESS_CODE) {
            *out = ev;
            return 0;
        }
        rt_get_last_error(); /* torch's next launch check must not see it */
    }
    if (r->stream == NULL) {
        Py_DECREF(ev.ev);
        PyErr_SetString(PyExc_RuntimeError, "StreamRec is not initialised");
        return -1;
    }
    PyObject *stream = Py_NewRef(r->stream);
    PyObject *res = PyObject_CallMethodOneArg(ev.ev, str_record, stream);
    Py_DECREF(stream);
    if (res == NULL) {
        Py_DECREF(ev.ev);
        return -1;
    }
    Py_DECREF(res);
    if (ev.h == NULL && r->use_raw) {
        ev.h = event_handle(ev.ev); /* created by this first record: the runtime from now on */
    }
    *out = ev;
    return 0;
}

/* ======================================================================================
 * Frame: one open region call, as Python sees it
 * ====================================================================================== */

/* Release a frame's references (each field cleared before its release: a release may run
 * Python code that looks at the frame again). */
static void
cframe_clear(CFrame *f)
{
    Py_CLEAR(f->region);
    Py_CLEAR(f->rec);
    Py_CLEAR(f->start);
    Py_CLEAR(f->range_id);
    f->start_h = NULL;
}

static int
cframe_traverse(CFrame *f, visitproc visit, void *arg)
{
    Py_VISIT(f->region);
    Py_VISIT(f->rec);
    Py_VISIT(f->start);
    Py_VISIT(f->range_id);
    return 0;
}

/* A Frame holding *f's references (taken over: *f is zeroed). NULL with MemoryError (*f is
 * left as it was). Callers keep the collector off around it (see gc_off): an allocation must
 * not run finalizers while they hold indices into a stack. */
static FrameObj *
frame_wrap(CFrame *f)
{
    FrameObj *o = PyObject_GC_New(FrameObj, &FrameType);
    if (o == NULL) {
        return NULL;
    }
    o->f = *f;
    o->f.start_h = NULL;
    memset(f, 0, sizeof(*f));
    PyObject_GC_Track(o);
    return o;
}

static int
frame_init(FrameObj *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"region", "slot", "gen", "kind", "rec", "start", "t0_ns", "dev",
                         "range_id", NULL};
    PyObject *region, *rec = Py_None, *start = Py_None, *range_id = Py_None;
    long long slot, gen, t0 = 0;
    int kind, dev = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OLLi|OOLiO:Frame", kw, &region, &slot, &gen,
                                     &kind, &rec, &start, &t0, &dev, &range_id)) {
        return -1;
    }
    CFrame old = self->f;
    self->f.region = Py_NewRef(region);
    self->f.rec = rec == Py_None ? NULL : Py_NewRef(rec);
    self->f.start = start == Py_None ? NULL : Py_NewRef(start);
    self->f.range_id = range_id == Py_None ? NULL : Py_NewRef(range_id);
    self->f.start_h = NULL;
    self->f.slot = slot;
    self->f.gen = gen;
    self->f.kind = kind;
    self->f.t0_ns = t0;
    self->f.dev = dev;
    cframe_clear(&old);
    return 0;
}

static int
frame_traverse(FrameObj *self, visitproc visit, void *arg)
{
    return cframe_traverse(&self->f, visit, arg);
}

static int
frame_clear(FrameObj *self)
{
    cframe_clear(&self->f);
    return 0;
}

static void
frame_dealloc(FrameObj *self)
{
    PyObject_GC_UnTrack(self);
    cframe_clear(&self->f);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
frame_repr(FrameObj *self)
{
    PyObject *region = or_none(self->f.region);
    PyObject *name = PyObject_GetAttrString(region, "name");
    if (name == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return NULL;
        }
        PyErr_Clear();
        name = Py_NewRef(region);
    }
    PyObject *r = PyUnicode_FromFormat("Frame(%R, kind=%d)", name, self->f.kind);
    Py_DECREF(name);
    return r;
}

static PyMemberDef frame_members[] = {
    {"region", T_OBJECT, offsetof(FrameObj, f.region), 0, "The Region."},
    {"slot", T_LONGLONG, offsetof(FrameObj, f.slot), 0, "Its region path."},
    {"gen", T_LONGLONG, offsetof(FrameObj, f.gen), 0, "The store's gen at enter."},
    {"kind", T_INT, offsetof(FrameObj, f.kind), 0, "TIMED, HOST, SKIP, OFF, NVTX, UNTIMED."},
    {"rec", T_OBJECT, offsetof(FrameObj, f.rec), 0, "StreamRec of a TIMED frame, or None."},
    {"start", T_OBJECT, offsetof(FrameObj, f.start), 0, "Start event of a TIMED frame."},
    {"t0_ns", T_LONGLONG, offsetof(FrameObj, f.t0_ns), 0, "Host clock at enter."},
    {"dev", T_INT, offsetof(FrameObj, f.dev), 0, "Clock of an UNTIMED frame (-1: host)."},
    {"range_id", T_OBJECT, offsetof(FrameObj, f.range_id), 0,
     "NVTX range of a detached frame (not on a stack), else None."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject FrameType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudatimer._speedups.Frame",
    .tp_doc = PyDoc_STR("Frame(region, slot, gen, kind, rec=None, start=None, t0_ns=0, dev=-1, "
                        "range_id=None): one open region call."),
    .tp_basicsize = sizeof(FrameObj),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)frame_init,
    .tp_dealloc = (destructor)frame_dealloc,
    .tp_traverse = (traverseproc)frame_traverse,
    .tp_clear = (inquiry)frame_clear,
    .tp_repr = (reprfunc)frame_repr,
    .tp_members = frame_members,
};

/* ======================================================================================
 * Stack: a thread's open regions of one store, innermost last. The hot path pushes inline
 * frames (no Python object); Python pushes Frame objects. An inline frame that Python reads
 * (pop, top, take, frames) becomes a Frame object in place, so what Python holds stays the
 * frame on the stack (the same object on every read; a write to it is seen by the exit).
 * ====================================================================================== */

static inline CFrame *
ent_frame(Entry *e)
{
    return e->py != NULL ? &e->py->f : &e->f;
}

/* The collector runs finalizers (any Python code) when an allocation triggers it; around
 * allocations made while holding indices into a stack or a store it is kept off. */
static inline int
gc_off(void)
{
    return PyGC_Disable();
}

static inline void
gc_restore(int was)
{
    if (was) {
        PyGC_Enable();
    }
}

/* Entry i as a Frame object (made in place for an inline frame). Borrowed; NULL on error. */
static FrameObj *
stack_frame_at(StackObj *st, Py_ssize_t i)
{
    Entry *e = &st->e[i];
    if (e->py == NULL) {
        int was = gc_off();
        FrameObj *o = frame_wrap(&st->e[i].f);
        gc_restore(was);
        if (o == NULL) {
            return NULL;
        }
        st->e[i].py = o;
    }
    return st->e[i].py;
}

/* Remove entry i, returning its Frame (a new reference). */
static PyObject *
stack_remove(StackObj *st, Py_ssize_t i)
{
    if (stack_frame_at(st, i) == NULL) {
        return NULL;
    }
    FrameObj *o = st->e[i].py;
    memmove(&st->e[i], &st->e[i + 1], (size_t)(st->n - i - 1) * sizeof(Entry));
    st->n--;
    return (PyObject *)o;
}

static int
stack_push_frame(StackObj *st, FrameObj *frame)
{
    if (grow((void **)&st->e, &st->cap, st->n + 1, sizeof(Entry)) < 0) {
        return -1;
    }
    Entry *e = &st->e[st->n++];
    memset(e, 0, sizeof(*e));
    e->py = (FrameObj *)Py_NewRef(frame);
    return 0;
}

static StackObj *
stack_make(void)
{
    StackObj *st = PyObject_GC_New(StackObj, &StackType);
    if (st == NULL) {
        return NULL;
    }
    st->e = NULL;
    st->n = st->cap = 0;
    st->tid = PyThread_get_thread_ident();
    st->weakrefs = NULL;
    st->base = -1;
    st->owner = NULL;
    PyObject_GC_Track(st);
    return st;
}

static PyObject *
stack_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "Stack() takes no arguments");
        return NULL;
    }
    if (type != &StackType) {
        PyErr_SetString(PyExc_TypeError, "Stack cannot be subclassed");
        return NULL;
    }
    return (PyObject *)stack_make();
}

static int
stack_traverse(StackObj *st, visitproc visit, void *arg)
{
    Py_VISIT(st->owner);
    for (Py_ssize_t i = 0; i < st->n; i++) {
        Entry *e = &st->e[i];
        if (e->py != NULL) {
            Py_VISIT(e->py);
        }
        else if (cframe_traverse(&e->f, visit, arg)) {
            return 1;
        }
    }
    return 0;
}

/* Drop every frame, innermost first (each removed before its release). */
static int
stack_clear(StackObj *st)
{
    Py_CLEAR(st->owner);
    while (st->n > 0) {
        Entry e = st->e[--st->n];
        if (e.py != NULL) {
            Py_DECREF(e.py);
        }
        else {
            cframe_clear(&e.f);
        }
    }
    return 0;
}

static void
stack_dealloc(StackObj *st)
{
    PyObject_GC_UnTrack(st);
    if (st->weakrefs != NULL) {
        PyObject_ClearWeakRefs((PyObject *)st);
    }
    stack_clear(st);
    PyMem_Free(st->e);
    Py_TYPE(st)->tp_free((PyObject *)st);
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
    FrameObj *o = stack_frame_at(st, i);
    return o ? Py_NewRef((PyObject *)o) : NULL;
}

static PyObject *
stack_push_m(StackObj *st, PyObject *frame)
{
    if (!Py_IS_TYPE(frame, &FrameType)) {
        PyErr_Format(PyExc_TypeError, "Stack.push takes a Frame, not %.100s",
                     Py_TYPE(frame)->tp_name);
        return NULL;
    }
    if (stack_push_frame(st, (FrameObj *)frame) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
stack_pop_m(StackObj *st, PyObject *unused)
{
    (void)unused;
    if (st->n == 0) {
        PyErr_SetString(PyExc_IndexError, "pop from empty stack");
        return NULL;
    }
    return stack_remove(st, st->n - 1);
}

static PyObject *
stack_top_m(StackObj *st, PyObject *unused)
{
    (void)unused;
    if (st->n == 0) {
        Py_RETURN_NONE;
    }
    return stack_item(st, st->n - 1);
}

static PyObject *
stack_take_m(StackObj *st, PyObject *region)
{
    for (Py_ssize_t i = st->n - 1; i >= 0; i--) {
        if (ent_frame(&st->e[i])->region == region) {
            return stack_remove(st, i);
        }
    }
    Py_RETURN_NONE;
}

static PyObject *
stack_frames_m(StackObj *st, PyObject *unused)
{
    (void)unused;
    int was = gc_off();
    PyObject *out = PyList_New(st->n);
    for (Py_ssize_t i = 0; out != NULL && i < st->n; i++) {
        FrameObj *o = stack_frame_at(st, i);
        if (o == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, Py_NewRef((PyObject *)o));
    }
    gc_restore(was);
    return out;
}

static PyObject *
stack_clear_m(StackObj *st, PyObject *unused)
{
    (void)unused;
    stack_clear(st);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(stack_bury_doc,
"bury(grave)\n\nIn a forked child: frames timed with events of the parent become HOST frames\n"
"(rec and start None); their start events go into grave, never released.");

static PyObject *
stack_bury_m(StackObj *st, PyObject *grave)
{
    for (Py_ssize_t i = 0; i < st->n; i++) {
        CFrame *f = ent_frame(&st->e[i]);
        if (f->kind != K_TIMED) {
            continue;
        }
        if (grave_add(grave, or_none(f->start)) < 0) {
            return NULL;
        }
        f = ent_frame(&st->e[i]); /* re-read: grave.append ran Python code */
        f->kind = K_HOST;
        PyObject *rec = f->rec, *start = f->start;
        f->rec = NULL;
        f->start = NULL;
        f->start_h = NULL;
        Py_XDECREF(rec);
        Py_XDECREF(start);
    }
    Py_RETURN_NONE;
}

static PyObject *
stack_get_tid(StackObj *st, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLong(st->tid);
}

static PyObject *
stack_get_base(StackObj *st, void *closure)
{
    (void)closure;
    return PyLong_FromLongLong(st->base);
}

static PyObject *
stack_repr(StackObj *st)
{
    return PyUnicode_FromFormat("<Stack of thread %lu, %zd frames>", st->tid, st->n);
}

static PySequenceMethods stack_as_sequence = {
    .sq_length = (lenfunc)stack_len,
    .sq_item = (ssizeargfunc)stack_item,
};

static PyMethodDef stack_methods[] = {
    {"push", (PyCFunction)stack_push_m, METH_O, "Push a Frame (innermost)."},
    {"pop", (PyCFunction)stack_pop_m, METH_NOARGS,
     "The innermost frame, removed (IndexError when empty)."},
    {"top", (PyCFunction)stack_top_m, METH_NOARGS, "The innermost frame, or None."},
    {"take", (PyCFunction)stack_take_m, METH_O,
     "Remove and return the innermost frame of region (None if it has none)."},
    {"frames", (PyCFunction)stack_frames_m, METH_NOARGS, "The frames, outermost first."},
    {"clear", (PyCFunction)stack_clear_m, METH_NOARGS, "Drop every frame."},
    {"bury", (PyCFunction)stack_bury_m, METH_O, stack_bury_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef stack_getset[] = {
    {"tid", (getter)stack_get_tid, NULL, "threading.get_ident() of the owning thread.", NULL},
    {"base", (getter)stack_get_base, NULL,
     "The slot regions nest under while it is empty (-1: the root; a task's stack starts "
     "under the region open where the task first opened one).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject StackType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudatimer._speedups.Stack",
    .tp_doc = PyDoc_STR("A thread's open regions of one store, innermost last."),
    .tp_basicsize = sizeof(StackObj),
    .tp_weaklistoffset = offsetof(StackObj, weakrefs),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = stack_new,
    .tp_dealloc = (destructor)stack_dealloc,
    .tp_traverse = (traverseproc)stack_traverse,
    .tp_clear = (inquiry)stack_clear,
    .tp_as_sequence = &stack_as_sequence,
    .tp_repr = (reprfunc)stack_repr,
    .tp_methods = stack_methods,
    .tp_getset = stack_getset,
};

/* ======================================================================================
 * StreamRec: a stream some region ran on. Its event pool, its pending samples (a deque as a
 * growable array), and the reference and anchor events that place GPU starts on the host
 * clock for the trace.
 *
 * The harvest runs here, in batches, on the thread that exits regions: resolving on a
 * background thread was slower (1.30x against 1.02x what two bare torch.Event records add in
 * the launch-bound loop): it contends with the launching thread in the driver.
 * ====================================================================================== */

static int store_fold(StoreObj *s, int64_t slot, int64_t gen, int dev, double gpu_ms,
                      double cpu_ms, int64_t step, int64_t t0_ns, int64_t tid, double at_ns,
                      int64_t stream, int skipped);

static void
pend_release(Pend *p)
{
    Py_CLEAR(p->store);
    Py_CLEAR(p->s.ev);
    Py_CLEAR(p->e.ev);
    Py_CLEAR(p->extra);
}

/* Append a sample (taking over its references, released on failure). */
static int
pend_push(RecObj *r, Pend *p)
{
    if (r->pfirst + r->pn >= r->pcap && r->pfirst > 0) {
        memmove(r->pend, r->pend + r->pfirst, (size_t)r->pn * sizeof(Pend));
        r->pfirst = 0;
    }
    if (grow((void **)&r->pend, &r->pcap, r->pfirst + r->pn + 1, sizeof(Pend)) < 0) {
        pend_release(p);
        return -1;
    }
    r->pend[r->pfirst + r->pn++] = *p;
    return 0;
}

/* Put a sample back first in line (its events could not be read yet). */
static void
pend_push_front(RecObj *r, Pend *p)
{
    if (r->pfirst == 0) {
        if (grow((void **)&r->pend, &r->pcap, r->pn + 1, sizeof(Pend)) < 0) {
            PyErr_Clear(); /* out of memory: the sample is lost, the run goes on */
            pend_release(p);
            return;
        }
        memmove(r->pend + 1, r->pend, (size_t)r->pn * sizeof(Pend));
        r->pfirst = 1;
    }
    r->pend[--r->pfirst] = *p;
    r->pn++;
}

static Pend
pend_pop_front(RecObj *r)
{
    Pend p = r->pend[r->pfirst++];
    if (--r->pn == 0) {
        r->pfirst = 0;
    }
    return p;
}

/* Drop every pending sample (each removed before its release). */
static void
rec_drop_pending(RecObj *r)
{
    while (r->pn > 0) {
        Pend p = pend_pop_front(r);
        pend_release(&p);
    }
}

/* 1 when end and every extra end event are done, 0 if not, -1 with an exception. Called on
 * copies (with their own references) of a sample's events: queries may run Python code. */
static int
events_done(RecObj *r, EvRef end, PyObject *extra)
{
    int d = ev_done(end);
    if (d <= 0 || extra == NULL) {
        return d;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(extra); k++) {
        EvRef x = evref_of(r, PyTuple_GET_ITEM(extra, k));
        d = ev_done(x);
        Py_DECREF(x.ev);
        if (d <= 0) {
            return d;
        }
    }
    return 1;
}

/* Whether pending sample i (if it still exists) is done. */
static int
pend_done(RecObj *r, Py_ssize_t i)
{
    if (i >= r->pn) {
        return 0; /* gone while a Python method ran */
    }
    Pend *p = &r->pend[r->pfirst + i];
    EvRef end = {Py_NewRef(p->e.ev), p->e.h};
    PyObject *extra = Py_XNewRef(p->extra);
    int d = events_done(r, end, extra);
    Py_DECREF(end.ev);
    Py_XDECREF(extra);
    return d;
}

/* How many samples from the front are done (-1 with an exception). Events on one stream
 * complete in record order: one query of the newest clears a whole batch when the GPU keeps
 * up, and a binary search finds the first unfinished one (log2(n) queries) when it lags. */
static Py_ssize_t
rec_ready(RecObj *r)
{
    Py_ssize_t n = r->pn;
    if (n == 0) {
        return 0;
    }
    int d = pend_done(r, n - 1);
    if (d != 0) {
        return d < 0 ? -1 : n;
    }
    Py_ssize_t lo = 0, hi = n - 1;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        d = pend_done(r, mid);
        if (d < 0) {
            return -1;
        }
        if (d) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return lo;
}

/* Where the finished start event *s happened on the host clock (ns; NaN if unreadable) into
 * *at_ns, and in *s the event to give back to the pool in its stead (ev NULL: none).
 *
 * One elapsed read against the anchor (0.24 us on an H200), so the sample's events go back to
 * the pool at once: keeping them in the trace ring instead (2 x 4096 events) made every
 * record cycle through thousands of distinct CUDA events, and in the launch-bound loop 512
 * distinct events cost 1.19-1.20x what re-recording two does. cudaEventElapsedTime is float32
 * ms, good to ~4 ns within 100 ms: past anchor_hop_ms (configure) *s becomes the anchor and
 * positions add up in double (microseconds over hours); the old anchor comes back instead,
 * or nothing when it was the reference (never pooled). */
static int
place(RecObj *r, EvRef *s, double *at_ns)
{
    double off;
    EvRef anchor = {Py_NewRef(r->anchor.ev), r->anchor.h};
    int rc = ev_elapsed(anchor, *s, &off);
    Py_DECREF(anchor.ev);
    if (rc != 0 || r->anchor.ev == NULL) { /* (anchor NULL: r was cleared meanwhile) */
        *at_ns = Py_NAN;
        return rc < 0 ? -1 : 0;
    }
    double at_ms = r->anchor_ms + off;
    if (off > g_anchor_hop_ms) {
        EvRef old = r->anchor;
        r->anchor = *s;
        r->anchor_ms = at_ms;
        if (old.ev == r->ref.ev) {
            Py_DECREF(old.ev); /* the anchor's own reference; r->ref keeps the event */
            old.ev = NULL;
            old.h = NULL;
        }
        *s = old;
    }
    *at_ns = (double)r->ref_ns + at_ms * 1e6;
    return 0;
}

/* Fold one finished sample (taken off the front) into its store: 1; 0 when its events cannot
 * be read yet (put back first in line); -1 with an exception (the sample is dropped, as the
 * reference loses it). */
static int
rec_resolve(RecObj *r, Pend *p)
{
    double gpu_ms = 0.0;
    int rc;
    if (p->extra != NULL) {
        /* Side-stream ends finish in no particular order: all must be done. */
        rc = events_done(r, p->e, p->extra);
        if (rc < 0) {
            goto fail;
        }
        rc = rc ? ev_elapsed(p->s, p->e, &gpu_ms) : 1;
        for (Py_ssize_t k = 0; rc == 0 && k < PyTuple_GET_SIZE(p->extra); k++) {
            EvRef x = evref_of(r, PyTuple_GET_ITEM(p->extra, k));
            double ms;
            rc = ev_elapsed(p->s, x, &ms);
            Py_DECREF(x.ev);
            if (rc == 0 && ms > gpu_ms) {
                gpu_ms = ms;
            }
        }
    }
    else {
        rc = ev_elapsed(p->s, p->e, &gpu_ms);
    }
    if (rc < 0) {
        goto fail;
    }
    if (rc > 0) {
        pend_push_front(r, p);
        return 0;
    }
    StoreObj *store = p->store;
    double at_ns = Py_NAN;
    if (store->trace_samples > 0 && p->gen == store->gen && r->anchor.ev != NULL) {
        if (place(r, &p->s, &at_ns) < 0) {
            goto fail;
        }
    }
    /* Every event comes back to this record's pool, side-stream ends included. */
    if (p->s.ev != NULL) {
        pool_put(r, p->s);
        p->s.ev = NULL;
    }
    pool_put(r, p->e);
    p->e.ev = NULL;
    if (p->extra != NULL) {
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(p->extra); k++) {
            pool_put(r, evref_of(r, PyTuple_GET_ITEM(p->extra, k)));
        }
    }
    rc = store_fold(store, p->slot, p->gen, r->dev, gpu_ms, (double)(p->t1 - p->t0) * 1e-6,
                    p->step, p->t0, p->tid, at_ns, r->sid, 0);
    pend_release(p);
    return rc < 0 ? -1 : 1;
fail:
    pend_release(p);
    return -1;
}

/* Resolve every finished sample of r, never blocking on the GPU. 0, or -1 with an exception
 * (what Python code called from here raised, other than "not ready"). */
static int
rec_harvest(RecObj *r)
{
    if (r->harvesting) {
        return 0; /* re-entered from a Python event method: the outer call goes on */
    }
    r->harvesting = 1;
    Py_INCREF(r);
    int rc = 0;
    Py_ssize_t ready = rec_ready(r);
    if (ready < 0) {
        rc = -1;
        goto done;
    }
    for (Py_ssize_t k = 0; k < ready && r->pn > 0; k++) {
        Pend p = pend_pop_front(r);
        int ok = rec_resolve(r, &p);
        if (ok <= 0) {
            rc = ok;
            break;
        }
    }
    if (rc == 0) {
        r->check_at = r->pn + g_harvest_batch;
    }
    if (r->pn > 0 && r->pfirst > r->pcap / 2) {
        memmove(r->pend, r->pend + r->pfirst, (size_t)r->pn * sizeof(Pend));
        r->pfirst = 0;
    }
done:
    r->harvesting = 0;
    Py_DECREF(r);
    return rc;
}

/* Queue a sample (its references taken over); every harvest_batch samples, harvest. */
static int
rec_push(RecObj *r, Pend *p)
{
    if (pend_push(r, p) < 0) {
        return -1;
    }
    if (r->pn >= r->check_at && !r->harvesting) {
        return rec_harvest(r);
    }
    return 0;
}

/* Release everything r holds (taken out first: a release may run Python code). */
static void
rec_release(RecObj *r)
{
    rec_drop_pending(r);
    while (r->npool > 0) {
        EvRef ev = r->pool[--r->npool];
        Py_DECREF(ev.ev);
    }
    EvRef anchor = r->anchor, ref = r->ref;
    r->anchor.ev = r->ref.ev = NULL;
    Py_XDECREF(anchor.ev);
    Py_XDECREF(ref.ev);
    Py_CLEAR(r->key);
    Py_CLEAR(r->stream);
    Py_CLEAR(r->make_event);
}

static int
rec_traverse(RecObj *r, visitproc visit, void *arg)
{
    Py_VISIT(r->key);
    Py_VISIT(r->stream);
    Py_VISIT(r->make_event);
    Py_VISIT(r->ref.ev);
    Py_VISIT(r->anchor.ev);
    for (Py_ssize_t i = 0; i < r->npool; i++) {
        Py_VISIT(r->pool[i].ev);
    }
    for (Py_ssize_t i = 0; i < r->pn; i++) {
        Pend *p = &r->pend[r->pfirst + i];
        Py_VISIT(p->store);
        Py_VISIT(p->s.ev);
        Py_VISIT(p->e.ev);
        Py_VISIT(p->extra);
    }
    return 0;
}

static int
rec_clear(RecObj *r)
{
    rec_release(r);
    return 0;
}

static void
rec_dealloc(RecObj *r)
{
    PyObject_GC_UnTrack(r);
    rec_release(r);
    PyMem_Free(r->pool);
    PyMem_Free(r->pend);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

/* (stream id, device, device type) of a key tuple. 0, or -1 with TypeError/OverflowError. */
static int
parse_key(PyObject *key, int64_t *sid, long *dev, long *type)
{
    if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 3) {
        PyErr_SetString(PyExc_TypeError, "a stream key is a tuple (stream id, device, type)");
        return -1;
    }
    *sid = PyLong_AsLongLong(PyTuple_GET_ITEM(key, 0));
    *dev = PyLong_AsLong(PyTuple_GET_ITEM(key, 1));
    *type = PyLong_AsLong(PyTuple_GET_ITEM(key, 2));
    return PyErr_Occurred() ? -1 : 0;
}

static int
rec_init(RecObj *r, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"key", "stream", "raw", "make_event", NULL};
    PyObject *key, *stream, *raw, *make;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO:StreamRec", kw, &key, &stream, &raw,
                                     &make)) {
        return -1;
    }
    if (r->key != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "StreamRec is initialised once");
        return -1;
    }
    int64_t sid;
    long dev, type;
    if (parse_key(key, &sid, &dev, &type) < 0) {
        return -1;
    }
    if (dev < INT32_MIN || dev > INT32_MAX || type < INT32_MIN || type > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "stream key out of range");
        return -1;
    }
    r->use_raw = 0;
    if (raw != Py_None && rt_record != NULL) {
        r->raw = PyLong_AsVoidPtr(raw);
        if (r->raw == NULL && PyErr_Occurred()) {
            return -1;
        }
        r->use_raw = 1;
    }
    r->sid = sid;
    r->dev = (int)dev;
    r->type = (int)type;
    r->key = Py_NewRef(key);
    r->stream = Py_NewRef(stream);
    r->make_event = Py_NewRef(make);
    r->check_at = g_harvest_batch;
    /* GPU starts are read against this reference, recorded now at host time ref_ns. */
    PyObject *ref = PyObject_CallNoArgs(make);
    if (ref == NULL) {
        return -1;
    }
    PyObject *res = PyObject_CallMethodOneArg(ref, str_record, stream);
    if (res == NULL) {
        Py_DECREF(ref);
        return -1;
    }
    Py_DECREF(res);
    r->ref_ns = mono_ns();
    EvRef old_ref = r->ref, old_anchor = r->anchor;
    r->ref.ev = ref;
    r->ref.h = r->use_raw ? event_handle(ref) : NULL;
    r->anchor.ev = Py_NewRef(ref);
    r->anchor.h = r->ref.h;
    r->anchor_ms = 0.0;
    Py_XDECREF(old_ref.ev);
    Py_XDECREF(old_anchor.ev);
    /* Pre-warm: events created and recorded once (torch's record: that creates the CUDA
     * event), so the first regions do not pay CUDA event creation (+1.5 us each) inside the
     * user's loop. */
    for (Py_ssize_t i = 0; i < g_prewarm; i++) {
        PyObject *ev = PyObject_CallNoArgs(make);
        if (ev == NULL) {
            return -1;
        }
        res = PyObject_CallMethodOneArg(ev, str_record, stream);
        if (res == NULL) {
            Py_DECREF(ev);
            return -1;
        }
        Py_DECREF(res);
        pool_put(r, evref_of(r, ev));
        Py_DECREF(ev);
    }
    return 0;
}

PyDoc_STRVAR(rec_take_doc,
"take(torch_record=False) -> event\n\n"
"A pooled event recorded on this stream now (a new one from make_event() when the pool is\n"
"empty): through the CUDA runtime when bound, unless torch_record (torch's record, which\n"
"switches to the event's device first).");

static PyObject *
rec_take_m(RecObj *r, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"torch_record", NULL};
    int torch_record = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|p:take", kw, &torch_record)) {
        return NULL;
    }
    EvRef ev;
    if (rec_take(r, torch_record, &ev) < 0) {
        return NULL;
    }
    return ev.ev;
}

static PyObject *
rec_give_m(RecObj *r, PyObject *event)
{
    pool_put(r, evref_of(r, event));
    Py_RETURN_NONE;
}

PyDoc_STRVAR(rec_push_doc,
"push(store, slot, gen, start, end, extra, t0, t1, step, tid)\n\n"
"Queue a sample (GPU time: start to the latest of end and the extra ends on other streams);\n"
"every harvest_batch samples the finished ones are harvested, without blocking.");

static PyObject *
rec_push_m(RecObj *r, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"store", "slot", "gen", "start", "end", "extra", "t0", "t1",
                         "step", "tid", NULL};
    PyObject *store, *start, *end, *extra;
    long long slot, gen, t0, t1, step, tid;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!LLOOOLLLL:push", kw, &StoreType, &store,
                                     &slot, &gen, &start, &end, &extra, &t0, &t1, &step,
                                     &tid)) {
        return NULL;
    }
    PyObject *ex = PySequence_Tuple(extra);
    if (ex == NULL) {
        return NULL;
    }
    if (PyTuple_GET_SIZE(ex) == 0) {
        Py_CLEAR(ex);
    }
    Pend p = {(StoreObj *)Py_NewRef(store), ex, evref_of(r, start), evref_of(r, end), slot, gen,
              t0, t1, step, tid};
    if (rec_push(r, &p) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
rec_harvest_m(RecObj *r, PyObject *unused)
{
    (void)unused;
    if (rec_harvest(r) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
rec_get_anchor_is_ref(RecObj *r, void *c)
{
    (void)c;
    return PyBool_FromLong(r->anchor.ev != NULL && r->anchor.ev == r->ref.ev);
}

static PyObject *
rec_get_pooled(RecObj *r, void *c)
{
    (void)c;
    return PyLong_FromSsize_t(r->npool);
}

static PyObject *
rec_get_pending(RecObj *r, void *c)
{
    (void)c;
    return PyLong_FromSsize_t(r->pn);
}

static PyObject *
rec_repr(RecObj *r)
{
    return PyUnicode_FromFormat("<StreamRec %R: %zd pooled, %zd pending>", or_none(r->key),
                                r->npool, r->pn);
}

static PyMethodDef rec_methods[] = {
    {"take", (PyCFunction)(void (*)(void))rec_take_m, METH_VARARGS | METH_KEYWORDS,
     rec_take_doc},
    {"give", (PyCFunction)rec_give_m, METH_O, "Give an event back to the pool."},
    {"push", (PyCFunction)(void (*)(void))rec_push_m, METH_VARARGS | METH_KEYWORDS,
     rec_push_doc},
    {"harvest", (PyCFunction)rec_harvest_m, METH_NOARGS,
     "Resolve every finished sample, never blocking on the GPU."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef rec_members[] = {
    {"key", T_OBJECT, offsetof(RecObj, key), READONLY, "(stream id, device, device type)."},
    {"stream", T_OBJECT, offsetof(RecObj, stream), READONLY, "The stream (Python records)."},
    {"device", T_INT, offsetof(RecObj, dev), READONLY, "key[1]."},
    {"ref_ns", T_LONGLONG, offsetof(RecObj, ref_ns), READONLY,
     "Host clock when the reference event was recorded."},
    {"anchor_ms", T_DOUBLE, offsetof(RecObj, anchor_ms), READONLY,
     "The anchor's position after the reference (GPU ms)."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef rec_getset[] = {
    {"anchor_is_ref", (getter)rec_get_anchor_is_ref, NULL, "The anchor is the reference.",
     NULL},
    {"pooled", (getter)rec_get_pooled, NULL, "Events in the pool.", NULL},
    {"pending", (getter)rec_get_pending, NULL, "Samples not resolved yet.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RecType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudatimer._speedups.StreamRec",
    .tp_doc = PyDoc_STR("StreamRec(key, stream, raw, make_event): a stream regions ran on: "
                        "event pool, pending samples, trace reference and anchor."),
    .tp_basicsize = sizeof(RecObj),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)rec_init,
    .tp_dealloc = (destructor)rec_dealloc,
    .tp_traverse = (traverseproc)rec_traverse,
    .tp_clear = (inquiry)rec_clear,
    .tp_repr = (reprfunc)rec_repr,
    .tp_methods = rec_methods,
    .tp_members = rec_members,
    .tp_getset = rec_getset,
};

/* ======================================================================================
 * Store: everything one Timer recorded. Whole-run statistics per (slot, clock), the raw
 * samples of the last keep_steps steps (at most step_cap per step), the last trace_samples
 * calls, and the Timer's switches (enabled, step, gen).
 * ====================================================================================== */

static void
step_free(StepRec *rec)
{
    for (Py_ssize_t k = 0; k < rec->nrows; k++) {
        PyMem_Free(rec->rows[k].g);
        PyMem_Free(rec->rows[k].c);
    }
    PyMem_Free(rec->rows);
    rec->rows = NULL;
    rec->nrows = rec->rcap = 0;
}

/* Forget statistics, series and trace (reset, dealloc). No Python code runs. */
static void
store_forget(StoreObj *s)
{
    for (Py_ssize_t i = 0; i < s->nacc; i++) {
        hist_free(&s->accs[i]->gpu);
        hist_free(&s->accs[i]->cpu);
        PyMem_Free(s->accs[i]);
    }
    PyMem_Free(s->accs);
    PyMem_Free(s->htab);
    s->accs = NULL;
    s->htab = NULL;
    s->nacc = s->acc_cap = 0;
    s->hsize = 0;
    for (Py_ssize_t i = 0; i < s->nsteps; i++) {
        step_free(s->steps[i]);
        PyMem_Free(s->steps[i]);
    }
    PyMem_Free(s->steps);
    s->steps = NULL;
    s->nsteps = s->steps_cap = 0;
    PyMem_Free(s->trace);
    s->trace = NULL;
    s->tfirst = s->ntrace = s->tcap = 0;
}

static inline size_t
acc_hash(int64_t slot, int dev)
{
    uint64_t h = (uint64_t)slot * 0x9E3779B97F4A7C15ULL;
    h ^= (uint64_t)(int64_t)dev * 0xC2B2AE3D27D4EB4FULL;
    return (size_t)(h ^ (h >> 29));
}

static int
acc_rehash(StoreObj *s, size_t size)
{
    Py_ssize_t *t = PyMem_Calloc(size, sizeof(Py_ssize_t));
    if (t == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < s->nacc; i++) {
        size_t j = acc_hash(s->accs[i]->slot, s->accs[i]->dev) & (size - 1);
        while (t[j] != 0) {
            j = (j + 1) & (size - 1);
        }
        t[j] = i + 1;
    }
    PyMem_Free(s->htab);
    s->htab = t;
    s->hsize = size;
    return 0;
}

/* The accumulator of (slot, dev), made on first sight (`order`: how many came before it).
 * NULL with MemoryError. */
static Acc *
acc_get(StoreObj *s, int64_t slot, int dev)
{
    if (s->hsize) {
        size_t j = acc_hash(slot, dev) & (s->hsize - 1);
        for (Py_ssize_t k; (k = s->htab[j]) != 0; j = (j + 1) & (s->hsize - 1)) {
            Acc *a = s->accs[k - 1];
            if (a->slot == slot && a->dev == dev) {
                return a;
            }
        }
    }
    if ((size_t)(s->nacc + 1) * 2 > s->hsize && acc_rehash(s, s->hsize ? s->hsize * 2 : 16) < 0) {
        return NULL;
    }
    if (grow((void **)&s->accs, &s->acc_cap, s->nacc + 1, sizeof(Acc *)) < 0) {
        return NULL;
    }
    Acc *a = PyMem_Calloc(1, sizeof(Acc));
    if (a == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    a->slot = slot;
    a->dev = dev;
    a->order = s->nacc;
    hist_init(&a->gpu);
    hist_init(&a->cpu);
    size_t j = acc_hash(slot, dev) & (s->hsize - 1);
    while (s->htab[j] != 0) {
        j = (j + 1) & (s->hsize - 1);
    }
    s->accs[s->nacc++] = a;
    s->htab[j] = s->nacc;
    return a;
}

/* The record of `step`, made (as the newest, the oldest evicted past keep_steps) when it is
 * not kept. The current step is the newest one in the common case: searched from there. */
static StepRec *
step_get(StoreObj *s, int64_t step)
{
    for (Py_ssize_t i = s->nsteps - 1; i >= 0; i--) {
        if (s->steps[i]->step == step) {
            return s->steps[i];
        }
    }
    if (grow((void **)&s->steps, &s->steps_cap, s->nsteps + 1, sizeof(StepRec *)) < 0) {
        return NULL;
    }
    StepRec *rec = PyMem_Calloc(1, sizeof(StepRec));
    if (rec == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    rec->step = step;
    rec->serial = ++s->step_serial;
    s->steps[s->nsteps++] = rec;
    if (s->nsteps > s->keep_steps) {
        step_free(s->steps[0]);
        PyMem_Free(s->steps[0]);
        memmove(s->steps, s->steps + 1, (size_t)(s->nsteps - 1) * sizeof(StepRec *));
        s->nsteps--;
    }
    return rec;
}

/* Keep one sample in its step's series (`rec`, from step_get). */
static int
store_keep(StoreObj *s, Acc *a, StepRec *rec, double gpu, double cpu)
{
    rec->count++;
    if (rec->dropped) {
        return 0;
    }
    if (rec->count > s->step_cap) {
        /* A run that never calls step() is all step 0: past the cap its raw samples go, so
         * memory stays bounded; windows leave the step out and say so. */
        rec->dropped = 1;
        step_free(rec);
        a->row_serial = 0;
        return 0;
    }
    Py_ssize_t idx = -1;
    if (a->row_serial == rec->serial) {
        idx = a->row_idx; /* the common case: same step as this (slot, clock)'s last sample */
    }
    else if (a->max_serial >= rec->serial) {
        /* A late sample of an older step: its row may exist. */
        for (Py_ssize_t k = 0; k < rec->nrows; k++) {
            if (rec->rows[k].slot == a->slot && rec->rows[k].dev == a->dev) {
                idx = k;
                break;
            }
        }
    }
    if (idx < 0) {
        if (grow((void **)&rec->rows, &rec->rcap, rec->nrows + 1, sizeof(Row)) < 0) {
            return -1;
        }
        idx = rec->nrows++;
        memset(&rec->rows[idx], 0, sizeof(Row));
        rec->rows[idx].slot = a->slot;
        rec->rows[idx].dev = a->dev;
    }
    a->row_serial = rec->serial;
    a->row_idx = idx;
    if (rec->serial > a->max_serial) {
        a->max_serial = rec->serial;
    }
    Row *row = &rec->rows[idx];
    if (row->n == row->cap) {
        Py_ssize_t cap = row->cap ? row->cap * 2 : 16;
        double *g = PyMem_Realloc(row->g, (size_t)cap * sizeof(double));
        if (g == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        row->g = g;
        double *c = PyMem_Realloc(row->c, (size_t)cap * sizeof(double));
        if (c == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        row->c = c;
        row->cap = cap;
    }
    row->g[row->n] = gpu;
    row->c[row->n++] = cpu;
    return 0;
}

static int
store_trace(StoreObj *s, const TItem *it)
{
    if (s->ntrace < s->trace_samples) {
        Py_ssize_t cap = s->tcap;
        if (grow((void **)&s->trace, &cap, s->ntrace + 1, sizeof(TItem)) < 0) {
            return -1;
        }
        s->tcap = cap;
        s->trace[s->ntrace++] = *it;
        return 0;
    }
    s->trace[s->tfirst] = *it; /* full: the oldest goes */
    s->tfirst = (s->tfirst + 1) % s->trace_samples;
    return 0;
}

/* Fold one sample into its accumulator `a` and its step's record `rec` (NULL: steps are
 * not kept). The ring's fold calls it with both looked up once per column and replay. */
static int
acc_fold(StoreObj *s, Acc *a, StepRec *rec, double gpu_ms, double cpu_ms, int skipped,
         const TItem *it)
{
    a->calls++;
    if (!isnan(gpu_ms) && hist_add(&a->gpu, gpu_ms) < 0) {
        return -1;
    }
    if (hist_add(&a->cpu, cpu_ms) < 0) {
        return -1;
    }
    if (skipped) {
        a->skipped++;
    }
    if (rec != NULL && store_keep(s, a, rec, gpu_ms, cpu_ms) < 0) {
        return -1;
    }
    return s->trace_samples > 0 ? store_trace(s, it) : 0;
}

/* Fold one finished sample (gpu_ms NaN: a host sample). No Python code runs. */
static int
store_fold(StoreObj *s, int64_t slot, int64_t gen, int dev, double gpu_ms, double cpu_ms,
           int64_t step, int64_t t0_ns, int64_t tid, double at_ns, int64_t stream, int skipped)
{
    if (gen != s->gen) {
        return 0; /* entered before reset(): discarded */
    }
    Acc *a = acc_get(s, slot, dev);
    if (a == NULL) {
        return -1;
    }
    StepRec *rec = NULL;
    if (s->keep_steps > 0 && (rec = step_get(s, step)) == NULL) {
        return -1;
    }
    TItem it = {slot, stream, t0_ns, step, tid, dev, at_ns, gpu_ms, cpu_ms};
    return acc_fold(s, a, rec, gpu_ms, cpu_ms, skipped, &it);
}

static int
store_init(StoreObj *s, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"keep_steps", "trace_samples", "step_cap", "child", NULL};
    Py_ssize_t keep, trace, cap;
    PyObject *child;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nnnO:Store", kw, &keep, &trace, &cap,
                                     &child)) {
        return -1;
    }
    if (s->inited) {
        PyErr_SetString(PyExc_RuntimeError, "Store is initialised once");
        return -1;
    }
    if (keep < 0 || trace < 0 || cap < 1) {
        PyErr_SetString(PyExc_ValueError,
                        "keep_steps and trace_samples must be >= 0, step_cap >= 1");
        return -1;
    }
    s->serial = g_next_serial++;
    s->serial_key = PyLong_FromLongLong(s->serial);
    if (s->serial_key == NULL) {
        return -1;
    }
    s->child = Py_NewRef(child);
    s->task_var = PyContextVar_New("cudatimer-stack", NULL);
    if (s->task_var == NULL) {
        return -1;
    }
    s->enabled = 1;
    s->keep_steps = keep;
    s->trace_samples = trace;
    s->step_cap = cap;
    s->inited = 1;
    return 0;
}

/* -- this thread's (or asyncio task's) Stack of a store ------------------------------------
 * A thread's is kept in the thread's dict (PyThreadState_GetDict) under the store's serial.
 * While an asyncio loop runs, each task has its own, in the store's context variable (a task
 * inherits its creator's context: its first region finds the creator's stack there and
 * nests under it). A 4-way thread-local cache keyed by (serial, current context) sits in
 * front (~0.1 us saved): a task switch changes the thread's current context, so plain
 * threaded code hits it every time and a task pays the lookup once per switch. A cached
 * Stack and context are held (up to four per thread, kept after the thread ends, as the
 * cache cannot see it end; held, a context's address is never reused while cached);
 * serials are never reused, so an entry of a store that is gone is never hit again. */
#define TLS_WAYS 4
static _Thread_local struct {
    int64_t serial;
    StackObj *st;
    PyObject *ctx;
} tls_stacks[TLS_WAYS];
static _Thread_local unsigned tls_next;
static PyObject *g_running_loop = NULL; /* _asyncio._get_running_loop, where importable */
static PyObject *g_current_task = NULL; /* _asyncio.current_task */

static int store_note_stack(StoreObj *s, PyObject *st);

/* The running task's Stack of s (a new reference), or thread_st's new reference when no
 * asyncio task runs here; NULL with an exception. */
static StackObj *
task_stack(StoreObj *s, StackObj *thread_st)
{
    if (g_running_loop == NULL || s->task_var == NULL) {
        return (StackObj *)Py_NewRef(thread_st);
    }
    PyObject *loop = PyObject_CallNoArgs(g_running_loop);
    if (loop == NULL) {
        return NULL;
    }
    PyObject *task = loop == Py_None ? Py_NewRef(Py_None) : PyObject_CallOneArg(g_current_task, loop);
    Py_DECREF(loop);
    if (task == NULL) {
        return NULL;
    }
    if (task == Py_None) {
        Py_DECREF(task);
        return (StackObj *)Py_NewRef(thread_st);
    }
    PyObject *cur = NULL;
    if (PyContextVar_Get(s->task_var, NULL, &cur) < 0) {
        Py_DECREF(task);
        return NULL;
    }
    if (cur != NULL && Py_IS_TYPE(cur, &StackType) && ((StackObj *)cur)->owner == task) {
        Py_DECREF(task);
        return (StackObj *)cur;
    }
    StackObj *parent = cur != NULL && Py_IS_TYPE(cur, &StackType) ? (StackObj *)cur : thread_st;
    StackObj *mine = stack_make();
    if (mine == NULL) {
        Py_XDECREF(cur);
        Py_DECREF(task);
        return NULL;
    }
    mine->base = parent->n ? ent_frame(&parent->e[parent->n - 1])->slot : parent->base;
    mine->owner = task; /* our reference */
    Py_XDECREF(cur);
    PyObject *token = PyContextVar_Set(s->task_var, (PyObject *)mine);
    if (token == NULL || store_note_stack(s, (PyObject *)mine) < 0) {
        Py_XDECREF(token);
        Py_DECREF(mine);
        return NULL;
    }
    Py_DECREF(token);
    return mine;
}

/* Remember a new Stack of s (weakly), dropping the references of stacks that are gone. */
static int
store_note_stack(StoreObj *s, PyObject *st)
{
    if (s->stacks == NULL && (s->stacks = PyList_New(0)) == NULL) {
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(s->stacks);
    if (n >= 8 && (n & (n - 1)) == 0) { /* at each power of two: compact */
        PyObject *live = PyList_New(0);
        if (live == NULL) {
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *ref = PyList_GET_ITEM(s->stacks, i);
            if (PyWeakref_GetObject(ref) != Py_None && PyList_Append(live, ref) < 0) {
                Py_DECREF(live);
                return -1;
            }
        }
        Py_SETREF(s->stacks, live);
    }
    PyObject *ref = PyWeakref_NewRef(st, NULL);
    if (ref == NULL) {
        return -1;
    }
    int rc = PyList_Append(s->stacks, ref);
    Py_DECREF(ref);
    return rc;
}

/* Borrowed (the cache holds it); NULL with an exception. */
static StackObj *
store_stack(StoreObj *s)
{
    PyObject *ctx = PyThreadState_Get()->context;
    for (int i = 0; i < TLS_WAYS; i++) {
        if (tls_stacks[i].serial == s->serial && tls_stacks[i].st != NULL
            && tls_stacks[i].ctx == ctx) {
            return tls_stacks[i].st;
        }
    }
    if (s->serial_key == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Store is not initialised");
        return NULL;
    }
    PyObject *d = PyThreadState_GetDict();
    if (d == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cudatimer: no thread state");
        return NULL;
    }
    PyObject *st = PyDict_GetItemWithError(d, s->serial_key);
    if (st == NULL || !Py_IS_TYPE(st, &StackType)) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        st = (PyObject *)stack_make();
        if (st == NULL) {
            return NULL;
        }
        int rc = PyDict_SetItem(d, s->serial_key, st);
        if (rc == 0) {
            rc = store_note_stack(s, st);
        }
        Py_DECREF(st);
        if (rc < 0) {
            return NULL;
        }
    }
    StackObj *found = task_stack(s, (StackObj *)st); /* a new reference */
    if (found == NULL) {
        return NULL;
    }
    ctx = PyThreadState_Get()->context; /* (created by the context variable's lookup) */
    unsigned w = tls_next++ % TLS_WAYS;
    StackObj *old = tls_stacks[w].st;
    PyObject *old_ctx = tls_stacks[w].ctx;
    tls_stacks[w].serial = s->serial;
    tls_stacks[w].st = found; /* the cache holds it; the dict or the context does too */
    tls_stacks[w].ctx = Py_XNewRef(ctx);
    Py_XDECREF(old);
    Py_XDECREF(old_ctx);
    return found;
}

static int
store_traverse(StoreObj *s, visitproc visit, void *arg)
{
    Py_VISIT(s->child);
    Py_VISIT(s->stacks);
    return 0;
}

static int
store_clear(StoreObj *s)
{
    Py_CLEAR(s->child);
    Py_CLEAR(s->stacks);
    Py_CLEAR(s->task_var);
    return 0;
}

static void
store_dealloc(StoreObj *s)
{
    PyObject_GC_UnTrack(s);
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb); /* a dealloc may run while an exception propagates */
    /* This thread's Stack of it goes (other threads' go with their thread). */
    for (int i = 0; s->serial && i < TLS_WAYS; i++) {
        if (tls_stacks[i].serial == s->serial) {
            StackObj *st = tls_stacks[i].st;
            PyObject *ctx = tls_stacks[i].ctx;
            tls_stacks[i].serial = 0;
            tls_stacks[i].st = NULL;
            tls_stacks[i].ctx = NULL;
            Py_XDECREF(st);
            Py_XDECREF(ctx);
        }
    }
    PyObject *d = s->serial_key ? PyThreadState_GetDict() : NULL;
    if (d != NULL && PyDict_DelItem(d, s->serial_key) < 0) {
        PyErr_Clear();
    }
    Py_CLEAR(s->serial_key);
    store_clear(s);
    store_forget(s);
    PyErr_Restore(et, ev, tb);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

PyDoc_STRVAR(store_orphan_doc,
"orphan(region) -> bool\n\n"
"Mark the innermost frame of region on another thread's stack of this store ORPHAN (its\n"
"kind before that kept in dev): its\n"
"call was closed elsewhere (a generator suspended inside a region, closed by the garbage\n"
"collector on another thread). The owning thread drops it, NVTX pop included, the next time\n"
"a region of this store enters or exits there. False when no other thread has one.");

static PyObject *
store_orphan_m(StoreObj *s, PyObject *region)
{
    StackObj *mine = store_stack(s);
    if (mine == NULL) {
        return NULL;
    }
    Py_ssize_t n = s->stacks != NULL ? PyList_GET_SIZE(s->stacks) : 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *st = PyWeakref_GetObject(PyList_GET_ITEM(s->stacks, i)); /* borrowed */
        if (st == Py_None || st == (PyObject *)mine || !Py_IS_TYPE(st, &StackType)) {
            continue;
        }
        StackObj *other = (StackObj *)st;
        for (Py_ssize_t k = other->n - 1; k >= 0; k--) {
            CFrame *f = ent_frame(&other->e[k]);
            if (f->region == region && f->kind != K_ORPHAN) {
                f->dev = f->kind; /* the kind it had: an OFF frame pushed no NVTX range */
                f->kind = K_ORPHAN; /* no Python code ran since the lookup: still in place */
                Py_RETURN_TRUE;
            }
        }
    }
    Py_RETURN_FALSE;
}

PyDoc_STRVAR(store_open_slots_doc,
"open_slots() -> list[int]\n\n"
"The slots of the frames open on every stack of this store, and the stacks' bases (what the\n"
"region tree keeps at reset()).");

static PyObject *
store_open_slots_m(StoreObj *s, PyObject *unused)
{
    (void)unused;
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    Py_ssize_t n = s->stacks != NULL ? PyList_GET_SIZE(s->stacks) : 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *st = PyWeakref_GetObject(PyList_GET_ITEM(s->stacks, i)); /* borrowed */
        if (st == Py_None || !Py_IS_TYPE(st, &StackType)) {
            continue;
        }
        StackObj *stack = (StackObj *)st;
        /* No Python code runs inside this loop (appending an int runs none), so the stack
         * cannot change under it. */
        for (Py_ssize_t k = -1; k < stack->n; k++) {
            int64_t slot = k < 0 ? stack->base : ent_frame(&stack->e[k])->slot;
            PyObject *v = PyLong_FromLongLong((long long)slot);
            if (v == NULL || PyList_Append(out, v) < 0) {
                Py_XDECREF(v);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(v);
        }
    }
    return out;
}

static PyObject *
store_stack_m(StoreObj *s, PyObject *unused)
{
    (void)unused;
    StackObj *st = store_stack(s);
    return st ? Py_NewRef((PyObject *)st) : NULL;
}

static PyObject *
store_reset_m(StoreObj *s, PyObject *unused)
{
    (void)unused;
    s->gen++;
    s->step = 0;
    store_forget(s);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(store_record_doc,
"record(slot, gen, dev, gpu_ms, cpu_ms, step, t0_ns, tid, at_ns, stream, skipped)\n\n"
"Fold one finished sample (gpu_ms NaN for host samples).");

static PyObject *
store_record_m(StoreObj *s, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"slot", "gen", "dev", "gpu_ms", "cpu_ms", "step", "t0_ns", "tid",
                         "at_ns", "stream", "skipped", NULL};
    long long slot, gen, step, t0, tid, stream;
    int dev, skipped;
    double gpu, cpu, at;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LLiddLLLdLp:record", kw, &slot, &gen, &dev,
                                     &gpu, &cpu, &step, &t0, &tid, &at, &stream, &skipped)) {
        return NULL;
    }
    if (store_fold(s, slot, gen, dev, gpu, cpu, step, t0, tid, at, stream, skipped) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(store_record_ring_doc,
"record_ring(gen, dev, ring, first, n, slots, enter, leave, step, t0_ns, tid, stream,\n"
"            offset_ns) -> float\n\n"
"Fold m replays of a CUDA graph read from its timestamp ring. Replay i's n timestamps\n"
"(GPU-clock ns) start at word (first + i*n) % cap of ring (cap: its length); column j is\n"
"the region call of slot slots[j] between its replay's timestamps enter[j] and leave[j].\n"
"Buffers of native int64: ring (cap), slots, enter, leave (c each), step, t0_ns, tid,\n"
"stream (m each, per replay). offset_ns: the least GPU-minus-host clock offset seen so far\n"
"(inf: none); the block's least (first timestamp - t0_ns) lowers it, and trace starts are\n"
"placed with the result (at_ns = timestamp - offset), which is returned. CPU time is 0.");

static int
ring_len(Py_buffer *b, const char *name, Py_ssize_t want)
{
    if (b->len % 8 != 0 || (want >= 0 && b->len / 8 != want)) {
        PyErr_Format(PyExc_ValueError,
                     "record_ring: %s must hold %zd 8-byte values, got %zd bytes", name,
                     want, b->len);
        return -1;
    }
    return 0;
}

static int
ring_columns(const int64_t *col, Py_ssize_t c, Py_ssize_t n, const char *name)
{
    for (Py_ssize_t j = 0; j < c; j++) {
        if (col[j] < 0 || col[j] >= n) {
            PyErr_Format(PyExc_ValueError,
                         "record_ring: %s[%zd] must be a timestamp index in [0, %zd), got %lld",
                         name, j, n, (long long)col[j]);
            return -1;
        }
    }
    return 0;
}

static PyObject *
store_record_ring_m(StoreObj *s, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"gen",  "dev",  "ring",  "first", "n",   "slots",  "enter",
                         "leave", "step", "t0_ns", "tid",   "stream", "offset_ns", NULL};
    long long gen;
    int dev;
    Py_ssize_t first, n;
    double offset;
    Py_buffer b[8]; /* ring slots enter leave step t0_ns tid stream */
    memset(b, 0, sizeof(b));
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Liy*nny*y*y*y*y*y*y*d:record_ring", kw,
                                     &gen, &dev, &b[0], &first, &n, &b[1], &b[2], &b[3], &b[4],
                                     &b[5], &b[6], &b[7], &offset)) {
        return NULL;
    }
    PyObject *res = NULL;
    Acc **accs = NULL;
    Py_ssize_t cap = b[0].len / 8, c = b[1].len / 8, m = b[4].len / 8;
    if (ring_len(&b[0], "ring", -1) < 0 || ring_len(&b[1], "slots", -1) < 0
        || ring_len(&b[2], "enter", c) < 0 || ring_len(&b[3], "leave", c) < 0
        || ring_len(&b[4], "step", -1) < 0 || ring_len(&b[5], "t0_ns", m) < 0
        || ring_len(&b[6], "tid", m) < 0 || ring_len(&b[7], "stream", m) < 0) {
        goto done;
    }
    if (n < 1 || n > cap || m * n > cap || first < 0 || (cap > 0 && first >= cap)) {
        PyErr_Format(PyExc_ValueError,
                     "record_ring: n (%zd) and first (%zd) must fit %zd replays in a ring of "
                     "%zd words (1 <= n, m * n <= cap, 0 <= first < cap)",
                     n, first, m, cap);
        goto done;
    }
    const int64_t *ring = b[0].buf, *slots = b[1].buf, *enter = b[2].buf, *leave = b[3].buf,
                  *step = b[4].buf, *t0 = b[5].buf, *tid = b[6].buf, *stream = b[7].buf;
    if (ring_columns(enter, c, n, "enter") < 0 || ring_columns(leave, c, n, "leave") < 0) {
        goto done;
    }
    /* Pass 1: the least lead of a first timestamp over its replay's launch on the host. */
    Py_ssize_t base = first;
    for (Py_ssize_t i = 0; i < m && c > 0; i++) {
        for (Py_ssize_t j = 0; j < c; j++) {
            Py_ssize_t k = base + enter[j];
            double lead = (double)(ring[k >= cap ? k - cap : k] - t0[i]);
            if (lead < offset) {
                offset = lead;
            }
        }
        base += n;
        if (base >= cap) {
            base -= cap;
        }
    }
    if (gen != s->gen || m == 0 || c == 0) {
        res = PyFloat_FromDouble(offset); /* entered before reset(): discarded */
        goto done;
    }
    /* Pass 2: each column's accumulator looked up once (they never move), each replay's
     * step once: ~1/3 of the per-sample cost of record() from C. */
    if (ns_table_ready() < 0) {
        goto done;
    }
    accs = PyMem_Malloc((size_t)c * sizeof(Acc *));
    if (accs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < c; j++) {
        if ((accs[j] = acc_get(s, slots[j], dev)) == NULL) {
            goto done;
        }
    }
    /* What acc_fold does per sample, with the CPU time (0.0 every time) counted per column
     * once at the end. */
    base = first;
    Py_ssize_t rows = 0, cols = 0; /* the samples folded: rows whole, then cols of the next */
    for (; rows < m; rows++) {
        Py_ssize_t i = rows;
        StepRec *rec = NULL;
        if (s->keep_steps > 0 && (rec = step_get(s, step[i])) == NULL) {
            goto zeros;
        }
        for (cols = 0; cols < c; cols++) {
            Py_ssize_t j = cols, ka = base + enter[j], kb = base + leave[j];
            int64_t ta = ring[ka >= cap ? ka - cap : ka], tb = ring[kb >= cap ? kb - cap : kb];
            double gpu_ms = (double)(tb - ta) * 1e-6;
            Acc *a = accs[j];
            a->calls++;
            if (hist_add_ns(&a->gpu, tb - ta) < 0
                || (rec != NULL && store_keep(s, a, rec, gpu_ms, 0.0) < 0)) {
                goto zeros;
            }
            if (s->trace_samples > 0) {
                TItem it = {slots[j], stream[i], t0[i], step[i], tid[i], dev,
                            (double)ta - offset, gpu_ms, 0.0};
                if (store_trace(s, &it) < 0) {
                    goto zeros;
                }
            }
        }
        cols = 0;
        base += n;
        if (base >= cap) {
            base -= cap;
        }
    }
    res = PyFloat_FromDouble(offset);
zeros:
    for (Py_ssize_t j = 0; j < c; j++) {
        hist_zeros(&accs[j]->cpu, rows + (j < cols ? 1 : 0));
    }
done:
    PyMem_Free(accs);
    for (int i = 0; i < 8; i++) {
        if (b[i].obj != NULL) {
            PyBuffer_Release(&b[i]);
        }
    }
    return res;
}

static PyObject *
store_count_m(StoreObj *s, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"slot", "gen", "dev", NULL};
    long long slot, gen;
    int dev;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LLi:count", kw, &slot, &gen, &dev)) {
        return NULL;
    }
    if (gen == s->gen) {
        Acc *a = acc_get(s, slot, dev);
        if (a == NULL) {
            return NULL;
        }
        a->calls++;
    }
    Py_RETURN_NONE;
}

/* A struct sequence of `type` from a format of values (the references of "N" taken over). */
static PyObject *
make_struct(PyTypeObject *type, const char *fmt, ...)
{
    va_list va;
    va_start(va, fmt);
    PyObject *t = Py_VaBuildValue(fmt, va);
    va_end(va);
    if (t == NULL) {
        return NULL;
    }
    PyObject *o = PyStructSequence_New(type);
    if (o != NULL) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); i++) {
            PyStructSequence_SET_ITEM(o, i, Py_NewRef(PyTuple_GET_ITEM(t, i)));
        }
    }
    Py_DECREF(t);
    return o;
}

static PyObject *
hist_state(const CHist *h)
{
    Py_ssize_t nb = 0;
    for (int32_t k = 0; k < h->n; k++) {
        nb += h->b[k] != 0;
    }
    PyObject *buckets = PyTuple_New(nb);
    if (buckets == NULL) {
        return NULL;
    }
    Py_ssize_t j = 0;
    for (int32_t k = 0; k < h->n; k++) {
        if (h->b[k]) {
            PyObject *pair = Py_BuildValue("(iL)", h->lo + k, (long long)h->b[k]);
            if (pair == NULL) {
                Py_DECREF(buckets);
                return NULL;
            }
            PyTuple_SET_ITEM(buckets, j++, pair);
        }
    }
    return make_struct(&HistStateType, "(LdddLN)", (long long)h->count, h->total, h->min,
                       h->max, (long long)h->zeros, buckets);
}

static PyObject *
list_append_new(PyObject *list, PyObject *item)
{
    if (item == NULL) {
        return NULL;
    }
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc < 0 ? NULL : list;
}

/* Append one kept step's series rows (SeriesRow: step, slot, dev, gpu_ms, cpu_ms) to rows. */
static int
append_step_rows(PyObject *rows, StepRec *rec)
{
    for (Py_ssize_t k = 0; k < rec->nrows; k++) {
        Row *w = &rec->rows[k];
        Py_ssize_t nb = w->n * (Py_ssize_t)sizeof(double);
        if (!list_append_new(rows, make_struct(&SeriesRowType, "(LLiy#y#)", (long long)rec->step,
                                               (long long)w->slot, w->dev, (const char *)w->g,
                                               nb, (const char *)w->c, nb))) {
            return -1;
        }
    }
    return 0;
}

/* The snapshot's parts; no Python code runs here (the collector is kept off by the caller),
 * so the store cannot change while they are copied out. */
static PyObject *
store_snapshot(StoreObj *s, int series, int trace)
{
    PyObject *stats = PyList_New(0), *kept = PyTuple_New(s->nsteps), *rows = PyList_New(0);
    PyObject *items = PyList_New(0), *dropped = NULL;
    if (stats == NULL || kept == NULL || rows == NULL || items == NULL) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < s->nacc; i++) {
        Acc *a = s->accs[i];
        if (!list_append_new(stats, make_struct(&SlotStatsType, "(LinLLNN)", (long long)a->slot,
                                                a->dev, a->order, (long long)a->calls,
                                                (long long)a->skipped, hist_state(&a->gpu),
                                                hist_state(&a->cpu)))) {
            goto fail;
        }
    }
    Py_ssize_t ndropped = 0;
    for (Py_ssize_t i = 0; i < s->nsteps; i++) {
        PyObject *v = PyLong_FromLongLong(s->steps[i]->step);
        if (v == NULL) {
            goto fail;
        }
        PyTuple_SET_ITEM(kept, i, v);
        ndropped += s->steps[i]->dropped;
    }
    dropped = PyTuple_New(ndropped);
    if (dropped == NULL) {
        goto fail;
    }
    for (Py_ssize_t i = 0, j = 0; i < s->nsteps; i++) {
        if (s->steps[i]->dropped) {
            PyTuple_SET_ITEM(dropped, j++, PyLong_FromLongLong(s->steps[i]->step));
            if (PyTuple_GET_ITEM(dropped, j - 1) == NULL) {
                goto fail;
            }
        }
    }
    for (Py_ssize_t i = 0; series && i < s->nsteps; i++) {
        if (append_step_rows(rows, s->steps[i]) < 0) {
            goto fail;
        }
    }
    for (Py_ssize_t k = 0; trace && k < s->ntrace; k++) {
        TItem *t = &s->trace[(s->tfirst + k) % s->ntrace];
        if (!list_append_new(items, make_struct(&TraceItemType, "(LiLddLdLL)",
                                                (long long)t->slot, t->dev,
                                                (long long)t->stream, t->at_ns, t->gpu_ms,
                                                (long long)t->t0_ns, t->cpu_ms,
                                                (long long)t->step, (long long)t->tid))) {
            goto fail;
        }
    }
    return make_struct(&SnapshotType, "(NNNNN)", stats, kept, dropped, rows, items);
fail:
    Py_XDECREF(stats);
    Py_XDECREF(kept);
    Py_XDECREF(dropped);
    Py_XDECREF(rows);
    Py_XDECREF(items);
    return NULL;
}

static PyObject *
store_snapshot_m(StoreObj *s, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"series", "trace", NULL};
    int series = 0, trace = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|pp:snapshot", kw, &series, &trace)) {
        return NULL;
    }
    int was = gc_off();
    PyObject *r = store_snapshot(s, series, trace);
    gc_restore(was);
    return r;
}

/* step_rows(first, stop): the rows of the kept steps with first <= step < stop, in the order
 * the steps were kept; what a per-step feed reads as steps finish. It tests each kept step's
 * number (keep_steps of them, 1000 by default) and copies only the rows asked for, so a
 * feed that reads one new step at a time pays for that step's rows, never for every kept
 * step's, as snapshot(series=True) would. No Python code runs while the rows are copied. */
static PyObject *
store_step_rows_m(StoreObj *s, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"first", "stop", NULL};
    long long first = 0, stop = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LL:step_rows", kw, &first, &stop)) {
        return NULL;
    }
    int was = gc_off();
    PyObject *rows = PyList_New(0);
    for (Py_ssize_t i = 0; rows != NULL && i < s->nsteps; i++) {
        StepRec *rec = s->steps[i];
        if (rec->step >= first && rec->step < stop && append_step_rows(rows, rec) < 0) {
            Py_CLEAR(rows);
        }
    }
    gc_restore(was);
    return rows;
}

static Py_ssize_t
count_pending(StoreObj *only)
{
    Py_ssize_t n = 0, pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(g_streams, &pos, &key, &value)) {
        if (!Py_IS_TYPE(value, &RecType)) {
            continue;
        }
        RecObj *r = (RecObj *)value;
        if (only == NULL) {
            n += r->pn;
            continue;
        }
        for (Py_ssize_t k = 0; k < r->pn; k++) {
            n += r->pend[r->pfirst + k].store == only;
        }
    }
    return n;
}

static PyObject *
store_pending_m(StoreObj *s, PyObject *unused)
{
    (void)unused;
    return PyLong_FromSsize_t(count_pending(s));
}

static PyObject *
store_get_enabled(StoreObj *s, void *c)
{
    (void)c;
    return PyBool_FromLong(s->enabled);
}

static int
store_set_enabled(StoreObj *s, PyObject *v, void *c)
{
    (void)c;
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete enabled");
        return -1;
    }
    int on = PyObject_IsTrue(v);
    if (on < 0) {
        return -1;
    }
    s->enabled = on;
    return 0;
}

static PyMethodDef store_methods[] = {
    {"stack", (PyCFunction)store_stack_m, METH_NOARGS,
     "The calling thread's stack of open regions of this store."},
    {"open_slots", (PyCFunction)store_open_slots_m, METH_NOARGS, store_open_slots_doc},
    {"reset", (PyCFunction)store_reset_m, METH_NOARGS,
     "gen += 1, step = 0, statistics, series and trace forgotten (pending samples of the old "
     "gen are dropped when they finish)."},
    {"record", (PyCFunction)(void (*)(void))store_record_m, METH_VARARGS | METH_KEYWORDS,
     store_record_doc},
    {"record_ring", (PyCFunction)(void (*)(void))store_record_ring_m,
     METH_VARARGS | METH_KEYWORDS, store_record_ring_doc},
    {"count", (PyCFunction)(void (*)(void))store_count_m, METH_VARARGS | METH_KEYWORDS,
     "count(slot, gen, dev): count a call that was not timed (every=N)."},
    {"snapshot", (PyCFunction)(void (*)(void))store_snapshot_m, METH_VARARGS | METH_KEYWORDS,
     "snapshot(series=False, trace=False) -> Snapshot: a copy; changes nothing."},
    {"step_rows", (PyCFunction)(void (*)(void))store_step_rows_m, METH_VARARGS | METH_KEYWORDS,
     "step_rows(first, stop) -> [SeriesRow]: the rows of the kept steps in [first, stop)."},
    {"pending", (PyCFunction)store_pending_m, METH_NOARGS,
     "This store's samples still waiting for the GPU."},
    {"orphan", (PyCFunction)store_orphan_m, METH_O, store_orphan_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef store_members[] = {
    {"step", T_LONGLONG, offsetof(StoreObj, step), 0, "The Timer's step number."},
    {"gen", T_LONGLONG, offsetof(StoreObj, gen), READONLY,
     "Bumped by reset(): samples of calls entered before it are dropped."},
    {"keep_steps", T_PYSSIZET, offsetof(StoreObj, keep_steps), READONLY, NULL},
    {"trace_samples", T_PYSSIZET, offsetof(StoreObj, trace_samples), READONLY, NULL},
    {"step_cap", T_PYSSIZET, offsetof(StoreObj, step_cap), READONLY, NULL},
    {"child", T_OBJECT, offsetof(StoreObj, child), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef store_getset[] = {
    {"enabled", (getter)store_get_enabled, (setter)store_set_enabled,
     "The Timer on (regions recorded).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject StoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudatimer._speedups.Store",
    .tp_doc = PyDoc_STR("Store(keep_steps, trace_samples, step_cap, child): one Timer's "
                        "results and switches; child(parent_slot, name) -> slot (-1: root)."),
    .tp_basicsize = sizeof(StoreObj),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)store_init,
    .tp_dealloc = (destructor)store_dealloc,
    .tp_traverse = (traverseproc)store_traverse,
    .tp_clear = (inquiry)store_clear,
    .tp_methods = store_methods,
    .tp_members = store_members,
    .tp_getset = store_getset,
};

/* ======================================================================================
 * The hot path: RegionBase.__enter__/__exit__ for the common case (the Timer on, CUDA in use,
 * the current device's default stream), the general hooks given to bind for everything else.
 *
 * A probe of this design (C context manager, stream read from c10, C stack, host clock,
 * pending ring, harvest in place every 256 exits) added 1.02x what two bare torch.Event
 * records add in the launch-bound loop (48 x Linear(256)+GELU, H200); the Python hot path
 * added 2.2x. In the common case with the runtime bound no Python-level call is made.
 * ====================================================================================== */

typedef struct {
    int64_t sid;
    long dev, type;
} SKey;

/* The current stream's key: 1 and *k; 0 when there is none to use (no getter, or it gave
 * something else than a tuple of three ints: the general hooks take over); -1 with the
 * getter's exception. */
static int
current_key(SKey *k)
{
    if (g_c10) {
        c10_stream s = c10_current(-1);
        k->sid = s.id;
        k->dev = s.index;
        k->type = s.type;
        return 1;
    }
    if (g_getter == NULL) {
        return 0;
    }
    PyObject *fn = Py_NewRef(g_getter);
    PyObject *t = PyObject_CallOneArg(fn, minus_one);
    Py_DECREF(fn);
    if (t == NULL) {
        return -1;
    }
    int ok = PyTuple_Check(t) && PyTuple_GET_SIZE(t) == 3;
    if (ok) {
        k->sid = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 0));
        k->dev = PyLong_AsLong(PyTuple_GET_ITEM(t, 1));
        k->type = PyLong_AsLong(PyTuple_GET_ITEM(t, 2));
        if (PyErr_Occurred()) {
            PyErr_Clear();
            ok = 0;
        }
    }
    Py_DECREF(t);
    return ok;
}

/* After a general hook raised (a KeyboardInterrupt from a signal handler, say): the frame
 * the enter hook pushed (st deeper than depth, r's frame on top), or the frame own that the
 * exit hook did not get to pop, goes with its NVTX range, as if the call never ran. The
 * hook's exception stays the one raised. */
static void
repair_stack(StackObj *st, RegionObj *r, Py_ssize_t depth, FrameObj *own)
{
    Py_ssize_t at = -1;
    if (own == NULL) {
        if (st->n > depth && st->n > 0 && ent_frame(&st->e[st->n - 1])->region == (PyObject *)r) {
            at = st->n - 1;
        }
    }
    else {
        for (Py_ssize_t i = st->n - 1; i >= 0; i--) {
            if (st->e[i].py == own) {
                at = i;
                break;
            }
        }
    }
    if (at < 0) {
        return;
    }
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *gone = stack_remove(st, at);
    if (gone != NULL) {
        CFrame *f = &((FrameObj *)gone)->f;
        if (r->pop != NULL && f->kind != K_OFF && f->range_id == NULL && call_hook(r->pop, NULL) < 0) {
            PyErr_Clear();
        }
        Py_DECREF(gone);
    }
    PyErr_Clear();
    PyErr_Restore(et, ev, tb);
}

static PyObject *
region_unbound(void)
{
    PyErr_SetString(PyExc_AttributeError, "region not bound (RegionBase.bind was not called)");
    return NULL;
}

/* The record of the current device's default stream where a call of r takes the common case
 * (the fast path on, the store enabled, CUDA in use, that stream current and seen before):
 * 1 and *rec (a new reference); 0 where it does not (a side stream, maybe capturing, or a
 * stream not seen yet); -1 with the stream getter's exception. */
static inline int
common_case(RegionObj *r, StoreObj *store, RecObj **rec)
{
    if (!r->fast || !store->enabled || !g_usable) {
        return 0;
    }
    SKey k;
    int c = current_key(&k);
    if (c <= 0) {
        return c;
    }
    if (k.sid != 0 || k.type != 1 || k.dev < 0 || k.dev >= MAX_DEVICES
        || g_defaults[k.dev] == NULL) {
        return 0;
    }
    *rec = (RecObj *)Py_NewRef(g_defaults[k.dev]);
    return 1;
}

static PyObject *
region_enter(RegionObj *r, PyObject *unused)
{
    (void)unused;
    StoreObj *store = r->store;
    if (store == NULL) {
        return region_unbound();
    }
    RecObj *rec = NULL;
    int c = common_case(r, store, &rec);
    if (c < 0) {
        return NULL;
    }
    if (c == 0) {
        goto slow;
    }
    Py_INCREF(store);
    StackObj *st = store_stack(store);
    if (st == NULL) {
        goto fail;
    }
    Py_INCREF(st);
    /* The generation is read before the slot: reset() prunes the tree, then bumps it, so a
     * slot taken under a generation is in the tree that generation's samples are read by. */
    int64_t gen = store->gen;
    int64_t parent = st->base;
    if (st->n) {
        CFrame *top = ent_frame(&st->e[st->n - 1]);
        if (top->kind == K_ORPHAN) { /* closed on another thread: the general hook drops it */
            Py_DECREF(st);
            Py_DECREF(rec);
            Py_DECREF(store);
            goto slow;
        }
        parent = top->slot;
    }
    if (gen != r->c_gen) { /* a reset() since: every cached slot may be forgotten */
        for (int i = 0; i < SLOT_WAYS; i++) {
            r->c_ways[i].parent = INT64_MIN;
        }
        r->c_gen = gen;
    }
    SlotWay *way = &r->c_ways[slot_way(parent)];
    if (parent != way->parent) {
        /* The cache missed (first call, or another parent): the store's child names it. */
        if (store->child == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "Store is not initialised");
            goto fail_st;
        }
        PyObject *res = PyObject_CallFunction(store->child, "LO", (long long)parent, r->name);
        if (res == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
                goto fail_st;
            }
            /* A parent forgotten by a reset() racing with this enter: the general path
             * names the stack's frames again. */
            PyErr_Clear();
            Py_DECREF(st);
            Py_DECREF(rec);
            Py_DECREF(store);
            goto slow;
        }
        long long slot = PyLong_AsLongLong(res);
        Py_DECREF(res);
        if (slot == -1 && PyErr_Occurred()) {
            goto fail_st;
        }
        way->parent = parent;
        way->slot = slot;
    }
    int64_t slot = way->slot;
    if (r->push != NULL && call_hook(r->push, r->attrs) < 0) {
        goto fail_st;
    }
    EvRef ev;
    if (rec_take(rec, 0, &ev) < 0) {
        if (r->push != NULL) {
            pop_keeping_error(r->pop);
        }
        goto fail_st;
    }
    if (grow((void **)&st->e, &st->cap, st->n + 1, sizeof(Entry)) < 0) {
        pool_put(rec, ev);
        goto fail_st;
    }
    Entry *e = &st->e[st->n++];
    e->py = NULL;
    e->f.region = Py_NewRef((PyObject *)r);
    e->f.rec = (PyObject *)rec; /* our reference goes to the frame */
    e->f.start = ev.ev;
    e->f.start_h = ev.h;
    e->f.range_id = NULL;
    e->f.slot = slot;
    e->f.gen = gen;
    e->f.kind = K_TIMED;
    e->f.dev = -1;
    e->f.t0_ns = mono_ns();
    Py_DECREF(st);
    Py_DECREF(store);
    return Py_NewRef((PyObject *)r);
fail_st:
    Py_DECREF(st);
fail:
    Py_DECREF(rec);
    Py_DECREF(store);
    return NULL;
slow:;
    StackObj *here = store_stack(store);
    if (here == NULL) {
        return NULL;
    }
    Py_INCREF(here);
    Py_ssize_t depth = here->n;
    PyObject *res = PyObject_CallOneArg(r->enter, (PyObject *)r);
    if (res == NULL) {
        repair_stack(here, r, depth, NULL);
        Py_DECREF(here);
        return NULL;
    }
    Py_DECREF(here);
    Py_DECREF(res);
    return Py_NewRef((PyObject *)r);
}

/* The fast exit of the top frame of st (region r, TIMED on rec): the frame is popped, the end
 * recorded and the sample queued (maybe harvesting), then NVTX popped. */
static PyObject *
fast_exit(RegionObj *r, StoreObj *store, StackObj *st, RecObj *rec, int64_t t1)
{
    Entry ent = st->e[--st->n];
    CFrame f;
    if (ent.py != NULL) { /* pushed by Python or read by it: its fields, its start's handle */
        f = ent.py->f;
        Py_XINCREF(f.start);
        f.start_h = f.start != NULL && rec->use_raw ? event_handle(f.start) : NULL;
        f.region = f.rec = f.range_id = NULL;
    }
    else {
        f = ent.f; /* its references are ours now */
    }
    EvRef start = {f.start != NULL ? f.start : Py_NewRef(Py_None), f.start_h};
    f.start = NULL;
    EvRef end;
    int failed = rec_take(rec, 0, &end) < 0;
    if (failed) {
        Py_DECREF(start.ev); /* dropped, as the reference drops it */
    }
    else {
        Pend p = {(StoreObj *)Py_NewRef(store), NULL, start, end, f.slot, f.gen, f.t0_ns, t1,
                  store->step, (int64_t)st->tid};
        failed = rec_push(rec, &p) < 0;
    }
    cframe_clear(&f);
    Py_XDECREF(ent.py);
    if (failed) {
        if (r->pop != NULL) {
            pop_keeping_error(r->pop);
        }
        return NULL;
    }
    if (call_hook(r->pop, NULL) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
region_exit(RegionObj *r, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t t1 = mono_ns();
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "__exit__ takes 3 arguments, got %zd", nargs);
        return NULL;
    }
    StoreObj *store = r->store;
    if (store == NULL) {
        return region_unbound();
    }
    StackObj *st = store_stack(store);
    if (st == NULL) {
        return NULL;
    }
    if (r->fast && st->n > 0) {
        Py_ssize_t n = st->n;
        Entry *e = &st->e[n - 1];
        CFrame *f = ent_frame(e);
        if (f->region == (PyObject *)r && f->kind == K_TIMED && f->rec != NULL
            && Py_IS_TYPE(f->rec, &RecType)) {
            FrameObj *py = e->py;
            RecObj *rec = (RecObj *)Py_NewRef(f->rec);
            Py_INCREF(store);
            Py_INCREF(st);
            SKey k;
            int c = current_key(&k);
            PyObject *res = NULL;
            int fast = 0;
            if (c > 0 && k.sid == rec->sid && k.dev == rec->dev && k.type == rec->type) {
                /* The getter is Python code: the frame must still be the one read above. */
                fast = st->n == n && st->e[n - 1].py == py
                       && ent_frame(&st->e[n - 1])->region == (PyObject *)r
                       && ent_frame(&st->e[n - 1])->rec == (PyObject *)rec;
            }
            if (fast) {
                res = fast_exit(r, store, st, rec, t1);
            }
            Py_DECREF(st);
            Py_DECREF(store);
            Py_DECREF(rec);
            if (c < 0 || fast) {
                return res;
            }
        }
    }
    /* A stream or device switch inside the region, another kind of frame, the fast path off:
     * the general hook. The frame it should close is noted first, so that if the hook raises
     * before it pops it (a KeyboardInterrupt from a signal handler, say), it goes anyway. */
    FrameObj *own = NULL;
    for (Py_ssize_t i = st->n - 1; i >= 0; i--) {
        if (ent_frame(&st->e[i])->region == (PyObject *)r) {
            own = stack_frame_at(st, i);
            if (own == NULL) {
                return NULL;
            }
            Py_INCREF(own);
            break;
        }
    }
    Py_INCREF(st);
    PyObject *res = PyObject_CallFunctionObjArgs(r->exit, (PyObject *)r, args[0], NULL);
    if (res == NULL) {
        if (own != NULL) {
            repair_stack(st, r, -1, own);
        }
        Py_XDECREF(own);
        Py_DECREF(st);
        return NULL;
    }
    Py_XDECREF(own);
    Py_DECREF(st);
    Py_DECREF(res);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(region_bind_doc,
"bind(store, fast, name, push, attrs, pop, enter, exit, start=None, end=None)\n\n"
"Set what the hooks read (Region.__init__ calls it once): the Timer's Store, whether this\n"
"region may take the common case, its name, NVTX push(attrs) and pop() (None when off), the\n"
"general hooks enter(region) and exit(region, exc_type), and NVTX start(attrs) -> range id\n"
"and end(range id) for detached calls (open_at/close; None when off).");

static PyObject *
region_bind(RegionObj *r, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"store", "fast", "name", "push", "attrs", "pop", "enter", "exit",
                         "start", "end", NULL};
    PyObject *store, *name, *push, *attrs, *pop, *enter, *exit;
    PyObject *start = Py_None, *end = Py_None;
    int fast;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!pOOOOOO|OO:bind", kw, &StoreType, &store,
                                     &fast, &name, &push, &attrs, &pop, &enter, &exit, &start,
                                     &end)) {
        return NULL;
    }
    Py_XSETREF(r->store, (StoreObj *)Py_NewRef(store));
    Py_XSETREF(r->name, Py_NewRef(name));
    Py_XSETREF(r->push, push == Py_None ? NULL : Py_NewRef(push));
    Py_XSETREF(r->attrs, Py_NewRef(attrs));
    Py_XSETREF(r->pop, pop == Py_None ? NULL : Py_NewRef(pop));
    Py_XSETREF(r->enter, Py_NewRef(enter));
    Py_XSETREF(r->exit, Py_NewRef(exit));
    Py_XSETREF(r->start, start == Py_None ? NULL : Py_NewRef(start));
    Py_XSETREF(r->end, end == Py_None ? NULL : Py_NewRef(end));
    r->fast = fast;
    r->c_gen = -1; /* as the reference: nothing cached (the ways are emptied at first use) */
    Py_RETURN_NONE;
}

/* NVTX end of range rid after a failure: the first exception stays the one raised. */
static void
end_keeping_error(PyObject *end, PyObject *rid)
{
    if (end == NULL || rid == NULL) {
        return;
    }
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    if (call_hook(end, rid) < 0) {
        PyErr_Clear();
    }
    PyErr_Restore(et, ev, tb);
}

/* Detached calls: frames on no stack, opened at a slot the caller names and closed by the
 * caller (backward rows, opened and closed inside autograd's pass). The common case as in
 * __enter__/__exit__: one C call each instead of the general path's ~15 Python calls (on the
 * H200 machine's host a backward row cost 22 us of host time through the general path). */
PyDoc_STRVAR(region_open_at_doc,
"open_at(slot, gen) -> Frame | None\n\n"
"A detached call at slot (of the store's generation gen) in the common case: a TIMED Frame\n"
"on no stack, its start recorded on the current device's default stream now and its NVTX\n"
"range started by bind's start(attrs). None, with nothing done, where __enter__ would take\n"
"the general hook (the fast path off, the store disabled, CUDA not in use, another stream).");

static PyObject *
region_open_at(RegionObj *r, PyObject *const *args, Py_ssize_t nargs)
{
    StoreObj *store = r->store;
    if (store == NULL) {
        return region_unbound();
    }
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "open_at takes 2 arguments (slot, gen), got %zd", nargs);
        return NULL;
    }
    long long slot = PyLong_AsLongLong(args[0]);
    if (slot == -1 && PyErr_Occurred()) {
        return NULL;
    }
    long long gen = PyLong_AsLongLong(args[1]);
    if (gen == -1 && PyErr_Occurred()) {
        return NULL;
    }
    RecObj *rec = NULL;
    int c = common_case(r, store, &rec);
    if (c <= 0) {
        return c < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *rid = NULL;
    if (r->start != NULL) {
        PyObject *fn = Py_NewRef(r->start);
        rid = PyObject_CallOneArg(fn, r->attrs);
        Py_DECREF(fn);
        if (rid == NULL) {
            Py_DECREF(rec);
            return NULL;
        }
    }
    EvRef ev;
    if (rec_take(rec, 0, &ev) < 0) {
        end_keeping_error(r->end, rid);
        Py_XDECREF(rid);
        Py_DECREF(rec);
        return NULL;
    }
    CFrame f;
    memset(&f, 0, sizeof(f));
    f.region = Py_NewRef((PyObject *)r);
    f.rec = (PyObject *)rec; /* our reference goes to the frame */
    f.start = ev.ev;
    f.range_id = rid;
    f.slot = slot;
    f.gen = gen;
    f.kind = K_TIMED;
    f.dev = -1;
    f.t0_ns = mono_ns();
    FrameObj *o = frame_wrap(&f);
    if (o == NULL) {
        end_keeping_error(r->end, rid);
        cframe_clear(&f);
        return NULL;
    }
    return (PyObject *)o;
}

PyDoc_STRVAR(region_close_doc,
"close(frame) -> bool\n\n"
"End a TIMED frame of this region in the common case: its end recorded on the stream it\n"
"started on, which must be the current one still, its sample queued (maybe harvesting), its\n"
"NVTX range ended by bind's end(range id); the frame is OFF afterwards. False, with nothing\n"
"done, for any other frame or stream: the caller takes the general path.");

static PyObject *
region_close(RegionObj *r, PyObject *frame)
{
    int64_t t1 = mono_ns();
    StoreObj *store = r->store;
    if (store == NULL) {
        return region_unbound();
    }
    if (!Py_IS_TYPE(frame, &FrameType)) {
        PyErr_Format(PyExc_TypeError, "close() takes a Frame, got %.100s",
                     Py_TYPE(frame)->tp_name);
        return NULL;
    }
    CFrame *f = &((FrameObj *)frame)->f;
    if (!r->fast || f->region != (PyObject *)r || f->kind != K_TIMED || f->rec == NULL
        || !Py_IS_TYPE(f->rec, &RecType) || f->start == NULL) {
        Py_RETURN_FALSE;
    }
    RecObj *rec = (RecObj *)Py_NewRef(f->rec);
    SKey k;
    int c = current_key(&k);
    if (c <= 0 || k.sid != rec->sid || k.dev != rec->dev || k.type != rec->type
        || f->kind != K_TIMED || f->rec != (PyObject *)rec || f->start == NULL) {
        /* (The getter is Python code: the frame is read again after it.) */
        Py_DECREF(rec);
        if (c < 0) {
            return NULL;
        }
        Py_RETURN_FALSE;
    }
    StackObj *st = store_stack(store); /* the closing thread's: the sample's tid */
    if (st == NULL) {
        Py_DECREF(rec);
        return NULL;
    }
    EvRef start = {f->start, rec->use_raw ? event_handle(f->start) : NULL};
    PyObject *rid = f->range_id;
    f->start = NULL; /* both references are ours now */
    f->range_id = NULL;
    f->kind = K_OFF;
    EvRef end;
    int failed = rec_take(rec, 0, &end) < 0;
    if (failed) {
        Py_DECREF(start.ev); /* dropped, as __exit__ drops it */
    }
    else {
        Pend p = {(StoreObj *)Py_NewRef(store), NULL, start, end, f->slot, f->gen, f->t0_ns, t1,
                  store->step, (int64_t)st->tid};
        failed = rec_push(rec, &p) < 0;
    }
    if (failed) {
        end_keeping_error(r->end, rid);
    }
    else if (rid != NULL && r->end != NULL && call_hook(r->end, rid) < 0) {
        failed = 1;
    }
    Py_XDECREF(rid);
    Py_DECREF(rec);
    if (failed) {
        return NULL;
    }
    Py_RETURN_TRUE;
}

static int
region_traverse(RegionObj *r, visitproc visit, void *arg)
{
    /* The type is visited by the Python subclass's traverse (subtype_traverse). */
    Py_VISIT(r->store);
    Py_VISIT(r->name);
    Py_VISIT(r->push);
    Py_VISIT(r->attrs);
    Py_VISIT(r->pop);
    Py_VISIT(r->enter);
    Py_VISIT(r->exit);
    Py_VISIT(r->start);
    Py_VISIT(r->end);
    return 0;
}

static int
region_clear(RegionObj *r)
{
    Py_CLEAR(r->store);
    Py_CLEAR(r->name);
    Py_CLEAR(r->push);
    Py_CLEAR(r->attrs);
    Py_CLEAR(r->pop);
    Py_CLEAR(r->enter);
    Py_CLEAR(r->exit);
    Py_CLEAR(r->start);
    Py_CLEAR(r->end);
    return 0;
}

static void
region_dealloc(RegionObj *r)
{
    PyObject_GC_UnTrack(r);
    region_clear(r);
    /* A Python subclass's dealloc (subtype_dealloc) releases the type after this. */
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyMethodDef region_methods[] = {
    {"__enter__", (PyCFunction)region_enter, METH_NOARGS, "Open the region."},
    {"__exit__", (PyCFunction)(void (*)(void))region_exit, METH_FASTCALL, "Close the region."},
    {"bind", (PyCFunction)(void (*)(void))region_bind, METH_VARARGS | METH_KEYWORDS,
     region_bind_doc},
    {"open_at", (PyCFunction)(void (*)(void))region_open_at, METH_FASTCALL, region_open_at_doc},
    {"close", (PyCFunction)region_close, METH_O, region_close_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RegionBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudatimer._speedups.RegionBase",
    .tp_doc = PyDoc_STR("Base of cudatimer.Region: __enter__/__exit__ for the common case, the "
                        "general hooks given to bind for everything else."),
    .tp_basicsize = sizeof(RegionObj),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)region_dealloc,
    .tp_traverse = (traverseproc)region_traverse,
    .tp_clear = (inquiry)region_clear,
    .tp_methods = region_methods,
};

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
    /* a backward=True region's backward_from(*tensors): nothing either */
    {"backward_from", (PyCFunction)(void (*)(void))null_exit, METH_FASTCALL, NULL},
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

/* ======================================================================================
 * Module functions: settings, the registry of streams, drain
 * ====================================================================================== */

PyDoc_STRVAR(configure_doc,
"configure(*, inv_log_gamma, harvest_batch, anchor_hop_ms, prewarm)\n\n"
"Set the constants the core works with (_device passes them once, at import): the bucket\n"
"rule of _hist, samples queued on a stream between harvests, how far (GPU ms) a trace\n"
"placement reads from its anchor before the anchor moves, events pre-warmed per stream.");

static PyObject *
configure(PyObject *module, PyObject *args, PyObject *kwds)
{
    (void)module;
    static char *kw[] = {"inv_log_gamma", "harvest_batch", "anchor_hop_ms", "prewarm", NULL};
    double inv = Py_NAN, hop = Py_NAN;
    Py_ssize_t batch = PY_SSIZE_T_MIN, prewarm = PY_SSIZE_T_MIN;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$dndn:configure", kw, &inv, &batch, &hop,
                                     &prewarm)) {
        return NULL;
    }
    if (isnan(inv) || isnan(hop) || batch == PY_SSIZE_T_MIN || prewarm == PY_SSIZE_T_MIN) {
        PyErr_SetString(PyExc_TypeError, "configure() takes the keyword arguments "
                                         "inv_log_gamma, harvest_batch, anchor_hop_ms, prewarm");
        return NULL;
    }
    if (batch < 1 || prewarm < 0) {
        PyErr_SetString(PyExc_ValueError, "harvest_batch must be >= 1 and prewarm >= 0");
        return NULL;
    }
    g_inv_log_gamma = inv;
    g_harvest_batch = batch;
    g_anchor_hop_ms = hop;
    g_prewarm = prewarm;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(set_stream_getter_doc,
"set_stream_getter(getter, c10)\n\n"
"getter(device) -> (stream id, device, device type) of the current stream (-1: the current\n"
"device); None: no CUDA (the hot path always takes the general hooks). c10: the getter is\n"
"torch's own and was checked against current_stream(), so c10's current stream is read\n"
"directly instead of calling it (when load() bound that symbol).");

static PyObject *
set_stream_getter(PyObject *module, PyObject *args, PyObject *kwds)
{
    (void)module;
    static char *kw[] = {"getter", "c10", NULL};
    PyObject *fn;
    int c10;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Op:set_stream_getter", kw, &fn, &c10)) {
        return NULL;
    }
    Py_XSETREF(g_getter, fn == Py_None ? NULL : Py_NewRef(fn));
    g_c10 = c10 && c10_current != NULL && g_getter != NULL;
    Py_RETURN_NONE;
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

static PyObject *
runtime_bound(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyBool_FromLong(rt_record != NULL);
}

static PyObject *
now_ns(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromLongLong(mono_ns());
}

PyDoc_STRVAR(current_stream_doc,
"current_stream() -> (stream id, device, device type) | None\n\n"
"The current stream as c10 reports it to the hot path (None when that symbol is not bound).\n"
"Compare it with torch's once before passing c10=True to set_stream_getter.");

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
stream_of(PyObject *module, PyObject *key)
{
    (void)module;
    PyObject *rec = PyDict_GetItemWithError(g_streams, key);
    if (rec == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    return Py_NewRef(rec);
}

PyDoc_STRVAR(new_stream_doc,
"new_stream(key, stream, raw, make_event) -> StreamRec\n\n"
"Make and register the record of key (replacing one of the same key); a default stream's\n"
"(stream id 0, device type 1) also serves the hot path of its device.");

static PyObject *
new_stream(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "new_stream takes 4 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *rec = PyObject_Vectorcall((PyObject *)&RecType, args, 4, NULL);
    if (rec == NULL) {
        return NULL;
    }
    if (PyDict_SetItem(g_streams, args[0], rec) < 0) {
        Py_DECREF(rec);
        return NULL;
    }
    RecObj *r = (RecObj *)rec;
    if (r->sid == 0 && r->type == 1 && r->dev >= 0 && r->dev < MAX_DEVICES) {
        RecObj *old = g_defaults[r->dev];
        g_defaults[r->dev] = (RecObj *)Py_NewRef(rec);
        Py_XDECREF(old);
    }
    return rec;
}

static PyObject *
all_streams(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyDict_Values(g_streams);
}

PyDoc_STRVAR(forget_streams_doc,
"forget_streams(grave=None)\n\n"
"Drop every stream record, pending samples included. grave (a forked child): a list that\n"
"takes every object instead (the registry, as a dict), so that no CUDA event of the parent\n"
"is ever destroyed.");

static PyObject *
forget_streams(PyObject *module, PyObject *args, PyObject *kwds)
{
    (void)module;
    static char *kw[] = {"grave", NULL};
    PyObject *grave = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:forget_streams", kw, &grave)) {
        return NULL;
    }
    if (grave != Py_None) {
        PyObject *copy = PyDict_Copy(g_streams);
        if (copy == NULL) {
            return NULL;
        }
        /* A default record is in the registry under its key; one replaced there since and
         * still held by the hot path goes into the copy too. */
        for (int i = 0; i < MAX_DEVICES; i++) {
            RecObj *d = g_defaults[i];
            if (d != NULL && PyDict_GetItemWithError(g_streams, d->key) != (PyObject *)d) {
                PyObject *alias = Py_BuildValue("(si)", "default", i);
                int rc = alias ? PyDict_SetItem(copy, alias, (PyObject *)d) : -1;
                Py_XDECREF(alias);
                if (rc < 0) {
                    Py_DECREF(copy);
                    return NULL;
                }
            }
        }
        int rc = grave_add(grave, copy);
        Py_DECREF(copy);
        if (rc < 0) {
            return NULL;
        }
    }
    RecObj *defaults[MAX_DEVICES];
    memcpy(defaults, g_defaults, sizeof(defaults));
    memset(g_defaults, 0, sizeof(g_defaults));
    PyObject *old = g_streams;
    g_streams = PyDict_New();
    if (g_streams == NULL) {
        g_streams = old;
        PyDict_Clear(g_streams);
        old = NULL;
    }
    for (int i = 0; i < MAX_DEVICES; i++) {
        Py_XDECREF(defaults[i]);
    }
    Py_XDECREF(old);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
pending_total(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromSsize_t(count_pending(NULL));
}

static PyObject *
clear_pending(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    PyObject *recs = PyDict_Values(g_streams);
    if (recs == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(recs); i++) {
        PyObject *r = PyList_GET_ITEM(recs, i);
        if (Py_IS_TYPE(r, &RecType)) {
            rec_drop_pending((RecObj *)r);
        }
    }
    Py_DECREF(recs);
    Py_RETURN_NONE;
}

/* drain's poll of one record: 1 when its newest sample is done and so is every sample with
 * side-stream ends (they finish in no particular order), 0 if not, -1 with an exception. */
static int
drain_done(RecObj *r)
{
    int d = pend_done(r, r->pn - 1);
    for (Py_ssize_t i = 0; d > 0 && i < r->pn; i++) {
        if (r->pend[r->pfirst + i].extra != NULL) {
            d = pend_done(r, i);
        }
    }
    return d;
}

PyDoc_STRVAR(drain_doc,
"drain(timeout_s) -> int\n\n"
"Wait (polling with a growing pause, the GIL released while sleeping; never a blocking CUDA\n"
"call) until the newest pending sample of each stream is done or timeout_s passed, then\n"
"resolve every finished sample. Returns how many are still pending.");

static PyObject *
drain(PyObject *module, PyObject *arg)
{
    (void)module;
    double timeout = PyFloat_AsDouble(arg);
    if (timeout == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    double span = timeout * 1e9;
    int64_t now = mono_ns();
    int64_t deadline = span >= (double)(INT64_MAX - now) ? INT64_MAX
                       : span > 0.0                      ? now + (int64_t)span
                                                         : now;
    PyObject *recs = PyDict_Values(g_streams);
    if (recs == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(recs); i++) {
        PyObject *o = PyList_GET_ITEM(recs, i);
        if (!Py_IS_TYPE(o, &RecType)) {
            continue;
        }
        RecObj *r = (RecObj *)o;
        long pause_us = 50;
        while (r->pn > 0) {
            int d = drain_done(r);
            if (d < 0) {
                if (!PyErr_ExceptionMatches(PyExc_RuntimeError)) {
                    Py_DECREF(recs);
                    return NULL;
                }
                PyErr_Clear(); /* a stream is capturing: nothing can be read now */
                break;
            }
            if (d || mono_ns() >= deadline) {
                break;
            }
            struct timespec ts = {0, pause_us * 1000};
            Py_BEGIN_ALLOW_THREADS
            nanosleep(&ts, NULL);
            Py_END_ALLOW_THREADS
            pause_us = pause_us * 2 > 2000 ? 2000 : pause_us * 2;
        }
    }
    Py_DECREF(recs);
    recs = PyDict_Values(g_streams);
    if (recs == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(recs); i++) {
        PyObject *o = PyList_GET_ITEM(recs, i);
        if (Py_IS_TYPE(o, &RecType) && rec_harvest((RecObj *)o) < 0) {
            Py_DECREF(recs);
            return NULL;
        }
    }
    Py_DECREF(recs);
    return PyLong_FromSsize_t(count_pending(NULL));
}

static PyMethodDef methods[] = {
    {"load", load, METH_NOARGS, load_doc},
    {"runtime_path", runtime_path, METH_NOARGS, runtime_path_doc},
    {"runtime_bound", runtime_bound, METH_NOARGS,
     "True when events are recorded through the CUDA runtime directly."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     configure_doc},
    {"set_stream_getter", (PyCFunction)(void (*)(void))set_stream_getter,
     METH_VARARGS | METH_KEYWORDS, set_stream_getter_doc},
    {"set_usable", set_usable, METH_O,
     "Whether CUDA is in use: the hot path records events only then."},
    {"now_ns", now_ns, METH_NOARGS, "The host clock of every sample (CLOCK_MONOTONIC), in ns."},
    {"current_stream", current_stream, METH_NOARGS, current_stream_doc},
    {"stream_of", stream_of, METH_O, "The record of a stream key, or None."},
    {"new_stream", (PyCFunction)(void (*)(void))new_stream, METH_FASTCALL, new_stream_doc},
    {"all_streams", all_streams, METH_NOARGS, "Every registered stream record."},
    {"forget_streams", (PyCFunction)(void (*)(void))forget_streams,
     METH_VARARGS | METH_KEYWORDS, forget_streams_doc},
    {"pending_total", pending_total, METH_NOARGS, "Samples of every stream not resolved yet."},
    {"clear_pending", clear_pending, METH_NOARGS,
     "Drop every pending sample without waiting (interpreter exit)."},
    {"drain", drain, METH_O, drain_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "cudatimer._speedups",
    "The recorder core in C (the contract of cudatimer._core.pyi; the reference is\n"
    "cudatimer._core_py). Event records and reads through the CUDA runtime torch loaded.",
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
        {&str_event_id, "event_id"}, {&str_record, "record"}, {&str_query, "query"},
        {&str_elapsed_time, "elapsed_time"}, {&str_append, "append"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].slot == NULL
            && (*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL) {
            return NULL;
        }
    }
    if (minus_one == NULL && (minus_one = PyLong_FromLong(-1)) == NULL) {
        return NULL;
    }
    if (g_running_loop == NULL) { /* optional: without _asyncio every stack is a thread's */
        /* asyncio.current_task is C from 3.12 (Python before); _get_running_loop is C where
         * _asyncio exists. torch imports asyncio already, so this costs no import time. */
        PyObject *aio = PyImport_ImportModule("asyncio");
        PyObject *events = aio ? PyObject_GetAttrString(aio, "events") : NULL;
        if (events != NULL) {
            g_running_loop = PyObject_GetAttrString(events, "_get_running_loop");
            g_current_task = g_running_loop ? PyObject_GetAttrString(aio, "current_task") : NULL;
            if (g_current_task == NULL) {
                Py_CLEAR(g_running_loop);
            }
        }
        Py_XDECREF(events);
        Py_XDECREF(aio);
        PyErr_Clear();
    }
    if (g_streams == NULL && (g_streams = PyDict_New()) == NULL) {
        return NULL;
    }
    struct {
        PyTypeObject *type;
        PyStructSequence_Desc *desc;
    } seqs[] = {
        {&HistStateType, &hist_desc}, {&SlotStatsType, &slot_desc}, {&SeriesRowType, &row_desc},
        {&TraceItemType, &item_desc}, {&SnapshotType, &snap_desc},
    };
    for (size_t i = 0; i < sizeof(seqs) / sizeof(seqs[0]); i++) {
        if (seqs[i].type->tp_name == NULL
            && PyStructSequence_InitType2(seqs[i].type, seqs[i].desc) < 0) {
            return NULL;
        }
    }
    PyTypeObject *types[] = {&FrameType, &StackType, &RecType, &StoreType, &RegionBaseType,
                             &NullRegionType};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (PyType_Ready(types[i]) < 0) {
            return NULL;
        }
    }
    PyObject *r = load(NULL, NULL); /* binds what is loaded; never initialises CUDA */
    if (r == NULL) {
        return NULL;
    }
    Py_DECREF(r);
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    struct {
        const char *name;
        PyObject *obj;
    } attrs[] = {
        {"Frame", (PyObject *)&FrameType},
        {"Stack", (PyObject *)&StackType},
        {"StreamRec", (PyObject *)&RecType},
        {"Store", (PyObject *)&StoreType},
        {"RegionBase", (PyObject *)&RegionBaseType},
        {"NullRegion", (PyObject *)&NullRegionType},
        {"HistState", (PyObject *)&HistStateType},
        {"SlotStats", (PyObject *)&SlotStatsType},
        {"SeriesRow", (PyObject *)&SeriesRowType},
        {"TraceItem", (PyObject *)&TraceItemType},
        {"Snapshot", (PyObject *)&SnapshotType},
    };
    for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++) {
        if (PyModule_AddObjectRef(m, attrs[i].name, attrs[i].obj) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    static const struct {
        const char *name;
        long value;
    } kinds[] = {{"TIMED", K_TIMED}, {"HOST", K_HOST},   {"SKIP", K_SKIP},
                 {"OFF", K_OFF},     {"NVTX", K_NVTX},   {"UNTIMED", K_UNTIMED},
                 {"ORPHAN", K_ORPHAN}, {"GRAPH", K_GRAPH}};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        if (PyModule_AddIntConstant(m, kinds[i].name, kinds[i].value) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    if (PyModule_AddStringConstant(m, "IMPL", "c") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
