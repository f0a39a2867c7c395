//! The writer's side of the PostgreSQL store: the backend the group-commit
//! writer drives. One batch is one transaction that first locks the
//! `chain_head` row — so the writers of every endpoint on the store take
//! turns and extend one chain — then decides each commit's conflicts against
//! what is stored and what the batch's earlier commits did, seals the
//! entries, and writes the whole batch in a constant number of statements
//! (arrays, `UNNEST`), whatever its size.
//!
//! A commit that conflicts writes nothing, so no savepoint is needed: every
//! conflict is decided before any row is written, under the lock, in
//! submission order, exactly as the SQLite writer decides it.
//!
//! Never here: validation or serialisation of a commit (`prepare`), reads.

use super::conn::{Param, PgConn, Pipeline};
use super::head::{col, load_head, Head};
use crate::chain::seal;
use crate::prepare::Prepared;
use crate::writer::{Backend, Job};
use crate::{BudgetRow, CommitAck, StoreError};
use std::collections::{HashMap, HashSet};

/// A batch's opening statements (see `PgBackend::begin`).
const LOCK_HEAD: &str = "SELECT seq, hash FROM chain_head WHERE id = 1 FOR UPDATE";
const LOOKUP_RECEIPTS: &str = "SELECT command_id FROM receipts WHERE command_id = ANY($1)";
const LOOKUP_OPEN_OPS: &str = "SELECT command_id FROM open_ops WHERE command_id = ANY($1)";
const LOOKUP_RESERVATIONS: &str =
    "SELECT reservation_id FROM budget WHERE reservation_id = ANY($1)";

/// How soon a batch's opening must fail for a new link to be tried at once:
/// a link found dead is refused in well under this, a hung one much later.
const RETRY_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// The ids a batch names whose stored state decides its conflicts.
struct Named {
    /// Command ids of receipts and of operations opened.
    ids: Vec<String>,
    /// Command ids of operations opened.
    ops: Vec<String>,
    /// Reservation ids of budget draws.
    draws: Vec<String>,
}

impl Named {
    fn of(batch: &[Job]) -> Self {
        let mut n = Self {
            ids: Vec::new(),
            ops: Vec::new(),
            draws: Vec::new(),
        };
        for job in batch {
            let c = &job.commit;
            n.ids
                .extend(c.receipts.iter().map(|r| r.row.command_id.clone()));
            n.ids
                .extend(c.open_ops.iter().map(|(op, _)| op.command_id.clone()));
            n.ops
                .extend(c.open_ops.iter().map(|(op, _)| op.command_id.clone()));
            n.draws
                .extend(c.budget_draws.iter().map(|b| b.reservation_id.clone()));
        }
        n
    }
}

/// The writer's backend: its own connection and the chain head it extends.
pub(super) struct PgBackend {
    pg: PgConn,
    head: Head,
    scratch: String,
}

impl PgBackend {
    pub(super) fn new(pg: PgConn, head: Head) -> Self {
        Self {
            pg,
            head,
            scratch: String::with_capacity(256),
        }
    }
}

impl Backend for PgBackend {
    fn apply_batch(
        &mut self,
        batch: &[Job],
        ts_ms: u64,
        results: &mut Vec<Result<CommitAck, StoreError>>,
    ) -> Result<(), StoreError> {
        let saved = self.head.clone();
        let outcome = self
            .pg
            .ensure()
            .and_then(|()| self.try_batch(batch, ts_ms, results));
        if outcome.is_err() {
            // Nothing of the batch may be reported stored: undo the
            // transaction (a no-op on a dropped link, where the server rolls
            // back itself) and the head advanced by it. The next batch
            // re-reads the head under the lock whatever happened.
            let _ = self.pg.batch("ROLLBACK");
            self.head = saved;
            results.clear();
        }
        outcome
    }
}

/// A `String`-keyed map that keeps the last value set and the first-seen
/// order: a batch's upserts, where a later commit overwrites an earlier one.
struct LastWins<V> {
    index: HashMap<String, usize>,
    rows: Vec<(String, V)>,
}

