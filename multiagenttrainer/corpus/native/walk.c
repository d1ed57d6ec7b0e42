/* multiagenttrainer.corpus._walk: the directory walk of walk.py in C, and the "nothing changed" check.
 *
 *   walk(root, root_rules, load_ignore, event_type, vcs_dirs, cache_dirs, salt, record)
 *       -> (events, fingerprint, records | None, record_count)
 *   verify(snapshot_path, root, key) -> fingerprint | None
 *
 * `walk` returns exactly the WalkEvent list of walk.py's Python walk (same order, kinds, reasons, sizes,
 * mtimes and paths), the SHA-1 fingerprint of (rel, size, mtime_ns) of its files, and, when asked, the
 * records of a listing snapshot: every directory entered, every file event and every .gitignore read,
 * with the stat fields that change when they do. Parsing .gitignore files stays in Python (`load_ignore`
 * returns the accepted patterns as (body, negated, dir_only)); matching them is git's own: dir.c's
 * basename/pathname rules around a port of wildmatch.c (WM_PATHNAME). Where dulwich (behind the Python
 * walk) and git disagree, this follows git: see tests/corpus/test_native_walk.py.
 *
 * Directories are read, decided and stat-ed on up to MAX_READERS threads without the GIL; the events are
 * then made on the caller's thread in git order, so the result does not depend on the threads.
 *
 * `verify` stats every record of a snapshot (two threads) and returns its fingerprint only when nothing
 * changed and no recorded time is close enough to the walk to be racy (git's racy-git rule).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

/* ------------------------------------------------------------------------------------ constants */

static PyObject *s_file, *s_dir, *s_skip, *s_ignored, *s_cache, *s_symlink, *s_unreadable, *s_empty;
static PyObject *zero;

#define RECORD_DIR 1          /* lstat: a directory with the same mtime, ctime and inode */
#define RECORD_FILE 2         /* lstat: a regular file with the same size, mtime, ctime and inode */
#define RECORD_FOLLOW_FILE 3  /* stat (symlinks followed): the same, e.g. .git/info/exclude */
#define RECORD_ABSENT 4       /* stat: no regular file there (an exclude file that did not exist) */
#define RECORD_FIXED 40       /* kind u8, 3 pad, rel_len u32, size i64, mtime i64, ctime i64, ino u64 */
#define SNAPSHOT_MAGIC "MATLIST1"
#define SNAPSHOT_FIXED 32     /* magic, start i64, root_len, key_len, fp_len, count (u32 each) */
#define SHA1_LEN 20
#define RACY_NS 2000000000LL  /* a recorded time this close to the walk's start may hide an edit */
#define MAX_READERS 4         /* threads reading directories; more only contend in the kernel */

/* ---------------------------------------------------------------------------------- byte buffer */

typedef struct {
    char *data;
    size_t len, cap;
} Buf;

static int buf_reserve(Buf *b, size_t extra) {
    if (extra > SIZE_MAX / 4 || b->len > SIZE_MAX / 4) return -1; /* no size this walk can reach */
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) cap *= 2;
    char *data = realloc(b->data, cap);
    if (!data) return -1;
    b->data = data;
    b->cap = cap;
    return 0;
}

static int buf_append(Buf *b, const void *bytes, size_t n) {
    if (buf_reserve(b, n + 1)) return -1;
    memcpy(b->data + b->len, bytes, n);
    b->len += n;
    b->data[b->len] = '\0'; /* always a C string: paths are handed to syscalls and wildmatch as is */
    return 0;
}

static void buf_truncate(Buf *b, size_t len) {
    b->len = len;
    if (b->data) b->data[len] = '\0';
}

/* --------------------------------------------------------------------- git's wildmatch, ported */
/* The algorithm of git's wildmatch.c with WM_PATHNAME always on (git matches basename-only patterns
 * without it, but a basename holds no '/', where the two modes differ) and no case folding. The
 * character classes are git's sane-ctype ones: ASCII only. */

enum { WM_MATCH, WM_NOMATCH, WM_ABORT_ALL, WM_ABORT_TO_STARSTAR };

static int is_glob_special(unsigned char c) { return c == '*' || c == '?' || c == '[' || c == '\\'; }

static int is_upper(unsigned char c) { return c >= 'A' && c <= 'Z'; }
static int is_lower(unsigned char c) { return c >= 'a' && c <= 'z'; }
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int is_alpha(unsigned char c) { return is_upper(c) || is_lower(c); }
static int is_alnum(unsigned char c) { return is_alpha(c) || is_digit(c); }
static int is_graph(unsigned char c) { return c > 0x20 && c < 0x7f; }

/* 1 or 0: whether c is in the POSIX class name[:len]; -1: no such class (git aborts the match). */
static int posix_class_has(const unsigned char *name, long len, unsigned char c) {
#define CLASS_IS(text) (len == (long)sizeof(text) - 1 && memcmp(name, text, (size_t)len) == 0)
    if (CLASS_IS("alnum")) return is_alnum(c);
    if (CLASS_IS("alpha")) return is_alpha(c);
    if (CLASS_IS("blank")) return c == ' ' || c == '\t';
    if (CLASS_IS("cntrl")) return c < 0x20 || c == 0x7f;
    if (CLASS_IS("digit")) return is_digit(c);
    if (CLASS_IS("graph")) return is_graph(c);
    if (CLASS_IS("lower")) return is_lower(c);
    if (CLASS_IS("print")) return c >= 0x20 && c < 0x7f;
    if (CLASS_IS("punct")) return is_graph(c) && !is_alnum(c);
    if (CLASS_IS("space")) return c == ' ' || c == '\t' || c == '\n' || c == '\r';
    if (CLASS_IS("upper")) return is_upper(c);
    if (CLASS_IS("xdigit")) return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    return -1;
#undef CLASS_IS
}

/* Match a bracket expression opening at *pp ('[') against t; leaves *pp on its closing ']'. */
static int match_bracket(const unsigned char **pp, unsigned char t) {
    const unsigned char *p = *pp;
    unsigned char c = *++p;
    if (c == '^') c = '!';
    int negated = c == '!';
    if (negated) c = *++p;
    unsigned char prev = 0;
    int matched = 0;
    do {
        if (!c) return WM_ABORT_ALL;
        if (c == '\\') {
            c = *++p;
            if (!c) return WM_ABORT_ALL;
            if (t == c) matched = 1;
        } else if (c == '-' && prev && p[1] && p[1] != ']') {
            c = *++p;
            if (c == '\\') {
                c = *++p;
                if (!c) return WM_ABORT_ALL;
            }
            if (t <= c && t >= prev) matched = 1;
            c = 0; /* a range is not the low end of another one */
        } else if (c == '[' && p[1] == ':') {
            const unsigned char *name = p += 2;
            while ((c = *p) && c != ']') p++;
            if (!c) return WM_ABORT_ALL;
            long len = (long)(p - name) - 1;
            if (len < 0 || p[-1] != ':') { /* no ":]": the '[' is a plain member */
                p = name - 2;
                c = '[';
                if (t == c) matched = 1;
                continue;
            }
            int has = posix_class_has(name, len, t);
            if (has < 0) return WM_ABORT_ALL;
            if (has) matched = 1;
            c = 0;
        } else if (t == c) {
            matched = 1;
        }
    } while (prev = c, (c = *++p) != ']');
    *pp = p;
    if (matched == negated || t == '/') return WM_NOMATCH;
    return WM_MATCH;
}

