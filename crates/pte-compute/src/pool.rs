//! A fork-join thread pool in which the calling thread takes part.
//!
//! [`ThreadPool::parallel_for`] runs tasks `0..n` and returns when all are done. The
//! caller runs tasks too: with one thread, with one task, or when the pool is already
//! busy (a task calling back into its own pool, or another thread using it at the same
//! moment) everything runs inline on the caller, with no hand-off and no
//! synchronization beyond one atomic flag. Workers spin for a short while after a job
//! (so back-to-back calls do not pay a wake-up), then park; while the pool is held
//! ([`ThreadPool::hold`]) they keep spinning. A call allocates nothing.
//!
//! Holding is for a caller with parallel calls far apart: a method's execution holds
//! its pool, so that a stretch of small one-thread calls between two parallel ones (an
//! LSTM's 32 steps between its input products, about 170 µs) does not put the workers
//! to sleep. On the 2-vCPU KVM machine of the benchmarks, waking a parked worker cost
//! the caller 8-130 µs per job; the LSTM at 2 threads ran in 0.91x the time held.
//!
//! Each thread starts with its own contiguous share of the tasks (thread `t` of `T` owns
//! tasks `t·n/T..(t+1)·n/T`) and takes them from the front, one at a time; a thread
//! that runs out takes the last task of another thread's share, so uneven tasks
//! balance. The fixed shares give locality across calls: a chain of operations split
//! the same way finds each thread's part of the data in that thread's own cache (on a
//! 2-core Zen 3, the kernels of a convolution network spent 20-75% more CPU time at 2
//! threads when tasks went to whichever thread came first). A task also learns the
//! index of the thread running it (0 for the caller), which
//! [`ThreadPool::parallel_for_scratch`] turns into a private scratch slice per thread.
//!
//! A job of one task per thread cannot balance: when a worker runs slower than the
//! caller (its vCPU shares a core with another guest, or was descheduled), the caller
//! waits for it. A caller that splits short work that way (a one-row product: an LSTM's
//! step) asks [`ThreadPool::split_pays`] first and reports how the split went with
//! [`ThreadPool::record_split`]; while the splits take about as long as the whole work
//! would on the caller alone, it runs inline, trying a split again now and then. The
//! 2-layer LSTM and GRU benchmarks (a split one-row product per step) at two threads,
//! on the shared 2-vCPU VM: 0.89-0.92x and 0.84-0.89x the time (paired, interleaved),
//! where splitting every step had made two threads slower than one in noisy periods.

use std::any::Any;
use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long an idle worker spins before it parks.
const SPIN: Duration = Duration::from_micros(50);

/// Even splits stop paying when a job takes this many times the caller's own share
/// (in 1/256ths): two equal threads take about 1.1 times, one waiting for a worker at
/// half speed (or for one that never joined, its share then run by the caller) 2.
const SPLIT_RATIO_LIMIT: u64 = 7 * 256 / 4;
/// While even splits do not pay, one in this many is tried anyway, to see whether the
/// workers keep up again.
const SPLIT_RETRY: u64 = 32;

/// `state` packs the job epoch (high 32 bits), a "closed" bit (no worker may join the
/// job any more) and the number of workers inside the job (low 31 bits).
const CLOSED: u64 = 1 << 31;
const ACTIVE: u64 = CLOSED - 1;
const EPOCH: u64 = 1 << 32;

/// Most tasks of one job: a share is two 32-bit bounds in one atomic word.
const MAX_JOB_TASKS: usize = u32::MAX as usize;

/// A type-erased `&F` where `F: Fn(usize, usize) + Sync` (task, thread); the job's
/// tasks are `first..first + tasks`.
#[derive(Clone, Copy)]
struct JobRef {
    data: *const (),
    call: unsafe fn(*const (), usize, usize),
    first: usize,
}

