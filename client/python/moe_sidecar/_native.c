/* _native.c — moe_sidecar's C extension: libmoe_client for Python, and the two CUDA host
 * functions of the stream path.
 *
 * Built against CPython's limited API (3.11, abi3), so one build loads on every Python from
 * 3.11 up; it needs nothing at build time beyond Python's headers and libmoe_client's sources
 * (compiled in). numpy, torch and CUDA are the Python layer's business (the package's Python
 * files).
 *
 * Owns: one `Channel` per libmoe_client connection, with a mutex that serialises every call
 * on it — the Python thread's and the CUDA driver threads' running the host functions (a
 * struct moe_client is not thread-safe). Blocking calls release the GIL first, then take the
 * mutex, so a host function never waits for the GIL and the GIL is never held while waiting
 * for the mutex. `Area` objects export a range of the channel's mapping through the buffer
 * protocol (numpy.frombuffer and torch.frombuffer views, zero-copy); each holds a reference to
 * its Channel, and close() refuses while any Area object lives (as mmap.close does while a
 * buffer is exported), so no view outlives the mapping. Areas are counted rather than buffer
 * exports: torch.frombuffer releases the export at once and keeps only a reference to the
 * Area for as long as the tensor lives.
 * reconnect() (moe_reconnect, after the sidecar died or was restarted) replaces the mapping
 * and refuses on the same condition. `dead` is set by any call that saw MOE_EPEERDEAD (the
 * host functions' too) and cleared by a reconnect; `generation` counts the channels had, so
 * the Python layer tells a request of a dead channel from one of the current.
 *
 * Stream ops: a `stream_op` is a small C struct the Python layer fills once per (wrapper,
 * batch size) and passes, by address, to cudaLaunchHostFunc with host_submit or host_wait.
 * The host functions run on a CUDA driver thread: they call no CUDA API, no Python, never
 * allocate; host_submit never blocks (moe_forward_submit, under the channel mutex), host_wait
 * waits for the completion (up to the op's timeout) and records the outcome in the op, which
 * the Python layer raises at its next call (a host function cannot raise). On error the output
 * rows are zeroed, so a failed layer adds nothing rather than garbage.
 *
 * Errors: every failure raises an exception made by the factory the Python layer registered
 * (_set_error_factory(callable(status, message, value, index))), falling back to RuntimeError.
 * Integer arguments go through int_arg (never "I"/"i", which wrap or name nothing): anything
 * with __index__, within the range of the field it fills, else TypeError or OverflowError
 * naming the argument, the value and the range.
 */
#define PY_SSIZE_T_CLEAN
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#include <Python.h>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_client.h"
#include "moe_proto.h" /* MOE_MAX_TOKENS_LIMIT */

static PyObject *error_factory; /* callable(status, message, value, index) -> exception */

static PyObject *raise_status(int status, const char *message, uint32_t value, uint32_t index)
{
	if (error_factory) {
		PyObject *exc = PyObject_CallFunction(error_factory, "isII", status,
		                                      message ? message : "", value, index);
		if (exc) {
			PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
			Py_DECREF(exc);
		}
		return NULL;
	}
	PyErr_Format(PyExc_RuntimeError, "%s: %s", moe_strerror(status), message ? message : "");
	return NULL;
}

/* ---- Integer arguments --------------------------------------------------------------------- */

/* One integer argument: its name, its range (the C field it fills, or narrower), and the value
 * once parsed. A PyArg_ParseTuple "O&" converter: {"slot", 0, UINT32_MAX} with int_arg. */
struct int_arg {
	const char *name;
	long long min, max;
	long long v;
};
#define U32_ARG(name)                                                                              \
	{                                                                                          \
		name, 0, UINT32_MAX, 0                                                             \
	}
#define U16_ARG(name)                                                                              \
	{                                                                                          \
		name, 0, UINT16_MAX, 0                                                             \
	}
#define I32_ARG(name)                                                                              \
	{                                                                                          \
		name, INT32_MIN, INT32_MAX, 0                                                      \
	}
#define DTYPE_ARG(name)                                                                            \
	{                                                                                          \
		name, 0, MOE_DTYPE_COUNT - 1, 0                                                    \
	}

static int int_arg(PyObject *o, void *p)
{
	struct int_arg *a = p;
	PyObject *i = PyNumber_Index(o);
	if (!i) {
		PyErr_Format(PyExc_TypeError, "%s: %R is not an integer", a->name, o);
		return 0;
	}
	int overflow = 0;
	long long v = PyLong_AsLongLongAndOverflow(i, &overflow);
	if (v == -1 && !overflow && PyErr_Occurred()) {
		Py_DECREF(i);
		return 0;
	}
	if (overflow || v < a->min || v > a->max) {
		PyErr_Format(PyExc_OverflowError, "%s: %S is out of range (%lld..%lld)", a->name, i,
		             a->min, a->max);
		Py_DECREF(i);
		return 0;
	}
	Py_DECREF(i);
	a->v = v;
	return 1;
}

/* ---- Channel ------------------------------------------------------------------------------ */

struct stream_op;

typedef struct {
	PyObject_HEAD struct moe_client *c;
	pthread_mutex_t lock;
	Py_ssize_t areas; /* Area objects alive: each may back a view of the mapping */
	struct stream_op *ops;
	/* Set by any call (host functions included) that got MOE_EPEERDEAD, cleared by a
	 * reconnect: the Python layer reads it to reconnect before the next call's work. */
	atomic_int dead;
	/* Channels this Channel has had: 1 after connect, +1 per reconnect. A request made on
	 * an earlier one died with it (its slot index means nothing on the new channel). */
	unsigned long generation;
} Channel;

/* One FORWARD issued from a CUDA stream: filled by the Python layer (stream_op_set) before
 * the host functions are enqueued, read by them on the driver thread. */
struct stream_op {
	struct stream_op *next;
	Channel *ch; /* borrowed: the Channel frees its ops */
	uint32_t slot;
	int32_t layer;
	uint32_t n_tokens;
	uint16_t k;
	uint32_t k_defer;
	uint8_t in_dtype, out_dtype;
	uint16_t flags;
	int timeout_ms;
	/* Outcome, written by the host functions, read and cleared by stream_op_take. */
	_Atomic int status;
	uint32_t value, index;
	char message[MOE_MESSAGE_MAX + 64];
};

static void op_fail(struct stream_op *op, int status, const char *msg)
{
	snprintf(op->message, sizeof(op->message), "%s", msg ? msg : moe_strerror(status));
	atomic_store_explicit(&op->status, status, memory_order_release);
}

/* The host functions: cudaHostFn_t, void (*)(void *). */
static void host_submit(void *arg)
{
	struct stream_op *op = arg;
	if (atomic_load_explicit(&op->status, memory_order_acquire) != MOE_OK)
		return; /* an earlier failure not yet reported: nothing more is submitted */
	Channel *ch = op->ch;
	pthread_mutex_lock(&ch->lock);
	int rc = ch->c ? moe_forward_submit(ch->c, op->slot, op->layer, op->n_tokens, op->k,
	                                    op->k_defer, op->in_dtype, op->out_dtype, op->flags)
	               : MOE_EPEERDEAD;
	if (rc == MOE_EPEERDEAD)
		atomic_store_explicit(&ch->dead, 1, memory_order_relaxed);
	if (rc != MOE_OK)
		op_fail(op, rc, ch->c ? moe_last_error(ch->c) : "the channel is closed");
	pthread_mutex_unlock(&ch->lock);
}

