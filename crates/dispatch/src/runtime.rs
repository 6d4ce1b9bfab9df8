//! Starting a service (dispatcher, agent) on its own threads inside a network namespace, and
//! stopping it.
//!
//! Services run on single-threaded runtimes, one per worker thread, and a connection stays on
//! the thread that accepted it: a work-stealing runtime wakes a second worker to steal a task
//! that just became ready, and on an idle machine that wake-up (an interrupt to a sleeping CPU)
//! cost more than the dispatcher's whole work for a small answer.

use std::future::Future;
use std::thread::JoinHandle;

use tokio::sync::watch;

use crate::error::{DispatchError, Result};
use crate::netns;

/// A service running on its own runtime; [`Running::stop`] (or drop) ends it.
pub struct Running<T> {
    /// What the service reported once ready (its listen address, …).
    pub ready: T,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl<T> Running<T> {
    /// Signals the service to stop and waits for its thread.
    pub fn stop(mut self) -> Result<()> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<()> {
        let _ = self.stop.send(true);
        match self.thread.take() {
            Some(thread) => thread.join().map_err(|_| DispatchError::Lab("a service thread panicked".into()))?,
            None => Ok(()),
        }
    }
}

impl<T> Drop for Running<T> {
    fn drop(&mut self) {
        if let Err(error) = self.stop_and_join() {
            tracing::warn!(%error, "service ended with an error");
        }
    }
}

/// Runs `service` on a runtime of `workers` threads, all inside `namespace` (when given).
/// `service` gets a stop signal and a sender for its ready value; `spawn` returns once the
/// service sent it (or failed before).
pub fn spawn<T, F, Fut>(name: &str, namespace: Option<String>, workers: usize, service: F) -> Result<Running<T>>
where
    T: Send + 'static,
    F: FnOnce(watch::Receiver<bool>, std::sync::mpsc::Sender<T>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>>,
{
    let (stop_tx, stop_rx) = watch::channel(false);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let thread_name = name.to_string();
    let thread = std::thread::Builder::new()
        .name(thread_name.clone())
        .spawn(move || -> Result<()> {
            if let Some(ns) = &namespace {
                netns::enter(ns)?;
            }
            let runtime = build_runtime(&thread_name, namespace, workers)?;
            runtime.block_on(service(stop_rx, ready_tx))
        })
        .map_err(|e| DispatchError::io(format!("spawning {name}"), e))?;
    match ready_rx.recv() {
        Ok(ready) => Ok(Running { ready, stop: stop_tx, thread: Some(thread) }),
        Err(_) => {
            let outcome = thread.join().map_err(|_| DispatchError::Lab(format!("{name} panicked while starting")))?;
            Err(outcome.err().unwrap_or_else(|| DispatchError::Lab(format!("{name} stopped before it was ready"))))
        }
    }
}

/// Starts a thread (inside `namespace` when given) that runs `work` on its own single-threaded
/// runtime; the thread ends when `work` does.
pub fn spawn_worker<F, Fut>(name: &str, namespace: Option<String>, work: F) -> Result<JoinHandle<Result<()>>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let thread_name = name.to_string();
    std::thread::Builder::new()
        .name(thread_name.clone())
        .spawn(move || -> Result<()> {
            if let Some(ns) = &namespace {
                netns::enter(ns)?;
            }
            build_runtime(&thread_name, None, 1)?.block_on(work());
            Ok(())
        })
        .map_err(|e| DispatchError::io(format!("spawning {name}"), e))
}

fn build_runtime(name: &str, namespace: Option<String>, workers: usize) -> Result<tokio::runtime::Runtime> {
    let mut builder = if workers <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(workers);
        builder
    };
    builder.enable_all().thread_name(format!("{name}-worker"));
    if let Some(ns) = namespace {
        // Workers create sockets too: every thread of the runtime lives in the namespace.
        builder.on_thread_start(move || {
            // A socket made in the wrong namespace would silently talk to the wrong host.
            netns::enter(&ns).expect("a runtime thread must live in its service's namespace");
        });
    }
    builder.build().map_err(|e| DispatchError::io(format!("building the {name} runtime"), e))
}