/// A thread's share of a job's tasks, `start..end` packed as `start | end << 32`, alone
/// on its cache line so that threads taking their own tasks do not contend.
#[repr(align(128))]
struct Share(AtomicU64);

impl Share {
    /// Makes this share thread `t`'s part of `tasks` tasks split over `n` threads.
    fn set(&self, t: usize, n: usize, tasks: usize) {
        // Below 2^32 each (`tasks` is at most `MAX_JOB_TASKS`, `t < n`).
        let bound = |t: usize| t as u64 * tasks as u64 / n.max(1) as u64;
        self.0
            .store(bound(t) | bound(t + 1) << 32, Ordering::Relaxed);
    }

    /// Takes the first task (`front`) or the last one of the share, if any is left.
    fn take(&self, front: bool) -> Option<usize> {
        let mut r = self.0.load(Ordering::Relaxed);
        loop {
            let (start, end) = (r & u64::from(u32::MAX), r >> 32);
            if start >= end {
                return None;
            }
            let (task, next) = if front {
                (start, r + 1)
            } else {
                (end - 1, r - (1 << 32))
            };
            match self
                .0
                .compare_exchange_weak(r, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                // A task index fits in 32 bits (`MAX_JOB_TASKS`).
                Ok(_) => return Some(task as usize),
                Err(now) => r = now,
            }
        }
    }
}

/// Calls the `F` behind `data`.
///
/// # Safety
/// `data` must point to a live `F`.
unsafe fn trampoline<F: Fn(usize, usize) + Sync>(data: *const (), task: usize, thread: usize) {
    // SAFETY: the caller guarantees `data` is a live `&F` (see `ThreadPool::run_job`).
    let f = unsafe { &*data.cast::<F>() };
    f(task, thread);
}

struct Shared {
    state: AtomicU64,
    /// One share of the current job's tasks per thread (the caller's first).
    shares: Box<[Share]>,
    job: UnsafeCell<JobRef>,
    /// Whether a caller owns the pool (publishes jobs) right now.
    busy: AtomicBool,
    sleeping: Box<[AtomicBool]>,
    shutdown: AtomicBool,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Workers that have started (past the standard library's own start-up, which
    /// allocates).
    started: AtomicUsize,
    /// Live [`Held`] guards: workers do not park while any is.
    held: AtomicUsize,
    /// How recent even splits fared: a running mean of (job time / the caller's own
    /// share's time), in 1/256ths (see [`ThreadPool::record_split`]).
    split_ratio: AtomicU64,
    /// Even splits declined since the last one tried.
    splits_declined: AtomicU64,
}

// SAFETY: `job` is written only by the thread that holds `busy`, and only while no worker
// is inside a job (the previous job ended with `state` closed and its active count 0);
// workers read it only after joining the current job through a successful
// compare-exchange on `state` (Acquire), which orders after the writer's Release
// publication of the new epoch. Every other field is atomic or a Mutex. The `JobRef`
// points to an `F: Sync`, so calling it from several threads at once is allowed.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer in `job` is only dereferenced under that protocol.
unsafe impl Send for Shared {}

impl Shared {
    /// Claims and runs tasks of the current job until none is left.
    ///
    /// # Safety
    /// The caller must be inside the current job (the publisher, or a worker counted in
    /// `state`'s active count), so that `job` is live and not being rewritten.
    unsafe fn run_tasks(&self, thread: usize) {
        // SAFETY: see the function's contract.
        let job = unsafe { *self.job.get() };
        let n = self.shares.len();
        // Our own share from the front, then the others' from the back.
        let mine = self.shares.get(thread).into_iter().map(|s| (s, true));
        let others = (1..n).filter_map(|d| self.shares.get((thread + d) % n));
        for (share, front) in mine.chain(others.map(|s| (s, false))) {
            while let Some(task) = share.take(front) {
                // SAFETY: the job's closure outlives the job (its publisher waits for
                // every joined worker before returning).
                unsafe { (job.call)(job.data, job.first + task, thread) };
            }
        }
    }
}

/// A fork-join pool of `threads - 1` workers plus the calling thread. Dropping it stops
/// and joins the workers.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("threads", &self.threads())
            .finish()
    }
}

