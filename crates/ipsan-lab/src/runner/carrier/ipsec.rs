//! The `ipsec` carrier: strongSwan's charon in each namespace (see [`crate::ipsec`]).

use super::Carrier;
use crate::runner::process::{run_quiet, side_name, wait_connect};
use crate::runner::*;

pub(super) struct Ipsec;

impl Carrier for Ipsec {
    fn check(&self, _ctx: &RunCtx<'_>) -> Result<(), RunError> {
        match crate::ipsec::unavailable() {
            Some(why) => Err(RunError::Skip(why)),
            None => Ok(()),
        }
    }

    fn connect(
        &self,
        ctx: &RunCtx<'_>,
        p: &Point,
        procs: &mut Procs,
        _target: SocketAddr,
    ) -> Result<SocketAddr, RunError> {
        ipsec(ctx, p, procs)
    }
}

/// Real IPsec: strongSwan's charon in each namespace (IKEv2 + PSK, userspace ESP in UDP,
/// tunnel mode with host-to-host selectors; see [`crate::ipsec`]). Returns the target's
/// address on the link: the iSCSI session goes to it as for `plain`, and charon's route
/// through its TUN device carries it inside ESP.
fn ipsec(ctx: &RunCtx<'_>, p: &Point, procs: &mut Procs) -> Result<SocketAddr, RunError> {
    let Some(link) = ctx.link else {
        return Err(RunError::Skip("ipsec needs namespaces (root)".into()));
    };
    let esp = crate::ipsec::esp_proposal(&p.cipher).map_err(RunError::Skip)?;
    // A fresh random PSK per run, only in the scratch files (never logged).
    let mut key = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))
        .map_err(|e| fail(format!("reading /dev/urandom: {e}")))?;
    let psk: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let mut sides = Vec::new();
    for side in [Side::Ini, Side::Tgt] {
        let peer = if side == Side::Ini {
            Side::Tgt
        } else {
            Side::Ini
        };
        // Absolute: charon resolves STRONGSWAN_CONF after changing to "/" (a relative
        // `--out` made every CHILD_SA fail: charon ran without the plan's plugins).
        let dir = std::path::absolute(ctx.scratch.join(format!("ipsec-{}", side_name(side))))
            .map_err(|e| fail(format!("scratch path: {e}")))?;
        let _ = std::fs::remove_file(dir.join("charon.log"));
        let s =
            crate::ipsec::Side::write(&dir, link.link.addr(side), link.link.addr(peer), esp, &psk)
                .map_err(|e| fail(format!("strongSwan config: {e}")))?;
        let ns = link.link.netns(side);
        for rule in crate::ipsec::bypass_rules() {
            // Rules persist in the namespace across runs; a second add says "File exists".
            let mut c = Command::new("ip");
            c.args(["-n", &ns]).args(&rule);
            match run_quiet(&mut c) {
                Ok(_) => {}
                Err(e) if e.contains("File exists") => {}
                Err(e) => return Err(fail(format!("ip rule for IKE: {e}"))),
            }
        }
        let argv = s.charon_argv();
        let mut c = link.link.command(side, &argv[0]);
        c.args(&argv[1..]);
        crate::guard::guard_child(&mut c);
        c.stdout(Stdio::null()).stderr(Stdio::null());
        let child = c.spawn().map_err(|e| fail(format!("charon: {e}")))?;
        let pid = child.id();
        procs.0.push((format!("charon@{}", side_name(side)), child));
        // charon is up when swanctl can load the connection (seconds on a loaded host).
        let t = Instant::now();
        loop {
            let load = s.load_args();
            let args: Vec<&str> = load.iter().map(String::as_str).collect();
            match run_bounded(s.swanctl(pid, &args), Duration::from_secs(10)) {
                Ok(o) if o.status.success() => break,
                Ok(o) if t.elapsed() > Duration::from_secs(20) => {
                    return Err(fail(format!(
                        "swanctl --load-all in {ns}: {}",
                        String::from_utf8_lossy(&o.stderr).trim()
                    )))
                }
                Err(e) if t.elapsed() > Duration::from_secs(20) => {
                    return Err(fail(format!("swanctl --load-all in {ns}: {e}")))
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        sides.push((s, pid));
    }
    let (ini, ini_pid) = &sides[0];
    let mut tries = Vec::new();
    let o = run_bounded(
        ini.swanctl(
            *ini_pid,
            &["--initiate", "--child", "lab", "--timeout", "20"],
        ),
        Duration::from_secs(30),
    )
    .map_err(|e| fail(format!("swanctl --initiate: {e}")))?;
    if !o.status.success() {
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        tries.push(format!(
            "{} {}",
            out.lines().last().unwrap_or("").trim(),
            err.lines().last().unwrap_or("").trim()
        ));
    }
    if !tries.is_empty() {
        let tail = |s: &crate::ipsec::Side| {
            let log = std::fs::read_to_string(s.dir.join("charon.log")).unwrap_or_default();
            let last: Vec<&str> = log.lines().rev().take(4).collect();
            last.join(" | ")
        };
        return Err(fail(format!(
            "IKE did not establish the CHILD_SA ({}); initiator's charon: {}; responder's: {}",
            tries.join("; "),
            tail(ini),
            tail(&sides[1].0)
        )));
    }
    // ESP-in-UDP arrives on charon's 4500 socket: 208 KiB of receive buffer overflows under
    // load (UdpRcvbufErrors), so raise it as upstream wireguard-go does.
    for (_, pid) in &sides {
        crate::sockbuf::force_udp_buffers(*pid, 4500, crate::sockbuf::WIREGUARD_SOCKET_BUFFER)
            .map_err(|e| fail(format!("raising charon's UDP buffers: {e}")))?;
    }
    // The inner TCP's packets wait for charon in `ipsec0`'s ring, 500 packets by default
    // (txqueuelen), and the TUN driver drops what does not fit: a 1 MiB write is ~750
    // packets in one burst, so at 64 ms 2–9 % of them were dropped there (ipsec0's TX
    // dropped counter) and Reno halved its window after every command. Kernel ESP, the
    // papers' baseline, seals inside the sender's transmit path and has no such queue.
    for side in [Side::Ini, Side::Tgt] {
        let ns = link.link.netns(side);
        run_quiet(Command::new("ip").args([
            "-n",
            &ns,
            "link",
            "set",
            "dev",
            crate::ipsec::TUN_DEVICE,
            "txqueuelen",
            &crate::ipsec::TUN_QUEUE.to_string(),
        ]))
        .map_err(|e| fail(format!("ipsec0's queue in {ns}: {e}")))?;
    }
    let addr = SocketAddr::from((link.tgt(), PORT));
    wait_connect(link, addr).map_err(|e| fail(format!("no TCP through the IPsec tunnel: {e}")))?;
    Ok(addr)
}
