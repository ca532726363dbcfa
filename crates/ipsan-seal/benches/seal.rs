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

/// Record protection (docs/seal.md §4a): what every PDU costs, protect on the sender plus
/// verify on the receiver, for a SCSI Command (header only MACed) and a SCSI Response with
/// 18 bytes of sense (header and data MACed).
fn record(c: &mut Criterion<ThreadCpu>) {
    use iscsi_wire::header::{ScsiCommand, ScsiResponse, TaskAttr};
    use iscsi_wire::Pdu;
    let cmd = Pdu::new(
        ScsiCommand {
            immediate: false,
            final_: true,
            read: false,
            write: true,
            attr: TaskAttr::SIMPLE,
            lun: 0,
            itt: 7,
            expected_data_transfer_length: 4096 + 24,
            cmd_sn: 1,
            exp_stat_sn: 1,
            cdb: [0x2a, 0, 0, 0, 0, 8, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0],
        },
        bytes::Bytes::from(vec![0u8; 4096 + 24]),
    );
    let resp = Pdu::new(
        ScsiResponse {
            bidi_overflow: false,
            bidi_underflow: false,
            overflow: false,
            underflow: false,
            response: 0,
            status: 2,
            itt: 7,
            snack_tag: 0,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 9,
            exp_data_sn: 0,
            bidi_read_residual_count: 0,
            residual_count: 0,
        },
        bytes::Bytes::from(vec![0x70u8; 20]),
    );
    for cipher in [Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305, Cipher::None] {
        let mut g = c.benchmark_group(format!("record/{cipher}"));
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1));
        for (name, pdu) in [("scsi-command-4KiB", &cmd), ("scsi-response-sense", &resp)] {
            let (mut sealer, mut opener) = ipsan_seal::record::pair_for_test(cipher, 1);
            g.bench_function(format!("protect+verify/{name}"), |bch| {
                bch.iter(|| {
                    let mut p = pdu.clone();
                    sealer.protect(&mut p).unwrap();
                    // What the codec hands the receiver: the BHS as on the wire.
                    let mut wire = BytesMut::new();
                    iscsi_wire::Codec::default().encode(&p, &mut wire).unwrap();
                    let mut rx = iscsi_wire::Codec {
                        max_recv_data_segment_length: 1 << 20,
                        ..iscsi_wire::Codec::default()
                    }
                    .decode(&mut wire)
                    .unwrap()
                    .unwrap();
                    opener.verify(&mut rx).unwrap();
                })
            });
            let (mut sealer, _) = ipsan_seal::record::pair_for_test(cipher, 1);
            g.bench_function(format!("protect/{name}"), |bch| {
                bch.iter(|| {
                    let mut p = pdu.clone();
                    sealer.protect(&mut p).unwrap();
                    p
                })
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

criterion_group! {
    name = cpu;
    config = Criterion::default().with_measurement(ThreadCpu);
    targets = per_cipher, copy_then_seal, record
}
criterion_group!(wall, pool_scaling);
criterion_main!(cpu, wall);
