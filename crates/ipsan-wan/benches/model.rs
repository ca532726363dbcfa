//! Per-packet cost of the pure impairment model (the part of the forwarder's work that does
//! not depend on the kernel): how many packets per second one core can decide.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ipsan_wan::{DirConfig, Impairment, LossModel, Packet, Pipeline};
use std::time::Duration;

fn configs() -> Vec<(&'static str, DirConfig)> {
    vec![
        ("none", DirConfig::default()),
        (
            "delay8ms",
            DirConfig {
                delay: Duration::from_millis(8),
                ..Default::default()
            },
        ),
        (
            "paxson", // Aiken et al.'s pathologies plus jitter and a 1 Gbit/s bottleneck
            DirConfig {
                delay: Duration::from_millis(8),
                jitter: Duration::from_micros(500),
                loss: LossModel::Bernoulli { p: 0.027 },
                reorder: 0.02,
                corrupt: 0.0002,
                rate_bps: 1_000_000_000,
                ..Default::default()
            },
        ),
    ]
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("impairment_per_packet");
    g.throughput(Throughput::Elements(1));
    for (name, cfg) in configs() {
        let mut p = Pipeline::new().with(Box::new(Impairment::new(cfg, 7)));
        let mut pkt = Packet::from_slice(&[0x45; 1500], 1600);
        let mut now = 0u64;
        g.bench_function(name, |b| {
            b.iter(|| {
                now += 12_000; // one 1500-byte packet per 12 µs = 1 Gbit/s
                std::hint::black_box(p.process(now, &mut pkt))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
