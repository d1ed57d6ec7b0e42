/* multiagenttrainer.corpus._encode: the per-file hot path of the corpus build, in one pass.
 *
 * For a file's bytes it answers, in a single scan: is this plainly a keepable text file (valid
 * UTF-8, no NUL in the sniffed head, no generator marker, no over-long line, enough newlines), and
 * if so, what is its text as the body of a JSON string (escaped exactly as orjson escapes) and its
 * git blob SHA-1. Anything unusual is not decided here: the caller falls back to the Python rules
 * in filters.py, which stay the reference. The constants of those rules come from Python
 * (`configure`), so they live in one place.
 *
 * `encode_dir_items` does that for a run of files on disk and writes their corpus.txt and
 * corpus.jsonl records straight into the chunk's two bytearrays: a file is read into corpus.txt's
 * buffer behind its header and escaped from there into corpus.jsonl's, with no Python object per
 * file but its SHA (the dedupe key) and its row in the chunk's columns.
 *
 *   encode(data, limit, skip_generated) -> (clean, escaped | None, sha | None)
 *   escape(data) -> bytes | None                    the JSON body of valid UTF-8, else None
 *   git_blob_sha(data) -> bytes                      SHA-1 of "blob <len>\0" + data
 *   encode_dir_items(...) -> bytes read              see chunks.py
 *   reserve_blocks(fd, length) -> bool               disk blocks for an output file, its size unchanged
 *   plan_span(...) -> (items, files)                 plan.plan_files for a span of a directory listing
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/falloc.h>
#include <linux/openat2.h>
#endif

#include <openssl/evp.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* ------------------------------------------------------------------ settings from filters.py */

#define MAX_MARKERS 32
#define MAX_MARKER_LEN 64

static struct {
    Py_ssize_t binary_sniff;      /* a NUL within this many leading bytes: binary */
    Py_ssize_t generated_sniff;   /* generator markers are looked for in this many leading bytes */
    Py_ssize_t long_line;         /* a line longer than this: minified */
    Py_ssize_t mean_sample;       /* files at least this long need ... */
    Py_ssize_t mean_min_newlines; /* ... at least this many newlines in their first mean_sample bytes */
    int markers;
    char marker[MAX_MARKERS][MAX_MARKER_LEN];
    Py_ssize_t marker_len[MAX_MARKERS];
    int configured;
} rules;

static EVP_MD_CTX *sha_ctx;

/* SHA-1, looked up once: OpenSSL 3 looks a digest up again on every EVP_sha1() init otherwise. */
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
static EVP_MD *sha1_md;
static int sha1_init(EVP_MD_CTX *ctx) { return EVP_DigestInit_ex2(ctx, sha1_md, NULL); }
static int sha1_fetch(void) { return (sha1_md = EVP_MD_fetch(NULL, "SHA1", NULL)) != NULL; }
#else
static int sha1_init(EVP_MD_CTX *ctx) { return EVP_DigestInit_ex(ctx, EVP_sha1(), NULL); }
static int sha1_fetch(void) { return 1; }
#endif

static PyObject *configure(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"binary_sniff", "generated_sniff", "long_line", "mean_sample",
                            "mean_min_newlines", "markers", NULL};
    PyObject *markers;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$nnnnnO", names, &rules.binary_sniff,
                                     &rules.generated_sniff, &rules.long_line, &rules.mean_sample,
                                     &rules.mean_min_newlines, &markers))
        return NULL;
    PyObject *seq = PySequence_Fast(markers, "markers must be a sequence of lowercase bytes");
    if (!seq) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (count > MAX_MARKERS) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "at most %d markers", MAX_MARKERS);
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        char *text;
        Py_ssize_t len;
        if (PyBytes_AsStringAndSize(item, &text, &len) < 0 || len == 0 || len >= MAX_MARKER_LEN) {
            Py_DECREF(seq);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "markers: 1 to 63 bytes each");
            return NULL;
        }
        memcpy(rules.marker[i], text, (size_t)len);
        rules.marker_len[i] = len;
    }
    Py_DECREF(seq);
    rules.markers = (int)count;
    rules.configured = 1;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ reading */

/* The directory of the files being read, kept open: the files of a run share few directories, and
 * opening a name relative to its directory skips the walk down the whole path every time. */
typedef struct {
    int fd;
    char path[4096];
    size_t len;
} OpenDir;

/* An absolute path opened without following a symbolic link in any of its components (the paths read
 * here have none: roots are resolved and the walk never lists a link), so a directory swapped for a link
 * while the corpus is built cannot lead outside the tree. openat2(RESOLVE_NO_SYMLINKS) does it in one call;
 * without it (ENOSYS: kernels before 5.6) each component is opened with O_NOFOLLOW from "/". The Python
 * fallback (chunks.open_beneath) follows the same rule. */
static int open_no_links(const char *path, int flags) {
#if defined(__linux__) && defined(SYS_openat2)
    struct open_how how;
    memset(&how, 0, sizeof how);
    how.flags = (unsigned long long)(flags | O_NOFOLLOW | O_CLOEXEC);
    how.resolve = RESOLVE_NO_SYMLINKS;
    long fd = syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof how);
    if (fd >= 0 || errno != ENOSYS) return (int)fd;
#endif
    if (path[0] != '/') {
        errno = EINVAL;
        return -1;
    }
    int at = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const char *part = path + 1;
    while (at >= 0) {
        const char *slash = strchr(part, '/');
        size_t len = slash ? (size_t)(slash - part) : strlen(part);
        char name[256];
        if (len >= sizeof name) {
            close(at);
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(name, part, len);
        name[len] = 0;
        int next = len == 0 ? dup(at) : openat(at, name, (slash ? O_RDONLY | O_DIRECTORY : flags) | O_NOFOLLOW | O_CLOEXEC);
        int failed = errno;
        close(at);
        errno = failed;
        if (!slash || next < 0) return next;
        at = next;
        part = slash + 1;
    }
    return -1;
}

/* A descriptor for the file at path (relative to its open directory when that can be used). */
static int open_in(OpenDir *dir, const char *path) {
    const int flags = O_RDONLY | O_NOFOLLOW | O_CLOEXEC;
    const char *slash = strrchr(path, '/');
    size_t len = slash ? (size_t)(slash - path) : 0;
    if (!dir || !slash || len == 0 || len >= sizeof dir->path) return open_no_links(path, flags);
    if (dir->fd < 0 || dir->len != len || memcmp(dir->path, path, len) != 0) {
        if (dir->fd >= 0) close(dir->fd);
        memcpy(dir->path, path, len);
        dir->path[len] = 0;
        dir->len = len;
        dir->fd = open_no_links(dir->path, O_RDONLY | O_DIRECTORY);
        if (dir->fd < 0) return open_no_links(path, flags); /* reports the real error for this file */
    }
    return openat(dir->fd, slash + 1, flags);
}

