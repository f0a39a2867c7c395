//! One bounded OPC UA session: opened within a deadline, every request
//! bounded by the smaller of the request timeout and the caller's deadline,
//! never reconnected behind the caller's back.
//!
//! **Owns:** building the client (security policy, mode, user, PKI), opening
//! a session (endpoints, channel, session, activation), resolving namespace
//! URIs and method parents on each new session, and sorting failures into
//! [`IoError`]s: a request that could not have reached the device, a status
//! the device answered, an answer that never came.
//! **Never here:** retries (a request is sent once; a lane drops a session
//! that timed out and the *next* use opens a new one), decisions.

use super::config::{Map, Mode, Policy};
use super::node::{Namespace, NodeRef, UaValue};
use opcua::client::{ClientBuilder, IdentityToken, Session};
use opcua::crypto::SecurityPolicy;
use opcua::types::{
    AttributeId, BrowseDescription, BrowseDirection, DataValue, EndpointDescription,
    MessageSecurityMode, NodeId, ReadValueId, ReferenceTypeId, StatusCode, TimestampsToReturn,
    Variant, WriteValue,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a request did not succeed.
#[derive(Debug, Clone, PartialEq)]
pub enum IoError {
    /// No session could be opened: nothing was sent.
    Unreachable(String),
    /// The device answered with a bad status code (the request arrived; the
    /// operation was refused).
    Status {
        /// The status code's bits.
        code: u32,
        /// Its symbolic name (`BadTypeMismatch`).
        name: String,
    },
    /// No answer within the bound: whether it was applied is unknown.
    Timeout(Duration),
    /// The session broke while the request was out: unknown too.
    Transport(String),
}

impl IoError {
    /// Whether the device certainly did not act on the request.
    pub fn had_no_effect(&self) -> bool {
        matches!(self, IoError::Unreachable(_) | IoError::Status { .. })
    }
    /// Short machine reason.
    pub fn reason(&self) -> &'static str {
        match self {
            IoError::Unreachable(_) => "unreachable",
            IoError::Status { .. } => "opcua_bad_status",
            IoError::Timeout(_) => "timeout",
            IoError::Transport(_) => "transport",
        }
    }
    fn status(s: StatusCode) -> IoError {
        IoError::Status {
            code: s.bits(),
            name: status_name(s),
        }
    }
}

impl std::fmt::Display for IoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IoError::Unreachable(e) => write!(f, "device unreachable: {e}"),
            IoError::Status { code, name } => write!(f, "OPC UA status {name} (0x{code:08X})"),
            IoError::Timeout(d) => write!(f, "no answer within {} ms", d.as_millis()),
            IoError::Transport(e) => write!(f, "session broken: {e}"),
        }
    }
}

/// A status code's symbolic name (`BadTypeMismatch`), without its flags.
pub fn status_name(s: StatusCode) -> String {
    s.sub_code().name().to_owned()
}

/// A status code's name only: the library's error text may carry server
/// strings, which are never forwarded unfiltered.
fn filtered(e: &opcua::types::Error) -> String {
    status_name(e.status())
}

/// An open session.
pub struct Conn {
    session: Arc<Session>,
    events: tokio::task::JoinHandle<StatusCode>,
    namespaces: HashMap<String, u16>,
    parents: HashMap<NodeRef, NodeId>,
    request_timeout: Duration,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("namespaces", &self.namespaces)
            .finish_non_exhaustive()
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Close politely in the background, bounded; the event loop goes
        // with it. A session that cannot close times out on the server.
        let (session, events) = (self.session.clone(), self.events.abort_handle());
        let bound = self.request_timeout;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = tokio::time::timeout(bound, session.disconnect()).await;
                events.abort();
            });
        } else {
            events.abort();
        }
    }
}

fn policy_uri(p: Policy) -> &'static str {
    match p {
        Policy::None => SecurityPolicy::None.to_uri(),
        Policy::Basic256Sha256 => SecurityPolicy::Basic256Sha256.to_uri(),
    }
}

fn mode(m: Mode) -> MessageSecurityMode {
    match m {
        Mode::None => MessageSecurityMode::None,
        Mode::Sign => MessageSecurityMode::Sign,
        Mode::SignAndEncrypt => MessageSecurityMode::SignAndEncrypt,
    }
}