static void host_wait(void *arg)
{
	struct stream_op *op = arg;
	Channel *ch = op->ch;
	struct moe_slot s;
	pthread_mutex_lock(&ch->lock);
	if (!ch->c) {
		pthread_mutex_unlock(&ch->lock);
		op_fail(op, MOE_EPEERDEAD, "the channel is closed");
		return;
	}
	moe_slot_view(ch->c, op->slot, &s);
	if (atomic_load_explicit(&op->status, memory_order_acquire) == MOE_OK) {
		struct moe_completion d;
		int rc = moe_forward_wait(ch->c, op->slot, &d, op->timeout_ms);
		if (rc == MOE_ETIMEDOUT) /* never reused while the sidecar may still write it */
			moe_slot_abandon(ch->c, op->slot);
		if (rc == MOE_EPEERDEAD)
			atomic_store_explicit(&ch->dead, 1, memory_order_relaxed);
		if (rc != MOE_OK) {
			op->value = d.value;
			op->index = d.index;
			op_fail(op, rc, moe_last_error(ch->c));
		}
	}
	if (atomic_load_explicit(&op->status, memory_order_acquire) != MOE_OK)
		memset(s.output, 0,
		       (size_t)op->n_tokens * moe_info(ch->c)->hidden *
		           moe_dtype_size(op->out_dtype));
	pthread_mutex_unlock(&ch->lock);
}

static int Channel_init(Channel *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"socket",     "max_tokens",         "hidden",      "top_k",
	                         "n_slots",    "connect_timeout_ms", "client_name", "expect_model",
	                         "server_uid", "batch_invariant",    NULL};
	const char *socket = NULL, *name = NULL, *expect = NULL;
	PyObject *server_uid_o = Py_None;
	int batch_invariant = 0;
	struct int_arg max_tokens = U32_ARG("max_tokens"), hidden = U32_ARG("hidden"),
	               top_k = U32_ARG("top_k"), n_slots = U32_ARG("n_slots"),
	               timeout_ms = I32_ARG("connect_timeout_ms");
	struct int_arg server_uid = U32_ARG("server_uid"); /* None: 0, only root or our own */
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|zO&O&O&O&O&zzOp", kwlist, &socket, int_arg,
	                                 &max_tokens, int_arg, &hidden, int_arg, &top_k, int_arg,
	                                 &n_slots, int_arg, &timeout_ms, &name, &expect,
	                                 &server_uid_o, &batch_invariant))
		return -1;
	if (server_uid_o != Py_None && !int_arg(server_uid_o, &server_uid))
		return -1;
	if (self->c) {
		PyErr_SetString(PyExc_RuntimeError, "Channel already connected");
		return -1;
	}
	struct moe_connect_opts o;
	memset(&o, 0, sizeof(o));
	o.socket_path = socket;
	o.max_tokens = (uint32_t)max_tokens.v;
	o.hidden = (uint32_t)hidden.v;
	o.top_k = (uint32_t)top_k.v;
	o.n_slots = (uint32_t)n_slots.v;
	o.timeout_ms = (int)timeout_ms.v;
	o.client_name = name;
	o.expect_model = expect;
	o.server_uid = (uint32_t)server_uid.v;
	o.flags = batch_invariant ? MOE_CONNECT_BATCH_INVARIANT : 0;
	struct moe_client *c = NULL;
	int rc;
	char why[256];
	Py_BEGIN_ALLOW_THREADS rc = moe_connect(&o, &c);
	snprintf(why, sizeof(why), "%s", moe_connect_error());
	Py_END_ALLOW_THREADS if (rc != MOE_OK)
	{
		raise_status(rc, why, 0, 0);
		return -1;
	}
	pthread_mutex_init(&self->lock, NULL);
	self->c = c;
	self->generation = 1;
	return 0;
}

static void Channel_dealloc(Channel *self)
{
	if (self->c)
		moe_close(self->c);
	self->c = NULL;
	struct stream_op *op = self->ops;
	while (op) {
		struct stream_op *next = op->next;
		free(op);
		op = next;
	}
	PyTypeObject *tp = Py_TYPE((PyObject *)self);
	freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
	tp_free(self);
	Py_DECREF(tp);
}

static struct moe_client *live(Channel *self)
{
	if (!self->c)
		raise_status(MOE_EINVAL, "the channel is closed", 0, 0);
	return self->c;
}

static PyObject *Channel_close(Channel *self, PyObject *noargs)
{
	(void)noargs;
	if (self->areas > 0) {
		PyErr_Format(PyExc_BufferError,
		             "cannot close the channel: %zd slot views (numpy arrays or torch "
		             "tensors of the shared mapping) are still alive; delete them first",
		             self->areas);
		return NULL;
	}
	struct moe_client *c = self->c;
	Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&self->lock);
	self->c = NULL;
	pthread_mutex_unlock(&self->lock);
	Py_END_ALLOW_THREADS if (c) moe_close(c);
	Py_RETURN_NONE;
}

static PyObject *Channel_closed(Channel *self, void *closure)
{
	(void)closure;
	return PyBool_FromLong(self->c == NULL);
}

static PyObject *Channel_views(Channel *self, void *closure)
{
	(void)closure;
	return PyLong_FromSsize_t(self->areas);
}

static PyObject *Channel_info(Channel *self, PyObject *noargs)
{
	(void)noargs;
	struct moe_client *c = live(self);
	if (!c)
		return NULL;
	const struct moe_info *i = moe_info(c);
	PyObject *layers = PyList_New(0);
	if (!layers)
		return NULL;
	int32_t ids[1024];
	int n = i->n_moe_layers ? moe_model_layers(c, ids, 1024) : 0;
	for (int l = 0; l < n && l < 1024; l++) {
		PyObject *v = PyLong_FromLong(ids[l]);
		if (!v || PyList_Append(layers, v) < 0) {
			Py_XDECREF(v);
			Py_DECREF(layers);
			return NULL;
		}
		Py_DECREF(v);
	}
	return Py_BuildValue(
	    "{sIsIsIsIsIsIs(II)sKsIsIsIsNsIsIsIsIsssssIsssN}", "max_tokens", i->max_tokens,
	    "hidden", i->hidden, "top_k", i->top_k, "n_slots", i->n_slots, "dtype_mask",
	    i->dtype_mask, "sidecar_pid", i->sidecar_pid, "abi", (unsigned)i->abi_major,
	    (unsigned)i->abi_minor, "channel_bytes", (unsigned long long)i->channel_bytes,
	    "n_layers", i->n_layers, "n_moe_layers", i->n_moe_layers, "first_moe_layer",
	    i->first_moe_layer, "moe_layers", layers, "n_experts", i->n_experts, "model_top_k",
	    i->model_top_k, "model_hidden", i->model_hidden, "expert_ffn", i->expert_ffn,
	    "model_name", i->model_name, "fingerprint", i->fingerprint, "message_max",
	    (unsigned)MOE_MESSAGE_MAX, "socket_path", moe_socket_path(c), "batch_invariant",
	    PyBool_FromLong(i->batch_invariant));
}

static PyObject *Channel_region(Channel *self, PyObject *noargs)
{
	(void)noargs;
	struct moe_client *c = live(self);
	if (!c)
		return NULL;
	void *base;
	size_t bytes;
	moe_channel_region(c, &base, &bytes);
	return Py_BuildValue("(Kn)", (unsigned long long)(uintptr_t)base, (Py_ssize_t)bytes);
}

