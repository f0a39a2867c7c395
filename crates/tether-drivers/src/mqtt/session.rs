//! The MQTT session: one OS thread running a current-thread tokio runtime
//! that owns the rumqttc client and polls its event loop continuously.
//!
//! Calls and the native stop reach it through a bounded request queue and
//! are answered through callbacks; nothing here waits for a caller. Incoming
//! messages update the state mirror (`state` topic) or are routed to the
//! waiting command by its correlation value (`ack` topic). A publish is
//! answered when the broker's PUBACK arrives, or at once with an error when
//! there is no connection: nothing is ever queued for a later connection,
//! so a command is never sent late and never twice.
//!
//! **Owns:** the connection, reconnecting, subscriptions, PUBACK tracking,
//! the link state. **Never belongs here:** payloads and statuses (the
//! mapping), waiting for a caller's deadline (callers bound their waits).

use super::config::Config;
use super::mirror::{Sample, Shared};
use super::proto::{Client, Ev, EventLoop};
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Requests waiting for the session.
pub const QUEUE_MAX: usize = 64;
/// Publishes awaiting their PUBACK at once; beyond it a publish is refused.
const INFLIGHT_MAX: usize = 64;
/// A publish without a PUBACK this long is answered with an error.
const INFLIGHT_FOR: Duration = Duration::from_secs(30);
/// Pause before reconnecting after a failed connection.
const RECONNECT_DELAY: Duration = Duration::from_millis(250);
/// Events buffered between the polling task and the session task.
const EVENTS_MAX: usize = 256;
/// Longest message payload read (a state message, an acknowledgement).
pub const PAYLOAD_MAX: usize = 64 * 1024;

/// How a publish ends: `Ok` once the broker acknowledged it.
pub type Done = Box<dyn FnOnce(Result<(), PublishError>) + Send>;

/// Why a publish did not complete.
#[derive(Debug, Clone, PartialEq)]
pub enum PublishError {
    /// Nothing was sent (no connection, queue full): safe to report failed.
    NotSent(String),
    /// It may have reached the broker (the connection broke meanwhile).
    Unknown(String),
}

/// A request to the session.
pub enum Request {
    /// Publish `payload` on `topic` with QoS 1.
    Publish {
        /// Topic.
        topic: String,
        /// JSON payload.
        payload: Value,
        /// Answered once.
        done: Done,
    },
}

/// Starts the session thread; the returned sender is its only handle (the
/// thread ends when every sender is dropped).
///
/// # Errors
/// The thread or runtime could not be started.
pub fn start(cfg: Arc<Config>, shared: Arc<Shared>) -> Result<mpsc::Sender<Request>, String> {
    let (tx, rx) = mpsc::channel(QUEUE_MAX);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("mqtt: runtime: {e}"))?;
    std::thread::Builder::new()
        .name(format!("mqtt-{}", cfg.client_id))
        .spawn(move || runtime.block_on(run(cfg, shared, rx)))
        .map_err(|e| format!("mqtt: thread: {e}"))?;
    Ok(tx)
}

/// Polls the event loop forever, forwarding events; reconnects after a
/// pause, dropping whatever was queued while disconnected.
async fn poll(mut el: EventLoop, events: mpsc::Sender<Ev>) {
    loop {
        match el.poll().await {
            Ok(Ev::Other) => {}
            Ok(ev) => {
                if events.send(ev).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                el.forget_pending();
                if events.send(Ev::Down(e)).await.is_err() {
                    return;
                }
                tokio::time::sleep(RECONNECT_DELAY).await;
                el.forget_pending();
            }
        }
    }
}

struct Session {
    cfg: Arc<Config>,
    shared: Arc<Shared>,
    client: Client,
    connected: bool,
    /// Publishes handed to rumqttc, not yet given a packet id.
    unnumbered: VecDeque<(Instant, Done)>,
    /// Publishes sent, awaiting their PUBACK.
    inflight: HashMap<u16, (Instant, Done)>,
}

