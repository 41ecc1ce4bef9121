/*
 * cudatimer._speedups: the two CUDA calls of the hot path, made without torch's Python binding.
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

#include <string.h>
#include <time.h>

#if defined(__linux__)
#include <dlfcn.h>
#include <link.h>
#define CUDATIMER_HAVE_DL 1
#endif

/* cudaError_t is an int-sized enum; events and streams are opaque pointers. */
typedef int (*event_record_fn)(void *event, void *stream);
typedef int (*event_elapsed_fn)(float *ms, void *start, void *end);
typedef int (*get_last_error_fn)(void);

#define CUDA_SUCCESS_CODE 0
#define CUDA_NOT_READY_CODE 600 /* cudaErrorNotReady */

static event_record_fn rt_record = NULL;
static event_elapsed_fn rt_elapsed = NULL;
static get_last_error_fn rt_get_last_error = NULL;
static char rt_path[4096];

static PyObject *str_pool;
static PyObject *str_raw;
static PyObject *str_event_id;
static PyObject *str_take_recorded;
static PyObject *str_elapsed_time;
/* Names read by fast_enter/fast_exit (attributes of Region, Timer, _Node, StreamEntry). */
static PyObject *str_fast, *str_timer, *str_enabled, *str_state, *str_local, *str_stack,
    *str_root, *str_children, *str_name, *str_child, *str_nvtx, *str_domain, *str_attrs,
    *str_push, *str_pop, *str_streams, *str_key, *str_pending, *str_append, *str_check_at,
    *str_step, *str_tid, *str_try_harvest;
static PyObject *minus_one; /* _cuda_getCurrentStream(-1): the current device */

/* Set once by configure(): the Backend, its USABLE state value and the StreamEntry type. */
static PyObject *cfg_backend = NULL;
static PyObject *cfg_usable = NULL;
static PyObject *cfg_entry_type = NULL;
static PyObject *cfg_ends_type = NULL;
static Py_ssize_t cfg_fold = 256;
/* Names read by resolve (attributes of _Node, _Acc, HistBuilder, Timer, StreamEntry). */
static PyObject *str_popleft, *str_appendleft, *str_clock, *str_owner, *str_gen, *str_stats,
    *str_calls, *str_gpu, *str_cpu, *str_fold, *str_keep_steps, *str_last, *str_series,
    *str_trace_samples, *str_trace, *str_path, *str_record, *str_gen_private, *str_raw_buf;
static PyObject *one;

