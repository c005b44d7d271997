/*
 * Hot-path S2 protobuf codecs for s2_spark.wire (optional accelerator).
 *
 * decode_read_batches: scans S2 ReadBatch messages (consecutive frames' payloads, read
 * where they were received) once and fills the flat buffers (offsets + data) of one set
 * of pyarrow arrays, so no Python object is made per record and nothing is copied but
 * the bytes the arrays hold; decode_read_many: several messages, each its own stream's,
 * into one such set (the reads of many small streams). encode_records: the reverse for
 * AppendRecord entries of an AppendInput. h1_response: a whole plain HTTP/1.1 answer
 * (the fan-out's tail lookups, acks and small reads, many to a buffer) read in one call,
 * as _h1.ResponseReader does;
 * h1_tails: the tail lookups' answers of a bulk run, many in one call, into arrays;
 * h1_acks: the same for a bulk run's appends (AppendAck answers); h1_bodies: where a bulk
 * run's small reads' answers (ReadBatch bodies, decoded later) lie in the buffer.
 * append_acks: many AppendAck answers read in one call into numbers; sink_bodies: a
 * writer's first append to each of many streams (records, mark with digest, token) built
 * in one call, as the sink builds one (backends/s2/_first_appends.py).
 * The pure-Python code in records.py / appends.py defines the behaviour; this module
 * must produce byte-identical results (the tests compare both).
 *
 * Wire parsing follows protobuf's own parser (upb) exactly: fields in any order, last
 * value wins for scalars and bytes, repeated occurrences of an embedded singular message
 * merge, unknown fields (including groups) are skipped; field number 0, wire types 6/7,
 * a tag longer than 5 bytes or above 2^32 - 1, unbalanced groups, nesting deeper than 100
 * (messages and groups together) and truncated data are errors.
 *
 * Builds against the full C API or the limited one (Py_LIMITED_API, for abi3 wheels).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define WT_VARINT 0
#define WT_I64 1
#define WT_LEN 2
#define WT_SGROUP 3
#define WT_EGROUP 4
#define WT_I32 5

#define MAX_DEPTH 100 /* upb's default: embedded messages and groups together */

static PyObject *FrameErrorType = NULL; /* set from Python via _set_error_type */

typedef struct {
    const char *msg;
} perr_t;

/* ---------------------------------------------------------------- varints */

static inline int read_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out) {
    const uint8_t *p = *pp;
    if (p < end && !(*p & 0x80)) {
        *out = *p;
        *pp = p + 1;
        return 1;
    }
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end) return 0;
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *out = v;
            *pp = p;
            return 1;
        }
    }
    return 0; /* longer than 10 bytes */
}

/* Reads a tag (a varint of at most 5 bytes, as upb reads it); returns 0 on error. */
static inline int read_tag(const uint8_t **pp, const uint8_t *end, uint32_t *field, int *wt,
                           perr_t *err) {
    uint64_t t;
    const uint8_t *start = *pp;
    if (!read_varint(pp, end, &t) || *pp - start > 5 || t > 0xFFFFFFFFu) {
        err->msg = "invalid field tag";
        return 0;
    }
    *field = (uint32_t)(t >> 3);
    *wt = (int)(t & 7);
    if (*field == 0) {
        err->msg = "field number 0";
        return 0;
    }
    return 1;
}

/* Skips an unknown field. depth: how deeply it is nested (ReadBatch 0, SequencedRecord and
 * StreamPosition 1, Header 2, each group around it 1 more). */
static int skip_field(const uint8_t **pp, const uint8_t *end, uint32_t field, int wt, int depth,
                      perr_t *err);

static int skip_group(const uint8_t **pp, const uint8_t *end, uint32_t group_field, int depth,
                      perr_t *err) {
    if (depth >= MAX_DEPTH) {
        err->msg = "groups nested too deeply";
        return 0;
    }
    while (*pp < end) {
        uint32_t f;
        int wt;
        if (!read_tag(pp, end, &f, &wt, err)) return 0;
        if (wt == WT_EGROUP) {
            if (f != group_field) {
                err->msg = "mismatched end-group tag";
                return 0;
            }
            return 1;
        }
        if (!skip_field(pp, end, f, wt, depth + 1, err)) return 0;
    }
    err->msg = "unterminated group";
    return 0;
}

static int skip_field(const uint8_t **pp, const uint8_t *end, uint32_t field, int wt, int depth,
                      perr_t *err) {
    uint64_t v;
    switch (wt) {
    case WT_VARINT:
        if (!read_varint(pp, end, &v)) {
            err->msg = "truncated or overlong varint";
            return 0;
        }
        return 1;
    case WT_I64:
        if (end - *pp < 8) {
            err->msg = "truncated fixed64";
            return 0;
        }
        *pp += 8;
        return 1;
    case WT_I32:
        if (end - *pp < 4) {
            err->msg = "truncated fixed32";
            return 0;
        }
        *pp += 4;
        return 1;
    case WT_LEN:
        if (!read_varint(pp, end, &v) || v > (uint64_t)(end - *pp)) {
            err->msg = "length-delimited field runs past the end";
            return 0;
        }
        *pp += v;
        return 1;
    case WT_SGROUP:
        return skip_group(pp, end, field, depth, err);
    case WT_EGROUP:
        err->msg = "unexpected end-group tag";
        return 0;
    default:
        err->msg = "invalid wire type";
        return 0;
    }
}

static inline int read_len(const uint8_t **pp, const uint8_t *end, const uint8_t **start,
                           size_t *len, perr_t *err) {
    uint64_t v;
    if (!read_varint(pp, end, &v) || v > (uint64_t)(end - *pp)) {
        err->msg = "length-delimited field runs past the end";
        return 0;
    }
    *start = *pp;
    *len = (size_t)v;
    *pp += v;
    return 1;
}

/* ---------------------------------------------------------------- decoding */

typedef struct {
    const uint8_t *start, *end; /* the SequencedRecord's bytes */
    uint64_t seq_num, timestamp;
    const uint8_t *body;
    size_t body_len;
    size_t n_headers;
    size_t name_bytes, value_bytes;
    int is_command;
} rec_t;

/* Parses one Header message: last name/value wins. */
static int parse_header(const uint8_t *p, const uint8_t *end, const uint8_t **name,
                        size_t *name_len, const uint8_t **value, size_t *value_len, perr_t *err) {
    *name = p;
    *name_len = 0;
    *value = p;
    *value_len = 0;
    while (p < end) {
        uint32_t f;
        int wt;
        if (!read_tag(&p, end, &f, &wt, err)) return 0;
        if (f == 1 && wt == WT_LEN) {
            if (!read_len(&p, end, name, name_len, err)) return 0;
        } else if (f == 2 && wt == WT_LEN) {
            if (!read_len(&p, end, value, value_len, err)) return 0;
        } else if (!skip_field(&p, end, f, wt, 2, err)) {
            return 0;
        }
    }
    return 1;
}

static int parse_record(const uint8_t *p, const uint8_t *end, rec_t *r, perr_t *err) {
    r->start = p;
    r->end = end;
    r->seq_num = 0;
    r->timestamp = 0;
    r->body = p;
    r->body_len = 0;
    r->n_headers = 0;
    r->name_bytes = 0;
    r->value_bytes = 0;
    size_t first_name_len = 0;
    while (p < end) {
        uint32_t f;
        int wt;
        if (!read_tag(&p, end, &f, &wt, err)) return 0;
        if (f == 4 && wt == WT_LEN) {
            if (!read_len(&p, end, &r->body, &r->body_len, err)) return 0;
        } else if (f == 1 && wt == WT_VARINT) {
            if (!read_varint(&p, end, &r->seq_num)) {
                err->msg = "truncated or overlong varint";
                return 0;
            }
        } else if (f == 2 && wt == WT_VARINT) {
            if (!read_varint(&p, end, &r->timestamp)) {
                err->msg = "truncated or overlong varint";
                return 0;
            }
        } else if (f == 3 && wt == WT_LEN) {
            const uint8_t *h;
            size_t hl;
            if (!read_len(&p, end, &h, &hl, err)) return 0;
            const uint8_t *n, *v;
            size_t nl, vl;
            if (!parse_header(h, h + hl, &n, &nl, &v, &vl, err)) return 0;
            if (r->n_headers == 0) first_name_len = nl;
            r->n_headers++;
            r->name_bytes += nl;
            r->value_bytes += vl;
        } else if (!skip_field(&p, end, f, wt, 1, err)) {
            return 0;
        }
    }
    r->is_command = (r->n_headers == 1 && first_name_len == 0);
    return 1;
}

/* Appends the record's headers to the output buffers (the record is known valid). */
static void emit_headers(const rec_t *r, int32_t *name_off, size_t *ni, uint8_t *name_data,
                         size_t *name_pos, int32_t *value_off, uint8_t *value_data,
                         size_t *value_pos) {
    perr_t err;
    const uint8_t *p = r->start, *end = r->end;
    while (p < end) {
        uint32_t f = 0; /* set: the record was read once already (as they are below) */
        int wt = 0;
        read_tag(&p, end, &f, &wt, &err);
        if (f == 3 && wt == WT_LEN) {
            const uint8_t *h = p, *n, *v;
            size_t hl = 0, nl, vl;
            read_len(&p, end, &h, &hl, &err);
            parse_header(h, h + hl, &n, &nl, &v, &vl, &err);
            memcpy(name_data + *name_pos, n, nl);
            *name_pos += nl;
            memcpy(value_data + *value_pos, v, vl);
            *value_pos += vl;
            (*ni)++;
            name_off[*ni] = (int32_t)*name_pos;
            value_off[*ni] = (int32_t)*value_pos;
        } else {
            skip_field(&p, end, f, wt, 1, &err);
        }
    }
}

