//! The target's answers to a Text Request in full feature phase (RFC 7143 §11.10): SendTargets
//! (Appendix C) from a [`Directory`] the driver implements from its registry, the declarative
//! MaxRecvDataSegmentLength (§13.12, applied by the engine), and Reject / NotUnderstood for
//! everything else (§6.2.1).

use std::net::SocketAddr;

use crate::params::{NOT_UNDERSTOOD, REJECT};

/// A target as SendTargets lists it: its name and the portals that reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// The target's iSCSI name.
    pub name: String,
    /// Each portal's address and portal group tag (RFC 7143 §4.4.1).
    pub portals: Vec<(SocketAddr, u16)>,
}

/// What the target engine asks about targets and portals to answer SendTargets; the driver
/// implements it from its registry.
pub trait Directory {
    /// Every target `initiator` may use, in the order SendTargets lists them.
    fn targets(&self, initiator: &str) -> Vec<Listed>;
}

/// The answer to a Text Request's keys from `initiator`, whose session is with
/// `session_target` (`None`: a discovery session).
#[must_use]
pub fn answer(
    keys: &[(String, String)],
    initiator: &str,
    session_target: Option<&str>,
    dir: Option<&dyn Directory>,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, v) in keys {
        match k.as_str() {
            "SendTargets" => {
                if let Some(d) = dir {
                    send_targets(v, initiator, session_target, d, &mut out);
                }
            }
            // Declarative, applied by the engine (RFC 7143 §13.12).
            "MaxRecvDataSegmentLength" => {}
            _ if crate::params::spec(k).is_some() => out.push((k.clone(), REJECT.into())),
            _ => out.push((k.clone(), NOT_UNDERSTOOD.into())),
        }
    }
    out
}

/// SendTargets (RFC 7143 Appendix C): `All` lists every target the initiator may use; an
/// empty value (a normal session's) lists the session's target; a name lists that one.
fn send_targets(
    value: &str,
    initiator: &str,
    session_target: Option<&str>,
    dir: &dyn Directory,
    out: &mut Vec<(String, String)>,
) {
    for t in dir.targets(initiator) {
        let wanted = match value {
            "All" => true,
            "" => session_target == Some(t.name.as_str()),
            name => name == t.name,
        };
        if !wanted {
            continue;
        }
        out.push(("TargetName".into(), t.name.clone()));
        for (addr, tag) in &t.portals {
            // An IPv6 address is bracketed (RFC 7143 Appendix C).
            let a = match addr {
                SocketAddr::V4(v4) => format!("{v4},{tag}"),
                SocketAddr::V6(v6) => format!("[{}]:{},{tag}", v6.ip(), v6.port()),
            };
            out.push(("TargetAddress".into(), a));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Two;
    impl Directory for Two {
        fn targets(&self, initiator: &str) -> Vec<Listed> {
            let mut v = vec![Listed {
                name: "iqn.2026-11.org.ipsan:a".into(),
                portals: vec![("127.0.0.1:3260".parse().unwrap(), 1)],
            }];
            if initiator == "iqn.2026-11.org.ipsan:admin" {
                v.push(Listed {
                    name: "iqn.2026-11.org.ipsan:b".into(),
                    portals: vec![("[::1]:3261".parse().unwrap(), 1)],
                });
            }
            v
        }
    }

    fn keys(k: &str, v: &str) -> Vec<(String, String)> {
        vec![(k.into(), v.into())]
    }

    #[test]
    fn accepts_send_targets_all_and_lists_only_what_the_initiator_may_use() {
        let a = answer(
            &keys("SendTargets", "All"),
            "iqn.2026-11.org.ipsan:admin",
            None,
            Some(&Two),
        );
        let want: Vec<(String, String)> = [
            ("TargetName", "iqn.2026-11.org.ipsan:a"),
            ("TargetAddress", "127.0.0.1:3260,1"),
            ("TargetName", "iqn.2026-11.org.ipsan:b"),
            ("TargetAddress", "[::1]:3261,1"),
        ]
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect();
        assert_eq!(a, want);
        let other = answer(&keys("SendTargets", "All"), "iqn.x:y", None, Some(&Two));
        assert_eq!(other.len(), 2, "b is not listed for another initiator");
    }

    #[test]
    fn accepts_an_empty_send_targets_in_a_normal_session_as_its_own_target() {
        let a = answer(
            &keys("SendTargets", ""),
            "iqn.2026-11.org.ipsan:admin",
            Some("iqn.2026-11.org.ipsan:b"),
            Some(&Two),
        );
        assert_eq!(a[0].1, "iqn.2026-11.org.ipsan:b");
        assert_eq!(a.len(), 2);
    }

    #[test]
    fn rejects_login_only_keys_and_does_not_understand_unknown_ones() {
        let a = answer(
            &[
                ("HeaderDigest".into(), "CRC32C".into()),
                ("X-com.example.Foo".into(), "1".into()),
                ("MaxRecvDataSegmentLength".into(), "65536".into()),
            ],
            "iqn.x:y",
            None,
            None,
        );
        assert_eq!(
            a,
            vec![
                ("HeaderDigest".to_string(), REJECT.to_string()),
                ("X-com.example.Foo".to_string(), NOT_UNDERSTOOD.to_string()),
            ]
        );
    }
}
