//! The node map: what an `opcua` manifest's `[driver_config]` says, read
//! into types and checked against the manifest it belongs to.
//!
//! **Owns:** the config's shape (serde, unknown keys refused), its defaults,
//! the security settings (policy, mode, user, PKI directory), method calls as
//! target steps, and the OPC UA side of the mapping defects `tether check`
//! reports; the defects every protocol shares are `crate::mapping`'s.
//! **Never here:** I/O (`session`, `tasks`), decisions.

use super::node::{Node, NodeRef, RawNode, VarType};
use crate::mapping::{self, MapDefect, RawInterlock, RawWatchdog, RawWriteParts, Source};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tether_core::manifest::DeviceManifest;

/// Connect timeout when the config names none (a session takes four round
/// trips: endpoints, channel, session, activation).
const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 3000;
/// Request timeout when the config names none.
const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 1000;
/// Poll period of the state mirror when the config names none.
const POLL_MS_DEFAULT: u64 = 100;
/// Freshness bound of the mirror when the config names none.
const STALE_MS_DEFAULT: u64 = 1000;
/// The most arguments a mapped method call takes.
const ARGS_MAX: usize = 16;

/// `[driver_config]` of an `opcua` device, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    endpoint: String,
    security: Option<String>,
    security_mode: Option<String>,
    username: Option<String>,
    password_env: Option<String>,
    pki_dir: Option<String>,
    #[serde(default)]
    trust_server_certs: bool,
    connect_timeout_ms: Option<u64>,
    request_timeout_ms: Option<u64>,
    poll_ms: Option<u64>,
    stale_ms: Option<u64>,
    #[serde(default)]
    fields: BTreeMap<String, BTreeMap<String, RawNode>>,
    #[serde(default)]
    targets: BTreeMap<String, Vec<RawStep>>,
    #[serde(default)]
    stop: Vec<RawStep>,
    #[serde(default)]
    interlocks: BTreeMap<String, RawInterlock<RawNode>>,
    watchdog: Option<RawWatchdog<RawNode>>,
}

/// One step of a target or of the stop, as written: a write (`field` or
/// `point`, with `input` or `value`) or a method call (`call`, `object`?,
/// `args`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStep {
    field: Option<String>,
    point: Option<RawNode>,
    input: Option<String>,
    value: Option<Value>,
    call: Option<String>,
    object: Option<String>,
    args: Option<Vec<RawArg>>,
}

/// A method argument as written: its type and an input or a constant.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawArg {
    #[serde(rename = "type")]
    data_type: String,
    input: Option<String>,
    value: Option<Value>,
}

/// The security policy of the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// No signing, no encryption.
    None,
    /// Basic256Sha256: signed, or signed and encrypted.
    Basic256Sha256,
}

/// Message security mode under Basic256Sha256.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// None (with [`Policy::None`]).
    None,
    /// Signed.
    Sign,
    /// Signed and encrypted.
    SignAndEncrypt,
}

/// A method argument.
#[derive(Debug, Clone)]
pub struct Arg {
    /// Its built-in type.
    pub data_type: VarType,
    /// Where its value comes from.
    pub source: Source,
}

/// A mapped method call.
#[derive(Debug, Clone)]
pub struct Call {
    /// The method node.
    pub method: NodeRef,
    /// The object it is called on; `None`: the method's parent, found by
    /// browsing on each connection.
    pub object: Option<NodeRef>,
    /// Its input arguments, in order.
    pub args: Vec<Arg>,
}

/// One step of a target or of the stop.
#[derive(Debug, Clone)]
pub enum Step {
    /// A variable written.
    Write(mapping::Write<Node>),
    /// A method called.
    Call(Call),
}

impl Step {
    /// How receipts name it.
    pub fn label(&self) -> String {
        match self {
            Step::Write(w) => w.label.clone(),
            Step::Call(c) => format!("{}()", c.method.text),
        }
    }
}

impl mapping::Step for Step {
    fn inputs(&self) -> Vec<(&str, Option<&str>)> {
        match self {
            Step::Write(w) => mapping::Step::inputs(w),
            Step::Call(c) => c
                .args
                .iter()
                .filter_map(|a| match &a.source {
                    Source::Input(n) => Some((n.as_str(), None)),
                    Source::Constant(_) => None,
                })
                .collect(),
        }
    }
}

/// A mapped field.
pub type Field = mapping::Field<Node>;