#ifdef Py_LIMITED_API
#define U8(b) ((uint8_t *)PyBytes_AsString(b))
#else
#define U8(b) ((uint8_t *)PyBytes_AS_STRING(b))
#endif

static PyObject *new_bytes(size_t n) { return PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n); }

static PyObject *frame_error(const char *what) {
    PyErr_Format(FrameErrorType ? FrameErrorType : PyExc_ValueError,
                 "malformed S2 ReadBatch message: %s", what);
    return NULL;
}

typedef struct {
    rec_t *recs;
    size_t n_recs, cap;
    int has_tail;
    uint64_t tail_seq, tail_ts;
} scan_t;

/* Pass 1 (no Python API, runs without the GIL, so the index grows by the C allocator):
 * validate and index every record.
 * Returns 1 on success, 0 on malformed input (err set), -1 when out of memory. */
static int scan_batch(const uint8_t *p, const uint8_t *end, scan_t *s, perr_t *err) {
    while (p < end) {
        uint32_t f;
        int wt;
        if (!read_tag(&p, end, &f, &wt, err)) return 0;
        if (f == 1 && wt == WT_LEN) {
            const uint8_t *r;
            size_t rl;
            if (!read_len(&p, end, &r, &rl, err)) return 0;
            if (s->n_recs == s->cap) {
                size_t ncap = s->cap ? s->cap * 2 : 64;
                rec_t *nr = (rec_t *)realloc(s->recs, ncap * sizeof(rec_t));
                if (!nr) return -1;
                s->recs = nr;
                s->cap = ncap;
            }
            if (!parse_record(r, r + rl, &s->recs[s->n_recs], err)) return 0;
            s->n_recs++;
        } else if (f == 2 && wt == WT_LEN) {
            const uint8_t *t, *tend;
            size_t tl;
            if (!read_len(&p, end, &t, &tl, err)) return 0;
            s->has_tail = 1; /* repeated occurrences merge into one message */
            tend = t + tl;
            while (t < tend) {
                uint32_t tf;
                int twt;
                if (!read_tag(&t, tend, &tf, &twt, err)) return 0;
                if (tf == 1 && twt == WT_VARINT) {
                    if (!read_varint(&t, tend, &s->tail_seq)) {
                        err->msg = "truncated or overlong varint";
                        return 0;
                    }
                } else if (tf == 2 && twt == WT_VARINT) {
                    if (!read_varint(&t, tend, &s->tail_ts)) {
                        err->msg = "truncated or overlong varint";
                        return 0;
                    }
                } else if (!skip_field(&t, tend, tf, twt, 1, err)) {
                    return 0;
                }
            }
        } else if (!skip_field(&p, end, f, wt, 0, err)) {
            return 0;
        }
    }
    return 1;
}

/* The buffers of a list or tuple of bytes-like objects, held until release_parts. */
typedef struct {
    PyObject *seq;
    Py_buffer *views;
    Py_ssize_t n;
} parts_t;

static void release_parts(parts_t *parts) {
    for (Py_ssize_t i = 0; i < parts->n; i++) PyBuffer_Release(&parts->views[i]);
    PyMem_Free(parts->views);
    Py_XDECREF(parts->seq);
    parts->views = NULL;
    parts->seq = NULL;
    parts->n = 0;
}

static int hold_parts(PyObject *payloads, parts_t *parts) {
    parts->n = 0;
    parts->views = NULL;
    parts->seq = PySequence_Fast(payloads, "payloads must be a list or tuple of buffers");
    if (!parts->seq) return 0;
    Py_ssize_t n = PySequence_Size(parts->seq);
    if (n < 0) return 0;
    parts->views = (Py_buffer *)PyMem_Calloc(n ? (size_t)n : 1, sizeof(Py_buffer));
    if (!parts->views) {
        PyErr_NoMemory();
        return 0;
    }
    int is_list = PyList_Check(parts->seq);
    for (; parts->n < n; parts->n++) {
        /* Borrowed, and looked up each time: taking a buffer may run code that changes a
         * list (an item gone is an IndexError). */
        PyObject *item = is_list ? PyList_GetItem(parts->seq, parts->n)
                                 : PyTuple_GetItem(parts->seq, parts->n);
        if (!item || PyObject_GetBuffer(item, &parts->views[parts->n], PyBUF_SIMPLE) < 0)
            return 0;
    }
    return 1;
}

/* What the kept records of a message (or of several) need in the output buffers, and the
 * metered bytes of all of them. */
typedef struct {
    size_t n_out, body, hdr, name, value, stream;
    uint64_t metered;
} totals_t;

static int too_large(const totals_t *t) {
    return t->body > INT32_MAX || t->name > INT32_MAX || t->value > INT32_MAX ||
           t->hdr > INT32_MAX || t->stream > INT32_MAX;
}

/* Checks the records' numbers and adds up what they need (`slen`: the stream name's
 * bytes a kept record takes). Returns 1, or 0 with a Python error set. */
static int count_records(const rec_t *recs, size_t n_recs, int include_cmd, size_t slen,
                         totals_t *t) {
    *t = (totals_t){0, 0, 0, 0, 0, 0, 0};
    for (size_t i = 0; i < n_recs; i++) {
        const rec_t *r = &recs[i];
        if (r->seq_num > (uint64_t)INT64_MAX) {
            PyErr_Format(FrameErrorType ? FrameErrorType : PyExc_ValueError,
                         "S2 record seq_num %llu is out of range",
                         (unsigned long long)r->seq_num);
            return 0;
        }
        if (r->timestamp > (uint64_t)(INT64_MAX / 1000)) {
            PyErr_Format(FrameErrorType ? FrameErrorType : PyExc_ValueError,
                         "S2 record timestamp %llu ms is out of range for microseconds",
                         (unsigned long long)r->timestamp);
            return 0;
        }
        t->metered += 8 + 2 * (uint64_t)r->n_headers + r->name_bytes + r->value_bytes +
                      r->body_len;
        if (r->is_command && !include_cmd) continue;
        t->n_out++;
        t->body += r->body_len;
        t->hdr += r->n_headers;
        t->name += r->name_bytes;
        t->value += r->value_bytes;
    }
    if ((t->n_out && slen * t->n_out / t->n_out != slen) || too_large(t)) goto large;
    t->stream = slen * t->n_out;
    if (t->stream <= INT32_MAX) return 1;
large:
    frame_error("batch too large for 32-bit Arrow offsets");
    return 0;
}

/* `into` += `t` (each part checked already: no sum overflows). */
static void add_totals(totals_t *into, const totals_t *t) {
    into->n_out += t->n_out;
    into->body += t->body;
    into->hdr += t->hdr;
    into->name += t->name;
    into->value += t->value;
    into->stream += t->stream;
    into->metered += t->metered;
}

/* The output buffers being filled, and where each is at. */
typedef struct {
    int32_t *soff, *boff, *loff, *noff, *voff;
    uint8_t *sdata, *bdata, *ndata, *vdata;
    int64_t *seqs, *tss;
    size_t j, spos, bpos, hi, npos, vpos;
} fill_t;

/* The 11 buffers for `t` (the header ones None without headers), and `f` at their starts.
 * Returns 1, or 0 with a Python error set (the buffers made so far in `bufs`). */
static int new_bufs(const totals_t *t, int include_headers, PyObject *bufs[11], fill_t *f) {
    size_t n_out = t->n_out;
    bufs[0] = new_bytes((n_out + 1) * 4); /* stream offsets */
    bufs[1] = new_bytes(t->stream);       /* stream data */
    bufs[2] = new_bytes(n_out * 8);       /* seq_num */
    bufs[3] = new_bytes(n_out * 8);       /* timestamp us */
    bufs[4] = new_bytes((n_out + 1) * 4); /* body offsets */
    bufs[5] = new_bytes(t->body);         /* body data */
    for (int k = 0; k < 6; k++)
        if (!bufs[k]) return 0;
    *f = (fill_t){(int32_t *)U8(bufs[0]), (int32_t *)U8(bufs[4]), NULL, NULL, NULL,
                  U8(bufs[1]), U8(bufs[5]), NULL, NULL, (int64_t *)U8(bufs[2]),
                  (int64_t *)U8(bufs[3]), 0, 0, 0, 0, 0, 0};
    f->soff[0] = f->boff[0] = 0;
    if (!include_headers) {
        for (int k = 6; k < 11; k++) {
            bufs[k] = Py_None;
            Py_INCREF(Py_None);
        }
        return 1;
    }
    size_t sizes[5] = {(n_out + 1) * 4, (t->hdr + 1) * 4, t->name, (t->hdr + 1) * 4, t->value};
    for (int k = 6; k < 11; k++) /* list, name and value offsets and data */
        if (!(bufs[k] = new_bytes(sizes[k - 6]))) return 0;
    f->loff = (int32_t *)U8(bufs[6]);
    f->noff = (int32_t *)U8(bufs[7]);
    f->ndata = U8(bufs[8]);
    f->voff = (int32_t *)U8(bufs[9]);
    f->vdata = U8(bufs[10]);
    f->loff[0] = f->noff[0] = f->voff[0] = 0;
    return 1;
}