impl<V> Default for LastWins<V> {
    fn default() -> Self {
        Self {
            index: HashMap::new(),
            rows: Vec::new(),
        }
    }
}

impl<V> LastWins<V> {
    fn set(&mut self, key: &str, v: V) {
        match self.index.get(key) {
            Some(&i) => self.rows[i].1 = v,
            None => {
                self.index.insert(key.to_owned(), self.rows.len());
                self.rows.push((key.to_owned(), v));
            }
        }
    }

    fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        let i = *self.index.get(key)?;
        self.rows.get_mut(i).map(|r| &mut r.1)
    }
}

/// What the stored state already holds of the ids a batch names.
#[derive(Default)]
struct Known {
    receipts: HashSet<String>,
    /// Whether each named command's operation is open now (in the batch's order).
    open: HashMap<String, bool>,
    reservations: HashSet<String>,
}

/// Everything a batch writes, gathered in submission order.
#[derive(Default)]
struct Plan {
    ev_seq: Vec<i64>,
    ev_hash: Vec<String>,
    ev_line: Vec<String>,
    rc_seq: Vec<i64>,
    rc_id: Vec<String>,
    rc_digest: Vec<String>,
    revisions: HashMap<(String, String), i64>,
    latches: LastWins<(bool, String)>,
    draws: LastWins<BudgetRow>,
    /// Releases of reservations stored before the batch.
    released_before: Vec<String>,
    /// `Some(info)` open, `None` closed.
    open_ops: LastWins<Option<String>>,
    /// `(record, created_seq, updated_seq)`.
    approvals: LastWins<(String, i64, i64)>,
    /// `(info, seq)`: exactly one is set.
    invocations: LastWins<(Option<String>, Option<i64>)>,
}

fn to_db(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v)
        .map_err(|_| StoreError::Corrupt(format!("{v} exceeds PostgreSQL's bigint range")))
}

fn conflict(c: &Prepared, known: &Known) -> Option<StoreError> {
    for r in &c.receipts {
        if known.receipts.contains(&r.row.command_id) {
            return Some(StoreError::Conflict(format!(
                "a receipt for command_id {:?} is already stored",
                r.row.command_id
            )));
        }
    }
    // A command id is dispatched once per store, whichever endpoint runs it.
    for (op, _) in &c.open_ops {
        let id = &op.command_id;
        if known.receipts.contains(id) || known.open.get(id).copied().unwrap_or(false) {
            return Some(StoreError::Conflict(format!(
                "command_id {id:?} already ran or is running on this store"
            )));
        }
    }
    for b in &c.budget_draws {
        if known.reservations.contains(&b.reservation_id) {
            return Some(StoreError::Conflict(format!(
                "budget reservation {:?} is already stored",
                b.reservation_id
            )));
        }
    }
    None
}

impl PgBackend {
    fn try_batch(
        &mut self,
        batch: &[Job],
        ts_ms: u64,
        results: &mut Vec<Result<CommitAck, StoreError>>,
    ) -> Result<(), StoreError> {
        let began = std::time::Instant::now();
        let mut known = match self.begin(batch) {
            Ok(known) => known,
            // An idle link found dead at once (a restarted server): the
            // server rolls back what it saw of the opening, so one new link
            // may start the batch. A link lost after a wait is not retried,
            // so that a hung server costs one bound, not two.
            Err(_) if self.pg.link_dropped() && began.elapsed() < RETRY_WITHIN => {
                self.pg.ensure()?;
                self.begin(batch)?
            }
            Err(e) => return Err(e),
        };
        let mut plan = Plan::default();
        for job in batch {
            let c = &job.commit;
            if let Some(e) = conflict(c, &known) {
                results.push(Err(e));
                continue;
            }
            if let Some(e) = self.over_cap(c, &plan)? {
                results.push(Err(e));
                continue;
            }
            if !c.leases.is_empty() {
                // Decided and written at once, under the head lock: a later
                // commit of the batch sees this one's leases.
                if let Err(e) = self.apply_leases(c)? {
                    results.push(Err(e));
                    continue;
                }
            }
            results.push(self.plan_commit(c, ts_ms, &mut known, &mut plan));
        }
        // A failure to plan (a number out of range) fails the batch.
        if let Some(Err(e)) = results.iter().find(|r| {
            !matches!(
                r,
                Ok(_)
                    | Err(StoreError::Conflict(_)
                        | StoreError::BudgetExceeded(_)
                        | StoreError::LeaseHeld(_))
            )
        }) {
            return Err(e.clone());
        }
        self.finish(&plan, announce(batch, results))
    }