/* A bytearray being appended to. Its size runs ahead of `used` while it grows (doubling), and is
 * cut back to `used` before Python sees it (sink_settle) and after the run. */
typedef struct {
    PyObject *array;
    Py_ssize_t used;
} Sink;

static Sink sink_at_end(PyObject *array) {
    Sink sink = {array, PyByteArray_GET_SIZE(array)};
    return sink;
}

/* Room for `need` more bytes; the buffer may move, so take pointers into it only after this. */
static int sink_reserve(Sink *sink, Py_ssize_t need) {
    Py_ssize_t size = PyByteArray_GET_SIZE(sink->array);
    if (sink->used + need <= size) return 0;
    Py_ssize_t grown = size * 2 > sink->used + need ? size * 2 : sink->used + need;
    return PyByteArray_Resize(sink->array, grown < 65536 ? 65536 : grown);
}

static inline char *sink_end(const Sink *sink) { return PyByteArray_AS_STRING(sink->array) + sink->used; }

static int sink_append(Sink *sink, const void *bytes, Py_ssize_t len) {
    if (sink_reserve(sink, len) < 0) return -1;
    memcpy(sink_end(sink), bytes, (size_t)len);
    sink->used += len;
    return 0;
}

static int sink_settle(Sink *sink) { return PyByteArray_Resize(sink->array, sink->used); }

/* Append at most limit + 1 bytes of the file at path to the sink; the count, or -1 with errno set. */
static Py_ssize_t read_into(Sink *sink, OpenDir *dir, const char *path, Py_ssize_t expected, Py_ssize_t limit) {
    int fd = open_in(dir, path);
    if (fd < 0) return -1;
    /* One read of the expected size + 1 is usually all: a short read means the end of the file. */
    Py_ssize_t want = (expected < 0 ? 0 : (expected < limit ? expected : limit)) + 1, total = 0;
    for (;;) {
        if (sink_reserve(sink, want - total) < 0) {
            close(fd);
            errno = ENOMEM;
            return -1;
        }
        ssize_t got = read(fd, sink_end(sink) + total, (size_t)(want - total));
        if (got < 0) {
            if (errno == EINTR) continue;
            int failed = errno;
            close(fd);
            errno = failed;
            return -1;
        }
        total += got;
        /* A regular file reads short only at its end, so one read is usually all. */
        if (total < want || total > limit) break;
        want = want * 2 < limit + 1 ? want * 2 : limit + 1; /* it grew since it was listed: read on */
    }
    close(fd);
    sink->used += total;
    return total;
}

/* ------------------------------------------------------------------ SHA-1 */

static int blob_sha(const char *data, Py_ssize_t len, unsigned char out[20]) {
    char header[32];
    int header_len = snprintf(header, sizeof header, "blob %zd", len) + 1; /* with the NUL */
    unsigned int size = 0;
    if (!sha_ctx && !(sha_ctx = EVP_MD_CTX_new())) return -1;
    if (sha1_init(sha_ctx) != 1 ||
        EVP_DigestUpdate(sha_ctx, header, (size_t)header_len) != 1 ||
        EVP_DigestUpdate(sha_ctx, data, (size_t)len) != 1 || EVP_DigestFinal_ex(sha_ctx, out, &size) != 1)
        return -1;
    return 0;
}

static PyObject *git_blob_sha(PyObject *self, PyObject *arg) {
    Py_buffer view;
    unsigned char digest[20];
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    int failed = blob_sha(view.buf, view.len, digest);
    PyBuffer_Release(&view);
    if (failed) return PyErr_Format(PyExc_RuntimeError, "OpenSSL SHA-1 failed");
    return PyBytes_FromStringAndSize((const char *)digest, 20);
}

/* ------------------------------------------------------------------ content checks */

static int has_generated_marker(const unsigned char *data, Py_ssize_t len) {
    unsigned char head[4096];
    Py_ssize_t n = len < rules.generated_sniff ? len : rules.generated_sniff;
    if (n > (Py_ssize_t)sizeof head) n = sizeof head;
    for (Py_ssize_t i = 0; i < n; i++) head[i] = (data[i] >= 'A' && data[i] <= 'Z') ? data[i] + 32 : data[i];
    for (int m = 0; m < rules.markers; m++)
        if (memmem(head, (size_t)n, rules.marker[m], (size_t)rules.marker_len[m])) return 1;
    return 0;
}

/* ------------------------------------------------------------------ JSON escaping with UTF-8 validation */

/* Length of the valid UTF-8 sequence at p (lead byte >= 0x80), or 0 if invalid (RFC 3629, as Python). */
static Py_ssize_t utf8_sequence(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    Py_ssize_t avail = end - p;
    if (c >= 0xC2 && c <= 0xDF) return (avail >= 2 && (p[1] & 0xC0) == 0x80) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (avail < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && p[1] > 0x9F) return 0; /* surrogates */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (avail < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0; /* overlong */
        if (c == 0xF4 && p[1] > 0x8F) return 0; /* above U+10FFFF */
        return 4;
    }
    return 0;
}

static const char HEX[] = "0123456789abcdef";

/* The bytes that stop the fast copy: controls, '"', '\\', and every byte >= 0x80. */
static inline int is_special(unsigned char c) { return c < 0x20 || c == '"' || c == '\\' || c >= 0x80; }


/* What one escaping pass saw, for the content rules. */
typedef struct {
    Py_ssize_t longest_line;      /* bytes in the longest line, newline excluded */
    Py_ssize_t first_nul;         /* offset of the first NUL byte, or -1 */
    Py_ssize_t sample_newlines;   /* newlines within the first rules.mean_sample bytes */
} Seen;

/* How orjson writes each ASCII byte that needs escaping inside a JSON string: 8 bytes, `len` used. */
typedef struct {
    char text[8];
    Py_ssize_t len;
} Escape;

static Escape ESCAPES[128];

