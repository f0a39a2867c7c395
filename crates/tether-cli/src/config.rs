//! The endpoint config file (TOML) and turning it into a loaded cell.

use serde::Deserialize;
use std::path::{Path, PathBuf};
use tether_kernel::loader::{self, Cell, Defect, ManifestSource, OverlaySource};

/// The endpoint config. Unknown keys are refused so a typo never drops a setting.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// Endpoint id (default `tether-local`).
    #[serde(default)]
    pub endpoint_id: Option<String>,
    /// State directory, relative to the config file.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// A PostgreSQL store shared by a fleet (`postgres://user@host:port/db`,
    /// no password in it); default: the SQLite store in the state directory.
    #[serde(default)]
    pub store: Option<String>,
    /// Serve the built-in simulated cell as well.
    #[serde(default)]
    pub builtin_cell: bool,
    /// Device manifest files (TOML or JSON), relative to the config file.
    #[serde(default)]
    pub devices: Vec<PathBuf>,
    /// Operator overlay (`site-limits.json`), relative to the config file.
    #[serde(default)]
    pub overlay: Option<PathBuf>,
    /// Principals and their bearer tokens; none means one local agent.
    #[serde(default)]
    pub principals: Vec<PrincipalConfig>,
    /// The ControlPolicy (Cedar), relative to the config file; the built-in
    /// default policy when absent.
    #[serde(default)]
    pub policy: Option<PathBuf>,
    /// How long an approval stays open, seconds (default 3600).
    #[serde(default)]
    pub approval_ttl_s: Option<u64>,
    /// Whether hardware and hybrid devices start armed (default true: armed
    /// unless an operator disarmed them). `false`: every start begins
    /// disarmed, and an operator arms each device (`tether arm`).
    #[serde(default)]
    pub hardware_armed_at_start: Option<bool>,
    /// The network listeners (`--http`, `--mcp-http`): Host and Origin,
    /// TLS, the header-read timeout, the connection bounds and the MCP
    /// session bounds (`[http]`).
    #[serde(default)]
    pub http: HttpConfig,
    /// The bounds per caller the kernel keeps (`[limits]`, `bounds.rs`).
    #[serde(default)]
    pub limits: crate::bounds::LimitsConfig,
    /// The operator console's public URL (`http://host:port/console/`): MCP
    /// hosts that support URL elicitation are sent its page for a held call
    /// (a stdio `tether mcp` serves no console but knows where it is).
    #[serde(default)]
    pub console_url: Option<String>,
    /// Signed checkpoints of the evidence chain (`[evidence]`, `evidence.rs`).
    #[serde(default)]
    pub evidence: crate::evidence::EvidenceConfig,
    /// Traces over OTLP and who may read `GET /metrics` (`[telemetry]`,
    /// `telemetry.rs`, docs/TELEMETRY.md).
    #[serde(default)]
    pub telemetry: crate::telemetry::TelemetryConfig,
    /// This endpoint among others on one store (`[fleet]`, `fleet.rs`).
    #[serde(default)]
    pub fleet: FleetConfig,
}

/// The `[fleet]` table: the leases and the governed stop's bound. Every key
/// is optional; unknown keys are refused.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetConfig {
    /// How long this endpoint's leases (its own, and one per physical
    /// device) last without a renewal, ms (default 5000; renewed every third).
    pub lease_ms: Option<u64>,
    /// The governed stop's guaranteed bound, ms (default 250): unable to
    /// read the stop for longer, the endpoint aborts its physical calls and
    /// refuses new ones until it can.
    pub stop_bound_ms: Option<u64>,
    /// How long a start waits for a device another endpoint owns, seconds
    /// (default 0: refuse at once; `--wait-for-devices` overrides).
    pub wait_for_devices_s: Option<u64>,
}

/// The `[http]` table: how the network listeners (`--http`, `--mcp-http`)
/// meet the network. Every key is optional; unknown keys are refused. The
/// listener defaults are in `tether_server::listener`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Host names (or addresses) the endpoint is also reached by, beyond its
    /// listen address: `name` (on the listen port, or without a port through
    /// a proxy) or `name:port`. Default: none.
    pub public_names: Vec<String>,
    /// Browser origins allowed to call, beyond the endpoint's own
    /// (`https://console.lab.example`). Default: none.
    pub allowed_origins: Vec<String>,
    /// Certificate chain (PEM), relative to the config file; with `tls_key`,
    /// every listener speaks TLS.
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of `tls_cert`, relative to the config file.
    pub tls_key: Option<PathBuf>,
    /// How long a client may take to send a request's headers (and a TLS
    /// handshake), and a keep-alive connection may idle, in ms (default 10000).
    pub header_read_timeout_ms: Option<u64>,
    /// Connections open at once, in total (default 1024).
    pub connections_max: Option<usize>,
    /// Connections open at once from one peer address (default 256, and at
    /// most `connections_max`).
    pub connections_per_peer_max: Option<usize>,
    /// MCP HTTP sessions on the endpoint, at most (default 512).
    pub mcp_sessions_max: Option<usize>,
    /// MCP HTTP sessions of one principal, at most (default 32; at most half
    /// of `mcp_sessions_max`).
    pub mcp_sessions_per_principal_max: Option<usize>,
}

