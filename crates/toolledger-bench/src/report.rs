//! One JSON line per workload, and peak RSS from `/proc`.

use serde::Serialize;

use super::run::Measured;

/// One workload's result line.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Workload name.
    pub workload: String,
    /// Storage backend.
    pub backend: &'static str,
    /// Callers in flight.
    pub concurrency: usize,
    /// Calls made.
    pub ops: usize,
    /// Calls that ended as the workload expects.
    pub succeeded: usize,
    /// Calls that did not.
    pub failed: usize,
    /// Wall time of the measured part.
    pub seconds: f64,
    /// `ops / seconds`.
    pub ops_per_sec: f64,
    /// Median latency (µs).
    pub p50_us: u64,
    /// 99th-percentile latency (µs).
    pub p99_us: u64,
    /// CPU time per operation (µs, user + system, every thread of this process; with a
    /// server child, its CPU time too). Less sensitive than `ops_per_sec` to other load on
    /// the machine.
    pub cpu_us_per_op: f64,
    /// Peak resident set of this process during the workload (MiB).
    pub peak_rss_mb: f64,
    /// Peak resident set of the server child, for workloads that run one (MiB).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_peak_rss_mb: Option<f64>,
    /// The server child's CPU time per operation (µs), for workloads that run one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_cpu_us_per_op: Option<f64>,
    /// The upstream's CPU time per operation (µs), on lines that go through the proxy (whose
    /// own is `server_cpu_us_per_op`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_cpu_us_per_op: Option<f64>,
    /// Bytes the server child caused to be written to storage per operation
    /// (`/proc/<pid>/io` `write_bytes`: pages dirtied for the database, its WAL and its
    /// checkpoints), for workloads that run one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_write_bytes_per_op: Option<f64>,
    /// Growth of the ledger's files (database and WAL, after the server closed them) per
    /// operation: what a settled operation keeps on disk before retention.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger_bytes_per_op: Option<f64>,
    /// The line this one is compared with: the same calls made to the upstream directly.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
    /// `p50_us` minus the baseline's (negative when this line is faster).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub added_p50_us: Option<i64>,
    /// `p99_us` minus the baseline's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub added_p99_us: Option<i64>,
    /// `ops_per_sec` divided by the baseline's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throughput_ratio: Option<f64>,
    /// Write transactions the SQLite writer committed during the workload, for workloads whose
    /// writes go through it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commits: Option<u64>,
    /// Jobs per write transaction (group-commit batch size) over the workload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_batch: Option<f64>,
    /// `commits` per operation: the write transactions (each one durable commit) a call cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commits_per_op: Option<f64>,
    /// Operations in the ledger a listing workload read from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rows: Option<usize>,
    /// `ops_per_sec` divided by the ceiling line's, when the ceiling ran in this invocation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_to_ceiling: Option<f64>,
    /// The `synchronous` pragma every connection ran with.
    pub synchronous: &'static str,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Report {
    /// A report for `workload` from what was measured.
    pub fn new(workload: &str, concurrency: usize, ops: usize, mut m: Measured) -> Report {
        m.latencies_us.sort_unstable();
        let seconds = m.elapsed.as_secs_f64().max(1e-9);
        Report {
            workload: workload.to_string(),
            backend: "sqlite",
            concurrency,
            ops,
            succeeded: ops.saturating_sub(m.failed),
            failed: m.failed,
            seconds: (seconds * 1000.0).round() / 1000.0,
            ops_per_sec: (ops as f64 / seconds).round(),
            p50_us: percentile(&m.latencies_us, 50.0),
            p99_us: percentile(&m.latencies_us, 99.0),
            cpu_us_per_op: (m.cpu.as_secs_f64() * 1e6 / ops.max(1) as f64 * 10.0).round() / 10.0,
            peak_rss_mb: peak_rss_mb("self").unwrap_or(0.0),
            server_peak_rss_mb: None,
            server_cpu_us_per_op: None,
            upstream_cpu_us_per_op: None,
            server_write_bytes_per_op: None,
            ledger_bytes_per_op: None,
            baseline: None,
            added_p50_us: None,
            added_p99_us: None,
            throughput_ratio: None,
            commits: None,
            mean_batch: None,
            commits_per_op: None,
            rows: None,
            ratio_to_ceiling: None,
            synchronous: "full",
        }
    }

    /// Adds `commits` write transactions carrying `jobs` jobs (a server's SQLite writer, as
    /// its metrics count them) over this line's operations.
    pub fn with_commits(mut self, commits: u64, jobs: u64) -> Report {
        self.commits = Some(commits);
        self.commits_per_op =
            Some((commits as f64 / self.ops.max(1) as f64 * 100.0).round() / 100.0);
        if commits > 0 {
            self.mean_batch = Some((jobs as f64 / commits as f64 * 10.0).round() / 10.0);
        }
        self
    }

    /// Adds what the SQLite writer did between `before` and `after`.
    pub fn with_writer(
        self,
        before: toolledger::store::sqlite::WriterStats,
        after: toolledger::store::sqlite::WriterStats,
    ) -> Report {
        self.with_commits(
            after.batches.saturating_sub(before.batches),
            after.jobs.saturating_sub(before.jobs),
        )
    }

    /// Compares this line with `base` (the same calls without what this line measures).
    pub fn compared_with(mut self, base: &Report) -> Report {
        self.baseline = Some(base.workload.clone());
        self.added_p50_us = Some(self.p50_us as i64 - base.p50_us as i64);
        self.added_p99_us = Some(self.p99_us as i64 - base.p99_us as i64);
        if base.ops_per_sec > 0.0 {
            self.throughput_ratio =
                Some((self.ops_per_sec / base.ops_per_sec * 100.0).round() / 100.0);
        }
        self
    }

    /// Prints the line on stdout.
    pub fn print(&self) {
        print_line(self, &self.workload);
    }
}

/// Prints one report line of `workload` on stdout (a placeholder line if it cannot be encoded).
pub fn print_line(line: &impl serde::Serialize, workload: &str) {
    match serde_json::to_string(line) {
        Ok(line) => println!("{line}"),
        Err(_) => println!("{{\"workload\":\"{workload}\",\"error\":\"unprintable\"}}"),
    }
}

/// A memory field (`VmHWM`, `VmRSS`) of `/proc/<pid>/status` (`pid` may be `self`), in MiB
/// with one decimal.
fn status_mb(pid: &str, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some((kb / 1024.0 * 10.0).round() / 10.0)
}

/// Peak resident set (`VmHWM`) of process `pid`, in MiB with one decimal.
pub fn peak_rss_mb(pid: &str) -> Option<f64> {
    status_mb(pid, "VmHWM:")
}

/// Resident set (`VmRSS`) of process `pid` now, in MiB with one decimal (0 when unknown).
pub fn rss_mb(pid: &str) -> f64 {
    status_mb(pid, "VmRSS:").unwrap_or(0.0)
}

/// Resets process `pid`'s peak-RSS mark to its current RSS, so each workload reports its own
/// peak (Linux ≥ 4.0; ignored elsewhere).
pub fn reset_peak_rss_of(pid: &str) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

/// [`reset_peak_rss_of`] this process.
pub fn reset_peak_rss() {
    reset_peak_rss_of("self");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
    }
}
