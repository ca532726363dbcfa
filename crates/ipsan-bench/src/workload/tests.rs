//! Unit tests of the workload engine: the pattern, the generator, pacing, histograms, CPU
//! accounting and the JSON report's schema.

use super::*;
use crate::report::{git_rev, Host, Report, TargetInfo};

#[test]
fn pattern_round_trips_and_names_first_bad_lba() {
    let mut buf = vec![0u8; 8 * 512];
    fill_pattern(&mut buf, 100, 512, 42);
    let mut scratch = Vec::new();
    check_pattern(&buf, 100, 512, 42, &mut scratch).unwrap();
    buf[3 * 512 + 200] ^= 0x10;
    match check_pattern(&buf, 100, 512, 42, &mut scratch) {
        Err(BenchError::Verify { lba, found_lba, .. }) => {
            assert_eq!(lba, 103);
            assert_eq!(found_lba, 103);
        }
        other => panic!("expected a verify error, got {other:?}"),
    }
}

#[test]
fn pattern_catches_misplaced_block_and_wrong_seed() {
    let mut a = vec![0u8; 512];
    fill_pattern(&mut a, 7, 512, 1);
    let mut scratch = Vec::new();
    let e = check_pattern(&a, 8, 512, 1, &mut scratch).unwrap_err();
    assert!(matches!(
        e,
        BenchError::Verify {
            lba: 8,
            found_lba: 7,
            ..
        }
    ));
    assert!(check_pattern(&a, 7, 512, 2, &mut scratch).is_err());
}

#[test]
fn generator_is_deterministic_and_respects_mix() {
    let w = Workload {
        mode: RwMode::RandRw,
        mix_read_percent: 70,
        block_size: 4096,
        depth: 1,
        offset: 0,
        limit: Limit::Bytes(1 << 30),
        verify: false,
        seed: 9,
        data: None,
        rate: None,
        sink: Default::default(),
    };
    let g = Generator::new(&w, 1000);
    let ops: Vec<Op> = (0..10_000).map(|i| g.op(i)).collect();
    assert_eq!(ops, (0..10_000).map(|i| g.op(i)).collect::<Vec<_>>());
    let reads = ops.iter().filter(|o| o.read).count();
    assert!((6_500..7_500).contains(&reads), "{reads}");
    assert!(ops.iter().all(|o| o.unit < 1000));
    let seq = Generator::new(
        &Workload {
            mode: RwMode::Write,
            ..w
        },
        4,
    );
    let units: Vec<u64> = (0..6).map(|i| seq.op(i).unit).collect();
    assert_eq!(units, vec![0, 1, 2, 3, 0, 1]);
    assert!(!seq.op(0).read);
}

#[test]
fn paces_command_i_at_i_blocks_over_the_rate() {
    let t0 = Instant::now();
    assert_eq!(pace_at(t0, 5, 65536, None), None);
    assert_eq!(pace_at(t0, 5, 65536, Some(0)), None);
    assert_eq!(pace_at(t0, 0, 65536, Some(1 << 20)), Some(t0));
    // 1 MiB/s of 64 KiB commands: one every 62.5 ms.
    assert_eq!(
        pace_at(t0, 3, 65536, Some(1 << 20)),
        Some(t0 + Duration::from_micros(187_500))
    );
}

#[test]
fn histogram_percentiles_are_in_microseconds() {
    let mut h = histogram();
    for v in 1..=1000u64 {
        h.record(v * 1000).unwrap();
    }
    let l = Latency::from_histogram(&h);
    assert!((l.p50 - 500.0).abs() < 1.0, "{l:?}");
    assert!((l.p99 - 990.0).abs() < 2.0, "{l:?}");
    assert!((l.max - 1000.0).abs() < 1.0, "{l:?}");
}

#[test]
fn parses_sizes_and_durations() {
    assert_eq!(parse_size("64KiB").unwrap(), 65536);
    assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
    assert_eq!(parse_size("4k").unwrap(), 4096);
    assert_eq!(parse_size("1MB").unwrap(), 1_000_000);
    assert!(parse_size("1XB").is_err());
    assert!(parse_size("").is_err());
    assert!(parse_size("99999999999999999999").is_err());
    assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
    assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
    assert!(parse_duration("0s").is_err());
    assert!(parse_duration("5 parsecs").is_err());
}

#[test]
fn cpu_usage_counts_busy_time() {
    // Spin until 100 ms of CPU time have been charged to us (bounded by 10 s of wall time
    // on a loaded machine); a broken reading would never get there.
    let s = cpu_times();
    let t = Instant::now();
    let mut x = 0u64;
    let mut used = 0.0;
    while used < 0.1 && t.elapsed() < Duration::from_secs(10) {
        for _ in 0..100_000 {
            x = splitmix64(x);
        }
        let now = cpu_times();
        used = (now.0 - s.0) + (now.1 - s.1);
    }
    std::hint::black_box(x);
    let c = CpuUsage::between(s, cpu_times(), t.elapsed());
    assert!(c.user_s + c.sys_s >= 0.1, "{c:?}");
    assert!(c.percent_of_one_core > 0.0 && c.percent_of_all_cores <= c.percent_of_one_core);
}