/// The edge's `[http]` keys, read (`tether_server::edge`).
///
/// # Errors
/// Every entry that cannot be read, as a defect naming `http.KEY[i]`.
pub fn edge(
    loaded: &Loaded,
    origin: &Path,
) -> Result<tether_server::edge::EdgeConfig, Vec<Defect>> {
    read_edge(origin, &loaded.config.http)
}

fn read_edge(
    file: &Path,
    http: &HttpConfig,
) -> Result<tether_server::edge::EdgeConfig, Vec<Defect>> {
    tether_server::edge::EdgeConfig::parse(&http.public_names, &http.allowed_origins).map_err(
        |defects| {
            defects
                .into_iter()
                .map(|(field, message)| Defect {
                    file: file.display().to_string(),
                    device: "-".into(),
                    field: format!("http.{field}"),
                    message,
                })
                .collect()
        },
    )
}

/// A `[[principals]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrincipalConfig {
    /// Stable id.
    pub id: String,
    /// human, agent or service.
    pub kind: String,
    /// Roles (`operator`, humans only).
    #[serde(default)]
    pub roles: Vec<String>,
    /// SHA-256 of the token, hex (the token itself is never written down).
    #[serde(default)]
    pub token_sha256: Option<String>,
    /// Name of the environment variable that holds the token.
    #[serde(default)]
    pub token_env: Option<String>,
}

/// Builds the authenticator from `[[principals]]`; every defect is reported.
///
/// # Errors
/// Duplicate ids, bad kinds or roles, a token given neither or both ways, a
/// malformed digest, an unset token variable.
pub fn authenticator(
    loaded: &Loaded,
    origin: &Path,
) -> Result<tether_server::auth::Authenticator, Vec<Defect>> {
    use tether_server::auth::{principal, token_digest, Authenticator, Credential};
    let mut defects = Vec::new();
    let mut creds = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    for (i, p) in loaded.config.principals.iter().enumerate() {
        let field = |f: &str| Defect {
            file: origin.display().to_string(),
            device: "-".into(),
            field: format!("principals[{i}].{f}"),
            message: String::new(),
        };
        let mut bad = |f: &str, m: String| {
            let mut d = field(f);
            d.message = m;
            defects.push(d);
        };
        if !ids.insert(p.id.clone()) {
            bad("id", format!("principal `{}` declared twice", p.id));
        }
        let who = match principal(&p.id, &p.kind, &p.roles) {
            Ok(w) => w,
            Err(e) => {
                bad("kind", e);
                continue;
            }
        };
        let digest = match (&p.token_sha256, &p.token_env) {
            (Some(hexd), None) => match hex::decode(hexd.trim()) {
                Ok(bytes) if bytes.len() == 32 => {
                    let mut d = [0u8; 32];
                    d.copy_from_slice(&bytes);
                    d
                }
                _ => {
                    bad(
                        "token_sha256",
                        "must be 64 hex characters (the SHA-256 of the token)".into(),
                    );
                    continue;
                }
            },
            (None, Some(var)) => match std::env::var(var) {
                Ok(t) if !t.is_empty() => token_digest(&t),
                // A process needs only the tokens it is given: an agent's
                // `tether mcp` never holds the operator's. The principal is
                // still known (its decisions and approvals show), its token
                // just cannot authenticate here.
                _ => {
                    eprintln!(
                        "tether: principal `{}`: `{var}` is not set in this process, so that principal's token is not accepted here",
                        p.id
                    );
                    continue;
                }
            },
            _ => {
                bad(
                    "token_sha256",
                    "give exactly one of token_sha256 or token_env".into(),
                );
                continue;
            }
        };
        // One token, one principal: a shared token would authenticate as
        // whichever is listed first, so the other could never sign in, or an
        // agent's token would be an operator's credential.
        if let Some(first) = creds
            .iter()
            .find(|c: &&Credential| c.token_sha256 == digest)
        {
            bad(
                "token_sha256",
                format!(
                    "principal `{}` has the same token as `{}`; every principal needs its own",
                    p.id, first.principal.id
                ),
            );
            continue;
        }
        creds.push(Credential {
            principal: who,
            token_sha256: digest,
        });
    }
    if defects.is_empty() {
        Ok(if loaded.config.principals.is_empty() {
            Authenticator::open()
        } else {
            // Principals configured: tokens required even if none of them
            // is usable in this process.
            Authenticator::new(creds)
        })
    } else {
        Err(defects)
    }
}

