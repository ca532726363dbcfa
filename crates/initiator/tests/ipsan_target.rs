//! The initiator against the ipsan target itself, in-process on 127.0.0.1:0 with RAM LUNs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use bytes::Bytes;
use common::{bounded, config};
use ipsan_initiator::{
    discover, ChapCredentials, ChapSecret, DigestChoice, Error, IscsiUrl, LoginOptions, Session,
};
use ipsan_target::config::{self as tconfig, Config, TargetConfig};
use ipsan_target::ServerHandle;

const IQN: &str = "iqn.2026-11.org.ipsan:initiator-test";

/// (user, secret file, optional (mutual user, mutual secret file)), as `ipsan target` flags.
type ChapArg<'a> = (&'a str, &'a Path, Option<(&'a str, &'a Path)>);

async fn start(chap: Option<ChapArg<'_>>) -> (ServerHandle, IscsiUrl) {
    let chap = chap.map(|(u, f, m)| tconfig::chap_from_flags(u, f, m).unwrap());
    let mut c = Config {
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        targets: vec![TargetConfig {
            iqn: IQN.into(),
            alias: None,
            allow: Vec::new(),
            chap,
            seal: Default::default(),
            luns: tconfig::luns_from_specs(&["mem:32MiB".to_owned()]).unwrap(),
        }],
        ..Config::default()
    };
    c.validate().unwrap();
    let h = ServerHandle::start(&c).await.unwrap();
    let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
    (h, url)
}

fn secret_file(dir: &tempfile::TempDir, name: &str, secret: &str) -> std::path::PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, secret).unwrap();
    p
}

fn chap(user: &str, pw: &str) -> ChapCredentials {
    ChapCredentials {
        name: user.into(),
        secret: ChapSecret::new(pw.as_bytes().to_vec()).unwrap(),
    }
}

#[test]
fn accepts_plain_login_discovery_and_inquiry() {
    bounded(30, async {
        let (h, url) = start(None).await;
        let s = Session::open(&url, &config(LoginOptions::default()))
            .await
            .unwrap();
        assert_eq!(s.capacity().unwrap().bytes(), 32 << 20);
        s.inquiry().await.unwrap();
        s.sync_cache().await.unwrap();
        s.logout().await.unwrap();
        let mut d = url.clone();
        d.target = None;
        d.lun = None;
        let found = discover(&d, &config(LoginOptions::default()))
            .await
            .unwrap();
        assert!(found.iter().any(|t| t.name == IQN), "{found:?}");
        h.shutdown().await.unwrap();
    });
}

#[test]
fn accepts_chap_and_mutual_chap_and_refuses_wrong_secret() {
    bounded(30, async {
        let dir = tempfile::tempdir().unwrap();
        let sf = secret_file(&dir, "s", "initiator-secret-1");
        let mf = secret_file(&dir, "m", "target-secret-22222");
        let (h, url) = start(Some(("alice", &sf, Some(("tgt", &mf))))).await;
        let o = LoginOptions {
            chap: Some(chap("alice", "initiator-secret-1")),
            mutual_chap: Some(chap("tgt", "target-secret-22222")),
            ..LoginOptions::default()
        };
        let s = Session::open(&url, &config(o.clone())).await.unwrap();
        assert!(s.params().target_authenticated);
        s.logout().await.unwrap();

        let mut bad = o.clone();
        bad.chap = Some(chap("alice", "not-the-secret-99"));
        let err = Session::open(&url, &config(bad)).await.unwrap_err();
        assert!(
            matches!(err, Error::LoginRefused { class: 2, .. }),
            "wrong secret must be refused: {err}"
        );
        let mut bad_target = o;
        bad_target.mutual_chap = Some(chap("tgt", "wrong-target-secret"));
        let err = Session::open(&url, &config(bad_target)).await.unwrap_err();
        assert!(err.to_string().contains("failed to authenticate"), "{err}");
        h.shutdown().await.unwrap();
    });
}

#[test]
fn surfaces_lba_out_of_range_with_sense() {
    bounded(30, async {
        let (h, url) = start(None).await;
        let s = Session::open(&url, &config(LoginOptions::default()))
            .await
            .unwrap();
        let cap = s.capacity().unwrap();
        let err = s.read(cap.blocks, 1).await.unwrap_err();
        assert!(
            err.sense().is_some_and(|s| s.is_lba_out_of_range()),
            "{err}"
        );
        let bl = cap.block_len as usize;
        let err = s
            .write(cap.blocks - 1, Bytes::from(vec![0u8; 2 * bl]))
            .await
            .unwrap_err();
        assert!(
            err.sense().is_some_and(|s| s.is_lba_out_of_range()),
            "{err}"
        );
        s.read(0, 1).await.unwrap();
        drop(s);
        h.shutdown().await.unwrap();
    });
}

#[test]
fn round_trips_with_fast_parameters() {
    bounded(120, async {
        let (h, url) = start(None).await;
        common::round_trip(url, LoginOptions::default(), |n| {
            assert!(n.immediate_data, "{n:?}");
        })
        .await;
        h.shutdown().await.unwrap();
    });
}

#[test]
fn round_trips_with_rfc_defaults_and_digests() {
    bounded(120, async {
        let (h, url) = start(None).await;
        let mut o = LoginOptions::rfc_defaults();
        o.digest = DigestChoice::Both;
        common::round_trip(url, o, |n| {
            assert!(n.header_digest && n.data_digest && n.initial_r2t, "{n:?}");
        })
        .await;
        h.shutdown().await.unwrap();
    });
}

#[test]
fn round_trips_with_r2t_only_writes() {
    bounded(120, async {
        let (h, url) = start(None).await;
        let o = LoginOptions {
            immediate_data: false,
            initial_r2t: true,
            max_burst_length: 65536,
            ..LoginOptions::default()
        };
        common::round_trip(url, o, |n| {
            assert!(n.initial_r2t && !n.immediate_data, "{n:?}");
        })
        .await;
        h.shutdown().await.unwrap();
    });
}
