/*
 * Test-only NVTX v3 injection library: logs every NVTX call as one JSON line.
 *
 * NVTX finds it through NVTX_INJECTION64_PATH at the first NVTX call of a process and calls
 * InitializeInjectionNvtx2 once per NVTX instance (torch and the nvtx package each carry one),
 * so initialisation fills the callback slots of the calling instance every time but opens the
 * log only once. Lines go to the file named by CUDATIMER_NVTX_LOG (stderr when unset), written
 * under a mutex and flushed at once so that several threads, or a crash, never garble a line.
 *
 * Built by tests/helpers/nvtx_harness.py against the NVTX headers of the nvidia-nvtx wheel or a CUDA
 * toolkit; the headers are not part of this repository. Written from the types documented in
 * nvToolsExt.h and nvtxDetail/nvtxTypes.h.
 */
#define _GNU_SOURCE
#define NVTX_NO_IMPL /* a tool needs the types, not the header-only implementation */
#include <nvtx3/nvToolsExt.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <wchar.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- shared state (one copy per process, whatever the number of NVTX instances) ---- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static FILE *g_log = NULL;
static uint64_t g_seq = 0;
static uint64_t g_next_range_id = 1; /* 0 is never a valid nvtxRangeId_t for us */

/* Handles are indexes + 1 into these tables, so a handle we did not hand out resolves to NULL
 * instead of being dereferenced. */
typedef struct {
    char **items;
    size_t len, cap;
} str_table;
static str_table g_domains = {0};
static str_table g_strings = {0};

/* Push depth per thread, to return the level NVTX documents for push/pop. */
static __thread int t_depth = 0;

static void lock_before_fork(void) { pthread_mutex_lock(&g_lock); }
static void unlock_after_fork(void) { pthread_mutex_unlock(&g_lock); }

static void open_log_once(void) {
    const char *path = getenv("CUDATIMER_NVTX_LOG");
    if (path != NULL && path[0] != '\0') g_log = fopen(path, "a");
    if (g_log == NULL) g_log = stderr;
    /* A fork while another thread writes would leave the child's copy of the mutex locked. */
    pthread_atfork(lock_before_fork, unlock_after_fork, unlock_after_fork);
}

static char *dup_ascii(const char *s) { return strdup(s != NULL ? s : ""); }

/* Wide strings only appear through the W entry points; keep ASCII, replace the rest. */
static char *dup_wide(const wchar_t *w) {
    if (w == NULL) return strdup("");
    size_t n = wcslen(w);
    char *out = malloc(n + 1);
    if (out == NULL) return NULL;
    for (size_t i = 0; i < n; ++i) out[i] = (w[i] > 0 && w[i] < 0x80) ? (char)w[i] : '?';
    out[n] = '\0';
    return out;
}

/* Takes ownership of s. Caller holds g_lock. Returns the handle value (index + 1), 0 on OOM. */
static uintptr_t table_add(str_table *t, char *s, int dedupe) {
    if (s == NULL) return 0;
    if (dedupe) {
        for (size_t i = 0; i < t->len; ++i) {
            if (strcmp(t->items[i], s) == 0) {
                free(s);
                return (uintptr_t)(i + 1);
            }
        }
    }
    if (t->len == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        char **items = realloc(t->items, cap * sizeof(char *));
        if (items == NULL) {
            free(s);
            return 0;
        }
        t->items = items;
        t->cap = cap;
    }
    t->items[t->len++] = s;
    return (uintptr_t)t->len;
}

/* Caller holds g_lock. */
static const char *table_get(const str_table *t, uintptr_t handle) {
    if (handle == 0 || handle > t->len) return NULL;
    return t->items[handle - 1];
}

/* ---- one log line ---- */

static void put_json_string(const char *s) {
    fputc('"', g_log);
    for (const unsigned char *p = (const unsigned char *)s; *p; ++p) {
        if (*p == '"' || *p == '\\') {
            fputc('\\', g_log);
            fputc(*p, g_log);
        } else if (*p < 0x20) {
            fprintf(g_log, "\\u%04x", *p);
        } else {
            fputc(*p, g_log); /* UTF-8 bytes pass through unchanged */
        }
    }
    fputc('"', g_log);
}

static void put_double(double v) {
    /* JSON has no NaN or infinities: write those as strings. */
    if (v != v) fputs("\"nan\"", g_log);
    else if (v > 1.7976931348623157e308) fputs("\"inf\"", g_log);
    else if (v < -1.7976931348623157e308) fputs("\"-inf\"", g_log);
    else fprintf(g_log, "%.17g", v);
}

