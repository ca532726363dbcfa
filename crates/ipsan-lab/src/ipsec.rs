//! The `ipsec` scheme: real IPsec between the lab's two namespaces — strongSwan's charon
//! (IKEv2, pre-shared key) with its userspace ESP (`kernel-libipsec`), because this kernel
//! has no ESP (`ip xfrm state add … proto esp` is refused). FreeS/WAN's descendant, the
//! papers' own baseline family, with the papers' cipher (3DES-CBC + HMAC-SHA1-96, RFC 2451 /
//! RFC 2404, from the openssl plugin) or AES-256-GCM (RFC 4106).
//!
//! What makes it run here (each found by trying):
//! - **Tunnel mode only**: kernel-libipsec has no transport mode. The selectors are still
//!   host to host (each host's own /32), so ESP protects exactly the iSCSI hosts' traffic.
//! - **ESP in UDP on port 4500** always (RFC 3948): libipsec sends ESP through charon's own
//!   NAT-T socket (`encap = yes`).
//! - **The `kdf` plugin** must be loaded or no CHILD_SA's keys can be derived.
//! - **A private `/run` per charon**: the pidfile path (`/run/charon.pid`) is compiled in, so
//!   two charons on one host (the two namespaces) refuse each other. Each runs under
//!   `unshare -m` with a tmpfs on `/run`; its vici socket lives there too, and `swanctl` is
//!   run in the same mount namespace through `nsenter`.
//! - **Host-to-host selectors cover IKE's own packets**: kernel-libipsec refuses the route
//!   ("conflicts with IKE traffic") unless `allow_peer_ts = yes`, and then the route to the
//!   peer through the TUN device (`ipsec0`, table 220) would also carry IKE and the
//!   encapsulated ESP. `ip rule`s ahead of table 220 send UDP 500/4500 by the main table.
//! - **charon's UDP receive buffer** (`net.core.rmem_default`, 208 KiB) overflows under
//!   AES-GCM load; the lab raises it to 7 MiB from outside as for wireguard-go
//!   ([`crate::sockbuf`]).
//! - **`ipsec0`'s queue** (txqueuelen 500) overflows: the TUN driver drops what does not
//!   fit while charon catches up, and a 1 MiB write is ~750 packets in one burst (at 64 ms
//!   2–9 % of the inner TCP's packets were lost there). The lab raises it to [`TUN_QUEUE`].

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The TUN device kernel-libipsec creates (one per namespace).
pub const TUN_DEVICE: &str = "ipsec0";
/// Its queue in packets: above the largest burst the lab's iSCSI connections send (8 MiB
/// in flight at MTU 1400), so the tunnel queues, as kernel ESP's back-pressure would, instead
/// of dropping.
pub const TUN_QUEUE: u32 = 16384;

/// Where Debian installs charon and its plugins.
pub const CHARON: &str = "/usr/lib/ipsec/charon";
const PLUGIN_DIR: &str = "/usr/lib/ipsec/plugins";

/// The plugins each charon loads (nothing else: `load_modular = no`).
pub const PLUGINS: &str = "random nonce openssl aes sha1 sha2 hmac gcm kdf pem pkcs1 x509 \
                           pubkey curve25519 socket-default kernel-libipsec kernel-netlink vici";

/// The ESP proposal for a lab cipher name.
pub fn esp_proposal(cipher: &str) -> Result<&'static str, String> {
    match cipher {
        "3des-cbc-hmac-sha1" => Ok("3des-sha1"),
        "aes-256-gcm" => Ok("aes256gcm16"),
        other => Err(format!(
            "the ipsec scheme has no ESP proposal for cipher {other:?} (3des-cbc-hmac-sha1, aes-256-gcm)"
        )),
    }
}

/// Why the `ipsec` scheme cannot run here, if it cannot.
pub fn unavailable() -> Option<String> {
    for (path, pkg) in [
        (CHARON.to_string(), "strongswan-charon"),
        (
            format!("{PLUGIN_DIR}/libstrongswan-kernel-libipsec.so"),
            "libcharon-extra-plugins",
        ),
        (
            format!("{PLUGIN_DIR}/libstrongswan-openssl.so"),
            "libstrongswan-standard-plugins",
        ),
        (
            format!("{PLUGIN_DIR}/libstrongswan-kdf.so"),
            "strongswan-charon",
        ),
        ("/usr/sbin/swanctl".to_string(), "strongswan-swanctl"),
    ] {
        if !Path::new(&path).exists() {
            return Some(format!(
                "strongSwan is not installed ({path} missing; Debian package {pkg}, see scripts/install-deps)"
            ));
        }
    }
    None
}

/// One side's files.
#[derive(Debug)]
pub struct Side {
    /// The directory holding this side's `strongswan.conf`, `swanctl.conf` and `charon.log`.
    pub dir: PathBuf,
}

impl Side {
    /// Writes this side's configuration: `me` and `peer` are the hosts' addresses on the
    /// emulated link, `esp` the ESP proposal, `psk` the pre-shared key.
    pub fn write(
        dir: &Path,
        me: Ipv4Addr,
        peer: Ipv4Addr,
        esp: &str,
        psk: &str,
    ) -> std::io::Result<Side> {
        std::fs::create_dir_all(dir)?;
        let log = dir.join("charon.log");
        std::fs::write(dir.join("strongswan.conf"), strongswan_conf(&log))?;
        std::fs::write(dir.join("swanctl.conf"), swanctl_conf(me, peer, esp, psk))?;
        Ok(Side {
            dir: dir.to_path_buf(),
        })
    }

