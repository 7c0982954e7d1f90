//! The agent's steady blocking work (the store's calls, the sources' syncs, the host
//! policy's checks) runs here rather than on tokio's blocking pool, which hands each task to
//! the thread that has waited longest: with work arriving all the time (100 sources polled
//! each second, a rollout's store calls), every thread a burst once started keeps getting
//! turns and never reaches its idle timeout, so the pool stays as large as its largest burst,
//! each thread with its stack and its own allocator pages resident. This pool hands work to
//! the thread that went idle last, so a steady load keeps as many threads as it runs at once
//! and the others time out.
//!
//! Invariants: a job always runs (a thread is started when none is idle); a panic in a job
//! is caught and handed to the awaiting side; a thread exits only when idle for
//! `KEEP_ALIVE` with no job given to it.

use std::any::Any;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use crate::base::lock;
use std::time::{Duration, Instant};

/// How long an idle thread waits for work before it exits.
const KEEP_ALIVE: Duration = Duration::from_secs(5);

type Job = Box<dyn FnOnce() + Send>;

/// One idle thread's mailbox.
struct Slot {
    job: Mutex<Option<Job>>,
    given: Condvar,
}

#[derive(Default)]
struct State {
    /// Idle threads, the one that went idle last at the end.
    idle: Vec<Arc<Slot>>,
    /// Jobs given out and not finished.
    running: usize,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled when `running` drops to zero.
    settled: Condvar,
}

static POOL: std::sync::LazyLock<Arc<Shared>> = std::sync::LazyLock::new(Arc::default);

/// A job's panic, as `std::panic::catch_unwind` caught it.
type Panic = Box<dyn Any + Send + 'static>;

/// Runs `f` on a blocking thread and waits for it without holding an async thread; a panic
/// in `f` is the `JoinError` (as from `spawn_blocking`, the payload kept whole). Dropping the
/// future does not stop `f`. On the agent's multi-threaded runtime it runs on this pool, in
/// the runtime's context; on a current-thread runtime (the CLI's commands, tests, whose clock
/// tokio may pause) it is `spawn_blocking`: tokio holds a paused clock still while its own
/// blocking task runs, and would move it on under a job of this pool.
///
/// Only this shell is generic (it is instantiated for every store call): the value comes back
/// through a slot, the rest is `run_job`'s, once.
pub(crate) async fn run_as_task<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    let slot = Arc::new(Mutex::new(None));
    let out = Arc::clone(&slot);
    run_job(Box::new(move || *lock(&out) = Some(f()))).await?;
    let value = lock(&slot).take();
    match value {
        Some(value) => Ok(value),
        // The job returned, so it filled the slot: never reached.
        None => Err(join_error(Box::new("a blocking job left no value")).await),
    }
}

async fn run_job(job: Job) -> Result<(), tokio::task::JoinError> {
    let flavor = tokio::runtime::Handle::current().runtime_flavor();
    if flavor != tokio::runtime::RuntimeFlavor::MultiThread {
        return tokio::task::spawn_blocking(job).await;
    }
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let runtime = tokio::runtime::Handle::current();
    give(Box::new(move || {
        let _context = runtime.enter();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        // The awaiting side may be gone (dropped); the job ran all the same.
        let _ = sender.send(outcome);
    }));
    let outcome = match receiver.await {
        Ok(outcome) => outcome,
        // Every job sends before it is dropped: never reached.
        Err(closed) => Err(Box::new(format!("a blocking job was lost: {closed}")) as Panic),
    };
    match outcome {
        Ok(()) => Ok(()),
        Err(panic) => Err(join_error(panic).await),
    }
}

/// `panic` as tokio's `JoinError`, which only tokio makes: raised again in a task of its own.
async fn join_error(panic: Panic) -> tokio::task::JoinError {
    match tokio::spawn(async move { std::panic::resume_unwind(panic) }).await {
        Err(join_error) => join_error,
    }
}

