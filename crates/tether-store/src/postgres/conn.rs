//! One connection to PostgreSQL driven synchronously from its own thread:
//! the URL and where its password comes from, connecting (and reconnecting
//! after a lost link), prepared statements, and every call bounded in time.
//!
//! `tokio-postgres` is asynchronous; the [`Store`](crate::Store) reads are
//! not, and they are called from tokio worker threads, where blocking on a
//! future would panic. So each connection owns a current-thread runtime and
//! is only ever used from a thread that is not a runtime's: the writer
//! thread, the reader thread, or a thread started for one call (`open`,
//! `migrate`, `verify`).
//!
//! Never here: what the queries are (`apply`, `read`, `schema`, `verify`).

use super::tls::{connector, hint, take_tls_params, TlsMode};
use crate::StoreError;
use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;
use tokio_postgres::config::SslMode;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, NoTls, Row, Statement};

/// Longest wait for a connection to be made (TCP, TLS, authentication).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest one statement (a read, or a batch's step) may take before the
/// call fails closed; the server is also told (`statement_timeout`).
pub(crate) const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether `url` names a PostgreSQL store (rather than a state directory).
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

fn pg_err(what: &str, e: &tokio_postgres::Error) -> StoreError {
    // The database's own message (e.g. a constraint or a permission) is
    // more telling than the driver's summary "db error".
    match e.as_db_error() {
        Some(db) => {
            StoreError::Postgres(format!("{what}: {} ({})", db.message(), db.code().code()))
        }
        None => {
            // The driver's own text is a summary ("error performing TLS
            // handshake"); the cause below it says which check refused.
            let mut text = format!("{what}: {e}");
            let mut cause = std::error::Error::source(e);
            for _ in 0..8 {
                let Some(c) = cause else { break };
                let more = c.to_string();
                if !text.ends_with(&more) {
                    text.push_str(": ");
                    text.push_str(&more);
                }
                cause = c.source();
            }
            StoreError::Postgres(text)
        }
    }
}

/// A parsed store URL, with the password taken from the environment or a
/// passfile, never from the URL (a URL shows in `ps` and in config files).
#[derive(Clone)]
pub(crate) struct PgTarget {
    pub(crate) config: Config,
    /// The TLS connector the URL's `sslmode` asks for; `None`: no TLS.
    pub(crate) tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    tls_mode: TlsMode,
    tls_root: Option<PathBuf>,
    /// The URL as given (it holds no password), for messages.
    pub(crate) shown: String,
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl PgTarget {
    /// Parses `url` (`postgres://user@host:port/dbname?options`). The
    /// password comes from `PGPASSWORD`, else from the passfile
    /// (`PGPASSFILE`, else `~/.pgpass`); a password in the URL is refused.
    pub(crate) fn parse(url: &str) -> Result<Self, StoreError> {
        if !is_postgres_url(url) {
            return Err(StoreError::Invalid(format!(
                "{url:?} is not a PostgreSQL URL (postgres://user@host:port/dbname)"
            )));
        }
        // `sslmode` and `sslrootcert` are Tether's to read (see `tls`).
        let tls = take_tls_params(url)?;
        let mut config: Config = tls
            .rest
            .parse()
            .map_err(|e| StoreError::Invalid(format!("cannot read the store URL: {e}")))?;
        if config.get_password().is_some() {
            return Err(StoreError::Invalid(
                "the store URL holds a password; give it in PGPASSWORD or a passfile (PGPASSFILE, ~/.pgpass) instead, so that it shows neither in `ps` nor in a config file".into(),
            ));
        }
        if config.get_user().is_none() {
            if let Ok(user) = std::env::var("PGUSER") {
                config.user(&user);
            }
        }
        if let Some(password) = password_from_env_or_file(&config) {
            config.password(password);
        }
        config.connect_timeout(CONNECT_TIMEOUT);
        config.application_name("tether");
        // A commit is acknowledged only once it is durable: refuse to run
        // with a server or role that turned synchronous commit off.
        // `enable_seqscan=off`: every statement here finds its rows by a key
        // or an index. A statement prepared while its table held a page or
        // two could be given a generic plan that scans the whole table (the
        // cheapest then), kept for the connection's life: the batch's
        // `= ANY($1)` lookups then read every row of a growing table, ~30 ms
        // a batch after 100,000 commands (docs/PERFORMANCE.md). With it off,
        // an index path is always preferred where one exists.
        let ms = STATEMENT_TIMEOUT.as_millis();
        config.options(format!(
            "-c synchronous_commit=on -c statement_timeout={ms} -c lock_timeout={ms} -c enable_seqscan=off"
        ));
        config.ssl_mode(if tls.mode == TlsMode::Disable {
            SslMode::Disable
        } else {
            SslMode::Require
        });
        Ok(Self {
            config,
            tls: connector(tls.mode, tls.root.clone())?,
            tls_mode: tls.mode,
            tls_root: tls.root,
            shown: url.to_owned(),
        })
    }
}

/// `PGPASSWORD`, else the first matching line of the passfile.
fn password_from_env_or_file(config: &Config) -> Option<String> {
    if let Ok(p) = std::env::var("PGPASSWORD") {
        return Some(p);
    }
    let path = std::env::var_os("PGPASSFILE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pgpass")))?;
    let text = std::fs::read_to_string(path).ok()?;
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        // libpq matches a socket directory as `localhost`.
        _ => "localhost".to_owned(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let user = config.get_user().unwrap_or_default().to_owned();
    let db = config.get_dbname().unwrap_or(user.as_str()).to_owned();
    passfile_lookup(&text, [&host, &port, &db, &user])
}

