//! One connection to the device, every request bounded.
//!
//! **Owns:** opening the connection lazily (bounded by the connect timeout),
//! one request at a time bounded by the smaller of the request timeout and
//! the caller's own bound, and dropping the connection after a timeout or a
//! transport error (a late answer must never be read as the next one's).
//! Reconnecting is not a new native session: it changes nothing on the device.
//! **Never here:** retries. A request is sent once; what happened to it is
//! told apart precisely: not sent, answered, refused by the device, unknown.

use super::codec::{Native, Point, Table};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio_modbus::client::{Context, Reader, Writer};
use tokio_modbus::Slave;

/// How a request ended when it did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoError {
    /// No connection could be opened: nothing was sent.
    Unreachable(String),
    /// The device answered with a Modbus exception: it refused the request.
    Exception {
        /// The exception code (1 illegal function, 2 illegal address, …).
        code: u8,
        /// Its name.
        name: String,
    },
    /// Sent, and no answer within the bound: it may have taken effect.
    Timeout(Duration),
    /// Sent, and the connection broke or the answer was garbage.
    Transport(String),
}

impl IoError {
    /// Whether the request surely never reached the device, or was refused.
    pub fn had_no_effect(&self) -> bool {
        matches!(self, IoError::Unreachable(_) | IoError::Exception { .. })
    }
    /// Short machine reason.
    pub fn reason(&self) -> &'static str {
        match self {
            IoError::Unreachable(_) => "unreachable",
            IoError::Exception { .. } => "modbus_exception",
            IoError::Timeout(_) => "timeout",
            IoError::Transport(_) => "transport",
        }
    }
}

impl std::fmt::Display for IoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IoError::Unreachable(e) => write!(f, "device unreachable: {e}"),
            IoError::Exception { code, name } => write!(f, "Modbus exception {code} ({name})"),
            IoError::Timeout(d) => write!(f, "no answer within {} ms", d.as_millis()),
            IoError::Transport(e) => write!(f, "connection failed mid-request: {e}"),
        }
    }
}

/// A connection to the device.
pub struct Lane {
    addr: SocketAddr,
    unit: u8,
    connect_timeout: Duration,
    request_timeout: Duration,
    ctx: Option<Context>,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("addr", &self.addr)
            .field("connected", &self.ctx.is_some())
            .finish()
    }
}

/// The bound of one step: the smaller of its timeout and what is left
/// before `until`.
fn bound(timeout: Duration, until: Instant) -> Duration {
    timeout.min(until.saturating_duration_since(Instant::now()))
}

impl Lane {
    /// A lane that connects on first use.
    pub fn new(
        addr: SocketAddr,
        unit: u8,
        connect_timeout: Duration,
        request_timeout: Duration,
    ) -> Self {
        Self {
            addr,
            unit,
            connect_timeout,
            request_timeout,
            ctx: None,
        }
    }

    async fn ensure(&mut self, until: Instant) -> Result<&mut Context, IoError> {
        if self.ctx.is_none() {
            let limit = bound(self.connect_timeout, until);
            let connecting = tokio::net::TcpStream::connect(self.addr);
            let stream = match tokio::time::timeout(limit, connecting).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return Err(IoError::Unreachable(e.kind().to_string())),
                Err(_) => {
                    return Err(IoError::Unreachable(format!(
                        "no connection within {} ms",
                        limit.as_millis()
                    )))
                }
            };
            // Small requests: send each at once.
            let _ = stream.set_nodelay(true);
            self.ctx = Some(tokio_modbus::client::tcp::attach_slave(
                stream,
                Slave(self.unit),
            ));
        }
        self.ctx
            .as_mut()
            .ok_or_else(|| IoError::Unreachable("no connection".into()))
    }

    /// Runs one request; drops the connection unless it was answered.
    async fn run<T, F>(&mut self, until: Instant, f: F) -> Result<T, IoError>
    where
        F: for<'c> FnOnce(
            &'c mut Context,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = tokio_modbus::Result<T>> + Send + 'c>,
        >,
    {
        let limit = bound(self.request_timeout, until);
        let ctx = self.ensure(until).await?;
        let answer = tokio::time::timeout(limit, f(ctx)).await;
        match answer {
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err(code))) => Err(IoError::Exception {
                code: u8::from(code),
                name: format!("{code:?}"),
            }),
            Ok(Err(e)) => {
                self.ctx = None;
                Err(IoError::Transport(filter(&e.to_string())))
            }
            Err(_) => {
                self.ctx = None;
                Err(IoError::Timeout(limit))
            }
        }
    }

    /// Reads one point.
    ///
    /// # Errors
    /// See [`IoError`].
    pub async fn read(&mut self, p: &Point, until: Instant) -> Result<Native, IoError> {
        let (a, n) = (p.address, p.data_type.words());
        match p.table {
            Table::Coil => {
                let bits = self.run(until, |c| Box::pin(c.read_coils(a, 1))).await?;
                first_bit(&bits)
            }
            Table::Discrete => {
                let bits = self
                    .run(until, |c| Box::pin(c.read_discrete_inputs(a, 1)))
                    .await?;
                first_bit(&bits)
            }
            Table::Holding => {
                let w = self
                    .run(until, |c| Box::pin(c.read_holding_registers(a, n)))
                    .await?;
                words(w, n)
            }
            Table::Input => {
                let w = self
                    .run(until, |c| Box::pin(c.read_input_registers(a, n)))
                    .await?;
                words(w, n)
            }
        }
    }

    /// Writes one point, once.
    ///
    /// # Errors
    /// See [`IoError`]; a read-only table is refused before anything is sent.
    pub async fn write(&mut self, p: &Point, v: &Native, until: Instant) -> Result<(), IoError> {
        let a = p.address;
        match (p.table, v) {
            (Table::Coil, Native::Bit(b)) => {
                let b = *b;
                self.run(until, |c| Box::pin(c.write_single_coil(a, b)))
                    .await
            }
            (Table::Holding, Native::Words(w)) if w.len() == 1 => {
                let w0 = w[0];
                self.run(until, |c| Box::pin(c.write_single_register(a, w0)))
                    .await
            }
            (Table::Holding, Native::Words(w)) => {
                let w = w.clone();
                self.run(until, move |c| {
                    Box::pin(async move { c.write_multiple_registers(a, &w).await })
                })
                .await
            }
            _ => Err(IoError::Unreachable(format!(
                "{} cannot be written with this value",
                p.label()
            ))),
        }
    }
}

fn first_bit(bits: &[bool]) -> Result<Native, IoError> {
    bits.first()
        .map(|b| Native::Bit(*b))
        .ok_or_else(|| IoError::Transport("an empty answer".into()))
}

fn words(w: Vec<u16>, n: u16) -> Result<Native, IoError> {
    if w.len() == usize::from(n) {
        Ok(Native::Words(w))
    } else {
        Err(IoError::Transport(format!(
            "{} register(s) answered, {n} asked",
            w.len()
        )))
    }
}

/// A native message cut to a bounded length of printable characters: what a
/// peer says is never forwarded unfiltered.
pub fn filter(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(160).collect()
}