/* Pass 2 (no Python API): the kept records, of stream `s`, into the buffers after what
 * `f` holds already. */
static void fill_records(const rec_t *recs, size_t n_recs, int include_cmd,
                         const uint8_t *s, size_t slen, fill_t *f) {
    for (size_t i = 0; i < n_recs; i++) {
        const rec_t *r = &recs[i];
        if (r->is_command && !include_cmd) continue;
        size_t j = f->j;
        memcpy(f->sdata + f->spos, s, slen);
        f->spos += slen;
        f->soff[j + 1] = (int32_t)f->spos;
        f->seqs[j] = (int64_t)r->seq_num;
        f->tss[j] = (int64_t)r->timestamp * 1000;
        memcpy(f->bdata + f->bpos, r->body, r->body_len);
        f->bpos += r->body_len;
        f->boff[j + 1] = (int32_t)f->bpos;
        if (f->loff) {
            if (r->n_headers)
                emit_headers(r, f->noff, &f->hi, f->ndata, &f->npos, f->voff, f->vdata,
                             &f->vpos);
            f->loff[j + 1] = (int32_t)f->hi;
        }
        f->j = j + 1;
    }
}

/* Of one decoded message: count, first_seq, last_seq, metered, tail_seq, tail_ts, n_out
 * (first and last None without records, the tail's None without one) into `items`, new
 * references; 1, or 0 with a Python error set (none made). */
#define N_META 7
static int meta_items(const rec_t *recs, size_t n_recs, const scan_t *sc, const totals_t *t,
                      PyObject *items[N_META]) {
    items[0] = PyLong_FromSize_t(n_recs);
    items[1] = n_recs ? PyLong_FromUnsignedLongLong(recs[0].seq_num) : Py_NewRef(Py_None);
    items[2] = n_recs ? PyLong_FromUnsignedLongLong(recs[n_recs - 1].seq_num)
                      : Py_NewRef(Py_None);
    items[3] = PyLong_FromUnsignedLongLong(t->metered);
    items[4] = sc->has_tail ? PyLong_FromUnsignedLongLong(sc->tail_seq) : Py_NewRef(Py_None);
    items[5] = sc->has_tail ? PyLong_FromUnsignedLongLong(sc->tail_ts) : Py_NewRef(Py_None);
    items[6] = PyLong_FromSize_t(t->n_out);
    for (int k = 0; k < N_META; k++) {
        if (items[k]) continue;
        for (int j = 0; j < N_META; j++) Py_CLEAR(items[j]);
        return 0;
    }
    return 1;
}

/* (count, first_seq, last_seq, metered, tail, n_out) of one decoded message (tail a
 * (seq_num, timestamp) or None), or NULL. */
static PyObject *batch_meta(const rec_t *recs, size_t n_recs, const scan_t *sc,
                            const totals_t *t) {
    PyObject *m[N_META];
    if (!meta_items(recs, n_recs, sc, t, m)) return NULL;
    PyObject *tail = Py_None;
    if (m[4] != Py_None && !(tail = PyTuple_Pack(2, m[4], m[5]))) {
        for (int k = 0; k < N_META; k++) Py_DECREF(m[k]);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(6, m[0], m[1], m[2], m[3], tail, m[6]);
    for (int k = 0; k < N_META; k++) Py_DECREF(m[k]);
    if (tail != Py_None) Py_DECREF(tail);
    return out;
}

/* `head` (a tuple) followed by the 11 buffers, stolen (NULL'd) whatever the outcome. */
static PyObject *with_bufs(PyObject *head, PyObject *bufs[11]) {
    PyObject *tail = NULL, *result = NULL;
    if (head && (tail = PyTuple_New(11)) != NULL) {
        for (int k = 0; k < 11; k++) {
            PyTuple_SetItem(tail, k, bufs[k]); /* steals */
            bufs[k] = NULL;
        }
        result = PySequence_Concat(head, tail);
    }
    for (int k = 0; k < 11; k++) Py_CLEAR(bufs[k]);
    Py_XDECREF(head);
    Py_XDECREF(tail);
    return result;
}

/*
 * decode_read_batches(payloads, stream_utf8, include_command_records, include_headers)
 * -> (count, first_seq, last_seq, metered, tail, n_out, stream_offsets, stream_data,
 *     seq_nums, timestamps_us, body_offsets, body_data,
 *     header_offsets, name_offsets, name_data, value_offsets, value_data)
 * payloads: a list or tuple of buffers, each a whole ReadBatch, read in place. They decode
 * as the one message their concatenation is (the records of all, in order; tail fields
 * merged, the last value of each winning), each checked on its own as a message.
 * The header buffers are None when include_headers is false.
 */
static PyObject *fw_decode_read_batches(PyObject *self, PyObject *args) {
    PyObject *payloads;
    Py_buffer sview;
    int include_cmd, include_headers;
    if (!PyArg_ParseTuple(args, "Oy*pp", &payloads, &sview, &include_cmd, &include_headers))
        return NULL;
    perr_t err = {NULL};
    scan_t sc = {NULL, 0, 0, 0, 0, 0};
    parts_t parts = {NULL, NULL, 0};
    totals_t t;
    fill_t f;
    PyObject *result = NULL;
    PyObject *bufs[11] = {NULL};
    int rc = 1;

    if (!hold_parts(payloads, &parts)) goto done;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < parts.n && rc == 1; i++) {
        const uint8_t *p = (const uint8_t *)parts.views[i].buf;
        rc = scan_batch(p, p + parts.views[i].len, &sc, &err);
    }
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (rc == 0) {
        frame_error(err.msg ? err.msg : "invalid data");
        goto done;
    }
    if (!count_records(sc.recs, sc.n_recs, include_cmd, (size_t)sview.len, &t)) goto done;
    if (!new_bufs(&t, include_headers, bufs, &f)) goto done;
    Py_BEGIN_ALLOW_THREADS
    fill_records(sc.recs, sc.n_recs, include_cmd, (const uint8_t *)sview.buf,
                 (size_t)sview.len, &f);
    Py_END_ALLOW_THREADS
    result = with_bufs(batch_meta(sc.recs, sc.n_recs, &sc, &t), bufs);
done:
    for (int k = 0; k < 11; k++) Py_XDECREF(bufs[k]);
    free(sc.recs);
    release_parts(&parts);
    PyBuffer_Release(&sview);
    return result;
}

/* One payload of decode_read_many: its records recs[start, end), its tail. */
typedef struct {
    size_t start, end;
    scan_t tail; /* has_tail, tail_seq, tail_ts only */
    totals_t t;
    const char *stream;
    Py_ssize_t slen;
} many_t;

/* Payload `one`'s records (NULL, not NULL + 0, where no payload had any). */
static const rec_t *recs_of(const scan_t *sc, const many_t *one) {
    return sc->recs ? sc->recs + one->start : NULL;
}

/* Scans payloads [0, n) each as a message of its own (no Python API): returns how many
 * scanned whole, `rc` the last scan's outcome (as scan_batch's). */
static Py_ssize_t scan_each(const parts_t *parts, scan_t *sc, many_t *each, int *rc,
                            perr_t *err) {
    Py_ssize_t i = 0;
    for (; i < parts->n; i++) {
        const uint8_t *p = (const uint8_t *)parts->views[i].buf;
        sc->has_tail = 0;
        sc->tail_seq = sc->tail_ts = 0;
        each[i].start = sc->n_recs;
        *rc = scan_batch(p, p + parts->views[i].len, sc, err);
        if (*rc != 1) break;
        each[i].end = sc->n_recs;
        each[i].tail = (scan_t){NULL, 0, 0, sc->has_tail, sc->tail_seq, sc->tail_ts};
    }
    return i;
}

/* Payload i's stream as UTF-8 (held by the list): 1, or 0 with a Python error set. */
static int stream_of(PyObject *streams, Py_ssize_t i, many_t *one) {
    PyObject *s = PyList_GetItem(streams, i);
    return s && (one->stream = PyUnicode_AsUTF8AndSize(s, &one->slen)) != NULL;
}

/* Checks and counts payloads [0, scanned) in order (each as decode_read_batches would,
 * its stream encoded first), their totals into `all`; then the scan's failure, if one
 * stopped it (its stream encoded first), then the sums' size. Returns 1, or 0 with a
 * Python error set. */
static int count_each(PyObject *streams, many_t *each, Py_ssize_t scanned, const scan_t *sc,
                      int include_cmd, int rc, const perr_t *err, totals_t *all) {
    *all = (totals_t){0, 0, 0, 0, 0, 0, 0};
    for (Py_ssize_t i = 0; i < scanned; i++) {
        if (!stream_of(streams, i, &each[i]) ||
            !count_records(recs_of(sc, &each[i]), each[i].end - each[i].start,
                           include_cmd, (size_t)each[i].slen, &each[i].t))
            return 0;
        add_totals(all, &each[i].t);
    }
    if (rc != 1 && !stream_of(streams, scanned, &each[scanned])) return 0;
    if (rc < 0) {
        PyErr_NoMemory();
        return 0;
    }
    if (rc == 0) {
        frame_error(err->msg ? err->msg : "invalid data");
        return 0;
    }
    if (!too_large(all)) return 1;
    frame_error("batch too large for 32-bit Arrow offsets");
    return 0;
}

