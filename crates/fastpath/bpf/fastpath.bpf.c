// SPDX-License-Identifier: GPL-2.0
/* Bypass kernel fast path: two sk_skb stream verdict programs that forward PostgreSQL traffic
 * between pooled client and server sockets inside the kernel and return a server to its pool at
 * the end of each transaction.
 *
 *   client skb ─► fp_client: walk messages (count Query/Sync/FunctionCall, spot what only user
 *                 space may handle) ─► linked or take a FREE server ─► redirect to the server
 *   server skb ─► fp_server: walk messages (ReadyForQuery) ─► redirect to the client; at 'Z' 'I'
 *                 with nothing outstanding: unlink, server FREE (or HANDOFF to user-space waiters)
 *
 * Anything else goes to user space with SK_PASS: a client whose gate is closed (the sentinel), a
 * client with no free server, an idle or user-held server. Framing state survives across skbs in
 * the slot: the bytes left of the current message and a stash for a split 5-byte header. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "fastpath.h"

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, FP_CLIENT_SLOTS);
	__type(key, __u64);
	__type(value, __u32);
} fp_clients SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, FP_SERVER_SLOTS);
	__type(key, __u64);
	__type(value, __u32);
} fp_servers SEC(".maps");

/* Socket cookie → slot index. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_SLOTS);
	__type(key, __u64);
	__type(value, __u32);
} fp_slot_of SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FP_SLOTS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct fp_slot);
} fp_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FP_POOLS_MAX);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct fp_pool);
} fp_pools SEC(".maps");

/* Server slots released while clients wait in user space, and parked clients whose gate a pass
 * closed (slot indexes: clients below FP_CLIENT_SLOTS). A record takes 16 bytes; a server or
 * client is announced at most once until user space takes it, so 1 MiB never fills. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} fp_handoffs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fp_counters);
} fp_counters SEC(".maps");

/* One zero the verifier cannot see through (see walk_init). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} fp_opaque_zero SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FP_POOLS_MAX);
	__type(key, __u32);
	__type(value, struct fp_pool_counters);
} fp_pool_counts SEC(".maps");

#define CAS(ptr, old, new) __sync_val_compare_and_swap((ptr), (old), (new))
/* Compare-and-swap retries against user space, which touches a word only on slow paths. */
#define CAS_TRIES 16

static __always_inline struct fp_counters *counters(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&fp_counters, &zero);
}

static __always_inline struct fp_slot *slot_at(__u32 index)
{
	return bpf_map_lookup_elem(&fp_slots, &index);
}

static __always_inline struct fp_slot *slot_of_skb(struct __sk_buff *skb, __u32 *index)
{
	__u64 cookie = bpf_get_socket_cookie(skb);
	__u32 *found = bpf_map_lookup_elem(&fp_slot_of, &cookie);
	if (!found)
		return 0;
	*index = *found;
	return slot_at(*found);
}

/* ---- message walk ------------------------------------------------------------------------ */

struct walk {
	struct __sk_buff *skb;
	__u32 pos;        /* next unread byte of the skb */
	__u32 len;
	__u32 frame_left; /* bytes of the current message still to skip */
	__u8 stash[4];
	__u8 stash_len;
	__u8 flags;
	__u8 unsafe;      /* client: a message only user space may handle */
	__u32 skip;       /* bytes at the skb's start that finish a message begun in an earlier skb */
	__u32 messages;   /* message headers read (a message counts in the skb its header ends in) */
	__u32 requests;   /* client: Query, Sync and FunctionCall messages */
	__u32 ready_count; /* server: ReadyForQuery messages */
	__u8 last_status;  /* server: the status byte of the last one */
	__u32 ready_end;   /* server: the offset just past the last one */
	__u32 bad;           /* a length below 4: the stream is not PostgreSQL */
	__u32 boundary_seen;
	__u32 message_max;   /* client: longer messages go to user space, which refuses them */
};

/* Reads the 5-byte header (and up to 2 body bytes) at w->pos into `out`, after the stashed
 * start of a header split across skbs. Load sizes are constants (a size computed from the
 * position would make the verifier track every position apart and never converge); bytes are
 * composed as one little-endian word, so no pointer is offset by a variable. */