/// A checked map, ready for the driver.
#[derive(Debug, Clone)]
pub struct Map {
    /// `opc.tcp://host:port[/path]`.
    pub endpoint: String,
    /// Security policy.
    pub policy: Policy,
    /// Message security mode.
    pub mode: Mode,
    /// User name and the variable holding the password, if not anonymous.
    pub user: Option<(String, String)>,
    /// Where the client's certificate and key live (and trusted server
    /// certificates), for Basic256Sha256.
    pub pki_dir: Option<PathBuf>,
    /// Trust a server certificate on first sight (else it must be in
    /// `pki_dir/trusted`).
    pub trust_server_certs: bool,
    /// Bound on opening a session.
    pub connect_timeout: Duration,
    /// Bound on one request.
    pub request_timeout: Duration,
    /// Period of the state mirror.
    pub poll: Duration,
    /// Age after which a mirrored reading is unknown.
    pub stale: Duration,
    /// resource id → fields.
    pub resources: BTreeMap<String, Vec<Field>>,
    /// target → ordered steps.
    pub targets: BTreeMap<String, Vec<Step>>,
    /// The native stop's steps.
    pub stop: Vec<Step>,
    /// Interlocks.
    pub interlocks: Vec<mapping::Interlock<Node>>,
    /// The watchdog, if mapped.
    pub watchdog: Option<mapping::Watchdog<Node>>,
}

impl Map {
    /// Reads and checks a manifest's map, every defect at once.
    ///
    /// # Errors
    /// Every defect found.
    pub fn of(manifest: &DeviceManifest) -> Result<Map, Vec<MapDefect>> {
        mapping::load(manifest, resolve)
    }

    /// [`Map::of`] with its defects joined, for building a driver or a probe.
    ///
    /// # Errors
    /// Every defect, joined.
    pub fn load(manifest: &DeviceManifest) -> Result<Map, String> {
        Map::of(manifest).map_err(|d| mapping::joined(&d))
    }

    /// The fields of a resource.
    pub fn fields(&self, resource: &str) -> &[Field] {
        self.resources.get(resource).map_or(&[], Vec::as_slice)
    }

    /// Every distinct node the mirror polls: fields, interlocks.
    pub fn polled(&self) -> Vec<Node> {
        mapping::polled(&self.resources, &self.interlocks, |a, b| a.node == b.node)
    }

    /// Every namespace URI the map names (resolved on each connection).
    pub fn namespace_uris(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut add = |r: &NodeRef| {
            if let super::node::Namespace::Uri(u) = &r.ns {
                if !out.contains(u) {
                    out.push(u.clone());
                }
            }
        };
        for f in self.resources.values().flatten() {
            add(&f.point.node);
        }
        for i in &self.interlocks {
            add(&i.point.node);
        }
        if let Some(w) = &self.watchdog {
            add(&w.point.node);
        }
        for s in self.targets.values().flatten().chain(&self.stop) {
            match s {
                Step::Write(w) => add(&w.point.node),
                Step::Call(c) => {
                    add(&c.method);
                    if let Some(o) = &c.object {
                        add(o);
                    }
                }
            }
        }
        out
    }
}

fn resolve(raw: &RawConfig, m: &DeviceManifest, defects: &mut Vec<MapDefect>) -> Map {
    check_endpoint(&raw.endpoint, defects);
    let (policy, mode) = security(raw, defects);
    let user = user(raw, defects);
    let ms = mapping::ms;
    let (poll, stale) = mapping::poll_and_stale(
        ms(raw.poll_ms, POLL_MS_DEFAULT, "poll_ms", defects),
        ms(raw.stale_ms, STALE_MS_DEFAULT, "stale_ms", defects),
        defects,
    );
    let resources = mapping::resolve_fields(&raw.fields, m, defects);
    let targets = mapping::resolve_targets(&raw.targets, m, &resources, defects, step);
    let stop = mapping::resolve_stop(&raw.stop, m, &resources, defects, step);
    let interlocks = mapping::resolve_interlocks(&raw.interlocks, m, defects);
    let watchdog = mapping::resolve_watchdog(raw.watchdog.as_ref(), m, &resources, defects);
    Map {
        endpoint: raw.endpoint.clone(),
        policy,
        mode,
        user,
        pki_dir: raw.pki_dir.as_ref().map(PathBuf::from),
        trust_server_certs: raw.trust_server_certs,
        connect_timeout: ms(
            raw.connect_timeout_ms,
            CONNECT_TIMEOUT_MS_DEFAULT,
            "connect_timeout_ms",
            defects,
        ),
        request_timeout: ms(
            raw.request_timeout_ms,
            REQUEST_TIMEOUT_MS_DEFAULT,
            "request_timeout_ms",
            defects,
        ),
        poll,
        stale,
        resources,
        targets,
        stop,
        interlocks,
        watchdog,
    }
}

fn check_endpoint(endpoint: &str, defects: &mut Vec<MapDefect>) {
    let ok = endpoint
        .strip_prefix("opc.tcp://")
        .and_then(|rest| rest.split('/').next())
        .and_then(|hostport| hostport.rsplit_once(':'))
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !ok {
        defects.push((
            "driver_config.endpoint".into(),
            format!("`{endpoint}` is not opc.tcp://HOST:PORT[/PATH]"),
        ));
    }
}

