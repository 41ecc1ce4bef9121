/* Part of cudatimer.core._speedups (module functions (settings, the registry of streams, drain) and the module itself). Not compiled on its own:
 * _speedups.c includes every part, in order, into one translation unit. */

/* ======================================================================================
 * Module functions: settings, the registry of streams, drain
 * ====================================================================================== */

PyDoc_STRVAR(configure_doc,
"configure($module, /, *, inv_log_gamma, harvest_batch, anchor_hop_ms, prewarm)\n--\n\n"
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
"set_stream_getter($module, /, getter, c10)\n--\n\n"
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
"current_stream($module, /)\n--\n\n"
"(stream id, device, device type) of the current stream as c10 reports it to the hot path;\n"
"None when that symbol is not bound. Compare it with torch's once before passing c10=True to\n"
"set_stream_getter.");

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
"new_stream($module, key, stream, raw, make_event, /)\n--\n\n"
"Make, register and return the record of key (replacing one of the same key); a default\n"
"stream's (stream id 0, device type 1) also serves the hot path of its device.");

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
"forget_streams($module, /, grave=None)\n--\n\n"
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
"drain($module, timeout_s, /)\n--\n\n"
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
     "runtime_bound($module, /)\n--\n\n"
     "True when events are recorded through the CUDA runtime directly."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     configure_doc},
    {"set_stream_getter", (PyCFunction)(void (*)(void))set_stream_getter,
     METH_VARARGS | METH_KEYWORDS, set_stream_getter_doc},
    {"set_usable", set_usable, METH_O,
     "set_usable($module, on, /)\n--\n\n"
     "Whether CUDA is in use: the hot path records events only then."},
    {"now_ns", now_ns, METH_NOARGS,
     "now_ns($module, /)\n--\n\nThe host clock of every sample (CLOCK_MONOTONIC), in ns."},
    {"current_stream", current_stream, METH_NOARGS, current_stream_doc},
    {"stream_of", stream_of, METH_O,
     "stream_of($module, key, /)\n--\n\nThe record of a stream key, or None."},
    {"new_stream", (PyCFunction)(void (*)(void))new_stream, METH_FASTCALL, new_stream_doc},
    {"all_streams", all_streams, METH_NOARGS,
     "all_streams($module, /)\n--\n\nEvery registered stream record."},
    {"forget_streams", (PyCFunction)(void (*)(void))forget_streams,
     METH_VARARGS | METH_KEYWORDS, forget_streams_doc},
    {"pending_total", pending_total, METH_NOARGS,
     "pending_total($module, /)\n--\n\nSamples of every stream not resolved yet."},
    {"clear_pending", clear_pending, METH_NOARGS,
     "clear_pending($module, /)\n--\n\n"
     "Drop every pending sample without waiting (interpreter exit)."},
    {"drain", drain, METH_O, drain_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "cudatimer.core._speedups",
    "The recorder core in C (the contract of cudatimer.core._core.pyi; the reference is\n"
    "cudatimer.core._core_py). Event records and reads through the CUDA runtime torch loaded.",
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