static void init_escapes(void) {
    for (int c = 0; c < 0x20; c++) {
        memcpy(ESCAPES[c].text, "\\u00", 4);
        ESCAPES[c].text[4] = HEX[c >> 4];
        ESCAPES[c].text[5] = HEX[c & 15];
        ESCAPES[c].len = 6;
    }
    const char *shorts = "\"\"\\\\\nn\tt\rr\bb\ff";
    for (int k = 0; shorts[k]; k += 2) {
        unsigned char c = (unsigned char)shorts[k];
        ESCAPES[c].text[0] = '\\';
        ESCAPES[c].text[1] = shorts[k + 1];
        ESCAPES[c].len = 2;
    }
}

/* Escape data into a new bytes object (NULL without an error set: not valid UTF-8).
 * Every 16-byte block is stored to the output before it is looked at (a speculative copy), so
 * runs of plain bytes cost one load and one store per block; the output is cut back to just before
 * the first byte that needs attention, which is then written escaped (or, for UTF-8, validated). */
#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_SPREAD 1
#include <tmmintrin.h>

/* Escaping a block of 16 bytes whose only specials are the two-byte escapes (\" \\ \b \t \n \f \r),
 * most blocks with specials in code: each half of 8 bytes is spread out with one byte shuffle, a
 * backslash going in before each special. SPREAD[m]: for the output bytes, which input byte each
 * takes (0x80: none) when the half's specials are the bits of m; SLASHES[m]: the backslashes. */
static unsigned char SPREAD[256][16], SLASHES[256][16], SPREAD_LEN[256];
static int have_ssse3;

static void init_spread(void) {
    for (int m = 0; m < 256; m++) {
        int k = 0;
        memset(SPREAD[m], 0x80, 16);
        memset(SLASHES[m], 0, 16);
        for (int j = 0; j < 8; j++) {
            if (m >> j & 1) SLASHES[m][k++] = '\\';
            SPREAD[m][k++] = (unsigned char)j;
        }
        SPREAD_LEN[m] = (unsigned char)k;
    }
    __builtin_cpu_init();
    have_ssse3 = __builtin_cpu_supports("ssse3");
}
#else
static void init_spread(void) {}
#endif

/* Append data, escaped as the body of a JSON string, to the sink: 1 done, 0 not valid UTF-8 (the
 * sink is left as it was), -1 error. `data` must not lie in the sink's own buffer. */
#define ESCAPE_FN escape_plain
#define ESCAPE_SPREAD 0
#include "escape_loop.h"

#if defined(HAVE_SPREAD)
#pragma GCC push_options
#pragma GCC target("ssse3")
#define ESCAPE_FN escape_spread
#define ESCAPE_SPREAD 1
#include "escape_loop.h"
#pragma GCC pop_options
#endif

/* Append data, escaped as the body of a JSON string, to the sink: 1 done, 0 not valid UTF-8 (the
 * sink is left as it was), -1 error. `data` must not lie in the sink's own buffer. */
static int escape_into(Sink *sink, const unsigned char *data, Py_ssize_t len, Seen *seen) {
#if defined(HAVE_SPREAD)
    if (have_ssse3) return escape_spread(sink, data, len, seen);
#endif
    return escape_plain(sink, data, len, seen);
}

/* data escaped as bytes (new reference), Py_None (new reference) if not UTF-8, NULL on error. */
static PyObject *escaped_bytes(const unsigned char *data, Py_ssize_t len, Seen *seen) {
    PyObject *array = PyByteArray_FromStringAndSize(NULL, 0), *result = NULL;
    if (!array) return NULL;
    Sink sink = sink_at_end(array);
    int done = escape_into(&sink, data, len, seen);
    if (done > 0) result = PyBytes_FromStringAndSize(PyByteArray_AS_STRING(array), sink.used);
    else if (done == 0) result = Py_NewRef(Py_None);
    Py_DECREF(array);
    return result;
}

/* 1: none of the content rules can apply (binary, minified); 0: let the Python rules decide.
 * The prose exemption of the mean-line rule needs the path, so those files go to Python. */
static int plain_by_rules(const Seen *seen, Py_ssize_t len) {
    if (seen->first_nul >= 0 && seen->first_nul < rules.binary_sniff) return 0;
    if (seen->longest_line > rules.long_line) return 0;
    return len < rules.mean_sample || seen->sample_newlines >= rules.mean_min_newlines;
}

static PyObject *escape(PyObject *self, PyObject *arg) {
    Py_buffer view;
    Seen seen;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *escaped = escaped_bytes(view.buf, view.len, &seen);
    PyBuffer_Release(&view);
    return escaped;
}

/* Whether a rule the escaping pass cannot see applies: sizes, and generator markers in the head. */
static int ruled_out_before_escaping(const unsigned char *data, Py_ssize_t len, Py_ssize_t limit, int skip_generated) {
    return len == 0 || len > limit || (skip_generated && has_generated_marker(data, len));
}

/* The escaped text of a plain text file (new reference), or NULL: with an error set on failure,
 * without one when the Python rules must decide (a content rule may apply, or not UTF-8). */
static PyObject *escape_if_plain(const unsigned char *data, Py_ssize_t len, Py_ssize_t limit, int skip_generated) {
    Seen seen;
    if (ruled_out_before_escaping(data, len, limit, skip_generated)) return NULL;
    PyObject *escaped = escaped_bytes(data, len, &seen);
    if (escaped == Py_None || (escaped && !plain_by_rules(&seen, len))) Py_CLEAR(escaped);
    return escaped;
}

static PyObject *sha_bytes(const char *data, Py_ssize_t len) {
    unsigned char digest[20];
    if (blob_sha(data, len, digest) < 0) return PyErr_Format(PyExc_RuntimeError, "OpenSSL SHA-1 failed");
    return PyBytes_FromStringAndSize((const char *)digest, 20);
}

