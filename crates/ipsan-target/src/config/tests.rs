//! Unit tests of the target's configuration: validation, Seal secrets, CHAP, limits and the
//! file form.

use super::*;

/// A name with its own Seal secret gets only that one, however its letters are cased
/// (iSCSI names are case-folded); other names get the target-wide secret.
#[test]
fn rejects_target_wide_secret_for_names_with_their_own() {
    let psk = |b: &[u8]| Psk::new(b.to_vec()).unwrap();
    let s = SealSettings {
        policy: SealPolicy::Allowed,
        secret: Some(psk(b"target-wide-secret-0123")),
        initiators: vec![(
            "iqn.2026-11.x:host-a".into(),
            psk(b"host-a-own-secret-0123"),
        )],
    };
    for name in ["iqn.2026-11.x:host-a", "IQN.2026-11.X:HOST-A"] {
        let (p, which) = s.secret_for(name).unwrap();
        assert_eq!(which, SealSecret::Initiator, "{name}");
        assert!(p.ct_eq(&psk(b"host-a-own-secret-0123")), "{name}");
    }
    let (p, which) = s.secret_for("iqn.2026-11.x:host-b").unwrap();
    assert_eq!(which, SealSecret::TargetWide);
    assert!(p.ct_eq(&psk(b"target-wide-secret-0123")));
}

fn remote_toml(key: &Path, lun1_extra: &str) -> String {
    format!(
        r#"
[[target]]
iqn = "iqn.2026-11.org.ipsan:gw"
[[target.lun]]
id = 0
backend = "iscsi://10.231.0.2:3260/iqn.2026-11.org.ipsan:disk0/0"
seal = "aes-256-gcm"
secret_file = "{k}"
depth = 8
[[target.lun]]
id = 1
backend = "iscsi://10.231.0.2:3260/iqn.2026-11.org.ipsan:disk0/1"
{lun1_extra}
"#,
        k = key.display()
    )
}