static __always_inline int read_header(struct walk *w, __u8 *out, __u32 *have)
{
	__u32 avail = w->len - w->pos;
	__u32 stashed = w->stash_len & 3;
	__u64 loaded = 0, stash = 0;
	__u32 k;
	if (avail >= 7) {
		if (bpf_skb_load_bytes(w->skb, w->pos, &loaded, 7) < 0)
			return -1;
	} else {
		for (k = 0; k < 6; k++) {
			__u8 byte = 0;
			if (k >= avail)
				break;
			if (bpf_skb_load_bytes(w->skb, w->pos + k, &byte, 1) < 0)
				return -1;
			loaded |= (__u64)byte << (8 * k);
		}
	}
	__builtin_memcpy(&stash, w->stash, 4);
	stash = stashed ? stash & ((1ull << (8 * stashed)) - 1) : 0;
	__u64 word = stash | (loaded << (8 * stashed));
	__builtin_memcpy(out, &word, 8);
	*have = stashed + avail < 7 ? stashed + avail : 7;
	return 0;
}

static __always_inline void stash_rest(struct walk *w, __u8 *header, __u32 have)
{
	__u32 i;
	for (i = 0; i < 4; i++)
		w->stash[i] = i < have ? header[i] : 0;
	w->stash_len = have;
	w->pos = w->len;
}

/* Client messages the kernel must not forward: named statements and portals need the pooler's
 * per-server statement bookkeeping; Terminate ends the session; a message whose body bytes this
 * skb lacks cannot be classified. */
static __always_inline int client_unsafe(__u8 *m, __u32 have)
{
	__u8 tag = m[0];
	if (tag == 'X')
		return 1;
	if (tag != 'P' && tag != 'B' && tag != 'D' && tag != 'C')
		return 0;
	if (have < 7)
		return 1;
	if (tag == 'P')
		return m[5] != 0;        /* statement name */
	if (tag == 'B')
		return m[5] != 0 || m[6] != 0; /* portal name, statement name */
	return m[5] == 'S' && m[6] != 0; /* Describe/Close of a named statement */
}

/* Called with w->pos at the status byte. */
static __always_inline void saw_ready(struct walk *w, __u8 status)
{
	w->ready_count += 1;
	w->last_status = status;
	w->ready_end = w->pos + 1;
}

/* Notes where the first message that starts in this skb begins: bytes before it finish a
 * message the previous skb began (user space must forward them unparsed). */
static __always_inline void note_boundary(struct walk *w)
{
	if (!w->boundary_seen && w->frame_left == 0 && w->stash_len == 0 && !(w->flags & FP_FLAG_STATUS_NEXT)) {
		w->skip = w->pos;
		w->boundary_seen = 1;
	}
}

/* What the shared part of a walk step did. */
enum step {
	STEP_STOP,   /* the skb is walked (or unreadable): stop the loop */
	STEP_DONE,   /* finished (part of) a message body or a split status byte */
	STEP_HEADER, /* `m` holds a message header (and up to 2 body bytes), w->pos is past the header */
	STEP_PARTIAL, /* the skb ends inside a header: `m` holds its first `have` bytes (stashed); stop */
};

/* The part of a step both directions share: finishes the current message or a split
 * ReadyForQuery status byte, or reads the next header into `m`. */
static __always_inline int walk_common(struct walk *w, __u8 *m, __u32 *have, __u32 *length)
{
	note_boundary(w);
	if (w->pos >= w->len)
		return STEP_STOP;
	if (w->flags & FP_FLAG_STATUS_NEXT) {
		__u8 status = 0;
		if (bpf_skb_load_bytes(w->skb, w->pos, &status, 1) < 0) {
			w->bad = 1;
			return STEP_STOP;
		}
		w->flags &= ~FP_FLAG_STATUS_NEXT;
		saw_ready(w, status);
		w->pos += 1;
		return STEP_DONE;
	}
	if (w->frame_left) {
		__u32 avail = w->len - w->pos;
		__u32 take = w->frame_left < avail ? w->frame_left : avail;
		w->frame_left -= take;
		w->pos += take;
		return STEP_DONE;
	}
	__u32 stashed = w->stash_len & 3;
	if (read_header(w, m, have) < 0) {
		w->bad = 1;
		return STEP_STOP;
	}
	if (*have < 5) {
		stash_rest(w, m, *have);
		return STEP_PARTIAL;
	}
	*length = ((__u32)m[1] << 24) | ((__u32)m[2] << 16) | ((__u32)m[3] << 8) | m[4];
	if (*length < 4) {
		w->bad = 1;
		return STEP_STOP;
	}
	w->stash_len = 0;
	w->messages += 1;
	w->pos += 5 - stashed;
	w->frame_left = *length - 4;
	return STEP_HEADER;
}

/* A server message that changes session state beyond the transaction: ParameterStatus (a SET
 * of a reported parameter) or the CommandComplete of SET ("SET" alone: 8 bytes, unlike
 * "SELECT n"), LISTEN, LOAD, PREPARE or CREATE. A CommandComplete whose tag this skb lacks
 * counts too: closing a clean server costs a reconnect, keeping a dirty one leaks state. */
