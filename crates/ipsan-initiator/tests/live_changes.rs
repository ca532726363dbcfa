//! Live configuration changes (issue 18) seen from a logged-in initiator: a LUN in use is only
//! removed with force, and then the host is told (REPORTED LUNS DATA HAS CHANGED); a grown
//! file LUN reports CAPACITY DATA HAS CHANGED and its new size; a new LUN is usable at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{bounded, config};
use ipsan_initiator::{Error, IscsiUrl, LoginOptions, Session};
use ipsan_target::registry::ChangeError;
use ipsan_target::{Config, ServerHandle};

const IQN: &str = "iqn.2026-11.org.ipsan:live";

async fn start(dir: &std::path::Path) -> ServerHandle {
    let c = Config::from_toml(&format!(
        "[server]\nportals = [\"127.0.0.1:0\"]\n[[target]]\niqn = \"{IQN}\"\n\
         [[target.lun]]\nid = 0\nbackend = \"mem:8MiB\"\n\
         [[target.lun]]\nid = 1\nbackend = \"mem:8MiB\"\n\
         [[target.lun]]\nid = 2\nbackend = \"file:{}/l2.img,size=4MiB\"\n",
        dir.display()
    ))
    .unwrap();
    ServerHandle::start(&c).await.unwrap()
}

async fn open(h: &ServerHandle, lun: u64) -> Session {
    let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/{lun}", h.addrs[0])).unwrap();
    let s = Session::open(&url, &config(LoginOptions::default()))
        .await
        .unwrap();
    // A new I_T nexus first sees its power-on unit attention; take it out of the way.
    let _ = s.read(0, 1).await;
    s.read(0, 1).await.unwrap();
    s
}

fn unit_attention(r: Result<bytes::BytesMut, Error>) -> (u8, u8) {
    match r {
        Err(Error::Scsi { sense: Some(s), .. })
            if s.key == ipsan_scsi::SenseKey::UNIT_ATTENTION =>
        {
            (s.asc, s.ascq)
        }
        other => panic!("expected a unit attention, got {other:?}"),
    }
}

