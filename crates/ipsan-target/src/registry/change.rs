//! Live changes (`ipsan ctl`, SIGHUP reloads): a new file form validated as a file is, every
//! change planned and checked before anything changes, then swapped in at once; hosts get
//! REPORTED LUNS DATA HAS CHANGED, sessions no longer allowed end, removed LUNs are flushed.

use std::collections::BTreeSet;
use std::sync::Arc;

use ipsan_scsi::LogicalUnit;
use iscsi_proto::login::Auth;

use super::{build_target, Registry, Target};
use crate::config::{Config, FileConfig, LunConfig, TargetConfig};

/// Why a configuration change was refused; nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// The new configuration does not validate (the field is named, as for a file).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The change is valid but would hurt running sessions without `force`, or cannot be
    /// done online.
    #[error("{field}: {why}")]
    Refused { field: String, why: String },
    /// The target was built in code, without a file form to edit.
    #[error("this target was not started from a configuration file form; nothing to edit")]
    NoSource,
}

fn refused(field: impl Into<String>, why: impl Into<String>) -> ChangeError {
    ChangeError::Refused {
        field: field.into(),
        why: why.into(),
    }
}

/// What an applied change did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct ChangeReport {
    /// One line per change (target added, LUN resized, …).
    pub changes: Vec<String>,
    /// Sessions ended by the change (removed targets, initiators no longer allowed).
    pub sessions_dropped: usize,
    /// Settings that changed in the file but only take effect at the next start.
    pub restart_needed: Vec<String>,
}

/// Whether two LUN configurations differ at most in size (a resize, not a replacement).
fn same_but_size(a: &LunConfig, b: &LunConfig) -> bool {
    let unsized_ = |l: &LunConfig| ipsan_scsi::BackendSpec {
        size: None,
        ..l.backend.clone()
    };
    a.id == b.id
        && unsized_(a) == unsized_(b)
        && a.block_size == b.block_size
        && a.read_only == b.read_only
        && a.write_cache == b.write_cache
        && a.serial == b.serial
}

/// Whether two Seal settings are the same (secrets compared in constant time).
fn same_seal(a: &crate::config::SealSettings, b: &crate::config::SealSettings) -> bool {
    let same_psk = |x: &Option<ipsan_seal::Psk>, y: &Option<ipsan_seal::Psk>| match (x, y) {
        (Some(x), Some(y)) => x.ct_eq(y),
        (None, None) => true,
        _ => false,
    };
    a.policy == b.policy
        && same_psk(&a.secret, &b.secret)
        && a.initiators.len() == b.initiators.len()
        && a.initiators
            .iter()
            .zip(&b.initiators)
            .all(|((n, p), (m, q))| n == m && p.ct_eq(q))
}

/// What a change of `[nvme]` does: the subsystems' host lists and the hosts' DH-HMAC-CHAP
/// secrets apply at once (reported as changes; the secrets by `Shared::apply_secrets`, which
/// reads what the files hold); anything else in it (listeners, TLS and its keys, NQNs) only at
/// the next start.
fn nvme_changes(old: &FileConfig, new: &FileConfig, report: &mut ChangeReport) {
    if old.nvme == new.nvme {
        return;
    }
    let hosts = |f: &FileConfig| {
        let mut v: Vec<(String, Vec<String>)> = f
            .nvme
            .subsystem
            .iter()
            .filter(|s| !s.hosts.is_empty())
            .map(|s| (s.target.clone(), s.hosts.clone()))
            .collect();
        v.sort();
        v
    };
    let (old_hosts, new_hosts) = (hosts(old), hosts(new));
    for (t, h) in &new_hosts {
        if !old_hosts.iter().any(|(o, oh)| o == t && oh == h) {
            report
                .changes
                .push(format!("NVMe hosts of {t}: {}", h.join(", ")));
        }
    }
    for (t, _) in &old_hosts {
        if !new_hosts.iter().any(|(n, _)| n == t) {
            report
                .changes
                .push(format!("NVMe hosts of {t}: any authenticated host"));
        }
    }
    let strip = |f: &FileConfig| {
        let mut n = f.nvme.clone();
        for s in &mut n.subsystem {
            s.hosts.clear();
        }
        n.subsystem.retain(|s| s.nqn.is_some());
        for h in &mut n.host {
            h.dhchap_secret_file = None;
            h.dhchap_ctrl_secret_file = None;
            if h.tls_key_file.is_none() {
                h.subsystems.clear();
            }
        }
        n.host.retain(|h| h.tls_key_file.is_some());
        n
    };
    if strip(old) != strip(new) {
        report
            .restart_needed
            .push("nvme (listeners, TLS and its keys, subsystem NQNs)".into());
    }
}