#ifdef CUDATIMER_HAVE_DL
static int
find_cudart(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    const char *name = info->dlpi_name;
    if (name != NULL && strstr(name, "/libcudart.so") != NULL) {
        size_t n = strlen(name);
        if (n < sizeof(rt_path)) {
            memcpy(rt_path, name, n + 1);
            return 1;
        }
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
    dl_iterate_phdr(find_cudart, NULL);
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
    if (rec == NULL || ela == NULL || err == NULL) {
        Py_RETURN_FALSE;
    }
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

/* time.perf_counter_ns() of CPython on Linux is CLOCK_MONOTONIC: the same clock, so host
 * times taken here and in the Python paths compare (a test checks the ordering). */
static PyObject *
now_ns(void)
{
#if defined(__linux__)
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return PyLong_FromLongLong((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
#else
    PyObject *time_mod = PyImport_ImportModule("time");
    if (time_mod == NULL) {
        return NULL;
    }
    PyObject *ns = PyObject_CallMethod(time_mod, "perf_counter_ns", NULL);
    Py_DECREF(time_mod);
    return ns;
#endif
}

PyDoc_STRVAR(configure_doc,
"configure(backend, usable, entry_type, ends_type, fold)\n\n"
"Give the hot path the process's Backend, the value of its USABLE state, the StreamEntry\n"
"and Ends types and HistBuilder.FOLD (called once by cudatimer._cuda).");

static PyObject *
configure(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *backend, *usable, *entry_type, *ends_type;
    Py_ssize_t fold;
    if (!PyArg_ParseTuple(args, "OOOOn:configure", &backend, &usable, &entry_type, &ends_type,
                          &fold)) {
        return NULL;
    }
    if (fold < 1) {
        PyErr_SetString(PyExc_ValueError, "configure: fold must be >= 1");
        return NULL;
    }
    cfg_fold = fold;
    Py_INCREF(backend);
    Py_INCREF(usable);
    Py_INCREF(entry_type);
    Py_INCREF(ends_type);
    Py_XSETREF(cfg_ends_type, ends_type);
    Py_XSETREF(cfg_backend, backend);
    Py_XSETREF(cfg_usable, usable);
    Py_XSETREF(cfg_entry_type, entry_type);
    Py_RETURN_NONE;
}

/* 1 if getattr(obj, name) is true, 0 if false, -1 on error. */
static int
attr_true(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        return -1;
    }
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* Pop the region's NVTX range if it pushed one, keeping any exception already set. */
static int
nvtx_pop(PyObject *region)
{
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    int ok = 0;
    int on = attr_true(region, str_nvtx);
    if (on > 0) {
        PyObject *domain = PyObject_GetAttr(region, str_domain);
        PyObject *r = domain != NULL ? PyObject_CallMethodNoArgs(domain, str_pop) : NULL;
        Py_XDECREF(domain);
        if (r == NULL) {
            ok = -1;
        }
        Py_XDECREF(r);
    }
    else if (on < 0) {
        ok = -1;
    }
    if (exc_type != NULL) {
        /* The first error wins: an error of the pop itself is dropped. */
        if (ok < 0) {
            PyErr_Clear();
        }
        PyErr_Restore(exc_type, exc_value, exc_tb);
        return -1;
    }
    return ok;
}

/* What fast_enter/fast_exit return: True (done), False (t == 0: the caller runs the Python
 * path), NULL (t < 0: an exception is set). */
static PyObject *
answer(int t)
{
    return t < 0 ? NULL : PyBool_FromLong(t);
}

PyDoc_STRVAR(fast_enter_doc,
"fast_enter(region, entries, get_stream) -> bool\n\n"
"Region.__enter__'s common case in one call: a timing region of an enabled Timer, CUDA in\n"
"use, the current stream already known (entries) and not a side stream. Pushes the NVTX\n"
"range, records a pooled start event on the current stream and pushes the frame\n"
"(region, node, entry, start, t0_ns) on the thread's stack. False: nothing was done, the\n"
"caller runs Timer._enter, which handles every case.");

static PyObject *
fast_enter(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (bad_nargs(nargs, 3, "fast_enter(region, entries, get_stream)")) {
        return NULL;
    }
    PyObject *region = args[0], *entries = args[1], *get_stream = args[2];
    PyObject *timer = NULL, *local = NULL, *stack = NULL, *parent = NULL, *children = NULL;
    PyObject *name = NULL, *node = NULL, *key = NULL, *event = NULL, *t0 = NULL;
    PyObject *frame = NULL, *state = NULL;
    PyObject *result = NULL;
    int t;

    if (cfg_backend == NULL || !PyDict_Check(entries)) {
        Py_RETURN_FALSE;
    }
    if ((t = attr_true(region, str_fast)) <= 0) {
        goto fallback_or_error;
    }
    if ((timer = PyObject_GetAttr(region, str_timer)) == NULL) {
        goto done;
    }
    if ((t = attr_true(timer, str_enabled)) <= 0) {
        goto fallback_or_error;
    }
    if ((state = PyObject_GetAttr(cfg_backend, str_state)) == NULL) {
        goto done;
    }
    if ((t = PyObject_RichCompareBool(state, cfg_usable, Py_EQ)) <= 0) {
        goto fallback_or_error;
    }
    if ((local = PyObject_GetAttr(timer, str_local)) == NULL
        || (stack = PyObject_GetAttr(local, str_stack)) == NULL) {
        goto done;
    }
    if (!PyList_Check(stack)) {
        t = 0;
        goto fallback_or_error;
    }
    Py_ssize_t depth = PyList_GET_SIZE(stack);
    if (depth > 0) {
        PyObject *top = PyList_GET_ITEM(stack, depth - 1);
        if (!PyTuple_Check(top) || PyTuple_GET_SIZE(top) < 2) {
            t = 0;
            goto fallback_or_error;
        }
        parent = PyTuple_GET_ITEM(top, 1);
        Py_INCREF(parent);
    }
    else if ((parent = PyObject_GetAttr(timer, str_root)) == NULL) {
        goto done;
    }
    if ((children = PyObject_GetAttr(parent, str_children)) == NULL
        || (name = PyObject_GetAttr(region, str_name)) == NULL) {
        goto done;
    }
    if (PyDict_Check(children)) {
        node = PyDict_GetItemWithError(children, name);
        if (node == NULL && PyErr_Occurred()) {
            goto done;
        }
        Py_XINCREF(node);
    }
    if (node == NULL && (node = PyObject_CallMethodOneArg(parent, str_child, name)) == NULL) {
        goto done;
    }
    if ((key = PyObject_CallOneArg(get_stream, minus_one)) == NULL) {
        goto done;
    }
    PyObject *entry = PyDict_GetItemWithError(entries, key); /* borrowed */
    if (entry == NULL) {
        t = PyErr_Occurred() ? -1 : 0;
        goto fallback_or_error;
    }
    /* A side stream may be capturing a CUDA graph: the general path checks (0.4 us). */
    if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) < 1) {
        t = 0;
        goto fallback_or_error;
    }
    PyObject *stream_id = PyTuple_GET_ITEM(key, 0);
    if (!PyLong_Check(stream_id) || PyLong_AsLongLong(stream_id) != 0) {
        t = PyErr_Occurred() ? -1 : 0;
        goto fallback_or_error;
    }
    Py_INCREF(entry); /* held while Python code (NVTX, the fallback record) may run */
    int nvtx_on = attr_true(region, str_nvtx);
    if (nvtx_on < 0) {
        Py_DECREF(entry);
        goto done;
    }
    if (nvtx_on) {
        PyObject *domain = PyObject_GetAttr(region, str_domain);
        PyObject *attrs = domain != NULL ? PyObject_GetAttr(region, str_attrs) : NULL;
        PyObject *r = attrs != NULL ? PyObject_CallMethodOneArg(domain, str_push, attrs) : NULL;
        Py_XDECREF(domain);
        Py_XDECREF(attrs);
        if (r == NULL) {
            Py_DECREF(entry);
            goto done;
        }
        Py_DECREF(r);
    }
    event = take_record(NULL, entry);
    if (event == NULL) {
        Py_DECREF(entry);
        nvtx_pop(region);
        goto done;
    }
    t0 = now_ns();
    frame = t0 != NULL ? PyTuple_Pack(5, region, node, entry, event, t0) : NULL;
    Py_DECREF(entry);
    if (frame == NULL || PyList_Append(stack, frame) < 0) {
        nvtx_pop(region);
        goto done;
    }
    t = 1;
fallback_or_error:
    result = answer(t);
done:
    Py_XDECREF(timer);
    Py_XDECREF(state);
    Py_XDECREF(local);
    Py_XDECREF(stack);
    Py_XDECREF(parent);
    Py_XDECREF(children);
    Py_XDECREF(name);
    Py_XDECREF(node);
    Py_XDECREF(key);
    Py_XDECREF(event);
    Py_XDECREF(t0);
    Py_XDECREF(frame);
    return result;
}

PyDoc_STRVAR(fast_exit_doc,
"fast_exit(region, get_stream) -> bool\n\n"
"Region.__exit__'s common case in one call: the top frame of the thread's stack is this\n"
"region's, made by fast_enter, and the current stream is still the one it started on. Pops\n"
"the frame, records a pooled end event, queues the sample (node, start, end, t0_ns, t1_ns,\n"
"step, thread id), harvests every HARVEST_BATCH samples (never blocking), pops the NVTX\n"
"range. False: nothing was done, the caller runs Timer._exit.");

static PyObject *
fast_exit(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (bad_nargs(nargs, 2, "fast_exit(region, get_stream)")) {
        return NULL;
    }
    PyObject *region = args[0], *get_stream = args[1];
    PyObject *t1 = now_ns();
    if (t1 == NULL) {
        return NULL;
    }
    PyObject *timer = NULL, *local = NULL, *stack = NULL, *frame = NULL, *key = NULL;
    PyObject *entry_key = NULL, *end = NULL, *pending = NULL, *step = NULL, *tid = NULL;
    PyObject *sample = NULL, *check_at = NULL, *result = NULL;
    int t = 0;

    if (cfg_entry_type == NULL) {
        goto fallback_or_error;
    }
    if ((timer = PyObject_GetAttr(region, str_timer)) == NULL
        || (local = PyObject_GetAttr(timer, str_local)) == NULL
        || (stack = PyObject_GetAttr(local, str_stack)) == NULL) {
        goto done;
    }
    if (!PyList_Check(stack) || PyList_GET_SIZE(stack) == 0) {
        goto fallback_or_error;
    }
    Py_ssize_t depth = PyList_GET_SIZE(stack);
    frame = PyList_GET_ITEM(stack, depth - 1);
    Py_INCREF(frame);
    if (!PyTuple_Check(frame) || PyTuple_GET_SIZE(frame) != 5
        || PyTuple_GET_ITEM(frame, 0) != region
        || (PyObject *)Py_TYPE(PyTuple_GET_ITEM(frame, 2)) != cfg_entry_type) {
        goto fallback_or_error;
    }
    PyObject *entry = PyTuple_GET_ITEM(frame, 2); /* held by frame */
    if ((t = attr_true(region, str_streams)) != 0) {
        t = t < 0 ? -1 : 0;
        goto fallback_or_error;
    }
    if ((key = PyObject_CallOneArg(get_stream, minus_one)) == NULL
        || (entry_key = PyObject_GetAttr(entry, str_key)) == NULL) {
        goto done;
    }
    if ((t = PyObject_RichCompareBool(key, entry_key, Py_EQ)) <= 0) {
        t = t < 0 ? -1 : 0;
        goto fallback_or_error;
    }
    /* Committed: from here on the frame is gone and the NVTX range is popped whatever
     * happens (as Region.__exit__'s try/finally does). */
    if (PyList_SetSlice(stack, depth - 1, depth, NULL) < 0) {
        goto done;
    }
    end = take_record(NULL, entry);
    if (end == NULL) {
        goto pop_nvtx;
    }
    if ((pending = PyObject_GetAttr(entry, str_pending)) == NULL
        || (step = PyObject_GetAttr(timer, str_step)) == NULL
        || (tid = PyObject_GetAttr(stack, str_tid)) == NULL) {
        goto pop_nvtx;
    }
    sample = PyTuple_Pack(7, PyTuple_GET_ITEM(frame, 1), PyTuple_GET_ITEM(frame, 3), end,
                          PyTuple_GET_ITEM(frame, 4), t1, step, tid);
    if (sample == NULL) {
        goto pop_nvtx;
    }
    PyObject *r = PyObject_CallMethodOneArg(pending, str_append, sample);
    if (r == NULL) {
        goto pop_nvtx;
    }
    Py_DECREF(r);
    Py_ssize_t n = PyObject_Size(pending);
    if (n < 0 || (check_at = PyObject_GetAttr(entry, str_check_at)) == NULL) {
        goto pop_nvtx;
    }
    Py_ssize_t at = PyLong_AsSsize_t(check_at);
    if (at == -1 && PyErr_Occurred()) {
        goto pop_nvtx;
    }
    if (n >= at) {
        r = PyObject_CallMethodOneArg(cfg_backend, str_try_harvest, entry);
        if (r == NULL) {
            goto pop_nvtx;
        }
        Py_DECREF(r);
    }
pop_nvtx:
    /* Reached with an exception set on every error path: nvtx_pop then keeps it, returns -1. */
    t = nvtx_pop(region) < 0 ? -1 : 1;
fallback_or_error:
    result = answer(t);
done:
    Py_DECREF(t1);
    Py_XDECREF(timer);
    Py_XDECREF(local);
    Py_XDECREF(stack);
    Py_XDECREF(frame);
    Py_XDECREF(key);
    Py_XDECREF(entry_key);
    Py_XDECREF(end);
    Py_XDECREF(pending);
    Py_XDECREF(step);
    Py_XDECREF(tid);
    Py_XDECREF(sample);
    Py_XDECREF(check_at);
    return result;
}


/* seq.append(value) (a list, an array, a deque); 0 or -1. */
static int
append_to(PyObject *seq, PyObject *value)
{
    if (PyList_CheckExact(seq)) {
        return PyList_Append(seq, value);
    }
    PyObject *r = PyObject_CallMethodOneArg(seq, str_append, value);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* HistBuilder.add written out: append to the raw buffer, fold when FOLD values wait. */
static int
hist_add(PyObject *acc, PyObject *which, PyObject *value)
{
    PyObject *hist = PyObject_GetAttr(acc, which);
    if (hist == NULL) {
        return -1;
    }
    PyObject *raw = PyObject_GetAttr(hist, str_raw_buf);
    int rc = -1;
    if (raw != NULL && append_to(raw, value) == 0) {
        Py_ssize_t n = PyObject_Size(raw);
        if (n >= 0) {
            rc = 0;
            if (n >= cfg_fold) {
                PyObject *r = PyObject_CallMethodNoArgs(hist, str_fold);
                rc = r != NULL ? 0 : -1;
                Py_XDECREF(r);
            }
        }
    }
    Py_XDECREF(raw);
    Py_DECREF(hist);
    return rc;
}

/* Timer._record for a plain sample, written out (_Node.add, the step series, the trace
 * ring). 1: its events were kept by the trace ring; 0: the caller returns them to the pool;
 * -1: error. Anything unusual (a first sample of a node on this clock) calls the Python
 * method, so the two never disagree on what is stored. */
static int
record_sample(PyObject *node, PyObject *clock, PyObject *gpu, PyObject *cpu, PyObject *step,
              PyObject *t0, PyObject *tid, PyObject *entry, PyObject *start, PyObject *end)
{
    PyObject *owner = NULL, *gen = NULL, *owner_gen = NULL, *stats = NULL, *calls = NULL;
    PyObject *calls1 = NULL, *keep = NULL, *last = NULL, *series = NULL, *ntrace = NULL;
    PyObject *ring = NULL, *old = NULL, *path = NULL, *item = NULL;
    int rc = -1;

    if ((owner = PyObject_GetAttr(node, str_owner)) == NULL
        || (gen = PyObject_GetAttr(node, str_gen)) == NULL
        || (owner_gen = PyObject_GetAttr(owner, str_gen_private)) == NULL) {
        goto done;
    }
    int same = PyObject_RichCompareBool(gen, owner_gen, Py_EQ);
    if (same <= 0) {
        rc = same < 0 ? -1 : 0; /* recorded before reset(): discarded */
        goto done;
    }
    if ((stats = PyObject_GetAttr(node, str_stats)) == NULL) {
        goto done;
    }
    PyObject *acc = PyDict_Check(stats) ? PyDict_GetItemWithError(stats, clock) : NULL;
    if (acc == NULL) {
        if (PyErr_Occurred()) {
            goto done;
        }
        PyObject *argv[] = {owner, node, clock, gpu, cpu, step, Py_False, t0, tid, entry,
                            start, end};
        PyObject *r = PyObject_VectorcallMethod(str_record, argv,
                                                12 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (r != NULL) {
            rc = PyObject_IsTrue(r);
            Py_DECREF(r);
        }
        goto done;
    }
    Py_INCREF(acc);
    if ((calls = PyObject_GetAttr(acc, str_calls)) == NULL
        || (calls1 = PyNumber_Add(calls, one)) == NULL
        || PyObject_SetAttr(acc, str_calls, calls1) < 0 || hist_add(acc, str_gpu, gpu) < 0
        || hist_add(acc, str_cpu, cpu) < 0) {
        Py_DECREF(acc);
        goto done;
    }
    Py_DECREF(acc);
    if ((keep = PyObject_GetAttr(owner, str_keep_steps)) == NULL) {
        goto done;
    }
    int keeping = PyObject_IsTrue(keep);
    if (keeping < 0) {
        goto done;
    }
    if (keeping) {
        if ((last = PyObject_GetAttr(node, str_last)) == NULL) {
            goto done;
        }
        int hit = 0;
        if (PyTuple_Check(last) && PyTuple_GET_SIZE(last) == 3) {
            hit = PyObject_RichCompareBool(PyTuple_GET_ITEM(last, 0), step, Py_EQ);
            if (hit > 0) {
                hit = PyObject_RichCompareBool(PyTuple_GET_ITEM(last, 1), clock, Py_EQ);
            }
            if (hit < 0) {
                goto done;
            }
        }
        if (hit) {
            series = PyTuple_GET_ITEM(last, 2);
            Py_INCREF(series);
        }
        else {
            PyObject *argv[] = {owner, node, clock, step};
            series = PyObject_VectorcallMethod(str_series, argv,
                                               4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (series == NULL) {
                goto done;
            }
        }
        if (!PyTuple_Check(series) || PyTuple_GET_SIZE(series) != 2) {
            PyErr_SetString(PyExc_TypeError, "cudatimer: a step series is a pair of arrays");
            goto done;
        }
        if (append_to(PyTuple_GET_ITEM(series, 0), gpu) < 0
            || append_to(PyTuple_GET_ITEM(series, 1), cpu) < 0) {
            goto done;
        }
    }
    if ((ntrace = PyObject_GetAttr(owner, str_trace_samples)) == NULL) {
        goto done;
    }
    Py_ssize_t cap = PyLong_AsSsize_t(ntrace);
    if (cap == -1 && PyErr_Occurred()) {
        goto done;
    }
    if (cap <= 0) {
        rc = 0;
        goto done;
    }
    if ((ring = PyObject_GetAttr(owner, str_trace)) == NULL) {
        goto done;
    }
    Py_ssize_t size = PyObject_Size(ring);
    if (size < 0) {
        goto done;
    }
    if (size >= cap) {
        if ((old = PyObject_CallMethodNoArgs(ring, str_popleft)) == NULL) {
            goto done;
        }
        /* (path, clock, entry, start, end, ...): give the old sample's events back. */
        if (PyTuple_Check(old) && PyTuple_GET_SIZE(old) >= 5
            && PyTuple_GET_ITEM(old, 2) != Py_None) {
            PyObject *old_pool = PyObject_GetAttr(PyTuple_GET_ITEM(old, 2), str_pool);
            int bad = old_pool == NULL || append_to(old_pool, PyTuple_GET_ITEM(old, 3)) < 0
                      || append_to(old_pool, PyTuple_GET_ITEM(old, 4)) < 0;
            Py_XDECREF(old_pool);
            if (bad) {
                goto done;
            }
        }
    }
    if ((path = PyObject_GetAttr(node, str_path)) == NULL) {
        goto done;
    }
    item = PyTuple_Pack(9, path, clock, entry, start, end, t0, cpu, step, tid);
    if (item == NULL || append_to(ring, item) < 0) {
        goto done;
    }
    rc = start != Py_None;
done:
    Py_XDECREF(owner);
    Py_XDECREF(gen);
    Py_XDECREF(owner_gen);
    Py_XDECREF(stats);
    Py_XDECREF(calls);
    Py_XDECREF(calls1);
    Py_XDECREF(keep);
    Py_XDECREF(last);
    Py_XDECREF(series);
    Py_XDECREF(ntrace);
    Py_XDECREF(ring);
    Py_XDECREF(old);
    Py_XDECREF(path);
    Py_XDECREF(item);
    return rc;
}

/* GPU milliseconds from start to end as a new float, or NULL with an error set. */
static PyObject *
elapsed_float(PyObject *start, PyObject *end)
{
    PyObject *argv[] = {start, end};
    return elapsed_ms(NULL, argv, 2);
}

PyDoc_STRVAR(resolve_doc,
"resolve(entry, ready, slow)\\n\n"
"Backend.harvest's loop over the `ready` oldest pending samples of entry (all complete):\n"
"GPU time, statistics, step series and trace ring as Timer._record does, events back to\n"
"the pool. Samples ending on several streams go to slow(entry, sample), the Python version\n"
"of one iteration, which returns False when it put the sample back (stop there). A sample\n"
"whose events are not readable yet is put back and the loop stops, like the Python one.");

static PyObject *
resolve(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (bad_nargs(nargs, 3, "resolve(entry, ready, slow)")) {
        return NULL;
    }
    PyObject *entry = args[0], *slow = args[2];
    Py_ssize_t ready = PyLong_AsSsize_t(args[1]);
    if (ready == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *pend = PyObject_GetAttr(entry, str_pending);
    PyObject *pool = pend != NULL ? PyObject_GetAttr(entry, str_pool) : NULL;
    PyObject *clock = pool != NULL ? PyObject_GetAttr(entry, str_clock) : NULL;
    PyObject *result = NULL;
    if (clock == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < ready; i++) {
        PyObject *sample = PyObject_CallMethodNoArgs(pend, str_popleft);
        if (sample == NULL) {
            goto done;
        }
        if (!PyTuple_CheckExact(sample) || PyTuple_GET_SIZE(sample) != 7
            || (PyObject *)Py_TYPE(PyTuple_GET_ITEM(sample, 2)) == cfg_ends_type) {
            PyObject *r = PyObject_CallFunctionObjArgs(slow, entry, sample, NULL);
            Py_DECREF(sample);
            if (r == NULL) {
                goto done;
            }
            int go_on = PyObject_IsTrue(r);
            Py_DECREF(r);
            if (go_on < 0) {
                goto done;
            }
            if (!go_on) {
                break;
            }
            continue;
        }
        PyObject *node = PyTuple_GET_ITEM(sample, 0), *start = PyTuple_GET_ITEM(sample, 1);
        PyObject *end = PyTuple_GET_ITEM(sample, 2), *t0 = PyTuple_GET_ITEM(sample, 3);
        PyObject *t1 = PyTuple_GET_ITEM(sample, 4), *step = PyTuple_GET_ITEM(sample, 5);
        PyObject *tid = PyTuple_GET_ITEM(sample, 6);
        PyObject *gpu = elapsed_float(start, end);
        if (gpu == NULL) {
            if (PyErr_ExceptionMatches(PyExc_RuntimeError)
                || PyErr_ExceptionMatches(PyExc_ValueError)) {
                /* Two threads appended out of record order: this one is not done yet. */
                PyErr_Clear();
                PyObject *r = PyObject_CallMethodOneArg(pend, str_appendleft, sample);
                Py_DECREF(sample);
                if (r == NULL) {
                    goto done;
                }
                Py_DECREF(r);
                break;
            }
            Py_DECREF(sample);
            goto done;
        }
        long long a = PyLong_AsLongLong(t0), b = PyLong_AsLongLong(t1);
        PyObject *cpu = PyErr_Occurred() ? NULL : PyFloat_FromDouble((double)(b - a) * 1e-6);
        int kept = cpu != NULL
                       ? record_sample(node, clock, gpu, cpu, step, t0, tid, entry, start, end)
                       : -1;
        Py_DECREF(gpu);
        Py_XDECREF(cpu);
        if (kept == 0 && (append_to(pool, start) < 0 || append_to(pool, end) < 0)) {
            kept = -1;
        }
        Py_DECREF(sample);
        if (kept < 0) {
            goto done;
        }
    }
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(pend);
    Py_XDECREF(pool);
    Py_XDECREF(clock);
    return result;
}

static PyMethodDef methods[] = {
    {"load", load, METH_NOARGS, load_doc},
    {"runtime_path", runtime_path, METH_NOARGS, runtime_path_doc},
    {"take_record", take_record, METH_O, take_record_doc},
    {"elapsed_ms", (PyCFunction)(void (*)(void))elapsed_ms, METH_FASTCALL, elapsed_ms_doc},
    {"configure", configure, METH_VARARGS, configure_doc},
    {"resolve", (PyCFunction)(void (*)(void))resolve, METH_FASTCALL, resolve_doc},
    {"fast_enter", (PyCFunction)(void (*)(void))fast_enter, METH_FASTCALL, fast_enter_doc},
    {"fast_exit", (PyCFunction)(void (*)(void))fast_exit, METH_FASTCALL, fast_exit_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "cudatimer._speedups",
    "Compiled hot path of cudatimer: pooled event records and elapsed times through the CUDA "
    "runtime torch loaded. Optional: without it cudatimer runs the same logic in Python.",
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
    str_pool = PyUnicode_InternFromString("pool");
    str_raw = PyUnicode_InternFromString("raw");
    str_event_id = PyUnicode_InternFromString("event_id");
    str_take_recorded = PyUnicode_InternFromString("take_recorded");
    str_elapsed_time = PyUnicode_InternFromString("elapsed_time");
    if (str_pool == NULL || str_raw == NULL || str_event_id == NULL || str_take_recorded == NULL
        || str_elapsed_time == NULL) {
        return NULL;
    }
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&str_fast, "fast"},         {&str_timer, "timer"},       {&str_enabled, "_enabled"},
        {&str_state, "state"},       {&str_local, "_local"},      {&str_stack, "stack"},
        {&str_root, "_root"},        {&str_children, "children"}, {&str_name, "name"},
        {&str_child, "child"},       {&str_nvtx, "nvtx"},         {&str_domain, "domain"},
        {&str_attrs, "attrs"},       {&str_push, "push"},         {&str_pop, "pop"},
        {&str_streams, "streams"},   {&str_key, "key"},           {&str_pending, "pending"},
        {&str_append, "append"},     {&str_check_at, "check_at"}, {&str_step, "_step"},
        {&str_tid, "tid"},           {&str_try_harvest, "try_harvest"},
        {&str_popleft, "popleft"},   {&str_appendleft, "appendleft"},
        {&str_clock, "clock"},       {&str_owner, "owner"},       {&str_gen, "gen"},
        {&str_gen_private, "_gen"},  {&str_stats, "stats"},       {&str_calls, "calls"},
        {&str_gpu, "gpu"},           {&str_cpu, "cpu"},           {&str_fold, "fold"},
        {&str_raw_buf, "raw"},       {&str_keep_steps, "keep_steps"},
        {&str_last, "last"},         {&str_series, "_series"},
        {&str_trace_samples, "trace_samples"},                    {&str_trace, "_trace"},
        {&str_path, "path"},         {&str_record, "_record"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL) {
            return NULL;
        }
    }
    if ((one = PyLong_FromLong(1)) == NULL) {
        return NULL;
    }
    if ((minus_one = PyLong_FromLong(-1)) == NULL) {
        return NULL;
    }
    return PyModule_Create(&module_def);
}
