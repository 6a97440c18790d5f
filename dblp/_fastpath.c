/* dblp._fastpath: the data path's per-datagram work in C, for runs of plain DATA.
 *
 * Why: above ~1 Gbit/s a Python receiver spends most of its CPU on glue, a
 * handful of numpy calls per batch and a loop turn per read, not on moving
 * bytes (py-spy, README "The transport at line rate"). This module does five
 * things and nothing else:
 *
 *   send_gso    a batch of one stream's full chunks built and sent as UDP GSO
 *               messages in one sendmmsg (dblp.batch.SendBatch.fill + sendmsg);
 *   recv_ring   one recvmmsg into the ring's preallocated slots (what
 *               dblp.batch.RecvRing.receive does through ctypes);
 *   recv_gro    the same for a socket with UDP receive offload on: runs the
 *               kernel coalesced cut back into the datagrams they were;
 *   sum_squares the float64 sum of squares of a float32 gradient, in the fixed
 *               order dblp.rounds.sum_squares also takes (the detector's norm,
 *               which every replica must compute alike);
 *   take_run    the leading run of DATA datagrams of ONE stream that
 *               dblp.batch.deliver would hand to InTransfer.on_data_batch,
 *               applied exactly as it applies them, stopping at the first
 *               datagram it must not decide: one that is not plain DATA of
 *               that stream, of this round, from the pinned address, or the
 *               one whose chunk makes the receiver STOP.
 *
 * With a job secret (mac_new: an AES-128-GMAC context for one pair key, from
 * Intel's Multi-Buffer Crypto library where it was built with it, else from
 * OpenSSL's libcrypto; the tag dblp.wire.Sealer makes over header and
 * payload with the header's seq as nonce) send_gso numbers and tags every
 * datagram it builds and take_run verifies every datagram's tag before it
 * spends anything else on it, stopping at the first that fails (Python counts
 * it and rate-limits its source); mac_check checks the tags of the rows
 * take_run leaves to Python. Built without libcrypto (DBLP_HAVE_LIBCRYPTO
 * unset) the module has no mac_new and keyed jobs keep the Python path.
 *
 * Everything else (control messages, other streams' first datagrams, forged
 * or malformed ones, the STOP, a stopped or finished receiver, fault
 * injection) stays in Python, so hostile input meets the checks it met
 * before. The header layout is not written here: dblp.batch passes the
 * offsets derived from dblp.wire.HEADER_FIELDS once (set_layout).
 * tests/unit/test_dblp_batch.py checks this path against the pure-Python one
 * bit for bit.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/in.h>

#ifdef DBLP_HAVE_LIBCRYPTO
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/modes.h>
#include <stdlib.h>
#endif
#if defined(DBLP_HAVE_LIBCRYPTO) && defined(DBLP_HAVE_IPSEC_MB)
#include <intel-ipsec-mb.h>
#define MAC_WITH_IPSEC_MB 1
#endif

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "chunks are little-endian float32: this core adds them as native floats"
#endif

/* Field offsets (bytes into the header), from dblp.wire via set_layout. */
static struct {
    int ready;
    Py_ssize_t header, tag;
    Py_ssize_t flags, src, part, index, count, length, bound, aux, seq;
    uint32_t ppm, pull;
    /* header bytes every DATA datagram of one round of one job shares, as two spans */
    Py_ssize_t fixed_a0, fixed_a1, fixed_b0, fixed_b1;
} L;

static inline uint32_t be16(const uint8_t *p) { return (uint32_t)p[0] << 8 | p[1]; }
static inline uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Ask for the cache lines of p[0..n) ahead of use (``write``: to be written). A keyed
 * datagram's check is arithmetic on bytes in cache, while what follows it waits on memory:
 * the payload the sender tags (a pass's chunks are shuffled, dblp.streams.chunk_order, so
 * no hardware prefetcher sees the next one coming) and the gradient row the receiver adds
 * it into. Asked for first, those lines arrive while the check computes. */
static inline void prefetch_lines(const uint8_t *p, size_t n, int write) {
    for (size_t o = 0; o < n; o += 64) {
        if (write)
            __builtin_prefetch(p + o, 1, 3);
        else
            __builtin_prefetch(p + o, 0, 3);
    }
}

static PyObject *set_layout(PyObject *self, PyObject *args) {
    long long v[18];
    if (!PyArg_ParseTuple(args, "(LLLLLLLLLLLLLLLLLL)", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                          &v[6], &v[7], &v[8], &v[9], &v[10], &v[11], &v[12], &v[13], &v[14],
                          &v[15], &v[16], &v[17]))
        return NULL;
    L.header = v[0]; L.tag = v[1]; L.flags = v[2]; L.src = v[3]; L.part = v[4];
    L.index = v[5]; L.count = v[6]; L.length = v[7]; L.bound = v[8]; L.aux = v[9];
    L.seq = v[10]; L.ppm = (uint32_t)v[11]; L.pull = (uint32_t)v[12];
    L.fixed_a0 = v[13]; L.fixed_a1 = v[14]; L.fixed_b0 = v[15]; L.fixed_b1 = v[16];
    if (v[17] != 0xDB1B || L.seq < 0 || L.seq + 8 > L.header) {
        /* a handshake: the caller knows which layout this is */
        PyErr_SetString(PyExc_ValueError, "set_layout: unexpected layout tag");
        return NULL;
    }
    L.ready = 1;
    Py_RETURN_NONE;
}

/* -- authentication: AES-128-GMAC under one pair key (dblp.wire.Sealer), in C ----------- */
#define TAG_BYTES 16
#define PAIR_KEY_BYTES 16
#define MAC_CAPSULE "dblp._fastpath.mac"

