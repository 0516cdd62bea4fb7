//! Where a browser goes after signing in: the `next` of `/sign-in?next=...` (and of the sign-in
//! form's hidden field). It is read in one place, [`same_origin_path`], which lets through only
//! a path on this server and turns everything else into `/`.
//!
//! A browser resolves a `Location` with the WHATWG URL rules, which are looser than they look:
//! it removes every tab, CR and LF anywhere in the URL and trims leading and trailing control
//! characters and spaces, and in `http(s)` URLs it reads `\` as `/`. So `/\tevil.example`,
//! `/\evil.example` and `\/evil.example` all become `//evil.example`, a URL on another host.
//! The rules here are stricter than needed rather than a copy of the parser: the value is
//! printable ASCII (what any URI of this server is), begins with one `/` followed by neither
//! `/` nor `\`, has no `\` at all, and stays so once percent-escapes are decoded (in case
//! something on the way, a proxy or a later redirect, decodes them).

/// The longest `next` kept; a longer one is not a page of this server.
const MAX_LEN: usize = 2048;

/// Rounds of percent-decoding checked (`%252F` is `%2F` after one, `/` after two).
const DECODE_ROUNDS: usize = 4;

/// `next` when it is a path on this server, else `/`.
pub fn same_origin_path(next: &str) -> String {
    if is_same_origin_path(next) {
        next.to_owned()
    } else {
        "/".to_owned()
    }
}

fn is_same_origin_path(next: &str) -> bool {
    if next.len() > MAX_LEN || !next.bytes().all(|b| b.is_ascii_graphic()) {
        return false;
    }
    let mut text = next.as_bytes().to_vec();
    for _ in 0..DECODE_ROUNDS {
        if !is_plain_path(&text) {
            return false;
        }
        let decoded = percent_decode(&text);
        if decoded == text {
            return true;
        }
        text = decoded;
    }
    // Still changing after this many rounds: nothing this server links to.
    false
}

/// Begins with exactly one slash, holds no backslash and no control character (what a browser
/// strips or reads as a slash).
fn is_plain_path(text: &[u8]) -> bool {
    let starts_with_one_slash =
        text.first() == Some(&b'/') && !matches!(text.get(1), Some(b'/' | b'\\'));
    let odd = |b: &u8| *b == b'\\' || b.is_ascii_control();
    starts_with_one_slash && !text.iter().any(odd)
}

/// `%XX` escapes decoded; a `%` not followed by two hex digits stays as it is.
fn percent_decode(text: &[u8]) -> Vec<u8> {
    let hex = |b: u8| char::from(b).to_digit(16);
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let escape = match text.get(i..i + 3) {
            Some([b'%', hi, lo]) => hex(*hi).zip(hex(*lo)),
            _ => None,
        };
        match escape {
            Some((hi, lo)) => {
                out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'%'));
                i += 3;
            }
            None => {
                out.push(text[i]);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "http://trainyard.test:8080/sign-in?next=x";

    /// Where a browser lands when a page of `BASE` redirects to `location` (the WHATWG parser;
    /// `reqwest::Url` is the `url` crate, which implements it).
    fn landing(location: &str) -> Option<reqwest::Url> {
        reqwest::Url::parse(BASE).ok()?.join(location).ok()
    }

    fn same_origin(location: &str) -> bool {
        let base = reqwest::Url::parse(BASE).map(|u| u.origin());
        landing(location).is_some_and(|u| Ok(u.origin()) == base)
    }

    #[test]
    fn paths_on_this_server_are_kept() {
        for path in [
            "/",
            "/runs",
            "/runs/abc?tab=charts",
            "/compare?runs=a,b&metric=loss%2Fval",
            "/runs?filter=params.lr%3E0.1#top",
            "/experiments/e1/sharing",
            "/@user",
            "/a//b",
        ] {
            assert_eq!(same_origin_path(path), path, "{path}");
            assert!(same_origin(path), "{path}");
        }
    }

    #[test]
    fn anything_a_browser_could_read_as_another_origin_becomes_the_root() {
        // (next, whether a browser given it as is would leave this server)
        let cases: &[(&str, bool)] = &[
            ("//evil.example/x", true),
            ("/\t/evil.example/x", true),
            ("/\n/evil.example/x", true),
            ("/\r\n/evil.example/x", true),
            ("\t//evil.example/x", true),
            ("/\\evil.example/x", true),
            ("\\/evil.example/x", true),
            ("\\\\evil.example/x", true),
            (" //evil.example/x", true),
            ("\u{0}//evil.example/x", true),
            ("\u{1f}//evil.example/x", true),
            ("https://evil.example/x", true),
            ("http:evil.example", false),
            ("javascript:alert(1)", true),
            ("data:text/html,hi", true),
            ("evil.example", false),
            ("", false),
            ("/runs\\..\\..\\x", false),
            ("/runs\n", false),
            ("/%09/evil.example/x", false),
            ("/%0a/evil.example/x", false),
            ("/%2F/evil.example/x", false),
            ("/%2fevil.example/x", false),
            ("/%5Cevil.example/x", false),
            ("/%5c%5cevil.example/x", false),
            ("/%252F%252Fevil.example/x", false),
            ("/%25252F%25252Fevil.example/x", false),
            ("/runs?x=%5C", false),
            ("/run\u{a0}s", false),
            ("/ｅvil", false),
            ("/\u{ff0f}evil.example", false),
        ];
        for (next, escapes) in cases {
            assert_eq!(same_origin_path(next), "/", "{next:?}");
            assert_eq!(!same_origin(next), *escapes, "the browser on {next:?}");
        }
        let long = format!("/{}", "a".repeat(MAX_LEN));
        assert_eq!(same_origin_path(&long), "/");
    }

    #[test]
    fn what_is_kept_resolves_to_this_origin_whatever_the_decoding() {
        // Every printable ASCII character in the two places that matter, raw and escaped.
        let mut tried = 0;
        for b in 0x20u8..0x7f {
            let c = char::from(b);
            for next in [
                format!("/{c}evil.example"),
                format!("{c}/evil.example"),
                format!("/%{b:02X}evil.example"),
                format!("/%25{b:02X}evil.example"),
            ] {
                let kept = same_origin_path(&next);
                assert!(same_origin(&kept), "{next:?} kept as {kept:?}");
                let decoded =
                    String::from_utf8_lossy(&percent_decode(kept.as_bytes())).into_owned();
                assert!(
                    same_origin(&decoded),
                    "{next:?}: decoded {decoded:?} leaves"
                );
                tried += 1;
            }
        }
        assert_eq!(tried, 4 * 95);
    }

    #[test]
    fn percent_escapes_decode_and_stray_percents_stay() {
        assert_eq!(percent_decode(b"/a%2Fb%2fc"), b"/a/b/c");
        assert_eq!(percent_decode(b"/100%"), b"/100%");
        assert_eq!(percent_decode(b"/%zz%4"), b"/%zz%4");
    }
}
