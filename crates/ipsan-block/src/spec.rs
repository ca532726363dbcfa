//! The backend spec grammar — `mem:256MiB`, `file:/path,size=10GiB[,direct]`, `null:1TiB`,
//! `disk:4GiB[,seek=8.5ms][,rpm=7200][,rate=30MB][,file=PATH]`, `rbd:pool/image[,conf=…]`,
//! each with an optional `,bs=512|4096` — and [`open`], which opens the store a spec names.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use crate::backend::{Backend, BackendError};
use crate::file::FileBackend;
use crate::mem::MemBackend;
use crate::null::NullBackend;
use crate::rbd::{RbdBackend, RbdSpec};

/// What kind of store a spec names.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum BackendKind {
    /// Sparse RAM store.
    Mem,
    /// Regular file (created sparse if missing) or block device.
    File {
        /// Path of the file or device.
        path: PathBuf,
        /// Open with O_DIRECT (bypass the page cache).
        direct: bool,
    },
    /// Discards writes, reads zeros.
    Null,
    /// A Ceph RBD image (`rbd:pool/image`), through librbd loaded at run time.
    Rbd(RbdSpec),
    /// A RAM store (or `file=`) whose requests take a single disk's time
    /// ([`crate::disk::DiskModel`]: one head, seek + half a revolution + transfer).
    Disk {
        /// `file=`: keep the bytes in this file instead of RAM.
        file: Option<PathBuf>,
        /// `seek=`: mean seek time.
        seek: std::time::Duration,
        /// `rpm=`: spindle speed.
        rpm: u32,
        /// `rate=`: media rate, bytes per second.
        rate: u64,
    },
}

/// A parsed backend spec: `mem:256MiB`, `file:/path/disk.img,size=10GiB[,direct][,bs=4096]`,
/// `null:1TiB[,bs=4096]`, `disk:20GiB[,seek=8.5ms][,rpm=7200][,rate=30MB][,file=PATH]`,
/// `rbd:pool/image[,conf=/etc/ceph/ceph.conf][,id=admin]
/// [,keyring=PATH][,<librados option>=<value>...][,bs=4096]`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct BackendSpec {
    /// The store.
    pub kind: BackendKind,
    /// Size in bytes; required for `mem` and `null`, and for `file` when the file is new.
    pub size: Option<u64>,
    /// Suggested logical block size (`bs=`), 512 or 4096.
    pub block_size: Option<u32>,
}

/// A backend spec's size (`256MiB`, `10GiB`): the grammar every ipsan size uses.
pub fn parse_size(s: &str) -> Result<u64, String> {
    ipsan_units::parse_size(s).map_err(|e| e.to_string())
}

