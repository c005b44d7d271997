/*
 * Durable Streams JSON-mode splitter for s2_spark.wire.durable (optional accelerator).
 *
 * split_json_array(body) scans a JSON array once and returns (offsets, data): int32
 * offsets (one more than the number of elements) and the elements' bytes concatenated
 * with the array's brackets, separating commas and surrounding whitespace removed, ready
 * to become an Arrow string column with no Python object per message. It checks exactly
 * what the numpy path in durable.py checks (one top-level array, balanced brackets of
 * matching kinds, at most MAX_DEPTH levels, terminated strings without control characters,
 * no empty elements, only JSON characters outside strings): both accept the same bodies.
 * Errors raise ValueError naming the flaw.
 *
 * split_json_prefix(body, continued) splits a piece of an array being received: it returns
 * (offsets, data, consumed, closed) for the elements that are followed by a top-level comma
 * (or by the closing bracket, then closed is true), where consumed is how many bytes of
 * body they took; the caller keeps body[consumed:] and prepends it to the next piece, with
 * continued true (the piece then starts right after a top-level comma, not at '[').
 *
 * Builds against the full C API or the limited one (Py_LIMITED_API, for abi3 wheels);
 * without _PyBytes_Resize there, the elements are gathered in a buffer of our own and
 * copied once into a bytes object of their size.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 1024

static int is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static int allowed_outside(unsigned char c) {
    return (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.' || c == 'e' ||
           c == 'E' || c == 't' || c == 'r' || c == 'u' || c == 'f' || c == 'a' ||
           c == 'l' || c == 's' || c == 'n' || c == ':';
}

/* Append the end offset of one element, growing the offsets array as needed. */
static int push_offset(int32_t **offs, Py_ssize_t *count, Py_ssize_t *cap, Py_ssize_t end) {
    if (*count + 2 > *cap) {
        int32_t *grown = PyMem_Realloc(*offs, sizeof(int32_t) * (size_t)(*cap * 2));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        *offs = grown;
        *cap *= 2;
    }
    (*offs)[++*count] = (int32_t)end;
    return 0;
}

static PyObject *fail(const char *what) {
    PyErr_SetString(PyExc_ValueError, what);
    return NULL;
}

/* Scan body; partial: it may end inside the array (see split_json_prefix). */
static PyObject *split(Py_buffer *view, int partial, int continued) {
    const unsigned char *s = (const unsigned char *)view->buf;
    Py_ssize_t n = view->len, i = 0;
    PyObject *data = NULL, *offsets = NULL, *result = NULL;
    char *out = NULL; /* the elements as written: into data, or a buffer of our own */
    int32_t *offs = NULL;
    Py_ssize_t count = 0, cap = 1024;
    char stack[MAX_DEPTH];
    int depth = 0;
    const char *err = NULL;
    Py_ssize_t consumed = 0, cut_count = 0; /* input and elements up to the last comma */

    if (!continued) {
        while (i < n && is_space(s[i])) i++;
        if (i >= n || s[i] != '[') { err = "not a JSON array"; goto done; }
        i++;
    }
    if (n > INT32_MAX) { err = "body too large"; goto done; }
#ifdef Py_LIMITED_API
    out = PyMem_Malloc(n > 0 ? (size_t)n : 1);
#else
    data = PyBytes_FromStringAndSize(NULL, n);
    if (data != NULL) out = PyBytes_AS_STRING(data);
#endif
    offs = PyMem_Malloc(sizeof(int32_t) * cap);
    if (out == NULL || offs == NULL) { PyErr_NoMemory(); goto done; }
    Py_ssize_t w = 0;
    offs[0] = 0;
    stack[depth++] = ']';
    int element_open = 0; /* bytes written for the current element */
    int saw_comma = continued;
    for (; i < n && depth > 0; i++) {
        unsigned char c = s[i];
        if (c == '"') {
            out[w++] = (char)c;
            for (i++; i < n; i++) {
                c = s[i];
                if (c == '\\') {
                    if (i + 1 >= n) break;
                    out[w++] = (char)c;
                    c = s[++i];
                    if (c < 0x20) {
                        err = "a control character inside a string";
                        goto done;
                    }
                } else if (c == '"') {
                    break;
                } else if (c < 0x20) {
                    err = "a control character inside a string";
                    goto done;
                }
                out[w++] = (char)c;
            }
            if (i >= n) {
                if (partial) break;
                err = "unterminated string";
                goto done;
            }
            out[w++] = '"';
            element_open = 1;
        } else if (c == '[' || c == '{') {
            if (depth >= MAX_DEPTH) { err = "nesting too deep"; goto done; }
            stack[depth++] = c == '[' ? ']' : '}';
            out[w++] = (char)c;
            element_open = 1;
        } else if (c == ']' || c == '}') {
            if (stack[depth - 1] != (char)c) { err = "unbalanced brackets"; goto done; }
            depth--;
            if (depth > 0) {
                out[w++] = (char)c;
            } else if (element_open || saw_comma) {
                if (!element_open) { err = "an empty element"; goto done; }
                if (push_offset(&offs, &count, &cap, w) < 0) goto done;
            }
        } else if (c == ',' && depth == 1) {
            if (!element_open) { err = "an empty element"; goto done; }
            if (push_offset(&offs, &count, &cap, w) < 0) goto done;
            element_open = 0;
            saw_comma = 1;
            consumed = i + 1;
            cut_count = count;
        } else if (is_space(c)) {
            if (depth > 1) out[w++] = (char)c;
        } else if (c == ',' || allowed_outside(c)) {
            out[w++] = (char)c;
            element_open = 1;
        } else {
            err = "a character outside strings that JSON does not allow";
            goto done;
        }
    }
    int closed = depth == 0;
    if (partial && !closed) {
        count = cut_count; /* the rest is kept for the next piece */
        w = offs[count];
    } else if (!closed) {
        err = "not a JSON array";
        goto done;
    } else {
        while (i < n && is_space(s[i])) i++;
        if (i != n) { err = "unbalanced brackets or data after the array"; goto done; }
        consumed = n;
    }
#ifdef Py_LIMITED_API
    data = PyBytes_FromStringAndSize(out, w);
    if (data == NULL) goto done;
#else
    if (_PyBytes_Resize(&data, w) < 0) goto done;
#endif
    offsets = PyBytes_FromStringAndSize((const char *)offs, sizeof(int32_t) * (count + 1));
    if (offsets == NULL) goto done;
    if (partial)
        result = Py_BuildValue("(OOnO)", offsets, data, consumed, closed ? Py_True : Py_False);
    else
        result = PyTuple_Pack(2, offsets, data);
done:
    if (err != NULL) fail(err);
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    PyMem_Free(offs);
#ifdef Py_LIMITED_API
    PyMem_Free(out);
#endif
    return result;
}

static PyObject *fj_split_json_array(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = split(&view, 0, 0);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *fj_split_json_prefix(PyObject *self, PyObject *args) {
    Py_buffer view;
    int continued;
    if (!PyArg_ParseTuple(args, "y*p", &view, &continued)) return NULL;
    PyObject *result = split(&view, 1, continued);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"split_json_array", fj_split_json_array, METH_O, "Split a JSON array into its elements."},
    {"split_json_prefix", fj_split_json_prefix, METH_VARARGS,
     "Split the complete elements off a piece of a JSON array being received."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "s2_spark.wire._fastjson",
    "Durable Streams JSON-mode splitter (optional accelerator).", -1, methods,
};

PyMODINIT_FUNC PyInit__fastjson(void) { return PyModule_Create(&module); }
