/* The words of a text and their ids in one pass over its code points: the same arrays as the
 * numpy code in words.py (its reference), which costs a dozen array passes and as many
 * temporaries per text. The character classes and the lower-case map come from words.py's
 * tables (Python's own \w and str.lower), so this file holds no Unicode data of its own.
 *
 * find(text, classes, lower) -> (points, starts, lengths, not_letters, ids, folded_ids)
 *   points: bytearray of uint32, the word characters word after word; starts, lengths:
 *   bytearrays of int64 per word (in characters); ids, folded_ids: bytearrays of uint64.
 * plane_end(text) -> the end of the last Unicode plane the text reaches (the tables' size).
 * ngrams(ids, lengths, n) -> (top_count, top_first, top_chars, repeated_chars)
 *   over the n-grams of consecutive words (ids: uint64 per word, lengths: int64 per word), by
 *   the polynomial n-gram ids of quality.ngram_hashes: the count of the most frequent one, its
 *   first position (the earliest among equally frequent ones) and its word characters, and the
 *   word characters covered by n-grams that occurred before (quality._repeated_cover).
 * collapsed(text) -> (utf8, length): " ".join(text.split()) encoded as UTF-8 with lone
 *   surrogates passed through (as "surrogatepass" does), and its length in characters.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The class bits of words.py. */
#define JOINED 1
#define IDEOGRAPH 2
#define APOSTROPHE 4
#define NOT_LETTER 8
#define PLANE 0x10000
#define POSITION_SHIFT 21
#define NGRAM_MULTIPLIER 0x9E3779B97F4A7C15ULL /* quality._NGRAM_MULTIPLIER */

static inline uint64_t mix(uint64_t x) /* splitmix64's finaliser, as words.mix */
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    x ^= x >> 31;
    return x;
}

static Py_UCS4 max_point(PyObject *text)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_UCS4 found = 0;
    if (kind != PyUnicode_4BYTE_KIND)
        return 0; /* every code point is below the first plane's end */
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 point = PyUnicode_READ(kind, data, i);
        if (point > found)
            found = point;
    }
    return found;
}

static PyObject *plane_end(PyObject *self, PyObject *text)
{
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "plane_end() takes a str");
        return NULL;
    }
    return PyLong_FromLong((long)(max_point(text) / PLANE + 1) * PLANE);
}

static PyObject *bytes_of(const void *data, Py_ssize_t count, size_t size)
{
    return PyByteArray_FromStringAndSize(data, count * (Py_ssize_t)size);
}