    /// Opens the batch's transaction in one round trip: `BEGIN`, the head
    /// row's lock (waiting for another endpoint's batch to finish), and what
    /// is stored of the receipts, operations and reservations the batch
    /// names (the server runs the lookups after the lock is taken).
    fn begin(&mut self, batch: &[Job]) -> Result<Known, StoreError> {
        let named = Named::of(batch);
        let mut p = Pipeline::default();
        p.push("BEGIN", Vec::new());
        p.push(LOCK_HEAD, Vec::new());
        let lookups = [
            (!named.ids.is_empty()).then_some(LOOKUP_RECEIPTS),
            (!named.ops.is_empty()).then_some(LOOKUP_OPEN_OPS),
            (!named.draws.is_empty()).then_some(LOOKUP_RESERVATIONS),
        ];
        for (sql, ids) in lookups.iter().zip([named.ids, named.ops, named.draws]) {
            if let Some(sql) = sql {
                p.push(sql, vec![boxed(ids)]);
            }
        }
        let mut answers = Vec::with_capacity(p.len());
        let statements = self.pg.prepare(&p)?;
        for a in self.pg.pipeline(&p, &statements)? {
            answers.push(a.map_err(|e| PgConn::step_error("opening a batch", &e))?);
        }
        let mut rows = answers.into_iter().skip(1);
        self.continue_from(rows.next().unwrap_or_default())?;
        let mut known = Known::default();
        for sql in lookups.into_iter().flatten() {
            for row in rows.next().unwrap_or_default() {
                let id = text(&row, 0)?;
                match sql {
                    LOOKUP_RECEIPTS => known.receipts.insert(id),
                    LOOKUP_OPEN_OPS => known.open.insert(id, true).is_none(),
                    _ => known.reservations.insert(id),
                };
            }
        }
        Ok(known)
    }

    /// Writes the plan, moves the head row, announces the change when the
    /// batch stored a latch or an approval, and commits — one round trip.
    /// A refusal of any statement rolls the whole batch back (nothing
    /// stored); an answer lost with the `COMMIT` in flight is
    /// [`StoreError::Indeterminate`].
    fn finish(&mut self, plan: &Plan, announce: bool) -> Result<(), StoreError> {
        let mut p = Pipeline::default();
        write_plan(&mut p, plan)?;
        if announce {
            // Wakes the governed-stop watchers of every endpoint (LISTEN),
            // delivered only if this transaction commits.
            p.push("SELECT pg_notify('tether_change', '')", Vec::new());
        }
        p.push(
            "UPDATE chain_head SET seq = $1, hash = $2, batches = batches + 1 WHERE id = 1",
            vec![boxed(to_db(self.head.seq)?), boxed(self.head.hash.clone())],
        );
        p.push("COMMIT", Vec::new());
        // Statements are prepared (once per link) before anything is sent,
        // so a failure to prepare stores nothing.
        let statements = self.pg.prepare(&p)?;
        let answers = match self.pg.pipeline(&p, &statements) {
            Ok(a) => a,
            Err(_) => return Err(self.lost_commit()),
        };
        let Some((commit, writes)) = answers.split_last() else {
            return Err(self.lost_commit());
        };
        // The first refusal: the server rolled the transaction back.
        if let Some(e) = writes
            .iter()
            .filter_map(|a| a.as_ref().err())
            .find(|e| e.as_db_error().is_some())
        {
            return Err(PgConn::step_error("writing a batch", e));
        }
        match commit {
            Ok(_) if writes.iter().all(Result::is_ok) => Ok(()),
            Err(e) if e.as_db_error().is_some() => Err(PgConn::step_error("committing", e)),
            _ => Err(self.lost_commit()),
        }
    }

