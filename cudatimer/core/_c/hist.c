/* Part of cudatimer.core._speedups (histograms: the buckets of records._hist.HistBuilder). Not compiled on its own:
 * _speedups.c includes every part, in order, into one translation unit. */

/* ======================================================================================
 * Histograms: the buckets of _hist.HistBuilder, ceil(inv_log_gamma * log(x)) for x > 0,
 * values <= 0 counted as zeros. Per-value updates here (~5 ns); the reference batches 256
 * values through math.fsum, so `total` may differ in its last bits, nothing else.
 * ====================================================================================== */
typedef struct {
    int64_t count, zeros;
    double total, min, max;
    int32_t lo, n; /* buckets b[0..n) hold indices lo..lo+n-1 */
    int64_t *b;
    /* The bucket of the last value and the least and largest values seen in it: the bucket
     * of x is monotonic in x, so any x in [seen_lo, seen_hi] is in it without a log (a
     * steady duration repeats its bucket: ~1/3 of a graph replay's fold on an EPYC host). */
    int32_t last;
    double seen_lo, seen_hi;
} CHist;

static void
hist_init(CHist *h)
{
    memset(h, 0, sizeof(*h));
    h->min = Py_HUGE_VAL;
    h->max = -Py_HUGE_VAL;
    h->seen_lo = Py_HUGE_VAL;
    h->seen_hi = -Py_HUGE_VAL;
}

/* k values of 0.0 at once (a graph replay's CPU time): what k hist_add(h, 0.0) would do. */
static void
hist_zeros(CHist *h, int64_t k)
{
    if (k > 0) {
        h->count += k;
        h->zeros += k;
        if (0.0 < h->min) {
            h->min = 0.0;
        }
        if (0.0 > h->max) {
            h->max = 0.0;
        }
    }
}

/* Count, total, min and max of one value (every value, zeros too). */
static inline void
hist_moments(CHist *h, double x)
{
    h->count++;
    h->total += x;
    if (x < h->min) {
        h->min = x;
    }
    if (x > h->max) {
        h->max = x;
    }
}

/* One more value in bucket i (grown to reach it). */
static int
hist_bucket(CHist *h, int32_t i)
{
    if (h->n == 0 || i < h->lo || i >= h->lo + h->n) {
        /* A steady duration touches a handful of buckets: grow to the exact span. */
        int32_t lo = h->n ? (i < h->lo ? i : h->lo) : i;
        int32_t hi = h->n ? (i >= h->lo + h->n ? i + 1 : h->lo + h->n) : i + 1;
        int64_t *b = PyMem_Calloc((size_t)(hi - lo), sizeof(int64_t));
        if (b == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        if (h->n) {
            memcpy(b + (h->lo - lo), h->b, (size_t)h->n * sizeof(int64_t));
        }
        PyMem_Free(h->b);
        h->b = b;
        h->lo = lo;
        h->n = hi - lo;
    }
    h->b[i - h->lo]++;
    return 0;
}

/* The bucket of x > 0: the last bucket's when x lies in its seen range, else by the log. */
static inline int32_t
hist_index(CHist *h, double x)
{
    if (x >= h->seen_lo && x <= h->seen_hi) {
        return h->last;
    }
    int32_t i = (int32_t)ceil(g_inv_log_gamma * log(x));
    if (i == h->last && h->seen_lo <= h->seen_hi) {
        h->seen_lo = x < h->seen_lo ? x : h->seen_lo;
        h->seen_hi = x > h->seen_hi ? x : h->seen_hi;
    }
    else {
        h->last = i;
        h->seen_lo = h->seen_hi = x;
    }
    return i;
}

static int
hist_add(CHist *h, double x)
{
    hist_moments(h, x);
    if (!(x > 0.0)) {
        h->zeros++;
        return 0;
    }
    return hist_bucket(h, hist_index(h, x));
}

/* Buckets of whole nanoseconds. A graph replay's durations are integers of the GPU clock
 * (tb - ta ns, folded as (tb - ta) * 1e-6 ms), and a duration under NS_TABLE ns takes its
 * bucket from a table built with the very expression hist_add computes, so the bucket is the
 * same bit for bit: the log was ~15 of the ~27 ns a graph sample took to fold on an H200
 * host, with region times of a few us jittering across buckets 1% wide. Built at the first
 * fold after configure() (32768 logs, ~0.5 ms), 128 KiB. */
#define NS_TABLE 32768
static int32_t *g_ns_bucket = NULL;
static double g_ns_inv = 0.0; /* the inv_log_gamma the table was built with */

static int
ns_table_ready(void)
{
    if (g_ns_bucket != NULL && g_ns_inv == g_inv_log_gamma) {
        return 0;
    }
    if (g_ns_bucket == NULL && (g_ns_bucket = PyMem_Malloc(NS_TABLE * sizeof(int32_t))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    g_ns_bucket[0] = 0; /* never read: a zero duration is a zero */
    for (int64_t d = 1; d < NS_TABLE; d++) {
        g_ns_bucket[d] = (int32_t)ceil(g_inv_log_gamma * log((double)d * 1e-6));
    }
    g_ns_inv = g_inv_log_gamma;
    return 0;
}

/* hist_add(h, d * 1e-6) for a duration of d whole ns. */
static inline int
hist_add_ns(CHist *h, int64_t d)
{
    double x = (double)d * 1e-6;
    hist_moments(h, x);
    if (d <= 0) {
        h->zeros++;
        return 0;
    }
    return hist_bucket(h, d < NS_TABLE ? g_ns_bucket[d] : hist_index(h, x));
}

static void
hist_free(CHist *h)
{
    PyMem_Free(h->b);
    h->b = NULL;
    h->n = 0;
}

