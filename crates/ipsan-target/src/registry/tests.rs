//! Unit tests of the session table: reinstatement (RFC 7143 §6.3.5), which logins may replace
//! a session (they prove as much), and the per-initiator quota by strength.

use super::*;

fn info(tsih: u16) -> SessionInfo {
    let params = iscsi_proto::params::SessionParams {
        initiator_name: "iqn.2026-11.x:ini".into(),
        target_name: Some("iqn.2026-11.x:a".into()),
        ..Default::default()
    };
    SessionInfo::new(
        &params,
        [0x80, 1, 2, 3, 4, 5],
        tsih,
        "127.0.0.1:1".parse().unwrap(),
        None,
        None,
    )
}

/// RFC 7143 §6.3.5: a login with the same InitiatorName, ISID and target ends the old
/// session, and the new one learns when the old one's commands are all done.
#[test]
fn reinstating_login_ends_the_old_session_and_waits_for_its_commands() {
    let r = Registry::build(
        &crate::Config::from_toml(
            "[[target]]\niqn = \"iqn.2026-11.x:a\"\n[[target.lun]]\nid = 0\nbackend = \"mem:4MiB\"\n",
        )
        .unwrap(),
    )
    .unwrap();
    let old = r.register(info(1)).unwrap();
    assert!(old.reinstates.is_none());
    let new = r.register(info(2)).unwrap();
    assert!(old.cancel.is_cancelled(), "the old session is told to end");
    let waits = new.reinstates.expect("a reinstatement");
    assert!(
        !waits.is_cancelled(),
        "the old session's commands still run"
    );
    old.drained.cancel();
    assert!(waits.is_cancelled());
    assert!(!new.cancel.is_cancelled());
    // The old session's late unregister leaves the new one registered.
    r.unregister(
        "iqn.2026-11.x:ini",
        [0x80, 1, 2, 3, 4, 5],
        Some("iqn.2026-11.x:a"),
        1,
    );
    assert_eq!(r.session_count(), 1);
}

fn registry(max_sessions: usize) -> Arc<Registry> {
    let mut c = crate::Config::from_toml(
        "[[target]]\niqn = \"iqn.2026-11.x:a\"\n[[target.lun]]\nid = 0\nbackend = \"mem:4MiB\"\n",
    )
    .unwrap();
    c.limits.max_sessions_per_initiator = max_sessions;
    Arc::new(Registry::build(&c).unwrap())
}

const NONE: Authentication = Authentication {
    chap_user: None,
    seal: None,
};

fn chap(user: &str) -> Authentication {
    Authentication {
        chap_user: Some(user.into()),
        seal: None,
    }
}

fn sealed(which: crate::config::SealSecret) -> Authentication {
    Authentication {
        chap_user: None,
        seal: Some(which),
    }
}

/// The order of proofs: a replacement proves everything the old session proved.
#[test]
fn accepts_only_replacements_that_prove_as_much() {
    use crate::config::SealSecret::{Initiator, TargetWide};
    let both = Authentication {
        chap_user: Some("alice".into()),
        seal: Some(TargetWide),
    };
    for (new, old, ok) in [
        (&NONE, &NONE, true),
        (&chap("alice"), &NONE, true),
        (&NONE, &chap("alice"), false),
        (&chap("bob"), &chap("alice"), false),
        (&chap("alice"), &chap("alice"), true),
        (&sealed(TargetWide), &sealed(TargetWide), true),
        (&sealed(Initiator), &sealed(TargetWide), true),
        (&sealed(TargetWide), &sealed(Initiator), false),
        (&NONE, &sealed(TargetWide), false),
        (&chap("alice"), &sealed(TargetWide), false),
        (&sealed(TargetWide), &both, false),
        (&chap("alice"), &both, false),
        (&both, &both, true),
    ] {
        assert_eq!(new.covers(old), ok, "{new} replacing {old}");
    }
}

/// A login that would reinstate a sealed session without Seal is refused with 0x0201
/// before it is answered, and again at registration if it raced past that; the sealed
/// session is never told to end. The same proof reinstates it.
#[test]
fn rejects_a_weaker_reinstatement_and_leaves_the_old_session_running() {
    let r = registry(8);
    let own = sealed(crate::config::SealSecret::Initiator);
    let old = r.register(info(1).with_auth(own.clone())).unwrap();
    let isid = [0x80, 1, 2, 3, 4, 5];
    let f = r
        .admit("iqn.2026-11.x:ini", isid, Some("iqn.2026-11.x:a"), &NONE)
        .unwrap_err();
    assert_eq!(f.status, LoginStatus::AUTHENTICATION_FAILURE);
    assert!(r.register(info(2)).is_err(), "the raced registration");
    assert!(!old.cancel.is_cancelled(), "the sealed session runs on");
    assert_eq!(r.stats.snapshot().outranked_rejects, 2);
    // Another ISID is another session: no replacement, admitted.
    let other = r.admit(
        "iqn.2026-11.x:ini",
        [0x80, 9, 9, 9, 9, 9],
        Some("iqn.2026-11.x:a"),
        &NONE,
    );
    assert!(other.is_ok());
    let slot = r
        .admit("iqn.2026-11.x:ini", isid, Some("iqn.2026-11.x:a"), &own)
        .unwrap();
    let new = r.register(info(3).with_auth(slot.auth().clone())).unwrap();
    assert!(old.cancel.is_cancelled(), "the same proof reinstates");
    assert!(new.reinstates.is_some());
}

/// The quota counts, for a login, the name's sessions at least as strong as it: weaker
/// sessions (and weaker logins in progress) never use up a stronger login's room.
#[test]
fn rejects_over_quota_only_among_sessions_at_least_as_strong() {
    let r = registry(2);
    let t = Some("iqn.2026-11.x:a");
    let ini = "iqn.2026-11.x:ini";
    let own = sealed(crate::config::SealSecret::Initiator);
    for (i, tsih) in [(1u8, 1u16), (2, 2)] {
        let mut x = info(tsih);
        x.isid[5] = i;
        r.register(x).unwrap();
    }
    let pending = r.admit(ini, [0x80, 0, 0, 0, 0, 3], t, &NONE);
    assert_eq!(
        pending.unwrap_err().status,
        LoginStatus::OUT_OF_RESOURCES,
        "plaintext counts every session"
    );
    let a = r.admit(ini, [0x80, 0, 0, 0, 0, 4], t, &own).unwrap();
    let b = r.admit(ini, [0x80, 0, 0, 0, 0, 5], t, &own).unwrap();
    assert_eq!(
        r.admit(ini, [0x80, 0, 0, 0, 0, 6], t, &own)
            .unwrap_err()
            .status,
        LoginStatus::OUT_OF_RESOURCES,
        "sealed logins in progress count for sealed logins"
    );
    drop((a, b));
    assert!(r.admit(ini, [0x80, 0, 0, 0, 0, 6], t, &own).is_ok());
}