static PyObject *Channel_slot_layout(Channel *self, PyObject *args)
{
	struct int_arg index_a = U32_ARG("index");
	if (!PyArg_ParseTuple(args, "O&", int_arg, &index_a))
		return NULL;
	const uint32_t index = (uint32_t)index_a.v;
	struct moe_client *c = live(self);
	if (!c)
		return NULL;
	struct moe_slot s;
	if (moe_slot_view(c, index, &s) != MOE_OK) {
		PyErr_Format(PyExc_ValueError, "slot %u out of range (0..%u)", index,
		             moe_info(c)->n_slots - 1);
		return NULL;
	}
	return Py_BuildValue("{s(nn)s(nn)s(nn)s(nn)}", "input", (Py_ssize_t)s.input_off,
	                     (Py_ssize_t)s.input_bytes, "ids", (Py_ssize_t)s.ids_off,
	                     (Py_ssize_t)s.ids_bytes, "weights", (Py_ssize_t)s.weights_off,
	                     (Py_ssize_t)s.weights_bytes, "output", (Py_ssize_t)s.output_off,
	                     (Py_ssize_t)s.output_bytes);
}

/* Runs call(c, a) under the mutex with the GIL released; its status, and the sentence copied
 * under the mutex. */
#define LOCKED_CALL(self, rc, why, expr)                                                           \
	do {                                                                                       \
		Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&(self)->lock);                          \
		if ((self)->c) {                                                                   \
			struct moe_client *c_ = (self)->c;                                         \
			(rc) = (expr);                                                             \
			if ((rc) == MOE_EPEERDEAD)                                                 \
				atomic_store_explicit(&(self)->dead, 1, memory_order_relaxed);     \
			snprintf((why), sizeof(why), "%s", moe_last_error(c_));                    \
		} else {                                                                           \
			(rc) = MOE_EINVAL;                                                         \
			snprintf((why), sizeof(why), "the channel is closed");                     \
		}                                                                                  \
		pthread_mutex_unlock(&(self)->lock);                                               \
		Py_END_ALLOW_THREADS                                                               \
	} while (0)

/* reconnect(timeout_ms): moe_reconnect (0: the connect timeout; CONNECT_NOWAIT: no wait).
 * Refused while slot views live: the old mapping is unmapped, and a view of it would fault. */
static PyObject *Channel_reconnect(Channel *self, PyObject *args)
{
	struct int_arg timeout_a = I32_ARG("timeout_ms");
	if (!PyArg_ParseTuple(args, "O&", int_arg, &timeout_a) || !live(self))
		return NULL;
	if (self->areas > 0) {
		PyErr_Format(
		    PyExc_BufferError,
		    "cannot reconnect the channel: %zd slot views (numpy arrays or torch "
		    "tensors of the shared mapping) are still alive, and reconnecting unmaps "
		    "it; delete them first",
		    self->areas);
		return NULL;
	}
	int rc;
	char why[MOE_MESSAGE_MAX + 64];
	LOCKED_CALL(self, rc, why, moe_reconnect(c_, (int)timeout_a.v));
	if (rc != MOE_OK) {
		atomic_store_explicit(&self->dead, 1, memory_order_relaxed); /* it stays dead */
		return raise_status(rc, why, 0, 0);
	}
	self->generation++;
	atomic_store_explicit(&self->dead, 0, memory_order_relaxed);
	Py_RETURN_NONE;
}

/* hung_up() -> the channel is known dead, or its socket says the sidecar has gone (a poll:
 * off the request path). */
static PyObject *Channel_hung_up(Channel *self, PyObject *noargs)
{
	(void)noargs;
	if (!live(self))
		return NULL;
	if (atomic_load_explicit(&self->dead, memory_order_relaxed))
		Py_RETURN_TRUE;
	/* The sidecar never sends after the welcome: readable means EOF or garbage. */
	struct pollfd p = {.fd = moe_socket_fd(self->c), .events = POLLIN | POLLRDHUP};
	if (poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLRDHUP | POLLERR))) {
		atomic_store_explicit(&self->dead, 1, memory_order_relaxed);
		Py_RETURN_TRUE;
	}
	Py_RETURN_FALSE;
}

static PyObject *Channel_dead(Channel *self, void *closure)
{
	(void)closure;
	return PyBool_FromLong(atomic_load_explicit(&self->dead, memory_order_relaxed));
}

static PyObject *Channel_generation(Channel *self, void *closure)
{
	(void)closure;
	return PyLong_FromUnsignedLong(self->generation);
}

static PyObject *Channel_acquire(Channel *self, PyObject *noargs)
{
	(void)noargs;
	struct moe_slot s;
	int rc;
	char why[MOE_MESSAGE_MAX + 64];
	LOCKED_CALL(self, rc, why, moe_slot_acquire(c_, &s));
	if (rc != MOE_OK)
		return raise_status(rc, why, 0, 0);
	return PyLong_FromUnsignedLong(s.index);
}

static PyObject *Channel_release(Channel *self, PyObject *args)
{
	struct int_arg slot_a = U32_ARG("slot");
	int abandon = 0;
	if (!PyArg_ParseTuple(args, "O&|p", int_arg, &slot_a, &abandon))
		return NULL;
	const uint32_t slot = (uint32_t)slot_a.v;
	int rc;
	char why[MOE_MESSAGE_MAX + 64];
	LOCKED_CALL(self, rc, why,
	            abandon ? moe_slot_abandon(c_, slot) : moe_slot_release(c_, slot));
	if (rc != MOE_OK)
		return raise_status(rc, why, 0, 0);
	Py_RETURN_NONE;
}

static PyObject *Channel_submit(Channel *self, PyObject *args)
{
	struct int_arg slot = U32_ARG("slot"), layer = I32_ARG("layer"),
	               n_tokens = U32_ARG("n_tokens"), k = U16_ARG("k"),
	               k_defer = U32_ARG("k_defer"), in_dt = DTYPE_ARG("in_dtype"),
	               out_dt = DTYPE_ARG("out_dtype"), flags = U16_ARG("flags");
	if (!PyArg_ParseTuple(args, "O&O&O&O&O&O&O&O&", int_arg, &slot, int_arg, &layer, int_arg,
	                      &n_tokens, int_arg, &k, int_arg, &k_defer, int_arg, &in_dt, int_arg,
	                      &out_dt, int_arg, &flags))
		return NULL;
	int rc;
	char why[MOE_MESSAGE_MAX + 64];
	LOCKED_CALL(self, rc, why,
	            moe_forward_submit(c_, (uint32_t)slot.v, (int32_t)layer.v, (uint32_t)n_tokens.v,
	                               (uint16_t)k.v, (uint32_t)k_defer.v, (uint8_t)in_dt.v,
	                               (uint8_t)out_dt.v, (uint16_t)flags.v));
	if (rc != MOE_OK)
		return raise_status(rc, why, 0, 0);
	Py_RETURN_NONE;
}

/* wait(slot, timeout_ms, poll=False) -> completion value (FORWARD: experts deferred), or None
 * when polling and not done. */
static PyObject *Channel_wait(Channel *self, PyObject *args)
{
	struct int_arg slot_a = U32_ARG("slot"), timeout_a = I32_ARG("timeout_ms");
	int poll = 0;
	if (!PyArg_ParseTuple(args, "O&O&|p", int_arg, &slot_a, int_arg, &timeout_a, &poll))
		return NULL;
	const uint32_t slot = (uint32_t)slot_a.v;
	const int timeout_ms = (int)timeout_a.v;
	int rc;
	char why[MOE_MESSAGE_MAX + 64];
	struct moe_completion d;
	memset(&d, 0, sizeof(d));
	LOCKED_CALL(self, rc, why,
	            poll ? moe_forward_poll(c_, slot, &d)
	                 : moe_forward_wait(c_, slot, &d, timeout_ms));
	if (poll && rc == MOE_EAGAIN)
		Py_RETURN_NONE;
	if (rc != MOE_OK)
		return raise_status(rc, why, d.value, d.index);
	return PyLong_FromUnsignedLong(d.value);
}

