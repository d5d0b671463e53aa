//! The JSON form of a stored record: one object, the same in `pure-serve records --json` and in a webhook's batches
//! (docs/apps.md), so a consumer reads both with one parser.
//!
//! `{"app", "source", "seq", "pos", "stored_at", ["origin", "origin_seq"], "payload" | "payload_b64"}`: `payload` is
//! the payload as text when it is UTF-8, else `payload_b64` holds it in standard base64; `origin` and `origin_seq`
//! are there for forwarded records only (docs/protocol.md 5.4); `stored_at` is RFC 3339 UTC with milliseconds, or
//! null for a record stored before the store kept it.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::RecordView;

/// A UTC time in milliseconds since the Unix epoch as (year, month, day, hour, minute, second, millisecond): the
/// civil date by Howard Hinnant's algorithm, to need no date library for the few formats the tools print.
pub fn utc_parts(ms: i64) -> (i64, i64, i64, i64, i64, i64, i64) {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        month,
        day,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms.rem_euclid(1000),
    )
}

/// Milliseconds since the Unix epoch as RFC 3339 UTC (`2026-12-01T10:26:00.123Z`); 0 (not known) as null.
pub fn rfc3339(ms: i64) -> serde_json::Value {
    if ms <= 0 {
        return serde_json::Value::Null;
    }
    let (year, month, day, hour, minute, second, milli) = utc_parts(ms);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{milli:03}Z").into()
}

/// The record's JSON object.
pub fn record(app: &str, r: &RecordView<'_>) -> serde_json::Value {
    let mut obj = serde_json::json!({
        "app": app, "source": r.source, "seq": r.seq, "pos": r.pos, "stored_at": rfc3339(r.stored_at_ms),
    });
    if let Some((origin, origin_seq)) = r.origin {
        obj["origin"] = origin.into();
        obj["origin_seq"] = origin_seq.into();
    }
    match std::str::from_utf8(r.payload) {
        Ok(text) => obj["payload"] = text.into(),
        Err(_) => obj["payload_b64"] = STANDARD.encode(r.payload).into(),
    }
    obj
}

/// A waiting downlink record's JSON object (`pure-serve records --waiting --json`, docs/downlink.md).
pub fn waiting(app: &str, w: &super::downlink::WaitingView<'_>) -> serde_json::Value {
    let mut obj = serde_json::json!({
        "app": app, "to": w.sender, "seq": w.seq, "queued_at": rfc3339(w.queued_at_ms),
        "expires_at": w.expires_at_ms.map_or(serde_json::Value::Null, rfc3339),
    });
    if let Some((blob, piece)) = w.piece {
        obj["blob"] = blob.into();
        obj["piece"] = piece.into();
    }
    match std::str::from_utf8(w.payload) {
        Ok(text) => obj["payload"] = text.into(),
        Err(_) => obj["payload_b64"] = STANDARD.encode(w.payload).into(),
    }
    obj
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), serde_json::Value::Null);
        assert_eq!(rfc3339(1), "1970-01-01T00:00:00.001Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_796_119_560_123), "2026-12-01T10:06:00.123Z");
    }

    #[test]
    fn forwarded_and_binary_records() {
        let r = RecordView {
            source: "node-a",
            seq: 3,
            pos: 9,
            stored_at_ms: 1,
            origin: Some(("dev", 7)),
            payload: &[0xff, 0x00],
        };
        let v = record("ingest", &r);
        assert_eq!(v["origin"], "dev");
        assert_eq!(v["origin_seq"], 7);
        assert_eq!(v["payload_b64"], "/wA=");
        assert!(v.get("payload").is_none());
    }
}