    fn lost_commit(&mut self) -> StoreError {
        self.pg.drop_link();
        StoreError::Indeterminate(format!(
            "the link to {} was lost while COMMIT was in flight; the batch may or may not be stored",
            self.pg.target().shown
        ))
    }

    /// Continues from the head the locked row names: another endpoint may
    /// have appended since this writer's last batch.
    fn continue_from(&mut self, rows: Vec<tokio_postgres::Row>) -> Result<(), StoreError> {
        let row = rows
            .first()
            .ok_or_else(|| StoreError::Corrupt("the chain_head row is missing".into()))?;
        let seq: i64 = row
            .try_get(0)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let hash: String = row
            .try_get(1)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        if to_db(self.head.seq)? == seq && self.head.hash == hash {
            return Ok(());
        }
        if seq > to_db(self.head.seq)? {
            self.head = load_head(&mut self.pg)?;
            return Ok(());
        }
        Err(StoreError::Corrupt(format!(
            "the database chain head (seq {seq}) is behind this writer's (seq {}): entries were removed",
            self.head.seq
        )))
    }

    /// The refusal of a commit's first capped draw that does not fit (see
    /// [`crate::BudgetCap`]): the key's stored, unreleased draws in the
    /// window plus those this batch already planned and this commit's
    /// earlier ones. Every endpoint's batch holds the head row's lock
    /// (`begin`) while it sums and writes, so endpoints on the store
    /// take turns and draw from one ledger. Releases planned earlier in the
    /// batch of rows stored before it are not subtracted: that over-counts,
    /// which refuses, never over-draws.
    fn over_cap(&mut self, c: &Prepared, plan: &Plan) -> Result<Option<StoreError>, StoreError> {
        for (i, d) in c.budget_draws.iter().enumerate() {
            let Some(cap) = &d.cap else { continue };
            let from_ms = cap.counts_from_ms(d.ts_ms).unwrap_or(0);
            let from_db = i64::try_from(from_ms).unwrap_or(i64::MAX);
            let rows = self.pg.query(
                "SELECT COALESCE(SUM(amount), 0.0)::float8 FROM budget
                 WHERE key = $1 AND ts_ms >= $2 AND NOT released",
                &[&d.key, &from_db],
            )?;
            let stored: f64 = match rows.first() {
                Some(r) => col(r, 0)?,
                None => 0.0,
            };
            let counts = |e: &&BudgetRow| e.key == d.key && e.ts_ms >= from_ms && !e.released;
            let planned: f64 = plan
                .draws
                .rows
                .iter()
                .map(|(_, e)| e)
                .filter(counts)
                .map(|e| e.amount)
                .sum();
            let earlier: f64 = c.budget_draws[..i]
                .iter()
                .filter(counts)
                .map(|e| e.amount)
                .sum();
            if let Err(e) = cap.check(d, stored + planned + earlier) {
                return Ok(Some(e));
            }
        }
        Ok(None)
    }