#[test]
fn removing_a_lun_in_use_needs_force_and_then_tells_the_host() {
    bounded(60, async {
        let dir = tempfile::tempdir().unwrap();
        let h = start(dir.path()).await;
        let reg = h.registry();
        let s = open(&h, 0).await;
        assert_eq!(s.report_luns().await.unwrap(), [0, 1, 2]);
        let remove_1 = |f: &mut ipsan_target::config::FileConfig| {
            f.target[0].lun.retain(|l| l.id != 1);
            Ok(())
        };
        match reg.change(false, remove_1) {
            Err(ChangeError::Refused { field, why }) => {
                assert_eq!(field, "target[0].lun");
                assert!(why.contains("in use by 1 session"), "{why}");
            }
            other => panic!("removal of a LUN in use not refused: {other:?}"),
        }
        assert_eq!(
            s.report_luns().await.unwrap(),
            [0, 1, 2],
            "refused change applied"
        );
        s.read(0, 1).await.unwrap();
        let report = reg.change(true, remove_1).unwrap();
        assert!(
            report.changes.iter().any(|c| c.contains("LUN 1 removed")),
            "{report:?}"
        );
        assert_eq!(unit_attention(s.read(0, 1).await), (0x3F, 0x0E));
        s.read(0, 1).await.unwrap();
        assert_eq!(s.report_luns().await.unwrap(), [0, 2]);
        s.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

#[test]
fn growing_a_file_lun_reports_capacity_changed_and_the_new_size() {
    bounded(60, async {
        let dir = tempfile::tempdir().unwrap();
        let h = start(dir.path()).await;
        let reg = h.registry();
        let s = open(&h, 2).await;
        assert_eq!(s.read_capacity().await.unwrap().bytes(), 4 << 20);
        let grow = |bytes: u64| {
            move |f: &mut ipsan_target::config::FileConfig| {
                let l = &mut f.target[0].lun[2];
                l.backend = l.resized_backend(bytes)?;
                Ok(())
            }
        };
        // Shrinking is refused and names the field.
        match reg.change(false, grow(2 << 20)) {
            Err(ChangeError::Refused { field, .. }) => {
                assert_eq!(field, "target[0].lun[2].backend")
            }
            other => panic!("shrink not refused: {other:?}"),
        }
        reg.change(false, grow(16 << 20)).unwrap();
        assert_eq!(unit_attention(s.read(0, 1).await), (0x2A, 0x09));
        assert_eq!(s.read_capacity().await.unwrap().bytes(), 16 << 20);
        // The grown blocks are usable.
        s.write((16 << 20) / 512 - 8, bytes::Bytes::from(vec![7u8; 4096]))
            .await
            .unwrap();
        assert_eq!(
            std::fs::metadata(dir.path().join("l2.img")).unwrap().len(),
            16 << 20
        );
        s.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

#[test]
fn a_lun_added_while_logged_in_is_usable_at_once_without_disturbing_the_session() {
    bounded(60, async {
        let dir = tempfile::tempdir().unwrap();
        let h = start(dir.path()).await;
        let reg = h.registry();
        let s = open(&h, 0).await;
        reg.change(false, |f| {
            f.target[0]
                .lun
                .push(ipsan_target::config::FileLun::new(7, "mem:4MiB".into()));
            Ok(())
        })
        .unwrap();
        // No unit attention for an addition: the running session goes on as before.
        s.read(0, 1).await.unwrap();
        assert_eq!(s.report_luns().await.unwrap(), [0, 1, 2, 7]);
        let s7 = open(&h, 7).await;
        s7.write(0, bytes::Bytes::from(vec![1u8; 512]))
            .await
            .unwrap();
        assert_eq!(&s7.read(0, 1).await.unwrap()[..], &[1u8; 512][..]);
        s7.logout().await.unwrap();
        s.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

#[test]
fn narrowing_an_allow_list_ends_only_the_sessions_it_excludes() {
    bounded(60, async {
        let dir = tempfile::tempdir().unwrap();
        let h = start(dir.path()).await;
        let reg = h.registry();
        let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
        let as_name = |name: &str| {
            config(LoginOptions {
                initiator_name: name.into(),
                ..LoginOptions::default()
            })
        };
        let keep = Session::open(&url, &as_name("iqn.2026-11.org.ipsan:keep"))
            .await
            .unwrap();
        let gone = Session::open(&url, &as_name("iqn.2026-11.org.ipsan:gone"))
            .await
            .unwrap();
        for s in [&keep, &gone] {
            let _ = s.read(0, 1).await;
            s.read(0, 1).await.unwrap();
        }
        let report = reg
            .change(false, |f| {
                f.target[0].allow = vec!["iqn.2026-11.org.ipsan:keep".into()];
                Ok(())
            })
            .unwrap();
        assert_eq!(report.sessions_dropped, 1, "{report:?}");
        keep.read(0, 1).await.unwrap();
        assert!(
            gone.read(0, 1).await.is_err(),
            "excluded session still served"
        );
        // And it cannot come back.
        assert!(Session::open(&url, &as_name("iqn.2026-11.org.ipsan:gone"))
            .await
            .is_err());
        // The ended session unregisters once its connection has closed.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while reg.sessions().len() != 1 {
            assert!(std::time::Instant::now() < deadline, "{:?}", reg.sessions());
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        keep.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

#[test]
fn logout_all_asks_with_async_event_1_and_now_ends_sessions_at_once() {
    bounded(60, async {
        let dir = tempfile::tempdir().unwrap();
        let h = start(dir.path()).await;
        let reg = h.registry();
        let call = |line: &'static [u8]| {
            let reg = reg.clone();
            tokio::task::spawn_blocking(move || ipsan_target::control::handle_line(&reg, line))
        };
        // ipsan's initiator logs out by itself when asked (AsyncEvent 1).
        let polite = open(&h, 0).await;
        let v = call(br#"{"id":1,"method":"logout_all","params":{"wait_secs":20}}"#)
            .await
            .unwrap();
        assert!(polite.logout_requested());
        assert_eq!(v["result"]["logged_out"], 1, "{v}");
        assert_eq!(v["result"]["sessions_dropped"], 0, "{v}");
        assert!(reg.sessions().is_empty());
        // `now` ends sessions without asking.
        let s = open(&h, 0).await;
        let v = call(br#"{"id":2,"method":"logout_all","params":{"now":true}}"#)
            .await
            .unwrap();
        assert_eq!(v["result"]["sessions_dropped"], 1, "{v}");
        assert!(!s.logout_requested());
        // `now` cancels the session; its connection task closes the socket and unregisters it
        // a moment later (a READ sent in that moment was seen served once in CI). Once the
        // target no longer lists it, the initiator must find it ended.
        let gone = std::time::Instant::now();
        while !reg.sessions().is_empty() {
            assert!(
                gone.elapsed() < std::time::Duration::from_secs(5),
                "the dropped session is still registered after 5 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(s.read(0, 1).await.is_err(), "ended session still served");
        h.shutdown().await.unwrap();
    });
}