#[test]
fn json_report_has_the_documented_schema() {
    let h = histogram();
    let lat = Latency::from_histogram(&h);
    let report = Report {
        schema: "ipsan-bench/1",
        tool: "ipsan bench",
        version: "0",
        git_rev: git_rev().to_owned(),
        started_unix_s: 1,
        host: Host::detect(),
        target: TargetInfo {
            url: "iscsi://h:3260/iqn.x/0".into(),
            vendor: "v".into(),
            product: "p".into(),
            revision: "r".into(),
            capacity_bytes: 1 << 20,
            block_len: 512,
        },
        workload: WorkloadInfo::from(&Workload {
            mode: RwMode::RandRw,
            mix_read_percent: 70,
            block_size: 4096,
            depth: 4,
            offset: 0,
            limit: Limit::Time(Duration::from_secs(3)),
            verify: true,
            seed: 5,
            data: None,
            rate: None,
            sink: Default::default(),
        }),
        negotiated: Some(ipsan_initiator::Negotiated::rfc_defaults()),
        nvme: None,
        result: Measured {
            duration_s: 1.0,
            ops: 0,
            read_ops: 0,
            write_ops: 0,
            bytes: 0,
            read_bytes: 0,
            write_bytes: 0,
            throughput_mb_s: 0.0,
            throughput_mib_s: 0.0,
            iops: 0.0,
            latency_us: lat.clone(),
            read_latency_us: Some(lat),
            write_latency_us: None,
            cpu: CpuUsage::between((0.0, 0.0), (0.5, 0.25), Duration::from_secs(1)),
            verify: VerifyResult {
                enabled: true,
                checked_blocks: 0,
            },
        },
        tcp: None,
        depth_auto: None,
        recovery: Some(ipsan_initiator::RecoveryStats::default()),
    };
    let v: serde_json::Value = serde_json::from_str(&report.to_json().unwrap()).unwrap();
    // The fields docs/bench.md promises to the lab.
    for path in [
        "/schema",
        "/git_rev",
        "/host/cpus",
        "/host/load_average/2",
        "/target/capacity_bytes",
        "/workload/rw",
        "/workload/time_s",
        "/workload/size_bytes",
        "/negotiated/initial_r2t",
        "/negotiated/target_max_recv_data_segment_length",
        "/result/throughput_mb_s",
        "/result/throughput_mib_s",
        "/result/iops",
        "/result/latency_us/p99_9",
        "/result/read_latency_us/p50",
        "/result/write_latency_us",
        "/result/cpu/percent_of_one_core",
        "/result/verify/checked_blocks",
    ] {
        assert!(v.pointer(path).is_some(), "missing {path}");
    }
    assert_eq!(v["schema"], "ipsan-bench/1");
    assert_eq!(v["workload"]["rw"], "randrw");
    assert_eq!(v["workload"]["time_s"], 3.0);
    assert!(v["workload"]["size_bytes"].is_null());
    assert_eq!(v["result"]["cpu"]["percent_of_one_core"], 75.0);
}
/// A device that notes the thread each command ran on; a read waits (up to 2 s) until
/// `wait_for` threads have been seen, so one runtime's workers cannot finish the run
/// before the other's have started.
struct Threads {
    seen: Mutex<std::collections::HashSet<std::thread::ThreadId>>,
    wait_for: AtomicU64,
}

impl Threads {
    fn seen(&self) -> usize {
        self.seen.lock().map_or(0, |g| g.len())
    }
}

impl BlockIo for Threads {
    fn capacity(&self) -> Option<Capacity> {
        Some(Capacity {
            blocks: 1 << 20,
            block_len: 512,
        })
    }
    async fn read_into(&self, _lba: u64, blocks: u32, _buf: BytesMut) -> Result<Bytes, Error> {
        if let Ok(mut g) = self.seen.lock() {
            g.insert(std::thread::current().id());
        }
        let until = Instant::now() + Duration::from_secs(2);
        while (self.seen() as u64) < self.wait_for.load(Ordering::Relaxed) && Instant::now() < until
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(Bytes::from(vec![0u8; blocks as usize * 512]))
    }
    async fn write(&self, _lba: u64, _data: Bytes) -> Result<(), Error> {
        Ok(())
    }
}

#[test]
fn runs_worker_k_on_runtime_k_mod_n() {
    let here = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let other = ipsan_initiator::nvme::RuntimeThreads::spawn(1, "test").unwrap();
    let there = other.handles()[0].clone();
    let there_id = here
        .block_on(there.spawn(async { std::thread::current().id() }))
        .unwrap();
    let dev = Arc::new(Threads {
        seen: Mutex::default(),
        wait_for: AtomicU64::new(2),
    });
    let w = Workload {
        mode: RwMode::Read,
        mix_read_percent: 100,
        block_size: 4096,
        depth: 4,
        offset: 0,
        limit: Limit::Bytes(64 * 4096),
        verify: false,
        seed: 1,
        data: None,
        rate: None,
        sink: Default::default(),
    };
    let runtimes = [here.handle().clone(), there];
    let (m, _) = here
        .block_on(run_on_threads(
            dev.clone(),
            w.clone(),
            None,
            None,
            &runtimes,
        ))
        .unwrap();
    assert_eq!(m.ops, 64);
    let seen = dev.seen.lock().unwrap().clone();
    let want: std::collections::HashSet<_> = [std::thread::current().id(), there_id]
        .into_iter()
        .collect();
    assert_eq!(seen, want, "the workers ran on both runtimes' threads");
    // Without runtimes, on the caller's only.
    dev.seen.lock().unwrap().clear();
    dev.wait_for.store(0, Ordering::Relaxed);
    here.block_on(run_on(dev.clone(), w, None, None)).unwrap();
    assert_eq!(dev.seen(), 1);
    drop(other);
}