/// The password of the first line `host:port:database:user:password`
/// matching `want` (`*` matches anything; `\:` and `\\` are escapes).
pub(crate) fn passfile_lookup(text: &str, want: [&str; 4]) -> Option<String> {
    for line in text.lines().take(10_000) {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split_passfile_line(line);
        if fields.len() != 5 {
            continue;
        }
        let matches = fields
            .iter()
            .zip(want)
            .all(|(have, want)| have == "*" || have == want);
        if matches {
            return fields.into_iter().nth(4);
        }
    }
    None
}

fn split_passfile_line(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let (Some(next), Some(last)) = (chars.next(), fields.last_mut()) {
                    last.push(next);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => {
                if let Some(last) = fields.last_mut() {
                    last.push(c);
                }
            }
        }
    }
    fields
}

/// A connection used synchronously from one (non-runtime) thread.
pub(crate) struct PgConn {
    rt: tokio::runtime::Runtime,
    target: PgTarget,
    client: Option<Client>,
    statements: HashMap<&'static str, Statement>,
}

impl PgConn {
    /// Connects to `target` (failing within [`CONNECT_TIMEOUT`]).
    pub(crate) fn connect(target: PgTarget) -> Result<Self, StoreError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Io(format!("cannot start a PostgreSQL runtime: {e}")))?;
        let mut conn = Self {
            rt,
            target,
            client: None,
            statements: HashMap::new(),
        };
        conn.ensure()?;
        Ok(conn)
    }

    /// The URL it was made from.
    pub(crate) fn target(&self) -> &PgTarget {
        &self.target
    }

    /// Reconnects when the link was lost (a restarted server, a cut
    /// network): a later call may then succeed, and nothing is assumed of
    /// the lost session.
    pub(crate) fn ensure(&mut self) -> Result<(), StoreError> {
        if self.client.as_ref().is_some_and(|c| !c.is_closed()) {
            return Ok(());
        }
        self.client = None;
        self.statements.clear();
        let config = self.target.config.clone();
        let shown = self.target.shown.clone();
        let bound = CONNECT_TIMEOUT + Duration::from_secs(1);
        let made = match self.target.tls.clone() {
            None => self.rt.block_on(async move {
                let made = tokio::time::timeout(bound, config.connect(NoTls)).await;
                made.map(|r| r.map(|(client, conn)| (client, spawn_io(conn))))
            }),
            Some(tls) => self.rt.block_on(async move {
                let made = tokio::time::timeout(bound, config.connect(tls)).await;
                made.map(|r| r.map(|(client, conn)| (client, spawn_io(conn))))
            }),
        };
        let client = match made {
            Ok(Ok((client, ()))) => client,
            Ok(Err(e)) => {
                let host = match self.target.config.get_hosts().first() {
                    Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
                    _ => String::new(),
                };
                let why = hint(self.target.tls_mode, self.target.tls_root.as_deref(), &host);
                return Err(pg_err(&format!("cannot connect to {shown}{why}"), &e));
            }
            Err(_) => {
                return Err(StoreError::Postgres(format!(
                    "cannot connect to {shown}: no answer within {CONNECT_TIMEOUT:?}"
                )))
            }
        };
        self.client = Some(client);
        Ok(())
    }

    /// Forgets the connection after a failure whose effect on the session is
    /// unknown (a timeout mid-statement): the server rolls back what it had
    /// open when the socket closes, and the next call reconnects.
    pub(crate) fn drop_link(&mut self) {
        self.client = None;
        self.statements.clear();
    }

    fn no_client(&self) -> StoreError {
        StoreError::Postgres(format!("not connected to {}", self.target.shown))
    }

    /// What a call that waited on the server got: the link is dropped after
    /// anything but an answer from the server (a timeout, a broken socket),
    /// since the session's state is then unknown.
    fn settle<T>(
        &mut self,
        what: &str,
        r: Result<Result<T, tokio_postgres::Error>, tokio::time::error::Elapsed>,
    ) -> Result<T, StoreError> {
        match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                let closed = self.client.as_ref().is_none_or(Client::is_closed);
                if e.as_db_error().is_none() || closed {
                    self.drop_link();
                }
                Err(pg_err(what, &e))
            }
            Err(_) => {
                self.drop_link();
                Err(StoreError::Postgres(format!(
                    "{what}: no answer from {} within {STATEMENT_TIMEOUT:?}",
                    self.target.shown
                )))
            }
        }
    }

    /// Whether the last failure dropped the link (the next call reconnects).
    pub(crate) fn link_dropped(&self) -> bool {
        self.client.is_none()
    }

    /// The prepared statement for `sql` (prepared once per connection).
    fn statement(&mut self, sql: &'static str) -> Result<Statement, StoreError> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let client = self.client.as_ref().ok_or_else(|| self.no_client())?;
        let r = wait(&self.rt, client.prepare(sql));
        let st = self.settle("preparing a statement", r)?;
        self.statements.insert(sql, st.clone());
        Ok(st)
    }

    /// Runs statements given as plain text (no parameters), e.g. `BEGIN`.
    pub(crate) fn batch(&mut self, sql: &str) -> Result<(), StoreError> {
        let client = self.client.as_ref().ok_or_else(|| self.no_client())?;
        let r = wait(&self.rt, client.batch_execute(sql));
        self.settle("running a statement", r)
    }

    /// The rows of `sql` with `params`.
    pub(crate) fn query(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let st = self.statement(sql)?;
        let client = self.client.as_ref().ok_or_else(|| self.no_client())?;
        let r = wait(&self.rt, client.query(&st, params));
        self.settle("querying", r)
    }

    /// The number of rows `sql` changed.
    pub(crate) fn execute(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let st = self.statement(sql)?;
        let client = self.client.as_ref().ok_or_else(|| self.no_client())?;
        let r = wait(&self.rt, client.execute(&st, params));
        self.settle("writing", r)
    }

    /// `COMMIT`, telling a refusal by the server (nothing stored) from a
    /// lost answer (perhaps stored: [`StoreError::Indeterminate`]).
    pub(crate) fn commit(&mut self) -> Result<(), StoreError> {
        let client = self.client.as_ref().ok_or_else(|| self.no_client())?;
        let r = wait(&self.rt, client.batch_execute("COMMIT"));
        match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) if e.as_db_error().is_some() => Err(pg_err("committing", &e)),
            _ => {
                self.drop_link();
                Err(StoreError::Indeterminate(format!(
                    "the link to {} was lost while COMMIT was in flight; the batch may or may not be stored",
                    self.target.shown
                )))
            }
        }
    }
}

