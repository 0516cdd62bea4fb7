//! Bounds on Hugging Face exports (`GET /api/v1/runs/{id}/export/hf`): what one client can make
//! the server write to disk and hold open.
//!
//! - One export per run at a time, shared: every download of a run that starts while another
//!   download of it is open streams the same directory, so N open downloads of a run hold one
//!   export's bytes on disk, never N. The directory is removed when the last download holding
//!   it ends (finished, cancelled or failed) and the export that wrote it is done.
//! - At most [`MAX_EXPORTS_PER_PRINCIPAL`] downloads per principal at once (from the request
//!   until its body has been sent); one more is refused ([`ExportError::Busy`], a 429).
//! - One export is written at a time, server-wide: it loads the whole model on the server's CPU
//!   and writes it out again.
//! - A new export is written only when the disk keeps [`FREE_MARGIN_BYTES`] free besides the
//!   export's expected size ([`ExportError::DiskShort`], a 507).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Downloads one principal (a user, the admin token, the local user, a run's token, or an
/// anonymous client address) may have open at once.
pub const MAX_EXPORTS_PER_PRINCIPAL: usize = 2;
/// Seconds a client refused for having too many exports open is asked to wait.
pub const EXPORT_RETRY_AFTER_S: u64 = 30;
/// Disk space an export must leave free, on top of its expected size (1 GiB).
pub const FREE_MARGIN_BYTES: u64 = 1 << 30;

/// Why an export was not given.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(
        "{open} Hugging Face exports are already being downloaded with this credential (at most \
         {limit} at once); retry once one has finished"
    )]
    Busy { open: usize, limit: usize },
    #[error(
        "not enough disk space for this export: it needs about {needed} bytes and the server \
         keeps {margin} bytes free, but {free} are free; retry once space has been freed"
    )]
    DiskShort { free: u64, needed: u64, margin: u64 },
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

/// What an export gave: the files of its directory, or why the model has no export.
#[derive(Debug, Clone)]
pub enum Made {
    Files(Vec<(String, PathBuf, u64)>),
    /// The model fits no `transformers` architecture: the reason.
    Refused(String),
}

/// One run's export directory, shared by the downloads that stream it; removed when the last
/// of them lets it go.
#[derive(Debug)]
pub struct Export {
    dir: PathBuf,
    made: tokio::sync::OnceCell<Made>,
}

impl Export {
    /// Where the export is (or will be) written.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.dir.display(), error = %e, "could not remove an export");
            }
        }
    }
}

/// A principal's place among its open exports; given back when dropped.
#[derive(Debug)]
pub struct Turn {
    open: Arc<Mutex<HashMap<String, usize>>>,
    principal: String,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.principal) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.principal);
            }
        }
    }
}

/// The server's exports: shared directories by run, open downloads by principal.
#[derive(Debug)]
pub struct Exports {
    by_run: Mutex<HashMap<PathBuf, Weak<Export>>>,
    open: Arc<Mutex<HashMap<String, usize>>>,
    limit: usize,
    margin: AtomicU64,
    /// One export written at a time.
    writing: Arc<tokio::sync::Semaphore>,
}

impl Default for Exports {
    fn default() -> Self {
        Exports::new(MAX_EXPORTS_PER_PRINCIPAL, FREE_MARGIN_BYTES)
    }
}

impl Exports {
    pub fn new(limit: usize, margin: u64) -> Self {
        Exports {
            by_run: Mutex::default(),
            open: Arc::default(),
            limit,
            margin: AtomicU64::new(margin),
            writing: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }

    /// The free space kept besides an export's expected size, in bytes.
    pub fn free_margin(&self) -> u64 {
        self.margin.load(Ordering::Relaxed)
    }

    /// Changes the free-space margin (an operator's tuning; tests make the disk look short).
    pub fn set_free_margin(&self, bytes: u64) {
        self.margin.store(bytes, Ordering::Relaxed);
    }

    /// Exports `principal` has open now.
    pub fn open_for(&self, principal: &str) -> usize {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.get(principal).copied().unwrap_or(0)
    }

    /// A place for one more open export of `principal`, or [`ExportError::Busy`].
    pub fn admit(&self, principal: &str) -> Result<Turn, ExportError> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(principal.to_string()).or_insert(0);
        if *n >= self.limit {
            return Err(ExportError::Busy {
                open: *n,
                limit: self.limit,
            });
        }
        *n += 1;
        Ok(Turn {
            open: self.open.clone(),
            principal: principal.to_string(),
        })
    }

    /// The export of the run in `run_dir` that downloads share: the one being downloaded now,
    /// or a new one written into `<run_dir>/<exports_dir>/hf-<random>`.
    pub fn shared(&self, run_dir: &Path, exports_dir: &str) -> Arc<Export> {
        self.shared_by(run_dir, &run_dir.join(exports_dir))
    }

    /// The export that downloads of what `key` names share (a run's directory, or one
    /// checkpoint's), written into `<exports>/hf-<random>` when it is new.
    pub fn shared_by(&self, key: &Path, exports: &Path) -> Arc<Export> {
        let mut by_run = self.by_run.lock().unwrap_or_else(|e| e.into_inner());
        by_run.retain(|_, weak| weak.strong_count() > 0);
        if let Some(export) = by_run.get(key).and_then(Weak::upgrade) {
            return export;
        }
        let export = Arc::new(Export {
            dir: exports.join(format!("hf-{}", uuid::Uuid::new_v4().simple())),
            made: tokio::sync::OnceCell::new(),
        });
        by_run.insert(key.to_path_buf(), Arc::downgrade(&export));
        export
    }

