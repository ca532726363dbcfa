//! Encode/decode cost per PDU, with and without CRC32C digests, at the data segment sizes the
//! target uses (8 KiB login-era, 256 KiB full feature).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use iscsi_wire::header::DataIn;
use iscsi_wire::{Codec, Pdu};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("data_in_roundtrip");
    for &size in &[8192usize, 262_144] {
        for &digests in &[false, true] {
            let codec = Codec {
                header_digest: digests,
                data_digest: digests,
                max_recv_data_segment_length: 1 << 20,
            };
            let pdu = Pdu::new(
                DataIn {
                    final_: true,
                    itt: 7,
                    data_sn: 3,
                    ..Default::default()
                },
                Bytes::from(vec![0x5au8; size]),
            );
            g.throughput(Throughput::Bytes(size as u64));
            let id = BenchmarkId::new(if digests { "crc32c" } else { "plain" }, size);
            g.bench_with_input(id, &pdu, |b, pdu| {
                let mut buf = BytesMut::with_capacity(size + 128);
                b.iter(|| {
                    codec.encode(pdu, &mut buf).unwrap();
                    let out = codec.decode(&mut buf).unwrap().unwrap();
                    assert_eq!(out.data.len(), size);
                });
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