static PyObject *encode(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t limit;
    int skip_generated;
    if (!rules.configured) return PyErr_Format(PyExc_RuntimeError, "_encode.configure() was not called");
    if (!PyArg_ParseTuple(args, "y*np", &view, &limit, &skip_generated)) return NULL;
    PyObject *result = NULL, *sha = NULL;
    PyObject *escaped = escape_if_plain(view.buf, view.len, limit, skip_generated);
    if (escaped) {
        sha = sha_bytes(view.buf, view.len);
        if (sha) result = PyTuple_Pack(3, Py_True, escaped, sha);
    } else if (!PyErr_Occurred()) {
        result = PyTuple_Pack(3, Py_False, Py_None, Py_None);
    }
    Py_XDECREF(escaped);
    Py_XDECREF(sha);
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------------ whole runs of files on disk */

/* Everything encode_dir_items needs besides the items; borrowed references. */
typedef struct {
    PyObject *headers, *record_starts, *split_prefixes; /* lists of bytes, per tree */
    PyObject *split_names;                              /* ("train", "val") */
    unsigned long long val_threshold;
    int all_val, skip_generated, dedupe;
    Py_ssize_t limit;
    PyObject *seen, *scanner, *trigger_requires, *skip, *fallback, *secrets;
    PyObject *clean;        /* a set of secrets.CleanHits keys, or Py_None */
    Py_ssize_t clean_line;  /* secrets.MAX_REMEMBERED_LINE */
    PyObject *shas, *txt_bytes, *jsonl_bytes, *sizes, *splits, *trees;
    PyObject *pending_txt, *pending_jsonl; /* bytearrays the fallback writes its records to */
    Sink txt, jsonl;
    OpenDir dir;
} Run;

static PyObject *DUPLICATE, *FIND_MATCHES;

/* 1 for "val": the first 8 bytes of SHA-1(source/repo/ + path), big-endian, below the threshold. */
static int is_val(const Run *run, Py_ssize_t tree, const char *path, Py_ssize_t path_len) {
    if (run->all_val) return 1;
    PyObject *prefix = PyList_GET_ITEM(run->split_prefixes, tree);
    unsigned char digest[20];
    unsigned int size = 0;
    if (!sha_ctx && !(sha_ctx = EVP_MD_CTX_new())) return -1;
    if (sha1_init(sha_ctx) != 1 ||
        EVP_DigestUpdate(sha_ctx, PyBytes_AS_STRING(prefix), (size_t)PyBytes_GET_SIZE(prefix)) != 1 ||
        EVP_DigestUpdate(sha_ctx, path, (size_t)path_len) != 1 || EVP_DigestFinal_ex(sha_ctx, digest, &size) != 1) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL SHA-1 failed");
        return -1;
    }
    unsigned long long h = 0;
    for (int k = 0; k < 8; k++) h = (h << 8) | digest[k];
    return h < run->val_threshold;
}

static int append_new(PyObject *list, PyObject *value) { /* steals value */
    if (!value) return -1;
    int failed = PyList_Append(list, value);
    Py_DECREF(value);
    return failed;
}

/* corpus.jsonl's fields before the text: record start, path, bytes, sha, split, `"text":"`. */
static int write_fields(Run *run, Py_ssize_t tree, const char *path, Py_ssize_t path_len, Py_ssize_t size,
                        const unsigned char *sha, int val) {
    PyObject *start = PyList_GET_ITEM(run->record_starts, tree);
    Seen seen;
    if (sink_append(&run->jsonl, PyBytes_AS_STRING(start), PyBytes_GET_SIZE(start)) < 0 ||
        sink_append(&run->jsonl, "\"", 1) < 0)
        return -1;
    int escaped = escape_into(&run->jsonl, (const unsigned char *)path, path_len, &seen);
    if (escaped <= 0) {
        if (escaped == 0) PyErr_SetString(PyExc_ValueError, "a corpus path is not valid UTF-8");
        return -1;
    }
    char tail[160], hex[41];
    for (int k = 0; k < 20; k++) hex[2 * k] = HEX[sha[k] >> 4], hex[2 * k + 1] = HEX[sha[k] & 15];
    hex[40] = 0;
    int tail_len = snprintf(tail, sizeof tail, "\",\"bytes\":%zd,\"sha\":\"%s\",\"split\":\"%s\",\"text\":\"",
                            size, hex, val ? "val" : "train");
    return sink_append(&run->jsonl, tail, tail_len);
}

/* corpus.txt's header line before a file. */
static int write_header(Run *run, Py_ssize_t tree, const char *path, Py_ssize_t path_len) {
    PyObject *start = PyList_GET_ITEM(run->headers, tree);
    return sink_append(&run->txt, PyBytes_AS_STRING(start), PyBytes_GET_SIZE(start)) < 0 ||
                   sink_append(&run->txt, path, path_len) < 0 || sink_append(&run->txt, " ---\n", 5) < 0
               ? -1
               : 0;
}

/* The row of a record just written to both buffers. */
static int add_columns(const Run *run, PyObject *item, PyObject *sha, Py_ssize_t size, Py_ssize_t txt_len,
                       Py_ssize_t jsonl_len, int val) {
    return PyList_Append(run->shas, sha) < 0 || append_new(run->txt_bytes, PyLong_FromSsize_t(txt_len)) < 0 ||
                   append_new(run->jsonl_bytes, PyLong_FromSsize_t(jsonl_len)) < 0 ||
                   append_new(run->sizes, PyLong_FromSsize_t(size)) < 0 ||
                   PyList_Append(run->splits, PyTuple_GET_ITEM(run->split_names, val)) < 0 ||
                   PyList_Append(run->trees, PyTuple_GET_ITEM(item, 0)) < 0
               ? -1
               : 0;
}

/* Whether any hit's rules could match in data: a trigger whose rules need a byte the file does not
 * have (secrets.TRIGGER_REQUIRES: URL credentials need `@`) is no reason to look closer. */
static int any_relevant_hit(const Run *run, PyObject *hits, const char *data, Py_ssize_t len) {
    signed char present[256];
    memset(present, -1, sizeof present); /* -1: not looked for yet */
    Py_ssize_t count = PyList_GET_SIZE(hits), known = PyTuple_GET_SIZE(run->trigger_requires);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *hit = PyList_GET_ITEM(hits, i);
        if (!PyTuple_Check(hit) || PyTuple_GET_SIZE(hit) < 1) return 1;
        Py_ssize_t trigger = PyLong_AsSsize_t(PyTuple_GET_ITEM(hit, 0));
        if (trigger < 0 || trigger >= known) {
            PyErr_Clear();
            return 1;
        }
        long required = PyLong_AsLong(PyTuple_GET_ITEM(run->trigger_requires, trigger));
        if (required < 0 || required > 255) return 1;
        if (present[required] < 0) present[required] = memchr(data, (int)required, (size_t)len) != NULL;
        if (present[required]) return 1;
    }
    return 0;
}

/* Whether the hit (trigger, start) is a clean hit remembered by secrets.CleanHits: the key is built
 * as CleanHits.unknown builds it, (trigger, offset in its line, the line), for lines shorter than
 * clean_line. 1 yes, 0 no, -1 error. */
