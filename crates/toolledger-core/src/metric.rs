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
//! The store's own series, written per job, are here: [`QueueDepth`] and [`BatchSize`].

use std::sync::{PoisonError, RwLock};

use metrics::{Gauge, Histogram};

/// Which recorder `metrics` uses now on this thread (the local one, the global one, or its
/// no-op one): the address of its value.
pub fn recorder_id() -> usize {
    metrics::with_recorder(|recorder| std::ptr::from_ref(recorder).cast::<()>() as usize)
}

/// A series' handle (`metrics::Counter`, `Gauge` or `Histogram`), registered once per recorder.
pub struct Registered<H> {
    slot: RwLock<Option<(usize, H)>>,
}

impl<H: Clone> Registered<H> {
    /// No handle yet.
    pub const fn new() -> Self {
        Registered {
            slot: RwLock::new(None),
        }
    }

    /// The handle for the current recorder: the one kept, or a new one from `register`.
    pub fn get(&self, register: impl FnOnce() -> H) -> H {
        let recorder = recorder_id();
        if let Some((kept_for, handle)) = &*self.slot.read().unwrap_or_else(PoisonError::into_inner)
        {
            if *kept_for == recorder {
                return handle.clone();
            }
        }
        let handle = register();
        *self.slot.write().unwrap_or_else(PoisonError::into_inner) =
            Some((recorder, handle.clone()));
        handle
    }
}

impl<H: Clone> Default for Registered<H> {
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
    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// A recorder of one counter.
    #[derive(Default)]
    struct OneCounter(Arc<AtomicU64>);

    impl Recorder for OneCounter {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(self.0.clone())
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
        let first = OneCounter::default();
        metrics::with_local_recorder(&first, || {
            increment();
            increment();
        });
        // A recorder installed later gets its own handle, and every increment.
        assert_eq!(registrations.get(), 2);
        assert_eq!(first.0.load(Ordering::Relaxed), 2);
        let second = OneCounter::default();
        metrics::with_local_recorder(&second, increment);
        assert_eq!(registrations.get(), 3);
        assert_eq!(second.0.load(Ordering::Relaxed), 1);
        assert_eq!(first.0.load(Ordering::Relaxed), 2);
    }
}