/// A parameter a pipeline's statement owns (or borrows from the plan it
/// writes), so that a batch's statements can be gathered before one is sent.
pub(crate) type Param<'a> = Box<dyn ToSql + Sync + 'a>;

/// Statements sent together in one round trip (see [`PgConn::pipeline`]).
#[derive(Default)]
pub(crate) struct Pipeline<'a> {
    steps: Vec<(&'static str, Vec<Param<'a>>)>,
}

impl<'a> Pipeline<'a> {
    pub(crate) fn push(&mut self, sql: &'static str, params: Vec<Param<'a>>) {
        self.steps.push((sql, params));
    }

    pub(crate) fn len(&self) -> usize {
        self.steps.len()
    }
}

/// What one statement of a pipeline got: its rows, or the server's refusal
/// (a `db_error`), or a lost link.
pub(crate) type StepResult = Result<Vec<Row>, tokio_postgres::Error>;

impl PgConn {
    /// Sends every statement of `p` at once and waits for all answers (one
    /// round trip instead of one a statement; tokio-postgres writes the
    /// requests of futures polled together back to back, in the order they
    /// are first polled, and `join_all` polls in order). The server runs them
    /// one after another as if sent singly; after a refusal the rest of an
    /// open transaction is refused too (`25P02`) and a `COMMIT` rolls back.
    /// The answers are in the order of the statements; the outer error is a
    /// link lost or silent past [`STATEMENT_TIMEOUT`] (the link is then
    /// dropped: what the server did of the pipeline is unknown).
    /// `statements` are `p`'s, from [`Self::prepare`] (called apart so that a
    /// caller can tell a failure to prepare, when nothing was sent, from a
    /// lost answer).
    pub(crate) fn pipeline(
        &mut self,
        p: &Pipeline<'_>,
        statements: &[Statement],
    ) -> Result<Vec<StepResult>, StoreError> {
        if statements.len() != p.steps.len() {
            return Err(StoreError::Invalid(
                "a pipeline's statements were not prepared for it".into(),
            ));
        }
        let client = self.client.as_ref().ok_or_else(|| self.no_client())?;
        let params: Vec<Vec<&(dyn ToSql + Sync)>> = p
            .steps
            .iter()
            .map(|(_, ps)| {
                ps.iter()
                    .map(|b| b.as_ref() as &(dyn ToSql + Sync))
                    .collect()
            })
            .collect();
        let calls = statements
            .iter()
            .zip(&params)
            .map(|(st, ps)| client.query(st, ps.as_slice()));
        let answers = wait(&self.rt, futures_util::future::join_all(calls));
        match answers {
            Ok(all) => {
                if all
                    .iter()
                    .any(|r| r.as_ref().is_err_and(|e| e.as_db_error().is_none()))
                    || self.client.as_ref().is_none_or(Client::is_closed)
                {
                    self.drop_link();
                }
                Ok(all)
            }
            Err(_) => {
                self.drop_link();
                Err(StoreError::Postgres(format!(
                    "a batch of statements: no answer from {} within {STATEMENT_TIMEOUT:?}",
                    self.target.shown
                )))
            }
        }
    }