static int wildmatch(const unsigned char *p, const unsigned char *text) {
    const unsigned char *start = p;
    for (; *p; text++, p++) {
        unsigned char t = *text, c = *p;
        int matched, match_slash;
        if (t == '\0' && c != '*') return WM_ABORT_ALL;
        switch (c) {
        case '\\':
            c = *++p; /* a trailing backslash compares '\0' with a non-NUL byte: no match */
            /* fall through */
        default:
            if (t != c) return WM_NOMATCH;
            continue;
        case '?':
            if (t == '/') return WM_NOMATCH;
            continue;
        case '[':
            matched = match_bracket(&p, t);
            if (matched != WM_MATCH) return matched;
            continue;
        case '*':
            if (*++p == '*') {
                const unsigned char *before = p - 2;
                while (*++p == '*') {
                }
                if ((before < start || *before == '/') &&
                    (*p == '\0' || *p == '/' || (p[0] == '\\' && p[1] == '/'))) {
                    /* a whole "**" component: first try it as no directory at all */
                    if (p[0] == '/' && wildmatch(p + 1, text) == WM_MATCH) return WM_MATCH;
                    match_slash = 1;
                } else {
                    match_slash = 0;
                }
            } else {
                match_slash = 0;
            }
            if (*p == '\0') {
                if (!match_slash && strchr((const char *)text, '/')) return WM_NOMATCH;
                return WM_MATCH;
            }
            if (!match_slash && *p == '/') { /* "*" then "/": the rest of this component */
                const char *slash = strchr((const char *)text, '/');
                if (!slash) return WM_NOMATCH;
                text = (const unsigned char *)slash;
                break; /* the loop steps over the slash in both */
            }
            for (;;) {
                if (t == '\0') break;
                if (!is_glob_special(*p)) { /* skip ahead to the next occurrence of the literal */
                    c = *p;
                    while ((t = *text) != '\0' && (match_slash || t != '/')) {
                        if (t == c) break;
                        text++;
                    }
                    if (t != c) return WM_NOMATCH;
                }
                matched = wildmatch(p, text);
                if (matched != WM_NOMATCH) {
                    if (!match_slash || matched != WM_ABORT_TO_STARSTAR) return matched;
                } else if (!match_slash && t == '/') {
                    return WM_ABORT_TO_STARSTAR;
                }
                t = *++text;
            }
            return WM_ABORT_ALL;
        }
    }
    return *text ? WM_NOMATCH : WM_MATCH;
}

/* --------------------------------------------------------------------------- gitignore rules */

typedef struct {
    char *text;       /* without '!' and the trailing '/'; pathname patterns without a leading '/' */
    size_t len;
    size_t literal;   /* leading bytes without glob characters, compared literally (dir.c's nowildcardlen) */
    unsigned char negated, dir_only, basename_only, never;
} Rule;

/* The rules of one ignore file, linked to those of the directories above (shallower, lower precedence). */
typedef struct Level {
    const struct Level *parent;
    size_t prefix;    /* length of the rel path of the ignore file's directory, with its '/'; 0 at the top */
    Rule *rules;
    size_t count;
} Level;

static size_t literal_length(const char *text) {
    size_t n = 0;
    while (text[n] && !is_glob_special((unsigned char)text[n])) n++;
    return n;
}

/* dir.c's match_basename: a pattern without '/' matches the entry's name at any depth. */
static int basename_matches(const Rule *rule, const char *base, size_t base_len) {
    if (rule->literal == rule->len) return base_len == rule->len && memcmp(base, rule->text, base_len) == 0;
    return wildmatch((const unsigned char *)rule->text, (const unsigned char *)base) == WM_MATCH;
}

/* dir.c's match_pathname: the literal head compared as bytes, the rest with wildmatch. Like git, a "**"
 * right after that head counts as starting the pattern. */
static int pathname_matches(const Rule *rule, const char *path, size_t path_len) {
    size_t literal = rule->literal;
    if (literal) {
        if (literal > path_len || memcmp(rule->text, path, literal) != 0) return 0;
        if (literal == rule->len) return literal == path_len;
    }
    return wildmatch((const unsigned char *)rule->text + literal, (const unsigned char *)path + literal) ==
           WM_MATCH;
}

/* 1 ignored, 0 re-included, -1 no pattern of this file matches (IgnoreFile.decide). */
static int level_decides(const Level *level, const char *rel, size_t rel_len, size_t base_at, int is_dir) {
    const char *path = rel + level->prefix;
    size_t path_len = rel_len - level->prefix;
    for (size_t i = level->count; i-- > 0;) {
        const Rule *rule = &level->rules[i];
        if (rule->never || (rule->dir_only && !is_dir)) continue;
        int hit = rule->basename_only ? basename_matches(rule, rel + base_at, rel_len - base_at)
                                      : pathname_matches(rule, path, path_len);
        if (hit) return !rule->negated;
    }
    return -1;
}

/* IgnoreStack.is_ignored: the deepest ignore file with a matching pattern decides. rel is NUL-terminated;
 * its last component (the entry's name) starts at base_at. */
static int is_ignored(const Level *level, const char *rel, size_t rel_len, size_t base_at, int is_dir) {
    for (; level; level = level->parent) {
        int decision = level_decides(level, rel, rel_len, base_at, is_dir);
        if (decision >= 0) return decision;
    }
    return 0;
}

static void level_free(Level *level) {
    if (!level) return;
    for (size_t i = 0; i < level->count; i++) free(level->rules[i].text);
    free(level->rules);
    free(level);
}

/* A Level from load_ignore's list of (body: bytes, negated: bool, dir_only: bool); NULL with an exception. */
static Level *level_from_list(PyObject *list, size_t prefix, const Level *parent) {
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "ignore rules must be a list of (bytes, bool, bool)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(list);
    Level *level = calloc(1, sizeof(Level));
    if (!level || !(level->rules = calloc(n ? (size_t)n : 1, sizeof(Rule)))) {
        free(level);
        PyErr_NoMemory();
        return NULL;
    }
    level->parent = parent;
    level->prefix = prefix;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *body;
        Py_ssize_t len;
        int negated, dir_only;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(list, i), "y#pp;ignore rules must be (bytes, bool, bool)", &body,
                              &len, &negated, &dir_only)) {
            level_free(level);
            return NULL;
        }
        Rule *rule = &level->rules[level->count++];
        rule->negated = (unsigned char)negated;
        rule->dir_only = (unsigned char)dir_only;
        rule->never = memchr(body, '\0', (size_t)len) != NULL; /* the Python matcher never matches these */
        rule->basename_only = memchr(body, '/', (size_t)len) == NULL;
        if (!rule->basename_only && len > 0 && body[0] == '/') { /* anchored: relative to its directory */
            body++;
            len--;
        }
        if (!(rule->text = malloc((size_t)len + 1))) {
            level_free(level);
            PyErr_NoMemory();
            return NULL;
        }
        memcpy(rule->text, body, (size_t)len);
        rule->text[len] = '\0';
        rule->len = rule->never ? 0 : (size_t)len;
        rule->literal = literal_length(rule->text);
        if (rule->literal > rule->len) rule->literal = rule->len;
    }
    return level;
}