    /// Adds one commit that does not conflict to the plan: its entries
    /// sealed onto the chain, its rows gathered.
    fn plan_commit(
        &mut self,
        c: &Prepared,
        ts_ms: u64,
        known: &mut Known,
        plan: &mut Plan,
    ) -> Result<CommitAck, StoreError> {
        let first_seq = self.head.seq + 1;
        for e in &c.events {
            let seq = self.head.seq + 1;
            let sealed = seal(
                seq,
                ts_ms,
                &e.kind_json,
                &e.body_json,
                &self.head.hash,
                &mut self.scratch,
            );
            plan.ev_seq.push(to_db(seq)?);
            plan.ev_hash.push(sealed.hash.clone());
            plan.ev_line.push(sealed.line);
            self.head = Head {
                seq,
                hash: sealed.hash,
            };
        }
        let head_seq = to_db(self.head.seq)?;
        for r in &c.receipts {
            // prepare() checked that `event` indexes this commit's events.
            plan.rc_seq.push(to_db(first_seq + r.row.event as u64)?);
            plan.rc_id.push(r.row.command_id.clone());
            plan.rc_digest.push(r.row.input_digest.clone());
            known.receipts.insert(r.row.command_id.clone());
        }
        for r in &c.revisions {
            let slot = plan
                .revisions
                .entry((r.device_id.clone(), r.resource.clone()))
                .or_insert(0);
            *slot = (*slot).max(to_db(r.revision)?);
        }
        for l in &c.latches {
            plan.latches
                .set(&l.row.device_id, (l.row.latched, l.info_json.clone()));
        }
        plan_budget(c, known, plan);
        for (op, info) in &c.open_ops {
            plan.open_ops.set(&op.command_id, Some(info.clone()));
            known.open.insert(op.command_id.clone(), true);
        }
        for id in &c.closed_ops {
            plan.open_ops.set(id, None);
            known.open.insert(id.clone(), false);
        }
        for (a, record) in &c.approvals {
            match plan.approvals.get_mut(&a.approval_id) {
                // Created earlier in the batch: keep where it was created.
                Some(row) => *row = (record.clone(), row.1, head_seq),
                None => plan
                    .approvals
                    .set(&a.approval_id, (record.clone(), head_seq, head_seq)),
            }
        }
        for (id, info) in &c.invocations {
            plan.invocations.set(id, (Some(info.clone()), None));
        }
        for r in &c.invocation_refs {
            let seq = to_db(first_seq + r.event as u64)?;
            plan.invocations.set(&r.invocation_id, (None, Some(seq)));
        }
        Ok(CommitAck {
            first_seq,
            last_seq: self.head.seq,
            head_hash: self.head.hash.clone(),
        })
    }
}

impl PgBackend {
    /// Decides a commit's leases against the stored rows and writes them
    /// (see [`crate::lease`]); the inner error refuses this commit alone.
    fn apply_leases(&mut self, c: &Prepared) -> Result<Result<(), StoreError>, StoreError> {
        let now_rows = self.pg.query(
            "SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint",
            &[],
        )?;
        let now: i64 = match now_rows.first() {
            Some(r) => col(r, 0)?,
            None => {
                return Err(StoreError::Corrupt(
                    "the server's clock did not answer".into(),
                ))
            }
        };
        let now_ms = u64::try_from(now).unwrap_or(0);
        for (d, _) in &c.leases {
            let rows = self.pg.query(
                "SELECT holder, renewed_ms, until_ms, info FROM leases WHERE key = $1 FOR UPDATE",
                &[&d.key],
            )?;
            let stored = match rows.first() {
                Some(r) => Some(crate::LeaseRow {
                    key: d.key.clone(),
                    holder: col(r, 0)?,
                    renewed_ms: u64::try_from(col::<i64>(r, 1)?).unwrap_or(0),
                    until_ms: u64::try_from(col::<i64>(r, 2)?).unwrap_or(0),
                    info: serde_json::from_str(&col::<String>(r, 3)?).unwrap_or_default(),
                }),
                None => None,
            };
            if let Err(e) = crate::lease::decide_hold(d, stored.as_ref(), now_ms) {
                return Ok(Err(e));
            }
        }
        for (d, info) in &c.leases {
            match &d.op {
                crate::LeaseOp::Hold { lease_ms, .. } => {
                    let until = to_db(now_ms.saturating_add(*lease_ms))?;
                    self.pg.execute(
                        "INSERT INTO leases(key, holder, renewed_ms, until_ms, info) VALUES ($1, $2, $3, $4, $5)
                         ON CONFLICT(key) DO UPDATE SET holder = excluded.holder, renewed_ms = excluded.renewed_ms,
                             until_ms = excluded.until_ms, info = excluded.info",
                        &[&d.key, &d.holder, &now, &until, info],
                    )?;
                }
                crate::LeaseOp::Release => {
                    self.pg.execute(
                        "DELETE FROM leases WHERE key = $1 AND holder = $2",
                        &[&d.key, &d.holder],
                    )?;
                }
            }
        }
        Ok(Ok(()))
    }
}

/// Whether a batch changed what the governed-stop watchers read: a latch
/// (a trip, a reset, arming) or an approval stored by one of its commits.
fn announce(batch: &[Job], results: &[Result<CommitAck, StoreError>]) -> bool {
    batch.iter().zip(results).any(|(job, r)| {
        r.is_ok() && (!job.commit.latches.is_empty() || !job.commit.approvals.is_empty())
    })
}

