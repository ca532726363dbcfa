//! The NVMe/TCP side of `ipsan bench`, `inquiry` and `discover` (issue 30): the flags only
//! `nvme+tcp://` URLs take, and the session configuration built from them and the shared
//! connection flags that apply to both protocols (`--digest`, `--command-timeout`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ipsan_initiator::nvme::{self, NvmeConfig, NvmeUrl};

use super::bench::ConnArgs;

/// Flags of `nvme+tcp://` URLs.
#[derive(Debug, clap::Args)]
pub struct NvmeArgs {
    /// NVMe/TCP: I/O queues, each its own TCP connection (the controller may grant fewer).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub queues: Option<u16>,
    /// NVMe/TCP: our host NQN (default: nqn.2014-08.org.nvmexpress:uuid:<host ID>).
    #[arg(long, value_name = "NQN")]
    pub hostnqn: Option<String>,
    /// NVMe/TCP: our host identifier, a UUID (default: a random one per run).
    #[arg(long, value_name = "UUID")]
    pub hostid: Option<String>,
    /// NVMe/TCP: Keep Alive Timeout (default 5s; 0 turns keep alive off); Keep Alive goes out
    /// at half of it.
    #[arg(long, value_name = "DURATION", value_parser = parse_kato)]
    pub kato: Option<Duration>,
    /// NVMe/TCP: DH-HMAC-CHAP (TP 8006) with the host secret in this file (`DHHC-1:…:`, as
    /// `nvme gen-dhchap-key` makes it; mode 0600): every queue authenticates when the
    /// controller asks.
    #[arg(long, value_name = "FILE")]
    pub dhchap_secret_file: Option<PathBuf>,
    /// NVMe/TCP: the controller's DH-HMAC-CHAP secret (`DHHC-1:…:`): bidirectional
    /// authentication, the controller must prove it knows it.
    #[arg(long, value_name = "FILE", requires = "dhchap_secret_file")]
    pub dhchap_ctrl_secret_file: Option<PathBuf>,
    /// NVMe/TCP: TLS 1.3 on every queue with the configured PSK in this file
    /// (`NVMeTLSkey-1:…:`, as `nvme gen-tls-key` makes it; mode 0600). The identity is
    /// `NVMe0R0H <hostnqn> <subsysnqn>`, the key Linux's target files with
    /// `nvme check-tls-key --insert`.
    #[arg(long, value_name = "FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// NVMe/TCP: after a connection loss, connect a new controller again for up to this long
    /// (Linux's ctrl_loss_tmo); Read, Write, Flush, Write Zeroes, Dataset Management and
    /// Compare in flight are sent again on it, reservation commands fail. Default 0: a lost
    /// connection fails the run (Linux's default is 600s).
    #[arg(long, value_name = "DURATION", value_parser = parse_kato)]
    pub ctrl_loss_tmo: Option<Duration>,
    /// NVMe/TCP: wait between attempts to connect again (Linux's reconnect_delay; default
    /// 10s), with --ctrl-loss-tmo.
    #[arg(long, value_name = "DURATION", value_parser = parse_kato, requires = "ctrl_loss_tmo")]
    pub reconnect_delay: Option<Duration>,
    /// NVMe/TCP: keep SQ flow control on the I/O queues. By default their Connects disable it
    /// (as `nvme connect --disable-sqflow`), so a successful read ends with its data and no
    /// response capsule.
    #[arg(long)]
    pub sq_flow_control: bool,
}

fn parse_kato(s: &str) -> Result<Duration, String> {
    ipsan_units::parse_duration_or_secs(s).map_err(|e| e.to_string())
}

impl NvmeArgs {
    /// Refuses the NVMe flags on an `iscsi://` URL (they would do nothing there).
    pub fn refuse_for_iscsi(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.queues.is_none()
                && self.hostnqn.is_none()
                && self.hostid.is_none()
                && self.kato.is_none()
                && self.dhchap_secret_file.is_none()
                && self.tls_key_file.is_none()
                && self.ctrl_loss_tmo.is_none()
                && !self.sq_flow_control,
            "--queues, --hostnqn, --hostid, --kato, --dhchap-*, --tls-key-file, --ctrl-loss-tmo and --sq-flow-control are for nvme+tcp:// URLs"
        );
        Ok(())
    }

    /// The URL and session configuration for an `nvme+tcp://` URL; the iSCSI-only flags of
    /// `conn` are refused.
    pub fn config(&self, url: &str, conn: &ConnArgs) -> anyhow::Result<(NvmeUrl, NvmeConfig)> {
        let url = NvmeUrl::parse(url).with_context(|| format!("bad URL {url:?}"))?;
        conn.refuse_for_nvme()?;
        let mut cfg = NvmeConfig::default();
        if let Some(id) = &self.hostid {
            cfg.hostid = nvme::parse_uuid(id)?;
            cfg.hostnqn = nvme::hostnqn_for(&cfg.hostid);
        }
        if let Some(n) = &self.hostnqn {
            cfg.hostnqn = n.clone();
        }
        if let Some(q) = self.queues {
            cfg.queues = q;
        }
        if let Some(k) = self.kato {
            cfg.kato = k;
        }
        if let Some(f) = &self.dhchap_secret_file {
            let host = nvme::dhchap_secret_from_file(f)?;
            let ctrl = match &self.dhchap_ctrl_secret_file {
                Some(c) => Some(nvme::dhchap_secret_from_file(c)?),
                None => None,
            };
            cfg.auth = Some(Arc::new(nvme::AuthConfig::new(host, ctrl)));
        }
        if let Some(f) = &self.tls_key_file {
            cfg.tls = Some(Arc::new(nvme::tls_key_from_file(f)?));
        }
        if let Some(tmo) = self.ctrl_loss_tmo.filter(|d| !d.is_zero()) {
            cfg.reconnect = Some(nvme::Reconnect {
                delay: self.reconnect_delay.unwrap_or(Duration::from_secs(10)),
                ctrl_loss_tmo: tmo,
            });
        }
        cfg.sq_flow_control = self.sq_flow_control;
        cfg.header_digest = conn.digest.header();
        cfg.data_digest = conn.digest.data();
        cfg.command_timeout =
            Some(Duration::from_secs(conn.command_timeout)).filter(|d| !d.is_zero());
        Ok((url, cfg))
    }
}
