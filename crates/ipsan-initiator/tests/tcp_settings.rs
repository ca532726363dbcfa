//! The connection runs with the TCP settings asked for (issue 7), read back from the kernel,
//! against the in-process ipsan target whose portal has its own settings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{bounded, config};
use ipsan_initiator::{IscsiUrl, LoginOptions, Session, SessionConfig};
use ipsan_target::config::{self as tconfig, Config, TargetConfig};
use ipsan_target::ServerHandle;
use ipsan_tcp::{BufSize, TcpSettings};

const IQN: &str = "iqn.2026-11.org.ipsan:tcp-settings";

#[test]
fn session_runs_with_the_requested_congestion_control_and_buffers() {
    bounded(30, async {
        let mut c = Config {
            portals: vec!["127.0.0.1:0".parse().unwrap()],
            tcp: Some(TcpSettings::with_congestion("reno")),
            targets: vec![TargetConfig::new(
                IQN,
                tconfig::luns_from_specs(&["mem:8MiB".to_owned()]).unwrap(),
            )],
            ..Config::default()
        };
        c.validate().unwrap();
        let h = ServerHandle::start(&c).await.unwrap();
        let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
        let tcp = TcpSettings {
            congestion: Some("cubic".into()),
            rcvbuf: BufSize::Bytes(1 << 20),
            nodelay: Some(true),
            ..TcpSettings::default()
        };
        let cfg = SessionConfig {
            tcp: Some(tcp),
            ..config(LoginOptions::default())
        };
        let s = Session::open(&url, &cfg).await.unwrap();
        let f = s.tcp_in_force().expect("settings read back");
        assert_eq!(f.congestion, "cubic");
        assert!(f.rcvbuf >= 1 << 20, "rcvbuf {} below the request", f.rcvbuf);
        assert!(f.nodelay);
        let info = s.tcp_info().expect("TCP_INFO");
        assert!(info.cwnd > 0);
        s.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}