async fn run(cfg: Arc<Config>, shared: Arc<Shared>, mut requests: mpsc::Receiver<Request>) {
    let (client, el) = super::proto::connect(&cfg);
    let (ev_tx, mut events) = mpsc::channel(EVENTS_MAX);
    let poller = tokio::spawn(poll(el, ev_tx));
    let mut s = Session {
        cfg,
        shared,
        client,
        connected: false,
        unnumbered: VecDeque::new(),
        inflight: HashMap::new(),
    };
    let mut sweep = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            req = requests.recv() => match req {
                Some(r) => s.request(r),
                None => break,
            },
            ev = events.recv() => match ev {
                Some(e) => s.event(e),
                None => break,
            },
            _ = sweep.tick() => s.sweep(),
        }
    }
    poller.abort();
    s.fail_all(&PublishError::Unknown("the driver stopped".into()));
}

impl Session {
    fn request(&mut self, r: Request) {
        let Request::Publish {
            topic,
            payload,
            done,
        } = r;
        if !self.connected {
            let why = self
                .shared
                .link()
                .last_error
                .unwrap_or_else(|| "not connected yet".into());
            done(Err(PublishError::NotSent(format!(
                "MQTT broker {}:{} is not connected ({why}); nothing was published",
                self.cfg.host, self.cfg.port
            ))));
            return;
        }
        if self.unnumbered.len() + self.inflight.len() >= INFLIGHT_MAX {
            done(Err(PublishError::NotSent(
                "too many publishes awaiting the broker; nothing was published".into(),
            )));
            return;
        }
        match self
            .client
            .publish(&topic, payload.to_string().into_bytes())
        {
            Ok(()) => self.unnumbered.push_back((Instant::now(), done)),
            Err(e) => done(Err(PublishError::NotSent(format!(
                "the MQTT client refused the publish: {e}"
            )))),
        }
    }

    fn event(&mut self, ev: Ev) {
        match ev {
            Ev::Connected => {
                self.connected = true;
                self.shared.set_link(true, None);
                for topic in [&self.cfg.topics.ack, &self.cfg.topics.state] {
                    if let Err(e) = self.client.subscribe(topic) {
                        self.shared
                            .set_link(true, Some(format!("subscribing to {topic}: {e}")));
                    }
                }
            }
            Ev::Down(e) => {
                self.connected = false;
                self.shared.set_link(false, Some(e));
                self.fail_all(&PublishError::Unknown(
                    "the connection to the broker broke before it acknowledged the publish".into(),
                ));
            }
            Ev::Sent(pkid) => {
                if let Some(p) = self.unnumbered.pop_front() {
                    self.inflight.insert(pkid, p);
                }
            }
            Ev::Acked(pkid) => {
                if let Some((_, done)) = self.inflight.remove(&pkid) {
                    done(Ok(()));
                }
            }
            Ev::Message { topic, payload } => self.message(&topic, &payload),
            Ev::Other => {}
        }
    }

    fn message(&mut self, topic: &str, payload: &[u8]) {
        if payload.len() > PAYLOAD_MAX {
            return;
        }
        let parsed = serde_json::from_slice::<Value>(payload).ok();
        if topic == self.cfg.topics.state {
            match parsed {
                Some(v @ Value::Object(_)) => self.shared.set_sample(Sample::now(v)),
                _ => self
                    .shared
                    .note_error("a state message that is not a JSON object was ignored"),
            }
        } else if topic == self.cfg.topics.ack {
            let Some(v) = parsed else { return };
            if let Some(id) = v.get(&self.cfg.correlation_field).and_then(Value::as_str) {
                self.shared.route_ack(id, v.clone());
            }
        }
    }

    fn sweep(&mut self) {
        let old = |at: &Instant| at.elapsed() > INFLIGHT_FOR;
        let expired: Vec<u16> = self
            .inflight
            .iter()
            .filter(|(_, (at, _))| old(at))
            .map(|(k, _)| *k)
            .collect();
        for k in expired {
            if let Some((_, done)) = self.inflight.remove(&k) {
                done(Err(PublishError::Unknown(
                    "the broker never acknowledged the publish".into(),
                )));
            }
        }
        while self.unnumbered.front().is_some_and(|(at, _)| old(at)) {
            if let Some((_, done)) = self.unnumbered.pop_front() {
                done(Err(PublishError::Unknown(
                    "the publish never left the client".into(),
                )));
            }
        }
    }

    fn fail_all(&mut self, e: &PublishError) {
        for (_, done) in self.unnumbered.drain(..) {
            done(Err(e.clone()));
        }
        for (_, (_, done)) in self.inflight.drain() {
            done(Err(e.clone()));
        }
    }
}