fn key_file(dir: &Path) -> PathBuf {
    let k = dir.join("wan.key");
    std::fs::write(&k, "0123456789abcdef0123456789abcdef").unwrap();
    std::fs::set_permissions(&k, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    k
}

fn chap_host_toml(entries: &str) -> String {
    format!("[[target]]\niqn = \"iqn.2026-11.x:y\"\n{entries}[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\n")
}

#[test]
fn accepts_per_host_chap_bound_to_names() {
    let c = Config::from_toml(&chap_host_toml(
            "[[target.chap_host]]\nuser = \"a\"\nsecret = \"secret-of-host-a\"\nnames = [\"iqn.2026-11.x:a\", \"iqn.2026-11.x:a2\"]\n[[target.chap_host]]\nuser = \"b\"\nsecret = \"secret-of-host-b\"\nnames = [\"iqn.2026-11.x:b\"]\n",
        ))
        .unwrap();
    let h = &c.targets[0].chap_hosts;
    assert_eq!(h.len(), 2);
    assert_eq!(h[0].policy.user, "a");
    assert_eq!(h[0].names, ["iqn.2026-11.x:a", "iqn.2026-11.x:a2"]);
    assert!(c.targets[0].chap.is_none());
    // The file form round-trips (ipsan ctl save).
    let again = Config::from_toml(&c.source.unwrap().to_toml().unwrap()).unwrap();
    assert_eq!(again.targets[0].chap_hosts.len(), 2);
}

#[test]
fn rejects_a_name_bound_twice_a_user_twice_and_no_names() {
    let twice = Config::from_toml(&chap_host_toml(
            "[[target.chap_host]]\nuser = \"a\"\nsecret = \"secret-of-host-a\"\nnames = [\"iqn.2026-11.x:a\"]\n[[target.chap_host]]\nuser = \"b\"\nsecret = \"secret-of-host-b\"\nnames = [\"iqn.2026-11.x:a\"]\n",
        ))
        .unwrap_err();
    assert_eq!(twice.field, "target[0].chap_host[1].names");
    let user = Config::from_toml(&chap_host_toml(
            "[[target.chap_host]]\nuser = \"a\"\nsecret = \"secret-of-host-a\"\nnames = [\"iqn.2026-11.x:a\"]\n[[target.chap_host]]\nuser = \"a\"\nsecret = \"another-secret-a\"\nnames = [\"iqn.2026-11.x:b\"]\n",
        ))
        .unwrap_err();
    assert_eq!(user.field, "target[0].chap_host[1].user");
    let none = Config::from_toml(&chap_host_toml(
        "[[target.chap_host]]\nuser = \"a\"\nsecret = \"secret-of-host-a\"\nnames = []\n",
    ))
    .unwrap_err();
    assert_eq!(none.field, "target[0].chap_host[0].names");
    let bad = Config::from_toml(&chap_host_toml(
        "[[target.chap_host]]\nuser = \"a\"\nsecret = \"secret-of-host-a\"\nnames = [\"host-a\"]\n",
    ))
    .unwrap_err();
    assert_eq!(bad.field, "target[0].chap_host[0].names");
}

#[test]
fn accepts_chap_host_flags_merging_one_users_names() {
    let h = chap_hosts_from_flags(&[
        "iqn.2026-11.x:a,ua,/k/a".into(),
        "iqn.2026-11.x:a2,ua,/k/a".into(),
        "iqn.2026-11.x:b,ub,/k/b,with,commas".into(),
    ])
    .unwrap();
    assert_eq!(h.len(), 2);
    assert_eq!(h[0].names, ["iqn.2026-11.x:a", "iqn.2026-11.x:a2"]);
    assert_eq!(
        h[1].secret_file.as_deref(),
        Some(Path::new("/k/b,with,commas"))
    );
    assert!(chap_hosts_from_flags(&["iqn.2026-11.x:a,ua".into()]).is_err());
    assert!(chap_hosts_from_flags(&[
        "iqn.2026-11.x:a,ua,/k/a".into(),
        "iqn.2026-11.x:b,ua,/k/other".into()
    ])
    .is_err());
}

#[test]
fn accepts_remote_iscsi_luns_mirroring_one_remote_target() {
    let dir = tempfile::tempdir().unwrap();
    let k = key_file(dir.path());
    let extra = format!(
        "seal = \"aes-256-gcm\"\nsecret_file = \"{}\"\ndepth = 8",
        k.display()
    );
    let c = Config::from_toml(&remote_toml(&k, &extra)).unwrap();
    let luns = &c.targets[0].luns;
    let r = luns[1].remote.as_ref().unwrap();
    assert_eq!(r.remote_lun(), 1);
    assert_eq!(r.depth, Some(8));
    assert_eq!(
        r.seal.as_ref().map(|(c, _)| *c),
        ipsan_seal::Cipher::from_name("aes-256-gcm")
    );
    assert_eq!(
        r.target_key(),
        "10.231.0.2:3260/iqn.2026-11.org.ipsan:disk0"
    );
    // The secret never shows in Debug.
    assert!(!format!("{r:?}").contains("0123456789abcdef"));
    let t = crate::registry::Registry::build(&c).unwrap().targets()[0].clone();
    assert!(t.luns.is_empty());
    assert_eq!(t.remotes.len(), 2);
    assert!(t.mirrored_remote().is_some());
    // A LUN the gateway does not list still goes to the mirrored remote target.
    assert_eq!(t.remote_route(7).map(|(_, l)| l), Some(7));
    assert_eq!(t.remote_targets().len(), 1);
}

#[test]
fn accepts_a_remote_luns_error_recovery_level_and_rejects_1_or_one_on_a_local_lun() {
    let dir = tempfile::tempdir().unwrap();
    let k = key_file(dir.path());
    let both = |lun0: &str, lun1: &str| {
        remote_toml(&k, "").replace(
            "depth = 8\n[[target.lun]]",
            &format!("depth = 8\n{lun0}\n[[target.lun]]"),
        ) + &format!(
            "seal = \"aes-256-gcm\"\nsecret_file = \"{}\"\ndepth = 8\n{lun1}\n",
            k.display()
        )
    };
    let erl = |toml: &str| -> Vec<u32> {
        Config::from_toml(toml).unwrap().targets[0]
            .luns
            .iter()
            .map(|l| l.remote.as_ref().unwrap().error_recovery_level)
            .collect()
    };
    assert_eq!(erl(&both("", "")), [2, 2], "the default, as --erl's");
    let zero = "error_recovery_level = 0";
    assert_eq!(erl(&both(zero, zero)), [0, 0]);
    let e = Config::from_toml(&both(
        "error_recovery_level = 1",
        "error_recovery_level = 1",
    ))
    .unwrap_err();
    assert!(e.to_string().contains("must be 0 or 2"), "{e}");
    let e = Config::from_toml(&both(zero, "")).unwrap_err();
    assert!(e.to_string().contains("must share"), "{e}");
    let e = Config::from_toml(
            "[[target]]\niqn = \"iqn.2026-11.org.ipsan:gw\"\n[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\nerror_recovery_level = 2\n",
        )
        .unwrap_err();
    assert!(e.to_string().contains("iscsi:// backends only"), "{e}");
}

#[test]
fn rejects_remote_luns_of_one_remote_target_with_different_settings() {
    let dir = tempfile::tempdir().unwrap();
    let k = key_file(dir.path());
    let e = Config::from_toml(&remote_toml(&k, "")).unwrap_err();
    assert!(e.to_string().contains("must share"), "{e}");
}

#[test]
fn rejects_remote_settings_on_a_local_backend_and_a_url_without_lun() {
    let e = Config::from_toml(
            "[[target]]\niqn = \"iqn.2026-11.org.ipsan:gw\"\n[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\ndepth = 4\n",
        )
        .unwrap_err();
    assert!(e.to_string().contains("iscsi:// backends only"), "{e}");
    let e = Config::from_toml(
            "[[target]]\niqn = \"iqn.2026-11.org.ipsan:gw\"\n[[target.lun]]\nid = 0\nbackend = \"iscsi://10.231.0.2/iqn.2026-11.org.ipsan:disk0\"\n",
        )
        .unwrap_err();
    assert!(e.to_string().contains("target-iqn/lun"), "{e}");
    let e = Config::from_toml(
            "[[target]]\niqn = \"iqn.2026-11.org.ipsan:gw\"\n[[target.lun]]\nid = 0\nbackend = \"iscsi://10.231.0.2/iqn.2026-11.org.ipsan:disk0/0\"\nseal = \"aes-256-gcm\"\n",
        )
        .unwrap_err();
    assert!(e.to_string().contains("go together"), "{e}");
}

#[test]
fn accepts_rbd_luns_with_ceph_settings_and_flags_fill_the_gaps() {
    let c = Config::from_toml(
        r#"
[server]
relative_port_id = 2
[[target]]
iqn = "iqn.2026-11.org.ipsan:rbd"
[[target.lun]]
id = 0
backend = "rbd:rbd/disk0,rbd_cache=false"
conf = "/etc/ceph/a.conf"
keyring = "/etc/ceph/a.keyring"
options = { rados_osd_op_timeout = 10, rbd_read_from_replica_policy = "balance" }
[[target.lun]]
id = 1
backend = "rbd:pool/ns/img"
"#,
    )
    .unwrap();
    assert_eq!(c.relative_port_id, 2);
    let mut luns = c.targets[0].luns.clone();
    apply_ceph_flags(&mut luns, Some(Path::new("/etc/ceph/b.conf")), Some("gw"));
    let rbd = |i: usize| match &luns[i].backend.kind {
        ipsan_scsi::BackendKind::Rbd(r) => r.clone(),
        other => panic!("{other:?}"),
    };
    let a = rbd(0);
    assert_eq!(
        a.conf.as_deref(),
        Some(Path::new("/etc/ceph/a.conf")),
        "the LUN's own wins"
    );
    assert_eq!(a.id.as_deref(), Some("gw"));
    assert_eq!(a.keyring.as_deref(), Some(Path::new("/etc/ceph/a.keyring")));
    assert!(a.options.contains(&("rbd_cache".into(), "false".into())));
    assert!(a
        .options
        .contains(&("rados_osd_op_timeout".into(), "10".into())));
    let b = rbd(1);
    assert_eq!(
        (b.pool.as_str(), b.namespace.as_deref(), b.image.as_str()),
        ("pool", Some("ns"), "img")
    );
    assert_eq!(b.conf.as_deref(), Some(Path::new("/etc/ceph/b.conf")));
}

#[test]
fn rejects_ceph_settings_on_other_backends_and_port_id_zero() {
    let e = Config::from_toml(
            "[[target]]\niqn = \"iqn.2026-11.org.ipsan:x\"\n[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\nconf = \"/x\"\n",
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("rbd: backends only"), "{e}");
    let e = Config::from_toml("[server]\nrelative_port_id = 0\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("server.relative_port_id"), "{e}");
    let e = Config::from_toml(
            "[[target]]\niqn = \"iqn.2026-11.org.ipsan:x\"\n[[target.lun]]\nid = 0\nbackend = \"rbd:rbd/x,size=1GiB\"\n",
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("the image's"), "{e}");
}

#[test]
fn accepts_full_example() {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("s");
    std::fs::write(&s, "a-secret-of-16-bytes").unwrap();
    std::fs::set_permissions(&s, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let text = format!(
        r#"
[server]
portals = ["127.0.0.1:3261"]
queue_depth = 64
[[target]]
iqn = "iqn.2026-11.org.ipsan:a"
allow = ["iqn.1994-05.com.redhat:*"]
[target.chap]
user = "alice"
secret_file = "{}"
[[target.lun]]
id = 0
backend = "mem:64MiB"
[[target.lun]]
id = 3
backend = "null:1TiB"
block_size = 4096
"#,
        s.display()
    );
    let c = Config::from_toml(&text).unwrap();
    assert_eq!(c.portals[0].port(), 3261);
    assert_eq!(c.queue_depth, 64);
    assert_eq!(c.targets[0].luns[1].block_size, 4096);
    assert_eq!(c.targets[0].chap.as_ref().unwrap().user, "alice");
    assert!(
        !format!("{c:?}").contains("a-secret-of-16"),
        "secret leaked into Debug"
    );
}

#[test]
fn accepts_limits_and_refuses_unsafe_values() {
    let base =
        "[[target]]\niqn = \"iqn.2026-11.x:y\"\n[[target.lun]]\nid=0\nbackend=\"mem:1MiB\"\n";
    let c = Config::from_toml(base).unwrap();
    assert_eq!(c.limits, crate::limits::Limits::default());
    let c = Config::from_toml(&format!(
            "[server]\nmax_sessions_per_initiator = 8\nmax_connections_per_address = 16\nfirst_pdu_timeout_secs = 2\n[server.auth_backoff]\nname_free_failures = 1\nlockout_base_ms = 250\nlockout_max_secs = 60\n{base}"
        ))
        .unwrap();
    assert_eq!(c.limits.max_sessions_per_initiator, 8);
    assert_eq!(c.limits.max_connections_per_address, 16);
    assert_eq!(c.limits.first_pdu_timeout.as_secs(), 2);
    assert_eq!(c.limits.auth.name_free_failures, 1);
    assert_eq!(c.limits.auth.lockout_base.as_millis(), 250);
    assert_eq!(c.limits.auth.lockout_max.as_secs(), 60);
    for (bad, field) in [
        (
            "[server]\nmax_sessions_per_initiator = 0\n",
            "server.max_sessions_per_initiator",
        ),
        (
            "[server]\nmax_connections_per_address = 0\n",
            "server.max_connections_per_address",
        ),
        (
            "[server]\nfirst_pdu_timeout_secs = 0\n",
            "server.first_pdu_timeout_secs",
        ),
        (
            "[server.auth_backoff]\nlockout_base_ms = 0\n",
            "server.auth_backoff.lockout_base_ms",
        ),
        (
            "[server.auth_backoff]\nlockout_base_ms = 5000\nlockout_max_secs = 1\n",
            "server.auth_backoff.lockout_max_secs",
        ),
        (
            "[server.auth_backoff]\ndelay_max_ms = 60000\n",
            "server.auth_backoff.delay_max_ms",
        ),
    ] {
        let e = Config::from_toml(&format!("{bad}{base}")).unwrap_err();
        assert_eq!(e.field, field, "{bad}");
    }
}

#[test]
fn rejects_bad_fields_naming_them() {
    let e = Config::from_toml(
        "[[target]]\niqn = \"bad name\"\n[[target.lun]]\nid=0\nbackend=\"mem:1MiB\"\n",
    )
    .unwrap_err();
    assert_eq!(e.field, "target[0].iqn");
    let e = Config::from_toml(
        "[[target]]\niqn = \"iqn.2026-11.x:y\"\n[[target.lun]]\nid=0\nbackend=\"mem:lots\"\n",
    )
    .unwrap_err();
    assert_eq!(e.field, "target[0].lun[0].backend");
    let e = Config::from_toml("[[target]]\niqn = \"iqn.2026-11.x:y\"\n[[target.lun]]\nid=0\nbackend=\"mem:1MiB\"\n[[target.lun]]\nid=0\nbackend=\"mem:1MiB\"\n").unwrap_err();
    assert_eq!(e.field, "target[0].lun[1].id");
    let e = Config::from_toml("[server]\nportals=[\"nowhere\"]\n").unwrap_err();
    assert_eq!(e.field, "server.portals");
    let e = Config::from_toml("[server]\nbogus = 1\n").unwrap_err();
    assert!(e.why.contains("bogus"), "{e}");
    let e = Config::from_toml("[[target]]\niqn = \"iqn.2026-11.x:y\"\n[target.chap]\nuser=\"u\"\n[[target.lun]]\nid=0\nbackend=\"mem:1MiB\"\n").unwrap_err();
    assert_eq!(e.field, "target[0].chap.secret");
}

#[test]
fn rejects_group_or_world_readable_secret_files_naming_the_field() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("s");
    std::fs::write(&s, "a-secret-of-16-bytes").unwrap();
    let text = |kind: &str| {
        format!(
                "[[target]]\niqn = \"iqn.2026-11.x:y\"\n[target.{kind}]\n{}secret_file = \"{}\"\n[[target.lun]]\nid=0\nbackend=\"mem:1MiB\"\n",
                if kind == "chap" { "user = \"u\"\n" } else { "" },
                s.display()
            )
    };
    for (mode, ok) in [
        (0o644, false),
        (0o640, false),
        (0o604, false),
        (0o600, true),
        (0o400, true),
    ] {
        std::fs::set_permissions(&s, std::fs::Permissions::from_mode(mode)).unwrap();
        for (kind, field) in [
            ("chap", "target[0].chap.secret"),
            ("seal", "target[0].seal.secret"),
        ] {
            match Config::from_toml(&text(kind)) {
                Ok(_) => assert!(ok, "{kind} secret with mode {mode:o} accepted"),
                Err(e) => {
                    assert!(!ok, "{kind} secret with mode {mode:o} refused: {e}");
                    assert_eq!(e.field, field);
                    assert!(e.why.contains("chmod 600"), "{e}");
                }
            }
        }
    }
}

#[test]
fn accepts_its_own_saved_form() {
    let text = "[server]\nportals = [\"127.0.0.1:3261\"]\n[[target]]\niqn = \"iqn.2026-11.x:y\"\nallow = [\"iqn.a:*\"]\n[target.chap]\nuser = \"u\"\nsecret_file = \"/etc/ipsan/u.secret\"\n[[target.lun]]\nid = 0\nbackend = \"file:/tmp/x.img,size=1GiB\"\n[[target.lun]]\nid = 2\nbackend = \"mem:64MiB\"\nread_only = true\n";
    let f = FileConfig::parse(text).unwrap();
    let saved = f.to_toml().unwrap();
    assert_eq!(FileConfig::parse(&saved).unwrap(), f, "{saved}");
    assert!(
        saved.contains("secret_file = \"/etc/ipsan/u.secret\""),
        "{saved}"
    );
    assert_eq!(
        f.target[0].lun[0].resized_backend(2 << 30).unwrap(),
        "file:/tmp/x.img,size=2GiB"
    );
    assert_eq!(
        f.target[0].lun[1].resized_backend(96 << 20).unwrap(),
        "mem:96MiB"
    );
}