#if defined(MAC_WITH_IPSEC_MB)
/* One context per pair key (a capsule): Intel's Multi-Buffer Crypto library's AES-128
 * GMAC (Debian's libipsec-mb), which picks its code for the CPU at start (VAES and
 * VPCLMULQDQ over 512-bit registers where the CPU has them): 78 ns per 1,456-byte
 * message on the machine of docs/transport.md, against 210 for libcrypto's GCM128 mode
 * API and 322 for its EVP AES-GCM, with the same tags (tests/unit/test_dblp_batch.py
 * holds them to Python's). The key schedule and the hash keys are made here; a message
 * sets its nonce, feeds header and payload and takes the tag. The manager only holds
 * the functions chosen for the CPU, so one serves every context and thread. */
#define MAC_BACKEND "intel-ipsec-mb"
typedef struct gcm_key_data MAC_CTX;
static IMB_MGR *mac_mgr = NULL;

static MAC_CTX *mac_ctx_new(const uint8_t *key) {
    if (!mac_mgr) {
        IMB_ARCH arch;
        IMB_MGR *m = alloc_mb_mgr(0);
        if (!m)
            return NULL;
        init_mb_mgr_auto(m, &arch);
        if (imb_get_errno(m)) {
            free_mb_mgr(m);
            return NULL;
        }
        mac_mgr = m;
    }
    MAC_CTX *ctx = aligned_alloc(64, (sizeof(MAC_CTX) + 63) / 64 * 64);
    if (ctx)
        IMB_AES128_GCM_PRE(mac_mgr, key, ctx);
    return ctx;
}

static void mac_ctx_free(MAC_CTX *ctx) {
    if (ctx) {
        OPENSSL_cleanse(ctx, sizeof *ctx);
        free(ctx);
    }
}

static int mac_tag(MAC_CTX *ctx, const uint8_t *a, size_t na, const uint8_t *b, size_t nb,
                   uint8_t out[TAG_BYTES]) {
    uint8_t iv[12] = {0};
    struct gcm_context_data g;
    if (na < (size_t)L.header)
        return 0;
    memcpy(iv + 4, a + L.seq, 8);
    if (!nb) {
        /* One buffer (a receiver verifying a datagram in its ring): GCM over no plaintext
         * with the message as its additional data is GMAC, in one call that takes the
         * 12-byte nonce's short path; GMAC_INIT takes any nonce length and spent an eighth
         * of the library's time in a 10 Gbit/s bench (perf). take_run's keyed rows cost 287
         * against 300 ns per 1,456-byte datagram verified and added up into a 64 MiB
         * gradient (unkeyed: 200), four alternated runs of each build on an idle machine. */
        IMB_AES128_GCM_ENC(mac_mgr, ctx, &g, NULL, NULL, 0, iv, a, na, out, TAG_BYTES);
        return 1;
    }
    IMB_AES128_GMAC_INIT(mac_mgr, ctx, &g, iv, sizeof iv);
    IMB_AES128_GMAC_UPDATE(mac_mgr, ctx, &g, a, na);
    if (nb)
        IMB_AES128_GMAC_UPDATE(mac_mgr, ctx, &g, b, nb);
    IMB_AES128_GMAC_FINALIZE(mac_mgr, ctx, &g, out, TAG_BYTES);
    return 1;
}
#elif defined(DBLP_HAVE_LIBCRYPTO)
/* Where libipsec-mb is not (it is x86-64 only): libcrypto's GCM128 mode API rather
 * than its EVP AES-128-GCM, which spends about 110 of its 320 ns per 1,456-byte message
 * resolving provider parameters (setting the nonce, taking the tag); the mode API
 * about 50. The hash subkey is made here; the block cipher is AES-128 in ECB from EVP
 * (AES-NI where the CPU has it), called once per message for the nonce's mask. An
 * engine is single-threaded, so a context is never used by two threads. */
#define MAC_BACKEND "libcrypto"
typedef struct {
    EVP_CIPHER_CTX *ecb;
    GCM128_CONTEXT *gcm;
} MAC_CTX;

static void mac_block(const unsigned char in[16], unsigned char out[16], const void *ecb) {
    int outl = 0;
    /* ECB without padding: 16 bytes in, 16 out, at once; it cannot fail once keyed */
    EVP_EncryptUpdate((EVP_CIPHER_CTX *)ecb, out, &outl, in, 16);
}

static void mac_ctx_free(MAC_CTX *ctx) {
    if (!ctx)
        return;
    if (ctx->gcm)
        CRYPTO_gcm128_release(ctx->gcm);
    EVP_CIPHER_CTX_free(ctx->ecb);
    PyMem_Free(ctx);
}

static MAC_CTX *mac_ctx_new(const uint8_t *key) {
    MAC_CTX *ctx = PyMem_Calloc(1, sizeof *ctx);
    if (!ctx)
        return NULL;
    if (!(ctx->ecb = EVP_CIPHER_CTX_new())
        || !EVP_EncryptInit_ex(ctx->ecb, EVP_aes_128_ecb(), NULL, key, NULL)
        || !EVP_CIPHER_CTX_set_padding(ctx->ecb, 0)
        || !(ctx->gcm = CRYPTO_gcm128_new(ctx->ecb, mac_block))) {
        mac_ctx_free(ctx);
        return NULL;
    }
    return ctx;
}

/* The tag of the message a + b (a starts with its header, whose seq is the nonce: four
 * zero bytes, then seq) into out; 0 on a libcrypto failure. */
static int mac_tag(MAC_CTX *ctx, const uint8_t *a, size_t na, const uint8_t *b, size_t nb,
                   uint8_t out[TAG_BYTES]) {
    uint8_t iv[12] = {0};
    if (na < (size_t)L.header)
        return 0;
    memcpy(iv + 4, a + L.seq, 8);
    CRYPTO_gcm128_setiv(ctx->gcm, iv, sizeof iv);
    if (CRYPTO_gcm128_aad(ctx->gcm, a, na) || (nb && CRYPTO_gcm128_aad(ctx->gcm, b, nb)))
        return 0;
    CRYPTO_gcm128_tag(ctx->gcm, out, TAG_BYTES);
    return 1;
}
#endif

#ifdef DBLP_HAVE_LIBCRYPTO
static void mac_free(PyObject *cap) {
    mac_ctx_free(PyCapsule_GetPointer(cap, MAC_CAPSULE));
}

