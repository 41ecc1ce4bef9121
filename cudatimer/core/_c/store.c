/* Part of cudatimer.core._speedups (Store: everything one Timer recorded (statistics, series, trace, snapshot)). Not compiled on its own:
 * _speedups.c includes every part, in order, into one translation unit. */

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
"orphan($self, region, /)\n--\n\n"
"Mark the innermost frame of region on another thread's stack of this store ORPHAN (its\n"
"kind before that kept in dev): its call was closed elsewhere (a generator suspended inside\n"
"a region, closed by the garbage collector on another thread). The owning thread drops it,\n"
"NVTX pop included, the next time a region of this store enters or exits there. False when\n"
"no other thread has one.");

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
"open_slots($self, /)\n--\n\n"
"The slots of the frames open on every stack of this store, and the stacks' bases (what\n"
"the region tree keeps at reset()).");

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

PyDoc_STRVAR(store_open_frames_doc,
"open_frames($self, /)\n--\n\n"
"Every frame open on a stack of this store now, as (stack, tid, slot, kind, t0_ns): stack\n"
"numbers the stacks of this call, each stack's frames come outermost first, ORPHAN frames are\n"
"left out. Changes nothing; any thread may call it (a live view reads other threads' stacks).");

static PyObject *
store_open_frames_m(StoreObj *s, PyObject *unused)
{
    (void)unused;
    /* The collector is kept off while the stacks are read: a collection could run finalizers
     * (Python code that enters or exits regions) between two frames of one stack. */
    int was = gc_off();
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        gc_restore(was);
        return NULL;
    }
    Py_ssize_t n = s->stacks != NULL ? PyList_GET_SIZE(s->stacks) : 0;
    Py_ssize_t number = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *st = PyWeakref_GetObject(PyList_GET_ITEM(s->stacks, i)); /* borrowed */
        if (st == Py_None || !Py_IS_TYPE(st, &StackType)) {
            continue;
        }
        StackObj *stack = (StackObj *)st;
        if (stack->n == 0) {
            continue;
        }
        for (Py_ssize_t k = 0; k < stack->n; k++) {
            CFrame *f = ent_frame(&stack->e[k]);
            if (f->kind == K_ORPHAN) {
                continue;
            }
            PyObject *item = Py_BuildValue("(nkLiL)", number, stack->tid, (long long)f->slot,
                                           f->kind, (long long)f->t0_ns);
            if (item == NULL || PyList_Append(out, item) < 0) {
                Py_XDECREF(item);
                Py_DECREF(out);
                gc_restore(was);
                return NULL;
            }
            Py_DECREF(item);
        }
        number++;
    }
    gc_restore(was);
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
"record($self, /, slot, gen, dev, gpu_ms, cpu_ms, step, t0_ns, tid, at_ns, stream, skipped)\n"
"--\n\n"
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
"record_ring($self, /, gen, dev, ring, first, n, slots, enter, leave, step, t0_ns, tid,"
" stream, offset_ns)\n--\n\n"
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
     "stack($self, /)\n--\n\nThe calling thread's stack of open regions of this store."},
    {"open_slots", (PyCFunction)store_open_slots_m, METH_NOARGS, store_open_slots_doc},
    {"open_frames", (PyCFunction)store_open_frames_m, METH_NOARGS, store_open_frames_doc},
    {"reset", (PyCFunction)store_reset_m, METH_NOARGS,
     "reset($self, /)\n--\n\n"
     "gen += 1, step = 0, statistics, series and trace forgotten (pending samples of the old "
     "gen are dropped when they finish)."},
    {"record", (PyCFunction)(void (*)(void))store_record_m, METH_VARARGS | METH_KEYWORDS,
     store_record_doc},
    {"record_ring", (PyCFunction)(void (*)(void))store_record_ring_m,
     METH_VARARGS | METH_KEYWORDS, store_record_ring_doc},
    {"count", (PyCFunction)(void (*)(void))store_count_m, METH_VARARGS | METH_KEYWORDS,
     "count($self, /, slot, gen, dev)\n--\n\nCount a call that was not timed (every=N)."},
    {"snapshot", (PyCFunction)(void (*)(void))store_snapshot_m, METH_VARARGS | METH_KEYWORDS,
     "snapshot($self, /, series=False, trace=False)\n--\n\nA Snapshot: a copy; changes nothing."},
    {"step_rows", (PyCFunction)(void (*)(void))store_step_rows_m, METH_VARARGS | METH_KEYWORDS,
     "step_rows($self, /, first, stop)\n--\n\n"
     "The SeriesRows of the kept steps in [first, stop)."},
    {"pending", (PyCFunction)store_pending_m, METH_NOARGS,
     "pending($self, /)\n--\n\nThis store's samples still waiting for the GPU."},
    {"orphan", (PyCFunction)store_orphan_m, METH_O, store_orphan_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef store_members[] = {
    {"step", T_LONGLONG, offsetof(StoreObj, step), 0, "The Timer's step number."},
    {"gen", T_LONGLONG, offsetof(StoreObj, gen), READONLY,
     "Bumped by reset(): samples of calls entered before it are dropped."},
    {"keep_steps", T_PYSSIZET, offsetof(StoreObj, keep_steps), READONLY, NULL},
    {"trace_samples", T_PYSSIZET, offsetof(StoreObj, trace_samples), READONLY, NULL},
    {"step_cap", T_PYSSIZET, offsetof(StoreObj, step_cap), READONLY,
     "Raw samples kept per step; past it the step's series are dropped."},
    {"child", T_OBJECT, offsetof(StoreObj, child), READONLY, "child(parent_slot, name) -> slot."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef store_getset[] = {
    {"enabled", (getter)store_get_enabled, (setter)store_set_enabled,
     "The Timer on (regions recorded).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject StoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudatimer.core._speedups.Store",
    .tp_doc = PyDoc_STR("Store(keep_steps, trace_samples, step_cap, child)\n--\n\nOne Timer's "
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