static PyObject *Channel_ping(Channel *self, PyObject *args)
{
	struct int_arg timeout_ms = I32_ARG("timeout_ms");
	if (!PyArg_ParseTuple(args, "O&", int_arg, &timeout_ms))
		return NULL;
	int rc;
	char why[MOE_MESSAGE_MAX + 64];
	LOCKED_CALL(self, rc, why, moe_ping(c_, (int)timeout_ms.v));
	if (rc != MOE_OK)
		return raise_status(rc, why, 0, 0);
	Py_RETURN_NONE;
}

/* Copies a contiguous buffer argument (bytes-like) for the duration of a call. */
static int get_buffer(PyObject *o, Py_buffer *b, const char *what)
{
	if (PyObject_GetBuffer(o, b, PyBUF_SIMPLE) < 0) {
		PyErr_Format(PyExc_TypeError, "%s must be a contiguous bytes-like object", what);
		return -1;
	}
	return 0;
}

static PyObject *Channel_prefetch(Channel *self, PyObject *args)
{
	struct int_arg layer_a = I32_ARG("layer"), timeout_a = I32_ARG("timeout_ms");
	PyObject *ids_o, *scores_o;
	if (!PyArg_ParseTuple(args, "O&OOO&", int_arg, &layer_a, &ids_o, &scores_o, int_arg,
	                      &timeout_a))
		return NULL;
	const int32_t layer = (int32_t)layer_a.v;
	const int timeout_ms = (int)timeout_a.v;
	Py_buffer ids = {0}, scores;
	if (ids_o != Py_None && get_buffer(ids_o, &ids, "ids") < 0)
		return NULL;
	if (get_buffer(scores_o, &scores, "scores") < 0) {
		if (ids.obj)
			PyBuffer_Release(&ids);
		return NULL;
	}
	const uint32_t n = (uint32_t)(scores.len / 4);
	if (ids.obj && ids.len != scores.len) {
		PyBuffer_Release(&ids);
		PyBuffer_Release(&scores);
		PyErr_SetString(PyExc_ValueError, "ids and scores differ in length");
		return NULL;
	}
	int rc;
	uint32_t queued = 0;
	char why[MOE_MESSAGE_MAX + 64];
	LOCKED_CALL(self, rc, why,
	            moe_prefetch(c_, layer, ids.obj ? (const int32_t *)ids.buf : NULL,
	                         (const float *)scores.buf, n, &queued, timeout_ms));
	if (ids.obj)
		PyBuffer_Release(&ids);
	PyBuffer_Release(&scores);
	if (rc != MOE_OK)
		return raise_status(rc, why, 0, 0);
	return PyLong_FromUnsignedLong(queued);
}

static PyObject *Channel_set_gpu_mask(Channel *self, PyObject *args)
{
	struct int_arg layer_a = I32_ARG("layer"), timeout_a = I32_ARG("timeout_ms");
	PyObject *bits_o;
	if (!PyArg_ParseTuple(args, "O&OO&", int_arg, &layer_a, &bits_o, int_arg, &timeout_a))
		return NULL;
	const int32_t layer = (int32_t)layer_a.v;
	const int timeout_ms = (int)timeout_a.v;
	Py_buffer bits;
	if (get_buffer(bits_o, &bits, "mask") < 0)
		return NULL;
	int rc;
	char why[MOE_MESSAGE_MAX + 64];
	LOCKED_CALL(self, rc, why,
	            moe_set_gpu_mask(c_, layer, bits.buf, (size_t)bits.len, timeout_ms));
	PyBuffer_Release(&bits);
	if (rc != MOE_OK)
		return raise_status(rc, why, 0, 0);
	Py_RETURN_NONE;
}

static PyObject *Channel_stats_json(Channel *self, PyObject *args)
{
	struct int_arg timeout_a = I32_ARG("timeout_ms"), flags_a = U16_ARG("flags");
	if (!PyArg_ParseTuple(args, "O&|O&", int_arg, &timeout_a, int_arg, &flags_a))
		return NULL;
	const int timeout_ms = (int)timeout_a.v;
	const uint16_t flags = (uint16_t)flags_a.v;
	size_t cap = 1u << 20;
	char *buf = malloc(cap);
	if (!buf)
		return PyErr_NoMemory();
	int rc;
	char why[MOE_MESSAGE_MAX + 64];
	LOCKED_CALL(self, rc, why, moe_stats_json_flags(c_, flags, buf, cap, timeout_ms));
	PyObject *r = rc == MOE_OK ? PyUnicode_FromString(buf) : raise_status(rc, why, 0, 0);
	free(buf);
	return r;
}

/* lease(layer, ids: bytes of int32 or None, n, timeout_ms[, flags]) -> bytes: n struct
 * moe_lease_expert (moe_lease; ids None: experts 0..n-1). */
static PyObject *Channel_lease(Channel *self, PyObject *args)
{
	struct int_arg layer_a = I32_ARG("layer"), n_a = {"n", 1, 256, 0},
	               timeout_a = I32_ARG("timeout_ms"), flags_a = U16_ARG("flags");
	PyObject *ids_o;
	if (!PyArg_ParseTuple(args, "O&OO&O&|O&", int_arg, &layer_a, &ids_o, int_arg, &n_a, int_arg,
	                      &timeout_a, int_arg, &flags_a))
		return NULL;
	const uint16_t flags = (uint16_t)flags_a.v;
	const uint32_t n = (uint32_t)n_a.v;
	Py_buffer ids = {0};
	if (ids_o != Py_None) {
		if (get_buffer(ids_o, &ids, "ids") < 0)
			return NULL;
		if ((size_t)ids.len != n * sizeof(int32_t)) {
			PyBuffer_Release(&ids);
			return PyErr_Format(PyExc_ValueError,
			                    "ids: %zd bytes, %u int32 ids need %zu", ids.len, n,
			                    n * sizeof(int32_t));
		}
	}
	PyObject *out =
	    PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * sizeof(struct moe_lease_expert)));
	if (!out) {
		if (ids_o != Py_None)
			PyBuffer_Release(&ids);
		return NULL;
	}
	struct moe_lease_expert *le = (struct moe_lease_expert *)(void *)PyBytes_AsString(out);
	const int32_t *idp = ids_o != Py_None ? ids.buf : NULL;
	const int32_t layer = (int32_t)layer_a.v;
	const int timeout_ms = (int)timeout_a.v;
	int rc;
	char why[MOE_MESSAGE_MAX + 64];
	LOCKED_CALL(self, rc, why, moe_lease(c_, layer, idp, n, flags, le, timeout_ms));
	if (ids_o != Py_None)
		PyBuffer_Release(&ids);
	if (rc != MOE_OK) {
		Py_DECREF(out);
		return raise_status(rc, why, 0, 0);
	}
	return out;
}

