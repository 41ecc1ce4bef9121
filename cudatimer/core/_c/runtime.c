/* Part of cudatimer.core._speedups (the binding to the CUDA runtime torch loaded (dlsym of its libcudart)). Not compiled on its own:
 * _speedups.c includes every part, in order, into one translation unit. */

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
"load($module, /)\n--\n\n"
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
"runtime_path($module, /)\n--\n\n"
"The path of the CUDA runtime library bound by load(), or None.");

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