static __always_inline int server_state_change(__u8 *m, __u32 have, __u32 length)
{
	if (m[0] == 'S')
		return 1;
	if (m[0] != 'C')
		return 0;
	if (have < 7)
		return 1;
	__u8 a = m[5], b = m[6];
	return (a == 'S' && b == 'E' && length == 8) || (a == 'L' && (b == 'I' || b == 'O')) ||
	       (a == 'P' && b == 'R') || (a == 'C' && b == 'R');
}

/* One bpf_loop iteration on a server skb. 1 stops the loop. */
static long walk_server_step(__u32 i, void *data)
{
	struct walk *w = data;
	__u8 m[8] = {};
	__u32 have = 0, length = 0;
	int step = walk_common(w, m, &have, &length);
	if (step != STEP_HEADER)
		return step != STEP_DONE;
	if (m[0] == 'Z' && length == 5) {
		w->frame_left = 0;
		if (w->pos >= w->len) {
			w->flags |= FP_FLAG_STATUS_NEXT;
			return 1;
		}
		saw_ready(w, m[5]);
		w->pos += 1;
	} else if (server_state_change(m, have, length)) {
		w->flags |= FP_FLAG_DIRTY;
	}
	return 0;
}

/* Type bytes a logged-in client may send that the kernel may forward (Terminate is in
 * client_unsafe). */
#define TAG_BIT(t) (1ull << ((t) - 64))
#define CLIENT_TAGS (TAG_BIT('B') | TAG_BIT('C') | TAG_BIT('D') | TAG_BIT('E') | TAG_BIT('F') | \
		     TAG_BIT('H') | TAG_BIT('P') | TAG_BIT('Q') | TAG_BIT('S') | TAG_BIT('c') | \
		     TAG_BIT('d') | TAG_BIT('f'))

/* 64 <= tag < 128 and in CLIENT_TAGS, in bit operations only: with branches here (and in the
 * step below) fp_client's verification took 2-3 times as many instructions. */
static __always_inline int client_tag_known(__u8 tag)
{
	return (tag >> 6) == 1 && ((CLIENT_TAGS >> (tag & 63)) & 1);
}

/* One bpf_loop iteration on a client skb. 1 stops the loop. A header with an unknown type (a
 * StartupPacket or SSLRequest sent again: type byte 0) or a length over the client's limit,
 * wherever it starts, sends the skb to user space, which refuses it at once as PostgreSQL does
 * (FATAL 08P01). Forwarded, the server would refuse an unknown type too, but after answering
 * the requests before it: their last ReadyForQuery releases the link, so the server's FATAL
 * reaches no client, and the kernel, having taken the header for a message of kilobytes, would
 * frame the client's stream wrongly from there. The type byte of a header the skb ends in
 * counts too: once forwarded, the next skb cannot take it back. */
static long walk_client_step(__u32 i, void *data)
{
	struct walk *w = data;
	__u8 m[8] = {};
	__u32 have = 0, length = 0;
	int step = walk_common(w, m, &have, &length);
	if (step == STEP_PARTIAL) {
		w->unsafe |= !client_tag_known(m[0]);
		return 1;
	}
	if (step != STEP_HEADER)
		return step == STEP_STOP;
	w->unsafe |= client_unsafe(m, have) | !client_tag_known(m[0]) | (length > w->message_max);
	if (m[0] == 'Q' || m[0] == 'S' || m[0] == 'F')
		w->requests += 1;
	return 0;
}

/* Walks every message of the skb; `skip` is the whole skb when no message starts in it. One
 * callback per direction, so each program's verification explores only its own. */
#define walk_all(w, step)                            \
	do {                                         \
		bpf_loop(FP_WALK_MAX, step, (w), 0); \
		if (!(w)->boundary_seen)             \
			(w)->skip = (w)->len;        \
	} while (0)

/* Starts a walk from the slot's framing state. The counters start from a zero read from a map:
 * a zero the verifier knows would keep apart, at every later instruction, the states where a
 * counter was never incremented (its stack bytes known zero) from those where it was, and
 * fp_client would run out of verifier instructions. -1: the map is missing (never happens). */
static __always_inline int walk_init(struct walk *w, struct __sk_buff *skb, struct fp_slot *s)
{
	__u32 zero_key = 0;
	__u32 *zero = bpf_map_lookup_elem(&fp_opaque_zero, &zero_key);
	if (!zero)
		return -1;
	w->messages = *zero;
	w->requests = *zero;
	w->ready_end = *zero;
	w->skb = skb;
	w->len = skb->len;
	w->frame_left = s->frame_left;
	__builtin_memcpy(w->stash, s->stash, 4);
	w->stash_len = s->stash_len;
	w->flags = s->flags;
	w->message_max = s->message_max;
	return 0;
}

