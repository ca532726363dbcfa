// SPDX-License-Identifier: MIT OR GPL-2.0
//
// Lab path impairment for the TCP experiments (scripts/tcp-experiments), used where the kernel
// has no netem: a tc egress program that drops a fraction of data packets at random and gives
// every packet an earliest departure time (EDT) DELAY_NS in the future. An `fq` qdisc on the
// same device holds each packet until its time, so the delay is exact and the kernel forwards
// at full speed. Packets of one flow keep their order (same delay, fq orders by time).
//
// Build-time parameters (the experiment script compiles one object per setting):
//   DELAY_NS     one-way delay in nanoseconds
//   LOSS_THRESH  drop when bpf_get_prandom_u32() < LOSS_THRESH (loss rate × 2^32); only
//                packets larger than MIN_DATA_LEN bytes, so pure ACKs are never dropped.

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#ifndef DELAY_NS
#define DELAY_NS 0ULL
#endif
#ifndef LOSS_THRESH
#define LOSS_THRESH 0U
#endif
#define MIN_DATA_LEN 200

char _license[] SEC("license") = "Dual MIT/GPL";

SEC("tc")
int lab_edt(struct __sk_buff *skb)
{
	if (LOSS_THRESH && skb->len > MIN_DATA_LEN && bpf_get_prandom_u32() < LOSS_THRESH)
		return TC_ACT_SHOT;
	if (DELAY_NS)
		bpf_skb_set_tstamp(skb, bpf_ktime_get_ns() + DELAY_NS, BPF_SKB_TSTAMP_DELIVERY_MONO);
	return TC_ACT_OK;
}
