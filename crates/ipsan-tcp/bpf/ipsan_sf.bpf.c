// SPDX-License-Identifier: MIT OR GPL-2.0
//
// ipsan storage-friendly congestion controls, after Muknahallipatna et al., "Storage Friendly TCP
// Performance in Distributed SAN" (the iFCP paper, Muknahallipatna et al.), section 4:
//
//   ipsan_sf     Reno (RFC 5681), except that on fast retransmit the slow-start threshold is 7/8
//                of cwnd instead of 1/2 ("reduce the current cwnd ... by only 1/8th").
//   ipsan_sf_ss  ipsan_sf with congestion avoidance disabled: cwnd always grows exponentially
//                (slow start), up to the peer's advertised receive window, as the paper's
//                gateways allowed ("the ramp of cwnd would always be exponential").
//   ipsan_ss     congestion avoidance disabled alone: Reno's cut (ssthresh = cwnd/2, RFC 5681
//                §3.2), then the same exponential growth as ipsan_sf_ss (the paper's Fig. 10
//                fourth series, "congestion avoidance disable ... starting point being at
//                one-half of the cwnd value").
//
// All three are registered with the kernel as BPF struct_ops `tcp_congestion_ops` and then selected
// per socket with setsockopt(TCP_CONGESTION). The kernel does the loss detection, fast recovery
// (PRR, RFC 6937) and RTO handling; these programs only choose ssthresh and the cwnd increase.
// They are written from the RFC and the paper, not from the kernel's tcp_cong.c.
//
// The license string must be GPL-compatible: the verifier refuses struct_ops programs otherwise.
//
// Guard against corrupted windows. On the 6.18 kernel of our CI machines (AMD Zen 4, SRSO
// mitigation on), a connection using these programs now and then has snd_ssthresh = 0x822034e5
// (2183148773), a value none of them computes: it is the low half of `srso_return_thunk+5`, a
// stale word from a kernel stack. We did not find the path that stores it; bpf_printk tracing
// showed our `ssthresh` never returning it. PRR (RFC 6937) then turns it into a cwnd of 1e7-1e9
// segments and the kernel WARNs once in tcp_snd_cwnd_set(). Counted: 0-2 repairs per 6 s of
// bulk transfer over a 100 Mbit/s bottleneck; never seen with the kernel's own reno. So
// `in_ack_event` (every ACK, before loss detection and PRR) and `cong_avoid` put cwnd and
// ssthresh back under what the connection can use, and `ssthresh` and `undo_cwnd` never compute
// from a corrupted window.

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

// include/net/tcp.h: "no threshold yet".
#define TCP_INFINITE_SSTHRESH 0x7fffffff

static __always_inline bool in_slow_start(const struct tcp_sock *tp)
{
	return tp->snd_cwnd < tp->snd_ssthresh;
}

// The peer's advertised receive window in segments (at least 2).
static __always_inline __u32 rwnd_segments(const struct tcp_sock *tp)
{
	__u32 mss = tp->mss_cache;

	if (mss == 0)
		mss = 536;
	return max_u32(tp->snd_wnd / mss, 2);
}

// The largest window that can mean anything for this connection: twice what the receiver
// allows or what was ever in flight (RFC 5681 §3.1 sends at most min(cwnd, rwnd); RFC 7661 lets
// an unused window decay). A cwnd or ssthresh above this is a corrupted value, not a window.
static __always_inline __u32 cwnd_ceiling(const struct tcp_sock *tp)
{
	__u32 segs = max_u32(max_u32(rwnd_segments(tp), tp->max_packets_out), 10);

	return 2 * segs;
}

// The paper's modified fast recovery: keep 7/8 of the window (cwnd - cwnd/8), never below 2.
static __always_inline __u32 seven_eighths_of(__u32 cwnd)
{
	return max_u32(cwnd - (cwnd >> 3), 2);
}

// Reno's cut (RFC 5681 §3.2, with cwnd standing in for FlightSize as the kernel's reno does):
// keep half the window, never below 2.
static __always_inline __u32 half_of(__u32 cwnd)
{
	return max_u32(cwnd >> 1, 2);
}

// The window a loss leaves: 7/8 (ipsan_sf, ipsan_sf_ss) or 1/2 (ipsan_ss). `halve` is a
// constant at every call site, so each program keeps only its own branch.
static __always_inline __u32 cut_of(__u32 cwnd, bool halve)
{
	return halve ? half_of(cwnd) : seven_eighths_of(cwnd);
}

// Windows repaired since the programs were loaded, all sockets together; `ipsan tcp list`
// reads it from the object's .bss map (pinned by `ipsan tcp load`).
__u64 ipsan_sf_repairs = 0;