static __always_inline void walk_commit(struct walk *w, struct fp_slot *s)
{
	s->frame_left = w->frame_left;
	__builtin_memcpy(s->stash, w->stash, 4);
	s->stash_len = w->stash_len;
	s->flags = w->flags;
}

/* ---- servers ----------------------------------------------------------------------------- */

/* What answer_requests did: nothing, released the link, released a link a client queued behind. */
#define ANSWER_RELEASED 1
#define ANSWER_RELEASED_CLOSED 3
#define ANSWER_RELEASED_QUEUEABLE 5

/* The skb's ReadyForQuery messages answer as many requests; when the last one says idle and
 * answers the last outstanding request, the link is released, in the same compare-and-swap
 * that a concurrent request from the client would change (then the link stays). */
static __always_inline int answer_requests(struct fp_slot *c, __u32 server_index, struct walk *w)
{
	int tries;
	if (w->ready_count == 0)
		return 0;
	for (tries = 0; tries < CAS_TRIES; tries++) {
		__u64 link = c->link;
		__u32 outstanding = FP_LINK_OUTSTANDING(link);
		if (FP_LINK_PEER(link) != server_index + 1)
			return 0;
		__u32 answered = w->ready_count < outstanding ? w->ready_count : outstanding;
		int release = w->last_status == 'I' && answered == outstanding;
		__u64 next = release ? 0 : link - answered;
		if (CAS(&c->link, link, next) == link)
			return !release ? 0 : (link & FP_LINK_CLOSED)    ? ANSWER_RELEASED_CLOSED
					     : (link & FP_LINK_QUEUEABLE) ? ANSWER_RELEASED_QUEUEABLE
									  : ANSWER_RELEASED;
	}
	return 0;
}

/* Announces a server slot user space must take on the handoff ring. With many clients waiting
 * (fp_pool.quiet_from) no wake-up: user space drains the ring whenever a passed request reaches
 * its queue, and on a 1 ms tick while any pool is that busy. Otherwise a forced wake-up, so
 * records left by a quiet spell never wait for the next busy one. */
static __always_inline void announce_handoff(__u32 index, struct fp_pool *pool, struct fp_counters *n)
{
	__u32 waiting = pool ? pool->waiters : 0, from = pool ? pool->quiet_from : 0;
	int quiet = from && waiting >= from && waiting != FP_WAITERS_PAUSED;
	if (n && quiet)
		n->handoffs_quiet++;
	bpf_ringbuf_output(&fp_handoffs, &index, sizeof(index), quiet ? BPF_RB_NO_WAKEUP : BPF_RB_FORCE_WAKEUP);
}

/* Gives a released server back: to the kernel's free set, or to user space when clients wait
 * there (FIFO order is theirs) or its session state changed (user space closes it). The second
 * look at `waiters` closes the race with a client that queued between the first look and the
 * store. */
static __always_inline void server_give_back(struct fp_slot *s, __u32 index, struct fp_counters *n, int takeable)
{
	__u32 pool_index = s->pool;
	struct fp_pool *pool = bpf_map_lookup_elem(&fp_pools, &pool_index);
	s->peer = FP_NO_PEER;
	if (pool && pool->waiters == 0 && !(s->flags & (FP_FLAG_DIRTY | FP_FLAG_QUEUE_BROKEN))) {
		/* An atomic exchange, so the store is ordered before the second look at `waiters`. */
		__sync_lock_test_and_set(&s->owner, FP_OWNER_FREE);
		if (pool->waiters == 0 || CAS(&s->owner, FP_OWNER_FREE, FP_OWNER_HANDOFF) != FP_OWNER_FREE)
			return;
	} else {
		if (takeable && pool && pool->queue_behind && !(s->flags & (FP_FLAG_DIRTY | FP_FLAG_QUEUE_BROKEN)))
			s->flags |= FP_FLAG_TAKEABLE;
		s->owner = FP_OWNER_HANDOFF;
	}
	if (n)
		n->handoffs++;
	announce_handoff(index, pool, n);
}

/* Counts where a walked skb's bytes and requests (or answers) went, in its pool's per-CPU counters (atomic
 * adds: a softirq verdict can interrupt a process-context one on the same CPU). */
