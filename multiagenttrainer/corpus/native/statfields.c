/* multiagenttrainer.corpus._statfields: the per-entry loops of directory listings and their snapshots.
 *
 *   stat_fields(top, modes, paths) -> bytes
 *
 * For each path (bytes; relative to the directory top, absolute, or b"" for top itself), the 40-byte
 * STAT record of listing_cache.py in native byte order: type (0 missing, 1 directory, 2 regular file,
 * 3 symlink, 4 other), size, mtime_ns, ctime_ns, inode, all zero when the stat fails. modes[i] = 0
 * stats paths[i] without following a final symlink (lstat), 1 follows it; top itself is always
 * followed. Relative paths are resolved from a descriptor of top (fstatat), as the Python loop of
 * listing_cache.stat_fields_python does, so both give the same bytes. It decides nothing about
 * which files a walk lists: that is git's answer (gitview.py).
 *
 * The stats run without the GIL, split over up to MAX_THREADS threads (the calling one included).
 *
 *   file_events(entries, start, current, top, event_type, events) -> index
 *
 * The usual case of walk._Listing.events, the files of the directory open at the moment: from
 * entries[start] on, each (key, FILE, size, mtime_ns) whose key lies directly in the directory key
 * `current` is appended to `events` as event_type(("file", rel, top + rel, size, mtime_ns, "", False)),
 * rel being the key decoded as os.fsdecode does; returns the index of the first entry that is not such a
 * file (walk.py handles it). The Python loop there is the reference; tests compare both.
 *
 *   fingerprint_lines(events) -> bytes
 *
 * walk.files_fingerprint's text without a selector: `rel NUL size NUL mtime_ns LF` for each event whose
 * kind is "file", rel encoded as UTF-8 with surrogateescape.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FIELDS_BYTES 40
#define MAX_THREADS 4      /* as many as the kernel serves in parallel here; more only contend */
#define MIN_PER_THREAD 256 /* a thread is worth starting for this many paths */

enum { TYPE_MISSING, TYPE_DIR, TYPE_FILE, TYPE_SYMLINK, TYPE_OTHER };

typedef struct {
    int root_fd;
    const char *const *paths;
    const char *modes;
    char *out;
    Py_ssize_t from, to;
} Slice;

static int64_t ns_of(struct timespec ts) { return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec; }

static int64_t type_of(mode_t mode) {
    if (S_ISDIR(mode)) return TYPE_DIR;
    if (S_ISREG(mode)) return TYPE_FILE;
    return S_ISLNK(mode) ? TYPE_SYMLINK : TYPE_OTHER;
}

static void stat_one(int root_fd, const char *path, char mode, char *out) {
    struct stat st;
    int found;
    if (path[0] == '\0')
        found = root_fd >= 0 && fstat(root_fd, &st) == 0;
    else if (root_fd < 0 && path[0] != '/')
        found = 0;
    else
        found = fstatat(root_fd, path, &st, mode ? 0 : AT_SYMLINK_NOFOLLOW) == 0;
    int64_t fields[4] = {0, 0, 0, 0};
    uint64_t inode = 0;
    if (found) {
        fields[0] = type_of(st.st_mode);
        fields[1] = (int64_t)st.st_size;
        fields[2] = ns_of(st.st_mtim);
        fields[3] = ns_of(st.st_ctim);
        inode = (uint64_t)st.st_ino;
    }
    memcpy(out, fields, sizeof fields);
    memcpy(out + sizeof fields, &inode, sizeof inode);
}

static void *stat_slice(void *arg) {
    const Slice *s = arg;
    for (Py_ssize_t i = s->from; i < s->to; i++) stat_one(s->root_fd, s->paths[i], s->modes[i], s->out + i * FIELDS_BYTES);
    return NULL;
}

/* The paths as C strings (borrowed from the bytes objects of `items`); NULL with an exception set. */
static const char **c_paths(PyObject **items, Py_ssize_t count) {
    const char **paths = PyMem_Malloc((size_t)(count ? count : 1) * sizeof *paths);
    if (!paths) return (const char **)PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < count; i++) {
        char *data;
        Py_ssize_t len;
        if (!PyBytes_Check(items[i]) || PyBytes_AsStringAndSize(items[i], &data, &len) < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "paths must be bytes");
            PyMem_Free(paths);
            return NULL;
        }
        if ((Py_ssize_t)strlen(data) != len) {
            PyErr_SetString(PyExc_ValueError, "a path with a NUL byte");
            PyMem_Free(paths);
            return NULL;
        }
        paths[i] = data;
    }
    return paths;
}

