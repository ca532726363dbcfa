#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Seal/open throughput per cipher on one core at 4 KiB, 64 KiB and 1 MiB (64 KiB chunks), and
//! the crypto pool's scaling with 1 and 2 workers on 1 MiB commands.
//!
//! `cargo bench -p ipsan-seal --bench seal` (results in docs/seal.md).

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use ipsan_seal::{
    AnswerOutcome, Binding, Cipher, CryptoPool, Psk, SealAnswer, SealOffer, SealSession,
    SessionIds, TargetSealConfig,
};

const SIZES: [usize; 3] = [4 << 10, 64 << 10, 1 << 20];

fn pair(cipher: Cipher) -> (Arc<SealSession>, Arc<SealSession>) {
    let psk = || Psk::new(b"benchmark secret, 32 bytes long.".to_vec()).unwrap();
    let ids = SessionIds {
        initiator_name: "iqn.2026-01.org.ipsan:bench".into(),
        target_name: "iqn.2026-01.org.ipsan:lun".into(),
        isid: [0; 6],
    };
    let offer = SealOffer::new(vec![cipher], 65536, psk(), ids.clone()).unwrap();
    let AnswerOutcome::Pending(p) =
        SealAnswer::handle_offer(&TargetSealConfig::default(), &offer.keys(), &ids, |_| {
            Some(psk())
        })
        .unwrap()
    else {
        panic!("not agreed")
    };
    let (i, c) = offer.handle_answer(p.keys()).unwrap();
    (Arc::new(i), Arc::new(p.handle_confirm(&c).unwrap()))
}

fn binding(len: usize) -> Binding {
    Binding {
        lun: 0,
        lba: 4096,
        blocks: (len / 512) as u32,
        opcode: 0x8a,
        task_tag: 1,
    }
}

fn per_cipher(c: &mut Criterion) {
    for cipher in Cipher::ALL {
        let mut g = c.benchmark_group(format!("seal/{cipher}"));
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        let (init, target) = pair(cipher);
        for size in SIZES {
            let b = binding(size);
            let plain = vec![0xa5u8; size];
            g.throughput(Throughput::Bytes(size as u64));
            g.bench_with_input(BenchmarkId::new("seal", size), &size, |bch, _| {
                bch.iter_batched(
                    || {
                        let mut buf = BytesMut::with_capacity(init.sealed_len(size).unwrap());
                        buf.extend_from_slice(&plain);
                        buf
                    },
                    |buf| init.seal(&b, buf).unwrap(),
                    BatchSize::LargeInput,
                )
            });
            // Every open needs freshly sealed data (the replay window rejects a second open of
            // the same counters); sealing happens in the untimed setup.
            g.bench_with_input(BenchmarkId::new("open", size), &size, |bch, _| {
                bch.iter_batched(
                    || BytesMut::from(&init.seal(&b, BytesMut::from(&plain[..])).unwrap()[..]),
                    |buf| target.open(&b, buf).unwrap(),
                    BatchSize::LargeInput,
                )
            });
        }
        g.finish();
    }
}

fn pool_scaling(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("pool/aes-256-gcm/seal-1MiB");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let size = 1 << 20;
    g.throughput(Throughput::Bytes(size as u64));
    let (init, _) = pair(Cipher::Aes256Gcm);
    let b = binding(size);
    let plain = vec![0x5au8; size];
    for workers in [1usize, 2] {
        let pool = CryptoPool::new(workers).unwrap();
        g.bench_with_input(BenchmarkId::new("workers", workers), &workers, |bch, _| {
            bch.iter_batched(
                || {
                    let mut buf = BytesMut::with_capacity(init.sealed_len(size).unwrap());
                    buf.extend_from_slice(&plain);
                    buf
                },
                |buf| rt.block_on(pool.seal(&init, b, buf)).unwrap(),
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, per_cipher, pool_scaling);
criterion_main!(benches);
