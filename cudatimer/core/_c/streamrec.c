/* Part of cudatimer.core._speedups (StreamRec: a stream some region ran on (event pool, pending samples, anchors)). Not compiled on its own:
 * _speedups.c includes every part, in order, into one translation unit. */

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
"take($self, /, torch_record=False)\n--\n\n"
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
"push($self, /, store, slot, gen, start, end, extra, t0, t1, step, tid)\n--\n\n"
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
    {"give", (PyCFunction)rec_give_m, METH_O,
     "give($self, event, /)\n--\n\nGive an event back to the pool."},
    {"push", (PyCFunction)(void (*)(void))rec_push_m, METH_VARARGS | METH_KEYWORDS,
     rec_push_doc},
    {"harvest", (PyCFunction)rec_harvest_m, METH_NOARGS,
     "harvest($self, /)\n--\n\nResolve every finished sample, never blocking on the GPU."},
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
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudatimer.core._speedups.StreamRec",
    .tp_doc = PyDoc_STR("StreamRec(key, stream, raw, make_event)\n--\n\nA stream regions ran "
                        "on: event pool, pending samples, trace reference and anchor."),
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