    /// Prepares (once per link) every statement of `p`; nothing is run.
    pub(crate) fn prepare(&mut self, p: &Pipeline<'_>) -> Result<Vec<Statement>, StoreError> {
        let mut statements = Vec::with_capacity(p.steps.len());
        for (sql, _) in &p.steps {
            statements.push(self.statement(sql)?);
        }
        Ok(statements)
    }

    /// The error of a statement of a pipeline, as [`Self::query`] reports it.
    pub(crate) fn step_error(what: &str, e: &tokio_postgres::Error) -> StoreError {
        pg_err(what, e)
    }
}

/// Drives a connection's I/O on the runtime it was made on, whenever a call
/// blocks on it (called inside that runtime).
fn spawn_io<F>(connection: F)
where
    F: Future + Send + 'static,
{
    tokio::spawn(async move {
        let _ = connection.await;
    });
}

/// Blocks on `fut` within [`STATEMENT_TIMEOUT`] (never called on a runtime's thread).
fn wait<F: Future>(
    rt: &tokio::runtime::Runtime,
    fut: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    rt.block_on(async { tokio::time::timeout(STATEMENT_TIMEOUT, fut).await })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passfile_lines_match_with_wildcards_and_escapes() {
        let text = "# comment\n\
                    db.example:5432:tether:other:nope\n\
                    db.example:*:tether:tether:pa\\:ss\\\\word\n\
                    *:*:*:*:fallback\n";
        assert_eq!(
            passfile_lookup(text, ["db.example", "5433", "tether", "tether"]).as_deref(),
            Some("pa:ss\\word")
        );
        assert_eq!(
            passfile_lookup(text, ["elsewhere", "5432", "x", "y"]).as_deref(),
            Some("fallback")
        );
        assert_eq!(passfile_lookup("a:b:c\n", ["a", "b", "c", "d"]), None);
    }

    #[test]
    fn a_url_with_a_password_or_of_another_scheme_is_refused() {
        assert!(matches!(
            PgTarget::parse("postgres://u:pw@localhost/db"),
            Err(StoreError::Invalid(_))
        ));
        assert!(matches!(
            PgTarget::parse("/var/lib/tether"),
            Err(StoreError::Invalid(_))
        ));
        assert!(PgTarget::parse("postgresql://u@localhost:5433/db").is_ok());
    }
}