/* mac_new(pair_key) -> capsule: AES-128-GMAC under a 16-byte key (dblp.wire.Sealer.pair_key) */
static PyObject *mac_new(PyObject *self, PyObject *args) {
    Py_buffer key;
    if (!PyArg_ParseTuple(args, "y*", &key))
        return NULL;
    PyObject *res = NULL;
    MAC_CTX *ctx = NULL;
    if (key.len != PAIR_KEY_BYTES) {
        PyErr_SetString(PyExc_ValueError, "mac_new: a pair key is 16 bytes");
        goto done;
    }
    if (!(ctx = mac_ctx_new(key.buf))) {
        PyErr_SetString(PyExc_RuntimeError, "mac_new: no AES-128-GMAC context (" MAC_BACKEND ")");
        goto done;
    }
    res = PyCapsule_New(ctx, MAC_CAPSULE, mac_free);
    if (!res)
        mac_ctx_free(ctx);
done:
    PyBuffer_Release(&key);
    return res;
}

static int mac_equal(const uint8_t *x, const uint8_t *y) {
    return CRYPTO_memcmp(x, y, TAG_BYTES) == 0;
}
#else
typedef void MAC_CTX;
static int mac_tag(MAC_CTX *ctx, const uint8_t *a, size_t na, const uint8_t *b, size_t nb,
                   uint8_t out[TAG_BYTES]) {
    return 0;
}
static int mac_equal(const uint8_t *x, const uint8_t *y) { return 0; }
#endif

/* The context of a capsule argument (None -> NULL, no error); -1 on a wrong argument. */
static int mac_arg(PyObject *obj, MAC_CTX **ctx) {
    *ctx = NULL;
    if (obj == NULL || obj == Py_None)
        return 0;
    *ctx = PyCapsule_GetPointer(obj, MAC_CAPSULE);
    return *ctx ? 0 : -1;
}

#ifdef DBLP_HAVE_LIBCRYPTO
/* mac_tag(capsule, message) -> 16 bytes: the C tag of a message (header, seq in it, and
 * payload; no trailer), for the tests to compare with Python's */
static PyObject *py_mac_tag(PyObject *self, PyObject *args) {
    PyObject *cap;
    Py_buffer msg;
    if (!PyArg_ParseTuple(args, "Oy*", &cap, &msg))
        return NULL;
    MAC_CTX *ctx;
    PyObject *res = NULL;
    uint8_t out[TAG_BYTES];
    if (!L.ready) {
        PyErr_SetString(PyExc_RuntimeError, "mac_tag before set_layout");
    } else if (mac_arg(cap, &ctx) < 0 || !ctx) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "mac_tag: no key");
    } else if (msg.len < L.header) {
        PyErr_SetString(PyExc_ValueError, "mac_tag: shorter than a header");
    } else if (!mac_tag(ctx, msg.buf, (size_t)msg.len, NULL, 0, out)) {
        PyErr_SetString(PyExc_RuntimeError, "mac_tag: libcrypto failed");
    } else {
        res = PyBytes_FromStringAndSize((const char *)out, TAG_BYTES);
    }
    PyBuffer_Release(&msg);
    return res;
}

/* mac_check(capsule, data, stride, lens, rows, ok) -> None: whether each listed row of a
 * ring ends in its right tag under the capsule's pair key (ok[j] = 1 or 0 for rows[j]).
 *
 * Why: the rows take_run leaves (a stream whose receiver is not there yet, the chunk
 * that makes a receiver STOP, the rest of a ring after it) were checked one by one by
 * Python's `cryptography`, 2.7 us each; at 10 Gbit/s a keyed rank had 700-900 of them
 * per round. Here each costs what take_run's own check does. */
static PyObject *mac_check(PyObject *self, PyObject *args) {
    PyObject *cap;
    Py_buffer data, lens, rows, ok;
    Py_ssize_t stride;
    if (!PyArg_ParseTuple(args, "Oy*ny*y*w*", &cap, &data, &stride, &lens, &rows, &ok))
        return NULL;
    PyObject *res = NULL;
    MAC_CTX *ctx;
    Py_ssize_t n = rows.len / (Py_ssize_t)sizeof(int64_t), slots = lens.len / (Py_ssize_t)sizeof(int64_t);
    if (!L.ready) {
        PyErr_SetString(PyExc_RuntimeError, "mac_check before set_layout");
        goto done;
    }
    if (mac_arg(cap, &ctx) < 0 || !ctx) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "mac_check: no key");
        goto done;
    }
    if (L.tag != TAG_BYTES || stride <= 0 || ok.len < n || data.len < slots * stride) {
        PyErr_SetString(PyExc_ValueError, "mac_check: inconsistent arguments");
        goto done;
    }
    const int64_t *ix = rows.buf, *len = lens.buf;
    const uint8_t *base = data.buf;
    uint8_t *out = ok.buf;
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t i = ix[j];
        if (i < 0 || i >= slots) {
            PyErr_SetString(PyExc_ValueError, "mac_check: a row outside the ring");
            goto done;
        }
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        const uint8_t *p = base + ix[j] * stride;
        int64_t m = len[ix[j]];
        uint8_t tag[TAG_BYTES];
        out[j] = m >= L.header + TAG_BYTES && m <= stride
                 && mac_tag(ctx, p, (size_t)(m - TAG_BYTES), NULL, 0, tag)
                 && mac_equal(tag, p + m - TAG_BYTES);
    }
    res = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&lens);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&ok);
    return res;
}
#endif