/// REPORTED LUNS DATA HAS CHANGED (SPC-4 §7.5.5 / Table 49: 3Fh/0Eh).
const REPORTED_LUNS_CHANGED: (u8, u8) = (0x3F, 0x0E);

impl Registry {
    /// The running configuration in file form (`None` when built in code).
    #[must_use]
    pub fn running_config(&self) -> Option<FileConfig> {
        crate::lock(&self.running).clone()
    }

    /// Edits the running configuration with `edit` and applies the result like a reload:
    /// validated as a file is, then swapped in atomically. Changes are serialized.
    pub fn change(
        &self,
        force: bool,
        edit: impl FnOnce(&mut FileConfig) -> Result<(), ChangeError>,
    ) -> Result<ChangeReport, ChangeError> {
        let mut running = crate::lock(&self.running);
        let r = (|| {
            let current = running.as_ref().ok_or(ChangeError::NoSource)?;
            let mut next = current.clone();
            edit(&mut next)?;
            let report = self.apply_locked(current, &next, force)?;
            Ok((next, report))
        })();
        let counter = match &r {
            Ok(_) => &self.metrics.config_changes,
            Err(ChangeError::Config(_)) => &self.metrics.config_changes_invalid,
            Err(_) => &self.metrics.config_changes_refused,
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (next, report) = r?;
        *running = Some(next);
        Ok(report)
    }

    /// Replaces the running configuration with `next` (a reload).
    pub fn apply(&self, next: FileConfig, force: bool) -> Result<ChangeReport, ChangeError> {
        self.change(force, |f| {
            *f = next;
            Ok(())
        })
    }

    /// Applies `new_file` over `old_file`: validated, planned and checked whole (refused with
    /// nothing changed), new backends opened and files grown, then one swap; then hosts are
    /// told and what is no longer served is dropped and flushed.
    fn apply_locked(
        &self,
        old_file: &FileConfig,
        new_file: &FileConfig,
        force: bool,
    ) -> Result<ChangeReport, ChangeError> {
        let cfg = Config::from_file_config(new_file)?;
        self.check_exposure(&cfg)?;
        if let Some(n) = self.nvme.get() {
            // The NVMe listeners as bound: none beyond loopback may lose its last host
            // authentication (its TLS mode is the one started with).
            n.check_exposure(&cfg.nvme, self.insecure_no_auth)
                .map_err(|e| refused("nvme.host", e.to_string()))?;
        }
        let old = self.targets();
        let in_use = InUse::now(self);
        let mut report = ChangeReport::default();
        if old_file.server != new_file.server {
            report
                .restart_needed
                .push("server (portals, limits, queue depth, TCP settings)".into());
        }

        // Plan and check everything before changing anything.
        removed_targets(&old, &cfg, &in_use, force, &mut report)?;
        let mut plans = Vec::new();
        for (i, t) in cfg.targets.iter().enumerate() {
            let o = old.iter().find(|x| x.iqn == t.iqn);
            plans.push(plan_target(i, t, o, &in_use, force, &mut report)?);
        }
        let built = open_targets(&cfg, &old, &plans)?;
        grow_files(&plans)?;

        let built = self.swap_in(&cfg, built);
        self.after_swap(&old, &built, &plans, &mut report);
        nvme_changes(old_file, new_file, &mut report);
        if let Some(n) = self.nvme.get() {
            // The subsystems' host lists and the hosts' DH-HMAC-CHAP secrets apply live; the
            // rest of `[nvme]` at the next start.
            n.apply_hosts(&cfg.nvme, &cfg.targets);
            if let Some(closed) = n.apply_secrets(&cfg.nvme) {
                report.changes.push(format!(
                    "NVMe DH-HMAC-CHAP secrets ({closed} controllers closed)"
                ));
            }
        }
        log_report(&report);
        Ok(report)
    }

    /// A listener beyond loopback authenticates: no change may add a target that
    /// authenticates no host, or take the last authentication from one, while a bound
    /// portal is beyond loopback (crate::exposure; `insecure_no_auth` as started).
    fn check_exposure(&self, cfg: &Config) -> Result<(), ChangeError> {
        let portals = crate::read(&self.portals).clone();
        match crate::exposure::check(cfg, &portals, self.insecure_no_auth) {
            Err(e) => Err(refused(
                format!("target {}", e.targets.join(", ")),
                e.to_string(),
            )),
            Ok(warnings) => {
                for w in warnings {
                    if matches!(w, crate::exposure::ExposureWarning::Insecure { .. }) {
                        tracing::warn!("{w}");
                    }
                }
                Ok(())
            }
        }
    }

    /// Commit: the new targets' LUN counters, then one swap of the target list and the
    /// discovery settings.
    fn swap_in(&self, cfg: &Config, built: Vec<Target>) -> Vec<Arc<Target>> {
        for t in &built {
            let mut table = crate::write(&t.lun_stats);
            table.retain(|id, _| t.luns.contains_key(id));
            for (id, lu) in &t.luns {
                table
                    .entry(*id)
                    .or_insert_with(|| crate::metrics::lun_stats(lu.block_size()));
            }
        }
        let built: Vec<Arc<Target>> = built.into_iter().map(Arc::new).collect();
        *crate::write(&self.targets) = Arc::new(built.clone());
        *crate::write(&self.discovery_auth) =
            cfg.discovery_chap.clone().map_or(Auth::None, Auth::Chap);
        self.discovery_enabled
            .store(cfg.discovery_enabled, std::sync::atomic::Ordering::Relaxed);
        built
    }

    /// Tells whom it concerns: REPORTED LUNS DATA HAS CHANGED where a LUN went, removed
    /// targets' counters forgotten, sessions of removed targets (or of initiators no longer
    /// allowed) ended, and backends no longer served flushed (their last commands finish on
    /// their own Arcs).
    fn after_swap(
        &self,
        old: &[Arc<Target>],
        built: &[Arc<Target>],
        plans: &[LunPlan],
        report: &mut ChangeReport,
    ) {
        for (t, plan) in built.iter().zip(plans) {
            if !plan.gone.is_empty() {
                for lu in t.luns.values() {
                    lu.unit_attention_all(REPORTED_LUNS_CHANGED.0, REPORTED_LUNS_CHANGED.1);
                }
            }
        }
        for o in old.iter().filter(|o| !built.iter().any(|n| n.iqn == o.iqn)) {
            self.metrics.forget_target(&o.iqn);
        }
        report.sessions_dropped = self.drop_sessions(|s| match s.target.as_deref() {
            None => false,
            Some(iqn) => match built.iter().find(|t| t.iqn == iqn) {
                None => true,
                Some(t) => !t.allows(&s.initiator),
            },
        });
        for o in old {
            for (id, backend) in &o.backends {
                let still = built
                    .iter()
                    .find(|n| n.iqn == o.iqn)
                    .and_then(|n| n.backends.iter().find(|(i, _)| i == id))
                    .is_some_and(|(_, b)| Arc::ptr_eq(b, backend));
                if !still {
                    if let Err(e) = backend.flush() {
                        tracing::warn!(target = %o.iqn, lun = id, "flush of a removed LUN failed: {e}");
                    }
                }
            }
        }
    }
}

/// Sessions logged in per target, as the change is planned.
struct InUse(Vec<Option<String>>);

impl InUse {
    fn now(r: &Registry) -> InUse {
        InUse(
            r.sessions()
                .into_iter()
                .map(|s| s.info.target.clone())
                .collect(),
        )
    }

