// SPDX-License-Identifier: GPL-2.0
/* Bypass workload mirroring: copies the client→pooler byte stream of mirrored flows to shadow
 * servers inside the kernel, and drops the shadows' replies there.
 *
 *   client segment ─► lo ingress, fp_mirror_tc: flow mirrored and payload? ─► mark, clone into
 *        │            lo egress, unmark ─► the original goes on to the pooler untouched
 *        └─ clone ─► lo egress ─► loopback ─► lo ingress, fp_mirror_tc sees the mark: TCP header
 *                    → UDP header + 12-byte fp_mirror_header (shadow id, TCP sequence) ─► IP ─►
 *                    the FastPath's UDP socket
 *   UDP socket ─► fp_mirror_datagram (skb verdict): sequence in order? ─► pop the header ─►
 *                 redirect (egress) into the shadow's TCP socket (fp_shadows, by shadow id)
 *   shadow socket ─► fp_shadow_reply: SK_DROP (the shadow's answers never reach user space)
 *
 * Why a clone and a datagram: an sk_skb verdict can redirect an skb to one socket only, so the
 * copy has to be made earlier, at tc, where bpf_clone_redirect exists. A UDP socket is the one
 * socket a raw IP packet can be steered into without a TCP handshake, and its sk_skb verdict
 * can then redirect the bytes into any TCP socket in a map.
 *
 * Which hook: the program runs at tc ingress. Loopback traffic passes lo egress and then lo
 * ingress; at ingress one program both clones (originals) and rewrites (marked clones), and the
 * data starts at the Ethernet header (lo carries a zeroed one). Where the clone goes matters
 * (found by experiment, kfree_skb reason IP_LOCALNET): a clone redirected into *ingress* is
 * scrubbed of its route, so IP routes it as input, and input routing drops a destination in
 * 127/8 as martian unless route_localnet is set. On lo the clone is therefore redirected into
 * lo's *egress* instead: it keeps the output route the original carries, loopback_xmit hands it
 * straight back to lo ingress, and IP delivers it locally without a route lookup. On any other
 * interface egress would put the clone on the wire, so it goes to ingress and that interface
 * needs route_localnet = 1 (user space checks).
 *
 * Cost for other traffic: the program runs on every packet of the interface; while no flow is
 * mirrored it returns after one array lookup, otherwise it reads the headers (direct packet
 * access) and looks the 4-tuple up.
 *
 * Checksums: on lo the segments are CHECKSUM_PARTIAL (never computed). The datagram gets UDP
 * checksum 0 ("none", legal for IPv4), which UDP accepts whatever the skb's checksum state; the
 * IP header checksum is verified by ip_rcv, so every IP field changed is patched incrementally.
 *
 * GSO: lo carries TCP super-packets up to 64 KiB as one GSO skb and never segments them, so
 * they are handled, not skipped: the header shrink keeps gso_size (BPF_F_ADJ_ROOM_FIXED_GSO),
 * and UDP queues a GSO skb of TCP type as one datagram (udp_unexpected_gso() is false for it).
 *
 * Retransmissions and reordering: the clone is per segment, so a retransmitted segment is
 * cloned again; the verdict keeps the next expected sequence number per shadow and skips bytes
 * already mirrored. A gap (a lost clone, or segments delivered out of order: lo hands each one
 * to the transmitting CPU's backlog, so without RPS a flow sent from two CPUs can be reordered)
 * cannot be repaired here: the stream is marked broken, the shadow gets nothing more, and user
 * space sees it (desyncs counter). With RPS on the interface a flow stays on one FIFO backlog. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "fastpath.h"

#define IP_MORE_FRAGMENTS 0x2000
#define IP_FRAGMENT_OFFSET 0x1fff
#define INADDR_LOOPBACK_HOST 0x7f000001
/* The datagram's L4 part: UDP header, then the mirror header. */
#define MIRROR_L4_LEN (sizeof(struct udphdr) + sizeof(struct fp_mirror_header))
/* Bytes sk_skb can pop at the front in one call (sk_skb_adjust_room's limit), and the calls
 * that cover the largest datagram (a 64 KiB GSO clone). */
#define POP_MAX 0xfff
#define POP_STEPS 17
#define CAS(ptr, old, new) __sync_val_compare_and_swap((ptr), (old), (new))
#define CAS_TRIES 16

_Static_assert(MIRROR_L4_LEN == 20, "the rewrite must fit the smallest TCP header");

