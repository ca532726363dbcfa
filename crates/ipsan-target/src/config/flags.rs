//! The command line of `ipsan target` (and `ipsan gateway`) into the file form: LUN specs,
//! Ceph flags, CHAP flags.

use super::*;

/// Parses `--chap-host NAME,USER,SECRET_FILE` flags into `[[target.chap_host]]` entries; one
/// user given for several names becomes one entry listing them (its file must be the same).
pub fn chap_hosts_from_flags(flags: &[String]) -> Result<Vec<FileChapHost>, ConfigError> {
    let mut out: Vec<FileChapHost> = Vec::new();
    for v in flags {
        let mut it = v.splitn(3, ',');
        let (Some(name), Some(user), Some(file)) = (it.next(), it.next(), it.next()) else {
            return Err(err(
                "--chap-host",
                format!("{v:?}: expected INITIATOR-NAME,CHAP-USER,SECRET-FILE"),
            ));
        };
        if user.is_empty() || file.is_empty() {
            return Err(err(
                "--chap-host",
                format!("{v:?}: expected INITIATOR-NAME,CHAP-USER,SECRET-FILE"),
            ));
        }
        let file = PathBuf::from(file);
        if let Some(e) = out.iter_mut().find(|e| e.user == user) {
            if e.secret_file.as_ref() != Some(&file) {
                return Err(err(
                    "--chap-host",
                    format!("CHAP user {user:?} is given with two secret files"),
                ));
            }
            e.names.push(name.to_owned());
            continue;
        }
        out.push(FileChapHost {
            user: user.to_owned(),
            secret: None,
            secret_file: Some(file),
            names: vec![name.to_owned()],
            mutual_user: None,
            mutual_secret: None,
            mutual_secret_file: None,
            algorithms: None,
        });
    }
    Ok(out)
}

/// Builds the LUN list of the command line's single target from `--lun` specs (ids 0, 1, …).
pub fn luns_from_specs(specs: &[String]) -> Result<Vec<LunConfig>, ConfigError> {
    specs
        .iter()
        .enumerate()
        .map(|(i, s)| lun_from(&format!("--lun {s}"), &FileLun::new(i as u64, s.clone())))
        .collect()
}

/// Applies `--ceph-conf` / `--ceph-id` to every `rbd:` LUN that does not name its own.
pub fn apply_ceph_flags(luns: &mut [LunConfig], conf: Option<&Path>, id: Option<&str>) {
    for l in luns {
        if let ipsan_scsi::BackendKind::Rbd(r) = &mut l.backend.kind {
            if r.conf.is_none() {
                r.conf = conf.map(Path::to_path_buf);
            }
            if r.id.is_none() {
                r.id = id.map(str::to_owned);
            }
        }
    }
}

/// Builds a CHAP policy from command-line values.
pub fn chap_from_flags(
    user: &str,
    secret_file: &Path,
    mutual: Option<(&str, &Path)>,
) -> Result<ChapPolicy, ConfigError> {
    chap_policy(
        "--chap",
        &FileChap {
            user: user.to_owned(),
            secret: None,
            secret_file: Some(secret_file.to_owned()),
            mutual_user: mutual.map(|(u, _)| u.to_owned()),
            mutual_secret: None,
            mutual_secret_file: mutual.map(|(_, p)| p.to_owned()),
            algorithms: None,
        },
    )
}
