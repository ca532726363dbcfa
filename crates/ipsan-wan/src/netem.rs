//! The `netem` engine: a veth pair between the two namespaces with a `tc netem` qdisc on each
//! end's egress. Used where the kernel has `sch_netem` (`--engine netem`, or `auto` when
//! present). This machine's kernel has none, so this engine is only exercised by its unit
//! tests (argument translation) and the availability check; the built-in engine carries
//! every measured result.
//!
//! Differences from the built-in model worth knowing: netem's `reorder` sends the chosen
//! packets *early* (without the delay) rather than holding them back, and its rate limiter
//! is a netem-internal serialiser with `limit` as the packet queue.

use crate::config::{DirConfig, JitterDist, LinkConfig, LossModel, QueueLimit};
use crate::error::LinkError;
use crate::forwarder::DirStats;
use crate::netns::{self, ns_names, IFNAME};
use std::process::Command;

/// `Ok` when a netem qdisc can be created; otherwise the reason (from `tc`). Checks once per
/// process, in a throw-away namespace, so nothing on the host changes.
pub fn available() -> Result<(), String> {
    static RESULT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    RESULT.get_or_init(probe).clone()
}

fn probe() -> Result<(), String> {
    let ns = format!("ipsan-netem-probe-{}", std::process::id());
    netns::add(&ns).map_err(|e| e.to_string())?;
    let r = netns::run("ip", &["-n", &ns, "link", "set", "lo", "up"]).and_then(|()| {
        netns::run(
            "tc",
            &[
                "-n", &ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
            ],
        )
    });
    let _ = netns::delete(&ns);
    r.map_err(|e| match e {
        LinkError::Command { stderr, .. } => stderr,
        other => other.to_string(),
    })
}

fn pct(p: f64) -> String {
    format!("{}%", p * 100.0)
}

/// The `tc qdisc ... netem` arguments that express `d`.
pub fn netem_args(d: &DirConfig, seed: u64) -> Vec<String> {
    let mut a: Vec<String> = vec!["limit".into()];
    a.push(match d.queue {
        QueueLimit::Packets(n) => n.to_string(),
        // netem's limit is in packets; assume full-size 1500-byte packets for a byte limit.
        QueueLimit::Bytes(b) => (b / 1500).max(1).to_string(),
    });
    a.extend(["delay".into(), format!("{}us", d.delay.as_micros())]);
    if !d.jitter.is_zero() {
        a.push(format!("{}us", d.jitter.as_micros()));
        a.extend([
            "distribution".into(),
            match d.jitter_dist {
                JitterDist::Uniform => "uniform".into(),
                JitterDist::Normal => "normal".into(),
            },
        ]);
    }
    match d.loss {
        LossModel::None => {}
        LossModel::Bernoulli { p } => a.extend(["loss".into(), "random".into(), pct(p)]),
        LossModel::Gilbert {
            p,
            r,
            loss_bad,
            loss_good,
        } => a.extend([
            "loss".into(),
            "gemodel".into(),
            pct(p),
            pct(r),
            pct(loss_bad),
            pct(loss_good),
        ]),
    }
    if d.reorder > 0.0 {
        a.extend(["reorder".into(), pct(d.reorder)]);
    }
    if d.corrupt > 0.0 {
        a.extend(["corrupt".into(), pct(d.corrupt)]);
    }
    if d.duplicate > 0.0 {
        a.extend(["duplicate".into(), pct(d.duplicate)]);
    }
    if d.rate_bps > 0 {
        a.extend(["rate".into(), format!("{}bit", d.rate_bps)]);
    }
    a.extend(["seed".into(), seed.to_string()]);
    a
}