/* Mirrored flows → shadow id. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_MIRROR_FLOWS_MAX);
	__type(key, struct fp_mirror_flow);
	__type(value, __u64);
} fp_mirror_flows SEC(".maps");

/* Shadow id → stream word (FP_STREAM_*). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_MIRROR_FLOWS_MAX);
	__type(key, __u64);
	__type(value, __u64);
} fp_mirror_streams SEC(".maps");

/* Shadow id → the shadow's TCP socket (logged in by user space before it enters). */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, FP_MIRROR_FLOWS_MAX);
	__type(key, __u64);
	__type(value, __u32);
} fp_shadows SEC(".maps");

/* The FastPath's UDP socket, at key 0. */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} fp_mirror_socket SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fp_mirror_config);
} fp_mirror_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fp_mirror_counters);
} fp_mirror_counters SEC(".maps");

static __always_inline struct fp_mirror_counters *counters(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&fp_mirror_counters, &zero);
}

/* ---- tc: clone, then rewrite the clone --------------------------------------------------- */

struct segment {
	struct fp_mirror_flow flow;
	__u32 seq;        /* host order */
	__u32 ip_len;     /* IP header bytes */
	__u32 tcp_len;    /* TCP header bytes, options included (data offset) */
	__u32 total;      /* IP total length */
	__u32 payload;    /* TCP payload bytes */
};

/* Copies the IPv4 and TCP headers. Direct packet access when the linear part holds them (it
 * always does for locally built segments: it saves two helper calls on every packet the
 * interface carries), bpf_skb_load_bytes otherwise. */
static __always_inline int load_headers(struct __sk_buff *skb, struct iphdr *ip, struct tcphdr *tcp)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct iphdr *linear_ip = data + ETH_HLEN;
	if ((void *)(linear_ip + 1) <= data_end) {
		__u32 ip_len = (linear_ip->ihl * 4) & 0x3c;
		struct tcphdr *linear_tcp = (void *)linear_ip + ip_len;
		if ((void *)(linear_tcp + 1) <= data_end) {
			*ip = *linear_ip;
			*tcp = *linear_tcp;
			return 0;
		}
	}
	if (bpf_skb_load_bytes(skb, ETH_HLEN, ip, sizeof(*ip)))
		return -1;
	return bpf_skb_load_bytes(skb, ETH_HLEN + ip->ihl * 4, tcp, sizeof(*tcp));
}

/* Reads an IPv4 TCP segment's headers; 0 for anything else (IPv6, fragments, other protocols). */
static __always_inline int read_segment(struct __sk_buff *skb, struct segment *seg)
{
	struct iphdr ip;
	struct tcphdr tcp;
	if (skb->protocol != bpf_htons(ETH_P_IP) || load_headers(skb, &ip, &tcp))
		return 0;
	if (ip.protocol != IPPROTO_TCP || ip.ihl < 5 || tcp.doff < 5 ||
	    (ip.frag_off & bpf_htons(IP_MORE_FRAGMENTS | IP_FRAGMENT_OFFSET)))
		return 0;
	seg->ip_len = ip.ihl * 4;
	seg->tcp_len = tcp.doff * 4;
	seg->total = bpf_ntohs(ip.tot_len);
	if (seg->total < seg->ip_len + seg->tcp_len)
		return 0;
	seg->payload = seg->total - seg->ip_len - seg->tcp_len;
	seg->seq = bpf_ntohl(tcp.seq);
	seg->flow.client_ip = ip.saddr;
	seg->flow.pooler_ip = ip.daddr;
	seg->flow.client_port = tcp.source;
	seg->flow.pooler_port = tcp.dest;
	return 1;
}

/* Patches the IP header for the datagram: protocol UDP, shorter total length, destination
 * 127.0.0.1 (the UDP socket's address), each with an incremental checksum update. */