static PyObject *find(PyObject *self, PyObject *args)
{
    PyObject *text, *result = NULL;
    Py_buffer classes_buffer, lower_buffer;
    if (!PyArg_ParseTuple(args, "Uy*y*", &text, &classes_buffer, &lower_buffer))
        return NULL;
    const uint8_t *classes = classes_buffer.buf;
    const uint32_t *lower = lower_buffer.buf;
    Py_ssize_t table = classes_buffer.len, n = PyUnicode_GET_LENGTH(text);
    size_t room = n > 0 ? (size_t)n : 1;
    Py_UCS4 *text_points = PyMem_Malloc(room * sizeof(Py_UCS4));
    uint8_t *bits = PyMem_Malloc(room);
    uint32_t *points = PyMem_Malloc(room * sizeof(uint32_t));
    int64_t *starts = PyMem_Malloc(room * sizeof(int64_t));
    int64_t *lengths = PyMem_Malloc(room * sizeof(int64_t));
    uint64_t *ids = PyMem_Malloc(room * sizeof(uint64_t));
    uint64_t *folded = PyMem_Malloc(room * sizeof(uint64_t));
    if (!text_points || !bits || !points || !starts || !lengths || !ids || !folded) {
        PyErr_NoMemory();
        goto done;
    }
    if (lower_buffer.len < table * (Py_ssize_t)sizeof(uint32_t)) {
        PyErr_SetString(PyExc_ValueError, "the lower-case table is smaller than the classes'");
        goto done;
    }
    if (n > 0 && !PyUnicode_AsUCS4(text, text_points, n, 0))
        goto done;

    long long not_letters = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((Py_ssize_t)text_points[i] >= table) {
            PyErr_SetString(PyExc_ValueError, "a code point lies beyond the tables");
            goto done;
        }
        bits[i] = classes[text_points[i]];
        not_letters += (bits[i] & NOT_LETTER) != 0;
    }

    /* A word is an ideograph alone or a run of joined characters, where an apostrophe between
     * two joined characters joins them (an apostrophe is never a joined character itself, so
     * the rule reads the classes as they are). A word's id sums the mix of each code point
     * with its position in the word above the code point's 21 bits. */
    Py_ssize_t words = 0, q = 0, length = 0;
    uint64_t id = 0, folded_id = 0;
    int before = 0; /* the previous character is a joined one */
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t b = bits[i];
        int joined = (b & JOINED) || (n > 2 && i > 0 && i < n - 1 && (b & APOSTROPHE)
                                      && (bits[i - 1] & JOINED) && (bits[i + 1] & JOINED));
        int ideograph = b & IDEOGRAPH;
        if (joined || ideograph) {
            if (ideograph || !before) {
                if (words > 0) {
                    lengths[words - 1] = length;
                    ids[words - 1] = id;
                    folded[words - 1] = folded_id;
                }
                starts[words++] = i;
                length = 0;
                id = folded_id = 0;
            }
            Py_UCS4 point = text_points[i];
            uint64_t above = (uint64_t)length << POSITION_SHIFT;
            points[q++] = point;
            id += mix((uint64_t)point | above);
            folded_id += mix((uint64_t)lower[point] | above);
            length++;
        }
        before = joined;
    }
    if (words > 0) {
        lengths[words - 1] = length;
        ids[words - 1] = id;
        folded[words - 1] = folded_id;
    }
    PyObject *arrays[5] = {bytes_of(points, q, sizeof(uint32_t)),
                           bytes_of(starts, words, sizeof(int64_t)),
                           bytes_of(lengths, words, sizeof(int64_t)),
                           bytes_of(ids, words, sizeof(uint64_t)),
                           bytes_of(folded, words, sizeof(uint64_t))};
    if (arrays[0] && arrays[1] && arrays[2] && arrays[3] && arrays[4])
        result = Py_BuildValue("OOOLOO", arrays[0], arrays[1], arrays[2], not_letters,
                               arrays[3], arrays[4]);
    for (int k = 0; k < 5; k++)
        Py_XDECREF(arrays[k]);

done:
    PyMem_Free(text_points);
    PyMem_Free(bits);
    PyMem_Free(points);
    PyMem_Free(starts);
    PyMem_Free(lengths);
    PyMem_Free(ids);
    PyMem_Free(folded);
    PyBuffer_Release(&classes_buffer);
    PyBuffer_Release(&lower_buffer);
    return result;
}

