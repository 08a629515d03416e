//! Driving a workload: `concurrency` callers pull operation numbers from one counter until
//! `ops` have run, each timing its own calls.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// What one workload run measured.
#[derive(Debug)]
pub struct Measured {
    /// Wall time from the first call to the last answer.
    pub elapsed: Duration,
    /// Latency of every call, in microseconds.
    pub latencies_us: Vec<u64>,
    /// Calls that did not end as the workload expects.
    pub failed: usize,
    /// CPU time (user + system, all threads) this process spent in the measured part.
    pub cpu: Duration,
}

/// CPU time (user + system) of this process, all threads, so far.
pub fn process_cpu() -> Duration {
    rusage(libc::RUSAGE_SELF)
}

/// CPU time of the waited-for children of this process, so far.
#[allow(dead_code)]
pub fn children_cpu() -> Duration {
    rusage(libc::RUSAGE_CHILDREN)
}

fn rusage(who: libc::c_int) -> Duration {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a properly sized out-parameter for getrusage.
    if unsafe { libc::getrusage(who, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// A progress bar on stderr, drawn only when stderr is a terminal.
#[derive(Clone)]
pub struct Progress(Option<ProgressBar>);

impl Progress {
    /// Advances the bar by `n`.
    pub fn inc(&self, n: u64) {
        if let Some(b) = &self.0 {
            b.inc(n);
        }
    }

    /// Removes the bar.
    pub fn finish_and_clear(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}

/// A progress bar for `label` at `concurrency` over `ops` calls.
pub fn progress(label: &str, concurrency: usize, ops: usize) -> Progress {
    if !super::stderr_is_terminal() {
        return Progress(None);
    }
    let bar = ProgressBar::new(ops as u64);
    if let Ok(style) =
        ProgressStyle::with_template("{prefix:>18} {bar:40} {pos}/{len} {per_sec} eta {eta}")
    {
        bar.set_style(style);
    }
    bar.set_prefix(format!("{label} c={concurrency}"));
    Progress(Some(bar))
}

/// Runs `op(0)`, …, `op(ops - 1)` with `concurrency` callers in flight. `op` returns whether
/// the call ended as the workload expects.
pub async fn drive<F, Fut>(label: &str, concurrency: usize, ops: usize, op: F) -> Measured
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send + 'static,
{
    let [measured] = drive_classes(label, concurrency, ops, None, |_| 0, op).await;
    measured
}

/// [`drive`], with each call counted in the class `class(i)` (`< N`) says: one [`Measured`]
/// per class, each with its own latencies and failures and the whole run's wall and CPU time.
/// With a `rate` (calls per second), call `i` starts no earlier than `i / rate` seconds after
/// the first, and its latency counts from then (a call that had to wait for a free caller
/// counts the wait): a steady offered load, as long as the callers suffice.
pub async fn drive_classes<const N: usize, C, F, Fut>(
    label: &str,
    concurrency: usize,
    ops: usize,
    rate: Option<f64>,
    class: C,
    op: F,
) -> [Measured; N]
where
    C: Fn(usize) -> usize + Send + Sync + 'static,
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send + 'static,
{
    let bar = progress(label, concurrency, ops);
    let op = Arc::new(op);
    let class = Arc::new(class);
    let next = Arc::new(AtomicUsize::new(0));
    let cpu_before = process_cpu();
    let started = Instant::now();
    let mut callers = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let op = op.clone();
        let class = class.clone();
        let next = next.clone();
        let bar = bar.clone();
        callers.push(tokio::spawn(async move {
            let mut latencies: [Vec<u64>; N] =
                std::array::from_fn(|_| Vec::with_capacity(ops / concurrency / N + 1));
            let mut failed = [0usize; N];
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= ops {
                    break;
                }
                let k = class(i).min(N - 1);
                let t0 = match rate {
                    Some(r) => {
                        let due = started + Duration::from_secs_f64(i as f64 / r);
                        tokio::time::sleep_until(due.into()).await;
                        due
                    }
                    None => Instant::now(),
                };
                if !op(i).await {
                    failed[k] += 1;
                }
                latencies[k].push(t0.elapsed().as_micros() as u64);
                bar.inc(1);
            }
            (latencies, failed)
        }));
    }
    let mut latencies_us: [Vec<u64>; N] = std::array::from_fn(|_| Vec::new());
    let mut failed = [0usize; N];
    let mut lost = 0;
    for caller in callers {
        match caller.await {
            Ok((lat, f)) => {
                for k in 0..N {
                    latencies_us[k].extend_from_slice(&lat[k]);
                    failed[k] += f[k];
                }
            }
            Err(_) => lost += 1,
        }
    }
    let elapsed = started.elapsed();
    let cpu = process_cpu().saturating_sub(cpu_before);
    bar.finish_and_clear();
    // A caller that panicked took its unanswered operations with it (counted in class 0).
    let answered: usize = latencies_us.iter().map(Vec::len).sum();
    let failed_so_far = failed.iter().sum::<usize>() + lost;
    failed[0] += lost + ops.saturating_sub(answered + failed_so_far);
    let mut latencies_us = latencies_us.into_iter();
    std::array::from_fn(|k| Measured {
        elapsed,
        latencies_us: latencies_us.next().unwrap_or_default(),
        failed: failed[k],
        cpu,
    })
}