impl FromStr for BackendSpec {
    type Err = BackendError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| BackendError::Spec {
            spec: spec.to_string(),
            reason,
        };
        let (kind, rest) = spec.split_once(':').ok_or_else(|| {
            err(
                "expected <kind>:<args>, e.g. mem:256MiB, file:/path,size=10GiB or null:1TiB"
                    .into(),
            )
        })?;
        let mut parts = rest.split(',');
        let first = parts.next().unwrap_or("");
        let mut size = None;
        let mut block_size = None;
        let mut direct = false;
        let mut kind = match kind {
            "mem" | "null" => {
                size = Some(parse_size(first).map_err(|e| err(format!("size: {e}")))?);
                if kind == "mem" {
                    BackendKind::Mem
                } else {
                    BackendKind::Null
                }
            }
            "disk" => {
                size = Some(parse_size(first).map_err(|e| err(format!("size: {e}")))?);
                let d = crate::disk::DiskModel::default_for(0);
                BackendKind::Disk {
                    file: None,
                    seek: d.seek,
                    rpm: d.rpm,
                    rate: d.rate,
                }
            }
            "rbd" => BackendKind::Rbd(RbdSpec::parse_path(first).map_err(err)?),
            "file" => {
                if first.is_empty() {
                    return Err(err(
                        "file: expected a path, e.g. file:/var/lib/disk.img".into()
                    ));
                }
                BackendKind::File {
                    path: PathBuf::from(first),
                    direct: false,
                }
            }
            other => {
                return Err(err(format!(
                    "unknown backend kind {other:?} (expected mem, file, null, disk or rbd)"
                )))
            }
        };
        for opt in parts {
            let (k, v) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            match (k, v) {
                ("size", Some(v)) if !matches!(kind, BackendKind::Rbd(_)) => {
                    size = Some(parse_size(v).map_err(|e| err(format!("size: {e}")))?)
                }
                ("bs", Some(v)) => {
                    let bs: u32 = v
                        .parse()
                        .map_err(|_| err(format!("bs: {v:?} is not a number (512 or 4096)")))?;
                    if bs != 512 && bs != 4096 {
                        return Err(err(format!("bs: {bs} unsupported (512 or 4096)")));
                    }
                    block_size = Some(bs);
                }
                ("direct", None) if matches!(kind, BackendKind::File { .. }) => direct = true,
                (k @ ("seek" | "rpm" | "rate" | "file"), Some(v))
                    if matches!(kind, BackendKind::Disk { .. }) =>
                {
                    if let BackendKind::Disk {
                        file,
                        seek,
                        rpm,
                        rate,
                    } = &mut kind
                    {
                        match k {
                            "seek" => {
                                *seek = ipsan_units::parse_duration(v)
                                    .map_err(|e| err(format!("seek: {e}")))?;
                                if *seek > std::time::Duration::from_secs(1) {
                                    return Err(err(format!("seek: {v} is above 1s")));
                                }
                            }
                            "rpm" => {
                                *rpm = v.parse().ok().filter(|r| (60..=100_000).contains(r)).ok_or_else(
                                    || err(format!("rpm: {v:?} is not 60..=100000")),
                                )?
                            }
                            "rate" => {
                                *rate = parse_size(v)
                                    .ok()
                                    .filter(|r| *r >= 1000)
                                    .ok_or_else(|| {
                                        err(format!(
                                            "rate: {v:?} is not a rate in bytes per second of at least 1KB (e.g. 30MB)"
                                        ))
                                    })?
                            }
                            _ => {
                                if v.is_empty() {
                                    return Err(err("file: expected a path".into()));
                                }
                                *file = Some(PathBuf::from(v))
                            }
                        }
                    }
                }
                ("size", _) if matches!(kind, BackendKind::Rbd(_)) => {
                    return Err(err(
                        "rbd: the LUN's size is the image's (grow it with `rbd resize`)".into(),
                    ))
                }
                (k, Some(v)) if matches!(kind, BackendKind::Rbd(_)) => {
                    if let BackendKind::Rbd(r) = &mut kind {
                        match k {
                            "conf" => r.conf = Some(PathBuf::from(v)),
                            "id" => r.id = Some(v.to_owned()),
                            "keyring" => r.keyring = Some(PathBuf::from(v)),
                            _ => r.options.push((k.to_owned(), v.to_owned())),
                        }
                    }
                }
                _ => return Err(err(format!("unknown option {opt:?}"))),
            }
        }
        let kind = match kind {
            BackendKind::File { path, .. } => BackendKind::File { path, direct },
            k => k,
        };
        if size == Some(0) {
            return Err(err("size: must be greater than zero".into()));
        }
        if let Some(sz) = size {
            if sz % 512 != 0 {
                return Err(err(format!("size: {sz} is not a multiple of 512 bytes")));
            }
        }
        Ok(BackendSpec {
            kind,
            size,
            block_size,
        })
    }
}