/// What `serve`, `check` and `describe` work from.
pub struct Loaded {
    pub config: EndpointConfig,
    pub base: PathBuf,
    pub manifests: Vec<ManifestSource>,
    pub overlay: Option<OverlaySource>,
    /// The policy file as (path shown in messages, Cedar text).
    pub policy: Option<(String, String)>,
}

fn defect(file: &Path, message: String) -> Defect {
    Defect {
        file: file.display().to_string(),
        device: "-".into(),
        field: "-".into(),
        message,
    }
}

/// Longest an approval may stay open: a week.
pub const APPROVAL_TTL_S_MAX: u64 = 7 * 86_400;

/// Reads a config (or, with none, the built-in cell).
///
/// # Errors
/// Unreadable or malformed files, each as a defect.
pub fn read(path: Option<&Path>) -> Result<Loaded, Vec<Defect>> {
    let Some(path) = path else {
        return Ok(builtin());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| vec![defect(path, format!("cannot read: {e}"))])?;
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    // A file with a top-level device_id is a single manifest: check it alone.
    if looks_like_manifest(&text, path) {
        return Ok(Loaded {
            config: EndpointConfig::default(),
            base,
            manifests: vec![ManifestSource {
                origin: path.display().to_string(),
                text,
            }],
            overlay: None,
            policy: None,
        });
    }
    let config: EndpointConfig =
        toml::from_str(&text).map_err(|e| vec![defect(path, e.to_string())])?;
    read_listed_files(path, config, base)
}

/// The built-in cell, served when no config is given.
fn builtin() -> Loaded {
    Loaded {
        config: EndpointConfig {
            builtin_cell: true,
            ..EndpointConfig::default()
        },
        base: PathBuf::from("."),
        manifests: tether_drivers::builtin_cell(),
        overlay: None,
        policy: None,
    }
}

/// Checks a parsed config at `path` and reads the files it lists (manifests,
/// overlay, policy) relative to `base`; every defect is reported.
fn read_listed_files(
    path: &Path,
    config: EndpointConfig,
    base: PathBuf,
) -> Result<Loaded, Vec<Defect>> {
    let mut manifests = if config.builtin_cell {
        tether_drivers::builtin_cell()
    } else {
        Vec::new()
    };
    let mut defects = Vec::new();
    if let Err(bad) = read_edge(path, &config.http) {
        defects.extend(bad);
    }
    for (field, message) in config.telemetry.defects() {
        defects.push(Defect {
            field,
            ..defect(path, message)
        });
    }
    for (field, message) in config.evidence.defects() {
        defects.push(Defect {
            field,
            ..defect(path, message)
        });
    }
    if let Some(ttl) = config.approval_ttl_s {
        if !(1..=APPROVAL_TTL_S_MAX).contains(&ttl) {
            defects.push(defect(
                path,
                format!(
                    "approval_ttl_s = {ttl}: must be between 1 and {APPROVAL_TTL_S_MAX} (seconds)"
                ),
            ));
        }
    }
    defects.extend(http_defects(path, &config.http));
    if let Some(u) = &config.console_url {
        // Validated and remembered here: both `serve` and `mcp` load the
        // config through this one path.
        if let Err(e) = tether_server::mcp::set_console_url(u) {
            defects.push(defect(path, e));
        }
    }
    for message in crate::bounds::defects(&config) {
        defects.push(defect(path, message));
    }
    for rel in &config.devices {
        if let Some((origin, text)) = read_relative(&base, rel, "device manifest", &mut defects) {
            manifests.push(ManifestSource { origin, text });
        }
    }
    let overlay = config
        .overlay
        .as_ref()
        .and_then(|rel| read_relative(&base, rel, "overlay", &mut defects))
        .map(|(origin, text)| OverlaySource { origin, text });
    let policy = config
        .policy
        .as_ref()
        .and_then(|rel| read_relative(&base, rel, "policy", &mut defects));
    if manifests.is_empty() && defects.is_empty() {
        defects.push(defect(
            path,
            "the config serves no device: list `devices` or set `builtin_cell = true`".into(),
        ));
    }
    if defects.is_empty() {
        Ok(Loaded {
            config,
            base,
            manifests,
            overlay,
            policy,
        })
    } else {
        Err(defects)
    }
}