    /// What `export` holds, made once by `make` (on the blocking pool, one export at a time,
    /// after checking that the disk has room for `expected()` bytes plus the margin) and shared
    /// by every caller.
    /// The export is kept alive until `make` is done, even when every download is gone by then,
    /// so its directory is never removed while it is written.
    pub async fn made<E, M>(
        &self,
        export: &Arc<Export>,
        expected: E,
        make: M,
    ) -> Result<Made, ExportError>
    where
        E: FnOnce() -> anyhow::Result<u64> + Send + 'static,
        M: FnOnce(&Path) -> anyhow::Result<Made> + Send + 'static,
    {
        let margin = self.free_margin();
        let held = export.clone();
        let writing = self.writing.clone();
        let made = export
            .made
            .get_or_try_init(|| async move {
                let turn = writing
                    .acquire_owned()
                    .await
                    .map_err(|e| ExportError::Failed(e.into()))?;
                tokio::task::spawn_blocking(move || {
                    let needed = expected()?;
                    let parent = held.dir.parent().unwrap_or(&held.dir);
                    std::fs::create_dir_all(parent)
                        .map_err(|e| anyhow::Error::from(e).context("creating the exports dir"))?;
                    let free = free_bytes(parent)?;
                    if free < needed.saturating_add(margin) {
                        return Err(ExportError::DiskShort {
                            free,
                            needed,
                            margin,
                        });
                    }
                    let made = make(&held.dir)?;
                    drop((held, turn));
                    Ok(made)
                })
                .await
                .map_err(|e| ExportError::Failed(e.into()))?
            })
            .await?;
        Ok(made.clone())
    }
}

/// Bytes free for an unprivileged user on the file system holding `path`.
pub fn free_bytes(path: &Path) -> anyhow::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: statvfs is a plain C struct of integers, for which all zeroes is a valid value.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a NUL-terminated string and `stat` a valid, writable statvfs that
    // outlives the call.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    if rc != 0 {
        return Err(anyhow::Error::from(std::io::Error::last_os_error())
            .context(format!("statvfs {}", path.display())));
    }
    #[allow(clippy::unnecessary_cast)]
    Ok((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn write_export(dir: &Path, bytes: usize) -> anyhow::Result<Made> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("model.safetensors"), vec![1u8; bytes])?;
        Ok(Made::Files(crate::checkpoints::archive::files(dir)?))
    }

    fn bytes_under(dir: &Path) -> u64 {
        walk(dir)
            .iter()
            .map(|p| p.metadata().map_or(0, |m| m.len()))
            .sum()
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .flat_map(|e| {
                let p = e.path();
                if p.is_dir() {
                    walk(&p)
                } else {
                    vec![p]
                }
            })
            .collect()
    }

    #[tokio::test]
    async fn concurrent_downloads_of_a_run_share_one_export_removed_after_the_last() {
        let tmp = tempfile::tempdir().unwrap();
        let exports = Exports::new(100, 0);
        let made = Arc::new(AtomicUsize::new(0));
        let mut held = Vec::new();
        // Twenty downloads of different principals, none of them read.
        for i in 0..20 {
            let _turn = exports.admit(&format!("user-{i}")).unwrap();
            let export = exports.shared(tmp.path(), ".exports");
            let count = made.clone();
            let got = exports
                .made(
                    &export,
                    || Ok(1000),
                    move |dir| {
                        count.fetch_add(1, Ordering::SeqCst);
                        write_export(dir, 1000)
                    },
                )
                .await
                .unwrap();
            assert!(matches!(got, Made::Files(ref f) if f.len() == 1));
            held.push(export);
        }
        assert_eq!(made.load(Ordering::SeqCst), 1, "one export written");
        assert_eq!(bytes_under(&tmp.path().join(".exports")), 1000);
        held.clear();
        assert_eq!(bytes_under(&tmp.path().join(".exports")), 0);
        assert!(walk(&tmp.path().join(".exports")).is_empty());
    }

    #[test]
    fn a_principal_gets_a_limited_number_of_open_exports_back_as_they_end() {
        let exports = Exports::new(2, 0);
        let a = exports.admit("alice").unwrap();
        let _b = exports.admit("alice").unwrap();
        assert!(matches!(
            exports.admit("alice"),
            Err(ExportError::Busy { open: 2, limit: 2 })
        ));
        // Another principal is not held back by alice's.
        let _c = exports.admit("bob").unwrap();
        drop(a);
        assert_eq!(exports.open_for("alice"), 1);
        assert!(exports.admit("alice").is_ok());
    }

    #[tokio::test]
    async fn an_export_the_disk_has_no_room_for_is_refused_before_anything_is_written() {
        let tmp = tempfile::tempdir().unwrap();
        let exports = Exports::new(2, u64::MAX / 2);
        let export = exports.shared(tmp.path(), ".exports");
        let made = exports
            .made(&export, || Ok(1000), |dir| write_export(dir, 1000))
            .await;
        match made {
            Err(ExportError::DiskShort { needed, margin, .. }) => {
                assert_eq!((needed, margin), (1000, u64::MAX / 2));
            }
            other => panic!("expected DiskShort, got {other:?}"),
        }
        assert!(walk(&tmp.path().join(".exports")).is_empty());
        assert!(free_bytes(tmp.path()).unwrap() > 0);
    }
}