/// A commit's budget draws and releases: a release of a reservation drawn
/// earlier in the batch (or in the same commit) marks the draw; any other is
/// of a row stored before the batch (or of none: a no-op).
fn plan_budget(c: &Prepared, known: &mut Known, plan: &mut Plan) {
    for b in &c.budget_draws {
        plan.draws.set(&b.reservation_id, b.clone());
        known.reservations.insert(b.reservation_id.clone());
    }
    for id in &c.budget_releases {
        match plan.draws.get_mut(id) {
            Some(draw) => draw.released = true,
            None => plan.released_before.push(id.clone()),
        }
    }
}

fn text(row: &tokio_postgres::Row, i: usize) -> Result<String, StoreError> {
    row.try_get(i)
        .map_err(|e| StoreError::Corrupt(format!("unexpected column: {e}")))
}

fn boxed<'a, T: tokio_postgres::types::ToSql + Sync + 'a>(v: T) -> Param<'a> {
    Box::new(v)
}

/// Writes a batch's plan: one statement per table it touches, gathered into
/// the pipeline that commits it.
fn write_plan<'a>(p: &mut Pipeline<'a>, plan: &'a Plan) -> Result<(), StoreError> {
    if !plan.ev_seq.is_empty() {
        p.push(
            "INSERT INTO events(seq, hash, line)
             SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[])",
            vec![
                boxed(&plan.ev_seq),
                boxed(&plan.ev_hash),
                boxed(&plan.ev_line),
            ],
        );
    }
    if !plan.rc_seq.is_empty() {
        p.push(
            "INSERT INTO receipts(seq, command_id, input_digest)
             SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[])",
            vec![
                boxed(&plan.rc_seq),
                boxed(&plan.rc_id),
                boxed(&plan.rc_digest),
            ],
        );
    }
    write_revisions(p, plan)?;
    if !plan.latches.rows.is_empty() {
        let (ids, rest): (Vec<&str>, Vec<&(bool, String)>) = plan
            .latches
            .rows
            .iter()
            .map(|(k, v)| (k.as_str(), v))
            .unzip();
        let latched: Vec<bool> = rest.iter().map(|v| v.0).collect();
        let info: Vec<&str> = rest.iter().map(|v| v.1.as_str()).collect();
        p.push(
            "INSERT INTO latches(device_id, latched, info)
             SELECT * FROM UNNEST($1::text[], $2::boolean[], $3::text[])
             ON CONFLICT (device_id) DO UPDATE SET latched = excluded.latched, info = excluded.info",
            vec![boxed(ids), boxed(latched), boxed(info)],
        );
    }
    write_budget(p, plan)?;
    write_open_ops(p, plan)?;
    write_approvals(p, plan)?;
    write_invocations(p, plan)
}

fn write_revisions<'a>(p: &mut Pipeline<'a>, plan: &'a Plan) -> Result<(), StoreError> {
    if plan.revisions.is_empty() {
        return Ok(());
    }
    let mut devices = Vec::with_capacity(plan.revisions.len());
    let mut resources = Vec::with_capacity(plan.revisions.len());
    let mut revisions = Vec::with_capacity(plan.revisions.len());
    for ((d, r), v) in &plan.revisions {
        devices.push(d.as_str());
        resources.push(r.as_str());
        revisions.push(*v);
    }
    // Another endpoint may have written a higher one: keep the highest.
    p.push(
        "INSERT INTO revisions(device_id, resource, revision)
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::bigint[])
         ON CONFLICT (device_id, resource)
         DO UPDATE SET revision = GREATEST(revisions.revision, excluded.revision)",
        vec![boxed(devices), boxed(resources), boxed(revisions)],
    );
    Ok(())
}

