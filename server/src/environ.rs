//! Secrets out of the process's own memory blocks. A process's environment and command line
//! stay readable as `/proc/<pid>/environ` and `/proc/<pid>/cmdline` by every process of the same
//! user for as long as it runs, whatever `std::env::remove_var` does (that only edits the C
//! library's copy of the list, not the block the kernel shows). So once the settings are read,
//! the values of the secret variables and options are overwritten in place in both blocks, and
//! the variables are removed, so no program the server starts inherits them.

use std::io::{Read, Seek, SeekFrom, Write};

/// Variables whose values are secrets.
pub const SECRET_VARS: &[&str] = &["TRAINYARD_ADMIN_TOKEN", "DATABASE_URL"];

/// Options whose values are secrets (`--admin-token X`, `--admin-token=X`).
pub const SECRET_OPTIONS: &[&str] = &["--admin-token", "--database-url"];

/// Overwrites every secret value in this process's argument and environment blocks with `*`
/// and removes the secret variables. Call it before any other thread starts (removing a
/// variable races with threads that read the environment).
pub fn erase_secrets() {
    let mut secrets: Vec<String> = SECRET_VARS
        .iter()
        .filter_map(|name| std::env::var(name).ok())
        .collect();
    let args: Vec<String> = std::env::args().collect();
    for (i, arg) in args.iter().enumerate() {
        for option in SECRET_OPTIONS {
            if arg == option {
                secrets.extend(args.get(i + 1).cloned());
            } else if let Some(value) = arg.strip_prefix(&format!("{option}=")) {
                secrets.push(value.to_string());
            }
        }
    }
    secrets.retain(|s| !s.is_empty());
    if let Err(e) = overwrite_in_blocks(&secrets) {
        // Nothing to do about it but say so: the server works the same.
        eprintln!("trainyard: could not erase secrets from /proc/self: {e}");
    }
    for name in SECRET_VARS {
        std::env::remove_var(name);
    }
}

/// `/proc/self/stat` fields 48-51: where the argument and environment blocks lie.
fn block_ranges() -> std::io::Result<[(u64, u64); 2]> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let after = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| std::io::Error::other("unexpected /proc/self/stat"))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `fields[0]` is field 3.
    let field = |n: usize| -> std::io::Result<u64> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no field {n} in /proc/self/stat")))
    };
    Ok([(field(48)?, field(49)?), (field(50)?, field(51)?)])
}

fn overwrite_in_blocks(secrets: &[String]) -> std::io::Result<()> {
    if secrets.is_empty() {
        return Ok(());
    }
    let mut mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")?;
    for (start, end) in block_ranges()? {
        let mut block = vec![0u8; end.saturating_sub(start) as usize];
        mem.seek(SeekFrom::Start(start))?;
        mem.read_exact(&mut block)?;
        let mut changed = false;
        for secret in secrets {
            let needle = secret.as_bytes();
            let mut from = 0;
            while let Some(at) = find(&block[from..], needle) {
                let at = from + at;
                block[at..at + needle.len()].fill(b'*');
                from = at + needle.len();
                changed = true;
            }
        }
        if changed {
            mem.seek(SeekFrom::Start(start))?;
            mem.write_all(&block)?;
        }
    }
    Ok(())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > haystack.len() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_found_wherever_it_occurs() {
        assert_eq!(find(b"A=1\0TOKEN=s3cret\0", b"s3cret"), Some(10));
        assert_eq!(find(b"abc", b"abcd"), None);
        assert_eq!(find(b"abc", b""), None);
    }

    #[test]
    fn the_blocks_of_this_process_are_found_and_hold_its_environment() {
        let [(arg_start, arg_end), (env_start, env_end)] = block_ranges().unwrap();
        assert!(arg_start < arg_end && env_start < env_end);
        let mut mem = std::fs::File::open("/proc/self/mem").unwrap();
        let mut block = vec![0u8; (env_end - env_start) as usize];
        mem.seek(SeekFrom::Start(env_start)).unwrap();
        mem.read_exact(&mut block).unwrap();
        let environ = std::fs::read("/proc/self/environ").unwrap();
        assert_eq!(block, environ);
    }
}
