//! `ctime`-style timestamps ("Sun Nov 22 03:32:20 2026"), in UTC.
//!
//! fio prints local time; converting to local time needs the C library's timezone
//! code, which this `unsafe`-free crate does not call, so we print UTC.

use std::time::{SystemTime, UNIX_EPOCH};
use uring::file::civil_from_days;

/// Seconds and milliseconds since the Unix epoch.
pub fn epoch_secs_ms(t: SystemTime) -> (u64, u64) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    (d.as_secs(), u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `Www Mmm dd hh:mm:ss yyyy` without the trailing newline.
pub fn ctime(t: SystemTime) -> String {
    const WDAY: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MON: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let (secs, _) = epoch_secs_ms(t);
    let secs = i64::try_from(secs).unwrap_or(0);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let wday = WDAY[usize::try_from(days.rem_euclid(7)).unwrap_or(0)];
    format!("{wday} {} {d:2} {:02}:{:02}:{:02} {y}", MON[(m - 1) as usize], rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_like_ctime_in_utc() {
        // fio's JSON above: timestamp 1795318338 = "Sun Nov 22 03:32:18 2026" on a UTC machine.
        let t = UNIX_EPOCH + Duration::from_secs(1_795_318_338);
        assert_eq!(ctime(t), "Sun Nov 22 03:32:18 2026");
        assert_eq!(ctime(UNIX_EPOCH), "Thu Jan  1 00:00:00 1970");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(ctime(t), "Tue Feb 29 00:00:00 2000");
    }
}
