#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Per-command overhead of the SCSI layer: READ(10)/WRITE(10) through
//! `LogicalUnit::execute` on the mem and null backends at 4 KiB and 1 MiB.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ipsan_scsi::{LogicalUnit, LuConfig, NexusId, ScsiRequest, ScsiStatus};

fn cdb10(op: u8, lba: u32, blocks: u16) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn bench(c: &mut Criterion) {
    let nexus = NexusId("iqn.bench,i,0x000000000001".into());
    for kind in ["mem", "null"] {
        let spec = format!("{kind}:1GiB").parse().unwrap();
        let backend = ipsan_scsi::open(&spec).unwrap();
        let mut cfg = LuConfig::with_serial("bench");
        cfg.block_size = 4096;
        let lu = Arc::new(LogicalUnit::new(backend, cfg).unwrap());
        let mut g = c.benchmark_group(format!("scsi_{kind}"));
        for size in [4096usize, 1 << 20] {
            let blocks = (size / 4096) as u16;
            let data = vec![0xA5u8; size];
            // Pre-write so the mem backend has the pages allocated (steady state).
            let w = cdb10(0x2A, 0, blocks);
            lu.execute(&ScsiRequest {
                cdb: &w,
                data_out: &data,
                nexus: &nexus,
                lun: 0,
                tailroom: false,
            });
            g.throughput(Throughput::Bytes(size as u64));
            g.bench_with_input(BenchmarkId::new("write10", size), &size, |b, _| {
                b.iter(|| {
                    let r = lu.execute(&ScsiRequest {
                        cdb: &w,
                        data_out: &data,
                        nexus: &nexus,
                        lun: 0,
                        tailroom: false,
                    });
                    assert_eq!(r.status, ScsiStatus::GOOD);
                })
            });
            let rc = cdb10(0x28, 0, blocks);
            g.bench_with_input(BenchmarkId::new("read10", size), &size, |b, _| {
                b.iter(|| {
                    let r = lu.execute(&ScsiRequest {
                        cdb: &rc,
                        data_out: &[],
                        nexus: &nexus,
                        lun: 0,
                        tailroom: false,
                    });
                    assert_eq!(r.data_in.len(), size);
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
