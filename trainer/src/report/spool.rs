//! The on-disk queue of metric batches the server has not acknowledged yet.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::wire::MetricBatch;

/// Batches waiting on disk, named by a zero-padded sequence number so name order is send order.
pub(super) struct Spool {
    pub(super) dir: PathBuf,
    next: u64,
    /// Spooled files, oldest first.
    files: Vec<PathBuf>,
}

impl Spool {
    /// Opens the spool, picking up files a previous process left behind.
    pub(super) fn open(dir: PathBuf) -> Result<Self> {
        let mut files: Vec<(u64, PathBuf)> = Vec::new();
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            let seq = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json"))
                .and_then(|n| n.parse::<u64>().ok());
            if let Some(seq) = seq {
                files.push((seq, path));
            }
        }
        files.sort();
        let next = files.last().map(|(s, _)| s + 1).unwrap_or(0);
        Ok(Spool {
            dir,
            next,
            files: files.into_iter().map(|(_, p)| p).collect(),
        })
    }

    pub(super) fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    pub(super) fn push(&mut self, batch: &MetricBatch) -> Result<()> {
        let path = self.dir.join(format!("{:012}.json", self.next));
        let tmp = self.dir.join(format!(".{:012}.tmp", self.next));
        let mut f = File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(batch)?)?;
        f.sync_all()?;
        fs::rename(&tmp, &path)?;
        self.next += 1;
        self.files.push(path);
        Ok(())
    }

    pub(super) fn oldest(&mut self) -> Option<(PathBuf, MetricBatch)> {
        while let Some(path) = self.files.first().cloned() {
            match fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<MetricBatch>(&b).ok())
            {
                Some(batch) => return Some((path, batch)),
                None => {
                    tracing::error!(file = %path.display(), "unreadable spool file; moved aside");
                    self.reject(&path);
                }
            }
        }
        None
    }

    pub(super) fn remove(&mut self, path: &Path) {
        if let Err(e) = fs::remove_file(path) {
            tracing::warn!(error = %e, file = %path.display(), "could not delete a sent spool file");
        }
        self.files.retain(|p| p != path);
    }

    pub(super) fn reject(&mut self, path: &Path) {
        let rejected = self.dir.join("rejected");
        let moved = fs::create_dir_all(&rejected)
            .and_then(|_| fs::rename(path, rejected.join(path.file_name().unwrap_or_default())));
        if let Err(e) = moved {
            tracing::warn!(error = %e, file = %path.display(), "could not move a refused spool file");
        }
        self.files.retain(|p| p != path);
    }
}