static PyObject *stat_fields(PyObject *self, PyObject *args) {
    (void)self;
    const char *top, *modes;
    Py_ssize_t top_len, modes_len;
    PyObject *sequence;
    if (!PyArg_ParseTuple(args, "y#y#O:stat_fields", &top, &top_len, &modes, &modes_len, &sequence)) return NULL;
    if ((Py_ssize_t)strlen(top) != top_len) {
        PyErr_SetString(PyExc_ValueError, "a path with a NUL byte");
        return NULL;
    }
    PyObject *fast = PySequence_Tuple(sequence); /* a copy: the caller's list may change while we run */
    if (!fast) return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(fast);
    PyObject *result = NULL;
    const char **paths = NULL;
    if (count != modes_len) {
        PyErr_SetString(PyExc_ValueError, "one mode per path");
        goto done;
    }
    if (!(paths = c_paths(&PyTuple_GET_ITEM(fast, 0), count))) goto done;
    if (!(result = PyBytes_FromStringAndSize(NULL, count * FIELDS_BYTES))) goto done;
    char *out = PyBytes_AS_STRING(result);
    Py_BEGIN_ALLOW_THREADS
    int root_fd = open(top, O_RDONLY | O_CLOEXEC | O_DIRECTORY);
    Slice slices[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    int wanted = (int)(count / MIN_PER_THREAD), started = 0;
    int parts = wanted < 1 ? 1 : wanted > MAX_THREADS ? MAX_THREADS : wanted;
    for (int i = 0; i < parts; i++) {
        slices[i] = (Slice){root_fd, paths, modes, out, count * i / parts, count * (i + 1) / parts};
        /* slice 0 runs here; a thread that cannot start leaves its slice to this thread too */
        if (i > 0 && pthread_create(&threads[started], NULL, stat_slice, &slices[i]) == 0) started++;
        else if (i > 0) stat_slice(&slices[i]);
    }
    stat_slice(&slices[0]);
    for (int i = 0; i < started; i++) pthread_join(threads[i], NULL);
    if (root_fd >= 0) close(root_fd);
    Py_END_ALLOW_THREADS
done:
    PyMem_Free(paths);
    Py_DECREF(fast);
    return result;
}

/* ------------------------------------------------------------------ file_events */

static PyObject *FILE_KIND, *EMPTY; /* "file" and "" */

/* A WalkEvent (a tuple subclass) for a file: built as tuple.__new__(event_type, fields) would. */
static PyObject *file_event(PyTypeObject *event_type, PyObject *rel, PyObject *top, PyObject *size, PyObject *mtime) {
    PyObject *path = PyUnicode_Concat(top, rel);
    if (!path) return NULL;
    PyObject *event = event_type->tp_alloc(event_type, 7);
    if (!event) {
        Py_DECREF(path);
        return NULL;
    }
    PyObject *fields[7] = {FILE_KIND, rel, path, size, mtime, EMPTY, Py_False};
    for (int i = 0; i < 7; i++) PyTuple_SET_ITEM(event, i, i == 2 ? path : Py_NewRef(fields[i]));
    return event;
}

static PyObject *file_events(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *entries, *current, *top, *events;
    Py_ssize_t index;
    PyTypeObject *event_type;
    if (!PyArg_ParseTuple(args, "O!nSUO!O!:file_events", &PyList_Type, &entries, &index, &current, &top,
                          &PyType_Type, &event_type, &PyList_Type, &events))
        return NULL;
    if (!PyType_IsSubtype(event_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "event_type must be a tuple type");
        return NULL;
    }
    const char *open_dir = PyBytes_AS_STRING(current);
    Py_ssize_t open_len = PyBytes_GET_SIZE(current);
    for (; index >= 0 && index < PyList_GET_SIZE(entries); index++) {
        PyObject *entry = PyList_GET_ITEM(entries, index);
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 4) break;
        PyObject *key = PyTuple_GET_ITEM(entry, 0), *kind = PyTuple_GET_ITEM(entry, 1);
        if (!PyBytes_Check(key) || !PyLong_Check(kind)) break;
        int overflow;
        if (PyLong_AsLongAndOverflow(kind, &overflow) != 0 || overflow) break; /* FILE is 0 */
        const char *name = PyBytes_AS_STRING(key);
        Py_ssize_t len = PyBytes_GET_SIZE(key);
        if (len < open_len || memcmp(name, open_dir, (size_t)open_len) != 0 ||
            memchr(name + open_len, '/', (size_t)(len - open_len)) != NULL)
            break;
        PyObject *rel = PyUnicode_DecodeFSDefaultAndSize(name, len);
        if (!rel) return NULL;
        PyObject *event = file_event(event_type, rel, top, PyTuple_GET_ITEM(entry, 2), PyTuple_GET_ITEM(entry, 3));
        Py_DECREF(rel);
        if (!event || PyList_Append(events, event) < 0) {
            Py_XDECREF(event);
            return NULL;
        }
        Py_DECREF(event);
    }
    return PyLong_FromSsize_t(index);
}