/// Opens (creating a sparse file if needed) the store a spec names.
pub fn open(spec: &BackendSpec) -> Result<Arc<dyn Backend>, BackendError> {
    let need_size = |what: &str| BackendError::Spec {
        spec: format!("{what}:"),
        reason: "size: required, e.g. 256MiB".into(),
    };
    match &spec.kind {
        BackendKind::Mem => Ok(Arc::new(MemBackend::new(
            spec.size.ok_or_else(|| need_size("mem"))?,
        ))),
        BackendKind::Null => Ok(Arc::new(NullBackend::new(
            spec.size.ok_or_else(|| need_size("null"))?,
        ))),
        BackendKind::File { path, direct } => Ok(Arc::new(FileBackend::open(
            path.clone(),
            spec.size,
            *direct,
        )?)),
        BackendKind::Rbd(r) => Ok(Arc::new(RbdBackend::open(r)?)),
        BackendKind::Disk {
            file,
            seek,
            rpm,
            rate,
        } => {
            let model = crate::disk::DiskModel {
                seek: *seek,
                rpm: *rpm,
                rate: *rate,
                size: spec.size.ok_or_else(|| need_size("disk"))?,
            };
            Ok(match file {
                None => Arc::new(crate::disk::DiskBackend::new(model)),
                Some(p) => Arc::new(crate::disk::DiskBackend::open_file(p.clone(), model)?),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mem_null_and_file_specs() {
        let m: BackendSpec = "mem:256MiB".parse().unwrap();
        assert_eq!(m.kind, BackendKind::Mem);
        assert_eq!(m.size, Some(256 << 20));
        let n: BackendSpec = "null:1TiB,bs=4096".parse().unwrap();
        assert_eq!(n.kind, BackendKind::Null);
        assert_eq!((n.size, n.block_size), (Some(1 << 40), Some(4096)));
        let f: BackendSpec = "file:/tmp/x.img,size=10GiB,direct,bs=512".parse().unwrap();
        assert_eq!(
            f.kind,
            BackendKind::File {
                path: "/tmp/x.img".into(),
                direct: true
            }
        );
        assert_eq!((f.size, f.block_size), (Some(10 << 30), Some(512)));
    }

    /// `disk:` defaults to the 2001 IDE drive (8.5 ms, 7200 rpm, 30 MB/s) and opens as a
    /// store of that model that keeps what is written.
    #[test]
    fn parses_disk_specs_with_the_model_and_opens_them() {
        let d: BackendSpec = "disk:4GiB".parse().unwrap();
        assert_eq!(
            d.kind,
            BackendKind::Disk {
                file: None,
                seek: std::time::Duration::from_micros(8500),
                rpm: 7200,
                rate: 30_000_000
            }
        );
        assert_eq!(d.size, Some(4 << 30));
        let d: BackendSpec = "disk:1GiB,seek=4ms,rpm=15000,rate=100MB,file=/tmp/d.img,bs=4096"
            .parse()
            .unwrap();
        assert_eq!(
            d.kind,
            BackendKind::Disk {
                file: Some("/tmp/d.img".into()),
                seek: std::time::Duration::from_millis(4),
                rpm: 15000,
                rate: 100_000_000
            }
        );
        assert_eq!(d.block_size, Some(4096));
        let b = open(&"disk:64MiB,seek=1ms".parse().unwrap()).unwrap();
        assert_eq!((b.kind(), b.size()), ("disk", 64 << 20));
        b.write_at(&[5u8; 512], 4096).unwrap();
        let mut got = [0u8; 512];
        b.read_at(&mut got, 4096).unwrap();
        assert_eq!(got, [5u8; 512]);
    }

    #[test]
    fn parses_rbd_specs_with_ceph_settings_and_librados_options() {
        let r: BackendSpec =
            "rbd:rbd/disk0,conf=/etc/ceph/x.conf,id=gw,keyring=/k,rbd_cache=false,bs=4096"
                .parse()
                .unwrap();
        let BackendKind::Rbd(r0) = &r.kind else {
            panic!("{r:?}")
        };
        assert_eq!((r0.pool.as_str(), r0.image.as_str()), ("rbd", "disk0"));
        assert_eq!(
            r0.conf.as_deref(),
            Some(std::path::Path::new("/etc/ceph/x.conf"))
        );
        assert_eq!(r0.id.as_deref(), Some("gw"));
        assert_eq!(
            r0.options,
            vec![("rbd_cache".to_owned(), "false".to_owned())]
        );
        assert_eq!((r.size, r.block_size), (None, Some(4096)));
        let e = |s: &str| s.parse::<BackendSpec>().unwrap_err().to_string();
        assert!(e("rbd:disk0").contains("rbd:<pool>/<image>"));
        assert!(e("rbd:rbd/d,size=1GiB").contains("the image's"));
    }

    #[test]
    fn rbd_open_names_the_unreadable_ceph_conf() {
        let spec: BackendSpec = "rbd:rbd/disk0,conf=/nonexistent/ceph.conf".parse().unwrap();
        let e = open(&spec).unwrap_err().to_string();
        // Either librbd is missing here (said so) or the configuration is unreadable (named).
        assert!(
            e.contains("RBD is unavailable") || e.contains("/nonexistent/ceph.conf"),
            "{e}"
        );
    }

    #[test]
    fn rejects_bad_specs_with_clear_errors() {
        let e = |s: &str| s.parse::<BackendSpec>().unwrap_err().to_string();
        assert!(e("mem:lots").contains("size:"), "{}", e("mem:lots"));
        assert!(e("mem:12XB").contains("unknown size unit"));
        assert!(e("tape:1GiB").contains("unknown backend kind"));
        assert!(e("disk:1GiB,rpm=0").contains("rpm:"));
        assert!(e("disk:1GiB,rate=0").contains("rate:"));
        assert!(e("disk:1GiB,seek=8").contains("seek:"));
        assert!(e("disk:1GiB,seek=2s").contains("above 1s"));
        assert!(e("disk:1GiB,direct").contains("unknown option"));
        assert!(e("mem:1GiB,rpm=7200").contains("unknown option"));
        assert!(e("mem256").contains("expected <kind>:<args>"));
        assert!(e("file:").contains("expected a path"));
        assert!(e("mem:1GiB,bs=1024").contains("bs: 1024 unsupported"));
        assert!(e("mem:1GiB,direct").contains("unknown option"));
        assert!(e("mem:0").contains("greater than zero"));
        assert!(e("mem:1000").contains("multiple of 512"));
        assert!(e("null:99999999999999TiB").contains("too large"));
    }

    #[test]
    fn file_spec_without_size_needs_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("missing.img");
        let spec: BackendSpec = format!("file:{}", p.display()).parse().unwrap();
        let err = open(&spec).unwrap_err().to_string();
        assert!(err.contains("size: required"), "{err}");
    }

    #[test]
    fn spec_sizes_use_the_shared_grammar() {
        let m: BackendSpec = "mem:1.5MiB".parse().unwrap();
        assert_eq!(m, "mem:1536KiB".parse().unwrap());
        assert!("mem:lots".parse::<BackendSpec>().is_err());
        assert!("mem:-5".parse::<BackendSpec>().is_err());
    }
}