/* recv_ring(fd, data, stride, slot, names, lens, slots) -> m, or -errno */
static PyObject *recv_ring(PyObject *self, PyObject *args) {
    int fd;
    Py_buffer data, names, lens;
    Py_ssize_t stride, slot, slots;
    if (!PyArg_ParseTuple(args, "iw*nnw*w*n", &fd, &data, &stride, &slot, &names, &lens, &slots))
        return NULL;
    PyObject *res = NULL;
    if (slots <= 0 || slots > 256 || data.len < slots * stride || slot > stride
        || names.len < slots * (Py_ssize_t)sizeof(struct sockaddr_in)
        || lens.len < slots * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "recv_ring: buffers smaller than the ring");
        goto done;
    }
    struct mmsghdr msgs[256];
    struct iovec iov[256];
    uint8_t *base = data.buf;
    struct sockaddr_in *addrs = names.buf;
    for (Py_ssize_t i = 0; i < slots; i++) {
        iov[i].iov_base = base + i * stride;
        iov[i].iov_len = (size_t)slot;
        memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
        msgs[i].msg_hdr.msg_name = &addrs[i];
        msgs[i].msg_hdr.msg_namelen = sizeof(struct sockaddr_in);
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    int m;
    Py_BEGIN_ALLOW_THREADS
    m = recvmmsg(fd, msgs, (unsigned)slots, MSG_DONTWAIT, NULL);
    Py_END_ALLOW_THREADS
    if (m < 0) {
        res = PyLong_FromLong(-errno);
        goto done;
    }
    int64_t *out = lens.buf;
    for (int i = 0; i < m; i++)
        out[i] = msgs[i].msg_len;
    res = PyLong_FromLong(m);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&names);
    PyBuffer_Release(&lens);
    return res;
}

/* recv_gro(fd, data, stride, slot, names, lens, slots, bounce, bstride, bnames,
 *          blens, bsegs, state) -> slots filled, or -errno when none were
 *
 * recv_ring for a socket with UDP_GRO on. The kernel then hands over a run of
 * one sender's equal-sized datagrams as ONE message of up to 64 KB, with the
 * segment size in a UDP_GRO control message: one copy and one pass through
 * the stack per run instead of per datagram (at 10 Gbit/s, the receive side's
 * largest cost). The ring downstream stays a ring of datagrams: each message
 * is read into ``bounce`` (``bstride`` bytes per message, room for the
 * largest UDP datagram, so nothing is cut) and its segments are copied into
 * the ring's slots exactly as the kernel would have delivered them apart: the
 * same bytes, cut to ``slot`` as recvmmsg cuts a datagram too long for its
 * slot, the same sender in every slot. A message with no segment size is one
 * datagram. Messages left over when the ring is full stay in ``bounce`` for
 * the next call; ``state`` (int64[5]) carries {messages held, next message,
 * byte offset in it, whether the last read found the socket drained,
 * datagrams per message in the last read}. A read asks for as many messages
 * as the free slots would take at that last rate: as many datagrams per
 * system call as recv_ring when nothing is coalesced, and no more 64 KB
 * messages than the ring will hold when they are (more would leave megabytes
 * to copy from memory instead of cache). Once a read has drained the socket
 * the call returns what it has, so a ring that is not full still means
 * "nothing more waiting", as recv_ring's does.
 *
 * ``blocked`` (optional, with ``state`` of 6): sources whose tags keep failing,
 * 6 bytes each (port and IPv4 as sockaddr_in holds them). A message from one
 * is dropped whole before it is copied anywhere (a flood arrives coalesced,
 * 44 datagrams a message) and its datagrams are added to state[5], which the
 * caller counts and resets; a call returns after GRO_MAX_DROPPED of them
 * even with nothing in the ring.
 */
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
/* Whether ``a``'s port and IPv4 address are one of the 6-byte keys in ``keys``. */
static int is_blocked(const struct sockaddr_in *a, const uint8_t *keys, Py_ssize_t n) {
    const uint8_t *k = (const uint8_t *)a + 2;  /* sin_port, sin_addr: as sockaddr_in holds them */
    for (Py_ssize_t o = 0; o + 6 <= n; o += 6)
        if (!memcmp(keys + o, k, 6))
            return 1;
    return 0;
}
#define GRO_MAX_MSGS 64
/* Dropped unread: the datagrams of one call from blocked sources, at most (then it returns). */
#define GRO_MAX_DROPPED 8192
static PyObject *recv_gro(PyObject *self, PyObject *args) {
    int fd;
    Py_buffer data, names, lens, bounce, bnames, blens, bsegs, state, blocked = {0};
    Py_ssize_t stride, slot, slots, bstride;
    if (!PyArg_ParseTuple(args, "iw*nnw*w*nw*nw*w*w*w*|y*", &fd, &data, &stride, &slot, &names,
                          &lens, &slots, &bounce, &bstride, &bnames, &blens, &bsegs, &state,
                          &blocked))
        return NULL;
    PyObject *res = NULL;
    Py_ssize_t nmax = blens.len / (Py_ssize_t)sizeof(int64_t);
    if (slots <= 0 || data.len < slots * stride || slot > stride
        || names.len < slots * (Py_ssize_t)sizeof(struct sockaddr_in)
        || lens.len < slots * (Py_ssize_t)sizeof(int64_t) || nmax < 1 || nmax > GRO_MAX_MSGS
        || bstride < 65535 || bounce.len < nmax * bstride
        || bnames.len < nmax * (Py_ssize_t)sizeof(struct sockaddr_in)
        || bsegs.len < nmax * (Py_ssize_t)sizeof(int64_t)
        || state.len < 5 * (Py_ssize_t)sizeof(int64_t)
        || (blocked.buf && (blocked.len % 6 || state.len < 6 * (Py_ssize_t)sizeof(int64_t)))) {
        PyErr_SetString(PyExc_ValueError, "recv_gro: buffers smaller than the ring");
        goto done;
    }
    uint8_t *out = data.buf, *bb = bounce.buf, *outnames = names.buf;
    struct sockaddr_in *bn = bnames.buf;
    int64_t *outlens = lens.buf, *bl = blens.buf, *bs = bsegs.buf, *st = state.buf;
    if (st[0] < 0 || st[0] > nmax || st[1] < 0 || st[2] < 0) {
        PyErr_SetString(PyExc_ValueError, "recv_gro: corrupt state");
        goto done;
    }
    Py_ssize_t i = 0;
    int err = 0;
    while (i < slots) {
        if (st[1] >= st[0]) {
            if (i > 0 && st[3])
                break;  /* the last read drained the socket */
            struct mmsghdr msgs[GRO_MAX_MSGS];
            struct iovec iov[GRO_MAX_MSGS];
            union {
                char raw[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
            } ctl[GRO_MAX_MSGS];
            Py_ssize_t per = st[4] > 0 ? (Py_ssize_t)st[4] : 1;
            Py_ssize_t want = (slots - i + per - 1) / per;
            if (want > nmax)
                want = nmax;
            memset(msgs, 0, (size_t)want * sizeof msgs[0]);
            for (Py_ssize_t j = 0; j < want; j++) {
                iov[j].iov_base = bb + j * bstride;
                iov[j].iov_len = (size_t)bstride;
                msgs[j].msg_hdr.msg_name = &bn[j];
                msgs[j].msg_hdr.msg_namelen = sizeof(struct sockaddr_in);
                msgs[j].msg_hdr.msg_iov = &iov[j];
                msgs[j].msg_hdr.msg_iovlen = 1;
                msgs[j].msg_hdr.msg_control = ctl[j].raw;
                msgs[j].msg_hdr.msg_controllen = sizeof ctl[j].raw;
            }
            int n;
            Py_BEGIN_ALLOW_THREADS
            n = recvmmsg(fd, msgs, (unsigned)want, MSG_DONTWAIT, NULL);
            Py_END_ALLOW_THREADS
            if (n <= 0) {
                if (n < 0 && i == 0)
                    err = errno;
                st[0] = st[1] = st[2] = 0;
                st[3] = 1;
                break;
            }
            int64_t datagrams = 0;
            for (int j = 0; j < n; j++) {
                bl[j] = msgs[j].msg_len;
                bs[j] = 0;
                for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msgs[j].msg_hdr); cm;
                     cm = CMSG_NXTHDR(&msgs[j].msg_hdr, cm)) {
                    if (cm->cmsg_level == IPPROTO_UDP && cm->cmsg_type == UDP_GRO) {
                        int g;
                        memcpy(&g, CMSG_DATA(cm), sizeof g);
                        bs[j] = g > 0 ? g : 0;
                    }
                }
                datagrams += bs[j] > 0 ? (bl[j] + bs[j] - 1) / bs[j] : 1;
            }
            st[0] = n;
            st[1] = st[2] = 0;
            st[3] = n < want;
            st[4] = datagrams / n > 0 ? datagrams / n : 1;
        }
        Py_ssize_t j = (Py_ssize_t)st[1];
        int64_t len = bl[j], seg = bs[j] > 0 ? bs[j] : len;
        const uint8_t *msg = bb + j * bstride;
        if (blocked.buf && st[2] == 0 && is_blocked(&bn[j], blocked.buf, blocked.len)) {
            /* a source of bad tags (dblp.engine_state.BadSources): its whole run, unread */
            st[5] += seg > 0 ? (len + seg - 1) / seg : 1;
            st[1]++;
            if (st[5] >= GRO_MAX_DROPPED && i == 0)
                break;  /* back to the caller now and then, though the flood goes on */
            continue;
        }
        do {
            int64_t off = st[2], piece = len - off < seg ? len - off : seg;
            int64_t keep = piece < slot ? piece : slot;
            memcpy(out + i * stride, msg + off, (size_t)keep);
            outlens[i] = keep;
            memcpy(outnames + i * sizeof(struct sockaddr_in), &bn[j], sizeof(struct sockaddr_in));
            i++;
            st[2] = off + piece;
        } while (st[2] < len && i < slots);
        if (st[2] >= len) {
            st[1]++;
            st[2] = 0;
        }
    }
    res = (i == 0 && err) ? PyLong_FromLong(-err) : PyLong_FromSsize_t(i);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&names);
    PyBuffer_Release(&lens);
    PyBuffer_Release(&bounce);
    PyBuffer_Release(&bnames);
    PyBuffer_Release(&blens);
    PyBuffer_Release(&bsegs);
    PyBuffer_Release(&state);
    if (blocked.buf)
        PyBuffer_Release(&blocked);
    return res;
}