static __always_inline void count_walk(__u32 pool_index, struct walk *w, int answers, int forwarded)
{
	struct fp_pool_counters *p = bpf_map_lookup_elem(&fp_pool_counts, &pool_index);
	if (!p)
		return;
	__u64 *bytes, *messages, *count;
	if (answers) {
		bytes = forwarded ? &p->answer_bytes_forwarded : &p->answer_bytes_passed;
		messages = forwarded ? &p->answer_messages_forwarded : &p->answer_messages_passed;
		count = forwarded ? &p->answers_forwarded : &p->answers_passed;
	} else {
		bytes = forwarded ? &p->request_bytes_forwarded : &p->request_bytes_passed;
		messages = forwarded ? &p->request_messages_forwarded : &p->request_messages_passed;
		count = forwarded ? &p->requests_forwarded : &p->requests_passed;
	}
	__sync_fetch_and_add(bytes, w->len);
	__sync_fetch_and_add(count, answers ? w->ready_count : w->requests);
	__sync_fetch_and_add(messages, w->messages);
}

static __always_inline void count_transaction(__u32 pool_index)
{
	struct fp_pool_counters *p = bpf_map_lookup_elem(&fp_pool_counts, &pool_index);
	if (p)
		__sync_fetch_and_add(&p->transactions, 1);
}

/* A server skb user space receives: an idle server's unprompted message, a server user space
 * holds, or an answer whose client is gone. The walk keeps counting messages across skbs; the
 * dirty flag belongs to kernel links only, so it is left as it was. */
static __always_inline int server_pass(struct fp_slot *s, struct walk *w)
{
	w->flags = (w->flags & ~FP_FLAG_DIRTY) | (s->flags & FP_FLAG_DIRTY);
	walk_commit(w, s);
	count_walk(s->pool, w, 1, 0);
	return SK_PASS;
}

/* ---- queue behind ------------------------------------------------------------------------ */

/* This skb answers the last request of a link a client queued behind, but the server cannot
 * switch cleanly: bytes after the last ReadyForQuery, or more ReadyForQuery messages than
 * requests, are the queued client's (one skb cannot be split between two clients), or the
 * transaction did not end idle (never for the statements user space lets a client queue
 * behind; the queued request would run inside it). */
static __always_inline int queue_cannot_switch(struct fp_slot *c, struct walk *w)
{
	__u64 link = c->link;
	__u32 outstanding = FP_LINK_OUTSTANDING(link);
	if (!(link & FP_LINK_CLOSED) || w->ready_count < outstanding)
		return 0;
	return w->ready_count > outstanding || w->ready_end != w->len || w->last_status != 'I';
}

/* The queue behind this server broke: its bytes go up, the current client (if any) is unlinked,
 * and user space wakes that client and the queued one with an error and closes the server. */
static __always_inline int queue_broken(struct fp_slot *s, struct fp_slot *c, __u32 index, struct walk *w,
					struct fp_counters *n)
{
	if (c)
		__sync_lock_test_and_set(&c->link, 0);
	else
		s->peer = FP_NO_PEER;
	if (n)
		n->queue_broken++;
	s->flags |= FP_FLAG_QUEUE_BROKEN;
	s->owner = FP_OWNER_HANDOFF;
	announce_handoff(index, 0, 0);
	count_walk(s->pool, w, 1, 0);
	return SK_PASS;
}

/* The transaction ahead of the queued client ended at a ReadyForQuery at the skb's end: the
 * server is the queued client's now (its requests are already in the server's stream). -1: the
 * queued client left meanwhile (its slot's link no longer names this server); its request's
 * answer will still come, so the caller must not free the server: it goes up, marked broken. */
static __always_inline int serve_queued(struct fp_slot *s, __u32 index)
{
	__u32 queued = (__u32)s->gate;
	s->gate = 0;
	struct fp_slot *b = queued ? slot_at(queued - 1) : 0;
	if (b) {
		/* An exchange: ordered before the look at the link, which user space clears (also
		 * with an exchange) before it looks at `peer` when the queued client leaves. */
		__sync_lock_test_and_set(&s->peer, queued - 1);
		if (FP_LINK_PEER(b->link) == index - FP_CLIENT_SLOTS + 1)
			return 0;
	}
	s->peer = FP_NO_PEER;
	s->flags |= FP_FLAG_QUEUE_BROKEN;
	return -1;
}