/* meta_items of each payload, one after another in one list (no tuple a payload: a
 * read_many of 10,000 reads made 20,000 objects for the collector), or NULL. */
static PyObject *metas_of(const many_t *each, Py_ssize_t n, const scan_t *sc) {
    PyObject *metas = PyList_New(n * N_META);
    for (Py_ssize_t i = 0; metas && i < n; i++) {
        PyObject *m[N_META];
        if (!meta_items(recs_of(sc, &each[i]), each[i].end - each[i].start, &each[i].tail,
                        &each[i].t, m)) {
            Py_CLEAR(metas);
            break;
        }
        for (int k = 0; k < N_META; k++) PyList_SetItem(metas, i * N_META + k, m[k]); /* steals */
    }
    return metas;
}

/*
 * decode_read_many(payloads, streams, include_command_records, include_headers)
 * -> (metas, n_out, stream_offsets, ... value_data) as decode_read_batches's buffers:
 * each payload a ReadBatch of its own, of stream streams[i] (a list of str as long as
 * payloads), as decode_read_batches([payload], stream) decodes it, the kept records of
 * all in one set of buffers, in order; metas payload i's count, first_seq, last_seq,
 * metered, tail_seq, tail_ts (None without a tail) and n_out at 7 * i .. 7 * i + 6. The
 * first error is the one decoding them one by one meets.
 */
static PyObject *fw_decode_read_many(PyObject *self, PyObject *args) {
    PyObject *payloads, *streams, *result = NULL, *bufs[11] = {NULL};
    int include_cmd, include_headers, rc = 1;
    if (!PyArg_ParseTuple(args, "OO!pp", &payloads, &PyList_Type, &streams, &include_cmd,
                          &include_headers))
        return NULL;
    perr_t err = {NULL};
    scan_t sc = {NULL, 0, 0, 0, 0, 0};
    parts_t parts = {NULL, NULL, 0};
    many_t *each = NULL;
    totals_t all;
    fill_t f;
    Py_ssize_t scanned;

    if (!hold_parts(payloads, &parts)) goto done;
    if (PyList_Size(streams) != parts.n) {
        PyErr_SetString(PyExc_ValueError, "one stream a payload");
        goto done;
    }
    if (!(each = (many_t *)PyMem_Calloc(parts.n ? (size_t)parts.n : 1, sizeof(many_t)))) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    scanned = scan_each(&parts, &sc, each, &rc, &err);
    Py_END_ALLOW_THREADS
    if (!count_each(streams, each, scanned, &sc, include_cmd, rc, &err, &all)) goto done;
    if (!new_bufs(&all, include_headers, bufs, &f)) goto done;
    /* With the GIL: the streams' UTF-8 is theirs, held by the list (as long as it is). */
    for (Py_ssize_t i = 0; i < parts.n; i++)
        fill_records(recs_of(&sc, &each[i]), each[i].end - each[i].start, include_cmd,
                     (const uint8_t *)each[i].stream, (size_t)each[i].slen, &f);
    PyObject *metas = metas_of(each, parts.n, &sc);
    result = with_bufs(metas ? Py_BuildValue("(Nn)", metas, (Py_ssize_t)all.n_out) : NULL,
                       bufs);
done:
    for (int k = 0; k < 11; k++) Py_XDECREF(bufs[k]);
    PyMem_Free(each);
    free(sc.recs);
    release_parts(&parts);
    return result;
}

/* ---------------------------------------------------------------- encoding */

static inline size_t varint_size(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline uint8_t *put_varint(uint8_t *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

typedef struct {
    Py_buffer view;
    int held;
} hbuf_t;

static int get_buf(PyObject *o, hbuf_t *b) {
    b->held = 0;
    if (o == Py_None) return 1;
    if (PyObject_GetBuffer(o, &b->view, PyBUF_SIMPLE) < 0) return 0;
    b->held = 1;
    return 1;
}

static void rel_buf(hbuf_t *b) {
    if (b->held) PyBuffer_Release(&b->view);
    b->held = 0;
}

/* Element i of an int64 buffer, which need not be 8-byte aligned. */
static inline int64_t ld64(const hbuf_t *b, int64_t i) {
    int64_t v;
    memcpy(&v, (const char *)b->view.buf + 8 * i, 8);
    return v;
}

/* Whether elements first..last of an int64 offsets buffer exist, never decrease and lie
 * within 0..limit (the length of the data they index). */
static int offsets_ok(const hbuf_t *off, int64_t first, int64_t last, int64_t limit) {
    if (!off->held || first < 0 || last < first || last >= off->view.len / 8) return 0;
    int64_t prev = 0;
    for (int64_t i = first; i <= last; i++) {
        int64_t v = ld64(off, i);
        if (v < prev || v > limit) return 0;
        prev = v;
    }
    return 1;
}

/* The checked inputs of encode_records; has_h / has_ts: headers / timestamps given. */
typedef struct {
    const hbuf_t *bo, *ho, *no, *vo, *ts;
    const uint8_t *bd, *nd, *vd, *tv;
    int has_h, has_ts;
} enc_t;

static inline int has_timestamp(const enc_t *e, int64_t i) {
    return e->has_ts && (!e->tv || e->tv[i]);
}

/* A length-delimited field's size; an empty one is omitted (proto3 default). */
static inline size_t field_size(uint64_t len) { return len ? 1 + varint_size(len) + len : 0; }

/* Record i's AppendRecord size; adds its metered size to *metered when not NULL. */
static size_t record_size(const enc_t *e, int64_t i, uint64_t *metered) {
    size_t rec = has_timestamp(e, i) ? 1 + varint_size((uint64_t)ld64(e->ts, i)) : 0;
    uint64_t m = 8;
    if (e->has_h) {
        for (int64_t h = ld64(e->ho, i); h < ld64(e->ho, i + 1); h++) {
            uint64_t nl = (uint64_t)(ld64(e->no, h + 1) - ld64(e->no, h));
            uint64_t vl = (uint64_t)(ld64(e->vo, h + 1) - ld64(e->vo, h));
            size_t hs = field_size(nl) + field_size(vl);
            rec += 1 + varint_size(hs) + hs; /* written even when empty */
            m += 2 + nl + vl;
        }
    }
    uint64_t bl = (uint64_t)(ld64(e->bo, i + 1) - ld64(e->bo, i));
    rec += field_size(bl);
    if (metered) *metered = m + bl;
    return rec;
}

static inline uint8_t *put_field(uint8_t *q, uint8_t tag, const uint8_t *data, uint64_t len) {
    if (!len) return q;
    *q++ = tag;
    q = put_varint(q, len);
    memcpy(q, data, len);
    return q + len;
}

/* Writes record i's entry (0x0A, length, AppendRecord) at q; returns the end. */
static uint8_t *put_record(const enc_t *e, int64_t i, uint8_t *q) {
    *q++ = 0x0A;
    q = put_varint(q, record_size(e, i, NULL));
    if (has_timestamp(e, i)) {
        *q++ = 0x08;
        q = put_varint(q, (uint64_t)ld64(e->ts, i));
    }
    if (e->has_h) {
        for (int64_t h = ld64(e->ho, i); h < ld64(e->ho, i + 1); h++) {
            int64_t n0 = ld64(e->no, h), v0 = ld64(e->vo, h);
            uint64_t nl = (uint64_t)(ld64(e->no, h + 1) - n0);
            uint64_t vl = (uint64_t)(ld64(e->vo, h + 1) - v0);
            *q++ = 0x12;
            q = put_varint(q, field_size(nl) + field_size(vl));
            q = put_field(q, 0x0A, e->nd + n0, nl);
            q = put_field(q, 0x12, e->vd + v0, vl);
        }
    }
    int64_t b0 = ld64(e->bo, i);
    return put_field(q, 0x1A, e->bd + b0, (uint64_t)(ld64(e->bo, i + 1) - b0));
}

/*
 * encode_records(n, body_offsets(int64[n+1]), body_data,
 *                header_offsets(int64[n+1]) | None, name_offsets(int64) | None, name_data | None,
 *                value_offsets(int64) | None, value_data | None,
 *                timestamps(uint64[n]) | None, ts_valid(uint8[n]) | None)
 * -> (payload bytes, entry_ends int64[n] bytes, metered int64[n] bytes)
 * Offsets are absolute positions into the data buffers (already adjusted for slicing);
 * every offset is checked to lie within its buffer, so no input reads out of bounds.
 * Each entry is `0x0A len AppendRecord`, fields in order timestamp(1), headers(2), body(3),
 * body omitted when empty (proto3 default), header name/value omitted when empty.
 */
static PyObject *fw_encode_records(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    PyObject *o[9];
    if (!PyArg_ParseTuple(args, "nOOOOOOOOO", &n, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                          &o[6], &o[7], &o[8]))
        return NULL;
    hbuf_t b[9];
    memset(b, 0, sizeof(b));
    PyObject *payload = NULL, *ends = NULL, *meters = NULL, *result = NULL;
    for (int k = 0; k < 9; k++)
        if (!get_buf(o[k], &b[k])) goto done;
    if (n < 0 || !b[1].held || !offsets_ok(&b[0], 0, n, b[1].view.len)) {
        PyErr_SetString(PyExc_ValueError, "bad body buffers");
        goto done;
    }
    int has_h = b[2].held;
    if (has_h && (!b[4].held || !b[6].held || !offsets_ok(&b[2], 0, n, INT64_MAX - 1) ||
                  !offsets_ok(&b[3], ld64(&b[2], 0), ld64(&b[2], n), b[4].view.len) ||
                  !offsets_ok(&b[5], ld64(&b[2], 0), ld64(&b[2], n), b[6].view.len))) {
        PyErr_SetString(PyExc_ValueError, "bad header buffers");
        goto done;
    }
    int has_ts = b[7].held;
    if ((!has_ts && b[8].held) || (has_ts && (b[7].view.len / 8 < n ||
                                              (b[8].held && b[8].view.len < n)))) {
        PyErr_SetString(PyExc_ValueError, "bad timestamp buffers");
        goto done;
    }
    enc_t e = {&b[0], &b[2], &b[3], &b[5], &b[7],
               (const uint8_t *)b[1].view.buf,
               has_h ? (const uint8_t *)b[4].view.buf : NULL,
               has_h ? (const uint8_t *)b[6].view.buf : NULL,
               b[8].held ? (const uint8_t *)b[8].view.buf : NULL,
               has_h, has_ts};

    /* Pass 1: sizes. */
    size_t total = 0;
    ends = new_bytes((size_t)n * 8);
    meters = new_bytes((size_t)n * 8);
    if (!ends || !meters) goto done;
    int64_t *endp = (int64_t *)U8(ends);
    int64_t *mp = (int64_t *)U8(meters);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t m;
        size_t rec = record_size(&e, i, &m);
        total += 1 + varint_size(rec) + rec;
        endp[i] = (int64_t)total;
        mp[i] = (int64_t)m;
    }
    /* Pass 2: the entries. */
    payload = new_bytes(total);
    if (!payload) goto done;
    uint8_t *q = U8(payload);
    for (Py_ssize_t i = 0; i < n; i++) q = put_record(&e, i, q);
    result = Py_BuildValue("(OOO)", payload, ends, meters);
done:
    Py_XDECREF(payload);
    Py_XDECREF(ends);
    Py_XDECREF(meters);
    for (int k = 0; k < 9; k++) rel_buf(&b[k]);
    return result;
}

/*
 * crc32(data, value=0): zlib's CRC-32 (the gzip polynomial, reflected) of data, carried on
 * from value, as zlib.crc32(data, value) gives it: the digest of a writer's marks
 * (backends/s2/_digest.py). zlib's table-driven loop runs at about 1 GB/s, as much
 * again as encoding the rows; where the CPU multiplies carry-less (x86-64 PCLMULQDQ),
 * whole 16-byte blocks are folded instead, as Intel's "Fast CRC Computation for Generic
 * Polynomials Using PCLMULQDQ Instruction" (Gopal et al., 2009) describes, with the
 * constants it gives for this polynomial; the tail and short inputs go byte by byte.
 */
static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
        crc_table[i] = c;
    }
}

