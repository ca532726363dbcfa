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
            chap_hosts: Vec::new(),
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
    // The target refuses secret files others can read.
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
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

/// LOGICAL UNIT RESET (RFC 7143 §11.5.1) against the real target: completed, the next
/// command of another session reports the reset as a unit attention (29h), acknowledged
/// writes survive it, and the session goes on.
#[test]
fn lun_reset_completes_sets_a_unit_attention_and_keeps_acknowledged_data() {
    bounded(30, async {
        let (h, url) = start(None).await;
        let cfg = config(LoginOptions::default());
        let a = Session::open(&url, &cfg).await.unwrap();
        let b = Session::open(&url, &cfg).await.unwrap();
        let bl = a.capacity().unwrap().block_len as usize;
        a.write(7, Bytes::from(vec![0x5a; bl])).await.unwrap();
        a.lun_reset().await.unwrap();
        // The other session's next command reports the reset (SAM-5 §6.3.2: 29h/03h, LUN
        // reset; 29h/00h also allowed), once.
        let err = b.read(7, 1).await.unwrap_err();
        let sense = err.sense().cloned().unwrap_or_else(|| panic!("{err}"));
        assert_eq!((sense.key.0, sense.asc), (0x06, 0x29), "{err}");
        let got = b.read(7, 1).await.unwrap();
        assert_eq!(
            &got[..],
            &vec![0x5a; bl][..],
            "acknowledged data survives a reset"
        );
        // The resetting session goes on too.
        a.write(8, Bytes::from(vec![0x33; bl]))
            .await
            .unwrap_or_else(|e| {
                assert_eq!(
                    e.sense().map(|s| (s.key.0, s.asc)),
                    Some((0x06, 0x29)),
                    "{e}"
                );
            });
        drop((a, b));
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

/// A toy, length-preserving transform: XOR READ/WRITE payloads with a byte derived from the
/// LBA, and record every command it saw.
#[derive(Debug, Default)]
struct Xor {
    seen: std::sync::Mutex<Vec<ipsan_initiator::CommandInfo>>,
}

fn xor(cmd: &ipsan_initiator::CommandInfo, data: &mut [u8]) {
    if matches!(cmd.opcode, 0x88 | 0x8a) {
        for (i, b) in data.iter_mut().enumerate() {
            *b ^= (cmd.lba as u8).wrapping_add((i / 512) as u8) | 0x80;
        }
    }
}

impl ipsan_initiator::PayloadTransform for Xor {
    fn wire_len(&self, plain_len: usize) -> Option<usize> {
        Some(plain_len)
    }
    fn outbound(
        &self,
        cmd: ipsan_initiator::CommandInfo,
        data: Bytes,
    ) -> ipsan_initiator::TransformFuture<Bytes> {
        self.seen.lock().unwrap().push(cmd);
        Box::pin(async move {
            let mut d = data.to_vec();
            xor(&cmd, &mut d);
            Ok(Bytes::from(d))
        })
    }
    fn inbound(
        &self,
        cmd: ipsan_initiator::CommandInfo,
        mut data: bytes::BytesMut,
    ) -> ipsan_initiator::TransformFuture<bytes::BytesMut> {
        self.seen.lock().unwrap().push(cmd);
        Box::pin(async move {
            xor(&cmd, &mut data);
            Ok(data)
        })
    }
}

#[test]
fn payload_transform_sees_every_command_and_changes_the_wire_bytes() {
    bounded(30, async {
        let (h, url) = start(None).await;
        let cfg = config(LoginOptions::default());
        let plain = Session::open(&url, &cfg).await.unwrap();
        let mut sealed = Session::open(&url, &cfg).await.unwrap();
        let t = std::sync::Arc::new(Xor::default());
        sealed.set_transform(t.clone());
        let data = Bytes::from(vec![0x11u8; 4 * 512]);
        sealed.write(40, data.clone()).await.unwrap();
        assert_eq!(&sealed.read(40, 4).await.unwrap()[..], &data[..]);
        let raw = plain.read(40, 4).await.unwrap();
        assert_ne!(
            &raw[..],
            &data[..],
            "the target must hold transformed bytes"
        );
        sealed.inquiry().await.unwrap();
        let seen = t.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert_eq!((seen[0].opcode, seen[0].lba, seen[0].blocks), (0x8a, 40, 4));
        assert_eq!((seen[1].opcode, seen[1].lba), (0x88, 40));
        assert_eq!((seen[2].opcode, seen[2].lba, seen[2].blocks), (0x12, 0, 0));
        assert_ne!(seen[0].itt, seen[1].itt);
        drop((plain, sealed));
        h.shutdown().await.unwrap();
    });
}
