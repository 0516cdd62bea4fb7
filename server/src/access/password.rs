//! Password hashing with argon2id (the RustCrypto `argon2` crate), stored as PHC strings
//! (`$argon2id$v=19$m=...,t=...,p=...$salt$hash`), so the parameters travel with each hash and
//! can be raised later without breaking old ones. The parameters are the crate's defaults,
//! which follow the OWASP recommendation for argon2id (19 MiB of memory, 2 passes, 1 lane).
//! Hashing costs tens of milliseconds on purpose: callers on the async runtime run it with
//! `spawn_blocking`.

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;

/// Shortest password accepted.
pub const MIN_LENGTH: usize = 8;
/// Longest password accepted (argon2 takes any length; this bounds the work per attempt).
pub const MAX_LENGTH: usize = 1024;

/// Why a password is refused, in words for the `password` field.
pub fn check_strength(password: &str) -> Result<(), String> {
    let chars = password.chars().count();
    if chars < MIN_LENGTH {
        return Err(format!(
            "password must be at least {MIN_LENGTH} characters long"
        ));
    }
    if password.len() > MAX_LENGTH {
        return Err(format!("password must be at most {MAX_LENGTH} bytes long"));
    }
    Ok(())
}

/// The PHC string of a new salted argon2id hash.
pub fn hash_password(password: &str) -> Result<String, argon2::password_hash::Error> {
    let salt = SaltString::generate(&mut OsRng);
    Ok(Argon2::default()
        .hash_password(password.as_bytes(), &salt)?
        .to_string())
}

/// Whether `password` matches the stored PHC string (false for a malformed one).
pub fn verify_password(password: &str, phc: &str) -> bool {
    if password.len() > MAX_LENGTH {
        return false;
    }
    PasswordHash::new(phc)
        .map(|hash| {
            Argon2::default()
                .verify_password(password.as_bytes(), &hash)
                .is_ok()
        })
        .unwrap_or(false)
}

/// Spends the time a verification takes, for a sign-in whose user does not exist, so the
/// answer's timing does not tell which names are taken.
pub fn burn_time(password: &str) {
    let _ = hash_password(password.get(..MAX_LENGTH.min(password.len())).unwrap_or(""));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_verifies_its_password_and_no_other() {
        let phc = hash_password("correct horse").expect("hash");
        assert!(phc.starts_with("$argon2id$"), "{phc}");
        assert!(!phc.contains("correct horse"));
        assert!(verify_password("correct horse", &phc));
        assert!(!verify_password("correct horsf", &phc));
        assert!(!verify_password("correct horse", "not a hash"));
    }

    #[test]
    fn two_hashes_of_one_password_differ_by_their_salt() {
        let a = hash_password("same password").expect("hash");
        let b = hash_password("same password").expect("hash");
        assert_ne!(a, b);
    }

    #[test]
    fn short_and_huge_passwords_are_refused_in_words() {
        assert_eq!(
            check_strength("short").unwrap_err(),
            "password must be at least 8 characters long"
        );
        assert!(check_strength(&"x".repeat(2000)).is_err());
        assert!(check_strength("long enough").is_ok());
    }
}
