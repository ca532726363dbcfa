//! The connection and login flags every initiator-side command shares (`bench`, `inquiry`,
//! `discover`, `attach`, `gateway`'s remote leg, `nvme`), and the session configuration they
//! build.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use ipsan_bench as bench;
use ipsan_initiator::ChapSecret;
use ipsan_initiator::{ChapCredentials, DigestChoice, IscsiUrl, LoginOptions, SessionConfig};

/// Connection and login flags shared by `bench`, `inquiry` and `discover`.
#[derive(Debug, clap::Args)]
pub struct ConnArgs {
    /// Our iSCSI name (InitiatorName).
    #[arg(long, default_value = "iqn.2026-11.org.ipsan:initiator")]
    pub initiator_name: String,
    /// Read the CHAP password from this file instead of the URL (one trailing newline dropped).
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
    /// Read the CHAP password from this environment variable instead of the URL.
    #[arg(long, value_name = "VAR")]
    pub password_env: Option<String>,
    /// Mutual CHAP: the name the target must answer with.
    #[arg(long)]
    pub target_user: Option<String>,
    /// Mutual CHAP: file holding the target's secret.
    #[arg(long, value_name = "FILE")]
    pub target_password_file: Option<PathBuf>,
    /// Mutual CHAP: environment variable holding the target's secret.
    #[arg(long, value_name = "VAR")]
    pub target_password_env: Option<String>,
    /// CHAP algorithms to offer, in order (comma-separated: sha256, sha3-256, sha1, md5).
    /// Default: sha256,sha3-256,sha1; MD5 only when listed here. Never narrowed on a refusal.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub chap_algorithms: Vec<String>,
    /// Start from RFC 7143's conservative defaults (InitialR2T=Yes, 8 KiB segments, 256 KiB
    /// bursts, one R2T) instead of the fast ones; flags below still override.
    #[arg(long)]
    pub rfc_defaults: bool,
    /// InitialR2T: wait for an R2T before any data beyond immediate data (yes|no).
    #[arg(long, value_parser = parse_yes_no)]
    pub initial_r2t: Option<bool>,
    /// ImmediateData: send the first data in the command PDU (yes|no).
    #[arg(long, value_parser = parse_yes_no)]
    pub immediate_data: Option<bool>,
    /// FirstBurstLength (unsolicited data per command), e.g. 256KiB.
    #[arg(long, value_parser = parse_u32_size)]
    pub first_burst: Option<u32>,
    /// MaxBurstLength (data per R2T or Data-In sequence), e.g. 16MiB.
    #[arg(long, value_parser = parse_u32_size)]
    pub max_burst: Option<u32>,
    /// MaxRecvDataSegmentLength we declare, e.g. 256KiB.
    #[arg(long, value_parser = parse_u32_size)]
    pub max_recv_seg: Option<u32>,
    /// MaxOutstandingR2T.
    #[arg(long)]
    pub max_outstanding_r2t: Option<u32>,
    /// CRC32C digests: none|header|data|both.
    #[arg(long, default_value = "none")]
    pub digest: DigestChoice,
    /// NOP-Out keepalive interval in seconds (0 disables).
    #[arg(long, default_value_t = 5)]
    pub nop_interval: u64,
    /// Seconds a keepalive NOP-Out may stay unanswered before the connection is declared
    /// failed and every command in flight fails (a silently dead link is found within
    /// --nop-interval + --nop-timeout).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub nop_timeout: u64,
    /// Seconds a SCSI command may go without status before the initiator aborts it with ABORT
    /// TASK and fails it (0 waits forever). An abort the target does not confirm within 10 s
    /// drops the connection.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86400))]
    pub command_timeout: u64,
    /// Session recovery (RFC 7143 §6.3.5 reinstatement, docs/bench.md "Session recovery"):
    /// when the connection fails, reconnect with backoff, log in again with fresh keys and
    /// resend the idempotent commands in flight; commands wait up to this long (e.g. `120s`,
    /// `2m`; a bare number is seconds) before they fail. `0` turns recovery off: a lost
    /// connection fails every command at once.
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = parse_recovery_timeout)]
    pub recovery_timeout: std::time::Duration,
    /// Seal every command's data (docs/seal.md): aes-256-gcm | chacha20-poly1305 |
    /// 3des-cbc-hmac-sha1 (legacy, the papers' cipher) | none (same framing, no protection).
    /// Without --seal the session is plain. The login fails if the target does not agree.
    #[arg(long, value_name = "CIPHER")]
    pub seal: Option<String>,
    /// Seal's pre-shared secret (at least 16 bytes; trailing whitespace ignored).
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// Threads that seal and open data (default: one per CPU).
    #[arg(long)]
    pub crypto_workers: Option<usize>,
    /// Seal's pipeline: `on` seals the next commands on the crypto workers while earlier ones
    /// wait for the network; `off` seals inline with one command in flight — the papers'
    /// "without optimization" cycle.
    #[arg(long, default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub pipeline: bool,
    /// With --seal: offer to compress the data (LZ4 per chunk, before sealing; docs/seal.md
    /// §4b). On only if the target agrees (`ipsan target --compress`). Leave it off when an
    /// attacker can choose part of the data and see transfer sizes (the length side channel).
    #[arg(long, requires = "seal")]
    pub compress: bool,
    /// TCP congestion control for the connection: cubic | bbr | reno | ipsan_sf | ipsan_sf_ss
    /// (the last two after `ipsan tcp load`). Default: the kernel's.
    #[arg(long, value_name = "NAME")]
    pub tcp_congestion: Option<String>,
    /// SO_SNDBUF: bytes (e.g. 8MiB), `kernel` (autotuning, default).
    #[arg(long, value_name = "SIZE")]
    pub tcp_sndbuf: Option<ipsan_tcp::BufSize>,
    /// SO_RCVBUF: bytes (e.g. 8MiB), `kernel` (autotuning, default). Set before connecting, so
    /// the window scale fits.
    #[arg(long, value_name = "SIZE")]
    pub tcp_rcvbuf: Option<ipsan_tcp::BufSize>,
    /// TCP_NODELAY (default yes: iSCSI PDUs are latency-sensitive).
    #[arg(long, value_parser = parse_yes_no)]
    pub tcp_nodelay: Option<bool>,
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("expected on or off, not {s:?}")),
    }
}

