#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Seal/open throughput per cipher on one core at 4 KiB, 64 KiB and 1 MiB (64 KiB chunks), and
//! the crypto pool's scaling with 1 and 2 workers on 1 MiB commands.
//!
//! `cargo bench -p ipsan-seal --bench seal` (results in docs/seal.md).
//!
//! The per-cipher groups are measured in **thread CPU time** (`CLOCK_THREAD_CPUTIME_ID`), so
//! "per core" means per core-second actually spent, even when the machine is shared and the
//! thread gets descheduled. The pool group is measured in wall time, since parallel speed-up is
//! what it shows.

use std::sync::Arc;
use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter};

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

/// Iterations per timed batch: enough that the clock read is negligible, few enough that the
/// pre-built inputs stay small.
fn batch(size: usize) -> u64 {
    ((4 << 20) / size).clamp(4, 256) as u64
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

/// CPU time consumed by the calling thread.
struct ThreadCpu;

#[allow(unsafe_code)]
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call, and
    // CLOCK_THREAD_CPUTIME_ID is supported on every Linux the project targets.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Measurement for ThreadCpu {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, i: u64) -> u64 {
        thread_cpu_ns() - i
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, ns: f64, values: &mut [f64]) -> &'static str {
        let (factor, unit) = if ns < 1e3 {
            (1.0, "ns cpu")
        } else if ns < 1e6 {
            (1e-3, "µs cpu")
        } else if ns < 1e9 {
            (1e-6, "ms cpu")
        } else {
            (1e-9, "s cpu")
        };
        values.iter_mut().for_each(|v| *v *= factor);
        unit
    }

    fn scale_throughputs(&self, _typical: f64, t: &Throughput, values: &mut [f64]) -> &'static str {
        let bytes = match *t {
            Throughput::Bytes(b) | Throughput::BytesDecimal(b) => b as f64,
            Throughput::Elements(e) => e as f64,
        };
        values
            .iter_mut()
            .for_each(|v| *v = bytes * 1e9 / *v / (1024.0 * 1024.0 * 1024.0));
        "GiB/s per core"
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn per_cipher(c: &mut Criterion<ThreadCpu>) {
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
                    BatchSize::NumIterations(batch(size)),
                )
            });
            // Every open needs freshly sealed data (the replay window rejects a second open of
            // the same counters); sealing happens in the untimed setup.
            g.bench_with_input(BenchmarkId::new("open", size), &size, |bch, _| {
                bch.iter_batched(
                    || BytesMut::from(&init.seal(&b, BytesMut::from(&plain[..])).unwrap()[..]),
                    |buf| target.open(&b, buf).unwrap(),
                    BatchSize::NumIterations(batch(size)),
                )
            });
        }
        g.finish();
    }
}

/// What the runtimes do with data they must keep (the initiator's write payload, the target's
/// Data-In from the device server): copy the whole command and then seal it in place (two
/// passes over memory), or `seal_copy`, which copies and seals chunk by chunk (one pass).
fn copy_then_seal(c: &mut Criterion<ThreadCpu>) {
    for cipher in [Cipher::Aes256Gcm, Cipher::None] {
        let mut g = c.benchmark_group(format!("seal-a-copy/{cipher}"));
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        let (init, _) = pair(cipher);
        let size = 1 << 20;
        let b = binding(size);
        let plain = bytes::Bytes::from(vec![0xa5u8; size]);
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function("copy-then-seal-1MiB", |bch| {
            bch.iter(|| {
                let mut buf = BytesMut::with_capacity(init.sealed_len(size).unwrap());
                buf.extend_from_slice(&plain);
                init.seal(&b, buf).unwrap()
            })
        });
        g.bench_function("seal_copy-1MiB", |bch| {
            bch.iter(|| init.seal_copy(&b, &plain).unwrap())
        });
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

criterion_group! {
    name = cpu;
    config = Criterion::default().with_measurement(ThreadCpu);
    targets = per_cipher, copy_then_seal
}
criterion_group!(wall, pool_scaling);
criterion_main!(cpu, wall);