/* ------------------------------------------------------------------ fingerprint_lines */

typedef struct {
    char *data;
    size_t len, capacity;
} Text;

static int text_append(Text *text, const char *bytes, size_t len) {
    if (text->len + len > text->capacity) {
        size_t wanted = text->capacity ? text->capacity * 2 : 1 << 16;
        while (wanted < text->len + len) wanted *= 2;
        char *moved = PyMem_Realloc(text->data, wanted);
        if (!moved) return -1;
        text->data = moved;
        text->capacity = wanted;
    }
    memcpy(text->data + text->len, bytes, len);
    text->len += len;
    return 0;
}

/* str(number) of an int, as Python writes it; -1 when it does not fit in 64 bits (the caller falls back). */
static int text_number(Text *text, PyObject *number) {
    int overflow;
    long long value = PyLong_Check(number) ? PyLong_AsLongLongAndOverflow(number, &overflow) : (overflow = 1, 0);
    if (overflow || (value == -1 && PyErr_Occurred())) return -1;
    char digits[24], *end = digits + sizeof digits, *at = end;
    unsigned long long magnitude = value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value;
    do *--at = (char)('0' + magnitude % 10);
    while ((magnitude /= 10) != 0);
    if (value < 0) *--at = '-';
    return text_append(text, at, (size_t)(end - at));
}

static PyObject *fingerprint_lines(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "events must be a list");
        return NULL;
    }
    Text text = {NULL, 0, 0};
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(arg); i++) {
        PyObject *event = PyList_GET_ITEM(arg, i);
        if (!PyTuple_Check(event) || PyTuple_GET_SIZE(event) < 5) {
            PyErr_SetString(PyExc_TypeError, "events must be walk events");
            goto done;
        }
        PyObject *kind = PyTuple_GET_ITEM(event, 0), *rel = PyTuple_GET_ITEM(event, 1);
        if (kind != FILE_KIND) {
            int same = PyUnicode_Check(kind) ? PyUnicode_Compare(kind, FILE_KIND) : 1;
            if (same == -1 && PyErr_Occurred()) goto done;
            if (same != 0) continue;
        }
        if (!PyUnicode_Check(rel)) {
            PyErr_SetString(PyExc_TypeError, "a walk event's rel must be a str");
            goto done;
        }
        PyObject *encoded = NULL;
        const char *bytes;
        Py_ssize_t len;
        if (PyUnicode_IS_ASCII(rel)) {
            bytes = (const char *)PyUnicode_DATA(rel);
            len = PyUnicode_GET_LENGTH(rel);
        } else {
            if (!(encoded = PyUnicode_AsEncodedString(rel, "utf-8", "surrogateescape"))) goto done;
            bytes = PyBytes_AS_STRING(encoded);
            len = PyBytes_GET_SIZE(encoded);
        }
        int failed = text_append(&text, bytes, (size_t)len) < 0 || text_append(&text, "\0", 1) < 0;
        Py_XDECREF(encoded);
        if (failed) {
            PyErr_NoMemory();
            goto done;
        }
        if (text_number(&text, PyTuple_GET_ITEM(event, 3)) < 0 || text_append(&text, "\0", 1) < 0 ||
            text_number(&text, PyTuple_GET_ITEM(event, 4)) < 0 || text_append(&text, "\n", 1) < 0) {
            if (!PyErr_Occurred()) result = Py_NewRef(Py_None); /* out of 64 bits: the Python loop decides */
            goto done;
        }
    }
    result = PyBytes_FromStringAndSize(text.data ? text.data : "", (Py_ssize_t)text.len);
done:
    PyMem_Free(text.data);
    return result;
}

static PyMethodDef methods[] = {
    {"stat_fields", stat_fields, METH_VARARGS,
     "stat_fields(top, modes, paths) -> bytes: 40 bytes of stat fields per path (listing_cache.STAT)."},
    {"file_events", file_events, METH_VARARGS,
     "file_events(entries, start, current, top, event_type, events) -> index: walk events of the open directory's files."},
    {"fingerprint_lines", fingerprint_lines, METH_O,
     "fingerprint_lines(events) -> bytes | None: the fingerprint text of the file events (None: out of 64 bits)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_statfields",
                                    "The stat loop of directory listings and their snapshots.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__statfields(void) {
    if (!FILE_KIND && !(FILE_KIND = PyUnicode_InternFromString("file"))) return NULL;
    if (!EMPTY && !(EMPTY = PyUnicode_InternFromString(""))) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "FIELDS_BYTES", FIELDS_BYTES)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