/* lease_release(ids: bytes of uint32 or None, timeout_ms): moe_lease_release (None: all). */
static PyObject *Channel_lease_release(Channel *self, PyObject *args)
{
	struct int_arg timeout_a = I32_ARG("timeout_ms");
	PyObject *ids_o;
	if (!PyArg_ParseTuple(args, "OO&", &ids_o, int_arg, &timeout_a))
		return NULL;
	Py_buffer ids = {0};
	if (ids_o != Py_None && get_buffer(ids_o, &ids, "ids") < 0)
		return NULL;
	const uint32_t *idp = ids_o != Py_None ? ids.buf : NULL;
	const uint32_t n = ids_o != Py_None ? (uint32_t)((size_t)ids.len / sizeof(uint32_t)) : 0;
	const int timeout_ms = (int)timeout_a.v;
	int rc;
	char why[MOE_MESSAGE_MAX + 64];
	LOCKED_CALL(self, rc, why, moe_lease_release(c_, idp, n, timeout_ms));
	if (ids_o != Py_None)
		PyBuffer_Release(&ids);
	if (rc != MOE_OK)
		return raise_status(rc, why, 0, 0);
	Py_RETURN_NONE;
}

/* lease_slices(expert: bytes of one struct moe_lease_expert as lease() gave it, matrix 0..2)
 * -> bytes of its struct moe_lease_slice (moe_lease_slices). */
static PyObject *Channel_lease_slices(Channel *self, PyObject *args)
{
	struct int_arg j_a = {"matrix", 0, 2, 0};
	PyObject *e_o;
	if (!PyArg_ParseTuple(args, "OO&", &e_o, int_arg, &j_a))
		return NULL;
	Py_buffer eb;
	if (get_buffer(e_o, &eb, "expert") < 0)
		return NULL;
	struct moe_lease_expert e;
	const int fits = (size_t)eb.len == sizeof(e);
	if (fits)
		memcpy(&e, eb.buf, sizeof(e));
	PyBuffer_Release(&eb);
	if (!fits)
		return PyErr_Format(PyExc_ValueError, "expert: %zu bytes expected",
		                    sizeof(struct moe_lease_expert));
	const struct moe_lease_matrix *m = j_a.v == 0 ? &e.gate : j_a.v == 1 ? &e.up : &e.down;
	struct moe_lease_slice sl[MOE_LEASE_MAX_POOLS];
	uint32_t n = 0;
	int rc;
	char why[MOE_MESSAGE_MAX + 64];
	LOCKED_CALL(self, rc, why, moe_lease_slices(c_, &e, m, sl, MOE_LEASE_MAX_POOLS, &n));
	if (rc != MOE_OK)
		return raise_status(rc, "lease_slices: no slices of this matrix held", 0, 0);
	return PyBytes_FromStringAndSize((const char *)sl, (Py_ssize_t)(n * sizeof(sl[0])));
}

/* lease_pool([staging[, pool]]) -> (fd, bytes): a duplicate of lease pool `pool`'s memfd
 * (staging true: the channel's staging area's), which the caller maps read-only and closes;
 * or raises (none). */
static PyObject *Channel_lease_pool(Channel *self, PyObject *args)
{
	int staging = 0;
	struct int_arg pool_a = {"pool", 0, MOE_LEASE_MAX_POOLS - 1, 0};
	if (!PyArg_ParseTuple(args, "|pO&", &staging, int_arg, &pool_a))
		return NULL;
	const uint32_t pool = (uint32_t)pool_a.v;
	int rc, fd = -1;
	size_t bytes = 0;
	char why[MOE_MESSAGE_MAX + 64];
	uint32_t n_pools = 0;
	LOCKED_CALL(self, rc, why,
	            (n_pools = moe_lease_pool_count(c_),
	             staging ? moe_lease_staging(c_, NULL, &bytes, &fd)
	                     : moe_lease_pool_at(c_, pool, NULL, &bytes, &fd)));
	if (rc == MOE_ENOLEASE && !staging && pool > 0 && n_pools > 0) {
		snprintf(why, sizeof(why),
		         "pool %u: the sidecar shares %u lease pool(s), one per NUMA node", pool,
		         n_pools);
		return raise_status(rc, why, 0, 0);
	}
	if (rc != MOE_OK)
		return raise_status(rc,
		                    rc != MOE_ENOLEASE ? why
		                    : staging
		                        ? "the sidecar gives this channel no staging area "
		                          "(serve --lease-staging-mib)"
		                        : "the sidecar shares no slot pool (start it with serve "
		                          "--leases)",
		                    0, 0);
	const int d = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (d < 0)
		return PyErr_SetFromErrno(PyExc_OSError);
	return Py_BuildValue("(in)", d, (Py_ssize_t)bytes);
}

/* deinterleave(description: 64 bytes of struct moe_lease_matrix, pool, out): GGUF rows of a
 * leased matrix into the writable buffer out (moe_lease_deinterleave); the description's
 * span must lie inside pool. */
static PyObject *mod_deinterleave(PyObject *mod, PyObject *args)
{
	(void)mod;
	PyObject *d_o, *pool_o, *out_o;
	if (!PyArg_ParseTuple(args, "OOO", &d_o, &pool_o, &out_o))
		return NULL;
	Py_buffer d, pool, out;
	if (get_buffer(d_o, &d, "description") < 0)
		return NULL;
	if (get_buffer(pool_o, &pool, "pool") < 0) {
		PyBuffer_Release(&d);
		return NULL;
	}
	if (PyObject_GetBuffer(out_o, &out, PyBUF_WRITABLE) < 0) {
		PyBuffer_Release(&d);
		PyBuffer_Release(&pool);
		return NULL;
	}
	struct moe_lease_matrix m;
	int rc = MOE_EINVAL;
	if ((size_t)d.len == sizeof(m)) {
		memcpy(&m, d.buf, sizeof(m));
		if (m.offset <= (uint64_t)pool.len && m.bytes <= (uint64_t)pool.len - m.offset)
			rc = moe_lease_deinterleave(&m, pool.buf, out.buf, (size_t)out.len);
	}
	PyBuffer_Release(&d);
	PyBuffer_Release(&pool);
	PyBuffer_Release(&out);
	if (rc != MOE_OK)
		return raise_status(rc,
		                    "deinterleave: the description, the pool or the output does "
		                    "not fit",
		                    0, 0);
	Py_RETURN_NONE;
}

/* deinterleave_slice(description, slice: 64 bytes each of struct moe_lease_matrix and
 * struct moe_lease_slice, pool, out): the slice's GGUF rows into their rows of out, the whole
 * matrix (moe_lease_deinterleave_slice); the slice's span must lie inside pool. */
static PyObject *mod_deinterleave_slice(PyObject *mod, PyObject *args)
{
	(void)mod;
	PyObject *d_o, *s_o, *pool_o, *out_o;
	if (!PyArg_ParseTuple(args, "OOOO", &d_o, &s_o, &pool_o, &out_o))
		return NULL;
	Py_buffer d, sb, pool, out;
	if (get_buffer(d_o, &d, "description") < 0)
		return NULL;
	if (get_buffer(s_o, &sb, "slice") < 0) {
		PyBuffer_Release(&d);
		return NULL;
	}
	if (get_buffer(pool_o, &pool, "pool") < 0) {
		PyBuffer_Release(&d);
		PyBuffer_Release(&sb);
		return NULL;
	}
	if (PyObject_GetBuffer(out_o, &out, PyBUF_WRITABLE) < 0) {
		PyBuffer_Release(&d);
		PyBuffer_Release(&sb);
		PyBuffer_Release(&pool);
		return NULL;
	}
	struct moe_lease_matrix m;
	struct moe_lease_slice s;
	int rc = MOE_EINVAL;
	if ((size_t)d.len == sizeof(m) && (size_t)sb.len == sizeof(s)) {
		memcpy(&m, d.buf, sizeof(m));
		memcpy(&s, sb.buf, sizeof(s));
		if (s.offset <= (uint64_t)pool.len && s.bytes <= (uint64_t)pool.len - s.offset)
			rc = moe_lease_deinterleave_slice(&m, &s, pool.buf, out.buf,
			                                  (size_t)out.len);
	}
	PyBuffer_Release(&d);
	PyBuffer_Release(&sb);
	PyBuffer_Release(&pool);
	PyBuffer_Release(&out);
	if (rc != MOE_OK)
		return raise_status(rc,
		                    "deinterleave_slice: the description, the slice, the pool or "
		                    "the output does not fit",
		                    0, 0);
	Py_RETURN_NONE;
}