static int known_clean(const Run *run, PyObject *trigger, Py_ssize_t start, const char *data, Py_ssize_t len) {
    if (start < 0 || start > len) return 0;
    Py_ssize_t line_start = start;
    while (line_start > 0 && data[line_start - 1] != '\n') line_start--;
    Py_ssize_t window = line_start + run->clean_line < len ? line_start + run->clean_line : len;
    const char *end = window > start ? memchr(data + start, '\n', (size_t)(window - start)) : NULL;
    Py_ssize_t line_end = end ? end - data : (len - line_start < run->clean_line ? len : -1);
    if (line_end < 0) return 0;
    PyObject *key = Py_BuildValue("(On y#)", trigger, start - line_start, data + line_start, line_end - line_start);
    if (!key) return -1;
    int found = PySet_Contains(run->clean, key);
    Py_DECREF(key);
    return found;
}

/* Whether every hit whose rules could match in data is a remembered clean hit (then the Python rules
 * would find nothing: secrets.redact_secrets passes those over). 1 yes, 0 no, -1 error. */
static int all_known_clean(const Run *run, PyObject *hits, const char *data, Py_ssize_t len) {
    if (!PyAnySet_Check(run->clean)) return 0;
    signed char present[256];
    memset(present, -1, sizeof present);
    Py_ssize_t count = PyList_GET_SIZE(hits), known = PyTuple_GET_SIZE(run->trigger_requires);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *hit = PyList_GET_ITEM(hits, i);
        if (!PyTuple_Check(hit) || PyTuple_GET_SIZE(hit) < 2) return 0;
        PyObject *trigger = PyTuple_GET_ITEM(hit, 0);
        Py_ssize_t index = PyLong_AsSsize_t(trigger), start = PyLong_AsSsize_t(PyTuple_GET_ITEM(hit, 1));
        if (index < 0 || index >= known || start < 0) {
            PyErr_Clear();
            return 0;
        }
        long required = PyLong_AsLong(PyTuple_GET_ITEM(run->trigger_requires, index));
        if (required > 255 || (required < 0 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        if (required >= 0) {
            if (present[required] < 0) present[required] = memchr(data, (int)required, (size_t)len) != NULL;
            if (!present[required]) continue; /* its rules cannot match in this file */
        }
        int clean = known_clean(run, trigger, start, data, len);
        if (clean <= 0) return clean;
    }
    return 1;
}

/* The secret scanner's hits in data (a new reference; NULL with an error set), or Py_None (new
 * reference too) when there are none worth a closer look (or all are remembered clean hits), or
 * redaction is off. */
static PyObject *secret_triggers(const Run *run, const char *data, Py_ssize_t len) {
    if (run->scanner == Py_None) Py_RETURN_NONE;
    PyObject *view = PyMemoryView_FromMemory((char *)data, len, PyBUF_READ);
    if (!view) return NULL;
    PyObject *hits = PyObject_CallMethodOneArg(run->scanner, FIND_MATCHES, view);
    Py_DECREF(view);
    if (!hits) return NULL;
    if (!PyList_Check(hits)) {
        Py_DECREF(hits);
        return PyErr_Format(PyExc_TypeError, "the secret scanner must return a list");
    }
    if (PyList_GET_SIZE(hits) > 0 && any_relevant_hit(run, hits, data, len)) {
        int clean = all_known_clean(run, hits, data, len);
        if (clean == 0) return hits;
        Py_DECREF(hits);
        if (clean < 0) return NULL;
    } else {
        Py_DECREF(hits);
    }
    Py_RETURN_NONE;
}

/* Move what the Python side wrote to a pending buffer into a sink, emptying the pending buffer. */
static int take_pending(Sink *sink, PyObject *pending) {
    Py_ssize_t len = PyByteArray_GET_SIZE(pending);
    if (len == 0) return 0;
    if (sink_append(sink, PyByteArray_AS_STRING(pending), len) < 0) return -1;
    return PyByteArray_Resize(pending, 0);
}

static int take_all_pending(Run *run) {
    return take_pending(&run->txt, run->pending_txt) < 0 || take_pending(&run->jsonl, run->pending_jsonl) < 0
               ? -1
               : 0;
}

/* Hand a file to the Python side: unreadable (data NULL), or for the content rules. A record it
 * makes goes to the pending buffers (the run's own buffers are bigger than their contents while it
 * runs), and from there after the run's records. */
static int hand_back(Run *run, PyObject *item, PyObject *data) {
    PyObject *called = PyObject_CallFunctionObjArgs(run->fallback, item, data ? data : Py_None, NULL);
    if (!called) return -1;
    Py_DECREF(called);
    return take_all_pending(run);
}

/* Let the secret rules look at a plain file whose scanner hits could be secrets: 1 when they
 * found some (and the Python side wrote the redacted record to the pending buffers), 0 when the
 * record written here stands, -1 error. */
static int check_secrets(Run *run, PyObject *item, PyObject *data, PyObject *sha, PyObject *hits) {
    PyObject *called = PyObject_CallFunctionObjArgs(run->secrets, item, data, sha, hits, NULL);
    if (!called) return -1;
    int redacted = PyObject_IsTrue(called);
    Py_DECREF(called);
    return redacted;
}

/* One file: written to both buffers, counted as a duplicate, or handed back. 0 done, -1 error. */
static int encode_dir_item(Run *run, PyObject *item, Py_ssize_t *bytes_read) {
    PyObject *path_obj = NULL, *data = NULL, *sha = NULL, *hits = NULL;
    int status = -1;
    Py_ssize_t tree = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 0)), path_len;
    const char *path = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(item, 1), &path_len);
    Py_ssize_t expected = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 3));
    if (!path || PyErr_Occurred()) return -1;
    if (tree < 0 || tree >= PyList_GET_SIZE(run->headers)) {
        PyErr_Format(PyExc_IndexError, "item names tree %zd, but there are %zd", tree, PyList_GET_SIZE(run->headers));
        return -1;
    }
    if (!PyUnicode_FSConverter(PyTuple_GET_ITEM(item, 2), &path_obj)) return -1;
    const Py_ssize_t txt_start = run->txt.used, jsonl_start = run->jsonl.used;
    if (write_header(run, tree, path, path_len) < 0) goto done;
    const Py_ssize_t data_at = run->txt.used;
    Py_ssize_t size = read_into(&run->txt, &run->dir, PyBytes_AS_STRING(path_obj), expected, run->limit);
    if (size < 0) {
        if (errno == ENOMEM && PyErr_Occurred()) goto done;
        run->txt.used = txt_start; /* vanished or unreadable: the Python side counts it */
        status = hand_back(run, item, NULL);
        goto done;
    }
    *bytes_read += size;
    /* From here on the file's bytes sit in corpus.txt's buffer, which stays put until the next append to it. */
