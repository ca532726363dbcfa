//! The WAN impairment model: [`wan_model`].

use super::Input;

/// Runs a packet sequence through one direction's impairment model with settings taken from
/// the input; see the module table.
pub fn wan_model(data: &[u8]) {
    use ipsan_wan::{DirConfig, Impairment, LossModel, Packet, QueueLimit, Stage, Verdict};
    use std::time::Duration;
    let mut inp = Input(data);
    let kind = inp.u8();
    let loss = match kind % 3 {
        0 => LossModel::None,
        1 => LossModel::Bernoulli { p: inp.prob(1.0) },
        _ => LossModel::Gilbert {
            p: inp.prob(1.0),
            r: inp.prob(1.0),
            loss_bad: inp.prob(1.0),
            loss_good: inp.prob(0.1),
        },
    };
    let queue_limit = u32::from(inp.u8()) + 1;
    let cfg = DirConfig {
        delay: Duration::from_micros(u64::from(inp.u16()) * 10),
        jitter: Duration::from_micros(u64::from(inp.u16())),
        jitter_dist: if kind & 0x80 != 0 {
            ipsan_wan::JitterDist::Normal
        } else {
            ipsan_wan::JitterDist::Uniform
        },
        loss,
        reorder: inp.prob(0.5),
        reorder_gap: Duration::from_micros(u64::from(inp.u16())),
        corrupt: inp.prob(0.5),
        duplicate: inp.prob(0.5),
        rate_bps: u64::from(inp.u32()) * 8,
        queue: QueueLimit::Packets(queue_limit),
        cuts: Vec::new(),
    };
    if cfg.validate().is_err() {
        return;
    }
    let seed = u64::from(inp.u32());
    let mut m = Impairment::new(cfg.clone(), seed);
    let mut now: u64 = 0;
    let mut last_in_order = 0u64;
    let mut p = Packet::with_capacity(1600);
    for _ in 0..2048 {
        if inp.0.len() < 3 {
            break;
        }
        now += u64::from(inp.u8()) * 1000;
        let len = usize::from(inp.u16() % 1500) + 1;
        let fill = inp.u8();
        let orig = vec![fill; len];
        p.buffer_mut()[..len].copy_from_slice(&orig);
        p.set_len(len);
        p.reset(now);
        let v = m.process(now, &mut p);
        assert!(
            m.queue_len(now) <= queue_limit as usize || cfg.rate_bps == 0,
            "queue over its limit"
        );
        if v != Verdict::Pass {
            continue;
        }
        assert!(p.release_at >= now, "released before it arrived");
        if !p.reordered {
            assert!(p.release_at >= last_in_order, "in-order packets overtook");
            last_in_order = p.release_at;
        }
        let flipped: u32 = p
            .data()
            .iter()
            .zip(&orig)
            .map(|(a, b)| (a ^ b).count_ones())
            .sum();
        assert_eq!(flipped, u32::from(p.corrupted), "corruption flips one bit");
        assert_eq!(p.len(), len);
    }
}