fn security(raw: &RawConfig, defects: &mut Vec<MapDefect>) -> (Policy, Mode) {
    let policy = match raw
        .security
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("none") => Policy::None,
        Some("basic256sha256") => Policy::Basic256Sha256,
        Some(other) => {
            defects.push((
                "driver_config.security".into(),
                format!("unknown security policy `{other}` (known: none, basic256sha256)"),
            ));
            Policy::None
        }
    };
    let mode = match (policy, raw.security_mode.as_deref()) {
        (Policy::None, None) => Mode::None,
        (Policy::None, Some(_)) => {
            defects.push((
                "driver_config.security_mode".into(),
                "security `none` has no message security mode".into(),
            ));
            Mode::None
        }
        (Policy::Basic256Sha256, None | Some("sign_and_encrypt")) => Mode::SignAndEncrypt,
        (Policy::Basic256Sha256, Some("sign")) => Mode::Sign,
        (Policy::Basic256Sha256, Some(other)) => {
            defects.push((
                "driver_config.security_mode".into(),
                format!("unknown mode `{other}` (known: sign, sign_and_encrypt)"),
            ));
            Mode::SignAndEncrypt
        }
    };
    if policy == Policy::Basic256Sha256 && raw.pki_dir.is_none() {
        defects.push((
            "driver_config.pki_dir".into(),
            "Basic256Sha256 needs a directory for the client's certificate and key (created when missing)".into(),
        ));
    }
    (policy, mode)
}

fn user(raw: &RawConfig, defects: &mut Vec<MapDefect>) -> Option<(String, String)> {
    match (&raw.username, &raw.password_env) {
        (None, None) => None,
        (Some(u), Some(env)) if !u.is_empty() && !env.is_empty() => Some((u.clone(), env.clone())),
        _ => {
            defects.push((
                "driver_config.username".into(),
                "a user needs both `username` and `password_env` (the variable holding the password; never the password itself)".into(),
            ));
            None
        }
    }
}

fn step(w: &RawStep, at: &str, fields: &[Field], defects: &mut Vec<MapDefect>) -> Option<Step> {
    let Some(method) = &w.call else {
        if w.object.is_some() || w.args.is_some() {
            defects.push((
                at.to_owned(),
                "`object` and `args` belong to a method `call`".into(),
            ));
            return None;
        }
        let parts = RawWriteParts {
            field: w.field.as_deref(),
            point: w.point.as_ref(),
            input: w.input.as_deref(),
            value: w.value.as_ref(),
        };
        return mapping::resolve_write(parts, at, fields, defects).map(Step::Write);
    };
    if w.field.is_some() || w.point.is_some() || w.input.is_some() || w.value.is_some() {
        defects.push((
            at.to_owned(),
            "a method `call` takes `object` and `args`, not `field`, `point`, `input` or `value`"
                .into(),
        ));
        return None;
    }
    call(method, w, at, defects).map(Step::Call)
}

fn call(method: &str, w: &RawStep, at: &str, defects: &mut Vec<MapDefect>) -> Option<Call> {
    let before = defects.len();
    let method = NodeRef::parse(method)
        .map_err(|e| defects.push((format!("{at}.call"), e)))
        .ok();
    let object = match &w.object {
        None => None,
        Some(o) => NodeRef::parse(o)
            .map_err(|e| defects.push((format!("{at}.object"), e)))
            .ok(),
    };
    let raw_args = w.args.as_deref().unwrap_or_default();
    if raw_args.len() > ARGS_MAX {
        defects.push((
            format!("{at}.args"),
            format!("at most {ARGS_MAX} arguments"),
        ));
    }
    let args: Vec<Arg> = raw_args
        .iter()
        .enumerate()
        .filter_map(|(k, a)| arg(a, &format!("{at}.args[{k}]"), defects))
        .collect();
    if defects.len() > before {
        return None;
    }
    Some(Call {
        method: method?,
        object,
        args,
    })
}

fn arg(a: &RawArg, at: &str, defects: &mut Vec<MapDefect>) -> Option<Arg> {
    let Some(data_type) = VarType::parse(&a.data_type) else {
        defects.push((
            format!("{at}.type"),
            format!("unknown type `{}`", a.data_type),
        ));
        return None;
    };
    let probe = arg_point(data_type, at);
    let source = mapping::write_source(&probe, a.input.as_deref(), a.value.as_ref(), at, defects)?;
    Some(Arg { data_type, source })
}

/// A method argument as a unit-less point of its type, for encoding.
pub fn arg_point(data_type: VarType, label: &str) -> Node {
    Node {
        node: NodeRef {
            ns: super::node::Namespace::Index(0),
            ident: String::new(),
            text: label.to_owned(),
        },
        data_type,
        scale: 1.0,
        offset: 0.0,
        native_unit: None,
        field_unit: None,
    }
}
