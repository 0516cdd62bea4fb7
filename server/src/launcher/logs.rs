//! Run logs: the process writes `<run dir>/output.log` directly (so its output never depends on
//! the server being up); the server reads it by offset or tail and, while a run is supervised,
//! polls it for new bytes and fans them out to followers.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Mutex;
use tokio::sync::broadcast;

/// Longest slice one offset read returns.
pub const MAX_READ_BYTES: u64 = 1 << 20;

/// New log bytes (whole lines, except for the final flush) starting at `offset`.
#[derive(Debug, Clone, PartialEq)]
pub enum LogEvent {
    Chunk {
        offset: u64,
        text: String,
    },
    /// The run's process ended; no more output will come from this attempt.
    End,
}

/// A slice of a log file.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LogSlice {
    /// Byte offset of `text` in the file.
    pub offset: u64,
    /// Offset to pass back to continue reading.
    pub next_offset: u64,
    /// Current size of the file.
    pub size: u64,
    pub text: String,
}

/// Reads from `offset` to the end (at most `MAX_READ_BYTES`). A missing file reads as empty.
pub fn read_from(path: &Path, offset: u64) -> std::io::Result<LogSlice> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(LogSlice {
                offset: 0,
                next_offset: 0,
                size: 0,
                text: String::new(),
            })
        }
        Err(e) => return Err(e),
    };
    let size = file.metadata()?.len();
    let start = offset.min(size);
    file.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    file.take(MAX_READ_BYTES).read_to_end(&mut buf)?;
    Ok(LogSlice {
        offset: start,
        next_offset: start + buf.len() as u64,
        size,
        text: String::from_utf8_lossy(&buf).into_owned(),
    })
}

/// The last `lines` lines (scans back at most `MAX_READ_BYTES`).
pub fn read_tail(path: &Path, lines: usize) -> std::io::Result<LogSlice> {
    let size = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(e),
    };
    let window_start = size.saturating_sub(MAX_READ_BYTES);
    let slice = read_from(path, window_start)?;
    let text = slice.text.as_str();
    let body = text.strip_suffix('\n').unwrap_or(text);
    let mut cut = body.len();
    let mut seen = 0;
    if lines == 0 {
        cut = text.len();
    } else {
        for (i, b) in body.bytes().enumerate().rev() {
            if b == b'\n' {
                seen += 1;
                if seen == lines {
                    cut = i + 1;
                    break;
                }
            }
        }
        if seen < lines {
            cut = 0;
        }
    }
    Ok(LogSlice {
        offset: slice.offset + cut as u64,
        next_offset: slice.next_offset,
        size: slice.size,
        text: text[cut..].to_string(),
    })
}

/// Broadcast channels of supervised runs' logs, created on demand.
#[derive(Default)]
pub struct LogHub {
    channels: Mutex<HashMap<String, broadcast::Sender<LogEvent>>>,
}

impl LogHub {
    fn sender(&self, run_id: &str) -> broadcast::Sender<LogEvent> {
        let mut map = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(run_id.to_string())
            .or_insert_with(|| broadcast::channel(1024).0)
            .clone()
    }

    pub fn subscribe(&self, run_id: &str) -> broadcast::Receiver<LogEvent> {
        self.sender(run_id).subscribe()
    }

    pub fn publish(&self, run_id: &str, event: LogEvent) {
        // No receivers is fine: nobody is following.
        let _ = self.sender(run_id).send(event);
    }

    /// Forgets a run's channel once it has ended (receivers still get what was sent).
    pub fn close(&self, run_id: &str) {
        let mut map = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(run_id);
    }
}

/// Follows one log file: each `poll` publishes the bytes appended since the last one, up to the
/// last complete line (`flush` publishes a trailing partial line too).
pub struct Tailer {
    offset: u64,
}

impl Tailer {
    /// Starts at the current end: earlier content is served by `read_from`.
    pub fn at_end(path: &Path) -> Tailer {
        Tailer {
            offset: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        }
    }

    pub fn poll(&mut self, path: &Path, whole_lines_only: bool) -> Option<LogEvent> {
        let size = std::fs::metadata(path).ok()?.len();
        if size <= self.offset {
            return None;
        }
        let slice = read_from(path, self.offset).ok()?;
        let text = if whole_lines_only {
            let end = slice.text.rfind('\n')? + 1;
            slice.text[..end].to_string()
        } else {
            slice.text
        };
        if text.is_empty() {
            return None;
        }
        let offset = self.offset;
        self.offset += text.len() as u64;
        Some(LogEvent::Chunk { offset, text })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn tail_returns_the_last_lines_and_their_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, "one\ntwo\nthree\nfour\n").unwrap();
        let tail = read_tail(&path, 2).unwrap();
        assert_eq!(tail.text, "three\nfour\n");
        assert_eq!(tail.offset, 8);
        assert_eq!(
            read_tail(&path, 10).unwrap().text,
            "one\ntwo\nthree\nfour\n"
        );
        let from = read_from(&path, 4).unwrap();
        assert_eq!(from.text, "two\nthree\nfour\n");
        assert_eq!(from.next_offset, 19);
    }

    #[test]
    fn a_missing_log_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_tail(&dir.path().join("none"), 5).unwrap().text, "");
    }

    #[test]
    fn the_tailer_publishes_whole_lines_and_keeps_partial_ones_for_later() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, "old\n").unwrap();
        let mut t = Tailer::at_end(&path);
        assert_eq!(t.poll(&path, true), None);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        write!(f, "a\nb").unwrap();
        assert_eq!(
            t.poll(&path, true),
            Some(LogEvent::Chunk {
                offset: 4,
                text: "a\n".into()
            })
        );
        assert_eq!(t.poll(&path, true), None);
        assert_eq!(
            t.poll(&path, false),
            Some(LogEvent::Chunk {
                offset: 6,
                text: "b".into()
            })
        );
    }
}
