//! What one DH-HMAC-CHAP transaction costs each side, per DH group (the exponentiations
//! dominate: the controller makes its key and the session key, the host the same). A
//! measurement, not a check: ignored; run it optimized,
//! `cargo test --release -p nvme-proto --test auth_cost -- --ignored --nocapture`.
//! The controller's share runs on the connection's task when the target calls
//! `ControllerAuth` inline (docs/results/nvme-auth-linux/README.md quotes a run).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme_proto::auth::{AuthConfig, ControllerAuth, DhGroup, DhchapSecret, HostAuth, HostStep};

#[test]
#[ignore = "a measurement; run with --release --ignored --nocapture"]
fn reports_transaction_cost_per_group() {
    const ROUNDS: u32 = 10;
    for group in DhGroup::ALL {
        let mut cfg = AuthConfig::new(
            DhchapSecret::from_key(&[1; 32], None).unwrap(),
            Some(DhchapSecret::from_key(&[2; 32], None).unwrap()),
        );
        cfg.dh_groups = vec![group];
        let cfg = Arc::new(cfg);
        let (mut ctrl_time, mut host_time) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..ROUNDS {
            let mut host = HostAuth::new(cfg.clone(), "nqn.h", "nqn.s", 1);
            let mut ctrl = ControllerAuth::new(cfg.clone(), "nqn.h", "nqn.s");
            let t = Instant::now();
            let negotiate = host.start();
            host_time += t.elapsed();
            let t = Instant::now();
            ctrl.auth_send(&negotiate).unwrap();
            let challenge = ctrl.auth_receive(4096).unwrap();
            ctrl_time += t.elapsed();
            let t = Instant::now();
            let HostStep::SendThenReceive(reply) = host.receive(&challenge) else {
                panic!("no reply")
            };
            host_time += t.elapsed();
            let t = Instant::now();
            ctrl.auth_send(&reply).unwrap();
            let success1 = ctrl.auth_receive(4096).unwrap();
            ctrl_time += t.elapsed();
            let t = Instant::now();
            let HostStep::SendThenDone(success2) = host.receive(&success1) else {
                panic!("no success2")
            };
            host_time += t.elapsed();
            let t = Instant::now();
            ctrl.auth_send(&success2).unwrap();
            ctrl_time += t.elapsed();
            assert!(ctrl.is_authenticated());
        }
        println!(
            "{:>9}: controller {:>7.2} ms, host {:>7.2} ms per bidirectional transaction",
            group.name(),
            ctrl_time.as_secs_f64() * 1e3 / f64::from(ROUNDS),
            host_time.as_secs_f64() * 1e3 / f64::from(ROUNDS),
        );
    }
}
