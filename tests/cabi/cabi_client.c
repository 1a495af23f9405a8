/* A C host for libserving_processor.so, as an RPC framework would be: not Python, loads the
 * library with dlopen(RTLD_NOW | RTLD_LOCAL), frees every returned buffer with free().
 * The tests and benchmarks/bench_cabi.py drive it; Python computes the expected bytes.
 *
 * Files: CONFIG is the JSON config file; REQUESTS holds records [u32 size][bytes];
 * EXPECTED and OUT hold records [i32 status][u32 size][bytes], all little-endian.
 *
 *   cabi_client LIB init CONFIG                       prints "state S handle NULL|set signals_changed N"
 *   cabi_client LIB once CONFIG REQUESTS OUT          process each request once -> OUT
 *   cabi_client LIB batch CONFIG REQUESTS OUT         one batch_process call -> OUT, prints its status
 *   cabi_client LIB info CONFIG OUT                   get_serving_model_info -> OUT
 *   cabi_client LIB serve CONFIG REQUESTS EXPECTED THREADS ROUNDS
 *        THREADS threads send ROUNDS requests each (cycling through REQUESTS), compare
 *        with EXPECTED; prints "sent N mismatched M seconds S"
 *   cabi_client LIB two CONFIG_A REQS_A EXP_A CONFIG_B REQS_B EXP_B THREADS ROUNDS
 *        THREADS threads per model; A is destroyed while B's threads run; prints
 *        "a_sent .. a_mismatched .. b_sent .. b_mismatched .. b_after_destroy .."
 *   cabi_client LIB pin CONFIG VERSION REQUESTS OUT    load_version(VERSION), each request -> OUT, then
 *        load_version(NULL) and the requests again -> OUT; prints "pin S <message>" / "unpin S <message>"
 *   cabi_client LIB calls                             bad calls; prints "name status message" lines
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "processor.h"

static recserve_initialize_fn initialize_;
static recserve_process_fn process_;
static recserve_batch_process_fn batch_process_;
static recserve_get_serving_model_info_fn get_serving_model_info_;
static recserve_release_buffer_fn release_buffer_;
static recserve_destroy_fn destroy_;
static recserve_load_version_fn load_version_;

static void die(const char* what, const char* detail) {
    fprintf(stderr, "cabi_client: %s: %s\n", what, detail ? detail : "");
    exit(2);
}

static void* symbol(void* lib, const char* name) {
    void* found = dlsym(lib, name);
    if (!found)
        die("dlsym", dlerror());
    return found;
}

static void load(const char* path) {
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        die("dlopen", dlerror());
    initialize_ = (recserve_initialize_fn)symbol(lib, "initialize");
    process_ = (recserve_process_fn)symbol(lib, "process");
    batch_process_ = (recserve_batch_process_fn)symbol(lib, "batch_process");
    get_serving_model_info_ = (recserve_get_serving_model_info_fn)symbol(lib, "get_serving_model_info");
    release_buffer_ = (recserve_release_buffer_fn)symbol(lib, "release_buffer");
    destroy_ = (recserve_destroy_fn)symbol(lib, "destroy");
    load_version_ = (recserve_load_version_fn)symbol(lib, "load_version");
}

static char* read_file(const char* path, size_t* size) {
    FILE* f = fopen(path, "rb");
    if (!f)
        die("cannot open", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char* data = malloc((size_t)n + 1);
    if (!data || fread(data, 1, (size_t)n, f) != (size_t)n)
        die("cannot read", path);
    data[n] = '\0';
    fclose(f);
    if (size)
        *size = (size_t)n;
    return data;
}

typedef struct {
    int count;
    const void** data; /* pointers into `blob` */
    int* size;
    int* status;       /* EXPECTED files only */
    char* blob;
} records;