/* take_run(data, stride, lens, names, start, stop, fixed, src, part, pull, addr,
 *          chunk_bytes, count, nbytes, out, add, have, room[, mac])
 *   -> (next, new, duplicates, malformed, max_aux)
 *
 * ``mac`` (a mac_new capsule of the pair key (session, src, this receiver's rank),
 * or None without a secret): every row's tag is
 * verified before anything but the fixed header bytes and the sender's
 * address is read, and the first that fails stops the run (Python counts it
 * against the global budget for failed tags). The address is compared first,
 * key or not, as in dblp.batch._fast_rows: a forged source costs no MAC.
 *
 * Rows start..stop-1 of the ring. ``fixed``: the shared header bytes of this
 * round (the two spans of set_layout, concatenated). ``addr``: the sender's
 * pinned port and IPv4 address as sockaddr_in holds them (6 bytes). ``room``:
 * new chunks the receiver may take before the one that makes it STOP.
 * ``next``: the first row not taken (stop when all were).
 */
static PyObject *take_run(PyObject *self, PyObject *args) {
    Py_buffer data, lens, names, fixed, addr, out, have;
    Py_ssize_t stride, start, stop, chunk_bytes, count, nbytes, room;
    unsigned int src, part, pull;
    int add;
    PyObject *macobj = NULL;
    MAC_CTX *mac = NULL;
    if (!L.ready) {
        PyErr_SetString(PyExc_RuntimeError, "take_run before set_layout");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*ny*y*nny*IIIy*nnnw*pw*n|O", &data, &stride, &lens, &names,
                          &start, &stop, &fixed, &src, &part, &pull, &addr, &chunk_bytes,
                          &count, &nbytes, &out, &add, &have, &room, &macobj))
        return NULL;
    PyObject *res = NULL;
    if (mac_arg(macobj, &mac) < 0)
        goto done;
    if (mac && L.tag != TAG_BYTES) {
        PyErr_SetString(PyExc_ValueError, "take_run: the layout's tag is not a MAC tag");
        goto done;
    }
    Py_ssize_t na = L.fixed_a1 - L.fixed_a0, nb = L.fixed_b1 - L.fixed_b0;
    if (start < 0 || stop < start || data.len < stop * stride || lens.len < stop * 8
        || names.len < stop * (Py_ssize_t)sizeof(struct sockaddr_in) || fixed.len != na + nb
        || addr.len != 6 || have.len < count || out.len < nbytes || chunk_bytes <= 0
        || chunk_bytes % 4 || stride < L.header + chunk_bytes + L.tag) {
        PyErr_SetString(PyExc_ValueError, "take_run: inconsistent arguments");
        goto done;
    }
    const uint8_t *base = data.buf, *fx = fixed.buf, *pin = addr.buf;
    const int64_t *len = lens.buf;
    const uint8_t *nm = names.buf;
    uint8_t *held = have.buf, *dst = out.buf;
    Py_ssize_t i, taken = 0, dups = 0, bad = 0;
    uint32_t max_aux = 0;
    for (i = start; i < stop; i++) {
        const uint8_t *p = base + i * stride;
        int64_t payload = len[i] - (int64_t)(L.header + L.tag);
        /* dblp.batch.data_rows, known_senders and the stream key: else Python decides */
        if (memcmp(p + L.fixed_a0, fx, (size_t)na) || memcmp(p + L.fixed_b0, fx + na, (size_t)nb))
            break;
        uint32_t length = be16(p + L.length), index = be32(p + L.index);
        uint32_t hcount = be32(p + L.count);
        if (payload <= 0 || payload > chunk_bytes || payload % 4 || (int64_t)length != payload
            || index >= hcount || be32(p + L.bound) >= L.ppm)
            break;
        if (be16(p + L.src) != src || be16(p + L.part) != part || (p[L.flags] & L.pull) != pull)
            break;
        if (memcmp(nm + i * sizeof(struct sockaddr_in) + 2, pin, 6))  /* port, IPv4 */
            break;  /* not the pinned address: no MAC spent on it */
        if (mac) {  /* the tag before anything costs more than a compare */
            uint8_t tag[TAG_BYTES];
            size_t row = (size_t)index * (size_t)chunk_bytes;
            if (row + (size_t)length <= (size_t)nbytes)
                prefetch_lines(dst + row, (size_t)length, 1);  /* the row it adds into */
            if (!mac_tag(mac, p, (size_t)(len[i] - L.tag), NULL, 0, tag)
                || !mac_equal(tag, p + len[i] - L.tag))
                break;
        }
        /* InTransfer.on_data_batch */
        int64_t want = (int64_t)nbytes - (int64_t)index * chunk_bytes;
        if (want > chunk_bytes)
            want = chunk_bytes;
        if ((Py_ssize_t)hcount != count || (int64_t)length != want) {
            bad++;
            continue;
        }
        if (held[index]) {
            dups++;
            continue;
        }
        if (taken == room)  /* this chunk makes the receiver STOP: Python sends it */
            break;
        const uint8_t *src_bytes = p + L.header;
        size_t at = (size_t)index * (size_t)chunk_bytes;
        if (add) {
            /* One float32 addition per element, in element order, as numpy's ``+=``:
             * the vectorizer (setup.py) does four at a time, each rounded alone, so
             * the sums are bit for bit those of the pure-Python path. */
            float *acc = (float *)(dst + at);
            size_t n = length / 4;
            for (size_t e = 0; e < n; e++) {
                float v;
                memcpy(&v, src_bytes + 4 * e, 4);  /* unaligned, little-endian floats */
                acc[e] += v;
            }
        } else {
            memcpy(dst + at, src_bytes, length);
        }
        held[index] = 1;
        taken++;
        uint32_t aux = be32(p + L.aux);
        if (aux > max_aux)
            max_aux = aux;
    }
    res = Py_BuildValue("(nnnnI)", i, taken, dups, bad, max_aux);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&lens);
    PyBuffer_Release(&names);
    PyBuffer_Release(&fixed);
    PyBuffer_Release(&addr);
    PyBuffer_Release(&out);
    PyBuffer_Release(&have);
    return res;
}

