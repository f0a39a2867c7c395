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

use super::conn::PgConn;
use super::head::{col, load_head, Head};
use crate::chain::seal;
use crate::prepare::Prepared;
use crate::writer::{Backend, Job};
use crate::{BudgetRow, CommitAck, StoreError};
use std::collections::{HashMap, HashSet};

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
        if let Err(e) = self.pg.batch("BEGIN") {
            // An idle link found dead (a restarted server): nothing was
            // sent, so one new link may start the batch.
            if !self.pg.link_dropped() {
                return Err(e);
            }
            self.pg.ensure()?;
            self.pg.batch("BEGIN")?;
        }
        self.lock_head()?;
        let mut known = self.lookup(batch)?;
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
        write_plan(&mut self.pg, &plan)?;
        if announce(batch, results) {
            // Wakes the governed-stop watchers of every endpoint (LISTEN),
            // delivered only if this transaction commits.
            self.pg.batch("NOTIFY tether_change")?;
        }
        let (seq, hash) = (to_db(self.head.seq)?, self.head.hash.clone());
        self.pg.execute(
            "UPDATE chain_head SET seq = $1, hash = $2, batches = batches + 1 WHERE id = 1",
            &[&seq, &hash],
        )?;
        self.pg.commit()
    }

    /// Takes the head row's lock (waiting for another endpoint's batch to
    /// finish) and continues from the head it names: another endpoint may
    /// have appended since this writer's last batch.
    fn lock_head(&mut self) -> Result<(), StoreError> {
        let rows = self.pg.query(
            "SELECT seq, hash FROM chain_head WHERE id = 1 FOR UPDATE",
            &[],
        )?;
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
    /// (`lock_head`) while it sums and writes, so endpoints on the store
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

    /// What is stored of the receipts, operations and reservations the
    /// batch names (three queries, whatever the batch's size).
    fn lookup(&mut self, batch: &[Job]) -> Result<Known, StoreError> {
        let mut ids: Vec<String> = Vec::new();
        let mut ops: Vec<String> = Vec::new();
        let mut draws: Vec<String> = Vec::new();
        for job in batch {
            let c = &job.commit;
            ids.extend(c.receipts.iter().map(|r| r.row.command_id.clone()));
            ids.extend(c.open_ops.iter().map(|(op, _)| op.command_id.clone()));
            ops.extend(c.open_ops.iter().map(|(op, _)| op.command_id.clone()));
            draws.extend(c.budget_draws.iter().map(|b| b.reservation_id.clone()));
        }
        let mut known = Known::default();
        if !ids.is_empty() {
            let sql = "SELECT command_id FROM receipts WHERE command_id = ANY($1)";
            for row in self.pg.query(sql, &[&ids])? {
                known.receipts.insert(text(&row, 0)?);
            }
        }
        if !ops.is_empty() {
            let sql = "SELECT command_id FROM open_ops WHERE command_id = ANY($1)";
            for row in self.pg.query(sql, &[&ops])? {
                known.open.insert(text(&row, 0)?, true);
            }
        }
        if !draws.is_empty() {
            let sql = "SELECT reservation_id FROM budget WHERE reservation_id = ANY($1)";
            for row in self.pg.query(sql, &[&draws])? {
                known.reservations.insert(text(&row, 0)?);
            }
        }
        Ok(known)
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

/// Writes a batch's plan: one statement per table it touches.
fn write_plan(pg: &mut PgConn, plan: &Plan) -> Result<(), StoreError> {
    if !plan.ev_seq.is_empty() {
        pg.execute(
            "INSERT INTO events(seq, hash, line)
             SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[])",
            &[&plan.ev_seq, &plan.ev_hash, &plan.ev_line],
        )?;
    }
    if !plan.rc_seq.is_empty() {
        pg.execute(
            "INSERT INTO receipts(seq, command_id, input_digest)
             SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[])",
            &[&plan.rc_seq, &plan.rc_id, &plan.rc_digest],
        )?;
    }
    write_revisions(pg, plan)?;
    if !plan.latches.rows.is_empty() {
        let (ids, rest): (Vec<&str>, Vec<&(bool, String)>) = plan
            .latches
            .rows
            .iter()
            .map(|(k, v)| (k.as_str(), v))
            .unzip();
        let latched: Vec<bool> = rest.iter().map(|v| v.0).collect();
        let info: Vec<&str> = rest.iter().map(|v| v.1.as_str()).collect();
        pg.execute(
            "INSERT INTO latches(device_id, latched, info)
             SELECT * FROM UNNEST($1::text[], $2::boolean[], $3::text[])
             ON CONFLICT (device_id) DO UPDATE SET latched = excluded.latched, info = excluded.info",
            &[&ids, &latched, &info],
        )?;
    }
    write_budget(pg, plan)?;
    write_open_ops(pg, plan)?;
    write_approvals(pg, plan)?;
    write_invocations(pg, plan)
}