/// Hands `job` to the thread that went idle last, or to a new thread.
fn give(job: Job) {
    let shared = Arc::clone(&POOL);
    let mut state = lock(&shared.state);
    state.running += 1;
    let idle = state.idle.pop();
    drop(state);
    let slot = idle.unwrap_or_else(|| {
        Arc::new(Slot {
            job: Mutex::new(None),
            given: Condvar::new(),
        })
    });
    let new = Arc::strong_count(&slot) == 1;
    *lock(&slot.job) = Some(job);
    if !new {
        slot.given.notify_one();
        return;
    }
    let (for_thread, own) = (Arc::clone(&shared), Arc::clone(&slot));
    let started = std::thread::Builder::new()
        .name("voodu-blocking".to_owned())
        .spawn(move || worker(&for_thread, &own));
    if let Err(error) = started {
        // No thread to be had (the process's limit): run it here rather than lose it.
        tracing::warn!(%error, "cannot start a blocking thread; running the job in place");
        let job = lock(&slot.job).take();
        if let Some(job) = job {
            job();
        }
        finished(&shared);
    }
}

/// One job fewer running.
fn finished(shared: &Shared) {
    let mut state = lock(&shared.state);
    state.running = state.running.saturating_sub(1);
    if state.running == 0 {
        shared.settled.notify_all();
    }
}

/// Runs the jobs given to `slot` (the first is in it) until it idles out.
fn worker(shared: &Shared, slot: &Arc<Slot>) {
    loop {
        let job = lock(&slot.job).take();
        if let Some(job) = job {
            job();
            finished(shared);
        }
        lock(&shared.state).idle.push(Arc::clone(slot));
        if !wait_for_job(shared, slot) {
            return;
        }
    }
}

/// Waits until a job is given to `slot` (true), or it stayed idle for `KEEP_ALIVE` (false:
/// it is then no longer listed as idle).
fn wait_for_job(shared: &Shared, slot: &Arc<Slot>) -> bool {
    let deadline = Instant::now() + KEEP_ALIVE;
    let mut mailbox = lock(&slot.job);
    loop {
        if mailbox.is_some() {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            drop(mailbox);
            let mut state = lock(&shared.state);
            if let Some(index) = state.idle.iter().position(|idle| Arc::ptr_eq(idle, slot)) {
                state.idle.remove(index);
                return false;
            }
            // Taken by `give` before this lock: its job is on its way; wait for it.
            drop(state);
            mailbox = lock(&slot.job);
            while mailbox.is_none() {
                mailbox = slot
                    .given
                    .wait(mailbox)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            return true;
        }
        mailbox = slot
            .given
            .wait_timeout(mailbox, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// Waits until no job runs, or `timeout` passes: at shutdown, so a store write in flight
/// ends before the process does. Whether it settled.
pub(crate) fn settle(timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut state = lock(&POOL.state);
    while state.running > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        state = POOL
            .settled
            .wait_timeout(state, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_runs_and_a_panic_comes_back_as_the_error() -> Result<(), String> {
        let value = run_as_task(|| 6 * 7)
            .await
            .map_err(|error| error.to_string())?;
        assert_eq!(value, 42);
        let as_task = run_as_task(|| -> u8 { panic!("boom as a task") }).await;
        let join_error = as_task.err().ok_or("a panic must be the error")?;
        assert!(join_error.is_panic());
        assert_eq!(
            join_error.into_panic().downcast_ref::<&str>(),
            Some(&"boom as a task")
        );
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_jobs_at_once_get_threads_and_jobs_in_turn_reuse_the_last_idle_one()
    -> Result<(), String> {
        // Eight that wait for each other need eight threads at once: none waits for a thread.
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let jobs: Vec<_> = (0..8)
            .map(|_| {
                let barrier = Arc::clone(&barrier);
                tokio::spawn(run_as_task(move || {
                    barrier.wait();
                }))
            })
            .collect();
        let all = async {
            for job in jobs {
                job.await
                    .map_err(|error| error.to_string())?
                    .map_err(|error| error.to_string())?;
            }
            Ok::<(), String>(())
        };
        tokio::time::timeout(Duration::from_secs(10), all)
            .await
            .map_err(|_| "eight jobs at once did not get eight threads")??;
        assert!(settle(Duration::from_secs(5)));
        // Then one job after another: each finds the thread the last one left idle, where a
        // pool waking its longest-idle thread would go round all eight.
        let mut threads = std::collections::BTreeSet::new();
        for _ in 0..20 {
            let id = run_as_task(|| std::thread::current().id())
                .await
                .map_err(|error| error.to_string())?;
            threads.insert(format!("{id:?}"));
        }
        // Other tests of this process may hold a thread or two at once.
        assert!(
            threads.len() <= 3,
            "{} threads for 20 jobs in turn",
            threads.len()
        );
        Ok(())
    }
}