/* expert_stats(timeout_ms) -> (counts: bytes of uint64, heat: bytes of float32, half_life),
 * layer-major [n_moe_layers][n_experts]. */
static PyObject *Channel_expert_stats(Channel *self, PyObject *args)
{
	struct int_arg timeout_a = I32_ARG("timeout_ms");
	if (!PyArg_ParseTuple(args, "O&", int_arg, &timeout_a) || !live(self))
		return NULL;
	const int timeout_ms = (int)timeout_a.v;
	const struct moe_info *i = moe_info(self->c);
	const size_t n = (size_t)i->n_moe_layers * i->n_experts;
	uint64_t *counts = calloc(n ? n : 1, sizeof(*counts));
	float *heat = calloc(n ? n : 1, sizeof(*heat));
	if (!counts || !heat) {
		free(counts);
		free(heat);
		return PyErr_NoMemory();
	}
	uint32_t half_life = 0;
	int rc;
	char why[MOE_MESSAGE_MAX + 64];
	LOCKED_CALL(self, rc, why, moe_expert_stats(c_, counts, heat, n, &half_life, timeout_ms));
	PyObject *r =
	    rc == MOE_OK
	        ? Py_BuildValue("(y#y#I)", (const char *)counts, (Py_ssize_t)(n * sizeof(*counts)),
	                        (const char *)heat, (Py_ssize_t)(n * sizeof(*heat)), half_life)
	        : raise_status(rc, why, 0, 0);
	free(counts);
	free(heat);
	return r;
}

/* ---- Stream ops ----------------------------------------------------------------------- */

static PyObject *Channel_stream_op(Channel *self, PyObject *noargs)
{
	(void)noargs;
	if (!live(self))
		return NULL;
	struct stream_op *op = calloc(1, sizeof(*op));
	if (!op)
		return PyErr_NoMemory();
	op->ch = self;
	op->next = self->ops;
	self->ops = op;
	return PyLong_FromVoidPtr(op);
}

static struct stream_op *find_op(Channel *self, PyObject *addr)
{
	void *p = PyLong_AsVoidPtr(addr);
	if (!p && PyErr_Occurred())
		return NULL;
	for (struct stream_op *op = self->ops; op; op = op->next)
		if (op == p)
			return op;
	PyErr_SetString(PyExc_ValueError, "not a stream op of this channel");
	return NULL;
}

static PyObject *Channel_stream_op_set(Channel *self, PyObject *args)
{
	PyObject *addr;
	struct int_arg slot = U32_ARG("slot"), layer = I32_ARG("layer"),
	               n_tokens = U32_ARG("n_tokens"), k = U16_ARG("k"),
	               k_defer = U32_ARG("k_defer"), in_dt = DTYPE_ARG("in_dtype"),
	               out_dt = DTYPE_ARG("out_dtype"), flags = U16_ARG("flags"),
	               timeout_ms = I32_ARG("timeout_ms");
	if (!PyArg_ParseTuple(args, "OO&O&O&O&O&O&O&O&O&", &addr, int_arg, &slot, int_arg, &layer,
	                      int_arg, &n_tokens, int_arg, &k, int_arg, &k_defer, int_arg, &in_dt,
	                      int_arg, &out_dt, int_arg, &flags, int_arg, &timeout_ms))
		return NULL;
	struct stream_op *op = find_op(self, addr);
	if (!op)
		return NULL;
	Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&self->lock); /* not while a host fn reads it */
	op->slot = (uint32_t)slot.v;
	op->layer = (int32_t)layer.v;
	op->n_tokens = (uint32_t)n_tokens.v;
	op->k = (uint16_t)k.v;
	op->k_defer = (uint32_t)k_defer.v;
	op->in_dtype = (uint8_t)in_dt.v;
	op->out_dtype = (uint8_t)out_dt.v;
	op->flags = (uint16_t)flags.v;
	op->timeout_ms = (int)timeout_ms.v;
	pthread_mutex_unlock(&self->lock);
	Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

/* stream_op_take(addr) -> (status, message, value, index); resets the status.
 * Without the channel mutex: host_wait holds it while it waits for the sidecar, and the
 * engine's launch thread calls this before each submit — it must not stall behind a layer's
 * CPU work. The host functions write message, value and index before the release store of a
 * failing status, so they are read complete after its acquire load. */
static PyObject *Channel_stream_op_take(Channel *self, PyObject *args)
{
	PyObject *addr;
	if (!PyArg_ParseTuple(args, "O", &addr))
		return NULL;
	struct stream_op *op = find_op(self, addr);
	if (!op)
		return NULL;
	char message[sizeof(op->message)] = "";
	uint32_t value = 0, index = 0;
	int status = atomic_load_explicit(&op->status, memory_order_acquire);
	if (status != MOE_OK) {
		memcpy(message, op->message, sizeof(message));
		message[sizeof(message) - 1] = '\0';
		value = op->value;
		index = op->index;
		atomic_store_explicit(&op->status, MOE_OK, memory_order_release);
	}
	return Py_BuildValue("(isII)", status, message, value, index);
}

/* ---- Area: a writable range of the mapping, through the buffer protocol -------------------- */

typedef struct {
	PyObject_HEAD Channel *ch;
	Py_ssize_t offset, length;
} Area;

static PyObject *Channel_area(Channel *self, PyObject *args);

static int Area_getbuffer(Area *self, Py_buffer *view, int flags)
{
	if (!self->ch->c) {
		PyErr_SetString(PyExc_BufferError, "the channel is closed");
		return -1;
	}
	void *base;
	size_t bytes;
	moe_channel_region(self->ch->c, &base, &bytes);
	return PyBuffer_FillInfo(view, (PyObject *)self, (char *)base + self->offset, self->length,
	                         0, flags);
}

static void Area_dealloc(Area *self)
{
	if (self->ch)
		self->ch->areas--;
	Py_XDECREF((PyObject *)self->ch);
	PyTypeObject *tp = Py_TYPE((PyObject *)self);
	freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
	tp_free(self);
	Py_DECREF(tp);
}

static PyType_Slot area_slots[] = {
    {Py_bf_getbuffer, Area_getbuffer},
    {Py_tp_dealloc, Area_dealloc},
    {Py_tp_doc, "A writable range of a channel's shared mapping (buffer protocol)."},
    {0, NULL},
};
static PyType_Spec area_spec = {"moe_sidecar._native.Area", sizeof(Area), 0, Py_TPFLAGS_DEFAULT,
                                area_slots};
static PyObject *area_type;

