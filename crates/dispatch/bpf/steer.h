/* Layouts shared by the steering program (steer.bpf.c) and the dispatcher (src/steer.rs mirrors
 * them with compile-time size and offset assertions). Change both together. */
#ifndef BYPASS_STEER_H
#define BYPASS_STEER_H

#include <linux/types.h>

/* Most flows the switch tracks at once. */
#define STEER_FLOWS_MAX 65536

/* What the switch does with a client's packets. */
enum steer_action {
	/* Deliver normally: the dispatcher owns the connection. */
	STEER_PASS = 0,
	/* Drop: the connection is moving and nobody owns it. */
	STEER_BLOCK = 1,
	/* Rewrite the destination MAC to the owning backend. */
	STEER_FORWARD = 2,
};

/* A client flow: its IPv4 address and TCP port, both in network byte order. */
struct steer_key {
	__u32 client_addr;
	__u16 client_port;
	__u16 pad;
};

struct steer_value {
	__u32 action;
	__u8 owner_mac[6];
	__u16 pad;
	/* Forwarded packets dropped at random, per million (loss tests); 0 in normal use. */
	__u32 drop_per_million;
};

/* Segments of one tracked flow that reached the switch port, and of those the ones dropped
 * there. arrived - dropped is what the flow's current owner must have received before its
 * socket may be exported: a segment still queued between the switch and the host would
 * otherwise meet a closed socket (reset) or be acknowledged and lost with it. The program adds
 * to `arrived` before it reads the flow's action, so a segment that saw the old action is
 * always counted by the time the dispatcher has changed it. */
struct steer_arrivals {
	__u64 arrived;
	__u64 dropped;
};

/* Per-CPU packet counters. */
struct steer_stats {
	__u64 passed;
	__u64 blocked;
	__u64 forwarded;
	__u64 dropped_random;
};

#endif
