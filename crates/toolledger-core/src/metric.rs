//! Metric handles registered once, for series recorded on every call.
//!
//! `metrics::counter!` and its kin look a series up in the recorder each time: they build its
//! key and labels, and the Prometheus recorder copies the key and hashes it into its registry.
//! On a path taken per call or per job that costs more than the increment itself. A
//! [`Registered`] keeps the handle the recorder gave and hands it out again for as long as the
//! process's recorder is the same one: a handle taken before a program installed its recorder
//! (or under another recorder in a test) is never reused after the change, it is registered
//! anew. Recorders are told apart by address, so a test's local recorder dropped and another
//! made in its place would be taken for it; a program's global recorder lives for ever.
//!
//! [`RegisteredByLabel`] does the same for a family of series told apart by one label's value
//! (a tool's calls by outcome); [`Registered`] is its one-series case. The store's own series,
//! written per job, are here: [`QueueDepth`] and [`BatchSize`].

use std::sync::{PoisonError, RwLock};

use metrics::{Gauge, Histogram};

/// Which recorder `metrics` uses now on this thread (the local one, the global one, or its
/// no-op one): the address of its value.
pub fn recorder_id() -> usize {
    metrics::with_recorder(|recorder| std::ptr::from_ref(recorder).cast::<()>() as usize)
}

/// A series' handle (`metrics::Counter`, `Gauge` or `Histogram`), registered once per recorder.
pub struct Registered<H> {
    by_label: RegisteredByLabel<H>,
}

impl<H: Clone> Registered<H> {
    /// No handle yet.
    pub const fn new() -> Self {
        Registered {
            by_label: RegisteredByLabel::new(),
        }
    }

    /// The handle for the current recorder: the one kept, or a new one from `register`.
    pub fn get(&self, register: impl FnOnce() -> H) -> H {
        self.by_label.get("", register)
    }
}

impl<H: Clone> Default for Registered<H> {
    fn default() -> Self {
        Self::new()
    }
}

/// Most label values whose handles a [`RegisteredByLabel`] keeps; the handles of others are
/// registered each time.
pub const KEPT_LABELS: usize = 32;

/// The handles of a family of series told apart by one label's value (a tool's calls by
/// outcome), each registered once per recorder.
pub struct RegisteredByLabel<H> {
    /// The recorder the handles are of, and a handle per label value seen.
    kept: RwLock<(usize, Vec<(String, H)>)>,
}

impl<H: Clone> RegisteredByLabel<H> {
    /// No handles yet.
    pub const fn new() -> Self {
        RegisteredByLabel {
            kept: RwLock::new((0, Vec::new())),
        }
    }

    /// The handle of `label` for the current recorder: the one kept, or a new one from
    /// `register` (kept while fewer than [`KEPT_LABELS`] are).
    pub fn get(&self, label: &str, register: impl FnOnce() -> H) -> H {
        let recorder = recorder_id();
        {
            let kept = self.kept.read().unwrap_or_else(PoisonError::into_inner);
            if kept.0 == recorder {
                if let Some((_, handle)) = kept.1.iter().find(|(l, _)| l == label) {
                    return handle.clone();
                }
            }
        }
        let handle = register();
        let mut kept = self.kept.write().unwrap_or_else(PoisonError::into_inner);
        if kept.0 != recorder {
            *kept = (recorder, Vec::new());
        }
        if kept.1.len() < KEPT_LABELS && !kept.1.iter().any(|(l, _)| l == label) {
            kept.1.push((label.to_string(), handle.clone()));
        }
        handle
    }
}

impl<H: Clone> Default for RegisteredByLabel<H> {
    fn default() -> Self {
        Self::new()
    }
}

/// `toolledger_store_queue_depth{backend,queue}`: the jobs waiting in one queue of a store, as
/// last seen.
pub struct QueueDepth {
    backend: &'static str,
    queue: &'static str,
    gauge: Registered<Gauge>,
}

impl QueueDepth {
    /// The gauge of `queue` in the store `backend` (`sqlite`, `postgres`).
    pub const fn new(backend: &'static str, queue: &'static str) -> Self {
        QueueDepth {
            backend,
            queue,
            gauge: Registered::new(),
        }
    }

