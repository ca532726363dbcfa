//! The `wireguard` carrier: wireguard-go in both namespaces.

use super::Carrier;
use crate::runner::process::{run_quiet, side_name};
use crate::runner::*;
use crate::tunnel::{self, TunnelWait};

pub(super) struct Wireguard;

impl Carrier for Wireguard {
    fn connect(
        &self,
        ctx: &RunCtx<'_>,
        _p: &Point,
        procs: &mut Procs,
        _target: SocketAddr,
    ) -> Result<SocketAddr, RunError> {
        wireguard(ctx, procs)
    }
}

/// wireguard-go in both namespaces, peers over the emulated link; returns the target's
/// address inside the tunnel.
fn wireguard(ctx: &RunCtx<'_>, procs: &mut Procs) -> Result<SocketAddr, RunError> {
    let Some(link) = ctx.link else {
        return Err(RunError::Skip("wireguard needs namespaces (root)".into()));
    };
    let tun = ctx.subnet().wrapping_add(1);
    let wg_ip = |side: Side| Ipv4Addr::new(10, 231, tun, if side == Side::Ini { 1 } else { 2 });
    let mut keys = Vec::new();
    for side in [Side::Ini, Side::Tgt] {
        let key = run_quiet(Command::new("wg").arg("genkey"))
            .map_err(|e| fail(format!("wg genkey: {e}")))?;
        let path = ctx.scratch.join(format!("wg-{side:?}.key"));
        std::fs::write(&path, &key).map_err(|e| fail(format!("writing a wg key: {e}")))?;
        let mut pc = Command::new("wg");
        pc.arg("pubkey")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = pc.spawn().map_err(|e| fail(format!("wg pubkey: {e}")))?;
        if let Some(mut si) = child.stdin.take() {
            use std::io::Write;
            let _ = si.write_all(key.as_bytes());
        }
        let o = child
            .wait_with_output()
            .map_err(|e| fail(format!("wg pubkey: {e}")))?;
        keys.push((path, String::from_utf8_lossy(&o.stdout).trim().to_string()));
    }
    for (i, side) in [Side::Ini, Side::Tgt].into_iter().enumerate() {
        // wireguard-go's control socket lives in the host-wide /var/run/wireguard/<if>.sock,
        // not per namespace: each side (and each lab on the host) needs its own name.
        // Named from the lab's pid (at most 10 of IFNAMSIZ's 15 characters).
        let ifname = format!(
            "wl{}{}",
            std::process::id(),
            if side == Side::Ini { 'i' } else { 't' }
        );
        let sock = PathBuf::from(format!("/var/run/wireguard/{ifname}.sock"));
        let _ = std::fs::remove_file(&sock);
        crate::guard::register_file(sock.clone());
        procs.1.push(sock);
        let mut c = link.link.command(side, "wireguard-go");
        crate::guard::guard_child(&mut c);
        // Its log (debug level: handshakes sent, received, rejected) goes to the run's
        // scratch directory; a tunnel that never comes up quotes its tail.
        let log = std::fs::File::create(wg_log(ctx, side))
            .map_err(|e| fail(format!("wireguard-go log: {e}")))?;
        c.args(["-f", &ifname])
            .env("WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD", "1")
            .env("LOG_LEVEL", "debug")
            // The log is on stdout, the start-up banner on stderr.
            .stdout(
                log.try_clone()
                    .map_err(|e| fail(format!("wireguard-go log: {e}")))?,
            )
            .stderr(log);
        let child = c.spawn().map_err(|e| fail(format!("wireguard-go: {e}")))?;
        let wg_pid = child.id();
        procs
            .0
            .push((format!("wireguard-go@{}", side_name(side)), child));
        let ns = link.link.netns(side);
        let t = Instant::now();
        while run_quiet(Command::new("ip").args(["-n", &ns, "link", "show", &ifname])).is_err() {
            // wireguard-go's start-up takes seconds on a loaded 2-core host.
            if t.elapsed() > Duration::from_secs(20) {
                return Err(fail(format!(
                    "wireguard-go did not create {ifname} within 20 s"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let peer = if side == Side::Ini {
            Side::Tgt
        } else {
            Side::Ini
        };
        let (key_path, _) = &keys[i];
        let (_, peer_pub) = &keys[1 - i];
        let endpoint = format!("{}:{WG_PORT}", link.link.addr(peer));
        let mut set = link.link.command(side, "wg");
        set.args([
            "set",
            &ifname,
            "listen-port",
            &WG_PORT.to_string(),
            "private-key",
        ])
        .arg(key_path)
        .args([
            "peer",
            peer_pub,
            "allowed-ips",
            &format!("{}/32", wg_ip(peer)),
        ]);
        // Only the initiator's side knows where its peer is; the target's side learns it
        // from the first handshake, as a server does. With an endpoint on both sides both
        // initiate when both have a packet queued, their initiations cross on the wire, each
        // answers the other's and then rejects the answer to its own ("Received invalid
        // response message"), and at 64 ms one way the 5 s retries collided again: 2 of 8
        // runs never completed a handshake in 14.9 s (wireguard-go's debug log).
        if side == Side::Ini {
            set.args(["endpoint", &endpoint]);
        }
        run_quiet(&mut set).map_err(|e| fail(format!("wg set: {e}")))?;
        // Debian's wireguard-go keeps 208 KiB UDP buffers and drops the tunnel's packets
        // there (see crate::sockbuf); give it upstream's 7 MiB.
        crate::sockbuf::force_udp_buffers(wg_pid, WG_PORT, crate::sockbuf::WIREGUARD_SOCKET_BUFFER)
            .map_err(|e| fail(format!("raising wireguard-go's UDP buffers: {e}")))?;
        run_quiet(Command::new("ip").args([
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{}/24", wg_ip(side)),
            "dev",
            &ifname,
        ]))
        .map_err(|e| fail(format!("wg address: {e}")))?;
        run_quiet(
            Command::new("ip").args(["-n", &ns, "link", "set", &ifname, "mtu", "1420", "up"]),
        )
        .map_err(|e| fail(format!("wg up: {e}")))?;
    }
    let addr = SocketAddr::from((wg_ip(Side::Tgt), PORT));
    // Wait for the handshake as long as WireGuard's own retries take at this RTT
    // (crate::tunnel): a fixed 8 s once failed a run at 64 ms one way.
    let cfg = link.link.config();
    let w = TunnelWait::wireguard(cfg.up.delay + cfg.down.delay);
    let start = Instant::now();
    let ini_if = format!("wl{}i", std::process::id());
    let ini_ns = link.link.netns(Side::Ini);
    tunnel::wait(
        &w,
        &mut || start.elapsed(),
        &mut std::thread::sleep,
        &mut |timeout| {
            link.link
                .run_in(Side::Ini, move || {
                    TcpStream::connect_timeout(&addr, timeout).map(|_| ())
                })
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
        },
        &mut || {
            run_quiet(Command::new("ip").args([
                "netns",
                "exec",
                &ini_ns,
                "wg",
                "show",
                &ini_if,
                "latest-handshakes",
            ]))
            .map(|o| match o.split_whitespace().nth(1) {
                Some("0") | None => "no WireGuard handshake completed".to_string(),
                Some(t) => format!("last WireGuard handshake at unix time {t}"),
            })
            .map(|state| {
                let tail = |side| {
                    let text = std::fs::read_to_string(wg_log(ctx, side)).unwrap_or_default();
                    let lines: Vec<&str> = text
                        .lines()
                        .filter(|l| l.contains("(wl"))
                        .rev()
                        .take(6)
                        .collect();
                    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
                };
                format!(
                    "{state}; wireguard-go@ini: {}; wireguard-go@tgt: {}",
                    tail(Side::Ini),
                    tail(Side::Tgt)
                )
            })
            .unwrap_or_else(|e| format!("wg show failed: {e}"))
        },
    )
    .map_err(|e| fail(format!("no TCP through the WireGuard tunnel: {e}")))?;
    Ok(addr)
}

/// Where wireguard-go on `side` logs during a run.
fn wg_log(ctx: &RunCtx<'_>, side: Side) -> PathBuf {
    ctx.scratch
        .join(format!("wireguard-go-{}.log", side_name(side)))
}