/// The client of one lane. Its PKI directory holds the client's own
/// certificate (made on first use) for Basic256Sha256; with security `none`
/// nothing is read or written there.
///
/// # Errors
/// A configuration the library refuses.
pub fn client(map: &Map, device_id: &str) -> Result<opcua::client::Client, String> {
    let secure = map.policy != Policy::None;
    let pki = map
        .pki_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("tether-opcua-client"));
    ClientBuilder::new()
        .application_name(format!("Tether ({device_id})"))
        .application_uri(format!("urn:tether:client:{device_id}"))
        .product_uri("urn:tether")
        .pki_dir(pki)
        .create_sample_keypair(secure)
        .trust_server_certs(map.trust_server_certs)
        // Never reconnect on its own: the lane decides, and a request is
        // never re-sent over a new session.
        .session_retry_limit(0)
        .request_timeout(map.request_timeout)
        .session_timeout(60_000)
        .client()
        .map_err(|e| format!("OPC UA client: {}", e.join("; ")))
}

fn identity(map: &Map) -> Result<IdentityToken, IoError> {
    match &map.user {
        None => Ok(IdentityToken::Anonymous),
        Some((user, env)) => std::env::var(env)
            .map(|pw| IdentityToken::new_user_name(user.clone(), pw))
            .map_err(|_| IoError::Unreachable(format!("the password variable `{env}` is not set"))),
    }
}

/// The server's endpoint to open a session on: the one at the configured
/// URL with the configured policy and mode; else (a server that advertises
/// its endpoints under a path of its own, as many do) one with that policy
/// and mode under any path — reached at the configured host and port either
/// way, never at the host the server names (it may not resolve from here).
///
/// # Errors
/// No endpoint offers the policy and mode.
fn choose_endpoint(
    endpoints: &[EndpointDescription],
    url: &str,
    policy: &str,
    mode: MessageSecurityMode,
) -> Result<EndpointDescription, IoError> {
    let security = SecurityPolicy::from_uri(policy);
    if let Some(e) = opcua::client::Client::find_matching_endpoint(endpoints, url, security, mode) {
        return Ok(e);
    }
    let mut e = endpoints
        .iter()
        .find(|e| {
            e.security_mode == mode
                && SecurityPolicy::from_uri(e.security_policy_uri.as_ref()) == security
        })
        .cloned()
        .ok_or_else(|| {
            IoError::Unreachable(format!(
                "the server offers no endpoint with security {} and mode {mode}",
                security.to_str()
            ))
        })?;
    let ours = url.trim_end_matches('/');
    let path = e
        .endpoint_url
        .as_ref()
        .strip_prefix("opc.tcp://")
        .and_then(|rest| rest.find('/').map(|i| rest[i..].to_owned()))
        .unwrap_or_default();
    let ours_no_path = ours
        .strip_prefix("opc.tcp://")
        .and_then(|rest| rest.split('/').next())
        .map_or_else(
            || ours.to_owned(),
            |hostport| format!("opc.tcp://{hostport}"),
        );
    e.endpoint_url = format!("{ours_no_path}{path}").into();
    Ok(e)
}