    /// Records that `depth` jobs wait.
    pub fn set(&self, depth: usize) {
        self.gauge
            .get(|| {
                metrics::gauge!("toolledger_store_queue_depth", "backend" => self.backend, "queue" => self.queue)
            })
            .set(depth as f64);
    }
}

/// `toolledger_store_commit_batch_size{backend}`: jobs or calls per transaction.
pub struct BatchSize {
    backend: &'static str,
    histogram: Registered<Histogram>,
}

impl BatchSize {
    /// The histogram of the store `backend`.
    pub const fn new(backend: &'static str) -> Self {
        BatchSize {
            backend,
            histogram: Registered::new(),
        }
    }

    /// Records a transaction of `n` jobs or calls.
    pub fn record(&self, n: usize) {
        self.histogram
            .get(|| metrics::histogram!("toolledger_store_commit_batch_size", "backend" => self.backend))
            .record(n as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics::{Counter, Key, KeyName, Metadata, Recorder, SharedString, Unit};
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    /// A recorder of counters by their labels' values (`a/b`), counting registrations.
    #[derive(Default)]
    struct Counters {
        counts: Mutex<HashMap<String, Arc<AtomicU64>>>,
        registrations: AtomicU64,
    }

    impl Counters {
        fn count(&self, labels: &str) -> u64 {
            let counts = self.counts.lock().unwrap();
            counts.get(labels).map_or(0, |c| c.load(Ordering::Relaxed))
        }

        fn registrations(&self) -> u64 {
            self.registrations.load(Ordering::Relaxed)
        }
    }

    impl Recorder for Counters {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            self.registrations.fetch_add(1, Ordering::Relaxed);
            let labels: Vec<&str> = key.labels().map(|l| l.value()).collect();
            let mut counts = self.counts.lock().unwrap();
            Counter::from_arc(counts.entry(labels.join("/")).or_default().clone())
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    #[test]
    fn a_handle_is_registered_once_per_recorder() {
        let counter: Registered<Counter> = Registered::new();
        let registrations = std::cell::Cell::new(0);
        let increment = || {
            counter
                .get(|| {
                    registrations.set(registrations.get() + 1);
                    metrics::counter!("calls")
                })
                .increment(1)
        };
        // Before any recorder: a no-op handle, then kept.
        increment();
        increment();
        assert_eq!(registrations.get(), 1);
        let first = Counters::default();
        metrics::with_local_recorder(&first, || {
            increment();
            increment();
        });
        // A recorder installed later gets its own handle, and every increment.
        assert_eq!(registrations.get(), 2);
        assert_eq!(first.count(""), 2);
        let second = Counters::default();
        metrics::with_local_recorder(&second, increment);
        assert_eq!(registrations.get(), 3);
        assert_eq!(second.count(""), 1);
        assert_eq!(first.count(""), 2);
    }

    #[test]
    fn handles_are_kept_per_label_value_and_per_recorder() {
        let calls: RegisteredByLabel<Counter> = RegisteredByLabel::new();
        let increment = |outcome: &str| {
            calls
                .get(outcome, || metrics::counter!("calls", "tool" => "refund", "outcome" => outcome.to_string()))
                .increment(1)
        };
        let first = Counters::default();
        metrics::with_local_recorder(&first, || {
            for outcome in ["fresh", "fresh", "replayed", "fresh", "operation_conflict"] {
                increment(outcome);
            }
        });
        assert_eq!(first.count("refund/fresh"), 3);
        assert_eq!(first.count("refund/replayed"), 1);
        assert_eq!(first.count("refund/operation_conflict"), 1);
        // Each label value was looked up in the recorder once.
        assert_eq!(first.registrations(), 3);
        // Another recorder gets its own handles; the first one's are left as they were.
        let second = Counters::default();
        metrics::with_local_recorder(&second, || increment("fresh"));
        assert_eq!(second.count("refund/fresh"), 1);
        assert_eq!(first.count("refund/fresh"), 3);
        // Past the bound, a label's handle is registered on every use, and still counts.
        let many = Counters::default();
        metrics::with_local_recorder(&many, || {
            for i in 0..KEPT_LABELS + 2 {
                increment(&format!("code_{i}"));
            }
            increment(&format!("code_{}", KEPT_LABELS + 1));
        });
        assert_eq!(many.registrations(), KEPT_LABELS as u64 + 3);
        assert_eq!(many.count(&format!("refund/code_{}", KEPT_LABELS + 1)), 2);
    }
}