static uint32_t u32(const char* p) {
    const unsigned char* b = (const unsigned char*)p;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static records read_records(const char* path, int with_status) {
    records r = {0};
    size_t total;
    r.blob = read_file(path, &total);
    int capacity = 16;
    r.data = malloc(capacity * sizeof *r.data);
    r.size = malloc(capacity * sizeof *r.size);
    r.status = malloc(capacity * sizeof *r.status);
    for (size_t at = 0; at < total; r.count++) {
        if (r.count == capacity) {
            capacity *= 2;
            r.data = realloc(r.data, capacity * sizeof *r.data);
            r.size = realloc(r.size, capacity * sizeof *r.size);
            r.status = realloc(r.status, capacity * sizeof *r.status);
        }
        r.status[r.count] = with_status ? (int)u32(r.blob + at) : 0;
        at += with_status ? 4 : 0;
        r.size[r.count] = (int)u32(r.blob + at);
        r.data[r.count] = r.blob + at + 4;
        at += 4 + (size_t)r.size[r.count];
    }
    return r;
}

static void free_records(records* r) {
    free(r->data);
    free(r->size);
    free(r->status);
    free(r->blob);
}

static void write_record(FILE* out, int status, const void* data, int size) {
    uint32_t header[2] = {(uint32_t)status, (uint32_t)size}; /* little-endian hosts only */
    fwrite(header, 4, 2, out);
    fwrite(data, 1, (size_t)size, out);
}

static void* open_model(const char* config_path) {
    char* config = read_file(config_path, NULL);
    int state = -1;
    void* model = initialize_("", config, &state);
    free(config);
    if (!model || state != 0)
        die("initialize failed", config_path);
    return model;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* ---- serving from threads ---------------------------------------------------------- */

typedef struct {
    void* model;
    const records* requests;
    const records* expected;
    int first;           /* index of this thread's first request */
    int rounds;
    atomic_int* keep_going; /* NULL: stop after `rounds`; else also run while it is non-zero */
    atomic_int* destroyed;  /* NULL, or set once another handle was destroyed */
    int sent, mismatched, after_destroy;
} worker;

static void* serve(void* arg) {
    worker* w = arg;
    for (int i = 0; i < w->rounds || (w->keep_going && atomic_load(w->keep_going)); i++) {
        int k = (w->first + i) % w->requests->count;
        int was_destroyed = w->destroyed && atomic_load(w->destroyed);
        void* out = NULL;
        int size = 0;
        int status = process_(w->model, w->requests->data[k], w->requests->size[k], &out, &size);
        if (status != w->expected->status[k] || size != w->expected->size[k] ||
            memcmp(out, w->expected->data[k], (size_t)size) != 0) {
            if (w->mismatched++ == 0) {
                fprintf(stderr, "mismatch on request %d: status %d size %d: %.200s\n", k, status, size,
                        status == 200 ? "(bytes)" : (char*)out);
                if (status == 200) { /* both answers in hex: a rounding apart, or unrelated? */
                    fprintf(stderr, "  got      ");
                    for (int b = 0; b < size && b < 64; b++) fprintf(stderr, "%02x", ((unsigned char*)out)[b]);
                    fprintf(stderr, "\n  expected ");
                    for (int b = 0; b < w->expected->size[k] && b < 64; b++)
                        fprintf(stderr, "%02x", ((const unsigned char*)w->expected->data[k])[b]);
                    fprintf(stderr, "\n");
                }
            }
        }
        free(out);
        w->sent++;
        w->after_destroy += was_destroyed;
    }
    return NULL;
}

static void run_workers(worker* workers, int n) {
    pthread_t* threads = malloc((size_t)n * sizeof *threads);
    for (int t = 0; t < n; t++)
        pthread_create(&threads[t], NULL, serve, &workers[t]);
    for (int t = 0; t < n; t++)
        pthread_join(threads[t], NULL);
    free(threads);
}

static int mode_serve(char** argv) {
    void* model = open_model(argv[0]);
    records requests = read_records(argv[1], 0), expected = read_records(argv[2], 1);
    int threads = atoi(argv[3]), rounds = atoi(argv[4]);
    worker* workers = calloc((size_t)threads, sizeof *workers);
    for (int t = 0; t < threads; t++)
        workers[t] = (worker){model, &requests, &expected, t * 7, rounds, NULL, NULL, 0, 0, 0};
    worker warmup = {model, &requests, &expected, 0, requests.count, NULL, NULL, 0, 0, 0};
    serve(&warmup); /* one pass before timing; checked like the rest */
    struct timespec cpu_start, cpu_end;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu_start);
    double start = now();
    run_workers(workers, threads);
    double seconds = now() - start;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu_end);
    int sent = 0, mismatched = warmup.mismatched;
    for (int t = 0; t < threads; t++) {
        sent += workers[t].sent;
        mismatched += workers[t].mismatched;
    }
    /* cpu: the process's CPU seconds meanwhile (every thread, ONNX Runtime's included):
     * cpu / seconds is how many cores the threads kept busy. */
    double cpu = (double)(cpu_end.tv_sec - cpu_start.tv_sec) + (cpu_end.tv_nsec - cpu_start.tv_nsec) / 1e9;
    printf("sent %d mismatched %d seconds %.6f cpu %.6f\n", sent, mismatched, seconds, cpu);
    destroy_(model);
    free(workers);
    free_records(&requests);
    free_records(&expected);
    return mismatched != 0;
}

