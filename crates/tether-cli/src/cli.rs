//! The command line itself: every subcommand, flag, default and help text
//! (clap derive). Parsing only; what each command does lives in its module.
//!
//! The doc comments on variants and fields are the help text clap prints.
//! The types themselves carry none: on `Cli` one would become part of
//! `tether --help`.

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "tether",
    version,
    about = "The governed path between AI agents and machines. A software envelope, not a safety-rated channel: keep an independent hardware e-stop."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Serve JSON-RPC and/or MCP over HTTP (built-in simulated cell when no --config is given).
    Serve {
        /// Endpoint config (TOML).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where evidence, latches, budgets and receipts persist.
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// A PostgreSQL store shared by a fleet (`postgres://user@host:port/db`;
        /// the password from PGPASSWORD or a passfile, never in the URL).
        /// Default: the config's `store`, else the SQLite store in the state directory.
        #[arg(long, value_name = "URL", env = "TETHER_STORE_URL")]
        store: Option<String>,
        /// Serve JSON-RPC on standard input/output, one JSON value per line.
        #[arg(long, conflicts_with = "http")]
        stdio: bool,
        /// Serve JSON-RPC over HTTP at ADDR (POST /rpc); port 0 picks a free port.
        #[arg(long, value_name = "ADDR")]
        http: Option<String>,
        /// Serve MCP over streamable HTTP at ADDR (path /mcp); port 0 picks a free port.
        #[arg(long, value_name = "ADDR", conflicts_with = "stdio")]
        mcp_http: Option<String>,
        /// Serve a non-loopback --http/--mcp-http address without
        /// [[principals]]: anyone who reaches it can command the devices.
        /// Only for an isolated network; configure principals instead.
        #[arg(long)]
        insecure_no_auth: bool,
        /// A `hardware` or `hybrid` device another live endpoint owns (its
        /// lease on the shared store holds): wait up to SECONDS for it
        /// instead of refusing to start (without a value: up to a day).
        #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "86400")]
        wait_for_devices: Option<u64>,
    },
    /// Serve MCP on standard input/output (what an MCP client launches).
    Mcp {
        /// Endpoint config (TOML).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where evidence, latches, budgets and receipts persist.
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// A PostgreSQL store shared by a fleet (`postgres://user@host:port/db`;
        /// the password from PGPASSWORD or a passfile, never in the URL).
        /// Default: the config's `store`, else the SQLite store in the state directory.
        #[arg(long, value_name = "URL", env = "TETHER_STORE_URL")]
        store: Option<String>,
        /// Environment variable holding this caller's bearer token (needed
        /// when principals are configured; never pass a token as a flag).
        #[arg(long, value_name = "NAME", default_value = "TETHER_TOKEN")]
        token_env: String,
        /// A `hardware` or `hybrid` device another live endpoint owns (its
        /// lease on the shared store holds): wait up to SECONDS for it
        /// instead of refusing to start (without a value: up to a day).
        #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "86400")]
        wait_for_devices: Option<u64>,
        /// Bridge to a running endpoint instead of starting one: its MCP
        /// URL (`http://HOST:PORT/mcp` of `tether serve --mcp-http`). Every
        /// call is decided by that endpoint's kernel, with this caller's token.
        #[arg(long, value_name = "URL", conflicts_with_all = ["config", "state_dir"])]
        endpoint: Option<String>,
    },
    /// Check a config (or a single device manifest, or a `.cedar` policy
    /// against the built-in cell) and print every defect. A config's policy is
    /// validated too.
    Check {
        /// Config, manifest or policy file.
        file: PathBuf,
        /// Print the Tether Cedar schema policies are validated against.
        #[arg(long)]
        schema: bool,
    },
    /// Operators: list, approve or deny held commands on a running endpoint
    /// (the operator's token comes from TETHER_TOKEN).
    Approvals {
        #[command(subcommand)]
        action: ApprovalAction,
        /// The endpoint's JSON-RPC URL (of `tether serve --http ADDR`).
        #[arg(
            long,
            global = true,
            env = "TETHER_ENDPOINT",
            default_value = "http://127.0.0.1:7878/rpc"
        )]
        endpoint: String,
    },
    /// Print a device's reference file (limits with units and sources, safety).
    Describe {
        /// Device id.
        device: String,
        /// Endpoint config (TOML); the built-in cell when absent.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Print reference.json instead of Markdown.
        #[arg(long)]
        json: bool,
    },
    /// Read every mapped field, interlock and watchdog point of a network
    /// device from the live device, in declared units beside the raw native
    /// values. Writes nothing: how to check a register map before letting an
    /// agent near the machine.
    Probe {
        /// Device id.
        device: String,
        /// Endpoint config (TOML) that serves the device.
        #[arg(long)]
        config: PathBuf,
        /// Bound on connecting and on each read, in ms.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=60_000))]
        timeout_ms: u64,
    },
    /// Export or verify the evidence chain.
    Audit {
        #[command(subcommand)]
        action: AuditAction,
    },
    /// Manage a PostgreSQL store: create or upgrade its schema, or copy an
    /// embedded store into it.
    Store {
        #[command(subcommand)]
        action: StoreAction,
    },
    /// The fleet on a store: endpoints alive with their devices, last
    /// heartbeats, device owners, latches, arming and open operations.
    Fleet {
        #[command(subcommand)]
        action: FleetAction,
    },
    /// The evidence signing key (ed25519) of a state directory: with one,
    /// endpoints sign checkpoints of the chain.
    Keys {
        #[command(subcommand)]
        action: KeysAction,
    },
    /// Trip the governed stop from a shell: every endpoint on the state
    /// directory latches (one device, or all). Works with no endpoint running.
    Estop {
        /// Only this device (default: every device).
        #[arg(long)]
        device: Option<String>,
        /// State directory shared with the endpoints.
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// The fleet's PostgreSQL store (instead of a state directory).
        #[arg(long, value_name = "URL", env = "TETHER_STORE_URL")]
        store: Option<String>,
        /// Why (recorded in the evidence).
        #[arg(long, default_value = "tether estop from a shell")]
        reason: String,
    },
    /// Ask a running endpoint to reset a device's latch (operator command).
    Reset {
        /// Device to reset.
        #[arg(long)]
        device: String,
        /// The endpoint's JSON-RPC URL (of `tether serve --http ADDR`).
        #[arg(
            long,
            env = "TETHER_ENDPOINT",
            default_value = "http://127.0.0.1:7878/rpc"
        )]
        endpoint: String,
        /// Why (recorded in the evidence).
        #[arg(long, default_value = "operator reset from a shell")]
        reason: String,
    },
    /// Arm hardware actuation of a hardware or hybrid device (operator only,
    /// token in TETHER_TOKEN).
    Arm {
        /// Device to arm.
        #[arg(long)]
        device: String,
        /// The endpoint's JSON-RPC URL (of `tether serve --http ADDR`).
        #[arg(
            long,
            env = "TETHER_ENDPOINT",
            default_value = "http://127.0.0.1:7878/rpc"
        )]
        endpoint: String,
        /// Why (recorded in the evidence).
        #[arg(long, default_value = "armed by an operator from a shell")]
        reason: String,
    },
    /// Disarm hardware actuation of a hardware or hybrid device.
    Disarm {
        /// Device to disarm.
        #[arg(long)]
        device: String,
        /// The endpoint's JSON-RPC URL (of `tether serve --http ADDR`).
        #[arg(
            long,
            env = "TETHER_ENDPOINT",
            default_value = "http://127.0.0.1:7878/rpc"
        )]
        endpoint: String,
        /// Why (recorded in the evidence).
        #[arg(long, default_value = "disarmed from a shell")]
        reason: String,
    },
    /// Simulator controls (for people and tests, never reachable by a model).
    Sim {
        #[command(subcommand)]
        action: SimAction,
    },
    /// Print the MHS error-code registry as Markdown.
    Codes,
    /// Tokens for `[[principals]]`.
    Token {
        #[command(subcommand)]
        action: TokenAction,
    },
}

