//! The `tls` carrier: stunnel (TLS 1.3) in both namespaces.

use super::Carrier;
use crate::plan::tls_cipher;
use crate::runner::process::{run_quiet, side_name, wait_connect};
use crate::runner::*;

pub(super) struct Tls;

impl Carrier for Tls {
    fn connect(
        &self,
        ctx: &RunCtx<'_>,
        p: &Point,
        procs: &mut Procs,
        _target: SocketAddr,
    ) -> Result<SocketAddr, RunError> {
        tls(ctx, p, procs)
    }
}

/// stunnel (TLS 1.3) in both namespaces: the initiator talks to its local stunnel, which
/// carries the session over TLS to the target side's stunnel.
fn tls(ctx: &RunCtx<'_>, p: &Point, procs: &mut Procs) -> Result<SocketAddr, RunError> {
    let Some(link) = ctx.link else {
        return Err(RunError::Skip("tls needs namespaces (root)".into()));
    };
    let (_, suite) = tls_cipher(&p.cipher);
    let key = ctx.scratch.join("tls.key");
    let cert = ctx.scratch.join("tls.crt");
    if !cert.exists() {
        run_quiet(
            Command::new("openssl")
                .args([
                    "req",
                    "-x509",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:prime256v1",
                    "-nodes",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=ipsan-lab",
                    "-keyout",
                ])
                .arg(&key)
                .arg("-out")
                .arg(&cert),
        )
        .map_err(|e| fail(format!("openssl req: {e}")))?;
    }
    let tgt = link.tgt();
    let server = format!(
        "foreground = yes\npid =\nsyslog = no\n[iscsi]\naccept = {tgt}:{TLS_PORT}\nconnect = 127.0.0.1:{PORT}\ncert = {}\nkey = {}\nsslVersion = TLSv1.3\nciphersuites = {suite}\n",
        cert.display(),
        key.display()
    );
    let client = format!(
        "foreground = yes\npid =\nsyslog = no\n[iscsi]\nclient = yes\naccept = 127.0.0.1:{PORT}\nconnect = {tgt}:{TLS_PORT}\nsslVersion = TLSv1.3\nciphersuites = {suite}\n"
    );
    for (side, conf, name) in [
        (Side::Tgt, server, "stunnel-tgt.conf"),
        (Side::Ini, client, "stunnel-ini.conf"),
    ] {
        let path = ctx.scratch.join(name);
        std::fs::write(&path, conf).map_err(|e| fail(format!("stunnel config: {e}")))?;
        let mut c = link.link.command(side, "stunnel");
        crate::guard::guard_child(&mut c);
        c.arg(&path).stdout(Stdio::null()).stderr(Stdio::null());
        let child = c.spawn().map_err(|e| fail(format!("stunnel: {e}")))?;
        procs
            .0
            .push((format!("stunnel@{}", side_name(side)), child));
    }
    // The target-side stunnel first: the client side accepts at once and only then connects
    // upstream, so a bench arriving before the server listens got "connection reset" (seen
    // once in the quick plan at 0 ms).
    wait_connect(link, SocketAddr::from((tgt, TLS_PORT)))
        .map_err(|e| fail(format!("the target-side stunnel did not listen: {e}")))?;
    let local = SocketAddr::from((Ipv4Addr::LOCALHOST, PORT));
    // The initiator-side stunnel listens in the initiator's namespace.
    let t = Instant::now();
    loop {
        let ok = link
            .link
            .run_in(Side::Ini, move || {
                TcpStream::connect_timeout(&local, Duration::from_millis(300)).is_ok()
            })
            .unwrap_or(false);
        if ok {
            break;
        }
        if t.elapsed() > Duration::from_secs(5) {
            return Err(fail("stunnel did not listen within 5 s"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(local)
}
