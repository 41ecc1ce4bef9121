/* Part of cudatimer.core._speedups (Stack: a thread's open regions of one store). Not compiled on its own:
 * _speedups.c includes every part, in order, into one translation unit. */

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
"bury($self, grave, /)\n--\n\n"
"In a forked child: frames timed with events of the parent become HOST frames (rec and\n"
"start None); their start events go into grave, never released.");

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
    {"push", (PyCFunction)stack_push_m, METH_O,
     "push($self, frame, /)\n--\n\nPush a Frame (innermost)."},
    {"pop", (PyCFunction)stack_pop_m, METH_NOARGS,
     "pop($self, /)\n--\n\nThe innermost frame, removed (IndexError when empty)."},
    {"top", (PyCFunction)stack_top_m, METH_NOARGS,
     "top($self, /)\n--\n\nThe innermost frame, or None."},
    {"take", (PyCFunction)stack_take_m, METH_O,
     "take($self, region, /)\n--\n\n"
     "Remove and return the innermost frame of region (None if it has none)."},
    {"frames", (PyCFunction)stack_frames_m, METH_NOARGS,
     "frames($self, /)\n--\n\nThe frames, outermost first."},
    {"clear", (PyCFunction)stack_clear_m, METH_NOARGS,
     "clear($self, /)\n--\n\nDrop every frame."},
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
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudatimer.core._speedups.Stack",
    .tp_doc = PyDoc_STR("Stack()\n--\n\nA thread's open regions of one store, innermost last."),
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