/* The CRC register (inverted, as zlib keeps it) after the bytes of p[0..n). */
static uint32_t crc_bytes(uint32_t c, const uint8_t *p, size_t n) {
    while (n--) c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_CLMUL_CRC 1

/* The register after n bytes (n >= 16, a multiple of 16), 16-byte blocks folded: each
 * block B_i of the message M = B_0..B_k-1 contributes B_i x^(128(k-1-i)), and a fold
 * multiplies running 128 bits by x^128 mod P (two 64-bit halves times the paper's k3 and
 * k4) before the next block is added; long inputs first run four such lanes 64 bytes
 * apart (x^512: k1, k2), which keeps the multiplier busy. The last 128 bits are then
 * reduced to 64, to 32 (k5), and by Barrett's method (P' and mu). */
__attribute__((target("pclmul,sse4.1")))
static uint32_t crc_clmul(uint32_t c, const uint8_t *p, size_t n) {
    const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
    const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x1f7011641LL, 0x1db710641LL);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)c));
    p += 16;
    n -= 16;
    if (n >= 48) { /* four lanes, each folded by 512 bits (k1, k2), then into one */
        const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);
        __m128i v[4] = {x, _mm_loadu_si128((const __m128i *)p),
                        _mm_loadu_si128((const __m128i *)(p + 16)),
                        _mm_loadu_si128((const __m128i *)(p + 32))};
        for (p += 48, n -= 48; n >= 64; p += 64, n -= 64)
            for (int i = 0; i < 4; i++)
                v[i] = _mm_xor_si128(
                    _mm_xor_si128(_mm_clmulepi64_si128(v[i], k1k2, 0x00),
                                  _mm_clmulepi64_si128(v[i], k1k2, 0x11)),
                    _mm_loadu_si128((const __m128i *)(p + 16 * i)));
        x = v[0];
        for (int i = 1; i < 4; i++)
            x = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k3k4, 0x00),
                                            _mm_clmulepi64_si128(x, k3k4, 0x11)), v[i]);
    }
    for (; n >= 16; p += 16, n -= 16) {
        __m128i lo = _mm_clmulepi64_si128(x, k3k4, 0x00);
        __m128i hi = _mm_clmulepi64_si128(x, k3k4, 0x11);
        x = _mm_xor_si128(_mm_xor_si128(lo, hi), _mm_loadu_si128((const __m128i *)p));
    }
    /* 128 -> 64 bits. */
    __m128i t = _mm_clmulepi64_si128(x, k3k4, 0x10);
    x = _mm_xor_si128(_mm_srli_si128(x, 8), t);
    /* 64 -> 32 bits. */
    t = _mm_srli_si128(x, 4);
    x = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x, low32), k5, 0x00), t);
    /* Barrett reduction. */
    t = _mm_clmulepi64_si128(_mm_and_si128(x, low32), poly, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), poly, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(x, t), 1);
}

static int clmul_ok = -1; /* whether this CPU has PCLMULQDQ and SSE4.1; -1: not asked */
#endif

static uint32_t crc_update(uint32_t value, const uint8_t *p, size_t n) {
    uint32_t c = ~value;
#ifdef HAVE_CLMUL_CRC
    if (clmul_ok < 0)
        clmul_ok = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    if (clmul_ok && n >= 64) {
        size_t whole = n & ~(size_t)15;
        c = crc_clmul(c, p, whole);
        p += whole;
        n -= whole;
    }
#endif
    return ~crc_bytes(c, p, n);
}

static PyObject *fw_crc32(PyObject *self, PyObject *args) {
    PyObject *data;
    unsigned long value = 0;
    if (!PyArg_ParseTuple(args, "O|k", &data, &value)) return NULL;
    hbuf_t b;
    if (!get_buf(data, &b)) return NULL;
    if (!b.held) {
        PyErr_SetString(PyExc_TypeError, "crc32 takes a bytes-like object");
        return NULL;
    }
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS
    crc = crc_update((uint32_t)value, (const uint8_t *)b.view.buf, (size_t)b.view.len);
    Py_END_ALLOW_THREADS
    rel_buf(&b);
    return PyLong_FromUnsignedLong(crc);
}

/* ---------------------------------------------------------------- many-stream appends */

/* One StreamPosition's fields into seq / ts (fields present overwrite: repeated
 * occurrences of the message merge); unknown fields skipped at depth 1. */
static int parse_position(const uint8_t *p, const uint8_t *end, uint64_t *seq, uint64_t *ts,
                          perr_t *err) {
    while (p < end) {
        uint32_t f;
        int wt;
        if (!read_tag(&p, end, &f, &wt, err)) return 0;
        if ((f == 1 || f == 2) && wt == WT_VARINT) {
            if (!read_varint(&p, end, f == 1 ? seq : ts)) {
                err->msg = "truncated or overlong varint";
                return 0;
            }
        } else if (!skip_field(&p, end, f, wt, 1, err)) {
            return 0;
        }
    }
    return 1;
}

/* An AppendAck: start, end and tail positions, seq_num and timestamp each, into out[6]. */
static int parse_ack(const uint8_t *p, const uint8_t *end, uint64_t out[6], perr_t *err) {
    memset(out, 0, 6 * sizeof(uint64_t));
    while (p < end) {
        uint32_t f;
        int wt;
        if (!read_tag(&p, end, &f, &wt, err)) return 0;
        if (f >= 1 && f <= 3 && wt == WT_LEN) {
            const uint8_t *m;
            size_t ml;
            if (!read_len(&p, end, &m, &ml, err)) return 0;
            if (!parse_position(m, m + ml, &out[2 * (f - 1)], &out[2 * (f - 1) + 1], err))
                return 0;
        } else if (!skip_field(&p, end, f, wt, 0, err)) {
            return 0;
        }
    }
    return 1;
}

/* append_acks(answers: list) -> (bytes, list): the AppendAck of every answer (protobuf),
 * six native u64 each (start seq_num, timestamp; end; tail), and the indices of those that
 * are not one (left zero there, for the caller to decode its own way). */