#define DATA ((const unsigned char *)PyByteArray_AS_STRING(run->txt.array) + data_at)
    unsigned char digest[20];
    Seen seen;
    int val = is_val(run, tree, path, path_len), plain = 0;
    if (val < 0 || blob_sha((const char *)DATA, size, digest) < 0) goto done;
    if (!ruled_out_before_escaping(DATA, size, run->limit, run->skip_generated)) {
        if (write_fields(run, tree, path, path_len, size, digest, val) < 0) goto done;
        plain = escape_into(&run->jsonl, DATA, size, &seen);
        if (plain < 0) goto done;
        plain = plain && plain_by_rules(&seen, size);
    }
    if (!plain) { /* the content rules decide */
        if (!(data = PyBytes_FromStringAndSize((const char *)DATA, size))) goto done;
        run->txt.used = txt_start;
        run->jsonl.used = jsonl_start;
        status = hand_back(run, item, data);
        goto done;
    }
    if (!(sha = PyBytes_FromStringAndSize((const char *)digest, 20))) goto done;
    if (run->dedupe) {
        int duplicate = PySet_Contains(run->seen, sha);
        if (duplicate < 0 || (!duplicate && PySet_Add(run->seen, sha) < 0)) goto done;
        if (duplicate) {
            run->txt.used = txt_start;
            run->jsonl.used = jsonl_start;
            PyObject *called = PyObject_CallFunctionObjArgs(run->skip, PyTuple_GET_ITEM(item, 0), DUPLICATE, NULL);
            Py_XDECREF(called);
            status = called ? 0 : -1;
            goto done;
        }
    }
    if (!(hits = secret_triggers(run, (const char *)DATA, size))) goto done;
    if (hits != Py_None) { /* the secret rules look closer at each hit */
        if (!(data = PyBytes_FromStringAndSize((const char *)DATA, size))) goto done;
        int redacted = check_secrets(run, item, data, sha, hits);
        if (redacted < 0) goto done;
        if (redacted) { /* the redacted record replaces the one written here */
            run->txt.used = txt_start;
            run->jsonl.used = jsonl_start;
            status = take_all_pending(run);
            goto done;
        }
    }
    int newline_ended = size > 0 && DATA[size - 1] == '\n';
#undef DATA
    if ((!newline_ended && sink_append(&run->txt, "\n", 1) < 0) || sink_append(&run->jsonl, "\"}\n", 3) < 0)
        goto done;
    status = add_columns(run, item, sha, size, run->txt.used - txt_start, run->jsonl.used - jsonl_start, val);
done:
    Py_XDECREF(path_obj);
    Py_XDECREF(data);
    Py_XDECREF(sha);
    Py_XDECREF(hits);
    return status;
}

static int exact_list(PyObject *value, const char *name) {
    if (PyList_CheckExact(value)) return 0;
    PyErr_Format(PyExc_TypeError, "%s must be a list", name);
    return -1;
}

static PyObject *encode_dir_items(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"items", "headers", "record_starts", "split_prefixes", "split_names",
                            "val_threshold", "limit", "skip_generated", "dedupe", "seen", "scanner",
                            "trigger_requires", "txt", "jsonl", "pending", "columns", "skip", "fallback",
                            "secrets", "clean", "clean_line", NULL};
    Run run;
    PyObject *items, *threshold, *columns, *txt, *jsonl, *pending;
    if (!rules.configured) return PyErr_Format(PyExc_RuntimeError, "_encode.configure() was not called");
    run.clean = Py_None;
    run.clean_line = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OOOOOOnppOOO!O!O!O!OOOOOn", names, &items, &run.headers,
                                     &run.record_starts, &run.split_prefixes, &run.split_names, &threshold,
                                     &run.limit, &run.skip_generated, &run.dedupe, &run.seen, &run.scanner,
                                     &PyTuple_Type, &run.trigger_requires, &PyByteArray_Type, &txt,
                                     &PyByteArray_Type, &jsonl, &PyTuple_Type, &pending, &columns, &run.skip,
                                     &run.fallback, &run.secrets, &run.clean, &run.clean_line))
        return NULL;
    if (!PyArg_ParseTuple(pending, "O!O!", &PyByteArray_Type, &run.pending_txt, &PyByteArray_Type,
                          &run.pending_jsonl))
        return NULL;
    if (exact_list(items, "items") || exact_list(run.headers, "headers") ||
        exact_list(run.record_starts, "record_starts") || exact_list(run.split_prefixes, "split_prefixes"))
        return NULL;
    if (PyList_GET_SIZE(run.record_starts) != PyList_GET_SIZE(run.headers) ||
        PyList_GET_SIZE(run.split_prefixes) != PyList_GET_SIZE(run.headers))
        return PyErr_Format(PyExc_ValueError, "headers, record_starts and split_prefixes: one per tree");
    if (!PySet_Check(run.seen)) return PyErr_Format(PyExc_TypeError, "seen must be a set");
    if (!PyTuple_Check(run.split_names) || PyTuple_GET_SIZE(run.split_names) != 2)
        return PyErr_Format(PyExc_TypeError, "split_names must be (train, val)");
    if (!PyArg_ParseTuple(columns, "O!O!O!O!O!O!", &PyList_Type, &run.shas, &PyList_Type, &run.txt_bytes,
                          &PyList_Type, &run.jsonl_bytes, &PyList_Type, &run.sizes, &PyList_Type, &run.splits,
                          &PyList_Type, &run.trees))
        return NULL;
    /* the threshold may be 2**64 (every file in val) */
    run.val_threshold = PyLong_AsUnsignedLongLong(threshold);
    run.all_val = 0;
    if (run.val_threshold == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return NULL;
        PyErr_Clear();
        run.all_val = 1;
    }
    run.txt = sink_at_end(txt);
    run.jsonl = sink_at_end(jsonl);
    run.dir.fd = -1;
    /* Size both buffers for the whole run up front: growing them by doubling copies them over and over. */
    Py_ssize_t planned = 0, count = PyList_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        Py_ssize_t size = PyTuple_Check(item) && PyTuple_GET_SIZE(item) >= 4
                              ? PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 3)) : 0;
        if (size < 0) {
            PyErr_Clear();
            size = 0;
        }
        planned += size < run.limit ? size : run.limit;
    }
    if (sink_reserve(&run.txt, planned + count * 256 + 1) < 0 ||
        sink_reserve(&run.jsonl, planned + planned / 4 + count * 512 + 64) < 0)
        return NULL;
    Py_ssize_t bytes_read = 0;
    int failed = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items) && !failed; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 4) {
            PyErr_Format(PyExc_TypeError, "items must be (tree, path, ref, size) tuples");
            failed = 1;
            break;
        }
        Py_INCREF(item);
        failed = encode_dir_item(&run, item, &bytes_read) < 0;
        Py_DECREF(item);
    }
    if (run.dir.fd >= 0) close(run.dir.fd);
    if (!failed) failed = sink_settle(&run.txt) < 0 || sink_settle(&run.jsonl) < 0;
    else { /* keep the buffers' sizes honest for the caller, whatever happened */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        (void)(sink_settle(&run.txt) < 0 || sink_settle(&run.jsonl) < 0);
        PyErr_Restore(type, value, traceback);
    }
    return failed ? NULL : PyLong_FromSsize_t(bytes_read);
}