/* send_gso(fd, buf, template, index_off, rows, chunks, addr, tag, per_msg[, mac, seq])
 *     -> datagrams sent, or -errno
 *
 * dblp.batch.SendBatch.fill followed by the engine's GSO sends (the tag is
 * ``tag`` zero bytes without a secret; with one, ``mac`` is the mac_new capsule
 * of the pair key (session, this rank, the destination), datagram i gets the
 * message number ``seq`` + i in its header, and its tag is written at the end
 * of its row of ``buf``): one datagram per entry of
 * ``chunks`` (int64 chunk indices), each ``template`` with its index field set,
 * then the chunk's row of ``rows`` (the stream's full chunks, contiguous),
 * then the tag. They leave as GSO messages of ``per_msg`` datagrams (the last
 * may hold fewer), each with a UDP_SEGMENT control message so the kernel cuts
 * it into those datagrams, all in one sendmmsg without a secret. With one, each
 * message leaves in a sendmmsg of its own as soon as its datagrams are tagged:
 * the MAC has just read their payloads, which the kernel's copy then finds in
 * the cache. Tagging all of a call's messages first passed up to 500 KB of
 * payload through this machine's 1 MB per-core L2 cache before the kernel read
 * the first byte again, and the Python of the sending path then ran 2-3x as
 * long as in an unkeyed rank (per call, timed in the bench's ranks; now the
 * same). 10 Gbit/s bench, 64 MiB, five alternated runs of each: keyed /
 * unkeyed PS 1.00-1.03x against 1.06-1.08x, sharded 1.00-1.08x against
 * 1.05-1.13x; a keyed rank's CPU per GB 0.89-0.98 s against 0.96-1.05
 * (unkeyed 0.89-0.95). Only the headers are written (into ``buf``'s rows);
 * the payload goes to the kernel straight from ``rows`` and the tag from a
 * block of zeros, three iovecs per datagram: the kernel copies every byte into
 * its buffer anyway, so a copy into ``buf`` first would only touch the
 * gradient twice (it was 6 % of a rank's CPU at 10 Gbit/s).
 * A UDP message leaves whole or not at all: the count returned is that of the
 * datagrams in the messages that left (a full socket buffer stops the rest).
 * ``addr``: the destination as a struct sockaddr_in (16 bytes).
 */