static PyObject *fw_append_acks(PyObject *self, PyObject *args) {
    PyObject *answers;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &answers)) return NULL;
    Py_ssize_t n = PyList_Size(answers);
    PyObject *out = new_bytes((size_t)n * 6 * sizeof(uint64_t));
    PyObject *bad = PyList_New(0);
    if (!out || !bad) goto error;
    uint8_t *q = U8(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t ack[6];
        hbuf_t b;
        perr_t err = {NULL};
        PyObject *item = PyList_GetItem(answers, i);
        if (!item || !get_buf(item, &b)) goto error;
        int ok = b.held && parse_ack((const uint8_t *)b.view.buf,
                                     (const uint8_t *)b.view.buf + b.view.len, ack, &err);
        rel_buf(&b);
        if (!ok) {
            memset(ack, 0, sizeof ack);
            PyObject *k = PyLong_FromSsize_t(i);
            if (!k || PyList_Append(bad, k) < 0) {
                Py_XDECREF(k);
                goto error;
            }
            Py_DECREF(k);
        }
        memcpy(q + (size_t)i * sizeof ack, ack, sizeof ack);
    }
    return Py_BuildValue("(NN)", out, bad);
error:
    Py_XDECREF(out);
    Py_XDECREF(bad);
    return NULL;
}

#define MARK_MAX 36  /* S2's fencing token limit: a mark is a fence record's value */
#define MARK_DIGEST 10 /* digest characters a mark keeps at most (_digest.MARK_CHARS) */

static const char B36[] = "0123456789abcdefghijklmnopqrstuvwxyz";
static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* n in base 36 into p (at most 13 characters); its length. */
static size_t put_b36(char *p, uint64_t n) {
    char tmp[16];
    size_t k = 0;
    do {
        tmp[k++] = B36[n % 36];
        n /= 36;
    } while (n);
    for (size_t i = 0; i < k; i++) p[i] = tmp[k - 1 - i];
    return k;
}

/* The first `take` (<= 11) characters of RowsDigest.text(): base 64 of the crc and the
 * low 32 bits of the size, 8 bytes big-endian. */
static void put_digest(char *p, uint32_t crc, uint64_t size, size_t take) {
    uint8_t raw[9] = {0};
    uint64_t v = ((uint64_t)crc << 32) | (size & 0xFFFFFFFFu);
    for (int i = 0; i < 8; i++) raw[i] = (uint8_t)(v >> (56 - 8 * i));
    char text[12];
    for (int g = 0; g < 3; g++) {
        uint32_t w = ((uint32_t)raw[3 * g] << 16) | ((uint32_t)raw[3 * g + 1] << 8) | raw[3 * g + 2];
        for (int j = 0; j < 4; j++) text[4 * g + j] = B64[(w >> (18 - 6 * j)) & 63];
    }
    memcpy(p, text, take);
}

/* The inputs of sink_bodies, checked. */
typedef struct {
    Py_ssize_t n_payloads, n_suffixes;
    Py_buffer *payloads;
    hbuf_t sb, lo, hi, firsts, counts, suffix_of;
    int64_t n_segs, n_streams;
} bodies_t;

static int int64s(PyObject *o, hbuf_t *b, int64_t *n, const char *what) {
    if (!get_buf(o, b)) return 0;
    if (!b->held || b->view.len % 8) {
        PyErr_Format(PyExc_ValueError, "%s must be an int64 buffer", what);
        return 0;
    }
    *n = b->view.len / 8;
    return 1;
}

static void release_bodies(bodies_t *a) {
    for (Py_ssize_t i = 0; i < a->n_payloads; i++) PyBuffer_Release(&a->payloads[i]);
    free(a->payloads);
    rel_buf(&a->sb);
    rel_buf(&a->lo);
    rel_buf(&a->hi);
    rel_buf(&a->firsts);
    rel_buf(&a->counts);
    rel_buf(&a->suffix_of);
}

/* Whether the segments and streams of `a` index what exists; ValueError if not. */
static int bodies_ok(bodies_t *a) {
    for (int64_t s = 0; s < a->n_segs; s++) {
        int64_t k = ld64(&a->sb, s), lo = ld64(&a->lo, s), hi = ld64(&a->hi, s);
        if (k < 0 || k >= a->n_payloads || lo < 0 || hi < lo || hi > a->payloads[k].len) {
            PyErr_Format(PyExc_ValueError, "segment %lld is out of its payload", (long long)s);
            return 0;
        }
    }
    int64_t prev = 0;
    if (ld64(&a->firsts, 0) != 0 || ld64(&a->firsts, a->n_streams) != a->n_segs) {
        PyErr_SetString(PyExc_ValueError, "firsts must run from 0 to the number of segments");
        return 0;
    }
    for (int64_t k = 0; k <= a->n_streams; k++) {
        int64_t f = ld64(&a->firsts, k);
        if (f < prev) {
            PyErr_SetString(PyExc_ValueError, "firsts must not decrease");
            return 0;
        }
        prev = f;
    }
    for (int64_t k = 0; k < a->n_streams; k++) {
        int64_t j = ld64(&a->suffix_of, k);
        if (ld64(&a->counts, k) < 0 || j < 0 || j >= a->n_suffixes) {
            PyErr_Format(PyExc_ValueError, "stream %lld: a negative count or no such suffix",
                         (long long)k);
            return 0;
        }
    }
    return 1;
}

/* Stream k's body (sink_bodies), or NULL with an error set. */
static PyObject *one_body(const bodies_t *a, int64_t k, const char *head, size_t head_len,
                          PyObject *suffixes) {
    char mark[64];
    if (head_len > MARK_MAX) goto too_long;
    memcpy(mark, head, head_len);
    size_t m = head_len + put_b36(mark + head_len, (uint64_t)ld64(&a->counts, k));
    if (m + 1 > MARK_MAX) goto too_long;
    int64_t s0 = ld64(&a->firsts, k), s1 = ld64(&a->firsts, k + 1);
    uint32_t crc = 0;
    uint64_t size = 0;
    for (int64_t s = s0; s < s1; s++) {
        const uint8_t *base = (const uint8_t *)a->payloads[ld64(&a->sb, s)].buf;
        int64_t l = ld64(&a->lo, s), h = ld64(&a->hi, s);
        crc = crc_update(crc, base + l, (size_t)(h - l));
        size += (uint64_t)(h - l);
    }
    size_t room = MARK_MAX - m - 1, take = room < MARK_DIGEST ? room : MARK_DIGEST;
    mark[m++] = '.';
    put_digest(mark + m, crc, size, take);
    m += take;
    PyObject *suffix = PyList_GetItem(suffixes, (Py_ssize_t)ld64(&a->suffix_of, k));
    size_t inner = 11 + 2 + m, tail = (size_t)PyBytes_Size(suffix); /* prefix, 0x1a, m */
    PyObject *body = new_bytes((size_t)size + 2 + inner + tail);
    if (!body) return NULL;
    uint8_t *q = U8(body);
    for (int64_t s = s0; s < s1; s++) {
        const uint8_t *base = (const uint8_t *)a->payloads[ld64(&a->sb, s)].buf;
        int64_t l = ld64(&a->lo, s), h = ld64(&a->hi, s);
        memcpy(q, base + l, (size_t)(h - l));
        q += h - l;
    }
    *q++ = 0x0A; /* the mark's fence record: timestamp 0, header ("", "fence"), the mark */
    *q++ = (uint8_t)inner;
    memcpy(q, "\x08\x00\x12\x07\x12\x05" "fence\x1a", 12);
    q += 12;
    *q++ = (uint8_t)m;
    memcpy(q, mark, m);
    memcpy(q + m, PyBytes_AsString(suffix), tail);
    return body;
too_long:
    PyErr_Format(PyExc_ValueError, "stream %lld: its mark exceeds %d bytes", (long long)k,
                 MARK_MAX);
    return NULL;
}

/* sink_bodies(payloads, seg_payload, seg_lo, seg_hi, firsts, counts, head, suffixes,
 * suffix_of) -> list[bytes]: the AppendInput of each stream k's single append, as
 * StreamSink._chain builds it for a stream's first: its records (segments
 * firsts[k]..firsts[k+1], each bytes [lo, hi) of a payload), the writer's mark (`head`,
 * the progress counts[k] in base 36, "." and as much of the records' digest as fits in
 * 36 bytes) as a fence record, then suffixes[suffix_of[k]] (the token's fence record and
 * the condition, prepared once per token). */