// Puts cwnd and ssthresh back inside cwnd_ceiling() if something outside these programs left
// them there (see the note at the top), ssthresh at the program's own cut (`halve`) of the
// window before the loss. ssthresh may legitimately be TCP_INFINITE_SSTHRESH.
static __always_inline void repair_window(struct tcp_sock *tp, bool halve)
{
	__u32 ceiling = cwnd_ceiling(tp);
	__u32 st = tp->snd_ssthresh;
	bool repaired = false;

	if (st > ceiling && st != TCP_INFINITE_SSTHRESH) {
		tp->snd_ssthresh = cut_of(min_u32(tp->prior_cwnd, ceiling), halve);
		repaired = true;
	}
	if (tp->snd_cwnd > ceiling) {
		tp->snd_cwnd = min_u32(max_u32(tp->snd_ssthresh, 2), ceiling);
		repaired = true;
	}
	if (repaired)
		__sync_fetch_and_add(&ipsan_sf_repairs, 1);
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

SEC("struct_ops/ipsan_sf_ssthresh")
__u32 BPF_PROG(ipsan_sf_ssthresh, struct sock *sk)
{
	const struct tcp_sock *tp = tcp_of(sk);

	return seven_eighths_of(min_u32(tp->snd_cwnd, cwnd_ceiling(tp)));
}

SEC("struct_ops/ipsan_ss_ssthresh")
__u32 BPF_PROG(ipsan_ss_ssthresh, struct sock *sk)
{
	const struct tcp_sock *tp = tcp_of(sk);

	return half_of(min_u32(tp->snd_cwnd, cwnd_ceiling(tp)));
}

// All three: a spurious loss (F-RTO / DSACK) restores the window from before the cut.
SEC("struct_ops/ipsan_sf_undo_cwnd")
__u32 BPF_PROG(ipsan_sf_undo_cwnd, struct sock *sk)
{
	const struct tcp_sock *tp = tcp_of(sk);

	return min_u32(max_u32(tp->snd_cwnd, tp->prior_cwnd), cwnd_ceiling(tp));
}

// Every ACK, before the kernel's loss detection and PRR look at the window.
SEC("struct_ops/ipsan_sf_in_ack_event")
void BPF_PROG(ipsan_sf_in_ack_event, struct sock *sk, __u32 flags)
{
	repair_window(tcp_of(sk), false);
}

SEC("struct_ops/ipsan_ss_in_ack_event")
void BPF_PROG(ipsan_ss_in_ack_event, struct sock *sk, __u32 flags)
{
	repair_window(tcp_of(sk), true);
}

SEC("struct_ops/ipsan_sf_cong_avoid")
void BPF_PROG(ipsan_sf_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
	struct tcp_sock *tp = tcp_of(sk);

	repair_window(tp, false);
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
static __always_inline void no_ca_cong_avoid(struct tcp_sock *tp, __u32 acked, bool halve)
{
	__u32 rwnd_segs = rwnd_segments(tp);

	repair_window(tp, halve);
	if (!cwnd_limited(tp))
		return;
	if (tp->snd_cwnd >= rwnd_segs)
		return;
	slow_start(tp, acked, rwnd_segs);
}

SEC("struct_ops/ipsan_sf_ss_cong_avoid")
void BPF_PROG(ipsan_sf_ss_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
	no_ca_cong_avoid(tcp_of(sk), acked, false);
}

SEC("struct_ops/ipsan_ss_cong_avoid")
void BPF_PROG(ipsan_ss_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
	no_ca_cong_avoid(tcp_of(sk), acked, true);
}

SEC(".struct_ops")
struct tcp_congestion_ops ipsan_sf = {
	.ssthresh = (void *)ipsan_sf_ssthresh,
	.cong_avoid = (void *)ipsan_sf_cong_avoid,
	.undo_cwnd = (void *)ipsan_sf_undo_cwnd,
	.in_ack_event = (void *)ipsan_sf_in_ack_event,
	.name = "ipsan_sf",
};

SEC(".struct_ops")
struct tcp_congestion_ops ipsan_sf_ss = {
	.ssthresh = (void *)ipsan_sf_ssthresh,
	.cong_avoid = (void *)ipsan_sf_ss_cong_avoid,
	.undo_cwnd = (void *)ipsan_sf_undo_cwnd,
	.in_ack_event = (void *)ipsan_sf_in_ack_event,
	.name = "ipsan_sf_ss",
};

SEC(".struct_ops")
struct tcp_congestion_ops ipsan_ss = {
	.ssthresh = (void *)ipsan_ss_ssthresh,
	.cong_avoid = (void *)ipsan_ss_cong_avoid,
	.undo_cwnd = (void *)ipsan_sf_undo_cwnd,
	.in_ack_event = (void *)ipsan_ss_in_ack_event,
	.name = "ipsan_ss",
};
