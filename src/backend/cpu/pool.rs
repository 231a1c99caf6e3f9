//! A persistent thread pool: `n` threads (the caller is thread 0) run one closure per step and
//! wait for the next. Workers spin briefly before sleeping, so the many small steps of a decode
//! pay no thread start-up and little wake-up latency.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// How many times a worker polls for new work before sleeping on the condition variable.
const SPIN_ROUNDS: u32 = 20_000;

type Job = dyn Fn(usize, usize) + Sync;

struct Shared {
    n_threads: usize,
    generation: AtomicU64,
    /// The current job, lifetime erased; valid while `run` has not returned. Written by `run`
    /// before it moves `generation` on (release) and read by workers after they see the new
    /// generation (acquire), never while a worker still runs the previous job, so it needs no
    /// lock: a mutex here made every worker queue for it on every step.
    job: UnsafeCell<Option<*const Job>>,
    wake: Condvar,
    sleeping_lock: Mutex<()>,
    /// Workers asleep on `wake` (a step with none skips the wake-up call).
    sleeping: AtomicUsize,
    finished: AtomicUsize,
    quit: AtomicBool,
}

// SAFETY: the raw job pointer is only dereferenced while `run` keeps the closure alive, and the
// closure is `Sync`.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all (at least 1), the calling thread included.
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            n_threads,
            generation: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            wake: Condvar::new(),
            sleeping_lock: Mutex::new(()),
            sleeping: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            quit: AtomicBool::new(false),
        });
        let workers = (1..n_threads)
            .map(|ith| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("bloomery-cpu-{ith}"))
                    .spawn(move || worker(shared, ith))
                    .expect("spawning a compute thread")
            })
            .collect();
        ThreadPool { shared, workers }
    }

    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Runs `f(ith, nth)` on every thread of the pool and returns when all have finished.
    pub fn run<F: Fn(usize, usize) + Sync>(&self, f: F) {
        let n = self.shared.n_threads;
        if n == 1 {
            f(0, 1);
            return;
        }
        let job: &(dyn Fn(usize, usize) + Sync + '_) = &f;
        // SAFETY: erasing the lifetime is sound because we wait below until every worker has
        // finished with the job before `f` goes out of scope.
        let job: *const Job = unsafe {
            std::mem::transmute::<&(dyn Fn(usize, usize) + Sync + '_), &'static Job>(job)
        };
        // SAFETY: no worker reads `job` now: each finished the previous step (counted below
        // before the last `run` returned) and waits for the generation to move.
        unsafe { *self.shared.job.get() = Some(job) };
        self.shared.finished.store(0, Ordering::Release);
        // the generation moves before the sleepers are counted, and a worker counts itself
        // before it checks the generation (both sequentially consistent): either this sees the
        // sleeper and wakes it under the lock it waits with, or the sleeper sees the new step
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        if self.shared.sleeping.load(Ordering::SeqCst) > 0 {
            let _guard = lock(&self.shared.sleeping_lock);
            self.shared.wake.notify_all();
        }
        f(0, n);
        while self.shared.finished.load(Ordering::Acquire) < n - 1 {
            std::hint::spin_loop();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn worker(shared: Arc<Shared>, ith: usize) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0;
        let generation = loop {
            let g = shared.generation.load(Ordering::Acquire);
            if g != seen || shared.quit.load(Ordering::Acquire) {
                break g;
            }
            if spins < SPIN_ROUNDS {
                spins += 1;
                std::hint::spin_loop();
            } else {
                let guard = lock(&shared.sleeping_lock);
                // counted before the generation is checked (see `run`)
                shared.sleeping.fetch_add(1, Ordering::SeqCst);
                if shared.generation.load(Ordering::SeqCst) == seen
                    && !shared.quit.load(Ordering::Acquire)
                {
                    drop(shared.wake.wait(guard));
                } else {
                    drop(guard);
                }
                shared.sleeping.fetch_sub(1, Ordering::SeqCst);
            }
        };
        if shared.quit.load(Ordering::Acquire) {
            return;
        }
        seen = generation;
        // SAFETY: written before the generation this worker saw moved (see `Shared::job`).
        let job = unsafe { *shared.job.get() }.expect("a job is set before the generation moves");
        // SAFETY: `run` keeps the closure alive until `finished` counts this thread.
        unsafe { (*job)(ith, shared.n_threads) };
        shared.finished.fetch_add(1, Ordering::AcqRel);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        {
            let _guard = lock(&self.shared.sleeping_lock);
            self.shared.quit.store(true, Ordering::Release);
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A raw pointer handed to pool threads that write disjoint parts of one buffer.
#[derive(Clone, Copy)]
pub struct SyncPtr<T>(*mut T);
// SAFETY: users write disjoint elements from different threads, and the buffer outlives `run`.
unsafe impl<T> Send for SyncPtr<T> {}
unsafe impl<T> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    pub fn new(p: *mut T) -> SyncPtr<T> {
        SyncPtr(p)
    }

    /// The pointer; a method so closures capture the whole (`Sync`) wrapper, not its field.
    pub fn get(self) -> *mut T {
        self.0
    }
}

/// The part `[start, end)` of `0..n` that thread `ith` of `nth` takes, in multiples of `align`.
pub fn split_range(n: usize, ith: usize, nth: usize, align: usize) -> (usize, usize) {
    let units = n.div_ceil(align);
    let per = units.div_ceil(nth);
    let start = (ith * per * align).min(n);
    let end = ((ith + 1) * per * align).min(n);
    (start, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_each_step() {
        let pool = ThreadPool::new(3);
        let hits = AtomicUsize::new(0);
        for _ in 0..1000 {
            pool.run(|ith, nth| {
                assert!(ith < nth);
                hits.fetch_add(1 << (ith * 10), Ordering::Relaxed);
            });
        }
        assert_eq!(
            hits.load(Ordering::Relaxed),
            1000 + (1000 << 10) + (1000 << 20)
        );
    }

    #[test]
    fn sleeping_workers_wake_for_the_next_step() {
        let pool = ThreadPool::new(4);
        let hits = AtomicUsize::new(0);
        for i in 0..40 {
            // gaps around the spin budget, so workers are caught spinning, falling asleep and
            // asleep
            std::thread::sleep(std::time::Duration::from_micros((i % 5) * 700));
            pool.run(|_, _| {
                hits.fetch_add(1, Ordering::Relaxed);
            });
        }
        assert_eq!(hits.load(Ordering::Relaxed), 160);
    }

    #[test]
    fn ranges_cover_everything_once() {
        for n in [0, 1, 7, 64, 1000] {
            for nth in 1..5 {
                let mut covered = 0;
                for ith in 0..nth {
                    let (s, e) = split_range(n, ith, nth, 4);
                    assert!(s <= e);
                    covered += e - s;
                }
                assert_eq!(covered, n);
            }
        }
    }
}