typedef struct {
    worker* workers;
    int count;
} worker_group;

static void* run_group(void* arg) {
    worker_group* g = arg;
    run_workers(g->workers, g->count);
    return NULL;
}

static int mode_two(char** argv) {
    void* a = open_model(argv[0]);
    void* b = open_model(argv[3]);
    records reqs_a = read_records(argv[1], 0), exp_a = read_records(argv[2], 1);
    records reqs_b = read_records(argv[4], 0), exp_b = read_records(argv[5], 1);
    int threads = atoi(argv[6]), rounds = atoi(argv[7]);
    atomic_int b_keep_going = 1, destroyed = 0;
    worker* wa = calloc((size_t)threads, sizeof *wa);
    worker* wb = calloc((size_t)threads, sizeof *wb);
    for (int t = 0; t < threads; t++) {
        wa[t] = (worker){a, &reqs_a, &exp_a, t, rounds, NULL, NULL, 0, 0, 0};
        wb[t] = (worker){b, &reqs_b, &exp_b, t, rounds, &b_keep_going, &destroyed, 0, 0, 0};
    }
    pthread_t group_b;
    worker_group gb = {wb, threads};
    pthread_create(&group_b, NULL, run_group, &gb); /* B serves throughout */
    run_workers(wa, threads);                       /* A serves concurrently with B */
    destroy_(a);                                    /* ... and goes away while B serves */
    atomic_store(&destroyed, 1);
    struct timespec pause = {0, 200 * 1000 * 1000};
    nanosleep(&pause, NULL); /* B keeps serving after the destroy */
    atomic_store(&b_keep_going, 0);
    pthread_join(group_b, NULL);

    int a_sent = 0, a_bad = 0, b_sent = 0, b_bad = 0, b_after = 0;
    for (int t = 0; t < threads; t++) {
        a_sent += wa[t].sent;
        a_bad += wa[t].mismatched;
        b_sent += wb[t].sent;
        b_bad += wb[t].mismatched;
        b_after += wb[t].after_destroy;
    }
    printf("a_sent %d a_mismatched %d b_sent %d b_mismatched %d b_after_destroy %d\n", a_sent, a_bad, b_sent,
           b_bad, b_after);
    destroy_(b);
    free(wa);
    free(wb);
    free_records(&reqs_a);
    free_records(&exp_a);
    free_records(&reqs_b);
    free_records(&exp_b);
    return 0;
}

/* ---- single calls ----------------------------------------------------------------- */

/* Signals whose disposition the host owns; starting the interpreter must change none. */
static const int host_signals[] = {SIGINT, SIGTERM, SIGPIPE, SIGXFSZ, SIGSEGV, SIGHUP, SIGCHLD};
#define HOST_SIGNALS (int)(sizeof host_signals / sizeof host_signals[0])

static int mode_init(char** argv) {
    struct sigaction before[HOST_SIGNALS], after;
    for (int i = 0; i < HOST_SIGNALS; i++)
        sigaction(host_signals[i], NULL, &before[i]);
    char* config = read_file(argv[0], NULL);
    int state = 12345;
    void* model = initialize_("", config, &state);
    free(config);
    int changed = 0;
    for (int i = 0; i < HOST_SIGNALS; i++) {
        sigaction(host_signals[i], NULL, &after);
        if (after.sa_handler != before[i].sa_handler) {
            fprintf(stderr, "signal %d's handler changed\n", host_signals[i]);
            changed++;
        }
    }
    printf("state %d handle %s signals_changed %d\n", state, model ? "set" : "NULL", changed);
    destroy_(model);
    return 0;
}

static int mode_once(char** argv) {
    void* model = open_model(argv[0]);
    records requests = read_records(argv[1], 0);
    FILE* out = fopen(argv[2], "wb");
    for (int k = 0; k < requests.count; k++) {
        void* data = NULL;
        int size = 0;
        int status = process_(model, requests.size[k] ? requests.data[k] : NULL, requests.size[k], &data, &size);
        write_record(out, status, data, size);
        free(data);
    }
    fclose(out);
    destroy_(model);
    free_records(&requests);
    return 0;
}

static void process_all(void* model, records* requests, FILE* out) {
    for (int k = 0; k < requests->count; k++) {
        void* data = NULL;
        int size = 0;
        int status = process_(model, requests->data[k], requests->size[k], &data, &size);
        write_record(out, status, data, size);
        free(data);
    }
}