fn qdisc(verb: &str, ns: &str, d: &DirConfig, seed: u64) -> Result<(), LinkError> {
    let mut args: Vec<String> = ["-n", ns, "qdisc", verb, "dev", IFNAME, "root", "netem"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(netem_args(d, seed));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    netns::run("tc", &refs)
}

/// Creates the veth pair, addresses it and attaches one netem qdisc per direction.
pub fn setup(cfg: &LinkConfig) -> Result<(), LinkError> {
    let (ini, tgt) = ns_names(&cfg.name);
    netns::run(
        "ip",
        &[
            "-n", &ini, "link", "add", IFNAME, "type", "veth", "peer", "name", IFNAME, "netns",
            &tgt,
        ],
    )?;
    let mtu = cfg.mtu.to_string();
    for (ns, addr) in [(&ini, cfg.ini_addr()), (&tgt, cfg.tgt_addr())] {
        netns::run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        netns::run(
            "ip",
            &[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                IFNAME,
            ],
        )?;
        netns::run("ip", &["-n", ns, "link", "set", IFNAME, "mtu", &mtu, "up"])?;
    }
    qdisc("add", &ini, &cfg.up, cfg.seed)?;
    qdisc("add", &tgt, &cfg.down, cfg.seed ^ 1)
}

/// Changes the running qdiscs.
pub fn change(name: &str, up: &DirConfig, down: &DirConfig, seed: u64) -> Result<(), LinkError> {
    let (ini, tgt) = ns_names(name);
    qdisc("change", &ini, up, seed)?;
    qdisc("change", &tgt, down, seed ^ 1)
}

/// Parses `Sent B bytes P pkt (dropped D, ...)` from `tc -s qdisc show`.
pub fn parse_tc_stats(text: &str) -> (u64, u64, u64) {
    let words: Vec<&str> = text.split_whitespace().collect();
    let num = |w: Option<&&str>| {
        w.map(|s| s.trim_end_matches(',').parse().unwrap_or(0))
            .unwrap_or(0)
    };
    let mut out = (0, 0, 0);
    for (i, w) in words.iter().enumerate() {
        match *w {
            "Sent" => {
                out.0 = num(words.get(i + 1));
                out.1 = num(words.get(i + 3));
            }
            "(dropped" => out.2 = num(words.get(i + 1)),
            _ => {}
        }
    }
    out
}

/// What netem reports for each direction (initiator → target, target → initiator): packets
/// and bytes sent, and drops (loss and queue together).
pub fn stats(name: &str) -> (DirStats, DirStats) {
    let (ini, tgt) = ns_names(name);
    let read = |ns: &str| {
        let out = Command::new("tc")
            .args(["-n", ns, "-s", "qdisc", "show", "dev", IFNAME])
            .output();
        let (bytes, pkts, dropped) = out
            .map(|o| parse_tc_stats(&String::from_utf8_lossy(&o.stdout)))
            .unwrap_or_default();
        DirStats {
            packets_out: pkts,
            bytes_out: bytes,
            dropped_loss: dropped,
            ..Default::default()
        }
    };
    (read(&ini), read(&tgt))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn translates_every_impairment_to_netem_arguments() {
        let d = DirConfig {
            delay: Duration::from_millis(8),
            jitter: Duration::from_micros(500),
            loss: LossModel::Bernoulli { p: 0.001 },
            reorder: 0.02,
            corrupt: 0.0002,
            duplicate: 0.01,
            rate_bps: 100_000_000,
            ..Default::default()
        };
        let a = netem_args(&d, 7).join(" ");
        assert_eq!(
            a,
            "limit 1000 delay 8000us 500us distribution uniform loss random 0.1% reorder 2% \
             corrupt 0.02% duplicate 1% rate 100000000bit seed 7"
        );
    }

    #[test]
    fn reads_tc_counters() {
        let t = "qdisc netem 8001: root refcnt 2 limit 1000 delay 8ms\n Sent 123456 bytes 789 pkt (dropped 12, overlimits 0 requeues 0)\n";
        assert_eq!(parse_tc_stats(t), (123456, 789, 12));
    }
}