/* ------------------------------------------------------------- reading directories (no GIL, threads) */
/* The walk runs in two passes. First, worker threads (the caller's among them, all without the GIL)
 * take directories from a shared queue, read and sort their entries, load their .gitignore (taking the
 * GIL for the Python parser), decide every entry and stat the files, and queue the subdirectories to
 * enter. Then one pass in git order, with the GIL, turns that tree into WalkEvents. */

enum { TYPE_DIR, TYPE_FILE, TYPE_LINK, TYPE_OTHER };
enum { ACT_NONE, ACT_FILE, ACT_SKIP_IGNORED, ACT_SKIP_SYMLINK, ACT_SKIP_IGNORED_DIR, ACT_SKIP_CACHE, ACT_ENTER };
enum { DIR_READ, DIR_UNREADABLE, DIR_FAILED };

typedef struct {
    int64_t size, mtime, ctime;
    uint64_t ino;
    int known;
} StatFields;

typedef struct Dir Dir;

typedef struct {
    const char *name;
    size_t len;
    unsigned char type, action, d_type;
    StatFields st;
    Dir *child;       /* ACT_ENTER: the directory to walk */
} Entry;

struct Dir {
    char *rel;        /* relative to the root, no trailing '/'; "" for the root */
    size_t rel_len;
    const Level *levels;  /* the ignore rules in force for its entries */
    Level *own;       /* the rules of its own .gitignore, if any */
    Entry *entries;
    size_t count;
    char *names;
    StatFields st, ignore_st;  /* the directory's and its .gitignore's, for the snapshot */
    int state;
    int err;          /* DIR_FAILED or DIR_UNREADABLE by a syscall: its errno, and the path for DIR_FAILED */
    char *err_path;
    PyObject *exc_type, *exc_value, *exc_tb;  /* raised by load_ignore (OSError: the dir is unreadable) */
};

typedef struct {
    const char **names;
    size_t *lens;
    size_t count;
} NameSet;

typedef struct {
    int root_fd;
    char *top;        /* the root, then '/' */
    size_t top_len;
    NameSet vcs, cache;
    PyObject *load_ignore;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    Dir **queue, **all;
    size_t queued, queue_cap, all_count, all_cap;
    int busy;         /* workers reading a directory (which may queue more) */
    int locks_ready, helpers_started, helper_count;
    pthread_t helpers[MAX_READERS];
} Reader;

static int64_t ns_of(struct timespec ts) { return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec; }

static void fill_stat(StatFields *out, const struct stat *st) {
    out->size = (int64_t)st->st_size;
    out->mtime = ns_of(st->st_mtim);
    out->ctime = ns_of(st->st_ctim);
    out->ino = (uint64_t)st->st_ino;
    out->known = 1;
}

static unsigned char type_of_mode(mode_t mode) {
    if (S_ISDIR(mode)) return TYPE_DIR;
    if (S_ISREG(mode)) return TYPE_FILE;
    if (S_ISLNK(mode)) return TYPE_LINK;
    return TYPE_OTHER;
}

/* git's tree order: names compared as bytes, a directory as "name/". */
static int entry_order(const void *a, const void *b) {
    const Entry *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->name, y->name, n);
    if (c) return c;
    int cx = x->len > n ? (unsigned char)x->name[n] : x->type == TYPE_DIR ? '/' : -1;
    int cy = y->len > n ? (unsigned char)y->name[n] : y->type == TYPE_DIR ? '/' : -1;
    return cx - cy;
}

static int in_name_set(const NameSet *set, const char *name, size_t len) {
    for (size_t i = 0; i < set->count; i++)
        if (set->lens[i] == len && memcmp(set->names[i], name, len) == 0) return 1;
    return 0;
}

static void dir_free(Dir *dir);

static void dir_fail(Dir *dir, int err, const char *path) {
    dir->state = DIR_FAILED;
    dir->err = err;
    free(dir->err_path);
    dir->err_path = path ? strdup(path) : NULL;
}