impl Conn {
    /// Opens a sessionimpl Conn {
    /// Opens a session and resolves what the map names on it, by `until`.
    ///
    /// # Errors
    /// [`IoError::Unreachable`]: nothing was sent to the device's variables.
    pub async fn open(
        client: &mut opcua::client::Client,
        map: &Map,
        until: Instant,
    ) -> Result<Conn, IoError> {
        let until = until.min(Instant::now() + map.connect_timeout);
        let unreachable = |e: String| IoError::Unreachable(e);
        let wanted = (
            map.endpoint.as_str(),
            policy_uri(map.policy),
            mode(map.mode),
        );
        let id = identity(map)?;
        let endpoints = tokio::time::timeout_at(
            until.into(),
            client.get_server_endpoints_from_url(map.endpoint.as_str()),
        )
        .await
        .map_err(|_| unreachable("no endpoint list within the connect timeout".into()))?
        .map_err(|e| unreachable(filtered(&e)))?;
        let chosen = choose_endpoint(&endpoints, &map.endpoint, wanted.1, wanted.2)?;
        let (session, events) = client
            .connect_to_endpoint_directly(chosen, id)
            .map_err(|e| unreachable(filtered(&e)))?;
        let mut events = events.spawn();
        let connected = tokio::time::timeout_at(until.into(), async {
            tokio::select! {
                ok = session.wait_for_connection() => Ok(ok),
                end = &mut events => Err(end.map_or_else(|_| "event loop ended".to_owned(), status_name)),
            }
        })
        .await;
        let mut conn = Conn {
            session,
            events,
            namespaces: HashMap::new(),
            parents: HashMap::new(),
            request_timeout: map.request_timeout,
        };
        match connected {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => return Err(unreachable("the session did not open".into())),
            Ok(Err(e)) => return Err(unreachable(e)),
            Err(_) => return Err(unreachable("no session within the connect timeout".into())),
        }
        conn.resolve_namespaces(map, until).await?;
        Ok(conn)
    }

    async fn resolve_namespaces(&mut self, map: &Map, until: Instant) -> Result<(), IoError> {
        let uris = map.namespace_uris();
        if uris.is_empty() {
            return Ok(());
        }
        let array: NodeId = opcua::types::VariableId::Server_NamespaceArray.into();
        let read = self.read(&[array], until).await.map_err(|e| match e {
            IoError::Status { name, .. } => {
                IoError::Unreachable(format!("namespace array: {name}"))
            }
            other => other,
        })?;
        let names: Vec<String> = match read.first().and_then(|d| d.value.as_ref()) {
            Some(Variant::Array(a)) => a
                .values
                .iter()
                .map(|v| match v {
                    Variant::String(s) => s.as_ref().to_owned(),
                    _ => String::new(),
                })
                .collect(),
            _ => {
                return Err(IoError::Unreachable(
                    "the server's namespace array is unreadable".into(),
                ))
            }
        };
        for uri in uris {
            let Some(idx) = names.iter().position(|n| *n == uri) else {
                return Err(IoError::Unreachable(format!(
                    "the server has no namespace `{uri}`"
                )));
            };
            let idx = u16::try_from(idx)
                .map_err(|_| IoError::Unreachable("namespace index beyond 65535".into()))?;
            self.namespaces.insert(uri, idx);
        }
        Ok(())
    }

    /// Whether the session is still up (its event loop runs).
    pub fn alive(&self) -> bool {
        !self.events.is_finished()
    }

    /// The node id of a reference on this session.
    ///
    /// # Errors
    /// A namespace this session did not resolve (not expected: every URI of
    /// the map is resolved when the session opens).
    pub fn node(&self, r: &NodeRef) -> Result<NodeId, IoError> {
        let idx = match &r.ns {
            Namespace::Index(i) => *i,
            Namespace::Uri(u) => *self
                .namespaces
                .get(u)
                .ok_or_else(|| IoError::Unreachable(format!("namespace `{u}` not resolved")))?,
        };
        r.on(idx).map_err(IoError::Unreachable)
    }

    fn bound(&self, until: Instant) -> (Instant, Duration) {
        let at = until.min(Instant::now() + self.request_timeout);
        (at, at.saturating_duration_since(Instant::now()))
    }

    fn sent_error(e: &opcua::types::Error) -> IoError {
        let s = e.status();
        if matches!(
            s,
            StatusCode::BadNotConnected | StatusCode::BadConnectionClosed
        ) {
            IoError::Unreachable(status_name(s))
        } else if s == StatusCode::BadTimeout {
            IoError::Timeout(Duration::ZERO)
        } else {
            IoError::Transport(filtered(e))
        }
    }