static const char *payload_type_name(int32_t type) {
    switch (type) {
    case NVTX_PAYLOAD_UNKNOWN: return "none";
    case NVTX_PAYLOAD_TYPE_UNSIGNED_INT64: return "uint64";
    case NVTX_PAYLOAD_TYPE_INT64: return "int64";
    case NVTX_PAYLOAD_TYPE_DOUBLE: return "double";
    case NVTX_PAYLOAD_TYPE_UNSIGNED_INT32: return "uint32";
    case NVTX_PAYLOAD_TYPE_INT32: return "int32";
    case NVTX_PAYLOAD_TYPE_FLOAT: return "float";
    default: return "other"; /* e.g. the payload extension's binary payloads */
    }
}

/* Message text of an attribute structure. Caller holds g_lock; the result lives until the next
 * call on the same thread or in the string table. */
static const char *attr_message(const nvtxEventAttributes_t *a, char **to_free) {
    *to_free = NULL;
    if (a == NULL) return "";
    switch (a->messageType) {
    case NVTX_MESSAGE_TYPE_ASCII: return a->message.ascii ? a->message.ascii : "";
    case NVTX_MESSAGE_TYPE_UNICODE: return (*to_free = dup_wide(a->message.unicode)) ? *to_free : "";
    case NVTX_MESSAGE_TYPE_REGISTERED: {
        const char *s = table_get(&g_strings, (uintptr_t)a->message.registered);
        return s != NULL ? s : "<unknown registered string>";
    }
    default: return "";
    }
}

/*
 * Writes {"seq","pid","tid","kind","domain","msg","category","color","payload_type","payload","id"}.
 * domain: handle from our table, NULL for the default domain ("" in the log), or the CORE
 * (ASCII) API, which has no domain at all (also ""). color is null unless ARGB was given.
 */
static void log_event(const char *kind, nvtxDomainHandle_t domain, const char *msg,
                      const nvtxEventAttributes_t *a, uint64_t range_id) {
    pthread_once(&g_once, open_log_once);
    long tid = syscall(SYS_gettid);
    pthread_mutex_lock(&g_lock);
    char *wide_copy = NULL;
    if (msg == NULL) msg = attr_message(a, &wide_copy);
    const char *dname = domain != NULL ? table_get(&g_domains, (uintptr_t)domain) : "";
    fprintf(g_log, "{\"seq\": %llu, \"pid\": %ld, \"tid\": %ld, \"kind\": ",
            (unsigned long long)g_seq++, (long)getpid(), tid);
    put_json_string(kind);
    fputs(", \"domain\": ", g_log);
    put_json_string(dname != NULL ? dname : "<unknown domain>");
    fputs(", \"msg\": ", g_log);
    put_json_string(msg);
    fprintf(g_log, ", \"category\": %u, \"color\": ", a != NULL ? a->category : 0u);
    if (a != NULL && a->colorType == NVTX_COLOR_ARGB) fprintf(g_log, "%u", a->color);
    else fputs("null", g_log);
    int32_t ptype = a != NULL ? a->payloadType : NVTX_PAYLOAD_UNKNOWN;
    fputs(", \"payload_type\": ", g_log);
    put_json_string(payload_type_name(ptype));
    fputs(", \"payload\": ", g_log);
    switch (ptype) {
    case NVTX_PAYLOAD_TYPE_UNSIGNED_INT64: fprintf(g_log, "%llu", (unsigned long long)a->payload.ullValue); break;
    case NVTX_PAYLOAD_TYPE_INT64: fprintf(g_log, "%lld", (long long)a->payload.llValue); break;
    case NVTX_PAYLOAD_TYPE_DOUBLE: put_double(a->payload.dValue); break;
    case NVTX_PAYLOAD_TYPE_UNSIGNED_INT32: fprintf(g_log, "%u", a->payload.uiValue); break;
    case NVTX_PAYLOAD_TYPE_INT32: fprintf(g_log, "%d", a->payload.iValue); break;
    case NVTX_PAYLOAD_TYPE_FLOAT: put_double((double)a->payload.fValue); break;
    default: fputs("null", g_log); break;
    }
    fprintf(g_log, ", \"id\": %llu}\n", (unsigned long long)range_id);
    fflush(g_log);
    pthread_mutex_unlock(&g_lock);
    free(wide_copy);
}

static uint64_t new_range_id(void) {
    return __atomic_fetch_add(&g_next_range_id, 1, __ATOMIC_RELAXED);
}