SEC("sk_skb/stream_verdict")
int fp_server(struct __sk_buff *skb)
{
	struct fp_counters *n = counters();
	struct walk w = {};
	__u32 index = 0;
	struct fp_slot *s = slot_of_skb(skb, &index);
	if (n)
		n->server_runs++;
	if (!s)
		return SK_PASS;
	if (walk_init(&w, skb, s) < 0)
		return SK_PASS;
	walk_all(&w, walk_server_step);
	struct fp_slot *c = 0;
	if (s->owner == FP_OWNER_KERNEL && s->peer != FP_NO_PEER)
		c = slot_at(s->peer);
	if (!c) {
		if (n)
			n->passes_idle_server++;
		return server_pass(s, &w);
	}
	walk_commit(&w, s);
	if (queue_cannot_switch(c, &w))
		return queue_broken(s, c, index, &w, n);
	int released = answer_requests(c, index - FP_CLIENT_SLOTS, &w);
	__u64 cookie = c->cookie;
	__sync_fetch_and_add(&c->redirected, w.len);
	long verdict = bpf_sk_redirect_hash(skb, &fp_clients, &cookie, 0);
	if (released && n)
		n->transactions++;
	if (verdict != SK_PASS) {
		/* The client is gone: the bytes go to user space with the server, which decides. */
		__sync_fetch_and_add(&c->redirected, -(__u64)w.len);
		if (n)
			n->redirect_failures++;
		if (released == ANSWER_RELEASED_CLOSED || s->gate)
			return queue_broken(s, 0, index, &w, n);
		s->peer = FP_NO_PEER;
		s->owner = FP_OWNER_HANDOFF;
		announce_handoff(index, 0, 0);
		count_walk(s->pool, &w, 1, 0);
		return SK_PASS;
	}
	if (n)
		n->bytes_to_clients += w.len;
	count_walk(s->pool, &w, 1, 1);
	if (released) {
		count_transaction(s->pool);
		if (released != ANSWER_RELEASED_CLOSED || serve_queued(s, index) < 0)
			server_give_back(s, index, n, released == ANSWER_RELEASED_QUEUEABLE);
	}
	return SK_PASS;
}

/* ---- clients ----------------------------------------------------------------------------- */

/* Closes the gate (if open) and counts the skb's bytes as passed to user space. The pass that
 * closes a parked client's gate wakes its session through the ring (its socket is in no
 * reactor); user space marks it parked before it opens the gate, so the CAS orders the look. */
static __always_inline int client_pass(struct fp_slot *c, __u32 index, struct __sk_buff *skb, __u32 skip)
{
	int tries;
	for (tries = 0; tries < CAS_TRIES; tries++) {
		__u64 gate = c->gate;
		if (gate & FP_GATE_FAST)
			c->pass_skip = skip;
		__u64 next = (gate & ~FP_GATE_FAST) + ((__u64)skb->len << 1);
		if (CAS(&c->gate, gate, next) != gate)
			continue;
		if ((gate & FP_GATE_FAST) && c->owner == FP_CLIENT_PARKED) {
			struct fp_counters *n = counters();
			if (n)
				n->passes_announced++;
			bpf_ringbuf_output(&fp_handoffs, &index, sizeof(index), BPF_RB_FORCE_WAKEUP);
		}
		return SK_PASS;
	}
	/* User space keeps changing the gate: it is re-arming; drop rather than reorder. The client
	 * sees its request unanswered and user space sees the gate, so this is never silent. */
	return SK_DROP;
}

/* Takes a free server of the pool with the client's parameter values, unless clients already
 * wait for one in user space: then, with queue_behind, only a server handed off to them that is
 * FP_FLAG_TAKEABLE (user space finds its ring record stale). */
static __always_inline int take_server(__u32 pool_index, __u32 client_index, __u16 params, __u32 *server_index,
				       struct fp_counters *n)
{
	struct fp_pool *pool = bpf_map_lookup_elem(&fp_pools, &pool_index);
	__u32 i;
	if (!pool || params == FP_PARAMS_UNKNOWN)
		return -1;
	__u32 waiting = pool->waiters != 0;
	if (waiting && (!pool->queue_behind || pool->waiters == FP_WAITERS_PAUSED))
		return -1;
	__u32 owner = waiting ? FP_OWNER_HANDOFF : FP_OWNER_FREE;
	__u32 count = pool->servers;
	if (count > FP_POOL_SERVERS_MAX)
		count = FP_POOL_SERVERS_MAX;
	for (i = 0; i < FP_POOL_SERVERS_MAX; i++) {
		if (i >= count)
			break;
		__u32 index = FP_CLIENT_SLOTS + pool_index * FP_POOL_SERVERS_MAX + i;
		struct fp_slot *s = slot_at(index);
		if (!s || s->owner != owner || s->params != params || (waiting && !(s->flags & FP_FLAG_TAKEABLE)))
			continue;
		if (CAS(&s->owner, owner, FP_OWNER_KERNEL) != owner)
			continue;
		if (waiting) {
			s->flags &= ~FP_FLAG_TAKEABLE;
			if (n)
				n->taken_from_handoff++;
		}
		s->peer = client_index;
		*server_index = pool_index * FP_POOL_SERVERS_MAX + i;
		return 0;
	}
	return -1;
}

/* Adds this skb's requests to the link; a link released meanwhile reads as "no server" (-1), a
 * link a client queued behind as "user space" (-2: it takes the bytes once the link ends). The
 * kernel wrote these bytes, so the link is no longer one to queue behind. */
