//! The carriers: what each scheme adds around the one iSCSI session a run measures — flags on
//! the target and on `ipsan bench` (Seal's), or a tunnel between the namespaces that the
//! session goes through (IPsec, WireGuard, TLS). `plain`, `esp-emu` (whose ESP is a stage of the
//! emulated link, [`crate::esp`]) and `iperf3` (no iSCSI, [`super::iperf3`]) add nothing here.
//! [`of`] is the table from scheme to carrier; `try_run` calls its steps in order.

mod ipsec;
mod tls;
mod wireguard;

use super::*;

/// One scheme's part of a run, called in this order by `try_run`.
pub(super) trait Carrier {
    /// Whether this host and this `ipsan` can run it at all (skipped or failed, never faked).
    fn check(&self, _ctx: &RunCtx<'_>) -> Result<(), RunError> {
        Ok(())
    }

    /// The target's flags for this scheme. Without Seal, a target inside the run's own
    /// namespaces says explicitly that it authenticates no host.
    fn target_args(&self, ctx: &RunCtx<'_>, _p: &Point, cmd: &mut Command) -> Result<(), RunError> {
        if ctx.link.is_some() {
            // 0.0.0.0 inside the target namespace this run made, reached only by its own
            // initiator namespace (or tunnel): no host authentication, said explicitly, as a
            // target beyond loopback refuses to start without it (docs/target.md).
            cmd.arg("--insecure-no-auth");
        }
        Ok(())
    }

    /// Starts what carries the session to `target`; returns where the initiator connects.
    fn connect(
        &self,
        _ctx: &RunCtx<'_>,
        _p: &Point,
        _procs: &mut Procs,
        target: SocketAddr,
    ) -> Result<SocketAddr, RunError> {
        Ok(target)
    }

    /// `ipsan bench`'s flags for this scheme.
    fn bench_args(&self, _ctx: &RunCtx<'_>, _p: &Point, _cmd: &mut Command) {}
}

/// The carrier of `scheme`.
pub(super) fn of(scheme: Scheme) -> &'static dyn Carrier {
    match scheme {
        Scheme::Plain | Scheme::EspEmu | Scheme::Iperf3 => &Plain,
        Scheme::Seal | Scheme::SealSeq => &Seal,
        Scheme::Ipsec => &ipsec::Ipsec,
        Scheme::Wireguard => &wireguard::Wireguard,
        Scheme::Tls => &tls::Tls,
    }
}

/// iSCSI as it is.
struct Plain;

impl Carrier for Plain {}

/// Seal: the target requires it, bench seals with the point's cipher, both from one secret
/// file in the run's scratch directory.
struct Seal;

impl Seal {
    fn secret(ctx: &RunCtx<'_>) -> PathBuf {
        ctx.scratch.join("seal.secret")
    }
}

impl Carrier for Seal {
    fn check(&self, ctx: &RunCtx<'_>) -> Result<(), RunError> {
        if ctx.bench_has_seal {
            Ok(())
        } else {
            Err(fail(
                "ipsan bench has no --seal flag yet (seal is being integrated into the initiator); not faked",
            ))
        }
    }

    fn target_args(&self, ctx: &RunCtx<'_>, p: &Point, cmd: &mut Command) -> Result<(), RunError> {
        let secret = Seal::secret(ctx);
        std::fs::write(
            &secret,
            b"ipsan lab run secret: 32+ bytes long, never reused\n",
        )
        .map_err(|e| fail(format!("writing the seal secret: {e}")))?;
        // The target refuses secret files others can read.
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(|e| fail(format!("chmod 600 the seal secret: {e}")))?;
        cmd.args(["--seal", "required", "--seal-secret-file"]);
        cmd.arg(&secret);
        if p.crypto_workers > 0 {
            cmd.args(["--crypto-workers", &p.crypto_workers.to_string()]);
        }
        Ok(())
    }

    fn bench_args(&self, ctx: &RunCtx<'_>, p: &Point, cmd: &mut Command) {
        cmd.args(["--seal", &p.cipher, "--secret-file"]);
        cmd.arg(Seal::secret(ctx));
        cmd.args(["--pipeline", if p.pipeline { "on" } else { "off" }]);
        if p.crypto_workers > 0 {
            cmd.args(["--crypto-workers", &p.crypto_workers.to_string()]);
        }
    }
}
