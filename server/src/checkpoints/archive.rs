//! A checkpoint directory as one uncompressed tar file (POSIX ustar), streamed: the weights are
//! already dense floats, so compressing would cost CPU for little. The length is known before
//! the first byte (512-byte header per file, contents padded to 512, two zero blocks at the
//! end), so downloads show their progress.

use std::io::Read;
use std::path::{Path, PathBuf};

use bytes::Bytes;

const BLOCK: u64 = 512;

/// The plain files of `dir` (no subdirectories, no hidden or temporary files), by name.
pub fn files(dir: &Path) -> std::io::Result<Vec<(String, PathBuf, u64)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if meta.is_file() && !name.starts_with('.') && name.len() < 100 {
            out.push((name, entry.path(), meta.len()));
        }
    }
    out.sort();
    Ok(out)
}

fn padded(len: u64) -> u64 {
    len.div_ceil(BLOCK) * BLOCK
}

/// Bytes of the archive of `files` under the folder `root`.
pub fn archive_len(files: &[(String, PathBuf, u64)]) -> u64 {
    files
        .iter()
        .map(|(_, _, len)| BLOCK + padded(*len))
        .sum::<u64>()
        + 2 * BLOCK
}

/// The ustar header of a regular file `path` (< 100 bytes) of `len` bytes.
fn header(path: &str, len: u64, mtime: u64) -> [u8; 512] {
    let mut h = [0u8; 512];
    let put =
        |h: &mut [u8; 512], at: usize, bytes: &[u8]| h[at..at + bytes.len()].copy_from_slice(bytes);
    put(&mut h, 0, path.as_bytes());
    put(&mut h, 100, b"0000644\0");
    put(&mut h, 108, b"0000000\0");
    put(&mut h, 116, b"0000000\0");
    put(&mut h, 124, format!("{len:011o}\0").as_bytes());
    put(&mut h, 136, format!("{mtime:011o}\0").as_bytes());
    h[156] = b'0';
    put(&mut h, 257, b"ustar\0");
    put(&mut h, 263, b"00");
    // The checksum is computed with its own field read as spaces.
    put(&mut h, 148, b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    put(&mut h, 148, format!("{sum:06o}\0 ").as_bytes());
    h
}

/// Streams the archive of `files` (each stored as `root/name`) into `send`, in chunks; stops
/// early when the receiver is gone (the download was cancelled).
pub fn write(
    root: &str,
    files: &[(String, PathBuf, u64)],
    send: &tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
) -> std::io::Result<()> {
    let mtime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let push = |bytes: Vec<u8>| -> std::io::Result<()> {
        send.blocking_send(Ok(Bytes::from(bytes)))
            .map_err(|_| std::io::Error::other("the download was cancelled"))
    };
    for (name, path, len) in files {
        push(header(&format!("{root}/{name}"), *len, mtime).to_vec())?;
        // Exactly `len` bytes, even if the file changed since it was listed.
        let mut file = std::fs::File::open(path)?.take(*len);
        let mut left = *len;
        let mut buf = vec![0u8; 1 << 20];
        while left > 0 {
            let n = file.read(&mut buf)?;
            if n == 0 {
                return Err(std::io::Error::other(format!(
                    "{name} got shorter while it was read"
                )));
            }
            push(buf[..n].to_vec())?;
            left -= n as u64;
        }
        let pad = padded(*len) - *len;
        if pad > 0 {
            push(vec![0u8; pad as usize])?;
        }
    }
    push(vec![0u8; 2 * BLOCK as usize])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_has_the_announced_length_and_each_file_at_its_offset() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("a.json"), b"{\"step\":3}").unwrap();
        std::fs::write(tmp.path().join("b.bin"), vec![7u8; 1000]).unwrap();
        std::fs::write(tmp.path().join(".hidden"), b"x").unwrap();
        let list = files(tmp.path()).unwrap();
        assert_eq!(list.len(), 2);
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        write("step-3", &list, &tx).unwrap();
        drop(tx);
        let mut out = Vec::new();
        while let Some(chunk) = rx.blocking_recv() {
            out.extend_from_slice(&chunk.unwrap());
        }
        assert_eq!(out.len() as u64, archive_len(&list));
        assert_eq!(&out[0..13], b"step-3/a.json");
        assert_eq!(&out[257..262], b"ustar");
        assert_eq!(&out[512..522], b"{\"step\":3}");
        // The header checksum is what tar verifies: the sum with the field as spaces.
        let mut h = out[..512].to_vec();
        let stored = u32::from_str_radix(std::str::from_utf8(&h[148..154]).unwrap(), 8).unwrap();
        h[148..156].copy_from_slice(b"        ");
        assert_eq!(stored, h.iter().map(|&b| u32::from(b)).sum::<u32>());
        assert_eq!(&out[1024..1024 + 6], b"step-3");
        assert!(out[1536..2536].iter().all(|&b| b == 7));
    }
}
