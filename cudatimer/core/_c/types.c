/* Part of cudatimer.core._speedups (the C structs every part shares (frames, pending samples, accumulators, caches)). Not compiled on its own:
 * _speedups.c includes every part, in order, into one translation unit. */

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
    "cudatimer.core._speedups.HistState",
    "A distribution as _hist.Histogram takes it (Histogram(*state)).", hist_fields, 6};
static PyStructSequence_Desc slot_desc = {
    "cudatimer.core._speedups.SlotStats",
    "Whole-run statistics of one region path (slot) on one clock (dev).", slot_fields, 7};
static PyStructSequence_Desc row_desc = {
    "cudatimer.core._speedups.SeriesRow",
    "Raw samples of one region path on one clock in one kept step.", row_fields, 5};
static PyStructSequence_Desc item_desc = {
    "cudatimer.core._speedups.TraceItem", "One of the last calls, for the trace.", item_fields, 9};
static PyStructSequence_Desc snap_desc = {
    "cudatimer.core._speedups.Snapshot", "What a store holds, copied out (Store.snapshot).",
    snap_fields, 5};

