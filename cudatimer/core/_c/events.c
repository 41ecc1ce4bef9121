/* Part of cudatimer.core._speedups (events: pooled records and reads, with the Python fallbacks). Not compiled on its own:
 * _speedups.c includes every part, in order, into one translation unit. */

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

