//! The dashboard's connections: each served by hyper with a limit on how long a request's head
//! may take, and the ones that have not shown the token yet bounded in number.
//!
//! Anyone on the machine can connect to the port; without these limits a local program opening
//! connections that never finish a request held a file descriptor and a task each, forever, until
//! the server could accept no more, the owner's page included.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};

/// How long a request's head may take to arrive, and a kept-alive connection may wait for its
/// next request; a connection past it is closed. An answer being sent (a page's update stream
/// that never ends) is not a head being read: it is not cut.
pub(super) const HEAD_TIME: Duration = Duration::from_secs(10);
/// Connections held at once that have not shown the token yet.
pub(super) const STRANGERS: usize = 64;
/// How long open pages get to close once Ctrl-C stops the server (their update streams never
/// end by themselves).
const CLOSING: Duration = Duration::from_secs(2);

/// The connections that have not shown the token yet, oldest first; each is told through its
/// `Notify` to close when newer ones push it out.
pub(super) struct Strangers {
    limit: usize,
    waiting: Mutex<(u64, BTreeMap<u64, Arc<Notify>>)>,
}

/// A connection's mark, on each of its requests: [`Arrival::admit`] when one shows the token.
#[derive(Clone)]
pub(super) struct Arrival {
    strangers: Arc<Strangers>,
    id: u64,
}

impl Strangers {
    pub(super) fn new(limit: usize) -> Arc<Strangers> {
        Arc::new(Strangers {
            limit: limit.max(1),
            waiting: Mutex::new((0, BTreeMap::new())),
        })
    }

    /// A new connection, among the strangers; at the limit the oldest stranger is told to
    /// close. The oldest, not the newest: refusing new ones would lock the owner out for as long
    /// as idle connections filled the places, while the owner's request, which shows the token
    /// within milliseconds of connecting, is never the oldest for long.
    fn arrive(self: &Arc<Self>) -> (Arrival, Arc<Notify>) {
        let notify = Arc::new(Notify::new());
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        waiting.0 += 1;
        let id = waiting.0;
        while waiting.1.len() >= self.limit {
            if let Some((_, oldest)) = waiting.1.pop_first() {
                oldest.notify_one();
            }
        }
        waiting.1.insert(id, notify.clone());
        (
            Arrival {
                strangers: self.clone(),
                id,
            },
            notify,
        )
    }

    /// How many connections have not shown the token.
    #[cfg(test)]
    fn count(&self) -> usize {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .len()
    }
}

impl Arrival {
    /// The connection showed the token: it is no stranger, and never pushed out.
    pub(super) fn admit(&self) {
        self.strangers
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .remove(&self.id);
    }
}

/// A connection's place among the strangers, given up when the connection ends.
struct Leaving(Arrival);

impl Drop for Leaving {
    fn drop(&mut self) {
        self.0.admit();
    }
}

/// Serves ROUTER on LISTENER until STOP, then gives open connections [`CLOSING`] to finish.
/// Accepting never fails for good: out of file descriptors (or the like), it waits a moment and
/// accepts again.
pub(super) async fn serve(
    listener: TcpListener,
    router: Router,
    strangers: Arc<Strangers>,
    head_time: Duration,
    stop: impl Future<Output = ()>,
) {
    let (stopping, stopping_seen) = watch::channel(false);
    let mut stop = std::pin::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tokio::spawn(connection(
                        stream,
                        router.clone(),
                        strangers.clone(),
                        head_time,
                        stopping_seen.clone(),
                    ));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            },
        }
    }
    drop(listener);
    let _ = stopping.send(true);
    drop(stopping_seen);
    // Every connection holds a receiver: closed once they have all ended.
    let _ = tokio::time::timeout(CLOSING, stopping.closed()).await;
}

/// One connection, until it ends, is pushed out as the oldest stranger, or the server stops.
async fn connection(
    stream: TcpStream,
    router: Router,
    strangers: Arc<Strangers>,
    head_time: Duration,
    mut stopping: watch::Receiver<bool>,
) {
    let (arrival, pushed_out) = strangers.arrive();
    let _leaving = Leaving(arrival.clone());
    let router = TowerToHyperService::new(router);
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(arrival.clone());
        router.call(request)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(head_time);
    let mut conn = std::pin::pin!(builder.serve_connection(TokioIo::new(stream), service));
    let mut closing = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => break,
            () = pushed_out.notified() => break,
            changed = stopping.changed(), if !closing => {
                closing = true;
                if changed.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_limit_the_oldest_stranger_is_told_to_close_and_an_admitted_one_never_is() {
        let strangers = Strangers::new(2);
        let (owner, owner_out) = strangers.arrive();
        owner.admit();
        let (_first, first_out) = strangers.arrive();
        let (_second, second_out) = strangers.arrive();
        assert_eq!(strangers.count(), 2);
        let (_third, third_out) = strangers.arrive();
        assert_eq!(strangers.count(), 2);
        let told = |n: &Arc<Notify>| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                tokio::time::timeout(Duration::from_millis(10), n.notified())
                    .await
                    .is_ok()
            })
        };
        assert!(told(&first_out));
        assert!(!told(&second_out));
        assert!(!told(&third_out));
        assert!(!told(&owner_out));
    }
}