/* Datagrams ahead whose payload send_gso's tagging loop asks for while it tags one (below). */
#define MAC_AHEAD 3
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
/* The kernel's cap on the segments of one GSO message (UDP_MAX_SEGMENTS, 64 on older kernels). */
#define GSO_MAX_SEGS 64
/* Messages one call may send (dblp.batch.GSO_MESSAGES). */
#define GSO_MAX_MSGS 8
static const uint8_t zero_tag[64];

/* sendmmsg without the GIL: the messages that left, or -1 with errno set. */
static int send_messages(int fd, struct mmsghdr *msgs, unsigned int n) {
    int sent;
    Py_BEGIN_ALLOW_THREADS
    sent = sendmmsg(fd, msgs, n, 0);
    Py_END_ALLOW_THREADS
    return sent;
}

static PyObject *send_gso(PyObject *self, PyObject *args) {
    int fd;
    Py_buffer buf, tmpl, rows, chunks, addr;
    Py_ssize_t index_off, tag, per_msg;
    PyObject *macobj = NULL;
    unsigned long long seq = 0;
    MAC_CTX *mac = NULL;
    if (!PyArg_ParseTuple(args, "iw*y*ny*y*y*nn|OK", &fd, &buf, &tmpl, &index_off, &rows,
                          &chunks, &addr, &tag, &per_msg, &macobj, &seq))
        return NULL;
    PyObject *res = NULL;
    if (mac_arg(macobj, &mac) < 0)
        goto done;
    if (mac && tag != TAG_BYTES) {
        PyErr_SetString(PyExc_ValueError, "send_gso: a MAC tag is 16 bytes");
        goto done;
    }
    Py_ssize_t k = chunks.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t hdr = tmpl.len;
    Py_ssize_t cb;
    const int64_t *idx = chunks.buf;
    /* the row length is the template's declared length (full chunks only) */
    if (hdr != L.header || !L.ready) {
        PyErr_SetString(PyExc_ValueError, "send_gso: template is not a header");
        goto done;
    }
    cb = be16((const uint8_t *)tmpl.buf + L.length);
    Py_ssize_t dgram = hdr + cb + tag;
    Py_ssize_t full = cb ? rows.len / cb : 0;
    if (k <= 0 || cb <= 0 || tag < 0 || buf.len < k * dgram || addr.len != sizeof(struct sockaddr_in)
        || index_off < 0 || index_off + 4 > hdr || per_msg < 1 || per_msg * dgram > 65507) {
        PyErr_SetString(PyExc_ValueError, "send_gso: inconsistent arguments");
        goto done;
    }
    if (per_msg > GSO_MAX_SEGS || k > per_msg * GSO_MAX_MSGS
        || tag > (Py_ssize_t)sizeof(zero_tag)) {
        PyErr_SetString(PyExc_ValueError, "send_gso: too many datagrams or too long a tag");
        goto done;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        if (idx[i] < 0 || idx[i] >= full) {
            PyErr_SetString(PyExc_ValueError, "send_gso: chunk index outside the rows");
            goto done;
        }
    }
    uint8_t *out = buf.buf;
    const uint8_t *src = rows.buf;
    struct iovec iovs[3 * GSO_MAX_SEGS * GSO_MAX_MSGS];
    struct mmsghdr msgs[GSO_MAX_MSGS];
    union {
        char raw[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } ctl[GSO_MAX_MSGS];
    memset(msgs, 0, sizeof msgs);
    memset(ctl, 0, sizeof ctl);
    size_t niov = 0;
    unsigned int nmsg = 0;
    if (mac)  /* the first payloads on their way in (see below) */
        for (Py_ssize_t i = 0; i < k && i < MAC_AHEAD; i++)
            prefetch_lines(src + (size_t)idx[i] * (size_t)cb, (size_t)cb, 0);
    for (Py_ssize_t first = 0; first < k; first += per_msg, nmsg++) {
        Py_ssize_t segs = k - first < per_msg ? k - first : per_msg;
        struct msghdr *m = &msgs[nmsg].msg_hdr;
        m->msg_name = addr.buf;
        m->msg_namelen = sizeof(struct sockaddr_in);
        m->msg_iov = &iovs[niov];
        for (Py_ssize_t i = first; i < first + segs; i++) {
            uint8_t *d = out + i * dgram;
            uint32_t c = (uint32_t)idx[i];
            memcpy(d, tmpl.buf, (size_t)hdr);
            d[index_off] = (uint8_t)(c >> 24);
            d[index_off + 1] = (uint8_t)(c >> 16);
            d[index_off + 2] = (uint8_t)(c >> 8);
            d[index_off + 3] = (uint8_t)c;
            iovs[niov++] = (struct iovec){d, (size_t)hdr};
            iovs[niov++] = (struct iovec){(void *)(src + (size_t)c * (size_t)cb), (size_t)cb};
            if (mac) {  /* numbered, then tagged where the row's tag goes (no payload copy) */
                uint8_t *t = d + hdr + cb;
                if (i + MAC_AHEAD < k)
                    prefetch_lines(src + (size_t)idx[i + MAC_AHEAD] * (size_t)cb, (size_t)cb, 0);
                uint64_t num = (uint64_t)seq + (uint64_t)i;
                for (int byte = 7; byte >= 0; byte--, num >>= 8)
                    d[L.seq + byte] = (uint8_t)num;
                if (!mac_tag(mac, d, (size_t)hdr, src + (size_t)c * (size_t)cb, (size_t)cb, t)) {
                    PyErr_SetString(PyExc_RuntimeError, "send_gso: libcrypto failed");
                    goto done;
                }
                iovs[niov++] = (struct iovec){t, (size_t)tag};
            } else if (tag) {
                iovs[niov++] = (struct iovec){(void *)zero_tag, (size_t)tag};
            }
        }
        m->msg_iovlen = (size_t)(&iovs[niov] - m->msg_iov);
        if (segs > 1) {  /* one datagram needs no segmentation */
            m->msg_control = ctl[nmsg].raw;
            m->msg_controllen = sizeof ctl[nmsg].raw;
            struct cmsghdr *cm = CMSG_FIRSTHDR(m);
            cm->cmsg_level = IPPROTO_UDP;
            cm->cmsg_type = UDP_SEGMENT;
            cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            uint16_t seg = (uint16_t)dgram;
            memcpy(CMSG_DATA(cm), &seg, sizeof seg);
        }
        if (mac) {  /* this message now, while its payloads are in the cache (see above) */
            int n = send_messages(fd, &msgs[nmsg], 1);
            if (n <= 0) {  /* a full socket buffer (or any error): what left before it,
                            * as sendmmsg counts; the error is the next call's */
                res = PyLong_FromSsize_t(first ? first : -(Py_ssize_t)errno);
                goto done;
            }
        }
    }
    if (mac) {
        res = PyLong_FromSsize_t(k);
    } else {
        int n = send_messages(fd, msgs, nmsg);
        Py_ssize_t sent = (Py_ssize_t)n * per_msg;
        res = PyLong_FromSsize_t(n < 0 ? -(Py_ssize_t)errno : sent < k ? sent : k);
    }
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&tmpl);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&chunks);
    PyBuffer_Release(&addr);
    return res;
}