    /// Reads the values of `nodes` in one request.
    ///
    /// # Errors
    /// The request's failure (per-node bad statuses are in the data values).
    pub async fn read(&self, nodes: &[NodeId], until: Instant) -> Result<Vec<DataValue>, IoError> {
        let (at, left) = self.bound(until);
        let ids: Vec<ReadValueId> = nodes.iter().cloned().map(ReadValueId::from).collect();
        let r = tokio::time::timeout_at(
            at.into(),
            self.session.read(&ids, TimestampsToReturn::Neither, 0.0),
        )
        .await
        .map_err(|_| IoError::Timeout(left))?
        .map_err(|e| Self::sent_error(&e))?;
        if r.len() != nodes.len() {
            return Err(IoError::Transport(format!(
                "{} values for {} nodes",
                r.len(),
                nodes.len()
            )));
        }
        Ok(r)
    }

    /// Writes one value, once.
    ///
    /// # Errors
    /// A bad status from the device, or no answer.
    pub async fn write(&self, node: NodeId, value: UaValue, until: Instant) -> Result<(), IoError> {
        let (at, left) = self.bound(until);
        let wv = WriteValue {
            node_id: node,
            attribute_id: AttributeId::Value as u32,
            index_range: Default::default(),
            value: DataValue::value_only(value.to_variant()),
        };
        let r = tokio::time::timeout_at(at.into(), self.session.write(&[wv]))
            .await
            .map_err(|_| IoError::Timeout(left))?
            .map_err(|e| Self::sent_error(&e))?;
        match r.first() {
            Some(s) if s.is_good() => Ok(()),
            Some(s) => Err(IoError::status(*s)),
            None => Err(IoError::Transport("an empty write response".into())),
        }
    }

    /// Calls a method once.
    ///
    /// # Errors
    /// A bad status from the device, or no answer.
    pub async fn call(
        &self,
        object: NodeId,
        method: NodeId,
        args: Vec<Variant>,
        until: Instant,
    ) -> Result<(), IoError> {
        let (at, left) = self.bound(until);
        let req = (object, method, Some(args)).into();
        let r = tokio::time::timeout_at(at.into(), self.session.call(vec![req]))
            .await
            .map_err(|_| IoError::Timeout(left))?
            .map_err(|e| Self::sent_error(&e))?;
        match r.first() {
            Some(res) if res.status_code.is_good() => Ok(()),
            Some(res) => Err(IoError::status(res.status_code)),
            None => Err(IoError::Transport("an empty call response".into())),
        }
    }

    /// The object a method is called on: the one the map names, else the
    /// method's parent (browsed once per session).
    ///
    /// # Errors
    /// A method with no parent object, or a failed browse.
    pub async fn object_of(
        &mut self,
        method: &NodeRef,
        object: Option<&NodeRef>,
        until: Instant,
    ) -> Result<NodeId, IoError> {
        if let Some(o) = object {
            return self.node(o);
        }
        if let Some(p) = self.parents.get(method) {
            return Ok(p.clone());
        }
        let (at, left) = self.bound(until);
        let desc = BrowseDescription {
            node_id: self.node(method)?,
            browse_direction: BrowseDirection::Inverse,
            reference_type_id: ReferenceTypeId::HasComponent.into(),
            include_subtypes: true,
            node_class_mask: 0,
            result_mask: 0,
        };
        let r = tokio::time::timeout_at(at.into(), self.session.browse(&[desc], 1, None))
            .await
            .map_err(|_| IoError::Timeout(left))?
            .map_err(|e| Self::sent_error(&e))?;
        let parent = r
            .first()
            .and_then(|b| b.references.as_ref())
            .and_then(|refs| refs.first())
            .map(|rd| rd.node_id.node_id.clone())
            .ok_or_else(|| IoError::Status {
                code: StatusCode::BadMethodInvalid.bits(),
                name: format!("no object owns `{}`", method.text),
            })?;
        self.parents.insert(method.clone(), parent.clone());
        Ok(parent)
    }
}

/// A data value as a native reading, or why it is none.
///
/// # Errors
/// A bad status, an empty value, or a type that is not a scalar.
pub fn reading(d: &DataValue) -> Result<UaValue, String> {
    let status = d.status.unwrap_or(StatusCode::Good);
    if !status.is_good() {
        return Err(format!(
            "the device refused the read: {}",
            status_name(status)
        ));
    }
    let v = d.value.as_ref().ok_or("the node has no value")?;
    UaValue::of_variant(v).ok_or_else(|| "the node holds no scalar of a mapped type".to_owned())
}