#[derive(Subcommand)]
pub enum TokenAction {
    /// Print a fresh random token (give it to the caller, e.g. in its
    /// TETHER_TOKEN) and the `token_sha256` line for the config (which
    /// keeps only the digest).
    New,
}

#[derive(Subcommand)]
pub enum ApprovalAction {
    /// List approvals (operators see all, others their own).
    List {
        /// Only this status.
        #[arg(long, value_parser = ["pending", "approved", "denied", "used", "expired", "revoked"])]
        status: Option<String>,
    },
    /// Show one approval.
    Get {
        /// Approval id.
        id: String,
    },
    /// Vote to approve.
    Approve {
        /// Approval id.
        id: String,
        /// Why (recorded in the evidence).
        #[arg(long, default_value = "approved from a shell")]
        reason: String,
    },
    /// Deny (final).
    Deny {
        /// Approval id.
        id: String,
        /// Why (recorded in the evidence).
        #[arg(long, default_value = "denied from a shell")]
        reason: String,
    },
}

#[derive(Subcommand)]
pub enum SimAction {
    /// Run the simulated arm as a separate controller process (leased commands
    /// over a line protocol; docs/SIM_PROTOCOL.md). Point a `remote.arm` device at it.
    Serve {
        /// Address to listen on; port 0 picks a free port and prints it.
        #[arg(long, default_value = "127.0.0.1:7879")]
        listen: String,
    },
    /// Print the external simulator's arm status (positions, moving, last stop).
    Status {
        /// The simulator's address.
        #[arg(long, default_value = "127.0.0.1:7879")]
        connect: String,
    },
    /// Open or close a simulated door contact (the `door` interlock of arm-1):
    /// of the built-in cell on a state directory, or with `--connect` of an
    /// external simulator (`tether sim serve`).
    Door {
        /// `open` or `close`.
        #[arg(value_parser = ["open", "close"])]
        state: String,
        /// Device whose door it is (built-in cell).
        #[arg(long, default_value = "arm-1")]
        device: String,
        /// State directory of the endpoint (built-in cell).
        #[arg(long, conflicts_with = "connect")]
        state_dir: Option<PathBuf>,
        /// The external simulator's address: set its door instead.
        #[arg(long)]
        connect: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum KeysAction {
    /// Create the signing key (mode 0600) and print its public key and key id.
    Init {
        /// State directory (where the store is).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Replace an existing key (as `tether keys rotate`).
        #[arg(long)]
        rotate: bool,
    },
    /// Replace the signing key with a new one; the old public key stays in
    /// the public-keys file, so older checkpoints still verify.
    Rotate {
        /// State directory.
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
    /// Print the public key and key id again.
    Show {
        /// State directory.
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Print every public key the directory had (its public-keys file).
        #[arg(long)]
        all: bool,
    },
}

#[derive(Subcommand)]
pub enum AuditAction {
    /// Write the chain as JSON Lines to standard output.
    Export {
        /// State directory.
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// A PostgreSQL store (instead of a state directory).
        #[arg(long, value_name = "URL", env = "TETHER_STORE_URL")]
        store: Option<String>,
        /// Only a slice: from the signed checkpoint at or before SEQ to the
        /// head; it verifies on its own with the public key.
        #[arg(long, value_name = "SEQ", conflicts_with = "follow")]
        since: Option<u64>,
        /// Keep going: after the chain so far, print each entry as it
        /// commits (each line carries its `hash` and `prev_hash`, so a
        /// receiver can check continuity); no seal line. Ends on a closed
        /// output or Ctrl-C.
        #[arg(long)]
        follow: bool,
        /// With --follow: start after entry SEQ (a shipper that already has
        /// entries up to SEQ).
        #[arg(long, value_name = "SEQ", requires = "follow")]
        after: Option<u64>,
    },
    /// Verify a chain (and, with public keys, every checkpoint signature);
    /// exit 1 naming the first broken entry.
    Verify {
        /// State directory to verify.
        #[arg(long, conflicts_with = "file")]
        state_dir: Option<PathBuf>,
        /// A PostgreSQL store to verify (instead of a state directory).
        #[arg(long, value_name = "URL", env = "TETHER_STORE_URL")]
        store: Option<String>,
        /// Exported JSON Lines file to verify (`-`: standard input).
        #[arg(long)]
        file: Option<PathBuf>,
        /// A public key (`ed25519:<hex>`, as `tether keys show` prints) to
        /// check checkpoints with; repeat for retired keys.
        #[arg(long, value_name = "KEY")]
        pubkey: Vec<String>,
        /// A public-keys file (one key a line, as `tether keys show --all`).
        #[arg(long, value_name = "FILE")]
        pubkey_file: Vec<PathBuf>,
        /// A checkpoint saved earlier (`tether audit checkpoint`): the chain
        /// must still hold it, so it was not cut back before it.
        #[arg(long, value_name = "FILE")]
        checkpoint: Option<PathBuf>,
        /// Fail when entries follow the last signed checkpoint.
        #[arg(long)]
        require_signed_tail: bool,
        /// An archive file `tether audit archive` wrote from this store;
        /// give every one: each must verify, together they must hold seq 1
        /// up to the store's start, linked, the newest the one the store
        /// records (its sha256). Not with --file.
        #[arg(long, value_name = "FILE", conflicts_with = "file")]
        archive: Vec<PathBuf>,
    },
    /// Move the entries before a signed checkpoint into a verified export
    /// file and remove them from the store, which then verifies from that
    /// checkpoint on. The file is written, fsynced and verified before
    /// anything is removed; receipts stay, so a past command_id never runs
    /// again.
    Archive {
        /// Archive up to the head signed by the newest checkpoint entry at
        /// or before SEQ.
        #[arg(long, value_name = "SEQ")]
        before: u64,
        /// The archive file to create (never overwritten).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// State directory (its store, and its public keys unless given).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// A PostgreSQL store (instead of a state directory's).
        #[arg(long, value_name = "URL", env = "TETHER_STORE_URL")]
        store: Option<String>,
        /// A public key to check the checkpoint with (default: the state
        /// directory's public-keys file); repeat for retired keys.
        #[arg(long, value_name = "KEY")]
        pubkey: Vec<String>,
        /// A public-keys file (one key a line, as `tether keys show --all`).
        #[arg(long, value_name = "FILE")]
        pubkey_file: Vec<PathBuf>,
    },
    /// Print the newest signed checkpoint (the file beside the store).
    Checkpoint {
        /// State directory.
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
pub enum FleetAction {
    /// Print the fleet's state as the store holds it (no endpoint needed).
    Status {
        /// State directory (the SQLite store shared by this host's endpoints).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// The fleet's PostgreSQL store.
        #[arg(long, value_name = "URL", env = "TETHER_STORE_URL")]
        store: Option<String>,
        /// One JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum StoreAction {
    /// Create the schema of a PostgreSQL store, or upgrade it to this
    /// build's version (endpoints refuse a version they do not know).
    Migrate {
        /// The store (`postgres://user@host:port/db`; the password from
        /// PGPASSWORD or a passfile).
        #[arg(long, value_name = "URL", env = "TETHER_STORE_URL")]
        store: String,
    },
    /// Move an embedded store's state (chain, receipts, latches, approvals,
    /// budgets, revisions, open operations, invocations) into a PostgreSQL
    /// store that holds nothing yet; verified before and after it commits.
    /// Refused while an endpoint has the state directory open.
    Copy {
        /// The state directory whose `tether.db` is copied (left unchanged).
        #[arg(long, value_name = "DIR")]
        from: PathBuf,
        /// The PostgreSQL store (made by `tether store migrate`, still empty).
        #[arg(long, value_name = "URL")]
        to: String,
    },
}
