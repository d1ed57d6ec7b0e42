/* multiagenttrainer.corpus._statfields: the stat loop of directory listings and their snapshots.
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

static PyMethodDef methods[] = {
    {"stat_fields", stat_fields, METH_VARARGS,
     "stat_fields(top, modes, paths) -> bytes: 40 bytes of stat fields per path (listing_cache.STAT)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_statfields",
                                    "The stat loop of directory listings and their snapshots.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__statfields(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "FIELDS_BYTES", FIELDS_BYTES)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