static __always_inline int rewrite_ip(struct __sk_buff *skb, struct segment *seg)
{
	const __u32 check = ETH_HLEN + offsetof(struct iphdr, check);
	__u16 old_total = bpf_htons(seg->total);
	__u16 new_total = bpf_htons(seg->ip_len + MIRROR_L4_LEN + seg->payload);
	__u16 old_ttl_protocol, new_ttl_protocol;
	__u32 new_daddr = bpf_htonl(INADDR_LOOPBACK_HOST);
	/* ttl and protocol share one 16-bit checksum word. */
	if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, ttl), &old_ttl_protocol, 2))
		return -1;
	new_ttl_protocol = old_ttl_protocol;
	((__u8 *)&new_ttl_protocol)[1] = IPPROTO_UDP;
	if (bpf_l3_csum_replace(skb, check, old_total, new_total, 2) ||
	    bpf_l3_csum_replace(skb, check, old_ttl_protocol, new_ttl_protocol, 2) ||
	    bpf_l3_csum_replace(skb, check, seg->flow.pooler_ip, new_daddr, 4))
		return -1;
	if (bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct iphdr, tot_len), &new_total, 2, 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct iphdr, ttl), &new_ttl_protocol, 2, 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct iphdr, daddr), &new_daddr, 4, 0))
		return -1;
	return 0;
}

/* Turns the TCP segment into a UDP datagram to `udp_port` carrying the mirror header and the
 * payload: shrink the TCP header to MIRROR_L4_LEN right after the IP header, write UDP and
 * mirror headers there, then fix the IP header. */
static __always_inline int rewrite_to_datagram(struct __sk_buff *skb, struct segment *seg, __u64 shadow,
					       __u16 udp_port)
{
	struct {
		struct udphdr udp;
		struct fp_mirror_header mirror;
	} out = {};
	__s32 shrink = (__s32)seg->tcp_len - (__s32)MIRROR_L4_LEN;
	if (shrink > 0 && bpf_skb_adjust_room(skb, -shrink, BPF_ADJ_ROOM_NET, BPF_F_ADJ_ROOM_FIXED_GSO))
		return -1;
	out.udp.source = seg->flow.client_port;
	out.udp.dest = udp_port;
	out.udp.len = bpf_htons(MIRROR_L4_LEN + seg->payload);
	out.udp.check = 0; /* no checksum: legal for UDP over IPv4 */
	out.mirror.shadow_low = (__u32)shadow;
	out.mirror.shadow_high = (__u32)(shadow >> 32);
	out.mirror.seq = seg->seq;
	if (bpf_skb_store_bytes(skb, ETH_HLEN + seg->ip_len, &out, sizeof(out), BPF_F_RECOMPUTE_CSUM))
		return -1;
	return rewrite_ip(skb, seg);
}

/* A marked clone: rewrite it into the datagram. A clone of a flow this program does not mirror
 * belongs to another FastPath's program on the same interface (or its flow went away): leave it
 * to the next program; if none claims it, TCP drops it as the duplicate segment it is. */
static __always_inline int rewrite_clone(struct __sk_buff *skb, struct fp_mirror_counters *n)
{
	__u32 zero = 0;
	struct segment seg = {};
	struct fp_mirror_config *config = bpf_map_lookup_elem(&fp_mirror_config, &zero);
	__u64 *shadow = 0;
	if (config && read_segment(skb, &seg))
		shadow = bpf_map_lookup_elem(&fp_mirror_flows, &seg.flow);
	if (!config || !shadow)
		return TC_ACT_UNSPEC;
	if (rewrite_to_datagram(skb, &seg, *shadow, config->udp_port)) {
		n->clone_failures++;
		return TC_ACT_SHOT;
	}
	skb->mark = 0; /* the mark only told clone from original; keep it out of routing */
	return TC_ACT_OK;
}

/* Returns TC_ACT_UNSPEC (TCX_NEXT) for every packet it leaves alone, so programs attached after
 * it, including other FastPaths' mirror programs, still see the packet. */
SEC("classifier")
int fp_mirror_tc(struct __sk_buff *skb)
{
	struct fp_mirror_counters *n = counters();
	struct segment seg = {};
	if (!n)
		return TC_ACT_UNSPEC;
	if (skb->mark == FP_MIRROR_MARK)
		return rewrite_clone(skb, n);
	__u32 zero = 0;
	struct fp_mirror_config *config = bpf_map_lookup_elem(&fp_mirror_config, &zero);
	if (!config || !config->flows || !read_segment(skb, &seg) || seg.payload == 0 ||
	    !bpf_map_lookup_elem(&fp_mirror_flows, &seg.flow))
		return TC_ACT_UNSPEC;
	__u64 direction = (config->flags & FP_MIRROR_CLONE_EGRESS) ? 0 : BPF_F_INGRESS;
	/* The clone inherits the mark; the original gets its own mark back before it goes on. */
	__u32 mark = skb->mark;
	skb->mark = FP_MIRROR_MARK;
	long cloned = bpf_clone_redirect(skb, skb->ifindex, direction);
	skb->mark = mark;
	if (cloned)
		n->clone_failures++;
	else
		n->segments_cloned++;
	return TC_ACT_UNSPEC;
}