fn write_budget<'a>(p: &mut Pipeline<'a>, plan: &'a Plan) -> Result<(), StoreError> {
    // Releases of rows stored before the batch go first, so that a release
    // never marks a draw made later in the batch.
    if !plan.released_before.is_empty() {
        p.push(
            "UPDATE budget SET released = true WHERE reservation_id = ANY($1)",
            vec![boxed(&plan.released_before)],
        );
    }
    if plan.draws.rows.is_empty() {
        return Ok(());
    }
    let rows = &plan.draws.rows;
    let ids: Vec<&str> = rows.iter().map(|(k, _)| k.as_str()).collect();
    let keys: Vec<&str> = rows.iter().map(|(_, b)| b.key.as_str()).collect();
    let amounts: Vec<f64> = rows.iter().map(|(_, b)| b.amount).collect();
    let ts: Vec<i64> = rows
        .iter()
        .map(|(_, b)| to_db(b.ts_ms))
        .collect::<Result<_, _>>()?;
    let released: Vec<bool> = rows.iter().map(|(_, b)| b.released).collect();
    // WITH ORDINALITY: `ord` follows the order of the draws.
    p.push(
            "INSERT INTO budget(reservation_id, key, amount, ts_ms, released)
         SELECT r, k, a, t, d FROM UNNEST($1::text[], $2::text[], $3::float8[], $4::bigint[], $5::boolean[])
             WITH ORDINALITY AS u(r, k, a, t, d, n) ORDER BY n",
            vec![boxed(ids), boxed(keys), boxed(amounts), boxed(ts), boxed(released)],
        );
    Ok(())
}

fn write_open_ops<'a>(p: &mut Pipeline<'a>, plan: &'a Plan) -> Result<(), StoreError> {
    let mut open_ids = Vec::new();
    let mut infos = Vec::new();
    let mut closed = Vec::new();
    for (id, info) in &plan.open_ops.rows {
        match info {
            Some(info) => {
                open_ids.push(id.as_str());
                infos.push(info.as_str());
            }
            None => closed.push(id.as_str()),
        }
    }
    if !closed.is_empty() {
        p.push(
            "DELETE FROM open_ops WHERE command_id = ANY($1)",
            vec![boxed(closed)],
        );
    }
    if !open_ids.is_empty() {
        p.push(
            "INSERT INTO open_ops(command_id, info) SELECT * FROM UNNEST($1::text[], $2::text[])
             ON CONFLICT (command_id) DO UPDATE SET info = excluded.info",
            vec![boxed(open_ids), boxed(infos)],
        );
    }
    Ok(())
}

fn write_approvals<'a>(p: &mut Pipeline<'a>, plan: &'a Plan) -> Result<(), StoreError> {
    if plan.approvals.rows.is_empty() {
        return Ok(());
    }
    let rows = &plan.approvals.rows;
    let ids: Vec<&str> = rows.iter().map(|(k, _)| k.as_str()).collect();
    let records: Vec<&str> = rows.iter().map(|(_, v)| v.0.as_str()).collect();
    let created: Vec<i64> = rows.iter().map(|(_, v)| v.1).collect();
    let updated: Vec<i64> = rows.iter().map(|(_, v)| v.2).collect();
    p.push(
        "INSERT INTO approvals(approval_id, record, created_seq, updated_seq)
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::bigint[])
         ON CONFLICT (approval_id)
         DO UPDATE SET record = excluded.record, updated_seq = excluded.updated_seq",
        vec![boxed(ids), boxed(records), boxed(created), boxed(updated)],
    );
    Ok(())
}

fn write_invocations<'a>(p: &mut Pipeline<'a>, plan: &'a Plan) -> Result<(), StoreError> {
    if plan.invocations.rows.is_empty() {
        return Ok(());
    }
    let rows = &plan.invocations.rows;
    let ids: Vec<&str> = rows.iter().map(|(k, _)| k.as_str()).collect();
    let infos: Vec<Option<&str>> = rows.iter().map(|(_, v)| v.0.as_deref()).collect();
    let seqs: Vec<Option<i64>> = rows.iter().map(|(_, v)| v.1).collect();
    p.push(
        "INSERT INTO invocations(invocation_id, info, seq)
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::bigint[])
         ON CONFLICT (invocation_id) DO UPDATE SET info = excluded.info, seq = excluded.seq",
        vec![boxed(ids), boxed(infos), boxed(seqs)],
    );
    Ok(())
}
