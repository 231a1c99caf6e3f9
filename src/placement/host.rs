//! The host's memory as `/proc/meminfo` reports it: the planner's host budget, and the engine's
//! test of whether a model file can be read into the page cache whole at load.

use super::DeviceInfo;

/// Where the host's memory comes from.
const MEMINFO: &str = "/proc/meminfo";

/// The host: `MemAvailable` free of `MemTotal`.
pub fn host_memory() -> Result<DeviceInfo, String> {
    std::fs::read_to_string(MEMINFO)
        .map_err(|e| e.to_string())
        .and_then(|text| from_meminfo(&text))
        .map_err(|e| format!("cannot read host memory from {MEMINFO}: {e}"))
}

/// `MemAvailable` and `MemTotal` of `/proc/meminfo`'s text (`MemTotal:  16384 kB`).
fn from_meminfo(text: &str) -> Result<DeviceInfo, String> {
    let field = |key: &str| -> Result<u64, String> {
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .ok_or_else(|| format!("no {key} line"))?
            .trim();
        value
            .strip_suffix("kB")
            .and_then(|n| n.trim().parse::<u64>().ok())
            .map(|kib| kib.saturating_mul(1024))
            .ok_or_else(|| format!("{key} '{value}' is not a size in kB"))
    };
    Ok(DeviceInfo {
        name: "host".into(),
        free_bytes: field("MemAvailable")?,
        total_bytes: field("MemTotal")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_memory_reads_meminfo() {
        let text = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   16384000 kB\n";
        let host = from_meminfo(text).unwrap();
        assert_eq!(
            (host.free_bytes, host.total_bytes),
            (16_384_000 * 1024, 24_576_000 * 1024)
        );
        let err = from_meminfo("MemTotal: 1 kB\n").unwrap_err();
        assert_eq!(err, "no MemAvailable line");
        let err = from_meminfo("MemTotal: lots\nMemAvailable: 1 kB\n").unwrap_err();
        assert_eq!(err, "MemTotal 'lots' is not a size in kB");
        assert!(host_memory().is_ok(), "this host has {MEMINFO}");
    }
}