impl ThreadPool {
    /// A pool running jobs on `threads` threads in all, the caller included (`threads`
    /// of 0 or 1: no worker, everything runs inline). Returns once every worker runs.
    pub fn new(threads: usize) -> Result<Self> {
        let n_workers = threads.saturating_sub(1);
        let shared = Arc::new(Shared {
            state: AtomicU64::new(CLOSED),
            shares: (0..=n_workers).map(|_| Share(AtomicU64::new(0))).collect(),
            job: UnsafeCell::new(JobRef {
                data: std::ptr::null(),
                call: trampoline::<fn(usize, usize)>,
                first: 0,
            }),
            busy: AtomicBool::new(false),
            sleeping: (0..n_workers).map(|_| AtomicBool::new(false)).collect(),
            shutdown: AtomicBool::new(false),
            panic: Mutex::new(None),
            started: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            split_ratio: AtomicU64::new(0),
            splits_declined: AtomicU64::new(0),
        });
        let mut pool = Self {
            shared,
            workers: Vec::with_capacity(n_workers),
        };
        for w in 0..n_workers {
            let shared = Arc::clone(&pool.shared);
            let handle = thread::Builder::new()
                .name(format!("pte-compute-{}", w + 1))
                .spawn(move || worker(&shared, w))
                .map_err(|e| Error::ThreadSpawn(e.to_string()))?;
            pool.workers.push(handle);
        }
        // Return once every worker runs, so that nothing the pool does later (a
        // thread's start-up included) allocates.
        while pool.shared.started.load(Ordering::Acquire) < n_workers {
            thread::yield_now();
        }
        Ok(pool)
    }

    /// A pool with one thread per available CPU.
    pub fn with_available_parallelism() -> Result<Self> {
        Self::new(thread::available_parallelism().map_or(1, usize::from))
    }

    /// Threads that run a job, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(task, thread)` once for every `task` in `0..tasks` and returns when all
    /// have run. `thread` is the index (below [`Self::threads`]) of the thread running the
    /// task, 0 for the caller; two tasks with the same `thread` never run at once. A
    /// panic in a task is re-raised here after every other task has finished.
    pub fn parallel_for<F: Fn(usize, usize) + Sync>(&self, tasks: usize, f: F) {
        if tasks == 0 {
            return;
        }
        if tasks == 1 || self.workers.is_empty() || !self.try_acquire() {
            (0..tasks).for_each(|t| f(t, 0));
            return;
        }
        for first in (0..tasks).step_by(MAX_JOB_TASKS) {
            self.run_job(first, (tasks - first).min(MAX_JOB_TASKS), &f);
        }
        self.shared.busy.store(false, Ordering::Release);
    }

    /// [`Self::parallel_for`] with a private scratch slice per thread: `scratch` is cut
    /// into [`Self::threads`] parts of `per_thread` elements and `f(task, part)` gets
    /// the part of the thread running it.
    pub fn parallel_for_scratch<T: Send, F: Fn(usize, &mut [T]) + Sync>(
        &self,
        tasks: usize,
        scratch: &mut [T],
        per_thread: usize,
        f: F,
    ) -> Result {
        let needed = crate::error::mul(per_thread, self.threads(), "per-thread scratch")?;
        if scratch.len() < needed {
            return Err(Error::ScratchTooSmall {
                len: scratch.len(),
                needed,
            });
        }
        let parts = Parts::new(scratch.get_mut(..needed).unwrap_or_default(), per_thread);
        self.parallel_for(tasks, |task, thread| {
            // SAFETY: a thread runs one task at a time, and the borrow ends with it.
            f(task, unsafe { parts.get(thread) });
        });
        Ok(())
    }