static PyObject *fw_sink_bodies(PyObject *self, PyObject *args) {
    PyObject *payloads, *sb, *lo, *hi, *firsts, *counts, *suffixes, *suffix_of;
    const char *head;
    Py_ssize_t head_len;
    if (!PyArg_ParseTuple(args, "O!OOOOOy#O!O", &PyList_Type, &payloads, &sb, &lo, &hi,
                          &firsts, &counts, &head, &head_len, &PyList_Type, &suffixes,
                          &suffix_of))
        return NULL;
    bodies_t a;
    memset(&a, 0, sizeof a);
    PyObject *out = NULL;
    Py_ssize_t np_ = PyList_Size(payloads);
    a.payloads = (Py_buffer *)calloc((size_t)(np_ ? np_ : 1), sizeof(Py_buffer));
    if (!a.payloads) return PyErr_NoMemory();
    for (; a.n_payloads < np_; a.n_payloads++)
        if (PyObject_GetBuffer(PyList_GetItem(payloads, a.n_payloads),
                               &a.payloads[a.n_payloads], PyBUF_SIMPLE) < 0)
            goto done;
    a.n_suffixes = PyList_Size(suffixes);
    for (Py_ssize_t j = 0; j < a.n_suffixes; j++)
        if (!PyBytes_Check(PyList_GetItem(suffixes, j))) {
            PyErr_SetString(PyExc_TypeError, "suffixes must be bytes");
            goto done;
        }
    int64_t n_lo, n_hi, n_firsts, n_of;
    if (!int64s(sb, &a.sb, &a.n_segs, "seg_payload") || !int64s(lo, &a.lo, &n_lo, "seg_lo")
        || !int64s(hi, &a.hi, &n_hi, "seg_hi") || !int64s(firsts, &a.firsts, &n_firsts, "firsts")
        || !int64s(counts, &a.counts, &a.n_streams, "counts")
        || !int64s(suffix_of, &a.suffix_of, &n_of, "suffix_of"))
        goto done;
    if (n_lo != a.n_segs || n_hi != a.n_segs || n_firsts != a.n_streams + 1
        || n_of != a.n_streams) {
        PyErr_SetString(PyExc_ValueError, "sink_bodies: arrays of mismatched lengths");
        goto done;
    }
    if (!bodies_ok(&a)) goto done;
    out = PyList_New((Py_ssize_t)a.n_streams);
    if (!out) goto done;
    for (int64_t k = 0; k < a.n_streams; k++) {
        PyObject *body = one_body(&a, k, head, (size_t)head_len, suffixes);
        if (!body) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SetItem(out, (Py_ssize_t)k, body);
    }
done:
    release_bodies(&a);
    return out;
}

static PyObject *fw_set_error_type(PyObject *self, PyObject *arg) {
    PyObject *old = FrameErrorType;
    Py_XINCREF(arg);
    FrameErrorType = arg;
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- HTTP/1.1 answers */

/* h1_response(buf, head_left, max_body, head_request): a whole HTTP/1.1 answer at the
 * start of buf, read as _h1.ResponseReader reads it, when it is the plain kind: a final
 * status (not 1xx), sound head (no control byte but HT, CR and LF only in CRLFs, header
 * names of token bytes), and no body (HEAD, 204, 304) or a body framed by one
 * Content-Length of at most max_body bytes, all here. Returns (status, headers,
 * keep_alive, body, end) with end the offset after the answer; None for anything else
 * (more to come, another framing, or a fault), which the Python reader then reads, so
 * its errors stay the only ones. */

static int is_token_byte(uint8_t c) {
    if (c >= '0' && c <= '9') return 1;
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return 1;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static int is_sound_byte(uint8_t c) { return (c >= 0x20 && c != 0x7f) || c == '\t'; }

/* The first CRLF CRLF in p[0..n), or -1. */
static Py_ssize_t find_head_end(const uint8_t *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i + 3 < n; i++) {
        const uint8_t *q = memchr(p + i, '\r', (size_t)(n - 3 - i));
        if (q == NULL) return -1;
        i = q - p;
        if (q[1] == '\n' && q[2] == '\r' && q[3] == '\n') return i;
    }
    return -1;
}

/* Whether the comma-separated value holds the token "close" (any case). */
static int has_close(const uint8_t *v, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i <= n) {
        Py_ssize_t j = i;
        while (j < n && v[j] != ',') j++;
        Py_ssize_t a = i, b = j;
        while (a < b && (v[a] == ' ' || v[a] == '\t')) a++;
        while (b > a && (v[b - 1] == ' ' || v[b - 1] == '\t')) b--;
        if (b - a == 5) {
            int same = 1;
            for (int k = 0; k < 5; k++) same &= ((v[a + k] | 0x20) == "close"[k]);
            if (same) return 1;
        }
        i = j + 1;
    }
    return 0;
}

typedef struct {
    int version11, status, close, lengths, transfer, coded;
    const uint8_t *length; /* the first Content-Length value */
    Py_ssize_t length_len;
} h1_head_t;

/* Parse the status line p[0..n); 0 where _status_line would refuse it. */
static int h1_status(const uint8_t *p, Py_ssize_t n, h1_head_t *h) {
    if (n < 12 || memcmp(p, "HTTP/1.", 7) != 0 || p[8] != ' ') return 0;
    if (p[7] != '0' && p[7] != '1') return 0;
    for (int k = 9; k < 12; k++)
        if (p[k] < '0' || p[k] > '9') return 0;
    if (n > 12 && p[12] != ' ') return 0;
    h->version11 = p[7] == '1';
    h->status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    return 1;
}

/* One header field line p[0..n) appended to `headers` as (lower-case name, value without
 * surrounding SP/HT); 0 where _field would refuse it, -1 on a Python error. */
static int h1_field(const uint8_t *p, Py_ssize_t n, PyObject *headers, h1_head_t *h) {
    const uint8_t *colon = memchr(p, ':', (size_t)n);
    if (colon == NULL || colon == p) return 0;
    Py_ssize_t nlen = colon - p;
    char lower[64];
    if (nlen > (Py_ssize_t)sizeof lower) return 0; /* rare: the Python reader reads it */
    for (Py_ssize_t k = 0; k < nlen; k++) {
        if (!is_token_byte(p[k])) return 0;
        lower[k] = (char)((p[k] >= 'A' && p[k] <= 'Z') ? p[k] | 0x20 : p[k]);
    }
    const uint8_t *v = colon + 1, *e = p + n;
    while (v < e && (*v == ' ' || *v == '\t')) v++;
    while (e > v && (e[-1] == ' ' || e[-1] == '\t')) e--;
    if (nlen == 14 && memcmp(lower, "content-length", 14) == 0) {
        if (h->lengths++ == 0) {
            h->length = v;
            h->length_len = e - v;
        } else if (e - v != h->length_len || memcmp(v, h->length, (size_t)(e - v)) != 0) {
            return 0; /* lengths that differ: the Python reader refuses them */
        }
    } else if (nlen == 17 && memcmp(lower, "transfer-encoding", 17) == 0) {
        h->transfer = 1;
    } else if (nlen == 10 && memcmp(lower, "connection", 10) == 0) {
        h->close |= has_close(v, e - v);
    } else if (nlen == 16 && memcmp(lower, "content-encoding", 16) == 0) {
        h->coded = 1; /* the bulk readers leave a coded body to Response, which decodes */
    }
    if (headers == NULL) return 1; /* h1_tails: the fields are checked, not kept */
    PyObject *pair = Py_BuildValue("(y#y#)", lower, nlen, (const char *)v, (Py_ssize_t)(e - v));
    if (pair == NULL) return -1;
    int failed = PyList_Append(headers, pair);
    Py_DECREF(pair);
    return failed ? -1 : 1;
}

/* The head p[0..n) (without its final CRLF CRLF) into h and headers; 1, 0 or -1. */
static int h1_head(const uint8_t *p, Py_ssize_t n, PyObject *headers, h1_head_t *h) {
    Py_ssize_t start = 0;
    int first = 1;
    while (start <= n) {
        Py_ssize_t i = start;
        while (i < n && is_sound_byte(p[i])) i++;
        if (i < n && !(p[i] == '\r' && i + 1 < n && p[i + 1] == '\n')) return 0;
        int ok = first ? h1_status(p + start, i - start, h)
                       : h1_field(p + start, i - start, headers, h);
        if (ok <= 0) return ok;
        first = 0;
        start = i + 2;
    }
    return 1;
}

/* The body's length from a Content-Length value, or -1 where body_framing refuses it. */
static long long h1_length(const h1_head_t *h) {
    if (h->length_len == 0 || h->length_len > 18) return -1;
    long long n = 0;
    for (Py_ssize_t k = 0; k < h->length_len; k++) {
        if (h->length[k] < '0' || h->length[k] > '9') return -1;
        n = n * 10 + (h->length[k] - '0');
    }
    return n;
}

static PyObject *h1_answer(const uint8_t *p, Py_ssize_t n, Py_ssize_t head_left,
                           long long max_body, int head_request) {
    Py_ssize_t end = find_head_end(p, n);
    if (end < 0 || end + 4 > head_left) Py_RETURN_NONE;
    h1_head_t h = {0};
    PyObject *headers = PyList_New(0);
    if (headers == NULL) return NULL;
    int ok = h1_head(p, end, headers, &h);
    long long length = 0;
    if (ok > 0 && h.status >= 100 && h.status < 200) ok = 0;
    if (ok > 0 && !(head_request || h.status == 204 || h.status == 304)) {
        if (h.transfer || h.lengths == 0) ok = 0;
        else if ((length = h1_length(&h)) < 0 || length > max_body) ok = 0;
        else if (length > n - (end + 4)) ok = 0; /* not all here yet */
    }
    if (ok <= 0) {
        Py_DECREF(headers);
        if (ok < 0) return NULL;
        Py_RETURN_NONE;
    }
    Py_ssize_t body_at = end + 4;
    return Py_BuildValue("(iNOy#n)", h.status, headers,
                         (h.version11 && !h.close) ? Py_True : Py_False,
                         (const char *)p + body_at, (Py_ssize_t)length,
                         body_at + (Py_ssize_t)length);
}