static PyObject *Channel_area(Channel *self, PyObject *args)
{
	struct int_arg offset_a = {"offset", 0, PY_SSIZE_T_MAX, 0},
	               length_a = {"length", 0, PY_SSIZE_T_MAX, 0};
	if (!PyArg_ParseTuple(args, "O&O&", int_arg, &offset_a, int_arg, &length_a))
		return NULL;
	const Py_ssize_t offset = (Py_ssize_t)offset_a.v, length = (Py_ssize_t)length_a.v;
	struct moe_client *c = live(self);
	if (!c)
		return NULL;
	void *base;
	size_t bytes;
	moe_channel_region(c, &base, &bytes);
	if ((size_t)offset > bytes || (size_t)length > bytes - offset) {
		PyErr_Format(PyExc_ValueError, "range [%zd, +%zd) is outside the %zu-byte channel",
		             offset, length, bytes);
		return NULL;
	}
	PyTypeObject *tp = (PyTypeObject *)area_type;
	allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
	Area *a = (Area *)alloc(tp, 0);
	if (!a)
		return NULL;
	Py_INCREF((PyObject *)self);
	a->ch = self;
	self->areas++;
	a->offset = offset;
	a->length = length;
	return (PyObject *)a;
}

/* ---- module --------------------------------------------------------------------------- */