static __always_inline int add_requests(struct fp_slot *c, __u32 requests, __u32 *server_index)
{
	int tries;
	for (tries = 0; tries < CAS_TRIES; tries++) {
		__u64 link = c->link;
		if (FP_LINK_PEER(link) == 0)
			return -1;
		if (link & FP_LINK_CLOSED)
			return -2;
		if (CAS(&c->link, link, (link + requests) & ~FP_LINK_QUEUEABLE) == link) {
			*server_index = FP_LINK_PEER(link) - 1;
			return 0;
		}
	}
	return -1;
}

/* Upper-cases ASCII letters (and folds other bytes the same way on both sides of a compare). */
#define FOLD 0xdfdfdfdfdfdfdfdfull
#define KEYWORD(word, text, n) ((((word) ^ (text)) & FOLD & ((n) == 8 ? ~0ull : (1ull << (8 * (n))) - 1)) == 0)

/* SQL text whose first word may change session state (SET, RESET, LISTEN, LOAD, PREPARE,
 * DECLARE, CREATE) or that starts with a comment: user space's session-state guard must see
 * it (and track what a SET changes). `text` is the little-endian first 8 bytes after any
 * leading blanks. The server program's dirty flag catches what slips past (a statement after
 * a ';' or a message that starts mid-skb). */
static __always_inline int sql_may_change_state(__u64 text)
{
	return KEYWORD(text, 0x544553ull, 3) || KEYWORD(text, 0x5445534552ull, 5) ||
	       KEYWORD(text, 0x4e455453494cull, 6) || KEYWORD(text, 0x44414f4cull, 4) ||
	       KEYWORD(text, 0x45524150455250ull, 7) || KEYWORD(text, 0x4552414c434544ull, 7) ||
	       KEYWORD(text, 0x455441455243ull, 6) || (text & 0xffff) == 0x2d2d || (text & 0xffff) == 0x2a2f;
}

/* The first 8 bytes of SQL text at `offset`, after up to 7 leading blanks (8 blanks: all ones,
 * which counts as a comment-like start and goes to user space). */
static __always_inline __u64 sql_start(struct __sk_buff *skb, __u32 offset)
{
	__u8 text[16] = {};
	__u32 avail = skb->len > offset ? skb->len - offset : 0;
	__u32 k, blanks = 0;
	if (avail >= 16)
		bpf_skb_load_bytes(skb, offset, text, 16);
	else if (avail >= 8)
		bpf_skb_load_bytes(skb, offset, text, 8);
	else if (avail >= 4)
		bpf_skb_load_bytes(skb, offset, text, 4);
	for (k = 0; k < 8; k++) {
		__u8 b = text[k];
		if (blanks == k && (b == ' ' || b == '\t' || b == '\n' || b == '\r'))
			blanks = k + 1;
	}
	if (blanks == 8)
		return 0x2d2d;
	__u64 low, high;
	__builtin_memcpy(&low, text, 8);
	__builtin_memcpy(&high, text + 8, 8);
	return blanks ? (low >> (8 * blanks)) | (high << (64 - 8 * blanks)) : low;
}

/* A Query or unnamed Parse that starts the skb and whose SQL may change session state: user
 * space must see it. Checked here, outside the walk, because any further state in the walk's
 * loop costs the verifier its pruning. (Unknown types and over-long messages the walk finds
 * wherever they start.) */
static __always_inline int client_first_for_user_space(struct __sk_buff *skb, struct fp_slot *c)
{
	__u8 header[5], name = 1;
	if (c->frame_left || c->stash_len || bpf_skb_load_bytes(skb, 0, header, 5) < 0)
		return 0;
	__u8 tag = header[0];
	if (tag == 'Q')
		return sql_may_change_state(sql_start(skb, 5));
	if (tag == 'P' && bpf_skb_load_bytes(skb, 5, &name, 1) == 0 && name == 0)
		return sql_may_change_state(sql_start(skb, 6));
	return 0;
}

/* Passes a client skb to user space, counting its bytes and messages there. */
static __always_inline int client_pass_counted(struct fp_slot *c, __u32 index, struct __sk_buff *skb,
					       struct walk *w)
{
	count_walk(c->pool, w, 0, 0);
	return client_pass(c, index, skb, w->skip);
}

static __always_inline int client_pass_no_server(struct fp_slot *c, __u32 index, struct __sk_buff *skb,
						 struct walk *w, struct fp_counters *n)
{
	if (n)
		n->passes_no_server++;
	return client_pass_counted(c, index, skb, w);
}

