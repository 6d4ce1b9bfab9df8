/* The switch's steering table (Prism at the top-of-rack switch, seed 004): a tc ingress program
 * on every client-facing switch port. Packets of flows not in the table pass untouched; a flow
 * being moved is dropped (BLOCK), so no host that no longer owns the connection answers with a
 * reset; a handed-over flow gets its destination MAC rewritten to the owning backend (FORWARD),
 * which holds the service address on its loopback (direct server return). Only the dispatcher
 * writes the table. For tracked flows (every connection that may move) the program also counts
 * the segments it let through (steer_arrivals), so an owner can wait for the ones still on
 * their way before it gives the connection up. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "steer.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, STEER_FLOWS_MAX);
	__type(key, struct steer_key);
	__type(value, struct steer_value);
} steer_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, STEER_FLOWS_MAX);
	__type(key, struct steer_key);
	__type(value, struct steer_arrivals);
} steer_arrivals SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct steer_stats);
} steer_counters SEC(".maps");

static __always_inline struct steer_stats *counters(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&steer_counters, &zero);
}

SEC("classifier")
int steer_ingress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->protocol != IPPROTO_TCP || ip->ihl < 5)
		return TC_ACT_OK;
	struct tcphdr *tcp = (void *)ip + ip->ihl * 4;
	if ((void *)(tcp + 1) > end)
		return TC_ACT_OK;

	struct steer_key key = { .client_addr = ip->saddr, .client_port = tcp->source, .pad = 0 };
	/* A GSO packet stands for several segments; the receiving socket counts them all. */
	__u64 segments = skb->gso_segs > 1 ? skb->gso_segs : 1;
	struct steer_arrivals *arrivals = bpf_map_lookup_elem(&steer_arrivals, &key);
	/* Counted before the action is read (a full barrier): see struct steer_arrivals. */
	if (arrivals)
		__sync_fetch_and_add(&arrivals->arrived, segments);
	struct steer_value *flow = bpf_map_lookup_elem(&steer_flows, &key);
	struct steer_stats *stats = counters();
	if (!flow || flow->action == STEER_PASS) {
		if (stats && flow)
			stats->passed++;
		return TC_ACT_OK;
	}
	if (flow->action == STEER_BLOCK) {
		if (stats)
			stats->blocked++;
		if (arrivals)
			__sync_fetch_and_add(&arrivals->dropped, segments);
		return TC_ACT_SHOT;
	}
	if (flow->drop_per_million && bpf_get_prandom_u32() % 1000000 < flow->drop_per_million) {
		if (stats)
			stats->dropped_random++;
		if (arrivals)
			__sync_fetch_and_add(&arrivals->dropped, segments);
		return TC_ACT_SHOT;
	}
	__builtin_memcpy(eth->h_dest, flow->owner_mac, ETH_ALEN);
	if (stats)
		stats->forwarded++;
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