static PyMethodDef channel_methods[] = {
    {"close", (PyCFunction)Channel_close, METH_NOARGS, "Unmap and disconnect."},
    {"reconnect", (PyCFunction)Channel_reconnect, METH_VARARGS,
     "reconnect(timeout_ms): a new channel to the sidecar now at the socket (moe_reconnect)."},
    {"hung_up", (PyCFunction)Channel_hung_up, METH_NOARGS,
     "True if the channel is dead or its socket hung up (a poll)."},
    {"info", (PyCFunction)Channel_info, METH_NOARGS, "What was negotiated and what is served."},
    {"region", (PyCFunction)Channel_region, METH_NOARGS, "(address, bytes) of the mapping."},
    {"slot_layout", (PyCFunction)Channel_slot_layout, METH_VARARGS,
     "slot_layout(i) -> {area: (offset, bytes)}."},
    {"area", (PyCFunction)Channel_area, METH_VARARGS, "area(offset, length) -> Area."},
    {"acquire", (PyCFunction)Channel_acquire, METH_NOARGS, "Take a free slot."},
    {"release", (PyCFunction)Channel_release, METH_VARARGS,
     "release(slot, abandon=False): give a slot back (abandon: even in flight)."},
    {"submit", (PyCFunction)Channel_submit, METH_VARARGS,
     "submit(slot, layer, n_tokens, k, k_defer, in_dtype, out_dtype, flags)."},
    {"wait", (PyCFunction)Channel_wait, METH_VARARGS,
     "wait(slot, timeout_ms, poll=False) -> value (None: polling, not done)."},
    {"ping", (PyCFunction)Channel_ping, METH_VARARGS, "ping(timeout_ms)."},
    {"lease", (PyCFunction)Channel_lease, METH_VARARGS,
     "lease(layer, ids, n, timeout_ms) -> bytes of n lease descriptions."},
    {"lease_release", (PyCFunction)Channel_lease_release, METH_VARARGS,
     "lease_release(ids or None, timeout_ms)."},
    {"lease_pool", (PyCFunction)Channel_lease_pool, METH_VARARGS,
     "lease_pool(staging=False, pool=0) -> (a duplicate of the pool's memfd, bytes)."},
    {"lease_slices", (PyCFunction)Channel_lease_slices, METH_VARARGS,
     "lease_slices(expert, matrix) -> bytes of the matrix's slices (split pools)."},
    {"prefetch", (PyCFunction)Channel_prefetch, METH_VARARGS,
     "prefetch(layer, ids|None, scores, timeout_ms) -> loads started."},
    {"set_gpu_mask", (PyCFunction)Channel_set_gpu_mask, METH_VARARGS,
     "set_gpu_mask(layer, bits, timeout_ms)."},
    {"stats_json", (PyCFunction)Channel_stats_json, METH_VARARGS,
     "stats_json(timeout_ms, flags=0)."},
    {"expert_stats", (PyCFunction)Channel_expert_stats, METH_VARARGS,
     "expert_stats(timeout_ms) -> (counts uint64 bytes, heat float32 bytes, half_life)."},
    {"stream_op", (PyCFunction)Channel_stream_op, METH_NOARGS,
     "A new stream op (its address, for cudaLaunchHostFunc's userData)."},
    {"stream_op_set", (PyCFunction)Channel_stream_op_set, METH_VARARGS,
     "stream_op_set(op, slot, layer, n_tokens, k, k_defer, in_dtype, out_dtype, flags, "
     "timeout_ms)."},
    {"stream_op_take", (PyCFunction)Channel_stream_op_take, METH_VARARGS,
     "stream_op_take(op) -> (status, message, value, index), status reset."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef channel_getset[] = {
    {"closed", (getter)Channel_closed, NULL, "True after close().", NULL},
    {"views", (getter)Channel_views, NULL, "Slot views (Area objects) alive: close() refuses.",
     NULL},
    {"dead", (getter)Channel_dead, NULL, "True after a call saw the sidecar gone, until reconnect.",
     NULL},
    {"generation", (getter)Channel_generation, NULL,
     "1 after connect, +1 per reconnect: requests of an earlier one died with it.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot channel_slots[] = {
    {Py_tp_init, Channel_init},
    {Py_tp_dealloc, Channel_dealloc},
    {Py_tp_methods, channel_methods},
    {Py_tp_getset, channel_getset},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_doc, "Channel(socket=None, max_tokens=0, hidden=0, top_k=0, n_slots=0, "
                "connect_timeout_ms=0, client_name=None, expect_model=None, server_uid=None, "
                "batch_invariant=False): "
                "one libmoe_client connection."},
    {0, NULL},
};
static PyType_Spec channel_spec = {"moe_sidecar._native.Channel", sizeof(Channel), 0,
                                   Py_TPFLAGS_DEFAULT, channel_slots};

static PyObject *mod_set_error_factory(PyObject *mod, PyObject *f)
{
	(void)mod;
	if (!PyCallable_Check(f)) {
		PyErr_SetString(PyExc_TypeError, "the error factory must be callable");
		return NULL;
	}
	PyObject *old = error_factory;
	Py_INCREF(f);
	error_factory = f;
	Py_XDECREF(old);
	Py_RETURN_NONE;
}

static PyObject *mod_fingerprint(PyObject *mod, PyObject *args)
{
	(void)mod;
	const char *path;
	if (!PyArg_ParseTuple(args, "s", &path))
		return NULL;
	char hex[33], why[320];
	int rc;
	Py_BEGIN_ALLOW_THREADS rc = moe_model_fingerprint(path, hex);
	snprintf(why, sizeof(why), "%s", moe_connect_error());
	Py_END_ALLOW_THREADS if (rc != MOE_OK) return raise_status(rc, why, 0, 0);
	return PyUnicode_FromString(hex);
}

/* placement(load: float64 buffer, n_moe_layers, n_experts, blocks: int32 buffer or None,
 * n_blocks, gpu_experts, strategy) -> (mask bytes, covered). */
static PyObject *mod_placement(PyObject *mod, PyObject *args)
{
	(void)mod;
	PyObject *load_o, *blocks_o;
	struct int_arg n_layers_a = U32_ARG("n_moe_layers"), n_experts_a = U32_ARG("n_experts"),
	               n_blocks_a = U32_ARG("n_blocks"), gpu_experts_a = U32_ARG("gpu_experts"),
	               strategy_a = {"strategy", 0, MOE_PLACE_COUNT - 1, 0};
	if (!PyArg_ParseTuple(args, "OO&O&OO&O&O&", &load_o, int_arg, &n_layers_a, int_arg,
	                      &n_experts_a, &blocks_o, int_arg, &n_blocks_a, int_arg,
	                      &gpu_experts_a, int_arg, &strategy_a))
		return NULL;
	const uint32_t n_layers = (uint32_t)n_layers_a.v, n_experts = (uint32_t)n_experts_a.v,
	               n_blocks = (uint32_t)n_blocks_a.v, gpu_experts = (uint32_t)gpu_experts_a.v;
	const int strategy = (int)strategy_a.v;
	Py_buffer load, blocks = {0};
	if (get_buffer(load_o, &load, "load") < 0)
		return NULL;
	if (blocks_o != Py_None && get_buffer(blocks_o, &blocks, "blocks") < 0) {
		PyBuffer_Release(&load);
		return NULL;
	}
	PyObject *r = NULL;
	const size_t cells = (size_t)n_layers * n_experts;
	const size_t mask_bytes = (size_t)(n_experts + 7u) / 8u * n_blocks;
	if ((size_t)load.len != cells * sizeof(double) ||
	    (blocks.buf && (size_t)blocks.len != (size_t)n_layers * sizeof(int32_t))) {
		PyErr_SetString(PyExc_ValueError, "placement: load or blocks of the wrong size");
		goto out;
	}
	uint8_t *mask = malloc(mask_bytes ? mask_bytes : 1);
	if (!mask) {
		PyErr_NoMemory();
		goto out;
	}
	double covered = 0;
	int rc = moe_placement(load.buf, n_layers, n_experts, blocks.buf, n_blocks, gpu_experts,
	                       strategy, mask, mask_bytes, &covered);
	if (rc == MOE_OK)
		r = Py_BuildValue("(y#d)", (const char *)mask, (Py_ssize_t)mask_bytes, covered);
	else
		PyErr_Format(PyExc_ValueError,
		             "placement: %s (load must be non-negative, blocks ascending below "
		             "n_blocks, strategy 0..%d)",
		             moe_strerror(rc), MOE_PLACE_COUNT - 1);
	free(mask);
out:
	PyBuffer_Release(&load);
	if (blocks.buf)
		PyBuffer_Release(&blocks);
	return r;
}

static PyObject *mod_strerror(PyObject *mod, PyObject *args)
{
	(void)mod;
	struct int_arg status = I32_ARG("status");
	if (!PyArg_ParseTuple(args, "O&", int_arg, &status))
		return NULL;
	return PyUnicode_FromString(moe_strerror((int)status.v));
}

static PyObject *mod_host_functions(PyObject *mod, PyObject *noargs)
{
	(void)mod;
	(void)noargs;
	return Py_BuildValue("(NN)", PyLong_FromVoidPtr((void *)(uintptr_t)host_submit),
	                     PyLong_FromVoidPtr((void *)(uintptr_t)host_wait));
}

/* int_arg(name, value, min, max) -> value as an int, or the TypeError / OverflowError every
 * native argument raises: the Python layer's checks word theirs the same way. */
static PyObject *mod_int_arg(PyObject *mod, PyObject *args)
{
	(void)mod;
	const char *name;
	PyObject *value;
	long long min, max;
	if (!PyArg_ParseTuple(args, "sOLL", &name, &value, &min, &max))
		return NULL;
	struct int_arg a = {name, min, max, 0};
	if (!int_arg(value, &a))
		return NULL;
	return PyLong_FromLongLong(a.v);
}

static PyMethodDef module_methods[] = {
    {"int_arg", mod_int_arg, METH_VARARGS,
     "int_arg(name, value, min, max) -> value, or TypeError/OverflowError naming all three."},
    {"_set_error_factory", mod_set_error_factory, METH_O, NULL},
    {"fingerprint", mod_fingerprint, METH_VARARGS,
     "fingerprint(path) -> the model fingerprint (32 hex digits) of a model path."},
    {"strerror", mod_strerror, METH_VARARGS, "strerror(status) -> name."},
    {"placement", mod_placement, METH_VARARGS,
     "placement(load, n_moe_layers, n_experts, blocks, n_blocks, gpu_experts, strategy) -> "
     "(mask bytes, covered)."},
    {"deinterleave", mod_deinterleave, METH_VARARGS,
     "deinterleave(description, pool, out): a leased matrix as GGUF rows into out."},
    {"deinterleave_slice", mod_deinterleave_slice, METH_VARARGS,
     "deinterleave_slice(description, slice, pool, out): a slice's rows into out."},
    {"host_functions", mod_host_functions, METH_NOARGS,
     "(host_submit, host_wait) addresses, for cudaLaunchHostFunc."},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *m)
{
	PyObject *ct = PyType_FromSpec(&channel_spec);
	if (!ct || PyModule_AddObject(m, "Channel", ct) < 0) {
		Py_XDECREF(ct);
		return -1;
	}
	area_type = PyType_FromSpec(&area_spec);
	if (!area_type)
		return -1;
	Py_INCREF(area_type);
	if (PyModule_AddObject(m, "Area", area_type) < 0) {
		Py_DECREF(area_type);
		return -1;
	}
	struct {
		const char *name;
		long v;
	} consts[] = {
	    {"ABI_MAJOR", MOE_ABI_MAJOR},
	    {"ABI_MINOR", MOE_ABI_MINOR},
	    {"DTYPE_F32", MOE_DTYPE_F32},
	    {"DTYPE_F16", MOE_DTYPE_F16},
	    {"DTYPE_BF16", MOE_DTYPE_BF16},
	    {"FWD_DROP_DEFERRED", MOE_FWD_DROP_DEFERRED},
	    {"CONNECT_NOWAIT", MOE_CONNECT_NOWAIT},
	    {"MAX_TOKENS_LIMIT", MOE_MAX_TOKENS_LIMIT},
	    {"FWD_DEFER_COLD", MOE_FWD_DEFER_COLD},
	    {"FWD_DEFER_UNION", MOE_FWD_DEFER_UNION},
	    {"STATS_EXPERTS", MOE_STATS_EXPERTS},
	    {"LEASE_BF16", MOE_LEASE_BF16},
	    {"PLACE_FREQUENCY", MOE_PLACE_FREQUENCY},
	    {"PLACE_UNIFORM", MOE_PLACE_UNIFORM},
	    {"PLACE_FRONT_LOADING", MOE_PLACE_FRONT_LOADING},
	    {"PLACE_BALANCED", MOE_PLACE_BALANCED},
	    {"PLACE_COUNT", MOE_PLACE_COUNT},
	};
	for (size_t i = 0; i < sizeof(consts) / sizeof(consts[0]); i++)
		if (PyModule_AddIntConstant(m, consts[i].name, consts[i].v) < 0)
			return -1;
	PyObject *statuses = PyDict_New();
	if (!statuses)
		return -1;
	for (int s = 0; s >= -64; s--) {
		const char *name = moe_strerror(s);
		if (strcmp(name, "unknown status") == 0)
			continue;
		PyObject *k = PyLong_FromLong(s), *v = PyUnicode_FromString(name);
		if (!k || !v || PyDict_SetItem(statuses, k, v) < 0) {
			Py_XDECREF(k);
			Py_XDECREF(v);
			Py_DECREF(statuses);
			return -1;
		}
		Py_DECREF(k);
		Py_DECREF(v);
	}
	return PyModule_AddObject(m, "STATUS_TEXT", statuses);
}

static PyModuleDef_Slot module_slots[] = {{Py_mod_exec, module_exec}, {0, NULL}};
static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT,
                                        "moe_sidecar._native",
                                        "libmoe_client for Python (moe_sidecar).",
                                        0,
                                        module_methods,
                                        module_slots,
                                        NULL,
                                        NULL,
                                        NULL};

PyMODINIT_FUNC PyInit__native(void)
{
	return PyModuleDef_Init(&module_def);
}