/// Largest `connections_max` the config accepts (the open-files limit is
/// checked again when the endpoint starts).
pub const CONNECTIONS_MAX_LIMIT: usize = 1 << 20;

/// What is wrong with the `[http]` table: TLS files given both or neither,
/// and each bound within its range.
fn http_defects(path: &Path, http: &HttpConfig) -> Vec<Defect> {
    use tether_server::listener::HEADER_READ_TIMEOUT_MS_MAX;
    let mut defects = Vec::new();
    if http.tls_cert.is_some() != http.tls_key.is_some() {
        defects.push(defect(
            path,
            "[http] tls_cert and tls_key go together: give both (TLS) or neither (plain HTTP)"
                .into(),
        ));
    }
    if let Some(ms) = http.header_read_timeout_ms {
        if !(1..=HEADER_READ_TIMEOUT_MS_MAX).contains(&ms) {
            defects.push(defect(
                path,
                format!("[http] header_read_timeout_ms = {ms}: must be between 1 and {HEADER_READ_TIMEOUT_MS_MAX}"),
            ));
        }
    }
    if let Some(n) = http.connections_max {
        if !(1..=CONNECTIONS_MAX_LIMIT).contains(&n) {
            defects.push(defect(
                path,
                format!(
                    "[http] connections_max = {n}: must be between 1 and {CONNECTIONS_MAX_LIMIT}"
                ),
            ));
        }
    }
    if let Some(n) = http.connections_per_peer_max {
        let max = http
            .connections_max
            .unwrap_or(tether_server::listener::CONNECTIONS_MAX_DEFAULT);
        if !(1..=max).contains(&n) {
            defects.push(defect(
                path,
                format!("[http] connections_per_peer_max = {n}: must be between 1 and connections_max ({max})"),
            ));
        }
    }
    defects
}

/// Reads `base/rel` as (path shown in messages, text); an unreadable file is
/// a defect (`cannot read {what}: ...`) and `None`.
fn read_relative(
    base: &Path,
    rel: &Path,
    what: &str,
    defects: &mut Vec<Defect>,
) -> Option<(String, String)> {
    let p = base.join(rel);
    match std::fs::read_to_string(&p) {
        Ok(text) => Some((p.display().to_string(), text)),
        Err(e) => {
            defects.push(defect(&p, format!("cannot read {what}: {e}")));
            None
        }
    }
}

fn looks_like_manifest(text: &str, path: &Path) -> bool {
    if path.extension().is_some_and(|e| e == "json") {
        return text.contains("\"device_id\"");
    }
    toml::from_str::<toml::Value>(text)
        .ok()
        .and_then(|v| v.get("device_id").cloned())
        .is_some()
}

/// Loads the cell and checks that every device has a driver.
///
/// # Errors
/// Every defect found.
pub fn load_cell(loaded: &Loaded) -> Result<Cell, Vec<Defect>> {
    let cell = loader::load(&loaded.manifests, loaded.overlay.as_ref())?;
    let mut defects = Vec::new();
    for d in &cell.devices {
        if !tether_drivers::KINDS.contains(&d.manifest.driver.as_str()) {
            defects.push(Defect {
                file: d.origin.clone(),
                device: d.manifest.device_id.clone(),
                field: "driver".into(),
                message: format!(
                    "unknown driver kind `{}` (known: {})",
                    d.manifest.driver,
                    tether_drivers::KINDS.join(", ")
                ),
            });
        }
        // The register map (or topic or node map) of a network driver.
        for (field, message) in tether_drivers::check_map(&d.manifest) {
            defects.push(Defect {
                file: d.origin.clone(),
                device: d.manifest.device_id.clone(),
                field,
                message,
            });
        }
    }
    if defects.is_empty() {
        Ok(cell)
    } else {
        Err(defects)
    }
}

/// The state directory: the flag, else the config's, else `$TETHER_STATE_DIR`,
/// else `$XDG_STATE_HOME/tether`, else `$HOME/.local/state/tether`, else
/// `./.tether-state`.
pub fn state_dir(flag: Option<&Path>, loaded: Option<&Loaded>) -> PathBuf {
    if let Some(f) = flag {
        return f.to_path_buf();
    }
    if let Some(l) = loaded {
        if let Some(d) = &l.config.state_dir {
            return l.base.join(d);
        }
    }
    if let Some(d) = std::env::var_os("TETHER_STATE_DIR").filter(|v| !v.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(d).join("tether");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(h).join(".local/state/tether");
    }
    PathBuf::from(".tether-state")
}
