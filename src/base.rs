//! The few helpers below every stage, beside `model` and `metrics` at layer 0 (it depends on
//! nothing): a mutex lock that outlives a panicked holder, the HMAC-SHA256 set-up, the text
//! of an HTTP client error, and a Unix time as UTC text.
//!
//! Invariants: `lock` is for data that stays consistent even if a holder panicked (every
//! critical section that uses it is a single update); HMAC takes a key of any length.

use std::sync::{Mutex, MutexGuard, PoisonError};

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

/// Locks `mutex`, taking the data over from a holder that panicked.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An HMAC-SHA256 keyed with `key` (`Mac::update` it, then `finalize`).
pub(crate) fn hmac_sha256(key: &[u8]) -> Hmac<Sha256> {
    Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length")
}

/// A client error's text without its URL (reqwest's own text is only `error sending request`
/// and repeats the URL): `timed_out` when it timed out, else `cannot connect` or `request
/// failed`, then `: cause` for each cause in turn. With `skip_repeats`, a cause the text so far
/// already ends with is left out (hyper's wrappers repeat what they wrap).
pub(crate) fn request_error_text(
    error: &reqwest::Error,
    timed_out: &str,
    skip_repeats: bool,
) -> String {
    let mut text = if error.is_timeout() {
        timed_out.to_owned()
    } else if error.is_connect() {
        "cannot connect".to_owned()
    } else {
        "request failed".to_owned()
    };
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !(skip_repeats && text.ends_with(&cause_text)) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// A Unix time as UTC `YYYY-MM-DD<separator>HH:MM:SS` (civil-from-days, proleptic
/// Gregorian).
pub(crate) fn utc_date_time(unix: i64, separator: char) -> String {
    let days = unix.div_euclid(86_400);
    let seconds = unix.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}{separator}{:02}:{:02}:{:02}",
        seconds / 3600,
        seconds % 3600 / 60,
        seconds % 60
    )
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a Unix time.
pub(crate) fn rfc3339_seconds(unix: i64) -> String {
    let mut text = utc_date_time(unix, 'T');
    text.push('Z');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231 test case 2.
    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        let mut mac = hmac_sha256(b"Jefe");
        mac.update(b"what do ya want for nothing?");
        let hex: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_poisoned_mutex_still_locks() {
        let mutex = std::sync::Arc::new(Mutex::new(1));
        let held = std::sync::Arc::clone(&mutex);
        let _ = std::thread::spawn(move || {
            let _guard = lock(&held);
            panic!("poison it");
        })
        .join();
        assert!(mutex.is_poisoned());
        *lock(&mutex) += 1;
        assert_eq!(*lock(&mutex), 2);
    }

    #[test]
    fn utc_text_matches_known_instants() {
        assert_eq!(rfc3339_seconds(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_seconds(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339_seconds(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_seconds(-1), "1969-12-31T23:59:59Z");
        assert_eq!(utc_date_time(1_700_000_000, ' '), "2023-11-14 22:13:20");
        // The same text as humantime's, which `status`, `releases` and `/activity` printed.
        for unix in [
            0_u64,
            86_399,
            951_782_400,
            1_700_000_000,
            4_102_444_800,
            253_402_300_799,
        ] {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix);
            assert_eq!(
                rfc3339_seconds(i64::try_from(unix).expect("small")),
                humantime::format_rfc3339_seconds(at).to_string()
            );
        }
    }
}