/* ------------------------------------------------------------------ memory */

/* A corpus worker allocates and frees about a chunk of file bytes at a time. glibc hands freed
 * memory at the top of the heap back to the kernel (and serves big blocks with fresh mappings),
 * so every chunk would fault its pages in again, which costs more than reading the files. */
static PyObject *retain_freed_memory(PyObject *self, PyObject *unused) {
#if defined(__GLIBC__)
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

/* Reserve disk blocks for the first `length` bytes of an output file without changing its size
 * (fallocate with FALLOC_FL_KEEP_SIZE): writing into reserved blocks costs the kernel less than its
 * delayed allocation does. False where the file system or the platform cannot. */
static PyObject *reserve_blocks(PyObject *self, PyObject *args) {
    int fd;
    long long length;
    if (!PyArg_ParseTuple(args, "iL:reserve_blocks", &fd, &length)) return NULL;
#if defined(__linux__) && defined(FALLOC_FL_KEEP_SIZE)
    int done = 0;
    if (length > 0) {
        Py_BEGIN_ALLOW_THREADS
        done = fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)length) == 0;
        Py_END_ALLOW_THREADS
    }
    return PyBool_FromLong(done);
#else
    (void)fd;
    Py_RETURN_FALSE;
#endif
}

/* ------------------------------------------------------------------ plan_span */

/* plan.plan_files, the per-file loop of a span of a directory tree's walk events: which files to read
 * (Items) and how many files the span has. The name rules are filters.name_skip_reason's: it is called
 * for every name that is a lock file or holds one of `hints` (filters.NAME_HINTS: every name its
 * patterns match holds one), and for every name that is not ASCII; other names pass them. Paths that
 * are not plain ASCII on one line go through plan.display_path; the selector, when there is one, is
 * asked of every file. The Python loop stays the reference; tests compare both. */
static PyObject *KIND_FILE, *REASON_EMPTY, *REASON_TOO_LARGE, *REASON_EXCLUDED;

static int ascii_name_has_hint(const char *name, Py_ssize_t len, PyObject *hints) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(hints); i++) {
        PyObject *hint = PyTuple_GET_ITEM(hints, i);
        if (memmem(name, (size_t)len, PyBytes_AS_STRING(hint), (size_t)PyBytes_GET_SIZE(hint))) return 1;
    }
    return 0;
}

/* The reason the name rules leave this file out (new reference), Py_None, or NULL on error. */
static PyObject *name_reason(PyObject *rel, PyObject *lock_files, PyObject *hints, PyObject *name_rule,
                             PyObject *skip_generated) {
    Py_ssize_t len = PyUnicode_GET_LENGTH(rel);
    Py_ssize_t slash = PyUnicode_FindChar(rel, '/', 0, len, -1);
    if (slash == -2) return NULL;
    PyObject *name = PyUnicode_Substring(rel, slash + 1, len);
    if (!name) return NULL;
    int check = !PyUnicode_IS_ASCII(name);
    if (!check) check = ascii_name_has_hint((const char *)PyUnicode_DATA(name), PyUnicode_GET_LENGTH(name), hints);
    if (!check) check = PySet_Contains(lock_files, name);
    PyObject *reason = check < 0 ? NULL
                       : check   ? PyObject_CallFunctionObjArgs(name_rule, name, skip_generated, NULL)
                                 : Py_NewRef(Py_None);
    Py_DECREF(name);
    return reason;
}

static int is_file_kind(PyObject *kind) {
    if (kind == KIND_FILE) return 1;
    if (!PyUnicode_Check(kind)) return 0;
    int compared = PyUnicode_Compare(kind, KIND_FILE);
    return compared == -1 && PyErr_Occurred() ? -1 : compared == 0;
}

/* The next pruned range (low, high) from the tuple, or (stop, stop) after the last. */
static int next_pruned(PyObject *pruned, Py_ssize_t *at, Py_ssize_t stop, Py_ssize_t *low, Py_ssize_t *high) {
    if (*at >= PyTuple_GET_SIZE(pruned)) {
        *low = *high = stop;
        return 0;
    }
    PyObject *range = PyTuple_GET_ITEM(pruned, (*at)++);
    return PyArg_ParseTuple(range, "nn;pruned ranges are (low, high) pairs", low, high) ? 0 : -1;
}