    /// Runs `f(i, chunk_i, part)` for every chunk of `chunk` elements of `data` (the
    /// last may be shorter), a few chunks per task, `part` the running thread's
    /// `per_thread` elements of `scratch` (see [`Self::parallel_for_scratch`]).
    pub fn parallel_chunks<T: Send, S: Send, F: Fn(usize, &mut [T], &mut [S]) + Sync>(
        &self,
        data: &mut [T],
        chunk: usize,
        scratch: &mut [S],
        per_thread: usize,
        f: F,
    ) -> Result {
        if data.is_empty() || chunk == 0 {
            return Ok(());
        }
        let chunks = data.len().div_ceil(chunk);
        // Every chunk its own task while they are few, so that the threads' shares
        // differ by one chunk at most (14 rows made 7 tasks of 2, shares of 3 and 4);
        // 16 or more per thread past that, each of several chunks. Small convolution
        // networks at 2 threads: 3-6% faster (fastest of 6 runs, old and new in turn).
        let per_task = chunks.div_ceil(self.threads() * 16).max(1);
        self.parallel_groups(
            data,
            chunk,
            per_task,
            scratch,
            per_thread,
            |i, group, part| {
                for (k, c) in group.chunks_mut(chunk).enumerate() {
                    f(i + k, c, part);
                }
            },
        )
    }

    /// Runs `f(i, group, part)` for every group of `per_task` consecutive chunks of
    /// `chunk` elements of `data` (one task per group; `i` the group's first chunk, the
    /// last group may be shorter), `part` the running thread's `per_thread` elements of
    /// `scratch` (see [`Self::parallel_for_scratch`]). For work that picks its own
    /// split, such as exactly one group per thread.
    pub fn parallel_groups<T: Send, S: Send, F: Fn(usize, &mut [T], &mut [S]) + Sync>(
        &self,
        data: &mut [T],
        chunk: usize,
        per_task: usize,
        scratch: &mut [S],
        per_thread: usize,
        f: F,
    ) -> Result {
        if data.is_empty() || chunk == 0 {
            return Ok(());
        }
        let per_task = per_task.max(1);
        let tasks = data.len().div_ceil(chunk).div_ceil(per_task);
        let group = crate::error::mul(per_task, chunk, "task group")?;
        let groups = Parts::new(data, group);
        // Task `t` runs group `t`: the same part of the data goes to the same thread
        // from one call to the next (see the module docs).
        self.parallel_for_scratch(tasks, scratch, per_thread, |t, part| {
            // SAFETY: every task runs once, and the borrow ends with it.
            let group = unsafe { groups.get(t) };
            f(t * per_task, group, part);
        })
    }

