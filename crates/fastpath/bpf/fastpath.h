/* The ABI between the fast-path programs (fastpath.bpf.c) and the pooler (crates/fastpath/src/abi.rs).
 * Every struct here is mirrored in Rust with #[repr(C)] and compile-time size/offset assertions:
 * change both together. */
#ifndef BYPASS_FASTPATH_H
#define BYPASS_FASTPATH_H

#include <linux/types.h>

/* Slots: clients first, then a fixed range of server slots per pool. */
#define FP_CLIENT_SLOTS 32768
#define FP_POOLS_MAX 64
#define FP_POOL_SERVERS_MAX 64
#define FP_SERVER_SLOTS (FP_POOLS_MAX * FP_POOL_SERVERS_MAX)
#define FP_SLOTS (FP_CLIENT_SLOTS + FP_SERVER_SLOTS)
#define FP_SOCKETS_MAX FP_SLOTS
#define FP_NO_PEER 0xffffffffu

/* Messages walked per skb at most (bpf_loop bound); 5-byte minimum messages in a 4 MiB skb. */
#define FP_WALK_MAX (1u << 20)

/* fp_slot.gate, clients only: FAST set = the kernel forwards this client's bytes; clear = every
 * byte goes to user space (the slow-path sentinel). Bits 1..63 count bytes passed to user space,
 * so user space can re-arm only when it has read every one of them (compare-and-swap). */
#define FP_GATE_FAST 1ull

/* fp_slot.link, clients only: peer server slot + 1 in the high half (0 = none), requests
 * (Query, Sync, FunctionCall) sent and not yet answered by ReadyForQuery in the low half. One
 * word, so "add a request" and "release at the last ReadyForQuery" cannot interleave. */
#define FP_LINK_PEER(link) ((__u32)((link) >> 32))
#define FP_LINK_OUTSTANDING(link) ((__u32)(link) & 0x3fffffffu)
/* Queue behind (fp_pool.queue_behind): user space wrote every outstanding request of this link
 * itself (its send returned), each a single autocommit statement, so the server's stream holds
 * all of them and the transaction ends with their answers: one client may queue behind it. */
#define FP_LINK_QUEUEABLE (1ull << 30)
/* A client queued behind this link's server: no request joins the link any more (it would land
 * after the queued client's). Released links carry neither bit. */
#define FP_LINK_CLOSED (1ull << 31)

/* fp_slot.owner of a client: user space parked its socket out of its reactor while the gate
 * is open (every forwarded byte would wake it for nothing), so the pass that closes the gate
 * announces the client on the handoff ring instead. 0: not parked. */
#define FP_CLIENT_PARKED 1

/* fp_slot.owner, servers only. */
enum fp_owner {
	FP_OWNER_ABSENT = 0,  /* no server in this slot */
	FP_OWNER_FREE = 1,    /* idle, in the kernel's pool: the first client to start takes it */
	FP_OWNER_KERNEL = 2,  /* linked to a client by the kernel */
	FP_OWNER_USER = 3,    /* user space holds it */
	FP_OWNER_HANDOFF = 4, /* released with clients waiting in user space: announced on the ring */
};

/* fp_slot.flags: framing state that does not fit the counters. */
#define FP_FLAG_STATUS_NEXT 1 /* a ReadyForQuery header ended the last skb: its status byte is next */
/* Servers: session state changed while the kernel linked it (a ParameterStatus, or a
 * CommandComplete of SET, LISTEN, LOAD, PREPARE or CREATE): released to user space, which
 * closes it, never into the free set. */
#define FP_FLAG_DIRTY 2
/* Servers: the queue behind broke (the answer that ended the current transaction shared an skb
 * with the queued client's, or the current client was gone): user space wakes both clients'
 * sessions with an error and closes the server. */
#define FP_FLAG_QUEUE_BROKEN 4
/* Servers handed off (FP_OWNER_HANDOFF) at the end of a link user space wrote and made
 * queueable: with fp_pool.queue_behind a client whose request finds no free server may take it
 * in the kernel before user space does. A server released by a link the kernel made never is,
 * so servers alternate between the clients queued in user space and the kernel's arrivals. */
#define FP_FLAG_TAKEABLE 8

/* fp_slot.params: which tracked parameter values (client_encoding, DateStyle, TimeZone, ...) a
 * client wants or a server has, as an id user space interns per pool. The kernel links a client
 * only to a FREE server with the same id; UNKNOWN matches nothing. */
#define FP_PARAMS_UNKNOWN 0xffff

/* Per-socket state, one cache line, in an mmap-able array shared with user space. */
struct fp_slot {
	__u64 link;       /* clients: see FP_LINK_*  */
	__u64 gate;       /* clients: see FP_GATE_FAST; servers: the client queued behind (slot + 1), 0: none */
	__u64 cookie;     /* the socket's cookie (its key in fp_clients / fp_servers) */
	__u64 redirected; /* bytes the kernel redirected into this socket */
	__u32 frame_left; /* bytes of the current message still to come */
	__u32 pool;       /* pool index (clients and servers) */
	__u32 peer;       /* servers: the linked client's slot, FP_NO_PEER when none */
	__u32 owner;      /* servers: enum fp_owner */
	__u8 stash[4];    /* start of a message header split across skbs */
	__u8 stash_len;
	__u8 flags;
	__u16 params;     /* see FP_PARAMS_UNKNOWN */
	__u32 pass_skip;  /* clients: bytes at the start of the first passed skb that finish a message the kernel forwarded */
	__u32 message_max; /* clients: longer messages go to user space, which refuses them */
};

/* fp_pool.waiters of a paused pool: every server goes back to user space at once. */
#define FP_WAITERS_PAUSED 0xffffffffu

