//! What a failed delivery may say: the receiver's answer and the client's error, with every
//! secret the agent knows for the request cut out before it is logged, recorded in the store
//! or shown by `status` and `notify test`.
//!
//! A receiver's error page may echo the request (Express's default 404 page is `Cannot POST
//! /hooks/<secret>`), and for a chat webhook the URL is the secret. So the secrets of one
//! request are: its whole URL, the URL's user, password, path, query and fragment and each of
//! their segments (percent-decoded too), every header value but the few in
//! [`PUBLIC_HEADERS`] (and the credential after an `Authorization` scheme), and the texts of
//! the secret files it was built from (`Request::secrets`: the URL file, the HMAC key, the
//! token).
//!
//! Invariants: `send` (one place, every sink's request) builds its error only from
//! [`Redactor::clean`]'s output; a secret is replaced whole, longest first, so no part of a
//! longer one is left around a shorter one's mark; an answer read only in part loses any end
//! that could be the start of a secret cut by the read.

use super::sinks::{PUBLIC_HEADERS, Request};

/// What stands where a secret was.
pub(crate) const MARK: &str = "<redacted>";

/// URL pieces shorter than this (`api`, `v2`) are not taken for secrets: cutting them out of
/// every answer would leave it illegible, and a secret that short guards nothing.
const MIN_PIECE_CHARS: usize = 4;

/// The secrets of one request, longest first.
pub(crate) struct Redactor {
    secrets: Vec<String>,
}

impl Redactor {
    /// The secrets of `request`.
    pub(crate) fn new(request: &Request) -> Redactor {
        let mut secrets = Vec::new();
        add(&mut secrets, &request.url, 1);
        for secret in &request.secrets {
            add(&mut secrets, secret, 1);
            add(&mut secrets, secret.trim(), 1);
        }
        for (name, value) in &request.headers {
            if PUBLIC_HEADERS.contains(name) {
                continue;
            }
            add(&mut secrets, value, 1);
            // `Bearer <token>`, `token <token>`: the credential alone may be echoed too.
            if let Some((_, credential)) = value.split_once(' ') {
                add(&mut secrets, credential.trim(), 1);
            }
        }
        if let Ok(url) = reqwest::Url::parse(&request.url) {
            // What an error page echoes: the path and its query, as sent.
            if let Some(query) = url.query() {
                let target = format!("{}?{query}", url.path());
                add(&mut secrets, &target, MIN_PIECE_CHARS);
                add(&mut secrets, &percent_decoded(&target), MIN_PIECE_CHARS);
            }
            let mut pieces = vec![url.username(), url.password().unwrap_or_default()];
            pieces.push(url.path());
            pieces.extend(url.path_segments().into_iter().flatten());
            for part in [url.query(), url.fragment()].into_iter().flatten() {
                pieces.push(part);
                for pair in part.split('&') {
                    pieces.push(pair);
                    pieces.extend(pair.split_once('=').map(|(_, value)| value));
                }
            }
            for piece in pieces {
                add(&mut secrets, piece, MIN_PIECE_CHARS);
                add(&mut secrets, &percent_decoded(piece), MIN_PIECE_CHARS);
            }
        }
        secrets.sort_unstable_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        Redactor { secrets }
    }

    /// `text` with every secret replaced by [`MARK`]. `cut`: `text` is the start of something
    /// longer, so an end that begins a secret is dropped too.
    pub(crate) fn clean(&self, text: &str, cut: bool) -> String {
        let mut text = text.to_owned();
        for secret in &self.secrets {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), MARK);
            }
        }
        if cut {
            // The longest end of `text` that starts a secret (every shorter one is inside it).
            let partial = self
                .secrets
                .iter()
                .filter_map(|secret| {
                    secret
                        .char_indices()
                        .map(|(index, _)| index)
                        .skip(1)
                        .filter(|&end| text.ends_with(&secret[..end]))
                        .max()
                })
                .max()
                .unwrap_or(0);
            text.truncate(text.len() - partial);
        }
        text
    }
}

fn add(secrets: &mut Vec<String>, text: &str, min_chars: usize) {
    if text.chars().count() >= min_chars.max(1) {
        secrets.push(text.to_owned());
    }
}

/// `%XX` escapes decoded (invalid UTF-8 replaced); anything else as it is.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let hex = |offset: usize| {
            bytes
                .get(index + offset)
                .and_then(|byte| char::from(*byte).to_digit(16))
        };
        match (bytes[index], hex(1), hex(2)) {
            (b'%', Some(high), Some(low)) => {
                out.push(u8::try_from(high * 16 + low).expect("two hex digits make a byte"));
                index += 3;
            }
            (byte, ..) => {
                out.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(url: &str, headers: Vec<(&'static str, String)>, secrets: &[&str]) -> Request {
        Request {
            url: url.to_owned(),
            headers,
            body: Vec::new(),
            secrets: secrets.iter().map(|secret| (*secret).to_owned()).collect(),
        }
    }

    /// Each place a secret can be echoed from is cut out; what is no secret stays legible.
    #[test]
    fn every_secret_of_a_request_is_cut_out_of_an_answer() {
        let redactor = Redactor::new(&request(
            "https://user:pa55word@hooks.example/services/T0ID/B0ID/s3cretPath%21?token=q5ecret&x=1",
            vec![
                ("content-type", "application/json".to_owned()),
                ("authorization", "Bearer ghp_t0ken".to_owned()),
            ],
            &["hmac-k3y\n"],
        ));
        for (answer, wanted) in [
            (
                "Cannot POST /services/T0ID/B0ID/s3cretPath%21?token=q5ecret&x=1",
                "Cannot POST <redacted>",
            ),
            ("no such path s3cretPath!", "no such path <redacted>"),
            ("bad token q5ecret", "bad token <redacted>"),
            ("got Bearer ghp_t0ken", "got <redacted>"),
            ("token ghp_t0ken is revoked", "token <redacted> is revoked"),
            (
                "key hmac-k3y, user:pa55word",
                "key <redacted>, <redacted>:<redacted>",
            ),
            ("want application/json", "want application/json"),
            ("x=1 is fine, v2 api", "x=1 is fine, v2 api"),
        ] {
            assert_eq!(redactor.clean(answer, false), wanted, "{answer}");
        }
    }

    /// An answer read in part that ends inside a secret keeps no start of it.
    #[test]
    fn a_secret_cut_by_the_end_of_what_was_read_is_dropped() {
        let redactor = Redactor::new(&request("http://h/abcdef123456", Vec::new(), &[]));
        assert_eq!(
            redactor.clean("Cannot POST /abcdef12", true),
            "Cannot POST "
        );
        assert_eq!(
            redactor.clean("Cannot POST /abcdef12", false),
            "Cannot POST /abcdef12",
            "a whole answer that only looks like a start is kept"
        );
    }

    #[test]
    fn percent_escapes_are_decoded() {
        assert_eq!(percent_decoded("a%2Fb%zz%4"), "a/b%zz%4");
    }
}
