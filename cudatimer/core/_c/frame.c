/* Part of cudatimer.core._speedups (Frame: one open region call, as Python sees it). Not compiled on its own:
 * _speedups.c includes every part, in order, into one translation unit. */

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
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudatimer.core._speedups.Frame",
    .tp_doc = PyDoc_STR("Frame(region, slot, gen, kind, rec=None, start=None, t0_ns=0, dev=-1, "
                        "range_id=None)\n--\n\nOne open region call."),
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