/* Per pool, in an mmap-able array. */
struct fp_pool {
	__u32 waiters; /* clients queued in user space: the kernel leaves free servers to them */
	__u32 servers; /* server slots in use in this pool's range (scan bound) */
	/* From this many waiters on, a handoff does not wake user space: with that many clients
	 * queued, user space drains the ring on its next passed request (or its 1 ms tick), and a
	 * wake-up (irq_work, a self-IPI) costs more than the wait. 0: every handoff wakes. */
	__u32 quiet_from;
	/* 1: a client with no free server may queue its request behind a server whose link is
	 * FP_LINK_QUEUEABLE (redirected at once; the server switches to it at the 'Z' 'I'). */
	__u32 queue_behind;
};

/* Per pool and per CPU: where the bytes of the pool's pooled sockets went. "Forwarded": the
 * kernel redirected them from socket to socket, user space never copied them. "Passed": the
 * kernel handed them up to user space (SK_PASS), which read them and relayed (or refused) them.
 * Requests run client to server, answers server to client (an idle server's unprompted
 * messages count as passed answers). Messages count in the skb their header ends in; requests
 * are the messages that ask for a ReadyForQuery (Query, Sync, FunctionCall), answers the
 * ReadyForQuery messages. SHOW STATS, /metrics and `bypass fastpath status` sum the CPUs. */
struct fp_pool_counters {
	__u64 transactions; /* released in the kernel */
	__u64 request_bytes_forwarded;
	__u64 request_messages_forwarded;
	__u64 requests_forwarded;
	__u64 request_bytes_passed;
	__u64 request_messages_passed;
	__u64 requests_passed;
	__u64 answer_bytes_forwarded;
	__u64 answer_messages_forwarded;
	__u64 answers_forwarded;
	__u64 answer_bytes_passed;
	__u64 answer_messages_passed;
	__u64 answers_passed;
};

/* Per-CPU counters. */
struct fp_counters {
	__u64 client_runs;
	__u64 server_runs;
	__u64 bytes_to_servers;
	__u64 bytes_to_clients;
	__u64 transactions;
	__u64 passes_no_server;
	__u64 passes_unsafe;
	__u64 passes_slow;
	__u64 passes_idle_server;
	__u64 handoffs;
	__u64 redirect_failures;
	__u64 handoffs_quiet; /* handoffs announced without waking user space (see fp_pool.quiet_from) */
	__u64 queued;         /* requests queued behind a busy server (fp_pool.queue_behind) */
	__u64 queue_broken;   /* queues that broke (FP_FLAG_QUEUE_BROKEN) */
	__u64 taken_from_handoff; /* handed-off servers a client took in the kernel (FP_FLAG_TAKEABLE) */
	__u64 passes_announced;   /* passes that closed a parked client's gate, announced on the ring */
};

/* ---- Workload mirroring (mirror.bpf.c, crates/fastpath/src/mirror.rs) ----------------------- */

/* Mirrored flows at most, and the skb mark that tags a clone on its way back into ingress. */
#define FP_MIRROR_FLOWS_MAX 4096
#define FP_MIRROR_MARK 0x4d495252u /* "MIRR" */

/* A mirrored client flow as the client's segments carry it (all fields in network order):
 * client address and port → pooler address and port. */
struct fp_mirror_flow {
	__u32 client_ip;
	__u32 pooler_ip;
	__u16 client_port;
	__u16 pooler_port;
};

/* What the tc program writes in front of the payload of a clone it turned into a UDP datagram.
 * With the 8-byte UDP header it takes 20 bytes, the smallest TCP header, so the rewrite only
 * ever shrinks the packet. `shadow` is a random 64-bit id (the key of fp_shadows and
 * fp_mirror_streams): a datagram that does not name a live shadow is dropped. */
struct fp_mirror_header {
	__u32 shadow_low;
	__u32 shadow_high;
	__u32 seq; /* TCP sequence number of the first payload byte, host order */
};

/* fp_mirror_streams value: where the shadow's copy of the client stream stands. One word so
 * concurrent verdicts on two CPUs advance it with compare-and-swap. */
#define FP_STREAM_STARTED (1ull << 63) /* low 32 bits: the next sequence number expected */
#define FP_STREAM_BROKEN (1ull << 62)  /* a gap: the shadow missed bytes and gets no more */

/* fp_mirror_config.flags: clone into the interface's egress, not its ingress (lo only; see
 * mirror.bpf.c for why). */
#define FP_MIRROR_CLONE_EGRESS 1u

/* Written by user space only (array of one). */
struct fp_mirror_config {
	__u16 udp_port; /* the FastPath's UDP socket, network order */
	__u16 pad;
	__u32 flags;    /* FP_MIRROR_* */
	__u32 flows;    /* mirrored flows: while 0 the tc program returns at once */
	__u32 reserved;
};

/* Per-CPU mirroring counters. */
struct fp_mirror_counters {
	__u64 segments_cloned;            /* tc: client segments with payload cloned */
	__u64 clone_failures;             /* tc: clone or rewrite into a datagram failed */
	__u64 segments_mirrored;          /* verdict: datagrams redirected into a shadow */
	__u64 bytes_mirrored;             /* verdict: payload bytes redirected into shadows */
	__u64 drops_no_shadow;            /* verdict: no such stream or shadow socket */
	__u64 duplicate_bytes;            /* verdict: retransmitted bytes already mirrored, skipped */
	__u64 desyncs;                    /* verdict: a gap in a stream (its shadow is cut off) */
	__u64 shadow_reply_bytes_dropped; /* shadow sockets: reply bytes dropped in the kernel */
};

#endif
