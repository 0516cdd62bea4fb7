//! Secrets the server hands out (session ids, CSRF tokens, API and run tokens) and the hash the
//! store keeps instead of them. The secrets carry 256 random bits, so a fast hash is the right
//! one here: nobody can guess a secret from its hash by trying, unlike a password, which is why
//! passwords alone go through argon2 (`password.rs`).

use rand::RngCore;

/// Prefix of every secret, so one found in a file or a paste is recognisable as ours.
pub const PREFIX: &str = "ty_";

/// A new secret: `ty_` and 32 random bytes, as hex. `rand::rng()` is a CSPRNG (ChaCha12)
/// seeded and reseeded from the operating system.
pub fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{PREFIX}{}", hex(&bytes))
}

/// A new public id (of a token): 16 random bytes as hex.
pub fn new_id() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    hex(&bytes)
}

/// What the store keeps of a secret.
pub fn hash_secret(secret: &str) -> String {
    blake3::hash(secret.as_bytes()).to_hex().to_string()
}

/// The CSRF token of the session whose cookie holds `session_secret`: derived from it (BLAKE3
/// in key-derivation mode), so the server can put it in every page from the cookie alone and
/// the store keeps only its hash. The token does not reveal the session secret.
pub fn session_csrf_token(session_secret: &str) -> String {
    const CONTEXT: &str = "trainyard 2027-01 session cookie secret -> CSRF token";
    format!(
        "{PREFIX}{}",
        hex(&blake3::derive_key(CONTEXT, session_secret.as_bytes()))
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new token for one attempt of a launched run: it may report that run only, and it stops
/// working when the run ends. Returns the secret (the store keeps its hash).
pub async fn issue_run_token(
    store: &dyn crate::store::Store,
    run_id: &str,
) -> crate::store::StoreResult<String> {
    let secret = new_secret();
    store
        .create_token(crate::store::accounts::TokenNew {
            id: new_id(),
            secret_hash: hash_secret(&secret),
            user_id: None,
            run_id: Some(run_id.to_owned()),
            name: format!("run {run_id}"),
            scope: crate::store::accounts::TokenScope::Run,
            created_at: crate::store::now_ms(),
            expires_at: None,
        })
        .await?;
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_long_unique_and_hashed_to_something_else() {
        let a = new_secret();
        let b = new_secret();
        assert_ne!(a, b);
        assert!(a.starts_with(PREFIX) && a.len() == PREFIX.len() + 64, "{a}");
        assert_eq!(hash_secret(&a), hash_secret(&a));
        assert_ne!(hash_secret(&a), hash_secret(&b));
        assert!(!hash_secret(&a).contains(&a[PREFIX.len()..]));
        assert_eq!(new_id().len(), 32);
    }

    #[test]
    fn a_sessions_csrf_token_is_its_own_secret_derived_from_the_cookie() {
        let a = new_secret();
        let b = new_secret();
        let csrf = session_csrf_token(&a);
        assert_eq!(csrf, session_csrf_token(&a));
        assert_ne!(csrf, session_csrf_token(&b));
        assert!(csrf.starts_with(PREFIX) && csrf.len() == a.len(), "{csrf}");
        assert_ne!(csrf, a);
        assert_ne!(csrf[PREFIX.len()..], hash_secret(&a));
        assert!(!csrf.contains(&a[PREFIX.len()..]));
    }
}
