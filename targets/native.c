/* family-certify: the llama.cpp worker's native helpers — its eval callback, its log callback, and argmax.
 *
 * ggml's scheduler asks the callback about every graph node of every llama_decode (hundreds per decode);
 * answering from Python costs more than the decode itself on tiny fixtures. This callback answers in C and
 * copies the wanted residuals (tensors named "l_out-N", and the logits "result_output" when asked) into buffers
 * the worker reads after the decode.
 * Likewise llama.cpp logs ~500 lines per model load: the log callback keeps the last non-debug ones in C.
 * Built on first use by targets/native.py (cc -O2 -shared); the ggml functions come in as pointers from the
 * libggml-base the worker already loaded, so no headers or link flags are needed.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The leading fields of struct ggml_tensor (ggml.h): type, buffer, ne[4]. */
struct fc_tensor_head {
    int type;
    void *buffer;
    int64_t ne[4];
};

typedef const char *(*fc_get_name_fn)(const void *);
typedef size_t (*fc_nbytes_fn)(const void *);
typedef void (*fc_tensor_get_fn)(const void *, void *, size_t, size_t);

#define FC_MAX_LAYERS 4096
#define FC_TYPE_F32 0

static fc_get_name_fn get_name;
static fc_nbytes_fn nbytes;
static fc_tensor_get_fn tensor_get;
static unsigned char want[FC_MAX_LAYERS];
static int any_wanted;

struct fc_buf {
    float *data;
    size_t n, cap;   /* floats held, floats allocated */
    int64_t width;   /* ne[0] of the captured tensor */
    int not_f32;     /* the tensor was seen but is not F32 */
};
static struct fc_buf got[FC_MAX_LAYERS];

void fc_init(void *get_name_ptr, void *nbytes_ptr, void *tensor_get_ptr) {
    get_name = (fc_get_name_fn)get_name_ptr;
    nbytes = (fc_nbytes_fn)nbytes_ptr;
    tensor_get = (fc_tensor_get_fn)tensor_get_ptr;
}

/* Set the layers to capture during the next decode; forgets what earlier decodes captured. */
int fc_want(const int *layers, int n) {
    memset(want, 0, sizeof want);
    any_wanted = 0;
    for (int i = 0; i < FC_MAX_LAYERS; i++) {
        got[i].n = 0;
        got[i].width = 0;
        got[i].not_f32 = 0;
    }
    for (int i = 0; i < n; i++) {
        if (layers[i] < 0 || layers[i] >= FC_MAX_LAYERS) return -1;
        want[layers[i]] = 1;
        any_wanted = 1;
    }
    return 0;
}

/* The logits node ("result_output") goes into the last slot: rows in ubatch order, which tells the worker how
 * llama.cpp ordered a batch's rows into ubatches (its logits come back in batch order). */
#define FC_OUTPUT_SLOT (FC_MAX_LAYERS - 1)

static int wanted_layer(const char *name) {
    if (strcmp(name, "result_output") == 0) return want[FC_OUTPUT_SLOT] ? FC_OUTPUT_SLOT : -1;
    if (strncmp(name, "l_out-", 6) != 0) return -1;
    char *end;
    long k = strtol(name + 6, &end, 10);
    if (end == name + 6 || *end != '\0' || k < 0 || k >= FC_MAX_LAYERS || !want[k]) return -1;
    return (int)k;
}

bool fc_eval(void *t, bool ask, void *user_data) {
    (void)user_data;
    if (!any_wanted) return false;
    int k = wanted_layer(get_name(t));
    if (k < 0) return false;
    if (ask) return true;
    const struct fc_tensor_head *h = (const struct fc_tensor_head *)t;
    struct fc_buf *b = &got[k];
    if (h->type != FC_TYPE_F32) {
        b->not_f32 = 1;
        return true;
    }
    size_t bytes = nbytes(t), floats = bytes / sizeof(float);
    if (b->n + floats > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + floats) cap *= 2;
        float *p = realloc(b->data, cap * sizeof(float));
        if (!p) return false; /* stops the computation: the decode fails instead of returning a short capture */
        b->data = p;
        b->cap = cap;
    }
    tensor_get(t, b->data + b->n, 0, bytes);
    b->n += floats;
    b->width = h->ne[0];
    return true;
}

/* What the last decode captured for layer k: floats held (0: nothing), row width, the data. */
int64_t fc_count(int k) { return (k >= 0 && k < FC_MAX_LAYERS && !got[k].not_f32) ? (int64_t)got[k].n : 0; }
int64_t fc_width(int k) { return (k >= 0 && k < FC_MAX_LAYERS) ? got[k].width : 0; }
const float *fc_data(int k) { return (k >= 0 && k < FC_MAX_LAYERS) ? got[k].data : NULL; }

/* numpy.argmax semantics: the first index of the maximum; a NaN counts as the maximum (the first NaN wins). */
int64_t fc_argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 0; i < n; i++) {
        if (x[i] != x[i]) return i;
        if (x[i] > x[best]) best = i;
    }
    return best;
}

/* ---- log: the last FC_LOG_LINES lines above debug level, for the worker's error messages ---- */
#define FC_LOG_LINES 200
#define FC_LOG_WIDTH 512
#define FC_LOG_LEVEL_DEBUG 1 /* GGML_LOG_LEVEL_DEBUG; NONE is 0 */

static char log_ring[FC_LOG_LINES][FC_LOG_WIDTH];
static int log_next, log_count, log_echo;

void fc_log(int level, const char *text, void *user_data) {
    (void)user_data;
    if (log_echo) fputs(text, stderr);
    if (level <= FC_LOG_LEVEL_DEBUG) return;
    size_t n = strlen(text);
    while (n && text[n - 1] == '\n') n--;
    if (!n) return;
    if (n >= FC_LOG_WIDTH) n = FC_LOG_WIDTH - 1;
    memcpy(log_ring[log_next], text, n);
    log_ring[log_next][n] = '\0';
    log_next = (log_next + 1) % FC_LOG_LINES;
    if (log_count < FC_LOG_LINES) log_count++;
}

void fc_log_echo(int on) { log_echo = on; }
void fc_log_clear(void) { log_count = 0; }
int fc_log_count(void) { return log_count; }
/* line i of fc_log_count(), oldest first */
const char *fc_log_line(int i) {
    if (i < 0 || i >= log_count) return "";
    return log_ring[(log_next - log_count + i + FC_LOG_LINES) % FC_LOG_LINES];
}