static PyObject *ngrams(PyObject *self, PyObject *args)
{
    Py_buffer ids_buffer, lengths_buffer;
    Py_ssize_t n;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*n", &ids_buffer, &lengths_buffer, &n))
        return NULL;
    const uint64_t *ids = ids_buffer.buf;
    const int64_t *lengths = lengths_buffer.buf;
    Py_ssize_t words = ids_buffer.len / (Py_ssize_t)sizeof(uint64_t);
    Py_ssize_t count = words - n + 1; /* positions of an n-gram */
    uint64_t *keys = NULL;
    int64_t *firsts = NULL, *counts = NULL, *depth = NULL;
    if (n < 1 || lengths_buffer.len != words * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "ngrams() needs n >= 1 and one length per id");
        goto done;
    }
    if (count <= 0) {
        result = Py_BuildValue("nnLL", (Py_ssize_t)0, (Py_ssize_t)-1, 0LL, 0LL);
        goto done;
    }
    /* Open addressing over twice as many slots as n-grams, by the high bits of a
     * multiplicative hash of the id. */
    int bits = 4;
    while (((Py_ssize_t)1 << bits) < 2 * count)
        bits++;
    size_t slots = (size_t)1 << bits, mask = slots - 1;
    keys = PyMem_Malloc(slots * sizeof(uint64_t));
    firsts = PyMem_Malloc(slots * sizeof(int64_t));
    counts = PyMem_Malloc(slots * sizeof(int64_t));
    depth = PyMem_Calloc((size_t)words + 1, sizeof(int64_t));
    if (!keys || !firsts || !counts || !depth) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t k = 0; k < slots; k++)
        firsts[k] = -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t id = 0;
        for (Py_ssize_t k = 0; k < n; k++)
            id = id * NGRAM_MULTIPLIER + ids[i + k];
        size_t slot = (size_t)((id * NGRAM_MULTIPLIER) >> (64 - bits));
        while (firsts[slot] >= 0 && keys[slot] != id)
            slot = (slot + 1) & mask;
        if (firsts[slot] < 0) {
            keys[slot] = id;
            firsts[slot] = i;
            counts[slot] = 1;
        } else { /* a repeat: its words are covered */
            counts[slot]++;
            depth[i]++;
            depth[i + n]--;
        }
    }
    int64_t top_count = 0, top_first = -1;
    for (size_t k = 0; k < slots; k++) {
        if (firsts[k] < 0)
            continue;
        if (counts[k] > top_count || (counts[k] == top_count && firsts[k] < top_first)) {
            top_count = counts[k];
            top_first = firsts[k];
        }
    }
    long long top_chars = 0, repeated_chars = 0;
    for (Py_ssize_t k = 0; k < n; k++)
        top_chars += lengths[top_first + k];
    int64_t covering = 0;
    for (Py_ssize_t w = 0; w < words; w++) {
        covering += depth[w];
        if (covering > 0)
            repeated_chars += lengths[w];
    }
    result = Py_BuildValue("nnLL", (Py_ssize_t)top_count, (Py_ssize_t)top_first, top_chars,
                           repeated_chars);

done:
    PyMem_Free(keys);
    PyMem_Free(firsts);
    PyMem_Free(counts);
    PyMem_Free(depth);
    PyBuffer_Release(&ids_buffer);
    PyBuffer_Release(&lengths_buffer);
    return result;
}

static char *put_utf8(char *out, Py_UCS4 point)
{
    if (point < 0x80) {
        *out++ = (char)point;
    } else if (point < 0x800) {
        *out++ = (char)(0xC0 | (point >> 6));
        *out++ = (char)(0x80 | (point & 0x3F));
    } else if (point < 0x10000) { /* surrogates too, as "surrogatepass" writes them */
        *out++ = (char)(0xE0 | (point >> 12));
        *out++ = (char)(0x80 | ((point >> 6) & 0x3F));
        *out++ = (char)(0x80 | (point & 0x3F));
    } else {
        *out++ = (char)(0xF0 | (point >> 18));
        *out++ = (char)(0x80 | ((point >> 12) & 0x3F));
        *out++ = (char)(0x80 | ((point >> 6) & 0x3F));
        *out++ = (char)(0x80 | (point & 0x3F));
    }
    return out;
}

static PyObject *collapsed(PyObject *self, PyObject *text)
{
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "collapsed() takes a str");
        return NULL;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), length = 0;
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    char *start = PyMem_Malloc(n > 0 ? (size_t)n * 4 : 1), *out = start;
    if (start == NULL)
        return PyErr_NoMemory();
    int pending_space = 0; /* whitespace since the last word character written */
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 point = PyUnicode_READ(kind, data, i);
        if (Py_UNICODE_ISSPACE(point)) { /* what str.split() splits at */
            pending_space = 1;
            continue;
        }
        if (pending_space && out != start) {
            *out++ = ' ';
            length++;
        }
        pending_space = 0;
        out = put_utf8(out, point);
        length++;
    }
    PyObject *result = Py_BuildValue("y#n", start, (Py_ssize_t)(out - start), length);
    PyMem_Free(start);
    return result;
}

static PyMethodDef methods[] = {
    {"find", find, METH_VARARGS, "The words of a text, their ids and folded ids."},
    {"plane_end", plane_end, METH_O, "The end of the last Unicode plane a text reaches."},
    {"ngrams", ngrams, METH_VARARGS, "The most frequent n-gram and the repeated ones' cover."},
    {"collapsed", collapsed, METH_O, "A text's words joined by single spaces, as UTF-8."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_words", NULL, -1, methods};

PyMODINIT_FUNC PyInit__words(void) { return PyModule_Create(&module); }