fn write_revisions(pg: &mut PgConn, plan: &Plan) -> Result<(), StoreError> {
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
    pg.execute(
        "INSERT INTO revisions(device_id, resource, revision)
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::bigint[])
         ON CONFLICT (device_id, resource)
         DO UPDATE SET revision = GREATEST(revisions.revision, excluded.revision)",
        &[&devices, &resources, &revisions],
    )?;
    Ok(())
}

fn write_budget(pg: &mut PgConn, plan: &Plan) -> Result<(), StoreError> {
    // Releases of rows stored before the batch go first, so that a release
    // never marks a draw made later in the batch.
    if !plan.released_before.is_empty() {
        pg.execute(
            "UPDATE budget SET released = true WHERE reservation_id = ANY($1)",
            &[&plan.released_before],
        )?;
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
    pg.execute(
        "INSERT INTO budget(reservation_id, key, amount, ts_ms, released)
         SELECT r, k, a, t, d FROM UNNEST($1::text[], $2::text[], $3::float8[], $4::bigint[], $5::boolean[])
             WITH ORDINALITY AS u(r, k, a, t, d, n) ORDER BY n",
        &[&ids, &keys, &amounts, &ts, &released],
    )?;
    Ok(())
}

fn write_open_ops(pg: &mut PgConn, plan: &Plan) -> Result<(), StoreError> {
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
        pg.execute(
            "DELETE FROM open_ops WHERE command_id = ANY($1)",
            &[&closed],
        )?;
    }
    if !open_ids.is_empty() {
        pg.execute(
            "INSERT INTO open_ops(command_id, info) SELECT * FROM UNNEST($1::text[], $2::text[])
             ON CONFLICT (command_id) DO UPDATE SET info = excluded.info",
            &[&open_ids, &infos],
        )?;
    }
    Ok(())
}

fn write_approvals(pg: &mut PgConn, plan: &Plan) -> Result<(), StoreError> {
    if plan.approvals.rows.is_empty() {
        return Ok(());
    }
    let rows = &plan.approvals.rows;
    let ids: Vec<&str> = rows.iter().map(|(k, _)| k.as_str()).collect();
    let records: Vec<&str> = rows.iter().map(|(_, v)| v.0.as_str()).collect();
    let created: Vec<i64> = rows.iter().map(|(_, v)| v.1).collect();
    let updated: Vec<i64> = rows.iter().map(|(_, v)| v.2).collect();
    pg.execute(
        "INSERT INTO approvals(approval_id, record, created_seq, updated_seq)
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::bigint[])
         ON CONFLICT (approval_id)
         DO UPDATE SET record = excluded.record, updated_seq = excluded.updated_seq",
        &[&ids, &records, &created, &updated],
    )?;
    Ok(())
}

fn write_invocations(pg: &mut PgConn, plan: &Plan) -> Result<(), StoreError> {
    if plan.invocations.rows.is_empty() {
        return Ok(());
    }
    let rows = &plan.invocations.rows;
    let ids: Vec<&str> = rows.iter().map(|(k, _)| k.as_str()).collect();
    let infos: Vec<Option<&str>> = rows.iter().map(|(_, v)| v.0.as_deref()).collect();
    let seqs: Vec<Option<i64>> = rows.iter().map(|(_, v)| v.1).collect();
    pg.execute(
        "INSERT INTO invocations(invocation_id, info, seq)
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::bigint[])
         ON CONFLICT (invocation_id) DO UPDATE SET info = excluded.info, seq = excluded.seq",
        &[&ids, &infos, &seqs],
    )?;
    Ok(())
}