/* ---- CORE: the domain-less ASCII/Ex API (torch.cuda.nvtx) ---- */

static void core_mark_ex(const nvtxEventAttributes_t *a) { log_event("mark", NULL, NULL, a, 0); }
static void core_mark_a(const char *m) { log_event("mark", NULL, m ? m : "", NULL, 0); }
static void core_mark_w(const wchar_t *m) {
    char *s = dup_wide(m);
    log_event("mark", NULL, s ? s : "", NULL, 0);
    free(s);
}
static nvtxRangeId_t core_start_ex(const nvtxEventAttributes_t *a) {
    uint64_t id = new_range_id();
    log_event("start", NULL, NULL, a, id);
    return id;
}
static nvtxRangeId_t core_start_a(const char *m) {
    uint64_t id = new_range_id();
    log_event("start", NULL, m ? m : "", NULL, id);
    return id;
}
static nvtxRangeId_t core_start_w(const wchar_t *m) {
    uint64_t id = new_range_id();
    char *s = dup_wide(m);
    log_event("start", NULL, s ? s : "", NULL, id);
    free(s);
    return id;
}
static void core_end(nvtxRangeId_t id) { log_event("end", NULL, "", NULL, id); }
static int core_push_ex(const nvtxEventAttributes_t *a) {
    log_event("push", NULL, NULL, a, 0);
    return t_depth++;
}
static int core_push_a(const char *m) {
    log_event("push", NULL, m ? m : "", NULL, 0);
    return t_depth++;
}
static int core_push_w(const wchar_t *m) {
    char *s = dup_wide(m);
    log_event("push", NULL, s ? s : "", NULL, 0);
    free(s);
    return t_depth++;
}
static int core_pop(void) {
    log_event("pop", NULL, "", NULL, 0);
    return t_depth > 0 ? --t_depth : -1; /* NVTX documents a negative level for a stray pop */
}
static void core_name_category_a(uint32_t cat, const char *name) {
    nvtxEventAttributes_t a = {0};
    a.category = cat;
    log_event("name_category", NULL, name ? name : "", &a, 0);
}

/* ---- CORE2: the domain API with registered strings (the nvtx package) ---- */

static void d_mark(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
    log_event("mark", d, NULL, a, 0);
}
static nvtxRangeId_t d_start(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
    uint64_t id = new_range_id();
    log_event("start", d, NULL, a, id);
    return id;
}
static void d_end(nvtxDomainHandle_t d, nvtxRangeId_t id) { log_event("end", d, "", NULL, id); }
static int d_push(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
    log_event("push", d, NULL, a, 0);
    return t_depth++;
}
static int d_pop(nvtxDomainHandle_t d) {
    log_event("pop", d, "", NULL, 0);
    return t_depth > 0 ? --t_depth : -1;
}
static void d_name_category_a(nvtxDomainHandle_t d, uint32_t cat, const char *name) {
    nvtxEventAttributes_t a = {0};
    a.category = cat;
    log_event("name_category", d, name ? name : "", &a, 0);
}
static void d_name_category_w(nvtxDomainHandle_t d, uint32_t cat, const wchar_t *name) {
    char *s = dup_wide(name);
    d_name_category_a(d, cat, s);
    free(s);
}

static nvtxStringHandle_t register_string(char *copy) {
    pthread_once(&g_once, open_log_once);
    pthread_mutex_lock(&g_lock);
    uintptr_t h = table_add(&g_strings, copy, 1);
    pthread_mutex_unlock(&g_lock);
    return (nvtxStringHandle_t)h;
}
static nvtxStringHandle_t d_register_a(nvtxDomainHandle_t d, const char *s) {
    (void)d;
    return register_string(dup_ascii(s));
}
static nvtxStringHandle_t d_register_w(nvtxDomainHandle_t d, const wchar_t *s) {
    (void)d;
    return register_string(dup_wide(s));
}

static nvtxDomainHandle_t create_domain(char *copy) {
    pthread_once(&g_once, open_log_once);
    pthread_mutex_lock(&g_lock);
    /* Same name, same handle: both NVTX instances then report one domain. */
    uintptr_t h = table_add(&g_domains, copy, 1);
    pthread_mutex_unlock(&g_lock);
    if (h != 0) log_event("domain_create", (nvtxDomainHandle_t)h, "", NULL, 0);
    return (nvtxDomainHandle_t)h;
}
static nvtxDomainHandle_t d_create_a(const char *name) { return create_domain(dup_ascii(name)); }
static nvtxDomainHandle_t d_create_w(const wchar_t *name) { return create_domain(dup_wide(name)); }
/* Handles stay valid until exit so that late events (atexit, finalizers) still resolve. */
static void d_destroy(nvtxDomainHandle_t d) { (void)d; }
static void d_initialize(const void *reserved) { (void)reserved; }

