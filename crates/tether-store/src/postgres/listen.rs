//! The store's ear: a connection of its own that `LISTEN`s on
//! `tether_change`, which every writer `NOTIFY`s in a batch that stores a
//! latch or an approval (`apply::announce`). It wakes the governed-stop
//! watcher at once instead of at its next poll; polling stays the fallback
//! (a lost notification, a lost link), so the watcher is never told less
//! than it would be without this.
//!
//! Never here: what a change means (the kernel's `safety/governed.rs`).

use super::conn::{PgTarget, CONNECT_TIMEOUT};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tokio_postgres::{AsyncMessage, NoTls};

/// Wait before connecting again after the listening link failed.
const RECONNECT_DELAY: Duration = Duration::from_millis(500);

/// Notifications heard so far, and the condition a waiter sleeps on.
#[derive(Default)]
pub(crate) struct Changes {
    heard: Mutex<u64>,
    wake: Condvar,
    /// What the last [`Changes::wait`] returned at: a notification heard
    /// since is answered at once.
    seen: Mutex<u64>,
    stop: AtomicBool,
}

impl Changes {
    fn bump(&self) {
        if let Ok(mut n) = self.heard.lock() {
            *n = n.wrapping_add(1);
        }
        self.wake.notify_all();
    }

    /// Waits until a notification newer than the last wait's, or `timeout`.
    pub(crate) fn wait(&self, timeout: Duration) {
        let seen = self.seen.lock().map_or(0, |s| *s);
        let Ok(heard) = self.heard.lock() else {
            std::thread::sleep(timeout);
            return;
        };
        let now = match self.wake.wait_timeout_while(heard, timeout, |n| *n == seen) {
            Ok((n, _)) => *n,
            Err(_) => return,
        };
        if let Ok(mut s) = self.seen.lock() {
            *s = now;
        }
    }

    /// Ends the listening thread at its next wake-up.
    pub(crate) fn close(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Starts the listening thread; it reconnects after a failure, every
/// [`RECONNECT_DELAY`], until [`Changes::close`].
pub(crate) fn spawn(target: PgTarget, changes: Arc<Changes>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("tether-pg-listen".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            // Runs for the life of the store; each round is one link.
            while !changes.stop.load(Ordering::SeqCst) {
                rt.block_on(listen_once(&target, &changes));
                // Whatever was missed while away: let the waiter poll.
                changes.bump();
                std::thread::sleep(RECONNECT_DELAY);
            }
        })
        .map(|_| ())
}

/// One link: connect (with the store's TLS when its URL asks for it),
/// `LISTEN`, and count notifications until it fails.
async fn listen_once(target: &PgTarget, changes: &Changes) {
    match target.tls.clone() {
        None => {
            let made = tokio::time::timeout(CONNECT_TIMEOUT, target.config.connect(NoTls)).await;
            if let Ok(Ok((client, connection))) = made {
                drive(client, connection, changes).await;
            }
        }
        Some(tls) => {
            let made = tokio::time::timeout(CONNECT_TIMEOUT, target.config.connect(tls)).await;
            if let Ok(Ok((client, connection))) = made {
                drive(client, connection, changes).await;
            }
        }
    }
}

/// `LISTEN` on a made link, then count notifications until it fails.
async fn drive<S, T>(
    client: tokio_postgres::Client,
    mut connection: tokio_postgres::Connection<S, T>,
    changes: &Changes,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut listening = Box::pin(async move {
        let r = client.batch_execute("LISTEN tether_change").await;
        // Keep the client alive while the connection is driven below.
        (r, client)
    });
    // The connection must be polled for the LISTEN to complete and for
    // notifications to arrive: drive both until the LISTEN is done.
    let mut listened = None;
    loop {
        if changes.stop.load(Ordering::SeqCst) {
            return;
        }
        tokio::select! {
            r = &mut listening, if listened.is_none() => {
                if r.0.is_err() {
                    return;
                }
                listened = Some(r.1);
            }
            msg = std::future::poll_fn(|cx| connection.poll_message(cx)) => match msg {
                Some(Ok(AsyncMessage::Notification(_))) => changes.bump(),
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return,
            },
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}
