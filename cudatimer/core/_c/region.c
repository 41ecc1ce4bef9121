/* Part of cudatimer.core._speedups (RegionBase: the hot path (enter/exit of the common case) and detached calls). Not compiled on its own:
 * _speedups.c includes every part, in order, into one translation unit. */

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
"bind($self, /, store, fast, name, push, attrs, pop, enter, exit, start=None, end=None)\n"
"--\n\n"
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
"open_at($self, slot, gen, /)\n--\n\n"
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
"close($self, frame, /)\n--\n\n"
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
    {"__enter__", (PyCFunction)region_enter, METH_NOARGS,
     "__enter__($self, /)\n--\n\nOpen the region."},
    {"__exit__", (PyCFunction)(void (*)(void))region_exit, METH_FASTCALL,
     "__exit__($self, exc_type, exc, tb, /)\n--\n\nClose the region."},
    {"bind", (PyCFunction)(void (*)(void))region_bind, METH_VARARGS | METH_KEYWORDS,
     region_bind_doc},
    {"open_at", (PyCFunction)(void (*)(void))region_open_at, METH_FASTCALL, region_open_at_doc},
    {"close", (PyCFunction)region_close, METH_O, region_close_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RegionBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudatimer.core._speedups.RegionBase",
    .tp_doc = PyDoc_STR("RegionBase()\n--\n\nBase of cudatimer.Region: __enter__/__exit__ for "
                        "the common case, the general hooks given to bind for everything else."),
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

/* NullRegion.__call__ as a method too, beside the tp_call slot that calls run through, so that
 * it has a signature to read (a slot's wrapper reads as (*args, **kwargs)); METH_COEXIST puts
 * it in the type's dict in place of that wrapper. */
static PyObject *
null_call_m(PyObject *self, PyObject *fn)
{
    (void)self;
    return Py_NewRef(fn);
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
    {"__enter__", (PyCFunction)null_enter, METH_NOARGS, "__enter__($self, /)\n--\n\nNothing."},
    {"__exit__", (PyCFunction)(void (*)(void))null_exit, METH_FASTCALL,
     "__exit__($self, /, *exc)\n--\n\nNothing."},
    {"__call__", (PyCFunction)null_call_m, METH_O | METH_COEXIST,
     "__call__($self, fn, /)\n--\n\nfn itself: a decorated function comes back unchanged."},
    /* a backward=True region's backward_from(*tensors): nothing either */
    {"backward_from", (PyCFunction)(void (*)(void))null_exit, METH_FASTCALL,
     "backward_from($self, /, *outputs)\n--\n\nNothing either."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject NullRegionType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudatimer.core._speedups.NullRegion",
    .tp_doc = PyDoc_STR("NullRegion()\n--\n\nWhat regions become under CUDATIMER_DISABLE: "
                        "nothing on enter, exit or call (a decorated function comes back "
                        "unchanged)."),
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_call = null_call,
    .tp_methods = null_methods,
    .tp_getset = null_getset,
};