/* Two doubles, one SSE2 register (x86-64's baseline; other targets' compilers lower it). */
typedef double dbl2 __attribute__((vector_size(16)));

/* sum_squares(x) -> float: the sum of x[i]**2 over a float32 buffer, in float64.
 *
 * The order is part of the contract: element i goes to lane i % 8, each lane
 * adds sequentially, and the lanes are combined as ((0+1)+(2+3))+((4+5)+(6+7)).
 * dblp.rounds.sum_squares takes the same order in numpy, so a rank without the
 * core gets the very same bits and decides its phase as its peers do. Eight
 * independent lanes keep the adder busy without reassociating anything
 * (built with -fno-fast-math -ffp-contract=off).
 */
static PyObject *sum_squares(PyObject *self, PyObject *args) {
    Py_buffer x;
    if (!PyArg_ParseTuple(args, "y*", &x))
        return NULL;
    if (x.len % (Py_ssize_t)sizeof(float)) {
        PyBuffer_Release(&x);
        PyErr_SetString(PyExc_ValueError, "sum_squares: not a float32 buffer");
        return NULL;
    }
    const float *v = x.buf;
    Py_ssize_t n = x.len / (Py_ssize_t)sizeof(float), i = 0;
    double a[8];
    Py_BEGIN_ALLOW_THREADS
    /* The eight lanes as four pairs held in registers: with a[8] as the
     * accumulators the compiler kept them in memory, and every step waited on
     * a store and a load (0.42 ns an element, cached or not). Each lane still
     * adds its own elements one after the other. */
    dbl2 s0 = {0, 0}, s1 = {0, 0}, s2 = {0, 0}, s3 = {0, 0};
    for (; i + 8 <= n; i += 8) {
        const float *f = v + i;
        dbl2 d0 = {f[0], f[1]}, d1 = {f[2], f[3]}, d2 = {f[4], f[5]}, d3 = {f[6], f[7]};
        s0 += d0 * d0;
        s1 += d1 * d1;
        s2 += d2 * d2;
        s3 += d3 * d3;
    }
    a[0] = s0[0], a[1] = s0[1], a[2] = s1[0], a[3] = s1[1];
    a[4] = s2[0], a[5] = s2[1], a[6] = s3[0], a[7] = s3[1];
    for (int j = 0; i + j < n; j++) {
        double d = (double)v[i + j];
        a[j] += d * d;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&x);
    return PyFloat_FromDouble(((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])));
}

static PyMethodDef methods[] = {
    {"send_gso", send_gso, METH_VARARGS, "Build k datagrams and send them as GSO messages in one sendmmsg."},
    {"set_layout", set_layout, METH_VARARGS, "Header field offsets, from dblp.wire."},
    {"recv_ring", recv_ring, METH_VARARGS, "One recvmmsg into a ring: datagrams read, or -errno."},
    {"recv_gro", recv_gro, METH_VARARGS, "recv_ring for a UDP_GRO socket: runs cut back into datagrams."},
    {"take_run", take_run, METH_VARARGS, "Apply the leading run of one stream's plain DATA."},
    {"sum_squares", sum_squares, METH_VARARGS, "Float64 sum of squares of float32s, fixed order."},
#ifdef DBLP_HAVE_LIBCRYPTO
    {"mac_new", mac_new, METH_VARARGS, "An AES-128-GMAC context (capsule) of one pair key, for send_gso/take_run."},
    {"mac_tag", py_mac_tag, METH_VARARGS, "The tag of one message (tests compare it)."},
    {"mac_check", mac_check, METH_VARARGS, "Whether each listed ring row ends in its right tag."},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath",
                                    "The data path's per-datagram work in C.", -1, methods};

PyMODINIT_FUNC PyInit__fastpath(void) {
    PyObject *m = PyModule_Create(&module);
#ifdef MAC_BACKEND
    /* which library computes keyed jobs' tags here (dblp-testbed doctor says) */
    if (m && PyModule_AddStringConstant(m, "MAC_BACKEND", MAC_BACKEND) < 0)
        Py_CLEAR(m);
#endif
    return m;
}
