//! `nvme_proto::psk` against values Linux's own tools produced (independent vectors), not
//! against itself.
//!
//! nvme-cli 2.13 / libnvme 1.13 (Debian 13, unpacked by ../shared/nvmevm; `NVME` below is
//! `/var/tmp/nvmevm/extract/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path
//! /var/tmp/nvmevm/extract/usr/lib/x86_64-linux-gnu /var/tmp/nvmevm/extract/usr/sbin/nvme`),
//! with H=nqn.2014-08.org.nvmexpress:uuid:6e766d65-766d-4000-8000-000000000001
//! S=nqn.2026-11.org.example:nvmet:
//!
//! ```text
//! $NVME gen-tls-key --hostnqn $H --subsysnqn $S --secret 000102…1e1f
//! NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:
//! $NVME gen-tls-key --hostnqn $H --subsysnqn $S --hmac 2 --secret 000102…2e2f
//! NVMeTLSkey-1:02:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:
//! $NVME check-tls-key --hostnqn $H --subsysnqn $S --keydata <key> --identity 0|1
//! (the identities below)
//! ```
//!
//! The TLS PSKs themselves are checked where only the right key works: `nvme-tls`'s
//! handshake against Linux's target (`crates/nvme-tls/tests/linux_target.rs`).
//!
//! libnvme 1.16's RFC 8446 derivation is checked against the digests in libnvme's own
//! `test/psk.c` (v1.16, both its fixed and its `compat` tables), the only published values of
//! the fixed derivation (no newer nvme-cli is packaged here).

use nvme_proto::psk::{
    ConfiguredPsk, Derivation, IdentityVersion, PskError, PskHash, PskIdentity, PskStore,
};

const H: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d65-766d-4000-8000-000000000001";
const S: &str = "nqn.2026-11.org.example:nvmet";
const KEY01: &str = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
const KEY02: &str =
    "NVMeTLSkey-1:02:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:";
const DIGEST01: &str = "J/04y9s1v2kmW6zJhX3otk3nHaraAGeSQ7pZEBrbMSg=";
const DIGEST02: &str = "/jenqVFYheonFSdScIuOa35+UretNkI7PnARUsPs5PCazIDZZBu55IDmqNzVtV7Q";

fn seq(n: u8) -> Vec<u8> {
    (0..n).collect()
}

#[test]
fn accepts_keys_made_by_nvme_gen_tls_key_and_encodes_them_back() {
    let k1 = ConfiguredPsk::parse(KEY01).unwrap();
    assert_eq!(
        k1,
        ConfiguredPsk::new(Some(PskHash::Sha256), &seq(32)).unwrap()
    );
    assert_eq!(k1.encode().as_str(), KEY01);
    let k2 = ConfiguredPsk::parse(&format!("{KEY02}\n")).unwrap();
    assert_eq!(
        k2,
        ConfiguredPsk::new(Some(PskHash::Sha384), &seq(48)).unwrap()
    );
    assert_eq!(k2.encode().as_str(), KEY02);
    assert_eq!(k2.hash(), PskHash::Sha384);
}

#[test]
fn rejects_a_mistyped_key_by_its_crc() {
    // One base64 character of the key changed (A → B): the CRC no longer matches.
    let typo = KEY01.replacen("AAEC", "BAEC", 1);
    assert_eq!(ConfiguredPsk::parse(&typo), Err(PskError::Crc));
}

#[test]
fn rejects_malformed_interchange_strings() {
    for bad in [
        "",
        "NVMeTLSkey-2:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
        "NVMeTLSkey-1:03:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
        "NVMeTLSkey-1:1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
        "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR",
        "NVMeTLSkey-1:01:!!!!:",
        "NVMeTLSkey-1:01:AAE=:",
        "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
    ] {
        assert!(ConfiguredPsk::parse(bad).is_err(), "{bad:?} was accepted");
    }
    // A well-formed 48-byte key labelled SHA-256.
    let wrong = KEY02.replacen(":02:", ":01:", 1);
    assert_eq!(
        ConfiguredPsk::parse(&wrong),
        Err(PskError::Length { hash: 1, len: 48 })
    );
}

#[test]
fn debug_never_prints_key_material() {
    let k = ConfiguredPsk::parse(KEY01).unwrap();
    let (_, tls) = k.tls_psk(H, S, IdentityVersion::V1, Derivation::Libnvme);
    let text = format!("{k:?} {:?} {tls:?}", k.retained(H, Derivation::Libnvme));
    assert!(text.contains("<redacted>"));
    assert!(
        !text.contains("AAEC") && !text.contains("[0, 1, 2"),
        "{text}"
    );
}

#[test]
fn derives_the_identities_nvme_check_tls_key_prints() {
    for (key, hh, digest) in [(KEY01, "01", DIGEST01), (KEY02, "02", DIGEST02)] {
        let k = ConfiguredPsk::parse(key).unwrap();
        let r = k.retained(H, Derivation::Libnvme);
        assert_eq!(
            r.identity(IdentityVersion::V0, H, S).to_string(),
            format!("NVMe0R{hh} {H} {S}")
        );
        assert_eq!(
            r.identity(IdentityVersion::V1, H, S).to_string(),
            format!("NVMe1R{hh} {H} {S} {digest}")
        );
    }
}