/* Read a directory's entries, typed (lstat where the file system does not say) and sorted. */
static int read_entries(Dir *dir, DIR *handle) {
    Buf names = {0};
    size_t count = 0, cap = 0;
    Entry *entries = NULL;
    struct dirent *de;
    errno = 0;
    while ((de = readdir(handle)) != NULL) {
        const char *name = de->d_name;
        if (name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'))) continue;
        if (count == cap) {
            cap = cap ? cap * 2 : 64;
            Entry *grown = realloc(entries, cap * sizeof(Entry));
            if (!grown) goto fail;
            entries = grown;
        }
        size_t len = strlen(name);
        Entry *entry = &entries[count++];
        memset(entry, 0, sizeof *entry);
        entry->name = (const char *)(uintptr_t)names.len; /* an offset until `names` stops growing */
        entry->len = len;
        entry->d_type = de->d_type;
        if (buf_append(&names, name, len + 1)) goto fail;
        errno = 0;
    }
    if (errno) goto fail;
    for (size_t i = 0; i < count; i++) {
        Entry *entry = &entries[i];
        entry->name = names.data + (uintptr_t)entry->name;
        switch (entry->d_type) {
        case DT_DIR: entry->type = TYPE_DIR; break;
        case DT_REG: entry->type = TYPE_FILE; break;
        case DT_LNK: entry->type = TYPE_LINK; break;
        case DT_UNKNOWN: {
            struct stat st;
            if (fstatat(dirfd(handle), entry->name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
                entry->type = type_of_mode(st.st_mode);
                fill_stat(&entry->st, &st);
            } else {
                entry->type = TYPE_OTHER; /* gone: as os.DirEntry, neither a directory nor a file */
            }
            break;
        }
        default: entry->type = TYPE_OTHER;
        }
    }
    qsort(entries, count, sizeof(Entry), entry_order);
    dir->entries = entries;
    dir->count = count;
    dir->names = names.data;
    return 0;
fail:
    dir->err = errno ? errno : ENOMEM;
    free(entries);
    free(names.data);
    return -1;
}

/* The bytes of root + '/' + rel + '/' + name (rel may be empty), NUL-terminated, in out. */
static int join_path(Buf *out, const Reader *r, const Dir *dir, const char *name, size_t len) {
    buf_truncate(out, 0);
    if (buf_append(out, r->top, r->top_len) || buf_append(out, dir->rel, dir->rel_len)) return -1;
    if (dir->rel_len && buf_append(out, "/", 1)) return -1;
    return buf_append(out, name, len);
}

/* Hand the directory's .gitignore (a regular file) to load_ignore, with the GIL, and keep its rules. */
static void load_dir_ignore(Reader *r, Dir *dir, DIR *handle, Buf *scratch) {
    const Entry *found = NULL;
    for (size_t i = 0; i < dir->count; i++) {
        if (dir->entries[i].len == 10 && memcmp(dir->entries[i].name, ".gitignore", 10) == 0) {
            found = &dir->entries[i];
            break;
        }
    }
    if (!found || found->type != TYPE_FILE) return;
    struct stat st; /* stat before reading: an edit after this shows in the snapshot */
    if (fstatat(dirfd(handle), found->name, &st, AT_SYMLINK_NOFOLLOW) == 0) fill_stat(&dir->ignore_st, &st);
    if (join_path(scratch, r, dir, found->name, found->len)) {
        dir_fail(dir, ENOMEM, NULL);
        return;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *path = PyUnicode_DecodeFSDefaultAndSize(scratch->data, (Py_ssize_t)scratch->len);
    PyObject *rules = path ? PyObject_CallOneArg(r->load_ignore, path) : NULL;
    Py_XDECREF(path);
    size_t prefix = dir->rel_len ? dir->rel_len + 1 : 0;
    if (rules && (dir->own = level_from_list(rules, prefix, dir->levels)) != NULL) dir->levels = dir->own;
    Py_XDECREF(rules);
    if (PyErr_Occurred()) {
        /* OSError: unreadable, as when os.scandir fails; the root re-raises it. Anything else is raised. */
        dir->state = PyErr_ExceptionMatches(PyExc_OSError) ? DIR_UNREADABLE : DIR_FAILED;
        PyErr_Fetch(&dir->exc_type, &dir->exc_value, &dir->exc_tb);
    }
    PyGILState_Release(gil);
}

static Dir *new_child(const Dir *parent, const Entry *entry) {
    Dir *child = calloc(1, sizeof(Dir));
    size_t len = parent->rel_len ? parent->rel_len + 1 + entry->len : entry->len;
    if (!child || !(child->rel = malloc(len + 1))) {
        free(child);
        return NULL;
    }
    size_t at = 0;
    if (parent->rel_len) {
        memcpy(child->rel, parent->rel, parent->rel_len);
        child->rel[parent->rel_len] = '/';
        at = parent->rel_len + 1;
    }
    memcpy(child->rel + at, entry->name, entry->len);
    child->rel[len] = '\0';
    child->rel_len = len;
    child->levels = parent->levels;
    return child;
}

/* walk.py's per-entry rules: VCS, cache and ignored directories; ignored files; files stat-ed. */
static void classify_entries(const Reader *r, Dir *dir, DIR *handle, Buf *scratch) {
    size_t base_at = dir->rel_len ? dir->rel_len + 1 : 0;
    buf_truncate(scratch, 0);
    if (buf_append(scratch, dir->rel, dir->rel_len) || (dir->rel_len && buf_append(scratch, "/", 1))) {
        dir_fail(dir, ENOMEM, NULL);
        return;
    }
    for (size_t i = 0; i < dir->count && dir->state == DIR_READ; i++) {
        Entry *entry = &dir->entries[i];
        buf_truncate(scratch, base_at);
        if (buf_append(scratch, entry->name, entry->len)) {
            dir_fail(dir, ENOMEM, NULL);
            return;
        }
        if (entry->type == TYPE_DIR) {
            if (in_name_set(&r->vcs, entry->name, entry->len))
                entry->action = ACT_NONE;
            else if (in_name_set(&r->cache, entry->name, entry->len))
                entry->action = ACT_SKIP_CACHE;
            else if (is_ignored(dir->levels, scratch->data, scratch->len, base_at, 1))
                entry->action = ACT_SKIP_IGNORED_DIR;
            else if (!(entry->child = new_child(dir, entry)))
                dir_fail(dir, ENOMEM, NULL);
            else
                entry->action = ACT_ENTER;
            continue;
        }
        if (is_ignored(dir->levels, scratch->data, scratch->len, base_at, 0)) {
            entry->action = ACT_SKIP_IGNORED;
        } else if (entry->type == TYPE_FILE) {
            struct stat st;
            if (r->top_len + scratch->len >= PATH_MAX) { /* os.DirEntry.stat would fail on the long path */
                errno = ENAMETOOLONG;
            } else if (fstatat(dirfd(handle), entry->name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
                fill_stat(&entry->st, &st);
                entry->action = ACT_FILE;
                continue;
            }
            if (errno == ENOENT) continue; /* deleted since the directory was read */
            int err = errno; /* the walk stops here: scratch may hold the error's path */
            dir_fail(dir, err, join_path(scratch, r, dir, entry->name, entry->len) ? NULL : scratch->data);
        } else {
            entry->action = entry->type == TYPE_LINK ? ACT_SKIP_SYMLINK : ACT_NONE;
        }
    }
}

/* Open a directory relative to the root; -1 with errno as os.scandir on its absolute path would. */
static int open_dir(const Reader *r, const Dir *dir) {
    if (!dir->rel_len) return fcntl(r->root_fd, F_DUPFD_CLOEXEC, 0);
    if (r->top_len + dir->rel_len >= PATH_MAX) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return openat(r->root_fd, dir->rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

/* Read one directory: its entries, its .gitignore, every entry decided. Never fails: the outcome is
 * dir->state (an unreadable directory is part of the walk's result, as in walk.py). */
static void read_dir(Reader *r, Dir *dir, Buf *scratch) {
    struct stat st;
    dir->state = DIR_READ;
    int fd = open_dir(r, dir);
    DIR *handle = fd < 0 ? NULL : fdopendir(fd);
    if (!handle) {
        dir->err = errno;
        if (fd >= 0) close(fd);
    } else if (read_entries(dir, handle)) {
        closedir(handle);
        handle = NULL;
    }
    if (!handle) {
        dir->state = DIR_UNREADABLE;
        if (dir->rel_len && fstatat(r->root_fd, dir->rel, &st, AT_SYMLINK_NOFOLLOW) == 0) fill_stat(&dir->st, &st);
        return;
    }
    if (fstat(dirfd(handle), &st) == 0) fill_stat(&dir->st, &st);
    load_dir_ignore(r, dir, handle, scratch);
    if (dir->state == DIR_READ) classify_entries(r, dir, handle, scratch);
    closedir(handle);
}

static int reserve_dirs(Dir ***array, size_t *cap, size_t needed) {
    if (needed <= *cap) return 0;
    size_t grown_cap = *cap * 2 > needed ? *cap * 2 : needed;
    Dir **grown = realloc(*array, grown_cap * sizeof(Dir *));
    if (!grown) return -1;
    *array = grown;
    *cap = grown_cap;
    return 0;
}

/* Queue the subdirectories a read found (under the lock). Out of memory: none is, and the read fails. */
static void queue_children(Reader *r, Dir *dir) {
    size_t children = 0;
    for (size_t i = 0; i < dir->count; i++) children += dir->entries[i].child != NULL;
    if (!children) return;
    if (reserve_dirs(&r->queue, &r->queue_cap, r->queued + children) ||
        reserve_dirs(&r->all, &r->all_cap, r->all_count + children)) {
        for (size_t i = 0; i < dir->count; i++) {
            if (dir->entries[i].child) dir_free(dir->entries[i].child);
            dir->entries[i].child = NULL;
        }
        dir_fail(dir, ENOMEM, NULL);
        return;
    }
    /* pushed in reverse so that workers taking from the end start with the first in git order */
    for (size_t i = dir->count; i-- > 0;) {
        Dir *child = dir->entries[i].child;
        if (!child) continue;
        r->queue[r->queued++] = child;
        r->all[r->all_count++] = child;
    }
}

static void *reader_thread(void *arg);

/* Start the helper threads once there is more than one directory to read (a small tree reads faster
 * on the caller's thread alone). Under the lock. */
static void start_helpers(Reader *r) {
    if (r->helpers_started || r->queued < 2) return;
    r->helpers_started = 1;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int wanted = cpus < 1 ? 1 : cpus > MAX_READERS ? MAX_READERS : (int)cpus;
    for (int i = 1; i < wanted; i++)
        if (pthread_create(&r->helpers[r->helper_count], NULL, reader_thread, r) == 0) r->helper_count++;
}

/* Take directories from the queue until none is left and no reader can add more. */
static void read_queued(Reader *r, int may_start_helpers) {
    Buf scratch = {0};
    pthread_mutex_lock(&r->lock);
    for (;;) {
        while (!r->queued && r->busy) pthread_cond_wait(&r->wake, &r->lock);
        if (!r->queued) break;
        Dir *dir = r->queue[--r->queued];
        r->busy++;
        pthread_mutex_unlock(&r->lock);
        read_dir(r, dir, &scratch);
        pthread_mutex_lock(&r->lock);
        r->busy--;
        queue_children(r, dir);
        if (may_start_helpers) start_helpers(r);
        pthread_cond_broadcast(&r->wake);
    }
    pthread_cond_broadcast(&r->wake);
    pthread_mutex_unlock(&r->lock);
    free(scratch.data);
}

static void *reader_thread(void *arg) {
    read_queued(arg, 0);
    return NULL;
}

/* Read the whole tree under root (already queued), on up to MAX_READERS threads, without the GIL. */
static void read_tree(Reader *r) {
    Py_BEGIN_ALLOW_THREADS
    read_queued(r, 1);
    for (int i = 0; i < r->helper_count; i++) pthread_join(r->helpers[i], NULL);
    Py_END_ALLOW_THREADS
}

static void dir_free(Dir *dir) {
    free(dir->rel);
    free(dir->entries);
    free(dir->names);
    free(dir->err_path);
    level_free(dir->own);
    Py_XDECREF(dir->exc_type);
    Py_XDECREF(dir->exc_value);
    Py_XDECREF(dir->exc_tb);
    free(dir);
}

/* ------------------------------------------------------------------------ events, in git order */

typedef struct {
    Dir *dir;
    size_t next;
} Frame;

typedef struct {
    const char *root_path;
    Buf path;         /* the walk root, a '/', then the rel path of the current entry */
    size_t top_len;
    PyObject *events;
    PyTypeObject *event_type;
    EVP_MD_CTX *sha;
    int record;
    Buf records;
    uint32_t record_count;
} Emitter;

static size_t rel_len_of(const Emitter *e) { return e->path.len - e->top_len; }

static int add_record(Emitter *e, int kind, const char *rel, size_t rel_len, const StatFields *st) {
    if (!e->record || !st->known) return 0;
    unsigned char fixed[RECORD_FIXED] = {0};
    uint32_t len32 = (uint32_t)rel_len;
    fixed[0] = (unsigned char)kind;
    memcpy(fixed + 4, &len32, 4);
    memcpy(fixed + 8, &st->size, 8);
    memcpy(fixed + 16, &st->mtime, 8);
    memcpy(fixed + 24, &st->ctime, 8);
    memcpy(fixed + 32, &st->ino, 8);
    if (buf_append(&e->records, fixed, RECORD_FIXED) || buf_append(&e->records, rel, rel_len) ||
        buf_append(&e->records, "", 1)) {
        PyErr_NoMemory();
        return -1;
    }
    e->record_count++;
    return 0;
}

/* The snapshot records of a directory entered: itself and the .gitignore it read. */
static int record_dir(Emitter *e, const Dir *dir) {
    if (!e->record) return 0;
    if (add_record(e, RECORD_DIR, dir->rel, dir->rel_len, &dir->st)) return -1;
    if (!dir->ignore_st.known) return 0;
    buf_truncate(&e->path, e->top_len);
    if ((dir->rel_len && (buf_append(&e->path, dir->rel, dir->rel_len) || buf_append(&e->path, "/", 1))) ||
        buf_append(&e->path, ".gitignore", 10)) {
        PyErr_NoMemory();
        return -1;
    }
    return add_record(e, RECORD_FILE, e->path.data + e->top_len, rel_len_of(e), &dir->ignore_st);
}

/* Raise what reading this directory met: load_ignore's exception, or an OSError. */
static int raise_dir_error(const Emitter *e, Dir *dir) {
    if (dir->exc_type) {
        PyErr_Restore(dir->exc_type, dir->exc_value, dir->exc_tb);
        dir->exc_type = dir->exc_value = dir->exc_tb = NULL;
    } else if (dir->err == ENOMEM) {
        PyErr_NoMemory();
    } else {
        errno = dir->err ? dir->err : EIO;
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, dir->err_path ? dir->err_path : e->root_path);
    }
    return -1;
}

/* A WalkEvent without running Python code: the tuple subclass allocated and filled directly.
 * Steals the references to rel, path, size and mtime. */
static PyObject *new_event(Emitter *e, PyObject *kind, PyObject *rel, PyObject *path, PyObject *size,
                           PyObject *mtime, PyObject *reason, PyObject *is_dir) {
    PyObject *event = e->event_type->tp_alloc(e->event_type, 7);
    if (!event) {
        Py_DECREF(rel);
        Py_DECREF(path);
        Py_DECREF(size);
        Py_DECREF(mtime);
        return NULL;
    }
    Py_INCREF(kind);
    Py_INCREF(reason);
    Py_INCREF(is_dir);
    PyTuple_SET_ITEM(event, 0, kind);
    PyTuple_SET_ITEM(event, 1, rel);
    PyTuple_SET_ITEM(event, 2, path);
    PyTuple_SET_ITEM(event, 3, size);
    PyTuple_SET_ITEM(event, 4, mtime);
    PyTuple_SET_ITEM(event, 5, reason);
    PyTuple_SET_ITEM(event, 6, is_dir);
    /* Only strings, ints and bools: no reference cycle can pass through it, so the collector need not
     * scan it (CPython untracks such tuples itself, but only at its next collection). */
    PyObject_GC_UnTrack(event);
    return event;
}

static int append_event(Emitter *e, PyObject *event) {
    if (!event) return -1;
    int failed = PyList_Append(e->events, event);
    Py_DECREF(event);
    return failed;
}

/* An event without path, size or mtime for the current entry. */
static int emit_simple(Emitter *e, PyObject *kind, PyObject *reason, PyObject *is_dir) {
    PyObject *rel = PyUnicode_DecodeFSDefaultAndSize(e->path.data + e->top_len, (Py_ssize_t)rel_len_of(e));
    if (!rel) return -1;
    Py_INCREF(s_empty);
    Py_INCREF(zero);
    Py_INCREF(zero);
    return append_event(e, new_event(e, kind, rel, s_empty, zero, zero, reason, is_dir));
}

/* Decimal digits of v at out; returns how many. */
static size_t format_int(char *out, int64_t v) {
    char digits[24];
    size_t n = 0, len = 0;
    uint64_t magnitude = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        digits[n++] = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude);
    if (v < 0) out[len++] = '-';
    while (n) out[len++] = digits[--n];
    return len;
}

/* The fingerprint's line for a file: rel NUL size NUL mtime_ns LF, as walk.py's files_fingerprint. */
static int hash_file(Emitter *e, const Entry *entry) {
    char tail[64];
    size_t n = 0;
    tail[n++] = '\0';
    n += format_int(tail + n, entry->st.size);
    tail[n++] = '\0';
    n += format_int(tail + n, entry->st.mtime);
    tail[n++] = '\n';
    if (EVP_DigestUpdate(e->sha, e->path.data + e->top_len, rel_len_of(e)) != 1 ||
        EVP_DigestUpdate(e->sha, tail, n) != 1) {
        PyErr_SetString(PyExc_RuntimeError, "SHA-1 update failed");
        return -1;
    }
    return 0;
}

static int emit_file(Emitter *e, const Entry *entry) {
    if (hash_file(e, entry) || add_record(e, RECORD_FILE, e->path.data + e->top_len, rel_len_of(e), &entry->st))
        return -1;
    PyObject *rel = PyUnicode_DecodeFSDefaultAndSize(e->path.data + e->top_len, (Py_ssize_t)rel_len_of(e));
    PyObject *path = rel ? PyUnicode_DecodeFSDefaultAndSize(e->path.data, (Py_ssize_t)e->path.len) : NULL;
    PyObject *size = path ? PyLong_FromLongLong(entry->st.size) : NULL;
    PyObject *mtime = size ? PyLong_FromLongLong(entry->st.mtime) : NULL;
    if (!mtime) {
        Py_XDECREF(rel);
        Py_XDECREF(path);
        Py_XDECREF(size);
        return -1;
    }
    return append_event(e, new_event(e, s_file, rel, path, size, mtime, s_empty, Py_False));
}

/* A subdirectory met in order: entered (its "dir" event), or left out as unreadable. 1: push it. */
static int emit_dir(Emitter *e, Dir *child) {
    if (child->state == DIR_FAILED) return raise_dir_error(e, child);
    if (child->state == DIR_UNREADABLE) {
        if (add_record(e, RECORD_DIR, child->rel, child->rel_len, &child->st)) return -1;
        return emit_simple(e, s_skip, s_unreadable, Py_True);
    }
    if (emit_simple(e, s_dir, s_empty, Py_False) || record_dir(e, child)) return -1; /* record_dir reuses path */
    return 1;
}

static int emit_entry(Emitter *e, const Dir *dir, Entry *entry) {
    if (entry->action == ACT_NONE) return 0;
    buf_truncate(&e->path, e->top_len);
    if ((dir->rel_len && (buf_append(&e->path, dir->rel, dir->rel_len) || buf_append(&e->path, "/", 1))) ||
        buf_append(&e->path, entry->name, entry->len)) {
        PyErr_NoMemory();
        return -1;
    }
    switch (entry->action) {
    case ACT_FILE: return emit_file(e, entry);
    case ACT_SKIP_IGNORED: return emit_simple(e, s_skip, s_ignored, Py_False);
    case ACT_SKIP_SYMLINK: return emit_simple(e, s_skip, s_symlink, Py_False);
    case ACT_SKIP_IGNORED_DIR: return emit_simple(e, s_skip, s_ignored, Py_True);
    case ACT_SKIP_CACHE: return emit_simple(e, s_skip, s_cache, Py_True);
    default: return emit_dir(e, entry->child);
    }
}

/* Depth first through the tree read, each directory's entries in their sorted order. */
static int emit_tree(Emitter *e, Dir *root) {
    if (root->state != DIR_READ) return raise_dir_error(e, root); /* the top is an error, as os.scandir's */
    if (record_dir(e, root)) return -1;
    Frame *stack = malloc(32 * sizeof(Frame));
    size_t depth = 0, cap = 32;
    int status = 0;
    if (!stack) {
        PyErr_NoMemory();
        return -1;
    }
    stack[depth++] = (Frame){root, 0};
    while (depth && status == 0) {
        Frame *top = &stack[depth - 1];
        if (top->next == top->dir->count) {
            depth--;
            continue;
        }
        Entry *entry = &top->dir->entries[top->next++];
        status = emit_entry(e, top->dir, entry);
        if (status == 1) {
            status = 0;
            if (depth == cap) {
                Frame *grown = realloc(stack, 2 * cap * sizeof(Frame));
                if (!grown) {
                    PyErr_NoMemory();
                    status = -1;
                    break;
                }
                stack = grown;
                cap *= 2;
            }
            stack[depth++] = (Frame){entry->child, 0};
        }
    }
    free(stack);
    return status;
}

/* ----------------------------------------------------------------------------------------- walk */

static int name_set_from(PyObject *iterable, NameSet *set, PyObject **keep) {
    PyObject *encoded = PyList_New(0);
    if (!encoded) return -1;
    *keep = encoded;
    PyObject *iter = PyObject_GetIter(iterable);
    if (!iter) return -1;
    PyObject *item;
    while ((item = PyIter_Next(iter))) {
        PyObject *bytes = PyUnicode_EncodeFSDefault(item);
        Py_DECREF(item);
        if (!bytes || PyList_Append(encoded, bytes)) {
            Py_XDECREF(bytes);
            Py_DECREF(iter);
            return -1;
        }
        Py_DECREF(bytes);
    }
    Py_DECREF(iter);
    if (PyErr_Occurred()) return -1;
    size_t n = (size_t)PyList_GET_SIZE(encoded);
    set->names = calloc(n ? n : 1, sizeof(char *));
    set->lens = calloc(n ? n : 1, sizeof(size_t));
    if (!set->names || !set->lens) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        PyObject *bytes = PyList_GET_ITEM(encoded, (Py_ssize_t)i);
        set->names[i] = PyBytes_AS_STRING(bytes);
        set->lens[i] = (size_t)PyBytes_GET_SIZE(bytes);
    }
    set->count = n;
    return 0;
}

static PyObject *hex_digest(EVP_MD_CTX *sha) {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    if (EVP_DigestFinal_ex(sha, digest, &size) != 1) {
        PyErr_SetString(PyExc_RuntimeError, "SHA-1 failed");
        return NULL;
    }
    char hex[2 * EVP_MAX_MD_SIZE];
    for (unsigned int i = 0; i < size; i++) {
        hex[2 * i] = "0123456789abcdef"[digest[i] >> 4];
        hex[2 * i + 1] = "0123456789abcdef"[digest[i] & 15];
    }
    return PyUnicode_FromStringAndSize(hex, 2 * (Py_ssize_t)size);
}

typedef struct {
    Reader reader;
    Emitter emitter;
    Dir *root;
    Level *root_level;
    PyObject *vcs_keep, *cache_keep, *root_bytes;
} Walk;

/* Everything the walk needs before reading: the root open, its exclude rules, the hash, the queue. */
static int walk_setup(Walk *w, PyObject *root, PyObject *root_rules, PyObject *vcs_dirs, PyObject *cache_dirs,
                      const char *salt, Py_ssize_t salt_len) {
    Reader *r = &w->reader;
    Emitter *e = &w->emitter;
    if (!(w->root_bytes = PyUnicode_EncodeFSDefault(root)) || !(e->events = PyList_New(0)) ||
        name_set_from(vcs_dirs, &r->vcs, &w->vcs_keep) || name_set_from(cache_dirs, &r->cache, &w->cache_keep))
        return -1;
    const char *top = PyBytes_AS_STRING(w->root_bytes);
    size_t top_len = (size_t)PyBytes_GET_SIZE(w->root_bytes);
    if (buf_append(&e->path, top, top_len) ||
        ((top_len == 0 || top[top_len - 1] != '/') && buf_append(&e->path, "/", 1))) {
        PyErr_NoMemory();
        return -1;
    }
    e->top_len = r->top_len = e->path.len;
    e->root_path = top;
    if (!(r->top = strdup(e->path.data))) {
        PyErr_NoMemory();
        return -1;
    }
    if (!(e->sha = EVP_MD_CTX_new()) || EVP_DigestInit_ex(e->sha, EVP_sha1(), NULL) != 1 ||
        EVP_DigestUpdate(e->sha, salt, (size_t)salt_len) != 1) {
        PyErr_SetString(PyExc_RuntimeError, "SHA-1 init failed");
        return -1;
    }
    if (root_rules != Py_None && !(w->root_level = level_from_list(root_rules, 0, NULL))) return -1;
    int fd;
    Py_BEGIN_ALLOW_THREADS
    fd = open(top, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    Py_END_ALLOW_THREADS
    if (fd < 0) {
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, top);
        return -1;
    }
    r->root_fd = fd;
    if (!(w->root = calloc(1, sizeof(Dir))) || !(w->root->rel = strdup("")) ||
        !(r->queue = malloc(256 * sizeof(Dir *))) || !(r->all = malloc(256 * sizeof(Dir *)))) {
        PyErr_NoMemory();
        return -1;
    }
    w->root->levels = w->root_level;
    r->queue_cap = r->all_cap = 256;
    r->queue[r->queued++] = w->root;
    r->all[r->all_count++] = w->root;
    if (pthread_mutex_init(&r->lock, NULL) || pthread_cond_init(&r->wake, NULL)) {
        PyErr_SetString(PyExc_RuntimeError, "cannot set up the walk's threads");
        return -1;
    }
    r->locks_ready = 1;
    return 0;
}

static void walk_free(Walk *w) {
    Reader *r = &w->reader;
    Emitter *e = &w->emitter;
    if (r->all_count) {
        for (size_t i = 0; i < r->all_count; i++) dir_free(r->all[i]); /* the root among them */
    } else if (w->root) {
        dir_free(w->root);
    }
    if (r->locks_ready) {
        pthread_mutex_destroy(&r->lock);
        pthread_cond_destroy(&r->wake);
    }
    free(r->top);
    free(r->queue);
    free(r->all);
    level_free(w->root_level);
    free(r->vcs.names);
    free(r->vcs.lens);
    free(r->cache.names);
    free(r->cache.lens);
    if (r->root_fd >= 0) close(r->root_fd);
    free(e->path.data);
    free(e->records.data);
    if (e->sha) EVP_MD_CTX_free(e->sha);
    Py_XDECREF(e->events);
    Py_XDECREF(w->vcs_keep);
    Py_XDECREF(w->cache_keep);
    Py_XDECREF(w->root_bytes);
}

static PyObject *walk(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *names[] = {"root", "root_rules", "load_ignore", "event_type", "vcs_dirs", "cache_dirs",
                            "salt", "record", NULL};
    PyObject *root, *root_rules, *load_ignore, *event_type, *vcs_dirs, *cache_dirs;
    const char *salt = "";
    Py_ssize_t salt_len = 0;
    int record = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "UOOOOO|y#p", names, &root, &root_rules, &load_ignore,
                                     &event_type, &vcs_dirs, &cache_dirs, &salt, &salt_len, &record))
        return NULL;
    if (!PyType_Check(event_type) || !PyType_IsSubtype((PyTypeObject *)event_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "event_type must be a tuple subclass (the WalkEvent NamedTuple)");
        return NULL;
    }
    Walk w;
    memset(&w, 0, sizeof w);
    w.reader.root_fd = -1;
    w.reader.load_ignore = load_ignore;
    w.emitter.event_type = (PyTypeObject *)event_type;
    w.emitter.record = record;
    PyObject *result = NULL;
    if (walk_setup(&w, root, root_rules, vcs_dirs, cache_dirs, salt, salt_len) == 0) {
        read_tree(&w.reader);
        if (emit_tree(&w.emitter, w.root) == 0) {
            PyObject *fingerprint = hex_digest(w.emitter.sha);
            PyObject *records =
                !fingerprint ? NULL
                : record     ? PyBytes_FromStringAndSize(w.emitter.records.data, (Py_ssize_t)w.emitter.records.len)
                             : Py_NewRef(Py_None);
            if (records)
                result = Py_BuildValue("(ONNI)", w.emitter.events, fingerprint, records, w.emitter.record_count);
            else
                Py_XDECREF(fingerprint);
        }
    }
    walk_free(&w);
    return result;
}

/* ------------------------------------------------------------------------------------- verify */

typedef struct {
    unsigned char kind;
    const char *rel;
    int64_t size, mtime, ctime;
    uint64_t ino;
} Record;

typedef struct {
    int root_fd;
    const Record *records;
    size_t from, to;
    atomic_int *changed;
} Slice;

static int record_unchanged(int root_fd, const Record *r) {
    struct stat st;
    int flags = r->kind == RECORD_FOLLOW_FILE || r->kind == RECORD_ABSENT ? 0 : AT_SYMLINK_NOFOLLOW;
    int found = r->rel[0] ? fstatat(root_fd, r->rel, &st, flags) == 0 : fstat(root_fd, &st) == 0;
    if (r->kind == RECORD_ABSENT) return !found || !S_ISREG(st.st_mode);
    if (!found) return 0;
    if (r->kind == RECORD_DIR ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) return 0;
    if (r->kind != RECORD_DIR && (int64_t)st.st_size != r->size) return 0;
    return ns_of(st.st_mtim) == r->mtime && ns_of(st.st_ctim) == r->ctime && (uint64_t)st.st_ino == r->ino;
}

static void *check_slice(void *arg) {
    Slice *slice = arg;
    for (size_t i = slice->from; i < slice->to; i++) {
        if (atomic_load_explicit(slice->changed, memory_order_relaxed)) break;
        if (!record_unchanged(slice->root_fd, &slice->records[i])) atomic_store(slice->changed, 1);
    }
    return NULL;
}

/* Whether every record is unchanged: the second half on another thread. */
static int all_unchanged(int root_fd, const Record *records, size_t count) {
    atomic_int changed = 0;
    Slice first = {root_fd, records, 0, count / 2, &changed};
    Slice second = {root_fd, records, count / 2, count, &changed};
    pthread_t thread;
    int threaded = count >= 256 && pthread_create(&thread, NULL, check_slice, &second) == 0;
    if (!threaded) first.to = count;
    check_slice(&first);
    if (threaded) pthread_join(thread, NULL);
    return !atomic_load(&changed);
}

static int is_racy(int64_t t, int64_t start) { return t > start - RACY_NS && t < start + RACY_NS; }

static int read_whole(const char *path, Buf *out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || buf_reserve(out, (size_t)st.st_size + 1)) {
        close(fd);
        return -1;
    }
    for (;;) {
        if (buf_reserve(out, 65536)) break;
        ssize_t n = read(fd, out->data + out->len, out->cap - out->len - 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            close(fd);
            return n < 0 ? -1 : 0;
        }
        out->len += (size_t)n;
    }
    close(fd);
    return -1;
}

