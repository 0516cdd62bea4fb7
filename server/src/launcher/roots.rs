//! Data roots: the folders whose files launched runs may read (`serve --data-root DIR`,
//! repeatable; by default `<data dir>/datasets`). Every path of a launch config must resolve,
//! symlinks followed, inside one of them (or name a checkpoint of a run its launcher may read);
//! `actions::paths` checks that at admission and the confinement (`launcher::confine`) enforces
//! it while the run executes.
//!
//! A root must never hold what runs must not read: the data directory (the SQLite database,
//! every run's files and the tokens), the database file, or the kernel's `/proc`, `/sys` and
//! `/dev`. A root inside the data directory is fine (the default is one); one that contains it
//! is refused at start-up, since a Landlock rule cannot carve a hole in a tree it allows.

use std::path::{Path, PathBuf};

/// The default root's folder under the data directory.
pub const DEFAULT_ROOT: &str = "datasets";

/// Trees no root may be or lie in.
const KERNEL_TREES: &[&str] = &["/proc", "/sys", "/dev"];

/// The server's data roots, as canonical paths (symlinks resolved), checked at start-up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataRoots {
    roots: Vec<PathBuf>,
}

impl DataRoots {
    /// Checks the configured roots (empty: the default, created when missing) against the data
    /// directory and the database file. `data_dir` must exist.
    pub fn resolve(
        configured: &[PathBuf],
        data_dir: &Path,
        database_file: Option<&Path>,
    ) -> anyhow::Result<DataRoots> {
        let data_dir = canonical_or_self(data_dir);
        let database_file = database_file.map(canonical_or_self);
        let default = data_dir.join(DEFAULT_ROOT);
        let wanted: Vec<PathBuf> = if configured.is_empty() {
            std::fs::create_dir_all(&default).map_err(|e| {
                anyhow::anyhow!("creating the data root {}: {e}", default.display())
            })?;
            vec![default]
        } else {
            configured.to_vec()
        };
        let mut roots = Vec::new();
        for root in &wanted {
            let shown = root.display();
            let canonical = std::fs::canonicalize(root).map_err(|e| {
                anyhow::anyhow!(
                    "--data-root {shown} cannot be used: {e} (it must be an existing folder)"
                )
            })?;
            if !canonical.is_dir() {
                anyhow::bail!("--data-root {shown} is not a folder");
            }
            let resolved = canonical.display();
            if data_dir.starts_with(&canonical) {
                anyhow::bail!(
                    "--data-root {shown} (resolved: {resolved}) contains the data directory {}, \
                     which holds the database and every run's files; name a folder beside it or \
                     inside {}",
                    data_dir.display(),
                    data_dir.join(DEFAULT_ROOT).display()
                );
            }
            if let Some(db) = &database_file {
                if db.starts_with(&canonical) {
                    anyhow::bail!(
                        "--data-root {shown} (resolved: {resolved}) contains the database file {}",
                        db.display()
                    );
                }
            }
            if KERNEL_TREES.iter().any(|t| canonical.starts_with(t)) {
                anyhow::bail!("--data-root {shown} lies in the kernel's {resolved}");
            }
            if !roots.contains(&canonical) {
                roots.push(canonical);
            }
        }
        Ok(DataRoots { roots })
    }

    /// Roots taken as they are, already canonical (tests, and a launcher built without a
    /// server).
    pub fn from_canonical(roots: Vec<PathBuf>) -> DataRoots {
        DataRoots { roots }
    }

    pub fn paths(&self) -> &[PathBuf] {
        &self.roots
    }

    /// Whether a canonical path lies inside a root.
    pub fn contain(&self, canonical: &Path) -> bool {
        self.roots.iter().any(|root| canonical.starts_with(root))
    }

    /// `/data/a, /data/b` for messages.
    pub fn describe(&self) -> String {
        if self.roots.is_empty() {
            return "none".to_string();
        }
        self.roots
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The canonical form of a path, or the path itself when it cannot be resolved (it does not
/// exist yet).
fn canonical_or_self(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_root_is_created_inside_the_data_directory() {
        let data = tempfile::tempdir().unwrap();
        let roots = DataRoots::resolve(&[], data.path(), None).unwrap();
        let want = std::fs::canonicalize(data.path())
            .unwrap()
            .join(DEFAULT_ROOT);
        assert_eq!(roots.paths(), std::slice::from_ref(&want));
        assert!(want.is_dir());
        assert!(roots.contain(&want.join("corpus.txt")));
        assert!(!roots.contain(&want.with_file_name("trainyard.db")));
    }

    #[test]
    fn a_root_that_holds_the_data_directory_the_database_or_the_kernels_trees_is_refused() {
        let outer = tempfile::tempdir().unwrap();
        let data = outer.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let elsewhere = outer.path().join("db");
        std::fs::create_dir_all(&elsewhere).unwrap();
        let db = elsewhere.join("ty.db");
        let cases: [(PathBuf, &str); 4] = [
            (outer.path().to_path_buf(), "contains the data directory"),
            (elsewhere.clone(), "contains the database file"),
            (PathBuf::from("/proc/self"), "kernel"),
            (outer.path().join("missing"), "must be an existing folder"),
        ];
        for (root, needle) in cases {
            let e = DataRoots::resolve(std::slice::from_ref(&root), &data, Some(&db))
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{}: {e}", root.display());
        }
        // A symlink to the data directory's parent is the parent.
        let link = tempfile::tempdir().unwrap();
        let sneaky = link.path().join("up");
        std::os::unix::fs::symlink(outer.path(), &sneaky).unwrap();
        let e = DataRoots::resolve(&[sneaky], &data, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("contains the data directory"), "{e}");
        // A folder beside the data directory is a root.
        let beside = outer.path().join("corpora");
        std::fs::create_dir_all(&beside).unwrap();
        let roots = DataRoots::resolve(std::slice::from_ref(&beside), &data, Some(&db)).unwrap();
        assert!(roots.contain(&std::fs::canonicalize(&beside).unwrap().join("a.txt")));
    }
}