/* ---- the UDP socket: datagram → shadow stream -------------------------------------------- */

/* Claims [seq, seq + payload) of a shadow's stream. Returns the bytes at the front already
 * mirrored (a retransmission overlapping what was sent), or -1 to drop the datagram: all of it
 * was mirrored already, or it leaves a gap (then the stream is marked broken for good). */
static __always_inline int claim_stream(__u64 *stream, __u32 seq, __u32 payload, struct fp_mirror_counters *n)
{
	for (int i = 0; i < CAS_TRIES; i++) {
		__u64 now = *(volatile __u64 *)stream;
		if (now & FP_STREAM_BROKEN)
			return -1;
		/* The first datagram after add_mirror starts the stream wherever it is. */
		__s32 ahead = (now & FP_STREAM_STARTED) ? (__s32)(seq - (__u32)now) : 0;
		__u32 already = ahead < 0 ? (__u32)-ahead : 0;
		if (already >= payload) {
			n->duplicate_bytes += payload;
			return -1;
		}
		if (ahead > 0) {
			__sync_fetch_and_or(stream, FP_STREAM_BROKEN);
			n->desyncs++;
			return -1;
		}
		__u64 next = FP_STREAM_STARTED | (__u32)(seq + payload);
		if (CAS(stream, now, next) == now) {
			n->duplicate_bytes += already;
			return already;
		}
	}
	/* Endless contention cannot happen with a handful of CPUs; if it does, say so. */
	__sync_fetch_and_or(stream, FP_STREAM_BROKEN);
	n->desyncs++;
	return -1;
}

/* Pops `bytes` at the front of the skb, in steps sk_skb_adjust_room accepts. */
static __always_inline int pop_front(struct __sk_buff *skb, __u32 bytes)
{
	for (int i = 0; i < POP_STEPS && bytes; i++) {
		__u32 step = bytes > POP_MAX ? POP_MAX : bytes;
		if (bpf_skb_adjust_room(skb, -(__s32)step, 0, 0))
			return -1;
		bytes -= step;
	}
	return bytes ? -1 : 0;
}

/* Attached with BPF_SK_SKB_VERDICT by user space (aya 0.14 parses only sk_skb/stream_* section
 * names; the attach type, not the section, decides). On a UDP socket, offset 0 of the skb is the
 * first byte of the UDP payload, i.e. our fp_mirror_header (UDP pulls its header before it
 * queues the datagram; checked by the tests: a shifted read would name no shadow). */
SEC("sk_skb/stream_verdict")
int fp_mirror_datagram(struct __sk_buff *skb)
{
	struct fp_mirror_counters *n = counters();
	struct fp_mirror_header header;
	if (!n)
		return SK_DROP;
	if (skb->len <= sizeof(header) || bpf_skb_load_bytes(skb, 0, &header, sizeof(header))) {
		n->drops_no_shadow++;
		return SK_DROP;
	}
	__u64 shadow = ((__u64)header.shadow_high << 32) | header.shadow_low;
	__u64 *stream = bpf_map_lookup_elem(&fp_mirror_streams, &shadow);
	if (!stream) {
		n->drops_no_shadow++;
		return SK_DROP;
	}
	__u32 payload = skb->len - sizeof(header);
	int already = claim_stream(stream, header.seq, payload, n);
	if (already < 0)
		return SK_DROP;
	/* On sk_skb a negative length pops bytes at the front: the header and any duplicate bytes. */
	if (pop_front(skb, sizeof(header) + already) ||
	    bpf_sk_redirect_hash(skb, &fp_shadows, &shadow, 0) != SK_PASS) {
		__sync_fetch_and_or(stream, FP_STREAM_BROKEN);
		n->drops_no_shadow++;
		return SK_DROP;
	}
	n->segments_mirrored++;
	n->bytes_mirrored += payload - already;
	return SK_PASS;
}

/* The shadow's replies: counted and dropped, so user space never reads them. */
SEC("sk_skb/stream_verdict")
int fp_shadow_reply(struct __sk_buff *skb)
{
	struct fp_mirror_counters *n = counters();
	if (n)
		n->shadow_reply_bytes_dropped += skb->len;
	return SK_DROP;
}

char LICENSE[] SEC("license") = "GPL";