/// libnvme 1.16's test/psk.c: 0x5512DBB6…5B03 (32 bytes; its 48-byte key appends
/// 0xFFC344BC…5B03), hosts "nqn.psk-test-host" / "nqn.psk-test-subsys".
#[test]
fn derives_libnvme_1_16_digests_for_both_derivations() {
    let k32 = [
        0x55, 0x12, 0xDB, 0xB6, 0x73, 0x7D, 0x01, 0x06, 0xF6, 0x59, 0x75, 0xB7, 0x73, 0xDF, 0xB0,
        0x11, 0xFF, 0xC3, 0x44, 0xBC, 0xF4, 0x42, 0xE2, 0xDD, 0x6D, 0x8B, 0xC4, 0x87, 0x0B, 0x5D,
        0x5B, 0x03,
    ];
    let mut k48 = k32.to_vec();
    k48.extend_from_slice(&k32[16..]);
    let (h, s) = ("nqn.psk-test-host", "nqn.psk-test-subsys");
    let cases = [
        (
            ConfiguredPsk::new(Some(PskHash::Sha256), &k32).unwrap(),
            "iSbjiStwJ/1TrTvDlt2fjFmzvsytOJelidNnA+X5lEU=",
            "66GuqV08TsAGII39teWUfwQwizjv06Jy8jOcX3NAAzM=",
        ),
        (
            ConfiguredPsk::new(Some(PskHash::Sha384), &k48).unwrap(),
            "QhW2+Rp6RzHlNtCslyRxMnwJ11tKKhz8JCAQpQ+XUD8f9td1VeH5h53yz2wKJG1a",
            "RsKmYJ3nAn1ApjjMloJFbAkLPivONDAX/xW327YBUsn2eGShXSjCZvBaOxscLqmz",
        ),
    ];
    for (key, rfc, compat) in cases {
        assert_eq!(key.retained(h, Derivation::Rfc8446).digest(h, s), rfc);
        assert_eq!(key.retained(h, Derivation::Libnvme).digest(h, s), compat);
    }
    // Its exported forms.
    assert_eq!(
        ConfiguredPsk::new(Some(PskHash::Sha256), &k32)
            .unwrap()
            .encode()
            .as_str(),
        "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"
    );
    assert_eq!(
        ConfiguredPsk::new(None, &k32).unwrap().encode().as_str(),
        "NVMeTLSkey-1:00:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"
    );
}

#[test]
fn parses_and_prints_identities_unchanged() {
    for text in [
        format!("NVMe0R01 {H} {S}"),
        format!("NVMe1R02 {H} {S} {DIGEST02}"),
    ] {
        let id = PskIdentity::parse(text.as_bytes()).unwrap();
        assert_eq!(id.to_string(), text);
        assert!(id.names(H, S));
        assert!(!id.names(S, H) && !id.names(H, "nqn.2026-11.org.example:other"));
    }
    for bad in [
        format!("NVMe0R01 {H}"),
        format!("NVMe0R01 {H} {S} {DIGEST01}"),
        format!("NVMe1R01 {H} {S}"),
        format!("NVMe0R03 {H} {S}"),
        format!("NVMe2R01 {H} {S}"),
        format!("NVMe0X01 {H} {S}"),
        format!("NVMe0R01 {H} {S} x y"),
    ] {
        assert!(PskIdentity::parse(bad.as_bytes()).is_err(), "{bad}");
    }
    assert_eq!(
        PskIdentity::parse(format!("NVMe1G01 {H} {S} {DIGEST01}").as_bytes()),
        Err(PskError::Generated)
    );
}

#[test]
fn store_resolves_offered_identities_to_the_key_the_host_derived() {
    let k = ConfiguredPsk::parse(KEY01).unwrap();
    let mut store = PskStore::new();
    store.insert(H, S, k.clone());
    for version in [IdentityVersion::V0, IdentityVersion::V1] {
        for derivation in Derivation::ALL {
            let (id, host_key) = k.tls_psk(H, S, version, derivation);
            let got = store.resolve(id.to_string().as_bytes()).unwrap();
            assert_eq!(got.identity, id);
            if version == IdentityVersion::V0 && derivation == Derivation::Rfc8446 {
                // A version 0 identity cannot say how its key was derived: the configured
                // default (libnvme's) is used, and the handshake would fail.
                assert_ne!(got.psk, host_key);
            } else {
                assert_eq!(got.derivation, derivation);
                assert_eq!(got.psk, host_key);
            }
        }
    }
    // A host configured for RFC 8446 keys with version 0 identities.
    let mut store = PskStore::new();
    store.insert_with(H, S, k.clone(), Derivation::Rfc8446);
    let (id, host_key) = k.tls_psk(H, S, IdentityVersion::V0, Derivation::Rfc8446);
    assert_eq!(
        store.resolve(id.to_string().as_bytes()).unwrap().psk,
        host_key
    );
}

#[test]
fn store_rejects_unknown_hosts_other_hashes_and_foreign_digests() {
    let mut store = PskStore::new();
    store.insert(H, S, ConfiguredPsk::parse(KEY01).unwrap());
    let other = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000000";
    assert!(matches!(
        store.resolve(format!("NVMe0R01 {other} {S}").as_bytes()),
        Err(PskError::UnknownHost { .. })
    ));
    assert!(matches!(
        store.resolve(format!("NVMe0R01 {H} {S}-other").as_bytes()),
        Err(PskError::UnknownHost { .. })
    ));
    assert_eq!(
        store
            .resolve(format!("NVMe0R02 {H} {S}").as_bytes())
            .unwrap_err(),
        PskError::HashMismatch {
            asked: 2,
            configured: 1
        }
    );
    // A host holding another key offers a version 1 identity with its own digest.
    let foreign = ConfiguredPsk::new(Some(PskHash::Sha256), &[7u8; 32]).unwrap();
    let (id, _) = foreign.tls_psk(H, S, IdentityVersion::V1, Derivation::Libnvme);
    assert_eq!(
        store.resolve(id.to_string().as_bytes()).unwrap_err(),
        PskError::DigestMismatch
    );
}