fn parse_yes_no(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "yes" | "y" | "true" | "1" => Ok(true),
        "no" | "n" | "false" | "0" => Ok(false),
        _ => Err(format!("expected yes or no, not {s:?}")),
    }
}

fn parse_u32_size(s: &str) -> Result<u32, String> {
    let v = bench::parse_size(s)?;
    u32::try_from(v).map_err(|_| format!("{s} is over 4 GiB"))
}

impl ConnArgs {
    /// Refuses the iSCSI-only flags on an `nvme+tcp://` URL (they would do nothing there).
    pub fn refuse_for_nvme(&self) -> anyhow::Result<()> {
        let given = [
            ("--password-file", self.password_file.is_some()),
            ("--password-env", self.password_env.is_some()),
            ("--target-user", self.target_user.is_some()),
            ("--chap-algorithms", !self.chap_algorithms.is_empty()),
            ("--rfc-defaults", self.rfc_defaults),
            ("--initial-r2t", self.initial_r2t.is_some()),
            ("--immediate-data", self.immediate_data.is_some()),
            ("--first-burst", self.first_burst.is_some()),
            ("--max-burst", self.max_burst.is_some()),
            ("--max-recv-seg", self.max_recv_seg.is_some()),
            ("--max-outstanding-r2t", self.max_outstanding_r2t.is_some()),
            ("--seal", self.seal.is_some()),
            ("--secret-file", self.secret_file.is_some()),
            ("--tcp-*", self.tcp_settings().is_some()),
        ];
        if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
            anyhow::bail!("{flag} is for iscsi:// URLs, not nvme+tcp://");
        }
        Ok(())
    }

    /// The `--tcp-*` flags, if any was given.
    pub fn tcp_settings(&self) -> Option<ipsan_tcp::TcpSettings> {
        let any = self.tcp_congestion.is_some()
            || self.tcp_sndbuf.is_some()
            || self.tcp_rcvbuf.is_some()
            || self.tcp_nodelay.is_some();
        any.then(|| ipsan_tcp::TcpSettings {
            congestion: self.tcp_congestion.clone(),
            sndbuf: self.tcp_sndbuf.unwrap_or_default(),
            rcvbuf: self.tcp_rcvbuf.unwrap_or_default(),
            nodelay: Some(self.tcp_nodelay.unwrap_or(true)),
            ..ipsan_tcp::TcpSettings::default()
        })
    }

    /// Parse the URL and turn the flags into a session configuration.
    pub fn config(&self, url: &str) -> anyhow::Result<(IscsiUrl, SessionConfig)> {
        let url = IscsiUrl::parse(url)?
            .with_secret_from(self.password_file.as_deref(), self.password_env.as_deref())?;
        let mut login = if self.rfc_defaults {
            LoginOptions::rfc_defaults()
        } else {
            LoginOptions::default()
        };
        login.initiator_name = self.initiator_name.clone();
        login.digest = self.digest;
        if let Some(v) = self.initial_r2t {
            login.initial_r2t = v;
        }
        if let Some(v) = self.immediate_data {
            login.immediate_data = v;
        }
        if let Some(v) = self.first_burst {
            login.first_burst_length = v;
        }
        if let Some(v) = self.max_burst {
            login.max_burst_length = v;
        }
        if let Some(v) = self.max_recv_seg {
            login.max_recv_data_segment_length = v;
        }
        if let Some(v) = self.max_outstanding_r2t {
            login.max_outstanding_r2t = v;
        }
        if let Some(user) = &url.user {
            let secret = url.password().cloned().context(
                "the URL names a CHAP user but no password was given \
                 (URL user%password, --password-file or --password-env)",
            )?;
            login.chap = Some(ChapCredentials {
                name: user.clone(),
                secret,
            });
        }
        if !self.chap_algorithms.is_empty() {
            login.chap_algorithms = self
                .chap_algorithms
                .iter()
                .map(|n| {
                    ipsan_initiator::ChapAlgorithm::from_name(n).with_context(|| {
                        format!("--chap-algorithms: unknown {n:?}; expected sha256, sha3-256, sha1 or md5")
                    })
                })
                .collect::<anyhow::Result<_>>()?;
        }
        if let Some(tu) = &self.target_user {
            let secret = if let Some(f) = &self.target_password_file {
                ChapSecret::from_file(f)?
            } else if let Some(v) = &self.target_password_env {
                ChapSecret::from_env(v)?
            } else {
                anyhow::bail!(
                    "--target-user needs --target-password-file or --target-password-env"
                );
            };
            anyhow::ensure!(
                login.chap.is_some(),
                "mutual CHAP needs a CHAP user in the URL"
            );
            login.mutual_chap = Some(ChapCredentials {
                name: tu.clone(),
                secret,
            });
        }
        if login.chap.is_some() || self.secret_file.is_some() {
            super::super::hold_secrets();
        }
        anyhow::ensure!(
            self.seal.is_none() || self.secret_file.is_some(),
            "--seal needs --secret-file (Seal's pre-shared secret)"
        );
        let extension = match (&self.seal, &self.secret_file) {
            (Some(name), Some(path)) => {
                let cipher = ipsan_seal::Cipher::from_name(name).with_context(|| {
                    format!("--seal {name}: expected aes-256-gcm, chacha20-poly1305, 3des-cbc-hmac-sha1 or none")
                })?;
                let psk = ipsan_initiator::psk_from_file(path)
                    .with_context(|| format!("--secret-file {}", path.display()))?;
                let workers = self.crypto_workers.unwrap_or_else(|| {
                    std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get)
                });
                anyhow::ensure!(
                    (1..=256).contains(&workers),
                    "--crypto-workers: must be in 1..=256"
                );
                let pool = if self.pipeline {
                    Some(Arc::new(
                        ipsan_seal::CryptoPool::new(workers).context("crypto workers")?,
                    ))
                } else {
                    None
                };
                let req = ipsan_initiator::seal::SealRequest {
                    ciphers: vec![cipher],
                    chunk: ipsan_seal::DEFAULT_CHUNK,
                    psk,
                    pool,
                };
                Some(req.factory_with_compression(self.compress))
            }
            _ => None,
        };
        let cfg = SessionConfig {
            login,
            nop_interval: (self.nop_interval > 0)
                .then(|| std::time::Duration::from_secs(self.nop_interval)),
            nop_timeout: std::time::Duration::from_secs(self.nop_timeout),
            command_timeout: (self.command_timeout > 0)
                .then(|| std::time::Duration::from_secs(self.command_timeout)),
            extension,
            tcp: self.tcp_settings(),
            recovery_timeout: Some(self.recovery_timeout).filter(|d| !d.is_zero()),
            ..SessionConfig::default()
        };
        Ok((url, cfg))
    }
}

/// `--recovery-timeout`: a duration (`0` = off; a bare number is seconds).
fn parse_recovery_timeout(s: &str) -> Result<std::time::Duration, String> {
    ipsan_units::parse_duration_or_secs(s).map_err(|e| e.to_string())
}