static PyObject *fw_h1_response(PyObject *self, PyObject *args) {
    PyObject *data;
    Py_ssize_t head_left;
    long long max_body;
    int head_request;
    if (!PyArg_ParseTuple(args, "OnLp", &data, &head_left, &max_body, &head_request))
        return NULL;
    hbuf_t b;
    if (!get_buf(data, &b)) return NULL;
    if (!b.held) {
        PyErr_SetString(PyExc_TypeError, "h1_response takes a bytes-like object");
        return NULL;
    }
    PyObject *out = h1_answer((const uint8_t *)b.view.buf, b.view.len, head_left, max_body,
                              head_request);
    rel_buf(&b);
    return out;
}

/* ---------------------------------------------------------------- bulk tail answers */

/* Digits p[0..n) of S2's spelling (0, or no leading zero, at most 20) into *out;
 * 0 for anything else or a value past 2^64 - 1 (Python reads those, to the same ints). */
static int tail_number(const uint8_t *p, Py_ssize_t n, uint64_t *out) {
    if (n < 1 || n > 20 || (p[0] == '0' && n > 1)) return 0;
    uint64_t v = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (p[k] < '0' || p[k] > '9') return 0;
        uint64_t d = (uint64_t)(p[k] - '0');
        if (v > (UINT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
    }
    *out = v;
    return 1;
}

/* A tail lookup's body exactly as S2 writes it, {"tail":{"seq_num":N,"timestamp":M}}. */
static int tail_body(const uint8_t *p, Py_ssize_t n, uint64_t *seq, uint64_t *ts) {
    static const char A[] = "{\"tail\":{\"seq_num\":", B[] = ",\"timestamp\":";
    const Py_ssize_t a = sizeof A - 1, b = sizeof B - 1;
    if (n < a + 1 + b + 1 + 2 || memcmp(p, A, (size_t)a) != 0) return 0;
    if (memcmp(p + n - 2, "}}", 2) != 0) return 0;
    const uint8_t *d = p + a, *e = p + n - 2;
    const uint8_t *comma = memchr(d, ',', (size_t)(e - d));
    if (comma == NULL || e - comma < b || memcmp(comma, B, (size_t)b) != 0) return 0;
    return tail_number(d, comma - d, seq) && tail_number(comma + b, e - (comma + b), ts);
}

/* One answer at p[0..n): 1 a plain 200 (no Content-Encoding) whose body `body` reads into
 * *a and *b (body NULL: the body's offset in p and its length), its end in *end; 0 more
 * bytes needed; 2 any other answer, or bytes the Python reader is to judge. */
typedef int (*body_fn)(const uint8_t *p, Py_ssize_t n, uint64_t *a, uint64_t *b);

static int plain_answer(const uint8_t *p, Py_ssize_t n, Py_ssize_t head_left,
                        long long max_body, body_fn body, uint64_t *a, uint64_t *b,
                        Py_ssize_t *end) {
    Py_ssize_t head = find_head_end(p, n);
    if (head < 0) return n > head_left ? 2 : 0;
    if (head + 4 > head_left) return 2;
    h1_head_t h = {0};
    if (h1_head(p, head, NULL, &h) <= 0) return 2;
    long long length;
    if (h.status != 200 || !h.version11 || h.close || h.transfer || h.coded ||
        h.lengths == 0 || (length = h1_length(&h)) < 0 || length > max_body)
        return 2;
    if (length > n - (head + 4)) return 0;
    if (body == NULL) {
        *a = (uint64_t)(head + 4);
        *b = (uint64_t)length;
    } else if (!body(p + head + 4, (Py_ssize_t)length, a, b)) {
        return 2;
    }
    *end = head + 4 + (Py_ssize_t)length;
    return 1;
}

/* An AppendAck answer (protobuf, as append_acks reads it): its start and end seq_num. */
static int ack_body(const uint8_t *p, Py_ssize_t n, uint64_t *start, uint64_t *end) {
    uint64_t ack[6];
    perr_t err = {NULL};
    if (!parse_ack(p, p + n, ack, &err)) return 0;
    *start = ack[0];
    *end = ack[2];
    return 1;
}

/* The answers in buf from pos, read while each is a whole plain 200 (a kept-alive
 * HTTP/1.1 answer, its body framed by Content-Length, not coded) whose body `body` reads
 * (NULL: any body, its offset in buf and length the two numbers), its two
 * numbers written to as[first + k] and bs[first + k] (writable uint64 buffers), at most
 * count of them. Returns (answers read, position after them, why it stopped): 0 count
 * read or no bytes left, 1 the next answer is not all here, 2 the next answer is of
 * another kind (or a fault): the Python reader reads that one, so its errors stay the
 * only ones. No Python object per answer. */
static PyObject *h1_bulk(PyObject *args, const char *name, body_fn body) {
    PyObject *data, *as_o, *bs_o;
    Py_ssize_t pos, head_left, first, count;
    long long max_body;
    if (!PyArg_ParseTuple(args, "OnnLOOnn", &data, &pos, &head_left, &max_body, &as_o,
                          &bs_o, &first, &count))
        return NULL;
    Py_buffer b, av, bv;
    if (PyObject_GetBuffer(data, &b, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(as_o, &av, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&b);
        return NULL;
    }
    if (PyObject_GetBuffer(bs_o, &bv, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&av);
        PyBuffer_Release(&b);
        return NULL;
    }
    PyObject *out = NULL;
    if (pos < 0 || pos > b.len || first < 0 || count < 0 || first > av.len / 8 - count ||
        first > bv.len / 8 - count) {
        PyErr_Format(PyExc_ValueError, "%s: position or range out of bounds", name);
        goto done;
    }
    const uint8_t *p = (const uint8_t *)b.buf;
    Py_ssize_t k = 0;
    int stop = 0;
    while (k < count && pos < b.len) {
        uint64_t x = 0, y = 0;
        Py_ssize_t end = 0;
        int got = plain_answer(p + pos, b.len - pos, head_left, max_body, body, &x, &y, &end);
        if (got != 1) {
            stop = got == 0 ? 1 : 2;
            break;
        }
        if (body == NULL) x += (uint64_t)pos; /* h1_bodies: the offset in buf */
        memcpy((uint8_t *)av.buf + 8 * (first + k), &x, 8);
        memcpy((uint8_t *)bv.buf + 8 * (first + k), &y, 8);
        pos += end;
        k++;
    }
    out = Py_BuildValue("(nni)", k, pos, stop);
done:
    PyBuffer_Release(&bv);
    PyBuffer_Release(&av);
    PyBuffer_Release(&b);
    return out;
}

/* h1_tails(buf, pos, head_left, max_body, seqs, tss, first, count): h1_bulk of tail
 * lookups' answers in S2's own spelling of a tail, their positions into seqs and tss. */
static PyObject *fw_h1_tails(PyObject *self, PyObject *args) {
    return h1_bulk(args, "h1_tails", tail_body);
}

/* h1_acks(buf, pos, head_left, max_body, starts, ends, first, count): h1_bulk of appends'
 * answers, each an AppendAck (protobuf), their start and end seq_num into starts, ends. */
static PyObject *fw_h1_acks(PyObject *self, PyObject *args) {
    return h1_bulk(args, "h1_acks", ack_body);
}

/* h1_bodies(buf, pos, head_left, max_body, offsets, lengths, first, count): h1_bulk of
 * small reads' answers, any body: where each lies in buf, for the caller to take before
 * buf moves on (its ReadBatch is decoded with the others' later, decode_read_many). */
static PyObject *fw_h1_bodies(PyObject *self, PyObject *args) {
    return h1_bulk(args, "h1_bodies", NULL);
}

static PyMethodDef methods[] = {
    {"decode_read_batches", fw_decode_read_batches, METH_VARARGS,
     "Decode ReadBatch messages, read in place, to one set of buffers."},
    {"decode_read_many", fw_decode_read_many, METH_VARARGS,
     "Decode ReadBatch messages, each its own stream's, to one set of buffers."},
    {"encode_records", fw_encode_records, METH_VARARGS, "Encode AppendRecord entries."},
    {"crc32", fw_crc32, METH_VARARGS, "zlib.crc32(data, value), folded where the CPU can."},
    {"append_acks", fw_append_acks, METH_VARARGS,
     "AppendAck answers, many in one call, into six u64 each."},
    {"sink_bodies", fw_sink_bodies, METH_VARARGS,
     "A writer's first append to each of many streams: records, mark and token."},
    {"h1_response", fw_h1_response, METH_VARARGS,
     "A whole plain HTTP/1.1 answer at the start of a buffer, or None."},
    {"h1_tails", fw_h1_tails, METH_VARARGS,
     "Plain tail lookups' answers off a buffer, their positions into arrays."},
    {"h1_acks", fw_h1_acks, METH_VARARGS,
     "Plain append answers off a buffer, their acks' start and end into arrays."},
    {"h1_bodies", fw_h1_bodies, METH_VARARGS,
     "Plain answers off a buffer, their bodies' offsets and lengths into arrays."},
    {"_set_error_type", fw_set_error_type, METH_O, "Set the exception type for bad input."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "s2_spark.wire._fastwire",
    "C accelerator for s2_spark.wire (optional).", -1, methods,
};

PyMODINIT_FUNC PyInit__fastwire(void) {
    crc_init();
    return PyModule_Create(&module);
}