    /// Keeps the workers from parking until the guard drops (they still wait for a job
    /// to be published: a parked one wakes at the next job and then stays awake). For
    /// a caller whose parallel calls are far apart; it costs a CPU per worker while
    /// held.
    pub fn hold(&self) -> Held<'_> {
        self.shared.held.fetch_add(1, Ordering::Relaxed);
        Held(&self.shared)
    }

    /// Whether work split evenly, one task per thread, should be split now: false
    /// while recent splits took about as long as the work would take on the caller
    /// alone (see [`Self::record_split`]), except for one call in 32.
    /// Always false with one thread.
    pub fn split_pays(&self) -> bool {
        let s = &*self.shared;
        if self.workers.is_empty() {
            return false;
        }
        if s.split_ratio.load(Ordering::Relaxed) < SPLIT_RATIO_LIMIT {
            return true;
        }
        s.splits_declined.fetch_add(1, Ordering::Relaxed) % SPLIT_RETRY == SPLIT_RETRY - 1
    }

    /// Reports an even split: the whole job took `total`, the caller's own share `own`.
    pub fn record_split(&self, own: Duration, total: Duration) {
        let s = &*self.shared;
        let own = own.as_nanos().max(1);
        let sample = (total.as_nanos().saturating_mul(256) / own).min(u128::from(u32::MAX)) as u64;
        // A running mean over about the last eight splits.
        let old = s.split_ratio.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            (old * 7 + sample) / 8
        };
        s.split_ratio.store(new, Ordering::Relaxed);
    }

    fn try_acquire(&self) -> bool {
        self.shared
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Publishes a job, runs tasks on the caller, then waits for the workers that joined.
    /// The caller holds `busy`.
    fn run_job<F: Fn(usize, usize) + Sync>(&self, first: usize, tasks: usize, f: &F) {
        let s = &*self.shared;
        // SAFETY: we hold `busy` and the previous job is over (closed, no active worker),
        // so no other thread reads `job` now (see `impl Sync for Shared`).
        unsafe {
            *s.job.get() = JobRef {
                data: (f as *const F).cast(),
                call: trampoline::<F>,
                first,
            };
        }
        let n = s.shares.len();
        for (t, share) in s.shares.iter().enumerate() {
            share.set(t, n, tasks);
        }
        // New epoch, open, no worker inside.
        let old = s.state.load(Ordering::Relaxed);
        s.state.store(
            (old & !(CLOSED | ACTIVE)).wrapping_add(EPOCH),
            Ordering::SeqCst,
        );
        for (w, sleeping) in s.sleeping.iter().enumerate() {
            if sleeping.swap(false, Ordering::SeqCst) {
                if let Some(h) = self.workers.get(w) {
                    h.thread().unpark();
                }
            }
        }
        // SAFETY: we published the job and are its owner; `f` lives until we return.
        let mine = panic::catch_unwind(AssertUnwindSafe(|| unsafe { s.run_tasks(0) }));
        // No worker joins from now on; wait for those inside (they finish their last
        // task and leave) before `f` goes out of scope.
        let mut spins = 0u32;
        let mut state = s.state.fetch_or(CLOSED, Ordering::AcqRel) | CLOSED;
        while state & ACTIVE != 0 {
            spins += 1;
            if spins > 1 << 12 {
                thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            state = s.state.load(Ordering::Acquire);
        }
        let theirs = s.panic.lock().ok().and_then(|mut p| p.take());
        if let Some(payload) = mine.err().or(theirs) {
            s.busy.store(false, Ordering::Release);
            panic::resume_unwind(payload);
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        for h in &self.workers {
            h.thread().unpark();
        }
        for h in self.workers.drain(..) {
            // A worker never panics (tasks run under catch_unwind); nothing to report.
            let _ = h.join();
        }
    }
}

/// A worker's loop: wait for a new epoch, join the job if it is still open, run tasks.
fn worker(s: &Shared, w: usize) {
    s.started.fetch_add(1, Ordering::Release);
    let mut seen = s.state.load(Ordering::Acquire) >> 32;
    loop {
        let Some(mut state) = wait_for_job(s, w, seen) else {
            return;
        };
        // Join the job unless its publisher closed it already.
        let joined = loop {
            seen = state >> 32;
            if state & CLOSED != 0 {
                break false;
            }
            match s.state.compare_exchange_weak(
                state,
                state + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break true,
                Err(now) => state = now,
            }
        };
        if joined {
            // SAFETY: we are counted in the active workers of the current job.
            let r = panic::catch_unwind(AssertUnwindSafe(|| unsafe { s.run_tasks(w + 1) }));
            if let Err(payload) = r {
                if let Ok(mut p) = s.panic.lock() {
                    p.get_or_insert(payload);
                }
            }
            s.state.fetch_sub(1, Ordering::Release);
        }
    }
}

/// A hold on a pool's workers (see [`ThreadPool::hold`]).
pub struct Held<'a>(&'a Shared);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Spins (for [`SPIN`] past the last time the pool was held), then parks, until the
/// epoch differs from `seen`; None on shutdown.
fn wait_for_job(s: &Shared, w: usize, seen: u64) -> Option<u64> {
    let mut start = Instant::now();
    let mut spins = 0u32;
    loop {
        let state = s.state.load(Ordering::Acquire);
        if state >> 32 != seen {
            return Some(state);
        }
        if s.shutdown.load(Ordering::Acquire) {
            return None;
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(64) {
            std::hint::spin_loop();
            continue;
        }
        if s.held.load(Ordering::Relaxed) > 0 {
            start = Instant::now();
        }
        if start.elapsed() < SPIN {
            std::hint::spin_loop();
            continue;
        }
        let sleeping = s.sleeping.get(w)?;
        sleeping.store(true, Ordering::SeqCst);
        if s.state.load(Ordering::SeqCst) >> 32 == seen && !s.shutdown.load(Ordering::SeqCst) {
            thread::park();
        }
        sleeping.store(false, Ordering::Relaxed);
    }
}

/// A `&mut [T]` cut into consecutive parts of `part` elements (the last may be
/// shorter), handed out by index to the tasks of a job.
struct Parts<'a, T> {
    ptr: *mut T,
    len: usize,
    part: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: `get`'s contract keeps the borrows handed to different threads disjoint, and
// `T: Send`.
unsafe impl<T: Send> Sync for Parts<'_, T> {}

impl<'a, T> Parts<'a, T> {
    fn new(data: &'a mut [T], part: usize) -> Self {
        Parts {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            part,
            _borrow: PhantomData,
        }
    }

    /// Part `i`, empty past the end.
    ///
    /// # Safety
    /// No other borrow of part `i` may be live while the returned one is: a task of
    /// [`ThreadPool::parallel_for`] asks for its own task index (every task runs
    /// once) or its own thread index (a thread runs one task at a time), and lets
    /// the borrow end with its call.
    #[allow(clippy::mut_from_ref)]
    unsafe fn get(&self, i: usize) -> &mut [T] {
        let start = i.saturating_mul(self.part).min(self.len);
        let end = start.saturating_add(self.part).min(self.len);
        // SAFETY: `ptr..ptr + len` is the `&mut [T]` borrowed for `'a`; `start..end`
        // lies inside it and is disjoint from every other part; the caller keeps
        // borrows of the same part from overlapping.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), end - start) }
    }
}

/// The first error met by the tasks of a parallel loop: a task returns nothing, so
/// each keeps its failure here and the caller returns it once the loop is over.
#[derive(Default)]
pub(crate) struct FirstError(Mutex<Option<Error>>);

impl FirstError {
    /// Keeps `r`'s error unless one is kept already.
    pub(crate) fn keep(&self, r: Result) {
        if let Err(e) = r {
            let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert(e);
        }
    }

    /// The error kept, if any.
    pub(crate) fn into_result(self) -> Result {
        match self.0.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_task_runs_once() {
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads).unwrap();
            for tasks in [0, 1, 2, 5, 100] {
                let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                pool.parallel_for(tasks, |t, thread| {
                    assert!(thread < threads);
                    hits[t].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn shares_split_evenly_and_are_taken_from_both_ends() {
        let share = Share(AtomicU64::new(0));
        share.set(1, 3, 10);
        assert_eq!(share.take(true), Some(3));
        assert_eq!(share.take(false), Some(5));
        assert_eq!(share.take(true), Some(4));
        assert_eq!(share.take(false), None);
        share.set(2, 3, 10);
        assert_eq!(share.take(false), Some(9));
        share.set(0, 4, 3);
        assert_eq!(share.take(true), None);
    }

    #[test]
    fn nested_calls_run_inline() {
        let pool = ThreadPool::new(2).unwrap();
        let total = AtomicUsize::new(0);
        pool.parallel_for(4, |_, _| {
            pool.parallel_for(3, |_, _| {
                total.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 12);
    }

    #[test]
    fn even_splits_stop_while_the_workers_lag_and_are_tried_again() {
        let pool = ThreadPool::new(2).unwrap();
        assert!(pool.split_pays(), "nothing recorded yet");
        let us = Duration::from_micros;
        for _ in 0..8 {
            pool.record_split(us(10), us(11));
        }
        assert!(pool.split_pays(), "the worker keeps up");
        // The worker takes twice the caller's time.
        for _ in 0..16 {
            pool.record_split(us(10), us(20));
        }
        let tried = (0..SPLIT_RETRY * 3).filter(|_| pool.split_pays()).count();
        assert_eq!(tried, 3, "one split in {SPLIT_RETRY} is tried");
        for _ in 0..16 {
            pool.record_split(us(10), us(11));
        }
        assert!(pool.split_pays(), "the worker keeps up again");
        assert!(!ThreadPool::new(1).unwrap().split_pays(), "one thread");
    }

    #[test]
    fn shared_by_several_threads() {
        let pool = ThreadPool::new(2).unwrap();
        let total = AtomicUsize::new(0);
        thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..200 {
                        pool.parallel_for(7, |_, _| {
                            total.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 3 * 200 * 7);
    }

    #[test]
    fn workers_park_and_wake() {
        let pool = ThreadPool::new(2).unwrap();
        for _ in 0..3 {
            thread::sleep(Duration::from_millis(2));
            let total = AtomicUsize::new(0);
            pool.parallel_for(50, |_, _| {
                total.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(total.load(Ordering::Relaxed), 50);
        }
    }

    #[test]
    fn held_workers_do_not_park() {
        let pool = ThreadPool::new(3).unwrap();
        let asleep = || {
            pool.shared
                .sleeping
                .iter()
                .any(|s| s.load(Ordering::SeqCst))
        };
        {
            let _held = pool.hold();
            // Wakes any worker that parked before the hold.
            pool.parallel_for(8, |_, _| {});
            thread::sleep(SPIN * 20);
            assert!(!asleep());
        }
        // Released, they park again.
        let start = Instant::now();
        while !pool
            .shared
            .sleeping
            .iter()
            .all(|s| s.load(Ordering::SeqCst))
        {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "workers never parked"
            );
            thread::sleep(SPIN);
        }
        let total = AtomicUsize::new(0);
        pool.parallel_for(50, |_, _| {
            total.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(total.load(Ordering::Relaxed), 50);
    }

    #[test]
    fn panics_propagate_and_the_pool_survives() {
        let pool = ThreadPool::new(2).unwrap();
        let r = panic::catch_unwind(AssertUnwindSafe(|| {
            pool.parallel_for(8, |t, _| {
                if t == 5 {
                    std::panic::panic_any("task 5");
                }
            });
        }));
        assert!(r.is_err());
        let total = AtomicUsize::new(0);
        pool.parallel_for(8, |_, _| {
            total.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(total.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn chunks_are_visited_once() {
        let pool = ThreadPool::new(2).unwrap();
        let mut data = vec![0usize; 103];
        let mut scratch = [0u8; 2];
        pool.parallel_chunks(&mut data, 10, &mut scratch, 1, |i, c, part| {
            assert_eq!(part.len(), 1);
            c.iter_mut().for_each(|v| *v += i + 1);
        })
        .unwrap();
        assert!(data.iter().enumerate().all(|(j, &v)| v == j / 10 + 1));
    }

    #[test]
    fn scratch_parts_are_private() {
        let pool = ThreadPool::new(2).unwrap();
        let mut scratch = vec![0usize; 2 * 4];
        pool.parallel_for_scratch(64, &mut scratch, 4, |t, part| {
            part.fill(t);
            assert!(part.iter().all(|&v| v == t));
        })
        .unwrap();
        assert!(pool
            .parallel_for_scratch(2, &mut scratch, 5, |_, _| {})
            .is_err());
    }
}