/* Queues the client's requests behind one server of its pool whose link is queueable: claims
 * the server's queue place, closes the link ahead (so nothing joins it after these requests),
 * then links the client, which the server's program makes current at the 'Z' 'I' that ends the
 * link ahead. The caller redirects the bytes at once: they follow every byte of the link ahead
 * in the server's stream, because user space wrote those before it made the link queueable. */
static __always_inline int queue_behind(struct fp_slot *c, __u32 client_index, __u32 requests, __u32 *server_index)
{
	__u32 pool_index = c->pool, i;
	struct fp_pool *pool = bpf_map_lookup_elem(&fp_pools, &pool_index);
	if (!pool || !pool->queue_behind || pool->waiters == FP_WAITERS_PAUSED || c->params == FP_PARAMS_UNKNOWN)
		return -1;
	__u32 count = pool->servers;
	if (count > FP_POOL_SERVERS_MAX)
		count = FP_POOL_SERVERS_MAX;
	for (i = 0; i < FP_POOL_SERVERS_MAX; i++) {
		if (i >= count)
			break;
		__u32 server = pool_index * FP_POOL_SERVERS_MAX + i;
		struct fp_slot *s = slot_at(FP_CLIENT_SLOTS + server);
		if (!s || s->owner != FP_OWNER_KERNEL || s->gate || s->params != c->params || s->peer >= FP_CLIENT_SLOTS)
			continue;
		struct fp_slot *a = slot_at(s->peer);
		if (!a)
			continue;
		__u64 link = a->link;
		if (FP_LINK_PEER(link) != server + 1 || !(link & FP_LINK_QUEUEABLE) || (link & FP_LINK_CLOSED) ||
		    FP_LINK_OUTSTANDING(link) == 0)
			continue;
		if (CAS(&s->gate, 0, client_index + 1) != 0)
			continue;
		if (CAS(&a->link, link, link | FP_LINK_CLOSED) != link) {
			s->gate = 0;
			continue;
		}
		c->link = ((__u64)(server + 1) << 32) | requests;
		*server_index = server;
		return 0;
	}
	return -1;
}

SEC("sk_skb/stream_verdict")
int fp_client(struct __sk_buff *skb)
{
	struct fp_counters *n = counters();
	struct walk w = {};
	__u32 index = 0, server = 0;
	struct fp_slot *c = slot_of_skb(skb, &index);
	if (n)
		n->client_runs++;
	if (!c)
		return SK_PASS;
	int gate_open = c->gate & FP_GATE_FAST;
	int first_for_user_space = gate_open && client_first_for_user_space(skb, c);
	/* Walked whatever the verdict, so the counters see every message; the framing carries on
	 * through a passed episode until user space re-arms (which resets it at a boundary). */
	if (walk_init(&w, skb, c) < 0)
		return SK_PASS;
	walk_all(&w, walk_client_step);
	walk_commit(&w, c);
	if (!gate_open) {
		if (n)
			n->passes_slow++;
		w.skip = 0;
		return client_pass_counted(c, index, skb, &w);
	}
	if (first_for_user_space) {
		if (n)
			n->passes_unsafe++;
		w.skip = 0;
		return client_pass_counted(c, index, skb, &w);
	}
	if (w.unsafe || w.bad) {
		if (n)
			n->passes_unsafe++;
		return client_pass_counted(c, index, skb, &w);
	}
	int added = add_requests(c, w.requests, &server);
	if (added == -2) {
		if (n)
			n->passes_no_server++;
		return client_pass_counted(c, index, skb, &w);
	}
	if (added < 0) {
		if (w.skip)
			return client_pass_no_server(c, index, skb, &w, n);
		if (take_server(c->pool, index, c->params, &server, n) == 0) {
			c->link = ((__u64)(server + 1) << 32) | w.requests;
		} else if (w.requests == 0 || queue_behind(c, index, w.requests, &server) < 0) {
			return client_pass_no_server(c, index, skb, &w, n);
		} else if (n) {
			n->queued++;
		}
	}
	struct fp_slot *s = slot_at(FP_CLIENT_SLOTS + server);
	if (!s)
		return client_pass_counted(c, index, skb, &w);
	__u64 cookie = s->cookie;
	__sync_fetch_and_add(&s->redirected, w.len);
	long verdict = bpf_sk_redirect_hash(skb, &fp_servers, &cookie, 0);
	if (verdict != SK_PASS) {
		__sync_fetch_and_add(&s->redirected, -(__u64)w.len);
		if (n)
			n->redirect_failures++;
		return client_pass_counted(c, index, skb, &w);
	}
	if (n)
		n->bytes_to_servers += w.len;
	count_walk(c->pool, &w, 0, 1);
	return SK_PASS;
}

char LICENSE[] SEC("license") = "GPL";