static PyObject *plan_span(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"events", "start", "stop", "pruned", "tree", "limit", "skip_generated",
                            "accepts", "lock_files", "hints", "name_rule", "display_path",
                            "item_type", "on_skip", NULL};
    PyObject *events, *pruned, *tree, *skip_generated, *accepts, *lock_files, *hints, *name_rule, *display, *on_skip;
    Py_ssize_t start, stop;
    long long limit;
    PyTypeObject *item_type;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$O!nnO!OLOOO!O!OOO!O", names, &PyList_Type, &events, &start,
                                     &stop, &PyTuple_Type, &pruned, &tree, &limit, &skip_generated, &accepts,
                                     &PyFrozenSet_Type, &lock_files, &PyTuple_Type, &hints, &name_rule, &display,
                                     &PyType_Type, &item_type, &on_skip))
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(hints); i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(hints, i))) return PyErr_Format(PyExc_TypeError, "hints must be bytes");
    if (!PyType_IsSubtype(item_type, &PyTuple_Type)) return PyErr_Format(PyExc_TypeError, "item_type must be a tuple type");
    if (start < 0 || stop > PyList_GET_SIZE(events) || start > stop) return PyErr_Format(PyExc_IndexError, "span out of range");
    PyObject *items = PyList_New(0);
    if (!items) return NULL;
    Py_ssize_t files = 0, pruned_at = 0, low, high, position = start;
    if (next_pruned(pruned, &pruned_at, stop, &low, &high) < 0) goto failed;
    while (position < stop) {
        if (position == low) { /* a vendored subtree: left out whole */
            position = high;
            if (next_pruned(pruned, &pruned_at, stop, &low, &high) < 0) goto failed;
            continue;
        }
        PyObject *event = PyList_GET_ITEM(events, position++);
        if (!PyTuple_Check(event) || PyTuple_GET_SIZE(event) < 4) {
            PyErr_SetString(PyExc_TypeError, "events must be walk events");
            goto failed;
        }
        int is_file = is_file_kind(PyTuple_GET_ITEM(event, 0));
        if (is_file < 0) goto failed;
        if (!is_file) continue;
        files++;
        PyObject *rel = PyTuple_GET_ITEM(event, 1), *ref = PyTuple_GET_ITEM(event, 2), *size = PyTuple_GET_ITEM(event, 3);
        if (!PyUnicode_Check(rel) || !PyLong_Check(size)) {
            PyErr_SetString(PyExc_TypeError, "a file event's rel must be a str and its size an int");
            goto failed;
        }
        PyObject *reason = name_reason(rel, lock_files, hints, name_rule, skip_generated);
        if (!reason) goto failed;
        if (reason == Py_None) {
            int overflow;
            long long bytes = PyLong_AsLongLongAndOverflow(size, &overflow);
            if (bytes == -1 && PyErr_Occurred()) {
                Py_DECREF(reason);
                goto failed;
            }
            if (overflow == 0 && bytes == 0) reason = Py_NewRef(REASON_EMPTY);
            else if (overflow > 0 || bytes > limit) reason = Py_NewRef(REASON_TOO_LARGE);
            if (reason != Py_None) Py_DECREF(Py_None);
        }
        if (reason == Py_None && accepts != Py_None) {
            PyObject *accepted = PyObject_CallOneArg(accepts, rel);
            int yes = accepted ? PyObject_IsTrue(accepted) : -1;
            Py_XDECREF(accepted);
            if (yes < 0) {
                Py_DECREF(reason);
                goto failed;
            }
            if (!yes) {
                Py_DECREF(reason);
                reason = Py_NewRef(REASON_EXCLUDED);
            }
        }
        if (reason != Py_None) {
            PyObject *done = PyObject_CallFunctionObjArgs(on_skip, reason, Py_False, NULL);
            Py_DECREF(reason);
            if (!done) goto failed;
            Py_DECREF(done);
            continue;
        }
        Py_DECREF(reason);
        int plain = PyUnicode_IS_ASCII(rel);
        if (plain) {
            const char *text = (const char *)PyUnicode_DATA(rel);
            Py_ssize_t len = PyUnicode_GET_LENGTH(rel);
            plain = !memchr(text, '\n', (size_t)len) && !memchr(text, '\r', (size_t)len);
        }
        PyObject *path = plain ? Py_NewRef(rel) : PyObject_CallOneArg(display, rel);
        if (!path) goto failed;
        PyObject *item = item_type->tp_alloc(item_type, 4);
        if (!item) {
            Py_DECREF(path);
            goto failed;
        }
        PyTuple_SET_ITEM(item, 0, Py_NewRef(tree));
        PyTuple_SET_ITEM(item, 1, path);
        PyTuple_SET_ITEM(item, 2, Py_NewRef(ref));
        PyTuple_SET_ITEM(item, 3, Py_NewRef(size));
        int appended = PyList_Append(items, item);
        Py_DECREF(item);
        if (appended < 0) goto failed;
    }
    return Py_BuildValue("(Nn)", items, files);
failed:
    Py_DECREF(items);
    return NULL;
}

/* ------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "Set the content-rule constants (keyword-only; from filters.py)."},
    {"encode", encode, METH_VARARGS,
     "encode(data, limit, skip_generated) -> (clean, escaped JSON body or None, git blob SHA-1 or None)"},
    {"escape", escape, METH_O, "escape(data) -> the JSON string body of valid UTF-8 data, or None"},
    {"encode_dir_items", (PyCFunction)(void (*)(void))encode_dir_items, METH_VARARGS | METH_KEYWORDS,
     "Encode a run of files on disk into corpus pieces (keyword-only; see chunks.py); returns bytes read."},
    {"retain_freed_memory", retain_freed_memory, METH_NOARGS,
     "Keep freed memory in this process (glibc): for short-lived worker processes."},
    {"git_blob_sha", git_blob_sha, METH_O, "git_blob_sha(data) -> the 20-byte SHA-1 git gives data as a blob"},
    {"plan_span", (PyCFunction)(void (*)(void))plan_span, METH_VARARGS | METH_KEYWORDS,
     "plan_span(*, events, start, stop, pruned, tree, limit, skip_generated, accepts, lock_files, hints, "
     "name_rule, display_path, item_type, on_skip) -> (items, files): plan.plan_files natively."},
    {"reserve_blocks", reserve_blocks, METH_VARARGS,
     "reserve_blocks(fd, length) -> bool: disk blocks for the file's first length bytes, its size unchanged"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_encode",
                                    "Native per-file hot path of the corpus build.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__encode(void) {
    init_escapes();
    init_spread();
    DUPLICATE = PyUnicode_InternFromString("duplicate");
    KIND_FILE = PyUnicode_InternFromString("file");
    REASON_EMPTY = PyUnicode_InternFromString("empty");
    REASON_TOO_LARGE = PyUnicode_InternFromString("too_large");
    REASON_EXCLUDED = PyUnicode_InternFromString("excluded");
    if (!KIND_FILE || !REASON_EMPTY || !REASON_TOO_LARGE || !REASON_EXCLUDED) return NULL;
    FIND_MATCHES = PyUnicode_InternFromString("find_matches_as_indexes");
    if (!DUPLICATE || !FIND_MATCHES) return NULL;
    if (!sha1_fetch()) return PyErr_Format(PyExc_ImportError, "OpenSSL has no SHA-1");
    return PyModule_Create(&module);
}
