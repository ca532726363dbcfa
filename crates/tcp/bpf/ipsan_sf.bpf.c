// SPDX-License-Identifier: MIT OR GPL-2.0
//
// ipsan storage-friendly congestion controls, after Muknahallipatna et al., "Storage Friendly TCP
// Performance in Distributed SAN" (the iFCP paper, papers/002), section 4:
//
//   ipsan_sf     Reno (RFC 5681), except that on fast retransmit the slow-start threshold is 7/8
//                of cwnd instead of 1/2 ("reduce the current cwnd ... by only 1/8th").
//   ipsan_sf_ss  ipsan_sf with congestion avoidance disabled: cwnd always grows exponentially
//                (slow start), up to the peer's advertised receive window, as the paper's
//                gateways allowed ("the ramp of cwnd would always be exponential").
//
// Both are registered with the kernel as BPF struct_ops `tcp_congestion_ops` and then selected
// per socket with setsockopt(TCP_CONGESTION). The kernel does the loss detection, fast recovery
// (PRR, RFC 6937) and RTO handling; these programs only choose ssthresh and the cwnd increase.
// They are written from the RFC and the paper, not from the kernel's tcp_cong.c.
//
// The license string must be GPL-compatible: the verifier refuses struct_ops programs otherwise.

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char _license[] SEC("license") = "Dual MIT/GPL";

static __always_inline struct tcp_sock *tcp_of(struct sock *sk)
{
	return (struct tcp_sock *)sk;
}

static __always_inline __u32 max_u32(__u32 a, __u32 b)
{
	return a > b ? a : b;
}

static __always_inline __u32 min_u32(__u32 a, __u32 b)
{
	return a < b ? a : b;
}

static __always_inline bool in_slow_start(const struct tcp_sock *tp)
{
	return tp->snd_cwnd < tp->snd_ssthresh;
}

// RFC 5681 §3.1 / RFC 7661: only grow cwnd while it is what limits the sender. In slow start,
// allow cwnd to reach twice what was in flight at the peak.
static __always_inline bool cwnd_limited(const struct tcp_sock *tp)
{
	if (in_slow_start(tp))
		return tp->snd_cwnd < 2 * tp->max_packets_out;
	return BPF_CORE_READ_BITFIELD(tp, is_cwnd_limited);
}

// RFC 5681 §3.1 slow start: cwnd += acked, at most to ssthresh; returns the ACKed segments left
// over once ssthresh is reached.
static __always_inline __u32 slow_start(struct tcp_sock *tp, __u32 acked, __u32 limit)
{
	__u32 cwnd = min_u32(tp->snd_cwnd + acked, limit);

	acked -= cwnd - tp->snd_cwnd;
	tp->snd_cwnd = min_u32(cwnd, tp->snd_cwnd_clamp);
	return acked;
}

// RFC 5681 §3.1 congestion avoidance: about one segment per RTT (cwnd/cwnd ACKed segments).
static __always_inline void cong_avoid_ai(struct tcp_sock *tp, __u32 w, __u32 acked)
{
	if (w == 0)
		w = 1;
	if (tp->snd_cwnd_cnt >= w) {
		tp->snd_cwnd_cnt = 0;
		tp->snd_cwnd++;
	}
	tp->snd_cwnd_cnt += acked;
	if (tp->snd_cwnd_cnt >= w) {
		__u32 delta = tp->snd_cwnd_cnt / w;

		tp->snd_cwnd_cnt -= delta * w;
		tp->snd_cwnd += delta;
	}
	tp->snd_cwnd = min_u32(tp->snd_cwnd, tp->snd_cwnd_clamp);
}

// The paper's modified fast recovery: keep 7/8 of the window (cwnd - cwnd/8), never below 2.
static __always_inline __u32 seven_eighths(struct sock *sk)
{
	const struct tcp_sock *tp = tcp_of(sk);
	__u32 cwnd = tp->snd_cwnd;

	return max_u32(cwnd - (cwnd >> 3), 2);
}

SEC("struct_ops/ipsan_sf_ssthresh")
__u32 BPF_PROG(ipsan_sf_ssthresh, struct sock *sk)
{
	return seven_eighths(sk);
}

SEC("struct_ops/ipsan_sf_undo_cwnd")
__u32 BPF_PROG(ipsan_sf_undo_cwnd, struct sock *sk)
{
	const struct tcp_sock *tp = tcp_of(sk);

	// A spurious loss (F-RTO / DSACK) restores the window from before the cut.
	return max_u32(tp->snd_cwnd, tp->prior_cwnd);
}

SEC("struct_ops/ipsan_sf_cong_avoid")
void BPF_PROG(ipsan_sf_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
	struct tcp_sock *tp = tcp_of(sk);

	if (!cwnd_limited(tp))
		return;
	if (in_slow_start(tp)) {
		acked = slow_start(tp, acked, tp->snd_ssthresh);
		if (!acked)
			return;
	}
	cong_avoid_ai(tp, tp->snd_cwnd, acked);
}

// Congestion avoidance disabled: exponential growth on every ACK, bounded by the receive window
// the peer advertises (in segments), which is the only limit the paper's gateways kept.
SEC("struct_ops/ipsan_sf_ss_cong_avoid")
void BPF_PROG(ipsan_sf_ss_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
	struct tcp_sock *tp = tcp_of(sk);
	__u32 mss = tp->mss_cache;
	__u32 rwnd_segs;

	if (!cwnd_limited(tp))
		return;
	if (mss == 0)
		mss = 536;
	rwnd_segs = max_u32(tp->snd_wnd / mss, 2);
	if (tp->snd_cwnd >= rwnd_segs)
		return;
	slow_start(tp, acked, rwnd_segs);
}

SEC(".struct_ops")
struct tcp_congestion_ops ipsan_sf = {
	.ssthresh = (void *)ipsan_sf_ssthresh,
	.cong_avoid = (void *)ipsan_sf_cong_avoid,
	.undo_cwnd = (void *)ipsan_sf_undo_cwnd,
	.name = "ipsan_sf",
};

SEC(".struct_ops")
struct tcp_congestion_ops ipsan_sf_ss = {
	.ssthresh = (void *)ipsan_sf_ssthresh,
	.cong_avoid = (void *)ipsan_sf_ss_cong_avoid,
	.undo_cwnd = (void *)ipsan_sf_undo_cwnd,
	.name = "ipsan_sf_ss",
};