static int checksum_ok(const Buf *data) {
    if (data->len < SNAPSHOT_FIXED + SHA1_LEN) return 0;
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    EVP_MD_CTX *sha = EVP_MD_CTX_new();
    int ok = sha && EVP_DigestInit_ex(sha, EVP_sha1(), NULL) == 1 &&
             EVP_DigestUpdate(sha, data->data, data->len - SHA1_LEN) == 1 &&
             EVP_DigestFinal_ex(sha, digest, &size) == 1 && size == SHA1_LEN &&
             memcmp(digest, data->data + data->len - SHA1_LEN, SHA1_LEN) == 0;
    if (sha) EVP_MD_CTX_free(sha);
    return ok;
}

static uint32_t u32_at(const char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static int64_t i64_at(const char *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Parse the records after the header; NULL when the layout is wrong or a time is racy. */
static Record *parse_records(const char *at, const char *end, uint32_t count, int64_t start) {
    if ((size_t)(end - at) / RECORD_FIXED < count) return NULL;
    Record *records = malloc((count ? count : 1) * sizeof(Record));
    if (!records) return NULL;
    for (uint32_t i = 0; i < count; i++) {
        Record *r = &records[i];
        if (end - at < RECORD_FIXED) goto bad;
        r->kind = (unsigned char)at[0];
        uint32_t rel_len = u32_at(at + 4);
        r->size = i64_at(at + 8);
        r->mtime = i64_at(at + 16);
        r->ctime = i64_at(at + 24);
        r->ino = (uint64_t)i64_at(at + 32);
        at += RECORD_FIXED;
        if ((size_t)(end - at) < (size_t)rel_len + 1 || at[rel_len] != '\0' || memchr(at, '\0', rel_len))
            goto bad;
        r->rel = at;
        at += rel_len + 1;
        if (r->kind < RECORD_DIR || r->kind > RECORD_ABSENT) goto bad;
        if (r->kind != RECORD_ABSENT && (is_racy(r->mtime, start) || is_racy(r->ctime, start))) goto bad;
    }
    if (at != end) goto bad;
    return records;
bad:
    free(records);
    return NULL;
}

/* The stored fingerprint when the snapshot is intact, for this root and key, and nothing changed. */
static PyObject *verify_snapshot(const Buf *data, const char *root, const char *key, Py_ssize_t key_len) {
    const char *p = data->data, *end = data->data + data->len - SHA1_LEN;
    if (memcmp(p, SNAPSHOT_MAGIC, 8) != 0) Py_RETURN_NONE;
    int64_t start = i64_at(p + 8);
    uint32_t root_len = u32_at(p + 16), stored_key_len = u32_at(p + 20), fp_len = u32_at(p + 24);
    uint32_t count = u32_at(p + 28);
    const char *at = p + SNAPSHOT_FIXED;
    if ((size_t)(end - at) < (size_t)root_len + stored_key_len + fp_len) Py_RETURN_NONE;
    if (root_len != strlen(root) || memcmp(at, root, root_len) != 0) Py_RETURN_NONE;
    at += root_len;
    if (stored_key_len != (uint32_t)key_len || memcmp(at, key, stored_key_len) != 0) Py_RETURN_NONE;
    at += stored_key_len;
    const char *fingerprint = at;
    at += fp_len;
    int unchanged = 0;
    Py_BEGIN_ALLOW_THREADS
    Record *records = parse_records(at, end, count, start);
    int root_fd = records ? open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (root_fd >= 0) {
        unchanged = all_unchanged(root_fd, records, count);
        close(root_fd);
    }
    free(records);
    Py_END_ALLOW_THREADS
    if (!unchanged) Py_RETURN_NONE;
    return PyUnicode_DecodeASCII(fingerprint, fp_len, "strict");
}

static PyObject *verify(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *path_obj, *root_obj;
    const char *key;
    Py_ssize_t key_len;
    if (!PyArg_ParseTuple(args, "O&O&y#", PyUnicode_FSConverter, &path_obj, PyUnicode_FSConverter, &root_obj,
                          &key, &key_len))
        return NULL;
    Buf data = {0};
    PyObject *result = NULL;
    int readable;
    Py_BEGIN_ALLOW_THREADS
    readable = read_whole(PyBytes_AS_STRING(path_obj), &data) == 0 && checksum_ok(&data);
    Py_END_ALLOW_THREADS
    if (readable)
        result = verify_snapshot(&data, PyBytes_AS_STRING(root_obj), key, key_len);
    else
        result = Py_NewRef(Py_None);
    if (result == NULL) { /* e.g. a fingerprint that is not ASCII: a corrupt snapshot */
        PyErr_Clear();
        result = Py_NewRef(Py_None);
    }
    free(data.data);
    Py_DECREF(path_obj);
    Py_DECREF(root_obj);
    return result;
}

/* ------------------------------------------------------------------------------------- module */

static PyMethodDef methods[] = {
    {"walk", (PyCFunction)(void (*)(void))walk, METH_VARARGS | METH_KEYWORDS,
     "walk(root, root_rules, load_ignore, event_type, vcs_dirs, cache_dirs, salt=b'', record=False)\n"
     "-> (events, fingerprint, records | None, record_count): walk.py's walk, in C."},
    {"verify", verify, METH_VARARGS,
     "verify(snapshot_path, root, key) -> fingerprint | None: the snapshot's fingerprint if nothing "
     "it records changed."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_walk",
                                    "The gitignore-aware directory walk and the listing snapshot check.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__walk(void) {
    PyObject **constants[] = {&s_file, &s_dir, &s_skip, &s_ignored, &s_cache, &s_symlink, &s_unreadable, &s_empty};
    const char *texts[] = {"file", "dir", "skip", "ignored", "cache", "symlink", "unreadable", ""};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        if (!*constants[i] && !(*constants[i] = PyUnicode_InternFromString(texts[i]))) return NULL;
    if (!zero && !(zero = PyLong_FromLong(0))) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddIntConstant(m, "RECORD_DIR", RECORD_DIR) || PyModule_AddIntConstant(m, "RECORD_FILE", RECORD_FILE) ||
        PyModule_AddIntConstant(m, "RECORD_FOLLOW_FILE", RECORD_FOLLOW_FILE) ||
        PyModule_AddIntConstant(m, "RECORD_ABSENT", RECORD_ABSENT) ||
        PyModule_AddIntConstant(m, "RACY_NS", (long)RACY_NS)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