    fn count(&self, iqn: &str) -> usize {
        self.0.iter().filter(|t| t.as_deref() == Some(iqn)).count()
    }
}

/// What a change does to one target's LUNs.
#[derive(Default)]
struct LunPlan {
    /// Kept as they are (same backend, perhaps grown).
    keep: BTreeSet<u64>,
    /// Removed or replaced: hosts get REPORTED LUNS DATA HAS CHANGED.
    gone: Vec<u64>,
    /// Grown: the LU, its new size in bytes, the field that asked.
    grow: Vec<(Arc<LogicalUnit>, u64, String)>,
}

/// Targets the change removes: refused while sessions use one, unless `force`.
fn removed_targets(
    old: &[Arc<Target>],
    cfg: &Config,
    in_use: &InUse,
    force: bool,
    report: &mut ChangeReport,
) -> Result<(), ChangeError> {
    for t in old {
        if !cfg.targets.iter().any(|n| n.iqn == t.iqn) {
            let n = in_use.count(&t.iqn);
            if n > 0 && !force {
                return Err(refused(
                    format!("target {}", t.iqn),
                    format!("{n} session(s) logged in; force to remove it and drop them"),
                ));
            }
            report.changes.push(format!("target {} removed", t.iqn));
        }
    }
    Ok(())
}

/// One target of the new configuration (`target[i]`) against the running one `o`: its LUNs
/// kept, grown, replaced, added or removed, and its access changes reported.
fn plan_target(
    i: usize,
    t: &TargetConfig,
    o: Option<&Arc<Target>>,
    in_use: &InUse,
    force: bool,
    report: &mut ChangeReport,
) -> Result<LunPlan, ChangeError> {
    let mut plan = LunPlan::default();
    let Some(o) = o else {
        report.changes.push(format!(
            "target {} added with LUN(s) {:?}",
            t.iqn,
            t.luns.iter().map(|l| l.id).collect::<Vec<_>>()
        ));
        return Ok(plan);
    };
    let sessions_here = in_use.count(&t.iqn);
    for (j, l) in t.luns.iter().enumerate() {
        let field = format!("target[{i}].lun[{j}]");
        match o.lun_configs.get(&l.id) {
            Some(ol) if same_but_size(ol, l) => {
                plan.keep.insert(l.id);
                if let Some(lu) = o.luns.get(&l.id) {
                    plan_resize(&t.iqn, &field, l, lu, &mut plan, report)?;
                }
            }
            Some(_) => {
                if sessions_here > 0 && !force {
                    return Err(refused(
                        field,
                        format!("LUN {} is in use by {sessions_here} session(s) and this change replaces it (only the size can change online); force to replace it", l.id),
                    ));
                }
                plan.gone.push(l.id);
                report
                    .changes
                    .push(format!("target {} LUN {} replaced", t.iqn, l.id));
            }
            None => report
                .changes
                .push(format!("target {} LUN {} added", t.iqn, l.id)),
        }
    }
    for id in o.luns.keys() {
        if t.luns.iter().any(|l| l.id == *id) {
            continue;
        }
        if sessions_here > 0 && !force {
            return Err(refused(
                format!("target[{i}].lun"),
                format!("LUN {id} is in use by {sessions_here} session(s); force to remove it (hosts get REPORTED LUNS DATA HAS CHANGED)"),
            ));
        }
        plan.gone.push(*id);
        report
            .changes
            .push(format!("target {} LUN {id} removed", t.iqn));
    }
    report_access_changes(t, o, report);
    Ok(plan)
}

/// A kept LUN whose size changes: growing a file or null LUN is planned, shrinking (hosts may
/// use those blocks), resizing a mem LUN, or a size of partial blocks is refused.
fn plan_resize(
    iqn: &str,
    field: &str,
    l: &LunConfig,
    lu: &Arc<LogicalUnit>,
    plan: &mut LunPlan,
    report: &mut ChangeReport,
) -> Result<(), ChangeError> {
    let now = lu.num_blocks() * u64::from(lu.block_size());
    match l.backend.size {
        Some(want) if want < now => Err(refused(
            format!("{field}.backend"),
            format!("shrinking LUN {} from {now} to {want} bytes is refused: hosts may be using those blocks", l.id),
        )),
        Some(want) if want > now => {
            if matches!(l.backend.kind, ipsan_scsi::BackendKind::Mem) {
                return Err(refused(
                    format!("{field}.backend"),
                    "a mem LUN cannot be resized online (file and null LUNs can)",
                ));
            }
            if want % u64::from(lu.block_size()) != 0 {
                return Err(refused(
                    format!("{field}.backend"),
                    format!("{want} bytes is not a whole number of {}-byte blocks", lu.block_size()),
                ));
            }
            plan.grow.push((lu.clone(), want, format!("{field}.backend")));
            report.changes.push(format!(
                "target {iqn} LUN {} resized from {now} to {want} bytes",
                l.id
            ));
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Allow-list, CHAP and Seal changes: reported; they apply to new logins, and sessions
/// logged in keep what they negotiated.
fn report_access_changes(t: &TargetConfig, o: &Target, report: &mut ChangeReport) {
    if o.allow != t.allow {
        report
            .changes
            .push(format!("target {} allow-list changed", t.iqn));
    }
    let chap_changed = match (&o.auth, &t.chap) {
        (Auth::Chap(a), Some(b)) => {
            a.user != b.user
                || !a.secret.ct_eq(&b.secret)
                || a.mutual.as_ref().map(|m| &m.0) != b.mutual.as_ref().map(|m| &m.0)
                || match (&a.mutual, &b.mutual) {
                    (Some(x), Some(y)) => !x.1.ct_eq(&y.1),
                    (None, None) => false,
                    _ => true,
                }
        }
        (Auth::None, None) => false,
        _ => true,
    };
    let hosts_changed = o.chap_hosts.len() != t.chap_hosts.len()
        || o.chap_hosts.iter().zip(&t.chap_hosts).any(|(a, b)| {
            a.names != b.names
                || a.policy.user != b.policy.user
                || !a.policy.secret.ct_eq(&b.policy.secret)
        });
    if chap_changed || hosts_changed {
        report.changes.push(format!(
            "target {} CHAP changed (new logins; sessions logged in stay)",
            t.iqn
        ));
    }
    if !same_seal(&o.seal, &t.seal) {
        report.changes.push(format!(
            "target {} Seal settings changed (new logins; sessions logged in keep their keys)",
            t.iqn
        ));
    }
}

/// Opens the new targets' backends (fallible, nothing visible yet); unchanged LUNs are kept.
fn open_targets(
    cfg: &Config,
    old: &[Arc<Target>],
    plans: &[LunPlan],
) -> Result<Vec<Target>, ChangeError> {
    let mut built = Vec::new();
    for (i, (t, plan)) in cfg.targets.iter().zip(plans).enumerate() {
        let o = old.iter().find(|x| x.iqn == t.iqn);
        let target = build_target(t, o.map(|o| (o.as_ref(), &plan.keep)), cfg.relative_port_id)
            .map_err(|e| {
                let j = t.luns.iter().position(|l| l.id == e.lun).unwrap_or(0);
                refused(format!("target[{i}].lun[{j}].backend"), e.why)
            })?;
        built.push(target);
    }
    Ok(built)
}

/// Grows files (I/O; a failure here stops before the swap, earlier grows stay: a larger file
/// is harmless and the LU reports its new size only once grown).
fn grow_files(plans: &[LunPlan]) -> Result<(), ChangeError> {
    for plan in plans {
        for (lu, want, field) in &plan.grow {
            lu.grow(*want)
                .map_err(|e| refused(field.clone(), format!("resize failed: {e}")))?;
        }
    }
    Ok(())
}

/// Logs what a change did and what waits for a restart.
fn log_report(report: &ChangeReport) {
    for c in &report.changes {
        tracing::info!(change = %c, "configuration changed");
    }
    if report.sessions_dropped > 0 {
        tracing::info!(
            sessions = report.sessions_dropped,
            "sessions ended by the change"
        );
    }
    for r in &report.restart_needed {
        tracing::warn!(setting = %r, "changed in the configuration; takes effect at restart");
    }
}
