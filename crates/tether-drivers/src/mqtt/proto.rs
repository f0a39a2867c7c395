//! MQTT 3.1.1 and 5 behind one face: rumqttc has a client and an event loop
//! per protocol version; the session speaks to this module only.
//!
//! **Owns:** building the rumqttc options (plain TCP, clean session, QoS 1),
//! normalising events. **Never belongs here:** what a message means.

use super::config::Config;
use rumqttc::v5::mqttbytes::v5::Packet as P5;
use rumqttc::{Event as E4, Outgoing, Packet as P4};
use std::time::Duration;

/// Requests the rumqttc client buffers before its event loop takes them.
const CLIENT_CAP: usize = 64;
/// Outgoing QoS 1 publishes unacknowledged at once (rumqttc flow control).
const INFLIGHT: u16 = 32;

/// A normalised event.
#[derive(Debug)]
pub enum Ev {
    /// CONNACK received: connected (subscriptions must be made again).
    Connected,
    /// The connection failed or broke.
    Down(String),
    /// A publish left with this packet id.
    Sent(u16),
    /// The broker acknowledged this packet id.
    Acked(u16),
    /// A message arrived.
    Message {
        /// Its topic.
        topic: String,
        /// Its payload.
        payload: Vec<u8>,
    },
    /// Nothing the session uses.
    Other,
}

/// The client half.
pub enum Client {
    /// MQTT 3.1.1.
    V4(rumqttc::AsyncClient),
    /// MQTT 5.
    V5(rumqttc::v5::AsyncClient),
}

/// The event-loop half.
pub enum EventLoop {
    /// MQTT 3.1.1.
    V4(Box<rumqttc::EventLoop>),
    /// MQTT 5.
    V5(Box<rumqttc::v5::EventLoop>),
}

/// Builds both halves (nothing connects until the loop is polled).
pub fn connect(cfg: &Config) -> (Client, EventLoop) {
    let keep_alive = Duration::from_secs(cfg.keep_alive_s);
    if cfg.v5 {
        let mut o = rumqttc::v5::MqttOptions::new(&cfg.client_id, &cfg.host, cfg.port);
        o.set_keep_alive(keep_alive)
            .set_clean_start(true)
            .set_connection_timeout(cfg.connect_timeout_s);
        let (c, l) = rumqttc::v5::AsyncClient::new(o, CLIENT_CAP);
        (Client::V5(c), EventLoop::V5(Box::new(l)))
    } else {
        let mut o = rumqttc::MqttOptions::new(&cfg.client_id, &cfg.host, cfg.port);
        o.set_keep_alive(keep_alive)
            .set_clean_session(true)
            .set_inflight(INFLIGHT);
        let (c, mut l) = rumqttc::AsyncClient::new(o, CLIENT_CAP);
        let mut net = l.network_options();
        net.set_connection_timeout(cfg.connect_timeout_s);
        l.set_network_options(net);
        (Client::V4(c), EventLoop::V4(Box::new(l)))
    }
}

impl Client {
    /// Queues a QoS 1, non-retained publish.
    pub fn publish(&self, topic: &str, payload: Vec<u8>) -> Result<(), String> {
        match self {
            Client::V4(c) => c
                .try_publish(topic, rumqttc::QoS::AtLeastOnce, false, payload)
                .map_err(|e| e.to_string()),
            Client::V5(c) => c
                .try_publish(
                    topic,
                    rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
                    false,
                    payload,
                )
                .map_err(|e| e.to_string()),
        }
    }

    /// Queues a QoS 1 subscription.
    pub fn subscribe(&self, topic: &str) -> Result<(), String> {
        match self {
            Client::V4(c) => c
                .try_subscribe(topic, rumqttc::QoS::AtLeastOnce)
                .map_err(|e| e.to_string()),
            Client::V5(c) => c
                .try_subscribe(topic, rumqttc::v5::mqttbytes::QoS::AtLeastOnce)
                .map_err(|e| e.to_string()),
        }
    }
}

impl EventLoop {
    /// The next event.
    ///
    /// # Errors
    /// The connection failed or broke (text for people).
    pub async fn poll(&mut self) -> Result<Ev, String> {
        match self {
            EventLoop::V4(l) => l.poll().await.map(ev4).map_err(|e| e.to_string()),
            EventLoop::V5(l) => l.poll().await.map(ev5).map_err(|e| e.to_string()),
        }
    }

    /// Drops every request not yet sent, so nothing queued while the
    /// connection was down is sent once it is back (a new clean session).
    pub fn forget_pending(&mut self) {
        match self {
            EventLoop::V4(l) => {
                l.clean();
                l.pending.clear();
            }
            EventLoop::V5(l) => {
                l.clean();
                l.pending.clear();
            }
        }
    }
}

fn ev4(e: E4) -> Ev {
    match e {
        E4::Incoming(P4::ConnAck(_)) => Ev::Connected,
        E4::Incoming(P4::PubAck(a)) => Ev::Acked(a.pkid),
        E4::Incoming(P4::Publish(p)) => Ev::Message {
            topic: p.topic,
            payload: p.payload.to_vec(),
        },
        E4::Outgoing(Outgoing::Publish(pkid)) => Ev::Sent(pkid),
        _ => Ev::Other,
    }
}

fn ev5(e: rumqttc::v5::Event) -> Ev {
    use rumqttc::v5::Event as E5;
    match e {
        E5::Incoming(P5::ConnAck(_)) => Ev::Connected,
        E5::Incoming(P5::PubAck(a)) => Ev::Acked(a.pkid),
        E5::Incoming(P5::Publish(p)) => Ev::Message {
            topic: String::from_utf8_lossy(&p.topic).into_owned(),
            payload: p.payload.to_vec(),
        },
        E5::Outgoing(Outgoing::Publish(pkid)) => Ev::Sent(pkid),
        _ => Ev::Other,
    }
}