/* ---- registration ---- */

typedef struct {
    unsigned int cbid;
    NvtxFunctionPointer fn;
} slot_fill;

#define FILL(id, f) {(id), (NvtxFunctionPointer)(f)}

static const slot_fill k_core[] = {
    FILL(NVTX_CBID_CORE_MarkEx, core_mark_ex),
    FILL(NVTX_CBID_CORE_MarkA, core_mark_a),
    FILL(NVTX_CBID_CORE_MarkW, core_mark_w),
    FILL(NVTX_CBID_CORE_RangeStartEx, core_start_ex),
    FILL(NVTX_CBID_CORE_RangeStartA, core_start_a),
    FILL(NVTX_CBID_CORE_RangeStartW, core_start_w),
    FILL(NVTX_CBID_CORE_RangeEnd, core_end),
    FILL(NVTX_CBID_CORE_RangePushEx, core_push_ex),
    FILL(NVTX_CBID_CORE_RangePushA, core_push_a),
    FILL(NVTX_CBID_CORE_RangePushW, core_push_w),
    FILL(NVTX_CBID_CORE_RangePop, core_pop),
    FILL(NVTX_CBID_CORE_NameCategoryA, core_name_category_a),
};

static const slot_fill k_core2[] = {
    FILL(NVTX_CBID_CORE2_DomainMarkEx, d_mark),
    FILL(NVTX_CBID_CORE2_DomainRangeStartEx, d_start),
    FILL(NVTX_CBID_CORE2_DomainRangeEnd, d_end),
    FILL(NVTX_CBID_CORE2_DomainRangePushEx, d_push),
    FILL(NVTX_CBID_CORE2_DomainRangePop, d_pop),
    FILL(NVTX_CBID_CORE2_DomainNameCategoryA, d_name_category_a),
    FILL(NVTX_CBID_CORE2_DomainNameCategoryW, d_name_category_w),
    FILL(NVTX_CBID_CORE2_DomainRegisterStringA, d_register_a),
    FILL(NVTX_CBID_CORE2_DomainRegisterStringW, d_register_w),
    FILL(NVTX_CBID_CORE2_DomainCreateA, d_create_a),
    FILL(NVTX_CBID_CORE2_DomainCreateW, d_create_w),
    FILL(NVTX_CBID_CORE2_DomainDestroy, d_destroy),
    FILL(NVTX_CBID_CORE2_Initialize, d_initialize),
};

/* Returns 0 when the instance does not offer the module at all. */
static int fill_module(const NvtxExportTableCallbacks *etbl, NvtxCallbackModule module,
                       const slot_fill *fills, size_t n) {
    NvtxFunctionTable table = NULL;
    unsigned int size = 0; /* highest valid callback id of this instance's table */
    if (!etbl->GetModuleFunctionTable(module, &table, &size) || table == NULL) return 0;
    for (size_t i = 0; i < n; ++i) {
        /* An older instance has fewer slots: never write past its table. */
        if (fills[i].cbid <= size && table[fills[i].cbid] != NULL) *table[fills[i].cbid] = fills[i].fn;
    }
    return 1;
}

EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
    pthread_once(&g_once, open_log_once);
    const NvtxExportTableCallbacks *etbl =
        (const NvtxExportTableCallbacks *)get_export_table(NVTX_ETID_CALLBACKS);
    if (etbl == NULL || etbl->struct_size < sizeof(NvtxExportTableCallbacks)) return 0;
    const NvtxExportTableVersionInfo *ver =
        (const NvtxExportTableVersionInfo *)get_export_table(NVTX_ETID_VERSIONINFO);

    int ok = fill_module(etbl, NVTX_CB_MODULE_CORE, k_core, sizeof k_core / sizeof k_core[0]);
    ok &= fill_module(etbl, NVTX_CB_MODULE_CORE2, k_core2, sizeof k_core2 / sizeof k_core2[0]);

    /* One "init" line per NVTX instance; id carries the instance's NVTX API version. */
    log_event("init", NULL, "", NULL, ver != NULL ? ver->version : 0);
    return ok; /* 0 makes NVTX detach this instance rather than run half-instrumented */
}
