/*
 * cudatimer.core._speedups: the recorder core in C, the compiled implementation of the contract in
 * _core.pyi (the plain-Python reference is _core_py.py; the two give the same results and the
 * tests hold them to it). Event records and reads go through the CUDA runtime torch loaded.
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
 * Every event operation falls back to the event's Python method (record(stream), query(),
 * elapsed_time(other)) whenever the runtime is absent, an event has no CUDA handle yet, or the
 * runtime returns an error, so errors surface with torch's own messages and nothing is
 * recorded twice or lost. The fake GPU of the CPU tests runs through those methods.
 *
 * Every input comes as a typed argument (configure, set_stream_getter, Store, StreamRec,
 * RegionBase.bind); nothing here reads attributes of cudatimer's own Python objects.
 *
 * Every function, method and type opens its docstring with its signature in CPython's
 * "name($self, a, /, b=None)\n--\n\n" form, which inspect.signature reads: the tests hold it
 * to _core.pyi and to the keyword lists and flags that the code below parses by.
 *
 * Everything runs under the GIL (no lock of its own). Python callbacks (make_event, a Store's
 * child, the stream getter, event methods of fake events, NVTX push/pop) may run any Python
 * code, so state is re-read after each of them and no pointer into an array that such code
 * could reallocate is held across one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h> /* first, as Python asks; its pyconfig.h defines _GNU_SOURCE on Linux */

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>
#include <time.h>

#if defined(__linux__)
#include <dlfcn.h>
#include <link.h>
#define CUDATIMER_HAVE_DL 1
#endif

/* The parts, one file per contract class, included in this order into one translation unit:
 * each part uses the static helpers and structs of the parts before it, and one unit keeps
 * every helper static (inlined where the compiler sees fit), as when the core was one file.
 * setup.py builds this file alone; MANIFEST.in ships the parts. */
#include "_c/runtime.c" /* the binding to the CUDA runtime torch loaded (dlsym of its libcudart) */
#include "_c/settings.c" /* settings given by configure() and small helpers (buffers, NVTX calls) */
#include "_c/hist.c" /* histograms: the buckets of records._hist.HistBuilder */
#include "_c/types.c" /* the C structs every part shares (frames, pending samples, accumulators, caches) */
#include "_c/events.c" /* events: pooled records and reads, with the Python fallbacks */
#include "_c/frame.c" /* Frame: one open region call, as Python sees it */
#include "_c/stack.c" /* Stack: a thread's open regions of one store */
#include "_c/streamrec.c" /* StreamRec: a stream some region ran on (event pool, pending samples, anchors) */
#include "_c/store.c" /* Store: everything one Timer recorded (statistics, series, trace, snapshot) */
#include "_c/region.c" /* RegionBase: the hot path (enter/exit of the common case) and detached calls */
#include "_c/module.c" /* module functions (settings, the registry of streams, drain) and the module itself */