    /// The argv (after `ip netns exec NS`) that runs charon with a private `/run`.
    pub fn charon_argv(&self) -> Vec<String> {
        let conf = self.dir.join("strongswan.conf");
        vec![
            "unshare".into(),
            "-m".into(),
            "--propagation".into(),
            "private".into(),
            "sh".into(),
            "-c".into(),
            format!(
                "mount -t tmpfs ipsan-lab-run /run && STRONGSWAN_CONF='{}' exec {CHARON}",
                conf.display()
            ),
        ]
    }

    /// `swanctl ARGS` inside charon's mount and network namespaces (pid `charon`).
    pub fn swanctl(&self, charon: u32, args: &[&str]) -> Command {
        let mut c = Command::new("nsenter");
        c.args(["-t", &charon.to_string(), "-m", "-n", "swanctl"]);
        c.args(args);
        c
    }

    /// `swanctl --load-all` of this side's connection and secret.
    pub fn load_args(&self) -> Vec<String> {
        vec![
            "--load-all".into(),
            "--noprompt".into(),
            "--file".into(),
            self.dir.join("swanctl.conf").display().to_string(),
        ]
    }
}

/// Packets through the initiator's CHILD_SA (in + out), from `swanctl --list-sas` in the
/// mount and network namespaces of charon `pid`: the proof that the data went through ESP.
pub fn sa_packets(pid: u32) -> Result<u64, String> {
    let o = Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-m", "-n", "swanctl", "--list-sas"])
        .output()
        .map_err(|e| format!("swanctl --list-sas: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "swanctl --list-sas: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    Ok(parse_sa_packets(&String::from_utf8_lossy(&o.stdout)))
}

/// Sums the `N packets` counters of `swanctl --list-sas` output.
fn parse_sa_packets(text: &str) -> u64 {
    let mut n = 0;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        for w in words.windows(2) {
            if w[1].trim_end_matches(',') == "packets" {
                n += w[0].parse::<u64>().unwrap_or(0);
            }
        }
    }
    n
}

fn strongswan_conf(log: &Path) -> String {
    format!(
        "# ipsan lab: one charon per namespace, userspace ESP (kernel-libipsec).\n\
charon {{\n  load_modular = no\n  load = {PLUGINS}\n  install_virtual_ip = no\n  \
filelog {{\n    lab {{\n      path = {}\n      default = 1\n      flush_line = yes\n    }}\n  }}\n  \
plugins {{\n    kernel-libipsec {{\n      allow_peer_ts = yes\n    }}\n  }}\n}}\n",
        log.display()
    )
}

fn swanctl_conf(me: Ipv4Addr, peer: Ipv4Addr, esp: &str, psk: &str) -> String {
    format!(
        "connections {{\n  lab {{\n    version = 2\n    local_addrs = {me}\n    remote_addrs = {peer}\n    \
encap = yes\n    mobike = no\n    proposals = aes256-sha256-x25519\n    \
local {{\n      auth = psk\n      id = {me}\n    }}\n    remote {{\n      auth = psk\n      id = {peer}\n    }}\n    \
children {{\n      lab {{\n        mode = tunnel\n        local_ts = {me}/32\n        remote_ts = {peer}/32\n        \
esp_proposals = {esp}\n        start_action = none\n      }}\n    }}\n  }}\n}}\n\
secrets {{\n  ike-lab {{\n    secret = \"{psk}\"\n  }}\n}}\n"
    )
}

/// `ip rule`s (argv after `ip -n NS`) that send IKE (UDP 500) and ESP-in-UDP (4500) by the
/// main table, ahead of the route through `ipsec0` that charon puts in table 220.
pub fn bypass_rules() -> Vec<Vec<String>> {
    let mut v = Vec::new();
    for port in ["500", "4500"] {
        for dir in ["sport", "dport"] {
            v.push(
                [
                    "rule", "add", "prio", "100", "ipproto", "udp", dir, port, "lookup", "main",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            );
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_the_papers_cipher_and_aes_gcm_and_rejects_others() {
        assert_eq!(esp_proposal("3des-cbc-hmac-sha1").unwrap(), "3des-sha1");
        assert_eq!(esp_proposal("aes-256-gcm").unwrap(), "aes256gcm16");
        assert!(esp_proposal("chacha20-poly1305").is_err());
    }

    #[test]
    fn config_loads_kdf_and_libipsec_and_selects_hosts() {
        let d = tempfile::tempdir().unwrap();
        let s = Side::write(
            d.path(),
            Ipv4Addr::new(10, 231, 1, 1),
            Ipv4Addr::new(10, 231, 1, 2),
            "3des-sha1",
            "k",
        )
        .unwrap();
        let ss = std::fs::read_to_string(s.dir.join("strongswan.conf")).unwrap();
        for p in ["kdf", "kernel-libipsec", "openssl", "vici"] {
            assert!(ss.contains(p), "{p} missing: {ss}");
        }
        assert!(ss.contains("allow_peer_ts = yes"));
        let sw = std::fs::read_to_string(s.dir.join("swanctl.conf")).unwrap();
        assert!(sw.contains("local_ts = 10.231.1.1/32"));
        assert!(sw.contains("remote_ts = 10.231.1.2/32"));
        assert!(sw.contains("mode = tunnel") && sw.contains("encap = yes"));
        assert_eq!(bypass_rules().len(), 4);
    }

    #[test]
    fn sums_both_directions_packets_of_list_sas() {
        let out = "  lab: #1, reqid 1, INSTALLED, TUNNEL-in-UDP, ESP:3DES_CBC/HMAC_SHA1_96\n    \
                   in  6816222d, 593287 bytes, 11408 packets,     0s ago\n    \
                   out 19b4f352, 96051053 bytes, 68623 packets,     0s ago\n";
        assert_eq!(parse_sa_packets(out), 11408 + 68623);
        assert_eq!(parse_sa_packets("no SAs"), 0);
    }
}