static void print_reply(const char* what, int status, void* data, int size) {
    printf("%s %d %.*s\n", what, status, size, data ? (const char*)data : "");
    free(data);
}

static int mode_pin(char** argv) {
    void* model = open_model(argv[0]);
    records requests = read_records(argv[2], 0);
    FILE* out = fopen(argv[3], "wb");
    void* data = NULL;
    int size = 0;
    int status = load_version_(model, argv[1], &data, &size);
    print_reply("pin", status, data, size);
    process_all(model, &requests, out);
    data = NULL;
    status = load_version_(model, NULL, &data, &size);
    print_reply("unpin", status, data, size);
    process_all(model, &requests, out);
    fclose(out);
    destroy_(model);
    free_records(&requests);
    return 0;
}

static int mode_batch(char** argv) {
    void* model = open_model(argv[0]);
    records requests = read_records(argv[1], 0);
    int n = requests.count;
    void** outputs = calloc((size_t)n + 1, sizeof *outputs);
    int* sizes = calloc((size_t)n + 1, sizeof *sizes);
    int* statuses = calloc((size_t)n + 1, sizeof *statuses);
    int status = batch_process_(model, n, requests.data, requests.size, outputs, sizes, statuses);
    FILE* out = fopen(argv[2], "wb");
    for (int k = 0; k < n; k++) {
        write_record(out, statuses[k], outputs[k], sizes[k]);
        release_buffer_(outputs[k]);
    }
    fclose(out);
    printf("batch_status %d\n", status);
    destroy_(model);
    free(outputs);
    free(sizes);
    free(statuses);
    free_records(&requests);
    return 0;
}

static int mode_info(char** argv) {
    void* model = open_model(argv[0]);
    void* data = NULL;
    int size = 0;
    int status = get_serving_model_info_(model, &data, &size);
    FILE* out = fopen(argv[1], "wb");
    write_record(out, status, data, size);
    fclose(out);
    free(data);
    destroy_(model);
    return 0;
}

static void report(const char* name, int status, void* data, int size) {
    printf("%s %d %.*s\n", name, status, size, data ? (char*)data : "");
    free(data);
}

static int mode_calls(void) {
    void* data = NULL;
    int size = 0;
    int status = process_(NULL, "x", 1, &data, &size);
    report("process_null_model", status, data, size);
    status = get_serving_model_info_(NULL, &data, &size);
    report("info_null_model", status, data, size);

    const void* inputs[2] = {"x", "y"};
    int input_sizes[2] = {1, 1}, sizes[2] = {0, 0}, statuses[2] = {0, 0};
    void* outputs[2] = {NULL, NULL};
    status = batch_process_(NULL, 2, inputs, input_sizes, outputs, sizes, statuses);
    report("batch_null_model", status, NULL, 0);
    report("batch_null_model[0]", statuses[0], outputs[0], sizes[0]);
    report("batch_null_model[1]", statuses[1], outputs[1], sizes[1]);

    status = process_(NULL, "x", 1, NULL, NULL);
    report("process_null_output", status, NULL, 0);
    destroy_(NULL);
    release_buffer_(NULL);
    report("destroy_null", 0, NULL, 0);

    int state = 12345;
    void* model = initialize_("", NULL, &state);
    printf("initialize_null_config state %d handle %s\n", state, model ? "set" : "NULL");
    return 0;
}

int main(int argc, char** argv) {
    if (argc < 3)
        die("usage", "cabi_client LIB MODE ARGS...");
    load(argv[1]);
    const char* mode = argv[2];
    int need = !strcmp(mode, "init") ? 1 : !strcmp(mode, "once") || !strcmp(mode, "batch") ? 3
             : !strcmp(mode, "info") ? 2 : !strcmp(mode, "serve") ? 5 : !strcmp(mode, "two") ? 8
             : !strcmp(mode, "pin") ? 4 : 0;
    if (argc - 3 < need)
        die("too few arguments for mode", mode);
    if (!strcmp(mode, "init"))
        return mode_init(argv + 3);
    if (!strcmp(mode, "once"))
        return mode_once(argv + 3);
    if (!strcmp(mode, "batch"))
        return mode_batch(argv + 3);
    if (!strcmp(mode, "info"))
        return mode_info(argv + 3);
    if (!strcmp(mode, "serve"))
        return mode_serve(argv + 3);
    if (!strcmp(mode, "two"))
        return mode_two(argv + 3);
    if (!strcmp(mode, "pin"))
        return mode_pin(argv + 3);
    if (!strcmp(mode, "calls"))
        return mode_calls();
    die("unknown mode", mode);
    return 2;
}
